/* ctl.c - controller connections; see ctl.h. */
#include "ctl.h"
#include "ctl_int.h"

#include "clock.h"
#include "handshake.h"
#include "sock.h"

#include <netdb.h>
#include <sodium.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MN_READ_CHUNK (1024 * 1024) /* most bytes offered to one read */
#define MN_READ_FIRST 512           /* bytes offered to a link's first read: a small peer costs little memory */

/* ---- connections ----------------------------------------------------------------- */

int mn__ctl_push_event(mn_ctl_t *c, mn_ev_kind_t k, int conn, int64_t a, int64_t b) {
  if (c->nevents == c->evcap) {
    size_t cap = c->evcap ? c->evcap * 2 : 64;
    mn_event_t *e = realloc(c->events, cap * sizeof(*e));
    if (e == NULL) return MN_ENOMEM;
    c->events = e;
    c->evcap = cap;
  }
  c->events[c->nevents++] = (mn_event_t){k, conn, a, b};
  return 0;
}

void mn__ctl_set_text(char **dst, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  char *t = strdup(buf);
  if (t == NULL) return;
  free(*dst);
  *dst = t;
}

/* k's reason, "" before it has one. */
static const char *reason_of(const mn_conn_t *k) { return k->reason ? k->reason : ""; }

static void mark(int **list, int *n, int id) {
  if (*list == NULL) *list = calloc((size_t)MN_MAX_CONNS, sizeof(int));
  if (*list != NULL) (*list)[(*n)++] = id;
}


int mn_ctl_init(mn_ctl_t *c, const char *token, size_t toklen) {
  memset(c, 0, sizeof(*c));
  signal(SIGPIPE, SIG_IGN);
  if (mn_auth_init(&c->auth, token, toklen) != 0) return MN_EAUTH;
  if (uv_loop_init(&c->loop) != 0) return MN_ENOMEM;
  uv_timer_init(&c->loop, &c->timer);
  uv_timer_init(&c->loop, &c->heartbeat);
  c->heartbeat.data = c;
  c->hb_ms = MN_HEARTBEAT_MS;
  c->hb_timeout_ms = MN_HEARTBEAT_TIMEOUT_MS;
  c->reconnect_ms = MN_RECONNECT_MS;
  c->cast_min = MN_CAST_MIN_TARGETS;
  c->fanout = c->tree_k = MN_TREE_FANOUT;
  c->direct_max = MN_DIRECT_MAX;
  c->direct_idle_ms = MN_DIRECT_IDLE_MS;
  /* MONARCH_PROC_HEARTBEAT=1: PING every proc too, as before agents watched them (to measure the difference). */
  const char *phb = getenv("MONARCH_PROC_HEARTBEAT");
  c->proc_heartbeats = phb && strcmp(phb, "1") == 0;
  const char *noack = getenv("MONARCH_NO_ACK");
  c->no_acks = noack && strcmp(noack, "1") == 0;
  uv_timer_start(&c->heartbeat, mn__ctl_on_heartbeat, c->hb_ms, c->hb_ms);
  uv_unref((uv_handle_t *)&c->heartbeat);
  /* The first tick must see a stall too: a script that computes before it first waits is no peer's silence. */
  uv_update_time(&c->loop);
  c->last_tick = uv_now(&c->loop);
  c->conns = calloc(MN_MAX_CONNS, sizeof(*c->conns));
  return c->conns ? 0 : MN_ENOMEM;
}

/* An agent the tree vouches for hears nothing from us directly: the kernel's keepalive, at the heartbeat
 * timeout, sees its link die. */
static void keep_alive(mn_conn_t *k) {
  uv_os_fd_t fd;
  if (k->kind == MN_CONN_AGENT && k->link != NULL && uv_fileno((uv_handle_t *)&k->link->tcp, &fd) == 0)
    mn_sock_keepalive(fd, k->ctl->hb_timeout_ms);
}

void mn_ctl_configure(mn_ctl_t *c, uint64_t hb_ms, uint64_t hb_timeout_ms, uint64_t reconnect_ms) {
  if (hb_ms > 0) {
    c->hb_ms = hb_ms;
    uv_timer_start(&c->heartbeat, mn__ctl_on_heartbeat, hb_ms, hb_ms);
  }
  if (hb_timeout_ms > 0 && hb_timeout_ms != c->hb_timeout_ms) {
    c->hb_timeout_ms = hb_timeout_ms;
    /* The agents' keepalives and the tree's link timing follow the timeout (the next cast sends a new TREE). */
    for (int i = 0; i < c->nagent_ids; i++) keep_alive(c->conns[c->agent_ids[i]]);
    if (mn__ctl_tree_active(c)) c->tree_dirty = 1;
  }
  if (reconnect_ms > 0) c->reconnect_ms = reconnect_ms;
}

/* ---- links: one TCP attempt each ---------------------------------------------- */

static void link_closed(uv_handle_t *h) {
  mn_link_t *l = h->data;
  free(l);
}

/* Abandons the current attempt; its callbacks see l->k == NULL and do nothing. */
void mn__ctl_drop_link(mn_conn_t *k) {
  mn_link_t *l = k->link;
  if (l == NULL) return;
  k->link = NULL;
  l->k = NULL;
  if (!uv_is_closing((uv_handle_t *)&l->tcp)) uv_close((uv_handle_t *)&l->tcp, link_closed);
}

static void retry_closed(uv_handle_t *h) { free(h); }

static void stop_retry(mn_conn_t *k) {
  if (k->retry != NULL) {
    uv_close((uv_handle_t *)k->retry, retry_closed);
    k->retry = NULL;
  }
}

void mn_ctl_disconnect(mn_ctl_t *c, int id, const char *reason) {
  mn_conn_t *k = mn_ctl_conn(c, id);
  if (k == NULL || k->state == MN_CS_CLOSED) return;
  k->state = MN_CS_CLOSED;
  mn__ctl_set_text(&k->reason, "%s", reason);
  mn__ctl_drop_link(k);
  mn__ctl_pool_forget(c, k);
  stop_retry(k);
  k->out.len = 0;
  if (k->pl != NULL) mn_buf_free(&k->pl->waiting);
  mn_buf_free(&k->unacked);
  k->unacked_off = 0;
  /* Closing: every connection goes anyway, and a walk of them all per agent would cost agents x procs. */
  if (k->kind == MN_CONN_AGENT && !c->closing) mn__ctl_unrelay_agent(c, id);
  mn__ctl_push_event(c, MN_EV_CLOSED, id, 0, 0);
  if (k->kind == MN_CONN_AGENT && !c->closing) mn__ctl_relayed_lost(c, id); /* after the agent's event: the script hears of the host first */
}

static void free_conn(mn_conn_t *k) {
  for (size_t i = 0; i < k->rcount; i++) {
    mn_pending_t *p = &k->ring[(k->rhead + i) & (k->rcap - 1)];
    if (p->rest != NULL) mn__ctl_rest_unref(p->rest);
  }
  mn_buf_free(&k->in);
  mn_buf_free(&k->out);
  mn_buf_free(&k->unacked);
  if (k->pl != NULL) mn_buf_free(&k->pl->waiting);
  free(k->pl);
  if (k->ag != NULL) {
    mn_buf_free(&k->ag->cast);
    mn_buf_free(&k->ag->spawn);
  }
  free(k->ag);
  if (k->ring != k->ring0) free(k->ring);
  free(k->host);
  free(k->info_host);
  free(k->reason);
}

static void on_agent_closed(uv_handle_t *h) { (void)h; }

/* Tells agents we are leaving on purpose, so they stop our procs at once. */
static void say_goodbye(mn_ctl_t *c) {
  char f[16];
  mn_buf_t bye = {f, 0, sizeof(f)}; /* a GOODBYE is 6 bytes: the buffer never grows */
  if (mn_msg_pack_goodbye(&bye) != 0) return;
  for (int i = 1; i <= c->nconns; i++) {
    mn_conn_t *k = c->conns[i];
    if (k->kind != MN_CONN_AGENT || k->state != MN_CS_READY || k->link == NULL || k->link->writing > 0) continue;
    uv_buf_t b = uv_buf_init(bye.data, (unsigned)bye.len);
    if (uv_try_write((uv_stream_t *)&k->link->tcp, &b, 1) != (int)bye.len) continue; /* it will time out instead */
  }
}

void mn_ctl_close(mn_ctl_t *c) {
  c->closing = 1;
  mn_ctl_flush(c);
  say_goodbye(c);
  for (int i = 1; i <= c->nconns; i++) mn_ctl_disconnect(c, i, "controller closing");
  if (c->agent_running) {
    /* The agent was started with --once: our goodbye is enough, the signal is a backstop. */
    uv_process_kill(&c->agent, SIGTERM);
  }
  uv_close((uv_handle_t *)&c->timer, NULL);
  uv_close((uv_handle_t *)&c->heartbeat, NULL);
  if (!uv_is_closing((uv_handle_t *)&c->agent_pipe) && c->agent_pipe.type == UV_NAMED_PIPE)
    uv_close((uv_handle_t *)&c->agent_pipe, on_agent_closed);
  /* Let close callbacks and the agent's exit run, bounded. */
  for (int i = 0; i < 200 && uv_loop_alive(&c->loop); i++) {
    if (c->agent_running && i == 100) uv_process_kill(&c->agent, SIGKILL);
    uv_run(&c->loop, UV_RUN_NOWAIT);
    if (!uv_loop_alive(&c->loop)) break;
    usleep(10000);
  }
  if (c->agent.type == UV_PROCESS && !uv_is_closing((uv_handle_t *)&c->agent))
    uv_close((uv_handle_t *)&c->agent, NULL);
  uv_run(&c->loop, UV_RUN_NOWAIT);
  if (uv_loop_close(&c->loop) != 0) {
    /* Handles still open (a stuck agent): leave the loop; the process is exiting. */
  }
  for (int i = 1; i <= c->nconns; i++) free_conn(c->conns[i]);
  mn__ctl_slab_free(c);
  free(c->conns);
  free(c->dirty);
  free(c->readable);
  free(c->events);
  free(c->released);
  free(c->casting);
  mn_buf_free(&c->gathered);
  free(c->agent_ids);
  free(c->tree);
  free(c->touched);
  free(c->spawning);
  free(c->pool);
  free(c->pool_waitq);
}

/* ---- writing ------------------------------------------------------------------ */

void mn__ctl_set_dirty(mn_ctl_t *c, mn_conn_t *k) {
  if (!k->dirty) {
    k->dirty = 1;
    mark(&c->dirty, &c->ndirty, k->id);
  }
}

int mn__ctl_queue_out(mn_ctl_t *c, mn_conn_t *k, const char *frame, size_t n) {
  if (mn_buf_append(&k->out, frame, n) != 0) return MN_ENOMEM;
  mn__ctl_set_dirty(c, k);
  return 0;
}

/* Whether a frame is a PING, [PING, id] (a fixarray of 2 whose type is a fixint). */
static int is_ping(const char *frame, size_t n) {
  return n > MN_FRAME_HEADER + 1 && (uint8_t)frame[MN_FRAME_HEADER] == 0x92 && frame[MN_FRAME_HEADER + 1] == MN_MSG_PING;
}

int mn_ctl_send(mn_ctl_t *c, mn_conn_t *k, const char *frame, size_t n) {
  if (k->relay_only) return 0; /* no link to write to: only casts reach it, through its agent */
  int ping = k->lazy && is_ping(frame, n);
  if (ping) k->pl->owed_at = uv_now(&c->loop); /* its PONG comes on the link: it waits */
  if (k->lazy && !k->direct && k->state == MN_CS_READY) {
    /* A pooled proc's link is closed or opening: the frame waits for it (mn__ctl_pool_up). */
    k->pl->ping_waits |= ping;
    if (mn_buf_append(&k->pl->waiting, frame, n) != 0) return MN_ENOMEM;
    mn__ctl_pool_want(c, k, 1);
    return 0;
  }
  return mn__ctl_queue_out(c, k, frame, n);
}

int mn_ctl_cancel(mn_ctl_t *c, mn_conn_t *k, double call) {
  if (k->relay_only) return 0; /* CANCEL travels on a proc's own link, which it has not got: nothing was asked */
  size_t n = 0;
  for (size_t i = 0; i < k->rcount; i++) n += k->ring[(k->rhead + i) & (k->rcap - 1)].call == call;
  if (n == 0) return 0;
  uint64_t *seqs = malloc(n * sizeof(*seqs));
  if (seqs == NULL) return MN_ENOMEM;
  /* The ring holds the calls in flight in seq order, ending at k->seq. */
  uint64_t first = k->seq - k->rcount + 1;
  n = 0;
  for (size_t i = 0; i < k->rcount; i++)
    if (k->ring[(k->rhead + i) & (k->rcap - 1)].call == call) seqs[n++] = first + i;
  mn_buf_t b;
  mn_buf_init(&b);
  int rc = mn_msg_pack_cancel(&b, seqs, n);
  if (rc == 0) rc = mn_ctl_send(c, k, b.data, b.len);
  mn_buf_free(&b);
  free(seqs);
  return rc == 0 ? (int)n : rc;
}

int mn__ctl_push_pending(mn_conn_t *k, double call, int32_t slot, int relay, mn_cast_rest_t *rest) {
  if (k->rcount == k->rcap) {
    uint32_t cap = k->rcap * 4; /* a power of two (positions wrap with a mask) */
    mn_pending_t *r = malloc(cap * sizeof(*r));
    if (r == NULL) return MN_ENOMEM;
    for (uint32_t i = 0; i < k->rcount; i++) r[i] = k->ring[(k->rhead + i) & (k->rcap - 1)];
    if (k->ring != k->ring0) free(k->ring);
    k->ring = r;
    k->rcap = cap;
    k->rhead = 0;
  }
  if (rest != NULL) rest->refs++;
  k->ring[(k->rhead + k->rcount) & (k->rcap - 1)] = (mn_pending_t){call, slot, relay, rest};
  k->rcount++;
  return 0;
}

int mn__ctl_track(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot, int relay,
                  mn_cast_rest_t *rest) {
  if (rest == NULL) mn_msg_set_seq(frame, k->seq + 1);
  if (mn__ctl_push_pending(k, call, slot, relay, rest) != 0) return MN_ENOMEM;
  if (rest == NULL && !c->no_acks && mn_buf_append(&k->unacked, frame, n) != 0) return MN_ENOMEM;
  k->seq++;
  return 0;
}

int mn__ctl_call_direct(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot) {
  if (mn__ctl_track(c, k, frame, n, call, slot, 0, NULL) != 0) return MN_ENOMEM;
  /* While reconnecting, the copy in `unacked` goes out once the link is back. */
  if (k->state == MN_CS_READY && mn_ctl_send(c, k, frame, n) != 0) return MN_ENOMEM;
  return 0;
}

int mn_ctl_call(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot) {
  /* Behind calls in flight through the agent, the same way; a relay-only proc has no other way. */
  if (k->on_relay > 0 || mn__ctl_no_link(k)) return mn_ctl_cast_add(c, k, frame, n, call, slot, 0);
  if (k->lazy) mn__ctl_pool_want(c, k, 0); /* its link is up: this use keeps it */
  return mn__ctl_call_direct(c, k, frame, n, call, slot);
}

/* Records that the RESULT for `seq` arrived: drops its frame copy (a relayed call has none). */
static void acked(mn_conn_t *k, uint64_t seq, int copied) {
  k->acked = seq;
  if (copied && k->unacked.len - k->unacked_off >= MN_FRAME_HEADER) {
    /* Frames are in seq order and answered in order: the front one is seq.
     * Advance an offset; compact only when the dead prefix dominates, so a
     * deep pipeline costs O(1) per answer instead of a memmove. */
    k->unacked_off += MN_FRAME_HEADER + mn_be32(k->unacked.data + k->unacked_off);
    if (k->unacked_off == k->unacked.len) {
      k->unacked.len = k->unacked_off = 0;
    } else if (k->unacked_off > (1u << 16) && k->unacked_off * 2 > k->unacked.len) {
      mn_buf_consume(&k->unacked, k->unacked_off);
      k->unacked_off = 0;
    }
  }
}

static void flush_conn(mn_conn_t *k);

/* One uv_write: owns a copy of its bytes, or references a payload until done. */
typedef struct {
  uv_write_t req;
  mn_link_t *l;
  mn_ctl_t *c;
  char *own;        /* bytes this write owns (freed when done) */
  int ref;          /* payload reference to release, or -1 */
} mn_wreq_t;

int mn__ctl_room(int **ids, int *cap, int n) {
  if (n < *cap) return 0;
  int want = *cap ? 2 * *cap : 64, *p = realloc(*ids, (size_t)want * sizeof(int));
  if (p == NULL) return MN_ENOMEM;
  *ids = p;
  *cap = want;
  return 0;
}

static void release_ref(mn_ctl_t *c, int ref) {
  if (ref < 0) return;
  if (mn__ctl_room(&c->released, &c->released_cap, c->nreleased) != 0) return; /* the payload stays referenced: a leak, not a crash */
  c->released[c->nreleased++] = ref;
}

int mn_ctl_take_released(mn_ctl_t *c, int *refs, int max) {
  int n = c->nreleased < max ? c->nreleased : max;
  if (n == 0) return 0;
  memcpy(refs, c->released, (size_t)n * sizeof(int));
  memmove(c->released, c->released + n, (size_t)(c->nreleased - n) * sizeof(int));
  c->nreleased -= n;
  return n;
}

static void on_written(uv_write_t *w, int status) {
  mn_wreq_t *r = w->data;
  mn_link_t *l = r->l;
  l->writing--;
  release_ref(r->c, r->ref);
  free(r->own);
  free(r);
  mn_conn_t *k = l->k;
  if (k == NULL) return; /* an abandoned attempt */
  if (status != 0) {
    mn__ctl_conn_lost(k, uv_strerror(status));
    return;
  }
  if (k->out.len > 0) flush_conn(k);
}

/* Issues one uv_write of bufs; takes ownership of `own` and `ref`. */
static int start_write(mn_conn_t *k, uv_buf_t *bufs, unsigned nbufs, char *own, int ref) {
  mn_link_t *l = k->link;
  mn_wreq_t *r = malloc(sizeof(*r));
  if (r == NULL) {
    free(own);
    release_ref(k->ctl, ref);
    return UV_ENOMEM;
  }
  r->l = l;
  r->c = k->ctl;
  r->own = own;
  r->ref = ref;
  r->req.data = r;
  int rc = uv_write(&r->req, (uv_stream_t *)&l->tcp, bufs, nbufs, on_written);
  if (rc != 0) {
    release_ref(k->ctl, ref);
    free(own);
    free(r);
    return rc;
  }
  l->writing++;
  return 0;
}


static void flush_conn(mn_conn_t *k) {
  mn_link_t *l = k->link;
  mn_conn_state_t ph = *mn__ctl_phase(k);
  if (l == NULL || ph == MN_CS_CLOSED || ph == MN_CS_CONNECTING || ph == MN_CS_RECONNECTING) return;
  if (k->out.len == 0) return;
  uv_buf_t b = uv_buf_init(k->out.data, (unsigned)k->out.len);
  /* Try the syscall now only when nothing is queued ahead, to keep the order. */
  if (l->writing == 0) {
    int n = uv_try_write((uv_stream_t *)&l->tcp, &b, 1);
    if (n == (int)k->out.len) {
      k->out.len = 0;
      return;
    }
    if (n < 0 && n != UV_EAGAIN) {
      mn__ctl_conn_lost(k, uv_strerror(n));
      return;
    }
    if (n > 0) mn_buf_consume(&k->out, (size_t)n);
  }
  /* Hand the rest to libuv: the write takes the buffer, `out` starts afresh. */
  char *own = k->out.data;
  b = uv_buf_init(own, (unsigned)k->out.len);
  mn_buf_init(&k->out);
  int rc = start_write(k, &b, 1, own, -1);
  if (rc != 0) mn__ctl_conn_lost(k, uv_strerror(rc));
}

int mn_ctl_call_bulk(mn_ctl_t *c, mn_conn_t *k, char *head, size_t n, const char *payload, size_t plen, int ref,
                     double call, int32_t slot) {
  if (k->relay_only) { /* the payload would have to go through its agent, which takes only casts */
    release_ref(c, ref);
    return MN_EINVAL;
  }
  if (k->state != MN_CS_READY || k->link == NULL || (k->lazy && !k->direct)) {
    if (k->lazy && k->state == MN_CS_READY) mn__ctl_pool_want(c, k, 1); /* the caller waits for it (mn_ctl_pool_linked) */
    release_ref(c, ref);
    return MN_ECLOSED;
  }
  if (k->lazy) mn__ctl_pool_want(c, k, 0);
  if (k->on_relay > 0) { /* it would overtake calls still on their way through the agent */
    release_ref(c, ref);
    return MN_EAGAIN;
  }
  mn_msg_set_seq(head, k->seq + 1);
  if (mn__ctl_push_pending(k, call, slot, 0, NULL) != 0) {
    release_ref(c, ref);
    return MN_ENOMEM;
  }
  if (!c->no_acks) {
    /* What a reconnect resends in its place: a CALL that fails as "lost". */
    char lost[MN_MSG_LOST_LEN];
    size_t ln = mn_msg_lost_call(lost, k->seq + 1);
    if (mn_buf_append(&k->unacked, lost, ln) != 0) {
      release_ref(c, ref);
      return MN_ENOMEM;
    }
  }
  k->seq++;
  /* Everything queued before it goes first, then head + payload in one write. */
  flush_conn(k);
  if (k->link == NULL || (k->lazy && !k->direct)) { /* that write lost the link: its placeholder is resent */
    release_ref(c, ref);
    return 0;
  }
  char *own = malloc(n);
  if (own == NULL) {
    release_ref(c, ref);
    return MN_ENOMEM;
  }
  memcpy(own, head, n);
  uv_buf_t bufs[2] = {uv_buf_init(own, (unsigned)n), uv_buf_init((char *)payload, (unsigned)plen)};
  int rc = start_write(k, bufs, 2, own, ref);
  if (rc != 0) mn__ctl_conn_lost(k, uv_strerror(rc));
  return 0;
}

void mn_ctl_flush(mn_ctl_t *c) {
  for (int i = 0; i < c->ndirty; i++) {
    mn_conn_t *k = mn_ctl_conn(c, c->dirty[i]);
    if (k == NULL) continue;
    k->dirty = 0;
    if (k->state == MN_CS_READY) flush_conn(k);
  }
  c->ndirty = 0;
  if (c->nwaitq > c->waitq_at) mn__ctl_pool_serve(c);
}

/* ---- reconnecting -------------------------------------------------------------- */

static void on_retry(uv_timer_t *t) {
  mn_conn_t *k = t->data;
  stop_retry(k);
  if (k->state == MN_CS_RECONNECTING) mn__ctl_start_link(k);
}

/* Schedules the next attempt, or gives up once the window is spent. */
void mn__ctl_schedule_retry(mn_conn_t *k, const char *why) {
  mn_ctl_t *c = k->ctl;
  uint64_t now = uv_now(&c->loop);
  if (c->closing || now - k->lost_at >= k->reconnect_ms) {
    char msg[700];
    snprintf(msg, sizeof(msg), "%.256s; reconnecting failed for %.1f s (last: %.300s)", reason_of(k),
             (double)(now - k->lost_at) / 1e3, why);
    k->state = MN_CS_RECONNECTING; /* disconnect closes it */
    mn_ctl_disconnect(c, k->id, msg);
    return;
  }
  uint64_t delay = MN_BACKOFF_MIN_MS << (k->attempt < 5 ? k->attempt : 5);
  if (delay > MN_BACKOFF_MAX_MS) delay = MN_BACKOFF_MAX_MS;
  k->attempt++;
  k->retry = malloc(sizeof(uv_timer_t));
  if (k->retry == NULL) return;
  uv_timer_init(&c->loop, k->retry);
  k->retry->data = k;
  uv_timer_start(k->retry, on_retry, delay, 0);
}

/* A ready connection broke (error, EOF or heartbeat silence). */
void mn__ctl_conn_lost(mn_conn_t *k, const char *why) {
  mn_ctl_t *c = k->ctl;
  if (k->state == MN_CS_CLOSED || k->state == MN_CS_RECONNECTING) return;
  if (k->lazy && k->state == MN_CS_READY) {
    mn__ctl_pool_lost(k, why); /* only its link: its agent reports the proc's death */
    return;
  }
  mn__ctl_drop_link(k);
  k->out.len = 0;
  if (!k->ever_ready || k->reconnect_ms == 0 || c->closing) {
    mn_ctl_disconnect(c, k->id, why); /* which takes its procs' calls off its relay */
    return;
  }
  if (k->state == MN_CS_READY) {
    k->state = MN_CS_RECONNECTING;
    uv_update_time(&c->loop); /* lost may be called from the script, between waits */
    k->lost_at = uv_now(&c->loop);
    k->attempt = 0;
    mn__ctl_set_text(&k->reason, "connection lost: %s", why);
    mn__ctl_push_event(c, MN_EV_RECONNECTING, k->id, 0, 0);
  }
  k->state = MN_CS_RECONNECTING;
  /* Once it is not ready: nothing is resent to it until it is back (mn__ctl_relayed_back). */
  if (k->kind == MN_CONN_AGENT) mn__ctl_unrelay_agent(c, k->id);
  mn__ctl_schedule_retry(k, why);
}

/* ---- reading and the handshake ------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  mn_link_t *l = h->data;
  mn_conn_t *k = l->k;
  (void)hint;
  if (k == NULL || mn_buf_reserve(&k->in, l->chunk) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  l->offered = k->in.cap - k->in.len;
  *buf = uv_buf_init(k->in.data + k->in.len, (unsigned)l->offered);
}

/* Opens the session on a freshly authenticated link: SESSION, then every unanswered CALL. */
static int open_session(mn_ctl_t *c, mn_conn_t *k) {
  char f[32];
  mn_buf_t b = {f, 0, sizeof(f)}; /* a SESSION is at most 23 bytes: the buffer never grows */
  int rc = mn_msg_pack_session(&b, k->session, k->acked);
  /* Whatever was queued for the old link is superseded by this order. */
  k->out.len = 0;
  mn__ctl_unrelay(k); /* everything unanswered goes this way now */
  if (rc == 0) rc = mn__ctl_queue_out(c, k, b.data, b.len);
  if (rc == 0) rc = mn__ctl_resend_unacked(c, k);
  return rc;
}

int mn__ctl_resend_unacked(mn_ctl_t *c, mn_conn_t *k) {
  if (k->unacked.len <= k->unacked_off) return 0;
  return mn__ctl_queue_out(c, k, k->unacked.data + k->unacked_off, k->unacked.len - k->unacked_off);
}

/* A checked WELCOME w on k's link: k is ready (or, a pooled proc's reopened link, that link is up), its
 * session opened. 0, MN_ENOMEM, or MN_EPEER with err (another process answers at k's address). */
static int welcomed(mn_ctl_t *c, mn_conn_t *k, const mn_msg_welcome_t *w, char *err, size_t errlen) {
  if (k->ever_ready && w->pid != k->info_pid) {
    /* The port was taken over by another process: ours is gone, and
     * resending its calls to a stranger would run them on the wrong proc. */
    snprintf(err, errlen, "the process behind %.200s:%d is gone (pid %lld answers there, not %lld)", k->host,
             k->port, (long long)w->pid, (long long)k->info_pid);
    return MN_EPEER;
  }
  if (w->host != NULL) mn__ctl_set_text(&k->info_host, "%.*s", (int)w->host_len, w->host);
  if (k->lazy && k->state == MN_CS_READY) return mn__ctl_pool_up(c, k); /* no event: the proc never left */
  k->info_pid = w->pid;
  int again = k->ever_ready;
  k->state = MN_CS_READY;
  if (k->kind == MN_CONN_AGENT) mn__ctl_tree_changed(c);
  k->peer_closed = 0;
  k->ever_ready = 1;
  k->attempt = 0;
  int rc = open_session(c, k);
  if (k->lazy) mn__ctl_pool_first_up(c, k); /* its spawn's link: it carried the SESSION */
  if (rc == 0 && again && k->kind == MN_CONN_AGENT) mn__ctl_relayed_back(c, k->id);
  mn__ctl_push_event(c, again ? MN_EV_RECONNECTED : MN_EV_CONNECTED, k->id, k->info_pid, 0);
  return rc;
}

/*
 * Runs handshake frames at the front of k->in; returns 0 to go on, or a
 * negative code once k is disconnected: MN_EFRAME, MN_ENOMEM, MN_EPEER (a
 * different process answers at k's address), or the handshake's code.
 */
static int handshake_step(mn_ctl_t *c, mn_conn_t *k) {
  uint8_t *ph = mn__ctl_phase(k);
  while (*ph == MN_CS_HELLO || *ph == MN_CS_WELCOME) {
    const char *body;
    char err[300];
    msgpack_zone zone;
    msgpack_object m;
    int64_t n = mn_frame_peek(k->in.data, k->in.len, 4096, &body);
    if (n == MN_EAGAIN) return 0;
    if (n < 0) {
      mn_ctl_disconnect(c, k->id, "peer sent an oversized handshake frame (not a monarch worker?)");
      return (int)n;
    }
    if (!msgpack_zone_init(&zone, 1024)) return MN_ENOMEM;
    int rc = mn_decode(body, (size_t)n, &zone, &m, err, sizeof(err));
    if (rc == 0 && *ph == MN_CS_HELLO) {
      mn_buf_t out;
      mn_buf_init(&out);
      rc = mn_hs_answer(&out, &c->auth, &m, k->link->ns, k->link->nc, err, sizeof(err));
      if (rc == 0 && (rc = mn__ctl_queue_out(c, k, out.data, out.len)) == 0) {
        *ph = MN_CS_WELCOME;
        flush_conn(k);
      }
      mn_buf_free(&out);
    } else if (rc == 0) {
      mn_msg_welcome_t w;
      rc = mn_hs_check_welcome(&c->auth, &m, k->link->ns, k->link->nc, err, sizeof(err));
      if (rc == 0) rc = mn_msg_parse_welcome(&m, &w, err, sizeof(err)); /* checked already: cannot fail */
      if (rc == 0 && (rc = welcomed(c, k, &w, err, sizeof(err))) == MN_EPEER) {
        msgpack_zone_destroy(&zone);
        mn_ctl_disconnect(c, k->id, err);
        return MN_EPEER;
      }
      if (rc == MN_ENOMEM) snprintf(err, sizeof(err), "out of memory opening the session");
    }
    msgpack_zone_destroy(&zone);
    mn_buf_consume(&k->in, MN_FRAME_HEADER + (size_t)n);
    if (rc != 0) {
      /* A refusal is final: a wrong token does not get better by retrying. */
      mn_ctl_disconnect(c, k->id, err);
      return rc;
    }
  }
  return 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  mn_link_t *l = s->data;
  mn_conn_t *k = l->k;
  (void)buf;
  if (k == NULL) return;
  mn_ctl_t *c = k->ctl;
  if (n < 0) {
    const char *why = n == UV_EOF ? "connection closed by peer" : uv_strerror((int)n);
    if (k->state == MN_CS_READY) {
      /* The peer's kernel ended it: its process is gone, or closed it (a silent link would time out). */
      k->peer_closed = n == UV_EOF || n == UV_ECONNRESET;
      mn__ctl_conn_lost(k, why);
    } else {
      mn__ctl_drop_link(k);
      if (k->state != MN_CS_CLOSED && k->ever_ready) mn__ctl_schedule_retry(k, why);
      else mn_ctl_disconnect(c, k->id, why);
    }
    if (!k->readable && k->in.len > 0) {
      k->readable = 1;
      mark(&c->readable, &c->nreadable, k->id);
    }
    return;
  }
  k->last_rx = uv_now(&c->loop);
  k->in.len += (size_t)n;
  if ((size_t)n == l->offered && l->chunk < MN_READ_CHUNK) l->chunk *= 2; /* a stream: read it in bigger pieces */
  if (*mn__ctl_phase(k) != MN_CS_READY && handshake_step(c, k) != 0) return;
  if (*mn__ctl_phase(k) == MN_CS_READY && k->in.len > 0 && !k->readable) {
    k->readable = 1;
    mark(&c->readable, &c->nreadable, k->id);
  }
}

/* An agent whose connection its host's kernel closed, and whose address then refuses connections,
 * is gone: its process died. Decided once refusals have gone on for MN_REFUSED_MS (a few attempts),
 * not after the whole reconnect window, so the script can go on without the host at once. A link that
 * went silent keeps the window even if refused: a local interface that is down answers that way too. */
static int agent_gone(mn_conn_t *k, int status) {
  uv_update_time(&k->ctl->loop);
  return k->kind == MN_CONN_AGENT && k->peer_closed && (status == UV_ECONNREFUSED || status == UV_ECONNRESET) &&
         uv_now(&k->ctl->loop) - k->lost_at >= MN_REFUSED_MS;
}

static void on_connect(uv_connect_t *req, int status) {
  mn_link_t *l = req->data;
  mn_conn_t *k = l->k;
  if (k == NULL || k->state == MN_CS_CLOSED) return;
  if (status != 0) {
    char msg[400];
    snprintf(msg, sizeof(msg), "cannot connect to %s:%d: %s", k->host, k->port, uv_strerror(status));
    if (k->ever_ready && agent_gone(k, status)) {
      char why[340];
      mn__ctl_drop_link(k);
      snprintf(why, sizeof(why), "%.256s, then refused: no host agent listens there any more", reason_of(k));
      mn_ctl_disconnect(k->ctl, k->id, why);
      return;
    }
    /* A proc's "refused" is retried within the window (a pooled proc's link goes back to the pool): a proc
     * that really died is reported by its agent. */
    mn__ctl_attempt_failed(k, msg);
    return;
  }
  uv_tcp_nodelay(&l->tcp, 1);
  keep_alive(k);
  *mn__ctl_phase(k) = MN_CS_HELLO;
  k->in.len = 0;
  k->in_off = 0;
  k->last_rx = uv_now(&k->ctl->loop);
  uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
}

void mn__ctl_start_link(mn_conn_t *k) {
  mn_ctl_t *c = k->ctl;
  struct addrinfo hints, *res = NULL;
  char service[16], msg[400];
  mn_link_t *l = calloc(1, sizeof(*l));
  if (l == NULL) {
    mn_ctl_disconnect(c, k->id, "out of memory");
    return;
  }
  l->k = k;
  l->tcp.data = l;
  l->req.data = l;
  l->chunk = MN_READ_FIRST;
  /* The loop's clock stands still while the script runs between waits: read
   * the time afresh, or a stale start ends the handshake at the next tick. */
  uv_update_time(&c->loop);
  l->started = uv_now(&c->loop);
  uv_tcp_init(&c->loop, &l->tcp);
  k->link = l;
  if (!k->ever_ready) k->state = MN_CS_CONNECTING;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  snprintf(service, sizeof(service), "%d", k->port);
  int rc = getaddrinfo(k->host, service, &hints, &res);
  if (rc != 0) {
    snprintf(msg, sizeof(msg), "cannot resolve %s: %s", k->host, gai_strerror(rc));
  } else {
    rc = uv_tcp_connect(&l->req, &l->tcp, res->ai_addr, on_connect);
    freeaddrinfo(res);
    if (rc == 0) return;
    snprintf(msg, sizeof(msg), "cannot connect to %s:%d: %s", k->host, k->port, uv_strerror(rc));
  }
  mn__ctl_attempt_failed(k, msg);
}

void mn__ctl_attempt_failed(mn_conn_t *k, const char *why) {
  if (k->lazy && k->state == MN_CS_READY) {
    mn__ctl_pool_lost(k, why); /* only its link: the proc stays ready, its agent reports a death */
    return;
  }
  mn__ctl_drop_link(k);
  if (k->ever_ready) mn__ctl_schedule_retry(k, why);
  else mn_ctl_disconnect(k->ctl, k->id, why);
}

/* An agent's own part, and room for it on the list of agents; 0 or MN_ENOMEM (nothing kept). */
static int add_agent_part(mn_ctl_t *c, mn_conn_t *k) {
  if (mn__ctl_room(&c->agent_ids, &c->agent_ids_cap, c->nagent_ids) != 0) return MN_ENOMEM;
  if ((k->ag = calloc(1, sizeof(*k->ag))) == NULL) return MN_ENOMEM;
  k->ag->tree_pos = -1;
  return 0;
}

int mn__ctl_new_conn(mn_ctl_t *c, mn_conn_kind_t kind, mn_conn_t **out) {
  if (c->nconns + 1 >= MN_MAX_CONNS) return MN_ELIMIT;
  mn_conn_t *k = mn__ctl_slab_conn(c);
  if (k == NULL) return MN_ENOMEM;
  k->ctl = c;
  k->kind = kind;
  k->ring = k->ring0;
  k->rcap = MN_RING_INLINE;
  if (kind == MN_CONN_AGENT && add_agent_part(c, k) != 0) return MN_ENOMEM; /* its slot stays unused */
  k->id = ++c->nconns;
  c->conns[k->id] = k;
  if (kind == MN_CONN_AGENT) c->agent_ids[c->nagent_ids++] = k->id;
  *out = k;
  return 0;
}

int mn__ctl_new_dialled(mn_ctl_t *c, const char *host, int port, mn_conn_kind_t kind, mn_conn_t **out) {
  char *h = strdup(host), *ih = strdup(host);
  mn_conn_t *k;
  int rc = h != NULL && ih != NULL ? mn__ctl_new_conn(c, kind, &k) : MN_ENOMEM;
  if (rc != 0) {
    free(h);
    free(ih);
    return rc;
  }
  k->host = h;
  k->info_host = ih;
  k->port = port;
  k->reconnect_ms = c->reconnect_ms;
  randombytes_buf(&k->session, sizeof(k->session));
  k->session |= 1; /* never 0: 0 means "no session" on the proc */
  *out = k;
  return 0;
}

int mn_ctl_connect(mn_ctl_t *c, const char *host, int port, mn_conn_kind_t kind) {
  mn_conn_t *k;
  int rc = mn__ctl_new_dialled(c, host, port, kind, &k);
  if (rc != 0) return rc;
  mn__ctl_start_link(k);
  return k->id;
}

/* ---- what a connection holds, for the Lua face ---------------------------------- */

static const char *const state_names[] = {"connecting", "handshake", "handshake", "ready", "reconnecting", "closed"};

int mn_ctl_info(mn_ctl_t *c, int id, mn_conn_info_t *out) {
  mn_conn_t *k = mn_ctl_conn(c, id);
  if (k == NULL) return MN_EPROTO;
  /* A relay-only proc goes by its agent's name. */
  const mn_conn_t *named = k->relay_only && mn_ctl_conn(c, k->via) ? mn_ctl_conn(c, k->via) : k;
  const char *host = named->info_host ? named->info_host : "";
  *out = (mn_conn_info_t){k->kind, k->state, state_names[k->state], host, k->info_pid, reason_of(k), k->rcount,
                          k->lazy ? k->direct : -1};
  return 0;
}

mn_conn_state_t mn_ctl_conn_state(const mn_conn_t *k) { return k->state; }

mn_conn_kind_t mn_ctl_conn_kind(const mn_conn_t *k) { return k->kind; }

size_t mn_ctl_inflight(const mn_conn_t *k) { return k->rcount; }

/* Takes the oldest pending entry; its shared bytes, if any, are let go (the copy returned has none). */
static mn_pending_t pop_pending(mn_conn_t *k) {
  mn_pending_t p = k->ring[k->rhead];
  k->rhead = (k->rhead + 1) & (k->rcap - 1);
  k->rcount--;
  if (p.relay && k->on_relay > 0) k->on_relay--;
  if (p.relay) mn__ctl_tree_answered(k->ctl, k);
  if (p.rest != NULL) mn__ctl_rest_unref(p.rest);
  return p;
}

int mn_ctl_take_result(mn_conn_t *k, uint64_t seq, mn_pending_t *out) {
  if (seq <= k->acked && k->via > 0) return 1; /* answered both ways after a resend: see ctl_cast.c */
  /* The oldest call in flight has seq k->seq - k->rcount + 1. */
  if (k->rcount == 0 || seq != k->seq - k->rcount + 1) return MN_EPROTO;
  *out = pop_pending(k);
  acked(k, seq, out->rest == NULL);
  out->rest = NULL;
  return 0;
}

int mn_ctl_take_pending(mn_conn_t *k, mn_pending_t *out) {
  if (k->rcount == 0) return 0;
  *out = pop_pending(k);
  out->rest = NULL;
  return 1;
}

int mn_ctl_oldest(const mn_conn_t *k, mn_pending_t *out) {
  if (k->rcount == 0) return MN_ENOTFOUND;
  *out = k->ring[k->rhead];
  out->rest = NULL;
  return 0;
}

/* Releases the bytes drained so far; moves a partial frame down only when the
 * dead prefix dominates, so bulk frames are not copied twice. */
static void compact_input(mn_conn_t *k) {
  size_t off = k->in_off;
  if (off >= k->in.len) {
    k->in.len = 0;
    k->in_off = 0;
  } else if (off > (1u << 20) && off * 2 > k->in.len) {
    mn_buf_consume(&k->in, off);
    k->in_off = 0;
  }
}

int64_t mn_ctl_read_frame(mn_ctl_t *c, mn_conn_t *k, const char **body) {
  int64_t len = k->in_off < k->in.len
                    ? mn_frame_peek(k->in.data + k->in_off, k->in.len - k->in_off, MN_MAX_FRAME, body)
                    : MN_EAGAIN;
  if (len == MN_EAGAIN) {
    compact_input(k);
    return MN_EAGAIN;
  }
  if (len < 0) {
    mn_ctl_refuse(c, k, "peer sent a frame larger than MN_MAX_FRAME");
    return MN_EFRAME;
  }
  k->in_off += MN_FRAME_HEADER + (size_t)len;
  return len;
}

void mn_ctl_refuse(mn_ctl_t *c, mn_conn_t *k, const char *reason) {
  mn_ctl_disconnect(c, k->id, reason);
  k->in.len = 0;
  k->in_off = 0;
}

int mn_ctl_take_readable(mn_ctl_t *c) {
  while (c->nreadable > 0) {
    /* Oldest first: the order in which the connections became readable. */
    int id = c->readable[c->readable_at++];
    if (c->readable_at == c->nreadable) c->nreadable = c->readable_at = 0;
    mn_conn_t *k = mn_ctl_conn(c, id);
    if (k == NULL) continue;
    k->readable = 0;
    return id;
  }
  return 0;
}

const mn_event_t *mn_ctl_events(mn_ctl_t *c, size_t *n) {
  *n = c->nevents;
  return c->events;
}

void mn_ctl_events_done(mn_ctl_t *c) { c->nevents = 0; }

const char *mn_ctl_event_name(mn_ev_kind_t kind) {
  switch (kind) {
  case MN_EV_CONNECTED: return "connected";
  case MN_EV_CLOSED: return "closed";
  case MN_EV_AGENT_EXIT: return "agent_exit";
  case MN_EV_RECONNECTING: return "reconnecting";
  case MN_EV_RECONNECTED: return "reconnected";
  }
  return "?";
}

int mn_ctl_agent_pid(const mn_ctl_t *c) { return c->agent.pid; }

/* ---- waiting ---------------------------------------------------------------------- */

int mn_ctl_has_work(const mn_ctl_t *c) { return c->nreadable > 0 || c->nevents > 0; }

void mn__ctl_on_timer(uv_timer_t *t) { (void)t; }

int mn_ctl_wait(mn_ctl_t *c, int timeout_ms) {
  mn_ctl_flush(c);
  if (mn_ctl_has_work(c) || timeout_ms == 0) {
    uv_run(&c->loop, UV_RUN_NOWAIT);
    mn_ctl_flush(c);
    return mn_ctl_has_work(c);
  }
  if (timeout_ms > 0) uv_timer_start(&c->timer, mn__ctl_on_timer, (uint64_t)timeout_ms, 0);
  uv_run(&c->loop, UV_RUN_ONCE);
  if (timeout_ms > 0) uv_timer_stop(&c->timer);
  mn_ctl_flush(c);
  return mn_ctl_has_work(c);
}
