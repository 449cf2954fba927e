/*
 * gpt_train.cu - cuda_gpt's gpt_train (gpt_cuda.h) and the checks every
 * kernel of the library makes. One training step, as gpt_train.c's:
 *   batch of (seed, step, dp rank), drawn on the host from the CPU text D
 *   -> forward -> loss -> backward into G (device) -> one all-reduce of the
 *   whole flat G over dp (NCCL) -> global gradient norm (sharded parts
 *   summed over tp) -> clip -> AdamW.
 * P, G, S are device memory; the text D stays a CPU tensor (gpt's
 * gpt_text_load fills it), and each step copies its B x T tokens, their
 * embedding buckets and the segment table to the device in one copy.
 */
#include <math.h>
#include <string.h>

#include "gpt_cuda.h"

#define GCU_MAX_FUSED 2000 /* most steps per gpt_train call, as gpt_train.c's GPT_MAX_FUSED */

/* A GPU f32 tensor of n elements (n < 0: any) on dev (dev < 0: any device). */
int gcu_check_f32(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t, int dev, int64_t n) {
  if (t->device < 0) return mk_errorf(ctx, "%s: cuda_gpt is a GPU library; %s is on the CPU (use gpt)", k, name);
  if (dev >= 0 && t->device != dev)
    return mk_errorf(ctx, "%s: %s is on cuda:%d but P is on cuda:%d", k, name, t->device, dev);
  if (t->dtype != MK_F32 || (n >= 0 && t->numel != n))
    return mk_errorf(ctx, "%s: %s must be f32[%lld] on the GPU, got %s[%lld]", k, name, (long long)n,
                     mk_dtype_name(t->dtype), (long long)t->numel);
  return 0;
}

/* The text: a CPU u8 tensor (the batches are drawn from it on the host, as gpt draws them). */
int gcu_check_text(mk_ctx_t *ctx, const char *k, const mk_tensor_t *D) {
  if (D->device >= 0 || D->dtype != MK_U8)
    return mk_errorf(ctx, "%s: D must be a CPU u8 tensor (gpt's gpt_text_load fills it), got %s on %s", k,
                     mk_dtype_name(D->dtype), D->device >= 0 ? "the GPU" : "the CPU");
  return 0;
}

/* Sizes from argv[0..3] (layers, heads, width, context) and the tp group. */
int gcu_cfg(mk_ctx_t *ctx, const char *k, gpt_cfg_t *c, const mk_arg_t *argv, const mk_group_t *tp) {
  const char *why = gpt_cfg_init(c, argv[0].v.i, argv[1].v.i, argv[2].v.i, argv[3].v.i, tp ? tp->size : 1,
                                 tp ? tp->rank : 0);
  return why ? mk_errorf(ctx, "%s: %s", k, why) : 0;
}

typedef struct {
  gcu_t g;
  gpt_cfg_t c;
  const mk_group_t *tp, *dp;
  float *P, *G, *m, *v;
  int64_t np, ntrain, seed, warmup, total, maxn;
  const uint8_t *D;
  int B, nseg;
  double lr, wd, clip;
  /* Device: model memory, row losses, norm partials, {rep, shd}; the staged region (segs | order | start | x | y). */
  float *mem;
  double *rowloss, *part, *rep;
  float *shd;
  char *stage;
  size_t stage_len, o_order, o_start, o_x, o_y;
  char *host; /* the staged region's host copy (call scratch) */
} train_t;

/* Lays out the staged region (offsets from its start) and the device block; 0 or the error. */
static int train_mem(mk_ctx_t *ctx, train_t *t) {
  size_t N = (size_t)t->B * (size_t)t->c.T, st = 0, off = 0;
  gcu_take(&st, GPT_MAX_SEGS * sizeof(gcu_seg_t));
  t->o_order = gcu_take(&st, N * sizeof(int32_t));
  t->o_start = gcu_take(&st, (GPT_VOCAB + 1) * sizeof(int32_t));
  t->o_x = gcu_take(&st, N), t->o_y = gcu_take(&st, N);
  t->stage_len = st;
  size_t o_mem = gcu_take(&off, gcu_model_floats(&t->c, t->B) * sizeof(float));
  size_t o_row = gcu_take(&off, N * sizeof(double));
  size_t o_part = gcu_take(&off, (size_t)GPT_MAX_SEGS * GCU_NORM_BLOCKS * sizeof(double));
  size_t o_rep = gcu_take(&off, sizeof(double) + sizeof(float));
  size_t o_stage = gcu_take(&off, st);
  char *base = (char *)gcu_scratch(&t->g, off);
  t->host = (char *)mk_scratch(ctx, st);
  if (base == NULL) return -1;
  if (t->host == NULL) return mk_errorf(ctx, "%s: no scratch memory for %zu bytes of batch", t->g.k, st);
  t->mem = (float *)(base + o_mem), t->rowloss = (double *)(base + o_row), t->part = (double *)(base + o_part);
  t->rep = (double *)(base + o_rep), t->shd = (float *)(t->rep + 1), t->stage = base + o_stage;
  return 0;
}

/* This step's batch, its buckets and the segment table (decay at this step's lr) to the device, in one copy. */
static int stage_batch(train_t *t, int64_t step, float lr) {
  int N = t->B * t->c.T;
  uint8_t *x = (uint8_t *)(t->host + t->o_x), *y = (uint8_t *)(t->host + t->o_y);
  gpt_batch(x, y, t->D, 0, t->ntrain, t->B, t->c.T, t->seed, step, (int64_t)t->dp->rank * t->B);
  gcu_embed_buckets(x, N, (int32_t *)(t->host + t->o_order), (int32_t *)(t->host + t->o_start));
  t->nseg = gcu_segments(&t->c, lr, (float)t->wd, (gcu_seg_t *)t->host);
  const gcu_seg_t *seg = (const gcu_seg_t *)t->host;
  t->maxn = 0;
  for (int k = 0; k < t->nseg; k++) t->maxn = seg[k].n > t->maxn ? seg[k].n : t->maxn;
  return gcu_copy(&t->g, t->stage, t->host, t->stage_len, cudaMemcpyHostToDevice);
}

/* The loss summed into G[np] (it rides the dp all-reduce), then the norm: squares on the device, shd over tp. */
static int loss_and_norm(train_t *t, double *loss, double *norm) {
  int N = t->B * t->c.T, dpn = t->dp->size, rc;
  const gcu_seg_t *seg = (const gcu_seg_t *)t->stage;
  if (dpn > 1 && (rc = gcu_all_reduce(&t->g, t->dp, t->G, t->np + 1, MK_F32))) return rc;
  if ((rc = gcu_sumsq(&t->g, t->G, seg, t->nseg, t->part, t->rep, t->shd)) ||
      (rc = gcu_all_reduce(&t->g, t->tp, t->shd, 1, MK_F32)))
    return rc;
  struct {
    double rep;
    float shd;
  } h;
  float lsum;
  if ((rc = gcu_copy(&t->g, &h, t->rep, sizeof(double) + sizeof(float), cudaMemcpyDeviceToHost)) ||
      (rc = gcu_copy(&t->g, &lsum, t->G + t->np, sizeof(float), cudaMemcpyDeviceToHost)))
    return rc;
  *loss = (double)lsum / ((double)N * dpn);
  *norm = sqrt(h.rep + (double)h.shd) / dpn;
  return 0;
}

static int train_step(train_t *t, int64_t step, double *loss, double *norm) {
  int N = t->B * t->c.T, rc;
  float *logits, lr = (float)gpt_lr_at(step, t->lr, t->warmup, t->total);
  const int32_t *order = (const int32_t *)(t->stage + t->o_order), *start = (const int32_t *)(t->stage + t->o_start);
  const uint8_t *x = (const uint8_t *)(t->stage + t->o_x), *y = (const uint8_t *)(t->stage + t->o_y);
  gcu_t *g = &t->g;
  if ((rc = gcu_cuda(g, "cudaMemsetAsync", cudaMemsetAsync(t->G, 0, (size_t)(t->np + 1) * sizeof(float), g->s))) ||
      (rc = stage_batch(t, step, lr)) || (rc = gcu_model_forward(g, t->tp, &t->c, t->P, x, t->B, t->mem, &logits)) ||
      (rc = gcu_xent_forward(g, logits, logits, y, N, t->c.V, 1.0f / (float)N, t->rowloss)) ||
      (rc = gcu_sum_rows(g, t->rowloss, N, NULL, t->G + t->np)) ||
      (rc = gcu_model_backward(g, t->tp, &t->c, t->P, t->G, order, start, t->B, t->mem, logits)) ||
      (rc = loss_and_norm(t, loss, norm)))
    return rc;
  float clipf = t->clip > 0 ? (float)fmin(t->clip / (*norm + 1e-6), 1.0) : 1.0f;
  return gcu_adamw(g, t->P, t->G, t->m, t->v, (const gcu_seg_t *)t->stage, t->nseg, t->maxn, lr, step + 1,
                   clipf / (float)t->dp->size);
}

/* Checks gpt_train's arguments (the table's order) into t; 0 or the error. */
static int train_args(mk_ctx_t *ctx, const char *k, train_t *t, const mk_arg_t *argv) {
  const mk_tensor_t *P = argv[2].v.tensor, *D = argv[5].v.tensor;
  int64_t B = argv[11].v.i, K = argv[14].v.i;
  t->tp = argv[0].v.group, t->dp = argv[1].v.group;
  if (gcu_cfg(ctx, k, &t->c, argv + 7, t->tp)) return -1;
  t->np = gpt_numel(&t->c);
  if (gcu_check_f32(ctx, k, "P", P, -1, t->np) || gcu_check_f32(ctx, k, "G", argv[3].v.tensor, P->device, t->np + 1) ||
      gcu_check_f32(ctx, k, "S", argv[4].v.tensor, P->device, 2 * t->np) || gcu_check_text(ctx, k, D))
    return -1;
  t->ntrain = argv[6].v.i;
  if (t->ntrain < t->c.T + 2 || t->ntrain > D->numel)
    return mk_errorf(ctx, "%s: ntrain %lld must be in %d..%lld", k, (long long)t->ntrain, t->c.T + 2,
                     (long long)D->numel);
  if (B < 1 || B > GPT_MAX_BATCH) return mk_errorf(ctx, "%s: batch must be in 1..%d", k, GPT_MAX_BATCH);
  if (K < 1 || K > GCU_MAX_FUSED || argv[13].v.i < 0) return mk_errorf(ctx, "%s: K must be in 1..%d", k, GCU_MAX_FUSED);
  t->B = (int)B, t->seed = argv[12].v.i, t->lr = argv[15].v.num, t->warmup = argv[16].v.i, t->total = argv[17].v.i;
  t->wd = argv[18].v.num, t->clip = argv[19].v.num, t->D = (const uint8_t *)D->data;
  t->P = (float *)P->data, t->G = (float *)argv[3].v.tensor->data, t->m = (float *)argv[4].v.tensor->data;
  t->v = t->m + t->np;
  return 0;
}

/* gpt_train(tpg, dpg, P, G, S, D, ntrain, L, H, C, T, B, seed, first, K, lr, warmup, total, wd, clip) */
int gcu_k_train(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_train";
  train_t t = {};
  if (train_args(ctx, k, &t, argv) || gcu_open(&t.g, ctx, k, argv[2].v.tensor->device) || train_mem(ctx, &t))
    return -1;
  for (int64_t s = argv[13].v.i; s < argv[13].v.i + argv[14].v.i; s++) {
    double loss, norm;
    int rc;
    if (mk_cancelled(ctx)) return mk_errorf(ctx, "%s: cancelled at step %lld", k, (long long)s);
    if ((rc = train_step(&t, s, &loss, &norm))) return rc;
    if ((rc = mk_return_number(ctx, loss)) || (rc = mk_return_number(ctx, norm))) return rc;
  }
  return 0;
}
