/*
 * exec_coll.c - collectives kernels call themselves (mk_all_reduce ... in
 * monarch_kernel.h): group arguments, the mk_api_t entries, and what a
 * call does with its groups when the kernel returns. The collectives run
 * through the hooks the collective module installs (mn_exec_set_coll), on
 * the executor thread, inside the kernel's call.
 */
#include "exec_int.h"

#include <stdio.h>
#include <string.h>

_Static_assert(MK_COLL_ETIMEDOUT == MN_ETIMEDOUT && MK_COLL_EINVAL == MN_EINVAL && MK_COLL_ENOTFOUND == MN_ENOTFOUND &&
                   MK_COLL_EPEER == MN_EPEER && MK_COLL_ECANCELED == MN_ECANCELED && MK_COLL_EDEVICE == MN_EDEVICE,
               "the kernel ABI's collective codes are err.h's");

static const mn_exec_coll_t *coll_ops;

void mn_exec_set_coll(const mn_exec_coll_t *ops) { coll_ops = ops; }

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
  for (int i = 0; coll_ops != NULL && i < x->nkgroups; i++) coll_ops->abort(x, x->kgroups[i].id, why);
  x->nkgroups = 0;
}

/* Records a failure of an in-kernel collective as the call's error; returns rc. */
static int kcoll_failed(mn_exec_t *x, int rc, int mismatch, const char *msg) {
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
  if (t->device >= 0) {
    snprintf(err, errlen,
             "%s: the tensor is on cuda:%d; in-kernel collectives run on CPU tensors (NCCL on the proc's stream is not "
             "available to kernels in this build)", what, t->device);
    return MN_EDEVICE;
  }
  return 0;
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
    return kcoll_failed(x, MN_EINVAL, 0, err);
  }
  k->gid = g->id;
  if (coll_ops == NULL) {
    snprintf(err, sizeof(err), "%s: this proc runs no collectives", what);
    rc = MN_ENOTFOUND;
  } else if (k->t != NULL || k->what != MN_KCOLL_BARRIER) {
    rc = check_tensor(k->t, what, err, sizeof(err));
    if (rc == 0 && (k->what == MN_KCOLL_ALL_GATHER || k->what == MN_KCOLL_REDUCE_SCATTER))
      rc = check_tensor(k->dst, what, err, sizeof(err));
  }
  if (rc != 0) {
    if (coll_ops != NULL) coll_ops->abort(x, g->id, err);
    return kcoll_failed(x, rc, 0, err);
  }
  rc = coll_ops->run(x, k, err, sizeof(err), &mismatch);
  return rc == 0 ? 0 : kcoll_failed(x, rc, mismatch, err);
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
      coll_ops->abort(x, gid, why);
      continue;
    }
    mn_kcoll_t k = {MN_KCOLL_FENCE, gid, NULL, NULL, 0};
    int mismatch = 0, rc = coll_ops->run(x, &k, why, sizeof(why), &mismatch);
    if (rc != 0) kcoll_failed(x, rc, mismatch, why);
  }
  x->nkgroups = 0;
}
