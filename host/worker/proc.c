/*
 * proc.c - the proc process.
 *
 * Two threads. The I/O thread accepts the controller's connection, checks
 * its token, splits the byte stream into frames, answers PINGs at once and
 * queues everything else. The executor thread runs the queue in order and
 * writes RESULT frames straight to the socket, batching those of one burst
 * into one write. A long kernel therefore never delays a PONG, and a burst
 * of small calls costs one wake-up and one syscall each way.
 */
#include "proc.h"

#include "exec.h"
#include "handshake.h"
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MN_SPIN_NS_DEFAULT 0 /* executor busy-wait before sleeping; 0: spinning measured slower on 2 cores */
#define MN_MAX_QUEUED (256u << 20) /* bytes of calls queued before the reader stops reading */

typedef struct item_s {
  struct item_s *next;
  unsigned gen; /* session the call arrived on */
  size_t len;
  char data[];
} item_t;

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;      /* signalled when items arrive or on stop */
  pthread_cond_t space;     /* signalled when queued bytes drop */
  item_t *head, *tail;
  size_t queued_bytes;
  atomic_int nitems;
  int stop;
  pthread_mutex_t wlock;    /* serializes writes to fd */
  int fd;                   /* the controller connection, -1 when none */
  unsigned gen;             /* session number of fd; bumped per connection, under wlock */
  atomic_int cancel;
  mn_exec_t exec;
  long spin_ns;
} proc_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Writes bytes to session `gen`'s connection; drops them if that session is over,
 * so a late result never reaches a controller that did not ask for it. */
static void send_bytes(proc_t *p, unsigned gen, const char *data, size_t n) {
  pthread_mutex_lock(&p->wlock);
  if (p->fd >= 0 && p->gen == gen && mn_write_all(p->fd, data, n) != 0) {
    /* The reader sees the broken connection too and handles it. */
    shutdown(p->fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&p->wlock);
}

/* Takes the whole queue; waits (spinning briefly first) until non-empty or stopped. */
static item_t *take_all(proc_t *p) {
  int64_t until = now_ns() + p->spin_ns;
  while (atomic_load_explicit(&p->nitems, memory_order_acquire) == 0 && now_ns() < until)
    ;
  pthread_mutex_lock(&p->lock);
  while (p->head == NULL && !p->stop) pthread_cond_wait(&p->cond, &p->lock);
  item_t *all = p->head;
  p->head = p->tail = NULL;
  atomic_store(&p->nitems, 0);
  p->queued_bytes = 0;
  pthread_cond_signal(&p->space);
  pthread_mutex_unlock(&p->lock);
  return all;
}

static unsigned current_gen(proc_t *p) {
  pthread_mutex_lock(&p->wlock);
  unsigned g = p->gen;
  pthread_mutex_unlock(&p->wlock);
  return g;
}

static void *executor(void *arg) {
  proc_t *p = arg;
  mn_exec_t *x = &p->exec;
  unsigned xgen = 0; /* session whose sequence numbers x tracks */
  for (;;) {
    item_t *it = take_all(p);
    if (it == NULL) break;
    while (it != NULL) {
      item_t *next = it->next;
      int rc = 0;
      if (it->gen != xgen) {
        /* A new controller session: drop what the old one left unflushed. */
        x->out.len = 0;
        mn_exec_new_session(x);
        xgen = it->gen;
      }
      /* Calls of a session that already ended have nobody to answer to. */
      if (it->gen == current_gen(p)) rc = mn_exec_frame(x, it->data, it->len);
      free(it);
      it = next;
      /* Flush when the burst is done, when the batch is large, or before closing. */
      if (it == NULL || x->out.len > (1u << 18) || rc < 0) {
        send_bytes(p, xgen, x->out.data, x->out.len);
        x->out.len = 0;
      }
      if (rc < 0) {
        pthread_mutex_lock(&p->wlock);
        if (p->fd >= 0 && p->gen == xgen) shutdown(p->fd, SHUT_RDWR);
        pthread_mutex_unlock(&p->wlock);
      }
    }
  }
  return NULL;
}

static void enqueue(proc_t *p, item_t *first, item_t *last, size_t bytes, int n) {
  pthread_mutex_lock(&p->lock);
  while (p->queued_bytes > MN_MAX_QUEUED && !p->stop) pthread_cond_wait(&p->space, &p->lock);
  if (p->tail) p->tail->next = first;
  else p->head = first;
  p->tail = last;
  p->queued_bytes += bytes;
  atomic_fetch_add_explicit(&p->nitems, n, memory_order_release);
  pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

/* Answers a PING inline: body is [5, id]. */
static int try_pong(proc_t *p, unsigned gen, const char *body, size_t len) {
  if (len < 2 || (unsigned char)body[0] != 0x92 || body[1] != MN_MSG_PING) return 0;
  char frame[32];
  if (len - 2 > sizeof(frame) - 6) return 0;
  frame[4] = (char)0x92;
  frame[5] = MN_MSG_PONG;
  memcpy(frame + 6, body + 2, len - 2);
  mn_put_be32(frame, (uint32_t)len);
  send_bytes(p, gen, frame, len + 4);
  return 1;
}

/* Serves one authenticated connection until it closes; `in` may already
 * hold bytes that arrived right behind the handshake. */
static void serve(proc_t *p, int fd, unsigned gen, mn_buf_t *inbuf) {
  mn_buf_t in = *inbuf;
  int pending = in.len > 0;
  for (;;) {
    if (!pending) {
      if (mn_buf_reserve(&in, 256 * 1024) != 0) break;
      ssize_t r = recv(fd, in.data + in.len, in.cap - in.len, 0);
      if (r == 0) break;
      if (r < 0) {
        if (errno == EINTR) continue;
        break;
      }
      in.len += (size_t)r;
    }
    pending = 0;
    size_t off = 0;
    item_t *first = NULL, *last = NULL;
    size_t bytes = 0;
    int n = 0;
    for (;;) {
      const char *body;
      int64_t len = mn_frame_peek(in.data + off, in.len - off, MN_MAX_FRAME, &body);
      if (len == MN_EAGAIN) break;
      if (len < 0) {
        mn_buf_t e;
        char msg[128];
        mn_buf_init(&e);
        snprintf(msg, sizeof(msg), "frame length exceeds MN_MAX_FRAME (%u bytes) or is zero", MN_MAX_FRAME);
        mn_pack_error(&e, MN_EFRAME, msg);
        send_bytes(p, gen, e.data, e.len);
        mn_buf_free(&e);
        goto out;
      }
      off += MN_FRAME_HEADER + (size_t)len;
      if (try_pong(p, gen, body, (size_t)len)) continue;
      item_t *it = malloc(sizeof(*it) + (size_t)len);
      if (it == NULL) goto out;
      it->next = NULL;
      it->gen = gen;
      it->len = (size_t)len;
      memcpy(it->data, body, (size_t)len);
      if (last) last->next = it;
      else first = it;
      last = it;
      bytes += (size_t)len;
      n++;
    }
    if (first) enqueue(p, first, last, bytes, n);
    mn_buf_consume(&in, off);
  }
out:
  *inbuf = in;
}

/*
 * Runs the server side of the handshake on a fresh connection; 0 when
 * authenticated. Bytes after the AUTH frame stay in `in` for serve().
 */
static int handshake(const mn_auth_t *auth, int fd, mn_buf_t *in) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  mn_buf_t out;
  msgpack_zone zone;
  msgpack_object msg;
  char err[256];
  const char *body;
  int rc = -1;
  mn_buf_init(&out);
  if (!msgpack_zone_init(&zone, 1024)) return -1;
  mn_hs_hello(&out, "proc", ns);
  if (mn_write_all(fd, out.data, out.len) != 0) goto done;
  out.len = 0;
  /* Only a HELLO-sized frame is read before authentication. */
  int64_t n = mn_read_frame(fd, in, &body, 4096, MN_HANDSHAKE_TIMEOUT_MS);
  if (n == MN_ECLOSED || n < 0) {
    if (n == MN_ETIMEDOUT) mn_pack_error(&out, MN_ETIMEDOUT, "handshake not completed in time");
    else if (n == MN_EFRAME) mn_pack_error(&out, MN_EFRAME, "handshake frame too large");
    if (out.len > 0 && mn_write_all(fd, out.data, out.len) != 0) goto done;
    goto done;
  }
  int code = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
  if (code == 0) code = mn_hs_check_auth(auth, &msg, ns, nc, err, sizeof(err));
  mn_buf_consume(in, MN_FRAME_HEADER + (size_t)n);
  if (code != 0) {
    mn_pack_error(&out, code, err);
    if (mn_write_all(fd, out.data, out.len) != 0) goto done;
    goto done;
  }
  mn_hs_welcome(&out, auth, ns, nc, "proc");
  rc = mn_write_all(fd, out.data, out.len) == 0 ? 0 : -1;
done:
  mn_buf_free(&out);
  msgpack_zone_destroy(&zone);
  return rc;
}

int mn_proc_main(const mn_proc_opts_t *o) {
  static proc_t P;
  proc_t *p = &P;
  mn_auth_t auth;
  char err[256];
  int port = 0;
  signal(SIGPIPE, SIG_IGN);
  if (o->parent > 0) {
    /* Die with the host agent, so a killed agent leaves no orphans. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != o->parent) return 3;
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
  char line[32];
  int ln = snprintf(line, sizeof(line), "%d\n", port);
  if (mn_write_all(o->port_fd >= 0 ? o->port_fd : 1, line, (size_t)ln) != 0) return 2;
  if (o->port_fd > 2) close(o->port_fd);

  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_cond_init(&p->space, NULL);
  pthread_mutex_init(&p->wlock, NULL);
  p->fd = -1;
  const char *spin = getenv("MONARCH_SPIN_US");
  p->spin_ns = spin ? atol(spin) * 1000 : MN_SPIN_NS_DEFAULT;
  if (mn_exec_init(&p->exec, o->prefix, o->rank, o->world, &p->cancel) != 0) return 2;
  pthread_t th;
  if (pthread_create(&th, NULL, executor, p) != 0) return 2;

  for (;;) {
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int r = poll(&pfd, 1, (int)(o->orphan_timeout * 1000));
    if (r == 0) break; /* orphaned: nobody came for us */
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    mn_sock_nodelay(fd);
    mn_buf_t in;
    mn_buf_init(&in);
    if (handshake(&auth, fd, &in) != 0) {
      mn_buf_free(&in);
      close(fd);
      continue;
    }
    pthread_mutex_lock(&p->wlock);
    p->fd = fd;
    unsigned gen = ++p->gen;
    pthread_mutex_unlock(&p->wlock);
    atomic_store(&p->cancel, 0);
    serve(p, fd, gen, &in);
    mn_buf_free(&in);
    pthread_mutex_lock(&p->wlock);
    p->fd = -1;
    close(fd);
    pthread_mutex_unlock(&p->wlock);
  }
  /* Orphaned: stop running kernels and leave. Exiting without joining is
   * deliberate: a kernel that ignores cancellation must not keep us alive. */
  atomic_store(&p->cancel, 1);
  close(lfd);
  _exit(0);
}
