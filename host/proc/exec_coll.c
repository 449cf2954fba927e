/*
 * exec_coll.c - collectives kernels call themselves (mk_all_reduce ... in
 * monarch_kernel.h): group arguments, the mk_api_t entries, and what a
 * call does with its groups when the kernel returns. The collectives run
 * through the hooks the collective module installs (mn_exec_set_coll), on
 * the executor thread, inside the kernel's call.
 */
#include "exec_int.h"

#include "dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(MK_COLL_ETIMEDOUT == MN_ETIMEDOUT && MK_COLL_EINVAL == MN_EINVAL && MK_COLL_ENOTFOUND == MN_ENOTFOUND &&
                   MK_COLL_EPEER == MN_EPEER && MK_COLL_ECANCELED == MN_ECANCELED && MK_COLL_EDEVICE == MN_EDEVICE,
               "the kernel ABI's collective codes are err.h's");

#define MN_KCOLL_DESC 6 /* int64s that describe a GPU collective to the other members */

static const mn_exec_coll_t *coll_ops;
static const mn_exec_gpu_coll_t *gpu_ops;

void mn_exec_set_coll(const mn_exec_coll_t *ops) { coll_ops = ops; }
void mn_exec_set_gpu_coll(const mn_exec_gpu_coll_t *ops) { gpu_ops = ops; }

/* Gives up on gid: its other members are told why, and its NCCL communicator (if any) goes too. */
static void give_up(mn_exec_t *x, uint64_t gid, const char *why) {
  if (coll_ops != NULL) coll_ops->abort(x, gid, why);
  if (gpu_ops != NULL) gpu_ops->drop(gid);
}

static const char *const kcoll_names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                                          "the end of the kernel"};

int mn__exec_group_arg(mn_exec_t *x, mk_arg_t *a, int i, const char *got, char *err, size_t errlen) {
  if (a->type != MK_ARG_INT || a->v.i < 0) {
    snprintf(err, errlen, "argument %d: expected a group (made with mesh:group()), got %s", i + 1, got);
    return MN_EINVAL;
  }
  if (x->nkgroups == MN_MAX_KGROUPS) {
    snprintf(err, errlen, "argument %d: a kernel call takes at most %d groups (MN_MAX_KGROUPS)", i + 1, MN_MAX_KGROUPS);
    return MN_ELIMIT;
  }
  if (coll_ops == NULL) {
    snprintf(err, errlen, "argument %d: this proc runs no collectives, so it holds no group", i + 1);
    return MN_ENOTFOUND;
  }
  mk_group_t *g = &x->kgroups[x->nkgroups];
  char why[256];
  if (coll_ops->group(x, (uint64_t)a->v.i, g, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "argument %d: group %lld does not exist on rank %d (freed, or torn down by a failed collective)",
             i + 1, (long long)a->v.i, x->rank);
    return MN_ENOTFOUND;
  }
  x->nkgroups++;
  a->type = MK_ARG_GROUP;
  a->v.group = g;
  return 0;
}

void mn__exec_bind_failed(mn_exec_t *x, const char *why) {
  for (int i = 0; coll_ops != NULL && i < x->nkgroups; i++) give_up(x, x->kgroups[i].id, why);
  x->nkgroups = 0;
}

/*
 * Records a failure of an in-kernel collective on group gid as the call's
 * error and gives the group up (a collective that failed has torn it down
 * already; a GPU group's communicator and the CPU group go together); returns rc.
 */
static int kcoll_failed(mn_exec_t *x, uint64_t gid, int rc, int mismatch, const char *msg) {
  give_up(x, gid, msg);
  snprintf(x->errmsg, sizeof(x->errmsg), "%s", msg);
  x->failed = 1;
  x->kcoll_kind = mismatch ? "collective_mismatch" : "collective";
  return rc;
}

/* A tensor a kernel hands a collective: one of its arguments or a view it made of its own memory. */
static int check_tensor(const mk_tensor_t *t, const char *what, char *err, size_t errlen) {
  if (t == NULL || (t->data == NULL && t->nbytes > 0) || t->numel < 0 ||
      t->nbytes != (size_t)t->numel * mk_dtype_size(t->dtype)) {
    snprintf(err, errlen, "%s: the tensor is NULL or its nbytes is not numel x the dtype's size", what);
    return MN_EINVAL;
  }
  return 0;
}

static const char *where(const mk_tensor_t *t, char buf[24]) {
  if (t->device < 0) return "the CPU";
  snprintf(buf, 24, "cuda:%d", t->device);
  return buf;
}

/*
 * A call's tensors must be where its group runs collectives: on one GPU for
 * a group with an NCCL communicator (mesh:group{ gpu = true }), on the CPU
 * for one without. 0, or MN_EINVAL / MN_EDEVICE with err saying what to do.
 */
static int check_device(const mn_kcoll_t *k, int gpu, uint64_t gid, const char *what, char *err, size_t errlen) {
  char a[24], b[24];
  if (k->dst != NULL && k->t->device != k->dst->device) {
    snprintf(err, errlen, "%s: src is on %s but dst is on %s; a collective's tensors must be on one device", what,
             where(k->t, a), where(k->dst, b));
    return MN_EINVAL;
  }
  if (k->t->device >= 0 && !gpu) {
    snprintf(err, errlen,
             "%s: the tensor is on %s but group %llu has no NCCL communicator; make the group with "
             "mesh:group{ gpu = true } to run collectives on GPU tensors", what, where(k->t, a), (unsigned long long)gid);
    return MN_EDEVICE;
  }
  if (k->t->device < 0 && gpu) {
    snprintf(err, errlen,
             "%s: the tensor is on the CPU but group %llu is a GPU group (mesh:group{ gpu = true }); pass GPU "
             "tensors, or make a group with mesh:group() for CPU tensors", what, (unsigned long long)gid);
    return MN_EDEVICE;
  }
  return 0;
}

/* "all_reduce(sum, f32) of 1024 elements", as mismatch messages name a GPU collective described by d. */
static void describe_text(const int64_t *d, char *out, size_t n) {
  static const char *const ops[] = {"sum", "max", "min", "avg"};
  const char *what = d[1] >= 0 && d[1] <= MN_KCOLL_FENCE ? kcoll_names[d[1]] : "?";
  const char *dt = d[3] >= 0 && d[3] < MK_DTYPE_COUNT ? mn_dtype_name((mk_dtype_t)d[3]) : "?";
  const char *op = d[2] >= 0 && d[2] < 4 ? ops[d[2]] : "?";
  if (d[1] == MN_KCOLL_BROADCAST) snprintf(out, n, "%s(root %lld, %s) of %lld elements", what, (long long)d[2], dt,
                                           (long long)d[4]);
  else if (d[1] == MN_KCOLL_ALL_GATHER) snprintf(out, n, "%s(%s) of %lld elements", what, dt, (long long)d[4]);
  else snprintf(out, n, "%s(%s, %s) of %lld elements", what, op, dt, (long long)d[4]);
}

/*
 * NCCL cannot tell two members that called different collectives (it would
 * hang or mix the data), so before every GPU collective the members swap a
 * description of it over the CPU group (one small all_gather): rank, what,
 * op or root, dtype, numel of each side. Returns 0 when every member
 * described the same call, else MN_EPEER with *mismatch set and a message
 * naming both calls, or the CPU collective's own failure.
 */
static int agree(mn_exec_t *x, const mk_group_t *g, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch) {
  int64_t mine[MN_KCOLL_DESC] = {x->rank, k->what, k->arg, k->t->dtype, k->t->numel, k->dst ? k->dst->numel : -1};
  int64_t *all = calloc((size_t)g->size, sizeof(mine));
  char why[MN_MAX_ERRMSG], a[160], b[160];
  if (all == NULL) {
    snprintf(err, errlen, "%s: out of memory", kcoll_names[k->what]);
    return MN_ENOMEM;
  }
  mk_tensor_t src = {mine, MK_I64, 1, {MN_KCOLL_DESC}, MN_KCOLL_DESC, sizeof(mine), -1, 0};
  mk_tensor_t dst = {all, MK_I64, 1, {MN_KCOLL_DESC * g->size}, MN_KCOLL_DESC * g->size, sizeof(mine) * g->size, -1, 0};
  mn_kcoll_t swap = {MN_KCOLL_ALL_GATHER, g->id, &src, &dst, 0};
  int rc = coll_ops->run(x, &swap, why, sizeof(why), mismatch);
  if (rc != 0) snprintf(err, errlen, "%s on GPU tensors (checking that every member makes the same call): %.900s",
                        kcoll_names[k->what], why);
  for (int i = 0; rc == 0 && i < g->size; i++) {
    const int64_t *d = all + (size_t)i * MN_KCOLL_DESC;
    if (memcmp(d + 1, mine + 1, sizeof(mine) - sizeof(mine[0])) == 0) continue;
    describe_text(d, a, sizeof(a));
    describe_text(mine, b, sizeof(b));
    snprintf(err, errlen, "rank %lld called %s but rank %d called %s on GPU group %llu", (long long)d[0], a, x->rank,
             b, (unsigned long long)g->id);
    *mismatch = 1;
    rc = MN_EPEER;
  }
  free(all);
  return rc;
}

/* A collective on a GPU group: every member agrees on it, then NCCL runs it. A barrier drains the stream first. */
static int gpu_kcoll(mn_exec_t *x, mk_ctx_t *ctx, const mk_group_t *g, mn_kcoll_t *k, char *err, size_t errlen,
                     int *mismatch) {
  int rc;
  if (k->what == MN_KCOLL_BARRIER) {
    rc = gpu_ops->run(x, ctx, k, err, errlen);
    return rc != 0 ? rc : coll_ops->run(x, k, err, errlen, mismatch);
  }
  rc = agree(x, g, k, err, errlen, mismatch);
  return rc != 0 ? rc : gpu_ops->run(x, ctx, k, err, errlen);
}

/* The span of a collective the kernel ran (inside its call's span): its name and payload. */
static void trace_kcoll(mn_exec_t *x, const mn_kcoll_t *k, int64_t t0, int rc) {
  const char *what = kcoll_names[k->what];
  mn_trace_span_t *s = mn_trace_push(&x->trace, MN_TRACE_KCOLL, what, strlen(what), t0);
  s->tensor_bytes = (k->t ? k->t->nbytes : 0) + (k->dst ? k->dst->nbytes : 0);
  s->failed = rc != 0;
}

/* Runs k for the kernel on ctx: checks, the collective, and on any failure the group given up on every member. */
static int kcoll(mk_ctx_t *ctx, const mk_group_t *g, mn_kcoll_t *k) {
  mn_exec_t *x = ctx->host;
  const char *what = kcoll_names[k->what];
  char err[MN_MAX_ERRMSG];
  int mismatch = 0, rc = 0;
  int ours = g != NULL && g >= x->kgroups && g < x->kgroups + x->nkgroups;
  if (!ours) {
    snprintf(err, sizeof(err), "%s: the group is not one of this call's group ('g') arguments", what);
    snprintf(x->errmsg, sizeof(x->errmsg), "%s", err);
    x->failed = 1;
    x->kcoll_kind = "collective";
    return MN_EINVAL;
  }
  k->gid = g->id;
  int gpu = gpu_ops != NULL && gpu_ops->has(g->id);
  if (coll_ops == NULL) {
    snprintf(err, sizeof(err), "%s: this proc runs no collectives", what);
    rc = MN_ENOTFOUND;
  } else if (k->t != NULL || k->what != MN_KCOLL_BARRIER) {
    rc = check_tensor(k->t, what, err, sizeof(err));
    if (rc == 0 && (k->what == MN_KCOLL_ALL_GATHER || k->what == MN_KCOLL_REDUCE_SCATTER))
      rc = check_tensor(k->dst, what, err, sizeof(err));
    if (rc == 0) rc = check_device(k, gpu, g->id, what, err, sizeof(err));
  }
  if (rc != 0) return kcoll_failed(x, g->id, rc, 0, err);
  int64_t t0 = x->trace.on ? mn_trace_now(&x->trace) : 0;
  if (gpu) rc = gpu_kcoll(x, ctx, g, k, err, sizeof(err), &mismatch);
  else rc = coll_ops->run(x, k, err, sizeof(err), &mismatch);
  if (x->trace.on) trace_kcoll(x, k, t0, rc);
  return rc == 0 ? 0 : kcoll_failed(x, g->id, rc, mismatch, err);
}

int mn__exec_api_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op) {
  mn_kcoll_t k = {MN_KCOLL_ALL_REDUCE, 0, t, NULL, op};
  return kcoll(ctx, g, &k);
}

int mn__exec_api_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root) {
  mn_kcoll_t k = {MN_KCOLL_BROADCAST, 0, t, NULL, root};
  return kcoll(ctx, g, &k);
}

int mn__exec_api_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst) {
  mn_kcoll_t k = {MN_KCOLL_ALL_GATHER, 0, (mk_tensor_t *)src, dst, 0};
  return kcoll(ctx, g, &k);
}

int mn__exec_api_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst, int op) {
  mn_kcoll_t k = {MN_KCOLL_REDUCE_SCATTER, 0, (mk_tensor_t *)src, dst, op};
  return kcoll(ctx, g, &k);
}

int mn__exec_api_barrier(mk_ctx_t *ctx, const mk_group_t *g) {
  mn_kcoll_t k = {MN_KCOLL_BARRIER, 0, NULL, NULL, 0};
  return kcoll(ctx, g, &k);
}

void mn__exec_kernel_groups_done(mn_exec_t *x, const char *kernel, int failed) {
  char why[MN_MAX_ERRMSG];
  for (int i = 0; coll_ops != NULL && i < x->nkgroups; i++) {
    uint64_t gid = x->kgroups[i].id;
    if (failed || x->failed) {
      /* The others may be waiting in a collective this member will never call: tell them now. */
      /* A reason longer than an ABORT carries (MN_COLL_MAX_ABORT_MSG) is cut there anyway. */
      snprintf(why, sizeof(why), "kernel '%.64s' failed on rank %d: %.900s", kernel, x->rank,
               x->errmsg[0] ? x->errmsg : "kernel failed without a message");
      give_up(x, gid, why);
      continue;
    }
    mn_kcoll_t k = {MN_KCOLL_FENCE, gid, NULL, NULL, 0};
    int mismatch = 0, rc = coll_ops->run(x, &k, why, sizeof(why), &mismatch);
    if (rc != 0) kcoll_failed(x, gid, rc, mismatch, why);
  }
  x->nkgroups = 0;
}
