/* wire.c - framing and msgpack glue; see wire.h. */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ------------------------------------------------------------- */

void mn_buf_init(mn_buf_t *b) { memset(b, 0, sizeof(*b)); }

void mn_buf_free(mn_buf_t *b) {
  free(b->data);
  mn_buf_init(b);
}

int mn_buf_reserve(mn_buf_t *b, size_t extra) {
  if (b->cap - b->len >= extra) return 0;
  size_t cap = b->cap ? b->cap : 64; /* small first: a controller holds several buffers per proc */
  while (cap - b->len < extra) {
    if (cap > SIZE_MAX / 2) return MN_ENOMEM;
    cap *= 2;
  }
  char *p = realloc(b->data, cap);
  if (p == NULL) return MN_ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}


void mn_buf_consume(mn_buf_t *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

int mn_buf_write_cb(void *data, const char *p, size_t n) {
  return mn_buf_append((mn_buf_t *)data, p, n) == 0 ? 0 : -1;
}

/* ---- framing ------------------------------------------------------------ */

size_t mn_frame_start(mn_buf_t *b, msgpack_packer *pk) {
  mn_buf_init(b);
  msgpack_packer_init(pk, b, mn_buf_write_cb);
  return mn_frame_begin(b);
}

size_t mn_frame_begin(mn_buf_t *b) {
  size_t start = b->len;
  static const char zero[MN_FRAME_HEADER] = {0};
  (void)mn_buf_append(b, zero, sizeof(zero)); /* failure surfaces at mn_frame_end */
  return start;
}

void mn_frame_end(mn_buf_t *b, size_t start) {
  if (b->len < start + MN_FRAME_HEADER) return;
  mn_put_be32(b->data + start, (uint32_t)(b->len - start - MN_FRAME_HEADER));
}

int64_t mn_frame_peek(const char *data, size_t len, size_t max, const char **body) {
  if (len < MN_FRAME_HEADER) return MN_EAGAIN;
  uint32_t n = mn_be32(data);
  if (n > max || n == 0) return MN_EFRAME;
  if (len - MN_FRAME_HEADER < n) return MN_EAGAIN;
  *body = data + MN_FRAME_HEADER;
  return n;
}

/* Walks a decoded object checking the nesting and size limits. */
static int check_limits(const msgpack_object *o, int depth, char *err, size_t errlen) {
  if (depth > MN_MAX_DEPTH) {
    snprintf(err, errlen, "nesting deeper than MN_MAX_DEPTH (%d)", MN_MAX_DEPTH);
    return MN_ELIMIT;
  }
  switch (o->type) {
  case MSGPACK_OBJECT_STR:
  case MSGPACK_OBJECT_BIN:
    if (o->via.str.size > MN_MAX_STR) {
      snprintf(err, errlen, "string of %u bytes exceeds MN_MAX_STR", o->via.str.size);
      return MN_ELIMIT;
    }
    return 0;
  case MSGPACK_OBJECT_ARRAY:
    if (o->via.array.size > MN_MAX_ITEMS) {
      snprintf(err, errlen, "array of %u items exceeds MN_MAX_ITEMS (%u)", o->via.array.size,
               MN_MAX_ITEMS);
      return MN_ELIMIT;
    }
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      int rc = check_limits(&o->via.array.ptr[i], depth + 1, err, errlen);
      if (rc != 0) return rc;
    }
    return 0;
  case MSGPACK_OBJECT_MAP:
    if (o->via.map.size > MN_MAX_ITEMS) {
      snprintf(err, errlen, "map of %u entries exceeds MN_MAX_ITEMS (%u)", o->via.map.size,
               MN_MAX_ITEMS);
      return MN_ELIMIT;
    }
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      int rc = check_limits(&o->via.map.ptr[i].key, depth + 1, err, errlen);
      if (rc == 0) rc = check_limits(&o->via.map.ptr[i].val, depth + 1, err, errlen);
      if (rc != 0) return rc;
    }
    return 0;
  default:
    return 0;
  }
}

/*
 * Walks the raw msgpack of a body before msgpack-c decodes it. msgpack-c
 * allocates an array's or map's storage from the count in its header, before
 * any element arrives: a 5-byte body announcing 2^31 elements would ask for
 * 48 GiB. Every element takes at least one byte, so a count beyond the bytes
 * left, or beyond MN_MAX_ITEMS, is refused here, before anything is
 * allocated. Malformed or truncated input is left for msgpack-c to report.
 */
static int check_counts(const char *body, size_t len, char *err, size_t errlen) {
  const unsigned char *p = (const unsigned char *)body;
  size_t i = 0;
  uint64_t need = 1; /* objects still to read */
  while (need > 0 && i < len) {
    unsigned c = p[i++];
    uint64_t items = 0, skip = 0, n = 0;
    int hdr = 0; /* bytes of length field after the type byte */
    need--;
    if (c >= 0x80 && c <= 0x8f) items = 2u * (c & 0x0f);      /* fixmap */
    else if (c >= 0x90 && c <= 0x9f) items = c & 0x0f;        /* fixarray */
    else if (c >= 0xa0 && c <= 0xbf) skip = c & 0x1f;         /* fixstr */
    else if (c >= 0xc4 && c <= 0xc6) hdr = 1 << (c - 0xc4);   /* bin 8/16/32 */
    else if (c >= 0xc7 && c <= 0xc9) hdr = 1 << (c - 0xc7), skip = 1; /* ext 8/16/32 + type */
    else if (c >= 0xca && c <= 0xcb) skip = c == 0xca ? 4 : 8; /* float 32/64 */
    else if (c >= 0xcc && c <= 0xcf) skip = 1u << (c - 0xcc); /* uint 8..64 */
    else if (c >= 0xd0 && c <= 0xd3) skip = 1u << (c - 0xd0); /* int 8..64 */
    else if (c >= 0xd4 && c <= 0xd8) skip = 1 + (1u << (c - 0xd4)); /* fixext: type + data */
    else if (c >= 0xd9 && c <= 0xdb) hdr = 1 << (c - 0xd9);   /* str 8/16/32 */
    else if (c >= 0xdc && c <= 0xdf) hdr = c & 1 ? 4 : 2;     /* array, map 16/32 */
    if (hdr > 0) {
      if (len - i < (size_t)hdr) return 0;
      for (int k = 0; k < hdr; k++) n = (n << 8) | p[i++];
      if (c >= 0xdc) {
        if (n > MN_MAX_ITEMS) {
          snprintf(err, errlen, "%s of %llu items exceeds MN_MAX_ITEMS (%u)", c <= 0xdd ? "array" : "map",
                   (unsigned long long)n, MN_MAX_ITEMS);
          return MN_ELIMIT;
        }
        items = c <= 0xdd ? n : 2 * n;
      } else {
        skip += n;
      }
    }
    if (skip > len - i) return 0; /* a short str/bin/ext: msgpack-c refuses it without allocating */
    i += (size_t)skip;
    need += items;
    if (need > len - i) {
      snprintf(err, errlen, "frame of %zu bytes is not valid msgpack: it announces %llu more elements than it holds", len,
               (unsigned long long)(need - (len - i)));
      return MN_EMSGPACK;
    }
  }
  return 0;
}

int mn_decode(const char *body, size_t len, msgpack_zone *zone, msgpack_object *obj, char *err,
              size_t errlen) {
  size_t off = 0;
  int rc = check_counts(body, len, err, errlen);
  if (rc != 0) return rc;
  msgpack_unpack_return r = msgpack_unpack(body, len, &off, zone, obj);
  if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
    /* msgpack-c reports its fixed parser stack (32 levels) running out as
     * NOMEM; a frame that small is a nesting violation, not memory trouble. */
    snprintf(err, errlen, "frame of %zu bytes nests deeper than MN_MAX_DEPTH (%d) or is too large to decode",
             len, MN_MAX_DEPTH);
    return MN_ELIMIT;
  }
  if (r != MSGPACK_UNPACK_SUCCESS && r != MSGPACK_UNPACK_EXTRA_BYTES) {
    snprintf(err, errlen, "frame of %zu bytes is not valid msgpack (or nests deeper than %d)",
             len, MN_MAX_DEPTH);
    return MN_EMSGPACK;
  }
  if (off != len) {
    snprintf(err, errlen, "frame has %zu trailing bytes after its message", len - off);
    return MN_EMSGPACK;
  }
  if (obj->type != MSGPACK_OBJECT_ARRAY || obj->via.array.size == 0 ||
      obj->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    snprintf(err, errlen, "frame is not an array starting with a message type");
    return MN_EPROTO;
  }
  return check_limits(obj, 0, err, errlen);
}

int mn_decode_next(const char *body, size_t len, size_t *off, int depth, msgpack_zone *zone, msgpack_object *obj,
                   char *err, size_t errlen) {
  if (*off >= len) {
    snprintf(err, errlen, "frame of %zu bytes ends where an element should start", len);
    return MN_EMSGPACK;
  }
  int rc = check_counts(body + *off, len - *off, err, errlen); /* it stops after this one object */
  if (rc != 0) return rc;
  msgpack_unpack_return r = msgpack_unpack(body, len, off, zone, obj);
  if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
    snprintf(err, errlen, "element nests deeper than MN_MAX_DEPTH (%d) or is too large to decode", MN_MAX_DEPTH);
    return MN_ELIMIT;
  }
  if (r != MSGPACK_UNPACK_SUCCESS && r != MSGPACK_UNPACK_EXTRA_BYTES) {
    snprintf(err, errlen, "frame of %zu bytes is not valid msgpack (or nests deeper than %d)", len, MN_MAX_DEPTH);
    return MN_EMSGPACK;
  }
  return check_limits(obj, depth, err, errlen);
}

int mn_get_u64(const msgpack_object *arr, uint32_t i, uint64_t *out) {
  if (i >= arr->via.array.size) return MN_EPROTO;
  const msgpack_object *o = &arr->via.array.ptr[i];
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return MN_EPROTO;
  *out = o->via.u64;
  return 0;
}

int mn_get_i64(const msgpack_object *arr, uint32_t i, int64_t *out) {
  if (i >= arr->via.array.size) return MN_EPROTO;
  const msgpack_object *o = &arr->via.array.ptr[i];
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) *out = o->via.i64;
  else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
    *out = (int64_t)o->via.u64;
  else return MN_EPROTO;
  return 0;
}

int mn_get_str(const msgpack_object *arr, uint32_t i, const char **p, size_t *n) {
  if (i >= arr->via.array.size) return MN_EPROTO;
  const msgpack_object *o = &arr->via.array.ptr[i];
  if (o->type != MSGPACK_OBJECT_STR) return MN_EPROTO;
  *p = o->via.str.ptr;
  *n = o->via.str.size;
  return 0;
}

int mn_get_bin(const msgpack_object *arr, uint32_t i, const char **p, size_t *n) {
  if (i >= arr->via.array.size) return MN_EPROTO;
  const msgpack_object *o = &arr->via.array.ptr[i];
  if (o->type != MSGPACK_OBJECT_BIN) return MN_EPROTO;
  *p = o->via.bin.ptr;
  *n = o->via.bin.size;
  return 0;
}

const msgpack_object *mn_map_get(const msgpack_object *map, const char *key) {
  if (map == NULL || map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t kl = strlen(key);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && memcmp(k->via.str.ptr, key, kl) == 0)
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

void mn_pack_cstr(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}
