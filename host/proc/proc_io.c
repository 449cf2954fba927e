/*
 * proc_io.c - the proc's connection, read by whichever thread holds it (the
 * idle executor, or the I/O thread while a call runs long; see
 * proc_handover.c). It accepts connections (each handshake runs on a thread
 * of its own so a slow or hostile peer never delays a PONG), splits the
 * stream of the current controller connection and the agent's relay into
 * frames, answers PING at once, handles SESSION, ACK and CANCEL, and writes
 * status lines to the agent. CALLs go to the caller in a batch, to run or
 * queue.
 */
#include "proc_int.h"

#include "clock.h"
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MN_RELAY_HELD_MAX (4u << 20) /* relay bytes kept unread while no SESSION has come */
#define MN_STATUS_MS_DEFAULT 1000 /* status lines to the agent; the agent sets MONARCH_STATUS_MS from its hang timeout */
#define MN_MAX_HANDSHAKES 16       /* concurrent unauthenticated connections accepted */
#define MN_BIG_FRAME (256u << 10)  /* frames this large are received straight into their queue item */
#define MN_BIG_FRAME_TIMEOUT_MS 30000 /* a bulk frame must keep arriving at least this often */

/* ---- handshakes ------------------------------------------------------------- */

static void *handshake_thread(void *arg) {
  conn_t *c = arg;
  proc_t *p = c->p;
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  mn_buf_t out;
  msgpack_zone zone;
  msgpack_object msg;
  char err[256];
  const char *body;
  int ok = 0;
  mn_buf_init(&out);
  if (!msgpack_zone_init(&zone, 1024)) goto done;
  mn_hs_hello(&out, "proc", ns);
  if (mn_write_all(c->fd, out.data, out.len) != 0) goto done_zone;
  out.len = 0;
  /* Only a HELLO-sized frame is read before authentication. */
  int64_t n = mn_read_frame(c->fd, &c->in, &body, 4096, MN_HANDSHAKE_TIMEOUT_MS);
  if (n < 0) {
    if (n == MN_ETIMEDOUT) mn_msg_pack_error(&out, MN_ETIMEDOUT, "handshake not completed in time");
    else if (n == MN_EFRAME) mn_msg_pack_error(&out, MN_EFRAME, "handshake frame too large");
  } else {
    int code = mn_decode(body, (size_t)n, &zone, &msg, err, sizeof(err));
    if (code == 0) code = mn_hs_check_auth(p->auth, &msg, ns, nc, err, sizeof(err));
    mn_buf_consume(&c->in, MN_FRAME_HEADER + (size_t)n);
    if (code != 0) mn_msg_pack_error(&out, code, err);
    else {
      mn_hs_welcome(&out, p->auth, ns, nc, "proc");
      ok = 1;
    }
  }
  if (out.len > 0 && mn_write_all(c->fd, out.data, out.len) != 0) ok = 0;
done_zone:
  msgpack_zone_destroy(&zone);
done:
  mn_buf_free(&out);
  /* Hand the connection over; the I/O thread owns it from here. */
  if (!ok || write(p->hs_pipe[1], &c, sizeof(c)) != (ssize_t)sizeof(c)) {
    close(c->fd);
    mn_buf_free(&c->in);
    free(c);
  }
  atomic_fetch_sub(&p->handshakes, 1);
  return NULL;
}

static void start_handshake(proc_t *p, int fd) {
  pthread_t th;
  pthread_attr_t attr;
  conn_t *c = calloc(1, sizeof(*c));
  if (c == NULL || atomic_load(&p->handshakes) >= MN_MAX_HANDSHAKES) {
    free(c);
    close(fd);
    return;
  }
  c->p = p;
  c->fd = fd;
  mn_buf_init(&c->in);
  atomic_fetch_add(&p->handshakes, 1);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &attr, handshake_thread, c) != 0) {
    atomic_fetch_sub(&p->handshakes, 1);
    close(fd);
    free(c);
  }
  pthread_attr_destroy(&attr);
}

/* ---- frames from the connection ------------------------------------------------- */

/* Answers a PING inline: body is [5, id]. 1 when it was a PING (answered), else 0; never fails. */
static int try_pong(proc_t *p, uint64_t session, const char *body, size_t len) {
  char frame[MN_MSG_PONG_MAX];
  size_t n = mn_msg_pong_from_ping(frame, body, len);
  if (n == 0) return 0;
  mn__proc_send_bytes(p, session, frame, n);
  return 1;
}

/* Closes a controller connection, or the agent's relay (then casts reach us directly). */
static void drop_conn(proc_t *p, conn_t **cur) {
  if (*cur == NULL) return;
  pthread_mutex_lock(&p->wlock);
  if ((*cur)->relay) p->relay_fd = -1;
  else if (p->fd == (*cur)->fd) p->fd = -1;
  /* Explicitly: closing drops it from the set only if no other process holds the socket too.
   * ENOENT (it never got in) is all that can fail, and then there is nothing to drop. */
  if (epoll_ctl(p->ep, EPOLL_CTL_DEL, (*cur)->fd, NULL) != 0 && errno != ENOENT) abort();
  close((*cur)->fd);
  pthread_mutex_unlock(&p->wlock);
  mn_buf_free(&(*cur)->in);
  free(*cur);
  *cur = NULL;
}

/* Writes an ERROR frame to c (best effort: the connection is dropped next). */
static void send_error(conn_t *c, int code, const char *msg) {
  mn_buf_t e;
  mn_buf_init(&e);
  if (mn_msg_pack_error(&e, code, msg) == 0 && mn_write_all(c->fd, e.data, e.len) != 0) {
    /* The peer is gone already; dropping the connection is all that is left. */
  }
  mn_buf_free(&e);
}

static uint64_t current_session(proc_t *p) {
  pthread_mutex_lock(&p->wlock);
  uint64_t s = p->session;
  pthread_mutex_unlock(&p->wlock);
  return s;
}

/* CANCEL: records each call for the executor, or flags it if it runs now. */
static void cancel_calls(proc_t *p, const msgpack_object *seqs) {
  uint64_t session = current_session(p);
  for (uint32_t i = 0; i < seqs->via.array.size; i++) {
    /* A full table (MN_ELIMIT) drops the request: the call then runs, as if the cancel came late. */
    if (mn_cancel_request(&p->cancels, session, seqs->via.array.ptr[i].via.u64) == MN_ELIMIT) break;
  }
}

/* Whether session sid was taken over by another one here (lock held). */
static int retired(const proc_t *p, uint64_t sid) {
  int n = p->nretired < MN_PROC_RETIRED ? p->nretired : MN_PROC_RETIRED;
  for (int i = 0; i < n; i++)
    if (p->retired[i] == sid) return 1;
  return 0;
}

/* Takes up SESSION (sid, acked): the connection now serves that session. Returns -1 for a session another one
 * took over from (a controller that froze past its agents' patience and woke up): two must never drive a proc. */
static int open_session(proc_t *p, conn_t *c, const mn_msg_session_t *s) {
  pthread_mutex_lock(&p->wlock);
  if (s->session != p->session && retired(p, s->session)) {
    pthread_mutex_unlock(&p->wlock);
    return -1;
  }
  if (s->session != p->session) {
    /* A new controller session: forget the old one's results, and never serve the old one again. */
    if (p->session != 0) {
      p->retired[p->nretired++ % MN_PROC_RETIRED] = p->session;
      mn_cancel_retire(&p->cancels, p->session);
    }
    mn_replay_clear(&p->replay);
    p->session = s->session;
  }
  mn_replay_trim(&p->replay, s->acked);
  p->fd = c->fd;
  pthread_mutex_unlock(&p->wlock);
  return 0;
}

/*
 * Handles SESSION, ACK and CANCEL, which the I/O thread owns. Returns 0 with
 * *handled 1 if it took the frame, 0 if the frame is for the executor; or
 * MN_EPROTO after sending an ERROR, or MN_ENOMEM (the caller drops the conn).
 */
static int control_frame(proc_t *p, conn_t *c, const char *body, size_t len, int *has_session, int *handled) {
  unsigned char t = len >= 2 ? (unsigned char)body[1] : 0;
  *handled = 0;
  if (t != MN_MSG_SESSION && t != MN_MSG_ACK && t != MN_MSG_CANCEL && *has_session) return 0;
  msgpack_zone zone;
  msgpack_object m;
  char err[256];
  mn_msg_session_t sess;
  const msgpack_object *seqs;
  uint64_t acked;
  int rc = MN_EPROTO;
  if (!msgpack_zone_init(&zone, 256)) return MN_ENOMEM;
  if (mn_decode(body, len, &zone, &m, err, sizeof(err)) == 0) {
    int type = mn_msg_type(&m);
    if (type == MN_MSG_SESSION && mn_msg_parse_session(&m, &sess, err, sizeof(err)) == 0) {
      if (open_session(p, c, &sess) == 0) {
        *has_session = 1;
        rc = 0;
      } else {
        snprintf(err, sizeof(err), "taken over by another controller: this proc no longer serves this controller's "
                 "session");
      }
    } else if (type == MN_MSG_ACK && *has_session && mn_msg_parse_ack(&m, &acked, err, sizeof(err)) == 0) {
      pthread_mutex_lock(&p->wlock);
      mn_replay_trim(&p->replay, acked);
      pthread_mutex_unlock(&p->wlock);
      rc = 0;
    } else if (type == MN_MSG_CANCEL && *has_session && mn_msg_parse_cancel(&m, &seqs, err, sizeof(err)) == 0) {
      cancel_calls(p, seqs);
      rc = 0;
    } else if (!*has_session && type != MN_MSG_SESSION) {
      snprintf(err, sizeof(err), "expected SESSION as the first message after WELCOME, got type %d", type);
    } else if (type != MN_MSG_SESSION && type != MN_MSG_ACK && type != MN_MSG_CANCEL) {
      /* The first bytes looked like one of these, but the message is another (a non-fixarray head). */
      snprintf(err, sizeof(err), "proc does not accept message type %d here", type);
    }
  }
  msgpack_zone_destroy(&zone);
  if (rc < 0) send_error(c, MN_EPROTO, err);
  else *handled = 1;
  return rc;
}

/* An ACK the agent handed on (ACKS): trims the replay cache as one on our own link does. 1 if it was one. */
static int relay_ack(proc_t *p, const char *body, size_t len) {
  if (len < 2 || (unsigned char)body[1] != MN_MSG_ACK) return 0;
  msgpack_zone zone;
  msgpack_object m;
  char err[128];
  uint64_t acked;
  if (!msgpack_zone_init(&zone, 256)) return 1;
  if (mn_decode(body, len, &zone, &m, err, sizeof(err)) == 0 && mn_msg_parse_ack(&m, &acked, err, sizeof(err)) == 0) {
    pthread_mutex_lock(&p->wlock);
    mn_replay_trim(&p->replay, acked);
    pthread_mutex_unlock(&p->wlock);
  }
  msgpack_zone_destroy(&zone);
  return 1; /* a malformed one from our own agent is dropped: the next ACK covers it */
}

static void batch_add(batch_t *q, item_t *it) {
  it->next = NULL;
  if (q->last) q->last->next = it;
  else q->first = it;
  q->last = it;
  q->bytes += it->len;
  q->n++;
}

/*
 * Receives a bulk frame of flen bytes, whose first `have` body bytes are at
 * `start`, straight into its queue item rather than growing the read buffer
 * and copying it out afterwards. Returns the item, or NULL if the
 * connection failed or stalled first.
 */
static item_t *receive_big(conn_t *c, const char *start, size_t have, size_t flen) {
  /* Memory follows the bytes that actually arrive, not the length a peer
   * announces: the item grows by doubling as data comes in. */
  size_t cap = flen < (16u << 20) ? flen : (16u << 20);
  if (cap < have) cap = have;
  item_t *it = malloc(sizeof(*it) + cap);
  if (it == NULL) return NULL;
  memcpy(it->data, start, have);
  while (have < flen) {
    if (have == cap) {
      size_t ncap = cap * 2 < flen ? cap * 2 : flen;
      item_t *grown = realloc(it, sizeof(*it) + ncap);
      if (grown == NULL) break;
      it = grown;
      cap = ncap;
    }
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (poll(&pf, 1, MN_BIG_FRAME_TIMEOUT_MS) <= 0) break;
    ssize_t r = recv(c->fd, it->data + have, cap - have, 0);
    if (r <= 0 && !(r < 0 && errno == EINTR)) break;
    if (r > 0) have += (size_t)r;
  }
  if (have < flen) {
    free(it);
    return NULL;
  }
  it->len = flen;
  return it;
}

/* Whether the bytes at `at` (n of them) start a bulk frame still arriving. */
static int big_frame_starts(const char *at, size_t n) {
  return n >= MN_FRAME_HEADER && mn_be32(at) >= MN_BIG_FRAME && mn_be32(at) <= MN_MAX_FRAME;
}


/*
 * Splits the bytes buffered for c into frames, adding its CALLs to q.
 * Returns 0, or a negative code when c must be dropped: MN_EPEER (a bulk
 * frame stalled or was cut off), MN_EFRAME, control_frame's code, or
 * MN_ENOMEM (the CALLs before it are in q all the same).
 */
static int parse_frames(proc_t *p, conn_t *c, int *has_session, batch_t *q) {
  mn_buf_t *in = &c->in;
  size_t off = 0;
  int rc = 0;
  uint64_t session = current_session(p);
  for (;;) {
    const char *body;
    int64_t len = mn_frame_peek(in->data + off, in->len - off, MN_MAX_FRAME, &body);
    if (len == MN_EAGAIN && *has_session && big_frame_starts(in->data + off, in->len - off)) {
      item_t *it = receive_big(c, in->data + off + MN_FRAME_HEADER, in->len - off - MN_FRAME_HEADER,
                               mn_be32(in->data + off));
      if (it == NULL) {
        rc = MN_EPEER; /* or memory ran out: receive_big does not say */
        break;
      }
      it->session = session;
      it->relay = c->relay;
      batch_add(q, it);
      off = in->len; /* consumed: the frame's start was all that was buffered */
      break;
    }
    if (len == MN_EAGAIN) break;
    if (len < 0) {
      char msg[128];
      snprintf(msg, sizeof(msg), "frame length exceeds MN_MAX_FRAME (%u bytes) or is zero", MN_MAX_FRAME);
      send_error(c, MN_EFRAME, msg);
      rc = MN_EFRAME;
      break;
    }
    int handled = 0;
    /* A cast can overtake the SESSION on the controller's own link: its CALLs wait, unread, for it
     * (run_held_relay); nothing would resend them. Past MN_RELAY_HELD_MAX nobody is coming: dropped. */
    c->held = c->relay && session == 0 && in->len <= MN_RELAY_HELD_MAX;
    if (c->held) break;
    off += MN_FRAME_HEADER + (size_t)len;
    if (c->relay) {
      if (session == 0) continue;
      if (relay_ack(p, body, (size_t)len)) continue;
    } else {
      if ((rc = control_frame(p, c, body, (size_t)len, has_session, &handled)) != 0) break;
      if (handled) {
        session = current_session(p);
        continue;
      }
      if (try_pong(p, session, body, (size_t)len)) continue;
    }
    item_t *it = malloc(sizeof(*it) + (size_t)len);
    if (it == NULL) {
      rc = MN_ENOMEM;
      break;
    }
    it->session = session;
    it->relay = c->relay;
    it->len = (size_t)len;
    memcpy(it->data, body, (size_t)len);
    batch_add(q, it);
  }
  mn_buf_consume(in, off);
  return rc;
}

/* The relay's frames held for want of a session, once the controller's SESSION has come. */
static void run_held_relay(proc_t *p, batch_t *q) {
  io_t *io = &p->io;
  if (io->relay != NULL && io->relay->held && current_session(p) != 0 &&
      parse_frames(p, io->relay, &io->relay_session, q) < 0)
    drop_conn(p, &io->relay);
}

/*
 * Reads what the current connection has, its CALLs into q. Returns 0, or a negative code
 * when it is finished: MN_ECLOSED, -errno from recv, MN_ENOMEM or parse_frames's.
 */
static int read_conn(proc_t *p, conn_t *c, int *has_session, batch_t *q) {
  mn_buf_t *in = &c->in;
  if (mn_buf_reserve(in, 256 * 1024) != 0) return MN_ENOMEM;
  ssize_t r = recv(c->fd, in->data + in->len, in->cap - in->len, MSG_DONTWAIT);
  if (r == 0) return MN_ECLOSED;
  if (r < 0) {
    int e = errno;
    return e == EINTR || e == EAGAIN ? 0 : -e;
  }
  in->len += (size_t)r;
  return parse_frames(p, c, has_session, q);
}

/* Every status_ms (MONARCH_STATUS_MS, a second by default), tells the agent
 * "S queued executed running" over the port pipe: for `monarch-run --status`,
 * and the sign of life by which the agent tells a hung proc (its I/O thread
 * writes it); skipped if the pipe is full. */
static void report_status(proc_t *p, int64_t *next) {
  int64_t now = mn_now_ns();
  if (p->status_fd < 0 || now < *next) return;
  *next = now + p->status_ms * 1000000;
  const char *running = p->exec.running; /* a kernel's static name, or NULL */
  char line[160];
  unsigned long long done = atomic_load(&p->executed), got = atomic_load(&p->received);
  int n = snprintf(line, sizeof(line), "S %llu %llu %.100s\n", got > done ? got - done : 0, done,
                   running ? running : "-");
  if (write(p->status_fd, line, (size_t)n) < 0 && errno != EAGAIN) {
    close(p->status_fd); /* the agent stopped listening: stop telling it */
    p->status_fd = -1;
  }
}

static conn_t *open_relay(proc_t *p, int fd) {
  if (fd < 0) return NULL;
  conn_t *r = calloc(1, sizeof(*r));
  if (r == NULL || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
    free(r);
    close(fd);
    return NULL;
  }
  r->p = p;
  r->fd = fd;
  r->relay = 1;
  p->relay_fd = fd;
  return r;
}

/* Adds fd to the connection's epoll set under `tag`; 0 or -errno. */
static int io_watch(proc_t *p, int fd, io_fd_t tag) {
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = tag};
  return epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : -errno;
}

/* A new connection on the listening socket: its handshake runs on a thread of its own. */
static void accept_conn(proc_t *p) {
  int fd = accept4(p->io.lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) {
    mn_sock_nodelay(fd);
    start_handshake(p, fd);
  }
}

/* A newly authenticated controller (from a handshake thread) replaces the current one. */
static void take_conn(proc_t *p, batch_t *q) {
  io_t *io = &p->io;
  conn_t *c;
  if (read(p->hs_pipe[0], &c, sizeof(c)) != (ssize_t)sizeof(c)) return;
  drop_conn(p, &io->cur);
  io->cur = c;
  io->has_session = 0;
  io->last_rx = mn_now_ns();
  atomic_store(&p->cancel, 0);
  if (io_watch(p, c->fd, IO_CONN) != 0) {
    drop_conn(p, &io->cur); /* out of memory for the set: the controller reconnects */
    return;
  }
  /* Frames that arrived right behind AUTH. */
  if (c->in.len > 0 && parse_frames(p, c, &io->has_session, q) < 0) drop_conn(p, &io->cur);
}

/*
 * One round of the connection's holder: the status line, the orphan clock,
 * one poll (yielding the core for spin_ns first, so the next frame finds it
 * awake) of at most wait_ns, then what arrived, its CALLs into q for the
 * caller to run or queue. Returns 1 when the proc should leave (orphaned,
 * or poll failed), else 0.
 */
int mn__proc_io_step(proc_t *p, batch_t *q, int64_t wait_ns) {
  io_t *io = &p->io;
  report_status(p, &io->next_status);
  /* The orphan clock runs only without a controller: while one is connected, a
   * quiet one is only busy; if it vanishes, its agent ends the session (silence, grace).
   * The agent's relay carrying a session counts too: a proc of a large mesh is reached
   * through it alone while the controller has closed its idle link (ctl_pool.c). */
  if ((io->cur != NULL && io->has_session) || (io->relay != NULL && current_session(p) != 0))
    io->last_rx = mn_now_ns();
  int64_t left = io->last_rx + io->orphan_ns - mn_now_ns();
  if (left <= 0 && !mn__proc_persistent()) return 1; /* orphaned: no controller for orphan_timeout */
  if (left <= 0) {
    io->last_rx = mn_now_ns(); /* persistent: keep waiting for a controller to attach */
    return 0;
  }
  if (left > io->slice_ns) left = io->slice_ns;
  if (left > wait_ns) left = wait_ns > 0 ? wait_ns : 0;
  struct epoll_event ev[IO_NFDS];
  uint32_t got[IO_NFDS] = {0};
  int r = 0;
  for (int64_t until = mn_now_ns() + p->spin_ns; r == 0 && mn_now_ns() < until; sched_yield())
    r = epoll_wait(p->ep, ev, IO_NFDS, 0);
  if (r == 0) r = epoll_wait(p->ep, ev, IO_NFDS, (int)(left / 1000000) + 1);
  if (r < 0 && errno != EINTR) return 1;
  for (int i = 0; i < r; i++) got[ev[i].data.u32] = ev[i].events;
  if (got[IO_LISTEN] & EPOLLIN) accept_conn(p);
  if (got[IO_HANDSHAKE] & EPOLLIN) take_conn(p, q);
  if (io->cur != NULL && (got[IO_CONN] & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
    io->last_rx = mn_now_ns();
    if (read_conn(p, io->cur, &io->has_session, q) < 0) drop_conn(p, &io->cur);
  }
  if (io->relay != NULL && (got[IO_RELAY] & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
      read_conn(p, io->relay, &io->relay_session, q) < 0)
    drop_conn(p, &io->relay);
  run_held_relay(p, q);
  return 0; /* wake_fd only ends the poll: hand_on answers it */
}

/* ---- setting up ------------------------------------------------------------------ */

/* Status lines to the agent (MONARCH_STATUS_MS), on the port pipe it keeps reading. */
void mn__proc_status_init(proc_t *p, int port_fd) {
  const char *st = getenv("MONARCH_STATUS_MS");
  p->status_ms = st && atoi(st) > 0 ? atoi(st) : MN_STATUS_MS_DEFAULT;
  p->status_fd = -1;
  if (port_fd > 2) {
    p->status_fd = port_fd;
    if (fcntl(p->status_fd, F_SETFL, fcntl(p->status_fd, F_GETFL) | O_NONBLOCK) != 0) {
      close(p->status_fd);
      p->status_fd = -1;
    }
  }
}

/* The connection's state before the executor first holds it, and its epoll set. 0 or -errno. */
int mn__proc_io_init(proc_t *p, int lfd, double orphan_timeout, int relay_fd) {
  io_t *io = &p->io;
  int rc;
  if ((p->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) return -errno;
  if ((rc = io_watch(p, lfd, IO_LISTEN)) != 0 || (rc = io_watch(p, p->hs_pipe[0], IO_HANDSHAKE)) != 0 ||
      (rc = io_watch(p, p->wake_fd, IO_WAKE)) != 0)
    return rc;
  io->lfd = lfd;
  io->relay = open_relay(p, relay_fd);
  if (io->relay != NULL && io_watch(p, relay_fd, IO_RELAY) != 0) drop_conn(p, &io->relay); /* casts come directly */
  io->relay_session = 1;
  io->last_rx = mn_now_ns();
  /* 0 means never: procs of the local agent die with it (PDEATHSIG) instead,
   * so a controller that computes for a while does not lose them. */
  io->orphan_ns = orphan_timeout > 0 ? (int64_t)(orphan_timeout * 1e9) : INT64_MAX / 4;
  io->slice_ns = p->status_ms * 1000000;
  p->io_on_exec = 1;
  return 0;
}

