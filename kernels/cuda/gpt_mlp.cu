/*
 * gpt_mlp.cu - GELU, the MLP's nonlinearity, on the device (gpt_cuda.h),
 * forward and backward in GPT-2's tanh form; the CUDA twin of
 * kernels/cpu/gpt_mlp.c, with the same tanh through expf. The MLP's two
 * matrices are gcu_linear_* (gpt_linear.cu), called by gpt_block.cu.
 */
#include "gpt_cuda.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* out = 0.5 f (1 + th), th = tanh(k (f + a f^3)) = 1 - 2 / (exp(2u) + 1), kept for the backward. */
__global__ void gelu_fwd_k(float *out, float *th, const float *f, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)blockDim.x * gridDim.x) {
    float x = f[e], u = GELU_K * (x + GELU_A * x * x * x);
    float t = 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
    th[e] = t;
    out[e] = 0.5f * x * (1.0f + t);
  }
}

/* dg/df = 0.5 (1 + th) + 0.5 f (1 - th^2) k (1 + 3 a f^2) */
__global__ void gelu_bwd_k(float *df, const float *dg, const float *f, const float *th, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)blockDim.x * gridDim.x) {
    float x = f[e], t = th[e];
    df[e] = dg[e] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x));
  }
}

int gcu_gelu_forward(gcu_t *g, float *out, float *th, const float *f, int64_t n) {
  gelu_fwd_k<<<gcu_grid(n), GCU_THREADS, 0, g->s>>>(out, th, f, n);
  return gcu_launched(g);
}

/* df may be dg (in place, as gpt_block.c calls it). */
int gcu_gelu_backward(gcu_t *g, float *df, const float *dg, const float *f, const float *th, int64_t n) {
  gelu_bwd_k<<<gcu_grid(n), GCU_THREADS, 0, g->s>>>(df, dg, f, th, n);
  return gcu_launched(g);
}
