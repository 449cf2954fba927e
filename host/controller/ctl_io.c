/*
 * ctl_io.c - the controller's bytes on the wire: each link's TCP attempt,
 * its reads (appended to the conn's input, never decoded here), its writes
 * (queued per conn, written in one syscall where possible), the handshake
 * that opens a session, and the loop's turn: before the loop sleeps, every
 * queued write goes out in one place (mn__ctl_before_sleep). The connection
 * table and each conn's lifecycle stay in ctl.c; what a change of one means
 * for casts, the tree, the pool and relay-only procs is the hub's
 * (ctl_route.c, mn__ctl_conn_changed).
 */
#include "ctl_int.h"

#include "handshake.h"
#include "sock.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_READ_CHUNK (1024 * 1024) /* most bytes offered to one read */
#define MN_READ_FIRST 512           /* bytes offered to a link's first read: a small peer costs little memory */

static void mark(int **list, int *n, int id) {
  if (*list == NULL) *list = calloc((size_t)MN_MAX_CONNS, sizeof(int));
  if (*list != NULL) (*list)[(*n)++] = id;
}

void mn__ctl_keep_alive(mn_conn_t *k) {
  uv_os_fd_t fd;
  if (k->kind == MN_CONN_AGENT && k->link != NULL && uv_fileno((uv_handle_t *)&k->link->tcp, &fd) == 0)
    mn_sock_keepalive(fd, k->ctl->hb_timeout_ms);
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

void mn__ctl_say_goodbye(mn_ctl_t *c) {
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
    /* A pooled proc's link is closed or opening: the frame waits for it (MN_CHANGE_LINK_UP sends it). */
    k->pl->ping_waits |= ping;
    if (mn_buf_append(&k->pl->waiting, frame, n) != 0) return MN_ENOMEM;
    mn__ctl_pool_want(c, k, 1);
    return 0;
  }
  return mn__ctl_queue_out(c, k, frame, n);
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

void mn__ctl_flush_now(mn_conn_t *k) {
  if (k->state == MN_CS_READY) flush_conn(k);
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
  if (k->ag != NULL) { /* what it runs and whether it takes shipped files (ctl_ship.c) */
    k->ag->elf_class = (int16_t)w->elf_class;
    k->ag->elf_machine = (int16_t)w->elf_machine;
    k->ag->ship = (int8_t)w->ship;
    snprintf(k->ag->cache_id, sizeof(k->ag->cache_id), "%.*s", (int)w->cache_len, w->cache != NULL ? w->cache : "");
  }
  /* A pooled proc's reopened link: no event, the proc never left. */
  if (k->lazy && k->state == MN_CS_READY) return mn__ctl_conn_changed(c, k, MN_CHANGE_LINK_UP);
  k->info_pid = w->pid;
  int again = k->ever_ready;
  k->state = MN_CS_READY;
  k->peer_closed = 0;
  k->ever_ready = 1;
  k->attempt = 0;
  int rc = open_session(c, k);
  /* A session that could not open is closed next (handshake_step): the modules hear of that instead. */
  if (rc == 0) rc = mn__ctl_conn_changed(c, k, again ? MN_CHANGE_BACK : MN_CHANGE_UP);
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
      snprintf(why, sizeof(why), "%.256s, then refused: no host agent listens there any more", mn__ctl_reason(k));
      mn_ctl_disconnect(k->ctl, k->id, why);
      return;
    }
    /* A proc's "refused" is retried within the window (a pooled proc's link goes back to the pool): a proc
     * that really died is reported by its agent. */
    mn__ctl_attempt_failed(k, msg);
    return;
  }
  uv_tcp_nodelay(&l->tcp, 1);
  mn__ctl_keep_alive(k);
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

/* ---- the loop's turn ------------------------------------------------------------- */

/*
 * Before the loop sleeps (Redis's beforeSleep): every conn marked dirty
 * writes what was queued for it (one uv_try_write each where it can), and
 * pooled procs waiting for a link get one as room frees. Queued frames
 * go out elsewhere only to keep an order (a handshake's AUTH, what a bulk
 * call's payload must follow, the rest once a uv_write is done). The loop
 * "sleeps" for the controller both while uv_run blocks and while the
 * script runs between waits: mn_ctl_wait runs this before each, and a
 * heartbeat tick at its end (the loop may block right after a timer).
 */
void mn__ctl_before_sleep(mn_ctl_t *c) {
  for (int i = 0; i < c->ndirty; i++) {
    mn_conn_t *k = mn_ctl_conn(c, c->dirty[i]);
    if (k == NULL) continue;
    k->dirty = 0;
    if (k->state == MN_CS_READY) flush_conn(k);
  }
  c->ndirty = 0;
  if (c->nwaitq > c->waitq_at) mn__ctl_pool_serve(c);
}

int mn_ctl_has_work(const mn_ctl_t *c) { return c->nreadable > 0 || c->nevents > 0; }

void mn__ctl_on_timer(uv_timer_t *t) { (void)t; }

int mn_ctl_wait(mn_ctl_t *c, int timeout_ms) {
  mn__ctl_before_sleep(c);
  if (mn_ctl_has_work(c) || timeout_ms == 0) {
    uv_run(&c->loop, UV_RUN_NOWAIT);
  } else {
    if (timeout_ms > 0) uv_timer_start(&c->timer, mn__ctl_on_timer, (uint64_t)timeout_ms, 0);
    uv_run(&c->loop, UV_RUN_ONCE);
    if (timeout_ms > 0) uv_timer_stop(&c->timer);
  }
  /* The script runs next, perhaps for long: what the loop's callbacks queued (a SESSION, resends) goes now. */
  mn__ctl_before_sleep(c);
  return mn_ctl_has_work(c);
}
