/*
 * gpt_kernels.cu - the table of the GPU kernel library "cuda_gpt" and its
 * small kernels: initial weights, a tensor's bytes, cuBLAS's FLOP/s.
 *
 * cuda_gpt shadows the CPU library gpt: a proc loads "gpt" and then
 * "cuda_gpt", whose kernels of the same names and signatures win (the one
 * loaded last does), as cuda_mlp shadows mlp. What it shadows is what
 * touches the model: gpt_init, gpt_train, gpt_eval, gpt_sample, gpt_bytes,
 * and gpt_sgemm_flops (the GPU's limit instead of a core's). gpt's
 * gpt_text_size, gpt_text_load, gpt_bigram and gpt_info stay gpt's: they
 * read files, count bytes and size the layout on the host, and the text D
 * stays a CPU tensor. P, G and S are GPU tensors (mesh:gpu_tensor) and the
 * groups GPU groups (mesh:group{dim =, gpu = true}). Every error message
 * starts with the kernel's name.
 */
#include <stdlib.h>
#include <string.h>

#include "gpt_cuda.h"

#define GCU_MAX_FLOPS_BATCHES 64 /* most timed batches of gpt_sgemm_flops */

/*
 * gpt_init(tpg, P, layers, heads, width, context, seed): this tp rank's
 * shard of the initial weights, drawn on the host by gpt_model.c's gpt_init
 * and copied to the device: the same bits as gpt's.
 */
static int k_init(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_init";
  gpt_cfg_t c;
  gcu_t g;
  mk_tensor_t *P = argv[1].v.tensor;
  if (gcu_cfg(ctx, k, &c, argv + 2, argv[0].v.group) || gcu_check_f32(ctx, k, "P", P, -1, gpt_numel(&c))) return -1;
  float *host = (float *)mk_scratch(ctx, P->nbytes);
  if (host == NULL) return mk_errorf(ctx, "%s: no scratch memory for %lld parameters", k, (long long)P->numel);
  gpt_init(&c, host, argv[6].v.i);
  if (gcu_open(&g, ctx, k, P->device)) return -1;
  return gcu_copy(&g, P->data, host, P->nbytes, cudaMemcpyHostToDevice);
}

/* gpt_bytes(t): the raw bytes of a GPU or CPU tensor (weights for references, bitwise checks, snapshots). */
static int k_bytes(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_bytes";
  const mk_tensor_t *t = argv[0].v.tensor;
  gcu_t g;
  if (t->device < 0) return mk_return_bytes(ctx, t->data, t->nbytes);
  void *host = mk_scratch(ctx, t->nbytes > 0 ? t->nbytes : 1);
  if (host == NULL) return mk_errorf(ctx, "%s: no scratch memory for %zu bytes", k, t->nbytes);
  if (gcu_open(&g, ctx, k, t->device) || gcu_copy(&g, host, t->data, t->nbytes, cudaMemcpyDeviceToHost)) return -1;
  return mk_return_bytes(ctx, host, t->nbytes);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Milliseconds of `iters` n^3 sgemms on the device, timed with events on the call's stream. */
static int time_batch(gcu_t *g, int n, int64_t iters, float *a, cudaEvent_t e0, cudaEvent_t e1, float *ms) {
  float *b = a + (size_t)n * n, *c = b + (size_t)n * n;
  if (gcu_cuda(g, "cudaEventRecord", cudaEventRecord(e0, g->s))) return -1;
  for (int64_t i = 0; i < iters; i++)
    if (gcu_gemm(g, 0, 0, n, n, n, 1.0f, a, n, 0, b, n, 0, 0.0f, c, n, 0, 1)) return -1;
  if (gcu_cuda(g, "cudaEventRecord", cudaEventRecord(e1, g->s)) ||
      gcu_cuda(g, "cudaEventSynchronize", cudaEventSynchronize(e1)))
    return -1;
  return gcu_cuda(g, "cudaEventElapsedTime", cudaEventElapsedTime(ms, e0, e1));
}

/*
 * gpt_sgemm_flops(n, iters, batches) -> the median over batches of the
 * FLOP/s of n x n x n cuBLAS sgemm (FP32) on this proc's GPU: the physical
 * limit a GPU run's model FLOP/s is set against.
 */
static int k_sgemm_flops(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "gpt_sgemm_flops";
  int64_t n = argv[0].v.i, iters = argv[1].v.i, nb = argv[2].v.i;
  gcu_t g;
  cudaEvent_t e0 = NULL, e1 = NULL;
  float ms[GCU_MAX_FLOPS_BATCHES];
  if (n < 1 || n > 16384 || iters < 1 || nb < 1 || nb > GCU_MAX_FLOPS_BATCHES)
    return mk_errorf(ctx, "%s: want n in 1..16384, iters >= 1, batches in 1..%d", k, GCU_MAX_FLOPS_BATCHES);
  if (gcu_open(&g, ctx, k, ctx->device >= 0 ? ctx->device : 0)) return -1;
  float *a = (float *)gcu_scratch(&g, 3 * (size_t)n * (size_t)n * sizeof(float));
  if (a == NULL || gcu_cuda(&g, "cudaMemsetAsync", cudaMemsetAsync(a, 0, 3 * (size_t)n * n * sizeof(float), g.s)) ||
      gcu_cuda(&g, "cudaEventCreate", cudaEventCreate(&e0)) || gcu_cuda(&g, "cudaEventCreate", cudaEventCreate(&e1)))
    return -1; /* an event made before a failure is the proc's (a few bytes): not worth a cleanup path */
  int rc = 0;
  for (int64_t b = 0; b <= nb && rc == 0; b++) /* batch 0 warms up */
    rc = time_batch(&g, (int)n, iters, a, e0, e1, &ms[b > 0 ? b - 1 : 0]);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (rc) return rc;
  qsort(ms, (size_t)nb, sizeof(float), cmp_float);
  return mk_return_number(ctx, 2.0 * (double)n * n * n * (double)iters / (ms[nb / 2] * 1e-3));
}

/* Names, signatures and argument orders are gpt's (kernels/cpu/gpt_kernels.c); test_gpt_cuda checks they match. */
static const mk_kernel_t kernels[] = {
  {"gpt_sgemm_flops", k_sgemm_flops, "iii",
   "gpt_sgemm_flops(n, iters, batches): median FLOP/s of n^3 cuBLAS sgemm on this GPU."},
  {"gpt_init", k_init, "gtiiiii", "gpt_init(tpg, P, layers, heads, width, context, seed): initial weights (GPU P)."},
  {"gpt_train", gcu_k_train, "ggttttiiiiiiiiiniinn",
   "gpt_train(tpg, dpg, P, G, S, D, ntrain, layers, heads, width, context, batch, seed, first, K, lr, warmup, "
   "total, wd, clip): K fused steps on the GPU (cuBLAS, NCCL); returns each step's mean loss and gradient norm."},
  {"gpt_eval", gcu_k_eval, "ggttiiiiiii",
   "gpt_eval(tpg, dpg, P, D, ntrain, layers, heads, width, context, batch, windows): summed validation loss and "
   "tokens, on the GPU."},
  {"gpt_sample", gcu_k_sample, "gtiiiisiin",
   "gpt_sample(tpg, P, layers, heads, width, context, prompt, n, seed, temperature): n generated bytes (GPU P)."},
  {"gpt_bytes", k_bytes, "t", "gpt_bytes(t): the tensor's raw bytes (GPU or CPU)."},
};

extern "C" MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "cuda_gpt", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels};
  return &lib;
}
