/* gpt_data.c - batches of byte windows, the bigram baseline and the sampling rule (gpt.h). */
#include <math.h>
#include <stdlib.h>

#include "gpt.h"

/*
 * B windows of T+1 bytes from data[lo, hi): x gets bytes 0..T-1 of each,
 * y bytes 1..T. Window i's start is a function of (seed, step, first_seq + i)
 * alone, so dp rank r reading sequences r*B.. of a step sees exactly what
 * one proc reading dp*B sequences sees there.
 */
void gpt_batch(uint8_t *x, uint8_t *y, const uint8_t *data, int64_t lo, int64_t hi, int B, int T, int64_t seed,
               int64_t step, int64_t first_seq) {
  for (int i = 0; i < B; i++) {
    rng_t r = rng_make(seed, TAG_GPT_BATCH, step, first_seq + i);
    int64_t s = lo + (int64_t)rng_below(&r, (uint32_t)(hi - lo - T));
    for (int t = 0; t < T; t++) x[(size_t)i * T + t] = data[s + t], y[(size_t)i * T + t] = data[s + t + 1];
  }
}

/*
 * Mean loss in nats per byte on data[ntrain, n) of a bigram model counted on
 * data[0, ntrain) with add-alpha smoothing. NaN when memory is short.
 */
double gpt_bigram_loss(const uint8_t *data, int64_t ntrain, int64_t n, double alpha) {
  double *cnt = calloc((size_t)GPT_VOCAB * GPT_VOCAB + GPT_VOCAB, sizeof(double));
  if (cnt == NULL) return NAN;
  double *row = cnt + GPT_VOCAB * GPT_VOCAB;
  for (int64_t i = 0; i + 1 < ntrain; i++) cnt[data[i] * GPT_VOCAB + data[i + 1]] += 1.0, row[data[i]] += 1.0;
  double loss = 0.0;
  for (int64_t i = ntrain; i + 1 < n; i++)
    loss -= log((cnt[data[i] * GPT_VOCAB + data[i + 1]] + alpha) / (row[data[i]] + GPT_VOCAB * alpha));
  free(cnt);
  return n - ntrain > 1 ? loss / (double)(n - ntrain - 1) : NAN;
}

/* A byte drawn from softmax(z / temp) with u uniform in [0, 1); temp <= 0: the most likely. gpt_sample's rule,
 * on both libraries (cuda_gpt draws on the host from the logits it copied back). */
uint8_t gpt_draw(const float *z, int V, double temp, double u) {
  int best = 0;
  for (int i = 1; i < V; i++) best = z[i] > z[best] ? i : best;
  if (temp <= 0) return (uint8_t)best;
  double sum = 0.0, acc = 0.0;
  for (int i = 0; i < V; i++) sum += exp((double)(z[i] - z[best]) / temp);
  for (int i = 0; i < V; i++) {
    acc += exp((double)(z[i] - z[best]) / temp) / sum;
    if (u < acc) return (uint8_t)i;
  }
  return (uint8_t)best;
}
