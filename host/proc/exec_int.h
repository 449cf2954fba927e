/* exec_int.h - what exec.c and exec_builtins.c (the executor's own built-ins) share. */
#ifndef MN_EXEC_INT_H
#define MN_EXEC_INT_H

#include "exec.h"

/* __load, __tensor_*, __lost, __kernels, __info: names no registered prefix claims. */
extern const mn_builtin_module_t mn__exec_builtins;

/* Reads a tensor handle (msgpack ext) into *id; 0, or MN_EINVAL if o is not one. */
int mn__exec_tensor_id(const msgpack_object *o, uint64_t *id);

/*
 * Returns n bytes at p as one bytes result without copying them into the
 * results: the RESULT frame is written from p, which must stay valid until
 * x->out is sent. At most one per call, and it must be the last result.
 * Returns 0, or MN_ELIMIT past MN_MAX_RESULTS.
 */
int mn__exec_return_ref(mn_exec_t *x, const void *p, size_t n);

/* ---- collectives in kernels (exec_coll.c) ---- */

/*
 * Turns a 'g' argument (an integer group id, converted as MK_ARG_INT) into
 * MK_ARG_GROUP pointing into x->kgroups. 0, or MN_EINVAL / MN_ELIMIT /
 * MN_ENOTFOUND with err naming argument i (0-based); got is what arrived.
 */
int mn__exec_group_arg(mn_exec_t *x, mk_arg_t *a, int i, const char *got, char *err, size_t errlen);
/* The call's arguments were refused: gives up on the groups already bound, telling their members why. */
void mn__exec_bind_failed(mn_exec_t *x, const char *why);
/*
 * After a kernel that was given groups returned: if it failed, gives up on
 * each group (its other members fail at once); otherwise meets the other
 * members at a fence on each, which fails the call when they ran different
 * collectives. Empties x->kgroups.
 */
void mn__exec_kernel_groups_done(mn_exec_t *x, const char *kernel, int failed);
int mn__exec_api_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op);
int mn__exec_api_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root);
int mn__exec_api_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst);
int mn__exec_api_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst, int op);
int mn__exec_api_barrier(mk_ctx_t *ctx, const mk_group_t *g);

#endif
