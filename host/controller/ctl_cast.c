/*
 * ctl_cast.c - casts: a mesh-wide call goes to each host agent as one CAST
 * frame naming its procs, instead of one CALL frame per proc; the agent
 * answers with batched RESULTS (host/agent/agent_relay.c). Every proc keeps
 * its own sequence numbers, pending ring and unacked copies here, exactly
 * as for a direct call, so replay, retries and failure handling do not
 * change; only the bytes travel another way.
 *
 * Which way each call goes is the hub's answer (mn__ctl_route, ctl_route.c,
 * with the rule that keeps order per proc); this file sends it that way:
 * gathered for its agent's CAST (flat, or down the tree: ctl_tree.c), kept
 * (parked), or on the proc's own link. If the agent's link is lost, each
 * proc's relayed calls are resent the way the hub says is left (its own
 * link, mostly); a proc that already ran one answers from its replay cache,
 * and whichever answer comes second is ignored (mn_ctl_take_result), so
 * nothing runs twice or is lost.
 */
#include "ctl_int.h"

#include <stdlib.h>
#include <string.h>

static int relay_enabled(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("MONARCH_RELAY");
    on = !(e && strcmp(e, "0") == 0);
  }
  return on;
}

void mn_ctl_set_relay(mn_ctl_t *c, mn_conn_t *k, int agent, int64_t pid) {
  mn_conn_t *a = mn_ctl_conn(c, agent);
  if (!relay_enabled() || c->no_acks || a == NULL || a->kind != MN_CONN_AGENT || k->kind != MN_CONN_PROC) return;
  k->via = agent;
  k->via_pid = (uint64_t)pid;
}

size_t mn_ctl_relayed(const mn_conn_t *k) { return k->on_relay; }

mn_conn_t *mn_ctl_relayed_conn(mn_ctl_t *c, int agent, uint64_t tag) {
  mn_conn_t *k = tag <= (uint64_t)c->nconns ? mn_ctl_conn(c, (int)tag) : NULL;
  (void)agent; /* through the tree, a proc's answers come from the top agent of its route, not its own */
  return k != NULL && k->kind == MN_CONN_PROC && k->via > 0 && k->state != MN_CS_CLOSED ? k : NULL;
}

void mn_ctl_prefetch(mn_ctl_t *c, uint64_t id, mn_prefetch_t what) {
  if (id == 0 || id > (uint64_t)c->nconns) return;
  mn_conn_t *k = c->conns[id];
  if (what == MN_PF_CONN) { /* k itself is not loaded yet: nothing of it may be read here */
    __builtin_prefetch(k);
    __builtin_prefetch((const char *)k + 64);
    return;
  }
  mn_conn_t *a = k->via > 0 && k->via <= c->nconns ? c->conns[k->via] : NULL;
  if (what == MN_PF_AGENT) {
    if (a != NULL && a->ag != NULL) __builtin_prefetch(a->ag, 1);
  } else if (k->ring != NULL) {
    size_t at = what == MN_PF_SEND ? k->rhead + k->rcount : k->rhead;
    __builtin_prefetch(&k->ring[at & (k->rcap - 1)], 1);
    if (a != NULL) __builtin_prefetch(a);
  }
}

/* Adds n uints (one cast target, or one ACK) to agent a's batch, putting a on the list of agents to send to.
 * One buffer takes every agent's, reused from cast to cast so that it stays in cache: at thousands of
 * agents, a buffer each is a cold line written per few procs. */
static int gather(mn_ctl_t *c, mn_conn_t *a, const uint64_t *t, size_t n) {
  mn_agent_part_t *g = a->ag;
  size_t bytes = n * sizeof(uint64_t);
  if (!g->in_cast) {
    if (c->casting == NULL) c->casting = calloc((size_t)MN_MAX_CONNS, sizeof(int));
    if (c->casting == NULL) return MN_ENOMEM;
    g->in_cast = 1;
    g->spilled = 0;
    g->run_at = c->gathered.len;
    g->run_len = 0;
    c->casting[c->ncasting++] = a->id;
  } else if (!g->spilled && c->gather_last != a->id) {
    /* Another agent's came between: its run goes on in a buffer of its own. */
    g->cast.len = 0;
    if (mn_buf_append(&g->cast, c->gathered.data + g->run_at, g->run_len) != 0) return MN_ENOMEM;
    g->spilled = 1;
  }
  c->gather_last = a->id;
  if (g->spilled) return mn_buf_append(&g->cast, (const char *)t, bytes);
  if (mn_buf_reserve(&c->gathered, bytes) != 0) return MN_ENOMEM;
  memcpy(c->gathered.data + c->gathered.len, t, bytes);
  c->gathered.len += bytes;
  g->run_len += bytes;
  return 0;
}

const uint64_t *mn__ctl_batch(const mn_ctl_t *c, const mn_conn_t *a, size_t width, size_t *n) {
  const mn_agent_part_t *g = a->ag;
  size_t len = !g->in_cast ? 0 : g->spilled ? g->cast.len : g->run_len;
  *n = len / (width * sizeof(uint64_t));
  return (const uint64_t *)(g->spilled ? g->cast.data : c->gathered.data + g->run_at);
}

void mn__ctl_batch_done(mn_ctl_t *c) {
  c->ncasting = 0;
  c->gathered.len = 0;
  c->gather_last = 0;
}

/* The tree is rebuilt before a cast gathers anything: a rebuild resends what is relayed, and must not take this
 * cast's own calls off their routes after they were counted on them. A call to one proc (call_as) asks only
 * when it may go through its agent (calls relayed ahead of it, or no link). */
static void tree_first(mn_ctl_t *c, const mn_conn_t *k, mn_send_t what) {
  int may_relay = what != MN_SEND_ONE || k->on_relay > 0 || mn__ctl_no_link(k);
  if (may_relay && c->tree_dirty && c->ncasting == 0 && c->cur_rest == NULL) mn__ctl_tree_refresh(c);
}

/* Records k's relayed call and gathers its (pid, seq, tag) for its agent's CAST; 0 or MN_ENOMEM. */
static int cast_relayed(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot) {
  if (c->cur_rest == NULL) {
    size_t rlen = n - MN_MSG_CALL_HEAD;
    c->cur_rest = malloc(sizeof(*c->cur_rest) + rlen);
    if (c->cur_rest == NULL) return MN_ENOMEM;
    c->cur_rest->refs = 1; /* the cast's own, let go at mn_ctl_cast_end */
    c->cur_rest->len = (uint32_t)rlen;
    memcpy(c->cur_rest->data, frame + MN_MSG_CALL_HEAD, rlen);
  }
  if (mn__ctl_track(c, k, frame, n, call, slot, 1, c->cur_rest) != 0) return MN_ENOMEM;
  uint64_t t[3] = {k->via_pid, k->seq, (uint64_t)k->id};
  if (gather(c, mn_ctl_conn(c, k->via), t, 3) != 0) return MN_ENOMEM;
  k->on_relay++;
  c->cast_calls++;
  return 0;
}

int mn__ctl_send_call(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot, mn_send_t what) {
  tree_first(c, k, what);
  if (k->lazy && what != MN_SEND_CAST) mn__ctl_pool_want(c, k, 0); /* a call to a few procs: a direct link pays (ctl_pool.c) */
  switch (mn__ctl_route(c, k, what, n)) {
  case MN_ROUTE_RELAY:
  case MN_ROUTE_TREE: return cast_relayed(c, k, frame, n, call, slot); /* mn_ctl_cast_end sends the batch */
  case MN_ROUTE_PARK: return mn__ctl_track(c, k, frame, n, call, slot, 0, NULL);
  case MN_ROUTE_DIRECT: break;
  }
  return mn__ctl_call_direct(c, k, frame, n, call, slot);
}

int mn_ctl_cast_add(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot, int prefer) {
  return mn__ctl_send_call(c, k, frame, n, call, slot, prefer ? MN_SEND_CAST : MN_SEND_CALL);
}

void mn__ctl_rest_unref(mn_cast_rest_t *r) {
  if (--r->refs == 0) free(r);
}

static int cast_send(mn_ctl_t *c, const char *frame, size_t n);

int mn_ctl_cast_end(mn_ctl_t *c, const char *frame, size_t n) {
  int rc = cast_send(c, frame, n);
  if (c->cur_rest != NULL) mn__ctl_rest_unref(c->cur_rest);
  c->cur_rest = NULL;
  return rc;
}

static int cast_send(mn_ctl_t *c, const char *frame, size_t n) {
  int rc = 0;
  if (mn__ctl_route_batch(c) == MN_ROUTE_TREE) return mn__ctl_tree_cast_end(c, frame + MN_MSG_CALL_HEAD, n - MN_MSG_CALL_HEAD);
  for (int i = 0; i < c->ncasting; i++) {
    mn_conn_t *a = mn_ctl_conn(c, c->casting[i]);
    size_t nt;
    const uint64_t *t = mn__ctl_batch(c, a, 3, &nt);
    if (rc == 0 && mn_msg_pack_cast(&a->out, t, nt, frame + MN_MSG_CALL_HEAD, n - MN_MSG_CALL_HEAD) != 0) rc = MN_ENOMEM;
    a->ag->in_cast = 0;
    c->casts++;
    mn__ctl_set_dirty(c, a);
  }
  mn__ctl_batch_done(c);
  return rc;
}

int mn__ctl_relay_ack(mn_ctl_t *c, mn_conn_t *k) {
  uint64_t t[2] = {k->via_pid, k->acked};
  return gather(c, mn_ctl_conn(c, k->via), t, 2);
}

void mn__ctl_relay_acks_end(mn_ctl_t *c) {
  if (c->ncasting > 0 && mn__ctl_route_batch(c) == MN_ROUTE_TREE) {
    (void)mn__ctl_tree_acks_end(c); /* out of memory: as below */
    return;
  }
  for (int i = 0; i < c->ncasting; i++) {
    mn_conn_t *a = mn_ctl_conn(c, c->casting[i]);
    size_t np;
    const uint64_t *t = mn__ctl_batch(c, a, 2, &np);
    /* Out of memory: those procs keep their replay caches a tick longer; the next ACK covers them. */
    (void)mn_msg_pack_acks(&a->out, t, np);
    a->ag->in_cast = 0;
    mn__ctl_set_dirty(c, a);
  }
  mn__ctl_batch_done(c);
}

/* The frames of k's calls in flight, in seq order: a relayed call's rebuilt from its cast's shared
 * bytes, a direct one's taken from `unacked`. They then all go on k's own link. */
static void rebuild_unacked(mn_conn_t *k) {
  mn_buf_t nb;
  mn_buf_init(&nb);
  size_t off = k->unacked_off;
  uint64_t seq = k->seq - k->rcount + 1;
  for (size_t i = 0; i < k->rcount; i++, seq++) {
    mn_pending_t *p = &k->ring[(k->rhead + i) & (k->rcap - 1)];
    if (p->rest != NULL) {
      char head[MN_MSG_CALL_HEAD];
      mn_msg_call_from_cast(head, seq, p->rest->len);
      /* Out of memory: this call is not resent; its timeout, or the proc's loss, fails it. */
      if (mn_buf_append(&nb, head, sizeof(head)) == 0) mn_buf_append(&nb, p->rest->data, p->rest->len);
      mn__ctl_rest_unref(p->rest);
      p->rest = NULL;
    } else if (off + MN_FRAME_HEADER <= k->unacked.len) {
      size_t len = MN_FRAME_HEADER + mn_be32(k->unacked.data + off);
      mn_buf_append(&nb, k->unacked.data + off, len);
      off += len;
    }
  }
  mn_buf_free(&k->unacked);
  k->unacked = nb;
  k->unacked_off = 0;
}

void mn__ctl_unrelay(mn_conn_t *k) {
  int any = 0;
  k->on_relay = 0;
  for (size_t i = 0; i < k->rcount; i++) {
    mn_pending_t *p = &k->ring[(k->rhead + i) & (k->rcap - 1)];
    if (p->relay) mn__ctl_tree_answered(k->ctl, k);
    any |= p->rest != NULL;
    p->relay = 0;
  }
  if (any && !k->ctl->no_acks) rebuild_unacked(k);
}

void mn__ctl_unrelay_resend(mn_ctl_t *c, mn_conn_t *k) {
  mn__ctl_unrelay(k);
  switch (mn__ctl_route(c, k, MN_SEND_RESEND, 0)) {
  case MN_ROUTE_RELAY: mn__ctl_relayed_resend(c, mn_ctl_conn(c, k->via), k); break;
  case MN_ROUTE_DIRECT: mn__ctl_resend_unacked(c, k); break;
  case MN_ROUTE_TREE: break; /* not an answer for a resend */
  case MN_ROUTE_PARK:
    /* Its agent's reconnect resends it (mn__ctl_relayed_changed), or its own reconnect; a pooled proc's
     * link, wanted now, once up (mn__ctl_pool_changed). */
    if (k->lazy && k->state == MN_CS_READY) mn__ctl_pool_want(c, k, 1);
    break;
  }
}

/* Agent conn `agent` is gone or reconnecting: its procs' relayed calls are resent the way left to each. */
static void unrelay_agent(mn_ctl_t *c, int agent) {
  mn_conn_t *a = mn_ctl_conn(c, agent);
  /* One outside the current tree (say, a host already gone reaching the end of its reconnect window)
   * carried nothing for the others: only its own procs' calls move. */
  if (a != NULL && a->ag != NULL && a->ag->tree_pos >= 0 && mn__ctl_tree_unrelay_agent(c)) return;
  for (int i = 1; i <= c->nconns; i++) {
    mn_conn_t *k = c->conns[i];
    if (k->via == agent && k->on_relay > 0) mn__ctl_unrelay_resend(c, k);
  }
}

void mn__ctl_cast_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what) {
  /* Closing: every connection goes anyway, and a walk of them all per agent would cost agents x procs. */
  if (k->kind == MN_CONN_AGENT && !c->closing && (what == MN_CHANGE_LOST || what == MN_CHANGE_CLOSED))
    unrelay_agent(c, k->id);
}
