/*
 * mlp_common.h - what the CPU (kernels/cpu/mlp.c) and GPU
 * (kernels/cuda/cuda_mlp.cu) training kernels must share to stay in step:
 * the deterministic generator behind the split, the initial weights and the
 * batch order, and the optimizer's constants. Included by C and by nvcc.
 */
#ifndef MLP_COMMON_H
#define MLP_COMMON_H

#include <stdint.h>

#define MLP_ADAM_BETA1 0.9        /* Adam first-moment decay */
#define MLP_ADAM_BETA2 0.999      /* Adam second-moment decay */
#define MLP_ADAM_EPS 1e-8         /* Adam denominator guard */

/* Purposes that key the generator, so that streams never overlap. */
enum { TAG_SPLIT = 1, TAG_INIT = 2, TAG_BATCH = 3 };

/* A 64-bit finalizer (splitmix64's): every input bit affects every output bit. */
static inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef struct {
  uint64_t s;
} rng_t;

/* A stream keyed by (seed, purpose, a, b): the same key gives the same stream anywhere. */
static inline rng_t rng_make(int64_t seed, uint64_t purpose, int64_t a, int64_t b) {
  rng_t r = {mix64((uint64_t)seed ^ mix64(purpose ^ mix64((uint64_t)a ^ mix64((uint64_t)b))))};
  return r;
}

static inline uint64_t rng_next(rng_t *r) {
  r->s += 0x9e3779b97f4a7c15ull;
  return mix64(r->s);
}

/* Uniform in [0, n) without modulo bias (rejects the top sliver of the range). */
static inline uint32_t rng_below(rng_t *r, uint32_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do
    x = rng_next(r);
  while (x >= limit);
  return (uint32_t)(x % n);
}

/* Uniform in [-1, 1) from 24 random bits: exactly representable in f32. */
static inline float rng_sym(rng_t *r) { return (float)(rng_next(r) >> 40) * (1.0f / 8388608.0f) - 1.0f; }

/* Fisher-Yates: idx becomes a permutation of 0..n-1 drawn from r. */
static inline void shuffle(rng_t *r, int32_t *idx, int n) {
  for (int i = 0; i < n; i++) idx[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)rng_below(r, (uint32_t)i + 1);
    int32_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
}

#endif
