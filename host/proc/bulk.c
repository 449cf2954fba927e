/* bulk.c - same-host put and fetch: the copies and the __bulk_ built-ins; see bulk.h. */
#include "bulk.h"

#include "exec.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- copies ------------------------------------------------------------------ */

int mn_bulk_check_peer(const mn_bulk_peer_t *peer, char *err, size_t errlen) {
  const char *sim = getenv("MONARCH_BULK_LOCAL_SIMULATE");
  if (sim != NULL && strcmp(sim, "eperm") == 0) {
    snprintf(err, errlen, "reading the controller's memory: %s (simulated: MONARCH_BULK_LOCAL_SIMULATE)",
             strerror(EPERM));
    return -EPERM;
  }
  uint64_t seen = 0;
  struct iovec local = {&seen, sizeof(seen)}, remote = {(void *)(uintptr_t)peer->cookie_addr, sizeof(seen)};
  ssize_t got = process_vm_readv(peer->pid, &local, 1, &remote, 1, 0);
  if (got < 0) {
    int e = errno;
    snprintf(err, errlen, "reading the controller's memory (pid %d): %s", (int)peer->pid, strerror(e));
    return -e;
  }
  if (got != (ssize_t)sizeof(seen) || seen != peer->cookie || peer->cookie == 0) {
    snprintf(err, errlen, "pid %d here is not the controller that asked (another host or PID namespace)",
             (int)peer->pid);
    return MN_EPEER;
  }
  return 0;
}

/* A copy shared by its threads: each claims the next piece until none is left. */
typedef struct {
  const mn_bulk_peer_t *peer;
  int to_peer;
  char *local;
  uint64_t remote;
  char *mapped; /* our map of the bytes at remote, or NULL: process_vm */
  size_t n;
  atomic_int *cancel;
  atomic_size_t next; /* offset of the next piece to claim */
  atomic_size_t done; /* bytes copied */
  atomic_int stop;    /* a piece failed: the others stop too */
} job_t;

typedef struct {
  job_t *job;
  int rc;
  char err[256];
} worker_t;

/* One piece by process_vm_readv/writev, after the peer proves itself again. */
static int piece_vm(job_t *j, size_t at, size_t len, char *err, size_t errlen) {
  int rc = mn_bulk_check_peer(j->peer, err, errlen);
  size_t moved = 0;
  while (rc == 0 && moved < len) {
    struct iovec l = {j->local + at + moved, len - moved}, r = {(void *)(uintptr_t)(j->remote + at + moved), len - moved};
    ssize_t got = j->to_peer ? process_vm_writev(j->peer->pid, &l, 1, &r, 1, 0)
                             : process_vm_readv(j->peer->pid, &l, 1, &r, 1, 0);
    if (got > 0) {
      moved += (size_t)got;
      continue;
    }
    int e = got < 0 ? errno : 0;
    if (e == EINTR) continue;
    snprintf(err, errlen, "%s the controller's memory at 0x%llx (%zu of %zu bytes done): %s",
             j->to_peer ? "writing" : "reading", (unsigned long long)(j->remote + at + moved),
             atomic_load(&j->done) + moved, j->n, e != 0 ? strerror(e) : "nothing moved");
    rc = e != 0 ? -e : MN_EPEER;
  }
  return rc;
}

static void *work(void *arg) {
  worker_t *w = arg;
  job_t *j = w->job;
  while (!atomic_load(&j->stop)) {
    if (j->cancel != NULL && atomic_load(j->cancel)) {
      snprintf(w->err, sizeof(w->err), "cancelled after %zu of %zu bytes", atomic_load(&j->done), j->n);
      w->rc = MN_ECANCELED;
      break;
    }
    size_t at = atomic_fetch_add(&j->next, MN_BULK_PIECE);
    if (at >= j->n) break;
    size_t len = j->n - at < MN_BULK_PIECE ? j->n - at : MN_BULK_PIECE;
    if (j->mapped == NULL) w->rc = piece_vm(j, at, len, w->err, sizeof(w->err));
    else if (j->to_peer) mn__bulk_copy_stream(j->mapped + at, j->local + at, len);
    else mn__bulk_copy_stream(j->local + at, j->mapped + at, len);
    if (w->rc != 0) break;
    atomic_fetch_add(&j->done, len);
  }
  if (w->rc != 0) atomic_store(&j->stop, 1);
  return NULL;
}

int mn_bulk_threads(size_t n, int mapped) {
  const char *e = getenv("MONARCH_BULK_THREADS");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long k = e != NULL && *e ? atol(e) : mapped ? 1 : (cpus < MN_BULK_DEFAULT_THREADS ? cpus : MN_BULK_DEFAULT_THREADS);
  if (k > MN_BULK_MAX_THREADS) k = MN_BULK_MAX_THREADS;
  size_t by_size = n / MN_BULK_STRIPE_MIN;
  if ((size_t)k > by_size) k = (long)by_size;
  return k < 1 ? 1 : (int)k;
}

int mn_bulk_copy(const mn_bulk_peer_t *peer, int to_peer, char *local, uint64_t remote, char *mapped, size_t n,
                 atomic_int *cancel, char *err, size_t errlen) {
  job_t j = {peer, to_peer, local, remote, mapped, n, cancel, 0, 0, 0};
  int k = mn_bulk_threads(n, mapped != NULL);
  worker_t w[MN_BULK_MAX_THREADS];
  pthread_t th[MN_BULK_MAX_THREADS];
  int started[MN_BULK_MAX_THREADS] = {0};
  for (int i = 0; i < k; i++) {
    w[i] = (worker_t){&j, 0, ""};
    /* Worker 0 is this thread; one that cannot start is simply not there to take pieces. */
    if (i > 0) started[i] = pthread_create(&th[i], NULL, work, &w[i]) == 0;
  }
  work(&w[0]);
  int rc = 0;
  for (int i = 0; i < k; i++) {
    if (started[i] && pthread_join(th[i], NULL) != 0 && w[i].rc == 0) {
      w[i].rc = MN_EPEER;
      snprintf(w[i].err, sizeof(w[i].err), "a copy thread could not be joined");
    }
    if (rc == 0 && w[i].rc != 0) {
      rc = w[i].rc;
      snprintf(err, errlen, "%s", w[i].err);
    }
  }
  if (rc == 0) mn__bulk_count(mapped != NULL, n);
  return rc;
}

/* ---- built-ins ------------------------------------------------------------------ */

/* The peer from args[at .. at+2] (pid, cookie address, cookie); MN_EINVAL with err. */
static int peer_arg(const mn_builtin_t *b, const msgpack_object *args, uint32_t at, mn_bulk_peer_t *peer, char *err,
                    size_t errlen) {
  int64_t pid;
  if (mn_get_i64(args, at, &pid) != 0 || pid <= 0 || pid > INT32_MAX ||
      mn_get_u64(args, at + 1, &peer->cookie_addr) != 0 || peer->cookie_addr == 0 ||
      mn_get_u64(args, at + 2, &peer->cookie) != 0 || peer->cookie == 0) {
    snprintf(err, errlen, "%s takes %s: pid, cookie address and cookie must be positive integers", b->name, b->usage);
    return MN_EINVAL;
  }
  peer->pid = (pid_t)pid;
  return 0;
}

/* __bulk_probe(pid, cookie_addr, cookie) -> true, or false and why: may this proc copy the caller's memory? */
static int b_probe(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  mn_bulk_peer_t peer;
  int rc = peer_arg(b, args, 0, &peer, err, errlen);
  if (rc != 0) return rc;
  char why[256];
  if (mn_bulk_check_peer(&peer, why, sizeof(why)) != 0)
    return mn_exec_returned(x, mk_return_bool(ctx, 0) || mk_return_string(ctx, why, strlen(why)));
  return mn_exec_returned(x, mk_return_bool(ctx, 1));
}

/*
 * The CPU tensor, its byte range and the controller's memory of
 * __bulk_put/__bulk_fetch(t, offset, len, addr, pid, cookie_addr, cookie
 * [, fd, fd_offset]): fd (-1: none) is the controller's memfd that holds
 * addr at fd_offset. NULL with err naming the bad argument: the range must
 * lie in the tensor, and addr .. addr+len must not wrap.
 */
static mk_tensor_t *bulk_args(mn_exec_t *x, const mn_builtin_t *b, const msgpack_object *args, size_t *off,
                              size_t *len, uint64_t *addr, mn_bulk_peer_t *peer, int64_t region[2], char *err,
                              size_t errlen) {
  mk_tensor_t *t = mn_exec_tensor_arg(x, args, 0, err, errlen);
  if (t == NULL) return NULL;
  int64_t o, n;
  uint32_t argc = args->via.array.size;
  region[0] = -1;
  region[1] = 0;
  if ((argc != 7 && argc != 9) || mn_get_i64(args, 1, &o) != 0 || mn_get_i64(args, 2, &n) != 0 ||
      mn_get_u64(args, 3, addr) != 0 || *addr == 0 ||
      (argc == 9 && (mn_get_i64(args, 7, &region[0]) != 0 || region[0] < -1 || region[0] > INT32_MAX ||
                     mn_get_i64(args, 8, &region[1]) != 0 || region[1] < 0))) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return NULL;
  }
  if (o < 0 || n < 0 || (uint64_t)o > t->nbytes || (uint64_t)n > t->nbytes - (uint64_t)o) {
    snprintf(err, errlen, "%s: range %lld+%lld is outside the tensor's %zu bytes", b->name, (long long)o,
             (long long)n, t->nbytes);
    return NULL;
  }
  if (*addr > UINT64_MAX - (uint64_t)n) {
    snprintf(err, errlen, "%s: address 0x%llx + %lld wraps around", b->name, (unsigned long long)*addr, (long long)n);
    return NULL;
  }
  if (t->device >= 0) {
    snprintf(err, errlen, "%s: the tensor is on cuda:%d; same-host bulk is for CPU tensors", b->name, t->device);
    return NULL;
  }
  if (peer_arg(b, args, 4, peer, err, errlen) != 0) return NULL;
  *off = (size_t)o;
  *len = (size_t)n;
  return t;
}

/* __bulk_put / __bulk_fetch: one copy, between the tensor and the controller's memory (its map when it names one). */
static int bulk_move(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, int fetch,
                     char *err, size_t errlen) {
  size_t off, len;
  uint64_t addr;
  int64_t region[2];
  mn_bulk_peer_t peer;
  mk_tensor_t *t = bulk_args(x, b, args, &off, &len, &addr, &peer, region, err, errlen);
  if (t == NULL) return MN_EINVAL;
  char *mapped = NULL;
  int rc = region[0] >= 0 ? mn_bulk_map(&peer, (int)region[0], (uint64_t)region[1], len, &mapped, err, errlen) : 1;
  if (rc == 1) {
    mapped = NULL; /* no map to be had: the kernel copies */
    rc = 0;
  }
  if (rc == 0) rc = mn_bulk_copy(&peer, fetch, (char *)t->data + off, addr, mapped, len, x->cancel, err, errlen);
  if (rc != 0) {
    if (rc != MN_EINVAL) x->err_kind = "bulk";
    return rc;
  }
  return fetch ? mn_exec_returned(x, mk_return_int(ctx, (int64_t)len)) : 0;
}

/* __bulk_put(t, offset, len, addr, pid, cookie_addr, cookie[, fd, fd_offset]): len bytes from the controller's addr into t at offset */
static int b_put(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                 size_t errlen) {
  return bulk_move(x, ctx, b, args, 0, err, errlen);
}

/* __bulk_fetch(t, offset, len, addr, pid, cookie_addr, cookie[, fd, fd_offset]) -> len: t's bytes at offset to the controller's addr */
static int b_fetch(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  return bulk_move(x, ctx, b, args, 1, err, errlen);
}

/* __bulk_stats() -> maps held, bytes copied through maps, bytes copied by process_vm, maps made, why a region went unmapped */
static int b_stats(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  const mn_bulk_stats_t *s = mn_bulk_stats();
  return mn_exec_returned(x, mk_return_int(ctx, mn_bulk_maps_held()) || mk_return_int(ctx, (int64_t)s->mapped_bytes) ||
                                 mk_return_int(ctx, (int64_t)s->vm_bytes) || mk_return_int(ctx, (int64_t)s->maps_made) ||
                                 mk_return_string(ctx, s->why_unmapped, strlen(s->why_unmapped)));
}

static const mn_builtin_t entries[] = {
  {"__bulk_probe", b_probe, "(pid, cookie_addr, cookie)"},
  {"__bulk_put", b_put, "(tensor, offset, len, addr, pid, cookie_addr, cookie[, fd, fd_offset])"},
  {"__bulk_fetch", b_fetch, "(tensor, offset, len, addr, pid, cookie_addr, cookie[, fd, fd_offset])"},
  {"__bulk_stats", b_stats, "()"},
};

static const mn_builtin_module_t module = {"__bulk_", entries, (int)(sizeof(entries) / sizeof(entries[0])), NULL};

int mn_bulk_register(void) { return mn_exec_register(&module); }
