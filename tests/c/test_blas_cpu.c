/*
 * test_blas_cpu.c - the OpenBLAS core types chosen from CPU features
 * (host/core/blas_cpu.c) over recorded CPUs: the cpuid pick, the candidates
 * the probes time, and the rule that decides between measurements.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "blas_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The vector flags of /proc/cpuinfo on each family (other flags left out: the choice does not read them). */
#define SSE "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt"
#define AVX SSE " avx xsave"
#define HSW AVX " fma avx2 bmi1 bmi2 f16c"
#define SKX HSW " avx512f avx512dq avx512cd avx512bw avx512vl"
/* want: the cpuid pick; cands: the core types the probes time, in order, blank-separated. */
static const struct {
  const char *name, *vendor, *flags, *want, *cands;
} cpus[] = {
    {"Skylake-SP", "GenuineIntel", SKX, "SKYLAKEX", "SKYLAKEX HASWELL"},
    {"Cascade Lake", "GenuineIntel", SKX " avx512_vnni", "SKYLAKEX", "SKYLAKEX HASWELL"},
    {"Cooper Lake (bf16: still SKYLAKEX)", "GenuineIntel", SKX " avx512_vnni avx512_bf16", "SKYLAKEX",
     "SKYLAKEX COOPERLAKE HASWELL"},
    {"Ice Lake-SP", "GenuineIntel", SKX " avx512ifma avx512vbmi avx512_vnni avx512_bitalg avx512_vpopcntdq",
     "SKYLAKEX", "SKYLAKEX HASWELL"},
    {"Sapphire Rapids", "GenuineIntel", SKX " avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16",
     "SKYLAKEX", "SKYLAKEX COOPERLAKE HASWELL"},
    {"the issue's VM (Intel Xeon Processor)", "GenuineIntel", SKX " avx512_vnni avx512_bf16", "SKYLAKEX",
     "SKYLAKEX COOPERLAKE HASWELL"},
    {"Haswell", "GenuineIntel", HSW, "HASWELL", "HASWELL ZEN SANDYBRIDGE"},
    {"Zen 2", "AuthenticAMD", HSW " sse4a clzero", "ZEN", "ZEN HASWELL SANDYBRIDGE"},
    {"Zen 3 (this machine's AMD EPYC)", "AuthenticAMD", HSW " sse4a clzero vaes vpclmulqdq", "ZEN",
     "ZEN HASWELL SANDYBRIDGE"},
    {"Zen 4 (AVX-512)", "AuthenticAMD", SKX " avx512_bf16 avx512ifma avx512vbmi", "SKYLAKEX",
     "SKYLAKEX COOPERLAKE HASWELL"},
    {"Hygon Dhyana", "HygonGenuine", HSW " sse4a", "ZEN", "ZEN HASWELL SANDYBRIDGE"},
    {"Sandy Bridge", "GenuineIntel", AVX, "SANDYBRIDGE", "SANDYBRIDGE"},
    {"an SSE-only CPU (unknown: left to OpenBLAS)", "GenuineIntel", SSE, NULL, ""},
    {"avx512f without bw/vl (Knights Landing)", "GenuineIntel", HSW " avx512f avx512cd avx512er avx512pf",
     "HASWELL", "HASWELL ZEN SANDYBRIDGE"},
    {"FMA without AVX2 (Piledriver)", "AuthenticAMD", AVX " fma fma4", "SANDYBRIDGE", "SANDYBRIDGE"},
};

static void each_recorded_cpu_gets_its_core_type(void **state) {
  for (size_t i = 0; i < sizeof(cpus) / sizeof(cpus[0]); i++) {
    mn_cpu_features_t f;
    mn_cpu_from_flags(&f, cpus[i].vendor, cpus[i].flags);
    const char *got = mn_blas_pick(&f);
    if (cpus[i].want == NULL ? got != NULL : got == NULL || strcmp(got, cpus[i].want) != 0)
      fail_msg("%s: want %s, got %s", cpus[i].name, cpus[i].want ? cpus[i].want : "none", got ? got : "none");
  }
}

static void each_recorded_cpu_gets_its_candidates(void **state) {
  for (size_t i = 0; i < sizeof(cpus) / sizeof(cpus[0]); i++) {
    mn_cpu_features_t f;
    mn_cpu_from_flags(&f, cpus[i].vendor, cpus[i].flags);
    const char *c[MN_BLAS_MAX_CANDIDATES];
    int n = mn_blas_candidates(&f, c);
    char got[128] = "";
    for (int j = 0; j < n; j++) snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", j ? " " : "", c[j]);
    if (strcmp(got, cpus[i].cands) != 0) fail_msg("%s: want '%s', got '%s'", cpus[i].name, cpus[i].cands, got);
    /* The cpuid pick comes first: it is the one tried where only one can be. */
    if (n > 0) assert_string_equal(c[0], cpus[i].want);
  }
}

/* A trial as the probes report it. */
static mn_blas_trial_t trial(const char *name, int ok, double gflops) {
  mn_blas_trial_t t;
  memset(&t, 0, sizeof(t));
  snprintf(t.name, sizeof(t.name), "%s", name);
  t.ok = ok, t.gflops = gflops;
  return t;
}

static void the_fastest_passing_candidate_wins_by_more_than_the_margin(void **state) {
  /* This machine's AMD EPYC: Zen (OpenBLAS's own) 41.8, Haswell 53.3, Sandybridge 37.1. */
  mn_blas_trial_t amd[] = {trial("", 1, 41.8), trial("HASWELL", 1, 53.3), trial("SANDYBRIDGE", 1, 37.1)};
  assert_int_equal(1, mn_blas_decide(amd, 3, 1.10));
  /* The VM: Prescott 19.7, SKYLAKEX 131.9, COOPERLAKE 110.2, HASWELL 66.4. */
  mn_blas_trial_t vm[] = {trial("", 1, 19.7), trial("SKYLAKEX", 1, 131.9), trial("COOPERLAKE", 1, 110.2),
                          trial("HASWELL", 1, 66.4)};
  assert_int_equal(1, mn_blas_decide(vm, 4, 1.10));
  /* Within the margin: OpenBLAS's own stays. */
  mn_blas_trial_t close[] = {trial("", 1, 50.0), trial("HASWELL", 1, 54.9)};
  assert_int_equal(0, mn_blas_decide(close, 2, 1.10));
  /* Only OpenBLAS's own was measured (nothing else for the CPU). */
  assert_int_equal(0, mn_blas_decide(amd, 1, 1.10));
}

static void a_candidate_that_fails_its_check_is_never_chosen(void **state) {
  /* The corrupt hook: every named core type computes wrong, whatever its speed. */
  mn_blas_trial_t t[] = {trial("", 1, 20.0), trial("SKYLAKEX", 0, 0), trial("HASWELL", 0, 0)};
  assert_int_equal(0, mn_blas_decide(t, 3, 1.10));
  /* SIGILL on the best, a slower one passes and wins. */
  mn_blas_trial_t u[] = {trial("", 1, 20.0), trial("SKYLAKEX", 0, 0), trial("HASWELL", 1, 60.0)};
  assert_int_equal(2, mn_blas_decide(u, 3, 1.10));
  /* OpenBLAS's own computes wrong: a passing candidate wins even when slower. */
  mn_blas_trial_t v[] = {trial("", 0, 0), trial("HASWELL", 1, 5.0)};
  assert_int_equal(1, mn_blas_decide(v, 2, 1.10));
}

static void a_flag_is_a_whole_word(void **state) {
  mn_cpu_features_t f;
  mn_cpu_from_flags(&f, "GenuineIntel", SSE " avx512_bf16 avx512_vnni"); /* "avx" appears only inside these */
  assert_false(f.avx);
  assert_false(f.avx512f);
  assert_true(f.avx512_bf16);
  assert_null(mn_blas_pick(&f));
}

static void a_cpu_that_is_not_x86_is_left_to_openblas(void **state) {
  mn_cpu_features_t f;
  memset(&f, 0, sizeof(f));
  f.avx = f.avx2 = f.fma = 1; /* ignored: not an x86 CPU */
  assert_null(mn_blas_pick(&f));
}

/* The first "flags" line of /proc/cpuinfo into buf; 0, or -1 where there is none (not Linux, not x86). */
static int cpuinfo_flags(char *buf, size_t n, char *vendor, size_t vn) {
  FILE *fp = fopen("/proc/cpuinfo", "r");
  if (fp == NULL) return -1;
  int found = 0;
  vendor[0] = '\0';
  while (!found && fgets(buf, (int)n, fp) != NULL) {
    if (strncmp(buf, "vendor_id", 9) == 0) sscanf(strchr(buf, ':') + 1, " %12s", vendor), vendor[vn - 1] = '\0';
    found = strncmp(buf, "flags", 5) == 0;
  }
  fclose(fp);
  return found ? 0 : -1;
}

static void cpuid_agrees_with_the_kernels_flags_on_this_machine(void **state) {
  static char line[8192];
  char vendor[16];
  if (cpuinfo_flags(line, sizeof(line), vendor, sizeof(vendor)) != 0) skip();
  /* Under valgrind, cpuid answers for the CPU valgrind emulates, not this one (make valgrind). */
  const char *pre = getenv("LD_PRELOAD");
  if (pre != NULL && strstr(pre, "vgpreload") != NULL) skip();
  mn_cpu_features_t mine, listed;
  mn_cpu_read(&mine);
  mn_cpu_from_flags(&listed, vendor, strchr(line, ':') + 1);
  assert_string_equal(mine.vendor, listed.vendor);
  assert_int_equal(mine.avx, listed.avx);
  assert_int_equal(mine.avx2, listed.avx2);
  assert_int_equal(mine.fma, listed.fma);
  assert_int_equal(mine.avx512f, listed.avx512f);
  assert_int_equal(mine.avx512bw, listed.avx512bw);
  assert_int_equal(mine.avx512_bf16, listed.avx512_bf16);
  const char *a = mn_blas_pick(&mine), *b = mn_blas_pick(&listed);
  assert_true(a == b || (a && b && strcmp(a, b) == 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(each_recorded_cpu_gets_its_core_type),
      cmocka_unit_test(each_recorded_cpu_gets_its_candidates),
      cmocka_unit_test(the_fastest_passing_candidate_wins_by_more_than_the_margin),
      cmocka_unit_test(a_candidate_that_fails_its_check_is_never_chosen),
      cmocka_unit_test(a_flag_is_a_whole_word),
      cmocka_unit_test(a_cpu_that_is_not_x86_is_left_to_openblas),
      cmocka_unit_test(cpuid_agrees_with_the_kernels_flags_on_this_machine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
