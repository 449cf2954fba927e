/*
 * blas_probe.c - `monarch-worker --blas-probe [CORETYPE [M N K]]`: loads
 * OpenBLAS with that core type, checks one sgemm on fixed data against a
 * double-precision reference, times it, and prints one line:
 *   blas core=Skylakex ok=1 gflops=131.2 m=256 n=256 k=256
 * It runs in a child process of its own (agent_blas.c), so a core type
 * whose kernels crash this CPU harms nothing. monarch-worker does not link
 * OpenBLAS: it is dlopen'ed here, after OPENBLAS_CORETYPE is set, because
 * OpenBLAS reads it once, when it loads.
 */
#include "agent.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_DIM 256         /* the default M = N = K: 34 MFLOP, a few ms on the slowest kernels */
#define PROBE_MAX_DIM 8192    /* largest M, N or K accepted */
#define PROBE_MIN_REPS 3      /* timed repetitions at least... */
#define PROBE_TIME_S 0.01     /* ...and until this much time has passed */
#define PROBE_ROW_STEP 4      /* rows of C checked: every 4th and the last, so each micro-tile (4 rows or more) is */
#define PROBE_TOLERANCE 1e-4  /* relative error allowed against the reference, per entry */

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef char *(*corename_fn)(void);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Fixed data in [-1, 1): a small LCG, so every probe multiplies the same matrices. */
static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((double)(seed >> 8) / (double)(1u << 23) - 1.0);
  }
}

/* Whether row i of C = A B (row-major, m x k times k x n) is right; ref, mag: n doubles of room. */
static int row_ok(const float *a, const float *b, const float *c, int i, int n, int k, double *ref, double *mag) {
  for (int j = 0; j < n; j++) ref[j] = mag[j] = 0;
  for (int p = 0; p < k; p++) { /* along B's rows, so the loop vectorises */
    double x = a[(size_t)i * k + p];
    const float *row = b + (size_t)p * n;
    for (int j = 0; j < n; j++) {
      double t = x * row[j];
      ref[j] += t, mag[j] += fabs(t);
    }
  }
  for (int j = 0; j < n; j++) {
    double err = fabs((double)c[(size_t)i * n + j] - ref[j]);
    if (!(err <= PROBE_TOLERANCE * mag[j] + 1e-30)) return 0; /* also catches NaN */
  }
  return 1;
}

/*
 * Whether C holds within PROBE_TOLERANCE of sum |a||b| against a double
 * reference, at every PROBE_ROW_STEP-th row and the last: a quarter of the
 * cost of all rows, and every micro-tile of the kernel is seen.
 */
static int check(const float *a, const float *b, const float *c, int m, int n, int k, double *ref, double *mag) {
  for (int i = 0; i < m; i += PROBE_ROW_STEP)
    if (!row_ok(a, b, c, i, n, k, ref, mag)) return 0;
  return row_ok(a, b, c, m - 1, n, k, ref, mag);
}

/* Runs the product once to check it, then times it; prints the line. Returns 0 when it passed. */
static int measure(sgemm_fn sgemm, const char *core, int named, int m, int n, int k) {
  float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n),
        *c = calloc((size_t)m * n, sizeof(float));
  double *ref = malloc(sizeof(double) * 2 * (size_t)n);
  if (a == NULL || b == NULL || c == NULL || ref == NULL) {
    free(a), free(b), free(c), free(ref);
    printf("blas core=%s ok=0 gflops=0 m=%d n=%d k=%d why=out_of_memory\n", core, m, n, k);
    return 1;
  }
  fill(a, (size_t)m * k, 1), fill(b, (size_t)k * n, 2);
  sgemm(101, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n); /* CblasRowMajor, CblasNoTrans twice */
  /* A test hook: a named core type's result goes wrong, as a bad kernel's would; OpenBLAS's own stays right. */
  const char *corrupt = getenv("MONARCH_BLAS_PROBE_CORRUPT");
  if (named && corrupt && strcmp(corrupt, "1") == 0) c[0] += 1.0f;
  int ok = check(a, b, c, m, n, k, ref, ref + n);
  double best = 1e30, t0 = now_s();
  for (int r = 0; r < PROBE_MIN_REPS || now_s() - t0 < PROBE_TIME_S; r++) {
    double t = now_s();
    sgemm(101, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    t = now_s() - t;
    if (t < best) best = t;
  }
  printf("blas core=%s ok=%d gflops=%.1f m=%d n=%d k=%d\n", core, ok, 2.0 * m * n * k / best / 1e9, m, n, k);
  free(a), free(b), free(c), free(ref);
  return ok ? 0 : 1;
}

/* Reads a dimension argument; 0 when it is not one. */
static int dim(const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  return *end == '\0' && v >= 1 && v <= PROBE_MAX_DIM ? (int)v : 0;
}

int mn_blas_probe_main(int argc, char **argv) {
  int m = PROBE_DIM, n = PROBE_DIM, k = PROBE_DIM;
  if (argc >= 4 && ((m = dim(argv[1])) == 0 || (n = dim(argv[2])) == 0 || (k = dim(argv[3])) == 0)) {
    fprintf(stderr, "monarch-worker: --blas-probe CORETYPE M N K wants dimensions 1..%d\n", PROBE_MAX_DIM);
    return 2;
  }
  int named = argc >= 1 && argv[0][0] != '\0' && strcmp(argv[0], "-") != 0;
  if (named) setenv("OPENBLAS_CORETYPE", argv[0], 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1); /* one core's speed, as a proc sharing the host gets */
  void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  sgemm_fn sgemm = lib ? (sgemm_fn)dlsym(lib, "cblas_sgemm") : NULL;
  corename_fn corename = lib ? (corename_fn)dlsym(lib, "openblas_get_corename") : NULL;
  if (sgemm == NULL || corename == NULL) {
    printf("blas core=? ok=0 gflops=0 m=%d n=%d k=%d why=no_openblas\n", m, n, k);
    return 1;
  }
  const char *core = corename();
  return measure(sgemm, core && core[0] ? core : "?", named, m, n, k);
}
