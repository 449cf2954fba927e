/*
 * ctl_tree.c - the cast tree. Past `fanout` host agents, a cast no longer
 * goes to every agent: the agents form a k-ary tree in host order, under R
 * top agents (as few as two levels allow: ceil(H / (k+1)), at most k; the
 * agent at position p has children R + pk .. R + pk + k-1), the controller sends
 * one CAST per top agent carrying the whole subtree's targets (subs), and
 * each agent hands the rest down and folds its children's RESULTS into its
 * own (host/agent/agent_tree.c). The controller writes and reads O(k)
 * frames per mesh-wide call instead of O(hosts).
 *
 * Routes. An agent is reached directly until its parent reports the link
 * up (LINKED); it switches to "through the parent" only while nothing is in
 * flight through it (its own procs' relayed calls, tree_inflight, and those
 * of the children routed through it, theirs in turn: summed only when a
 * route would change), so two casts to a proc never travel different ways
 * at once and cannot overtake each other. A change of the agents (one
 * joins, is lost, or a link goes down) rebuilds the tree: every relayed call
 * in flight is resent on its proc's own link (the replay caches keep that
 * exactly-once) and every route starts direct again.
 *
 * Supervision. An agent whose parent reports its link up is vouched for:
 * the controller neither PINGs it nor times it out, and its ACKS travel
 * down the tree inside its top agent's; the parent PINGs the link (TREE
 * says how often) and reports it lost (LINKED false) after silence_ms,
 * when the controller takes the child back, counting that silence. Its
 * own connection is watched by the kernel meanwhile (TCP keepalive), so a
 * link cut between the controller and the child alone is seen too.
 */
#include "ctl_int.h"

#include <stdlib.h>
#include <string.h>

/* Position of child j of the agent at position p (may be past the last agent). */
static int child_pos(const mn_ctl_t *c, int p, int j) { return c->tree_roots + p * c->tree_k + j; }

static mn_conn_t *parent_of(mn_ctl_t *c, const mn_conn_t *a) {
  if (a->ag->tree_pos < c->tree_roots) return NULL;
  return mn_ctl_conn(c, c->tree[(a->ag->tree_pos - c->tree_roots) / c->tree_k]);
}

static mn_conn_t *route_of(mn_ctl_t *c, const mn_conn_t *a) { return a->ag->route > 0 ? mn_ctl_conn(c, a->ag->route) : NULL; }

/* The agents changed (one is up, back, lost or closed): the next cast rebuilds the tree. One lost outside the
 * current tree changes nothing in it; while closing, nothing is rebuilt. */
void mn__ctl_tree_conn_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what) {
  if (k->kind != MN_CONN_AGENT) return;
  if (what == MN_CHANGE_UP || what == MN_CHANGE_BACK) c->tree_dirty = 1;
  if ((what == MN_CHANGE_LOST || what == MN_CHANGE_CLOSED) && !c->closing && k->ag->tree_pos >= 0) c->tree_dirty = 1;
}

/* Takes the answers counted since the last flush off their agent's in-flight count. */
static void answered_flush(mn_ctl_t *c) {
  int64_t n = c->ans_n;
  mn_conn_t *a = c->ans_via > 0 ? mn_ctl_conn(c, c->ans_via) : NULL;
  if (a != NULL && a->ag != NULL) a->ag->tree_inflight -= a->ag->tree_inflight < n ? a->ag->tree_inflight : n;
  c->ans_n = 0;
}

/* Counted, not walked, per answer: a route is walked once per run of one agent's answers. */
void mn__ctl_tree_answered(mn_ctl_t *c, mn_conn_t *k) {
  if (k->via != c->ans_via) {
    answered_flush(c);
    c->ans_via = k->via;
  }
  c->ans_n++;
}

/* Every relayed call in flight is resent on its proc's own link; every route is direct again, and with
 * links_too, no link counts as up (a new tree's links report afresh). */
static void unrelay_all(mn_ctl_t *c, int links_too) {
  mn__ctl_spawn_resend(c); /* while the routes still say which went through a parent */
  int routed = c->tree_routed;
  c->ans_n = 0; /* every count goes to 0 below */
  c->tree_routed = 0;
  for (int i = 0; i < c->nagent_ids; i++) {
    mn_agent_part_t *g = c->conns[c->agent_ids[i]]->ag;
    g->route = 0;
    g->tree_inflight = 0;
    if (links_too) g->tree_up = 0;
  }
  /* With every route direct, each proc's calls went to its own agent: none passed a parent, none moves. */
  if (routed == 0) return;
  for (int i = 1; i <= c->nconns; i++) {
    mn_conn_t *k = c->conns[i];
    if (k->kind != MN_CONN_PROC || k->on_relay == 0) continue;
    c->tree_resent += k->on_relay;
    mn__ctl_unrelay_resend(c, k); /* off the tree */
  }
}

/* "ip:port" of the agent as this controller reached it (numeric, so that another agent can dial it). */
static void peer_addr(const mn_conn_t *a, char *out, size_t n) {
  struct sockaddr_storage ss = {0};
  int len = sizeof(ss);
  char ip[64] = "";
  if (a->link != NULL && uv_tcp_getpeername(&a->link->tcp, (struct sockaddr *)&ss, &len) == 0)
    uv_ip_name((struct sockaddr *)&ss, ip, sizeof(ip));
  if (ss.ss_family == AF_INET6) snprintf(out, n, "[%s]:%d", ip, a->port);
  else snprintf(out, n, "%s:%d", ip, a->port);
}

/* How often a parent PINGs its children's links, and how long one may stay silent: well inside the
 * heartbeat timeout, so that a lost child is still reported lost within it. */
static uint64_t link_ping_ms(const mn_ctl_t *c) { return c->hb_timeout_ms / 5 > 100 ? c->hb_timeout_ms / 5 : 100; }
static uint64_t link_silence_ms(const mn_ctl_t *c) { return c->hb_timeout_ms / 2 > 200 ? c->hb_timeout_ms / 2 : 200; }

/* a's parent, if their link is up and the parent ready: what a is cast through and vouched for by. */
static mn_conn_t *linked_parent(mn_ctl_t *c, const mn_conn_t *a) {
  mn_conn_t *p = a->ag->tree_up ? parent_of(c, a) : NULL;
  return p != NULL && p->state == MN_CS_READY ? p : NULL;
}

mn_conn_t *mn__ctl_tree_linked_parent(mn_ctl_t *c, const mn_conn_t *a) {
  return a->ag != NULL && a->ag->tree_pos >= 0 && mn__ctl_tree_active(c) ? linked_parent(c, a) : NULL;
}

mn_conn_t *mn__ctl_tree_child(mn_ctl_t *c, const mn_conn_t *a, int j) {
  if (a->ag->tree_pos < 0 || j >= c->tree_k || child_pos(c, a->ag->tree_pos, j) >= c->ntree) return NULL;
  return mn_ctl_conn(c, c->tree[child_pos(c, a->ag->tree_pos, j)]);
}

int mn__ctl_tree_vouched(mn_ctl_t *c, const mn_conn_t *a) {
  return a->ag->tree_pos >= 0 && mn__ctl_tree_active(c) && linked_parent(c, a) != NULL;
}

/* TREE to the agent at position p: its children's addresses and sessions. */
static void send_tree(mn_ctl_t *c, int p) {
  char addrs[MN_TREE_MAX_FANOUT][80];
  const char *ap[MN_TREE_MAX_FANOUT];
  uint64_t sessions[MN_TREE_MAX_FANOUT];
  size_t n = 0;
  for (int j = 0; j < c->tree_k && child_pos(c, p, j) < c->ntree; j++, n++) {
    mn_conn_t *ch = mn_ctl_conn(c, c->tree[child_pos(c, p, j)]);
    peer_addr(ch, addrs[n], sizeof(addrs[n]));
    ap[n] = addrs[n];
    sessions[n] = ch->session;
  }
  mn_conn_t *a = mn_ctl_conn(c, c->tree[p]);
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_tree(&b, c->tree_epoch, ap, sessions, n, link_ping_ms(c), link_silence_ms(c)) == 0)
    mn_ctl_send(c, a, b.data, b.len);
  mn_buf_free(&b);
}

/* Positions are the ready agents in connection (host) order. */
static void rebuild(mn_ctl_t *c) {
  int was = mn__ctl_tree_active(c); /* with the fan-out the current tree was built for */
  c->tree_dirty = 0;
  c->tree_k = c->fanout;
  if (was) unrelay_all(c, 1); /* below the fan-out every route is direct: nothing went through a parent */
  if (c->tree == NULL) c->tree = calloc((size_t)MN_MAX_CONNS, sizeof(int));
  if (c->tree == NULL) return;
  c->ntree = 0;
  for (int i = 0; i < c->nagent_ids; i++) {
    mn_conn_t *k = c->conns[c->agent_ids[i]];
    k->ag->tree_pos = -1;
    if (k->state == MN_CS_READY) {
      k->ag->tree_pos = c->ntree;
      c->tree[c->ntree++] = k->id;
    }
  }
  /* As few top agents as two levels allow (each relays to up to k), so that the controller writes and
   * reads as few frames as it can; k of them once the tree needs a third level. */
  int k = c->tree_k > 1 ? c->tree_k : 1;
  c->tree_roots = (c->ntree + k) / (k + 1);
  if (c->tree_roots > k) c->tree_roots = k;
  if (c->tree_roots < 1) c->tree_roots = 1;
  c->tree_epoch++;
  /* Below the fan-out nobody relays; agents that had children hear so (an empty TREE closes their links). */
  if (!mn__ctl_tree_active(c) && !was) return;
  for (int p = 0; p < c->ntree; p++) send_tree(c, p);
}

void mn__ctl_tree_refresh(mn_ctl_t *c) {
  if (c->fanout > 0 || mn__ctl_tree_active(c)) rebuild(c);
  c->tree_dirty = 0;
}

int mn_ctl_tree_build(mn_ctl_t *c) {
  if (c->tree_dirty && c->ncasting == 0 && c->cur_rest == NULL) mn__ctl_tree_refresh(c);
  return mn_ctl_tree_wanted(c);
}

int mn_ctl_tree_wanted(const mn_ctl_t *c) { return mn__ctl_tree_active(c) ? c->ntree - c->tree_roots : 0; }

static void mn__ctl_tree_linked(mn_ctl_t *c, mn_conn_t *a, uint64_t epoch, uint64_t index, int up) {
  if (epoch != c->tree_epoch || a->ag->tree_pos < 0 || index >= (uint64_t)c->tree_k) return;
  int64_t pos = child_pos(c, a->ag->tree_pos, (int)index);
  if (pos >= c->ntree) return;
  mn_conn_t *ch = mn_ctl_conn(c, c->tree[pos]);
  if (up) {
    ch->ag->tree_up = 1; /* used from the next cast on which nothing is in flight through it */
  } else if (ch->ag->tree_up) {
    /* What was in flight below it is lost with the link: rebuild (it is cast to directly meanwhile). Its
     * parent last heard it silence_ms ago: the heartbeat takes it back from there. */
    uint64_t now = uv_now(&c->loop), heard = now > link_silence_ms(c) ? now - link_silence_ms(c) : 0;
    if (ch->last_rx > heard) ch->last_rx = heard;
    /* Now, not at the next cast: with none coming, the calls below the link would wait for good. The
     * other links stay up (their children stay vouched for) until the next cast rebuilds the tree. */
    ch->ag->tree_up = 0;
    unrelay_all(c, 0);
    c->tree_dirty = 1;
  }
}

/* Relayed calls in flight through a: its own procs', and those of every child routed through it (theirs in turn). */
static int64_t through(mn_ctl_t *c, const mn_conn_t *a) {
  int64_t n = a->ag->tree_inflight;
  for (int j = 0; j < c->tree_k && child_pos(c, a->ag->tree_pos, j) < c->ntree; j++) {
    mn_conn_t *ch = mn_ctl_conn(c, c->tree[child_pos(c, a->ag->tree_pos, j)]);
    if (ch->ag->route == a->id) n += through(c, ch);
  }
  return n;
}

/* Agent a takes the route its parent's link allows, if nothing is in flight through it. */
static void settle(mn_ctl_t *c, mn_conn_t *a) {
  mn_conn_t *p = linked_parent(c, a);
  int want = p != NULL ? p->id : 0;
  if (a->ag->route != want && through(c, a) == 0) {
    c->tree_routed += (want != 0) - (a->ag->route != 0);
    a->ag->route = want;
  }
}

/* Before a cast (the tree is current: its first mn_ctl_cast_add refreshed it): idle agents take the route
 * their parent's link allows. */
static void settle_routes(mn_ctl_t *c) {
  answered_flush(c);
  for (int i = 0; i < c->ncasting; i++) settle(c, mn_ctl_conn(c, c->casting[i]));
}

/* Adds agent a's entries to its own count and every agent's on its route (and, for a cast, to what is in
 * flight to its procs); returns the top one (sent to directly). */
static mn_conn_t *count_route(mn_ctl_t *c, mn_conn_t *a, uint32_t n, int cast) {
  mn_conn_t *top = a;
  if (cast) a->ag->tree_inflight += n;
  for (mn_conn_t *x = a; x != NULL; x = route_of(c, x)) {
    if (x->ag->tree_count == 0 && x->ag->in_tree == 0) {
      x->ag->in_tree = 1;
      c->touched[c->ntouched++] = x->id;
    }
    x->ag->tree_count += n;
    top = x;
  }
  return top;
}

static uint32_t nsubs(mn_ctl_t *c, const mn_conn_t *a) {
  uint32_t n = 0;
  for (int j = 0; j < c->tree_k && child_pos(c, a->ag->tree_pos, j) < c->ntree; j++) {
    mn_conn_t *ch = mn_ctl_conn(c, c->tree[child_pos(c, a->ag->tree_pos, j)]);
    n += ch->ag->route == a->id && ch->ag->tree_count > 0;
  }
  return n;
}

/* Uints per entry in an agent's batch: a cast target's (pid, seq, tag), an ACK's (pid, acked). */
#define CAST_WIDTH 3
#define ACK_WIDTH 2

static size_t nentries(const mn_ctl_t *c, const mn_conn_t *a, int width) {
  size_t n;
  (void)mn__ctl_batch(c, a, (size_t)width, &n);
  return n;
}

/* subs of a for each child reached through it with entries below: a cast's (index, count, targets,
 * subs) quads, or ACKS's (index, pairs, subs) triples. */
static int pack_subs(mn_ctl_t *c, msgpack_packer *pk, mn_buf_t *b, const mn_conn_t *a, int width) {
  int f = 0;
  for (int j = 0; j < c->tree_k && child_pos(c, a->ag->tree_pos, j) < c->ntree; j++) {
    mn_conn_t *ch = mn_ctl_conn(c, c->tree[child_pos(c, a->ag->tree_pos, j)]);
    if (ch->ag->route != a->id || ch->ag->tree_count == 0) continue;
    size_t n;
    const uint64_t *t = mn__ctl_batch(c, ch, (size_t)width, &n);
    f |= msgpack_pack_uint64(pk, (uint64_t)j);
    if (width == CAST_WIDTH) f |= msgpack_pack_uint64(pk, ch->ag->tree_count);
    f |= msgpack_pack_array(pk, (uint32_t)(width * n)) | mn_msg_pack_uints(b, t, width * n);
    f |= msgpack_pack_array(pk, (uint32_t)(width + 1) * nsubs(c, ch)) | pack_subs(c, pk, b, ch, width);
  }
  return f;
}

static int send_root(mn_ctl_t *c, mn_conn_t *r, const char *rest, size_t rlen) {
  msgpack_packer pk;
  size_t start;
  size_t n;
  const uint64_t *t = mn__ctl_batch(c, r, rest != NULL ? CAST_WIDTH : ACK_WIDTH, &n);
  int f = rest != NULL ? mn_msg_cast_head(&r->out, &pk, &start, t, n, rest, rlen, nsubs(c, r))
                       : mn_msg_acks_head(&r->out, &pk, &start, t, n, nsubs(c, r));
  f |= pack_subs(c, &pk, &r->out, r, rest != NULL ? CAST_WIDTH : ACK_WIDTH);
  if (f != 0) return MN_ENOMEM;
  mn_frame_end(&r->out, start);
  c->casts += rest != NULL;
  mn__ctl_set_dirty(c, r);
  return 0;
}

/* What an agent on a spawn's way with none of its own is sent: req 0, {count = 0}. */
static const char SPAWN_NONE[] = "\x00\x81\xa5" "count" "\x00";

static int spawn_body(msgpack_packer *pk, const mn_conn_t *a) {
  const mn_agent_part_t *g = a->ag;
  return g->spawn_new ? pk->callback(pk->data, g->spawn.data, g->spawn.len)
                      : pk->callback(pk->data, SPAWN_NONE, sizeof(SPAWN_NONE) - 1);
}

/* subs of a's spawn: an (index, req, spec, subs) quad for each child reached through it with a spawn below. */
static int pack_spawn_subs(mn_ctl_t *c, msgpack_packer *pk, const mn_conn_t *a) {
  int f = 0;
  for (int j = 0; j < c->tree_k && child_pos(c, a->ag->tree_pos, j) < c->ntree; j++) {
    mn_conn_t *ch = mn_ctl_conn(c, c->tree[child_pos(c, a->ag->tree_pos, j)]);
    if (ch->ag->route != a->id || ch->ag->tree_count == 0) continue;
    f |= msgpack_pack_uint64(pk, (uint64_t)j) | spawn_body(pk, ch);
    f |= msgpack_pack_array(pk, 4 * nsubs(c, ch)) | pack_spawn_subs(c, pk, ch);
  }
  return f;
}

static int send_spawn_root(mn_ctl_t *c, mn_conn_t *x) {
  msgpack_packer pk;
  size_t start;
  int f = mn_msg_spawn_head(&x->out, &pk, &start) | spawn_body(&pk, x);
  f |= msgpack_pack_array(&pk, 4 * nsubs(c, x)) | pack_spawn_subs(c, &pk, x);
  if (f != 0) {
    x->out.len = start;
    return MN_ENOMEM;
  }
  mn_frame_end(&x->out, start);
  mn__ctl_set_dirty(c, x);
  return 0;
}

#define SPAWN_WIDTH 0 /* a spawn: one entry per agent, its SPAWN (ctl_spawn.c) */

/* What was gathered for agents ids[0..n) goes to the top agents of their routes, each with its subtree's as
 * subs: a cast's targets (CAST_WIDTH, with rest), ACKs (ACK_WIDTH) or spawns (SPAWN_WIDTH). */
static int send_down(mn_ctl_t *c, const int *ids, int n, int width, const char *rest, size_t rlen) {
  if (c->touched == NULL) c->touched = calloc((size_t)MN_MAX_CONNS, sizeof(int));
  if (c->touched == NULL) return MN_ENOMEM;
  int rc = 0;
  for (int i = 0; i < n; i++) {
    mn_conn_t *a = mn_ctl_conn(c, ids[i]);
    uint32_t entries = width == SPAWN_WIDTH ? 1 : (uint32_t)nentries(c, a, width);
    count_route(c, a, entries, rest != NULL)->ag->tree_root = 1;
  }
  /* Every root is among the touched; send each once, then clear what this marked. */
  for (int i = 0; i < c->ntouched; i++) {
    mn_conn_t *x = mn_ctl_conn(c, c->touched[i]);
    if (x->ag->tree_root && rc == 0) rc = width == SPAWN_WIDTH ? send_spawn_root(c, x) : send_root(c, x, rest, rlen);
    x->ag->tree_root = 0;
  }
  for (int i = 0; i < c->ntouched; i++) {
    mn_conn_t *x = mn_ctl_conn(c, c->touched[i]);
    x->ag->tree_count = 0;
    x->ag->in_tree = 0;
    x->ag->in_cast = 0;
  }
  c->ntouched = 0;
  return rc;
}

/* The batches gathered (a cast's targets, with rest; or ACKs, rest NULL) go down the routes. */
static int tree_send(mn_ctl_t *c, const char *rest, size_t rlen) {
  int rc = send_down(c, c->casting, c->ncasting, rest != NULL ? CAST_WIDTH : ACK_WIDTH, rest, rlen);
  mn__ctl_batch_done(c);
  return rc;
}

int mn__ctl_tree_cast_end(mn_ctl_t *c, const char *rest, size_t rlen) {
  settle_routes(c);
  return tree_send(c, rest, rlen);
}

/* ACKs take the routes casts took: a vouched agent hears nothing from the controller directly. */
int mn__ctl_tree_acks_end(mn_ctl_t *c) { return tree_send(c, NULL, 0); }

int mn__ctl_tree_route_spawn(mn_ctl_t *c, mn_conn_t *a) {
  if (!mn__ctl_tree_active(c) || a->ag->tree_pos < 0) return 0;
  answered_flush(c);
  settle(c, a);
  return a->ag->route != 0;
}

int mn__ctl_tree_spawn_end(mn_ctl_t *c, const int *ids, int n) { return send_down(c, ids, n, SPAWN_WIDTH, NULL, 0); }

int mn_ctl_take_linked(mn_ctl_t *c, mn_conn_t *a, const msgpack_object *m, char *err, size_t errlen) {
  uint64_t epoch, index;
  int up;
  int rc = mn_msg_parse_linked(m, &epoch, &index, &up, err, errlen);
  if (rc == 0) mn__ctl_tree_linked(c, a, epoch, index, up);
  return rc;
}

int mn__ctl_tree_unrelay_agent(mn_ctl_t *c) {
  /* The caller marked the tree for a rebuild. With every route direct (say, a host lost after another,
   * before the rebuild), nothing went through a parent: only the lost agent's own procs' calls move. */
  if (!mn__ctl_tree_active(c) || c->tree_routed == 0) return 0;
  unrelay_all(c, 1); /* its subtree's casts went through it: all of them go direct until the rebuild */
  return 1;
}

void mn_ctl_tree_stats(mn_ctl_t *c, int *active, int *up, int *routed, int *vouched) {
  answered_flush(c);
  *active = mn__ctl_tree_active(c);
  *up = *routed = *vouched = 0;
  for (int p = 0; p < c->ntree; p++) {
    mn_conn_t *a = mn_ctl_conn(c, c->tree[p]);
    *up += a->ag->tree_up;
    *routed += a->ag->route != 0;
    *vouched += mn__ctl_tree_vouched(c, a);
  }
}
