/*
 * ctl.c - the controller's connection table (see ctl.h): conns made, found
 * and closed; each conn's lifecycle (ready, lost, reconnecting, closed),
 * told to the modules through the hub (ctl_route.c); the calls in flight
 * (seq numbers, the pending FIFO, unacked copies) and the answers taken
 * against them. The bytes on the wire are ctl_io.c's.
 */
#include "ctl.h"
#include "ctl_int.h"

#include <sodium.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

void mn_ctl_configure(mn_ctl_t *c, uint64_t hb_ms, uint64_t hb_timeout_ms, uint64_t reconnect_ms) {
  if (hb_ms > 0) {
    c->hb_ms = hb_ms;
    uv_timer_start(&c->heartbeat, mn__ctl_on_heartbeat, hb_ms, hb_ms);
  }
  if (hb_timeout_ms > 0 && hb_timeout_ms != c->hb_timeout_ms) {
    c->hb_timeout_ms = hb_timeout_ms;
    /* The agents' keepalives and the tree's link timing follow the timeout (the next cast sends a new TREE). */
    for (int i = 0; i < c->nagent_ids; i++) mn__ctl_keep_alive(c->conns[c->agent_ids[i]]);
    if (mn__ctl_tree_active(c)) c->tree_dirty = 1;
  }
  if (reconnect_ms > 0) c->reconnect_ms = reconnect_ms;
}

/* ---- closing ---------------------------------------------------------------------- */

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
  stop_retry(k);
  k->out.len = 0;
  if (k->pl != NULL) mn_buf_free(&k->pl->waiting);
  mn_buf_free(&k->unacked);
  k->unacked_off = 0;
  mn__ctl_push_event(c, MN_EV_CLOSED, id, 0, 0);
  /* After the event: a host's relay-only procs close with it, and the script hears of the host first. */
  (void)mn__ctl_conn_changed(c, k, MN_CHANGE_CLOSED); /* fails only for a link up */
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

void mn_ctl_close(mn_ctl_t *c) {
  c->closing = 1;
  mn__ctl_before_sleep(c);
  mn__ctl_say_goodbye(c);
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

/* ---- calls in flight ---------------------------------------------------------------- */

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
  return mn__ctl_send_call(c, k, frame, n, call, slot, MN_SEND_ONE); /* the hub routes it (ctl_route.c) */
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

int mn__ctl_room(int **ids, int *cap, int n) {
  if (n < *cap) return 0;
  int want = *cap ? 2 * *cap : 64, *p = realloc(*ids, (size_t)want * sizeof(int));
  if (p == NULL) return MN_ENOMEM;
  *ids = p;
  *cap = want;
  return 0;
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
    snprintf(msg, sizeof(msg), "%.256s; reconnecting failed for %.1f s (last: %.300s)", mn__ctl_reason(k),
             (double)(now - k->lost_at) / 1e3, why);
    k->state = MN_CS_RECONNECTING; /* disconnect closes it */
    mn_ctl_disconnect(c, k->id, msg);
    return;
  }
  /* Between attempts a conn is RECONNECTING whatever phase the failed one reached (a redial's handshake
   * set HELLO): on_retry redials only from there, and a conn left in HELLO with no link was never back
   * nor lost. */
  k->state = MN_CS_RECONNECTING;
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
    /* Only its link: its agent reports the proc's death. */
    (void)mn__ctl_conn_changed(c, k, MN_CHANGE_LINK_LOST); /* fails only for a link up */
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
  /* Once it is not ready: nothing is resent to it until it is back (MN_CHANGE_BACK). */
  (void)mn__ctl_conn_changed(c, k, MN_CHANGE_LOST); /* fails only for a link up */
  mn__ctl_schedule_retry(k, why);
}

void mn__ctl_attempt_failed(mn_conn_t *k, const char *why) {
  if (k->lazy && k->state == MN_CS_READY) {
    /* Only its link: the proc stays ready, its agent reports a death. */
    (void)mn__ctl_conn_changed(k->ctl, k, MN_CHANGE_LINK_LOST); /* fails only for a link up */
    return;
  }
  mn__ctl_drop_link(k);
  if (k->ever_ready) mn__ctl_schedule_retry(k, why);
  else mn_ctl_disconnect(k->ctl, k->id, why);
}

/* ---- new connections -------------------------------------------------------------- */

/* An agent's own part, and room for it on the list of agents; 0 or MN_ENOMEM (nothing kept). */
static int add_agent_part(mn_ctl_t *c, mn_conn_t *k) {
  if (mn__ctl_room(&c->agent_ids, &c->agent_ids_cap, c->nagent_ids) != 0) return MN_ENOMEM;
  if ((k->ag = calloc(1, sizeof(*k->ag))) == NULL) return MN_ENOMEM;
  k->ag->tree_pos = -1;
  k->ag->ship = -1; /* until its WELCOME says */
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
  *out = (mn_conn_info_t){k->kind, k->state, state_names[k->state], host, k->info_pid, mn__ctl_reason(k), k->rcount,
                          k->lazy ? k->direct : -1, k->ag ? k->ag->elf_class : 0, k->ag ? k->ag->elf_machine : 0,
                          k->ag ? k->ag->ship : -1, k->ag ? k->ag->cache_id : ""};
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

mn_take_t mn_ctl_take_result(mn_conn_t *k, uint64_t seq, mn_pending_t *out) {
  if (seq <= k->acked && k->via > 0) return MN_TAKE_SECOND; /* answered both ways after a resend: see ctl_cast.c */
  /* The oldest call in flight has seq k->seq - k->rcount + 1. */
  if (k->rcount == 0 || seq != k->seq - k->rcount + 1) return MN_TAKE_STRAY;
  *out = pop_pending(k);
  acked(k, seq, out->rest == NULL);
  out->rest = NULL;
  return MN_TAKE_ANSWERED;
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
