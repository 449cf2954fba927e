/*
 * coll_ring.c - the pipelined ring: two dependent streams (TCP, or direct
 * copies between procs on one host) driven by one poll loop.
 */
#include "coll_int.h"

/* ---- the ring: two dependent streams driven by one poll loop ----------------------------- */
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
  mn__coll_put_be64(m + 8, a);
  mn__coll_put_be64(m + 16, b);
}

/* Sends what is queued without blocking; 0 or a negative code. */
static int ctl_flush(int fd, ctl_t *c) {
  if (c->olen == 0) return 0;
  ssize_t w = mn__coll_try_io(fd, 1, (char *)c->out, c->olen);
  if (w < 0) return (int)w;
  memmove(c->out, c->out + w, c->olen - (size_t)w);
  c->olen -= (size_t)w;
  return 0;
}

/* Queues a control message; when the queue is full, waits for room. */
static int ctl_queue(mn_coll_t *co, int fd, ctl_t *c, int kind, int step, uint64_t a, uint64_t b) {
  if (c->olen + MN_COLL_CTL_LEN > sizeof(c->out)) {
    int rc = mn__coll_write_exact(fd, c->out, c->olen, mn_now_ms() + co->timeout_ms);
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
 * collective. Sets *moved when any came. Returns 0, or a negative code with
 * err: the link's, or MN_EPROTO for a message out of step.
 */
static int ctl_read(ring_state_t *s, int fd, ctl_t *c, int acks, int *moved, char *err, size_t errlen) {
  const ring_t *r = s->r;
  const char *who = acks ? r->next_who : r->prev_who;
  while (acks ? s->jc < r->nsend : s->ann_step < r->nrecv) {
    ssize_t got = mn__coll_try_io(fd, 0, (char *)c->in + c->ilen, MN_COLL_CTL_LEN - c->ilen);
    if (got < 0) return mn__coll_fail_io(err, errlen, r->what, who, 0, (int)got);
    if (got == 0) break;
    *moved = 1;
    c->ilen += (size_t)got;
    if (c->ilen < MN_COLL_CTL_LEN) continue;
    c->ilen = 0;
    const unsigned char *m = c->in;
    uint32_t kind = mn_be32((const char *)m), step = mn_be32((const char *)m + 4);
    uint64_t a = mn__coll_get_be64(m + 8), b = mn__coll_get_be64(m + 16);
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
    return MN_EPROTO;
  }
  return 0;
}

/*
 * Copies n bytes of the previous member's memory at addr into dst (same
 * host). 0, or with err: -errno from process_vm_readv, MN_EPEER when it read nothing.
 */
static int cma_read(const ring_t *r, char *dst, uint64_t addr, size_t n, char *err, size_t errlen) {
  while (n > 0) {
    struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)addr, n};
    ssize_t got = process_vm_readv(r->prev_pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : 0;
      if (e == EINTR) continue;
      snprintf(err, errlen, "%s: copying from %s failed: %s (it failed or died)", r->what, r->prev_who,
               e != 0 ? strerror(e) : "nothing read");
      return e != 0 ? -e : MN_EPEER;
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

/* Sends (tcp) or announces (same host) what is ready. Sets *moved; *want_out when the socket is full. 0 or a code. */
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
      if (rc != 0) return mn__coll_fail_io(err, errlen, r->what, r->next_who, 1, rc);
      s->sdone = ready;
    } else {
      ssize_t w = mn__coll_try_io(r->send_fd, 1, s->ps.buf + s->sdone, ready - s->sdone);
      if (w < 0) return mn__coll_fail_io(err, errlen, r->what, r->next_who, 1, (int)w);
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

/*
 * Receives (tcp) or copies (same host) what there is room for. Sets *moved;
 * *want_in when waiting for data. 0 or a negative code with err.
 */
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
      int rc = cma_read(r, s->pr.a != NULL ? s->tmp : s->pr.buf + s->rdone, from, n, err, errlen);
      if (rc != 0) return rc;
      if (s->pr.a != NULL) reduce_in(s, n);
      s->rdone += n;
      rc = ctl_queue(c, r->recv_fd, &s->cr, MN_COLL_CTL_ACK, s->jr, s->rdone, 0);
      if (rc != 0) return mn__coll_fail_io(err, errlen, r->what, r->prev_who, 1, rc);
    } else if (s->pr.a == NULL) {
      ssize_t got = mn__coll_try_io(r->recv_fd, 0, s->pr.buf + s->rdone, room - s->rdone);
      if (got < 0) return mn__coll_fail_io(err, errlen, r->what, r->prev_who, 0, (int)got);
      if (got == 0) {
        *want_in = 1;
        break;
      }
      s->rdone += (size_t)got;
    } else {
      /* Reduce whole elements as soon as they are in, so the next step's send can follow. */
      size_t want = room - s->rdone - s->fill;
      if (want > MN_COLL_CHUNK - s->fill) want = MN_COLL_CHUNK - s->fill;
      ssize_t got = mn__coll_try_io(r->recv_fd, 0, s->tmp + s->fill, want);
      if (got < 0) return mn__coll_fail_io(err, errlen, r->what, r->prev_who, 0, (int)got);
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
 * Returns 0, or a negative code with err (coll_int.h).
 */
int mn__coll_ring_run(mn_coll_t *c, ring_t *r, char *err, size_t errlen) {
  ring_state_t s;
  int rc = MN_ENOMEM;
  int64_t last = mn_now_ms();
  memset(&s, 0, sizeof(s));
  s.r = r;
  if (r->nrecv > 0 && c->tmp == NULL && (c->tmp = malloc(MN_COLL_CHUNK)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", r->what);
    return MN_ENOMEM;
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
    int moved = 0, want_out = 0, want_in = 0;
    if (r->send_cma && s.jc < r->nsend && (rc = ctl_read(&s, r->send_fd, &s.cs, 1, &moved, err, errlen)) != 0)
      goto done;
    if (r->recv_cma && s.jr < r->nrecv && (rc = ctl_read(&s, r->recv_fd, &s.cr, 0, &moved, err, errlen)) != 0)
      goto done;
    if ((rc = ring_send(c, &s, &moved, &want_out, err, errlen)) != 0 ||
        (rc = ring_recv(c, &s, &moved, &want_in, err, errlen)) != 0)
      goto done;
    size_t before = s.cs.olen + s.cr.olen;
    int f1 = ctl_flush(r->send_fd, &s.cs), f2 = ctl_flush(r->recv_fd, &s.cr);
    if (f1 != 0 || f2 != 0) {
      rc = mn__coll_fail_io(err, errlen, r->what, f1 != 0 ? r->next_who : r->prev_who, 1, f1 != 0 ? f1 : f2);
      goto done;
    }
    if (s.cs.olen + s.cr.olen < before) moved = 1;
    int send_done = s.js >= r->nsend && (!r->send_cma || s.jc >= r->nsend);
    if (send_done && s.jr >= r->nrecv && s.cs.olen == 0 && s.cr.olen == 0) break;
    int64_t now = mn_now_ms();
    if (moved) {
      last = now;
      continue;
    }
    int waiting_prev = s.jr < r->nrecv;
    if (now - last >= c->timeout_ms || mn__coll_cancelled(c)) {
      rc = mn__coll_fail_stall(c, err, errlen, r->what, waiting_prev ? r->prev_who : r->next_who, !waiting_prev);
      goto done;
    }
    struct pollfd pf[2] = {{.fd = r->send_fd}, {.fd = r->recv_fd}};
    if (want_out || s.cs.olen > 0) pf[0].events |= POLLOUT;
    if (r->send_cma && s.jc < r->nsend) pf[0].events |= POLLIN;
    if (want_in || (r->recv_cma && s.ann_step < r->nrecv)) pf[1].events |= POLLIN;
    if (s.cr.olen > 0) pf[1].events |= POLLOUT;
    if (pf[0].events == 0 && pf[1].events == 0) {
      snprintf(err, errlen, "%s: internal error: the ring stalled with nothing to wait for", r->what);
      rc = MN_EINVAL; /* a ring whose steps cannot all run: a bad plan */
      goto done;
    }
    int64_t wait = c->timeout_ms - (now - last);
    int pr = mn__coll_poll(c, pf, 2, (int)(wait < MN_COLL_POLL_SLICE_MS ? wait : MN_COLL_POLL_SLICE_MS));
    if (pr < 0 && pr != -EINTR) {
      snprintf(err, errlen, "poll failed during %s: %s", r->what, strerror(-pr));
      rc = pr;
      goto done;
    }
  }
  rc = 0;
done:
  free(s.ann_addr);
  free(s.ann_ready);
  return rc;
}
