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

#endif
