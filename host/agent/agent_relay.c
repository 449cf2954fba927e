/*
 * agent_relay.c - casts: one CAST frame from the controller becomes a CALL
 * on each named proc's relay (a socketpair made at spawn), and their
 * RESULTs go back batched in RESULTS frames. The controller then writes
 * and reads one frame per host instead of one per proc. Results wait for
 * their siblings at most MN_RELAY_FLUSH_MS; the last one of a burst sends
 * the batch at once. Results for a controller that is away are dropped:
 * when it comes back it resends those calls directly, and the procs answer
 * them from their replay caches, so nothing runs twice.
 */
#include "agent_int.h"

/* A cast's shared bytes: the CALL after its seq, written to every target. */
typedef struct {
  int refs;
  size_t len;
  char data[];
} rest_t;

typedef struct {
  uv_write_t req;
  rest_t *rest;
  char head[MN_MSG_CALL_HEAD];
} cast_write_t;

/* What each_target does for one proc named in a list: entry is its part of the list, its pid first. */
typedef void (*target_fn)(aproc_t *p, const msgpack_object *entry, void *arg);

static void flush_session(asession_t *s);

static void rest_unref(rest_t *r) {
  if (--r->refs == 0) free(r);
}

static void on_cast_written(uv_write_t *w, int status) {
  cast_write_t *cw = w->data;
  (void)status; /* a broken relay shows up as a read error; the controller resends directly */
  rest_unref(cw->rest);
  free(cw);
}

static void relay_write(aproc_t *p, const msgpack_object *e, void *arg) {
  rest_t *rest = arg;
  cast_write_t *cw = malloc(sizeof(*cw));
  if (cw == NULL) return; /* the call is lost here; the controller's timeout or a reconnect resends it */
  p->tag = e[2].via.u64;
  cw->req.data = cw;
  cw->rest = rest;
  rest->refs++;
  mn_msg_call_from_cast(cw->head, e[1].via.u64, rest->len);
  uv_buf_t b[2] = {uv_buf_init(cw->head, MN_MSG_CALL_HEAD), uv_buf_init(rest->data, (unsigned)rest->len)};
  if (uv_write(&cw->req, (uv_stream_t *)&p->relay, b, 2, on_cast_written) != 0) {
    rest_unref(rest);
    free(cw);
    return;
  }
  p->relayed++;
  p->owner->relayed++;
}

/*
 * Calls fn for each entry of t, a flat list of uints (`width` per proc, its
 * pid first), that names a live proc of s with its relay open. A pid that
 * is not one is skipped: it died, and the controller hears so.
 */
static void each_target(asession_t *s, const msgpack_object *t, uint32_t width, target_fn fn, void *arg) {
  const msgpack_object *v = t->via.array.ptr;
  if (s->a->pids.count == 0) return; /* a simulated agent's targets are all virtual: not even a probe each */
  for (uint32_t i = 0; i + width <= t->via.array.size; i += width) {
    uint64_t pid = v[i].via.u64;
    aproc_t *p = pid <= INT64_MAX ? mn__agent_pids_find(s->a, (int64_t)pid) : NULL;
    if (p != NULL && p->owner == s && p->relay_open) fn(p, &v[i], arg);
  }
}

void mn__agent_handle_cast(aconn_t *c, const msgpack_object *m) {
  char err[300];
  const msgpack_object *t;
  const char *rest;
  size_t rlen;
  if (mn_msg_parse_cast(m, &t, &rest, &rlen, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  const msgpack_object *subs;
  if (mn_msg_parse_cast_subs(m, &subs, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  asession_t *s = c->relay_of != NULL ? c->relay_of : c->session;
  if (s->up != c && s->nbatch > 0) flush_session(s); /* what was gathered goes back the way its casts came */
  s->up = c;
  s->relayed += mn__agent_tree_forward(s, subs, rest, rlen);
  rest_t *r = malloc(sizeof(*r) + rlen);
  if (r == NULL) return; /* as for a lost write: resent after a reconnect, or the call times out */
  r->refs = 1;
  r->len = rlen;
  memcpy(r->data, rest, rlen);
  each_target(s, t, 3, relay_write, r);
  if (c->a->sim != NULL) mn__agent_sim_cast(s, t, r->data, r->len); /* virtual procs answer here */
  rest_unref(r);
}

static void ack_write(aproc_t *p, const msgpack_object *e, void *arg) {
  (void)arg;
  uv_write_t *w = malloc(sizeof(*w) + 16);
  if (w == NULL) return; /* the proc keeps its replay cache until the next ACK */
  mn_buf_t b = {(char *)(w + 1), 0, 16}; /* an ACK is at most 14 bytes: the buffer never grows */
  if (mn_msg_pack_ack(&b, e[1].via.u64) != 0) {
    free(w);
    return;
  }
  w->data = NULL; /* mn__agent_on_write frees w->data and w: the bytes live inside w */
  uv_buf_t ub = uv_buf_init(b.data, (unsigned)b.len);
  if (uv_write(w, (uv_stream_t *)&p->relay, &ub, 1, mn__agent_on_write) != 0) free(w);
}

void mn__agent_handle_acks(aconn_t *c, const msgpack_object *m) {
  char err[300];
  const msgpack_object *t, *subs;
  if (mn_msg_parse_acks(m, &t, err, sizeof(err)) != 0 || mn_msg_parse_acks_subs(m, &subs, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  asession_t *s = c->relay_of != NULL ? c->relay_of : c->session;
  if (subs != NULL) mn__agent_tree_forward_acks(s, subs);
  each_target(s, t, 2, ack_write, NULL);
}

/* ---- results ------------------------------------------------------------------- */

/* Sends the session's batch (handing its buffer to the write), if it has one and its controller is here. */
static void flush_session(asession_t *s) {
  if (s->nbatch == 0) return;
  mn_msg_results_end(&s->batch, s->nbatch);
  s->nbatch = 0;
  aconn_t *to = s->up != NULL && !s->up->closing ? s->up : s->conn;
  uv_write_t *w = to != NULL && !to->closing ? malloc(sizeof(*w)) : NULL;
  if (w == NULL) {
    s->batch.len = 0;
    return;
  }
  w->data = s->batch.data;
  uv_buf_t b = uv_buf_init(s->batch.data, (unsigned)s->batch.len);
  mn_buf_init(&s->batch);
  if (uv_write(w, (uv_stream_t *)&to->tcp, &b, 1, mn__agent_on_write) != 0) mn__agent_on_write(w, -1);
}

void mn__agent_relay_flush(asession_t *s) { flush_session(s); }

static void on_relay_timer(uv_timer_t *t) {
  agent_t *a = t->data;
  for (asession_t *s = a->sessions; s; s = s->next) flush_session(s);
}

/* Sends s's batch when nothing more is awaited or it is large; else within MN_RELAY_FLUSH_MS. */
void mn__agent_relay_push(asession_t *s) {
  agent_t *a = s->a;
  if (a->relay_timer.data == NULL) { /* made on first use: an agent that never relays has none */
    uv_timer_init(a->loop, &a->relay_timer);
    a->relay_timer.data = a;
    uv_unref((uv_handle_t *)&a->relay_timer);
  }
  if (s->relayed == 0 || s->batch.len >= MN_RELAY_BATCH) {
    flush_session(s);
  } else if (!uv_is_active((uv_handle_t *)&a->relay_timer)) {
    uv_timer_start(&a->relay_timer, on_relay_timer, MN_RELAY_FLUSH_MS, 0);
  }
}

void mn__agent_relay_take_batch(asession_t *s, const char *entries, size_t len, uint32_t n) {
  s->relayed -= (int64_t)n < s->relayed ? (int64_t)n : s->relayed;
  if (s->nbatch == 0 && mn_msg_results_begin(&s->batch) != 0) return;
  if (mn_buf_append(&s->batch, entries, len) != 0) return;
  s->nbatch += n;
  mn__agent_relay_push(s);
}

void mn__agent_relay_answer(asession_t *s, uint64_t tag, const char *body, size_t len) {
  if (s->nbatch == 0 && mn_msg_results_begin(&s->batch) != 0) return;
  if (mn_msg_results_add(&s->batch, tag, body, len) == 0) s->nbatch++;
  if (s->batch.len >= MN_RELAY_BATCH) flush_session(s);
}


static void take_result(aproc_t *p, const char *body, size_t len) {
  asession_t *s = p->owner;
  if (p->relayed > 0) p->relayed--;
  if (s == NULL) return; /* killed or parked: its session is gone */
  if (s->relayed > 0) s->relayed--;
  mn__agent_relay_answer(s, p->tag, body, len);
  mn__agent_relay_push(s);
}

static void relay_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  aproc_t *p = h->data;
  (void)hint;
  if (mn_buf_reserve(&p->rin, 64 * 1024) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(p->rin.data + p->rin.len, (unsigned)(p->rin.cap - p->rin.len));
}

static void relay_closed(uv_handle_t *h) {
  aproc_t *p = h->data;
  mn_buf_free(&p->rin);
  mn__agent_proc_handle_closed(h);
}

/* The relay broke while its proc lives (it wrote garbage, or closed its end): calls in flight
 * through it would never be answered, so the proc goes, and the controller hears of its death. */
static void relay_broke(aproc_t *p) {
  if (!uv_is_closing((uv_handle_t *)&p->proc)) uv_process_kill(&p->proc, SIGKILL);
  mn__agent_relay_proc_gone(p);
}

static void relay_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  aproc_t *p = st->data;
  (void)buf;
  if (n < 0) {
    relay_broke(p);
    return;
  }
  p->rin.len += (size_t)n;
  size_t off = 0;
  for (;;) {
    const char *body;
    int64_t len = mn_frame_peek(p->rin.data + off, p->rin.len - off, MN_MAX_FRAME, &body);
    if (len == MN_EAGAIN) break;
    if (len < 0) {
      relay_broke(p);
      return;
    }
    off += MN_FRAME_HEADER + (size_t)len;
    take_result(p, body, (size_t)len);
  }
  mn_buf_consume(&p->rin, off);
}

int mn__agent_relay_open(aproc_t *p, int fd) {
  agent_t *a = p->a;
  uv_pipe_init(a->loop, &p->relay, 0);
  p->relay.data = p;
  int rc = uv_pipe_open(&p->relay, fd);
  if (rc == 0) rc = uv_read_start((uv_stream_t *)&p->relay, relay_alloc, relay_read);
  p->relay_open = 1; /* closed by relay_proc_gone either way: it counts among the proc's handles */
  if (rc != 0) mn__agent_relay_proc_gone(p);
  return rc;
}

void mn__agent_relay_proc_gone(aproc_t *p) {
  if (!p->relay_open) return;
  p->relay_open = 0;
  if (p->owner != NULL) p->owner->relayed -= p->relayed < p->owner->relayed ? p->relayed : p->owner->relayed;
  p->relayed = 0;
  uv_close((uv_handle_t *)&p->relay, relay_closed);
}

void mn__agent_relay_session_gone(asession_t *s) { mn_buf_free(&s->batch); }

void mn__agent_relay_close(agent_t *a) {
  if (a->relay_timer.data != NULL) uv_close((uv_handle_t *)&a->relay_timer, NULL);
}
