/* join.c - the JOIN exchange; see join.h. The messages are built and parsed in msg.c. */
#include "join.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

/* Copies n bytes of a peer's text into out (cap > 0), control characters and NULs as '?': it goes into logs. */
static void printable(char *out, size_t cap, const char *p, size_t n) {
  size_t i = 0;
  for (; i < n && i + 1 < cap; i++) out[i] = (unsigned char)p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i];
  out[i] = '\0';
}

/* An ERROR the peer sent instead of what we expected: its code (MN_EPEER if not negative), its text in err. */
static int peer_error(const msgpack_object *msg, char *err, size_t errlen) {
  mn_msg_error_t e;
  char why[200], text[301];
  if (mn_msg_parse_error(msg, &e, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "peer sent a malformed ERROR (%s)", why);
    return MN_EPROTO;
  }
  printable(text, sizeof(text), e.text, e.text_len);
  if (text[0] == '\0') snprintf(err, errlen, "the peer sent ERROR %lld without a message", (long long)e.code);
  else snprintf(err, errlen, "%s", text);
  return e.code < 0 && e.code > -100000 ? (int)e.code : MN_EPEER;
}

int mn_join_hello(mn_buf_t *out, uint8_t nonce_j[MN_NONCE_LEN]) {
  mn_auth_nonce(nonce_j);
  return mn_msg_pack_hello(out, nonce_j, MN_JOIN_ROLE);
}

int mn_join_answer(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *hello, const char *addr,
                   uint8_t nonce_j[MN_NONCE_LEN], uint8_t nonce_a[MN_NONCE_LEN], char *err, size_t errlen) {
  mn_msg_hello_t h;
  char why[300];
  uint8_t mac[MN_MAC_LEN];
  if (mn_msg_type(hello) == MN_MSG_ERROR) return peer_error(hello, err, errlen);
  if (mn_msg_parse_hello(hello, &h, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "the peer did not greet with HELLO (not a monarch join port?): %s", why);
    return MN_EPROTO;
  }
  if (h.role_len != strlen(MN_JOIN_ROLE) || memcmp(h.role, MN_JOIN_ROLE, h.role_len) != 0) {
    char role[33];
    printable(role, sizeof(role), h.role, h.role_len);
    snprintf(err, errlen, "the peer is a monarch %s, not a controller's join port", role);
    return MN_EPROTO;
  }
  if (h.version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "the controller speaks protocol version %llu, this side %d", (unsigned long long)h.version,
             MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  memcpy(nonce_j, h.nonce, MN_NONCE_LEN);
  mn_auth_nonce(nonce_a);
  mn_auth_mac_data(a, 'j', nonce_j, nonce_a, addr, strlen(addr), mac);
  return mn_msg_pack_join(out, nonce_a, addr, mac);
}

int mn_join_check_addr(const char *addr) {
  char host[MN_MSG_JOIN_MAX_ADDR + 1];
  unsigned char bin[16];
  const char *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (colon == NULL || hl == 0 || hl >= sizeof(host) || colon[1] == '\0' || strlen(colon + 1) > 5) return MN_EINVAL;
  unsigned port = 0;
  for (const char *p = colon + 1; *p; p++) {
    if (*p < '0' || *p > '9') return MN_EINVAL;
    port = port * 10 + (unsigned)(*p - '0');
  }
  if (port == 0 || port > 65535) return MN_EINVAL;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  if (host[0] == '[') { /* [IPv6]:port */
    if (hl < 3 || host[hl - 1] != ']') return MN_EINVAL;
    host[hl - 1] = '\0';
    return inet_pton(AF_INET6, host + 1, bin) == 1 ? 0 : MN_EINVAL;
  }
  return inet_pton(AF_INET, host, bin) == 1 ? 0 : MN_EINVAL;
}

int mn_join_accept(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *msg,
                   const uint8_t nonce_j[MN_NONCE_LEN], char *addr, size_t addrlen, char *err, size_t errlen) {
  mn_msg_join_t m;
  char why[300];
  uint8_t mac[MN_MAC_LEN];
  if (mn_msg_type(msg) != MN_MSG_JOIN) {
    snprintf(err, errlen, "expected JOIN as the first message, got type %d", mn_msg_type(msg));
    return MN_EPROTO;
  }
  if (mn_msg_parse_join(msg, &m, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "%s", why);
    return MN_EPROTO;
  }
  if (m.version != MN_PROTOCOL_VERSION) {
    snprintf(err, errlen, "protocol version %llu not supported (this side speaks %d)",
             (unsigned long long)m.version, MN_PROTOCOL_VERSION);
    return MN_EVERSION;
  }
  /* The MAC first: nothing about the address is told to a peer without the token. */
  if (mn_auth_check_data(a, 'j', nonce_j, m.nonce, m.addr, m.addr_len, m.mac, m.mac_len) != 0) {
    snprintf(err, errlen, "authentication failed: wrong cluster token");
    return MN_EAUTH;
  }
  addr[0] = '\0'; /* stays empty for an address too long for addr or holding a NUL */
  if (m.addr_len < addrlen && memchr(m.addr, '\0', m.addr_len) == NULL) {
    memcpy(addr, m.addr, m.addr_len);
    addr[m.addr_len] = '\0';
  }
  if (addr[0] == '\0' || mn_join_check_addr(addr) != 0) {
    char shown[64];
    printable(shown, sizeof(shown), m.addr, m.addr_len);
    snprintf(err, errlen, "address '%s' is not a numeric IPv4:PORT or [IPv6]:PORT with a port 1..65535", shown);
    addr[0] = '\0';
    return MN_EPROTO;
  }
  mn_auth_mac(a, 'J', m.nonce, nonce_j, mac);
  return mn_msg_pack_joined(out, mac);
}

int mn_join_check_joined(const mn_auth_t *a, const msgpack_object *msg, const uint8_t nonce_j[MN_NONCE_LEN],
                         const uint8_t nonce_a[MN_NONCE_LEN], char *err, size_t errlen) {
  const uint8_t *mac;
  size_t mac_len;
  char why[300];
  if (mn_msg_type(msg) == MN_MSG_ERROR) return peer_error(msg, err, errlen);
  if (mn_msg_parse_joined(msg, &mac, &mac_len, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "expected JOINED: %s", why);
    return MN_EPROTO;
  }
  if (mn_auth_check(a, 'J', nonce_a, nonce_j, mac, mac_len) != 0) {
    snprintf(err, errlen, "the controller failed to prove it holds the cluster token");
    return MN_EAUTH;
  }
  return 0;
}
