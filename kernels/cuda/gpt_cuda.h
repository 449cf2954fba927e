/*
 * gpt_cuda.h - what the files of the GPU kernel library "cuda_gpt"
 * (kernels/cuda/gpt_*.cu) share: the call's device context, the cuBLAS
 * wrapper, and each layer's forward and backward on device memory.
 *
 * cuda_gpt is the CUDA twin of the CPU library "gpt" (kernels/cpu/gpt_*.c,
 * docs/gpt.md): the same model, flat layout, tensor-parallel split and
 * kernel signatures. What needs no device is not written twice: the sizes,
 * the layout, the initial weights, the batches and the learning rate are
 * gpt_model.c's, gpt_data.c's and gpt_adamw.c's, compiled into this library
 * (gpt.h), so a GPU run starts from the same bits and reads the same bytes
 * as a CPU run. Each layer here has the CPU layer's name with gcu_ for gpt_
 * and its arguments in the same order, after the context.
 *
 * Determinism: no atomics. Every sum on the device runs in a fixed order
 * (a warp's shuffle tree per row, one thread per column over the rows in
 * order, fixed grids for the norm), and cuBLAS gives the same bits for the
 * same call on the same GPU, so a step run twice gives the same weights:
 * what monarch.train's bitwise recovery needs. Results are close to gpt's,
 * not equal (other summation orders, fused multiply-adds).
 */
#ifndef GPT_CUDA_H
#define GPT_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "cpu/gpt.h"
}

#define GCU_THREADS 256     /* threads per block of every kernel */
#define GCU_WARPS 8         /* warps per block of the row kernels (GCU_THREADS / 32) */
#define GCU_MAX_BLOCKS 8192 /* most blocks of a grid-stride kernel */
#define GCU_MAX_DEVICES 64  /* devices whose cuBLAS handle and scratch are cached */

/* One kernel call's device: every layer function takes it first. */
typedef struct {
  mk_ctx_t *ctx;    /* messages (mk_errorf) and collectives */
  const char *k;    /* the kernel's name: the first word of every message */
  int dev;          /* the CUDA device of the call's tensors */
  cudaStream_t s;   /* ctx->stream (NULL: the legacy default stream) */
  cublasHandle_t h; /* this device's handle, bound to s */
} gcu_t;

/* A segment of the flat layout as the optimizer and the norm see it (gpt_seg_t, on the device). */
typedef struct {
  int64_t off, n; /* floats [off, off + n) */
  float keep;     /* 1 - lr wd: the decay of AdamW (1 for biases and gains) */
  int sharded;    /* split over tp: its squares are summed over tp for the norm */
} gcu_seg_t;

/* The sum of v over a warp's 32 lanes, in a fixed tree: the same bits every time; every lane gets it. */
static __device__ __forceinline__ float gcu_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ __forceinline__ double gcu_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ __forceinline__ float gcu_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* This thread's warp as a row index of a one-warp-per-row kernel, and the stride over rows. */
#define GCU_ROW0 ((int64_t)blockIdx.x * GCU_WARPS + threadIdx.x / 32)
#define GCU_ROW_STEP ((int64_t)gridDim.x * GCU_WARPS)
#define GCU_LANE ((int)(threadIdx.x % 32))

/* The offset of the next n bytes of a scratch block whose size so far is *off, aligned to GCU_ALIGN: a call
 * lays out its buffers as offsets, asks for *off bytes once, then adds the base. */
#define GCU_ALIGN 256 /* alignment of each buffer in scratch */
static inline size_t gcu_take(size_t *off, size_t n) {
  size_t at = *off;
  *off += (n + GCU_ALIGN - 1) / GCU_ALIGN * GCU_ALIGN;
  return at;
}

/* gpt_dev.cu: the device, errors, scratch, copies, cuBLAS, the all-reduce. */
int gcu_open(gcu_t *g, mk_ctx_t *ctx, const char *k, int dev);
int gcu_cuda(gcu_t *g, const char *what, cudaError_t rc);
int gcu_launched(gcu_t *g);
unsigned gcu_grid(int64_t n);
unsigned gcu_rows_grid(int64_t rows);
void *gcu_scratch(gcu_t *g, size_t n);
int gcu_copy(gcu_t *g, void *dst, const void *src, size_t n, cudaMemcpyKind kind);
int gcu_gemm(gcu_t *g, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
             const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch);
int gcu_all_reduce(gcu_t *g, const mk_group_t *grp, void *data, int64_t n, mk_dtype_t dt);

/* gpt_embed.cu */
void gcu_embed_buckets(const uint8_t *tok, int N, int32_t *order, int32_t *start);
int gcu_embed_forward(gcu_t *g, float *x, const uint8_t *tok, const float *wte, const float *wpe, int B, int T, int C);
int gcu_embed_backward(gcu_t *g, float *dwte, float *dwpe, const float *dx, const int32_t *order, const int32_t *start,
                       int B, int T, int C);

/* gpt_norm.cu */
int gcu_norm_forward(gcu_t *g, float *y, float *mu, float *rs, const float *x, const float *gain, const float *b, int N,
                     int C);
int gcu_norm_backward(gcu_t *g, float *dx, float *dg, float *db, const float *dy, const float *x, const float *mu,
                      const float *rs, const float *gain, int N, int C);

/* gpt_linear.cu */
int gcu_linear_forward(gcu_t *g, float *y, const float *x, const float *W, const float *b, int N, int in, int out);
int gcu_linear_backward(gcu_t *g, float *dx, float *dW, float *db, const float *dy, const float *x, const float *W,
                        int N, int in, int out, float beta_dx);
int gcu_add_residual(gcu_t *g, float *dst, const float *a, const float *bias, int N, int C);

/* gpt_attn.cu: datt is [nh x T x T] scratch. */
int gcu_attn_forward(gcu_t *g, float *y, float *att, const float *qkv, int B, int T, int nh, int hs);
int gcu_attn_backward(gcu_t *g, float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int B,
                      int T, int nh, int hs);

/* gpt_mlp.cu */
int gcu_gelu_forward(gcu_t *g, float *out, float *th, const float *f, int64_t n);
int gcu_gelu_backward(gcu_t *g, float *df, const float *dg, const float *f, const float *th, int64_t n);

/* gpt_loss.cu: per-row losses in double into rowloss [N]; gcu_sum_rows adds them in a fixed order. */
int gcu_xent_forward(gcu_t *g, float *dlogits, const float *logits, const uint8_t *target, int N, int V, float dscale,
                     double *rowloss);
int gcu_sum_rows(gcu_t *g, const double *rowloss, int N, double *sum, float *sumf);

/* gpt_adamw.cu: over the segments seg [nseg] (device memory); part holds nseg x GCU_NORM_BLOCKS doubles. */
#define GCU_NORM_BLOCKS 32 /* partial sums per segment of the gradient norm: fixed, so it is deterministic */
int gcu_segments(const gpt_cfg_t *c, float lr, float wd, gcu_seg_t *out);
int gcu_sumsq(gcu_t *g, const float *G, const gcu_seg_t *seg, int nseg, double *part, double *rep, float *shd);
int gcu_adamw(gcu_t *g, float *p, const float *grad, float *m, float *v, const gcu_seg_t *seg, int nseg, int64_t maxn,
              float lr, int64_t t, float gscale);

/* gpt_block.cu: a block and the whole model, as gpt_block.c; tp NULL or of size 1: no collective. */
size_t gcu_model_floats(const gpt_cfg_t *c, int B);
int gcu_model_forward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const float *P, const uint8_t *tok, int B,
                      float *mem, float **logits);
int gcu_model_backward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const float *P, float *G,
                       const int32_t *order, const int32_t *start, int B, float *mem, const float *dlogits);

/* gpt_train.cu: the checks every kernel makes, and gpt_train; gpt_eval.cu: gpt_eval and gpt_sample (table in
 * gpt_kernels.cu). */
int gcu_check_f32(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t, int dev, int64_t n);
int gcu_check_text(mk_ctx_t *ctx, const char *k, const mk_tensor_t *D);
int gcu_cfg(mk_ctx_t *ctx, const char *k, gpt_cfg_t *c, const mk_arg_t *argv, const mk_group_t *tp);
int gcu_k_train(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);
int gcu_k_eval(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);
int gcu_k_sample(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);

#endif
