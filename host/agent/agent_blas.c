/*
 * agent_blas.c - the OpenBLAS core type the agent's procs run (issue 34).
 * At start, before the loop runs, the agent picks a core type from the
 * CPU's features (blas_cpu.c) and tries it in a child process
 * (`monarch-worker --blas-probe`, blas_probe.c) beside OpenBLAS's own
 * choice: the pick goes to the procs (OPENBLAS_CORETYPE in the agent's
 * environment, which every spawn passes on) only if its product is right
 * and more than MN_BLAS_GAIN faster. A pick that crashes or computes wrong
 * is reported once, and the procs keep OpenBLAS's choice. STATUS reports
 * the result (mn__agent_blas_pack).
 */
#include "agent_int.h"
#include "blas_cpu.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>

#define MN_BLAS_PROBE_MS 5000 /* a probe that has not answered by then is killed and counts as failed */
#define MN_BLAS_GAIN 1.10     /* the pick must beat OpenBLAS's own choice by this factor */

typedef struct {
  char core[32];  /* openblas_get_corename() in the probe, or "?" */
  int ok;         /* its product matched the reference */
  double gflops;
  char why[96];   /* when !ok: "killed by SIGILL", "wrong result", "no answer in 5 s" */
} probe_t;

static mn_agent_blas_t blas = {"?", "openblas", 0, "?", 0, "", 0, 0};

const mn_agent_blas_t *mn__agent_blas(void) { return &blas; }

/* Reads the probe's one line from fd until the deadline (ms of CLOCK_MONOTONIC); the bytes read, or -1. */
static ssize_t read_line(int fd, char *buf, size_t n, int64_t deadline_ms) {
  size_t got = 0;
  for (;;) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    int64_t left = deadline_ms - ((int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000);
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, (int)left) == 0) return -1;
    ssize_t r = read(fd, buf + got, n - 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || (got += (size_t)r) == n - 1) break;
  }
  buf[got] = '\0';
  return (ssize_t)got;
}

/* Fills r from the probe's line, or its failure from how it ended. */
static void parse_probe(probe_t *r, const char *line, ssize_t got, int status, int timed_out) {
  const char *s = got > 0 ? strstr(line, "blas core=") : NULL;
  if (s == NULL || sscanf(s, "blas core=%31s ok=%d gflops=%lf", r->core, &r->ok, &r->gflops) != 3) r->ok = 0;
  if (r->ok) return;
  if (timed_out) snprintf(r->why, sizeof(r->why), "no answer in %d s", MN_BLAS_PROBE_MS / 1000);
  else if (WIFSIGNALED(status))
    snprintf(r->why, sizeof(r->why), "killed by SIG%s",
             sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
  else if (s != NULL) snprintf(r->why, sizeof(r->why), "its product differs from the reference");
  else snprintf(r->why, sizeof(r->why), "no answer (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* Runs `exe --blas-probe core` (NULL: OpenBLAS's own choice) with its stdout on a pipe; fills r. */
static void probe(const char *exe, const char *core, probe_t *r) {
  memset(r, 0, sizeof(*r));
  snprintf(r->core, sizeof(r->core), "?");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(r->why, sizeof(r->why), "pipe: %s", strerror(errno));
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  char *args[] = {(char *)exe, "--blas-probe", (char *)(core ? core : "-"), NULL};
  extern char **environ;
  pid_t pid;
  int rc = posix_spawn(&pid, exe, &fa, NULL, args, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    snprintf(r->why, sizeof(r->why), "cannot start %s: %s", exe, strerror(rc));
    return;
  }
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  char line[256];
  ssize_t got = read_line(fds[0], line, sizeof(line), (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000 + MN_BLAS_PROBE_MS);
  close(fds[0]);
  int status = 0, timed_out = got < 0;
  if (timed_out) kill(pid, SIGKILL);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  parse_probe(r, line, got, status, timed_out);
}

/* The pick failed or lost: procs keep OpenBLAS's own choice, and the log says why (once, at start). */
static void keep_own(const char *pick, const probe_t *mine, const char *why) {
  snprintf(blas.note, sizeof(blas.note), "%s %s", pick, why);
  fprintf(stderr, "monarch-worker: blas: %s %s; procs keep OpenBLAS's own %s\n", pick, why, mine->core);
}

/* Probes the pick (or the core MONARCH_BLAS_CORETYPE names) against OpenBLAS's own, and decides. */
static void try_pick(const char *exe, const char *pick, const probe_t *mine, int named) {
  probe_t p;
  probe(exe, pick, &p);
  char why[160];
  if (!p.ok) {
    snprintf(why, sizeof(why), "failed its self-check (%s)", p.why);
    keep_own(pick, mine, why);
  } else if (!named && p.gflops <= mine->gflops * MN_BLAS_GAIN) {
    snprintf(why, sizeof(why), "is not %.0f%% faster (%.1f against %.1f GFLOP/s)", (MN_BLAS_GAIN - 1) * 100,
             p.gflops, mine->gflops);
    keep_own(pick, mine, why);
  } else {
    setenv("OPENBLAS_CORETYPE", pick, 1); /* the agent itself never loads OpenBLAS: only its procs read it */
    snprintf(blas.core, sizeof(blas.core), "%s", p.core);
    blas.source = named ? "named" : "auto";
    blas.gflops = p.gflops;
  }
}

void mn__agent_blas_init(const char *exe, int verbose) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const char *user = getenv("OPENBLAS_CORETYPE"), *mode = getenv("MONARCH_BLAS_CORETYPE");
  if (mode == NULL || mode[0] == '\0') mode = "auto";
  probe_t mine;
  probe(exe, NULL, &mine); /* with the user's OPENBLAS_CORETYPE, if set: what the procs will run */
  snprintf(blas.core, sizeof(blas.core), "%s", mine.core);
  snprintf(blas.own, sizeof(blas.own), "%s", mine.core);
  blas.gflops = blas.own_gflops = mine.gflops;
  blas.ok = mine.ok;
  mn_cpu_features_t f;
  mn_cpu_read(&f);
  const char *pick = strcasecmp(mode, "auto") == 0 ? mn_blas_pick(&f) : NULL;
  if (user != NULL && user[0] != '\0') {
    blas.source = "user";
    snprintf(blas.note, sizeof(blas.note), "the user's OPENBLAS_CORETYPE=%s", user);
  } else if (strcasecmp(mode, "off") == 0) {
    blas.source = "off";
    snprintf(blas.note, sizeof(blas.note), "MONARCH_BLAS_CORETYPE=off");
  } else if (strcasecmp(mode, "auto") != 0) try_pick(exe, mode, &mine, 1);
  else if (pick == NULL) snprintf(blas.note, sizeof(blas.note), "no pick for this CPU's features");
  else if (strcasecmp(pick, mine.core) != 0) try_pick(exe, pick, &mine, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  blas.probe_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  if (verbose)
    fprintf(stderr, "monarch-worker: blas: procs run %s (%s, %.1f GFLOP/s); OpenBLAS's own %s %.1f GFLOP/s%s%s; "
            "probed in %.0f ms\n", blas.core, blas.source, blas.gflops, blas.own, blas.own_gflops,
            mine.ok ? "" : " failed its self-check: ", mine.ok ? "" : mine.why, blas.probe_ms);
}

void mn__agent_blas_pack(msgpack_packer *pk) {
  msgpack_pack_map(pk, 8);
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
}
