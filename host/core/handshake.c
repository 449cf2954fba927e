/* handshake.c - see handshake.h. */
#include "handshake.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void pack_bin(msgpack_packer *pk, const uint8_t *p, size_t n) {
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, p, n);
}

/* Reads the error text of an ERROR frame a peer sent instead of what we expected. */
static int peer_error(const msgpack_object *msg, char *err, size_t errlen) {
  const char *p;
  size_t n;
  if (mn_get_str(msg, 2, &p, &n) == 0)
    snprintf(err, errlen, "peer refused: %.*s", (int)(n > 200 ? 200 : n), p);
  else
    snprintf(err, errlen, "peer sent an ERROR without a message");
  return MN_EAUTH;
}

int mn_hs_hello(mn_buf_t *out, const char *role, uint8_t nonce_s[MN_NONCE_LEN]) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, mn_buf_write_cb);
  mn_auth_nonce(nonce_s);
  size_t start = mn_frame_begin(out);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_HELLO);
  msgpack_pack_int(&pk, MN_PROTOCOL_VERSION);
  pack_bin(&pk, nonce_s, MN_NONCE_LEN);
  mn_pack_cstr(&pk, role);
  mn_frame_end(out, start);
  return 0;
}

int mn_hs_check_auth(const mn_auth_t *a, const msgpack_object *msg,
                     const uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN],
                     char *err, size_t errlen) {
  uint64_t version;
  const char *nc, *mac;
  size_t ncl, macl;
  if (mn_msg_type(msg) != MN_MSG_AUTH) {
    snprintf(err, errlen, "expected AUTH as the first message, got type %d", mn_msg_type(msg));
    return MN_EAUTH;
  }
  if (mn_get_u64(msg, 1, &version) != 0 || mn_get_bin(msg, 2, &nc, &ncl) != 0 ||
      mn_get_bin(msg, 3, &mac, &macl) != 0 || ncl != MN_NONCE_LEN) {
    snprintf(err, errlen, "malformed AUTH message");
    return MN_EAUTH;
  }
  if (version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "protocol version %llu not supported (this side speaks %d)",
             (unsigned long long)version, MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  if (mn_auth_check(a, 'c', nonce_s, (const uint8_t *)nc, (const uint8_t *)mac, macl) != 0) {
    snprintf(err, errlen, "authentication failed: wrong cluster token");
    return MN_EAUTH;
  }
  memcpy(nonce_c, nc, MN_NONCE_LEN);
  return 0;
}

int mn_hs_welcome(mn_buf_t *out, const mn_auth_t *a, const uint8_t nonce_s[MN_NONCE_LEN],
                  const uint8_t nonce_c[MN_NONCE_LEN], const char *role) {
  uint8_t mac[MN_MAC_LEN];
  char host[256];
  msgpack_packer pk;
  mn_auth_mac(a, 's', nonce_c, nonce_s, mac);
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
  host[sizeof(host) - 1] = '\0';
  msgpack_packer_init(&pk, out, mn_buf_write_cb);
  size_t start = mn_frame_begin(out);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_int(&pk, MN_MSG_WELCOME);
  pack_bin(&pk, mac, sizeof(mac));
  msgpack_pack_map(&pk, 3);
  mn_pack_cstr(&pk, "hostname");
  mn_pack_cstr(&pk, host);
  mn_pack_cstr(&pk, "pid");
  msgpack_pack_int64(&pk, (int64_t)getpid());
  mn_pack_cstr(&pk, "role");
  mn_pack_cstr(&pk, role);
  mn_frame_end(out, start);
  return 0;
}

int mn_hs_answer(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *hello,
                 uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN], char *err,
                 size_t errlen) {
  uint64_t version;
  const char *ns;
  size_t nsl;
  uint8_t mac[MN_MAC_LEN];
  if (mn_msg_type(hello) == MN_MSG_ERROR) return peer_error(hello, err, errlen);
  if (mn_msg_type(hello) != MN_MSG_HELLO || mn_get_u64(hello, 1, &version) != 0 ||
      mn_get_bin(hello, 2, &ns, &nsl) != 0 || nsl != MN_NONCE_LEN) {
    snprintf(err, errlen, "peer did not start with a valid HELLO (not a monarch worker?)");
    return MN_EPROTO;
  }
  if (version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "peer speaks protocol version %llu, this side %d",
             (unsigned long long)version, MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  memcpy(nonce_s, ns, MN_NONCE_LEN);
  mn_auth_nonce(nonce_c);
  mn_auth_mac(a, 'c', nonce_s, nonce_c, mac);
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, mn_buf_write_cb);
  size_t start = mn_frame_begin(out);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_AUTH);
  msgpack_pack_int(&pk, MN_PROTOCOL_VERSION);
  pack_bin(&pk, nonce_c, MN_NONCE_LEN);
  pack_bin(&pk, mac, MN_MAC_LEN);
  mn_frame_end(out, start);
  return 0;
}

int mn_hs_check_welcome(const mn_auth_t *a, const msgpack_object *msg,
                        const uint8_t nonce_s[MN_NONCE_LEN], const uint8_t nonce_c[MN_NONCE_LEN],
                        char *err, size_t errlen) {
  const char *mac;
  size_t macl;
  if (mn_msg_type(msg) == MN_MSG_ERROR) return peer_error(msg, err, errlen);
  if (mn_msg_type(msg) != MN_MSG_WELCOME || mn_get_bin(msg, 1, &mac, &macl) != 0) {
    snprintf(err, errlen, "expected WELCOME, got message type %d", mn_msg_type(msg));
    return MN_EPROTO;
  }
  if (mn_auth_check(a, 's', nonce_c, nonce_s, (const uint8_t *)mac, macl) != 0) {
    snprintf(err, errlen, "server failed to prove it holds the cluster token");
    return MN_EAUTH;
  }
  return 0;
}
