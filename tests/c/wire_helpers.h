/*
 * wire_helpers.h - what test_wire.c and test_sock.c share: a packer into an
 * mn_buf_t, decoding a body into a zone of its own, and packing one frame.
 */
#ifndef MN_TEST_WIRE_HELPERS_H
#define MN_TEST_WIRE_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sock.h"
#include "wire.h"


/* A packer writing into an mn_buf_t. */
typedef struct {
  mn_buf_t b;
  msgpack_packer pk;
} packbuf_t;

static inline void pb_init(packbuf_t *p) {
  mn_buf_init(&p->b);
  msgpack_packer_init(&p->pk, &p->b, mn_buf_write_cb);
}

/* A decoded message with the zone it lives in. */
typedef struct {
  msgpack_zone zone;
  msgpack_object obj;
  char err[256];
  int rc;
} decoded_t;

static inline int decode(decoded_t *d, const char *body, size_t len) {
  assert_true(msgpack_zone_init(&d->zone, 4096));
  memset(d->err, 0, sizeof(d->err));
  d->rc = mn_decode(body, len, &d->zone, &d->obj, d->err, sizeof(d->err));
  return d->rc;
}

static inline void decoded_free(decoded_t *d) { msgpack_zone_destroy(&d->zone); }

/* Asserts that decoding fails with `want` (0: any error) and a message. */
static inline int expect_reject(const char *body, size_t len, int want) {
  decoded_t d;
  int rc = decode(&d, body, len);
  assert_true(rc < 0);
  if (want != 0) assert_int_equal(rc, want);
  assert_true(strlen(d.err) > 0);
  decoded_free(&d);
  return rc;
}


/* Packs [type, "payload"] as one frame into b; returns the frame's size. */
static inline size_t pack_frame(mn_buf_t *b, int type, const char *payload) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, mn_buf_write_cb);
  size_t before = b->len;
  size_t start = mn_frame_begin(b);
  assert_int_equal(start, before);
  assert_int_equal(b->len, before + MN_FRAME_HEADER);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int(&pk, type);
  mn_pack_cstr(&pk, payload);
  mn_frame_end(b, start);
  return b->len - before;
}


#endif
