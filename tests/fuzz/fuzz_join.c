/*
 * fuzz_join.c - libFuzzer target for the JOIN exchange on a controller's
 * join port (host/core/join.c), both ends.
 *
 * The first input byte picks a mode:
 *   0  controller, raw: the rest is what a peer sends after our HELLO; its
 *      first frame (at most 4096 bytes, as ctl_join.c reads) goes through
 *      mn_decode and mn_join_accept.
 *   1  agent, raw: the first frame is the join port's greeting
 *      (mn_join_answer), the second its verdict (mn_join_check_joined).
 *   2  controller, structured: a JOIN built from the bytes, with a right or
 *      damaged MAC, wrong versions and nonce fields, and an address of
 *      arbitrary bytes.
 * The structured mode has an oracle: the JOIN is accepted exactly when it
 * was well formed, its MAC made with the cluster key and its address one
 * the controller may dial; and an accepted one's JOINED convinces an agent
 * holding the token and no other. Raw bytes are never accepted (that would
 * be a forged HMAC-SHA256).
 */
#include <sodium.h>

#include "fuzz_util.h"
#include "join.h"

#define FUZZ_JOIN_MAX 4096 /* what the join port reads */

static mn_auth_t key, other_key;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  FZ_CHECK(fz_rng_install() == 0, "randombytes_set_implementation");
  FZ_CHECK(mn_auth_global_init() == 0, "sodium_init");
  FZ_CHECK(mn_auth_init(&key, "fuzz-cluster-token", 18) == 0, "key");
  FZ_CHECK(mn_auth_init(&other_key, "another-token", 13) == 0, "other key");
  return 0;
}

typedef struct {
  const uint8_t *p;
  size_t n;
} in_t;

static uint8_t take(in_t *in) {
  if (in->n == 0) return 0;
  in->n--;
  return *in->p++;
}

/* Next frame body: a length-prefixed frame when one is there, else the rest as one body. 0, or -1 when empty. */
static int next_body(in_t *in, const char **body, size_t *len) {
  const char *b;
  if (in->n == 0) return -1;
  int64_t n = mn_frame_peek((const char *)in->p, in->n, FUZZ_JOIN_MAX, &b);
  size_t used = n > 0 ? MN_FRAME_HEADER + (size_t)n : in->n;
  *body = n > 0 ? b : (const char *)in->p;
  *len = n > 0 ? (size_t)n : in->n;
  in->p += used;
  in->n -= used;
  return 0;
}

static int decode(const char *body, size_t len, msgpack_zone *z, msgpack_object *m) {
  char err[256] = "";
  if (fz_skip_overcount() && fz_overcount(body, len)) return -1; /* known issue F1 */
  msgpack_zone_clear(z);
  int rc = mn_decode(body, len, z, m, err, sizeof(err));
  FZ_CHECK(rc == 0 || err[0] != '\0', "mn_decode failed without a message");
  return rc == 0 ? 0 : -1;
}

static void decode_own(const mn_buf_t *b, msgpack_zone *z, msgpack_object *m) {
  const char *body;
  int64_t n = mn_frame_peek(b->data, b->len, MN_MAX_FRAME, &body);
  FZ_CHECK(n > 0, "a frame we packed does not peek (%lld)", (long long)n);
  FZ_CHECK(decode(body, (size_t)n, z, m) == 0, "a frame we packed does not decode");
}

static int refusal(int rc) { return rc == MN_EAUTH || rc == MN_EVERSION || rc == MN_EPROTO; }

static void controller_raw(in_t *in, msgpack_zone *z) {
  uint8_t nj[MN_NONCE_LEN];
  char err[400] = "", addr[MN_MSG_JOIN_MAX_ADDR + 1];
  const char *body;
  size_t len;
  msgpack_object m;
  mn_buf_t out;
  mn_buf_init(&out);
  FZ_CHECK(mn_join_hello(&out, nj) == 0, "hello");
  out.len = 0;
  if (next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
    int rc = mn_join_accept(&out, &key, &m, nj, addr, sizeof(addr), err, sizeof(err));
    FZ_CHECK(refusal(rc), "mn_join_accept returned %d", rc);
    FZ_CHECK(err[0] != '\0', "refused without a message");
    FZ_CHECK(out.len == 0, "a refused JOIN got an answer");
  }
  mn_buf_free(&out);
}

static void agent_raw(in_t *in, msgpack_zone *z) {
  uint8_t nj[MN_NONCE_LEN], na[MN_NONCE_LEN];
  char err[400] = "";
  const char *body;
  size_t len;
  msgpack_object m;
  mn_buf_t out;
  mn_buf_init(&out);
  if (next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
    int rc = mn_join_answer(&out, &key, &m, "10.0.0.1:7000", nj, na, err, sizeof(err));
    FZ_CHECK(rc <= 0, "mn_join_answer returned %d", rc);
    FZ_CHECK(rc == 0 || err[0] != '\0', "refused without a message");
    if (rc == 0 && next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
      rc = mn_join_check_joined(&key, &m, nj, na, err, sizeof(err));
      FZ_CHECK(rc < 0, "JOINED from arbitrary bytes was accepted");
      FZ_CHECK(err[0] != '\0', "refused without a message");
    }
  }
  mn_buf_free(&out);
}

/* Packs a 32-byte field from want, exact or damaged as the input says; 1 when it is a bin equal to want. */
static int pack_field(msgpack_packer *pk, in_t *in, const uint8_t want[32]) {
  uint8_t how = take(in), buf[48];
  size_t n = 32;
  memcpy(buf, want, 32);
  if ((how & 3) == 1) buf[take(in) & 31] ^= (uint8_t)(1u << (take(in) & 7)); /* one bit off */
  if (how & 4) n = take(in) % 48;                                              /* another length */
  for (size_t i = 32; i < n; i++) buf[i] = take(in);
  if (how & 8) {
    msgpack_pack_str(pk, n); /* a str, not a bin */
    msgpack_pack_str_body(pk, buf, n);
  } else {
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, buf, n);
  }
  return !(how & 8) && n == 32 && memcmp(buf, want, 32) == 0;
}

/* The address field: arbitrary bytes (up to 300) as the input gives them, or a valid one. */
static size_t pick_addr(in_t *in, char *addr, size_t cap) {
  static const char *valid[] = {"127.0.0.1:7000", "[::1]:41000", "10.1.2.3:1", "192.168.0.9:65535"};
  uint8_t how = take(in);
  if (how < 128) {
    snprintf(addr, cap, "%s", valid[how & 3]);
    return strlen(addr);
  }
  size_t n = take(in) % 301;
  if (n > cap) n = cap;
  for (size_t i = 0; i < n; i++) addr[i] = (char)take(in);
  return n;
}

/* Whether the controller may dial addr: no NUL, not too long, and the rule join.h states. */
static int dialable(const char *addr, size_t n) {
  char s[MN_MSG_JOIN_MAX_ADDR + 1];
  if (n == 0 || n > MN_MSG_JOIN_MAX_ADDR || memchr(addr, '\0', n) != NULL) return 0;
  memcpy(s, addr, n);
  s[n] = '\0';
  return mn_join_check_addr(s) == 0;
}

static void controller_structured(in_t *in, msgpack_zone *z) {
  uint8_t nj[MN_NONCE_LEN], na[32], mac[MN_MAC_LEN];
  char err[400] = "", got[MN_MSG_JOIN_MAX_ADDR + 1], addr[304];
  msgpack_object m;
  mn_buf_t hello, join, joined;
  msgpack_packer pk;
  mn_buf_init(&hello);
  mn_buf_init(&join);
  mn_buf_init(&joined);
  FZ_CHECK(mn_join_hello(&hello, nj) == 0, "hello");
  for (int i = 0; i < 32; i++) na[i] = take(in);
  uint8_t head = take(in);
  size_t alen = pick_addr(in, addr, sizeof(addr));
  mn_auth_mac_data(head & 0x40 ? &other_key : &key, 'j', nj, na, addr, alen, mac);
  msgpack_packer_init(&pk, &join, mn_buf_write_cb);
  size_t start = mn_frame_begin(&join);
  msgpack_pack_array(&pk, 5 + (head >> 7));
  int ok = (head & 7) != 7 && (head & 0x40) == 0;
  msgpack_pack_int(&pk, (head & 7) != 7 ? MN_MSG_JOIN : MN_MSG_AUTH + (head & 0x20)); /* AUTH, or no type at all */
  ok &= (head & 0x18) == 0;
  msgpack_pack_int(&pk, (head & 0x18) == 0 ? MN_PROTOCOL_VERSION : 1 + (head & 0x18)); /* 9, 17, 25: never ours */
  ok &= pack_field(&pk, in, na);
  msgpack_pack_str(&pk, alen);
  msgpack_pack_str_body(&pk, addr, alen);
  ok &= pack_field(&pk, in, mac);
  if (head >> 7) msgpack_pack_nil(&pk); /* a trailing element is ignored */
  mn_frame_end(&join, start);
  ok &= dialable(addr, alen);
  decode_own(&join, z, &m);
  int rc = mn_join_accept(&joined, &key, &m, nj, got, sizeof(got), err, sizeof(err));
  FZ_CHECK(rc == 0 || refusal(rc), "mn_join_accept returned %d", rc);
  FZ_CHECK((rc == 0) == (ok != 0), "JOIN %s but accept says %d (%s)", ok ? "valid" : "invalid", rc, err);
  if (rc == 0) {
    FZ_CHECK(strlen(got) == alen && memcmp(got, addr, alen) == 0, "the address was not copied out whole");
    decode_own(&joined, z, &m);
    FZ_CHECK(mn_join_check_joined(&key, &m, nj, na, err, sizeof(err)) == 0, "own JOINED refused: %s", err);
    FZ_CHECK(mn_join_check_joined(&other_key, &m, nj, na, err, sizeof(err)) == MN_EAUTH,
             "JOINED accepted under another token");
  }
  mn_buf_free(&hello);
  mn_buf_free(&join);
  mn_buf_free(&joined);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msgpack_zone zone;
  in_t in = {data, size};
  fz_rng_reset(); /* same nonces for the same input */
  if (size == 0 || !msgpack_zone_init(&zone, 2048)) return 0;
  switch (take(&in) % 3) {
  case 0: controller_raw(&in, &zone); break;
  case 1: agent_raw(&in, &zone); break;
  default: controller_structured(&in, &zone); break;
  }
  msgpack_zone_destroy(&zone);
  return 0;
}
