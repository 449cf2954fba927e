/*
 * ctl_spawn.c - spawns down the cast tree. A mesh's SPAWNs are gathered
 * (mn_ctl_spawn_add) and sent together (mn_ctl_spawn_end): an agent whose
 * parent's link is up gets its SPAWN inside its top agent's, as subs, and
 * each agent hands its children theirs before starting its own procs
 * (host/agent/agent_tree.c), so the controller writes one frame per top
 * agent instead of one per host. Answers (SPAWNED, SPAWN_FAILED) come on
 * each agent's own connection: they are what the controller must hear of
 * each proc anyway, and they then need no relay to survive.
 *
 * A relay on the way may be lost before it hands a spawn on. So a spawn
 * sent through the tree is kept until its agent's first answer, and every
 * one still kept goes to its agent directly whenever relayed work is taken
 * off the tree (a lost agent or link, a rebuild: mn__ctl_spawn_resend). The
 * agent remembers its latest SPAWN reqs and drops a second copy, so no proc
 * is started twice.
 */
#include "ctl_int.h"

#include <stdlib.h>
#include <string.h>

static int send_direct(mn_ctl_t *c, mn_conn_t *a, const char *body, size_t n) {
  mn_buf_t b;
  mn_buf_init(&b);
  int rc = mn_msg_pack_spawn_body(&b, body, n);
  if (rc == 0) rc = mn_ctl_send(c, a, b.data, b.len);
  mn_buf_free(&b);
  return rc;
}

static void forget(mn_agent_part_t *g) {
  g->spawn_req = 0;
  g->spawn.len = 0;
}

int mn_ctl_spawn_add(mn_ctl_t *c, mn_conn_t *a, uint64_t req, const char *body, size_t n) {
  mn_agent_part_t *g = a->ag;
  if (g == NULL || req == 0) return MN_EPROTO;
  if (c->spawning == NULL && (c->spawning = calloc((size_t)MN_MAX_CONNS, sizeof(int))) == NULL) return MN_ENOMEM;
  /* One kept already (from this list, or an earlier one not answered yet): it stays, this one goes directly. */
  if (g->spawn_req != 0 || !mn__ctl_tree_route_spawn(c, a)) return send_direct(c, a, body, n);
  g->spawn.len = 0;
  if (mn_buf_append(&g->spawn, body, n) != 0) return MN_ENOMEM;
  g->spawn_req = req;
  g->spawn_new = 1;
  c->spawning[c->nspawning++] = a->id;
  return 0;
}

int mn_ctl_spawn_end(mn_ctl_t *c) {
  int rc = c->nspawning > 0 ? mn__ctl_tree_spawn_end(c, c->spawning, c->nspawning) : 0;
  for (int i = 0; i < c->nspawning; i++) mn_ctl_conn(c, c->spawning[i])->ag->spawn_new = 0;
  c->spawn_relayed += (uint64_t)c->nspawning;
  c->nspawning = 0;
  return rc;
}

void mn__ctl_spawn_resend(mn_ctl_t *c) {
  for (int i = 0; i < c->nagent_ids; i++) {
    mn_conn_t *a = c->conns[c->agent_ids[i]];
    if (a->ag->spawn_req == 0 || a->ag->route == 0 || a->state == MN_CS_CLOSED) continue;
    if (send_direct(c, a, a->ag->spawn.data, a->ag->spawn.len) == 0) c->spawn_resent++;
    forget(a->ag);
  }
}

void mn_ctl_spawn_answered(mn_conn_t *a, const msgpack_object *m) {
  uint64_t req;
  if (a->ag != NULL && a->ag->spawn_req != 0 && mn_get_u64(m, 1, &req) == 0 && req == a->ag->spawn_req) forget(a->ag);
}
