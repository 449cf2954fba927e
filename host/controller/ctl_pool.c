/*
 * ctl_pool.c - pooled procs: the procs of a large mesh keep a direct link
 * only while it pays. Mesh-wide calls reach them through their host agents
 * (casts) and their agents watch them, so a link serves only what a cast
 * cannot carry well or at all: calls to a few procs (call_one, choose, an
 * actor's endpoint: one hop less), CANCEL, messages (PING) and bulk puts.
 *
 * A pooled proc's first link carries its SESSION (the proc then takes
 * casts of that session) and, unless used, closes at the next heartbeat
 * once idle, or sooner for another proc's first link. Later
 * links open on demand, at most c->direct_max at once: one more closes the
 * least recently used idle one, or, if none is, a call goes through the
 * agent and a frame that needs the link waits for one to free. A link
 * unused for direct_idle closes. Closing one changes only the way bytes
 * travel: the conn keeps its session, sequence numbers, pending ring and
 * unacked copies, the proc its replay cache, so replay and exactly-once
 * hold as for a reconnect, and the script hears of nothing. Order per proc
 * holds as for casts (ctl_cast.c): while calls are in flight through the
 * agent every call follows them, and a reopened link is used once none is.
 */
#include "ctl_int.h"

#include <stdlib.h>

/* Whether a message sent on k's link may still be answered there (a PONG): nothing heard since, within the
 * hold time (a message with no answer, a SESSION, holds the link no longer than that). */
static int owed(const mn_conn_t *k) {
  uint64_t now = uv_now(&k->ctl->loop);
  /* Bytes in the same ms as the send count as before it: a handshake's last bytes and the message share one. */
  return k->pl->owed_at >= k->last_rx && now - k->pl->owed_at < MN_POOL_HOLD_MS;
}

/* Whether k's link can close with nothing lost: up, no direct call in flight, nothing left to write or read. */
static int idle(const mn_conn_t *k) {
  return k->direct && k->link != NULL && k->rcount == k->on_relay && k->out.len == 0 && k->pl->waiting.len == 0 &&
         k->link->writing == 0 && k->in_off >= k->in.len && !owed(k);
}

static void pool_remove(mn_ctl_t *c, mn_conn_t *k) {
  if (k->pl == NULL || k->pl->at == 0) return;
  int i = k->pl->at - 1, last = c->pool[--c->npool];
  c->pool[i] = last;
  c->conns[last]->pl->at = i + 1;
  k->pl->at = 0;
}

/* Closes k's idle link: it goes back to its agent, quietly (no event: nothing failed). */
static void close_link(mn_ctl_t *c, mn_conn_t *k) {
  mn__ctl_drop_link(k);
  pool_remove(c, k);
  k->direct = 0;
  k->in.len = k->in_off = 0;
  c->pool_closed++;
}

/* Milliseconds from t to now; 0 if t is later (a want after the loop's clock moved on). */
static uint64_t since(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

/* Closes the least recently used idle link unused for `hold` ms; 1 if one was closed. */
static int evict_one(mn_ctl_t *c, uint64_t now, uint64_t hold) {
  mn_conn_t *lru = NULL;
  for (int i = 0; i < c->npool; i++) {
    mn_conn_t *k = c->conns[c->pool[i]];
    if (idle(k) && since(now, k->pl->used_at) >= hold && (lru == NULL || k->pl->used_at < lru->pl->used_at)) lru = k;
  }
  if (lru == NULL) return 0;
  close_link(c, lru);
  return 1;
}

/* Counts k's link in the pool and dials it; 0 or MN_ENOMEM (nothing dialled). */
static int open_link(mn_ctl_t *c, mn_conn_t *k) {
  if (mn__ctl_room(&c->pool, &c->pool_cap, c->npool) != 0) return MN_ENOMEM;
  c->pool[c->npool++] = k->id;
  k->pl->at = c->npool;
  mn__ctl_start_link(k); /* a failure comes back as MN_CHANGE_LINK_LOST, or closes a first link's conn */
  return 0;
}

/* Puts k on the list of procs waiting for a link (once). */
static void enqueue(mn_ctl_t *c, mn_conn_t *k) {
  if (k->pl->wait) return;
  if (c->waitq_at > 0 && c->waitq_at == c->nwaitq) c->nwaitq = c->waitq_at = 0;
  if (c->nwaitq == c->waitq_cap && c->waitq_at > 0) { /* room at the front first */
    for (int i = c->waitq_at; i < c->nwaitq; i++) c->pool_waitq[i - c->waitq_at] = c->pool_waitq[i];
    c->nwaitq -= c->waitq_at;
    c->waitq_at = 0;
  }
  if (mn__ctl_room(&c->pool_waitq, &c->waitq_cap, c->nwaitq) != 0) return; /* its next want tries again */
  c->pool_waitq[c->nwaitq++] = k->id;
  k->pl->wait = 1;
}

static uint64_t hold_ms(const mn_ctl_t *c) {
  return c->direct_idle_ms / 2 < MN_POOL_HOLD_MS ? c->direct_idle_ms / 2 : MN_POOL_HOLD_MS;
}

/* Whether k still needs a link it has not got (a first one, or one asked for by a frame that waits). */
static int still_wants(const mn_conn_t *k) {
  return k->lazy && k->link == NULL && (k->state == MN_CS_CONNECTING || k->state == MN_CS_READY);
}

void mn__ctl_pool_want(mn_ctl_t *c, mn_conn_t *k, int must) {
  if (k->pl == NULL) return; /* not pooled: its link is its own business */
  uint64_t now = uv_now(&c->loop);
  k->pl->used_at = now;
  if (!still_wants(k)) return;
  if (k->lost_at != 0 && since(now, k->lost_at) < MN_POOL_RETRY_MS) return; /* the next want, or the heartbeat, tries again */
  if (c->nwaitq > c->waitq_at && must) { /* behind those waiting already */
    enqueue(c, k);
    return;
  }
  if (c->npool < c->direct_max || evict_one(c, now, must ? 0 : hold_ms(c))) {
    if (open_link(c, k) == 0) return;
  }
  if (must) enqueue(c, k); /* a call goes through the agent meanwhile, and wants again next time */
}

void mn__ctl_pool_serve(mn_ctl_t *c) {
  uint64_t now = uv_now(&c->loop);
  while (c->waitq_at < c->nwaitq) {
    mn_conn_t *k = mn_ctl_conn(c, c->pool_waitq[c->waitq_at]);
    if (k != NULL && k->pl->wait && still_wants(k)) {
      if (c->npool >= c->direct_max && !evict_one(c, now, 0)) return;
      if (open_link(c, k) != 0) return;
    }
    if (k != NULL) k->pl->wait = 0;
    c->waitq_at++;
  }
  c->nwaitq = c->waitq_at = 0;
}

/* k's link finished its handshake: calls may take it. */
static void link_up(mn_ctl_t *c, mn_conn_t *k) {
  k->link->phase = MN_CS_READY;
  k->direct = 1;
  c->pool_opened++;
}

/* k's first link (its spawn's) finished its handshake and opened its session: it counts as up, and as the
 * first to close for another proc's. */
static void pool_first_up(mn_ctl_t *c, mn_conn_t *k) {
  link_up(c, k);
  k->pl->used_at = 0; /* unused since: the first link to close for another proc's */
}

/* k's reopened link finished its handshake: SESSION, its unanswered calls unless they travel through its
 * agent, then what waited for it. 0 or MN_ENOMEM. */
static int pool_up(mn_ctl_t *c, mn_conn_t *k) {
  char f[32];
  mn_buf_t b = {f, 0, sizeof(f)}; /* a SESSION is at most 23 bytes: the buffer never grows */
  int rc = mn_msg_pack_session(&b, k->session, k->acked);
  link_up(c, k);
  if (rc == 0) rc = mn__ctl_queue_out(c, k, b.data, b.len);
  /* Unanswered calls not on their way through the agent were never sent, or went on a link lost since. */
  if (rc == 0 && k->on_relay == 0) rc = mn__ctl_resend_unacked(c, k);
  if (k->pl->ping_waits) k->pl->owed_at = uv_now(&c->loop); /* a PING that waited goes only now */
  k->pl->ping_waits = 0;
  if (rc == 0 && k->pl->waiting.len > 0) rc = mn__ctl_queue_out(c, k, k->pl->waiting.data, k->pl->waiting.len);
  k->pl->waiting.len = 0;
  return rc;
}

/* k's link failed or was lost (k stays ready): its direct calls go again through its agent. Not a failure
 * of the proc: if it died, its agent says so (PROC_EXIT). */
static void pool_lost(mn_ctl_t *c, mn_conn_t *k) {
  mn__ctl_drop_link(k);
  pool_remove(c, k);
  k->direct = 0;
  k->out.len = 0;
  uv_update_time(&c->loop);
  k->lost_at = uv_now(&c->loop);
  c->pool_closed++;
  /* Its direct calls go again through the agent; one the proc ran already is answered from its replay cache.
   * What waits for the link (a CANCEL, a PING) is tried again by the heartbeat (mn__ctl_pool_tick's caller). */
  if (k->rcount > k->on_relay) mn__ctl_unrelay_resend(c, k);
}

int mn__ctl_pool_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what) {
  switch (what) {
  case MN_CHANGE_UP: if (k->lazy) pool_first_up(c, k); break; /* its spawn's link: it carried the SESSION */
  case MN_CHANGE_LINK_UP: return pool_up(c, k);
  case MN_CHANGE_LINK_LOST: pool_lost(c, k); break;
  case MN_CHANGE_CLOSED: /* its link no longer counts */
    pool_remove(c, k);
    k->direct = 0;
    break;
  case MN_CHANGE_BACK:
  case MN_CHANGE_LOST: break; /* a pooled proc never reconnects: its link only goes back to the pool */
  }
  return 0;
}

void mn__ctl_pool_tick(mn_ctl_t *c, uint64_t now) {
  for (int i = 0; i < c->npool;) {
    mn_conn_t *k = c->conns[c->pool[i]];
    if (idle(k) && (since(now, k->pl->used_at) >= c->direct_idle_ms || c->npool > c->direct_max)) close_link(c, k);
    else i++;
  }
  if (c->nwaitq > c->waitq_at) mn__ctl_pool_serve(c);
}

int mn_ctl_connect_pooled(mn_ctl_t *c, const char *host, int port, int agent, int64_t pid) {
  mn_conn_t *k;
  int rc = mn__ctl_new_dialled(c, host, port, MN_CONN_PROC, &k);
  if (rc != 0) return rc;
  mn_ctl_set_relay(c, k, agent, pid);
  if (k->via == 0) { /* no casts (MONARCH_RELAY=0): a plain connection */
    mn__ctl_start_link(k);
    return k->id;
  }
  k->pl = calloc(1, sizeof(*k->pl));
  if (k->pl == NULL) { /* a plain connection, then: it works, only without the pool's saving */
    mn__ctl_start_link(k);
    return k->id;
  }
  k->lazy = 1;
  k->state = MN_CS_CONNECTING;
  mn__ctl_pool_want(c, k, 1);
  return k->id;
}

int mn_ctl_pool_linked(mn_ctl_t *c, mn_conn_t *k) {
  if (!k->lazy) return 1; /* its link is whatever state it is in: nothing to open */
  if (k->direct) {
    mn__ctl_pool_want(c, k, 0); /* a use: it stays */
    return 1;
  }
  if (k->state == MN_CS_READY) mn__ctl_pool_want(c, k, 1);
  return 0;
}

void mn_ctl_pool_configure(mn_ctl_t *c, int direct_max, uint64_t idle_ms) {
  if (direct_max > 0) c->direct_max = direct_max;
  if (idle_ms > 0) c->direct_idle_ms = idle_ms;
}
