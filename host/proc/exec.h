/*
 * exec.h - runs CALL messages on a proc: built-ins (library loading,
 * tensors) and kernels, with signature checks, producing RESULT frames.
 * One mn_exec_t belongs to the proc's executor thread.
 */
#ifndef MN_EXEC_H
#define MN_EXEC_H

#include "cancel.h"
#include "registry.h"
#include "scratch.h"
#include "trace.h"
#include "wire.h"

#include <stdatomic.h>

#define MN_MAX_RESULTS 4096 /* most values one kernel may return */
#define MN_MAX_ERRMSG 1024  /* longest error message a kernel may set */
#define MN_MAX_KGROUPS 8    /* most group ('g') arguments of one kernel call */

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
  mn_scratch_t scratch;   /* behind the running kernel's mk_scratch */
  atomic_int *cancel;     /* set by the I/O thread when work should stop */
  mn_cancel_t *cancels;   /* calls the controller asked to stop (NULL: none are asked) */
  uint64_t session;       /* the controller session whose calls run now (for `cancels`) */
  uint64_t last_seq;      /* highest CALL sequence number executed */
  uint64_t dup_seq;       /* seq of the resent CALL when mn_exec_frame returns MN_EXEC_ALREADY_RAN */
  msgpack_zone zone;
  const char *running;    /* kernel now running, for crash reports */
  const char *err_kind;   /* a built-in's error kind; "bad_args" unless it sets another */
  const char *ref_ptr;    /* payload of the last RESULT in `out`, written from here (no copy) */
  size_t ref_len;         /* its length; 0 when the last RESULT is all in `out` */
  mk_group_t kgroups[MN_MAX_KGROUPS]; /* the running kernel's group arguments */
  int nkgroups;
  const char *kcoll_kind; /* set when an in-kernel collective failed: the reply's kind */
  mn_trace_t trace;       /* the timeline (trace.h); __trace turns it on and takes its spans */
  const char *call_name;  /* the CALL now running: its kernel name (in the frame), for its span */
  size_t call_len;
  const msgpack_object *call_args;
  int replied_err;        /* its reply was an error */
} mn_exec_t;

/*
 * Collectives for kernels (the mk_api_t's all_reduce ... barrier), provided
 * by the module that owns the proc's collective instance (coll_builtins.c),
 * so that the executor links without it. Each returns 0 or a negative code
 * with err; *mismatch as mn_coll_*.
 */
typedef enum { MN_KCOLL_ALL_REDUCE, MN_KCOLL_BROADCAST, MN_KCOLL_ALL_GATHER, MN_KCOLL_REDUCE_SCATTER,
               MN_KCOLL_BARRIER, MN_KCOLL_FENCE } mn_kcoll_op_t;
typedef struct {
  mn_kcoll_op_t what;
  uint64_t gid;
  mk_tensor_t *t;        /* all_reduce, broadcast: the tensor; all_gather, reduce_scatter: src */
  mk_tensor_t *dst;      /* all_gather, reduce_scatter */
  int arg;               /* the reduction op, or broadcast's root */
} mn_kcoll_t;
typedef struct {
  /* Fills g for group gid held by this proc; MN_ENOTFOUND with err if there is none. */
  int (*group)(mn_exec_t *x, uint64_t gid, mk_group_t *g, char *err, size_t errlen);
  int (*run)(mn_exec_t *x, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch);
  /* Gives up on gid, telling the other members why (a kernel that failed or was given bad arguments). */
  void (*abort)(mn_exec_t *x, uint64_t gid, const char *why);
} mn_exec_coll_t;
/* Installs the collectives kernels reach (before executors start). Without them a 'g' argument is refused. */
void mn_exec_set_coll(const mn_exec_coll_t *ops);

/*
 * The GPU half of in-kernel collectives, provided by gpu.c (so that the
 * executor links without it): a group whose id is also the id of an NCCL
 * communicator on this proc (mesh:group{gpu = true}) runs its collectives
 * on GPU tensors through NCCL on ctx->stream. exec_coll.c checks the
 * arguments and that every member agrees on the call (over the CPU group)
 * before run; run waits for NCCL as the __gpu_ built-ins do and returns 0
 * or a negative code with err (an aborted communicator is dropped).
 */
typedef struct {
  /* 1 when gid names one of this proc's NCCL communicators, else 0 (a predicate). */
  int (*has)(uint64_t gid);
  /* k->what is one of the four data collectives, or MN_KCOLL_BARRIER: wait for ctx->stream to drain. */
  int (*run)(mn_exec_t *x, mk_ctx_t *ctx, const mn_kcoll_t *k, char *err, size_t errlen);
  /* Aborts and forgets gid's communicator (and its watch group) if there is one: its group was given up on. */
  void (*drop)(uint64_t gid);
} mn_exec_gpu_coll_t;
/* Installs the GPU collectives (before executors start). Without them a GPU tensor on a group is refused. */
void mn_exec_set_gpu_coll(const mn_exec_gpu_coll_t *ops);

/*
 * Built-ins: calls whose names start with "__", answered by the proc itself.
 * Each module (the executor's own, collectives, GPU, actors) is a table of
 * entries; a handler reads raw msgpack args, writes results through ctx->api
 * (the mk_return_* helpers) and returns 0, or a negative code (err.h) with a
 * message in err: MN_EINVAL for bad arguments, MN_ENOTFOUND for a tensor,
 * library or kernel that is not there, the code of what failed otherwise.
 * The code picks nothing on the wire: the reply's kind is x->err_kind, which
 * the handler may set (default "bad_args"). ctx->kernel is the NUL-terminated
 * name that was called.
 */
typedef struct mn_builtin_s mn_builtin_t;
typedef int (*mn_builtin_fn)(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                             char *err, size_t errlen);
struct mn_builtin_s {
  const char *name;  /* the whole name, "__coll_barrier" */
  mn_builtin_fn fn;
  const char *usage; /* its arguments, "(group_id)", as messages and docs show them */
};

typedef struct mn_builtin_module_s mn_builtin_module_t;
struct mn_builtin_module_s {
  const char *prefix;           /* every name of the module starts with it ("__coll_") */
  const mn_builtin_t *entries;
  int count;
  /* Writes the error for a name with this prefix that no entry has; NULL: "unknown built-in '...'". */
  void (*unknown)(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen);
};
#define MN_MAX_BUILTIN_MODULES 16 /* most registered built-in modules */

/*
 * Registers a module of built-ins; m (and its entries) must outlive every
 * executor. Call before executors start: the table is not locked. Returns 0,
 * or MN_ELIMIT if MN_MAX_BUILTIN_MODULES are registered already.
 */
int mn_exec_register(const mn_builtin_module_t *m);

/*
 * A built-in's code for r, what its mk_return_* calls returned (the kernel
 * ABI says only "nonzero" on failure): 0 for 0, else MN_ELIMIT past
 * MN_MAX_RESULTS or MN_ENOMEM.
 */
static inline int mn_exec_returned(const mn_exec_t *x, int r) {
  if (r == 0) return 0;
  return x->nresults >= MN_MAX_RESULTS ? MN_ELIMIT : MN_ENOMEM;
}

/*
 * Writes m's names into buf, separated by ", ", for an "unknown built-in"
 * message: every name after the first loses its first `strip` bytes (so the
 * actors' list reads "__actor_define, _has, ..."). Returns buf.
 */
const char *mn_exec_builtin_names(const mn_builtin_module_t *m, size_t strip, char *buf, size_t len);

/*
 * A new tensor's dtype name (s, sl) and shape (an array of integers) from
 * a built-in's arguments, as __tensor_new and __gpu_tensor_new take them:
 * sets *dt and shape[0 .. sh's size). 0, or MN_EINVAL with err naming what
 * is wrong.
 */
int mn_exec_dtype_shape(const char *s, size_t sl, const msgpack_object *sh, int *dt, int64_t shape[MK_MAX_DIMS],
                        char *err, size_t errlen);
/*
 * Resolves a tensor argument (ext handle or integer id); NULL with err if it
 * is no tensor or absent (callers fail with MN_EINVAL: a bad argument).
 */
mk_tensor_t *mn_exec_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, char *err,
                                size_t errlen);

/* 0, or MN_ENOMEM. */
int mn_exec_init(mn_exec_t *x, const char *prefix, int rank, int world, atomic_int *cancel);
void mn_exec_close(mn_exec_t *x);
/* What mn_exec_frame made of a frame when it returns no negative MN_E* code. */
typedef enum {
  MN_EXEC_DONE = 0,        /* the CALL was taken: its RESULT (ok or failed) is in x->out */
  MN_EXEC_ALREADY_RAN = 1, /* a resend of a CALL that ran before: its seq in x->dup_seq, nothing appended */
} mn_exec_outcome_t;
/*
 * Executes one frame. Appends a RESULT (or, for a protocol violation, an
 * ERROR) frame to x->out. Returns MN_EXEC_DONE, MN_EXEC_ALREADY_RAN (the
 * caller replays that call's result), or a negative MN_E* code (the
 * decoder's, or MN_EPROTO) when the connection should be closed after the
 * ERROR is written. While x->trace.on, a call that ran (other than __trace)
 * also leaves its span in x->trace.
 */
int mn_exec_frame(mn_exec_t *x, const char *body, size_t len);
/* Starts a new controller session: CALL sequence numbers restart at 1. */
static inline void mn_exec_new_session(mn_exec_t *x) { x->last_seq = 0; }

#endif
