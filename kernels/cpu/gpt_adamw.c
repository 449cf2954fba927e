/* gpt_adamw.c - the optimizer (gpt.h): warmup + cosine learning rate and AdamW, as torch.optim.AdamW computes it. */
#include <math.h>

#include "gpt.h"

/* Linear warmup over `warmup` steps to lr, then a cosine down to lr/10 at step `total` (0-based step). */
double gpt_lr_at(int64_t step, double lr, int64_t warmup, int64_t total) {
  if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
  double span = total > warmup ? (double)(total - warmup) : 1.0;
  double prog = (double)(step - warmup) / span;
  if (prog > 1.0) prog = 1.0;
  double lo = lr * 0.1;
  return lo + 0.5 * (lr - lo) * (1.0 + cos(M_PI * prog));
}

/*
 * One AdamW step (torch's order of operations) on elements i0..i1-1 with
 * gradient gscale * g, step number t (1-based), decay wd (0 for biases and gains):
 *   p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 */
void gpt_adamw(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1, float lr, float wd, int64_t t,
               float gscale) {
  float bc1 = 1.0f - powf(GPT_BETA1, (float)t), bc2s = sqrtf(1.0f - powf(GPT_BETA2, (float)t));
  float step = lr / bc1, keep = 1.0f - lr * wd;
  for (int64_t i = i0; i < i1; i++) {
    float gi = g[i] * gscale;
    p[i] *= keep;
    m[i] = GPT_BETA1 * m[i] + (1.0f - GPT_BETA1) * gi;
    v[i] = GPT_BETA2 * v[i] + (1.0f - GPT_BETA2) * gi * gi;
    p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + GPT_ADAM_EPS);
  }
}
