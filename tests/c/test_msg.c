/*
 * test_msg.c - unit tests for host/core/msg.c: every builder round-trips
 * through the decoder and its parser, the fixed-layout frames have the
 * bytes docs/protocol.md shows, and a malformed message (wrong element
 * count, wrong field type) is refused with an error naming the field. Here
 * the table of names, the handshake, the join port, controller -> peer and
 * agent messages; calls and results are in test_msg_calls.c.
 */
#include "msg_helpers.h"

static const uint8_t nonce[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                  17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t mac[32] = {0xaa, 0xbb, 0xcc};

/* ---- the table -------------------------------------------------------------- */

static void count_type(void *data, int type, const char *name) {
  int *n = data;
  assert_string_equal(mn_msg_name(type), name);
  (*n)++;
}

static void test_names(void **state) {
  (void)state;
  int n = 0;
  mn_msg_each(count_type, &n);
  assert_int_equal(n, 35); /* 32, and SHIP_ASK, SHIP_DATA, SHIP_STATE (40..42) */
  assert_string_equal(mn_msg_name(MN_MSG_CALL), "CALL");
  assert_null(mn_msg_name(0));
  assert_null(mn_msg_name(23));
  assert_string_equal(mn_msg_name(MN_MSG_CANCEL), "CANCEL");
  assert_string_equal(mn_msg_name(MN_MSG_JOIN), "JOIN");
  assert_string_equal(mn_msg_name(MN_MSG_JOINED), "JOINED");
  assert_string_equal(mn_msg_name(MN_MSG_ACKS), "ACKS");
  assert_null(mn_msg_name(37));
  assert_string_equal(mn_msg_name(MN_MSG_SHIP_DATA), "SHIP_DATA");
  assert_null(mn_msg_name(43));
  assert_null(mn_msg_name(1000));
  assert_null(mn_msg_name(-1));
}

static void test_check_script_send(void **state) {
  (void)state;
  char err[200];
  assert_int_equal(mn_msg_check_script_send(MN_MSG_SPAWN, 3, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_check_script_send(MN_MSG_PING, 2, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_check_script_send(MN_MSG_PERSIST, 5, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_check_script_send(MN_MSG_STATUS, 2, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_check_script_send(99, 2, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "99"));
  assert_int_equal(mn_msg_check_script_send(MN_MSG_RESULT, 4, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "not one a controller sends"));
  assert_int_equal(mn_msg_check_script_send(MN_MSG_CALL, 4, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "core.call"));
  assert_int_equal(mn_msg_check_script_send(MN_MSG_SESSION, 3, err, sizeof(err)), MN_EPROTO);
  assert_int_equal(mn_msg_check_script_send(MN_MSG_KILL, 2, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "KILL has 2 elements"));
  /* The join port's messages are the C side's: a script sends neither. */
  assert_int_equal(mn_msg_check_script_send(MN_MSG_JOIN, 5, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "not one a controller sends"));
  assert_int_equal(mn_msg_check_script_send(MN_MSG_JOINED, 2, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "JOINED is sent by the controller's C side only"));
  assert_int_equal(mn_msg_check_script_send(MN_MSG_ATTACH, 4, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "[16, req, name]"));
}

/* ---- handshake messages ------------------------------------------------------- */

static void test_hello_auth_welcome_error(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_hello(&b, nonce, "proc"), 0);
  take(&b, &m);
  mn_msg_hello_t h;
  assert_int_equal(mn_msg_parse_hello(&m.obj, &h, m.err, sizeof(m.err)), 0);
  assert_int_equal(h.version, MN_PROTOCOL_VERSION);
  assert_memory_equal(h.nonce, nonce, 32);
  assert_int_equal(h.role_len, 4);
  assert_memory_equal(h.role, "proc", 4);
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_auth(&b, nonce, mac), 0);
  take(&b, &m);
  mn_msg_auth_t a;
  assert_int_equal(mn_msg_parse_auth(&m.obj, &a, m.err, sizeof(m.err)), 0);
  assert_int_equal(a.version, MN_PROTOCOL_VERSION);
  assert_memory_equal(a.nonce, nonce, 32);
  assert_int_equal(a.mac_len, 32);
  assert_memory_equal(a.mac, mac, 32);
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_welcome(&b, mac, "node7", 4242, "agent"), 0);
  take(&b, &m);
  mn_msg_welcome_t w;
  assert_int_equal(mn_msg_parse_welcome(&m.obj, &w, m.err, sizeof(m.err)), 0);
  assert_int_equal(w.mac_len, 32);
  assert_int_equal(w.host_len, 5);
  assert_memory_equal(w.host, "node7", 5);
  assert_int_equal(w.pid, 4242);
  assert_non_null(mn_map_get(&m.obj.via.array.ptr[2], "role"));
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_error(&b, MN_EPROTO, "no"), 0);
  take(&b, &m);
  mn_msg_error_t e;
  assert_int_equal(mn_msg_parse_error(&m.obj, &e, m.err, sizeof(m.err)), 0);
  assert_int_equal(e.code, MN_EPROTO);
  assert_int_equal(e.text_len, 2);
  done(&m);
}

static void test_handshake_malformed(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_hello_t h;
  mn_msg_auth_t a;
  mn_msg_welcome_t w;
  mn_msg_error_t e;
  hand(&b, "uuss", (uint64_t)MN_MSG_HELLO, (uint64_t)1, "not a nonce", "proc");
  take(&b, &m);
  expect_named(mn_msg_parse_hello(&m.obj, &h, m.err, sizeof(m.err)), m.err, "HELLO", "nonce_s");
  done(&m);
  hand(&b, "uub", (uint64_t)MN_MSG_HELLO, (uint64_t)1);
  take(&b, &m);
  expect_named(mn_msg_parse_hello(&m.obj, &h, m.err, sizeof(m.err)), m.err, "HELLO", "3 elements");
  done(&m);
  hand(&b, "uubi", (uint64_t)MN_MSG_HELLO, (uint64_t)1, (int64_t)7);
  take(&b, &m);
  expect_named(mn_msg_parse_hello(&m.obj, &h, m.err, sizeof(m.err)), m.err, "HELLO", "role");
  done(&m);
  hand(&b, "usbb", (uint64_t)MN_MSG_AUTH, "1");
  take(&b, &m);
  expect_named(mn_msg_parse_auth(&m.obj, &a, m.err, sizeof(m.err)), m.err, "AUTH", "version");
  done(&m);
  hand(&b, "uubs", (uint64_t)MN_MSG_AUTH, (uint64_t)1, "mac");
  take(&b, &m);
  expect_named(mn_msg_parse_auth(&m.obj, &a, m.err, sizeof(m.err)), m.err, "AUTH", "mac");
  done(&m);
  hand(&b, "ubn", (uint64_t)MN_MSG_WELCOME);
  take(&b, &m);
  expect_named(mn_msg_parse_welcome(&m.obj, &w, m.err, sizeof(m.err)), m.err, "WELCOME", "info");
  done(&m);
  hand(&b, "uss", (uint64_t)MN_MSG_ERROR, "code", "text");
  take(&b, &m);
  expect_named(mn_msg_parse_error(&m.obj, &e, m.err, sizeof(m.err)), m.err, "ERROR", "code");
  done(&m);
  /* A parser given another type says so. */
  hand(&b, "uu", (uint64_t)MN_MSG_PING, (uint64_t)1);
  take(&b, &m);
  expect_named(mn_msg_parse_auth(&m.obj, &a, m.err, sizeof(m.err)), m.err, "AUTH", "type 5");
  done(&m);
}

/* ---- the join port ------------------------------------------------------------------ */

static void test_join_joined(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_join_t j;
  const uint8_t *jm;
  size_t jml;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_join(&b, nonce, "10.0.0.7:7000", mac), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), 0);
  assert_int_equal(j.version, MN_PROTOCOL_VERSION);
  assert_memory_equal(j.nonce, nonce, 32);
  assert_int_equal(j.addr_len, 13);
  assert_memory_equal(j.addr, "10.0.0.7:7000", 13);
  assert_int_equal(j.mac_len, 32);
  assert_memory_equal(j.mac, mac, 32);
  done(&m);

  /* JOINED's bytes: [33, bin8(32) mac]. */
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_joined(&b, mac), 0);
  static const unsigned char head[] = {0, 0, 0, 36, 0x92, 0x21, 0xc4, 0x20, 0xaa, 0xbb, 0xcc};
  expect_bytes(b.data, 11, head, sizeof(head));
  assert_int_equal(b.len, 40);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_joined(&m.obj, &jm, &jml, m.err, sizeof(m.err)), 0);
  assert_int_equal(jml, 32);
  assert_memory_equal(jm, mac, 32);
  done(&m);
}

static void test_join_malformed(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_join_t j;
  const uint8_t *jm;
  size_t jml;
  char longer[MN_MSG_JOIN_MAX_ADDR + 2];
  memset(longer, '1', sizeof(longer) - 1);
  longer[sizeof(longer) - 1] = '\0';
  hand(&b, "uubs", (uint64_t)MN_MSG_JOIN, (uint64_t)1, "1.2.3.4:5");
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "malformed JOIN", "4 elements");
  done(&m);
  hand(&b, "usbsb", (uint64_t)MN_MSG_JOIN, "1", "1.2.3.4:5");
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "version");
  done(&m);
  hand(&b, "uussb", (uint64_t)MN_MSG_JOIN, (uint64_t)1, "short nonce", "1.2.3.4:5");
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "nonce_a");
  done(&m);
  hand(&b, "uubib", (uint64_t)MN_MSG_JOIN, (uint64_t)1, (int64_t)7);
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "addr");
  done(&m);
  hand(&b, "uubsb", (uint64_t)MN_MSG_JOIN, (uint64_t)1, "");
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "addr");
  done(&m);
  hand(&b, "uubsb", (uint64_t)MN_MSG_JOIN, (uint64_t)1, longer);
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "1..280 bytes");
  done(&m);
  hand(&b, "uubss", (uint64_t)MN_MSG_JOIN, (uint64_t)1, "1.2.3.4:5", "mac");
  take(&b, &m);
  expect_named(mn_msg_parse_join(&m.obj, &j, m.err, sizeof(m.err)), m.err, "JOIN", "mac");
  done(&m);
  hand(&b, "us", (uint64_t)MN_MSG_JOINED, "mac");
  take(&b, &m);
  expect_named(mn_msg_parse_joined(&m.obj, &jm, &jml, m.err, sizeof(m.err)), m.err, "malformed JOINED: want [33, mac]",
               "mac");
  done(&m);
  hand(&b, "u", (uint64_t)MN_MSG_JOINED);
  take(&b, &m);
  expect_named(mn_msg_parse_joined(&m.obj, &jm, &jml, m.err, sizeof(m.err)), m.err, "JOINED", "1 elements");
  done(&m);
}

/* ---- controller -> peer ------------------------------------------------------------ */

static void test_session_ack_ping_goodbye(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_session(&b, 0xfeedface12345ull, 17), 0);
  take(&b, &m);
  mn_msg_session_t s;
  assert_int_equal(mn_msg_parse_session(&m.obj, &s, m.err, sizeof(m.err)), 0);
  assert_int_equal(s.session, 0xfeedface12345ull);
  assert_int_equal(s.acked, 17);
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_ack(&b, 99), 0);
  take(&b, &m);
  uint64_t acked = 0;
  assert_int_equal(mn_msg_parse_ack(&m.obj, &acked, m.err, sizeof(m.err)), 0);
  assert_int_equal(acked, 99);
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_ping(&b, 1ull << 40), 0);
  take(&b, &m);
  const msgpack_object *id;
  assert_int_equal(mn_msg_parse_ping(&m.obj, &id, m.err, sizeof(m.err)), 0);
  assert_int_equal(id->via.u64, 1ull << 40);
  /* The agent's PONG re-encodes the id as it came. */
  mn_buf_t pb;
  mn_buf_init(&pb);
  assert_int_equal(mn_msg_pack_pong(&pb, id), 0);
  done(&m);
  take(&pb, &m);
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_PONG);
  assert_int_equal(mn_msg_parse_ping(&m.obj, &id, m.err, sizeof(m.err)), 0);
  assert_int_equal(id->via.u64, 1ull << 40);
  done(&m);

  char f[8];
  mn_buf_t g = {f, 0, sizeof(f)};
  assert_int_equal(mn_msg_pack_goodbye(&g), 0);
  static const unsigned char bye[] = {0, 0, 0, 2, 0x91, 25};
  expect_bytes(g.data, g.len, bye, sizeof(bye));
}

static void test_session_malformed(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_session_t s;
  uint64_t acked;
  const msgpack_object *id;
  hand(&b, "uu", (uint64_t)MN_MSG_SESSION, (uint64_t)5);
  take(&b, &m);
  expect_named(mn_msg_parse_session(&m.obj, &s, m.err, sizeof(m.err)), m.err, "SESSION", "2 elements");
  done(&m);
  hand(&b, "uuu", (uint64_t)MN_MSG_SESSION, (uint64_t)0, (uint64_t)0);
  take(&b, &m);
  expect_named(mn_msg_parse_session(&m.obj, &s, m.err, sizeof(m.err)), m.err, "SESSION", "id");
  done(&m);
  hand(&b, "uus", (uint64_t)MN_MSG_SESSION, (uint64_t)3, "x");
  take(&b, &m);
  expect_named(mn_msg_parse_session(&m.obj, &s, m.err, sizeof(m.err)), m.err, "SESSION", "acked");
  done(&m);
  hand(&b, "ui", (uint64_t)MN_MSG_ACK, (int64_t)-1);
  take(&b, &m);
  expect_named(mn_msg_parse_ack(&m.obj, &acked, m.err, sizeof(m.err)), m.err, "ACK", "acked");
  done(&m);
  hand(&b, "uuu", (uint64_t)MN_MSG_PING, (uint64_t)1, (uint64_t)2);
  take(&b, &m);
  expect_named(mn_msg_parse_ping(&m.obj, &id, m.err, sizeof(m.err)), m.err, "PING", "3 elements");
  done(&m);
}

/* ---- agent messages -------------------------------------------------------------------- */

static void test_agent_events(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  /* docs/protocol.md section 12: SPAWNED [11, 1, 0, 6794, 36373] and PROC_EXIT [13, 6794, 0, "KILL", 0]. */
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_spawned(&b, 1, 0, 6794, 36373), 0);
  static const unsigned char spawned[] = {0, 0, 0, 0x0a, 0x95, 0x0b, 0x01, 0x00, 0xcd, 0x1a, 0x8a, 0xcd, 0x8e, 0x15};
  expect_bytes(b.data, b.len, spawned, sizeof(spawned));
  mn_buf_free(&b);
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_proc_exit(&b, 6794, 0, "KILL", 0), 0);
  static const unsigned char exited[] = {0, 0, 0, 0x0c, 0x95, 0x0d, 0xcd, 0x1a, 0x8a, 0x00,
                                         0xa4, 'K', 'I', 'L', 'L', 0x00};
  expect_bytes(b.data, b.len, exited, sizeof(exited));
  mn_buf_free(&b);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_spawn_failed(&b, 5, 2, "cannot start"), 0);
  take(&b, &m);
  uint64_t req;
  int64_t index;
  const char *p;
  size_t n;
  assert_int_equal(m.obj.via.array.size, 4);
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_SPAWN_FAILED);
  assert_int_equal(mn_get_u64(&m.obj, 1, &req), 0);
  assert_int_equal(req, 5);
  assert_int_equal(mn_get_i64(&m.obj, 2, &index), 0);
  assert_int_equal(index, 2);
  assert_int_equal(mn_get_str(&m.obj, 3, &p, &n), 0);
  assert_int_equal(n, 12);
  done(&m);

  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_log(&b, 3, 2, "line\nmore", 5), 0);
  take(&b, &m);
  int64_t rank, stream;
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_LOG);
  assert_int_equal(mn_get_i64(&m.obj, 1, &rank), 0);
  assert_int_equal(mn_get_i64(&m.obj, 2, &stream), 0);
  assert_int_equal(mn_get_str(&m.obj, 3, &p, &n), 0);
  assert_int_equal(rank, 3);
  assert_int_equal(stream, 2);
  assert_int_equal(n, 5);
  assert_memory_equal(p, "line\n", 5);
  done(&m);

  msgpack_packer pk;
  mn_buf_init(&b);
  size_t s = mn_msg_reply_head(&b, &pk, 12, 1);
  msgpack_pack_map(&pk, 0);
  mn_frame_end(&b, s);
  take(&b, &m);
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_REPLY);
  assert_int_equal(m.obj.via.array.size, 4);
  assert_int_equal(mn_get_u64(&m.obj, 1, &req), 0);
  assert_int_equal(req, 12);
  assert_true(m.obj.via.array.ptr[2].via.boolean);
  done(&m);
}

/* SPAWN down the tree: [10, req, spec, subs], written by the controller from packed (req, spec) bodies and
 * handed on by an agent from its decoded parts. */
static void test_spawn_subs(void **state) {
  (void)state;
  mn_buf_t body, b, fwd;
  msg_t m;
  msgpack_packer pk;
  mn_buf_init(&body);
  msgpack_packer_init(&pk, &body, mn_buf_write_cb);
  msgpack_pack_uint64(&pk, 7);
  msgpack_pack_map(&pk, 1);
  mn_pack_cstr(&pk, "count");
  msgpack_pack_int(&pk, 3);
  mn_buf_init(&b);
  size_t start;
  assert_int_equal(mn_msg_spawn_head(&b, &pk, &start), 0);
  pk.callback(pk.data, body.data, body.len);
  msgpack_pack_array(&pk, 4); /* one child: index 1, req 0 with {count = 0}, no subs of its own */
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_uint64(&pk, 0);
  msgpack_pack_map(&pk, 1);
  mn_pack_cstr(&pk, "count");
  msgpack_pack_int(&pk, 0);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, start);
  take(&b, &m);
  mn_msg_spawn_t sp;
  assert_int_equal(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), 0);
  assert_int_equal(sp.req, 7);
  assert_int_equal(sp.count, 3);
  assert_non_null(sp.subs);
  assert_int_equal(sp.subs->via.array.size, 4);
  /* The child's own frame, as its parent writes it: parses to req 0, count 0, no subs below. */
  const msgpack_object *q = sp.subs->via.array.ptr;
  mn_buf_init(&fwd);
  assert_int_equal(mn_msg_pack_spawn_obj(&fwd, q[1].via.u64, &q[2], &q[3]), 0);
  done(&m);
  take(&fwd, &m);
  assert_int_equal(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), 0);
  assert_int_equal(sp.req, 0);
  assert_int_equal(sp.count, 0);
  assert_int_equal(sp.subs->via.array.size, 0);
  done(&m);
  /* The same body sent directly: [10, req, spec], no subs. */
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_spawn_body(&b, body.data, body.len), 0);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), 0);
  assert_int_equal(sp.req, 7);
  assert_null(sp.subs);
  done(&m);
  /* A quad whose spec is no map. */
  mn_buf_init(&b);
  assert_int_equal(mn_msg_spawn_head(&b, &pk, &start), 0);
  pk.callback(pk.data, body.data, body.len);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_uint64(&pk, 0);
  msgpack_pack_uint64(&pk, 8);
  msgpack_pack_array(&pk, 0);
  msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, start);
  take(&b, &m);
  expect_named(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), m.err, "SPAWN", "subs (element 3)");
  done(&m);
  mn_buf_free(&body);
}

static void test_spawn_kill(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  msgpack_packer pk;
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t s = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_int(&pk, MN_MSG_SPAWN);
  msgpack_pack_int(&pk, 4);
  msgpack_pack_map(&pk, 2);
  mn_pack_cstr(&pk, "count");
  msgpack_pack_int(&pk, 2);
  mn_pack_cstr(&pk, "world");
  msgpack_pack_int(&pk, 8);
  mn_frame_end(&b, s);
  take(&b, &m);
  mn_msg_spawn_t sp;
  assert_int_equal(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), 0);
  assert_int_equal(sp.req, 4);
  assert_int_equal(sp.count, 2);
  assert_non_null(mn_map_get(sp.spec, "world"));
  done(&m);
  hand(&b, "uum", (uint64_t)MN_MSG_SPAWN, (uint64_t)4);
  take(&b, &m);
  expect_named(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), m.err,
               "malformed SPAWN: want [10, req, {count=, rank_base=, world=}, subs?", "count");
  done(&m);
  hand(&b, "usm", (uint64_t)MN_MSG_SPAWN, "4");
  take(&b, &m);
  expect_named(mn_msg_parse_spawn(&m.obj, &sp, m.err, sizeof(m.err)), m.err, "SPAWN", "req");
  done(&m);

  mn_msg_kill_t k;
  hand(&b, "uii", (uint64_t)MN_MSG_KILL, (int64_t)6794, (int64_t)9);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_kill(&m.obj, &k, m.err, sizeof(m.err)), 0);
  assert_int_equal(k.pid, 6794);
  assert_int_equal(k.sig, 9);
  done(&m);
  hand(&b, "uii", (uint64_t)MN_MSG_KILL, (int64_t)6794, (int64_t)65);
  take(&b, &m);
  expect_named(mn_msg_parse_kill(&m.obj, &k, m.err, sizeof(m.err)), m.err, "malformed KILL: want [14, pid, signal]",
               "signal");
  done(&m);
  hand(&b, "usi", (uint64_t)MN_MSG_KILL, "pid", (int64_t)9);
  take(&b, &m);
  expect_named(mn_msg_parse_kill(&m.obj, &k, m.err, sizeof(m.err)), m.err, "KILL", "pid");
  done(&m);
  hand(&b, "ui", (uint64_t)MN_MSG_KILL, (int64_t)1);
  take(&b, &m);
  expect_named(mn_msg_parse_kill(&m.obj, &k, m.err, sizeof(m.err)), m.err, "KILL", "2 elements");
  done(&m);
}

static void test_requests(void **state) {
  (void)state;
  mn_buf_t b;
  msg_t m;
  mn_msg_request_t q;
  hand(&b, "uusan", (uint64_t)MN_MSG_PERSIST, (uint64_t)3, "mesh");
  take(&b, &m);
  assert_int_equal(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), 0);
  assert_int_equal(q.req, 3);
  assert_int_equal(q.name_len, 4);
  assert_int_equal(q.pids->type, MSGPACK_OBJECT_ARRAY);
  assert_int_equal(q.description->type, MSGPACK_OBJECT_NIL);
  done(&m);
  hand(&b, "uus", (uint64_t)MN_MSG_ATTACH, (uint64_t)3, "mesh");
  take(&b, &m);
  assert_int_equal(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), 0);
  assert_null(q.pids);
  done(&m);
  hand(&b, "uu", (uint64_t)MN_MSG_LIST, (uint64_t)8);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), 0);
  assert_int_equal(q.req, 8);
  assert_null(q.name);
  done(&m);
  hand(&b, "uu", (uint64_t)MN_MSG_STATUS, (uint64_t)9);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), 0);
  done(&m);

  /* Wrong count, wrong name, wrong req, and a type that is no request. */
  hand(&b, "uus", (uint64_t)MN_MSG_PERSIST, (uint64_t)3, "mesh");
  take(&b, &m);
  expect_named(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), m.err,
               "malformed PERSIST: want [15, req, name, pids, description]", "3 elements");
  done(&m);
  hand(&b, "uus", (uint64_t)MN_MSG_DETACH, (uint64_t)3, "");
  take(&b, &m);
  expect_named(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), m.err, "DETACH", "name");
  done(&m);
  hand(&b, "uuss", (uint64_t)MN_MSG_ATTACH, (uint64_t)3, "mesh", "extra");
  take(&b, &m);
  expect_named(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), m.err, "ATTACH", "4 elements");
  done(&m);
  hand(&b, "us", (uint64_t)MN_MSG_LIST, "8");
  take(&b, &m);
  expect_named(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), m.err, "LIST", "req");
  done(&m);
  hand(&b, "uu", (uint64_t)MN_MSG_PING, (uint64_t)8);
  take(&b, &m);
  assert_int_equal(mn_msg_parse_request(&m.obj, &q, m.err, sizeof(m.err)), MN_EPROTO);
  assert_non_null(strstr(m.err, "not a request"));
  done(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_check_script_send),
      cmocka_unit_test(test_hello_auth_welcome_error),
      cmocka_unit_test(test_handshake_malformed),
      cmocka_unit_test(test_join_joined),
      cmocka_unit_test(test_join_malformed),
      cmocka_unit_test(test_session_ack_ping_goodbye),
      cmocka_unit_test(test_session_malformed),
      cmocka_unit_test(test_agent_events),
      cmocka_unit_test(test_spawn_kill),
      cmocka_unit_test(test_spawn_subs),
      cmocka_unit_test(test_requests),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
