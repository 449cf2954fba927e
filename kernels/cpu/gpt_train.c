/*
 * gpt_train.c - the "gpt" library's kernels that run the model (gpt.h):
 * gpt_train (K fused steps), gpt_eval and gpt_sample. One training step:
 *   batch of (seed, step, dp rank) -> forward -> loss -> backward into G
 *   -> one all-reduce of the whole flat G over dp (the bucket) -> global
 *   gradient norm (sharded parts summed over tp) -> clip -> AdamW.
 */
#include <math.h>
#include <string.h>

#include "gpt.h"

#define GPT_MAX_FUSED 2000    /* most steps per gpt_train call (two results each, under MN_MAX_RESULTS) */
#define GPT_MAX_SAMPLE 65536  /* most bytes gpt_sample generates */
#define GPT_MAX_WINDOWS 65536 /* most validation windows of gpt_eval */

typedef struct {
  gpt_cfg_t c;
  gpt_comm_t tp;
  const mk_group_t *dp;
  float *P, *G, *m, *v;
  int64_t np, ntrain, seed, warmup, total;
  const uint8_t *D;
  int B;
  double lr, wd, clip;
  float *mem;
  uint8_t *x, *y;
} train_t;

static int want(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t, mk_dtype_t dt, int64_t n) {
  if (t->device >= 0) return mk_errorf(ctx, "%s: gpt is a CPU library; %s is on cuda:%d", k, name, t->device);
  if (t->dtype != dt || (n >= 0 && t->numel != n))
    return mk_errorf(ctx, "%s: %s must be %s[%lld], got %s[%lld]", k, name, mk_dtype_name(dt), (long long)n,
                     mk_dtype_name(t->dtype), (long long)t->numel);
  return 0;
}

/* Model memory and the batch bytes for B sequences, from scratch. */
static int get_mem(mk_ctx_t *ctx, const char *k, const gpt_cfg_t *c, int B, float **mem, uint8_t **x, uint8_t **y) {
  size_t nf = gpt_model_floats(c, B), nb = (size_t)B * (size_t)c->T;
  *mem = mk_scratch(ctx, nf * sizeof(float) + 2 * nb);
  if (*mem == NULL) return mk_errorf(ctx, "%s: no scratch memory for %zu floats of activations", k, nf);
  *x = (uint8_t *)(*mem + nf), *y = *x + nb;
  return 0;
}

/* sqrt of the sum of squares of G: replicated segments once, sharded ones summed over tp. */
static int grad_norm(train_t *t, double *out) {
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(&t->c, s), rc;
  double rep = 0.0, shd = 0.0;
  for (int k = 0; k < n; k++) {
    const float *g = t->G + s[k].off;
    double sum = 0.0;
    for (int64_t i = 0; i < s[k].rows * s[k].cols; i++) sum += (double)g[i] * g[i];
    if (s[k].split == SPLIT_NONE) rep += sum; else shd += sum;
  }
  float f = (float)shd;
  if ((rc = gpt_all_reduce(&t->tp, &f, 1))) return rc;
  *out = sqrt(rep + (double)f);
  return 0;
}

static int train_step(mk_ctx_t *ctx, train_t *t, int64_t step, double *loss, double *norm) {
  int N = t->B * t->c.T, rc, dpn = t->dp->size;
  float *logits;
  memset(t->G, 0, (size_t)(t->np + 1) * sizeof(float));
  gpt_batch(t->x, t->y, t->D, 0, t->ntrain, t->B, t->c.T, t->seed, step, (int64_t)t->dp->rank * t->B);
  if ((rc = gpt_model_forward(&t->tp, &t->c, t->P, t->x, t->B, t->mem, &logits))) return rc;
  t->G[t->np] = (float)gpt_xent_forward(logits, logits, t->y, N, t->c.V, 1.0f / (float)N);
  if ((rc = gpt_model_backward(&t->tp, &t->c, t->P, t->G, t->x, t->B, t->mem, logits))) return rc;
  if (dpn > 1) {
    gpt_comm_t dp = {ctx, t->dp};
    if ((rc = gpt_all_reduce(&dp, t->G, t->np + 1))) return rc;
  }
  *loss = (double)t->G[t->np] / ((double)N * dpn);
  if ((rc = grad_norm(t, norm))) return rc;
  *norm /= dpn;
  float clipf = t->clip > 0 ? (float)fmin(t->clip / (*norm + 1e-6), 1.0) : 1.0f;
  float lr = (float)gpt_lr_at(step, t->lr, t->warmup, t->total);
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(&t->c, s);
  for (int k = 0; k < n; k++) {
    float wd = s[k].kind == SEG_MATRIX || s[k].kind == SEG_PROJ ? (float)t->wd : 0.0f;
    gpt_adamw(t->P, t->G, t->m, t->v, s[k].off, s[k].off + s[k].rows * s[k].cols, lr, wd, step + 1,
              clipf / (float)dpn);
  }
  return 0;
}

/* gpt_train(tpg, dpg, P, G, S, D, ntrain, L, H, C, T, B, seed, first, K, lr, warmup, total, wd, clip) */
int gpt_k_train(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "gpt_train";
  train_t t = {.tp = {ctx, argv[0].v.group}, .dp = argv[1].v.group};
  const char *why = gpt_cfg_init(&t.c, argv[7].v.i, argv[8].v.i, argv[9].v.i, argv[10].v.i, t.tp.g->size,
                                 t.tp.g->rank);
  if (why) return mk_errorf(ctx, "%s: %s", k, why);
  int64_t B = argv[11].v.i, first = argv[13].v.i, K = argv[14].v.i;
  t.np = gpt_numel(&t.c);
  if (want(ctx, k, "P", argv[2].v.tensor, MK_F32, t.np) || want(ctx, k, "G", argv[3].v.tensor, MK_F32, t.np + 1) ||
      want(ctx, k, "S", argv[4].v.tensor, MK_F32, 2 * t.np) || want(ctx, k, "D", argv[5].v.tensor, MK_U8, -1))
    return -1;
  t.ntrain = argv[6].v.i, t.D = argv[5].v.tensor->data;
  if (t.ntrain < t.c.T + 2 || t.ntrain > argv[5].v.tensor->numel)
    return mk_errorf(ctx, "%s: ntrain %lld must be in %d..%lld", k, (long long)t.ntrain, t.c.T + 2,
                     (long long)argv[5].v.tensor->numel);
  if (B < 1 || B > GPT_MAX_BATCH) return mk_errorf(ctx, "%s: batch must be in 1..%d", k, GPT_MAX_BATCH);
  if (K < 1 || K > GPT_MAX_FUSED || first < 0) return mk_errorf(ctx, "%s: K must be in 1..%d", k, GPT_MAX_FUSED);
  t.B = (int)B, t.seed = argv[12].v.i, t.lr = argv[15].v.num, t.warmup = argv[16].v.i, t.total = argv[17].v.i;
  t.wd = argv[18].v.num, t.clip = argv[19].v.num;
  t.P = argv[2].v.tensor->data, t.G = argv[3].v.tensor->data, t.m = argv[4].v.tensor->data, t.v = t.m + t.np;
  if (get_mem(ctx, k, &t.c, t.B, &t.mem, &t.x, &t.y)) return -1;
  for (int64_t s = first; s < first + K; s++) {
    double loss, norm;
    int rc;
    if (mk_cancelled(ctx)) return mk_errorf(ctx, "%s: cancelled at step %lld", k, (long long)s);
    if ((rc = train_step(ctx, &t, s, &loss, &norm))) return rc;
    if ((rc = mk_return_number(ctx, loss)) || (rc = mk_return_number(ctx, norm))) return rc;
  }
  return 0;
}

/* Starts of this part's validation windows (j % parts == part of `windows` evenly spaced) go to x and y. */
static int eval_batch(const uint8_t *D, int64_t ntrain, int T, int B, int64_t windows, int64_t first,
                      int64_t stride, uint8_t *x, uint8_t *y) {
  int k = 0;
  for (; k < B && first + k < windows; k++) {
    int64_t s = ntrain + (first + k) * stride;
    for (int i = 0; i < T; i++) x[(size_t)k * T + i] = D[s + i], y[(size_t)k * T + i] = D[s + i + 1];
  }
  memset(x + (size_t)k * T, 0, (size_t)(B - k) * T);
  return k;
}

/*
 * gpt_eval(tpg, dpg, P, D, ntrain, L, H, C, T, B, windows) -> summed loss, tokens over all the windows:
 * each dp rank runs its part of them, and the sums are all-reduced over dp.
 */
int gpt_k_eval(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "gpt_eval";
  gpt_cfg_t c;
  gpt_comm_t tp = {ctx, argv[0].v.group}, dp = {ctx, argv[1].v.group};
  argv++; /* the rest as in the table, after the two groups */
  const char *why = gpt_cfg_init(&c, argv[4].v.i, argv[5].v.i, argv[6].v.i, argv[7].v.i, tp.g->size, tp.g->rank);
  if (why) return mk_errorf(ctx, "%s: %s", k, why);
  const mk_tensor_t *D = argv[2].v.tensor;
  int64_t ntrain = argv[3].v.i, B = argv[8].v.i, W = argv[9].v.i, part = dp.g->rank, parts = dp.g->size;
  if (want(ctx, k, "P", argv[1].v.tensor, MK_F32, gpt_numel(&c)) || want(ctx, k, "D", D, MK_U8, -1)) return -1;
  if (B < 1 || B > GPT_MAX_BATCH || W < 1 || W > GPT_MAX_WINDOWS)
    return mk_errorf(ctx, "%s: want batch 1..%d, windows 1..%d", k, GPT_MAX_BATCH, GPT_MAX_WINDOWS);
  int64_t stride = ntrain >= 0 && ntrain < D->numel ? (D->numel - ntrain - c.T - 1) / W : 0;
  if (stride < 1) return mk_errorf(ctx, "%s: validation text too short for %lld windows", k, (long long)W);
  float *mem = NULL, *logits = NULL;
  uint8_t *x = NULL, *y = NULL;
  if (get_mem(ctx, k, &c, (int)B, &mem, &x, &y)) return -1;
  double loss = 0.0;
  int64_t tokens = 0;
  int64_t per = (W + parts - 1) / parts, lo = part * per, hi = lo + per < W ? lo + per : W;
  for (int64_t j = lo; j < hi; j += B) {
    int rc, got = eval_batch(D->data, ntrain, c.T, (int)B, hi, j, stride, x, y);
    if (mk_cancelled(ctx)) return mk_error(ctx, "gpt_eval: cancelled");
    if ((rc = gpt_model_forward(&tp, &c, argv[1].v.tensor->data, x, (int)B, mem, &logits))) return rc;
    loss += gpt_xent_forward(NULL, logits, y, got * c.T, c.V, 0.0f);
    tokens += (int64_t)got * c.T;
  }
  float sums[2] = {(float)loss, (float)tokens};
  int rc = gpt_all_reduce(&dp, sums, 2);
  if (rc == 0) rc = mk_return_number(ctx, sums[0]);
  return rc ? rc : mk_return_int(ctx, (int64_t)sums[1]);
}

/* gpt_sample(tpg, P, L, H, C, T, prompt, n, seed, temperature) -> n bytes following the prompt */
int gpt_k_sample(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "gpt_sample";
  gpt_cfg_t c;
  gpt_comm_t tp = {ctx, argv[0].v.group};
  const char *why = gpt_cfg_init(&c, argv[2].v.i, argv[3].v.i, argv[4].v.i, argv[5].v.i, tp.g->size, tp.g->rank);
  if (why) return mk_errorf(ctx, "%s: %s", k, why);
  int64_t n = argv[7].v.i, plen = (int64_t)argv[6].v.str.len;
  if (want(ctx, k, "P", argv[1].v.tensor, MK_F32, gpt_numel(&c))) return -1;
  if (n < 1 || n > GPT_MAX_SAMPLE || plen < 1) return mk_errorf(ctx, "%s: want a prompt and n in 1..%d", k, GPT_MAX_SAMPLE);
  float *mem = NULL, *logits = NULL;
  uint8_t *x = NULL, *y = NULL, *out = mk_scratch(ctx, (size_t)(plen + n));
  if (out == NULL || get_mem(ctx, k, &c, 1, &mem, &x, &y)) return mk_errorf(ctx, "%s: no scratch memory", k);
  memcpy(out, argv[6].v.str.ptr, (size_t)plen);
  for (int64_t i = plen; i < plen + n; i++) {
    /* The window starts at the left: causal attention makes the padding after it irrelevant. */
    int64_t w = i < c.T ? i : c.T, rc;
    memset(x, 0, (size_t)c.T);
    memcpy(x, out + i - w, (size_t)w);
    if (mk_cancelled(ctx)) return mk_error(ctx, "gpt_sample: cancelled");
    if ((rc = gpt_model_forward(&tp, &c, argv[1].v.tensor->data, x, 1, mem, &logits))) return (int)rc;
    rng_t r = rng_make(argv[8].v.i, TAG_GPT_SAMPLE, i, 0);
    out[i] = gpt_draw(logits + (size_t)(w - 1) * c.V, c.V, argv[9].v.num, (double)(rng_next(&r) >> 11) * 0x1p-53);
  }
  return mk_return_string(ctx, (const char *)out + plen, (size_t)n);
}
