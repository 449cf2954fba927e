/*
 * fuzz_handshake.c - libFuzzer target for the HELLO / AUTH / WELCOME
 * exchange (host/core/handshake.c, auth.c), both ends.
 *
 * The first input byte picks a mode:
 *   0  server, raw: the rest is what a client sends after our HELLO; its
 *      first frame (at most 4096 bytes, as on the real servers) goes
 *      through mn_decode and mn_hs_check_auth.
 *   1  client, raw: the first frame is the server's greeting
 *      (mn_hs_answer), the second its WELCOME (mn_hs_check_welcome).
 *   2  server, structured: an AUTH message is built from the bytes with a
 *      correct or damaged MAC, wrong versions, nonce lengths and types.
 *   3  client, structured: a HELLO and a WELCOME built the same way.
 * Structured modes have an oracle: the handshake succeeds exactly when the
 * message was well formed and its MAC right, so a bypass is a crash.
 *
 * libsodium's random source is replaced by a counter reset per input so
 * that nonces, and therefore runs, are deterministic.
 */
#include <sodium.h>

#include "fuzz_util.h"
#include "handshake.h"

#define FUZZ_HANDSHAKE_MAX 4096 /* what agent and proc read before authentication */

static mn_auth_t key, other_key;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  FZ_CHECK(fz_rng_install() == 0, "randombytes_set_implementation");
  FZ_CHECK(mn_auth_global_init() == 0, "sodium_init");
  FZ_CHECK(mn_auth_init(&key, "fuzz-cluster-token", 18) == 0, "key");
  FZ_CHECK(mn_auth_init(&other_key, "another-token", 13) == 0, "other key");
  return 0;
}

/* ---- input reader ---------------------------------------------------------- */

typedef struct {
  const uint8_t *p;
  size_t n;
} in_t;

static uint8_t take(in_t *in) {
  if (in->n == 0) return 0;
  in->n--;
  return *in->p++;
}

/* Next frame body of the raw stream: a length-prefixed frame when one is
 * there, else everything left as one body. Returns 0 or -1 when empty. */
static int next_body(in_t *in, const char **body, size_t *len) {
  const char *b;
  if (in->n == 0) return -1;
  int64_t n = mn_frame_peek((const char *)in->p, in->n, FUZZ_HANDSHAKE_MAX, &b);
  if (n > 0) {
    *body = b;
    *len = (size_t)n;
    in->p += MN_FRAME_HEADER + (size_t)n;
    in->n -= MN_FRAME_HEADER + (size_t)n;
  } else {
    *body = (const char *)in->p;
    *len = in->n;
    in->p += in->n;
    in->n = 0;
  }
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

/* Decodes the single frame at the start of b (which we packed ourselves). */
static void decode_own(const mn_buf_t *b, msgpack_zone *z, msgpack_object *m) {
  const char *body;
  int64_t n = mn_frame_peek(b->data, b->len, MN_MAX_FRAME, &body);
  FZ_CHECK(n > 0, "a frame we packed does not peek (%lld)", (long long)n);
  FZ_CHECK(decode(body, (size_t)n, z, m) == 0, "a frame we packed does not decode");
}

static int handshake_code(int rc) {
  return rc == 0 || rc == MN_EAUTH || rc == MN_EVERSION || rc == MN_EPROTO;
}

/* ---- raw modes --------------------------------------------------------------- */

static void server_raw(in_t *in, msgpack_zone *z) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char err[256] = "";
  const char *body;
  size_t len;
  msgpack_object m;
  mn_buf_t out;
  mn_buf_init(&out);
  FZ_CHECK(mn_hs_hello(&out, "proc", ns) == 0, "hello");
  if (next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
    int rc = mn_hs_check_auth(&key, &m, ns, nc, err, sizeof(err));
    FZ_CHECK(handshake_code(rc), "mn_hs_check_auth returned %d", rc);
    FZ_CHECK(rc == 0 || err[0] != '\0', "refused without a message");
    /* Forging HMAC-SHA256 from fuzzed bytes means the check is broken. */
    FZ_CHECK(rc != 0, "AUTH from arbitrary bytes was accepted");
  }
  mn_buf_free(&out);
}

static void client_raw(in_t *in, msgpack_zone *z) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  char err[256] = "";
  const char *body;
  size_t len;
  msgpack_object m;
  mn_buf_t out;
  mn_buf_init(&out);
  if (next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
    int rc = mn_hs_answer(&out, &key, &m, ns, nc, err, sizeof(err));
    FZ_CHECK(handshake_code(rc), "mn_hs_answer returned %d", rc);
    FZ_CHECK(rc == 0 || err[0] != '\0', "refused without a message");
    if (rc == 0 && next_body(in, &body, &len) == 0 && decode(body, len, z, &m) == 0) {
      rc = mn_hs_check_welcome(&key, &m, ns, nc, err, sizeof(err));
      FZ_CHECK(handshake_code(rc), "mn_hs_check_welcome returned %d", rc);
      FZ_CHECK(rc != 0, "WELCOME from arbitrary bytes was accepted");
    }
  }
  mn_buf_free(&out);
}

/* ---- structured modes --------------------------------------------------------- */

/* Packs a byte string of n bytes as bin (or, when as_str, as str). */
static void pack_bytes(msgpack_packer *pk, const uint8_t *p, size_t n, int as_str) {
  if (as_str) {
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, p, n);
  } else {
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, p, n);
  }
}

/*
 * Packs a 32-byte field derived from `want`: exact, one bit off, arbitrary
 * bytes, another length, a str instead of a bin, or no bytes at all. The
 * first 32 bytes sent go to `sent`; returns 1 when the field is a bin of
 * exactly 32 bytes (whatever they are).
 */
static int pack_field(msgpack_packer *pk, in_t *in, const uint8_t want[32], uint8_t sent[32]) {
  uint8_t how = take(in);
  uint8_t buf[64];
  size_t n = 32;
  memcpy(buf, want, 32);
  if ((how & 3) == 1) buf[take(in) & 31] ^= (uint8_t)(1u << (take(in) & 7)); /* one bit off */
  if ((how & 3) == 2) for (int i = 0; i < 32; i++) buf[i] = take(in);        /* arbitrary */
  if (how & 4) n = take(in) % 64;                                              /* wrong length */
  for (size_t i = 32; i < n; i++) buf[i] = take(in);
  int as_str = (how & 8) != 0;
  if (how & 16) msgpack_pack_int(pk, how); /* not bytes at all */
  else pack_bytes(pk, buf, n, as_str);
  memcpy(sent, buf, 32);
  return !(how & 16) && !as_str && n == 32;
}

/* Type and version of a handshake message; returns 1 when both are right. */
static int pack_head(msgpack_packer *pk, in_t *in, int type, int nfields, int *extra) {
  uint8_t t = take(in), v = take(in);
  *extra = t >> 6; /* up to 3 trailing elements */
  msgpack_pack_array(pk, (size_t)(nfields + *extra));
  int type_ok = (t & 7) != 7;
  msgpack_pack_int(pk, type_ok ? type : t);
  if (type == MN_MSG_WELCOME) return type_ok; /* WELCOME carries no version */
  int ver_ok = v < 200;
  if (ver_ok) msgpack_pack_int(pk, MN_PROTOCOL_VERSION);
  else if (v < 230) msgpack_pack_int(pk, v); /* 200..229: never our version */
  else mn_pack_cstr(pk, "1");                /* the right number, as a string */
  return type_ok && ver_ok;
}

static void pack_extra(msgpack_packer *pk, int extra) {
  for (int i = 0; i < extra; i++) msgpack_pack_nil(pk);
}

static void server_structured(in_t *in, msgpack_zone *z) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN], nc_sent[32], mac_want[MN_MAC_LEN], mac_used[32];
  char err[256] = "";
  msgpack_object m;
  mn_buf_t hello, auth, welcome;
  msgpack_packer pk;
  int extra;
  mn_buf_init(&hello);
  mn_buf_init(&auth);
  mn_buf_init(&welcome);
  FZ_CHECK(mn_hs_hello(&hello, "agent", ns) == 0, "hello");
  msgpack_packer_init(&pk, &auth, mn_buf_write_cb);
  size_t start = mn_frame_begin(&auth);
  int ok = pack_head(&pk, in, MN_MSG_AUTH, 4, &extra);
  uint8_t raw[32];
  for (int i = 0; i < 32; i++) raw[i] = take(in);
  ok &= pack_field(&pk, in, raw, nc_sent);
  mn_auth_mac(take(in) == 0xff ? &other_key : &key, 'c', ns, nc_sent, mac_want);
  ok &= pack_field(&pk, in, mac_want, mac_used);
  /* The MAC is right only if it was made with the cluster key. */
  uint8_t real[MN_MAC_LEN];
  mn_auth_mac(&key, 'c', ns, nc_sent, real);
  ok &= memcmp(mac_used, real, MN_MAC_LEN) == 0;
  pack_extra(&pk, extra);
  mn_frame_end(&auth, start);
  decode_own(&auth, z, &m);
  int rc = mn_hs_check_auth(&key, &m, ns, nc, err, sizeof(err));
  FZ_CHECK(handshake_code(rc), "mn_hs_check_auth returned %d", rc);
  FZ_CHECK((rc == 0) == (ok != 0), "AUTH %s but the check says %d (%s)", ok ? "valid" : "invalid", rc,
           err);
  if (rc == 0) {
    FZ_CHECK(memcmp(nc, nc_sent, MN_NONCE_LEN) == 0, "client nonce not copied out");
    /* Our WELCOME must convince a real client holding the token, and no other. */
    FZ_CHECK(mn_hs_welcome(&welcome, &key, ns, nc, "agent") == 0, "welcome");
    decode_own(&welcome, z, &m);
    FZ_CHECK(mn_hs_check_welcome(&key, &m, ns, nc, err, sizeof(err)) == 0, "own WELCOME refused: %s", err);
    FZ_CHECK(mn_hs_check_welcome(&other_key, &m, ns, nc, err, sizeof(err)) == MN_EAUTH,
             "WELCOME accepted under another token");
  }
  mn_buf_free(&hello);
  mn_buf_free(&auth);
  mn_buf_free(&welcome);
}

static void client_structured(in_t *in, msgpack_zone *z) {
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN], ns_sent[32], s_nc[MN_NONCE_LEN], mac_want[MN_MAC_LEN],
      mac_used[32];
  char err[256] = "";
  msgpack_object m;
  mn_buf_t hello, auth, welcome;
  msgpack_packer pk;
  int extra;
  mn_buf_init(&hello);
  mn_buf_init(&auth);
  mn_buf_init(&welcome);
  msgpack_packer_init(&pk, &hello, mn_buf_write_cb);
  size_t start = mn_frame_begin(&hello);
  int is_error = (take(in) & 15) == 0;
  int ok;
  if (is_error) { /* the server refused us: [ERROR, code, message?] */
    uint8_t n = 1 + take(in) % 3;
    msgpack_pack_array(&pk, n);
    msgpack_pack_int(&pk, MN_MSG_ERROR);
    if (n > 1) msgpack_pack_int(&pk, MN_EAUTH);
    if (n > 2) pack_bytes(&pk, in->p, in->n < 300 ? in->n : 300, 1);
    ok = 0;
  } else {
    ok = pack_head(&pk, in, MN_MSG_HELLO, 4, &extra);
    uint8_t raw[32];
    for (int i = 0; i < 32; i++) raw[i] = take(in);
    ok &= pack_field(&pk, in, raw, ns_sent);
    if (take(in) & 1) {
      mn_pack_cstr(&pk, "proc");
    } else {
      msgpack_pack_nil(&pk); /* HELLO's layout wants role as a str (msg.c checks it) */
      ok = 0;
    }
    pack_extra(&pk, extra);
  }
  mn_frame_end(&hello, start);
  const char *body;
  int64_t len = mn_frame_peek(hello.data, hello.len, MN_MAX_FRAME, &body);
  FZ_CHECK(len > 0, "own frame");
  if (decode(body, (size_t)len, z, &m) != 0) goto done; /* e.g. an empty array: not a message */
  int rc = mn_hs_answer(&auth, &key, &m, ns, nc, err, sizeof(err));
  FZ_CHECK(handshake_code(rc), "mn_hs_answer returned %d", rc);
  FZ_CHECK((rc == 0) == (ok != 0), "HELLO %s but the answer says %d (%s)", ok ? "valid" : "invalid", rc,
           err);
  if (rc != 0) goto done;
  FZ_CHECK(memcmp(ns, ns_sent, MN_NONCE_LEN) == 0, "server nonce not kept");
  /* The AUTH we produced must satisfy a real server. */
  decode_own(&auth, z, &m);
  FZ_CHECK(mn_hs_check_auth(&key, &m, ns, s_nc, err, sizeof(err)) == 0, "own AUTH refused: %s", err);
  FZ_CHECK(memcmp(s_nc, nc, MN_NONCE_LEN) == 0, "nonce mismatch");
  /* Now the server's WELCOME, proper or not. */
  msgpack_packer_init(&pk, &welcome, mn_buf_write_cb);
  start = mn_frame_begin(&welcome);
  ok = pack_head(&pk, in, MN_MSG_WELCOME, 3, &extra);
  mn_auth_mac(take(in) == 0xff ? &other_key : &key, 's', nc, ns, mac_want);
  ok &= pack_field(&pk, in, mac_want, mac_used);
  uint8_t real[MN_MAC_LEN];
  mn_auth_mac(&key, 's', nc, ns, real);
  ok &= memcmp(mac_used, real, MN_MAC_LEN) == 0;
  msgpack_pack_map(&pk, 0);
  pack_extra(&pk, extra);
  mn_frame_end(&welcome, start);
  decode_own(&welcome, z, &m);
  rc = mn_hs_check_welcome(&key, &m, ns, nc, err, sizeof(err));
  FZ_CHECK(handshake_code(rc), "mn_hs_check_welcome returned %d", rc);
  FZ_CHECK((rc == 0) == (ok != 0), "WELCOME %s but the check says %d (%s)", ok ? "valid" : "invalid", rc,
           err);
done:
  mn_buf_free(&hello);
  mn_buf_free(&auth);
  mn_buf_free(&welcome);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  msgpack_zone zone;
  in_t in = {data, size};
  fz_rng_reset(); /* same nonces for the same input */
  if (size == 0 || !msgpack_zone_init(&zone, 2048)) return 0;
  switch (take(&in) & 3) {
  case 0: server_raw(&in, &zone); break;
  case 1: client_raw(&in, &zone); break;
  case 2: server_structured(&in, &zone); break;
  default: client_structured(&in, &zone); break;
  }
  msgpack_zone_destroy(&zone);
  return 0;
}
