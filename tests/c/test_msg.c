/*
 * test_msg.c - unit tests for host/core/msg.c: every builder round-trips
 * through the decoder and its parser, the fixed-layout frames have the
 * bytes docs/protocol.md shows, and a malformed message (wrong element
 * count, wrong field type) is refused with an error naming the field.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"

/* ---- helpers -------------------------------------------------------------- */

/* One frame decoded, with the zone it lives in. */
typedef struct {
  mn_buf_t b; /* the frame: strings and bins of obj point into it */
  msgpack_zone zone;
  msgpack_object obj;
  char err[400];
} msg_t;

/* Decodes the single whole frame in b (which m takes over) into m. */
static void take(mn_buf_t *b, msg_t *m) {
  const char *body;
  int64_t n = mn_frame_peek(b->data, b->len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal((size_t)n + MN_FRAME_HEADER, b->len);
  assert_true(msgpack_zone_init(&m->zone, 4096));
  m->err[0] = '\0';
  int rc = mn_decode(body, (size_t)n, &m->zone, &m->obj, m->err, sizeof(m->err));
  if (rc != 0) print_error("decode: %s\n", m->err);
  assert_int_equal(rc, 0);
  m->b = *b;
  mn_buf_init(b);
}

static void done(msg_t *m) {
  msgpack_zone_destroy(&m->zone);
  mn_buf_free(&m->b);
}

/* Packs an array message by hand from a format: u (uint64), i (int64), s (str), b (bin of 32), n (nil), t/f (bool), m (empty map), a (empty array). */
static void hand(mn_buf_t *b, const char *fmt, ...) {
  msgpack_packer pk;
  va_list ap;
  static const uint8_t zeros[32];
  mn_buf_init(b);
  msgpack_packer_init(&pk, b, mn_buf_write_cb);
  size_t s = mn_frame_begin(b);
  msgpack_pack_array(&pk, strlen(fmt));
  va_start(ap, fmt);
  for (const char *f = fmt; *f; f++) {
    switch (*f) {
    case 'u': msgpack_pack_uint64(&pk, va_arg(ap, uint64_t)); break;
    case 'i': msgpack_pack_int64(&pk, va_arg(ap, int64_t)); break;
    case 's': mn_pack_cstr(&pk, va_arg(ap, const char *)); break;
    case 'b':
      msgpack_pack_bin(&pk, 32);
      msgpack_pack_bin_body(&pk, zeros, 32);
      break;
    case 'n': msgpack_pack_nil(&pk); break;
    case 't': msgpack_pack_true(&pk); break;
    case 'f': msgpack_pack_false(&pk); break;
    case 'm': msgpack_pack_map(&pk, 0); break;
    case 'a': msgpack_pack_array(&pk, 0); break;
    }
  }
  va_end(ap);
  mn_frame_end(b, s);
}

static void expect_bytes(const char *got, size_t n, const unsigned char *want, size_t wn) {
  assert_int_equal(n, wn);
  assert_memory_equal(got, want, wn);
}

/* Asserts that err says what is malformed and names `field`. */
static void expect_named(int rc, const char *err, const char *name, const char *field) {
  assert_int_equal(rc, MN_EPROTO);
  if (strstr(err, name) == NULL || strstr(err, field) == NULL)
    print_error("error \"%s\" lacks \"%s\" or \"%s\"\n", err, name, field);
  assert_non_null(strstr(err, name));
  assert_non_null(strstr(err, field));
}

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
  assert_int_equal(n, 32);
  assert_string_equal(mn_msg_name(MN_MSG_CALL), "CALL");
  assert_null(mn_msg_name(0));
  assert_null(mn_msg_name(23));
  assert_string_equal(mn_msg_name(MN_MSG_CANCEL), "CANCEL");
  assert_string_equal(mn_msg_name(MN_MSG_JOIN), "JOIN");
  assert_string_equal(mn_msg_name(MN_MSG_JOINED), "JOINED");
  assert_string_equal(mn_msg_name(MN_MSG_ACKS), "ACKS");
  assert_null(mn_msg_name(37));
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
      cmocka_unit_test(test_pack_uints_widths),
      cmocka_unit_test(test_check_script_send),
      cmocka_unit_test(test_hello_auth_welcome_error),
      cmocka_unit_test(test_handshake_malformed),
      cmocka_unit_test(test_join_joined),
      cmocka_unit_test(test_join_malformed),
      cmocka_unit_test(test_session_ack_ping_goodbye),
      cmocka_unit_test(test_session_malformed),
      cmocka_unit_test(test_call_head),
      cmocka_unit_test(test_call_malformed),
      cmocka_unit_test(test_put_and_lost),
      cmocka_unit_test(test_result),
      cmocka_unit_test(test_cast_results),
      cmocka_unit_test(test_acks),
      cmocka_unit_test(test_tree_messages),
      cmocka_unit_test(test_results_reader),
      cmocka_unit_test(test_pong_from_ping),
      cmocka_unit_test(test_agent_events),
      cmocka_unit_test(test_spawn_kill),
      cmocka_unit_test(test_spawn_subs),
      cmocka_unit_test(test_requests),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
