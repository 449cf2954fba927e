/*
 * gpu_comm.c - NCCL communicators for a proc: made, used and freed by the
 * __gpu_nccl_* and collective built-ins (gpu.h), and used by the
 * collectives kernels call on their group's communicator (exec.h's GPU
 * hooks). A collective is waited for by polling its stream, so that a dead
 * member, a cancel or the timeout aborts the communicator instead of
 * hanging the proc.
 */
#include "gpu_int.h"

#include "clock.h"
#include "collective.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_GPU_POLL_EVERY 256      /* stream polls between checks of cancel, timeout, NCCL errors */

typedef struct {
  uint64_t id;
  void *comm;   /* ncclComm_t */
  int nranks;
  int rank;
  int device;
  uint64_t watch; /* a collective group of the same procs whose links tell when one dies (0: none) */
} comm_t;

/* The communicators this proc holds, by the controller's id. */
static struct {
  comm_t comms[MN_GPU_MAX_COMMS];
  int ncomms;
  double timeout_s;             /* MONARCH_GPU_TIMEOUT, read on first use (0: not yet) */
} C;

static mn__gpu_t *const G = &mn__gpu; /* what gpu_load.c loaded */

/* ---- communicators ------------------------------------------------------------- */

static comm_t *find_comm(uint64_t id) {
  for (int i = 0; i < C.ncomms; i++)
    if (C.comms[i].id == id) return &C.comms[i];
  return NULL;
}

static void drop_comm(comm_t *c) {
  if (c->watch != 0) mn_coll_watch_free(c->watch); /* closing its links tells the other members at once */
  *c = C.comms[--C.ncomms];
}

/* The communicator named by argument 0; NULL with err. */
static comm_t *comm_arg(mn_exec_t *x, const msgpack_object *args, const char *who, char *err, size_t errlen) {
  uint64_t id;
  if (mn__gpu_nccl_ready(x, err, errlen) != 0) return NULL;
  if (mn_get_u64(args, 0, &id) != 0) {
    snprintf(err, errlen, "%s: argument 1 must be a communicator id (a non-negative integer)", who);
    return NULL;
  }
  comm_t *c = find_comm(id);
  if (c == NULL) snprintf(err, errlen, "%s: communicator %llu does not exist on this proc (call __gpu_nccl_init first)",
                          who, (unsigned long long)id);
  return c;
}

/* NCCL's number for d (>= 0), or MN_EINVAL for a dtype NCCL lacks. */
static int nccl_dtype(mk_dtype_t d) {
  switch (d) {
  case MK_U8: return 1;
  case MK_I32: return 2;
  case MK_I64: return 4;
  case MK_F16: return 6;
  case MK_F32: return 7;
  case MK_F64: return 8;
  case MK_BF16: return 9;
  default: return MN_EINVAL;
  }
}

/* The reduction named by argument i: sum, max, min, avg as NCCL numbers them (>= 0); MN_EINVAL with err. */
static int nccl_op(const msgpack_object *args, uint32_t i, const char *who, char *err, size_t errlen) {
  static const struct { const char *name; int op; } ops[] = {{"sum", 0}, {"max", 2}, {"min", 3}, {"avg", 4}};
  const char *s;
  size_t n;
  if (mn_get_str(args, i, &s, &n) == 0)
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
      if (strlen(ops[k].name) == n && memcmp(ops[k].name, s, n) == 0) return ops[k].op;
  snprintf(err, errlen, "%s: argument %u must be a reduction: \"sum\", \"max\", \"min\" or \"avg\"", who, i + 1);
  return MN_EINVAL;
}

static double coll_timeout(void) {
  if (C.timeout_s <= 0) {
    const char *e = getenv("MONARCH_GPU_TIMEOUT");
    double v = e ? atof(e) : 0;
    C.timeout_s = v > 0 ? v : MN_GPU_COLL_TIMEOUT_S;
  }
  return C.timeout_s;
}

/*
 * Waits for the collective just enqueued on `stream` (NULL: the legacy
 * default stream, which the built-ins use). A peer that
 * never joins would block a plain cudaStreamSynchronize forever; polling
 * lets a cancel, an NCCL error or the timeout abort the communicator
 * instead, so the proc stays usable. Returns 0, or with err MN_EDEVICE (the
 * device or NCCL reported an error), the watch's code (a member died),
 * MN_ECANCELED or MN_ETIMEDOUT; an aborted communicator is dropped.
 */
static int coll_wait(mn_exec_t *x, mk_ctx_t *ctx, comm_t *c, void *stream, const char *who, char *err,
                     size_t errlen) {
  double deadline = mn_now_s() + coll_timeout();
  const char *why = NULL;
  int rc = MN_EDEVICE;
  for (unsigned i = 1;; i++) {
    int q = G->rt.StreamQuery(stream);
    if (q == CUDA_SUCCESS) return 0;
    if (q != CUDA_NOT_READY) {
      x->err_kind = "gpu";
      snprintf(err, errlen, "%s: the device reported an error: %s", who, G->rt.GetErrorString(q));
      return MN_EDEVICE;
    }
    if (i % MN_GPU_POLL_EVERY == 0) {
      int async = NCCL_SUCCESS;
      if (G->nccl.CommGetAsyncError(c->comm, &async) == NCCL_SUCCESS && async != NCCL_SUCCESS &&
          async != NCCL_IN_PROGRESS) {
        rc = mn__gpu_nccl_fail(x, async, c->comm, who, err, errlen);
        break;
      }
      if (c->watch != 0 && (rc = mn_coll_watch(c->watch, who, err, errlen)) != 0) {
        /* NCCL does not notice a dead peer on its own: it would wait for the timeout. */
        x->err_kind = "gpu";
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, "; communicator %llu aborted", (unsigned long long)c->id);
        break;
      }
      if (mk_cancelled(ctx)) {
        why = "cancelled";
        rc = MN_ECANCELED;
      } else if (mn_now_s() > deadline) {
        why = "timed out";
        rc = MN_ETIMEDOUT;
      }
      if (why != NULL) {
        x->err_kind = "gpu";
        snprintf(err, errlen, "%s on communicator %llu %s after %.0f s (did every rank join?); communicator aborted",
                 who, (unsigned long long)c->id, why, coll_timeout());
        break;
      }
    }
    sched_yield();
  }
  if (G->nccl.CommAbort(c->comm) != NCCL_SUCCESS)
    fprintf(stderr, "monarch proc: ncclCommAbort of communicator %llu failed\n", (unsigned long long)c->id);
  drop_comm(c);
  return rc;
}

/* ---- built-ins --------------------------------------------------------------- */

/* __gpu_nccl_id() -> 128 bytes */
int mn__gpu_b_nccl_id(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                      char *err, size_t errlen) {
  mn_nccl_id_t id;
  int rc = mn__gpu_nccl_ready(x, err, errlen);
  if (rc != 0) return rc;
  rc = G->nccl.GetUniqueId(&id);
  if (rc != NCCL_SUCCESS) return mn__gpu_nccl_fail(x, rc, NULL, "ncclGetUniqueId", err, errlen);
  return mn_exec_returned(x, mk_return_bytes(ctx, id.internal, sizeof(id.internal)));
}

/* A communicator that was not made does not keep its watch group. Returns rc. */
static int fail_watch(uint64_t watch, int rc) {
  if (watch != 0) mn_coll_watch_free(watch);
  return rc;
}

/* __gpu_nccl_init(comm, id, nranks, rank [, watch group]) */
int mn__gpu_b_nccl_init(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                        char *err, size_t errlen) {
  uint64_t cid, watch = 0;
  int64_t nranks, rank;
  const char *s;
  size_t sl;
  mn_nccl_id_t id;
  if (mn_get_u64(args, 0, &cid) != 0 || (mn_get_bin(args, 1, &s, &sl) != 0 && mn_get_str(args, 1, &s, &sl) != 0) ||
      mn_get_i64(args, 2, &nranks) != 0 || mn_get_i64(args, 3, &rank) != 0 ||
      (args->via.array.size > 4 && mn_get_u64(args, 4, &watch) != 0)) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return MN_EINVAL;
  }
  if (sl != sizeof(id.internal)) {
    snprintf(err, errlen, "__gpu_nccl_init: the NCCL id must be %d bytes, got %zu", MN_GPU_NCCL_ID_BYTES, sl);
    return fail_watch(watch, MN_EINVAL);
  }
  if (nranks < 1 || nranks > 1 << 20 || rank < 0 || rank >= nranks) {
    snprintf(err, errlen, "__gpu_nccl_init: rank %lld is outside 0..nranks-1 (nranks %lld)", (long long)rank,
             (long long)nranks);
    return fail_watch(watch, MN_EINVAL);
  }
  int rc = mn__gpu_nccl_ready(x, err, errlen);
  if (rc != 0 || (rc = mn__gpu_use_device(x, mn__gpu_proc_device(x), err, errlen)) != 0) return fail_watch(watch, rc);
  if (find_comm(cid) != NULL) {
    snprintf(err, errlen, "__gpu_nccl_init: communicator %llu already exists on this proc", (unsigned long long)cid);
    return fail_watch(watch, MN_EINVAL);
  }
  if (C.ncomms == MN_GPU_MAX_COMMS) {
    snprintf(err, errlen, "__gpu_nccl_init: MN_GPU_MAX_COMMS (%d) communicators already live on this proc",
             MN_GPU_MAX_COMMS);
    return fail_watch(watch, MN_ELIMIT);
  }
  memcpy(id.internal, s, sizeof(id.internal));
  void *comm = NULL;
  rc = G->nccl.CommInitRank(&comm, (int)nranks, id, (int)rank);
  if (rc != NCCL_SUCCESS) return fail_watch(watch, mn__gpu_nccl_fail(x, rc, NULL, "ncclCommInitRank", err, errlen));
  C.comms[C.ncomms++] = (comm_t){cid, comm, (int)nranks, (int)rank, G->cur, watch};
  return 0;
}

/* __gpu_nccl_free(comm) -> true, or false if there was none */
int mn__gpu_b_nccl_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                        char *err, size_t errlen) {
  uint64_t cid;
  if (mn_get_u64(args, 0, &cid) != 0) {
    snprintf(err, errlen, "__gpu_nccl_free takes a communicator id");
    return MN_EINVAL;
  }
  comm_t *c = find_comm(cid);
  if (c == NULL) return mn_exec_returned(x, mk_return_bool(ctx, 0));
  int rc = G->nccl.CommDestroy(c->comm);
  drop_comm(c);
  if (rc != NCCL_SUCCESS) return mn__gpu_nccl_fail(x, rc, NULL, "ncclCommDestroy", err, errlen);
  return mn_exec_returned(x, mk_return_bool(ctx, 1));
}

/* Checks a collective's tensor against its communicator; 0 or MN_EINVAL with err. */
static int coll_tensor(const comm_t *c, const mk_tensor_t *t, const char *who, char *err, size_t errlen) {
  if (t->device != c->device) {
    snprintf(err, errlen, "%s: tensor %llu is on cuda:%d but communicator %llu is on cuda:%d", who,
             (unsigned long long)t->id, t->device, (unsigned long long)c->id, c->device);
    return MN_EINVAL;
  }
  if (nccl_dtype(t->dtype) < 0) {
    snprintf(err, errlen, "%s: dtype %s has no NCCL type", who, mn_dtype_name(t->dtype));
    return MN_EINVAL;
  }
  return 0;
}

/* __gpu_all_reduce(comm, t, op), __gpu_broadcast(comm, t, root),
 * __gpu_all_gather(comm, send, recv), __gpu_reduce_scatter(comm, send, recv, op). */
typedef enum { GPU_ALL_REDUCE, GPU_BROADCAST, GPU_ALL_GATHER, GPU_REDUCE_SCATTER } gpu_coll_t;

/*
 * Enqueues one NCCL collective on `stream` over checked tensors (a: the
 * tensor or the send side, b: the receive side of a gather or scatter) and
 * waits for it with coll_wait. arg is NCCL's reduction op, or the root.
 */
static int launch(mn_exec_t *x, mk_ctx_t *ctx, gpu_coll_t kind, comm_t *c, mk_tensor_t *a, mk_tensor_t *b, int arg,
                  void *stream, const char *who, char *err, size_t errlen) {
  int rc, dt = nccl_dtype(a->dtype);
  if (kind == GPU_ALL_REDUCE) rc = G->nccl.AllReduce(a->data, a->data, (size_t)a->numel, dt, arg, c->comm, stream);
  else if (kind == GPU_BROADCAST) rc = G->nccl.Broadcast(a->data, a->data, (size_t)a->numel, dt, arg, c->comm, stream);
  else if (kind == GPU_ALL_GATHER) rc = G->nccl.AllGather(a->data, b->data, (size_t)a->numel, dt, c->comm, stream);
  else rc = G->nccl.ReduceScatter(a->data, b->data, (size_t)b->numel, dt, arg, c->comm, stream);
  if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) return mn__gpu_nccl_fail(x, rc, c->comm, who, err, errlen);
  return coll_wait(x, ctx, c, stream, who, err, errlen);
}

static int b_collective(mn_exec_t *x, mk_ctx_t *ctx, gpu_coll_t kind, const char *who, const msgpack_object *args,
                        char *err, size_t errlen) {
  int is_ar = kind == GPU_ALL_REDUCE, is_bc = kind == GPU_BROADCAST;
  int is_ag = kind == GPU_ALL_GATHER, is_rs = kind == GPU_REDUCE_SCATTER;
  int op = 0, root = 0, rc;
  int64_t r64;
  comm_t *c = comm_arg(x, args, who, err, errlen);
  if (c == NULL) return MN_EINVAL; /* also when NCCL is missing: x->err_kind says "no_gpu" */
  mk_tensor_t *a = mn__gpu_tensor_arg(x, args, 1, who, err, errlen), *b = a;
  if (a == NULL || coll_tensor(c, a, who, err, errlen) != 0) return MN_EINVAL;
  if (is_ag || is_rs) {
    b = mn__gpu_tensor_arg(x, args, 2, who, err, errlen);
    if (b == NULL || coll_tensor(c, b, who, err, errlen) != 0) return MN_EINVAL;
    /* The gathered (or scattered-from) side holds one part per rank. */
    const mk_tensor_t *part = is_ag ? a : b, *whole = is_ag ? b : a;
    if (a == b || a->dtype != b->dtype || whole->numel != part->numel * c->nranks) {
      snprintf(err, errlen, "%s: %s must be a separate %s tensor of %d x %lld elements (%d ranks), got %s of %lld",
               who, is_ag ? "recv" : "send", mn_dtype_name(part->dtype), c->nranks, (long long)part->numel,
               c->nranks, mn_dtype_name(whole->dtype), (long long)whole->numel);
      return MN_EINVAL;
    }
  }
  if ((is_ar || is_rs) && (op = nccl_op(args, is_ar ? 2 : 3, who, err, errlen)) < 0) return op;
  if (is_bc) {
    if (mn_get_i64(args, 2, &r64) != 0 || r64 < 0 || r64 >= c->nranks) {
      snprintf(err, errlen, "%s: argument 3 must be the root rank, 0..%d", who, c->nranks - 1);
      return MN_EINVAL;
    }
    root = (int)r64;
  }
  if ((rc = mn__gpu_use_device(x, c->device, err, errlen)) != 0) return rc;
  return launch(x, ctx, kind, c, a, b, is_bc ? root : op, NULL, who, err, errlen);
}

int mn__gpu_b_all_reduce(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                         char *err, size_t errlen) {
  return b_collective(x, ctx, GPU_ALL_REDUCE, b->name, args, err, errlen);
}
int mn__gpu_b_broadcast(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                        char *err, size_t errlen) {
  return b_collective(x, ctx, GPU_BROADCAST, b->name, args, err, errlen);
}
int mn__gpu_b_all_gather(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                         char *err, size_t errlen) {
  return b_collective(x, ctx, GPU_ALL_GATHER, b->name, args, err, errlen);
}
int mn__gpu_b_reduce_scatter(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                             char *err, size_t errlen) {
  return b_collective(x, ctx, GPU_REDUCE_SCATTER, b->name, args, err, errlen);
}

/* ---- collectives kernels call (exec.h's GPU hooks) ----------------------------- */

static int k_has(uint64_t gid) { return find_comm(gid) != NULL; }

static void k_drop(uint64_t gid) {
  comm_t *c = find_comm(gid);
  if (c == NULL) return;
  if (G->nccl.CommAbort(c->comm) != NCCL_SUCCESS)
    fprintf(stderr, "monarch proc: ncclCommAbort of communicator %llu failed\n", (unsigned long long)gid);
  drop_comm(c);
}

/* NCCL's reduction for an mk_reduce_op_t, or MN_EINVAL with err. */
static int kernel_op(int op, const char *who, char *err, size_t errlen) {
  static const int nccl_ops[] = {0, 2, 3, 4}; /* MK_SUM, MK_MAX, MK_MIN, MK_AVG -> ncclSum, ncclMax, ncclMin, ncclAvg */
  if (op >= 0 && op < 4) return nccl_ops[op];
  snprintf(err, errlen, "%s: unknown reduction %d (MK_SUM, MK_MAX, MK_MIN, MK_AVG)", who, op);
  return MN_EINVAL;
}

/* Checks an in-kernel GPU collective's arguments against its communicator; 0 or MN_EINVAL with err. */
static int kernel_args(const comm_t *c, const mn_kcoll_t *k, const char *who, char *err, size_t errlen) {
  const mk_tensor_t *part = k->what == MN_KCOLL_ALL_GATHER ? k->t : k->dst;
  const mk_tensor_t *whole = k->what == MN_KCOLL_ALL_GATHER ? k->dst : k->t;
  if (coll_tensor(c, k->t, who, err, errlen) != 0 || (k->dst != NULL && coll_tensor(c, k->dst, who, err, errlen) != 0))
    return MN_EINVAL;
  if (k->what == MN_KCOLL_BROADCAST && (k->arg < 0 || k->arg >= c->nranks)) {
    snprintf(err, errlen, "%s: root %d is outside the group's positions 0..%d", who, k->arg, c->nranks - 1);
    return MN_EINVAL;
  }
  if (k->dst != NULL && (k->t->data == k->dst->data || k->t->dtype != k->dst->dtype ||
                         whole->numel != part->numel * c->nranks)) {
    snprintf(err, errlen, "%s: %s must be a separate %s tensor of %d x %lld elements (%d members), got %s of %lld", who,
             k->what == MN_KCOLL_ALL_GATHER ? "dst" : "src", mn_dtype_name(part->dtype), c->nranks,
             (long long)part->numel, c->nranks, mn_dtype_name(whole->dtype), (long long)whole->numel);
    return MN_EINVAL;
  }
  return 0;
}

/*
 * Runs an in-kernel collective of group k->gid through the NCCL
 * communicator of the same id, on ctx->stream, and waits for it as the
 * built-ins do (a dead member, a cancel or the timeout aborts it); a
 * barrier only waits for the stream to drain. exec_coll.c has checked that
 * every member makes the same call. Any failure drops the communicator.
 */
static int k_run(mn_exec_t *x, mk_ctx_t *ctx, const mn_kcoll_t *k, char *err, size_t errlen) {
  static const char *const names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  static const gpu_coll_t kinds[] = {GPU_ALL_REDUCE, GPU_BROADCAST, GPU_ALL_GATHER, GPU_REDUCE_SCATTER};
  const char *who = k->what <= MN_KCOLL_BARRIER ? names[k->what] : "collective";
  comm_t *c = find_comm(k->gid);
  int rc, arg = k->arg;
  if (c == NULL || k->what > MN_KCOLL_BARRIER) {
    snprintf(err, errlen, "%s: group %llu has no NCCL communicator on this proc", who, (unsigned long long)k->gid);
    return MN_ENOTFOUND;
  }
  if ((rc = mn__gpu_use_device(x, c->device, err, errlen)) != 0) return rc;
  if (k->what == MN_KCOLL_BARRIER) {
    int q = G->rt.StreamQuery(ctx->stream);
    return q == CUDA_SUCCESS ? 0 : coll_wait(x, ctx, c, ctx->stream, who, err, errlen);
  }
  if ((rc = kernel_args(c, k, who, err, errlen)) != 0) return rc;
  if ((k->what == MN_KCOLL_ALL_REDUCE || k->what == MN_KCOLL_REDUCE_SCATTER) &&
      (arg = kernel_op(k->arg, who, err, errlen)) < 0)
    return arg;
  return launch(x, ctx, kinds[k->what], c, k->t, k->dst, arg, ctx->stream, who, err, errlen);
}

const mn_exec_gpu_coll_t mn__gpu_kernel_colls = {k_has, k_run, k_drop};

/* ---- resetting (tests) ---------------------------------------------------------- */

void mn__gpu_comm_reset(void) {
  for (int i = 0; i < C.ncomms; i++)
    if (G->nccl.CommAbort(C.comms[i].comm) != NCCL_SUCCESS) fprintf(stderr, "monarch proc: ncclCommAbort failed\n");
  memset(&C, 0, sizeof(C));
}
