/*
 * gpt_kernels.c - the entry points and table of the CPU kernel library "gpt"
 * (examples/gpt.lua, docs/gpt.md): text loading, the bigram baseline,
 * initial weights, fused training steps (forward, backward, the dp all-reduce
 * of one flat gradient, clipping and AdamW in one call), evaluation and sampling.
 *
 * The gradient tensor G holds numel + 1 floats: the last carries the step's
 * summed loss through the same dp all-reduce, so every rank returns the global
 * mean. S (AdamW state) holds m | v, 2 x numel. Every error message starts
 * with the kernel name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <time.h>

#include "gpt.h"

#define GPT_MAX_TEXT (256 << 20) /* most bytes of training text */
#define GPT_MAX_PATH 4096        /* longest path in a path list */

static int want_f32(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t, int64_t n) {
  if (t->device >= 0) return mk_errorf(ctx, "%s: gpt is a CPU library; %s is on cuda:%d", k, name, t->device);
  if (t->dtype != MK_F32 || t->numel != n)
    return mk_errorf(ctx, "%s: %s must be f32 with %lld elements, got %s with %lld", k, name, (long long)n,
                     mk_dtype_name(t->dtype), (long long)t->numel);
  return 0;
}

/* Sizes from argv[i..i+3] (layers, heads, width, context) and the tp group g (NULL: tp = 1). */
static int parse_cfg(mk_ctx_t *ctx, const char *k, gpt_cfg_t *c, const mk_arg_t *argv, int i, const mk_group_t *g) {
  const char *why = gpt_cfg_init(c, argv[i].v.i, argv[i + 1].v.i, argv[i + 2].v.i, argv[i + 3].v.i, g ? g->size : 1,
                                 g ? g->rank : 0);
  return why ? mk_errorf(ctx, "%s: %s", k, why) : 0;
}

static int want_text(mk_ctx_t *ctx, const char *k, const mk_tensor_t *D, int64_t ntrain, int T) {
  if (D->device >= 0 || D->dtype != MK_U8) return mk_errorf(ctx, "%s: D must be a CPU u8 tensor", k);
  if (ntrain < T + 2 || D->numel - ntrain < T + 2)
    return mk_errorf(ctx, "%s: want more than %d bytes in each of train (%lld) and validation (%lld)", k, T + 1,
                     (long long)ntrain, (long long)(D->numel - ntrain));
  return 0;
}

/* ---- text ---------------------------------------------------------------------------- */

/* Calls fn on each path of a '\n'-separated list, in order; stops at the first nonzero. */
static int each_path(mk_ctx_t *ctx, const char *k, const mk_arg_t *list, int (*fn)(mk_ctx_t *, const char *, FILE *,
                                                                                      void *), void *ud) {
  const char *p = list->v.str.ptr, *end = p + list->v.str.len;
  char path[GPT_MAX_PATH];
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((nl ? nl : end) - p);
    if (n >= sizeof(path)) return mk_errorf(ctx, "%s: a path is longer than %d bytes", k, GPT_MAX_PATH - 1);
    memcpy(path, p, n), path[n] = '\0';
    p += n + 1;
    if (n == 0) continue;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return mk_errorf(ctx, "%s: cannot open %s", k, path);
    int rc = fn(ctx, path, f, ud);
    fclose(f);
    if (rc) return rc;
  }
  return 0;
}

static int add_size(mk_ctx_t *ctx, const char *path, FILE *f, void *ud) {
  if (fseek(f, 0, SEEK_END) != 0) return mk_errorf(ctx, "gpt_text_size: cannot seek in %s", path);
  *(int64_t *)ud += (int64_t)ftell(f);
  return *(int64_t *)ud > GPT_MAX_TEXT ? mk_errorf(ctx, "gpt_text_size: more than %d bytes of text", GPT_MAX_TEXT) : 0;
}

/* gpt_text_size(paths) -> total bytes of the files named one per line */
static int k_text_size(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  int64_t n = 0;
  if (each_path(ctx, "gpt_text_size", &argv[0], add_size, &n)) return -1;
  return mk_return_int(ctx, n);
}

typedef struct {
  mk_tensor_t *D;
  int64_t at;
} fill_t;

static int fill(mk_ctx_t *ctx, const char *path, FILE *f, void *ud) {
  fill_t *s = ud;
  size_t got;
  while (s->at < s->D->numel && (got = fread((uint8_t *)s->D->data + s->at, 1, (size_t)(s->D->numel - s->at), f)) > 0)
    s->at += (int64_t)got;
  return ferror(f) ? mk_errorf(ctx, "gpt_text_load: cannot read %s", path) : 0;
}

/* gpt_text_load(paths, D): the files concatenated in list order into D (u8, gpt_text_size bytes) */
static int k_text_load(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  fill_t s = {argv[1].v.tensor, 0};
  if (s.D->device >= 0 || s.D->dtype != MK_U8) return mk_error(ctx, "gpt_text_load: D must be a CPU u8 tensor");
  if (each_path(ctx, "gpt_text_load", &argv[0], fill, &s)) return -1;
  if (s.at != s.D->numel)
    return mk_errorf(ctx, "gpt_text_load: read %lld bytes into D of %lld (did a file change?)", (long long)s.at,
                     (long long)s.D->numel);
  return 0;
}

/* gpt_bigram(D, ntrain) -> the best validation loss of add-alpha bigram models, and its alpha */
static int k_bigram(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  static const double alphas[] = {0.01, 0.03, 0.1, 0.3, 1.0};
  const mk_tensor_t *D = argv[0].v.tensor;
  if (want_text(ctx, "gpt_bigram", D, argv[1].v.i, 1)) return -1;
  double best = INFINITY, at = 0;
  for (int i = 0; i < 5; i++) {
    double l = gpt_bigram_loss(D->data, argv[1].v.i, D->numel, alphas[i]);
    if (isnan(l)) return mk_error(ctx, "gpt_bigram: out of memory");
    if (l < best) best = l, at = alphas[i];
  }
  int rc = mk_return_number(ctx, best);
  return rc ? rc : mk_return_number(ctx, at);
}

/* ---- model ----------------------------------------------------------------------------- */

/* gpt_info(layers, heads, width, context, tp) -> floats per tp rank's shard, or an error naming a bad size */
static int k_info(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  gpt_cfg_t c;
  mk_group_t g = {0, 0, (int)argv[4].v.i};
  if (argv[4].v.i < 1 || argv[4].v.i > 4096) return mk_error(ctx, "gpt_info: tp must be in 1..4096");
  if (parse_cfg(ctx, "gpt_info", &c, argv, 0, &g)) return -1;
  return mk_return_int(ctx, gpt_numel(&c));
}

/* gpt_init(tpg, P, layers, heads, width, context, seed): this tp rank's shard of the initial weights */
static int k_init(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  gpt_cfg_t c;
  if (parse_cfg(ctx, "gpt_init", &c, argv, 2, argv[0].v.group) ||
      want_f32(ctx, "gpt_init", "P", argv[1].v.tensor, gpt_numel(&c)))
    return -1;
  gpt_init(&c, argv[1].v.tensor->data, argv[6].v.i);
  return 0;
}

/* gpt_bytes(t): the raw bytes of a CPU tensor (weights for the PyTorch reference, bitwise checks) */
static int k_bytes(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_tensor_t *t = argv[0].v.tensor;
  if (t->device >= 0) return mk_errorf(ctx, "gpt_bytes: tensor is on cuda:%d", t->device);
  return mk_return_bytes(ctx, t->data, t->nbytes);
}


static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/*
 * gpt_sgemm_flops(n, iters, batches) -> the median over batches of the FLOP/s
 * of n x n x n sgemm on this proc (its OpenBLAS, its threads): the physical
 * limit bench/gpt.sh sets the model's FLOP/s against.
 */
static int k_sgemm_flops(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  int64_t n = argv[0].v.i, iters = argv[1].v.i, nb = argv[2].v.i;
  if (n < 1 || n > 4096 || iters < 1 || nb < 1 || nb > 64)
    return mk_error(ctx, "gpt_sgemm_flops: want n in 1..4096, iters >= 1, batches in 1..64");
  float *a = mk_scratch(ctx, 3 * (size_t)n * (size_t)n * sizeof(float));
  if (a == NULL) return mk_error(ctx, "gpt_sgemm_flops: no scratch memory");
  float *b = a + n * n, *c = b + n * n;
  for (int64_t i = 0; i < 2 * n * n; i++) a[i] = (float)(i % 7) * 0.1f;
  double t[64];
  for (int64_t k = 0; k <= nb; k++) { /* batch 0 warms up */
    double t0 = now_s();
    for (int64_t i = 0; i < iters; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n, b, (int)n, 0.0f,
                  c, (int)n);
    if (k > 0) t[k - 1] = (now_s() - t0) / (double)iters;
  }
  qsort(t, (size_t)nb, sizeof(double), cmp_double);
  return mk_return_number(ctx, 2.0 * (double)n * (double)n * (double)n / t[nb / 2]);
}

static const mk_kernel_t kernels[] = {
  {"gpt_sgemm_flops", k_sgemm_flops, "iii", "gpt_sgemm_flops(n, iters, batches): median FLOP/s of n^3 sgemm here."},
  {"gpt_text_size", k_text_size, "s", "gpt_text_size(paths): total bytes of the files named one per line."},
  {"gpt_text_load", k_text_load, "st", "gpt_text_load(paths, D): the files concatenated into the u8 tensor D."},
  {"gpt_bigram", k_bigram, "ti", "gpt_bigram(D, ntrain): validation loss of the best add-alpha bigram model, alpha."},
  {"gpt_info", k_info, "iiiii", "gpt_info(layers, heads, width, context, tp): floats in one tp rank's shard."},
  {"gpt_init", k_init, "gtiiiii", "gpt_init(tpg, P, layers, heads, width, context, seed): initial weights."},
  {"gpt_train", gpt_k_train, "ggttttiiiiiiiiiniinn",
   "gpt_train(tpg, dpg, P, G, S, D, ntrain, layers, heads, width, context, batch, seed, first, K, lr, warmup, "
   "total, wd, clip): K fused steps; returns each step's mean loss and gradient norm."},
  {"gpt_eval", gpt_k_eval, "ggttiiiiiii",
   "gpt_eval(tpg, dpg, P, D, ntrain, layers, heads, width, context, batch, windows): summed validation loss and "
   "tokens (each dp rank runs its part of the windows)."},
  {"gpt_sample", gpt_k_sample, "gtiiiisiin",
   "gpt_sample(tpg, P, layers, heads, width, context, prompt, n, seed, temperature): n generated bytes."},
  {"gpt_bytes", k_bytes, "t", "gpt_bytes(t): the tensor's raw bytes."},
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "gpt", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels};
  return &lib;
}
