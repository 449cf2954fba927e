/*
 * proc.c - the proc process: its setup and the __persist built-in.
 *
 * Two threads plus short-lived handshake threads. One thread at a time holds
 * the connection and reads it (proc_io.c): the executor while it is idle, or
 * the I/O thread while a call runs long (proc_handover.c says how they hand
 * it over). Calls run in order on the executor thread, which writes their
 * RESULTs straight to the socket, one write per burst. Only the executor
 * runs kernels (CUDA, actors and collectives keep one thread).
 *
 * Sessions make calls exactly-once across reconnects: a controller opens
 * every connection with SESSION(id, acked). The same id resumes: sequence
 * numbers continue, and a resent CALL that already ran is answered from the
 * replay cache. A new id starts afresh. With no controller traffic for
 * --orphan-timeout seconds the proc exits, unless it belongs to a persistent
 * mesh (__persist): then it waits for the controller that attaches it next.
 */
#include "proc_int.h"

#include "actor.h"
#include "bulk.h"
#include "coll_builtins.h"
#include "gpu.h"
#include "sock.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define MN_SPIN_NS_DEFAULT 0 /* the connection's holder yields before it sleeps; the agent sets MONARCH_SPIN_US, knowing how many procs share the host */

/* ---- persistence ------------------------------------------------------------- */

/* Set by __persist(true): no orphan timeout. The agent still reaps us (PDEATHSIG). */
static atomic_int persistent;

/* __persist(on): marks this proc as part of a persistent mesh (or not). Runs on the executor thread. */
static int persist_builtin(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                           char *err, size_t errlen) {
  if (args->via.array.size != 1 || args->via.array.ptr[0].type != MSGPACK_OBJECT_BOOLEAN) {
    snprintf(err, errlen, "__persist takes one boolean");
    return MN_EINVAL;
  }
  atomic_store(&persistent, args->via.array.ptr[0].via.boolean ? 1 : 0);
  return 0;
}

/* Any other name that starts with "__persist" gets the usage, as it always has. */
static void persist_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  snprintf(err, errlen, "__persist takes one boolean");
}

static const mn_builtin_t persist_entry = {"__persist", persist_builtin, "(on)"};
static const mn_builtin_module_t persist_module = {"__persist", &persist_entry, 1, persist_unknown};

int mn__proc_persistent(void) { return atomic_load(&persistent); }

/* ---- the process ------------------------------------------------------------------ */

/* The proc's state, its executor and the built-in modules, before any thread starts. 0, or 2 (the exit code). */
static int proc_init(proc_t *p, const mn_proc_opts_t *o, const mn_auth_t *auth) {
  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_cond_init(&p->space, NULL);
  pthread_mutex_init(&p->wlock, NULL);
  p->fd = -1;
  p->relay_fd = -1;
  p->auth = auth;
  mn_replay_init(&p->replay, MN_REPLAY_MAX_BYTES);
  const char *noreplay = getenv("MONARCH_NO_REPLAY");
  p->replay_on = !(noreplay && strcmp(noreplay, "1") == 0);
  if (pipe2(p->hs_pipe, O_CLOEXEC) != 0) return 2;
  const char *spin = getenv("MONARCH_SPIN_US");
  p->spin_ns = spin ? atol(spin) * 1000 : MN_SPIN_NS_DEFAULT;
  if (mn_exec_init(&p->exec, o->prefix, o->rank, o->world, &p->cancel) != 0) return 2;
  if (mn_cancel_init(&p->cancels, &p->cancel) != 0) return 2;
  p->exec.cancels = &p->cancels;
  if (mn_gpu_register() != 0) return 2;
  p->exec.device = o->device >= 0 ? 0 : -1; /* pinned: its GPU is the only one it sees, device 0 */
  if (mn_coll_start(o->bind_host, auth, o->rank) != 0) return 2;
  if (mn_actor_register() != 0) return 2;
  if (mn_exec_register(&persist_module) != 0) return 2;
  if (mn_bulk_register() != 0) return 2;
  /* Blocking, for the I/O thread's read; arming resets it (wait_takeover). */
  if ((p->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC)) < 0) return 2;
  if ((p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) return 2;
  return 0;
}

int mn_proc_main(const mn_proc_opts_t *o) {
  static proc_t P;
  proc_t *p = &P;
  mn_auth_t auth;
  char err[256];
  int port = 0;
  signal(SIGPIPE, SIG_IGN);
  /* Bulk frames are malloc'd per chunk: keep such blocks in the heap for
   * reuse instead of fresh mmaps whose page faults would halve throughput. */
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  if (o->parent > 0) {
    /* Die with the host agent, so a killed agent leaves no orphans. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != o->parent) return 3;
  }
  /* Before any thread starts (setenv is not thread-safe) and before CUDA loads. */
  if (o->device >= 0 && mn_gpu_pin(o->device, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch-worker --proc: %s\n", err);
    return 2;
  }
  if (mn_auth_load(&auth, NULL, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch-worker --proc: %s\n", err);
    return 2;
  }
  int lfd = mn_sock_listen(o->bind_host, 0, &port);
  if (lfd < 0) {
    fprintf(stderr, "monarch-worker --proc: cannot listen on %s: %s\n", o->bind_host, strerror(-lfd));
    return 2;
  }
  if (proc_init(p, o, &auth) != 0) return 2;

  /* Report the port only once everything is ready to serve, and before the
   * first status line: the agent reads both on this pipe. */
  char line[32];
  int ln = snprintf(line, sizeof(line), "%d\n", port);
  if (mn_write_all(o->port_fd >= 0 ? o->port_fd : 1, line, (size_t)ln) != 0) return 2;
  mn__proc_status_init(p, o->port_fd);
  if (mn__proc_io_init(p, lfd, o->orphan_timeout, o->relay_fd) != 0) return 2;
  pthread_t th;
  if (pthread_create(&th, NULL, mn__proc_executor, p) != 0) return 2;
  mn__proc_io_thread(p); /* never returns: the proc leaves by _exit */
}
