/*
 * test_wire.c - unit tests for host/core/wire.c: buffers, framing, the
 * msgpack decoder and its limits, accessors, ERROR frames. test_sock.c
 * covers the small helpers of host/core/sock.c.
 */
#include "wire_helpers.h"

/* ---- buffers -------------------------------------------------------------- */

static void test_buf_growth(void **state) {
  (void)state;
  mn_buf_t b;
  mn_buf_init(&b);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  assert_int_equal(b.cap, 0);

  /* Reserving nothing on an empty buffer needs no memory. */
  assert_int_equal(mn_buf_reserve(&b, 0), 0);

  assert_int_equal(mn_buf_reserve(&b, 1), 0);
  assert_non_null(b.data);
  assert_true(b.cap >= 1);
  size_t first_cap = b.cap;

  /* Append a pattern much larger than the first allocation. */
  enum { N = 50000 };
  for (int i = 0; i < N; i++) {
    unsigned char c = (unsigned char)(i * 7 + 3);
    assert_int_equal(mn_buf_append(&b, &c, 1), 0);
  }
  assert_int_equal(b.len, N);
  assert_true(b.cap >= N);
  assert_true(b.cap > first_cap);
  for (int i = 0; i < N; i++) assert_int_equal((unsigned char)b.data[i], (unsigned char)(i * 7 + 3));

  /* A reserve that fits does not move or grow the buffer. */
  size_t cap = b.cap;
  char *data = b.data;
  assert_int_equal(mn_buf_reserve(&b, cap - b.len), 0);
  assert_int_equal(b.cap, cap);
  assert_ptr_equal(b.data, data);
  /* One byte more must grow it, keeping the contents. */
  assert_int_equal(mn_buf_reserve(&b, cap - b.len + 1), 0);
  assert_true(b.cap >= cap + 1);
  for (int i = 0; i < N; i++) assert_int_equal((unsigned char)b.data[i], (unsigned char)(i * 7 + 3));

  /* An impossible reservation fails cleanly and leaves the buffer intact. */
  cap = b.cap;
  assert_int_equal(mn_buf_reserve(&b, SIZE_MAX), MN_ENOMEM);
  assert_int_equal(mn_buf_append(&b, "x", SIZE_MAX - 8), MN_ENOMEM);
  assert_int_equal(b.len, N);
  assert_int_equal(b.cap, cap);

  mn_buf_free(&b);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  assert_int_equal(b.cap, 0);
  mn_buf_free(&b); /* freeing twice is harmless */
}

static void test_buf_consume(void **state) {
  (void)state;
  mn_buf_t b;
  mn_buf_init(&b);
  mn_buf_consume(&b, 5); /* consuming from an empty buffer is harmless */
  assert_int_equal(b.len, 0);

  assert_int_equal(mn_buf_append(&b, "abcdefghij", 10), 0);
  mn_buf_consume(&b, 0);
  assert_int_equal(b.len, 10);
  assert_memory_equal(b.data, "abcdefghij", 10);

  mn_buf_consume(&b, 3);
  assert_int_equal(b.len, 7);
  assert_memory_equal(b.data, "defghij", 7);

  assert_int_equal(mn_buf_append(&b, "XY", 2), 0);
  assert_int_equal(b.len, 9);
  assert_memory_equal(b.data, "defghijXY", 9);

  mn_buf_consume(&b, 9); /* exactly everything */
  assert_int_equal(b.len, 0);
  assert_int_equal(mn_buf_append(&b, "q", 1), 0);
  mn_buf_consume(&b, 100); /* more than there is */
  assert_int_equal(b.len, 0);

  /* The write callback appends and reports success as 0. */
  assert_int_equal(mn_buf_write_cb(&b, "hello", 5), 0);
  assert_int_equal(b.len, 5);
  assert_memory_equal(b.data, "hello", 5);
  mn_buf_free(&b);
}

/* ---- framing --------------------------------------------------------------- */

static void test_frame_round_trip(void **state) {
  (void)state;
  mn_buf_t b;
  mn_buf_init(&b);
  size_t n1 = pack_frame(&b, MN_MSG_PING, "first");
  size_t n2 = pack_frame(&b, MN_MSG_PONG, "second frame, longer");
  assert_int_equal(b.len, n1 + n2);
  /* The prefix is the big-endian body length. */
  assert_int_equal(mn_be32(b.data), n1 - MN_FRAME_HEADER);
  assert_int_equal(mn_be32(b.data + n1), n2 - MN_FRAME_HEADER);

  /* Every truncation of the first frame asks for more bytes. */
  for (size_t len = 0; len < n1; len++) {
    const char *body = NULL;
    assert_int_equal(mn_frame_peek(b.data, len, MN_MAX_FRAME, &body), MN_EAGAIN);
    assert_null(body);
  }
  const char *body = NULL;
  int64_t n = mn_frame_peek(b.data, n1, MN_MAX_FRAME, &body);
  assert_int_equal(n, n1 - MN_FRAME_HEADER);
  assert_ptr_equal(body, b.data + MN_FRAME_HEADER);
  /* With the second frame behind it, the first is still found alone. */
  body = NULL;
  n = mn_frame_peek(b.data, b.len, MN_MAX_FRAME, &body);
  assert_int_equal(n, n1 - MN_FRAME_HEADER);

  decoded_t d;
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_PING);
  const char *s;
  size_t sl;
  assert_int_equal(mn_get_str(&d.obj, 1, &s, &sl), 0);
  assert_int_equal(sl, 5);
  assert_memory_equal(s, "first", 5);
  decoded_free(&d);

  /* Consume it; the second frame is next, truncations included. */
  mn_buf_consume(&b, MN_FRAME_HEADER + (size_t)n);
  assert_int_equal(b.len, n2);
  for (size_t len = 0; len < n2; len++)
    assert_int_equal(mn_frame_peek(b.data, len, MN_MAX_FRAME, &body), MN_EAGAIN);
  n = mn_frame_peek(b.data, b.len, MN_MAX_FRAME, &body);
  assert_int_equal(n, n2 - MN_FRAME_HEADER);
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_PONG);
  assert_int_equal(mn_get_str(&d.obj, 1, &s, &sl), 0);
  assert_int_equal(sl, strlen("second frame, longer"));
  decoded_free(&d);
  mn_buf_free(&b);
}

static void test_frame_limits(void **state) {
  (void)state;
  char hdr[MN_FRAME_HEADER + 16] = {0};
  const char *body = NULL;

  /* Zero length is rejected as soon as the header is complete. */
  mn_put_be32(hdr, 0);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER, MN_MAX_FRAME, &body), MN_EFRAME);
  assert_int_equal(mn_frame_peek(hdr, sizeof(hdr), MN_MAX_FRAME, &body), MN_EFRAME);
  /* ...but not before: three bytes of it are just an incomplete header. */
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER - 1, MN_MAX_FRAME, &body), MN_EAGAIN);

  /* Larger than max: rejected without waiting for the body. */
  mn_put_be32(hdr, 11);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER, 10, &body), MN_EFRAME);
  assert_int_equal(mn_frame_peek(hdr, sizeof(hdr), 10, &body), MN_EFRAME);
  /* Exactly max is fine. */
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER + 11, 11, &body), 11);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER + 10, 11, &body), MN_EAGAIN);

  mn_put_be32(hdr, MN_MAX_FRAME + 1);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER, MN_MAX_FRAME, &body), MN_EFRAME);
  mn_put_be32(hdr, 0xffffffffu);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER, MN_MAX_FRAME, &body), MN_EFRAME);
  mn_put_be32(hdr, MN_MAX_FRAME);
  assert_int_equal(mn_frame_peek(hdr, MN_FRAME_HEADER, MN_MAX_FRAME, &body), MN_EAGAIN);

  /* be32 helpers round-trip, including the high bit. */
  mn_put_be32(hdr, 0x80a1b2c3u);
  assert_int_equal((unsigned char)hdr[0], 0x80);
  assert_int_equal((unsigned char)hdr[3], 0xc3);
  assert_int_equal(mn_be32(hdr), 0x80a1b2c3u);

  /* mn_frame_end on a buffer whose prefix never got written is a no-op. */
  mn_buf_t b;
  mn_buf_init(&b);
  mn_frame_end(&b, 0);
  assert_int_equal(b.len, 0);
  mn_buf_free(&b);
}

/* ---- decoding ---------------------------------------------------------- */

static void test_decode_valid(void **state) {
  (void)state;
  packbuf_t p;
  pb_init(&p);
  msgpack_pack_array(&p.pk, 4);
  msgpack_pack_int(&p.pk, MN_MSG_CALL);
  msgpack_pack_uint64(&p.pk, 17);
  mn_pack_cstr(&p.pk, "noop");
  msgpack_pack_array(&p.pk, 0);

  decoded_t d;
  assert_int_equal(decode(&d, p.b.data, p.b.len), 0);
  assert_int_equal(d.obj.type, MSGPACK_OBJECT_ARRAY);
  assert_int_equal(d.obj.via.array.size, 4);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_CALL);
  uint64_t seq;
  assert_int_equal(mn_get_u64(&d.obj, 1, &seq), 0);
  assert_int_equal(seq, 17);
  decoded_free(&d);

  /* A one-element array is the smallest valid message. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  assert_int_equal(decode(&d, p.b.data, p.b.len), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_PING);
  decoded_free(&d);
  mn_buf_free(&p.b);
}

static void test_decode_rejects(void **state) {
  (void)state;
  packbuf_t p;
  pb_init(&p);

  /* Not an array. */
  msgpack_pack_int(&p.pk, 5);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);
  p.b.len = 0;
  mn_pack_cstr(&p.pk, "hello");
  expect_reject(p.b.data, p.b.len, MN_EPROTO);
  p.b.len = 0;
  msgpack_pack_map(&p.pk, 1);
  msgpack_pack_int(&p.pk, 1);
  msgpack_pack_int(&p.pk, 2);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);

  /* Empty array. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 0);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);

  /* First element not a non-negative integer. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 2);
  mn_pack_cstr(&p.pk, "20");
  msgpack_pack_int(&p.pk, 1);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_int(&p.pk, -20);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_double(&p.pk, 20.0);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_nil(&p.pk);
  expect_reject(p.b.data, p.b.len, MN_EPROTO);

  /* Trailing bytes after a valid message. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  msgpack_pack_int(&p.pk, 0);
  expect_reject(p.b.data, p.b.len, MN_EMSGPACK);
  /* Two whole messages in one body are trailing bytes too. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  expect_reject(p.b.data, p.b.len, MN_EMSGPACK);

  /* Truncated: the array promises more elements than there are. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 3);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  expect_reject(p.b.data, p.b.len, MN_EMSGPACK);
  /* Truncated inside a string. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  mn_pack_cstr(&p.pk, "a string that will be cut");
  expect_reject(p.b.data, p.b.len - 5, MN_EMSGPACK);

  /* Garbage: 0xc1 is never valid msgpack. */
  static const char garbage[] = {(char)0xc1, 0x01, 0x02};
  expect_reject(garbage, sizeof(garbage), MN_EMSGPACK);
  static const char garbage2[] = {(char)0x92, 0x05, (char)0xc1};
  expect_reject(garbage2, sizeof(garbage2), MN_EMSGPACK);
  /* A str8 header claiming more bytes than the body holds. */
  static const char garbage3[] = {(char)0x91, (char)0xd9, (char)0xff, 'a'};
  expect_reject(garbage3, sizeof(garbage3), MN_EMSGPACK);
  /* Empty body. */
  expect_reject("", 0, 0);

  mn_buf_free(&p.b);
}

/* [1, [[[ ... [0] ... ]]]] with `arrays` arrays in all, counting the outer one. */
static void pack_nested_arrays(msgpack_packer *pk, int arrays) {
  msgpack_pack_array(pk, 2);
  msgpack_pack_int(pk, MN_MSG_PING);
  for (int i = 1; i < arrays; i++) msgpack_pack_array(pk, 1);
  msgpack_pack_int(pk, 0);
}

/* [1, {"k": {"k": ... {"k": 0}}}] with `maps` nested maps. */
static void pack_nested_maps(msgpack_packer *pk, int maps) {
  msgpack_pack_array(pk, 2);
  msgpack_pack_int(pk, MN_MSG_PING);
  for (int i = 0; i < maps; i++) {
    msgpack_pack_map(pk, 1);
    mn_pack_cstr(pk, "k");
  }
  msgpack_pack_int(pk, 0);
}

/*
 * Decodes [1, <nested>] where <nested> is `n` levels of arrays (maps when
 * `maps`), freeing everything before returning, so that a failing assertion
 * on the result leaks nothing. Returns mn_decode's code; err gets its text.
 */
static int decode_nested(int n, int maps, char *err, size_t errlen) {
  packbuf_t p;
  decoded_t d;
  pb_init(&p);
  if (maps) pack_nested_maps(&p.pk, n);
  else pack_nested_arrays(&p.pk, n);
  int rc = decode(&d, p.b.data, p.b.len);
  snprintf(err, errlen, "%s", d.err);
  decoded_free(&d);
  mn_buf_free(&p.b);
  return rc;
}

/* The depth error must be MN_ELIMIT or MN_EMSGPACK with a message naming the limit. */
static void expect_depth_reject(int n, int maps) {
  char err[256], want[32];
  int rc = decode_nested(n, maps, err, sizeof(err));
  snprintf(want, sizeof(want), "%d", MN_MAX_DEPTH);
  if (!((rc == MN_ELIMIT || rc == MN_EMSGPACK) && strstr(err, "deeper") && strstr(err, want)))
    print_error("%d nested %s: mn_decode returned %d (%s), err \"%s\"; want MN_ELIMIT or "
                "MN_EMSGPACK and a message naming the depth limit\n",
                n, maps ? "maps" : "arrays", rc, mn_strerror(rc), err);
  assert_true(rc == MN_ELIMIT || rc == MN_EMSGPACK);
  assert_non_null(strstr(err, "deeper"));
  assert_non_null(strstr(err, want));
}

static void test_decode_depth_limit(void **state) {
  (void)state;
  char err[256];
  /* MN_MAX_DEPTH arrays deep (the outer one included) is accepted... */
  assert_int_equal(decode_nested(MN_MAX_DEPTH, 0, err, sizeof(err)), 0);
  /* ...one more is not, nor any depth up to msgpack-c's own parser stack
   * (MSGPACK_EMBED_STACK_SIZE, 32 containers). */
  static const int deep[] = {MN_MAX_DEPTH + 1, MN_MAX_DEPTH + 4, 31, 32};
  for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) expect_depth_reject(deep[i], 0);
  /* Maps count towards depth the same way (plus the outer array). */
  assert_int_equal(decode_nested(MN_MAX_DEPTH - 1, 1, err, sizeof(err)), 0);
  expect_depth_reject(MN_MAX_DEPTH, 1);
  expect_depth_reject(30, 1);
}

/*
 * Nesting past msgpack-c's parser stack (more than 32 containers) makes
 * msgpack_unpack() fail with MSGPACK_UNPACK_NOMEM_ERROR before mn_decode's
 * own depth check runs. A hostile or buggy peer sending [[[[...]]]] must
 * still get a depth error naming the limit, not "out of memory".
 */
static void test_decode_depth_beyond_parser_stack(void **state) {
  (void)state;
  static const int deep[] = {33, 40, 100, 1000};
  for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) expect_depth_reject(deep[i], 0);
  expect_depth_reject(64, 1);
}

static void test_decode_item_limit(void **state) {
  (void)state;
  packbuf_t p;
  pb_init(&p);
  decoded_t d;

  /* [1, [nil x (MN_MAX_ITEMS + 1)]] */
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  msgpack_pack_array(&p.pk, MN_MAX_ITEMS + 1);
  for (uint32_t i = 0; i < MN_MAX_ITEMS + 1; i++) msgpack_pack_nil(&p.pk);
  assert_int_equal(decode(&d, p.b.data, p.b.len), MN_ELIMIT);
  assert_non_null(strstr(d.err, "MN_MAX_ITEMS"));
  decoded_free(&d);

  /* Exactly MN_MAX_ITEMS is allowed. */
  p.b.len = 0;
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_int(&p.pk, MN_MSG_PING);
  msgpack_pack_array(&p.pk, MN_MAX_ITEMS);
  for (uint32_t i = 0; i < MN_MAX_ITEMS; i++) msgpack_pack_nil(&p.pk);
  assert_int_equal(decode(&d, p.b.data, p.b.len), 0);
  decoded_free(&d);
  mn_buf_free(&p.b);
}

/* ---- accessors ------------------------------------------------------------- */

static void test_accessors(void **state) {
  (void)state;
  packbuf_t p;
  pb_init(&p);
  static const char binv[] = {0, 1, 2, (char)0xff};
  msgpack_pack_array(&p.pk, 10);
  msgpack_pack_int(&p.pk, MN_MSG_PING);            /* 0 */
  msgpack_pack_uint64(&p.pk, 42);                  /* 1 */
  msgpack_pack_int64(&p.pk, -5);                   /* 2 */
  mn_pack_cstr(&p.pk, "str");                      /* 3 */
  msgpack_pack_bin(&p.pk, sizeof(binv));           /* 4 */
  msgpack_pack_bin_body(&p.pk, binv, sizeof(binv));
  msgpack_pack_double(&p.pk, 1.5);                 /* 5 */
  msgpack_pack_nil(&p.pk);                         /* 6 */
  msgpack_pack_uint64(&p.pk, UINT64_MAX);          /* 7 */
  msgpack_pack_true(&p.pk);                        /* 8 */
  msgpack_pack_array(&p.pk, 1);                    /* 9 */
  msgpack_pack_int(&p.pk, 1);

  decoded_t d;
  assert_int_equal(decode(&d, p.b.data, p.b.len), 0);
  const msgpack_object *o = &d.obj;
  uint64_t u = 99;
  int64_t i = 99;
  const char *s = NULL;
  size_t n = 99;

  /* Right types. */
  assert_int_equal(mn_get_u64(o, 1, &u), 0);
  assert_int_equal(u, 42);
  assert_int_equal(mn_get_i64(o, 1, &i), 0);
  assert_int_equal(i, 42);
  assert_int_equal(mn_get_i64(o, 2, &i), 0);
  assert_int_equal(i, -5);
  assert_int_equal(mn_get_str(o, 3, &s, &n), 0);
  assert_int_equal(n, 3);
  assert_memory_equal(s, "str", 3);
  assert_int_equal(mn_get_bin(o, 4, &s, &n), 0);
  assert_int_equal(n, sizeof(binv));
  assert_memory_equal(s, binv, sizeof(binv));
  assert_int_equal(mn_get_u64(o, 7, &u), 0);
  assert_true(u == UINT64_MAX);

  /* Wrong types, and outputs untouched. */
  u = 7;
  i = 7;
  s = NULL;
  n = 7;
  assert_int_equal(mn_get_u64(o, 2, &u), MN_EPROTO);  /* negative */
  assert_int_equal(mn_get_u64(o, 3, &u), MN_EPROTO);  /* string */
  assert_int_equal(mn_get_u64(o, 5, &u), MN_EPROTO);  /* float */
  assert_int_equal(mn_get_u64(o, 6, &u), MN_EPROTO);  /* nil */
  assert_int_equal(mn_get_u64(o, 8, &u), MN_EPROTO);  /* bool */
  assert_int_equal(u, 7);
  assert_int_equal(mn_get_i64(o, 7, &i), MN_EPROTO);  /* > INT64_MAX */
  assert_int_equal(mn_get_i64(o, 5, &i), MN_EPROTO);
  assert_int_equal(mn_get_i64(o, 3, &i), MN_EPROTO);
  assert_int_equal(i, 7);
  assert_int_equal(mn_get_str(o, 4, &s, &n), MN_EPROTO); /* bin is not str */
  assert_int_equal(mn_get_str(o, 1, &s, &n), MN_EPROTO);
  assert_int_equal(mn_get_str(o, 9, &s, &n), MN_EPROTO);
  assert_int_equal(mn_get_bin(o, 3, &s, &n), MN_EPROTO); /* str is not bin */
  assert_int_equal(mn_get_bin(o, 6, &s, &n), MN_EPROTO);
  assert_null(s);
  assert_int_equal(n, 7);

  /* Out of range. */
  assert_int_equal(mn_get_u64(o, 10, &u), MN_EPROTO);
  assert_int_equal(mn_get_i64(o, 1000, &i), MN_EPROTO);
  assert_int_equal(mn_get_str(o, 10, &s, &n), MN_EPROTO);
  assert_int_equal(mn_get_bin(o, UINT32_MAX, &s, &n), MN_EPROTO);
  decoded_free(&d);
  mn_buf_free(&p.b);
}

static void test_map_get(void **state) {
  (void)state;
  packbuf_t p;
  pb_init(&p);
  msgpack_pack_array(&p.pk, 3);
  msgpack_pack_int(&p.pk, MN_MSG_WELCOME);
  msgpack_pack_map(&p.pk, 4);
  mn_pack_cstr(&p.pk, "ab");
  msgpack_pack_int(&p.pk, 1);
  mn_pack_cstr(&p.pk, "abc");
  mn_pack_cstr(&p.pk, "three");
  msgpack_pack_int(&p.pk, 7); /* a non-string key */
  msgpack_pack_int(&p.pk, 2);
  mn_pack_cstr(&p.pk, "");
  msgpack_pack_nil(&p.pk);
  msgpack_pack_array(&p.pk, 0);

  decoded_t d;
  assert_int_equal(decode(&d, p.b.data, p.b.len), 0);
  const msgpack_object *map = &d.obj.via.array.ptr[1];
  const msgpack_object *v = mn_map_get(map, "ab");
  assert_non_null(v);
  assert_int_equal(v->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_int_equal(v->via.u64, 1);
  v = mn_map_get(map, "abc");
  assert_non_null(v);
  assert_int_equal(v->type, MSGPACK_OBJECT_STR);
  assert_int_equal(v->via.str.size, 5);
  assert_memory_equal(v->via.str.ptr, "three", 5);
  v = mn_map_get(map, "");
  assert_non_null(v);
  assert_int_equal(v->type, MSGPACK_OBJECT_NIL);
  assert_null(mn_map_get(map, "a"));     /* a prefix of a key is not the key */
  assert_null(mn_map_get(map, "abcd"));
  assert_null(mn_map_get(map, "7"));     /* an integer key is not a string */
  assert_null(mn_map_get(&d.obj.via.array.ptr[2], "ab")); /* not a map */
  assert_null(mn_map_get(&d.obj, "ab"));
  assert_null(mn_map_get(NULL, "ab"));
  decoded_free(&d);
  mn_buf_free(&p.b);
}

static void test_pack_error(void **state) {
  (void)state;
  mn_buf_t b;
  mn_buf_init(&b);
  assert_int_equal(mn_buf_append(&b, "junk", 4), 0); /* frames append after existing bytes */
  assert_int_equal(mn_pack_error(&b, MN_EPROTO, "something went wrong"), 0);
  assert_int_equal(mn_pack_error(&b, 7, ""), 0);

  const char *body;
  int64_t n = mn_frame_peek(b.data + 4, b.len - 4, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  decoded_t d;
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(d.obj.via.array.size, 3);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_ERROR);
  int64_t code;
  const char *s;
  size_t sl;
  assert_int_equal(mn_get_i64(&d.obj, 1, &code), 0);
  assert_int_equal(code, MN_EPROTO);
  assert_int_equal(mn_get_str(&d.obj, 2, &s, &sl), 0);
  assert_int_equal(sl, strlen("something went wrong"));
  assert_memory_equal(s, "something went wrong", sl);
  decoded_free(&d);

  size_t off = 4 + MN_FRAME_HEADER + (size_t)n;
  n = mn_frame_peek(b.data + off, b.len - off, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(off + MN_FRAME_HEADER + (size_t)n, b.len);
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_ERROR);
  assert_int_equal(mn_get_i64(&d.obj, 1, &code), 0);
  assert_int_equal(code, 7);
  assert_int_equal(mn_get_str(&d.obj, 2, &s, &sl), 0);
  assert_int_equal(sl, 0);
  decoded_free(&d);
  mn_buf_free(&b);
}

static void test_strerror(void **state) {
  (void)state;
  static const int codes[] = {MN_OK, MN_EAGAIN, MN_EFRAME, MN_EMSGPACK, MN_ELIMIT, MN_EPROTO,
                              MN_EAUTH, MN_EVERSION, MN_ENOMEM, MN_ECLOSED, MN_ETIMEDOUT, MN_EINVAL,
                              MN_ENOTFOUND, MN_EPEER, MN_ECANCELED, MN_EKERNEL, MN_EDEVICE};
  size_t nc = sizeof(codes) / sizeof(codes[0]);
  for (size_t i = 0; i < nc; i++) {
    const char *a = mn_strerror(codes[i]);
    assert_non_null(a);
    assert_true(strlen(a) > 0);
    assert_string_not_equal(a, "unknown error");
    for (size_t j = 0; j < i; j++) assert_string_not_equal(a, mn_strerror(codes[j]));
  }
  assert_string_equal(mn_strerror(-ENOENT), strerror(ENOENT));
  assert_string_equal(mn_strerror(-99999), "unknown error");
  assert_string_equal(mn_strerror(5), "unknown error");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buf_growth),
    cmocka_unit_test(test_buf_consume),
    cmocka_unit_test(test_frame_round_trip),
    cmocka_unit_test(test_frame_limits),
    cmocka_unit_test(test_decode_valid),
    cmocka_unit_test(test_decode_rejects),
    cmocka_unit_test(test_decode_depth_limit),
    cmocka_unit_test(test_decode_depth_beyond_parser_stack),
    cmocka_unit_test(test_decode_item_limit),
    cmocka_unit_test(test_accessors),
    cmocka_unit_test(test_map_get),
    cmocka_unit_test(test_pack_error),
    cmocka_unit_test(test_strerror),
  };
  return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
