/*
 * ctl_route.c - the hub: which way a call to a proc goes, and who hears of
 * a change of a conn.
 *
 * Routes. Every call (core.call, call_as), resend and ACK to a proc asks
 * mn__ctl_route, and its sender (ctl_cast.c, ctl_heartbeat.c) acts on the
 * answer:
 *   DIRECT  on the proc's own link (queued while it reconnects: the copy in
 *           unacked goes once it is back);
 *   RELAY   in a CAST to its host agent (agent_relay.c hands it over);
 *   TREE    the same, while the cast tree is active (past `fanout` agents):
 *           down the tree, through its agent's route (ctl_tree.c);
 *   PARK    no way now: kept in unacked until its agent is back (relay-only
 *           procs, ctl_relayed.c) or its pooled link is up (ctl_pool.c).
 * Order per proc: its calls in flight all travel one way. A call goes
 * through the agent only if nothing is in flight on its own link, and once
 * calls are in flight through the agent every call follows them until they
 * are answered. A mesh-wide call's small CALLs take the agent when the proc
 * is idle; a call to a few procs takes it only when it must (no link, or
 * calls ahead of it relayed).
 *
 * Changes. A conn's lifecycle (ctl.c, ctl_io.c) tells the modules that keep
 * state about conns through mn__ctl_conn_changed alone, each in a fixed
 * order: the pool (which links count), the tree (its agents changed), casts
 * (relayed calls off a lost agent), relay-only procs (follow their agent).
 */
#include "ctl_int.h"

#define MN_CAST_MAX_REST (64u << 10) /* larger calls go straight to each proc: the agent would only copy them */

/* k's agent, if it relays k's casts. */
static const mn_conn_t *agent_of(const mn_ctl_t *c, const mn_conn_t *k) {
  return k->via > 0 && k->via <= c->nconns ? c->conns[k->via] : NULL;
}

int mn__ctl_relay_usable(const mn_ctl_t *c, const mn_conn_t *k) {
  const mn_conn_t *a = agent_of(c, k);
  return a != NULL && a->state == MN_CS_READY && k->state == MN_CS_READY;
}

mn_route_t mn__ctl_route_batch(const mn_ctl_t *c) {
  return mn__ctl_tree_active(c) ? MN_ROUTE_TREE : MN_ROUTE_RELAY;
}

/* A call taken off its relay: to the agent itself (one-target CAST, whatever the tree) when k has no link,
 * else on its link if that is ready (a reconnecting one resends it when back). */
static mn_route_t route_resend(const mn_ctl_t *c, const mn_conn_t *k) {
  const mn_conn_t *a = agent_of(c, k);
  if (mn__ctl_no_link(k)) return a != NULL && a->state == MN_CS_READY ? MN_ROUTE_RELAY : MN_ROUTE_PARK;
  return k->state == MN_CS_READY ? MN_ROUTE_DIRECT : MN_ROUTE_PARK;
}

mn_route_t mn__ctl_route(const mn_ctl_t *c, const mn_conn_t *k, mn_send_t what, size_t n) {
  if (what == MN_SEND_RESEND) return route_resend(c, k);
  int no_link = mn__ctl_no_link(k);
  int relay = mn__ctl_relay_usable(c, k);
  if (what != MN_SEND_ACK) {
    /* Behind relayed calls, any call goes that way too (order); else a small one of a mesh-wide call, on an
     * idle link; a proc with no link has no other way. */
    int small = what == MN_SEND_CAST && k->rcount == 0 && n - MN_MSG_CALL_HEAD <= MN_CAST_MAX_REST;
    relay = relay && (no_link || k->on_relay > 0 || small);
  }
  if (relay) return mn__ctl_route_batch(c);
  /* An ACK with no link and no agent is not sent: the next one covers it. */
  return no_link ? MN_ROUTE_PARK : MN_ROUTE_DIRECT;
}

int mn__ctl_conn_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what) {
  int rc = mn__ctl_pool_changed(c, k, what);
  mn__ctl_tree_conn_changed(c, k, what);
  mn__ctl_cast_changed(c, k, what);
  mn__ctl_relayed_changed(c, k, what);
  return rc;
}
