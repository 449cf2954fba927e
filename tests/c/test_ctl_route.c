/*
 * test_ctl_route.c - unit tests for the controller's routing hub
 * (host/controller/ctl_route.c): each answer of mn__ctl_route (direct,
 * relay, tree, park) from a conn state built by hand, the senders acting
 * on it (a CALL queued on the proc's link, gathered into its agent's CAST,
 * or kept), and mn__ctl_conn_changed telling the modules of an agent lost,
 * back and closed. No sockets: conns are made without links, and what a
 * sender did is read from their buffers and rings.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "ctl_int.h"
#include "msg.h"

/* ---- fixture: a controller with one ready agent -------------------------- */

typedef struct {
  mn_ctl_t c;
  mn_conn_t *agent;
  mn_buf_t frame; /* a CALL of "noop" with no arguments */
} fx_t;

static int setup(void **state) {
  fx_t *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  assert_int_equal(mn_ctl_init(&f->c, "token", 5), 0);
  assert_int_equal(mn__ctl_new_conn(&f->c, MN_CONN_AGENT, &f->agent), 0);
  f->agent->state = MN_CS_READY;
  f->agent->ever_ready = 1;
  f->agent->reconnect_ms = 5000;
  mn_buf_init(&f->frame);
  msgpack_packer pk;
  size_t start = mn_msg_call_head(&f->frame, &pk, "noop", 4, 0);
  mn_frame_end(&f->frame, start);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx_t *f = *state;
  mn_ctl_close(&f->c);
  mn_buf_free(&f->frame);
  free(f);
  return 0;
}

/* A ready proc of f's agent, with a link of its own unless relay_only (no link is dialled: none is needed). */
static mn_conn_t *proc(fx_t *f, int relay_only) {
  mn_conn_t *k;
  assert_int_equal(mn__ctl_new_conn(&f->c, MN_CONN_PROC, &k), 0);
  k->state = MN_CS_READY;
  k->ever_ready = 1;
  k->via = f->agent->id;
  k->via_pid = 1000 + (uint64_t)k->id;
  k->relay_only = (uint8_t)relay_only;
  return k;
}

static mn_route_t route(fx_t *f, mn_conn_t *k, mn_send_t what) {
  return mn__ctl_route(&f->c, k, what, f->frame.len);
}

/* Makes the tree active: more agents in it than the fan-out it was built for. */
static void tree_on(fx_t *f) {
  f->c.tree_k = 2;
  f->c.ntree = 3;
}

/* ---- the decision ----------------------------------------------------------- */

static void direct_on_its_own_link(void **state) {
  fx_t *f = *state;
  mn_conn_t *k = proc(f, 0);
  assert_int_equal(route(f, k, MN_SEND_ONE), MN_ROUTE_DIRECT);
  assert_int_equal(route(f, k, MN_SEND_CALL), MN_ROUTE_DIRECT);
  assert_int_equal(route(f, k, MN_SEND_RESEND), MN_ROUTE_DIRECT);
  /* A mesh-wide call's target goes direct when a call is in flight on its link (order), when the call is
   * too large to be worth the agent's copy, and when it has no agent. */
  k->rcount = 1;
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_DIRECT);
  k->rcount = 0;
  assert_int_equal(mn__ctl_route(&f->c, k, MN_SEND_CAST, MN_MSG_CALL_HEAD + (64u << 10) + 1), MN_ROUTE_DIRECT);
  k->via = 0;
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_DIRECT);
  assert_int_equal(route(f, k, MN_SEND_ACK), MN_ROUTE_DIRECT);
}

static void relay_for_a_cast_or_behind_relayed_calls(void **state) {
  fx_t *f = *state;
  mn_conn_t *k = proc(f, 0);
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_RELAY);
  assert_int_equal(route(f, k, MN_SEND_ACK), MN_ROUTE_RELAY);
  /* Calls in flight through the agent: every later call follows them, a call to one proc too. */
  k->on_relay = 1;
  k->rcount = 1;
  assert_int_equal(route(f, k, MN_SEND_ONE), MN_ROUTE_RELAY);
  assert_int_equal(route(f, k, MN_SEND_CALL), MN_ROUTE_RELAY);
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_RELAY);
  /* A relay-only proc has no other way. */
  mn_conn_t *r = proc(f, 1);
  assert_int_equal(route(f, r, MN_SEND_ONE), MN_ROUTE_RELAY);
  assert_int_equal(route(f, r, MN_SEND_RESEND), MN_ROUTE_RELAY);
}

static void tree_while_it_is_active(void **state) {
  fx_t *f = *state;
  mn_conn_t *k = proc(f, 0), *r = proc(f, 1);
  assert_int_equal(mn__ctl_route_batch(&f->c), MN_ROUTE_RELAY);
  tree_on(f);
  assert_int_equal(mn__ctl_route_batch(&f->c), MN_ROUTE_TREE);
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_TREE);
  assert_int_equal(route(f, k, MN_SEND_ACK), MN_ROUTE_TREE);
  assert_int_equal(route(f, r, MN_SEND_ONE), MN_ROUTE_TREE);
  assert_int_equal(route(f, k, MN_SEND_ONE), MN_ROUTE_DIRECT);
  /* A resend to a link-less proc goes to its agent itself, whatever the tree (a relay on the way was lost). */
  assert_int_equal(route(f, r, MN_SEND_RESEND), MN_ROUTE_RELAY);
}

static void park_with_no_way(void **state) {
  fx_t *f = *state;
  mn_conn_t *r = proc(f, 1), *k = proc(f, 0);
  mn_conn_t *p = proc(f, 0);
  p->lazy = 1; /* pooled, its link closed */
  f->agent->state = MN_CS_RECONNECTING;
  assert_int_equal(route(f, r, MN_SEND_ONE), MN_ROUTE_PARK);
  assert_int_equal(route(f, r, MN_SEND_CAST), MN_ROUTE_PARK);
  assert_int_equal(route(f, r, MN_SEND_RESEND), MN_ROUTE_PARK);
  assert_int_equal(route(f, r, MN_SEND_ACK), MN_ROUTE_PARK);
  assert_int_equal(route(f, p, MN_SEND_CALL), MN_ROUTE_PARK);
  /* A proc with a link goes direct meanwhile; one reconnecting keeps its resends for its own reconnect. */
  assert_int_equal(route(f, k, MN_SEND_CAST), MN_ROUTE_DIRECT);
  k->state = MN_CS_RECONNECTING;
  assert_int_equal(route(f, k, MN_SEND_RESEND), MN_ROUTE_PARK);
  /* Its agent back: the pooled proc's calls go through it while its link is closed. */
  f->agent->state = MN_CS_READY;
  assert_int_equal(route(f, p, MN_SEND_CALL), MN_ROUTE_RELAY);
  p->direct = 1;
  assert_int_equal(route(f, p, MN_SEND_CALL), MN_ROUTE_DIRECT);
}

/* ---- the senders act on it ------------------------------------------------- */

static void senders_queue_gather_or_keep(void **state) {
  fx_t *f = *state;
  mn_conn_t *k1 = proc(f, 0), *k2 = proc(f, 0), *r = proc(f, 1);
  /* DIRECT: the frame is in k1's output and its unacked copy. */
  assert_int_equal(mn_ctl_call(&f->c, k1, f->frame.data, f->frame.len, 1, 1), 0);
  assert_int_equal(mn_ctl_cast_end(&f->c, f->frame.data, f->frame.len), 0);
  assert_int_equal(k1->out.len, f->frame.len);
  assert_int_equal(k1->unacked.len, f->frame.len);
  assert_int_equal(k1->on_relay, 0);
  /* RELAY: a mesh-wide call's targets gathered, one CAST for the agent, no copy per proc. k1 has a direct
   * call in flight, so its call follows that one on its link. */
  for (int i = 0; i < 3; i++) {
    mn_conn_t *k = i == 0 ? k1 : i == 1 ? k2 : r;
    assert_int_equal(mn_ctl_cast_add(&f->c, k, f->frame.data, f->frame.len, 2, i + 1, 1), 0);
  }
  assert_int_equal(mn_ctl_cast_end(&f->c, f->frame.data, f->frame.len), 0);
  assert_int_equal(f->c.casts, 1);
  assert_int_equal(f->c.cast_calls, 2);
  assert_true(f->agent->out.len > 0);
  assert_int_equal(k1->on_relay, 0);
  assert_int_equal(k1->out.len, 2 * f->frame.len);
  assert_int_equal(k2->on_relay, 1);
  assert_int_equal(k2->unacked.len, 0);
  assert_int_equal(k2->out.len, 0);
  assert_int_equal(r->on_relay, 1);
  /* Behind its relayed call, k2's call to one proc goes the same way. */
  assert_int_equal(mn_ctl_call(&f->c, k2, f->frame.data, f->frame.len, 3, 1), 0);
  assert_int_equal(mn_ctl_cast_end(&f->c, f->frame.data, f->frame.len), 0);
  assert_int_equal(k2->on_relay, 2);
  assert_int_equal(k2->out.len, 0);
  /* PARK: the agent away, relay-only r's next call is kept in unacked, nothing written anywhere. */
  f->agent->state = MN_CS_RECONNECTING;
  f->agent->out.len = 0;
  size_t before = r->unacked.len;
  assert_int_equal(mn_ctl_call(&f->c, r, f->frame.data, f->frame.len, 4, 1), 0);
  assert_int_equal(r->rcount, 2);
  assert_int_equal(r->unacked.len, before + f->frame.len);
  assert_int_equal(f->agent->out.len, 0);
}

/* ---- the hook: a conn's change told to the modules ------------------------------- */

static void an_agent_lost_and_back_moves_its_relayed_calls(void **state) {
  fx_t *f = *state;
  mn_conn_t *k = proc(f, 0), *r = proc(f, 1);
  assert_int_equal(mn_ctl_cast_add(&f->c, k, f->frame.data, f->frame.len, 1, 1, 1), 0);
  assert_int_equal(mn_ctl_cast_add(&f->c, r, f->frame.data, f->frame.len, 1, 2, 1), 0);
  assert_int_equal(mn_ctl_cast_end(&f->c, f->frame.data, f->frame.len), 0);
  assert_int_equal(k->on_relay + r->on_relay, 2);
  /* Lost: k's call is rebuilt from the cast's bytes and resent on its own link; r's waits for the agent. */
  mn__ctl_conn_lost(f->agent, "test");
  assert_int_equal(f->agent->state, MN_CS_RECONNECTING);
  assert_int_equal(k->on_relay, 0);
  assert_int_equal(k->out.len, f->frame.len);
  assert_int_equal(r->on_relay, 0);
  assert_int_equal(r->unacked.len, f->frame.len);
  /* Back (same session): r's unanswered call goes to the agent again as a CAST, and the tree is to be rebuilt. */
  f->agent->state = MN_CS_READY;
  f->agent->out.len = 0;
  f->c.tree_dirty = 0;
  assert_int_equal(mn__ctl_conn_changed(&f->c, f->agent, MN_CHANGE_BACK), 0);
  assert_int_equal(r->on_relay, 1);
  assert_true(f->agent->out.len > 0);
  assert_int_equal(f->c.tree_dirty, 1);
}

static void an_agent_closed_closes_its_relay_only_procs_after_its_event(void **state) {
  fx_t *f = *state;
  mn_conn_t *k = proc(f, 0), *r = proc(f, 1);
  mn_ctl_events_done(&f->c);
  mn_ctl_disconnect(&f->c, f->agent->id, "gone");
  assert_int_equal(r->state, MN_CS_CLOSED);
  assert_int_equal(k->state, MN_CS_READY); /* a proc with its own link is its agent's report to end */
  size_t n;
  const mn_event_t *ev = mn_ctl_events(&f->c, &n);
  assert_int_equal(n, 2);
  assert_int_equal(ev[0].kind, MN_EV_CLOSED);
  assert_int_equal(ev[0].conn, f->agent->id);
  assert_int_equal(ev[1].conn, r->id);
  assert_non_null(strstr(r->reason, "its host agent is gone"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(direct_on_its_own_link, setup, teardown),
      cmocka_unit_test_setup_teardown(relay_for_a_cast_or_behind_relayed_calls, setup, teardown),
      cmocka_unit_test_setup_teardown(tree_while_it_is_active, setup, teardown),
      cmocka_unit_test_setup_teardown(park_with_no_way, setup, teardown),
      cmocka_unit_test_setup_teardown(senders_queue_gather_or_keep, setup, teardown),
      cmocka_unit_test_setup_teardown(an_agent_lost_and_back_moves_its_relayed_calls, setup, teardown),
      cmocka_unit_test_setup_teardown(an_agent_closed_closes_its_relay_only_procs_after_its_event, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
