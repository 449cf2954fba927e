/*
 * ctl_relayed.c - relay-only procs: procs their agent reported with port 0
 * (a simulated agent's virtual procs, `monarch-worker --simulate`). They have
 * no link of their own, so no socket, no file descriptor and no heartbeat:
 * their agent stands for them. Every call to one is a cast through that agent
 * (ctl_cast.c); it keeps its own sequence numbers, pending ring and unacked
 * copies like any proc, so a lost agent link costs a resend, not a call: when
 * the agent is back, the unanswered calls go to it again. If the agent is
 * lost for good, they are lost with it, like the procs of a lost host.
 */
#include "ctl_int.h"

#include <stdio.h>

int mn_ctl_connect_relayed(mn_ctl_t *c, int agent, int64_t pid) {
  mn_conn_t *a = mn_ctl_conn(c, agent);
  if (a == NULL || a->kind != MN_CONN_AGENT || a->state != MN_CS_READY) return MN_EINVAL;
  mn_conn_t *k;
  int rc = mn__ctl_new_conn(c, MN_CONN_PROC, &k);
  if (rc != 0) return rc;
  k->state = MN_CS_READY;
  k->ever_ready = 1;
  k->relay_only = 1;
  k->via = agent;
  k->via_pid = (uint64_t)pid;
  k->info_pid = pid;
  if (mn__ctl_push_event(c, MN_EV_CONNECTED, k->id, pid, 0) != 0) return MN_ENOMEM;
  return k->id;
}

int mn_ctl_relay_only(const mn_conn_t *k) { return k->relay_only; }

/* The seq of a CALL frame in unacked (mn_msg_set_seq wrote it big-endian). */
static uint64_t frame_seq(const char *f) {
  uint64_t seq = 0;
  for (int j = 0; j < 8; j++) seq = seq << 8 | (uint8_t)f[MN_MSG_CALL_SEQ_OFFSET + j];
  return seq;
}

void mn__ctl_relayed_resend(mn_ctl_t *c, mn_conn_t *a, mn_conn_t *k) {
  size_t off = k->unacked_off;
  while (off + MN_MSG_CALL_HEAD <= k->unacked.len) {
    const char *f = k->unacked.data + off;
    size_t n = MN_FRAME_HEADER + mn_be32(f);
    uint64_t t[3] = {k->via_pid, frame_seq(f), (uint64_t)k->id};
    /* Out of memory: the rest stays unanswered; the script's timeout, if any, ends those calls. */
    if (mn_msg_pack_cast(&a->out, t, 1, f + MN_MSG_CALL_HEAD, n - MN_MSG_CALL_HEAD) != 0) break;
    off += n;
  }
  for (size_t i = 0; i < k->rcount; i++) k->ring[(k->rhead + i) & (k->rcap - 1)].relay = 1;
  k->on_relay = k->rcount;
  mn__ctl_set_dirty(c, a);
}

/* Agent a is back (same session): its relay-only procs' unanswered calls go to it again, as casts. */
static void relayed_back(mn_ctl_t *c, mn_conn_t *a) {
  for (int i = 1; i <= c->nconns; i++) {
    mn_conn_t *k = c->conns[i];
    /* A pooled proc without its link too (ctl_pool.c); one whose link is up sent them on it already. */
    if (mn__ctl_no_link(k) && k->via == a->id && k->state == MN_CS_READY && k->rcount > 0) mn__ctl_relayed_resend(c, a, k);
  }
}

/* Agent a is closed for good: its relay-only procs are closed with it. */
static void relayed_lost(mn_ctl_t *c, mn_conn_t *a) {
  for (int i = 1; i <= c->nconns; i++) {
    mn_conn_t *k = c->conns[i];
    if (!k->relay_only || k->via != a->id || k->state == MN_CS_CLOSED) continue;
    char why[1100];
    snprintf(why, sizeof(why), "its host agent is gone: %s", a->reason ? a->reason : "closed");
    mn_ctl_disconnect(c, k->id, why);
  }
}

void mn__ctl_relayed_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what) {
  if (k->kind != MN_CONN_AGENT) return;
  if (what == MN_CHANGE_BACK) relayed_back(c, k);
  /* Called after the agent's CLOSED event: the script hears of the host first. */
  if (what == MN_CHANGE_CLOSED && !c->closing) relayed_lost(c, k);
}
