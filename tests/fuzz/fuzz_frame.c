/*
 * fuzz_frame.c - libFuzzer target for the frame layer: mn_frame_peek and
 * mn_decode over arbitrary bytes, several frames per input.
 *
 * The input is a byte stream as a peer would send it. It is fed to an
 * mn_buf_t in chunks of varying size, the way the proc's reader receives
 * it, and split into frames with mn_frame_peek; every body goes through
 * mn_decode and the accessors the servers use on decoded messages.
 *
 * Decoded messages also go through the parsers of CAST, RESULTS, ACKS, TREE
 * and LINKED, which agents run on what controllers and parent agents send.
 *
 * Oracles beyond the sanitizers: mn_decode returns only documented codes
 * and always fills err on failure; a decoded message packs back into a
 * frame that decodes again to an equal object (NaN compared bitwise).
 */
#include "fuzz_util.h"
#include "msg.h"
#include "wire.h"

#define FUZZ_HANDSHAKE_MAX 4096 /* the pre-authentication frame limit of agent and proc */

static int known_code(int rc) {
  return rc == 0 || rc == MN_EMSGPACK || rc == MN_ELIMIT || rc == MN_EPROTO || rc == MN_ENOMEM;
}

/* Structural equality; floats compare by bit pattern so that NaN equals itself. */
static int same(const msgpack_object *a, const msgpack_object *b) {
  if (a->type != b->type) return 0;
  switch (a->type) {
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    return memcmp(&a->via.f64, &b->via.f64, sizeof(double)) == 0;
  case MSGPACK_OBJECT_ARRAY:
    if (a->via.array.size != b->via.array.size) return 0;
    for (uint32_t i = 0; i < a->via.array.size; i++)
      if (!same(&a->via.array.ptr[i], &b->via.array.ptr[i])) return 0;
    return 1;
  case MSGPACK_OBJECT_MAP:
    if (a->via.map.size != b->via.map.size) return 0;
    for (uint32_t i = 0; i < a->via.map.size; i++)
      if (!same(&a->via.map.ptr[i].key, &b->via.map.ptr[i].key) ||
          !same(&a->via.map.ptr[i].val, &b->via.map.ptr[i].val))
        return 0;
    return 1;
  default:
    return msgpack_object_equal(*a, *b);
  }
}

static volatile size_t sink; /* keeps the reads below from being optimized away */

/* Touches a decoded message the way the servers do: typed getters and map lookups. */
static void use_message(const msgpack_object *m) {
  uint64_t u;
  int64_t i;
  const char *p;
  size_t n;
  sink += (size_t)mn_msg_type(m);
  for (uint32_t k = 0; k < m->via.array.size && k < 8; k++) {
    if (mn_get_u64(m, k, &u) == 0) sink += (size_t)u;
    if (mn_get_i64(m, k, &i) == 0) sink += (size_t)i;
    if (mn_get_str(m, k, &p, &n) == 0 && n > 0) sink += (unsigned char)p[n - 1];
    if (mn_get_bin(m, k, &p, &n) == 0 && n > 0) sink += (unsigned char)p[0];
    const msgpack_object *v = mn_map_get(&m->via.array.ptr[k], "count");
    if (v != NULL) sink += v->type;
  }
  /* Out-of-range indexes must be refused, not read. */
  FZ_CHECK(mn_get_u64(m, m->via.array.size, &u) == MN_EPROTO, "getter past the end succeeded");
}

/* The parsers of the cast and tree messages, which agents run on what controllers and parent agents
 * send: each accepts or refuses with MN_EPROTO and a text, and what it hands back is in bounds. */
static void parse_casts(const msgpack_object *m) {
  char err[300];
  const msgpack_object *t, *subs;
  const char *rest;
  size_t rlen;
  uint64_t e, i;
  uint32_t n;
  int up, rc;
  err[0] = '\0';
  if ((rc = mn_msg_parse_cast(m, &t, &rest, &rlen, err, sizeof(err))) == 0) {
    FZ_CHECK(t->via.array.size % 3 == 0, "CAST targets not in triples");
    if (mn_msg_parse_cast_subs(m, &subs, err, sizeof(err)) == 0 && subs != NULL)
      for (uint32_t q = 0; q < subs->via.array.size; q += 4) sink += subs->via.array.ptr[q + 2].via.array.size;
  }
  FZ_CHECK(rc == 0 || (rc == MN_EPROTO && err[0] != '\0'), "CAST refused without a text");
  uint64_t ping, silence;
  if (mn_msg_parse_tree(m, &e, &t, &ping, &silence, err, sizeof(err)) == 0)
    for (uint32_t k = 0; k < t->via.array.size; k += 2) sink += t->via.array.ptr[k].via.str.size + (size_t)(ping + silence);
  if (mn_msg_parse_linked(m, &e, &i, &up, err, sizeof(err)) == 0) sink += (size_t)(e + i) + (size_t)up;
  if (mn_msg_parse_acks(m, &t, err, sizeof(err)) == 0) FZ_CHECK(t->via.array.size % 2 == 0, "ACKS not in pairs");
  if (mn_msg_parse_acks_subs(m, &subs, err, sizeof(err)) == 0 && subs != NULL)
    for (uint32_t q = 0; q < subs->via.array.size; q += 3) sink += subs->via.array.ptr[q + 1].via.array.size;
  if (mn_msg_parse_results(m, &n, err, sizeof(err)) == 0) FZ_CHECK(2 * n + 1 == m->via.array.size, "RESULTS count");
}

/* Packs a decoded message back into a frame and checks it decodes to the same thing. */
static void roundtrip(const msgpack_object *m) {
  mn_buf_t b;
  msgpack_packer pk;
  msgpack_zone z;
  msgpack_object again;
  const char *body;
  char err[256];
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t start = mn_frame_begin(&b);
  FZ_CHECK(msgpack_pack_object(&pk, *m) == 0, "repacking a decoded object failed");
  mn_frame_end(&b, start);
  int64_t n = mn_frame_peek(b.data, b.len, MN_MAX_FRAME, &body);
  FZ_CHECK(n > 0 && (size_t)n + MN_FRAME_HEADER == b.len, "repacked frame does not peek whole (%lld)",
        (long long)n);
  FZ_CHECK(msgpack_zone_init(&z, 1024), "zone init");
  int rc = mn_decode(body, (size_t)n, &z, &again, err, sizeof(err));
  FZ_CHECK(rc == 0, "repacked frame does not decode: %s", err);
  FZ_CHECK(same(m, &again), "repacked frame decodes to a different object");
  msgpack_zone_destroy(&z);
  mn_buf_free(&b);
}

/* Splits buf into frames like a server's reader; returns bytes consumed. */
static size_t drain(mn_buf_t *in, size_t max, msgpack_zone *zone, int *closed) {
  size_t off = 0;
  char err[256];
  for (;;) {
    const char *body;
    int64_t n = mn_frame_peek(in->data + off, in->len - off, max, &body);
    if (n == MN_EAGAIN) break;
    if (n < 0) { /* a server answers ERROR and closes here */
      FZ_CHECK(n == MN_EFRAME, "mn_frame_peek returned %lld", (long long)n);
      *closed = 1;
      break;
    }
    FZ_CHECK(n > 0 && (size_t)n <= max && body == in->data + off + MN_FRAME_HEADER,
          "mn_frame_peek returned a body outside the frame");
    off += MN_FRAME_HEADER + (size_t)n;
    if (fz_skip_overcount() && fz_overcount(body, (size_t)n)) { /* known issue F1 */
      *closed = 1;
      break;
    }
    msgpack_object m;
    err[0] = '\0';
    msgpack_zone_clear(zone);
    int rc = mn_decode(body, (size_t)n, zone, &m, err, sizeof(err));
    FZ_CHECK(known_code(rc), "mn_decode returned undocumented code %d", rc);
    if (rc != 0) {
      FZ_CHECK(err[0] != '\0', "mn_decode failed (%d) without a message", rc);
      *closed = 1;
      break;
    }
    FZ_CHECK(m.type == MSGPACK_OBJECT_ARRAY && m.via.array.size > 0, "decoded a non-message");
    use_message(&m);
    parse_casts(&m);
    roundtrip(&m);
  }
  return off;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msgpack_zone zone;
  if (!msgpack_zone_init(&zone, 4096)) return 0;
  /* Pass 1: the pre-authentication limit. Pass 2: the full limit, fed in
   * chunks whose sizes come from the data so partial frames are exercised. */
  for (int pass = 0; pass < 2; pass++) {
    size_t max = pass == 0 ? FUZZ_HANDSHAKE_MAX : MN_MAX_FRAME;
    mn_buf_t in;
    int closed = 0;
    size_t fed = 0, step = 1;
    mn_buf_init(&in);
    while (fed < size && !closed) {
      size_t chunk = pass == 0 ? size : step;
      if (chunk > size - fed) chunk = size - fed;
      FZ_CHECK(mn_buf_append(&in, data + fed, chunk) == 0, "append");
      fed += chunk;
      step = (step * 7 + (size_t)data[fed - 1]) % 61 + 1;
      size_t used = drain(&in, max, &zone, &closed);
      mn_buf_consume(&in, used);
    }
    mn_buf_free(&in);
  }
  msgpack_zone_destroy(&zone);
  return 0;
}
