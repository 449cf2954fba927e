/*
 * test_auth.c - unit tests for host/core/auth.c (key derivation, MACs,
 * token loading and generation) and host/core/handshake.c (the HELLO /
 * AUTH / WELCOME exchange, driven through its pure functions).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "auth.h"
#include "handshake.h"
#include "wire.h"

/* ---- helpers -------------------------------------------------------------- */

static void auth_of(mn_auth_t *a, const char *token) {
  memset(a, 0, sizeof(*a));
  assert_int_equal(mn_auth_init(a, token, strlen(token)), 0);
  assert_true(a->set);
}

/* The first whole frame of b, decoded (and consumed from b). The body is
 * copied because decoded strings and bins point into it. */
typedef struct {
  char *body;
  msgpack_zone zone;
  msgpack_object obj;
} msg_t;

static void take_msg(mn_buf_t *b, msg_t *m) {
  const char *body;
  char err[256] = "";
  int64_t n = mn_frame_peek(b->data, b->len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  m->body = malloc((size_t)n);
  assert_non_null(m->body);
  memcpy(m->body, body, (size_t)n);
  mn_buf_consume(b, MN_FRAME_HEADER + (size_t)n);
  assert_true(msgpack_zone_init(&m->zone, 1024));
  int rc = mn_decode(m->body, (size_t)n, &m->zone, &m->obj, err, sizeof(err));
  if (rc != 0) print_error("decode: %s\n", err);
  assert_int_equal(rc, 0);
}

static void msg_free(msg_t *m) {
  msgpack_zone_destroy(&m->zone);
  free(m->body);
}

/* Packs an arbitrary message as a frame and decodes it back. */
static void pack_bin(msgpack_packer *pk, const void *p, size_t n) {
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, p, n);
}

static void save_env(const char *name, char **saved) {
  const char *v = getenv(name);
  *saved = v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *saved) {
  if (saved) {
    setenv(name, saved, 1);
    free(saved);
  } else {
    unsetenv(name);
  }
}

/* ---- keys and MACs --------------------------------------------------------- */

static void test_auth_keys(void **state) {
  (void)state;
  assert_int_equal(mn_auth_global_init(), 0);
  assert_int_equal(mn_auth_global_init(), 0); /* repeatable */
  mn_auth_t a, b, c, d;
  auth_of(&a, "correct horse battery staple");
  auth_of(&b, "correct horse battery staple");
  auth_of(&c, "correct horse battery stapler");
  auth_of(&d, "");
  assert_memory_equal(a.key, b.key, MN_KEY_LEN);
  assert_memory_not_equal(a.key, c.key, MN_KEY_LEN);
  assert_memory_not_equal(a.key, d.key, MN_KEY_LEN);
  /* The key is a hash, not the token itself. */
  assert_memory_not_equal(a.key, "correct horse battery staple", 28);
  /* The length given is what counts, not a NUL. */
  mn_auth_t e;
  assert_int_equal(mn_auth_init(&e, "tokenXYZ", 5), 0);
  auth_of(&b, "token");
  assert_memory_equal(e.key, b.key, MN_KEY_LEN);
}

/* The construction is the documented one (auth.h, docs/protocol.md), so that
 * another implementation can interoperate: key = BLAKE2b-256(token), mac =
 * HMAC-SHA256(key, role || nonce_a || nonce_b). */
static void test_auth_construction(void **state) {
  (void)state;
  const char *token = "interop-token";
  mn_auth_t a;
  auth_of(&a, token);
  uint8_t key[MN_KEY_LEN];
  crypto_generichash(key, sizeof(key), (const unsigned char *)token, strlen(token), NULL, 0);
  assert_memory_equal(a.key, key, MN_KEY_LEN);

  uint8_t na[MN_NONCE_LEN], nb[MN_NONCE_LEN], msg[1 + 2 * MN_NONCE_LEN];
  uint8_t mac[MN_MAC_LEN], want[crypto_auth_hmacsha256_BYTES];
  for (int i = 0; i < MN_NONCE_LEN; i++) {
    na[i] = (uint8_t)i;
    nb[i] = (uint8_t)(0xA0 + i);
  }
  msg[0] = 'c';
  memcpy(msg + 1, na, MN_NONCE_LEN);
  memcpy(msg + 1 + MN_NONCE_LEN, nb, MN_NONCE_LEN);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key, sizeof(key));
  crypto_auth_hmacsha256_update(&st, msg, sizeof(msg));
  crypto_auth_hmacsha256_final(&st, want);
  mn_auth_mac(&a, 'c', na, nb, mac);
  assert_memory_equal(mac, want, MN_MAC_LEN);
}

static void test_auth_mac_check(void **state) {
  (void)state;
  mn_auth_t a, other;
  auth_of(&a, "sekrit");
  auth_of(&other, "sekrit2");
  uint8_t n1[MN_NONCE_LEN], n2[MN_NONCE_LEN], mac[MN_MAC_LEN], mac2[MN_MAC_LEN];
  mn_auth_nonce(n1);
  mn_auth_nonce(n2);
  assert_memory_not_equal(n1, n2, MN_NONCE_LEN);

  mn_auth_mac(&a, 'c', n1, n2, mac);
  /* Deterministic. */
  mn_auth_mac(&a, 'c', n1, n2, mac2);
  assert_memory_equal(mac, mac2, MN_MAC_LEN);
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, MN_MAC_LEN), 0);

  /* Wrong role, swapped nonces, wrong key. */
  assert_int_equal(mn_auth_check(&a, 's', n1, n2, mac, MN_MAC_LEN), MN_EAUTH);
  assert_int_equal(mn_auth_check(&a, 'c', n2, n1, mac, MN_MAC_LEN), MN_EAUTH);
  assert_int_equal(mn_auth_check(&other, 'c', n1, n2, mac, MN_MAC_LEN), MN_EAUTH);
  mn_auth_mac(&a, 's', n1, n2, mac2);
  assert_memory_not_equal(mac, mac2, MN_MAC_LEN);

  /* Every single flipped bit of the MAC is caught. */
  for (int bit = 0; bit < MN_MAC_LEN * 8; bit++) {
    memcpy(mac2, mac, MN_MAC_LEN);
    mac2[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac2, MN_MAC_LEN), MN_EAUTH);
  }
  /* ...and so is one flipped bit of either nonce. */
  n1[MN_NONCE_LEN - 1] ^= 0x80;
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, MN_MAC_LEN), MN_EAUTH);
  n1[MN_NONCE_LEN - 1] ^= 0x80;
  n2[0] ^= 1;
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, MN_MAC_LEN), MN_EAUTH);
  n2[0] ^= 1;
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, MN_MAC_LEN), 0);

  /* Wrong lengths, including a right prefix and a right MAC plus a byte. */
  uint8_t longer[MN_MAC_LEN + 1];
  memcpy(longer, mac, MN_MAC_LEN);
  longer[MN_MAC_LEN] = 0;
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, MN_MAC_LEN - 1), MN_EAUTH);
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, mac, 0), MN_EAUTH);
  assert_int_equal(mn_auth_check(&a, 'c', n1, n2, longer, sizeof(longer)), MN_EAUTH);
}

/* ---- the handshake ----------------------------------------------------------- */

typedef struct {
  uint8_t srv_ns[MN_NONCE_LEN]; /* server's own nonce */
  uint8_t srv_nc[MN_NONCE_LEN]; /* client nonce as the server learned it */
  uint8_t cli_ns[MN_NONCE_LEN]; /* server nonce as the client learned it */
  uint8_t cli_nc[MN_NONCE_LEN]; /* client's own nonce */
  char err[256];
} hs_t;

/* Runs HELLO -> AUTH -> check; returns check_auth's code. If it succeeded,
 * also runs WELCOME -> check_welcome and returns that code in *welcome_rc. */
static int run_handshake(const mn_auth_t *srv, const mn_auth_t *cli, hs_t *h, int *welcome_rc) {
  mn_buf_t s2c, c2s;
  msg_t m;
  mn_buf_init(&s2c);
  mn_buf_init(&c2s);
  memset(h, 0, sizeof(*h));
  *welcome_rc = 1;

  assert_int_equal(mn_hs_hello(&s2c, "proc", h->srv_ns), 0);
  take_msg(&s2c, &m);
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_HELLO);
  assert_int_equal(m.obj.via.array.size, 4);
  uint64_t version;
  const char *p;
  size_t n;
  assert_int_equal(mn_get_u64(&m.obj, 1, &version), 0);
  assert_int_equal(version, MN_PROTOCOL_VERSION);
  assert_int_equal(mn_get_bin(&m.obj, 2, &p, &n), 0);
  assert_int_equal(n, MN_NONCE_LEN);
  assert_memory_equal(p, h->srv_ns, MN_NONCE_LEN);
  assert_int_equal(mn_get_str(&m.obj, 3, &p, &n), 0);
  assert_int_equal(n, 4);
  assert_memory_equal(p, "proc", 4);

  assert_int_equal(mn_hs_answer(&c2s, cli, &m.obj, h->cli_ns, h->cli_nc, h->err, sizeof(h->err)), 0);
  msg_free(&m);
  assert_memory_equal(h->cli_ns, h->srv_ns, MN_NONCE_LEN);

  take_msg(&c2s, &m);
  assert_int_equal(mn_msg_type(&m.obj), MN_MSG_AUTH);
  /* The token itself never travels. */
  int rc = mn_hs_check_auth(srv, &m.obj, h->srv_ns, h->srv_nc, h->err, sizeof(h->err));
  msg_free(&m);
  if (rc == 0) {
    assert_memory_equal(h->srv_nc, h->cli_nc, MN_NONCE_LEN);
    assert_int_equal(mn_hs_welcome(&s2c, srv, h->srv_ns, h->srv_nc, "proc"), 0);
    take_msg(&s2c, &m);
    assert_int_equal(mn_msg_type(&m.obj), MN_MSG_WELCOME);
    *welcome_rc = mn_hs_check_welcome(cli, &m.obj, h->cli_ns, h->cli_nc, h->err, sizeof(h->err));
    if (*welcome_rc == 0) {
      /* The info map names this host, pid and role. */
      assert_int_equal(m.obj.via.array.size, 3);
      const msgpack_object *info = &m.obj.via.array.ptr[2];
      const msgpack_object *v = mn_map_get(info, "pid");
      assert_non_null(v);
      assert_int_equal(v->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
      assert_int_equal(v->via.u64, (uint64_t)getpid());
      v = mn_map_get(info, "role");
      assert_non_null(v);
      assert_int_equal(v->type, MSGPACK_OBJECT_STR);
      assert_int_equal(v->via.str.size, 4);
      assert_memory_equal(v->via.str.ptr, "proc", 4);
      v = mn_map_get(info, "hostname");
      assert_non_null(v);
      assert_int_equal(v->type, MSGPACK_OBJECT_STR);
      assert_true(v->via.str.size > 0);
    }
    msg_free(&m);
  }
  assert_int_equal(s2c.len, 0);
  assert_int_equal(c2s.len, 0);
  mn_buf_free(&s2c);
  mn_buf_free(&c2s);
  return rc;
}

static void test_handshake_ok(void **state) {
  (void)state;
  mn_auth_t srv, cli;
  auth_of(&srv, "cluster-token-1");
  auth_of(&cli, "cluster-token-1");
  hs_t h, h2;
  int wrc;
  assert_int_equal(run_handshake(&srv, &cli, &h, &wrc), 0);
  assert_int_equal(wrc, 0);
  /* Every connection uses fresh nonces. */
  assert_int_equal(run_handshake(&srv, &cli, &h2, &wrc), 0);
  assert_int_equal(wrc, 0);
  assert_memory_not_equal(h.srv_ns, h2.srv_ns, MN_NONCE_LEN);
  assert_memory_not_equal(h.cli_nc, h2.cli_nc, MN_NONCE_LEN);
}

static void test_handshake_wrong_token(void **state) {
  (void)state;
  mn_auth_t srv, cli;
  auth_of(&srv, "cluster-token-1");
  auth_of(&cli, "cluster-token-2");
  hs_t h;
  int wrc;
  assert_int_equal(run_handshake(&srv, &cli, &h, &wrc), MN_EAUTH);
  assert_non_null(strstr(h.err, "token"));
  assert_int_equal(wrc, 1); /* never got as far as WELCOME */
}

/* A server without the token cannot fake a WELCOME: neither with a MAC of its
 * own key nor by reflecting the client's AUTH MAC back at it. */
static void test_handshake_fake_server(void **state) {
  (void)state;
  mn_auth_t cli, fake;
  auth_of(&cli, "real-token");
  auth_of(&fake, "fake-token");
  mn_buf_t b;
  mn_buf_init(&b);
  msg_t m;
  uint8_t ns[MN_NONCE_LEN], cns[MN_NONCE_LEN], cnc[MN_NONCE_LEN];
  char err[256] = "";

  assert_int_equal(mn_hs_hello(&b, "agent", ns), 0);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_answer(&b, &cli, &m.obj, cns, cnc, err, sizeof(err)), 0);
  msg_free(&m);
  take_msg(&b, &m);
  const char *cmac;
  size_t cmacl;
  assert_int_equal(mn_get_bin(&m.obj, 3, &cmac, &cmacl), 0);
  assert_int_equal(cmacl, MN_MAC_LEN);
  uint8_t reflected[MN_MAC_LEN];
  memcpy(reflected, cmac, MN_MAC_LEN);
  msg_free(&m);

  /* WELCOME with the fake server's MAC. */
  assert_int_equal(mn_hs_welcome(&b, &fake, ns, cnc, "agent"), 0);
  take_msg(&b, &m);
  err[0] = '\0';
  assert_int_equal(mn_hs_check_welcome(&cli, &m.obj, cns, cnc, err, sizeof(err)), MN_EAUTH);
  assert_true(strlen(err) > 0);
  msg_free(&m);

  /* WELCOME carrying the client's own MAC. */
  msgpack_packer pk;
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t start = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_int(&pk, MN_MSG_WELCOME);
  pack_bin(&pk, reflected, MN_MAC_LEN);
  msgpack_pack_map(&pk, 0);
  mn_frame_end(&b, start);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_check_welcome(&cli, &m.obj, cns, cnc, err, sizeof(err)), MN_EAUTH);
  msg_free(&m);

  /* A WELCOME with the right key but for another connection's nonces. */
  uint8_t other_nc[MN_NONCE_LEN];
  mn_auth_nonce(other_nc);
  assert_int_equal(mn_hs_welcome(&b, &cli, ns, other_nc, "agent"), 0);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_check_welcome(&cli, &m.obj, cns, cnc, err, sizeof(err)), MN_EAUTH);
  msg_free(&m);

  /* The genuine one passes. */
  assert_int_equal(mn_hs_welcome(&b, &cli, ns, cnc, "agent"), 0);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_check_welcome(&cli, &m.obj, cns, cnc, err, sizeof(err)), 0);
  msg_free(&m);
  mn_buf_free(&b);
}

/* An AUTH recorded from one connection is useless on another. */
static void test_handshake_replay(void **state) {
  (void)state;
  mn_auth_t key;
  auth_of(&key, "shared-token");
  mn_buf_t b;
  mn_buf_init(&b);
  msg_t hello, auth;
  uint8_t ns_old[MN_NONCE_LEN], ns_new[MN_NONCE_LEN], cns[MN_NONCE_LEN], cnc[MN_NONCE_LEN];
  uint8_t got_nc[MN_NONCE_LEN];
  char err[256] = "";

  assert_int_equal(mn_hs_hello(&b, "proc", ns_old), 0);
  take_msg(&b, &hello);
  assert_int_equal(mn_hs_answer(&b, &key, &hello.obj, cns, cnc, err, sizeof(err)), 0);
  take_msg(&b, &auth);
  /* It was good for the connection it answered... */
  assert_int_equal(mn_hs_check_auth(&key, &auth.obj, ns_old, got_nc, err, sizeof(err)), 0);

  /* ...but a new connection has a fresh nonce. */
  assert_int_equal(mn_hs_hello(&b, "proc", ns_new), 0);
  mn_buf_consume(&b, b.len);
  assert_memory_not_equal(ns_old, ns_new, MN_NONCE_LEN);
  memset(got_nc, 0xAA, sizeof(got_nc));
  err[0] = '\0';
  assert_int_equal(mn_hs_check_auth(&key, &auth.obj, ns_new, got_nc, err, sizeof(err)), MN_EAUTH);
  assert_true(strlen(err) > 0);
  /* The client nonce is not handed out on failure. */
  for (int i = 0; i < MN_NONCE_LEN; i++) assert_int_equal(got_nc[i], 0xAA);
  msg_free(&hello);
  msg_free(&auth);
  mn_buf_free(&b);
}

static void test_handshake_version(void **state) {
  (void)state;
  mn_auth_t key;
  auth_of(&key, "tok");
  mn_buf_t b;
  mn_buf_init(&b);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  msg_t m;
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN], mac[MN_MAC_LEN], out_ns[MN_NONCE_LEN],
      out_nc[MN_NONCE_LEN];
  char err[256] = "";
  mn_auth_nonce(ns);
  mn_auth_nonce(nc);

  /* A HELLO of a future version. */
  size_t start = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_HELLO);
  msgpack_pack_int(&pk, MN_PROTOCOL_VERSION + 1);
  pack_bin(&pk, ns, MN_NONCE_LEN);
  mn_pack_cstr(&pk, "proc");
  mn_frame_end(&b, start);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_answer(&b, &key, &m.obj, out_ns, out_nc, err, sizeof(err)), MN_EVERSION);
  assert_true(strlen(err) > 0);
  assert_int_equal(b.len, 0); /* nothing answered */
  msg_free(&m);

  /* An AUTH of a future version, with an otherwise correct MAC. */
  mn_auth_mac(&key, 'c', ns, nc, mac);
  start = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_AUTH);
  msgpack_pack_int(&pk, MN_PROTOCOL_VERSION + 1);
  pack_bin(&pk, nc, MN_NONCE_LEN);
  pack_bin(&pk, mac, MN_MAC_LEN);
  mn_frame_end(&b, start);
  take_msg(&b, &m);
  err[0] = '\0';
  assert_int_equal(mn_hs_check_auth(&key, &m.obj, ns, out_nc, err, sizeof(err)), MN_EVERSION);
  assert_non_null(strstr(err, "version"));
  msg_free(&m);

  /* The same AUTH at the right version passes: the version was the only fault. */
  start = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_AUTH);
  msgpack_pack_int(&pk, MN_PROTOCOL_VERSION);
  pack_bin(&pk, nc, MN_NONCE_LEN);
  pack_bin(&pk, mac, MN_MAC_LEN);
  mn_frame_end(&b, start);
  take_msg(&b, &m);
  assert_int_equal(mn_hs_check_auth(&key, &m.obj, ns, out_nc, err, sizeof(err)), 0);
  assert_memory_equal(out_nc, nc, MN_NONCE_LEN);
  msg_free(&m);
  mn_buf_free(&b);
}

/* What the malformed-handshake tests share: a key, a buffer and its packer, both nonces, the client's MAC. */
typedef struct {
  mn_auth_t key;
  mn_buf_t b;
  msgpack_packer pk;
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN], mac[MN_MAC_LEN];
} hs_fix_t;

static void hs_fix_init(hs_fix_t *f) {
  auth_of(&f->key, "tok");
  mn_buf_init(&f->b);
  msgpack_packer_init(&f->pk, &f->b, mn_buf_write_cb);
  mn_auth_nonce(f->ns);
  mn_auth_nonce(f->nc);
  mn_auth_mac(&f->key, 'c', f->ns, f->nc, f->mac);
}

static void test_handshake_malformed(void **state) {
  (void)state;
  hs_fix_t f;
  hs_fix_init(&f);
  uint8_t *ns = f.ns, *nc = f.nc;
  msg_t m;
  char err[256];

  /* The client gets an ERROR instead of a HELLO: the peer's text comes through. */
  mn_pack_error(&f.b, MN_EAUTH, "go away");
  take_msg(&f.b, &m);
  err[0] = '\0';
  assert_int_equal(mn_hs_answer(&f.b, &f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, "go away"));
  err[0] = '\0';
  assert_int_equal(mn_hs_check_welcome(&f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, "go away"));
  msg_free(&m);

  /* Something else than HELLO / WELCOME. */
  size_t start = mn_frame_begin(&f.b);
  msgpack_pack_array(&f.pk, 2);
  msgpack_pack_int(&f.pk, MN_MSG_PING);
  msgpack_pack_int(&f.pk, 1);
  mn_frame_end(&f.b, start);
  take_msg(&f.b, &m);
  assert_int_equal(mn_hs_answer(&f.b, &f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EPROTO);
  assert_int_equal(mn_hs_check_welcome(&f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EPROTO);
  err[0] = '\0';
  assert_int_equal(mn_hs_check_auth(&f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EAUTH);
  assert_true(strlen(err) > 0);
  msg_free(&m);
  assert_int_equal(f.b.len, 0);

  /* HELLO with a short nonce. */
  start = mn_frame_begin(&f.b);
  msgpack_pack_array(&f.pk, 4);
  msgpack_pack_int(&f.pk, MN_MSG_HELLO);
  msgpack_pack_int(&f.pk, MN_PROTOCOL_VERSION);
  pack_bin(&f.pk, ns, MN_NONCE_LEN - 1);
  mn_pack_cstr(&f.pk, "proc");
  mn_frame_end(&f.b, start);
  take_msg(&f.b, &m);
  assert_int_equal(mn_hs_answer(&f.b, &f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EPROTO);
  msg_free(&m);
  assert_int_equal(f.b.len, 0);

  /* WELCOME whose MAC is not a bin. */
  start = mn_frame_begin(&f.b);
  msgpack_pack_array(&f.pk, 3);
  msgpack_pack_int(&f.pk, MN_MSG_WELCOME);
  mn_pack_cstr(&f.pk, "not a mac");
  msgpack_pack_map(&f.pk, 0);
  mn_frame_end(&f.b, start);
  take_msg(&f.b, &m);
  assert_int_equal(mn_hs_check_welcome(&f.key, &m.obj, ns, nc, err, sizeof(err)), MN_EPROTO);
  msg_free(&m);
  mn_buf_free(&f.b);
}

/* AUTH variants: short nonce, nonce as str, MAC missing, truncated MAC. */
static void test_handshake_malformed_auth(void **state) {
  (void)state;
  hs_fix_t f;
  hs_fix_init(&f);
  uint8_t *ns = f.ns, *nc = f.nc, *mac = f.mac;
  msg_t m;
  char err[256];
  size_t start;
  for (int variant = 0; variant < 4; variant++) {
    start = mn_frame_begin(&f.b);
    msgpack_pack_array(&f.pk, variant == 2 ? 3 : 4);
    msgpack_pack_int(&f.pk, MN_MSG_AUTH);
    msgpack_pack_int(&f.pk, MN_PROTOCOL_VERSION);
    if (variant == 0) pack_bin(&f.pk, nc, MN_NONCE_LEN - 1);
    else if (variant == 1) {
      msgpack_pack_str(&f.pk, MN_NONCE_LEN);
      msgpack_pack_str_body(&f.pk, nc, MN_NONCE_LEN);
    } else pack_bin(&f.pk, nc, MN_NONCE_LEN);
    if (variant == 3) pack_bin(&f.pk, mac, MN_MAC_LEN - 1);
    else if (variant != 2) pack_bin(&f.pk, mac, MN_MAC_LEN);
    mn_frame_end(&f.b, start);
    take_msg(&f.b, &m);
    uint8_t out_nc[MN_NONCE_LEN];
    err[0] = '\0';
    int rc = mn_hs_check_auth(&f.key, &m.obj, ns, out_nc, err, sizeof(err));
    if (rc != MN_EAUTH) print_error("AUTH variant %d: rc %d\n", variant, rc);
    assert_int_equal(rc, MN_EAUTH);
    assert_true(strlen(err) > 0);
    msg_free(&m);
  }

  mn_buf_free(&f.b);
}

/* ---- loading and generating tokens ------------------------------------------ */

typedef struct {
  char *token;
  char *file;
  char dir[64];
} env_state_t;

static int env_setup(void **state) {
  env_state_t *s = calloc(1, sizeof(*s));
  if (s == NULL) return -1;
  save_env("MONARCH_TOKEN", &s->token);
  save_env("MONARCH_TOKEN_FILE", &s->file);
  unsetenv("MONARCH_TOKEN");
  unsetenv("MONARCH_TOKEN_FILE");
  snprintf(s->dir, sizeof(s->dir), "/tmp/mn_test_auth.XXXXXX");
  if (mkdtemp(s->dir) == NULL) return -1;
  *state = s;
  return 0;
}

static int env_teardown(void **state) {
  env_state_t *s = *state;
  char cmd[128];
  restore_env("MONARCH_TOKEN", s->token);
  restore_env("MONARCH_TOKEN_FILE", s->file);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
  if (system(cmd) != 0) return -1;
  free(s);
  return 0;
}

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void test_auth_load_env(void **state) {
  env_state_t *s = *state;
  mn_auth_t a, want;
  char err[256];
  char path[128];
  auth_of(&want, "from-the-env");

  setenv("MONARCH_TOKEN", "from-the-env", 1);
  memset(&a, 0, sizeof(a));
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_true(a.set);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);

  /* The environment variable wins over a file, even one passed explicitly. */
  snprintf(path, sizeof(path), "%s/tok", s->dir);
  write_file(path, "from-a-file\n", 12);
  setenv("MONARCH_TOKEN_FILE", path, 1);
  memset(&a, 0, sizeof(a));
  assert_int_equal(mn_auth_load(&a, path, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);

  /* An empty MONARCH_TOKEN counts as unset. */
  setenv("MONARCH_TOKEN", "", 1);
  auth_of(&want, "from-a-file");
  memset(&a, 0, sizeof(a));
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);

  /* Too long a token in the environment. */
  char *huge = malloc(MN_MAX_TOKEN + 2);
  assert_non_null(huge);
  memset(huge, 'k', MN_MAX_TOKEN + 1);
  huge[MN_MAX_TOKEN + 1] = '\0';
  setenv("MONARCH_TOKEN", huge, 1);
  err[0] = '\0';
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, "MONARCH_TOKEN"));
  huge[MN_MAX_TOKEN] = '\0'; /* exactly the limit is fine */
  setenv("MONARCH_TOKEN", huge, 1);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  free(huge);
}

static void test_auth_load_file(void **state) {
  env_state_t *s = *state;
  mn_auth_t a, want;
  char err[256];
  char path[128], path2[128];
  auth_of(&want, "s3cret");

  /* A trailing newline (and CR / spaces) is not part of the token. */
  snprintf(path, sizeof(path), "%s/token", s->dir);
  write_file(path, "s3cret\n", 7);
  setenv("MONARCH_TOKEN_FILE", path, 1);
  memset(&a, 0, sizeof(a));
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);
  write_file(path, "s3cret \r\n", 9);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);
  write_file(path, "s3cret", 6);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);
  /* ...but inner content is. */
  write_file(path, "s3cret\nmore\n", 12);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  assert_memory_not_equal(a.key, want.key, MN_KEY_LEN);

  /* An explicit file overrides MONARCH_TOKEN_FILE. */
  snprintf(path2, sizeof(path2), "%s/other", s->dir);
  write_file(path2, "other-token\n", 12);
  auth_of(&want, "other-token");
  assert_int_equal(mn_auth_load(&a, path2, err, sizeof(err)), 0);
  assert_memory_equal(a.key, want.key, MN_KEY_LEN);

  /* Empty, or only whitespace. */
  write_file(path, "", 0);
  err[0] = '\0';
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, path));
  write_file(path, "\n\n \r\n", 5);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);

  /* Exactly MN_MAX_TOKEN bytes plus a newline is fine; one more byte is not. */
  char *big = malloc(MN_MAX_TOKEN + 8);
  assert_non_null(big);
  memset(big, 'q', MN_MAX_TOKEN + 8);
  big[MN_MAX_TOKEN] = '\n';
  write_file(path, big, MN_MAX_TOKEN + 1);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), 0);
  mn_auth_t exact;
  assert_int_equal(mn_auth_init(&exact, big, MN_MAX_TOKEN), 0);
  assert_memory_equal(a.key, exact.key, MN_KEY_LEN);
  big[MN_MAX_TOKEN] = 'q';
  write_file(path, big, MN_MAX_TOKEN + 1);
  err[0] = '\0';
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_true(strlen(err) > 0);
  write_file(path, big, MN_MAX_TOKEN + 8);
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  free(big);

  /* A file that is not there. */
  snprintf(path2, sizeof(path2), "%s/missing", s->dir);
  setenv("MONARCH_TOKEN_FILE", path2, 1);
  err[0] = '\0';
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, path2));
}

static void test_auth_load_none(void **state) {
  (void)state;
  mn_auth_t a;
  char err[256] = "";
  memset(&a, 0, sizeof(a));
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_false(a.set);
  assert_non_null(strstr(err, "MONARCH_TOKEN"));
  assert_non_null(strstr(err, "MONARCH_TOKEN_FILE"));
  /* Both set to empty strings is the same as unset. */
  setenv("MONARCH_TOKEN", "", 1);
  setenv("MONARCH_TOKEN_FILE", "", 1);
  err[0] = '\0';
  assert_int_equal(mn_auth_load(&a, NULL, err, sizeof(err)), MN_EAUTH);
  assert_non_null(strstr(err, "MONARCH_TOKEN"));
}

static void test_auth_generate(void **state) {
  (void)state;
  enum { LEN = 48, N = 64 };
  static char toks[N][LEN + 1];
  for (int i = 0; i < N; i++) {
    memset(toks[i], 0x7f, sizeof(toks[i]));
    mn_auth_generate(toks[i], LEN);
    assert_int_equal(strlen(toks[i]), LEN);
    for (int j = 0; j < LEN; j++) assert_true(isalnum((unsigned char)toks[i][j]));
    for (int j = 0; j < i; j++) assert_string_not_equal(toks[i], toks[j]);
  }
  char small[2] = {'x', 'x'};
  mn_auth_generate(small, 0);
  assert_int_equal(small[0], '\0');
  assert_int_equal(small[1], 'x'); /* nothing written past len + 1 */
  char one[3] = {'x', 'x', 'x'};
  mn_auth_generate(one, 1);
  assert_true(isalnum((unsigned char)one[0]));
  assert_int_equal(one[1], '\0');
  assert_int_equal(one[2], 'x');

  /* A generated token works end to end. */
  char tok[33];
  mn_auth_generate(tok, 32);
  mn_auth_t srv, cli;
  auth_of(&srv, tok);
  auth_of(&cli, tok);
  hs_t h;
  int wrc;
  assert_int_equal(run_handshake(&srv, &cli, &h, &wrc), 0);
  assert_int_equal(wrc, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_auth_keys),
    cmocka_unit_test(test_auth_construction),
    cmocka_unit_test(test_auth_mac_check),
    cmocka_unit_test(test_handshake_ok),
    cmocka_unit_test(test_handshake_wrong_token),
    cmocka_unit_test(test_handshake_fake_server),
    cmocka_unit_test(test_handshake_replay),
    cmocka_unit_test(test_handshake_version),
    cmocka_unit_test(test_handshake_malformed),
    cmocka_unit_test(test_handshake_malformed_auth),
    cmocka_unit_test_setup_teardown(test_auth_load_env, env_setup, env_teardown),
    cmocka_unit_test_setup_teardown(test_auth_load_file, env_setup, env_teardown),
    cmocka_unit_test_setup_teardown(test_auth_load_none, env_setup, env_teardown),
    cmocka_unit_test(test_auth_generate),
  };
  return cmocka_run_group_tests_name("auth", tests, NULL, NULL);
}
