/* msg.c - every message's number, name, builder and parser (msg.h). */
#include "msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------ */

enum {
  BY_SERVER = 1, /* an agent or a proc sends it */
  BY_CTL = 2,    /* a controller sends it */
  BY_SCRIPT = 4, /* ... and its script may, with core.send (the C side owns the others) */
};

typedef struct {
  const char *name;   /* NULL for a number that is no type */
  uint8_t min;        /* elements, the type included */
  uint8_t exact;      /* no more than min either */
  uint8_t by;
  const char *layout; /* for error messages */
} spec_t;

/* Indexed by type, so that finding a message's spec costs no search on the hot paths. */
static const spec_t specs[] = {
    [MN_MSG_HELLO] = {"HELLO", 4, 0, BY_SERVER, "[1, version, nonce_s, role]"},
    [MN_MSG_AUTH] = {"AUTH", 4, 0, BY_CTL, "[2, version, nonce_c, mac]"},
    [MN_MSG_WELCOME] = {"WELCOME", 3, 0, BY_SERVER, "[3, mac, info]"},
    [MN_MSG_ERROR] = {"ERROR", 3, 0, BY_SERVER, "[4, code, message]"},
    [MN_MSG_PING] = {"PING", 2, 1, BY_CTL | BY_SCRIPT, "[5, id]"},
    [MN_MSG_PONG] = {"PONG", 2, 1, BY_SERVER, "[6, id]"},
    [MN_MSG_SPAWN] = {"SPAWN", 3, 0, BY_CTL | BY_SCRIPT,
                      "[10, req, {count=, rank_base=, world=}, subs?: [index, req, spec, subs, ...]]"},
    [MN_MSG_SPAWNED] = {"SPAWNED", 5, 0, BY_SERVER, "[11, req, index, pid, port]"},
    [MN_MSG_SPAWN_FAILED] = {"SPAWN_FAILED", 4, 0, BY_SERVER, "[12, req, index, message]"},
    [MN_MSG_PROC_EXIT] = {"PROC_EXIT", 5, 0, BY_SERVER, "[13, pid, status, signal, rank]"},
    [MN_MSG_KILL] = {"KILL", 3, 0, BY_CTL | BY_SCRIPT, "[14, pid, signal]"},
    [MN_MSG_PERSIST] = {"PERSIST", 5, 1, BY_CTL | BY_SCRIPT, "[15, req, name, pids, description]"},
    [MN_MSG_ATTACH] = {"ATTACH", 3, 1, BY_CTL | BY_SCRIPT, "[16, req, name]"},
    [MN_MSG_REPLY] = {"REPLY", 4, 0, BY_SERVER, "[17, req, ok, value]"},
    [MN_MSG_DETACH] = {"DETACH", 3, 1, BY_CTL | BY_SCRIPT, "[18, req, name]"},
    [MN_MSG_LIST] = {"LIST", 2, 1, BY_CTL | BY_SCRIPT, "[19, req]"},
    [MN_MSG_CALL] = {"CALL", 4, 1, BY_CTL, "[20, seq, kernel, args]"},
    [MN_MSG_RESULT] = {"RESULT", 4, 1, BY_SERVER, "[21, seq, ok, value]"},
    [MN_MSG_SESSION] = {"SESSION", 3, 0, BY_CTL, "[22, id, acked]"},
    [MN_MSG_ACK] = {"ACK", 2, 0, BY_CTL, "[24, acked]"},
    [MN_MSG_GOODBYE] = {"GOODBYE", 1, 0, BY_CTL, "[25]"},
    [MN_MSG_LOG] = {"LOG", 4, 0, BY_SERVER, "[26, rank, stream, text]"},
    [MN_MSG_STATUS] = {"STATUS", 2, 0, BY_CTL | BY_SCRIPT, "[27, req]"},
    [MN_MSG_CANCEL] = {"CANCEL", 2, 1, BY_CTL, "[28, [seq, ...]]"},
    [MN_MSG_PROC_HUNG] = {"PROC_HUNG", 4, 0, BY_SERVER, "[29, pid, rank, silent_ms]"},
    [MN_MSG_CAST] = {"CAST", 3, 0, BY_CTL, "[30, [pid, seq, tag, ...], rest: bin, subs: [index, count, targets, subs, ...]]"},
    [MN_MSG_RESULTS] = {"RESULTS", 1, 0, BY_SERVER, "[31, tag, result, tag, result, ...]"},
    [MN_MSG_JOIN] = {"JOIN", 5, 0, BY_SERVER, "[32, version, nonce_a, addr, mac]"},
    [MN_MSG_JOINED] = {"JOINED", 2, 0, BY_CTL, "[33, mac]"},
    [MN_MSG_ACKS] = {"ACKS", 2, 0, BY_CTL, "[34, [pid, acked, ...], subs?]"},
    [MN_MSG_TREE] = {"TREE", 3, 0, BY_CTL, "[35, epoch, [addr, session, ...], ping_ms?, silence_ms?]"},
    [MN_MSG_LINKED] = {"LINKED", 4, 1, BY_SERVER, "[36, epoch, index, up]"},
};

#define NSPECS (sizeof(specs) / sizeof(specs[0]))

static const spec_t *spec_of(int64_t type) {
  return type >= 0 && (size_t)type < NSPECS && specs[type].name != NULL ? &specs[type] : NULL;
}

const char *mn_msg_name(int type) {
  const spec_t *s = spec_of(type);
  return s ? s->name : NULL;
}

void mn_msg_each(void (*fn)(void *data, int type, const char *name), void *data) {
  for (size_t i = 0; i < NSPECS; i++)
    if (specs[i].name != NULL) fn(data, (int)i, specs[i].name);
}

int mn_msg_check_script_send(int64_t type, size_t nelems, char *err, size_t errlen) {
  const spec_t *s = spec_of(type);
  if (s == NULL || !(s->by & BY_CTL)) {
    snprintf(err, errlen, "message type %lld is not one a controller sends", (long long)type);
    return MN_EPROTO;
  }
  if (!(s->by & BY_SCRIPT)) {
    snprintf(err, errlen, "%s is sent by the controller's C side only%s", s->name,
             type == MN_MSG_CALL ? " (use core.call)" : "");
    return MN_EPROTO;
  }
  if (nelems < s->min || (s->exact && nelems > s->min)) {
    snprintf(err, errlen, "%s has %zu elements, want %s%u: %s", s->name, nelems, s->exact ? "" : "at least ",
             (unsigned)s->min, s->layout);
    return MN_EPROTO;
  }
  return 0;
}

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

/* ---- parsers ------------------------------------------------------------------- */

/* Writes "malformed X: want [layout]; <detail>" and returns MN_EPROTO. */
__attribute__((format(printf, 4, 5))) static int bad(const spec_t *s, char *err, size_t errlen, const char *fmt,
                                                     ...) {
  char detail[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  snprintf(err, errlen, "malformed %s: want %s; %s", s->name, s->layout, detail);
  return MN_EPROTO;
}

/* The spec of m's type, after checking that m is of `type` with the right count. */
static const spec_t *check(const msgpack_object *m, int type, int *rc, char *err, size_t errlen) {
  const spec_t *s = spec_of(type);
  uint32_t n = m->via.array.size;
  *rc = 0;
  if (mn_msg_type(m) != type)
    *rc = bad(s, err, errlen, "got message type %d", mn_msg_type(m));
  else if (n < s->min || (s->exact && n > s->min))
    *rc = bad(s, err, errlen, "got %u elements", n);
  return s;
}

static const msgpack_object *at(const msgpack_object *m, uint32_t i) { return &m->via.array.ptr[i]; }

/* Element i of m if it is there: a uint, else 0 (an older peer's shorter frame). */
static uint64_t opt_u64(const msgpack_object *m, uint32_t i) {
  return m->via.array.size > i && at(m, i)->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? at(m, i)->via.u64 : 0;
}

static int want_u64(const spec_t *s, const msgpack_object *m, uint32_t i, const char *field, uint64_t *out,
                    char *err, size_t errlen) {
  if (mn_get_u64(m, i, out) != 0) return bad(s, err, errlen, "%s (element %u) is not a uint", field, i);
  return 0;
}

static int want_i64(const spec_t *s, const msgpack_object *m, uint32_t i, const char *field, int64_t *out,
                    char *err, size_t errlen) {
  if (mn_get_i64(m, i, out) != 0) return bad(s, err, errlen, "%s (element %u) is not an int", field, i);
  return 0;
}

static int want_bin(const spec_t *s, const msgpack_object *m, uint32_t i, const char *field, size_t len,
                    const uint8_t **p, size_t *n, char *err, size_t errlen) {
  const char *q;
  size_t ql;
  if (mn_get_bin(m, i, &q, &ql) != 0 || (len > 0 && ql != len)) {
    if (len > 0) return bad(s, err, errlen, "%s (element %u) is not a bin of %zu bytes", field, i, len);
    return bad(s, err, errlen, "%s (element %u) is not a bin", field, i);
  }
  *p = (const uint8_t *)q;
  if (n != NULL) *n = ql;
  return 0;
}

int mn_msg_parse_hello(const msgpack_object *m, mn_msg_hello_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_HELLO, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "version", &out->version, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 2, "nonce_s", 32, &out->nonce, NULL, err, errlen);
  if (rc == 0 && mn_get_str(m, 3, &out->role, &out->role_len) != 0)
    rc = bad(s, err, errlen, "role (element 3) is not a str");
  return rc;
}

int mn_msg_parse_auth(const msgpack_object *m, mn_msg_auth_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_AUTH, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "version", &out->version, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 2, "nonce_c", 32, &out->nonce, NULL, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 3, "mac", 0, &out->mac, &out->mac_len, err, errlen);
  return rc;
}

int mn_msg_parse_join(const msgpack_object *m, mn_msg_join_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_JOIN, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "version", &out->version, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 2, "nonce_a", 32, &out->nonce, NULL, err, errlen);
  if (rc == 0 && (mn_get_str(m, 3, &out->addr, &out->addr_len) != 0 || out->addr_len == 0 ||
                  out->addr_len > MN_MSG_JOIN_MAX_ADDR))
    rc = bad(s, err, errlen, "addr (element 3) is not a str of 1..%d bytes", MN_MSG_JOIN_MAX_ADDR);
  if (rc == 0) rc = want_bin(s, m, 4, "mac", 0, &out->mac, &out->mac_len, err, errlen);
  return rc;
}

int mn_msg_parse_joined(const msgpack_object *m, const uint8_t **mac, size_t *mac_len, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_JOINED, &rc, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 1, "mac", 0, mac, mac_len, err, errlen);
  return rc;
}

int mn_msg_parse_welcome(const msgpack_object *m, mn_msg_welcome_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_WELCOME, &rc, err, errlen);
  if (rc == 0) rc = want_bin(s, m, 1, "mac", 0, &out->mac, &out->mac_len, err, errlen);
  if (rc == 0 && at(m, 2)->type != MSGPACK_OBJECT_MAP) rc = bad(s, err, errlen, "info (element 2) is not a map");
  if (rc != 0) return rc;
  /* Keys of info that are absent or of another type are ignored, as clients must. */
  const msgpack_object *h = mn_map_get(at(m, 2), "hostname"), *pid = mn_map_get(at(m, 2), "pid");
  out->host = h && h->type == MSGPACK_OBJECT_STR ? h->via.str.ptr : NULL;
  out->host_len = out->host ? h->via.str.size : 0;
  out->pid = pid && pid->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)pid->via.u64 : 0;
  return 0;
}

int mn_msg_parse_error(const msgpack_object *m, mn_msg_error_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_ERROR, &rc, err, errlen);
  if (rc == 0) rc = want_i64(s, m, 1, "code", &out->code, err, errlen);
  if (rc == 0 && mn_get_str(m, 2, &out->text, &out->text_len) != 0)
    rc = bad(s, err, errlen, "message (element 2) is not a str");
  return rc;
}

int mn_msg_parse_session(const msgpack_object *m, mn_msg_session_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_SESSION, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "id", &out->session, err, errlen);
  if (rc == 0 && out->session == 0) rc = bad(s, err, errlen, "id (element 1) is 0");
  if (rc == 0) rc = want_u64(s, m, 2, "acked", &out->acked, err, errlen);
  out->relay = rc == 0 && m->via.array.size > 3 && at(m, 3)->type == MSGPACK_OBJECT_BOOLEAN && at(m, 3)->via.boolean;
  out->silence_ms = rc == 0 && out->relay ? opt_u64(m, 4) : 0;
  return rc;
}

int mn_msg_parse_ack(const msgpack_object *m, uint64_t *acked, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_ACK, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "acked", acked, err, errlen);
  return rc;
}

int mn_msg_parse_cancel(const msgpack_object *m, const msgpack_object **seqs, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_CANCEL, &rc, err, errlen);
  if (rc != 0) return rc;
  const msgpack_object *a = &m->via.array.ptr[1];
  if (a->type != MSGPACK_OBJECT_ARRAY) return bad(s, err, errlen, "seqs (element 1) is not an array");
  for (uint32_t i = 0; i < a->via.array.size; i++)
    if (a->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return bad(s, err, errlen, "seqs (element 1) holds something other than sequence numbers");
  *seqs = a;
  return 0;
}

int mn_msg_parse_cast(const msgpack_object *m, const msgpack_object **targets, const char **rest, size_t *rlen,
                      char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_CAST, &rc, err, errlen);
  if (rc != 0) return rc;
  const msgpack_object *t = at(m, 1);
  if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size % 3 != 0)
    return bad(s, err, errlen, "targets (element 1) is not an array of (pid, seq, tag) triples");
  for (uint32_t i = 0; i < t->via.array.size; i++)
    if (t->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return bad(s, err, errlen, "targets (element 1) holds something other than uints");
  if (at(m, 2)->type != MSGPACK_OBJECT_BIN) return bad(s, err, errlen, "rest (element 2) is not a bin");
  *targets = t;
  *rest = at(m, 2)->via.bin.ptr;
  *rlen = at(m, 2)->via.bin.size;
  return 0;
}

/* Element el of m, when present: a tree's subs, flat entries of `uints` uints then two arrays (what is
 * below, and that child's own subs). *subs is NULL when absent; each entry's shape is checked, not
 * what lies deeper. */
static int parse_subs(const spec_t *s, const msgpack_object *m, uint32_t el, uint32_t uints, msgpack_object_type what,
                      const char *entries, const char *entry, const msgpack_object **subs, char *err, size_t errlen) {
  uint32_t w = uints + 2;
  *subs = NULL;
  if (m->via.array.size <= el) return 0;
  const msgpack_object *t = at(m, el);
  if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size % w != 0)
    return bad(s, err, errlen, "subs (element %u) is not an array of %s", el, entries);
  for (uint32_t i = 0; i < t->via.array.size; i += w) {
    const msgpack_object *q = &t->via.array.ptr[i];
    int ok = q[uints].type == what && q[uints + 1].type == MSGPACK_OBJECT_ARRAY;
    for (uint32_t u = 0; u < uints; u++) ok &= q[u].type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    if (!ok) return bad(s, err, errlen, "subs (element %u) holds %s", el, entry);
  }
  *subs = t;
  return 0;
}

int mn_msg_parse_cast_subs(const msgpack_object *m, const msgpack_object **subs, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_CAST, &rc, err, errlen);
  *subs = NULL;
  if (rc != 0) return rc;
  return parse_subs(s, m, 3, 2, MSGPACK_OBJECT_ARRAY, "(index, count, targets, subs) quads", "a quad that is not (uint, uint, array, array)",
                    subs, err, errlen);
}

int mn_msg_parse_tree(const msgpack_object *m, uint64_t *epoch, const msgpack_object **children, uint64_t *ping_ms,
                      uint64_t *silence_ms, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_TREE, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "epoch", epoch, err, errlen);
  if (rc != 0) return rc;
  const msgpack_object *t = at(m, 2);
  if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size % 2 != 0)
    return bad(s, err, errlen, "children (element 2) is not an array of (addr, session) pairs");
  for (uint32_t i = 0; i < t->via.array.size; i += 2)
    if (t->via.array.ptr[i].type != MSGPACK_OBJECT_STR || t->via.array.ptr[i].via.str.size >= 300 ||
        t->via.array.ptr[i + 1].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return bad(s, err, errlen, "children (element 2) holds a pair that is not (addr, session)");
  *children = t;
  *ping_ms = opt_u64(m, 3);
  *silence_ms = opt_u64(m, 4);
  return 0;
}

int mn_msg_parse_linked(const msgpack_object *m, uint64_t *epoch, uint64_t *index, int *up, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_LINKED, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "epoch", epoch, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 2, "index", index, err, errlen);
  if (rc == 0 && at(m, 3)->type != MSGPACK_OBJECT_BOOLEAN) rc = bad(s, err, errlen, "up (element 3) is not a bool");
  if (rc == 0) *up = at(m, 3)->via.boolean;
  return rc;
}

int mn_msg_parse_acks(const msgpack_object *m, const msgpack_object **pairs, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_ACKS, &rc, err, errlen);
  if (rc != 0) return rc;
  const msgpack_object *t = at(m, 1);
  if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size % 2 != 0)
    return bad(s, err, errlen, "element 1 is not an array of (pid, acked) pairs");
  for (uint32_t i = 0; i < t->via.array.size; i++)
    if (t->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return bad(s, err, errlen, "element 1 holds something other than uints");
  *pairs = t;
  return 0;
}

int mn_msg_parse_acks_subs(const msgpack_object *m, const msgpack_object **subs, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_ACKS, &rc, err, errlen);
  *subs = NULL;
  if (rc != 0) return rc;
  return parse_subs(s, m, 2, 1, MSGPACK_OBJECT_ARRAY, "(index, pairs, subs) triples", "a triple that is not (uint, array, array)", subs,
                    err, errlen);
}

int mn_msg_parse_results(const msgpack_object *m, uint32_t *n, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_RESULTS, &rc, err, errlen);
  if (rc != 0) return rc;
  uint32_t size = m->via.array.size;
  if (size % 2 != 1) return bad(s, err, errlen, "got %u elements: a tag without its result", size);
  for (uint32_t i = 1; i < size; i += 2) {
    if (at(m, i)->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return bad(s, err, errlen, "tag (element %u) is not a uint", i);
    if (at(m, i + 1)->type != MSGPACK_OBJECT_ARRAY)
      return bad(s, err, errlen, "result (element %u) is not an array", i + 1);
  }
  *n = (size - 1) / 2;
  return 0;
}

int mn_msg_results_open(mn_msg_results_reader_t *r, const char *body, size_t len) {
  if (len < 6 || (uint8_t)body[0] != 0xdd || body[5] != MN_MSG_RESULTS) return MN_EPROTO;
  uint32_t count = mn_be32(body + 1);
  if (count % 2 != 1 || (count - 1) / 2 > (len - 6) / 2) return MN_EPROTO; /* an entry takes 2 bytes or more */
  *r = (mn_msg_results_reader_t){body, len, 6, (count - 1) / 2};
  return 0;
}

/* A msgpack uint at r->off (any width) into *v, advancing; 0, or MN_EPROTO when there is none. */
static int read_uint(mn_msg_results_reader_t *r, uint64_t *v) {
  if (r->off >= r->len) return MN_EPROTO;
  uint8_t b = (uint8_t)r->body[r->off];
  size_t w = b <= 0x7f ? 0 : b >= 0xcc && b <= 0xcf ? (size_t)1 << (b - 0xcc) : SIZE_MAX;
  if (w == SIZE_MAX || r->len - r->off - 1 < w) return MN_EPROTO;
  *v = w == 0 ? b : 0;
  for (size_t i = 1; i <= w; i++) *v = *v << 8 | (uint8_t)r->body[r->off + i];
  r->off += 1 + w;
  return 0;
}

static int quick_result(mn_msg_results_reader_t *r, mn_msg_result_t *out);

int mn_msg_results_skip(mn_msg_results_reader_t *r, uint64_t *tag) {
  mn_msg_result_t res;
  if (r->left == 0 || read_uint(r, tag) != 0 || !quick_result(r, &res)) return 0;
  r->left--;
  return 1;
}

/* [RESULT, seq, ok, []] in the form procs write it, read in place: 1, or 0 (r->off unmoved) for any other form. */
static int quick_result(mn_msg_results_reader_t *r, mn_msg_result_t *out) {
  static const msgpack_object empty = {.type = MSGPACK_OBJECT_ARRAY, .via.array = {0, NULL}};
  size_t at = r->off;
  if (r->len - at < 5 || (uint8_t)r->body[at] != 0x94 || r->body[at + 1] != MN_MSG_RESULT) return 0;
  r->off += 2;
  uint8_t ok;
  if (read_uint(r, &out->seq) != 0 || r->len - r->off < 2 || ((ok = (uint8_t)r->body[r->off]) != 0xc2 && ok != 0xc3) ||
      (uint8_t)r->body[r->off + 1] != 0x90) {
    r->off = at;
    return 0;
  }
  out->ok = ok == 0xc3;
  out->value = &empty;
  r->off += 2;
  return 1;
}

int mn_msg_results_next(mn_msg_results_reader_t *r, msgpack_zone *zone, uint64_t *tag, mn_msg_result_t *out,
                        char *err, size_t errlen) {
  if (r->left == 0) return 0;
  r->left--;
  if (read_uint(r, tag) != 0) {
    snprintf(err, errlen, "malformed RESULTS: want [31, tag, result, ...]; a tag (at byte %zu) is not a uint", r->off);
    return MN_EPROTO;
  }
  if (quick_result(r, out)) return 1;
  msgpack_object m;
  int rc = mn_decode_next(r->body, r->len, &r->off, 1, zone, &m, err, errlen);
  if (rc == 0 && m.type != MSGPACK_OBJECT_ARRAY) {
    snprintf(err, errlen, "malformed RESULTS: want [31, tag, result, ...]; a result is not an array");
    rc = MN_EPROTO;
  }
  if (rc != 0) return rc;
  /* Its value is at depth 2, checked above. A well-formed entry that is no RESULT spoils only itself. */
  return mn_msg_parse_result(&m, out, err, errlen) == 0 ? 1 : MN_EINVAL;
}

int mn_msg_parse_call(const msgpack_object *m, mn_msg_call_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_CALL, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "seq", &out->seq, err, errlen);
  if (rc == 0 && mn_get_str(m, 2, &out->kernel, &out->kernel_len) != 0)
    rc = bad(s, err, errlen, "kernel (element 2) is not a str");
  if (rc == 0 && at(m, 3)->type != MSGPACK_OBJECT_ARRAY) rc = bad(s, err, errlen, "args (element 3) is not an array");
  if (rc == 0) out->args = at(m, 3);
  return rc;
}

int mn_msg_parse_result(const msgpack_object *m, mn_msg_result_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_RESULT, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "seq", &out->seq, err, errlen);
  if (rc == 0 && at(m, 2)->type != MSGPACK_OBJECT_BOOLEAN) rc = bad(s, err, errlen, "ok (element 2) is not a bool");
  if (rc != 0) return rc;
  out->ok = at(m, 2)->via.boolean;
  out->value = at(m, 3);
  return 0;
}

int mn_msg_parse_spawn(const msgpack_object *m, mn_msg_spawn_t *out, char *err, size_t errlen) {
  int rc;
  const spec_t *s = check(m, MN_MSG_SPAWN, &rc, err, errlen);
  if (rc == 0) rc = want_u64(s, m, 1, "req", &out->req, err, errlen);
  if (rc != 0) return rc;
  const msgpack_object *cnt = mn_map_get(at(m, 2), "count");
  if (cnt == NULL || cnt->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return bad(s, err, errlen, "spec (element 2) is not a map with a uint count");
  out->count = cnt->via.u64;
  out->spec = at(m, 2);
  return parse_subs(s, m, 3, 2, MSGPACK_OBJECT_MAP, "(index, req, spec, subs) quads",
                    "a quad that is not (uint, uint, map, array)", &out->subs, err, errlen);
}

int mn_msg_parse_kill(const msgpack_object *m, mn_msg_kill_t *out, char *err, size_t errlen) {
  int rc;
  int64_t sig = 0;
  const spec_t *s = check(m, MN_MSG_KILL, &rc, err, errlen);
  if (rc == 0) rc = want_i64(s, m, 1, "pid", &out->pid, err, errlen);
  if (rc == 0) rc = want_i64(s, m, 2, "signal", &sig, err, errlen);
  if (rc == 0 && (sig < 0 || sig > 64)) rc = bad(s, err, errlen, "signal (element 2) is %lld, not in 0..64", (long long)sig);
  out->sig = (int)sig;
  return rc;
}

int mn_msg_parse_request(const msgpack_object *m, mn_msg_request_t *out, char *err, size_t errlen) {
  int type = mn_msg_type(m), rc;
  if (type != MN_MSG_PERSIST && type != MN_MSG_ATTACH && type != MN_MSG_DETACH && type != MN_MSG_LIST &&
      type != MN_MSG_STATUS) {
    snprintf(err, errlen, "message type %d is not a request to an agent", type);
    return MN_EPROTO;
  }
  const spec_t *s = check(m, type, &rc, err, errlen);
  memset(out, 0, sizeof(*out));
  if (rc == 0) rc = want_u64(s, m, 1, "req", &out->req, err, errlen);
  if (rc != 0 || type == MN_MSG_LIST || type == MN_MSG_STATUS) return rc;
  if (mn_get_str(m, 2, &out->name, &out->name_len) != 0 || out->name_len == 0 || out->name_len > MN_MAX_NAME)
    return bad(s, err, errlen, "name (element 2) is not a str of 1..%d bytes", MN_MAX_NAME);
  if (type == MN_MSG_PERSIST) {
    out->pids = at(m, 3);
    out->description = at(m, 4);
  }
  return 0;
}

int mn_msg_parse_ping(const msgpack_object *m, const msgpack_object **id, char *err, size_t errlen) {
  int rc, type = mn_msg_type(m) == MN_MSG_PONG ? MN_MSG_PONG : MN_MSG_PING;
  (void)check(m, type, &rc, err, errlen);
  if (rc == 0) *id = at(m, 1);
  return rc;
}
