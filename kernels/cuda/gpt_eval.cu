/*
 * gpt_eval.cu - cuda_gpt's gpt_eval and gpt_sample (gpt_cuda.h): the model's
 * forward on the device over validation windows or a growing prompt, with
 * gpt_train.c's choice of windows and its sampling rule on the host.
 */
#include <math.h>
#include <string.h>

#include "gpt_cuda.h"

#define GCU_MAX_SAMPLE 65536  /* most bytes gpt_sample generates, as gpt_train.c's GPT_MAX_SAMPLE */
#define GCU_MAX_WINDOWS 65536 /* most validation windows of gpt_eval, as GPT_MAX_WINDOWS */

/* Windows first.. (up to B, below `windows`) of stride `stride` after ntrain into x and y; rows past them zero. */
static int eval_batch(const uint8_t *D, int64_t ntrain, int T, int B, int64_t windows, int64_t first, int64_t stride,
                      uint8_t *x, uint8_t *y) {
  int k = 0;
  for (; k < B && first + k < windows; k++) {
    int64_t s = ntrain + (first + k) * stride;
    for (int i = 0; i < T; i++) x[(size_t)k * T + i] = D[s + i], y[(size_t)k * T + i] = D[s + i + 1];
  }
  memset(x + (size_t)k * T, 0, (size_t)(B - k) * T);
  memset(y + (size_t)k * T, 0, (size_t)(B - k) * T);
  return k;
}

typedef struct {
  float *mem;
  double *rowloss, *sum;
  float *sums;   /* {loss, tokens} for the dp all-reduce */
  uint8_t *xy;   /* x [N] | y [N] on the device */
  uint8_t *host; /* the same on the host */
} eval_mem_t;

static int eval_mem(gcu_t *g, const gpt_cfg_t *c, int B, eval_mem_t *e) {
  size_t N = (size_t)B * (size_t)c->T, off = 0;
  size_t o_mem = gcu_take(&off, gcu_model_floats(c, B) * sizeof(float)), o_row = gcu_take(&off, N * sizeof(double));
  size_t o_sum = gcu_take(&off, sizeof(double)), o_sums = gcu_take(&off, 2 * sizeof(float));
  size_t o_xy = gcu_take(&off, 2 * N);
  char *base = (char *)gcu_scratch(g, off);
  if (base == NULL) return -1;
  e->mem = (float *)(base + o_mem), e->rowloss = (double *)(base + o_row), e->sum = (double *)(base + o_sum);
  e->sums = (float *)(base + o_sums), e->xy = (uint8_t *)(base + o_xy);
  e->host = (uint8_t *)mk_scratch(g->ctx, 2 * N);
  return e->host ? 0 : mk_errorf(g->ctx, "%s: no scratch memory for %zu bytes of batch", g->k, 2 * N);
}

/* Summed loss of windows [lo, hi) into *loss, B at a time. */
static int eval_windows(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const float *P, const mk_tensor_t *D,
                        int64_t ntrain, int B, int64_t lo, int64_t hi, int64_t stride, eval_mem_t *e, double *loss) {
  size_t N = (size_t)B * (size_t)c->T;
  for (int64_t j = lo; j < hi; j += B) {
    int rc, got = eval_batch((const uint8_t *)D->data, ntrain, c->T, B, hi, j, stride, e->host, e->host + N);
    float *logits;
    double part;
    if (mk_cancelled(g->ctx)) return mk_errorf(g->ctx, "%s: cancelled", g->k);
    if ((rc = gcu_copy(g, e->xy, e->host, 2 * N, cudaMemcpyHostToDevice)) ||
        (rc = gcu_model_forward(g, tp, c, P, e->xy, B, e->mem, &logits)) ||
        (rc = gcu_xent_forward(g, NULL, logits, e->xy + N, got * c->T, c->V, 0.0f, e->rowloss)) ||
        (rc = gcu_sum_rows(g, e->rowloss, got * c->T, e->sum, NULL)) ||
        (rc = gcu_copy(g, &part, e->sum, sizeof(double), cudaMemcpyDeviceToHost)))
      return rc;
    *loss += part;
  }
  return 0;
}

/*
 * gpt_eval(tpg, dpg, P, D, ntrain, L, H, C, T, B, windows) -> summed loss, tokens over all the windows:
 * each dp rank runs its part of them, and the sums are all-reduced over dp (a GPU group: on the device).
 */
int gcu_k_eval(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_eval";
  gpt_cfg_t c;
  gcu_t g;
  eval_mem_t e;
  const mk_group_t *tp = argv[0].v.group, *dp = argv[1].v.group;
  const mk_tensor_t *P = argv[2].v.tensor, *D = argv[3].v.tensor;
  int64_t ntrain = argv[4].v.i, B = argv[9].v.i, W = argv[10].v.i;
  if (gcu_cfg(ctx, k, &c, argv + 5, tp) || gcu_check_f32(ctx, k, "P", P, -1, gpt_numel(&c)) ||
      gcu_check_text(ctx, k, D))
    return -1;
  if (B < 1 || B > GPT_MAX_BATCH || W < 1 || W > GCU_MAX_WINDOWS)
    return mk_errorf(ctx, "%s: want batch 1..%d, windows 1..%d", k, GPT_MAX_BATCH, GCU_MAX_WINDOWS);
  int64_t stride = ntrain >= 0 && ntrain < D->numel ? (D->numel - ntrain - c.T - 1) / W : 0;
  if (stride < 1) return mk_errorf(ctx, "%s: validation text too short for %lld windows", k, (long long)W);
  if (gcu_open(&g, ctx, k, P->device) || eval_mem(&g, &c, (int)B, &e)) return -1;
  int64_t per = (W + dp->size - 1) / dp->size, lo = dp->rank * per, hi = lo + per < W ? lo + per : W;
  double loss = 0.0;
  int rc = eval_windows(&g, tp, &c, (const float *)P->data, D, ntrain, (int)B, lo, hi, stride, &e, &loss);
  float sums[2] = {(float)loss, (float)(hi > lo ? (hi - lo) * c.T : 0)};
  if (rc == 0 && dp->size > 1 &&
      ((rc = gcu_copy(&g, e.sums, sums, sizeof(sums), cudaMemcpyHostToDevice)) ||
       (rc = gcu_all_reduce(&g, dp, e.sums, 2, MK_F32)) ||
       (rc = gcu_copy(&g, sums, e.sums, sizeof(sums), cudaMemcpyDeviceToHost))))
    return rc;
  if (rc == 0) rc = mk_return_number(ctx, sums[0]);
  return rc ? rc : mk_return_int(ctx, (int64_t)sums[1]);
}

/* gpt_sample(tpg, P, L, H, C, T, prompt, n, seed, temperature) -> n bytes following the prompt */
int gcu_k_sample(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_sample";
  gpt_cfg_t c;
  gcu_t g;
  eval_mem_t e;
  const mk_group_t *tp = argv[0].v.group;
  const mk_tensor_t *P = argv[1].v.tensor;
  int64_t n = argv[7].v.i, plen = (int64_t)argv[6].v.str.len;
  if (gcu_cfg(ctx, k, &c, argv + 2, tp) || gcu_check_f32(ctx, k, "P", P, -1, gpt_numel(&c))) return -1;
  if (n < 1 || n > GCU_MAX_SAMPLE || plen < 1)
    return mk_errorf(ctx, "%s: want a prompt and n in 1..%d", k, GCU_MAX_SAMPLE);
  uint8_t *out = (uint8_t *)mk_scratch(ctx, (size_t)(plen + n));
  float *z = (float *)mk_scratch(ctx, (size_t)c.V * sizeof(float));
  if (out == NULL || z == NULL) return mk_errorf(ctx, "%s: no scratch memory", k);
  if (gcu_open(&g, ctx, k, P->device) || eval_mem(&g, &c, 1, &e)) return -1;
  memcpy(out, argv[6].v.str.ptr, (size_t)plen);
  for (int64_t i = plen; i < plen + n; i++) {
    /* The window starts at the left: causal attention makes the padding after it irrelevant. */
    int64_t w = i < c.T ? i : c.T;
    int rc;
    float *logits;
    memset(e.host, 0, (size_t)c.T);
    memcpy(e.host, out + i - w, (size_t)w);
    if (mk_cancelled(ctx)) return mk_error(ctx, "gpt_sample: cancelled");
    if ((rc = gcu_copy(&g, e.xy, e.host, (size_t)c.T, cudaMemcpyHostToDevice)) ||
        (rc = gcu_model_forward(&g, tp, &c, (const float *)P->data, e.xy, 1, e.mem, &logits)) ||
        (rc = gcu_copy(&g, z, logits + (size_t)(w - 1) * c.V, (size_t)c.V * sizeof(float), cudaMemcpyDeviceToHost)))
      return rc;
    rng_t r = rng_make(argv[8].v.i, TAG_GPT_SAMPLE, i, 0);
    out[i] = gpt_draw(z, c.V, argv[9].v.num, (double)(rng_next(&r) >> 11) * 0x1p-53);
  }
  return mk_return_string(ctx, (const char *)out + plen, (size_t)n);
}
