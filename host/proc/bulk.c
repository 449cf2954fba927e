/* bulk.c - same-host put and fetch by process_vm_readv/writev; see bulk.h. */
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

/* One thread's part of mn_bulk_copy: the whole of it, piece by piece. */
static int copy_serial(const mn_bulk_peer_t *peer, int to_peer, char *local, uint64_t remote, size_t n,
                       atomic_int *cancel, char *err, size_t errlen) {
  size_t done = 0;
  while (done < n) {
    if (cancel != NULL && atomic_load(cancel)) {
      snprintf(err, errlen, "cancelled after %zu of %zu bytes", done, n);
      return MN_ECANCELED;
    }
    int rc = mn_bulk_check_peer(peer, err, errlen);
    if (rc != 0) return rc;
    size_t want = n - done > MN_BULK_PIECE ? MN_BULK_PIECE : n - done;
    struct iovec l = {local + done, want}, r = {(void *)(uintptr_t)(remote + done), want};
    ssize_t got = to_peer ? process_vm_writev(peer->pid, &l, 1, &r, 1, 0) : process_vm_readv(peer->pid, &l, 1, &r, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : 0;
      if (e == EINTR) continue;
      snprintf(err, errlen, "%s the controller's memory at 0x%llx (%zu of %zu bytes done): %s",
               to_peer ? "writing" : "reading", (unsigned long long)(remote + done), done, n,
               e != 0 ? strerror(e) : "nothing moved");
      return e != 0 ? -e : MN_EPEER;
    }
    done += (size_t)got;
  }
  return 0;
}

typedef struct {
  const mn_bulk_peer_t *peer;
  int to_peer;
  char *local;
  uint64_t remote;
  size_t n;
  atomic_int *cancel;
  int rc;
  char err[256];
} stripe_t;

static void *stripe_run(void *arg) {
  stripe_t *s = arg;
  s->rc = copy_serial(s->peer, s->to_peer, s->local, s->remote, s->n, s->cancel, s->err, sizeof(s->err));
  return NULL;
}

int mn_bulk_threads(size_t n) {
  const char *e = getenv("MONARCH_BULK_THREADS");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long k = e != NULL && *e ? atol(e) : (cpus < MN_BULK_DEFAULT_THREADS ? cpus : MN_BULK_DEFAULT_THREADS);
  if (k > MN_BULK_MAX_THREADS) k = MN_BULK_MAX_THREADS;
  size_t by_size = n / MN_BULK_STRIPE_MIN;
  if ((size_t)k > by_size) k = (long)by_size;
  return k < 1 ? 1 : (int)k;
}

int mn_bulk_copy(const mn_bulk_peer_t *peer, int to_peer, char *local, uint64_t remote, size_t n, atomic_int *cancel,
                 char *err, size_t errlen) {
  int k = mn_bulk_threads(n);
  if (k == 1) return copy_serial(peer, to_peer, local, remote, n, cancel, err, errlen);
  stripe_t s[MN_BULK_MAX_THREADS];
  pthread_t th[MN_BULK_MAX_THREADS];
  int started[MN_BULK_MAX_THREADS] = {0};
  size_t per = (n / (size_t)k + 4095) & ~(size_t)4095; /* whole pages, so stripes do not share one */
  for (int i = 0; i < k; i++) {
    size_t at = per * (size_t)i < n ? per * (size_t)i : n, len = n - at < per ? n - at : per;
    s[i] = (stripe_t){peer, to_peer, local + at, remote + at, len, cancel, 0, ""};
    /* Stripe 0 is ours; a thread that cannot start leaves its stripe to us too. */
    if (i > 0) started[i] = pthread_create(&th[i], NULL, stripe_run, &s[i]) == 0;
  }
  for (int i = 0; i < k; i++)
    if (!started[i]) stripe_run(&s[i]);
  int rc = 0;
  for (int i = 0; i < k; i++) {
    if (started[i] && pthread_join(th[i], NULL) != 0) s[i].rc = s[i].rc ? s[i].rc : MN_EPEER;
    if (rc == 0 && s[i].rc != 0) {
      rc = s[i].rc;
      snprintf(err, errlen, "%s", s[i].err);
    }
  }
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
 * __bulk_put/__bulk_fetch(t, offset, len, addr, pid, cookie_addr, cookie).
 * NULL with err naming the bad argument: the range must lie in the tensor,
 * and addr .. addr+len must not wrap.
 */
static mk_tensor_t *bulk_args(mn_exec_t *x, const mn_builtin_t *b, const msgpack_object *args, size_t *off,
                              size_t *len, uint64_t *addr, mn_bulk_peer_t *peer, char *err, size_t errlen) {
  mk_tensor_t *t = mn_exec_tensor_arg(x, args, 0, err, errlen);
  if (t == NULL) return NULL;
  int64_t o, n;
  if (args->via.array.size != 7 || mn_get_i64(args, 1, &o) != 0 || mn_get_i64(args, 2, &n) != 0 ||
      mn_get_u64(args, 3, addr) != 0 || *addr == 0) {
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

/* __bulk_put / __bulk_fetch: one copy, between the tensor and the controller's memory. */
static int bulk_move(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, int fetch,
                     char *err, size_t errlen) {
  size_t off, len;
  uint64_t addr;
  mn_bulk_peer_t peer;
  mk_tensor_t *t = bulk_args(x, b, args, &off, &len, &addr, &peer, err, errlen);
  if (t == NULL) return MN_EINVAL;
  int rc = mn_bulk_copy(&peer, fetch, (char *)t->data + off, addr, len, x->cancel, err, errlen);
  if (rc != 0) {
    x->err_kind = "bulk";
    return rc;
  }
  return fetch ? mn_exec_returned(x, mk_return_int(ctx, (int64_t)len)) : 0;
}

/* __bulk_put(t, offset, len, addr, pid, cookie_addr, cookie): len bytes from the controller's addr into t at offset */
static int b_put(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                 size_t errlen) {
  return bulk_move(x, ctx, b, args, 0, err, errlen);
}

/* __bulk_fetch(t, offset, len, addr, pid, cookie_addr, cookie) -> len: t's bytes at offset to the controller's addr */
static int b_fetch(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  return bulk_move(x, ctx, b, args, 1, err, errlen);
}

static const mn_builtin_t entries[] = {
  {"__bulk_probe", b_probe, "(pid, cookie_addr, cookie)"},
  {"__bulk_put", b_put, "(tensor, offset, len, addr, pid, cookie_addr, cookie)"},
  {"__bulk_fetch", b_fetch, "(tensor, offset, len, addr, pid, cookie_addr, cookie)"},
};

static const mn_builtin_module_t module = {"__bulk_", entries, (int)(sizeof(entries) / sizeof(entries[0])), NULL};

int mn_bulk_register(void) { return mn_exec_register(&module); }
