/*
 * blas_choose.c - runs the probes and makes the choice of blas_choose.h.
 * The probe processes are spawned and read here; what they measure is
 * blas_probe.c's (host/agent), the rule that decides is mn_blas_decide
 * (blas_cpu.c), and the cache is blas_cache.c's.
 */
#include "blas_choose.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_OUT 4096 /* a probe's output: a line per shape and the summary */

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Reads fd to its end or the deadline (ms of CLOCK_MONOTONIC); the bytes read, or -1 at the deadline. */
static ssize_t read_all(int fd, char *buf, size_t n, int64_t deadline) {
  size_t got = 0;
  for (;;) {
    int64_t left = deadline - now_ms();
    struct pollfd p = {fd, POLLIN, 0};
    int r = left > 0 ? poll(&p, 1, (int)left) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t k = read(fd, buf + got, n - 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0 || (got += (size_t)k) == n - 1) break;
  }
  buf[got] = '\0';
  return (ssize_t)got;
}

/* Fills t from the probe's summary line (and c's version and lib), or t's failure from how the probe ended. */
static void parse(mn_blas_trial_t *t, mn_blas_choice_t *c, const char *out, int status, int timed_out) {
  const char *s = out ? strstr(out, "blas core=") : NULL, *v = s ? strstr(s, " version=") : NULL;
  if (s == NULL || sscanf(s, "blas core=%31s ok=%d gflops=%lf", t->core, &t->ok, &t->gflops) != 3) t->ok = 0;
  if (v && c && sscanf(v, " version=%15s lib=%255s", c->version, c->lib) != 2) snprintf(c->lib, sizeof(c->lib), "?");
  if (t->ok) return;
  const char *why = s ? strstr(s, " why=") : NULL;
  /* A crash is the core type's doing, worth keeping; a timeout, a kill or a probe that said nothing may not be. */
  t->transient = timed_out || (WIFSIGNALED(status) ? WTERMSIG(status) == SIGKILL : s == NULL);
  if (timed_out) snprintf(t->why, sizeof(t->why), "no answer in %d s", MN_BLAS_PROBE_MS / 1000);
  else if (WIFSIGNALED(status))
    snprintf(t->why, sizeof(t->why), "killed by SIG%s",
             sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
  else if (why != NULL) snprintf(t->why, sizeof(t->why), "%.*s", (int)strcspn(why + 5, "\n"), why + 5);
  else snprintf(t->why, sizeof(t->why), "no answer (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

void mn_blas_probe(const char *worker, const char *core, mn_blas_trial_t *t, mn_blas_choice_t *c) {
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", core ? core : "");
  snprintf(t->core, sizeof(t->core), "?");
  t->transient = 1;
  if (access(worker, X_OK) != 0) { /* said here: where spawn is fork + exec, a child's exec failure is only 127 */
    snprintf(t->why, sizeof(t->why), "cannot start %s: %s", worker, strerror(errno));
    return;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(t->why, sizeof(t->why), "pipe: %s", strerror(errno));
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  char *args[] = {(char *)worker, "--blas-probe", (char *)(core ? core : "-"), NULL};
  extern char **environ;
  pid_t pid;
  int rc = posix_spawn(&pid, worker, &fa, NULL, args, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    snprintf(t->why, sizeof(t->why), "cannot start %s: %s", worker, strerror(rc));
    return;
  }
  static char out[PROBE_OUT];
  ssize_t got = read_all(fds[0], out, sizeof(out), now_ms() + MN_BLAS_PROBE_MS);
  close(fds[0]);
  int status = 0, timed_out = got < 0;
  if (timed_out) kill(pid, SIGKILL);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  t->transient = 0;
  parse(t, c, got > 0 ? out : NULL, status, timed_out);
}

/* Whether core names what OpenBLAS reported as done (SKYLAKEX vs "SkylakeX"). */
static int same_core(const char *name, const char *core) { return strcasecmp(name, core) == 0; }

/* Probes OpenBLAS's own choice, then each candidate it does not already run; decides. */
static void measure(const char *worker, mn_blas_choice_t *c) {
  mn_cpu_features_t f;
  mn_cpu_read(&f);
  const char *cand[MN_BLAS_MAX_CANDIDATES];
  int nc = mn_blas_candidates(&f, cand);
  mn_blas_probe(worker, NULL, &c->trial[0], c);
  c->n = 1;
  for (int i = 0; i < nc; i++) {
    int seen = 0;
    for (int j = 0; j < c->n; j++) seen |= same_core(cand[i], c->trial[j].core);
    if (seen) continue;
    mn_blas_trial_t *t = &c->trial[c->n];
    mn_blas_probe(worker, cand[i], t, NULL);
    /* OpenBLAS runs another core where it cannot run the one asked for: one already measured is not kept. */
    for (int j = 0; j < c->n && t->ok; j++) seen |= same_core(t->core, c->trial[j].core);
    if (!seen) c->n++;
  }
  c->chosen = mn_blas_decide(c->trial, c->n, MN_BLAS_GAIN);
}

/* Whether the trials say something lasting about this CPU and library (worth keeping). */
static int lasting(const mn_blas_choice_t *c) {
  for (int i = 0; i < c->n; i++)
    if (c->trial[i].transient) return 0;
  return c->trial[0].ok;
}

void mn_blas_choose(const char *worker, mn_blas_choice_t *c) {
  int64_t t0 = now_ms();
  memset(c, 0, sizeof(*c));
  /* The test hook changes what the probes answer: nothing it makes is read from or written to the cache. */
  const char *hook = getenv("MONARCH_BLAS_PROBE_CORRUPT");
  char path[512];
  int cache = (hook == NULL || hook[0] == '\0') && mn_blas_cache_path(path, sizeof(path)) == 0;
  if (cache && mn_blas_cache_read(path, c) == 0) {
    c->probe_ms = (double)(now_ms() - t0);
    return;
  }
  int lock = cache ? mn_blas_cache_lock(path) : -1;
  if (lock >= 0 && mn_blas_cache_read(path, c) == 0) { /* another process measured while we waited */
    close(lock);
    c->probe_ms = (double)(now_ms() - t0);
    return;
  }
  measure(worker, c);
  if (cache && lasting(c)) mn_blas_cache_write(path, c); /* a failure to write costs only the next start */
  if (lock >= 0) close(lock);
  c->probe_ms = (double)(now_ms() - t0);
}

int mn_blas_env_ours(void) {
  const char *set = getenv("OPENBLAS_CORETYPE"), *ours = getenv(MN_BLAS_PICKED);
  return set != NULL && ours != NULL && strcmp(set, ours) == 0;
}

void mn_blas_env_set(const char *core) {
  if (core == NULL) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(MN_BLAS_PICKED);
    return;
  }
  setenv("OPENBLAS_CORETYPE", core, 1);
  setenv(MN_BLAS_PICKED, core, 1);
}

void mn_blas_env_init(const char *prefix) {
  char worker[4096];
  snprintf(worker, sizeof(worker), "%s/bin/monarch-worker", prefix);
  const char *user = getenv("OPENBLAS_CORETYPE"), *mode = getenv("MONARCH_BLAS_CORETYPE");
  if (user != NULL && user[0] != '\0' && !mn_blas_env_ours()) return;
  mn_blas_env_set(NULL); /* ours, from a parent: chosen again below, the same way */
  if (mode == NULL || mode[0] == '\0') mode = "auto";
  if (strcasecmp(mode, "off") == 0) return;
  if (strcasecmp(mode, "auto") != 0) {
    mn_blas_trial_t t;
    mn_blas_probe(worker, mode, &t, NULL);
    if (t.ok) mn_blas_env_set(mode);
    else fprintf(stderr, "monarch-run: blas: MONARCH_BLAS_CORETYPE=%s failed its self-check (%s); "
                 "OpenBLAS's own choice stands\n", mode, t.why);
    return;
  }
  mn_blas_choice_t c;
  mn_blas_choose(worker, &c);
  if (c.chosen > 0) mn_blas_env_set(c.trial[c.chosen].name);
}
