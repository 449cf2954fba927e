/*
 * ctl_ship.c - a shipped file's chunks, down the cast tree. The agents that
 * lack a file (lua/monarch/ship.lua asked them: SHIP_ASK) get each chunk as
 * SHIP_DATA; one whose parent's link is up gets it inside its top agent's
 * frame, as subs, and every agent hands it on to the children named there
 * before it keeps its own copy (host/agent/agent_tree.c), so the controller
 * writes one copy per top agent (at most `fanout`), not one per host. An
 * agent on the way that has the file already is marked self = false: it only
 * hands the chunk on.
 *
 * Answers (SHIP_STATE) come on each agent's own connection, as SPAWN's do,
 * so a relay lost on the way loses no answer: ship.lua sends the file again
 * directly (direct = 1) to each agent that did not say "cached".
 */
#include "ctl_int.h"

#include "ship.h"

#include <stdlib.h>

enum { WANTS = 1, PASSES = 2 }; /* ship_mark: the agent keeps the chunk, hands it on, or both */

static uint32_t nsubs(mn_ctl_t *c, mn_conn_t *a) {
  uint32_t n = 0;
  for (int j = 0;; j++) {
    mn_conn_t *ch = mn__ctl_tree_child(c, a, j);
    if (ch == NULL) return n;
    n += ch->ag->ship_mark != 0 && mn__ctl_tree_linked_parent(c, ch) == a;
  }
}

/* a's subs: an (index, self, subs) triple per marked child reached through a. */
static int pack_subs(mn_ctl_t *c, msgpack_packer *pk, mn_conn_t *a) {
  int f = 0;
  for (int j = 0;; j++) {
    mn_conn_t *ch = mn__ctl_tree_child(c, a, j);
    if (ch == NULL) return f;
    if (ch->ag->ship_mark == 0 || mn__ctl_tree_linked_parent(c, ch) != a) continue;
    f |= msgpack_pack_uint64(pk, (uint64_t)j);
    f |= (ch->ag->ship_mark & WANTS) ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    f |= msgpack_pack_array(pk, 3 * nsubs(c, ch)) | pack_subs(c, pk, ch);
  }
}

static int send_root(mn_ctl_t *c, mn_conn_t *r, const uint8_t *hash, uint64_t size, uint64_t offset,
                     const char *chunk, size_t len) {
  msgpack_packer pk;
  size_t start;
  int f = mn_msg_ship_data_head(&r->out, &pk, &start, hash, size, offset, chunk, len, r->ag->ship_mark & WANTS,
                                nsubs(c, r));
  if (f == 0) f = pack_subs(c, &pk, r);
  if (f != 0) {
    r->out.len = start;
    return MN_ENOMEM;
  }
  mn_frame_end(&r->out, start);
  mn__ctl_set_dirty(c, r);
  /* Out now, not when the script next waits: the agent takes (and hashes) this chunk while the next is packed. */
  mn__ctl_flush_now(r);
  c->ship_bytes += len;
  c->ship_frames++;
  return 0;
}

/* Marks a as wanting the chunk and each parent on its linked way as passing it; returns the top one. */
static mn_conn_t *mark_way(mn_ctl_t *c, mn_conn_t *a, int direct) {
  a->ag->ship_mark |= WANTS;
  mn_conn_t *top = a;
  for (mn_conn_t *p; !direct && (p = mn__ctl_tree_linked_parent(c, top)) != NULL; top = p) p->ag->ship_mark |= PASSES;
  return top;
}

int mn_ctl_ship_data(mn_ctl_t *c, const int *ids, int n, const uint8_t *hash, uint64_t size, uint64_t offset,
                     const char *chunk, size_t len, int direct) {
  int *tops = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), ntops = 0, rc = 0;
  if (tops == NULL) return MN_ENOMEM;
  for (int i = 0; i < n; i++) {
    mn_conn_t *a = mn_ctl_conn(c, ids[i]);
    if (a == NULL || a->ag == NULL || a->state != MN_CS_READY) continue;
    mn_conn_t *top = mark_way(c, a, direct);
    int seen = 0;
    for (int t = 0; t < ntops && !seen; t++) seen = tops[t] == top->id;
    if (!seen) tops[ntops++] = top->id;
  }
  for (int t = 0; t < ntops && rc == 0; t++) rc = send_root(c, mn_ctl_conn(c, tops[t]), hash, size, offset, chunk, len);
  for (int i = 0; i < c->nagent_ids; i++) c->conns[c->agent_ids[i]]->ag->ship_mark = 0;
  free(tops);
  return rc;
}

size_t mn_ctl_agents_pending(mn_ctl_t *c) {
  size_t n = 0;
  for (int i = 0; i < c->nagent_ids; i++) {
    mn_conn_t *a = c->conns[c->agent_ids[i]];
    n += a->out.len;
    if (a->link != NULL) n += uv_stream_get_write_queue_size((uv_stream_t *)&a->link->tcp);
  }
  return n;
}
