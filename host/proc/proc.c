/*
 * proc.c - the proc process.
 *
 * Two threads plus short-lived handshake threads. One thread at a time holds
 * the connection: it accepts connections (each handshake runs on a thread of
 * its own so a slow or hostile peer never delays a PONG), splits the stream
 * of the current controller connection and the agent's relay into frames,
 * answers PING at once, handles SESSION, ACK and CANCEL, and writes status
 * lines to the agent. Calls run in order on the executor thread, which
 * writes their RESULTs straight to the socket, one write per burst.
 *
 * While it is idle the executor holds the connection itself and runs the
 * calls it reads at once: a call costs one wake-up, not two. So that a long
 * call never leaves the connection unread, each such run arms a timer; past
 * MN_INLINE_NS the I/O thread wakes and takes the connection over, queueing
 * what it reads for the executor, and hands it back once the executor has
 * run the queue dry and asks for it. Only the executor runs kernels (CUDA,
 * actors and collectives keep one thread), and it runs calls from the
 * connection only while the queue is empty, so their order holds.
 *
 * Sessions make calls exactly-once across reconnects: a controller opens
 * every connection with SESSION(id, acked). The same id resumes: sequence
 * numbers continue, and a resent CALL that already ran is answered from the
 * replay cache. A new id starts afresh. With no controller traffic for
 * --orphan-timeout seconds the proc exits, unless it belongs to a persistent
 * mesh (__persist): then it waits for the controller that attaches it next.
 */
#include "proc.h"

#include "actor.h"
#include "bulk.h"
#include "clock.h"
#include "coll_builtins.h"
#include "collective.h"
#include "exec.h"
#include "gpu.h"
#include "handshake.h"
#include "replay.h"
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define MN_RELAY_HELD_MAX (4u << 20) /* relay bytes kept unread while no SESSION has come */
#define MN_SPIN_NS_DEFAULT 0 /* the connection's holder yields before it sleeps; the agent sets MONARCH_SPIN_US, knowing how many procs share the host */
/* A call run by the executor may keep the connection unread this long before the I/O thread takes
 * it; past the scheduler's tick (4 ms at 250 Hz) its timer is never the CPU's next event, so arming and
 * disarming it reprograms no clock (2 us a call on a VM, 0.4 us this way). */
#define MN_INLINE_NS 5000000
#define MN_STATUS_MS_DEFAULT 1000 /* status lines to the agent; the agent sets MONARCH_STATUS_MS from its hang timeout */
#define MN_MAX_QUEUED (256u << 20) /* bytes of calls queued before the reader stops reading */
#define MN_MAX_HANDSHAKES 16       /* concurrent unauthenticated connections accepted */
#define MN_BIG_FRAME (256u << 10)  /* frames this large are received straight into their queue item */
#define MN_BIG_FRAME_TIMEOUT_MS 30000 /* a bulk frame must keep arriving at least this often */

typedef struct item_s {
  struct item_s *next;
  uint64_t session; /* session the call arrived on */
  int relay;        /* it came through the agent (a cast): its RESULT goes back that way */
  size_t len;
  char data[];
} item_t;

typedef struct proc_s proc_t;

typedef struct {
  proc_t *p;
  int fd;
  int relay;   /* the agent's relay: CALLs only, of the session being served */
  int held;    /* the relay: frames wait unread in `in` for the controller's SESSION (run_held_relay) */
  mn_buf_t in; /* bytes that arrived right behind AUTH */
} conn_t;

/* What each fd in the epoll set is: its event's tag. */
typedef enum { IO_LISTEN, IO_HANDSHAKE, IO_CONN, IO_RELAY, IO_WAKE, IO_NFDS } io_fd_t;

/* The connection's state: owned by the thread that holds it, handed over under proc_t's lock. */
typedef struct {
  int lfd;                /* the listening socket */
  conn_t *cur;            /* the current controller connection (NULL: none) */
  conn_t *relay;          /* the agent's relay (NULL: none) */
  int has_session;        /* cur has sent its SESSION */
  int relay_session;      /* the relay carries CALLs of the session served, no SESSION: always 1 */
  int64_t last_rx;        /* when a controller was last heard from (the orphan clock) */
  int64_t next_status;    /* when the next status line is due */
  int64_t orphan_ns;      /* --orphan-timeout; "never" is a far future */
  int64_t slice_ns;       /* longest sleep in poll: status lines keep their pace */
} io_t;

struct proc_s {
  pthread_mutex_t lock;     /* guards the queue and who holds the connection */
  pthread_cond_t cond;      /* signalled when items arrive or the connection comes back to the executor */
  pthread_cond_t space;     /* signalled when queued bytes drop */
  item_t *head, *tail;
  size_t queued_bytes;
  int io_on_exec;           /* the executor holds the connection (else the I/O thread does) */
  int want_io;              /* the executor's queue ran dry: it asks for the connection back */
  int64_t inline_since;     /* when the executor began running calls while holding the connection (0: it is not) */
  int timer_fd;             /* fires MN_INLINE_NS into such a run: the I/O thread's cue to take over */
  int wake_fd;              /* eventfd: wakes the I/O thread's poll when want_io is set */
  int ep;                   /* epoll set of the connection's fds (io_fd_t tags): none is re-armed per call */
  io_t io;
  pthread_mutex_t wlock;    /* guards fd, session, replay and every write */
  int fd;                   /* the controller connection, -1 when none */
  int relay_fd;             /* the agent's relay for casts (--relay-fd), -1 when none */
  uint64_t session;         /* the controller session now served (0: none yet) */
  mn_replay_t replay;       /* unacknowledged RESULTs of `session` */
  int replay_on;            /* MONARCH_NO_REPLAY=1 turns the cache off (for measuring it) */
  atomic_int cancel;
  mn_cancel_t cancels;      /* calls the controller asked to stop (CANCEL) */
  atomic_int handshakes;    /* handshake threads running */
  int hs_pipe[2];           /* handshake threads hand authenticated conns to the connection's holder */
  const mn_auth_t *auth;
  mn_exec_t exec;
  long spin_ns;
  int64_t swept_ns;         /* when the executor last dropped bulk maps the controller no longer holds (bulk.h) */
  atomic_ullong executed;   /* calls run, for the agent's status report */
  atomic_ullong received;   /* calls read; received - executed are in flight */
  int status_fd;            /* the port pipe, kept for status lines to the agent (-1: none) */
  int64_t status_ms;        /* interval of status lines (MONARCH_STATUS_MS) */
};

/* Frames split off one poll's reads, for the executor to run or the I/O thread to queue. */
typedef struct {
  item_t *first, *last;
  size_t bytes;
  int n;
} batch_t;

/* Writes bytes to `session`'s connection (or the relay), if that session is
 * the one being served. Caller holds wlock. */
static void write_locked(proc_t *p, uint64_t session, int relay, const char *data, size_t n) {
  int fd = relay ? p->relay_fd : p->fd;
  if (fd >= 0 && p->session == session && n > 0 && mn_write_all(fd, data, n) != 0) {
    /* The I/O thread sees the broken connection too and drops it. */
    shutdown(fd, SHUT_RDWR);
  }
}

static void send_bytes(proc_t *p, uint64_t session, const char *data, size_t n) {
  pthread_mutex_lock(&p->wlock);
  write_locked(p, session, 0, data, n);
  pthread_mutex_unlock(&p->wlock);
}

/* ---- executor --------------------------------------------------------------- */

/* Answers a resent CALL from the replay cache (or says its result is gone). */
static void replay_one(proc_t *p, uint64_t session, int relay, uint64_t seq) {
  size_t len;
  pthread_mutex_lock(&p->wlock);
  const char *f = p->session == session ? mn_replay_find(&p->replay, seq, &len) : NULL;
  if (f != NULL) {
    write_locked(p, session, relay, f, len);
  } else if (p->session == session && seq <= p->replay.evicted) {
    mn_buf_t b;
    char msg[160];
    msgpack_packer pk;
    mn_buf_init(&b);
    snprintf(msg, sizeof(msg), "result of call %llu was lost in a reconnect: the replay cache (%u MiB) overflowed",
             (unsigned long long)seq, MN_REPLAY_MAX_BYTES >> 20);
    size_t s = mn_msg_result_head(&b, &pk, seq, 0);
    mn_msg_pack_failure(&pk, "lost", msg, NULL, 0);
    mn_frame_end(&b, s);
    write_locked(p, session, relay, b.data, b.len);
    mn_buf_free(&b);
  }
  /* Otherwise it was acknowledged already: the controller has its result. */
  pthread_mutex_unlock(&p->wlock);
}

/*
 * Flushes the executor's batch: caches each result for replay, then writes
 * them all. A last result with a payload by reference (ref, rlen: tensor
 * bytes) is written straight from that memory and is too big to cache.
 */
static void flush_out(proc_t *p, uint64_t session, int relay, mn_buf_t *out, uint64_t *seqs, size_t *offs, int n,
                      const char *ref, size_t rlen) {
  pthread_mutex_lock(&p->wlock);
  if (p->replay_on && p->session == session) {
    for (int i = 0; i < n; i++) {
      size_t end = i + 1 < n ? offs[i + 1] : out->len;
      if (seqs[i] == 0) continue;
      if (rlen > 0 && i == n - 1) {
        if (seqs[i] > p->replay.evicted) p->replay.evicted = seqs[i];
        break;
      }
      if (mn_replay_add(&p->replay, seqs[i], out->data + offs[i], end - offs[i]) != 0) break;
    }
  }
  int fd = relay ? p->relay_fd : p->fd;
  if (rlen == 0) {
    write_locked(p, session, relay, out->data, out->len);
  } else if (fd >= 0 && p->session == session && mn_write2_all(fd, out->data, out->len, ref, rlen) != 0) {
    shutdown(fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&p->wlock);
  out->len = 0;
}

#define MN_BATCH 256 /* results written per flush at most */

/* What the executor keeps between calls: whose they are and where their results go. */
typedef struct {
  uint64_t session; /* session whose sequence numbers exec tracks */
  int relay;        /* where the batch's results go: the controller, or the agent's relay */
  uint64_t seqs[MN_BATCH];
  size_t offs[MN_BATCH];
  int nb;           /* results in exec.out not yet written */
} run_t;

/* Runs one call, leaving its result in the batch (a replayed one is written at once). Returns
 * mn_exec_frame's code, MN_EXEC_ALREADY_RAN taken care of (replayed) as MN_EXEC_DONE. */
static int run_one(proc_t *p, run_t *r, const item_t *it) {
  mn_exec_t *x = &p->exec;
  if (it->session != r->session) {
    /* A different controller session: drop what the old one left unflushed. */
    x->out.len = 0;
    r->nb = 0;
    mn_exec_new_session(x);
    r->session = it->session;
    x->session = it->session;
  }
  if (it->relay != r->relay) {
    /* Results go back the way their calls came: a batch holds one way's. */
    if (r->nb > 0) flush_out(p, r->session, r->relay, &x->out, r->seqs, r->offs, r->nb, NULL, 0);
    r->nb = 0;
    r->relay = it->relay;
  }
  pthread_mutex_lock(&p->wlock);
  int live = it->session == p->session;
  pthread_mutex_unlock(&p->wlock);
  if (!live) return 0;
  size_t before = x->out.len;
  int rc = mn_exec_frame(x, it->data, it->len);
  mn_cancel_end(&p->cancels);
  if (rc == MN_EXEC_ALREADY_RAN) {
    if (x->out.len > 0) flush_out(p, r->session, r->relay, &x->out, r->seqs, r->offs, r->nb, NULL, 0);
    r->nb = 0;
    replay_one(p, r->session, r->relay, x->dup_seq);
    return MN_EXEC_DONE;
  }
  if (x->out.len > before) {
    r->seqs[r->nb] = rc == MN_EXEC_DONE ? x->last_seq : 0; /* ERROR frames are not replayed */
    r->offs[r->nb] = before;
    r->nb++;
  }
  return rc;
}

/* Runs a chain of calls in order and frees them; their results are written by the time it returns. */
static void run_items(proc_t *p, run_t *r, item_t *it) {
  mn_exec_t *x = &p->exec;
  while (it != NULL) {
    item_t *next = it->next;
    int rc = run_one(p, r, it);
    free(it);
    atomic_fetch_add_explicit(&p->executed, 1, memory_order_relaxed);
    it = next;
    /* Flush when the burst is done, when the batch is full, before closing,
     * or at once behind a payload by reference (the next call may change it). */
    if (r->nb > 0 && (it == NULL || r->nb == MN_BATCH || x->out.len > (1u << 18) || rc < 0 || x->ref_len > 0)) {
      flush_out(p, r->session, r->relay, &x->out, r->seqs, r->offs, r->nb, x->ref_ptr, x->ref_len);
      x->ref_len = 0;
      r->nb = 0;
    }
    if (rc < 0) {
      /* A protocol error ends the controller's link (its ERROR went the relay's way if the call did). */
      pthread_mutex_lock(&p->wlock);
      if (p->fd >= 0 && p->session == r->session) shutdown(p->fd, SHUT_RDWR);
      pthread_mutex_unlock(&p->wlock);
    }
  }
}

/* ---- who holds the connection: the executor while idle, else the I/O thread ---- */

/* Sets the takeover timer to fire `ns` from now (0: disarms it). Only a bad fd or value fails: a bug. */
static void set_timer(proc_t *p, long ns) {
  struct itimerspec t = {{0, 0}, {0, ns}};
  if (timerfd_settime(p->timer_fd, 0, &t, NULL) != 0) abort();
}

/*
 * Executor: runs calls (first) while it holds the connection, with
 * the timer armed so that the I/O thread takes the connection over if they
 * keep it unread MN_INLINE_NS. Returns 1 if the executor still holds it, 0
 * if the I/O thread took it (then it queues what arrives meanwhile).
 */
static int run_held(proc_t *p, run_t *r, item_t *first) {
  pthread_mutex_lock(&p->lock);
  p->inline_since = mn_now_ns();
  pthread_mutex_unlock(&p->lock);
  set_timer(p, MN_INLINE_NS);
  run_items(p, r, first);
  pthread_mutex_lock(&p->lock);
  int held = p->io_on_exec;
  p->inline_since = 0;
  pthread_mutex_unlock(&p->lock);
  if (held) set_timer(p, 0); /* else it fired already: it is one-shot */
  return held;
}

static int run_inline(proc_t *p, run_t *r, batch_t *q) {
  atomic_fetch_add_explicit(&p->received, (unsigned long long)q->n, memory_order_relaxed);
  return run_held(p, r, q->first);
}

/*
 * Executor, while the I/O thread holds the connection: returns the calls it
 * queued, or NULL once the connection is back. The queue run dry, it asks
 * for the connection (want_io, and wake_fd to end the I/O thread's poll).
 */
static item_t *wait_work(proc_t *p, int *back) {
  pthread_mutex_lock(&p->lock);
  while (p->head == NULL && !p->io_on_exec) {
    if (!p->want_io) {
      uint64_t one = 1;
      p->want_io = 1;
      /* Fails only when the count would overflow: it is readable already. */
      if (write(p->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN) abort();
    }
    pthread_cond_wait(&p->cond, &p->lock);
  }
  item_t *all = p->head;
  *back = p->io_on_exec;
  p->head = p->tail = NULL;
  p->queued_bytes = 0;
  pthread_cond_signal(&p->space);
  pthread_mutex_unlock(&p->lock);
  return all;
}

/*
 * I/O thread: queues what it read for the executor and, if the executor
 * asked for the connection, hands it back. Returns 1 while the I/O thread
 * still holds the connection, 0 once it is the executor's.
 */
static int hand_on(proc_t *p, batch_t *q) {
  pthread_mutex_lock(&p->lock);
  if (q->first != NULL) {
    while (p->queued_bytes > MN_MAX_QUEUED) pthread_cond_wait(&p->space, &p->lock);
    atomic_fetch_add_explicit(&p->received, (unsigned long long)q->n, memory_order_relaxed);
    if (p->tail) p->tail->next = q->first;
    else p->head = q->first;
    p->tail = q->last;
    p->queued_bytes += q->bytes;
  }
  int back = p->want_io;
  if (back) {
    uint64_t n;
    p->want_io = 0;
    p->io_on_exec = 1;
    /* Clears the request's wake-up; EAGAIN: nothing to clear. */
    if (read(p->wake_fd, &n, sizeof(n)) < 0 && errno != EAGAIN) abort();
  }
  if (q->first != NULL || back) pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->lock);
  return !back;
}

/*
 * I/O thread: sleeps until the executor has spent MN_INLINE_NS in calls
 * while holding the connection, then takes it. Arming the timer resets its
 * count, so only an expiry of the run in progress ends the read; the check
 * under the lock catches a run that ended as the timer fired (or one that
 * has just begun in its place: its own expiry is still to come).
 */
static void wait_takeover(proc_t *p) {
  for (;;) {
    uint64_t ticks;
    if (read(p->timer_fd, &ticks, sizeof(ticks)) < 0 && errno != EINTR) abort();
    pthread_mutex_lock(&p->lock);
    int take = p->io_on_exec && p->inline_since != 0 && mn_now_ns() - p->inline_since >= MN_INLINE_NS / 2;
    if (take) p->io_on_exec = 0;
    pthread_mutex_unlock(&p->lock);
    if (take) return;
  }
}

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

/* ---- the I/O thread ------------------------------------------------------------ */

/* Answers a PING inline: body is [5, id]. 1 when it was a PING (answered), else 0; never fails. */
static int try_pong(proc_t *p, uint64_t session, const char *body, size_t len) {
  char frame[MN_MSG_PONG_MAX];
  size_t n = mn_msg_pong_from_ping(frame, body, len);
  if (n == 0) return 0;
  send_bytes(p, session, frame, n);
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

/* Takes up SESSION (sid, acked): the connection now serves that session. */
static void open_session(proc_t *p, conn_t *c, const mn_msg_session_t *s) {
  pthread_mutex_lock(&p->wlock);
  if (s->session != p->session) {
    /* A new controller session: forget the old one's results. */
    mn_replay_clear(&p->replay);
    p->session = s->session;
  }
  mn_replay_trim(&p->replay, s->acked);
  p->fd = c->fd;
  pthread_mutex_unlock(&p->wlock);
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
      open_session(p, c, &sess);
      *has_session = 1;
      rc = 0;
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
static int io_step(proc_t *p, batch_t *q, int64_t wait_ns) {
  io_t *io = &p->io;
  report_status(p, &io->next_status);
  /* The orphan clock runs only without a controller: while one is connected, a
   * quiet one is only busy; if it vanishes, its agent ends the session (silence, grace).
   * The agent's relay carrying a session counts too: a proc of a large mesh is reached
   * through it alone while the controller has closed its idle link (ctl_pool.c). */
  if ((io->cur != NULL && io->has_session) || (io->relay != NULL && current_session(p) != 0))
    io->last_rx = mn_now_ns();
  int64_t left = io->last_rx + io->orphan_ns - mn_now_ns();
  if (left <= 0 && !atomic_load(&persistent)) return 1; /* orphaned: no controller for orphan_timeout */
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

/* ---- the threads ---------------------------------------------------------------- */

/* Orphaned (or poll failed): stop running kernels and leave. Exiting without joining is
 * deliberate: a kernel that ignores cancellation must not keep us alive. */
static _Noreturn void leave(proc_t *p) {
  atomic_store(&p->cancel, 1);
  _exit(0);
}

/* How long the executor may sleep in poll before it is due to drop bulk maps the controller no longer holds. */
static int64_t sweep_due(proc_t *p) {
  if (mn_bulk_maps_held() == 0) return INT64_MAX;
  int64_t due = p->swept_ns + (int64_t)MN_BULK_SWEEP_MS * 1000000, now = mn_now_ns();
  if (now < due) return due - now;
  mn_bulk_sweep();
  p->swept_ns = mn_now_ns();
  return (int64_t)MN_BULK_SWEEP_MS * 1000000;
}

/* The executor: holds the connection and runs what it reads while idle; else runs the I/O thread's queue. */
static void *executor(void *arg) {
  proc_t *p = arg;
  run_t r;
  int holds_io = 1;
  memset(&r, 0, sizeof(r));
  for (;;) {
    if (!holds_io) {
      int back;
      item_t *all = wait_work(p, &back);
      /* Handed back along with calls queued at the same time: those run as read ones do, under the
       * takeover timer, or a long one would leave the connection unheard (no status lines: "hung"). */
      if (all != NULL && back) holds_io = run_held(p, &r, all);
      else if (all != NULL) run_items(p, &r, all);
      else holds_io = 1;
      continue;
    }
    batch_t q = {NULL, NULL, 0, 0};
    if (io_step(p, &q, sweep_due(p)) != 0) leave(p);
    if (q.first != NULL) holds_io = run_inline(p, &r, &q);
  }
  return NULL;
}

/* The I/O thread: takes the connection when a call keeps the executor from it, until the executor asks it back. */
static void io_thread(proc_t *p) {
  for (;;) {
    wait_takeover(p);
    for (int mine = 1; mine;) {
      batch_t q = {NULL, NULL, 0, 0};
      if (io_step(p, &q, INT64_MAX) != 0) leave(p);
      mine = hand_on(p, &q);
    }
  }
}

/* Status lines to the agent (MONARCH_STATUS_MS), on the port pipe it keeps reading. */
static void status_init(proc_t *p, int port_fd) {
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
static int io_init(proc_t *p, int lfd, double orphan_timeout, int relay_fd) {
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

  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_cond_init(&p->space, NULL);
  pthread_mutex_init(&p->wlock, NULL);
  p->fd = -1;
  p->relay_fd = -1;
  p->auth = &auth;
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
  if (mn_coll_start(o->bind_host, &auth, o->rank) != 0) return 2;
  if (mn_actor_register() != 0) return 2;
  if (mn_exec_register(&persist_module) != 0) return 2;
  if (mn_bulk_register() != 0) return 2;
  /* Blocking, for the I/O thread's read; arming resets it (wait_takeover). */
  if ((p->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC)) < 0) return 2;
  if ((p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) return 2;

  /* Report the port only once everything is ready to serve, and before the
   * first status line: the agent reads both on this pipe. */
  char line[32];
  int ln = snprintf(line, sizeof(line), "%d\n", port);
  if (mn_write_all(o->port_fd >= 0 ? o->port_fd : 1, line, (size_t)ln) != 0) return 2;
  status_init(p, o->port_fd);
  if (io_init(p, lfd, o->orphan_timeout, o->relay_fd) != 0) return 2;
  pthread_t th;
  if (pthread_create(&th, NULL, executor, p) != 0) return 2;
  io_thread(p);
  return 0; /* not reached: the proc leaves by leave() */
}
