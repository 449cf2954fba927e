/* collective.c - the proc's CPU data plane; see collective.h and docs/collectives.md. */
#include "collective.h"

#include "coll_shm.h"
#include "exec.h"
#include "handshake.h"
#include "registry.h"
#include "sock.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MN_COLL_BLOCK 16          /* elements per reduction block: a fixed trip count -O2 vectorizes */
#define MN_COLL_POLL_SLICE_MS 100 /* longest single poll, so cancellation is seen promptly */
#define MN_COLL_MAX_LOCAL 64      /* most "local" sends waiting for their recv on one proc */
#define MN_COLL_MAX_HS_FRAME 4096 /* largest handshake frame read before authentication */
#define MN_COLL_CMA_CHUNK (1u << 20) /* same host: bytes per announcement and per copy (measured best) */
#define MN_COLL_CTL_LEN 24        /* bytes of a same-host control message */
#define MN_COLL_CTL_ANNOUNCE 1    /* sender -> receiver: [kind, step, address, bytes ready] */
#define MN_COLL_CTL_ACK 2         /* receiver -> sender: [kind, step, bytes copied, 0] */
#define MN_COLL_COPY_PULL 1       /* a copy's go-ahead, in the header's op: the receiver copies from the sender's memory */
#define MN_COLL_PULL_CHUNK (16u << 20) /* same host: bytes a copy reads per call */
#define MN_COLL_PULL_MIN_RATE 100e6    /* bytes/s a same-host copy is given at least, on top of the timeout */

/* ---- reduction ops ---------------------------------------------------------- */

static const char *const op_names[] = {"sum", "max", "min", "avg"};

int mn_coll_op_parse(const char *s, size_t n) {
  for (int i = 0; i < 4; i++)
    if (strlen(op_names[i]) == n && memcmp(s, op_names[i], n) == 0) return i;
  return -1;
}

const char *mn_coll_op_name(int op) { return op >= 0 && op < 4 ? op_names[op] : "?"; }

const char *mn_coll_kind_name(int kind) {
  switch (kind) {
  case MN_COLL_ALL_REDUCE: return "all_reduce";
  case MN_COLL_BROADCAST: return "broadcast";
  case MN_COLL_ALL_GATHER: return "all_gather";
  case MN_COLL_REDUCE_SCATTER: return "reduce_scatter";
  case MN_COLL_BARRIER: return "barrier";
  case MN_COLL_SEND: return "copy";
  case MN_COLL_ABORT: return "abort";
  default: return "an unknown collective";
  }
}

int mn_coll_dtype_ok(mk_dtype_t dt) { return dt == MK_F32 || dt == MK_F64 || dt == MK_I32 || dt == MK_I64; }

/* `#pragma GCC ivdep`: out may equal a, which is safe element by element. */
#if defined(__GNUC__) && !defined(__clang__)
#define MN_IVDEP _Pragma("GCC ivdep")
#else
#define MN_IVDEP
#endif

/*
 * One reduction loop per dtype and op. The blocks of MN_COLL_BLOCK elements
 * have a fixed trip count, which is what lets gcc -O2 emit vector code.
 * Integer sums go through the unsigned type so that overflow wraps.
 */
#define MN_REDUCE_LOOP(T, EXPR)                                                  \
  do {                                                                           \
    T *o_ = out;                                                                 \
    const T *a_ = a, *b_ = b;                                                    \
    size_t i_ = 0;                                                               \
    for (; i_ + MN_COLL_BLOCK <= count; i_ += MN_COLL_BLOCK) {                   \
      MN_IVDEP for (size_t k_ = i_; k_ < i_ + MN_COLL_BLOCK; k_++) {             \
        T x = a_[k_], y = b_[k_];                                                \
        o_[k_] = (EXPR);                                                         \
      }                                                                          \
    }                                                                            \
    for (; i_ < count; i_++) {                                                   \
      T x = a_[i_], y = b_[i_];                                                  \
      o_[i_] = (EXPR);                                                           \
    }                                                                            \
  } while (0)

#define MN_REDUCE_TYPE(T, SUM)                                                   \
  do {                                                                           \
    if (op == MN_COLL_MAX) MN_REDUCE_LOOP(T, x > y ? x : y);                     \
    else if (op == MN_COLL_MIN) MN_REDUCE_LOOP(T, x < y ? x : y);                \
    else MN_REDUCE_LOOP(T, SUM);                                                 \
  } while (0)

void mn_coll_reduce(void *out, const void *a, const void *b, size_t count, mk_dtype_t dt, int op) {
  switch (dt) {
  case MK_F32: MN_REDUCE_TYPE(float, x + y); break;
  case MK_F64: MN_REDUCE_TYPE(double, x + y); break;
  case MK_I32: MN_REDUCE_TYPE(int32_t, (int32_t)((uint32_t)x + (uint32_t)y)); break;
  case MK_I64: MN_REDUCE_TYPE(int64_t, (int64_t)((uint64_t)x + (uint64_t)y)); break;
  default: break; /* callers check mn_coll_dtype_ok first */
  }
}

void mn_coll_divide(void *p, size_t count, mk_dtype_t dt, int n) {
  size_t i;
  switch (dt) {
  case MK_F32: for (i = 0; i < count; i++) ((float *)p)[i] /= (float)n; break;
  case MK_F64: for (i = 0; i < count; i++) ((double *)p)[i] /= (double)n; break;
  case MK_I32: for (i = 0; i < count; i++) ((int32_t *)p)[i] /= n; break;
  case MK_I64: for (i = 0; i < count; i++) ((int64_t *)p)[i] /= n; break;
  default: break;
  }
}

void mn_coll_segment(size_t count, int n, int i, size_t *first, size_t *len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, u = (size_t)i;
  *first = u * base + (u < extra ? u : extra);
  *len = base + (u < extra ? 1 : 0);
}

/* ---- step headers --------------------------------------------------------------- */

static void put_be64(unsigned char *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}
static uint64_t get_be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return v;
}

void mn_coll_hdr_pack(const mn_coll_hdr_t *h, unsigned char out[MN_COLL_HDR_LEN]) {
  memset(out, 0, MN_COLL_HDR_LEN);
  mn_put_be32((char *)out, MN_COLL_MAGIC);
  out[4] = h->kind;
  out[5] = h->op;
  out[6] = h->dtype;
  mn_put_be32((char *)out + 8, h->rank);
  mn_put_be32((char *)out + 12, h->root);
  put_be64(out + 16, h->seq);
  put_be64(out + 24, h->nbytes);
}

int mn_coll_hdr_unpack(const unsigned char in[MN_COLL_HDR_LEN], mn_coll_hdr_t *h) {
  if (mn_be32((const char *)in) != MN_COLL_MAGIC) return -1;
  h->kind = in[4];
  h->op = in[5];
  h->dtype = in[6];
  h->rank = mn_be32((const char *)in + 8);
  h->root = mn_be32((const char *)in + 12);
  h->seq = get_be64(in + 16);
  h->nbytes = get_be64(in + 24);
  return 0;
}

/* "all_reduce(sum, f32) of 4096 bytes" */
static void describe_hdr(const mn_coll_hdr_t *h, char *buf, size_t n) {
  const char *k = mn_coll_kind_name(h->kind), *dt = mn_dtype_name((mk_dtype_t)h->dtype);
  unsigned long long b = (unsigned long long)h->nbytes;
  switch (h->kind) {
  case MN_COLL_ALL_REDUCE:
  case MN_COLL_REDUCE_SCATTER: snprintf(buf, n, "%s(%s, %s) of %llu bytes", k, mn_coll_op_name(h->op), dt, b); break;
  case MN_COLL_BROADCAST: snprintf(buf, n, "%s(root %u, %s) of %llu bytes", k, h->root, dt, b); break;
  case MN_COLL_BARRIER: snprintf(buf, n, "%s", k); break;
  default: snprintf(buf, n, "%s(%s) of %llu bytes", k, dt, b); break;
  }
}

int mn_coll_hdr_check(const mn_coll_hdr_t *mine, const mn_coll_hdr_t *theirs, char *err, size_t errlen) {
  int reduces = mine->kind == MN_COLL_ALL_REDUCE || mine->kind == MN_COLL_REDUCE_SCATTER;
  if (mine->kind == theirs->kind && mine->dtype == theirs->dtype && mine->nbytes == theirs->nbytes &&
      mine->seq == theirs->seq && (!reduces || mine->op == theirs->op) &&
      (mine->kind != MN_COLL_BROADCAST || mine->root == theirs->root))
    return 0;
  char a[128], b[128];
  describe_hdr(theirs, a, sizeof(a));
  describe_hdr(mine, b, sizeof(b));
  if (mine->seq != theirs->seq)
    snprintf(err, errlen, "rank %u called %s as collective #%llu of the group but rank %u called %s as #%llu",
             theirs->rank, a, (unsigned long long)theirs->seq, mine->rank, b, (unsigned long long)mine->seq);
  else
    snprintf(err, errlen, "rank %u called %s but rank %u called %s (collective #%llu of the group)", theirs->rank,
             a, mine->rank, b, (unsigned long long)mine->seq);
  return -1;
}

/* ---- instances ---------------------------------------------------------------------- */

typedef struct {
  int kind;        /* mn_coll_link_t; 0 marks a free slot */
  uint64_t key;    /* group id or copy tag */
  uint32_t from;   /* member index (ring, star) or sender rank (p2p) */
  uint64_t nbytes; /* p2p: bytes the sender will send */
  int dtype;       /* p2p: the sender's dtype */
  uint64_t pid, addr, cookie_addr, cookie; /* p2p: where to copy from directly, and the proof of a shared host */
  int fd;
  uint64_t order;  /* arrival order: the oldest is evicted when the table is full */
} parked_t;

typedef struct group_s {
  uint64_t id;
  int n, me;
  int next_fd, prev_fd;  /* ring: we send to next, receive from prev */
  int next_cma;          /* next copies from our memory itself (same host) */
  int prev_cma;          /* we copy from prev's memory (same host) */
  pid_t prev_pid;
  int *star;             /* member 0: star[i] links member i; others: star[0] links member 0 */
  char **addrs;          /* member data addresses, for messages */
  int *ranks;            /* member global ranks, for messages (-1: unknown) */
  mn_shm_t *shm;         /* every member on this host: collectives run in shared memory (coll_shm.h) */
  uint64_t seq;          /* collectives started on this group */
  struct group_s *next;
} group_t;

struct mn_coll_s {
  mn_auth_t auth;
  int rank;
  int lfd, port;
  pthread_t acceptor;
  int acceptor_started;
  atomic_int stopping;
  pthread_mutex_t lock;   /* guards parked[] */
  pthread_cond_t cond;    /* signalled when a link is parked */
  parked_t parked[MN_COLL_MAX_PARKED];
  uint64_t arrivals;
  int timeout_ms;
  int cma;                /* 1: try single-copy links to members on this host */
  int shm;                /* 1: groups entirely on this host use shared memory (needs cma) */
  size_t shm_piece;       /* bytes per staging buffer asked for (0: the default) */
  uint64_t cookie;        /* random; a peer that can read it from our memory shares our host */
  atomic_int *cancel;
  group_t *groups;        /* executor thread only, like everything below */
  int ngroups;
  char *tmp;              /* MN_COLL_CHUNK bytes for reducing receives */
  char *star_buf;         /* member 0's star receive buffer */
  size_t star_cap;
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cancelled(const mn_coll_t *c) { return c->cancel != NULL && atomic_load(c->cancel) != 0; }

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  /* Best effort: every send and recv below passes MSG_DONTWAIT anyway. */
  if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return;
}

/* ---- blocking-with-deadline I/O for handshakes and small messages ------------------- */

/* Waits until fd is ready for `events` or the deadline passes: 0, MN_ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return MN_ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
    if (r > 0) return 0;
    if (r < 0 && errno != EINTR) return -errno;
  }
}

/* Reads exactly n bytes: 0, MN_ECLOSED, MN_ETIMEDOUT or -errno. */
static int read_exact(int fd, void *p, size_t n, int64_t deadline) {
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

static int write_exact(int fd, const void *p, size_t n, int64_t deadline) {
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
  int rc = read_exact(fd, pre, sizeof(pre), deadline);
  if (rc != 0) return rc;
  uint32_t n = mn_be32(pre);
  if (n == 0 || n > max) return MN_EFRAME;
  rc = read_exact(fd, buf, n, deadline);
  return rc != 0 ? rc : (int64_t)n;
}

static const char *io_error(int code) {
  if (code == MN_ECLOSED) return "the peer closed the link";
  if (code == MN_ETIMEDOUT) return "timed out";
  if (code == MN_EFRAME) return "oversized frame";
  return code < 0 && code > -4096 ? strerror(-code) : mn_strerror(code);
}

/* ---- the data port: acceptor thread and parked links ---------------------------------- */

/* Server side of the token handshake; 0 once the peer proved it holds the token. */
static int serve_handshake(mn_coll_t *c, int fd, int64_t deadline) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char body[MN_COLL_MAX_HS_FRAME], err[256];
  msgpack_zone zone;
  msgpack_object msg;
  mn_buf_t out;
  int rc = -1;
  mn_buf_init(&out);
  if (!msgpack_zone_init(&zone, 1024)) return -1;
  mn_hs_hello(&out, "data", ns);
  if (write_exact(fd, out.data, out.len, deadline) != 0) goto done;
  out.len = 0;
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) goto done;
  int code = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
  if (code == 0) code = mn_hs_check_auth(&c->auth, &msg, ns, nc, err, sizeof(err));
  if (code != 0) {
    mn_pack_error(&out, code, err);
    if (write_exact(fd, out.data, out.len, deadline) != 0) goto done;
    goto done;
  }
  mn_hs_welcome(&out, &c->auth, ns, nc, "data");
  rc = write_exact(fd, out.data, out.len, deadline) == 0 ? 0 : -1;
done:
  mn_buf_free(&out);
  msgpack_zone_destroy(&zone);
  return rc;
}

/*
 * Reads [kind, key, from, nbytes, rank, dtype] or, for a copy, that and
 * [pid, data address, cookie address, cookie]; 0 or -1 for anything else.
 */
static int read_ident(int fd, parked_t *e, int64_t deadline) {
  char body[MN_COLL_MAX_IDENT], err[128];
  msgpack_zone zone;
  msgpack_object msg;
  uint64_t v[10] = {0};
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0 || !msgpack_zone_init(&zone, 512)) return -1;
  int rc = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
  uint32_t items = rc == 0 ? msg.via.array.size : 0;
  if (items != 6 && items != 10) rc = -1;
  for (uint32_t i = 0; rc == 0 && i < items; i++) rc = mn_get_u64(&msg, i, &v[i]);
  msgpack_zone_destroy(&zone);
  if (rc != 0 || v[0] < MN_COLL_LINK_RING || v[0] > MN_COLL_LINK_P2P || v[2] > UINT32_MAX || v[5] >= MK_DTYPE_COUNT)
    return -1;
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
    int64_t deadline = now_ms() + MN_HANDSHAKE_TIMEOUT_MS;
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
 * or MN_ECLOSED when cancelled.
 */
static int claim(mn_coll_t *c, int kind, uint64_t key, int64_t from, parked_t *out) {
  int64_t deadline = now_ms() + c->timeout_ms;
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
    int64_t now = now_ms();
    if (now >= deadline) break;
    if (cancelled(c)) {
      rc = MN_ECLOSED;
      break;
    }
    int64_t wait = deadline - now < MN_COLL_POLL_SLICE_MS ? deadline - now : MN_COLL_POLL_SLICE_MS;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(wait * 1000000);
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&c->cond, &c->lock, &ts);
  }
done:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

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

static void group_destroy(mn_coll_t *c, group_t *g);

void mn_coll_close(mn_coll_t *c) {
  if (c == NULL) return;
  atomic_store(&c->stopping, 1);
  /* Shutting the listening socket down wakes the acceptor out of accept(). */
  if (c->lfd >= 0 && shutdown(c->lfd, SHUT_RDWR) != 0 && c->acceptor_started) pthread_cancel(c->acceptor);
  if (c->acceptor_started) pthread_join(c->acceptor, NULL);
  close_fd(&c->lfd);
  while (c->groups != NULL) group_destroy(c, c->groups);
  for (int i = 0; i < MN_COLL_MAX_PARKED; i++)
    if (c->parked[i].kind != 0) close(c->parked[i].fd);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c->tmp);
  free(c->star_buf);
  free(c);
}

int mn_coll_port(const mn_coll_t *c) { return c->port; }
void mn_coll_set_timeout(mn_coll_t *c, double seconds) {
  c->timeout_ms = seconds <= 0 ? 1 : seconds > 1e6 ? 1000000000 : (int)(seconds * 1000);
}
void mn_coll_set_cancel(mn_coll_t *c, atomic_int *cancel) { c->cancel = cancel; }
void mn_coll_set_cma(mn_coll_t *c, int on) { c->cma = on != 0; }
void mn_coll_set_shm(mn_coll_t *c, int on) { c->shm = on != 0; }

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

/* Client side of the handshake; 0, or -1 with err. */
static int client_handshake(mn_coll_t *c, int fd, int64_t deadline, char *err, size_t errlen) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char body[MN_COLL_MAX_HS_FRAME];
  msgpack_zone zone;
  msgpack_object msg;
  mn_buf_t out;
  int rc = -1;
  if (!msgpack_zone_init(&zone, 1024)) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  mn_buf_init(&out);
  int64_t n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) {
    snprintf(err, errlen, "no HELLO: %s", io_error((int)n));
    goto done;
  }
  if (mn_decode(body, (size_t)n, &zone, &msg, err, errlen) != 0 ||
      mn_hs_answer(&out, &c->auth, &msg, ns, nc, err, errlen) != 0)
    goto done;
  int w = write_exact(fd, out.data, out.len, deadline);
  if (w != 0) {
    snprintf(err, errlen, "sending AUTH: %s", io_error(w));
    goto done;
  }
  msgpack_zone_clear(&zone);
  n = read_frame_exact(fd, body, sizeof(body), deadline);
  if (n < 0) {
    snprintf(err, errlen, "no WELCOME: %s", io_error((int)n));
    goto done;
  }
  if (mn_decode(body, (size_t)n, &zone, &msg, err, errlen) != 0 ||
      mn_hs_check_welcome(&c->auth, &msg, ns, nc, err, errlen) != 0)
    goto done;
  rc = 0;
done:
  mn_buf_free(&out);
  msgpack_zone_destroy(&zone);
  return rc;
}

/*
 * Opens an authenticated link to the data port at addr and identifies it.
 * Returns the (nonblocking) fd, or -1 with err saying what failed.
 */
static int link_open(mn_coll_t *c, const char *addr, int kind, uint64_t key, uint32_t from, uint64_t nbytes,
                     int dtype, const void *data, char *err, size_t errlen) {
  char host[MN_COLL_MAX_ADDR + 1], why[256];
  int port;
  int64_t deadline = now_ms() + c->timeout_ms;
  if (strlen(addr) > MN_COLL_MAX_ADDR || mn_parse_addr(addr, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "'%s' is not a data address HOST:PORT", addr);
    return -1;
  }
  int fd = connect_deadline(host, port, deadline);
  if (fd < 0) {
    snprintf(err, errlen, "cannot connect to %s: %s", addr, io_error(fd));
    return -1;
  }
  if (client_handshake(c, fd, deadline, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "handshake with %s failed: %s", addr, why);
    close(fd);
    return -1;
  }
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t start = mn_frame_begin(&b);
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
  int rc = write_exact(fd, b.data, b.len, deadline);
  mn_buf_free(&b);
  if (rc != 0) {
    snprintf(err, errlen, "identifying the link to %s: %s", addr, io_error(rc));
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- transfers: independent sends and receives driven by one poll loop ---------------- */

typedef struct {
  int fd;
  int send;         /* 1: send buf; 0: receive into buf */
  char *buf;
  size_t len, done;
  const char *who;  /* the peer, for messages: "rank 3 (host:port)" */
} xfer_t;

static int fail_io(char *err, size_t errlen, const char *what, const char *who, int sending, int code) {
  if (code == MN_ECLOSED)
    snprintf(err, errlen, "%s closed its link during %s (it failed or died)", who, what);
  else
    snprintf(err, errlen, "lost the link %s %s during %s: %s", sending ? "to" : "from", who, what, io_error(code));
  return -1;
}

static int fail_stall(mn_coll_t *c, char *err, size_t errlen, const char *what, const char *who, int sending) {
  if (cancelled(c))
    snprintf(err, errlen, "%s cancelled", what);
  else if (sending)
    snprintf(err, errlen, "%s: %s took no data for %g s (MONARCH_COLL_TIMEOUT)", what, who, c->timeout_ms / 1000.0);
  else
    snprintf(err, errlen, "%s: no data from %s for %g s (MONARCH_COLL_TIMEOUT; is it running the same collective?)",
             what, who, c->timeout_ms / 1000.0);
  return -1;
}

/* One nonblocking attempt; returns bytes moved (0: would block) or a negative code. */
static ssize_t try_io(int fd, int send_, char *p, size_t n) {
  for (;;) {
    ssize_t r = send_ ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) return r;
    if (r == 0) return send_ ? 0 : MN_ECLOSED;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

/* Runs every transfer to completion; 0, or -1 with err. */
static int xfer_run(mn_coll_t *c, xfer_t *xs, int nx, const char *what, char *err, size_t errlen) {
  struct pollfd stack[8], *pf = nx <= 8 ? stack : malloc(sizeof(*pf) * (size_t)nx);
  int *map = NULL, rc = -1;
  int64_t last = now_ms();
  if (pf == NULL || (map = malloc(sizeof(int) * (size_t)nx)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    goto done;
  }
  for (;;) {
    int left = 0, moved = 0;
    for (int i = 0; i < nx; i++) {
      xfer_t *x = &xs[i];
      while (x->done < x->len) {
        ssize_t r = try_io(x->fd, x->send, x->buf + x->done, x->len - x->done);
        if (r < 0) {
          fail_io(err, errlen, what, x->who, x->send, (int)r);
          goto done;
        }
        if (r == 0) break;
        x->done += (size_t)r;
        moved = 1;
      }
      if (x->done < x->len) left++;
    }
    if (left == 0) break;
    int64_t now = now_ms();
    if (moved) last = now;
    int np = 0;
    for (int i = 0; i < nx; i++) {
      if (xs[i].done == xs[i].len) continue;
      pf[np].fd = xs[i].fd;
      pf[np].events = xs[i].send ? POLLOUT : POLLIN;
      pf[np].revents = 0;
      map[np++] = i;
    }
    if (now - last >= c->timeout_ms || cancelled(c)) {
      fail_stall(c, err, errlen, what, xs[map[0]].who, xs[map[0]].send);
      goto done;
    }
    int64_t wait = c->timeout_ms - (now - last);
    if (poll(pf, (nfds_t)np, (int)(wait < MN_COLL_POLL_SLICE_MS ? wait : MN_COLL_POLL_SLICE_MS)) < 0 &&
        errno != EINTR) {
      snprintf(err, errlen, "poll failed during %s: %s", what, strerror(errno));
      goto done;
    }
  }
  rc = 0;
done:
  if (pf != stack) free(pf);
  free(map);
  return rc;
}

/* ---- the ring: two dependent streams driven by one poll loop ----------------------------- */

/*
 * A piece is what one step sends or receives. A received piece either lands
 * in place (a == NULL: the bytes go straight into buf) or is reduced:
 * buf = a op received, through the chunk buffer.
 */
typedef struct {
  char *buf;
  const char *a;
  size_t len;
  int divide; /* the last reduction of an average: divide after reducing */
} piece_t;

typedef struct ring_s ring_t;
struct ring_s {
  int send_fd, recv_fd;
  int send_cma;       /* same host: announce ready bytes; the next member copies them itself */
  int recv_cma;       /* same host: copy from the previous member's memory (process_vm_readv) */
  pid_t prev_pid;
  int nsend, nrecv;   /* steps in each stream */
  int lag;            /* send step j >= lag waits on receive step j - lag; < 0: never waits */
  int reuse_from;     /* receive step j >= reuse_from overwrites what send step j - reuse_dist sent: */
  int reuse_dist;     /* it waits until the next member has copied that (0: never) */
  void (*piece)(const ring_t *r, int step, int sending, piece_t *p);
  mk_dtype_t dtype;
  int op, n, me;
  size_t esize;
  const char *next_who, *prev_who, *what;
  /* algorithm data */
  char *data;         /* the tensor (all_reduce, broadcast), dst (all_gather) */
  const char *src;    /* reduce_scatter input */
  char *buf[2];       /* reduce_scatter double buffer */
  size_t count;       /* elements: whole tensor (all_reduce), one block (gather, scatter) */
};

/* Control bytes of a link, both ways: announcements go forward, acks come back. */
typedef struct {
  unsigned char out[MN_COLL_CTL_LEN * 32];
  size_t olen;
  unsigned char in[MN_COLL_CTL_LEN];
  size_t ilen;
} ctl_t;

typedef struct {
  ring_t *r;
  int js;             /* send cursor: step, and bytes pushed (tcp) or announced (same host) */
  size_t sdone;
  int jc;             /* consumed cursor: what the next member has copied (same host) */
  size_t cdone;
  int jr;             /* receive cursor: step, bytes landed or reduced, bytes waiting in tmp */
  size_t rdone, fill;
  piece_t ps, pr;
  uint64_t *ann_addr, *ann_ready; /* same host: where each receive step's bytes are, and how many are ready */
  int ann_step;       /* same host: the first receive step not yet fully announced */
  ctl_t cs, cr;       /* control traffic on send_fd and on recv_fd */
  char *tmp;
} ring_state_t;

/* Bytes of send step js the receive side has made ready. */
static size_t send_ready(const ring_state_t *s) {
  const ring_t *r = s->r;
  size_t len = s->ps.len;
  if (r->lag < 0 || s->js < r->lag) return len;
  int dep = s->js - r->lag;
  return s->jr > dep ? len : s->jr == dep ? (s->rdone < len ? s->rdone : len) : 0;
}

/* What the next member has finished with: pushed bytes over TCP, acknowledged copies on one host. */
static void consumed(const ring_state_t *s, int *j, size_t *done) {
  *j = s->r->send_cma ? s->jc : s->js;
  *done = s->r->send_cma ? s->cdone : s->sdone;
}

/* Bytes of receive step jr that may be written: all, unless they overwrite what the next member still reads. */
static size_t recv_room(const ring_state_t *s) {
  const ring_t *r = s->r;
  size_t len = s->pr.len, done;
  int j;
  if (r->reuse_dist <= 0 || s->jr < r->reuse_from) return len;
  int dep = s->jr - r->reuse_dist;
  consumed(s, &j, &done);
  return j > dep ? len : j == dep ? (done < len ? done : len) : 0;
}

static void put_ctl(unsigned char *m, int kind, int step, uint64_t a, uint64_t b) {
  mn_put_be32((char *)m, (uint32_t)kind);
  mn_put_be32((char *)m + 4, (uint32_t)step);
  put_be64(m + 8, a);
  put_be64(m + 16, b);
}

/* Sends what is queued without blocking; 0 or a negative code. */
static int ctl_flush(int fd, ctl_t *c) {
  if (c->olen == 0) return 0;
  ssize_t w = try_io(fd, 1, (char *)c->out, c->olen);
  if (w < 0) return (int)w;
  memmove(c->out, c->out + w, c->olen - (size_t)w);
  c->olen -= (size_t)w;
  return 0;
}

/* Queues a control message; when the queue is full, waits for room. */
static int ctl_queue(mn_coll_t *co, int fd, ctl_t *c, int kind, int step, uint64_t a, uint64_t b) {
  if (c->olen + MN_COLL_CTL_LEN > sizeof(c->out)) {
    int rc = write_exact(fd, c->out, c->olen, now_ms() + co->timeout_ms);
    if (rc != 0) return rc;
    c->olen = 0;
  }
  put_ctl(c->out + c->olen, kind, step, a, b);
  c->olen += MN_COLL_CTL_LEN;
  return ctl_flush(fd, c); /* at once: the peer may be waiting for exactly this */
}

static void normalize_consumed(ring_state_t *s) {
  piece_t p;
  while (s->jc < s->r->nsend) {
    s->r->piece(s->r, s->jc, 1, &p);
    if (s->cdone < p.len) break;
    s->jc++;
    s->cdone = 0;
  }
}

/* Moves past the receive steps whose bytes are all announced (zero-length steps need no announcement). */
static void advance_announced(ring_state_t *s) {
  piece_t p;
  while (s->ann_step < s->r->nrecv) {
    s->r->piece(s->r, s->ann_step, 0, &p);
    if (s->ann_ready[s->ann_step] < p.len) break;
    s->ann_step++;
  }
}

/*
 * Reads the control messages waiting on fd: acks (on send_fd) or
 * announcements (on recv_fd), one message at a time and never past the last
 * one this collective can bring: the bytes after it belong to the next
 * collective. Returns 1 if any came, 0 if none, or -1 with err.
 */
static int ctl_read(ring_state_t *s, int fd, ctl_t *c, int acks, char *err, size_t errlen) {
  const ring_t *r = s->r;
  const char *who = acks ? r->next_who : r->prev_who;
  int any = 0;
  while (acks ? s->jc < r->nsend : s->ann_step < r->nrecv) {
    ssize_t got = try_io(fd, 0, (char *)c->in + c->ilen, MN_COLL_CTL_LEN - c->ilen);
    if (got < 0) return fail_io(err, errlen, r->what, who, 0, (int)got);
    if (got == 0) break;
    any = 1;
    c->ilen += (size_t)got;
    if (c->ilen < MN_COLL_CTL_LEN) continue;
    c->ilen = 0;
    const unsigned char *m = c->in;
    uint32_t kind = mn_be32((const char *)m), step = mn_be32((const char *)m + 4);
    uint64_t a = get_be64(m + 8), b = get_be64(m + 16);
    piece_t p;
    if (acks && kind == MN_COLL_CTL_ACK && step < (uint32_t)r->nsend) {
      r->piece(r, (int)step, 1, &p);
      if (a <= p.len && ((int)step > s->jc || ((int)step == s->jc && a >= s->cdone))) {
        s->jc = (int)step;
        s->cdone = (size_t)a;
        normalize_consumed(s);
        continue;
      }
    } else if (!acks && kind == MN_COLL_CTL_ANNOUNCE && step >= (uint32_t)s->ann_step && step < (uint32_t)r->nrecv) {
      r->piece(r, (int)step, 0, &p);
      if (b <= p.len && b >= s->ann_ready[step]) {
        s->ann_addr[step] = a;
        s->ann_ready[step] = b;
        advance_announced(s);
        continue;
      }
    }
    snprintf(err, errlen, "%s: %s sent a control message out of step (kind %u, step %u)", r->what, who, kind, step);
    return -1;
  }
  return any;
}

/* Copies n bytes of the previous member's memory at addr into dst (same host). */
static int cma_read(const ring_t *r, char *dst, uint64_t addr, size_t n, char *err, size_t errlen) {
  while (n > 0) {
    struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)addr, n};
    ssize_t got = process_vm_readv(r->prev_pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      snprintf(err, errlen, "%s: copying from %s failed: %s (it failed or died)", r->what, r->prev_who,
               got < 0 ? strerror(errno) : "nothing read");
      return -1;
    }
    dst += got;
    addr += (uint64_t)got;
    n -= (size_t)got;
  }
  return 0;
}

/* Reduces n received bytes (whole elements, in s->tmp) into the current receive piece. */
static void reduce_in(ring_state_t *s, size_t n) {
  const ring_t *r = s->r;
  size_t count = n / r->esize;
  mn_coll_reduce(s->pr.buf + s->rdone, s->pr.a + s->rdone, s->tmp, count, r->dtype, r->op);
  if (s->pr.divide) mn_coll_divide(s->pr.buf + s->rdone, count, r->dtype, r->n);
}

/* Sends (tcp) or announces (same host) what is ready. Sets *moved; *want_out when the socket is full. */
static int ring_send(mn_coll_t *c, ring_state_t *s, int *moved, int *want_out, char *err, size_t errlen) {
  ring_t *r = s->r;
  while (s->js < r->nsend) {
    if (s->sdone == s->ps.len) {
      if (++s->js < r->nsend) r->piece(r, s->js, 1, &s->ps);
      s->sdone = 0;
      *moved = 1;
      continue;
    }
    size_t ready = send_ready(s);
    if (ready <= s->sdone) break;
    if (r->send_cma) {
      /* Announce in chunks: each announcement lets the next member copy while we go on. */
      if (ready < s->ps.len && ready - s->sdone < MN_COLL_CMA_CHUNK) break;
      int rc = ctl_queue(c, r->send_fd, &s->cs, MN_COLL_CTL_ANNOUNCE, s->js, (uint64_t)(uintptr_t)s->ps.buf, ready);
      if (rc != 0) return fail_io(err, errlen, r->what, r->next_who, 1, rc);
      s->sdone = ready;
    } else {
      ssize_t w = try_io(r->send_fd, 1, s->ps.buf + s->sdone, ready - s->sdone);
      if (w < 0) return fail_io(err, errlen, r->what, r->next_who, 1, (int)w);
      if (w == 0) {
        *want_out = 1;
        break;
      }
      s->sdone += (size_t)w;
    }
    *moved = 1;
  }
  return 0;
}

/* Receives (tcp) or copies (same host) what there is room for. Sets *moved; *want_in when waiting for data. */
static int ring_recv(mn_coll_t *c, ring_state_t *s, int *moved, int *want_in, char *err, size_t errlen) {
  ring_t *r = s->r;
  while (s->jr < r->nrecv) {
    if (s->rdone == s->pr.len) {
      if (++s->jr < r->nrecv) r->piece(r, s->jr, 0, &s->pr);
      s->rdone = 0;
      *moved = 1;
      continue;
    }
    size_t room = recv_room(s);
    if (room <= s->rdone + s->fill) break;
    if (r->recv_cma) {
      size_t avail = s->ann_ready[s->jr] < room ? (size_t)s->ann_ready[s->jr] : room, n;
      if (avail <= s->rdone) {
        *want_in = 1; /* wait for an announcement */
        break;
      }
      n = avail - s->rdone;
      if (n > MN_COLL_CMA_CHUNK) n = MN_COLL_CMA_CHUNK;
      if (s->pr.a != NULL && n > MN_COLL_CHUNK) n = MN_COLL_CHUNK; /* what s->tmp holds */
      if (s->pr.a != NULL) n = n / r->esize * r->esize;
      if (n == 0) {
        *want_in = 1;
        break;
      }
      uint64_t from = s->ann_addr[s->jr] + s->rdone;
      if (cma_read(r, s->pr.a != NULL ? s->tmp : s->pr.buf + s->rdone, from, n, err, errlen) != 0) return -1;
      if (s->pr.a != NULL) reduce_in(s, n);
      s->rdone += n;
      int rc = ctl_queue(c, r->recv_fd, &s->cr, MN_COLL_CTL_ACK, s->jr, s->rdone, 0);
      if (rc != 0) return fail_io(err, errlen, r->what, r->prev_who, 1, rc);
    } else if (s->pr.a == NULL) {
      ssize_t got = try_io(r->recv_fd, 0, s->pr.buf + s->rdone, room - s->rdone);
      if (got < 0) return fail_io(err, errlen, r->what, r->prev_who, 0, (int)got);
      if (got == 0) {
        *want_in = 1;
        break;
      }
      s->rdone += (size_t)got;
    } else {
      /* Reduce whole elements as soon as they are in, so the next step's send can follow. */
      size_t want = room - s->rdone - s->fill;
      if (want > MN_COLL_CHUNK - s->fill) want = MN_COLL_CHUNK - s->fill;
      ssize_t got = try_io(r->recv_fd, 0, s->tmp + s->fill, want);
      if (got < 0) return fail_io(err, errlen, r->what, r->prev_who, 0, (int)got);
      if (got == 0) {
        *want_in = 1;
        break;
      }
      s->fill += (size_t)got;
      size_t whole = s->fill / r->esize * r->esize;
      reduce_in(s, whole);
      s->rdone += whole;
      s->fill -= whole;
      if (s->fill > 0) memmove(s->tmp, s->tmp + whole, s->fill);
    }
    /* One chunk at a time: what just became ready goes out before the next is taken in. */
    *moved = 1;
    break;
  }
  return 0;
}

/*
 * Runs both streams of a ring step sequence. Over TCP every send goes
 * straight from tensor memory and every landing receive straight into it;
 * reducing receives pass through c->tmp and are reduced as soon as whole
 * elements are in, so the next step's send can follow right behind. On one
 * host the sender only announces ready bytes and the receiver copies them
 * out of the sender's memory itself (one copy instead of two), acknowledging
 * what it copied so the sender knows when it may overwrite them.
 * Returns 0, or -1 with err.
 */
static int ring_run(mn_coll_t *c, ring_t *r, char *err, size_t errlen) {
  ring_state_t s;
  int rc = -1;
  int64_t last = now_ms();
  memset(&s, 0, sizeof(s));
  s.r = r;
  if (r->nrecv > 0 && c->tmp == NULL && (c->tmp = malloc(MN_COLL_CHUNK)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", r->what);
    return -1;
  }
  s.tmp = c->tmp;
  if (r->recv_cma && r->nrecv > 0) {
    s.ann_addr = calloc((size_t)r->nrecv, sizeof(uint64_t));
    s.ann_ready = calloc((size_t)r->nrecv, sizeof(uint64_t));
    if (s.ann_addr == NULL || s.ann_ready == NULL) {
      snprintf(err, errlen, "out of memory during %s", r->what);
      goto done;
    }
  }
  if (r->nsend > 0) r->piece(r, 0, 1, &s.ps);
  if (r->nrecv > 0) r->piece(r, 0, 0, &s.pr);
  normalize_consumed(&s);
  if (r->recv_cma) advance_announced(&s);
  for (;;) {
    int moved = 0, want_out = 0, want_in = 0, got;
    if (r->send_cma && s.jc < r->nsend) {
      if ((got = ctl_read(&s, r->send_fd, &s.cs, 1, err, errlen)) < 0) goto done;
      moved |= got;
    }
    if (r->recv_cma && s.jr < r->nrecv) {
      if ((got = ctl_read(&s, r->recv_fd, &s.cr, 0, err, errlen)) < 0) goto done;
      moved |= got;
    }
    if (ring_send(c, &s, &moved, &want_out, err, errlen) != 0 || ring_recv(c, &s, &moved, &want_in, err, errlen) != 0)
      goto done;
    size_t before = s.cs.olen + s.cr.olen;
    int f1 = ctl_flush(r->send_fd, &s.cs), f2 = ctl_flush(r->recv_fd, &s.cr);
    if (f1 != 0 || f2 != 0) {
      fail_io(err, errlen, r->what, f1 != 0 ? r->next_who : r->prev_who, 1, f1 != 0 ? f1 : f2);
      goto done;
    }
    if (s.cs.olen + s.cr.olen < before) moved = 1;
    int send_done = s.js >= r->nsend && (!r->send_cma || s.jc >= r->nsend);
    if (send_done && s.jr >= r->nrecv && s.cs.olen == 0 && s.cr.olen == 0) break;
    int64_t now = now_ms();
    if (moved) {
      last = now;
      continue;
    }
    int waiting_prev = s.jr < r->nrecv;
    if (now - last >= c->timeout_ms || cancelled(c)) {
      fail_stall(c, err, errlen, r->what, waiting_prev ? r->prev_who : r->next_who, !waiting_prev);
      goto done;
    }
    struct pollfd pf[2] = {{.fd = r->send_fd}, {.fd = r->recv_fd}};
    if (want_out || s.cs.olen > 0) pf[0].events |= POLLOUT;
    if (r->send_cma && s.jc < r->nsend) pf[0].events |= POLLIN;
    if (want_in || (r->recv_cma && s.ann_step < r->nrecv)) pf[1].events |= POLLIN;
    if (s.cr.olen > 0) pf[1].events |= POLLOUT;
    if (pf[0].events == 0 && pf[1].events == 0) {
      snprintf(err, errlen, "%s: internal error: the ring stalled with nothing to wait for", r->what);
      goto done;
    }
    int64_t wait = c->timeout_ms - (now - last);
    if (poll(pf, 2, (int)(wait < MN_COLL_POLL_SLICE_MS ? wait : MN_COLL_POLL_SLICE_MS)) < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll failed during %s: %s", r->what, strerror(errno));
      goto done;
    }
  }
  rc = 0;
done:
  free(s.ann_addr);
  free(s.ann_ready);
  return rc;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/*
 * all_reduce: n-1 reduce-scatter steps (send segment me-j, reduce segment
 * me-j-1 into place), then n-1 all-gather steps (send segment me+1-k, land
 * segment me-k). What step j+1 sends is exactly what step j received.
 */
static void piece_all_reduce(const ring_t *r, int j, int sending, piece_t *p) {
  int n = r->n, seg;
  size_t first, len;
  if (j < n - 1) seg = sending ? mod(r->me - j, n) : mod(r->me - j - 1, n);
  else seg = sending ? mod(r->me + 1 - (j - n + 1), n) : mod(r->me - (j - n + 1), n);
  mn_coll_segment(r->count, n, seg, &first, &len);
  p->buf = r->data + first * r->esize;
  p->len = len * r->esize;
  p->a = !sending && j < n - 1 ? p->buf : NULL;
  p->divide = !sending && j == n - 2 && r->op == MN_COLL_AVG;
}

/* broadcast: one step; the root only sends, the member before it only receives. */
static void piece_broadcast(const ring_t *r, int j, int sending, piece_t *p) {
  p->buf = r->data;
  p->len = r->count * r->esize;
  p->a = NULL;
  p->divide = 0;
}

/* all_gather: n-1 steps; send block me-k, land block me-k-1 in dst. */
static void piece_all_gather(const ring_t *r, int k, int sending, piece_t *p) {
  int blk = sending ? mod(r->me - k, r->n) : mod(r->me - k - 1, r->n);
  p->len = r->count * r->esize;
  p->buf = r->data + (size_t)blk * p->len;
  p->a = NULL;
  p->divide = 0;
}

/*
 * reduce_scatter: n-1 steps. Receive step j reduces src block me-j-2 with
 * the incoming partial into buf[j % 2]; send step j>0 sends buf[(j-1) % 2],
 * step 0 sends src block me-1. The last step's buffer is dst.
 */
static void piece_reduce_scatter(const ring_t *r, int j, int sending, piece_t *p) {
  size_t bl = r->count * r->esize;
  p->len = bl;
  p->a = NULL;
  p->divide = 0;
  if (sending) {
    p->buf = j == 0 ? (char *)r->src + (size_t)mod(r->me - 1, r->n) * bl : r->buf[(j - 1) % 2];
  } else {
    p->buf = r->buf[j % 2];
    p->a = r->src + (size_t)mod(r->me - j - 2, r->n) * bl;
    p->divide = j == r->n - 2 && r->op == MN_COLL_AVG;
  }
}

/* ---- groups ------------------------------------------------------------------------------ */

static group_t *group_find(mn_coll_t *c, uint64_t gid) {
  for (group_t *g = c->groups; g != NULL; g = g->next)
    if (g->id == gid) return g;
  return NULL;
}

static void group_destroy(mn_coll_t *c, group_t *g) {
  for (group_t **pp = &c->groups; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == g) {
      *pp = g->next;
      c->ngroups--;
      break;
    }
  }
  close_fd(&g->next_fd);
  close_fd(&g->prev_fd);
  int nstar = g->me == 0 ? g->n : 1;
  for (int i = 0; g->star != NULL && i < nstar; i++) close_fd(&g->star[i]);
  for (int i = 0; g->addrs != NULL && i < g->n; i++) free(g->addrs[i]);
  mn_shm_close(g->shm);
  free(g->addrs);
  free(g->ranks);
  free(g->star);
  free(g);
}

int mn_coll_group_shm(mn_coll_t *c, uint64_t gid) {
  group_t *g = group_find(c, gid);
  return g == NULL ? -1 : g->shm != NULL;
}

int mn_coll_group_free(mn_coll_t *c, uint64_t gid) {
  group_t *g = group_find(c, gid);
  if (g != NULL) group_destroy(c, g);
  return 0;
}

/* "rank 3 (host:port)" for member i. */
static void member_name(const group_t *g, int i, char *buf, size_t n) {
  if (g->ranks[i] >= 0) snprintf(buf, n, "rank %d (%s)", g->ranks[i], g->addrs[i]);
  else snprintf(buf, n, "member %d (%s)", i, g->addrs[i]);
}

static int claim_member(mn_coll_t *c, group_t *g, int kind, int from, int *fd, char *err, size_t errlen) {
  parked_t e;
  int rc = claim(c, kind, g->id, from, &e);
  if (rc == 0) {
    *fd = e.fd;
    return 0;
  }
  char who[MN_COLL_MAX_ADDR + 32];
  member_name(g, from, who, sizeof(who));
  if (rc == MN_ECLOSED)
    snprintf(err, errlen, "setting up group %llu: cancelled while waiting for %s", (unsigned long long)g->id, who);
  else
    snprintf(err, errlen, "setting up group %llu: %s did not connect within %g s (it must join the group too)",
             (unsigned long long)g->id, who, c->timeout_ms / 1000.0);
  return -1;
}

/* 1 when process pid holds cookie at addr: it shares our host and lets us copy from its memory. */
static int same_host(const mn_coll_t *c, uint64_t pid, uint64_t addr, uint64_t cookie) {
  uint64_t seen = 0;
  if (!c->cma || cookie == 0 || pid == 0 || pid > INT32_MAX) return 0;
  struct iovec local = {&seen, sizeof(seen)}, remote = {(void *)(uintptr_t)addr, sizeof(seen)};
  return process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof(seen) && seen == cookie;
}

/*
 * Finds out whether each ring link can copy memory directly: every member
 * sends the next one its pid and the address of its random cookie; the next
 * member tries to read the cookie with process_vm_readv (which works only on
 * the same host, with permission to trace the peer) and answers yes or no,
 * so both ends of every link agree on how it moves data.
 */
static int probe_same_host(mn_coll_t *c, group_t *g, char *err, size_t errlen) {
  unsigned char out[24], in[24], yes = 0, answer = 0;
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  member_name(g, mod(g->me - 1, g->n), pw, sizeof(pw));
  put_be64(out, (uint64_t)getpid());
  put_be64(out + 8, (uint64_t)(uintptr_t)&c->cookie);
  put_be64(out + 16, c->cma ? c->cookie : 0);
  xfer_t xs[2] = {{g->next_fd, 1, (char *)out, sizeof(out), 0, nw}, {g->prev_fd, 0, (char *)in, sizeof(in), 0, pw}};
  if (xfer_run(c, xs, 2, "group setup", err, errlen) != 0) return -1;
  uint64_t pid = get_be64(in);
  yes = (unsigned char)same_host(c, pid, get_be64(in + 8), get_be64(in + 16));
  xfer_t ys[2] = {{g->prev_fd, 1, (char *)&yes, 1, 0, pw}, {g->next_fd, 0, (char *)&answer, 1, 0, nw}};
  if (xfer_run(c, ys, 2, "group setup", err, errlen) != 0) return -1;
  g->prev_cma = yes;
  g->prev_pid = (pid_t)pid;
  g->next_cma = answer == 1;
  return 0;
}

/*
 * When every member is on this host (each ring link copies directly), the
 * group runs its collectives in shared memory. Member 0 gathers the votes
 * over the star, creates the region and offers it; the others map it and
 * report back; the group uses it only if all of them could. -1 only when
 * a link fails; otherwise the group simply keeps the ring.
 */
static int setup_shm(mn_coll_t *c, group_t *g, char *err, size_t errlen) {
  int n = g->n;
  unsigned char vote = (unsigned char)(c->shm && c->cma && g->prev_cma && g->next_cma && n <= MN_SHM_MAX_MEMBERS);
  unsigned char offer[32] = {0}, ok = 0;
  char who[MN_COLL_MAX_ADDR + 32], why[512];
  if (g->me != 0) {
    member_name(g, 0, who, sizeof(who));
    xfer_t v = {g->star[0], 1, (char *)&vote, 1, 0, who}, o = {g->star[0], 0, (char *)offer, sizeof(offer), 0, who};
    if (xfer_run(c, &v, 1, "group setup", err, errlen) != 0 || xfer_run(c, &o, 1, "group setup", err, errlen) != 0)
      return -1;
    if (offer[0] == 1 && mn_shm_attach(&g->shm, n, g->me, (long)get_be64(offer + 8), (int)get_be64(offer + 16),
                                       (size_t)get_be64(offer + 24), why, sizeof(why)) == 0)
      ok = 1;
    xfer_t r = {g->star[0], 1, (char *)&ok, 1, 0, who}, f = {g->star[0], 0, (char *)offer, 1, 0, who};
    if (xfer_run(c, &r, 1, "group setup", err, errlen) != 0 || xfer_run(c, &f, 1, "group setup", err, errlen) != 0)
      return -1;
    if (offer[0] != 1) {
      mn_shm_close(g->shm);
      g->shm = NULL;
    }
    return 0;
  }
  unsigned char *votes = calloc((size_t)n, 1);
  xfer_t *xs = calloc((size_t)n, sizeof(xfer_t));
  char (*names)[MN_COLL_MAX_ADDR + 32] = calloc((size_t)n, sizeof(*names));
  int rc = -1;
  if (votes == NULL || xs == NULL || names == NULL) {
    snprintf(err, errlen, "out of memory setting up group %llu", (unsigned long long)g->id);
    goto done;
  }
  for (int i = 1; i < n; i++) {
    member_name(g, i, names[i], sizeof(names[0]));
    xs[i - 1] = (xfer_t){g->star[i], 0, (char *)&votes[i], 1, 0, names[i]};
  }
  if (xfer_run(c, xs, n - 1, "group setup", err, errlen) != 0) goto done;
  int all = vote;
  for (int i = 1; i < n; i++) all = all && votes[i] == 1;
  if (all && mn_shm_create(&g->shm, n, mn_shm_piece_for(n, c->shm_piece), why, sizeof(why)) != 0) all = 0;
  offer[0] = (unsigned char)all;
  if (all) {
    put_be64(offer + 8, (uint64_t)getpid());
    put_be64(offer + 16, (uint64_t)mn_shm_fd(g->shm));
    put_be64(offer + 24, (uint64_t)mn_shm_piece_for(n, c->shm_piece));
  }
  for (int i = 1; i < n; i++) xs[i - 1] = (xfer_t){g->star[i], 1, (char *)offer, sizeof(offer), 0, names[i]};
  if (xfer_run(c, xs, n - 1, "group setup", err, errlen) != 0) goto done;
  for (int i = 1; i < n; i++) xs[i - 1] = (xfer_t){g->star[i], 0, (char *)&votes[i], 1, 0, names[i]};
  if (xfer_run(c, xs, n - 1, "group setup", err, errlen) != 0) goto done;
  for (int i = 1; i < n; i++) all = all && votes[i] == 1;
  ok = (unsigned char)all;
  for (int i = 1; i < n; i++) xs[i - 1] = (xfer_t){g->star[i], 1, (char *)&ok, 1, 0, names[i]};
  if (xfer_run(c, xs, n - 1, "group setup", err, errlen) != 0) goto done;
  if (g->shm != NULL) mn_shm_drop_fd(g->shm); /* every member has it mapped, or none uses it */
  if (!all) {
    mn_shm_close(g->shm);
    g->shm = NULL;
  }
  rc = 0;
done:
  free(votes);
  free(xs);
  free(names);
  return rc;
}

int mn_coll_group(mn_coll_t *c, uint64_t gid, int me, int n, const char *const *addrs, const int *ranks,
                  char *err, size_t errlen) {
  if (n < 1 || n > MN_COLL_MAX_MEMBERS || me < 0 || me >= n) {
    snprintf(err, errlen, "group %llu: member %d of %d is out of range (1..%d members)", (unsigned long long)gid, me,
             n, MN_COLL_MAX_MEMBERS);
    return -1;
  }
  mn_coll_group_free(c, gid);
  if (c->ngroups >= MN_COLL_MAX_GROUPS) {
    snprintf(err, errlen, "this proc already holds %d groups (MN_COLL_MAX_GROUPS); free some with __coll_free",
             MN_COLL_MAX_GROUPS);
    return -1;
  }
  group_t *g = calloc(1, sizeof(*g));
  int nstar = me == 0 ? n : 1;
  if (g == NULL || (g->addrs = calloc((size_t)n, sizeof(char *))) == NULL ||
      (g->ranks = malloc(sizeof(int) * (size_t)n)) == NULL || (g->star = malloc(sizeof(int) * (size_t)nstar)) == NULL) {
    if (g != NULL) {
      free(g->addrs);
      free(g->ranks);
      free(g);
    }
    snprintf(err, errlen, "out of memory setting up group %llu", (unsigned long long)gid);
    return -1;
  }
  g->id = gid;
  g->n = n;
  g->me = me;
  g->next_fd = g->prev_fd = -1;
  for (int i = 0; i < nstar; i++) g->star[i] = -1;
  g->next = c->groups;
  c->groups = g;
  c->ngroups++;
  for (int i = 0; i < n; i++) {
    g->ranks[i] = ranks != NULL ? ranks[i] : -1;
    if (addrs[i] == NULL || strlen(addrs[i]) > MN_COLL_MAX_ADDR || (g->addrs[i] = strdup(addrs[i])) == NULL) {
      snprintf(err, errlen, "group %llu: address of member %d is missing or too long", (unsigned long long)gid, i);
      goto fail;
    }
  }
  if (n == 1) return 0;
  /* Connect first, then wait: every member can join at once without deadlock. */
  char why[512];
  int next = (me + 1) % n;
  g->next_fd = link_open(c, addrs[next], MN_COLL_LINK_RING, gid, (uint32_t)me, 0, 0, NULL, why, sizeof(why));
  if (g->next_fd < 0) {
    snprintf(err, errlen, "setting up group %llu: ring link to the next member: %s", (unsigned long long)gid, why);
    goto fail;
  }
  if (me != 0) {
    g->star[0] = link_open(c, addrs[0], MN_COLL_LINK_STAR, gid, (uint32_t)me, 0, 0, NULL, why, sizeof(why));
    if (g->star[0] < 0) {
      snprintf(err, errlen, "setting up group %llu: star link to member 0: %s", (unsigned long long)gid, why);
      goto fail;
    }
  }
  if (claim_member(c, g, MN_COLL_LINK_RING, mod(me - 1, n), &g->prev_fd, err, errlen) != 0) goto fail;
  for (int i = 1; me == 0 && i < n; i++)
    if (claim_member(c, g, MN_COLL_LINK_STAR, i, &g->star[i], err, errlen) != 0) goto fail;
  if (probe_same_host(c, g, err, errlen) != 0) goto fail;
  if (setup_shm(c, g, err, errlen) != 0) goto fail;
  return 0;
fail:
  group_destroy(c, g);
  return -1;
}

/* Looks the group up; -1 with a message when this proc has none by that id. */
static group_t *group_get(mn_coll_t *c, uint64_t gid, const char *what, char *err, size_t errlen) {
  group_t *g = group_find(c, gid);
  if (g == NULL)
    snprintf(err, errlen,
             "%s: rank %d has no group %llu (set it up with __coll_group first; a failed collective tears its group "
             "down)",
             what, c->rank, (unsigned long long)gid);
  return g;
}

/*
 * Gives up on a group before any byte of this collective was sent: tells
 * the next member why (an ABORT header where it expects this step's header),
 * then closes every link so the other members fail at once instead of at the
 * timeout. The err text is kept.
 */
static int group_abort(mn_coll_t *c, group_t *g, const char *err) {
  if (g->shm != NULL) mn_shm_abort(g->shm, (uint32_t)c->rank, err);
  if (g->next_fd >= 0) {
    unsigned char h[MN_COLL_HDR_LEN];
    size_t ml = strlen(err) > MN_COLL_MAX_ABORT_MSG ? MN_COLL_MAX_ABORT_MSG : strlen(err);
    mn_coll_hdr_t a = {.kind = MN_COLL_ABORT, .rank = (uint32_t)c->rank, .seq = g->seq, .nbytes = ml};
    mn_coll_hdr_pack(&a, h);
    int64_t deadline = now_ms() + 100; /* best effort: a peer that is not reading learns from the close */
    if (write_exact(g->next_fd, h, sizeof(h), deadline) == 0 && write_exact(g->next_fd, err, ml, deadline) != 0) {
      /* The close below tells it anyway. */
    }
  }
  group_destroy(c, g);
  return -1;
}

int mn_coll_group_abort(mn_coll_t *c, uint64_t gid, const char *why) {
  group_t *g = group_find(c, gid);
  if (g != NULL) group_abort(c, g, why);
  return 0;
}

/* A failure in the middle of a collective: the byte streams are out of step, so the group is gone. */
static int group_fail(mn_coll_t *c, group_t *g) {
  group_destroy(c, g);
  return -1;
}

/*
 * Every collective starts with one header from each member to the next.
 * A member whose predecessor called something else reports the mismatch;
 * one that gave up earlier sent ABORT and its reason instead.
 */
static int exchange_headers(mn_coll_t *c, group_t *g, const mn_coll_hdr_t *mine, const char *what, char *err,
                            size_t errlen, int *mismatch) {
  unsigned char out[MN_COLL_HDR_LEN], in[MN_COLL_HDR_LEN];
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  mn_coll_hdr_t theirs;
  member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  member_name(g, mod(g->me - 1, g->n), pw, sizeof(pw));
  mn_coll_hdr_pack(mine, out);
  xfer_t xs[2] = {{g->next_fd, 1, (char *)out, sizeof(out), 0, nw}, {g->prev_fd, 0, (char *)in, sizeof(in), 0, pw}};
  if (xfer_run(c, xs, 2, what, err, errlen) != 0) return -1;
  if (mn_coll_hdr_unpack(in, &theirs) != 0) {
    snprintf(err, errlen, "%s: %s sent bytes that are not a step header (the group's streams are out of step)",
             what, pw);
    return -1;
  }
  if (theirs.kind == MN_COLL_ABORT) {
    char reason[MN_COLL_MAX_ABORT_MSG + 1];
    size_t rl = theirs.nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)theirs.nbytes;
    if (read_exact(g->prev_fd, reason, rl, now_ms() + 1000) != 0) rl = 0;
    reason[rl] = '\0';
    snprintf(err, errlen, "%s: rank %u gave up on group %llu: %s", what, theirs.rank, (unsigned long long)g->id,
             rl ? reason : "(no reason given)");
    return -1;
  }
  if (mn_coll_hdr_check(mine, &theirs, err, errlen) != 0) {
    if (mismatch != NULL) *mismatch = 1;
    return -1;
  }
  return 0;
}

/*
 * Small all_reduce and barrier: every member sends to member 0, which
 * reduces in member order (so the result is the same every run) and sends
 * the result back to all. With reduce == 0 it only gathers and releases.
 */
static int star_run(mn_coll_t *c, group_t *g, char *data, size_t nbytes, mk_dtype_t dt, int op, int reduce,
                    const char *what, char *err, size_t errlen) {
  char who[MN_COLL_MAX_ADDR + 32];
  int n = g->n;
  if (g->me != 0) {
    member_name(g, 0, who, sizeof(who));
    xfer_t x = {g->star[0], 1, data, nbytes, 0, who};
    if (xfer_run(c, &x, 1, what, err, errlen) != 0) return -1;
    x.send = 0;
    x.done = 0;
    return xfer_run(c, &x, 1, what, err, errlen);
  }
  size_t need = (size_t)(n - 1) * nbytes;
  if (need > c->star_cap) {
    char *p = realloc(c->star_buf, need);
    if (p == NULL) {
      snprintf(err, errlen, "out of memory during %s", what);
      return -1;
    }
    c->star_buf = p;
    c->star_cap = need;
  }
  xfer_t *xs = calloc((size_t)(n - 1), sizeof(xfer_t));
  char (*names)[MN_COLL_MAX_ADDR + 32] = calloc((size_t)(n - 1), sizeof(*names));
  int rc = -1;
  if (xs == NULL || names == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    goto done;
  }
  for (int i = 1; i < n; i++) {
    member_name(g, i, names[i - 1], sizeof(names[0]));
    xs[i - 1] = (xfer_t){g->star[i], 0, c->star_buf + (size_t)(i - 1) * nbytes, nbytes, 0, names[i - 1]};
  }
  if (xfer_run(c, xs, n - 1, what, err, errlen) != 0) goto done;
  if (reduce) {
    size_t count = nbytes / mk_dtype_size(dt);
    for (int i = 1; i < n; i++) mn_coll_reduce(data, data, c->star_buf + (size_t)(i - 1) * nbytes, count, dt, op);
    if (op == MN_COLL_AVG) mn_coll_divide(data, count, dt, n);
  }
  for (int i = 1; i < n; i++) xs[i - 1] = (xfer_t){g->star[i], 1, data, nbytes, 0, names[i - 1]};
  rc = xfer_run(c, xs, n - 1, what, err, errlen);
done:
  free(xs);
  free(names);
  return rc;
}

/*
 * Runs the ring over g's links, naming the neighbours in messages. Links to
 * members on this host copy directly for collectives of at least
 * MN_COLL_CMA_MIN bytes; below that TCP's buffering wins (every member sees
 * the same byte count, so both ends of a link choose alike).
 */
static int ring_over(mn_coll_t *c, group_t *g, ring_t *r, size_t nbytes, const char *what, char *err,
                     size_t errlen) {
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  member_name(g, mod(g->me - 1, g->n), pw, sizeof(pw));
  r->send_fd = g->next_fd;
  r->recv_fd = g->prev_fd;
  r->send_cma = g->next_cma && nbytes >= MN_COLL_CMA_MIN;
  r->recv_cma = g->prev_cma && nbytes >= MN_COLL_CMA_MIN;
  r->prev_pid = g->prev_pid;
  r->n = g->n;
  r->me = g->me;
  r->what = what;
  r->next_who = nw;
  r->prev_who = pw;
  return ring_run(c, r, err, errlen);
}

static int check_cpu(const mk_tensor_t *t, const char *what, const char *arg, char *err, size_t errlen) {
  if (t->device < 0) return 0;
  snprintf(err, errlen, "%s: %s is on GPU device %d; CPU collectives need CPU tensors", what, arg, t->device);
  return -1;
}

static int check_reducible(const mk_tensor_t *t, const char *what, int op, char *err, size_t errlen) {
  if (op < 0 || op > MN_COLL_AVG) {
    snprintf(err, errlen, "%s: unknown op %d (sum, max, min, avg)", what, op);
    return -1;
  }
  if (!mn_coll_dtype_ok(t->dtype)) {
    snprintf(err, errlen, "%s does not support dtype %s (f32, f64, i32, i64)", what, mn_dtype_name(t->dtype));
    return -1;
  }
  return 0;
}

/* ---- the collectives ----------------------------------------------------------------------- */

/* ---- shared-memory groups ---------------------------------------------------------------- */

typedef struct {
  mn_coll_t *c;
  group_t *g;
  const char *what;
} shm_ctx_t;

static void shm_name(void *arg, int j, char *buf, size_t n) { member_name(((shm_ctx_t *)arg)->g, j, buf, n); }

/*
 * For a group that sends nothing on its sockets (shared memory, or a watch
 * group): a readable one means its member died (EOF) or gave up (an ABORT
 * header). 0, or -1 with err naming the member and `what` was running.
 */
static int group_peer_check(group_t *g, const char *what, char *err, size_t errlen) {
  int fds[3] = {g->next_fd, g->prev_fd, g->me != 0 ? g->star[0] : -1};
  int who[3] = {(g->me + 1) % g->n, mod(g->me - 1, g->n), 0};
  int nfd = g->me != 0 ? 3 : 2;
  for (int i = 0; i < nfd + (g->me == 0 ? g->n - 1 : 0); i++) {
    int fd = i < nfd ? fds[i] : g->star[i - nfd + 1], member = i < nfd ? who[i] : i - nfd + 1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (fd < 0 || poll(&p, 1, 0) <= 0) continue;
    char name[MN_COLL_MAX_ADDR + 32];
    member_name(g, member, name, sizeof(name));
    unsigned char h[MN_COLL_HDR_LEN];
    mn_coll_hdr_t a;
    int rc = read_exact(fd, h, sizeof(h), now_ms() + 100);
    if (rc == 0 && mn_coll_hdr_unpack(h, &a) == 0 && a.kind == MN_COLL_ABORT) {
      char reason[MN_COLL_MAX_ABORT_MSG + 1];
      size_t rl = a.nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)a.nbytes;
      if (read_exact(fd, reason, rl, now_ms() + 100) != 0) rl = 0;
      reason[rl] = '\0';
      snprintf(err, errlen, "%s: rank %u gave up on group %llu: %s", what, a.rank, (unsigned long long)g->id,
               rl ? reason : "(no reason given)");
    } else if (rc != 0) {
      fail_io(err, errlen, what, name, 0, rc);
    } else {
      snprintf(err, errlen, "%s: %s sent bytes this group never sends (out of step)", what, name);
    }
    return -1;
  }
  return 0;
}

static int shm_check(void *arg, char *err, size_t errlen) {
  shm_ctx_t *x = arg;
  return group_peer_check(x->g, x->what, err, errlen);
}

static int shm_over(mn_coll_t *c, group_t *g, const mn_coll_hdr_t *h, char *data, const char *src, size_t count,
                    size_t esize, const char *what, char *err, size_t errlen, int *mismatch) {
  shm_ctx_t x = {c, g, what};
  mn_shm_op_t op = {.hdr = h, .gid = g->id, .what = what, .data = data, .src = src, .count = count, .esize = esize,
                    .timeout_ms = c->timeout_ms, .cancel = c->cancel, .check = shm_check, .name = shm_name, .arg = &x};
  return mn_shm_run(g->shm, &op, err, errlen, mismatch) == 0 ? 0 : group_fail(c, g);
}

int mn_coll_all_reduce(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int op, char *err, size_t errlen,
                       int *mismatch) {
  const char *what = "all_reduce";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return -1;
  g->seq++;
  if (check_cpu(t, what, "the tensor", err, errlen) != 0 || check_reducible(t, what, op, err, errlen) != 0)
    return group_abort(c, g, err);
  if (g->n == 1) return 0; /* the sum, max, min and average of one value is that value */
  mn_coll_hdr_t h = {MN_COLL_ALL_REDUCE, (uint8_t)op, (uint8_t)t->dtype, (uint32_t)c->rank, 0, g->seq, t->nbytes};
  if (g->shm != NULL)
    return shm_over(c, g, &h, t->data, NULL, (size_t)t->numel, mk_dtype_size(t->dtype), what, err, errlen, mismatch);
  if (exchange_headers(c, g, &h, what, err, errlen, mismatch) != 0) return group_fail(c, g);
  int rc;
  if (t->nbytes < MN_COLL_SMALL && (size_t)(g->n - 1) * t->nbytes <= MN_COLL_STAR_MAX) {
    rc = star_run(c, g, t->data, t->nbytes, t->dtype, op, 1, what, err, errlen);
  } else {
    /* The gather phase's step k lands on the segment the scatter phase's step k sent. */
    ring_t r = {.nsend = 2 * (g->n - 1), .nrecv = 2 * (g->n - 1), .lag = 1, .reuse_from = g->n - 1,
                .reuse_dist = g->n - 1, .piece = piece_all_reduce, .dtype = t->dtype, .op = op, .esize = mk_dtype_size(t->dtype), .data = t->data,
                .count = (size_t)t->numel};
    rc = ring_over(c, g, &r, t->nbytes, what, err, errlen);
  }
  return rc == 0 ? 0 : group_fail(c, g);
}

int mn_coll_broadcast(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int root, char *err, size_t errlen,
                      int *mismatch) {
  const char *what = "broadcast";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return -1;
  g->seq++;
  if (check_cpu(t, what, "the tensor", err, errlen) != 0) return group_abort(c, g, err);
  if (root < 0 || root >= g->n) {
    snprintf(err, errlen, "%s: root %d is outside the group's members 0..%d", what, root, g->n - 1);
    return group_abort(c, g, err);
  }
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {MN_COLL_BROADCAST, 0, (uint8_t)t->dtype, (uint32_t)c->rank, (uint32_t)root, g->seq, t->nbytes};
  if (g->shm != NULL) return shm_over(c, g, &h, t->data, NULL, t->nbytes, 1, what, err, errlen, mismatch);
  if (exchange_headers(c, g, &h, what, err, errlen, mismatch) != 0) return group_fail(c, g);
  /* A chain from the root around the ring, forwarded chunk by chunk as it lands. */
  int last = (g->me + 1) % g->n == root;
  ring_t r = {.nsend = last ? 0 : 1, .nrecv = g->me == root ? 0 : 1, .lag = g->me == root ? -1 : 0,
              .piece = piece_broadcast, .dtype = t->dtype, .esize = 1, .data = t->data, .count = t->nbytes};
  return ring_over(c, g, &r, t->nbytes, what, err, errlen) == 0 ? 0 : group_fail(c, g);
}

int mn_coll_all_gather(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, char *err,
                       size_t errlen, int *mismatch) {
  const char *what = "all_gather";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return -1;
  g->seq++;
  if (check_cpu(src, what, "src", err, errlen) != 0 || check_cpu(dst, what, "dst", err, errlen) != 0)
    return group_abort(c, g, err);
  if (src->dtype != dst->dtype || dst->numel != (int64_t)g->n * src->numel) {
    snprintf(err, errlen, "%s: dst must be %s with %d x %lld = %lld elements (the group has %d members); it is %s with %lld",
             what, mn_dtype_name(src->dtype), g->n, (long long)src->numel, (long long)g->n * (long long)src->numel,
             g->n, mn_dtype_name(dst->dtype), (long long)dst->numel);
    return group_abort(c, g, err);
  }
  memmove((char *)dst->data + (size_t)g->me * src->nbytes, src->data, src->nbytes);
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {MN_COLL_ALL_GATHER, 0, (uint8_t)src->dtype, (uint32_t)c->rank, 0, g->seq, src->nbytes};
  if (g->shm != NULL) return shm_over(c, g, &h, dst->data, src->data, src->nbytes, 1, what, err, errlen, mismatch);
  if (exchange_headers(c, g, &h, what, err, errlen, mismatch) != 0) return group_fail(c, g);
  ring_t r = {.nsend = g->n - 1, .nrecv = g->n - 1, .lag = 1, .piece = piece_all_gather, .dtype = src->dtype,
              .esize = 1, .data = dst->data, .count = src->nbytes};
  return ring_over(c, g, &r, src->nbytes, what, err, errlen) == 0 ? 0 : group_fail(c, g);
}

int mn_coll_reduce_scatter(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, int op,
                           char *err, size_t errlen, int *mismatch) {
  const char *what = "reduce_scatter";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return -1;
  g->seq++;
  if (check_cpu(src, what, "src", err, errlen) != 0 || check_cpu(dst, what, "dst", err, errlen) != 0 ||
      check_reducible(src, what, op, err, errlen) != 0)
    return group_abort(c, g, err);
  if (src->dtype != dst->dtype || src->numel != (int64_t)g->n * dst->numel) {
    snprintf(err, errlen, "%s: src must be %s with %d x %lld = %lld elements (the group has %d members); it is %s with %lld",
             what, mn_dtype_name(dst->dtype), g->n, (long long)dst->numel, (long long)g->n * (long long)dst->numel,
             g->n, mn_dtype_name(src->dtype), (long long)src->numel);
    return group_abort(c, g, err);
  }
  if (g->n == 1) {
    memmove(dst->data, src->data, dst->nbytes); /* one member: its block is all of src */
    return 0;
  }
  if (src->data == dst->data) {
    snprintf(err, errlen, "%s: src and dst must be different tensors", what);
    return group_abort(c, g, err);
  }
  mn_coll_hdr_t h = {MN_COLL_REDUCE_SCATTER, (uint8_t)op, (uint8_t)src->dtype, (uint32_t)c->rank, 0, g->seq,
                     src->nbytes};
  if (g->shm != NULL)
    return shm_over(c, g, &h, dst->data, src->data, (size_t)dst->numel, mk_dtype_size(src->dtype), what, err, errlen,
                    mismatch);
  if (exchange_headers(c, g, &h, what, err, errlen, mismatch) != 0) return group_fail(c, g);
  /* Two buffers alternate; the one the last step fills is dst. */
  char *scratch = NULL;
  if (g->n > 2 && (scratch = malloc(dst->nbytes ? dst->nbytes : 1)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    return group_fail(c, g);
  }
  ring_t r = {.nsend = g->n - 1, .nrecv = g->n - 1, .lag = 1, .reuse_from = 2, .reuse_dist = 1,
              .piece = piece_reduce_scatter,
              .dtype = src->dtype, .op = op, .esize = mk_dtype_size(src->dtype), .src = src->data,
              .count = (size_t)dst->numel};
  r.buf[(g->n - 2) % 2] = dst->data;
  r.buf[(g->n - 1) % 2] = scratch;
  int rc = ring_over(c, g, &r, src->nbytes, what, err, errlen);
  free(scratch);
  return rc == 0 ? 0 : group_fail(c, g);
}

int mn_coll_barrier(mn_coll_t *c, uint64_t gid, char *err, size_t errlen, int *mismatch) {
  const char *what = "barrier";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return -1;
  g->seq++;
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {MN_COLL_BARRIER, 0, 0, (uint32_t)c->rank, 0, g->seq, 0};
  if (g->shm != NULL) return shm_over(c, g, &h, NULL, NULL, 0, 1, what, err, errlen, mismatch);
  char token = 1;
  if (exchange_headers(c, g, &h, what, err, errlen, mismatch) != 0 ||
      star_run(c, g, &token, 1, MK_U8, 0, 0, what, err, errlen) != 0)
    return group_fail(c, g);
  return 0;
}

/* ---- proc-to-proc copies ----------------------------------------------------------------- */

/* Reads a header and, for ABORT, its reason into err; returns 0 for any other header. */
static int read_reply(int fd, mn_coll_hdr_t *h, int64_t deadline, const char *who, char *err, size_t errlen) {
  unsigned char b[MN_COLL_HDR_LEN];
  int rc = read_exact(fd, b, sizeof(b), deadline);
  if (rc != 0) {
    if (rc == MN_ETIMEDOUT)
      snprintf(err, errlen, "copy: %s did not run the matching recv within the timeout (MONARCH_COLL_TIMEOUT)", who);
    else
      fail_io(err, errlen, "copy", who, 0, rc);
    return -1;
  }
  if (mn_coll_hdr_unpack(b, h) != 0) {
    snprintf(err, errlen, "copy: %s answered with something that is not a step header", who);
    return -1;
  }
  if (h->kind == MN_COLL_ABORT) {
    char reason[MN_COLL_MAX_ABORT_MSG + 1];
    size_t rl = h->nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)h->nbytes;
    if (read_exact(fd, reason, rl, now_ms() + 1000) != 0) rl = 0;
    reason[rl] = '\0';
    snprintf(err, errlen, "copy refused by %s: %s", who, rl ? reason : "(no reason given)");
    return -1;
  }
  return 0;
}

int mn_coll_send(mn_coll_t *c, const mk_tensor_t *t, const char *addr, uint64_t tag, char *err, size_t errlen) {
  char why[512], who[MN_COLL_MAX_ADDR + 16];
  mn_coll_hdr_t h;
  if (check_cpu(t, "copy", "the source tensor", err, errlen) != 0) return -1;
  snprintf(who, sizeof(who), "the proc at %s", addr);
  int fd = link_open(c, addr, MN_COLL_LINK_P2P, tag, (uint32_t)(c->rank < 0 ? 0 : c->rank), t->nbytes, (int)t->dtype,
                     t->data, why, sizeof(why));
  if (fd < 0) {
    snprintf(err, errlen, "copy: %s", why);
    return -1;
  }
  int rc = -1;
  if (read_reply(fd, &h, now_ms() + c->timeout_ms, who, err, errlen) != 0) goto done;
  int64_t wait = c->timeout_ms;
  if (h.op == MN_COLL_COPY_PULL) {
    wait += (int64_t)(t->nbytes / MN_COLL_PULL_MIN_RATE * 1000); /* it is copying from our memory meanwhile */
  } else {
    xfer_t x = {fd, 1, t->data, t->nbytes, 0, who};
    if (xfer_run(c, &x, 1, "copy", err, errlen) != 0) goto done;
  }
  /* The receiver confirms once every byte has landed; until then our memory must stay as it is. */
  if (read_reply(fd, &h, now_ms() + wait, who, err, errlen) != 0) goto done;
  rc = 0;
done:
  close(fd);
  return rc;
}

/* Copies n bytes from pid's memory at addr into dst, in chunks so cancellation is seen. */
static int pull_copy(mn_coll_t *c, pid_t pid, char *dst, uint64_t addr, size_t n, const char *who, char *err,
                     size_t errlen) {
  size_t done = 0;
  while (done < n) {
    if (cancelled(c)) {
      snprintf(err, errlen, "copy cancelled");
      return -1;
    }
    size_t want = n - done > MN_COLL_PULL_CHUNK ? MN_COLL_PULL_CHUNK : n - done;
    struct iovec local = {dst + done, want}, remote = {(void *)(uintptr_t)(addr + done), want};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      snprintf(err, errlen, "copy: reading the source tensor of %s failed: %s (it failed or died)", who,
               got < 0 ? strerror(errno) : "nothing read");
      return -1;
    }
    done += (size_t)got;
  }
  return 0;
}

int mn_coll_recv(mn_coll_t *c, mk_tensor_t *t, uint64_t tag, char *err, size_t errlen) {
  parked_t e;
  char who[64];
  unsigned char b[MN_COLL_HDR_LEN];
  if (check_cpu(t, "copy", "the destination tensor", err, errlen) != 0) return -1;
  int rc = claim(c, MN_COLL_LINK_P2P, tag, -1, &e);
  if (rc != 0) {
    if (rc == MN_ECLOSED) snprintf(err, errlen, "copy (tag %llu): cancelled", (unsigned long long)tag);
    else
      snprintf(err, errlen, "copy (tag %llu): no sender connected within %g s (MONARCH_COLL_TIMEOUT)",
               (unsigned long long)tag, c->timeout_ms / 1000.0);
    return -1;
  }
  snprintf(who, sizeof(who), "rank %u", e.from);
  mn_coll_hdr_t h = {MN_COLL_SEND, 0, (uint8_t)t->dtype, (uint32_t)c->rank, 0, tag, t->nbytes};
  int64_t deadline = now_ms() + c->timeout_ms;
  rc = -1;
  if (e.nbytes != t->nbytes || e.dtype != (int)t->dtype) {
    snprintf(err, errlen, "copy: rank %u sends %s data of %llu bytes but the destination tensor on rank %d is %s of %zu bytes",
             e.from, mn_dtype_name((mk_dtype_t)e.dtype), (unsigned long long)e.nbytes, c->rank, mn_dtype_name(t->dtype),
             t->nbytes);
    size_t ml = strlen(err) > MN_COLL_MAX_ABORT_MSG ? MN_COLL_MAX_ABORT_MSG : strlen(err);
    mn_coll_hdr_t a = {.kind = MN_COLL_ABORT, .rank = (uint32_t)c->rank, .seq = tag, .nbytes = ml};
    mn_coll_hdr_pack(&a, b);
    if (write_exact(e.fd, b, sizeof(b), deadline) == 0 && write_exact(e.fd, err, ml, deadline) != 0) {
      /* The sender sees the close instead. */
    }
    goto done;
  }
  /* On one host we copy straight out of the sender's tensor: one copy instead of TCP's two. */
  int pull = t->nbytes >= MN_COLL_CMA_MIN && same_host(c, e.pid, e.cookie_addr, e.cookie);
  h.op = pull ? MN_COLL_COPY_PULL : 0;
  mn_coll_hdr_pack(&h, b);
  int w = write_exact(e.fd, b, sizeof(b), deadline);
  if (w != 0) {
    fail_io(err, errlen, "copy", who, 1, w);
    goto done;
  }
  if (pull) {
    if (pull_copy(c, (pid_t)e.pid, t->data, e.addr, t->nbytes, who, err, errlen) != 0) goto done;
  } else {
    xfer_t x = {e.fd, 0, t->data, t->nbytes, 0, who};
    if (xfer_run(c, &x, 1, "copy", err, errlen) != 0) goto done;
  }
  w = write_exact(e.fd, b, sizeof(b), now_ms() + c->timeout_ms);
  if (w != 0) {
    fail_io(err, errlen, "copy", who, 1, w);
    goto done;
  }
  rc = 0;
done:
  close(e.fd);
  return rc;
}

/* ---- the __coll_ built-ins ------------------------------------------------------------------ */

static mn_coll_t *proc_coll; /* the process's instance, opened by mn_coll_start */

/* "local" sends waiting for their recv on this proc: tag -> tensor id. */
static struct {
  int used;
  uint64_t tag, id;
} local_sends[MN_COLL_MAX_LOCAL];

int mn_coll_watch(uint64_t gid, const char *what, char *err, size_t errlen) {
  group_t *g = proc_coll != NULL ? group_find(proc_coll, gid) : NULL;
  return g == NULL ? 0 : group_peer_check(g, what, err, errlen);
}

void mn_coll_watch_free(uint64_t gid) {
  if (proc_coll != NULL) mn_coll_group_free(proc_coll, gid);
}

static int arg_u64(const msgpack_object *args, uint32_t i, const char *name, const char *what, uint64_t *v,
                   char *err, size_t errlen) {
  if (mn_get_u64(args, i, v) == 0) return 0;
  snprintf(err, errlen, "%s: argument %u (%s) must be a non-negative integer", what, i + 1, name);
  return -1;
}

static int arg_op(const msgpack_object *args, uint32_t i, const char *what, int *op, char *err, size_t errlen) {
  const char *s;
  size_t n;
  if (mn_get_str(args, i, &s, &n) != 0 || (*op = mn_coll_op_parse(s, n)) < 0) {
    if (i < args->via.array.size && args->via.array.ptr[i].type == MSGPACK_OBJECT_STR)
      snprintf(err, errlen, "%s: unknown op '%.*s' (sum, max, min, avg)", what, (int)(n > 32 ? 32 : n), s);
    else
      snprintf(err, errlen, "%s: argument %u (op) must be one of \"sum\", \"max\", \"min\", \"avg\"", what, i + 1);
    return -1;
  }
  return 0;
}

static int arg_count(const msgpack_object *args, uint32_t lo, uint32_t hi, const char *what, const char *sig,
                     char *err, size_t errlen) {
  uint32_t n = args->via.array.size;
  if (n >= lo && n <= hi) return 0;
  snprintf(err, errlen, "%s takes %s, got %u argument%s", what, sig, n, n == 1 ? "" : "s");
  return -1;
}

/* __coll_group(gid, my_index, {"host:port", ...} [, {rank, ...}]) */
static int builtin_group(const msgpack_object *args, char *err, size_t errlen) {
  const char *what = "__coll_group";
  uint64_t gid, me;
  if (arg_count(args, 3, 4, what, "(group_id, my_index, addresses [, ranks])", err, errlen) != 0 ||
      arg_u64(args, 0, "group id", what, &gid, err, errlen) != 0 ||
      arg_u64(args, 1, "my index", what, &me, err, errlen) != 0)
    return -1;
  const msgpack_object *a = &args->via.array.ptr[2];
  const msgpack_object *r = args->via.array.size > 3 ? &args->via.array.ptr[3] : NULL;
  if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size < 1 || a->via.array.size > MN_COLL_MAX_MEMBERS) {
    snprintf(err, errlen, "%s: argument 3 must be a list of 1..%d \"host:port\" addresses", what,
             MN_COLL_MAX_MEMBERS);
    return -1;
  }
  int n = (int)a->via.array.size;
  if (r != NULL && r->type != MSGPACK_OBJECT_NIL && (r->type != MSGPACK_OBJECT_ARRAY || (int)r->via.array.size != n)) {
    snprintf(err, errlen, "%s: argument 4 must be a list of %d ranks", what, n);
    return -1;
  }
  if (me >= (uint64_t)n) {
    snprintf(err, errlen, "%s: my index %llu is outside 0..%d", what, (unsigned long long)me, n - 1);
    return -1;
  }
  char **addrs = calloc((size_t)n, sizeof(char *));
  int *ranks = malloc(sizeof(int) * (size_t)n), rc = -1;
  if (addrs == NULL || ranks == NULL) {
    snprintf(err, errlen, "%s: out of memory", what);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const char *s;
    size_t sl;
    int64_t rk = -1;
    if (mn_get_str(a, (uint32_t)i, &s, &sl) != 0 || sl == 0 || sl > MN_COLL_MAX_ADDR) {
      snprintf(err, errlen, "%s: address %d must be a \"host:port\" string of at most %d bytes", what, i + 1,
               MN_COLL_MAX_ADDR);
      goto done;
    }
    if ((addrs[i] = strndup(s, sl)) == NULL) {
      snprintf(err, errlen, "%s: out of memory", what);
      goto done;
    }
    if (r != NULL && r->type == MSGPACK_OBJECT_ARRAY && (mn_get_i64(r, (uint32_t)i, &rk) != 0 || rk < -1 || rk > INT32_MAX)) {
      snprintf(err, errlen, "%s: rank %d must be an integer", what, i + 1);
      goto done;
    }
    ranks[i] = (int)rk;
  }
  rc = mn_coll_group(proc_coll, gid, (int)me, n, (const char *const *)addrs, ranks, err, errlen);
done:
  for (int i = 0; addrs != NULL && i < n; i++) free(addrs[i]);
  free(addrs);
  free(ranks);
  return rc;
}

static int builtin_recv_local(mn_exec_t *x, mk_tensor_t *t, uint64_t tag, int *found, char *err, size_t errlen) {
  *found = 0;
  for (int i = 0; i < MN_COLL_MAX_LOCAL; i++) {
    if (!local_sends[i].used || local_sends[i].tag != tag) continue;
    *found = 1;
    local_sends[i].used = 0;
    mk_tensor_t *s = mn_tensor_get(&x->reg, local_sends[i].id);
    if (s == NULL) {
      snprintf(err, errlen, "copy: the source tensor %llu was freed before the copy ran",
               (unsigned long long)local_sends[i].id);
      return -1;
    }
    if (s->nbytes != t->nbytes || s->dtype != t->dtype) {
      snprintf(err, errlen, "copy: the source is %s of %zu bytes but the destination on rank %d is %s of %zu bytes",
               mn_dtype_name(s->dtype), s->nbytes, x->rank, mn_dtype_name(t->dtype), t->nbytes);
      return -1;
    }
    if (s != t) memcpy(t->data, s->data, t->nbytes);
    return 0;
  }
  return 0;
}

/* The other members are (or will be) in this collective: tell them why this one is not. */
static int abort_on_bad_args(mn_coll_t *c, uint64_t gid, const char *err) {
  mn_coll_group_abort(c, gid, err);
  return -1;
}

static int coll_builtin(mn_exec_t *x, mk_ctx_t *ctx, const char *name, size_t nl, const msgpack_object *args,
                        char *err, size_t errlen) {
  uint64_t gid, tag, root;
  int op, mismatch = 0, rc;
  mk_tensor_t *t, *t2 = NULL;
  mn_coll_t *c = proc_coll;
  mn_coll_set_cancel(c, x->cancel);
#define IS(lit) (nl == sizeof(lit) - 1 && memcmp(name, lit, nl) == 0)
#define TENSOR(i) mn_exec_tensor_arg(x, args, i, err, errlen)
  if (IS("__coll_port")) return mk_return_int(ctx, c->port) == 0 ? 0 : -1;
  if (IS("__coll_group")) return builtin_group(args, err, errlen);
  if (IS("__coll_free")) {
    if (arg_count(args, 1, 1, "__coll_free", "(group_id)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_free", &gid, err, errlen) != 0)
      return -1;
    return mn_coll_group_free(c, gid);
  }
  if (IS("__coll_all_reduce") || IS("__coll_reduce_scatter")) {
    int scatter = IS("__coll_reduce_scatter");
    const char *what = scatter ? "__coll_reduce_scatter" : "__coll_all_reduce";
    uint32_t opi = scatter ? 3 : 2;
    if (arg_count(args, opi + 1, opi + 1, what, scatter ? "(group_id, src, dst, op)" : "(group_id, tensor, op)",
                  err, errlen) != 0 ||
        arg_u64(args, 0, "group id", what, &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || (scatter && (t2 = TENSOR(2)) == NULL) || arg_op(args, opi, what, &op, err, errlen) != 0)
      return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = scatter ? mn_coll_reduce_scatter(c, gid, t, t2, op, err, errlen, &mismatch)
                 : mn_coll_all_reduce(c, gid, t, op, err, errlen, &mismatch);
  } else if (IS("__coll_broadcast")) {
    if (arg_count(args, 3, 3, "__coll_broadcast", "(group_id, tensor, root_index)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_broadcast", &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || arg_u64(args, 2, "root index", "__coll_broadcast", &root, err, errlen) != 0)
      return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = mn_coll_broadcast(c, gid, t, root > INT32_MAX ? -1 : (int)root, err, errlen, &mismatch);
  } else if (IS("__coll_all_gather")) {
    if (arg_count(args, 3, 3, "__coll_all_gather", "(group_id, src, dst)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_all_gather", &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || (t2 = TENSOR(2)) == NULL) return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = mn_coll_all_gather(c, gid, t, t2, err, errlen, &mismatch);
  } else if (IS("__coll_barrier")) {
    if (arg_count(args, 1, 1, "__coll_barrier", "(group_id)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_barrier", &gid, err, errlen) != 0)
      return -1;
    x->err_kind = "collective";
    rc = mn_coll_barrier(c, gid, err, errlen, &mismatch);
  } else if (IS("__coll_send")) {
    const char *s;
    size_t sl;
    char addr[MN_COLL_MAX_ADDR + 1];
    if (arg_count(args, 3, 3, "__coll_send", "(tensor, \"host:port\" or \"local\", tag)", err, errlen) != 0 ||
        (t = TENSOR(0)) == NULL || arg_u64(args, 2, "tag", "__coll_send", &tag, err, errlen) != 0)
      return -1;
    if (mn_get_str(args, 1, &s, &sl) != 0 || sl == 0 || sl > MN_COLL_MAX_ADDR) {
      snprintf(err, errlen, "__coll_send: argument 2 must be the receiver's data address \"host:port\" or \"local\"");
      return -1;
    }
    memcpy(addr, s, sl);
    addr[sl] = '\0';
    x->err_kind = "collective";
    if (strcmp(addr, "local") == 0) {
      for (int i = 0; i < MN_COLL_MAX_LOCAL; i++) {
        if (!local_sends[i].used) {
          local_sends[i].used = 1;
          local_sends[i].tag = tag;
          local_sends[i].id = t->id;
          return 0;
        }
      }
      snprintf(err, errlen, "copy: %d local copies are already waiting for their recv (MN_COLL_MAX_LOCAL)",
               MN_COLL_MAX_LOCAL);
      return -1;
    }
    rc = mn_coll_send(c, t, addr, tag, err, errlen);
  } else if (IS("__coll_recv")) {
    int found;
    if (arg_count(args, 2, 2, "__coll_recv", "(tensor, tag)", err, errlen) != 0 || (t = TENSOR(0)) == NULL ||
        arg_u64(args, 1, "tag", "__coll_recv", &tag, err, errlen) != 0)
      return -1;
    x->err_kind = "collective";
    rc = builtin_recv_local(x, t, tag, &found, err, errlen);
    if (!found) rc = mn_coll_recv(c, t, tag, err, errlen);
  } else {
    snprintf(err, errlen, "unknown built-in '%.*s' (collectives: __coll_port, __coll_group, __coll_free, "
             "__coll_all_reduce, __coll_broadcast, __coll_all_gather, __coll_reduce_scatter, __coll_barrier, "
             "__coll_send, __coll_recv)", (int)nl, name);
    return -1;
  }
#undef IS
#undef TENSOR
  if (rc != 0 && mismatch) x->err_kind = "collective_mismatch";
  return rc;
}

int mn_coll_start(const char *bind_host, const mn_auth_t *auth, int rank) {
  char err[256];
  int rc = mn_coll_open(&proc_coll, bind_host, auth, rank, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "monarch-worker --proc: data port: %s\n", err);
    return rc;
  }
  if (mn_exec_register("__coll_", coll_builtin) != 0) {
    fprintf(stderr, "monarch-worker --proc: cannot register the collective built-ins (MN_MAX_BUILTIN_MODULES)\n");
    return -1;
  }
  return 0;
}
