/*
 * exec.h - runs CALL messages on a proc: built-ins (library loading,
 * tensors) and kernels, with signature checks, producing RESULT frames.
 * One mn_exec_t belongs to the proc's executor thread.
 */
#ifndef MN_EXEC_H
#define MN_EXEC_H

#include "cancel.h"
#include "registry.h"
#include "wire.h"

#include <stdatomic.h>

#define MN_MAX_RESULTS 4096 /* most values one kernel may return */
#define MN_MAX_ERRMSG 1024  /* longest error message a kernel may set */
#define MN_MAX_SCRATCH 16   /* most scratch blocks one kernel call may hold */

typedef struct {
  mn_registry_t reg;
  int rank;
  int world;
  int device;             /* CUDA device of a GPU proc (ctx->device), -1 on a CPU proc */
  const char *host;       /* hostname, for error messages */
  mn_buf_t out;           /* reply frames waiting to be written */
  mn_buf_t rbuf;          /* the running kernel's packed results */
  msgpack_packer rpk;
  uint32_t nresults;
  int failed;
  char errmsg[MN_MAX_ERRMSG];
  void *scratch;          /* cached first scratch block */
  size_t scratch_cap;
  int scratch_used;
  void *extra[MN_MAX_SCRATCH];
  int nextra;
  atomic_int *cancel;     /* set by the I/O thread when work should stop */
  mn_cancel_t *cancels;   /* calls the controller asked to stop (NULL: none are asked) */
  uint64_t session;       /* the controller session whose calls run now (for `cancels`) */
  uint64_t last_seq;      /* highest CALL sequence number executed */
  uint64_t dup_seq;       /* seq of the resent CALL when mn_exec_frame returns 1 */
  msgpack_zone zone;
  const char *running;    /* kernel now running, for crash reports */
  const char *err_kind;   /* a built-in's error kind; "bad_args" unless it sets another */
  const char *ref_ptr;    /* payload of the last RESULT in `out`, written from here (no copy) */
  size_t ref_len;         /* its length; 0 when the last RESULT is all in `out` */
} mn_exec_t;

/*
 * Built-in extension point. A module (collectives, GPU, actors) registers
 * handlers for built-ins whose names start with `prefix` (e.g. "__coll_").
 * A handler reads raw msgpack args, writes results through ctx->api (the
 * mk_return_* helpers) and returns 0, or -1 with a message in err.
 */
typedef int (*mn_builtin_fn)(mn_exec_t *x, mk_ctx_t *ctx, const char *name, size_t nl,
                             const msgpack_object *args, char *err, size_t errlen);
#define MN_MAX_BUILTIN_MODULES 16 /* most registered built-in prefixes */
int mn_exec_register(const char *prefix, mn_builtin_fn fn);
/* Resolves a tensor argument (ext handle or integer id); NULL with err if absent. */
mk_tensor_t *mn_exec_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, char *err,
                                size_t errlen);

int mn_exec_init(mn_exec_t *x, const char *prefix, int rank, int world, atomic_int *cancel);
void mn_exec_close(mn_exec_t *x);
/*
 * Executes one frame. Appends a RESULT (or, for a protocol violation, an
 * ERROR) frame to x->out. Returns 0, 1 for a CALL that already ran (its
 * seq in x->dup_seq; nothing appended), or a negative MN_E* code when the
 * connection should be closed after the ERROR is written.
 */
int mn_exec_frame(mn_exec_t *x, const char *body, size_t len);
/* Starts a new controller session: CALL sequence numbers restart at 1. */
static inline void mn_exec_new_session(mn_exec_t *x) { x->last_seq = 0; }

#endif
