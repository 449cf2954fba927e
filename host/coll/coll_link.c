/*
 * coll_link.c - the data port (an acceptor thread that authenticates and
 * parks links), connecting to peers, and transfers driven by one poll loop.
 */
#include "coll_int.h"

#include <sched.h>
#include <sodium.h>

/* ---- sockets -------------------------------------------------------------------------- */

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  /* Best effort: every send and recv below passes MSG_DONTWAIT anyway. */
  if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return;
}

/* ---- blocking-with-deadline I/O for handshakes and small messages ------------------- */

/* Waits until fd is ready for `events` or the deadline passes: 0, MN_ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - mn_now_ms();
    if (left <= 0) return MN_ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
    if (r > 0) return 0;
    if (r < 0 && errno != EINTR) return -errno;
  }
}

/* Reads exactly n bytes: 0, MN_ECLOSED, MN_ETIMEDOUT or -errno. */
int mn__coll_read_exact(int fd, void *p, size_t n, int64_t deadline) {
  char *c = p;
  while (n > 0) {
    ssize_t r = recv(fd, c, n, MSG_DONTWAIT);
    if (r > 0) {
      c += r;
      n -= (size_t)r;
    } else if (r == 0) {
      return MN_ECLOSED;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLIN, deadline);
      if (w != 0) return w;
    } else if (errno != EINTR) {
      return -errno;
    }
  }
  return 0;
}

int mn__coll_write_exact(int fd, const void *p, size_t n, int64_t deadline) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w >= 0) {
      c += w;
      n -= (size_t)w;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int r = wait_fd(fd, POLLOUT, deadline);
      if (r != 0) return r;
    } else if (errno != EINTR) {
      return -errno;
    }
  }
  return 0;
}

/*
 * Reads one whole frame (and not a byte more: what follows belongs to the
 * link's later user) into buf; returns its body length or a negative code.
 */
static int64_t read_frame_exact(int fd, char *buf, size_t max, int64_t deadline) {
  char pre[MN_FRAME_HEADER];
  int rc = mn__coll_read_exact(fd, pre, sizeof(pre), deadline);
  if (rc != 0) return rc;
  uint32_t n = mn_be32(pre);
  if (n == 0 || n > max) return MN_EFRAME;
  rc = mn__coll_read_exact(fd, buf, n, deadline);
  return rc != 0 ? rc : (int64_t)n;
}

static const char *io_error(int code) {
  if (code == MN_ECLOSED) return "the peer closed the link";
  if (code == MN_ETIMEDOUT) return "timed out";
  if (code == MN_EFRAME) return "oversized frame";
  return code < 0 && code > -4096 ? strerror(-code) : mn_strerror(code);
}

/* ---- the data port: acceptor thread and parked links ---------------------------------- */

/*
 * Server side of the token handshake: 0 once the peer proved it holds the
 * token, else the I/O, decoding or authentication code.
 */
static int serve_handshake(mn_coll_t *c, int fd, int64_t deadline) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char body[MN_COLL_MAX_HS_FRAME], err[256];
  msgpack_zone zone;
  msgpack_object msg;
  mn_buf_t out;
  int rc;
  mn_buf_init(&out);
  if (!msgpack_zone_init(&zone, 1024)) return MN_ENOMEM;
  mn_hs_hello(&out, "data", ns);
  if ((rc = mn__coll_write_exact(fd, out.data, out.len, deadline)) != 0) goto done;
  out.len = 0;
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) {
    rc = (int)n;
    goto done;
  }
  rc = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
  if (rc == 0) rc = mn_hs_check_auth(&c->auth, &msg, ns, nc, err, sizeof(err));
  if (rc != 0) {
    /* The refusal is best effort: the peer is dropped either way, with the decoding or auth code. */
    mn_msg_pack_error(&out, rc, err);
    if (mn__coll_write_exact(fd, out.data, out.len, deadline) != 0) goto done;
    goto done;
  }
  mn_hs_welcome(&out, &c->auth, ns, nc, "data");
  rc = mn__coll_write_exact(fd, out.data, out.len, deadline);
done:
  mn_buf_free(&out);
  msgpack_zone_destroy(&zone);
  return rc;
}

/*
 * Reads [kind, key, from, nbytes, rank, dtype] or, for a copy, that and
 * [pid, data address, cookie address, cookie]. 0; the read's code;
 * MN_ENOMEM; or MN_EPROTO for anything else.
 */
static int read_ident(int fd, parked_t *e, int64_t deadline) {
  char body[MN_COLL_MAX_IDENT], err[128];
  msgpack_zone zone;
  msgpack_object msg;
  uint64_t v[10] = {0};
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) return (int)n;
  if (!msgpack_zone_init(&zone, 512)) return MN_ENOMEM;
  int rc = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
  uint32_t items = rc == 0 ? msg.via.array.size : 0;
  if (items != 6 && items != 10) rc = MN_EPROTO;
  for (uint32_t i = 0; rc == 0 && i < items; i++) rc = mn_get_u64(&msg, i, &v[i]);
  msgpack_zone_destroy(&zone);
  if (rc != 0 || v[0] < MN_COLL_LINK_RING || v[0] > MN_COLL_LINK_LEADER || v[2] > UINT32_MAX || v[5] >= MK_DTYPE_COUNT)
    return MN_EPROTO;
  e->kind = (int)v[0];
  e->key = v[1];
  e->from = (uint32_t)v[2];
  e->nbytes = v[3];
  e->dtype = (int)v[5];
  e->pid = v[6];
  e->addr = v[7];
  e->cookie_addr = v[8];
  e->cookie = v[9];
  return 0;
}

/* Files an authenticated link; a duplicate replaces the older one, a full table evicts the oldest. */
static void park(mn_coll_t *c, parked_t *e) {
  pthread_mutex_lock(&c->lock);
  parked_t *slot = NULL, *oldest = NULL;
  for (int i = 0; i < MN_COLL_MAX_PARKED; i++) {
    parked_t *p = &c->parked[i];
    if (p->kind == e->kind && p->key == e->key && p->from == e->from) {
      slot = p;
      break;
    }
    if (p->kind == 0 && slot == NULL) slot = p;
    if (p->kind != 0 && (oldest == NULL || p->order < oldest->order)) oldest = p;
  }
  if (slot == NULL) slot = oldest;
  if (slot->kind != 0) close(slot->fd);
  e->order = ++c->arrivals;
  *slot = *e;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

static void *acceptor_main(void *arg) {
  mn_coll_t *c = arg;
  while (!atomic_load(&c->stopping)) {
    int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (atomic_load(&c->stopping)) break;
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        struct timespec ts = {0, 10 * 1000 * 1000}; /* out of descriptors: let some close */
        nanosleep(&ts, NULL);
      } else if (errno == EINVAL || errno == EBADF) {
        break; /* the socket was shut down */
      }
      continue;
    }
    mn_sock_nodelay(fd);
    int64_t deadline = mn_now_ms() + MN_HANDSHAKE_TIMEOUT_MS;
    parked_t e;
    memset(&e, 0, sizeof(e));
    e.fd = fd;
    /* A peer that fails the handshake or sends a bad identification is dropped quietly. */
    if (serve_handshake(c, fd, deadline) != 0 || read_ident(fd, &e, deadline) != 0) {
      close(fd);
      continue;
    }
    set_nonblock(fd);
    park(c, &e);
  }
  return NULL;
}

/*
 * Takes the parked link (kind, key, from); from < 0 takes any with that key.
 * Waits up to the instance timeout. Returns 0 and fills *out, MN_ETIMEDOUT,
 * or MN_ECANCELED.
 */
int mn__coll_claim(mn_coll_t *c, int kind, uint64_t key, int64_t from, parked_t *out) {
  int64_t deadline = mn_now_ms() + c->timeout_ms;
  int rc = MN_ETIMEDOUT;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    for (int i = 0; i < MN_COLL_MAX_PARKED; i++) {
      parked_t *p = &c->parked[i];
      if (p->kind == kind && p->key == key && (from < 0 || p->from == (uint64_t)from)) {
        *out = *p;
        p->kind = 0;
        rc = 0;
        goto done;
      }
    }
    int64_t now = mn_now_ms();
    if (now >= deadline) break;
    if (mn__coll_cancelled(c)) {
      rc = MN_ECANCELED;
      break;
    }
    int64_t wait = deadline - now < MN_COLL_POLL_SLICE_MS ? deadline - now : MN_COLL_POLL_SLICE_MS;
    struct timespec ts = mn_deadline_ts(wait); /* c->cond runs on CLOCK_MONOTONIC */
    pthread_cond_timedwait(&c->cond, &c->lock, &ts);
  }
done:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static void default_host_key(mn_coll_t *c);

int mn_coll_open(mn_coll_t **out, const char *bind_host, const mn_auth_t *auth, int rank, char *err,
                 size_t errlen) {
  mn_coll_t *c = calloc(1, sizeof(*c));
  pthread_condattr_t ca;
  if (c == NULL) {
    snprintf(err, errlen, "out of memory");
    return MN_ENOMEM;
  }
  c->auth = *auth;
  c->rank = rank;
  c->timeout_ms = (int)(MN_COLL_TIMEOUT_DEFAULT * 1000);
  const char *t = getenv("MONARCH_COLL_TIMEOUT");
  if (t != NULL && *t) {
    double s = strtod(t, NULL);
    if (s > 0 && s < 1e6) c->timeout_ms = (int)(s * 1000);
  }
  const char *cma = getenv("MONARCH_COLL_CMA");
  c->cma = !(cma != NULL && strcmp(cma, "0") == 0);
  const char *shm = getenv("MONARCH_COLL_SHM"), *piece = getenv("MONARCH_COLL_SHM_PIECE");
  c->shm = !(shm != NULL && strcmp(shm, "0") == 0);
  c->shm_piece = piece != NULL && *piece ? (size_t)strtoull(piece, NULL, 10) : 0;
  default_host_key(c);
  const char *spin = getenv("MONARCH_SPIN_US");
  c->spin_us = spin != NULL && *spin ? atoi(spin) : 0;
  uint8_t nonce[MN_NONCE_LEN];
  mn_auth_nonce(nonce);
  memcpy(&c->cookie, nonce, sizeof(c->cookie));
  atomic_init(&c->stopping, 0);
  pthread_mutex_init(&c->lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cond, &ca);
  pthread_condattr_destroy(&ca);
  c->lfd = mn_sock_listen(bind_host, 0, &c->port);
  if (c->lfd < 0) {
    int code = c->lfd;
    snprintf(err, errlen, "cannot listen on %s: %s", bind_host, strerror(-code));
    c->lfd = -1;
    mn_coll_close(c);
    return code;
  }
  int rc = pthread_create(&c->acceptor, NULL, acceptor_main, c);
  if (rc != 0) {
    snprintf(err, errlen, "cannot start the acceptor thread: %s", strerror(rc));
    mn_coll_close(c);
    return -rc;
  }
  c->acceptor_started = 1;
  *out = c;
  return 0;
}


void mn_coll_close(mn_coll_t *c) {
  if (c == NULL) return;
  atomic_store(&c->stopping, 1);
  /* Shutting the listening socket down wakes the acceptor out of accept(). */
  if (c->lfd >= 0 && shutdown(c->lfd, SHUT_RDWR) != 0 && c->acceptor_started) pthread_cancel(c->acceptor);
  if (c->acceptor_started) pthread_join(c->acceptor, NULL);
  mn__coll_close_fd(&c->lfd);
  while (c->groups != NULL) mn__coll_group_destroy(c, c->groups);
  for (int i = 0; i < MN_COLL_MAX_PARKED; i++)
    if (c->parked[i].kind != 0) close(c->parked[i].fd);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c->tmp);
  free(c->star_buf);
  free(c);
}

int mn_coll_port(const mn_coll_t *c) { return c->port; }
int mn_coll_rank(const mn_coll_t *c) { return c->rank; }
void mn_coll_set_timeout(mn_coll_t *c, double seconds) {
  c->timeout_ms = seconds <= 0 ? 1 : seconds > 1e6 ? 1000000000 : (int)(seconds * 1000);
}
void mn_coll_set_cancel(mn_coll_t *c, atomic_int *cancel) { c->cancel = cancel; }
void mn_coll_set_cma(mn_coll_t *c, int on) { c->cma = on != 0; }
void mn_coll_set_shm(mn_coll_t *c, int on) { c->shm = on != 0; }
_Static_assert(crypto_generichash_BYTES <= MN_COLL_HOST_KEY, "a host key holds the hash");

void mn_coll_set_host_key(mn_coll_t *c, const char *key) {
  /* A hash, so keys of any length stay distinct (a truncated copy could merge two hosts). */
  memset(c->host_key, 0, sizeof(c->host_key));
  crypto_generichash((unsigned char *)c->host_key, crypto_generichash_BYTES, (const unsigned char *)key, strlen(key),
                     NULL, 0);
}

/* The kernel's boot id: procs that share it share memory (the test for that is still made, by mapping). */
static void default_host_key(mn_coll_t *c) {
  const char *k = getenv("MONARCH_HOST_KEY");
  char id[64] = "";
  FILE *f = k != NULL && *k ? NULL : fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f != NULL) {
    if (fgets(id, sizeof(id), f) == NULL) id[0] = '\0';
    id[strcspn(id, "\n")] = '\0';
    fclose(f);
  }
  if (k == NULL || !*k) k = id[0] ? id : "unknown";
  mn_coll_set_host_key(c, k);
}

/* ---- connecting to a peer's data port ------------------------------------------------- */

/* Nonblocking connect bounded by the deadline; returns the fd or a negative code. */
static int connect_deadline(const char *host, int port, int64_t deadline) {
  struct addrinfo hints, *res, *ai;
  char service[16];
  int fd = -ECONNREFUSED;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  snprintf(service, sizeof(service), "%d", port);
  if (getaddrinfo(host, service, &hints, &res) != 0) return -EHOSTUNREACH;
  for (ai = res; ai != NULL; ai = ai->ai_next) {
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) continue;
    int rc = connect(s, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : -errno;
    if (rc == -EINPROGRESS) {
      rc = wait_fd(s, POLLOUT, deadline);
      int soerr = 0;
      socklen_t sl = sizeof(soerr);
      if (rc == 0) rc = getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 ? -errno : -soerr;
    }
    if (rc == 0) {
      fd = s;
      break;
    }
    fd = rc;
    close(s);
  }
  freeaddrinfo(res);
  if (fd >= 0) mn_sock_nodelay(fd);
  return fd;
}

/* Client side of the handshake; 0, or the I/O, decoding or authentication code with err. */
static int client_handshake(mn_coll_t *c, int fd, int64_t deadline, char *err, size_t errlen) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char body[MN_COLL_MAX_HS_FRAME];
  msgpack_zone zone;
  msgpack_object msg;
  mn_buf_t out;
  int rc;
  if (!msgpack_zone_init(&zone, 1024)) {
    snprintf(err, errlen, "out of memory");
    return MN_ENOMEM;
  }
  mn_buf_init(&out);
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) {
    rc = (int)n;
    snprintf(err, errlen, "no HELLO: %s", io_error(rc));
    goto done;
  }
  if ((rc = mn_decode(body, (size_t)n, &zone, &msg, err, errlen)) != 0 ||
      (rc = mn_hs_answer(&out, &c->auth, &msg, ns, nc, err, errlen)) != 0)
    goto done;
  rc = mn__coll_write_exact(fd, out.data, out.len, deadline);
  if (rc != 0) {
    snprintf(err, errlen, "sending AUTH: %s", io_error(rc));
    goto done;
  }
  msgpack_zone_clear(&zone);
  n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) {
    rc = (int)n;
    snprintf(err, errlen, "no WELCOME: %s", io_error(rc));
    goto done;
  }
  rc = mn_decode(body, (size_t)n, &zone, &msg, err, errlen);
  if (rc == 0) rc = mn_hs_check_welcome(&c->auth, &msg, ns, nc, err, errlen);
done:
  mn_buf_free(&out);
  msgpack_zone_destroy(&zone);
  return rc;
}

/*
 * Opens an authenticated link to the data port at addr and identifies it.
 * Returns the (nonblocking) fd, or a negative code with err saying what
 * failed: MN_EINVAL for a bad address, -errno from connecting, the
 * handshake's code (MN_EAUTH, ...) or the I/O code of identifying the link.
 */
int mn__coll_link_open(mn_coll_t *c, const char *addr, int kind, uint64_t key, uint32_t from, uint64_t nbytes,
                     int dtype, const void *data, char *err, size_t errlen) {
  char host[MN_COLL_MAX_ADDR + 1], why[256];
  int port;
  int64_t deadline = mn_now_ms() + c->timeout_ms;
  if (strlen(addr) > MN_COLL_MAX_ADDR || mn_parse_addr(addr, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "'%s' is not a data address HOST:PORT", addr);
    return MN_EINVAL;
  }
  int fd = connect_deadline(host, port, deadline);
  if (fd < 0) {
    snprintf(err, errlen, "cannot connect to %s: %s", addr, io_error(fd));
    return fd;
  }
  int rc = client_handshake(c, fd, deadline, why, sizeof(why));
  if (rc != 0) {
    snprintf(err, errlen, "handshake with %s failed: %s", addr, why);
    close(fd);
    return rc;
  }
  mn_buf_t b;
  msgpack_packer pk;
  size_t start = mn_frame_start(&b, &pk);
  msgpack_pack_array(&pk, data != NULL ? 10 : 6);
  msgpack_pack_int(&pk, kind);
  msgpack_pack_uint64(&pk, key);
  msgpack_pack_uint32(&pk, from);
  msgpack_pack_uint64(&pk, nbytes);
  msgpack_pack_int(&pk, c->rank < 0 ? 0 : c->rank);
  msgpack_pack_int(&pk, dtype);
  if (data != NULL) { /* a copy: the receiver may read the data itself if it shares our host */
    msgpack_pack_uint64(&pk, (uint64_t)getpid());
    msgpack_pack_uint64(&pk, (uint64_t)(uintptr_t)data);
    msgpack_pack_uint64(&pk, (uint64_t)(uintptr_t)&c->cookie);
    msgpack_pack_uint64(&pk, c->cma ? c->cookie : 0);
  }
  mn_frame_end(&b, start);
  rc = mn__coll_write_exact(fd, b.data, b.len, deadline);
  mn_buf_free(&b);
  if (rc != 0) {
    snprintf(err, errlen, "identifying the link to %s: %s", addr, io_error(rc));
    close(fd);
    return rc;
  }
  return fd;
}

/* ---- transfers: independent sends and receives driven by one poll loop ---------------- */

int mn__coll_fail_io(char *err, size_t errlen, const char *what, const char *who, int sending, int code) {
  if (code == MN_ECLOSED) {
    snprintf(err, errlen, "%s closed its link during %s (it failed or died)", who, what);
    return MN_EPEER;
  }
  snprintf(err, errlen, "lost the link %s %s during %s: %s", sending ? "to" : "from", who, what, io_error(code));
  return code;
}

int mn__coll_fail_stall(mn_coll_t *c, char *err, size_t errlen, const char *what, const char *who, int sending) {
  if (mn__coll_cancelled(c)) {
    snprintf(err, errlen, "%s cancelled", what);
    return MN_ECANCELED;
  }
  if (sending)
    snprintf(err, errlen, "%s: %s took no data for %g s (MONARCH_COLL_TIMEOUT)", what, who, c->timeout_ms / 1000.0);
  else
    snprintf(err, errlen, "%s: no data from %s for %g s (MONARCH_COLL_TIMEOUT; is it running the same collective?)",
             what, who, c->timeout_ms / 1000.0);
  return MN_ETIMEDOUT;
}

/* One nonblocking attempt; returns bytes moved (0: would block) or a negative code. */
ssize_t mn__coll_try_io(int fd, int send_, char *p, size_t n) {
  for (;;) {
    ssize_t r = send_ ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) return r;
    if (r == 0) return send_ ? 0 : MN_ECLOSED;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

int mn__coll_poll(mn_coll_t *c, struct pollfd *pf, nfds_t n, int timeout_ms) {
  /* Yield a while before sleeping, as the proc's threads do: a peer's bytes then find us awake. */
  int ready = 0;
  int64_t until = c->spin_us > 0 ? mn_now_us() + c->spin_us : 0;
  for (; ready == 0 && mn_now_us() < until; sched_yield()) ready = poll(pf, n, 0);
  if (ready == 0) ready = poll(pf, n, timeout_ms);
  return ready < 0 ? -errno : ready;
}

/* Runs every transfer to completion; 0, or a negative code with err (coll_int.h). */
int mn__coll_xfer_run(mn_coll_t *c, xfer_t *xs, int nx, const char *what, char *err, size_t errlen) {
  struct pollfd stack[8], *pf = nx <= 8 ? stack : malloc(sizeof(*pf) * (size_t)nx);
  int *map = NULL, rc = MN_ENOMEM;
  int64_t last = mn_now_ms();
  if (pf == NULL || (map = malloc(sizeof(int) * (size_t)nx)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    goto done;
  }
  for (;;) {
    int left = 0, moved = 0;
    for (int i = 0; i < nx; i++) {
      xfer_t *x = &xs[i];
      while (x->done < x->len) {
        ssize_t r = mn__coll_try_io(x->fd, x->send, x->buf + x->done, x->len - x->done);
        if (r < 0) {
          rc = mn__coll_fail_io(err, errlen, what, x->who, x->send, (int)r);
          goto done;
        }
        if (r == 0) break;
        x->done += (size_t)r;
        moved = 1;
      }
      if (x->done < x->len) left++;
    }
    if (left == 0) break;
    int64_t now = mn_now_ms();
    if (moved) last = now;
    int np = 0;
    for (int i = 0; i < nx; i++) {
      if (xs[i].done == xs[i].len) continue;
      pf[np].fd = xs[i].fd;
      pf[np].events = xs[i].send ? POLLOUT : POLLIN;
      pf[np].revents = 0;
      map[np++] = i;
    }
    if (now - last >= c->timeout_ms || mn__coll_cancelled(c)) {
      rc = mn__coll_fail_stall(c, err, errlen, what, xs[map[0]].who, xs[map[0]].send);
      goto done;
    }
    int64_t wait = c->timeout_ms - (now - last);
    int pr = mn__coll_poll(c, pf, (nfds_t)np, (int)(wait < MN_COLL_POLL_SLICE_MS ? wait : MN_COLL_POLL_SLICE_MS));
    if (pr < 0 && pr != -EINTR) {
      snprintf(err, errlen, "poll failed during %s: %s", what, strerror(-pr));
      rc = pr;
      goto done;
    }
  }
  rc = 0;
done:
  if (pf != stack) free(pf);
  free(map);
  return rc;
}
