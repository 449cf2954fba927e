/*
 * faulty.c - test-only kernel library "faulty".
 *
 * Each kernel misbehaves in one specific way (crash, exit, hang, spin, noisy
 * output) so the proc's and controller's failure handling can be exercised
 * end to end. Never ship it in a real deployment.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monarch_kernel.h"

/*
 * The pointer itself is volatile, so the compiler must load it and cannot
 * prove it is NULL: the store really happens and faults with SIGSEGV (a
 * provably-NULL store may be turned into a trap instruction, i.e. SIGILL).
 */
static int *volatile segv_target;

static int k_segv(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc, (void)argv;
  *segv_target = 42;
  return 0;
}

static int k_abort(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc, (void)argv;
  abort();
}

/* _exit, not exit: skips atexit handlers and stdio flushing, like a sudden death. */
static int k_exit(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc;
  _exit((int)argv[0].v.i);
}

/* The message comes back verbatim (no "fail:" prefix) so tests can match it exactly. */
static int k_fail(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  size_t len = argv[0].v.str.len;
  return mk_errorf(ctx, "%.*s", len > INT_MAX ? INT_MAX : (int)len, argv[0].v.str.ptr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Burns CPU without ever polling mk_cancelled: models a kernel that ignores cancel. */
static int k_spin(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  double secs = mk_arg_number(&argv[0]);
  if (!(secs >= 0.0 && secs <= 86400.0))
    return mk_errorf(ctx, "spin: seconds must be in [0, 86400], got %g", secs);
  double end = now_s() + secs;
  int64_t iters = 0;
  do
    iters++;
  while (now_s() < end);
  return mk_return_int(ctx, iters);
}

/* Blocks forever and ignores cancel; only a signal that kills the proc ends it. */
static int k_hang(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc, (void)argv;
  for (;;)
    pause();
  return 0; /* not reached; gcc -Wreturn-type still asks for it */
}

static int print_to(FILE *f, const mk_arg_t *a) {
  fwrite(a->v.str.ptr, 1, a->v.str.len, f);
  fputc('\n', f);
  fflush(f);
  return 0;
}

static int k_print(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc;
  return print_to(stdout, &argv[0]);
}

static int k_eprint(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc;
  return print_to(stderr, &argv[0]);
}

/* A side effect that must happen once per call: exactly-once tests count it. */
static int64_t bumps;

static int k_bump(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc, (void)argv;
  if (mk_return_int(ctx, ++bumps) != 0) return -1;
  return mk_return_int(ctx, (int64_t)getpid()); /* which incarnation counted it */
}

static int k_bumps(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc, (void)argv;
  return mk_return_int(ctx, bumps);
}

/* Appends "PID\n" to the file at path: a spec queues it just before the call it waits for and polls the
 * file, so it knows when the proc's executor reached that call instead of sleeping a guessed time. */
static int k_mark(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  char path[4096];
  size_t len = argv[0].v.str.len;
  if (len == 0 || len >= sizeof(path)) return mk_errorf(ctx, "mark: a path of 1..%zu bytes", sizeof(path) - 1);
  memcpy(path, argv[0].v.str.ptr, len);
  path[len] = '\0';
  FILE *f = fopen(path, "a");
  if (f == NULL) return mk_errorf(ctx, "mark: cannot open %s", path);
  int bad = fprintf(f, "%d\n", (int)getpid()) < 0;
  if (fclose(f) != 0 || bad) return mk_errorf(ctx, "mark: cannot write %s", path);
  return 0;
}

static const mk_kernel_t kernels[] = {
  { "segv", k_segv, "", "Dereferences NULL: the proc dies with SIGSEGV." },
  { "abort", k_abort, "", "Calls abort(): the proc dies with SIGABRT." },
  { "exit", k_exit, "i", "exit(code): the proc calls _exit(code) immediately." },
  { "fail", k_fail, "s", "fail(msg): returns an error whose message is exactly msg." },
  { "spin", k_spin, "n", "spin(s): busy-loops s seconds ignoring cancel; returns the iteration count." },
  { "hang", k_hang, "", "Sleeps forever ignoring cancel (pause() in a loop)." },
  { "print", k_print, "s", "print(s): writes s and a newline to stdout and flushes." },
  { "eprint", k_eprint, "s", "eprint(s): writes s and a newline to stderr and flushes." },
  { "bump", k_bump, "", "Adds one to this proc's counter; returns the new value and the pid." },
  { "bumps", k_bumps, "", "Returns this proc's counter without changing it." },
  { "mark", k_mark, "s", "mark(path): appends this proc's pid and a newline to the file at path." },
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "faulty", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
