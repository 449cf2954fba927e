/*
 * msg.c - the table of every message (number, name, who sends it, its
 * layout) and the parsers that check a received one against it (msg.h).
 * The builders are in msg_pack.c.
 */
#include "msg.h"

#include <ctype.h>
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
    [MN_MSG_SHIP_ASK] = {"SHIP_ASK", 5, 0, BY_CTL, "[40, hash: bin(32), size, path, place]"},
    [MN_MSG_SHIP_DATA] = {"SHIP_DATA", 7, 0, BY_CTL, "[41, hash: bin(32), size, offset, chunk: bin, self: bool, subs]"},
    [MN_MSG_SHIP_STATE] = {"SHIP_STATE", 4, 0, BY_SERVER, "[42, hash: bin(32), state, detail]"},
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
  const msgpack_object *ec = mn_map_get(at(m, 2), "elf_class"), *em = mn_map_get(at(m, 2), "elf_machine");
  const msgpack_object *sh = mn_map_get(at(m, 2), "ship");
  out->elf_class = ec && ec->type == MSGPACK_OBJECT_POSITIVE_INTEGER && ec->via.u64 < 256 ? (int)ec->via.u64 : 0;
  out->elf_machine = em && em->type == MSGPACK_OBJECT_POSITIVE_INTEGER && em->via.u64 < 65536 ? (int)em->via.u64 : 0;
  out->ship = sh && sh->type == MSGPACK_OBJECT_BOOLEAN ? sh->via.boolean : -1;
  const msgpack_object *ca = mn_map_get(at(m, 2), "cache");
  int id_ok = ca && ca->type == MSGPACK_OBJECT_STR && ca->via.str.size == 32; /* MN_SHIP_ID_LEN (ship.h) */
  for (uint32_t i = 0; id_ok && i < ca->via.str.size; i++) id_ok = isxdigit((unsigned char)ca->via.str.ptr[i]) != 0;
  out->cache = id_ok ? ca->via.str.ptr : NULL;
  out->cache_len = id_ok ? ca->via.str.size : 0;
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
