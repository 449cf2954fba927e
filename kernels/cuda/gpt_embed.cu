/*
 * gpt_embed.cu - token and position embeddings on the device (gpt_cuda.h),
 * forward and backward; the CUDA twin of kernels/cpu/gpt_embed.c.
 *
 * The token embedding's gradient gathers rows by token. Without atomics each
 * (token, channel) is one thread that adds the rows of its token in
 * position order, from buckets the host sorts once per batch (the host drew
 * the batch, so it knows the tokens): the very order of gpt_embed.c's loop.
 */
#include "gpt_cuda.h"

/* x[n, i] = wte[tok[n], i] + wpe[n % T, i] */
__global__ void embed_fwd_k(float *x, const uint8_t *tok, const float *wte, const float *wpe, int64_t total, int T,
                            int C) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)blockDim.x * gridDim.x) {
    int64_t n = e / C;
    int i = (int)(e % C), t = (int)(n % T);
    x[e] = wte[(int64_t)tok[n] * C + i] + wpe[(int64_t)t * C + i];
  }
}

/* dwte[v, i] += dx[order[j], i] for j in start[v]..start[v+1]-1, in order. */
__global__ void embed_wte_back_k(float *dwte, const float *dx, const int32_t *order, const int32_t *start, int C) {
  int v = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float a = dwte[(int64_t)v * C + i];
  for (int j = start[v]; j < start[v + 1]; j++) a += dx[(int64_t)order[j] * C + i];
  dwte[(int64_t)v * C + i] = a;
}

/* dwpe[t, i] += dx[b, t, i] over b in order. */
__global__ void embed_wpe_back_k(float *dwpe, const float *dx, int B, int T, int C) {
  int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= (int64_t)T * C) return;
  float a = dwpe[e];
  for (int b = 0; b < B; b++) a += dx[(int64_t)b * T * C + e];
  dwpe[e] = a;
}

/*
 * On the host: order [N] lists the positions n of tok grouped by token and
 * ascending within a token (a stable counting sort); token v's run is
 * order[start[v] .. start[v+1]-1], start has GPT_VOCAB + 1 entries.
 */
void gcu_embed_buckets(const uint8_t *tok, int N, int32_t *order, int32_t *start) {
  int32_t at[GPT_VOCAB];
  for (int v = 0; v <= GPT_VOCAB; v++) start[v] = 0;
  for (int n = 0; n < N; n++) start[tok[n] + 1]++;
  for (int v = 0; v < GPT_VOCAB; v++) start[v + 1] += start[v], at[v] = start[v];
  for (int n = 0; n < N; n++) order[at[tok[n]]++] = n;
}

/* x[b,t,:] = wte[tok[b,t],:] + wpe[t,:]; tok in device memory. */
int gcu_embed_forward(gcu_t *g, float *x, const uint8_t *tok, const float *wte, const float *wpe, int B, int T, int C) {
  int64_t total = (int64_t)B * T * C;
  embed_fwd_k<<<gcu_grid(total), GCU_THREADS, 0, g->s>>>(x, tok, wte, wpe, total, T, C);
  return gcu_launched(g);
}

/* dwte[tok[b,t],:] += dx[b,t,:]; dwpe[t,:] += dx[b,t,:]; order and start (gcu_embed_buckets) in device memory. */
int gcu_embed_backward(gcu_t *g, float *dwte, float *dwpe, const float *dx, const int32_t *order, const int32_t *start,
                       int B, int T, int C) {
  dim3 grid((unsigned)((C + GCU_THREADS - 1) / GCU_THREADS), GPT_VOCAB);
  embed_wte_back_k<<<grid, GCU_THREADS, 0, g->s>>>(dwte, dx, order, start, C);
  int64_t tc = (int64_t)T * C;
  embed_wpe_back_k<<<(unsigned)((tc + GCU_THREADS - 1) / GCU_THREADS), GCU_THREADS, 0, g->s>>>(dwpe, dx, B, T, C);
  return gcu_launched(g);
}
