/* test_blas_cpu.c - the OpenBLAS core type chosen from CPU features (host/core/blas_cpu.c), over recorded CPUs. */
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
static const struct {
  const char *name, *vendor, *flags, *want;
} cpus[] = {
    {"Skylake-SP", "GenuineIntel", SKX, "SKYLAKEX"},
    {"Cascade Lake", "GenuineIntel", SKX " avx512_vnni", "SKYLAKEX"},
    {"Cooper Lake (bf16: still SKYLAKEX)", "GenuineIntel", SKX " avx512_vnni avx512_bf16", "SKYLAKEX"},
    {"Ice Lake-SP", "GenuineIntel", SKX " avx512ifma avx512vbmi avx512_vnni avx512_bitalg avx512_vpopcntdq",
     "SKYLAKEX"},
    {"Sapphire Rapids", "GenuineIntel", SKX " avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16",
     "SKYLAKEX"},
    {"the issue's VM (Intel Xeon Processor)", "GenuineIntel", SKX " avx512_vnni avx512_bf16", "SKYLAKEX"},
    {"Haswell", "GenuineIntel", HSW, "HASWELL"},
    {"Zen 2", "AuthenticAMD", HSW " sse4a clzero", "ZEN"},
    {"Zen 3 (this machine's AMD EPYC)", "AuthenticAMD", HSW " sse4a clzero vaes vpclmulqdq", "ZEN"},
    {"Zen 4 (AVX-512)", "AuthenticAMD", SKX " avx512_bf16 avx512ifma avx512vbmi", "SKYLAKEX"},
    {"Hygon Dhyana", "HygonGenuine", HSW " sse4a", "ZEN"},
    {"Sandy Bridge", "GenuineIntel", AVX, "SANDYBRIDGE"},
    {"an SSE-only CPU", "GenuineIntel", SSE, NULL},
    {"avx512f without bw/vl (Knights Landing)", "GenuineIntel", HSW " avx512f avx512cd avx512er avx512pf",
     "HASWELL"},
    {"FMA without AVX2 (Piledriver)", "AuthenticAMD", AVX " fma fma4", "SANDYBRIDGE"},
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
      cmocka_unit_test(a_flag_is_a_whole_word),
      cmocka_unit_test(a_cpu_that_is_not_x86_is_left_to_openblas),
      cmocka_unit_test(cpuid_agrees_with_the_kernels_flags_on_this_machine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
