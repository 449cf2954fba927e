/*
 * msg_pack.c - the builders of msg.h: each writes one whole frame (or a
 * frame's head, for the payload's owner to pack after it) into a buffer.
 * The table of messages and the parsers are in msg.c.
 */
#include "msg.h"

#include <string.h>

/* ---- builders --------------------------------------------------------------- */

/* Ends the frame begun at start, or takes it back if a write failed. */
static int finish(mn_buf_t *b, size_t start, int failed) {
  if (failed || b->len < start + MN_FRAME_HEADER) {
    if (b->len > start) b->len = start;
    return MN_ENOMEM;
  }
  mn_frame_end(b, start);
  return 0;
}

static int pack_cstr(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

static int pack_bin(msgpack_packer *pk, const uint8_t *p, size_t n) {
  return msgpack_pack_bin(pk, n) | msgpack_pack_bin_body(pk, p, n);
}

/* Begins a frame in b with the array header and the type; sets *start. */
static int head(mn_buf_t *b, msgpack_packer *pk, size_t *start, size_t n, int type) {
  msgpack_packer_init(pk, b, mn_buf_write_cb);
  *start = mn_frame_begin(b);
  return msgpack_pack_array(pk, n) | msgpack_pack_int(pk, type);
}

int mn_msg_pack_error(mn_buf_t *b, int code, const char *msg) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_ERROR);
  f |= msgpack_pack_int(&pk, code) | pack_cstr(&pk, msg);
  return finish(b, s, f);
}

int mn_msg_pack_hello(mn_buf_t *b, const uint8_t nonce_s[32], const char *role) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_HELLO);
  f |= msgpack_pack_int(&pk, MN_PROTOCOL_VERSION) | pack_bin(&pk, nonce_s, 32) | pack_cstr(&pk, role);
  return finish(b, s, f);
}

int mn_msg_pack_auth(mn_buf_t *b, const uint8_t nonce_c[32], const uint8_t mac[32]) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_AUTH);
  f |= msgpack_pack_int(&pk, MN_PROTOCOL_VERSION) | pack_bin(&pk, nonce_c, 32) | pack_bin(&pk, mac, 32);
  return finish(b, s, f);
}

int mn_msg_pack_welcome(mn_buf_t *b, const uint8_t mac[32], const char *hostname, int64_t pid, const char *role) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_WELCOME);
  f |= pack_bin(&pk, mac, 32) | msgpack_pack_map(&pk, 3);
  f |= pack_cstr(&pk, "hostname") | pack_cstr(&pk, hostname);
  f |= pack_cstr(&pk, "pid") | msgpack_pack_int64(&pk, pid);
  f |= pack_cstr(&pk, "role") | pack_cstr(&pk, role);
  return finish(b, s, f);
}

int mn_msg_pack_welcome_agent(mn_buf_t *b, const uint8_t mac[32], const char *hostname, int64_t pid, int elf_class,
                              int elf_machine, int ship, const char *cache_id) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_WELCOME);
  f |= pack_bin(&pk, mac, 32) | msgpack_pack_map(&pk, 7);
  f |= pack_cstr(&pk, "hostname") | pack_cstr(&pk, hostname);
  f |= pack_cstr(&pk, "pid") | msgpack_pack_int64(&pk, pid);
  f |= pack_cstr(&pk, "role") | pack_cstr(&pk, "agent");
  f |= pack_cstr(&pk, "elf_class") | msgpack_pack_int(&pk, elf_class);
  f |= pack_cstr(&pk, "elf_machine") | msgpack_pack_int(&pk, elf_machine);
  f |= pack_cstr(&pk, "ship") | (ship ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
  f |= pack_cstr(&pk, "cache") | pack_cstr(&pk, cache_id != NULL ? cache_id : "");
  return finish(b, s, f);
}

int mn_msg_pack_join(mn_buf_t *b, const uint8_t nonce_a[32], const char *addr, const uint8_t mac[32]) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 5, MN_MSG_JOIN);
  f |= msgpack_pack_int(&pk, MN_PROTOCOL_VERSION) | pack_bin(&pk, nonce_a, 32) | pack_cstr(&pk, addr) |
       pack_bin(&pk, mac, 32);
  return finish(b, s, f);
}

int mn_msg_pack_joined(mn_buf_t *b, const uint8_t mac[32]) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_JOINED) | pack_bin(&pk, mac, 32);
  return finish(b, s, f);
}

int mn_msg_pack_ping(mn_buf_t *b, uint64_t id) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_PING);
  f |= msgpack_pack_uint64(&pk, id);
  return finish(b, s, f);
}

int mn_msg_pack_pong(mn_buf_t *b, const msgpack_object *id) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_PONG);
  f |= msgpack_pack_object(&pk, *id);
  return finish(b, s, f);
}

int mn_msg_pack_session(mn_buf_t *b, uint64_t session, uint64_t acked) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_SESSION);
  f |= msgpack_pack_uint64(&pk, session) | msgpack_pack_uint64(&pk, acked);
  return finish(b, s, f);
}

int mn_msg_pack_ack(mn_buf_t *b, uint64_t acked) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_ACK);
  f |= msgpack_pack_uint64(&pk, acked);
  return finish(b, s, f);
}

int mn_msg_pack_cancel(mn_buf_t *b, const uint64_t *seqs, size_t n) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_CANCEL);
  f |= msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) f |= msgpack_pack_uint64(&pk, seqs[i]);
  return finish(b, s, f);
}

int mn_msg_pack_proc_hung(mn_buf_t *b, int64_t pid, int rank, uint64_t silent_ms) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_PROC_HUNG);
  f |= msgpack_pack_int64(&pk, pid) | msgpack_pack_int(&pk, rank) | msgpack_pack_uint64(&pk, silent_ms);
  return finish(b, s, f);
}

int mn_msg_pack_goodbye(mn_buf_t *b) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 1, MN_MSG_GOODBYE);
  return finish(b, s, f);
}

int mn_msg_pack_spawned(mn_buf_t *b, uint64_t req, int index, int64_t pid, int port) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 5, MN_MSG_SPAWNED);
  f |= msgpack_pack_uint64(&pk, req) | msgpack_pack_int(&pk, index) | msgpack_pack_int64(&pk, pid) |
       msgpack_pack_int(&pk, port);
  return finish(b, s, f);
}

int mn_msg_pack_spawn_failed(mn_buf_t *b, uint64_t req, int index, const char *msg) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_SPAWN_FAILED);
  f |= msgpack_pack_uint64(&pk, req) | msgpack_pack_int(&pk, index) | pack_cstr(&pk, msg);
  return finish(b, s, f);
}

int mn_msg_pack_proc_exit(mn_buf_t *b, int64_t pid, int64_t status, const char *signal, int rank) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 5, MN_MSG_PROC_EXIT);
  f |= msgpack_pack_int64(&pk, pid) | msgpack_pack_int64(&pk, status) | pack_cstr(&pk, signal) |
       msgpack_pack_int(&pk, rank);
  return finish(b, s, f);
}

int mn_msg_pack_log(mn_buf_t *b, int rank, int stream, const char *text, size_t n) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_LOG);
  f |= msgpack_pack_int(&pk, rank) | msgpack_pack_int(&pk, stream) | msgpack_pack_str(&pk, n) |
       msgpack_pack_str_body(&pk, text, n);
  return finish(b, s, f);
}

size_t mn_msg_pong_from_ping(char out[MN_MSG_PONG_MAX], const char *ping, size_t len) {
  /* [PING, id] starts 0x92 0x05 whatever id is: answering needs no decoding. */
  if (len < 2 || (unsigned char)ping[0] != 0x92 || ping[1] != MN_MSG_PING) return 0;
  if (len > MN_MSG_PONG_MAX - MN_FRAME_HEADER) return 0;
  mn_put_be32(out, (uint32_t)len);
  out[4] = (char)0x92;
  out[5] = MN_MSG_PONG;
  memcpy(out + 6, ping + 2, len - 2);
  return len + MN_FRAME_HEADER;
}

/* Writes 0xcf and v as a big-endian uint64 at p; returns 9. */
static size_t put_u64(char *p, uint64_t v) {
  p[0] = (char)0xcf;
  for (int j = 8; j >= 1; j--, v >>= 8) p[j] = (char)v;
  return 9;
}

size_t mn_msg_lost_call(char out[MN_MSG_LOST_LEN], uint64_t seq) {
  static const char name[] = {(char)0xa6, '_', '_', 'l', 'o', 's', 't', (char)0x90}; /* "__lost", [] */
  size_t h = MN_FRAME_HEADER;
  out[h++] = (char)0x94;
  out[h++] = MN_MSG_CALL;
  h += put_u64(out + h, seq);
  memcpy(out + h, name, sizeof(name));
  h += sizeof(name);
  mn_put_be32(out, (uint32_t)(h - MN_FRAME_HEADER));
  return h;
}

size_t mn_msg_put_head(char out[MN_MSG_PUT_HEAD], uint64_t tensor, uint64_t offset, uint32_t len) {
  static const char name[] = {(char)0xac, '_', '_', 't', 'e', 'n', 's', 'o', 'r', '_', 'p', 'u', 't'};
  size_t h = MN_FRAME_HEADER;
  out[h++] = (char)0x94;
  out[h++] = MN_MSG_CALL;
  h += put_u64(out + h, 0);
  memcpy(out + h, name, sizeof(name));
  h += sizeof(name);
  out[h++] = (char)0x93; /* [tensor, offset, bin] */
  h += put_u64(out + h, tensor);
  h += put_u64(out + h, offset);
  out[h++] = (char)0xc6; /* bin32: the payload follows */
  mn_put_be32(out + h, len);
  h += 4;
  mn_put_be32(out, (uint32_t)(h - MN_FRAME_HEADER + len));
  return h;
}

/* ---- heads ------------------------------------------------------------------- */

size_t mn_msg_call_head(mn_buf_t *b, msgpack_packer *pk, const char *kernel, size_t kl, uint32_t nargs) {
  /* seq as a fixed-width uint64, so every target's copy is patched in place. */
  static const char start[] = {(char)0x94, MN_MSG_CALL, (char)0xcf, 0, 0, 0, 0, 0, 0, 0, 0};
  msgpack_packer_init(pk, b, mn_buf_write_cb);
  size_t s = mn_frame_begin(b);
  (void)mn_buf_append(b, start, sizeof(start)); /* failure surfaces at mn_frame_end, as for every frame */
  msgpack_pack_str(pk, kl);
  msgpack_pack_str_body(pk, kernel, kl);
  msgpack_pack_array(pk, nargs);
  return s;
}

/* [type, id, ok, ...] for RESULT and REPLY. */
static size_t answer_head(mn_buf_t *b, msgpack_packer *pk, int type, uint64_t id, int ok) {
  size_t s;
  (void)head(b, pk, &s, 4, type); /* as for the value the caller packs next: a short frame is the sign */
  msgpack_pack_uint64(pk, id);
  if (ok) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  return s;
}

size_t mn_msg_result_head(mn_buf_t *b, msgpack_packer *pk, uint64_t seq, int ok) {
  return answer_head(b, pk, MN_MSG_RESULT, seq, ok);
}

void mn_msg_pack_failure(msgpack_packer *pk, const char *kind, const char *message, const char *kernel, size_t klen) {
  msgpack_pack_map(pk, kernel != NULL ? 3 : 2);
  pack_cstr(pk, "kind");
  pack_cstr(pk, kind);
  pack_cstr(pk, "message");
  pack_cstr(pk, message);
  if (kernel == NULL) return;
  pack_cstr(pk, "kernel");
  msgpack_pack_str(pk, klen);
  msgpack_pack_str_body(pk, kernel, klen);
}

size_t mn_msg_reply_head(mn_buf_t *b, msgpack_packer *pk, uint64_t req, int ok) {
  return answer_head(b, pk, MN_MSG_REPLY, req, ok);
}

/* Packs n uints in their smallest msgpack form straight into b (room made once, not a callback per
 * value: a cast names three per proc); 0 or MN_ENOMEM. */
int mn_msg_pack_uints(mn_buf_t *b, const uint64_t *v, size_t n) {
  if (mn_buf_reserve(b, 9 * n) != 0) return MN_ENOMEM;
  unsigned char *p = (unsigned char *)b->data + b->len;
  /* One store per width, not a byte at a time: a cast's triples are tens of thousands of uints. */
  for (size_t i = 0; i < n; i++) {
    uint64_t x = v[i];
    if (x <= 0x7f) {
      *p++ = (unsigned char)x;
    } else if (x <= 0xff) {
      p[0] = 0xcc, p[1] = (unsigned char)x, p += 2;
    } else if (x <= 0xffff) {
      p[0] = 0xcd, p[1] = (unsigned char)(x >> 8), p[2] = (unsigned char)x, p += 3;
    } else if (x <= 0xffffffffu) {
      p[0] = 0xce, mn_put_be32((char *)p + 1, (uint32_t)x), p += 5;
    } else {
      p[0] = 0xcf, mn_put_be32((char *)p + 1, (uint32_t)(x >> 32)), mn_put_be32((char *)p + 5, (uint32_t)x), p += 9;
    }
  }
  b->len = (size_t)(p - (unsigned char *)b->data);
  return 0;
}

int mn_msg_pack_cast(mn_buf_t *b, const uint64_t *targets, size_t n, const char *rest, size_t rlen) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_CAST) | msgpack_pack_array(&pk, (uint32_t)(3 * n));
  f |= mn_msg_pack_uints(b, targets, 3 * n);
  f |= msgpack_pack_bin(&pk, rlen) | msgpack_pack_bin_body(&pk, rest, rlen);
  return finish(b, s, f);
}

int mn_msg_cast_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint64_t *targets, size_t n,
                     const char *rest, size_t rlen, uint32_t nsubs) {
  int f = head(b, pk, start, 4, MN_MSG_CAST) | msgpack_pack_array(pk, (uint32_t)(3 * n)) | mn_msg_pack_uints(b, targets, 3 * n);
  f |= msgpack_pack_bin(pk, rlen) | msgpack_pack_bin_body(pk, rest, rlen) | msgpack_pack_array(pk, 4 * nsubs);
  return f ? MN_ENOMEM : 0;
}

int mn_msg_pack_cast_obj(mn_buf_t *b, const msgpack_object *targets, const char *rest, size_t rlen,
                         const msgpack_object *subs) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_CAST) | msgpack_pack_object(&pk, *targets);
  f |= msgpack_pack_bin(&pk, rlen) | msgpack_pack_bin_body(&pk, rest, rlen) | msgpack_pack_object(&pk, *subs);
  return finish(b, s, f);
}

int mn_msg_spawn_head(mn_buf_t *b, msgpack_packer *pk, size_t *start) {
  return head(b, pk, start, 4, MN_MSG_SPAWN) ? MN_ENOMEM : 0;
}

int mn_msg_pack_spawn_body(mn_buf_t *b, const char *body, size_t blen) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_SPAWN) | mn_buf_append(b, body, blen);
  return finish(b, s, f);
}

int mn_msg_pack_spawn_obj(mn_buf_t *b, uint64_t req, const msgpack_object *spec, const msgpack_object *subs) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_SPAWN) | msgpack_pack_uint64(&pk, req) | msgpack_pack_object(&pk, *spec);
  f |= msgpack_pack_object(&pk, *subs);
  return finish(b, s, f);
}

int mn_msg_pack_tree(mn_buf_t *b, uint64_t epoch, const char *const *addrs, const uint64_t *sessions, size_t n,
                     uint64_t ping_ms, uint64_t silence_ms) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 5, MN_MSG_TREE) | msgpack_pack_uint64(&pk, epoch) | msgpack_pack_array(&pk, (uint32_t)(2 * n));
  for (size_t i = 0; i < n; i++) f |= pack_cstr(&pk, addrs[i]) | msgpack_pack_uint64(&pk, sessions[i]);
  f |= msgpack_pack_uint64(&pk, ping_ms) | msgpack_pack_uint64(&pk, silence_ms);
  return finish(b, s, f);
}

int mn_msg_pack_linked(mn_buf_t *b, uint64_t epoch, uint64_t index, int up) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 4, MN_MSG_LINKED) | msgpack_pack_uint64(&pk, epoch) | msgpack_pack_uint64(&pk, index);
  f |= up ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
  return finish(b, s, f);
}

int mn_msg_pack_relay_session(mn_buf_t *b, uint64_t session, uint64_t silence_ms) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 5, MN_MSG_SESSION) | msgpack_pack_uint64(&pk, session) | msgpack_pack_uint64(&pk, 0);
  f |= msgpack_pack_true(&pk) | msgpack_pack_uint64(&pk, silence_ms);
  return finish(b, s, f);
}

int mn_msg_pack_acks(mn_buf_t *b, const uint64_t *pairs, size_t n) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 2, MN_MSG_ACKS) | msgpack_pack_array(&pk, (uint32_t)(2 * n));
  for (size_t i = 0; i < 2 * n; i++) f |= msgpack_pack_uint64(&pk, pairs[i]);
  return finish(b, s, f);
}

int mn_msg_acks_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint64_t *pairs, size_t n, uint32_t nsubs) {
  int f = head(b, pk, start, 3, MN_MSG_ACKS) | msgpack_pack_array(pk, (uint32_t)(2 * n));
  f |= mn_msg_pack_uints(b, pairs, 2 * n) | msgpack_pack_array(pk, 3 * nsubs);
  return f ? MN_ENOMEM : 0;
}

int mn_msg_pack_acks_obj(mn_buf_t *b, const msgpack_object *pairs, const msgpack_object *subs) {
  msgpack_packer pk;
  size_t s;
  int f = head(b, &pk, &s, 3, MN_MSG_ACKS) | msgpack_pack_object(&pk, *pairs) | msgpack_pack_object(&pk, *subs);
  return finish(b, s, f);
}

void mn_msg_call_from_cast(char out[MN_MSG_CALL_HEAD], uint64_t seq, size_t rlen) {
  mn_put_be32(out, (uint32_t)(MN_MSG_CALL_HEAD - MN_FRAME_HEADER + rlen));
  out[4] = (char)0x94;
  out[5] = MN_MSG_CALL;
  out[6] = (char)0xcf;
  mn_msg_set_seq(out, seq);
}

int mn_msg_results_begin(mn_buf_t *b) {
  /* The head's size does not depend on the count: array32, so end() patches it in place. */
  char h[MN_MSG_RESULTS_HEAD] = {0, 0, 0, 0, (char)0xdd, 0, 0, 0, 0, MN_MSG_RESULTS};
  b->len = 0;
  return mn_buf_append(b, h, sizeof(h));
}

int mn_msg_results_add(mn_buf_t *b, uint64_t tag, const char *result, size_t len) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, mn_buf_write_cb);
  size_t was = b->len;
  if (msgpack_pack_uint64(&pk, tag) != 0 || mn_buf_append(b, result, len) != 0) {
    b->len = was;
    return MN_ENOMEM;
  }
  return 0;
}

void mn_msg_results_end(mn_buf_t *b, uint32_t n) {
  mn_put_be32(b->data, (uint32_t)(b->len - MN_FRAME_HEADER));
  mn_put_be32(b->data + 5, 1 + 2 * n);
}
