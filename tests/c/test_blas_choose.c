/*
 * test_blas_choose.c - running the probes and keeping their answer
 * (host/core/blas_choose.c, blas_cache.c), against a fake monarch-worker: a
 * shell script that answers `--blas-probe CORE` with fixed figures, dies of
 * SIGILL for SKYLAKEX, and counts its runs, so the choice and the cache are
 * checked without timing anything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "blas_choose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], worker[128];

/* The fake probe: OpenBLAS's own is "Zen" at 40; HASWELL 50; SANDYBRIDGE 30; ZEN is OpenBLAS's own again. */
static const char *fake =
    "#!/bin/sh\n"
    "echo run >> \"$(dirname \"$0\")/runs\"\n"
    "lib=\"$0\"\n"
    "case \"$2\" in\n"
    "  -) echo \"blas core=Zen ok=1 gflops=40.0 shapes=7 version=0.3.21 lib=$lib\" ;;\n"
    "  HASWELL) if [ \"$MONARCH_BLAS_PROBE_CORRUPT\" = 1 ]; then\n"
    "      echo \"blas core=Haswell ok=0 gflops=0 shapes=7 version=0.3.21 lib=$lib why=32x128x64 nn differs\"\n"
    "    else echo \"blas core=Haswell ok=1 gflops=50.0 shapes=7 version=0.3.21 lib=$lib\"; fi ;;\n"
    "  SANDYBRIDGE) echo \"blas core=Sandybridge ok=1 gflops=30.0 shapes=7 version=0.3.21 lib=$lib\" ;;\n"
    "  ZEN) echo \"blas core=Zen ok=1 gflops=40.0 shapes=7 version=0.3.21 lib=$lib\" ;;\n"
    "  *) kill -ILL $$ ;;\n"
    "esac\n";

static int runs(void) {
  char path[160], line[16];
  snprintf(path, sizeof(path), "%s/runs", dir);
  FILE *fp = fopen(path, "r");
  int n = 0;
  while (fp && fgets(line, sizeof(line), fp)) n++;
  if (fp) fclose(fp);
  unlink(path);
  return n;
}

static int setup(void **state) {
  snprintf(dir, sizeof(dir), "/tmp/test_blas_choose.XXXXXX");
  if (mkdtemp(dir) == NULL) return -1;
  snprintf(worker, sizeof(worker), "%s/monarch-worker", dir);
  FILE *fp = fopen(worker, "w");
  if (fp == NULL) return -1;
  fputs(fake, fp);
  fclose(fp);
  chmod(worker, 0755);
  setenv("XDG_CACHE_HOME", dir, 1);
  unsetenv("MONARCH_BLAS_PROBE_CORRUPT");
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void a_probe_line_fills_the_trial(void **state) {
  mn_blas_trial_t t;
  mn_blas_choice_t c;
  memset(&c, 0, sizeof(c));
  mn_blas_probe(worker, NULL, &t, &c);
  assert_string_equal("", t.name);
  assert_string_equal("Zen", t.core);
  assert_true(t.ok);
  assert_true(t.gflops == 40.0);
  assert_string_equal("0.3.21", c.version);
  assert_string_equal(worker, c.lib);
  mn_blas_probe(worker, "SKYLAKEX", &t, NULL);
  assert_false(t.ok);
  assert_false(t.transient); /* a crash is the core type's, and worth keeping */
  assert_string_equal("killed by SIGILL", t.why);
  mn_blas_probe(worker, "HASWELL", &t, NULL);
  assert_true(t.ok);
  assert_string_equal("Haswell", t.core);
  runs();
}

static void a_worker_that_is_not_there_is_a_transient_failure(void **state) {
  mn_blas_trial_t t;
  mn_blas_probe("/nonexistent/monarch-worker", NULL, &t, NULL);
  assert_false(t.ok);
  assert_true(t.transient);
  assert_non_null(strstr(t.why, "/nonexistent/monarch-worker"));
}

/* This CPU's candidates, as the choice will try them (the fake answers for any). */
static void the_choice_is_measured_once_then_read_from_the_cache(void **state) {
  mn_cpu_features_t f;
  mn_cpu_read(&f);
  const char *cand[MN_BLAS_MAX_CANDIDATES];
  if (mn_blas_candidates(&f, cand) == 0) skip(); /* nothing to choose between on this CPU */
  mn_blas_choice_t c;
  mn_blas_choose(worker, &c);
  assert_false(c.cached);
  int measured = runs();
  assert_true(measured >= 2);
  assert_string_equal("Zen", c.trial[0].core);
  /* Where HASWELL is a candidate (AVX2 and up) it wins: 50 against 40. */
  for (int i = 1; i < c.n; i++)
    if (strcmp(c.trial[i].name, "HASWELL") == 0) assert_int_equal(i, c.chosen);
  /* ZEN is OpenBLAS's own here: never probed twice. */
  for (int i = 1; i < c.n; i++) assert_string_not_equal("ZEN", c.trial[i].name);
  mn_blas_choice_t again;
  mn_blas_choose(worker, &again);
  assert_true(again.cached);
  assert_int_equal(0, runs());
  assert_int_equal(c.n, again.n);
  assert_int_equal(c.chosen, again.chosen);
  for (int i = 0; i < c.n; i++) {
    assert_string_equal(c.trial[i].name, again.trial[i].name);
    assert_string_equal(c.trial[i].why, again.trial[i].why);
  }
  /* The library changes (an upgrade: another mtime): measured again. */
  FILE *fp = fopen(worker, "a");
  fputs("# upgraded\n", fp);
  fclose(fp);
  mn_blas_choose(worker, &again);
  assert_false(again.cached);
  assert_true(runs() >= 2);
}

static void the_test_hook_neither_reads_nor_writes_the_cache(void **state) {
  char path[512];
  assert_int_equal(0, mn_blas_cache_path(path, sizeof(path)));
  unlink(path);
  setenv("MONARCH_BLAS_PROBE_CORRUPT", "1", 1);
  mn_blas_choice_t c;
  mn_blas_choose(worker, &c);
  unsetenv("MONARCH_BLAS_PROBE_CORRUPT");
  assert_false(c.cached);
  assert_int_equal(0, c.chosen); /* HASWELL computed wrong: OpenBLAS's own stays */
  assert_int_not_equal(0, access(path, F_OK));
  runs();
}

static void a_cache_of_another_cpu_or_format_is_not_read(void **state) {
  char path[512];
  assert_int_equal(0, mn_blas_cache_path(path, sizeof(path)));
  FILE *fp = fopen(path, "w");
  fprintf(fp, "monarch-blas 1\nkey SomeOtherCPU|x|0|avx,|LD_LIBRARY_PATH=\nlib %s 1 1\nversion 0.3.21\n"
              "trial - Zen 1 40.0\nchosen 0\n", worker);
  fclose(fp);
  mn_blas_choice_t c;
  assert_int_equal(-1, mn_blas_cache_read(path, &c));
  fp = fopen(path, "w");
  fprintf(fp, "monarch-blas 99\n");
  fclose(fp);
  assert_int_equal(-1, mn_blas_cache_read(path, &c));
  unlink(path);
  assert_int_equal(-1, mn_blas_cache_read(path, &c));
}

static void monarch_run_keeps_the_users_value_and_marks_its_own(void **state) {
  setenv("OPENBLAS_CORETYPE", "PRESCOTT", 1);
  unsetenv(MN_BLAS_PICKED);
  mn_blas_env_init(dir); /* the prefix: dir/bin/monarch-worker does not exist, and is never run */
  assert_string_equal("PRESCOTT", getenv("OPENBLAS_CORETYPE"));
  assert_false(mn_blas_env_ours());
  mn_blas_env_set("HASWELL");
  assert_true(mn_blas_env_ours());
  setenv("MONARCH_BLAS_CORETYPE", "off", 1);
  mn_blas_env_init(dir); /* ours from a parent, and off here: unset */
  assert_null(getenv("OPENBLAS_CORETYPE"));
  assert_null(getenv(MN_BLAS_PICKED));
  unsetenv("MONARCH_BLAS_CORETYPE");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_probe_line_fills_the_trial),
      cmocka_unit_test(a_worker_that_is_not_there_is_a_transient_failure),
      cmocka_unit_test(the_choice_is_measured_once_then_read_from_the_cache),
      cmocka_unit_test(the_test_hook_neither_reads_nor_writes_the_cache),
      cmocka_unit_test(a_cache_of_another_cpu_or_format_is_not_read),
      cmocka_unit_test(monarch_run_keeps_the_users_value_and_marks_its_own),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
