/*
 * wire.h - framing, the msgpack codec glue and the protocol's named limits.
 *
 * A frame is a 4-byte big-endian body length followed by one msgpack array
 * whose first element is a message type (mn_msg_t, msg.h, which builds and
 * parses every message). docs/protocol.md is the specification; this header
 * and msg.h are its C mirror.
 */
#ifndef MN_WIRE_H
#define MN_WIRE_H

#include "err.h"

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MN_PROTOCOL_VERSION 2
#define MN_FRAME_HEADER 4            /* bytes of length prefix */
#define MN_MAX_FRAME (1u << 30)      /* largest frame body accepted, bytes */
#define MN_MAX_DEPTH 16              /* deepest nesting of arrays/maps in a frame */
#define MN_MAX_STR (1u << 30)        /* longest str/bin in a frame, bytes */
#define MN_MAX_ITEMS (1u << 20)      /* most elements of one array or map */
#define MN_MAX_ARGS 64               /* most arguments of one call */
#define MN_MAX_NAME 256              /* longest kernel or library name */



/* ---- growable byte buffer ---------------------------------------------- */

typedef struct {
  char *data;
  size_t len;
  size_t cap;
} mn_buf_t;

void mn_buf_init(mn_buf_t *b);
void mn_buf_free(mn_buf_t *b);
/* Makes room for `extra` more bytes; returns 0 or MN_ENOMEM. */
int mn_buf_reserve(mn_buf_t *b, size_t extra);
/* Appends n bytes; 0 or MN_ENOMEM. Inline, and 8 to 32 bytes as two fixed-size moves that overlap:
 * the controller copies a CALL of a few dozen bytes per proc of a cast, where a call to memcpy costs
 * more than the copy. */
static inline int mn_buf_append(mn_buf_t *b, const void *p, size_t n) {
  if (n == 0) return 0;
  if (b->cap - b->len < n && mn_buf_reserve(b, n) != 0) return MN_ENOMEM;
  char *d = b->data + b->len;
  const char *s = p;
  if (n >= 16 && n <= 32) {
    memcpy(d, s, 16);
    memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8 && n < 16) {
    memcpy(d, s, 8);
    memcpy(d + n - 8, s + n - 8, 8);
  } else {
    memcpy(d, s, n);
  }
  b->len += n;
  return 0;
}
/* Drops the first n bytes. */
void mn_buf_consume(mn_buf_t *b, size_t n);
/*
 * msgpack_packer write callback whose data is an mn_buf_t*. It keeps
 * msgpack-c's callback convention (0, or -1 when memory runs out), which
 * msgpack_pack_* hand on to kernels through the mk_return_* helpers.
 */
int mn_buf_write_cb(void *data, const char *p, size_t n);

/* ---- framing ------------------------------------------------------------ */

/* Reserves the length prefix of a new frame; returns its offset in b. */
size_t mn_frame_begin(mn_buf_t *b);
/* A new frame in a fresh buffer: initialises b and a packer writing into it,
 * reserves the prefix (mn_frame_begin) and returns its offset. */
size_t mn_frame_start(mn_buf_t *b, msgpack_packer *pk);
/* Patches the length prefix once the body has been packed after `start`. */
void mn_frame_end(mn_buf_t *b, size_t start);

static inline uint32_t mn_be32(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  return ((uint32_t)u[0] << 24) | ((uint32_t)u[1] << 16) | ((uint32_t)u[2] << 8) | u[3];
}

static inline void mn_put_be32(char *p, uint32_t v) {
  p[0] = (char)(v >> 24); p[1] = (char)(v >> 16); p[2] = (char)(v >> 8); p[3] = (char)v;
}

/*
 * Finds the next complete frame in data[0..len). Returns the body length and
 * sets *body when one is there, MN_EAGAIN when more bytes are needed, or
 * MN_EFRAME when the prefix announces more than `max` bytes.
 */
int64_t mn_frame_peek(const char *data, size_t len, size_t max, const char **body);

/*
 * Decodes one frame body into *obj, allocating in `zone` (the caller owns
 * the zone and clears it when done with obj). Checks that the body is one
 * msgpack array of at least one element starting with a positive integer
 * type, and every named limit. Returns 0 or an MN_E* code and writes a
 * message naming what was wrong into err.
 */
int mn_decode(const char *body, size_t len, msgpack_zone *zone, msgpack_object *obj,
              char *err, size_t errlen);

/*
 * Decodes the one msgpack object at body[*off] of a frame body of len bytes
 * (a reader that walks a frame element by element), checking the limits
 * mn_decode checks with the object at nesting depth `depth` of its frame,
 * and advances *off past it. 0 or an MN_E* code with err.
 */
int mn_decode_next(const char *body, size_t len, size_t *off, int depth, msgpack_zone *zone, msgpack_object *obj,
                   char *err, size_t errlen);

/* Type of a decoded message (its first element). */
static inline int mn_msg_type(const msgpack_object *o) { return (int)o->via.array.ptr[0].via.u64; }

/* Small accessors that return 0 on success, MN_EPROTO if the element is
 * missing or of another type. */
int mn_get_u64(const msgpack_object *arr, uint32_t i, uint64_t *out);
int mn_get_i64(const msgpack_object *arr, uint32_t i, int64_t *out);
int mn_get_str(const msgpack_object *arr, uint32_t i, const char **p, size_t *n);
int mn_get_bin(const msgpack_object *arr, uint32_t i, const char **p, size_t *n);
/* Looks a key up in a map object; NULL if absent. */
const msgpack_object *mn_map_get(const msgpack_object *map, const char *key);

void mn_pack_cstr(msgpack_packer *pk, const char *s);

/* The message types, their builders and parsers build on the above. */
#include "msg.h"

#endif /* MN_WIRE_H */
