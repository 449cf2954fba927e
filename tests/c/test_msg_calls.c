/*
 * test_msg_calls.c - unit tests for host/core/msg.c: the messages of calls
 * and results (CALL heads, PUT and LOST, RESULT, cast results, ACKS, the
 * tree's messages, the RESULTS reader, PONG), built, round-tripped and
 * refused when malformed, as test_msg.c does for the rest.
 */
#include "msg_helpers.h"

/* ---- calls and results ---------------------------------------------------------------- */

static void test_call_head(void **state) {
  (void)state;
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  /* docs/protocol.md section 12: CALL noop, seq 1, no arguments. */
  size_t s = mn_msg_call_head(&b, &pk, "noop", 4, 0);
  mn_frame_end(&b, s);
  mn_msg_set_seq(b.data, 1);
  static const unsigned char want[] = {0, 0, 0, 0x11, 0x94, 0x14, 0xcf, 0, 0, 0, 0, 0, 0, 0, 1,
                                       0xa4, 'n', 'o', 'o', 'p', 0x90};
  expect_bytes(b.data, b.len, want, sizeof(want));
  mn_buf_free(&b);

  /* With arguments packed after the head, then a new seq patched in. */
  mn_buf_init(&b);
  s = mn_msg_call_head(&b, &pk, "__load", 6, 1);
  mn_pack_cstr(&pk, "basic");
  mn_frame_end(&b, s);
  mn_msg_set_seq(b.data, 0x0102030405060708ull);
  msg_t m;
  take(&b, &m);
  mn_msg_call_t c;
  assert_int_equal(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), 0);
  assert_int_equal(c.seq, 0x0102030405060708ull);
  assert_int_equal(c.kernel_len, 6);
  assert_memory_equal(c.kernel, "__load", 6);
  assert_int_equal(c.args->via.array.size, 1);
  done(&m);
}

static void test_call_malformed(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_call_t c;
  hand(&b, "usua", (uint64_t)MN_MSG_CALL, "2", (uint64_t)0);
  take(&b, &m);
  expect_named(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), m.err, "malformed CALL: want [20, seq, kernel, args]", "seq");
  done(&m);
  hand(&b, "uuua", (uint64_t)MN_MSG_CALL, (uint64_t)2, (uint64_t)7);
  take(&b, &m);
  expect_named(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), m.err, "CALL", "kernel");
  done(&m);
  hand(&b, "uuss", (uint64_t)MN_MSG_CALL, (uint64_t)2, "noop", "args");
  take(&b, &m);
  expect_named(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), m.err, "CALL", "args");
  done(&m);
  hand(&b, "uusan", (uint64_t)MN_MSG_CALL, (uint64_t)2, "noop");
  take(&b, &m);
  expect_named(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), m.err, "CALL", "5 elements");
  done(&m);
}

static void test_put_and_lost(void **state) {
  (void)state;
  char head[MN_MSG_PUT_HEAD];
  size_t h = mn_msg_put_head(head, 7, 4096, 3);
  assert_int_equal(h, MN_MSG_PUT_HEAD);
  mn_msg_set_seq(head, 9);
  /* With its 3 payload bytes it is one whole frame: [CALL, 9, "__tensor_put", [7, 4096, bin]]. */
  mn_buf_t b;
  mn_buf_init(&b);
  assert_int_equal(mn_buf_append(&b, head, h), 0);
  assert_int_equal(mn_buf_append(&b, "xyz", 3), 0);
  msg_t m;
  take(&b, &m);
  mn_msg_call_t c;
  assert_int_equal(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), 0);
  assert_int_equal(c.seq, 9);
  assert_memory_equal(c.kernel, "__tensor_put", 12);
  assert_int_equal(c.args->via.array.size, 3);
  assert_int_equal(c.args->via.array.ptr[0].via.u64, 7);
  assert_int_equal(c.args->via.array.ptr[1].via.u64, 4096);
  assert_int_equal(c.args->via.array.ptr[2].via.bin.size, 3);
  assert_memory_equal(c.args->via.array.ptr[2].via.bin.ptr, "xyz", 3);
  done(&m);

  char lost[MN_MSG_LOST_LEN];
  assert_int_equal(mn_msg_lost_call(lost, 9), MN_MSG_LOST_LEN);
  mn_buf_init(&b);
  assert_int_equal(mn_buf_append(&b, lost, sizeof(lost)), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_call(&m.obj, &c, m.err, sizeof(m.err)), 0);
  assert_int_equal(c.seq, 9);
  assert_int_equal(c.kernel_len, 6);
  assert_memory_equal(c.kernel, "__lost", 6);
  assert_int_equal(c.args->via.array.size, 0);
  done(&m);
}

static void test_result(void **state) {
  (void)state;
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  /* docs/protocol.md section 12: [21, 3, true, []]. */
  size_t s = mn_msg_result_head(&b, &pk, 3, 1);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, s);
  static const unsigned char want[] = {0, 0, 0, 5, 0x94, 0x15, 0x03, 0xc3, 0x90};
  expect_bytes(b.data, b.len, want, sizeof(want));
  msg_t m;
  take(&b, &m);
  mn_msg_result_t r;
  assert_int_equal(mn_msg_parse_result(&m.obj, &r, m.err, sizeof(m.err)), 0);
  assert_int_equal(r.seq, 3);
  assert_true(r.ok);
  assert_int_equal(r.value->type, MSGPACK_OBJECT_ARRAY);
  done(&m);

  mn_buf_init(&b);
  s = mn_msg_result_head(&b, &pk, 1ull << 33, 0);
  mn_pack_cstr(&pk, "bad");
  mn_frame_end(&b, s);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_result(&m.obj, &r, m.err, sizeof(m.err)), 0);
  assert_int_equal(r.seq, 1ull << 33);
  assert_false(r.ok);
  done(&m);

  hand(&b, "uuna", (uint64_t)MN_MSG_RESULT, (uint64_t)1);
  take(&b, &m);
  expect_named(mn_msg_parse_result(&m.obj, &r, m.err, sizeof(m.err)), m.err, "RESULT", "ok");
  done(&m);
  hand(&b, "uut", (uint64_t)MN_MSG_RESULT, (uint64_t)1);
  take(&b, &m);
  expect_named(mn_msg_parse_result(&m.obj, &r, m.err, sizeof(m.err)), m.err, "RESULT", "3 elements");
  done(&m);
}

/* mn_msg_pack_uints writes each uint in msgpack's smallest form: every width, at its edges. */
static void test_pack_uints_widths(void **state) {
  (void)state;
  const uint64_t v[] = {0, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffffu, 0x100000000ull, UINT64_MAX};
  const size_t bytes[] = {1, 1, 2, 2, 3, 3, 5, 5, 9, 9};
  size_t n = sizeof(v) / sizeof(v[0]), total = 0;
  mn_buf_t b;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_uints(&b, v, n), 0);
  for (size_t i = 0; i < n; i++) total += bytes[i];
  assert_int_equal(b.len, total);
  msgpack_zone zone;
  assert_true(msgpack_zone_init(&zone, 1024));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    msgpack_object o;
    size_t at = off;
    msgpack_unpack_return rc = msgpack_unpack(b.data, b.len, &off, &zone, &o);
    assert_int_equal(rc, i + 1 < n ? MSGPACK_UNPACK_EXTRA_BYTES : MSGPACK_UNPACK_SUCCESS); /* more follow */
    assert_int_equal(o.type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_true(o.via.u64 == v[i]);
    assert_int_equal(off - at, bytes[i]);
  }
  msgpack_zone_destroy(&zone);
  mn_buf_free(&b);
}

/* CAST carries a CALL's bytes after its seq; the agent's copy for one proc
 * is the same frame as the controller's CALL to it. RESULTS round-trips. */
static void test_cast_results(void **state) {
  (void)state;
  mn_buf_t b, c;
  msgpack_packer pk;
  mn_buf_init(&b);
  size_t s = mn_msg_call_head(&b, &pk, "echo", 4, 1);
  msgpack_pack_uint64(&pk, 7);
  mn_frame_end(&b, s);
  mn_msg_set_seq(b.data, 42);
  uint64_t t[6] = {1001, 42, 3, 1002, 9, 4};
  mn_buf_init(&c);
  assert_int_equal(mn_msg_pack_cast(&c, t, 2, b.data + MN_MSG_CALL_HEAD, b.len - MN_MSG_CALL_HEAD), 0);
  msg_t m;
  take(&c, &m);
  const msgpack_object *targets;
  const char *rest;
  size_t rlen;
  assert_int_equal(mn_msg_parse_cast(&m.obj, &targets, &rest, &rlen, m.err, sizeof(m.err)), 0);
  assert_int_equal(targets->via.array.size, 6);
  assert_int_equal(targets->via.array.ptr[3].via.u64, 1002);
  char head[MN_MSG_CALL_HEAD];
  mn_msg_call_from_cast(head, 42, rlen);
  assert_memory_equal(head, b.data, MN_MSG_CALL_HEAD);
  assert_memory_equal(rest, b.data + MN_MSG_CALL_HEAD, rlen);
  done(&m);
  mn_buf_free(&b);

  /* RESULTS: two entries, each a tag and a RESULT body. */
  mn_buf_t r;
  mn_buf_init(&r);
  mn_buf_init(&b);
  s = mn_msg_result_head(&b, &pk, 42, 1);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, s);
  assert_int_equal(mn_msg_results_begin(&r), 0);
  assert_int_equal(mn_msg_results_add(&r, 3, b.data + MN_FRAME_HEADER, b.len - MN_FRAME_HEADER), 0);
  assert_int_equal(mn_msg_results_add(&r, 4, b.data + MN_FRAME_HEADER, b.len - MN_FRAME_HEADER), 0);
  mn_msg_results_end(&r, 2);
  mn_buf_free(&b);
  take(&r, &m);
  uint32_t n;
  assert_int_equal(mn_msg_parse_results(&m.obj, &n, m.err, sizeof(m.err)), 0);
  assert_int_equal(n, 2);
  assert_int_equal(m.obj.via.array.ptr[3].via.u64, 4);
  mn_msg_result_t res;
  assert_int_equal(mn_msg_parse_result(&m.obj.via.array.ptr[4], &res, m.err, sizeof(m.err)), 0);
  assert_int_equal(res.seq, 42);
  done(&m);

  /* Malformed: a tag without its result; a target list not in triples; rest not a bin. */
  hand(&b, "uu", (uint64_t)MN_MSG_RESULTS, (uint64_t)3);
  take(&b, &m);
  expect_named(mn_msg_parse_results(&m.obj, &n, m.err, sizeof(m.err)), m.err, "RESULTS", "without its result");
  done(&m);
  hand(&b, "uas", (uint64_t)MN_MSG_CAST, "x");
  take(&b, &m);
  expect_named(mn_msg_parse_cast(&m.obj, &targets, &rest, &rlen, m.err, sizeof(m.err)), m.err, "CAST", "rest");
  done(&m);
}

/* ACKS: (pid, acked) pairs round-trip; an odd count or a non-uint is refused by name. */
static void test_acks(void **state) {
  (void)state;
  mn_buf_t b;
  mn_buf_init(&b);
  uint64_t p[4] = {1001, 42, 1002, 7};
  assert_int_equal(mn_msg_pack_acks(&b, p, 2), 0);
  msg_t m;
  take(&b, &m);
  const msgpack_object *pairs;
  assert_int_equal(mn_msg_parse_acks(&m.obj, &pairs, m.err, sizeof(m.err)), 0);
  assert_int_equal(pairs->via.array.size, 4);
  assert_int_equal(pairs->via.array.ptr[3].via.u64, 7);
  done(&m);
  hand(&b, "uu", (uint64_t)MN_MSG_ACKS, (uint64_t)3);
  take(&b, &m);
  expect_named(mn_msg_parse_acks(&m.obj, &pairs, m.err, sizeof(m.err)), m.err, "ACKS", "pairs");
  done(&m);
  /* Through the tree: the top agent's pairs, then one child's (index 1) with an empty subtree. */
  msgpack_packer pk;
  size_t start;
  assert_int_equal(mn_msg_acks_head(&b, &pk, &start, p, 1, 1), 0);
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_uint64(&pk, 1002);
  msgpack_pack_uint64(&pk, 7);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, start);
  take(&b, &m);
  const msgpack_object *subs;
  assert_int_equal(mn_msg_parse_acks(&m.obj, &pairs, m.err, sizeof(m.err)), 0);
  assert_int_equal(pairs->via.array.size, 2);
  assert_int_equal(mn_msg_parse_acks_subs(&m.obj, &subs, m.err, sizeof(m.err)), 0);
  assert_non_null(subs);
  assert_int_equal(subs->via.array.size, 3);
  assert_int_equal(subs->via.array.ptr[1].via.array.ptr[1].via.u64, 7);
  /* What the agent hands on: the child's pairs and subs as one ACKS. */
  mn_buf_t fwd;
  mn_buf_init(&fwd);
  assert_int_equal(mn_msg_pack_acks_obj(&fwd, &subs->via.array.ptr[1], &subs->via.array.ptr[2]), 0);
  done(&m);
  take(&fwd, &m);
  assert_int_equal(mn_msg_parse_acks(&m.obj, &pairs, m.err, sizeof(m.err)), 0);
  assert_int_equal(pairs->via.array.ptr[0].via.u64, 1002);
  done(&m);
  mn_buf_free(&fwd);
  /* subs not in triples is named. */
  hand(&b, "uau", (uint64_t)MN_MSG_ACKS, (uint64_t)2);
  take(&b, &m);
  expect_named(mn_msg_parse_acks_subs(&m.obj, &subs, m.err, sizeof(m.err)), m.err, "ACKS", "triples");
  done(&m);
}

/* The tree's messages: TREE, LINKED, a relay SESSION and a CAST with subs round-trip; bad shapes are named. */
static void test_tree_messages(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  const char *addrs[2] = {"10.0.0.2:7000", "[::1]:7001"};
  uint64_t sessions[2] = {11, 12}, epoch, index, ping, silence;
  const msgpack_object *ch, *subs;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_tree(&b, 3, addrs, sessions, 2, 750, 1500), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_tree(&m.obj, &epoch, &ch, &ping, &silence, m.err, sizeof(m.err)), 0);
  assert_int_equal(epoch, 3);
  assert_int_equal(ping, 750);
  assert_int_equal(silence, 1500);
  assert_int_equal(ch->via.array.size, 4);
  assert_int_equal(ch->via.array.ptr[3].via.u64, 12);
  done(&m);
  int up;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_linked(&b, 3, 1, 1), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_linked(&m.obj, &epoch, &index, &up, m.err, sizeof(m.err)), 0);
  assert_true(epoch == 3 && index == 1 && up == 1);
  done(&m);
  mn_msg_session_t sess;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_relay_session(&b, 99, 1500), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_session(&m.obj, &sess, m.err, sizeof(m.err)), 0);
  assert_true(sess.session == 99 && sess.relay == 1 && sess.silence_ms == 1500);
  done(&m);
  /* CAST with one sub (child 1, 1 triple, no deeper subs), then handed on from its decoded parts. */
  msgpack_packer pk;
  size_t start;
  uint64_t t[3] = {1001, 5, 7};
  mn_buf_init(&b);
  assert_int_equal(mn_msg_cast_head(&b, &pk, &start, t, 1, "r", 1, 1), 0);
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_array(&pk, 3);
  for (int i = 0; i < 3; i++) msgpack_pack_uint64(&pk, t[i] + 1);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, start);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_cast_subs(&m.obj, &subs, m.err, sizeof(m.err)), 0);
  assert_int_equal(subs->via.array.size, 4);
  mn_buf_t fwd;
  mn_buf_init(&fwd);
  assert_int_equal(mn_msg_pack_cast_obj(&fwd, &subs->via.array.ptr[2], "r", 1, &subs->via.array.ptr[3]), 0);
  done(&m);
  take(&fwd, &m);
  const msgpack_object *targets;
  const char *rest;
  size_t rlen;
  assert_int_equal(mn_msg_parse_cast(&m.obj, &targets, &rest, &rlen, m.err, sizeof(m.err)), 0);
  assert_int_equal(targets->via.array.ptr[0].via.u64, 1002);
  done(&m);
  /* Malformed: TREE pairs of the wrong types; subs not in quads; LINKED's up not a bool. */
  hand(&b, "uuu", (uint64_t)MN_MSG_TREE, (uint64_t)1, (uint64_t)2);
  take(&b, &m);
  expect_named(mn_msg_parse_tree(&m.obj, &epoch, &ch, &ping, &silence, m.err, sizeof(m.err)), m.err, "TREE", "children");
  done(&m);
  hand(&b, "uuuu", (uint64_t)MN_MSG_LINKED, (uint64_t)1, (uint64_t)2, (uint64_t)3);
  take(&b, &m);
  expect_named(mn_msg_parse_linked(&m.obj, &epoch, &index, &up, m.err, sizeof(m.err)), m.err, "LINKED", "up");
  done(&m);
}

/* Appends RESULT [21, seq, ok, value] (value packed by fn) to the RESULTS batch r under tag. */
static void add_result(mn_buf_t *r, uint64_t tag, uint64_t seq, int ok, void (*value)(msgpack_packer *pk)) {
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  size_t s = mn_msg_result_head(&b, &pk, seq, ok);
  value(&pk);
  mn_frame_end(&b, s);
  assert_int_equal(mn_msg_results_add(r, tag, b.data + MN_FRAME_HEADER, b.len - MN_FRAME_HEADER), 0);
  mn_buf_free(&b);
}

static void pack_nothing(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void pack_answer(msgpack_packer *pk) {
  msgpack_pack_array(pk, 2);
  msgpack_pack_uint64(pk, 300);
  mn_pack_cstr(pk, "x");
}
static void pack_deep(msgpack_packer *pk) {
  for (int i = 0; i < MN_MAX_DEPTH; i++) msgpack_pack_array(pk, 1);
  msgpack_pack_nil(pk);
}

/* The RESULTS reader: entries read in place, [] without decoding, other values decoded and checked. */
static void test_results_reader(void **state) {
  (void)state;
  mn_buf_t r;
  mn_buf_init(&r);
  assert_int_equal(mn_msg_results_begin(&r), 0);
  add_result(&r, 3, 42, 1, pack_nothing);
  add_result(&r, 70000, 1ull << 40, 0, pack_answer);
  add_result(&r, 5, 7, 1, pack_deep);
  mn_msg_results_end(&r, 3);
  msgpack_zone zone;
  assert_true(msgpack_zone_init(&zone, 1024));
  mn_msg_results_reader_t rd;
  char err[300];
  uint64_t tag;
  mn_msg_result_t res;
  assert_int_equal(mn_msg_results_open(&rd, r.data + MN_FRAME_HEADER, r.len - MN_FRAME_HEADER), 0);
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), 1);
  assert_int_equal(tag, 3);
  assert_int_equal(res.seq, 42);
  assert_true(res.ok);
  assert_int_equal(res.value->type, MSGPACK_OBJECT_ARRAY);
  assert_int_equal(res.value->via.array.size, 0);
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), 1);
  assert_int_equal(tag, 70000);
  assert_int_equal(res.seq, 1ull << 40);
  assert_false(res.ok);
  assert_int_equal(res.value->via.array.size, 2);
  assert_int_equal(res.value->via.array.ptr[0].via.u64, 300);
  /* A value nested past MN_MAX_DEPTH (it sits at depth 2) ends the frame, as mn_decode would. */
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), MN_ELIMIT);
  assert_non_null(strstr(err, "MN_MAX_DEPTH"));
  msgpack_zone_destroy(&zone);
  mn_buf_free(&r);

  /* An entry that is an array but no RESULT spoils only itself; a count past the bytes is refused at open. */
  mn_buf_init(&r);
  assert_int_equal(mn_msg_results_begin(&r), 0);
  assert_int_equal(mn_msg_results_add(&r, 9, "\x92\x15\x01", 3), 0);
  add_result(&r, 10, 1, 1, pack_nothing);
  mn_msg_results_end(&r, 2);
  assert_true(msgpack_zone_init(&zone, 1024));
  assert_int_equal(mn_msg_results_open(&rd, r.data + MN_FRAME_HEADER, r.len - MN_FRAME_HEADER), 0);
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), MN_EINVAL);
  assert_int_equal(tag, 9);
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), 1);
  assert_int_equal(tag, 10);
  assert_int_equal(mn_msg_results_next(&rd, &zone, &tag, &res, err, sizeof(err)), 0);
  mn_put_be32(r.data + MN_FRAME_HEADER + 1, 2001);
  assert_int_equal(mn_msg_results_open(&rd, r.data + MN_FRAME_HEADER, r.len - MN_FRAME_HEADER), MN_EPROTO);
  msgpack_zone_destroy(&zone);
  mn_buf_free(&r);
}

static void test_pong_from_ping(void **state) {
  (void)state;
  char out[MN_MSG_PONG_MAX];
  /* docs/protocol.md section 12: [5, 99] is answered with [6, 99]. */
  static const char ping[] = {(char)0x92, 0x05, 0x63};
  static const unsigned char pong[] = {0, 0, 0, 3, 0x92, 0x06, 0x63};
  size_t n = mn_msg_pong_from_ping(out, ping, sizeof(ping));
  expect_bytes(out, n, pong, sizeof(pong));
  /* Not a 2-element PING, or too long to answer inline: 0, the executor refuses it. */
  static const char call[] = {(char)0x94, 0x14};
  assert_int_equal(mn_msg_pong_from_ping(out, call, sizeof(call)), 0);
  char big[MN_MSG_PONG_MAX];
  memset(big, 'x', sizeof(big));
  big[0] = (char)0x92;
  big[1] = 0x05;
  assert_int_equal(mn_msg_pong_from_ping(out, big, MN_MSG_PONG_MAX - MN_FRAME_HEADER), MN_MSG_PONG_MAX);
  assert_int_equal(mn_msg_pong_from_ping(out, big, MN_MSG_PONG_MAX - MN_FRAME_HEADER + 1), 0);
  assert_int_equal(mn_msg_pong_from_ping(out, ping, 1), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_uints_widths),
      cmocka_unit_test(test_call_head),
      cmocka_unit_test(test_call_malformed),
      cmocka_unit_test(test_put_and_lost),
      cmocka_unit_test(test_result),
      cmocka_unit_test(test_cast_results),
      cmocka_unit_test(test_acks),
      cmocka_unit_test(test_tree_messages),
      cmocka_unit_test(test_results_reader),
      cmocka_unit_test(test_pong_from_ping),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
