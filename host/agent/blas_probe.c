/*
 * blas_probe.c - `monarch-worker --blas-probe [CORETYPE [M N K [TA TB]]]`:
 * loads OpenBLAS with that core type ("-": its own choice), checks each
 * product on fixed data against a double-precision reference, times it, and
 * prints a line per shape and a summary line last:
 *   blas shape=32x128x64 op=nn ok=1 gflops=57.1
 *   blas core=Haswell ok=1 gflops=48.2 shapes=7 version=0.3.21 lib=/usr/lib/...so
 * Without dimensions it runs the shapes our kernels use (kernel_shapes);
 * the summary's gflops is the geometric mean over them, so each shape counts
 * alike however small. It runs in a child process of its own
 * (blas_choose.c), so a core type whose kernels crash this CPU harms
 * nothing. monarch-worker does not link OpenBLAS: it is dlopen'ed here,
 * after OPENBLAS_CORETYPE is set, because OpenBLAS reads it once, when it
 * loads.
 */
#include "agent.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_MAX_DIM 8192    /* largest M, N or K accepted */
#define PROBE_MIN_REPS 3      /* timed repetitions of a shape at least... */
#define PROBE_TIME_S 0.004    /* ...and until this much time has passed */
#define PROBE_CHECK_ROWS 64   /* rows of C checked at most (plus the last), spread evenly... */
#define PROBE_ROW_STEP 4      /* ...at a multiple of 4 apart, so the row tiles are all checked on small shapes */
#define PROBE_TOLERANCE 1e-4  /* relative error allowed against the reference, per entry */

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef char *(*str_fn)(void);

typedef struct {
  int m, n, k, ta, tb;
} shape_t;

/*
 * The products of our kernels: kernels/cpu/mlp.c at examples/train.lua's
 * sizes (batch 32, 64 features, 128 hidden, 10 classes): the forward's two,
 * then the backward's dW2 = A1^T dZ, dA1 = dZ W2^T, dW1 = X^T dA1; and a GPT
 * layer's (2048 tokens, 384 channels, a 128-wide head block): its forward
 * and its input gradient.
 */
static const shape_t kernel_shapes[] = {
    {32, 128, 64, 0, 0}, {32, 10, 128, 0, 0}, {128, 10, 32, 1, 0}, {32, 128, 10, 0, 1},
    {64, 128, 32, 1, 0}, {2048, 384, 128, 0, 0}, {2048, 128, 384, 0, 1},
};

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

/* Whether row i of C = op(A) op(B) (row-major, as stored for s) is right; ref, mag: n doubles of room. */
static int row_ok(const shape_t *s, const float *a, const float *b, const float *c, int i, double *ref, double *mag) {
  int n = s->n, k = s->k;
  for (int j = 0; j < n; j++) ref[j] = mag[j] = 0;
  for (int p = 0; p < k; p++) {
    double x = s->ta ? a[(size_t)p * s->m + i] : a[(size_t)i * k + p];
    for (int j = 0; j < n; j++) {
      double t = x * (s->tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j]);
      ref[j] += t, mag[j] += fabs(t);
    }
  }
  for (int j = 0; j < n; j++) {
    double err = fabs((double)c[(size_t)i * n + j] - ref[j]);
    if (!(err <= PROBE_TOLERANCE * mag[j] + 1e-30)) return 0; /* also catches NaN */
  }
  return 1;
}

/* Whether C holds within PROBE_TOLERANCE of sum |a||b| at up to PROBE_CHECK_ROWS rows and the last. */
static int check(const shape_t *s, const float *a, const float *b, const float *c, double *ref) {
  int step = (s->m + PROBE_CHECK_ROWS - 1) / PROBE_CHECK_ROWS;
  step = (step + PROBE_ROW_STEP - 1) / PROBE_ROW_STEP * PROBE_ROW_STEP;
  for (int i = 0; i < s->m; i += step)
    if (!row_ok(s, a, b, c, i, ref, ref + s->n)) return 0;
  return row_ok(s, a, b, c, s->m - 1, ref, ref + s->n);
}

static void gemm(sgemm_fn sgemm, const shape_t *s, const float *a, const float *b, float *c) {
  sgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, s->m, s->n, s->k, 1.0f, a, s->ta ? s->m : s->k, b,
        s->tb ? s->k : s->n, 0.0f, c, s->n); /* CblasRowMajor; CblasTrans 112, CblasNoTrans 111 */
}

/* Checks, then times one shape; prints its line. Returns its GFLOP/s, 0 where it failed (-1: out of memory). */
static double measure(sgemm_fn sgemm, const shape_t *s, int corrupt) {
  float *a = malloc(sizeof(float) * (size_t)s->m * s->k), *b = malloc(sizeof(float) * (size_t)s->k * s->n),
        *c = calloc((size_t)s->m * s->n, sizeof(float));
  double *ref = malloc(sizeof(double) * 2 * (size_t)s->n);
  if (a == NULL || b == NULL || c == NULL || ref == NULL) {
    free(a), free(b), free(c), free(ref);
    return -1;
  }
  fill(a, (size_t)s->m * s->k, 1), fill(b, (size_t)s->k * s->n, 2);
  gemm(sgemm, s, a, b, c);
  if (corrupt) c[0] += 1.0f; /* the test hook: a result gone wrong, as a bad kernel's would */
  int ok = check(s, a, b, c, ref);
  double best = 1e30, t0 = now_s();
  for (int r = 0; ok && (r < PROBE_MIN_REPS || now_s() - t0 < PROBE_TIME_S); r++) {
    double t = now_s();
    gemm(sgemm, s, a, b, c);
    t = now_s() - t;
    if (t < best) best = t;
  }
  double gflops = ok ? 2.0 * s->m * s->n * s->k / best / 1e9 : 0;
  printf("blas shape=%dx%dx%d op=%c%c ok=%d gflops=%.1f\n", s->m, s->n, s->k, s->ta ? 't' : 'n', s->tb ? 't' : 'n',
         ok, gflops);
  free(a), free(b), free(c), free(ref);
  return gflops;
}

/* Reads a dimension argument; 0 when it is not one. */
static int dim(const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  return *end == '\0' && v >= 1 && v <= PROBE_MAX_DIM ? (int)v : 0;
}

/* The shape of `M N K [TA TB]` into s; 0, or -1 (bad). */
static int parse_shape(int argc, char **argv, shape_t *s) {
  if (argc != 3 && argc != 5) return -1;
  s->m = dim(argv[0]), s->n = dim(argv[1]), s->k = dim(argv[2]), s->ta = s->tb = 0;
  if (argc == 5) {
    if ((strcmp(argv[3], "0") != 0 && strcmp(argv[3], "1") != 0) ||
        (strcmp(argv[4], "0") != 0 && strcmp(argv[4], "1") != 0))
      return -1;
    s->ta = argv[3][0] == '1', s->tb = argv[4][0] == '1';
  }
  return s->m && s->n && s->k ? 0 : -1;
}

/* The OpenBLAS version ("0.3.21") from openblas_get_config(), and the library's real path, into ver and lib. */
static void describe(void *lib, sgemm_fn sgemm, char *ver, size_t vn, char *path, size_t pn) {
  str_fn config = (str_fn)dlsym(lib, "openblas_get_config");
  const char *cfg = config ? config() : NULL;
  if (cfg == NULL || sscanf(cfg, "OpenBLAS %15s", ver) != 1) snprintf(ver, vn, "?");
  Dl_info info;
  char real[PATH_MAX];
  if (dladdr((void *)sgemm, &info) && info.dli_fname && realpath(info.dli_fname, real)) snprintf(path, pn, "%s", real);
  else snprintf(path, pn, "?");
}

/* Runs the shapes; prints the summary line. Returns 0 when every shape passed. */
static int run_shapes(void *lib, sgemm_fn sgemm, const char *core, int corrupt, const shape_t *shapes, int n) {
  double logsum = 0;
  int failed = -1;
  for (int i = 0; i < n && failed < 0; i++) {
    double g = measure(sgemm, &shapes[i], corrupt && i == 0);
    if (g <= 0) failed = i;
    else logsum += log(g);
  }
  char ver[16], path[PATH_MAX];
  describe(lib, sgemm, ver, sizeof(ver), path, sizeof(path));
  printf("blas core=%s ok=%d gflops=%.1f shapes=%d version=%s lib=%s", core, failed < 0,
         failed < 0 ? exp(logsum / n) : 0.0, n, ver, path);
  if (failed >= 0)
    printf(" why=%dx%dx%d %c%c differs from the reference", shapes[failed].m, shapes[failed].n, shapes[failed].k,
           shapes[failed].ta ? 't' : 'n', shapes[failed].tb ? 't' : 'n');
  printf("\n");
  return failed < 0 ? 0 : 1;
}

int mn_blas_probe_main(int argc, char **argv) {
  shape_t one;
  if (argc > 1 && parse_shape(argc - 1, argv + 1, &one) != 0) {
    fprintf(stderr, "monarch-worker: --blas-probe CORETYPE M N K [TA TB] wants dimensions 1..%d and "
                    "transposes 0 or 1\n", PROBE_MAX_DIM);
    return 2;
  }
  int named = argc >= 1 && argv[0][0] != '\0' && strcmp(argv[0], "-") != 0;
  if (named) setenv("OPENBLAS_CORETYPE", argv[0], 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1); /* one core's speed, as a proc sharing the host gets */
  void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  sgemm_fn sgemm = lib ? (sgemm_fn)dlsym(lib, "cblas_sgemm") : NULL;
  str_fn corename = lib ? (str_fn)dlsym(lib, "openblas_get_corename") : NULL;
  if (sgemm == NULL || corename == NULL) {
    printf("blas core=? ok=0 gflops=0 shapes=0 version=? lib=? why=no OpenBLAS library (libopenblas.so.0)\n");
    return 1;
  }
  const char *core = corename();
  /* A test hook: a named core type's result goes wrong; OpenBLAS's own stays right. */
  const char *hook = getenv("MONARCH_BLAS_PROBE_CORRUPT");
  int corrupt = named && hook && strcmp(hook, "1") == 0;
  if (argc > 1) return run_shapes(lib, sgemm, core && core[0] ? core : "?", corrupt, &one, 1);
  return run_shapes(lib, sgemm, core && core[0] ? core : "?", corrupt, kernel_shapes,
                    (int)(sizeof(kernel_shapes) / sizeof(kernel_shapes[0])));
}
