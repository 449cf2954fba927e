/*
 * msg_helpers.h - what test_msg.c and test_msg_calls.c share: a frame
 * decoded with its zone (take, done), messages packed by hand from a format
 * (hand), and the checks of exact bytes and of errors that name a field.
 */
#ifndef MN_TEST_MSG_HELPERS_H
#define MN_TEST_MSG_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"


/* One frame decoded, with the zone it lives in. */
typedef struct {
  mn_buf_t b; /* the frame: strings and bins of obj point into it */
  msgpack_zone zone;
  msgpack_object obj;
  char err[400];
} msg_t;

/* Decodes the single whole frame in b (which m takes over) into m. */
static inline void take(mn_buf_t *b, msg_t *m) {
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

static inline void done(msg_t *m) {
  msgpack_zone_destroy(&m->zone);
  mn_buf_free(&m->b);
}

/* Packs an array message by hand from a format: u (uint64), i (int64), s (str), b (bin of 32), n (nil), t/f (bool), m (empty map), a (empty array). */
static inline void hand(mn_buf_t *b, const char *fmt, ...) {
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

static inline void expect_bytes(const char *got, size_t n, const unsigned char *want, size_t wn) {
  assert_int_equal(n, wn);
  assert_memory_equal(got, want, wn);
}

/* Asserts that err says what is malformed and names `field`. */
static inline void expect_named(int rc, const char *err, const char *name, const char *field) {
  assert_int_equal(rc, MN_EPROTO);
  if (strstr(err, name) == NULL || strstr(err, field) == NULL)
    print_error("error \"%s\" lacks \"%s\" or \"%s\"\n", err, name, field);
  assert_non_null(strstr(err, name));
  assert_non_null(strstr(err, field));
}


#endif
