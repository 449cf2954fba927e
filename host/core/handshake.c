/* handshake.c - see handshake.h. The messages are built and parsed in msg.c. */
#include "handshake.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Reads the error text of an ERROR frame a peer sent instead of what we expected. */
static int peer_error(const msgpack_object *msg, char *err, size_t errlen) {
  mn_msg_error_t e;
  char why[200];
  if (mn_msg_parse_error(msg, &e, why, sizeof(why)) == 0)
    snprintf(err, errlen, "peer refused: %.*s", (int)(e.text_len > 200 ? 200 : e.text_len), e.text);
  else
    snprintf(err, errlen, "peer sent an ERROR without a message");
  return MN_EAUTH;
}

int mn_hs_hello(mn_buf_t *out, const char *role, uint8_t nonce_s[MN_NONCE_LEN]) {
  mn_auth_nonce(nonce_s);
  return mn_msg_pack_hello(out, nonce_s, role);
}

int mn_hs_check_auth(const mn_auth_t *a, const msgpack_object *msg,
                     const uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN],
                     char *err, size_t errlen) {
  mn_msg_auth_t m;
  char why[300];
  if (mn_msg_type(msg) != MN_MSG_AUTH) {
    snprintf(err, errlen, "expected AUTH as the first message, got type %d", mn_msg_type(msg));
    return MN_EAUTH;
  }
  if (mn_msg_parse_auth(msg, &m, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "malformed AUTH message (%s)", why);
    return MN_EAUTH;
  }
  if (m.version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "protocol version %llu not supported (this side speaks %d)",
             (unsigned long long)m.version, MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  if (mn_auth_check(a, 'c', nonce_s, m.nonce, m.mac, m.mac_len) != 0) {
    snprintf(err, errlen, "authentication failed: wrong cluster token");
    return MN_EAUTH;
  }
  memcpy(nonce_c, m.nonce, MN_NONCE_LEN);
  return 0;
}

int mn_hs_welcome(mn_buf_t *out, const mn_auth_t *a, const uint8_t nonce_s[MN_NONCE_LEN],
                  const uint8_t nonce_c[MN_NONCE_LEN], const char *role) {
  uint8_t mac[MN_MAC_LEN];
  char host[256];
  mn_auth_mac(a, 's', nonce_c, nonce_s, mac);
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
  host[sizeof(host) - 1] = '\0';
  return mn_msg_pack_welcome(out, mac, host, (int64_t)getpid(), role);
}

int mn_hs_welcome_agent(mn_buf_t *out, const mn_auth_t *a, const uint8_t nonce_s[MN_NONCE_LEN],
                        const uint8_t nonce_c[MN_NONCE_LEN], int elf_class, int elf_machine, int ship,
                        const char *cache_id) {
  uint8_t mac[MN_MAC_LEN];
  char host[256];
  mn_auth_mac(a, 's', nonce_c, nonce_s, mac);
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
  host[sizeof(host) - 1] = '\0';
  return mn_msg_pack_welcome_agent(out, mac, host, (int64_t)getpid(), elf_class, elf_machine, ship, cache_id);
}

int mn_hs_answer(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *hello,
                 uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN], char *err,
                 size_t errlen) {
  mn_msg_hello_t h;
  char why[300];
  uint8_t mac[MN_MAC_LEN];
  if (mn_msg_type(hello) == MN_MSG_ERROR) return peer_error(hello, err, errlen);
  if (mn_msg_parse_hello(hello, &h, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "peer did not start with a valid HELLO (not a monarch worker?): %s", why);
    return MN_EPROTO;
  }
  if (h.version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "peer speaks protocol version %llu, this side %d",
             (unsigned long long)h.version, MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  memcpy(nonce_s, h.nonce, MN_NONCE_LEN);
  mn_auth_nonce(nonce_c);
  mn_auth_mac(a, 'c', nonce_s, nonce_c, mac);
  return mn_msg_pack_auth(out, nonce_c, mac);
}

int mn_hs_check_welcome(const mn_auth_t *a, const msgpack_object *msg,
                        const uint8_t nonce_s[MN_NONCE_LEN], const uint8_t nonce_c[MN_NONCE_LEN],
                        char *err, size_t errlen) {
  mn_msg_welcome_t w;
  char why[300];
  if (mn_msg_type(msg) == MN_MSG_ERROR) return peer_error(msg, err, errlen);
  if (mn_msg_type(msg) != MN_MSG_WELCOME) {
    snprintf(err, errlen, "expected WELCOME, got message type %d", mn_msg_type(msg));
    return MN_EPROTO;
  }
  if (mn_msg_parse_welcome(msg, &w, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "expected WELCOME, got message type %d (%s)", mn_msg_type(msg), why);
    return MN_EPROTO;
  }
  if (mn_auth_check(a, 's', nonce_c, nonce_s, w.mac, w.mac_len) != 0) {
    snprintf(err, errlen, "server failed to prove it holds the cluster token");
    return MN_EAUTH;
  }
  return 0;
}
