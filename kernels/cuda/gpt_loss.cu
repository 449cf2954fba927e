/*
 * gpt_loss.cu - softmax cross-entropy over the vocabulary on the device
 * (gpt_cuda.h), loss and gradient in one pass; the CUDA twin of
 * kernels/cpu/gpt_loss.c, in double where it sums as that does. One warp
 * per row; the rows' losses are then added in a fixed order by one block.
 */
#include <math.h>

#include "gpt_cuda.h"

/*
 * rowloss[n] = -log softmax(z_n)[target[n]]; when dlogits is not NULL it
 * gets dscale * (softmax - onehot(target)) (it may be logits: in place).
 */
__global__ void xent_k(float *dlogits, const float *logits, const uint8_t *target, int N, int V, float dscale,
                       double *rowloss) {
  for (int64_t n = GCU_ROW0; n < N; n += GCU_ROW_STEP) {
    const float *z = logits + n * V;
    float mx = -INFINITY;
    for (int i = GCU_LANE; i < V; i += 32) mx = fmaxf(mx, z[i]);
    mx = gcu_warp_max(mx);
    double sum = 0.0;
    for (int i = GCU_LANE; i < V; i += 32) sum += exp((double)(z[i] - mx));
    sum = gcu_warp_sum_d(sum);
    int t = target[n];
    double zt = (double)(z[t] - mx);
    __syncwarp();
    if (GCU_LANE == 0) rowloss[n] = log(sum) - zt;
    if (dlogits == NULL) continue;
    float *d = dlogits + n * V;
    for (int i = GCU_LANE; i < V; i += 32)
      d[i] = dscale * (float)(exp((double)(z[i] - mx)) / sum) - (i == t ? dscale : 0.0f);
  }
}

/* out = the sum of x[0..n) by one block: each thread its strided share in order, then a fixed tree. */
__global__ void sum_rows_k(const double *x, int n, double *out, float *outf) {
  __shared__ double s[GCU_THREADS];
  double a = 0.0;
  for (int i = threadIdx.x; i < n; i += GCU_THREADS) a += x[i];
  s[threadIdx.x] = a;
  __syncthreads();
  for (int w = GCU_THREADS / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (out != NULL) *out = s[0];
    if (outf != NULL) *outf = (float)s[0];
  }
}

int gcu_xent_forward(gcu_t *g, float *dlogits, const float *logits, const uint8_t *target, int N, int V, float dscale,
                     double *rowloss) {
  xent_k<<<gcu_rows_grid(N), GCU_THREADS, 0, g->s>>>(dlogits, logits, target, N, V, dscale, rowloss);
  return gcu_launched(g);
}

/* The summed loss of N rows into *sum (double) and/or *sumf (float), both device memory (either may be NULL). */
int gcu_sum_rows(gcu_t *g, const double *rowloss, int N, double *sum, float *sumf) {
  sum_rows_k<<<1, GCU_THREADS, 0, g->s>>>(rowloss, N, sum, sumf);
  return gcu_launched(g);
}
