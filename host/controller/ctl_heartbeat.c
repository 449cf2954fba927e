/*
 * ctl_heartbeat.c - the controller's heartbeat: every hb_ms it ends stalled
 * handshakes (a reconnect's unanswered connect included), declares silent
 * peers lost, PINGs the quiet ones the cast tree does not vouch for, and
 * sends procs their ACKs (every MN_ACK_TICKS ticks, through their agents and
 * down the tree where it can). Most ticks touch the agents only.
 */
#include "ctl_int.h"

#include <stdio.h>

/* Tells a proc the highest seq whose RESULT arrived, if that moved: it drops those from its replay cache. */
static void send_ack(mn_ctl_t *c, mn_conn_t *k) {
  if (k->acked <= k->ack_sent) return;
  k->ack_sent = k->acked;
  /* One ACKS frame per agent, not one write per proc (the hub says whether its agent can take it). */
  mn_route_t r = mn__ctl_route(c, k, MN_SEND_ACK, 0);
  if ((r == MN_ROUTE_RELAY || r == MN_ROUTE_TREE) && mn__ctl_relay_ack(c, k) == 0) return;
  /* Not gathered (out of memory): on its own link, if it has one; with none, the next ACK covers it. */
  if (r == MN_ROUTE_PARK || mn__ctl_no_link(k)) return;
  char f[16];
  mn_buf_t b = {f, 0, sizeof(f)}; /* an ACK is at most 14 bytes: the buffer never grows */
  if (mn_msg_pack_ack(&b, k->acked) == 0) mn_ctl_send(c, k, b.data, b.len);
}

/* One connection's heartbeat: a stalled handshake ends, a silent peer is lost, a quiet one is PINGed. */
static void heartbeat_conn(mn_ctl_t *c, mn_conn_t *k, uint64_t now) {
  /* A reconnect's connect that nothing answers (SYNs dropped) would wait for the kernel's minutes: it
   * ends with the handshake's limit, or the reconnect window, whichever comes first. */
  int redial = k->state == MN_CS_RECONNECTING && k->link != NULL;
  mn_conn_state_t ph = *mn__ctl_phase(k); /* a pooled proc's reopened link: its own handshake */
  if ((ph == MN_CS_HELLO || ph == MN_CS_WELCOME || ph == MN_CS_CONNECTING || redial) && k->link &&
      (now - k->link->started > MN_HANDSHAKE_TIMEOUT_MS || (redial && now - k->lost_at >= k->reconnect_ms))) {
    char msg[340];
    snprintf(msg, sizeof(msg), "no handshake from %s:%d within %d ms", k->host, k->port,
             (int)(now - k->link->started));
    mn__ctl_attempt_failed(k, msg);
    return;
  }
  if (k->state != MN_CS_READY) return;
  /* A pooled proc whose link failed while frames or direct calls (its agent gone) wait for it: again. */
  if (k->lazy && k->link == NULL && (k->pl->waiting.len > 0 || k->rcount > k->on_relay)) mn__ctl_pool_want(c, k, 1);
  if (k->kind == MN_CONN_PROC && (!c->proc_heartbeats || mn__ctl_no_link(k))) {
    send_ack(c, k); /* procs are watched by their agents (PROC_HUNG); they only hear how far we got */
    return;
  }
  if (k->kind == MN_CONN_AGENT && mn__ctl_tree_vouched(c, k)) {
    k->last_rx = now; /* its parent watches it; from LINKED false on, the silence counts here again */
    return;
  }
  if (now - k->last_rx > c->hb_timeout_ms) {
    char msg[96];
    snprintf(msg, sizeof(msg), "no heartbeat for %.1f s", (double)(now - k->last_rx) / 1e3);
    mn__ctl_conn_lost(k, msg);
    return;
  }
  char f[32];
  mn_buf_t b = {f, 0, sizeof(f)}; /* PING and ACK are at most 14 bytes each: the buffer never grows */
  /* Heard from within a quarter of the timeout: no PING this tick. An answer every other tick watches as
   * well (the default timeout is six ticks), and at thousands of hosts the PINGs are the idle cost. */
  if (now - k->last_rx >= c->hb_timeout_ms / 4 && mn_msg_pack_ping(&b, MN_HB_PING_BASE + c->hb_count) == 0) {
    mn_ctl_send(c, k, b.data, b.len);
    c->agent_pings += k->kind == MN_CONN_AGENT;
  }
  if (k->kind == MN_CONN_PROC) send_ack(c, k);
}

void mn__ctl_on_heartbeat(uv_timer_t *t) {
  mn_ctl_t *c = t->data;
  uint64_t now = uv_now(&c->loop);
  c->hb_count++;
  /* If this process itself did not run the loop for a while (the script
   * computed, or blocked, between waits), the silence is ours, not the
   * peers': their bytes may be waiting unread. Start counting afresh. */
  int stalled = c->last_tick != 0 && now - c->last_tick > c->hb_ms + c->hb_timeout_ms / 2;
  c->last_tick = now;
  if (stalled)
    for (int i = 1; i <= c->nconns; i++) {
      c->conns[i]->last_rx = now;
      if (c->conns[i]->link) c->conns[i]->link->started = now;
    }
  /* Procs only hear ACKs (their agents watch them) and start up rarely: every MN_ACK_TICKS ticks is
   * enough for them, and the other ticks touch the agents alone, not tens of thousands of procs. */
  if (c->proc_heartbeats || c->hb_count % MN_ACK_TICKS == 0) {
    for (int i = 1; i <= c->nconns; i++) heartbeat_conn(c, c->conns[i], now);
  } else {
    for (int i = 0; i < c->nagent_ids; i++) heartbeat_conn(c, c->conns[c->agent_ids[i]], now);
  }
  mn__ctl_relay_acks_end(c);
  if (c->npool > 0 || c->nwaitq > c->waitq_at) mn__ctl_pool_tick(c, now);
  mn__ctl_before_sleep(c); /* the loop may block right after this tick */
}
