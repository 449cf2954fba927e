/*
 * agent_blas.c - the OpenBLAS core type the agent's procs run (issue 34).
 * At start, before the loop runs, the agent decides (blas_choose.c: each
 * candidate core type probed at our kernels' shapes in a child process, or
 * the answer cached for this CPU and library) and gives the winner to its
 * procs as OPENBLAS_CORETYPE in its own environment, which every spawn
 * passes on. A core type that crashes or computes wrong is reported once
 * and dropped; the procs keep OpenBLAS's choice. STATUS reports the result
 * (mn__agent_blas_pack).
 */
#include "agent_int.h"
#include "blas_choose.h"

#include <strings.h>

static mn_agent_blas_t blas = {"?", "openblas", 0, "?", 0, "", 0, 0};
static mn_blas_choice_t choice; /* what was measured (or read from the cache) */

const mn_agent_blas_t *mn__agent_blas(void) { return &blas; }

/* The candidates that failed their check, "HASWELL (killed by SIGILL), ..." into out. */
static void failures(char *out, size_t n) {
  size_t w = 0;
  out[0] = '\0';
  for (int i = 1; i < choice.n && w < n; i++)
    if (!choice.trial[i].ok)
      w += (size_t)snprintf(out + w, n - w, "%s%s (%s)", w ? ", " : "", choice.trial[i].name, choice.trial[i].why);
}

/* MONARCH_BLAS_CORETYPE=auto: the choice procs get, or why they keep OpenBLAS's own. */
static void decide_auto(const char *exe) {
  mn_blas_choose(exe, &choice);
  char failed[160];
  failures(failed, sizeof(failed));
  if (failed[0] && !choice.cached)
    fprintf(stderr, "monarch-worker: blas: failed its self-check: %s; not given to procs\n", failed);
  if (choice.chosen > 0) {
    mn_blas_env_set(choice.trial[choice.chosen].name);
    blas.source = "auto";
    return;
  }
  int best = 0;
  for (int i = 1; i < choice.n; i++)
    if (choice.trial[i].ok && (best == 0 || choice.trial[i].gflops > choice.trial[best].gflops)) best = i;
  if (choice.n == 1 && !failed[0]) snprintf(blas.note, sizeof(blas.note), "no other core type for this CPU's features");
  else if (best > 0)
    snprintf(blas.note, sizeof(blas.note), "the fastest other, %s, is not %.0f%% faster (%.1f against %.1f GFLOP/s)",
             choice.trial[best].name, (MN_BLAS_GAIN - 1) * 100, choice.trial[best].gflops, choice.trial[0].gflops);
  else snprintf(blas.note, sizeof(blas.note), "every other core type failed its self-check: %s", failed);
}

/* MONARCH_BLAS_CORETYPE=NAME: NAME if it passes its check, whatever its speed. */
static void decide_named(const char *exe, const char *name) {
  mn_blas_trial_t *t = &choice.trial[1];
  mn_blas_probe(exe, name, t, NULL);
  choice.n = 2;
  if (t->ok) {
    choice.chosen = 1;
    mn_blas_env_set(name);
    blas.source = "named";
    return;
  }
  snprintf(blas.note, sizeof(blas.note), "%s failed its self-check (%s)", name, t->why);
  fprintf(stderr, "monarch-worker: blas: %s failed its self-check (%s); procs keep OpenBLAS's own %s\n", name, t->why,
          choice.trial[0].core);
}

void mn__agent_blas_init(const char *exe, int verbose) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const char *mode = getenv("MONARCH_BLAS_CORETYPE"), *user = getenv("OPENBLAS_CORETYPE");
  if (mode == NULL || mode[0] == '\0') mode = "auto";
  if (mn_blas_env_ours()) mn_blas_env_set(NULL), user = NULL; /* monarch-run's pick, not the user's: ours again */
  if (user != NULL && user[0] != '\0') {
    mn_blas_probe(exe, NULL, &choice.trial[0], &choice); /* with the user's value: what the procs will run */
    choice.n = 1;
    blas.source = "user";
    snprintf(blas.note, sizeof(blas.note), "the user's OPENBLAS_CORETYPE=%s", user);
  } else if (strcasecmp(mode, "auto") == 0) {
    decide_auto(exe);
  } else {
    char path[512];
    int off = strcasecmp(mode, "off") == 0;
    if (off && mn_blas_cache_path(path, sizeof(path)) == 0 && mn_blas_cache_read(path, &choice) == 0) {
      choice.chosen = 0; /* what was measured, shown; OpenBLAS's own choice run */
    } else {
      mn_blas_probe(exe, NULL, &choice.trial[0], &choice);
      choice.n = 1;
    }
    if (off) {
      blas.source = "off";
      snprintf(blas.note, sizeof(blas.note), "MONARCH_BLAS_CORETYPE=off");
    } else decide_named(exe, mode);
  }
  const mn_blas_trial_t *run = &choice.trial[choice.chosen], *own = &choice.trial[0];
  snprintf(blas.core, sizeof(blas.core), "%s", run->core);
  snprintf(blas.own, sizeof(blas.own), "%s", own->core);
  blas.gflops = run->gflops, blas.own_gflops = own->gflops, blas.ok = run->ok;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  blas.probe_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  if (verbose)
    fprintf(stderr, "monarch-worker: blas: procs run %s (%s, %.1f GFLOP/s); OpenBLAS's own %s %.1f GFLOP/s%s%s; "
            "%s in %.0f ms\n", blas.core, blas.source, blas.gflops, blas.own, blas.own_gflops,
            own->ok ? "" : " failed its self-check: ", own->ok ? "" : own->why, choice.cached ? "cached" : "probed",
            blas.probe_ms);
}

/* tried: [{name, core, ok, gflops, why}], OpenBLAS's own choice first (name ""). */
static void pack_trials(msgpack_packer *pk) {
  msgpack_pack_array(pk, (size_t)choice.n);
  for (int i = 0; i < choice.n; i++) {
    const mn_blas_trial_t *t = &choice.trial[i];
    msgpack_pack_map(pk, 5);
    mn_pack_cstr(pk, "name");
    mn_pack_cstr(pk, t->name);
    mn_pack_cstr(pk, "core");
    mn_pack_cstr(pk, t->core);
    mn_pack_cstr(pk, "ok");
    if (t->ok) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
    mn_pack_cstr(pk, "gflops");
    msgpack_pack_double(pk, t->gflops);
    mn_pack_cstr(pk, "why");
    if (t->ok) msgpack_pack_nil(pk);
    else mn_pack_cstr(pk, t->why);
  }
}

void mn__agent_blas_pack(msgpack_packer *pk) {
  msgpack_pack_map(pk, 11);
  mn_pack_cstr(pk, "core");
  mn_pack_cstr(pk, blas.core);
  mn_pack_cstr(pk, "source");
  mn_pack_cstr(pk, blas.source);
  mn_pack_cstr(pk, "gflops");
  msgpack_pack_double(pk, blas.gflops);
  mn_pack_cstr(pk, "ok");
  if (blas.ok) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  mn_pack_cstr(pk, "openblas");
  mn_pack_cstr(pk, blas.own);
  mn_pack_cstr(pk, "openblas_gflops");
  msgpack_pack_double(pk, blas.own_gflops);
  mn_pack_cstr(pk, "note");
  if (blas.note[0]) mn_pack_cstr(pk, blas.note);
  else msgpack_pack_nil(pk);
  mn_pack_cstr(pk, "probe_ms");
  msgpack_pack_double(pk, blas.probe_ms);
  mn_pack_cstr(pk, "tried");
  pack_trials(pk);
  mn_pack_cstr(pk, "cached");
  if (choice.cached) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  mn_pack_cstr(pk, "version");
  mn_pack_cstr(pk, choice.version[0] ? choice.version : "?");
}
