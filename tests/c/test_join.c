/*
 * test_join.c - unit tests for host/core/join.c: the JOIN exchange on a
 * controller's join port, driven through its pure functions from both
 * ends (the controller's listener and the agent that joins), with right
 * and wrong tokens, replays, tampering and the address rules.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "join.h"

/* One frame decoded; the body is copied because decoded strings point into it. */
typedef struct {
  char *body;
  msgpack_zone zone;
  msgpack_object obj;
} frame_t;

static void take(mn_buf_t *b, frame_t *f) {
  const char *body;
  char err[256] = "";
  int64_t n = mn_frame_peek(b->data, b->len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  f->body = malloc((size_t)n);
  assert_non_null(f->body);
  memcpy(f->body, body, (size_t)n);
  mn_buf_consume(b, MN_FRAME_HEADER + (size_t)n);
  assert_true(msgpack_zone_init(&f->zone, 1024));
  assert_int_equal(mn_decode(f->body, (size_t)n, &f->zone, &f->obj, err, sizeof(err)), 0);
}

static void drop(frame_t *f) {
  msgpack_zone_destroy(&f->zone);
  free(f->body);
}

static void key(mn_auth_t *a, const char *token) { assert_int_equal(mn_auth_init(a, token, strlen(token)), 0); }

/* The two ends' state: what a listener and a joining agent keep. */
typedef struct {
  mn_auth_t ctl_key, agent_key;
  uint8_t ctl_nj[MN_NONCE_LEN];                 /* the listener's */
  uint8_t ag_nj[MN_NONCE_LEN], ag_na[MN_NONCE_LEN]; /* the agent's copies */
  char addr[MN_MSG_JOIN_MAX_ADDR + 1];
  char err[400];
  mn_buf_t wire;
} ends_t;

static void ends(ends_t *e, const char *ctl_token, const char *agent_token) {
  memset(e, 0, sizeof(*e));
  key(&e->ctl_key, ctl_token);
  key(&e->agent_key, agent_token);
  mn_buf_init(&e->wire);
}

/* HELLO from the listener, answered by the agent with JOIN for addr; returns mn_join_answer's code. */
static int greet_and_answer(ends_t *e, const char *addr) {
  frame_t f;
  assert_int_equal(mn_join_hello(&e->wire, e->ctl_nj), 0);
  take(&e->wire, &f);
  int rc = mn_join_answer(&e->wire, &e->agent_key, &f.obj, addr, e->ag_nj, e->ag_na, e->err, sizeof(e->err));
  drop(&f);
  return rc;
}

/* The listener takes the JOIN on the wire; returns mn_join_accept's code. */
static int accept_join(ends_t *e) {
  frame_t f;
  take(&e->wire, &f);
  int rc = mn_join_accept(&e->wire, &e->ctl_key, &f.obj, e->ctl_nj, e->addr, sizeof(e->addr), e->err, sizeof(e->err));
  drop(&f);
  return rc;
}

static int check_joined(ends_t *e) {
  frame_t f;
  take(&e->wire, &f);
  int rc = mn_join_check_joined(&e->agent_key, &f.obj, e->ag_nj, e->ag_na, e->err, sizeof(e->err));
  drop(&f);
  return rc;
}

static void test_join_ok(void **state) {
  (void)state;
  ends_t e;
  ends(&e, "cluster", "cluster");
  assert_int_equal(greet_and_answer(&e, "10.1.2.3:7000"), 0);
  assert_memory_equal(e.ag_nj, e.ctl_nj, MN_NONCE_LEN);
  assert_int_equal(accept_join(&e), 0);
  assert_string_equal(e.addr, "10.1.2.3:7000");
  assert_int_equal(check_joined(&e), 0);
  assert_int_equal(e.wire.len, 0);
  /* IPv6 in brackets too. */
  assert_int_equal(greet_and_answer(&e, "[fd00::7]:41000"), 0);
  assert_int_equal(accept_join(&e), 0);
  assert_string_equal(e.addr, "[fd00::7]:41000");
  mn_buf_free(&e.wire);
}

static void test_join_wrong_token(void **state) {
  (void)state;
  ends_t e;
  ends(&e, "cluster", "guess");
  assert_int_equal(greet_and_answer(&e, "10.1.2.3:7000"), 0);
  assert_int_equal(accept_join(&e), MN_EAUTH);
  assert_string_equal(e.err, "authentication failed: wrong cluster token");
  assert_string_equal(e.addr, ""); /* nothing to dial */
  assert_int_equal(e.wire.len, 0); /* and no JOINED */
  mn_buf_free(&e.wire);
}

/* A JOIN recorded from one exchange is refused in the next (a fresh nonce), and so is one whose address was changed. */
static void test_join_replay_and_tamper(void **state) {
  (void)state;
  ends_t e;
  ends(&e, "cluster", "cluster");
  assert_int_equal(greet_and_answer(&e, "10.1.2.3:7000"), 0);
  mn_buf_t recorded;
  mn_buf_init(&recorded);
  assert_int_equal(mn_buf_append(&recorded, e.wire.data, e.wire.len), 0);
  assert_int_equal(accept_join(&e), 0);
  e.wire.len = 0;
  frame_t f;
  assert_int_equal(mn_join_hello(&e.wire, e.ctl_nj), 0); /* a new connection */
  take(&e.wire, &f);
  drop(&f);
  assert_int_equal(mn_buf_append(&e.wire, recorded.data, recorded.len), 0);
  assert_int_equal(accept_join(&e), MN_EAUTH);

  /* The same exchange with the address rewritten in flight: one byte of "7000" becomes "7001". */
  e.wire.len = 0;
  assert_int_equal(greet_and_answer(&e, "10.1.2.3:7000"), 0);
  char *p = memmem(e.wire.data, e.wire.len, "7000", 4);
  assert_non_null(p);
  p[3] = '1';
  assert_int_equal(accept_join(&e), MN_EAUTH);
  mn_buf_free(&recorded);
  mn_buf_free(&e.wire);
}

/* An agent learns when the listener does not hold the token, or sent an ERROR instead. */
static void test_join_fake_controller(void **state) {
  (void)state;
  ends_t e, fake;
  ends(&e, "cluster", "cluster");
  ends(&fake, "other", "other");
  assert_int_equal(greet_and_answer(&e, "10.1.2.3:7000"), 0);
  frame_t f;
  take(&e.wire, &f);
  /* The fake accepts with its own key: its JOINED is right for itself, wrong for us. */
  uint8_t mac[MN_MAC_LEN];
  mn_auth_mac(&fake.ctl_key, 'J', e.ag_na, e.ag_nj, mac);
  drop(&f);
  assert_int_equal(mn_msg_pack_joined(&e.wire, mac), 0);
  assert_int_equal(check_joined(&e), MN_EAUTH);
  assert_non_null(strstr(e.err, "failed to prove it holds the cluster token"));
  /* An ERROR: its code and text reach the agent. */
  assert_int_equal(mn_msg_pack_error(&e.wire, MN_ELIMIT, "too many joins"), 0);
  assert_int_equal(check_joined(&e), MN_ELIMIT);
  assert_string_equal(e.err, "too many joins");
  assert_int_equal(mn_msg_pack_error(&e.wire, 5, "odd code"), 0);
  assert_int_equal(check_joined(&e), MN_EPEER);
  mn_buf_free(&e.wire);
  mn_buf_free(&fake.wire);
}

/* What an agent makes of a peer that is not a join port. */
static void test_join_not_a_join_port(void **state) {
  (void)state;
  ends_t e;
  frame_t f;
  uint8_t n[MN_NONCE_LEN] = {0};
  ends(&e, "cluster", "cluster");
  assert_int_equal(mn_msg_pack_hello(&e.wire, n, "agent"), 0);
  take(&e.wire, &f);
  assert_int_equal(mn_join_answer(&e.wire, &e.agent_key, &f.obj, "1.2.3.4:5", e.ag_nj, e.ag_na, e.err, sizeof(e.err)),
                   MN_EPROTO);
  assert_string_equal(e.err, "the peer is a monarch agent, not a controller's join port");
  drop(&f);
  assert_int_equal(mn_msg_pack_ping(&e.wire, 1), 0);
  take(&e.wire, &f);
  assert_int_equal(mn_join_answer(&e.wire, &e.agent_key, &f.obj, "1.2.3.4:5", e.ag_nj, e.ag_na, e.err, sizeof(e.err)),
                   MN_EPROTO);
  assert_non_null(strstr(e.err, "did not greet with HELLO"));
  drop(&f);
  assert_int_equal(e.wire.len, 0);
  mn_buf_free(&e.wire);
}

/* The listener refuses what is not a JOIN, a JOIN of another version, and an address it would not dial. */
static void test_join_accept_refusals(void **state) {
  (void)state;
  ends_t e;
  frame_t f;
  ends(&e, "cluster", "cluster");
  assert_int_equal(mn_join_hello(&e.wire, e.ctl_nj), 0);
  take(&e.wire, &f);
  drop(&f);
  assert_int_equal(mn_msg_pack_auth(&e.wire, e.ctl_nj, e.ctl_nj), 0);
  assert_int_equal(accept_join(&e), MN_EPROTO);
  assert_string_equal(e.err, "expected JOIN as the first message, got type 2");
  static const char *bad[] = {"localhost:7000", "10.1.2.3", "10.1.2.3:0", "10.1.2.3:65536", "10.1.2.3:70a",
                              "10.1.2:7000", "fd00::7:7000", "[fd00::7:7000", "[nonsense]:7000", ":7000",
                              "10.1.2.3:123456"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    e.wire.len = 0;
    assert_int_equal(greet_and_answer(&e, bad[i]), 0);
    assert_int_equal(accept_join(&e), MN_EPROTO);
    if (strstr(e.err, "is not a numeric") == NULL) print_error("%s: %s\n", bad[i], e.err);
    assert_non_null(strstr(e.err, "is not a numeric"));
    assert_int_equal(e.wire.len, 0);
  }
  assert_int_equal(mn_join_check_addr("127.0.0.1:1"), 0);
  assert_int_equal(mn_join_check_addr("[::1]:65535"), 0);
  mn_buf_free(&e.wire);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_join_ok),
      cmocka_unit_test(test_join_wrong_token),
      cmocka_unit_test(test_join_replay_and_tamper),
      cmocka_unit_test(test_join_fake_controller),
      cmocka_unit_test(test_join_not_a_join_port),
      cmocka_unit_test(test_join_accept_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
