/*
 * blas_cpu.c - the CPU's vector features (cpuid) and the OpenBLAS core type
 * they call for (blas_cpu.h). Pure but for mn_cpu_read.
 */
#include "blas_cpu.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* The XCR0 register: which register states the OS saves on a context switch. */
static uint64_t xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

void mn_cpu_read(mn_cpu_features_t *f) {
  unsigned a, b, c, d;
  memset(f, 0, sizeof(*f));
  f->x86 = 1;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  unsigned max = a;
  memcpy(f->vendor, &b, 4), memcpy(f->vendor + 4, &d, 4), memcpy(f->vendor + 8, &c, 4);
  unsigned ext = __get_cpuid_max(0x80000000u, NULL), r[4];
  for (unsigned i = 0; ext >= 0x80000004u && i < 3; i++) {
    __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
    memcpy(f->brand + 16 * i, r, 16);
  }
  f->brand[48] = '\0';
  __get_cpuid(1, &a, &b, &c, &d);
  f->signature = a;
  int osxsave = (c >> 27) & 1;
  uint64_t x = osxsave ? xcr0() : 0;
  int ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xe0) == 0xe0; /* SSE+AVX state; opmask+ZMM state */
  f->avx = ymm && ((c >> 28) & 1);
  f->fma = f->avx && ((c >> 12) & 1);
  if (max < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  f->avx2 = f->avx && ((b >> 5) & 1);
  f->avx512f = zmm && ((b >> 16) & 1);
  f->avx512dq = zmm && ((b >> 17) & 1);
  f->avx512cd = zmm && ((b >> 28) & 1);
  f->avx512bw = zmm && ((b >> 30) & 1);
  f->avx512vl = zmm && ((b >> 31) & 1);
  unsigned max7 = a;
  if (max7 >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f->avx512_bf16 = f->avx512f && ((a >> 5) & 1);
  }
}
#else
/* Not x86: OpenBLAS's own detection reads the ARM and POWER cores by their IDs; we leave it alone there. */
void mn_cpu_read(mn_cpu_features_t *f) { memset(f, 0, sizeof(*f)); }
#endif

/* Whether the blank-separated list has the word w. */
static int has_word(const char *list, const char *w) {
  size_t n = strlen(w);
  for (const char *s = strstr(list, w); s != NULL; s = strstr(s + 1, w))
    if ((s == list || s[-1] == ' ') && (s[n] == ' ' || s[n] == '\0' || s[n] == '\n')) return 1;
  return 0;
}

void mn_cpu_from_flags(mn_cpu_features_t *f, const char *vendor, const char *flags) {
  memset(f, 0, sizeof(*f));
  f->x86 = 1;
  strncpy(f->vendor, vendor, sizeof(f->vendor) - 1);
  f->avx = has_word(flags, "avx");
  f->avx2 = has_word(flags, "avx2");
  f->fma = has_word(flags, "fma");
  f->avx512f = has_word(flags, "avx512f");
  f->avx512bw = has_word(flags, "avx512bw");
  f->avx512vl = has_word(flags, "avx512vl");
  f->avx512dq = has_word(flags, "avx512dq");
  f->avx512cd = has_word(flags, "avx512cd");
  f->avx512_bf16 = has_word(flags, "avx512_bf16");
}

/*
 * AVX-512 F+BW+VL+DQ: SKYLAKEX, even with BF16, where COOPERLAKE would be
 * OpenBLAS's name: its sgemm measured slower than SKYLAKEX's (110 against
 * 132 GFLOP/s, issue 34) and our kernels use no bf16. AVX2+FMA: HASWELL's
 * kernels, or ZEN's on AMD and Hygon (the same kernels, tuned block sizes). AVX only:
 * SANDYBRIDGE. Older: OpenBLAS's own choice is as good as any.
 */
const char *mn_blas_pick(const mn_cpu_features_t *f) {
  if (!f->x86) return NULL;
  if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) return "SKYLAKEX";
  int amd = strcmp(f->vendor, "AuthenticAMD") == 0 || strcmp(f->vendor, "HygonGenuine") == 0;
  if (f->avx2 && f->fma) return amd ? "ZEN" : "HASWELL";
  if (f->avx) return "SANDYBRIDGE";
  return NULL;
}

/* Appends name to out[*n] unless it is there already or out is full. */
static void add(const char **out, int *n, const char *name) {
  for (int i = 0; i < *n; i++)
    if (strcmp(out[i], name) == 0) return;
  if (*n < MN_BLAS_MAX_CANDIDATES) out[(*n)++] = name;
}

int mn_blas_candidates(const mn_cpu_features_t *f, const char **out) {
  int n = 0;
  const char *pick = mn_blas_pick(f);
  if (pick == NULL) return 0;
  add(out, &n, pick);
  if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) {
    if (f->avx512_bf16) add(out, &n, "COOPERLAKE");
    if (f->avx2 && f->fma) add(out, &n, "HASWELL");
    return n;
  }
  if (f->avx2 && f->fma) add(out, &n, "HASWELL"), add(out, &n, "ZEN");
  add(out, &n, "SANDYBRIDGE");
  return n;
}

int mn_blas_decide(const mn_blas_trial_t *t, int n, double gain) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (t[i].ok && (best == 0 || t[i].gflops > t[best].gflops)) best = i;
  if (best == 0) return 0;
  if (!t[0].ok) return best; /* OpenBLAS's own computes wrong: any core type that computes right beats it */
  return t[best].gflops > t[0].gflops * gain ? best : 0;
}
