/*
 * kcoll.c - the CPU kernel library "kcoll": kernels that run collectives
 * themselves (mk_all_reduce and friends, ABI 2) on a group the script passes
 * ('g'). They are the examples of docs/kernels.md, what the integration
 * specs drive, and the in-rank timing loop of bench/kcoll.lua.
 *
 * Ops are named as in Lua ("sum", "max", "min", "avg"). Every error message
 * starts with the kernel name; a failed collective's message is passed on.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monarch_kernel.h"

#define KC_MAX_BATCHES 64 /* most timed batches of kc_bench */

static int parse_op(mk_ctx_t *ctx, const char *k, const mk_arg_t *a, mk_reduce_op_t *op) {
  static const char *const names[] = {"sum", "max", "min", "avg"};
  for (int i = 0; i < 4; i++) {
    if (a->v.str.len == strlen(names[i]) && memcmp(a->v.str.ptr, names[i], a->v.str.len) == 0) {
      *op = (mk_reduce_op_t)i;
      return 0;
    }
  }
  return mk_errorf(ctx, "%s: unknown op '%.*s' (sum, max, min, avg)", k, (int)(a->v.str.len > 32 ? 32 : a->v.str.len),
                   a->v.str.ptr);
}

/* kc_all_reduce(g, t, op) */
static int k_all_reduce(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  mk_reduce_op_t op;
  if (parse_op(ctx, "kc_all_reduce", &argv[2], &op)) return -1;
  return mk_all_reduce(ctx, argv[0].v.group, argv[1].v.tensor, op);
}

/* kc_broadcast(g, t, root) */
static int k_broadcast(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  return mk_broadcast(ctx, argv[0].v.group, argv[1].v.tensor, (int)argv[2].v.i);
}

/* kc_all_gather(g, src, dst) */
static int k_all_gather(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  return mk_all_gather(ctx, argv[0].v.group, argv[1].v.tensor, argv[2].v.tensor);
}

/* kc_reduce_scatter(g, src, dst, op) */
static int k_reduce_scatter(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  mk_reduce_op_t op;
  if (parse_op(ctx, "kc_reduce_scatter", &argv[3], &op)) return -1;
  return mk_reduce_scatter(ctx, argv[0].v.group, argv[1].v.tensor, argv[2].v.tensor, op);
}

/* kc_barrier(g) -> this proc's position in the group and the group's size */
static int k_barrier(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_group_t *g = argv[0].v.group;
  int rc = mk_barrier(ctx, g);
  if (rc == 0) rc = mk_return_int(ctx, g->rank);
  return rc ? rc : mk_return_int(ctx, g->size);
}

/*
 * kc_steps(g, t, n): n all_reduce(sum)s of t, each after adding this
 * member's position + 1 to every f32 element; the sum of n rounds, so a
 * spec can check that collectives in one call follow each other in order.
 */
static int k_steps(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_group_t *g = argv[0].v.group;
  mk_tensor_t *t = argv[1].v.tensor;
  if (t->dtype != MK_F32) return mk_error(ctx, "kc_steps: want an f32 tensor");
  float *p = t->data;
  for (int64_t s = 0; s < argv[2].v.i; s++) {
    for (int64_t i = 0; i < t->numel; i++) p[i] += (float)(g->rank + 1);
    int rc = mk_all_reduce(ctx, g, t, MK_SUM);
    if (rc) return rc;
  }
  return 0;
}

/*
 * kc_misbehave(g, t, how, who): the member at position `who` departs from
 * the others, who all_reduce(sum) t once: "fail" returns an error first,
 * "exit" ends its process, "extra" runs a second all_reduce, "op" reduces
 * with max, "size" reduces only the first half of t, "gpu" hands over a
 * view of t that claims to be on cuda:0. For the failure specs.
 */
static int k_misbehave(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_group_t *g = argv[0].v.group;
  mk_tensor_t *t = argv[1].v.tensor, view = *argv[1].v.tensor;
  const char *how = argv[2].v.str.ptr;
  size_t hl = argv[2].v.str.len;
  int me = g->rank == (int)argv[3].v.i;
#define IS(s) (hl == strlen(s) && memcmp(how, s, hl) == 0)
  if (me && IS("fail")) return mk_errorf(ctx, "kc_misbehave: rank %d fails on purpose", ctx->rank);
  if (me && IS("exit")) _exit(9);
  if (me && IS("op")) return mk_all_reduce(ctx, g, t, MK_MAX);
  if (me && IS("size")) {
    view.numel = t->numel / 2;
    view.nbytes = (size_t)view.numel * mk_dtype_size(t->dtype);
    view.shape[0] = view.numel;
    view.ndim = 1;
    return mk_all_reduce(ctx, g, &view, MK_SUM);
  }
  if (me && IS("gpu")) {
    view.device = 0;
    return mk_all_reduce(ctx, g, &view, MK_SUM);
  }
  int rc = mk_all_reduce(ctx, g, t, MK_SUM);
  if (rc == 0 && me && IS("extra")) rc = mk_all_reduce(ctx, g, t, MK_SUM);
#undef IS
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One of the five collectives by name on t (for gathers and scatters, dst is the second tensor). */
static int run_named(mk_ctx_t *ctx, const mk_group_t *g, int which, mk_tensor_t *t, mk_tensor_t *dst) {
  switch (which) {
  case 0: return mk_all_reduce(ctx, g, t, MK_SUM);
  case 1: return mk_broadcast(ctx, g, t, 0);
  case 2: return mk_all_gather(ctx, g, t, dst);
  case 3: return mk_reduce_scatter(ctx, g, dst, t, MK_SUM);
  default: return mk_barrier(ctx, g);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/*
 * kc_bench(g, what, t, big, iters, batches): times `iters` back-to-back
 * collectives inside this proc, `batches` times after a barrier each, the
 * way bench/mpi_allreduce.c times MPI_Allreduce; returns the median batch's
 * seconds per collective. what: "all_reduce", "broadcast", "all_gather"
 * (t into big), "reduce_scatter" (big into t) or "barrier". big holds
 * size x numel(t) elements (any tensor when unused).
 */
static int k_bench(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  static const char *const names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  const mk_group_t *g = argv[0].v.group;
  mk_tensor_t *t = argv[2].v.tensor, *big = argv[3].v.tensor;
  int64_t iters = argv[4].v.i, nb = argv[5].v.i;
  int which = -1;
  for (int i = 0; i < 5; i++)
    if (argv[1].v.str.len == strlen(names[i]) && memcmp(argv[1].v.str.ptr, names[i], argv[1].v.str.len) == 0) which = i;
  if (which < 0) return mk_error(ctx, "kc_bench: what must be all_reduce, broadcast, all_gather, reduce_scatter or barrier");
  if (iters < 1 || nb < 1 || nb > KC_MAX_BATCHES)
    return mk_errorf(ctx, "kc_bench: want iters >= 1 and 1..%d batches", KC_MAX_BATCHES);
  double times[KC_MAX_BATCHES];
  int rc = run_named(ctx, g, which, t, big); /* warm up */
  for (int64_t b = 0; rc == 0 && b < nb; b++) {
    if ((rc = mk_barrier(ctx, g)) != 0) break;
    double t0 = now_s();
    for (int64_t i = 0; rc == 0 && i < iters; i++) rc = run_named(ctx, g, which, t, big);
    times[b] = (now_s() - t0) / (double)iters;
    if (mk_cancelled(ctx)) return mk_error(ctx, "kc_bench: cancelled");
  }
  if (rc) return rc;
  qsort(times, (size_t)nb, sizeof(double), cmp_double);
  return mk_return_number(ctx, times[nb / 2]);
}

static const mk_kernel_t kernels[] = {
  {"kc_all_reduce", k_all_reduce, "gts", "kc_all_reduce(g, t, op): mk_all_reduce of t over g."},
  {"kc_broadcast", k_broadcast, "gti", "kc_broadcast(g, t, root): mk_broadcast of the root's t."},
  {"kc_all_gather", k_all_gather, "gtt", "kc_all_gather(g, src, dst): mk_all_gather."},
  {"kc_reduce_scatter", k_reduce_scatter, "gtts", "kc_reduce_scatter(g, src, dst, op): mk_reduce_scatter."},
  {"kc_barrier", k_barrier, "g", "kc_barrier(g): mk_barrier; returns this proc's position and the group size."},
  {"kc_steps", k_steps, "gti", "kc_steps(g, t, n): n rounds of t += position + 1 and all_reduce(sum)."},
  {"kc_misbehave", k_misbehave, "gtsi", "kc_misbehave(g, t, how, who): one member departs from an all_reduce."},
  {"kc_bench", k_bench, "gsttii", "kc_bench(g, what, t, big, iters, batches): in-rank seconds per collective."},
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "kcoll", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels};
  return &lib;
}
