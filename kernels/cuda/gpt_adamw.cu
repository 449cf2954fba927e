/*
 * gpt_adamw.cu - the optimizer on the device (gpt_cuda.h): the gradient's
 * squared norm per kind of segment and AdamW; the CUDA twin of
 * kernels/cpu/gpt_adamw.c's gpt_adamw (the schedule, gpt_lr_at, is that
 * file's own, compiled in). Both kernels take the layout as a table of
 * segments in device memory, one grid row per segment: one launch per step.
 */
#include <math.h>

#include "gpt_cuda.h"

/*
 * part[s * GCU_NORM_BLOCKS + b] = sum of G^2 over block b's share of
 * segment s (blockIdx.y), in double, in a fixed order.
 */
__global__ void sumsq_k(const float *G, const gcu_seg_t *seg, double *part) {
  __shared__ double s[GCU_THREADS];
  const gcu_seg_t *sg = &seg[blockIdx.y];
  double a = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < sg->n; i += (int64_t)blockDim.x * gridDim.x) {
    double x = G[sg->off + i];
    a += x * x;
  }
  s[threadIdx.x] = a;
  __syncthreads();
  for (int w = GCU_THREADS / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[(int64_t)blockIdx.y * GCU_NORM_BLOCKS + blockIdx.x] = s[0];
}

/* rep = replicated segments' squares, shd = sharded ones' (as float: the tp all-reduce sums it), in segment order. */
__global__ void sumsq_total_k(const double *part, const gcu_seg_t *seg, int nseg, double *rep, float *shd) {
  double r = 0.0, h = 0.0;
  for (int k = 0; k < nseg; k++) {
    double a = 0.0;
    for (int b = 0; b < GCU_NORM_BLOCKS; b++) a += part[(int64_t)k * GCU_NORM_BLOCKS + b];
    if (seg[k].sharded) h += a;
    else r += a;
  }
  *rep = r, *shd = (float)h;
}

/*
 * One AdamW step (torch's order of operations, as gpt_adamw.c) with gradient
 * gscale * g on segment blockIdx.y:
 *   p *= keep; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= step * m / (sqrt(v) / bc2s + eps), step = lr / (1 - b1^t), bc2s = sqrt(1 - b2^t)
 */
__global__ void adamw_k(float *p, const float *grad, float *m, float *v, const gcu_seg_t *seg, float step, float bc2s,
                        float gscale) {
  const gcu_seg_t *sg = &seg[blockIdx.y];
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < sg->n; j += (int64_t)blockDim.x * gridDim.x) {
    int64_t i = sg->off + j;
    float gi = grad[i] * gscale;
    p[i] *= sg->keep;
    m[i] = GPT_BETA1 * m[i] + (1.0f - GPT_BETA1) * gi;
    v[i] = GPT_BETA2 * v[i] + (1.0f - GPT_BETA2) * gi * gi;
    p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + GPT_ADAM_EPS);
  }
}

/*
 * On the host: out (GPT_MAX_SEGS) gets gpt_segments' layout with AdamW's
 * decay keep = 1 - lr wd on matrices (wte, wpe, qkv, proj, fc, fc2) and 1
 * elsewhere, as gpt_train.c decides it. Returns the number of segments.
 */
int gcu_segments(const gpt_cfg_t *c, float lr, float wd, gcu_seg_t *out) {
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(c, s);
  for (int k = 0; k < n; k++) {
    float d = s[k].kind == SEG_MATRIX || s[k].kind == SEG_PROJ ? wd : 0.0f;
    out[k].off = s[k].off, out[k].n = s[k].rows * s[k].cols;
    out[k].keep = 1.0f - lr * d;
    out[k].sharded = s[k].split != SPLIT_NONE;
  }
  return n;
}

/* Squares of G per kind into *rep (double) and *shd (float), both device memory; part as gpt_cuda.h says. */
int gcu_sumsq(gcu_t *g, const float *G, const gcu_seg_t *seg, int nseg, double *part, double *rep, float *shd) {
  sumsq_k<<<dim3(GCU_NORM_BLOCKS, (unsigned)nseg), GCU_THREADS, 0, g->s>>>(G, seg, part);
  sumsq_total_k<<<1, 1, 0, g->s>>>(part, seg, nseg, rep, shd);
  return gcu_launched(g);
}

/* AdamW step t (1-based) over every segment; maxn, the longest segment, sizes the grid. */
int gcu_adamw(gcu_t *g, float *p, const float *grad, float *m, float *v, const gcu_seg_t *seg, int nseg, int64_t maxn,
              float lr, int64_t t, float gscale) {
  float bc1 = 1.0f - powf(GPT_BETA1, (float)t), bc2s = sqrtf(1.0f - powf(GPT_BETA2, (float)t));
  unsigned gx = gcu_grid(maxn);
  adamw_k<<<dim3(gx < 1024 ? gx : 1024, (unsigned)nseg), GCU_THREADS, 0, g->s>>>(p, grad, m, v, seg, lr / bc1, bc2s,
                                                                                 gscale);
  return gcu_launched(g);
}
