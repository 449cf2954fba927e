/* gpt_loss.c - softmax cross-entropy over the vocabulary (gpt.h), loss and gradient in one pass. */
#include <math.h>

#include "gpt.h"

/*
 * Returns the summed loss -log softmax(logits)[target] over N rows (in
 * double, in row order). When dlogits is not NULL it gets
 * dscale * (softmax - onehot(target)), the gradient of dscale * loss.
 */
double gpt_xent_forward(float *dlogits, const float *logits, const uint8_t *target, int N, int V, float dscale) {
  double loss = 0.0;
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * V;
    float mx = z[0];
    for (int i = 1; i < V; i++) mx = z[i] > mx ? z[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)(z[i] - mx));
    loss += log(sum) - (double)(z[target[n]] - mx);
    if (dlogits == NULL) continue;
    float *d = dlogits + (size_t)n * V;
    for (int i = 0; i < V; i++) d[i] = dscale * (float)(exp((double)(z[i] - mx)) / sum);
    d[target[n]] -= dscale;
  }
  return loss;
}
