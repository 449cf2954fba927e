/*
 * proc_handover.c - the proc's executor: it runs calls in order, writes
 * their RESULTs (one write per burst, each kept for replay), and hands the
 * connection to the I/O thread and back.
 *
 * While it is idle the executor holds the connection itself and runs the
 * calls it reads at once: a call costs one wake-up, not two. So that a long
 * call never leaves the connection unread, each such run arms a timer; past
 * MN_INLINE_NS the I/O thread wakes and takes the connection over, queueing
 * what it reads for the executor, and hands it back once the executor has
 * run the queue dry and asks for it. The executor runs calls from the
 * connection only while the queue is empty, so their order holds.
 */
#include "proc_int.h"

#include "bulk.h"
#include "clock.h"
#include "sock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* A call run by the executor may keep the connection unread this long before the I/O thread takes
 * it; past the scheduler's tick (4 ms at 250 Hz) its timer is never the CPU's next event, so arming and
 * disarming it reprograms no clock (2 us a call on a VM, 0.4 us this way). */
#define MN_INLINE_NS 5000000
#define MN_MAX_QUEUED (256u << 20) /* bytes of calls queued before the reader stops reading */

/* ---- writes ------------------------------------------------------------------- */

/* Writes bytes to `session`'s connection (or the relay), if that session is
 * the one being served. Caller holds wlock. */
static void write_locked(proc_t *p, uint64_t session, int relay, const char *data, size_t n) {
  int fd = relay ? p->relay_fd : p->fd;
  if (fd >= 0 && p->session == session && n > 0 && mn_write_all(fd, data, n) != 0) {
    /* The I/O thread sees the broken connection too and drops it. */
    shutdown(fd, SHUT_RDWR);
  }
}

void mn__proc_send_bytes(proc_t *p, uint64_t session, const char *data, size_t n) {
  pthread_mutex_lock(&p->wlock);
  write_locked(p, session, 0, data, n);
  pthread_mutex_unlock(&p->wlock);
}

/* ---- running calls -------------------------------------------------------------- */

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
void *mn__proc_executor(void *arg) {
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
    if (mn__proc_io_step(p, &q, sweep_due(p)) != 0) leave(p);
    if (q.first != NULL) holds_io = run_inline(p, &r, &q);
  }
  return NULL;
}

/* The I/O thread: takes the connection when a call keeps the executor from it, until the executor asks it back. */
_Noreturn void mn__proc_io_thread(proc_t *p) {
  for (;;) {
    wait_takeover(p);
    for (int mine = 1; mine;) {
      batch_t q = {NULL, NULL, 0, 0};
      if (mn__proc_io_step(p, &q, INT64_MAX) != 0) leave(p);
      mine = hand_on(p, &q);
    }
  }
}

