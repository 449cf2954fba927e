/*
 * msg.h - the protocol's messages: their numbers and names (in one place for
 * C and, as core.MSG, for Lua), the builders that write them and the
 * parsers that check the ones received (the table and the parsers in msg.c,
 * the builders in msg_pack.c). docs/protocol.md describes each.
 *
 * Builders write message heads and fixed fields; a payload (kernel results,
 * Lua values, a description) is packed by its owner after the head, straight
 * into the same buffer, so no message costs an extra allocation or copy.
 * Parsers check the element count and the type of every field they name and
 * point into the decoded object (valid while its zone is); on failure they
 * return MN_EPROTO and write "malformed X: want [layout]; <field> ..." into
 * err. Elements past the last named one are ignored, except where the
 * layout is exact (CALL, RESULT, PERSIST, ATTACH, DETACH, LIST, PING, PONG).
 */
#ifndef MN_MSG_H
#define MN_MSG_H

#include "wire.h"

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  MN_MSG_HELLO = 1,       /* server -> client: version, nonce, role */
  MN_MSG_AUTH = 2,        /* client -> server: version, nonce, mac */
  MN_MSG_WELCOME = 3,     /* server -> client: mac, info */
  MN_MSG_ERROR = 4,       /* either way: code, message; then the sender closes */
  MN_MSG_PING = 5,        /* either way: id */
  MN_MSG_PONG = 6,        /* reply: id */
  MN_MSG_SPAWN = 10,      /* controller -> agent: req, spec */
  MN_MSG_SPAWNED = 11,    /* agent -> controller: req, index, pid, port */
  MN_MSG_SPAWN_FAILED = 12, /* agent -> controller: req, index, message */
  MN_MSG_PROC_EXIT = 13,  /* agent -> controller: pid, exit code, signal name */
  MN_MSG_KILL = 14,       /* controller -> agent: pid, signal number */
  MN_MSG_PERSIST = 15,    /* controller -> agent: req, name, pids, description: keep these procs up */
  MN_MSG_ATTACH = 16,     /* controller -> agent: req, name: take over a persistent mesh */
  MN_MSG_REPLY = 17,      /* agent -> controller: req, ok, value (answers 15, 16, 18, 19) */
  MN_MSG_DETACH = 18,     /* controller -> agent: req, name: let go of a persistent mesh */
  MN_MSG_LIST = 19,       /* controller -> agent: req: the persistent meshes kept here */
  MN_MSG_CALL = 20,       /* controller -> proc: seq, kernel, args */
  MN_MSG_RESULT = 21,     /* proc -> controller: seq, ok, value */
  MN_MSG_SESSION = 22,    /* controller -> agent/proc, first after WELCOME: session id, acked seq */
  MN_MSG_ACK = 24,        /* controller -> proc: highest seq whose RESULT arrived */
  MN_MSG_GOODBYE = 25,    /* controller -> agent: clean exit, stop my procs now */
  MN_MSG_LOG = 26,        /* agent -> controller: rank, stream (1 stdout, 2 stderr), text of whole lines */
  MN_MSG_STATUS = 27,     /* controller -> agent: req; answered by REPLY with the agent's procs and recent exits */
  MN_MSG_PROC_HUNG = 29,  /* agent -> controller: pid, rank, ms: its I/O thread sent no status for that long */
  MN_MSG_CANCEL = 28,     /* controller -> proc: [seq, ...]: stop these calls (queued: skip; running: cancel flag) */
  MN_MSG_CAST = 30,       /* controller -> agent: [pid, seq, tag, ...], the CALL after its seq: one call, many procs */
  MN_MSG_RESULTS = 31,    /* agent -> controller: tag, RESULT, tag, RESULT...: its procs' answers to casts, batched */
  MN_MSG_JOIN = 32,       /* agent -> controller's join port: version, nonce, address to dial, mac */
  MN_MSG_JOINED = 33,     /* controller's join port -> agent: mac; the controller dials the address next */
  MN_MSG_ACKS = 34,       /* controller -> agent: [pid, acked, ...]: ACKs for its procs, handed on over their relays */
  MN_MSG_TREE = 35,       /* controller -> agent: epoch, [addr, session, ...]: the agents it relays casts to */
  MN_MSG_LINKED = 36,     /* agent -> controller: epoch, index, up: its link to child `index` of that TREE came up or went */
  MN_MSG_SHIP_ASK = 40,   /* controller -> agent: hash, size, path, place: does its cache hold this file? (ship.h) */
  MN_MSG_SHIP_DATA = 41,  /* controller -> agent (and down the tree): hash, size, offset, chunk, self, subs */
  MN_MSG_SHIP_STATE = 42, /* agent -> controller: hash, state, detail: what it has of that file now */
} mn_msg_t;

#define MN_MSG_CALL_SEQ_OFFSET 7 /* a CALL frame's seq bytes: len(4) + fixarray(1) + type(1) + 0xcf(1) */
#define MN_MSG_PUT_HEAD 52       /* bytes of a __tensor_put CALL before its payload */
#define MN_MSG_LOST_LEN 23       /* bytes of the `__lost` CALL frame that stands in for a put */
#define MN_MSG_CALL_HEAD 15      /* a CALL frame's bytes up to its kernel name: len, fixarray, type, seq */
#define MN_MSG_RESULTS_HEAD 10   /* a RESULTS frame's bytes before its entries: len, array32 + count, type */
#define MN_MSG_PONG_MAX 32       /* largest PONG frame the proc answers inline (a 28-byte PING body) */

/* ---- the table ------------------------------------------------------------ */

/* The name of a type ("CALL"), or NULL for a number that is not one. */
const char *mn_msg_name(int type);
/* Calls fn for every message type in numeric order (exports to Lua). */
void mn_msg_each(void (*fn)(void *data, int type, const char *name), void *data);
/*
 * Checks a message a controller's script queues whole (core.send): `type`
 * must be one a controller sends and the C side does not keep in step
 * itself (not CALL, SESSION, ACK or GOODBYE), with `nelems` elements, the
 * type included. Returns 0, or MN_EPROTO with the reason in err.
 */
int mn_msg_check_script_send(int64_t type, size_t nelems, char *err, size_t errlen);

/* ---- builders: each appends one whole frame to b; 0 or MN_ENOMEM ---------- */

int mn_msg_pack_error(mn_buf_t *b, int code, const char *msg);
int mn_msg_pack_hello(mn_buf_t *b, const uint8_t nonce_s[32], const char *role);
int mn_msg_pack_auth(mn_buf_t *b, const uint8_t nonce_c[32], const uint8_t mac[32]);
/* info is {hostname, pid, role}. */
int mn_msg_pack_welcome(mn_buf_t *b, const uint8_t mac[32], const char *hostname, int64_t pid, const char *role);
/* An agent's WELCOME: info also says what it runs (ELF class and machine), whether it takes shipped files,
 * and its ship cache's id (cache_id: "" or NULL when it has none; agents that tell one id share one cache). */
int mn_msg_pack_welcome_agent(mn_buf_t *b, const uint8_t mac[32], const char *hostname, int64_t pid, int elf_class,
                              int elf_machine, int ship, const char *cache_id);
int mn_msg_pack_ping(mn_buf_t *b, uint64_t id);
/* The agent's answer: id re-encoded as it came. */
int mn_msg_pack_pong(mn_buf_t *b, const msgpack_object *id);
int mn_msg_pack_session(mn_buf_t *b, uint64_t session, uint64_t acked);
int mn_msg_pack_ack(mn_buf_t *b, uint64_t acked);
/* PROC_HUNG [29, pid, rank, silent_ms]: a proc's I/O thread went quiet (agent -> controller). */
int mn_msg_pack_proc_hung(mn_buf_t *b, int64_t pid, int rank, uint64_t silent_ms);
/* CANCEL [28, [seq, ...]]: stop these calls of the session (controller -> proc). */
int mn_msg_pack_cancel(mn_buf_t *b, const uint64_t *seqs, size_t n);
int mn_msg_pack_goodbye(mn_buf_t *b);
int mn_msg_pack_spawned(mn_buf_t *b, uint64_t req, int index, int64_t pid, int port);
int mn_msg_pack_spawn_failed(mn_buf_t *b, uint64_t req, int index, const char *msg);
/* signal: a short name ("KILL"), "" for none. */
int mn_msg_pack_proc_exit(mn_buf_t *b, int64_t pid, int64_t status, const char *signal, int rank);
int mn_msg_pack_log(mn_buf_t *b, int rank, int stream, const char *text, size_t n);

/*
 * CAST [30, targets, rest]: one call for several procs of an agent. targets
 * holds n (pid, seq, tag) triples, flat; rest is the CALL's bytes after its
 * seq (kernel name and args), as a bin. The agent hands each proc
 * [CALL, seq, ...rest] and answers with RESULTS, naming each result by tag.
 */
int mn_msg_pack_cast(mn_buf_t *b, const uint64_t *targets, size_t n, const char *rest, size_t rlen);
/*
 * A CAST through the tree, [30, targets, rest, subs]: subs is flat
 * (index, count, targets, subs) quads, one per child of the agent (index in
 * its TREE) with targets below it; count is every triple in that subtree.
 * The caller packs subs after this head; 0 or MN_ENOMEM.
 */
int mn_msg_cast_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint64_t *targets, size_t n,
                     const char *rest, size_t rlen, uint32_t nsubs);
/* Packs n uints straight into b (a cast's or ACKS's flat lists, not a packer callback per value); 0 or MN_ENOMEM. */
int mn_msg_pack_uints(mn_buf_t *b, const uint64_t *v, size_t n);
/* The same from decoded parts (an agent handing a sub-cast on): targets and subs as they came. */
int mn_msg_pack_cast_obj(mn_buf_t *b, const msgpack_object *targets, const char *rest, size_t rlen,
                         const msgpack_object *subs);
/*
 * SPAWN through the tree, [10, req, spec, subs]: subs is flat (index, req, spec, subs) quads, one per
 * child (index in its TREE) with a spawn at or below it; an agent on the way with none of its own gets
 * req 0 and spec {count = 0}. This writes the frame's head; the caller packs the rest and ends the frame.
 * 0 or MN_ENOMEM.
 */
int mn_msg_spawn_head(mn_buf_t *b, msgpack_packer *pk, size_t *start);
/* [10, req, spec] from body, req and spec packed one after the other: a spawn sent to its agent directly. */
int mn_msg_pack_spawn_body(mn_buf_t *b, const char *body, size_t blen);
/* A sub-spawn handed on by an agent: [10, req, spec, subs] from its decoded parts. */
int mn_msg_pack_spawn_obj(mn_buf_t *b, uint64_t req, const msgpack_object *spec, const msgpack_object *subs);
/* TREE [35, epoch, [addr, session, ...], ping_ms, silence_ms]: n children, addrs "host:port"; the parent
 * PINGs each child's link every ping_ms and reports it lost (LINKED false) after silence_ms without an answer. */
int mn_msg_pack_tree(mn_buf_t *b, uint64_t epoch, const char *const *addrs, const uint64_t *sessions, size_t n,
                     uint64_t ping_ms, uint64_t silence_ms);
/* LINKED [36, epoch, index, up]. */
int mn_msg_pack_linked(mn_buf_t *b, uint64_t epoch, uint64_t index, int up);
/* SESSION with element 3 set: the relay link a parent agent opens to a child for session `session`;
 * element 4, the silence after which the parent gives up on the link (the child then drops it too). */
int mn_msg_pack_relay_session(mn_buf_t *b, uint64_t session, uint64_t silence_ms);
/* The head of [CALL, seq, ...rest] for a rest of rlen bytes (the agent's copy of a cast); MN_MSG_CALL_HEAD bytes. */
void mn_msg_call_from_cast(char out[MN_MSG_CALL_HEAD], uint64_t seq, size_t rlen);
/*
 * RESULTS [31, tag, result, tag, result, ...]: begin reserves the head in an
 * empty b; add appends one (tag, RESULT body); end writes the head for n
 * entries. 0 or MN_ENOMEM.
 */
int mn_msg_results_begin(mn_buf_t *b);
int mn_msg_results_add(mn_buf_t *b, uint64_t tag, const char *result, size_t len);
void mn_msg_results_end(mn_buf_t *b, uint32_t n);

/* ACKS [34, [pid, acked, ...]]: n (pid, acked) pairs, flat; the agent gives each proc [ACK, acked] on its relay. */
int mn_msg_pack_acks(mn_buf_t *b, const uint64_t *pairs, size_t n);
/* ACKS through the tree, [34, pairs, subs]: subs is flat (index, pairs, subs) triples, one per child with
 * ACKs below it. The caller packs subs after this head; 0 or MN_ENOMEM. */
int mn_msg_acks_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint64_t *pairs, size_t n, uint32_t nsubs);
/* The same from decoded parts (an agent handing ACKs on to a child). */
int mn_msg_pack_acks_obj(mn_buf_t *b, const msgpack_object *pairs, const msgpack_object *subs);

/* JOIN [32, version, nonce_a, addr, mac]: a host agent asks a controller to dial it at addr ("HOST:PORT"). */
int mn_msg_pack_join(mn_buf_t *b, const uint8_t nonce_a[32], const char *addr, const uint8_t mac[32]);
/* JOINED [33, mac]: the controller's answer, proving it holds the token too. */
int mn_msg_pack_joined(mn_buf_t *b, const uint8_t mac[32]);

/* The old name of mn_msg_pack_error. */
static inline int mn_pack_error(mn_buf_t *b, int code, const char *msg) { return mn_msg_pack_error(b, code, msg); }

/*
 * The proc's inline PONG: if ping (a frame body) is [PING, id] with a body of
 * at most MN_MSG_PONG_MAX - 4 bytes, writes the same frame with PONG for
 * PING into out, without decoding id, and returns its length; else 0.
 */
size_t mn_msg_pong_from_ping(char out[MN_MSG_PONG_MAX], const char *ping, size_t len);

/*
 * The `__lost` CALL with this seq, [CALL, seq, "__lost", []], which a
 * reconnect resends in place of a put whose payload is gone. Returns
 * MN_MSG_LOST_LEN.
 */
size_t mn_msg_lost_call(char out[MN_MSG_LOST_LEN], uint64_t seq);

/*
 * The head of [CALL, seq, "__tensor_put", [tensor, offset, bin(len)]] up to
 * the bin's bytes, with its frame length counting len more; seq is 0 at
 * MN_MSG_CALL_SEQ_OFFSET (mn_msg_set_seq). Returns MN_MSG_PUT_HEAD.
 */
size_t mn_msg_put_head(char out[MN_MSG_PUT_HEAD], uint64_t tensor, uint64_t offset, uint32_t len);

/* ---- heads: the caller packs the rest with pk, then mn_frame_end(b, start) */

/*
 * Starts [CALL, seq, kernel, args] in b, up to the args array header for
 * nargs arguments, with seq written as a uint64 0 at start +
 * MN_MSG_CALL_SEQ_OFFSET, so that one encoding serves every target
 * (mn_msg_set_seq). Initialises pk over b. Returns the frame's start.
 */
size_t mn_msg_call_head(mn_buf_t *b, msgpack_packer *pk, const char *kernel, size_t kl, uint32_t nargs);
/* Starts [RESULT, seq, ok, ...]; the caller packs the value. Initialises pk over b. */
size_t mn_msg_result_head(mn_buf_t *b, msgpack_packer *pk, uint64_t seq, int ok);
/* The value of a failed RESULT: {kind, message, kernel} (kernel NULL: {kind, message}), packed with pk. */
void mn_msg_pack_failure(msgpack_packer *pk, const char *kind, const char *message, const char *kernel, size_t klen);
/* Starts [REPLY, req, ok, ...]; the caller packs the value. Initialises pk over b. */
size_t mn_msg_reply_head(mn_buf_t *b, msgpack_packer *pk, uint64_t req, int ok);

/* Writes seq into a CALL frame built by mn_msg_call_head or mn_msg_put_head. */
static inline void mn_msg_set_seq(char *frame, uint64_t seq) {
  for (int j = 7; j >= 0; j--, seq >>= 8) frame[MN_MSG_CALL_SEQ_OFFSET + j] = (char)seq;
}

/* ---- parsers: fill *out from a decoded message; 0 or MN_EPROTO ------------ */

typedef struct {
  uint64_t version;
  const uint8_t *nonce; /* 32 bytes */
  const char *role;
  size_t role_len;
} mn_msg_hello_t;

typedef struct {
  uint64_t version;
  const uint8_t *nonce; /* 32 bytes */
  const uint8_t *mac;
  size_t mac_len;       /* checked by the MAC comparison, not here */
} mn_msg_auth_t;

typedef struct {
  const uint8_t *mac;
  size_t mac_len;
  const char *host;     /* info.hostname, NULL if absent or not a str */
  size_t host_len;
  int64_t pid;          /* info.pid, 0 if absent or not a uint */
  int elf_class;        /* info.elf_class (1: 32-bit, 2: 64-bit), 0 if absent (an agent before shipping) */
  int elf_machine;      /* info.elf_machine (e_machine of the agent's own binary), 0 if absent */
  int ship;             /* info.ship: 1 it takes shipped files, 0 --no-ship, -1 absent (an older agent) */
  const char *cache;    /* info.cache: its ship cache's id (MN_SHIP_ID_LEN hex digits), NULL if absent or not one */
  size_t cache_len;
} mn_msg_welcome_t;

typedef struct {
  int64_t code;
  const char *text;
  size_t text_len;
} mn_msg_error_t;

typedef struct {
  uint64_t session;     /* never 0 */
  uint64_t acked;
  int relay;            /* element 3, optional: 1 when a parent agent opens a relay link for casts, not a controller */
  uint64_t silence_ms;  /* element 4, optional (0): a relay link silent this long is given up by its parent */
} mn_msg_session_t;

typedef struct {
  uint64_t seq;
  const char *kernel;
  size_t kernel_len;
  const msgpack_object *args; /* an array */
} mn_msg_call_t;

typedef struct {
  uint64_t seq;
  int ok;
  const msgpack_object *value;
} mn_msg_result_t;

typedef struct {
  uint64_t req;
  uint64_t count;
  const msgpack_object *spec; /* the map, for the optional keys */
  const msgpack_object *subs; /* through the cast tree: (index, req, spec, subs) quads for the children; NULL if absent */
} mn_msg_spawn_t;

typedef struct {
  int64_t pid;
  int sig;              /* 0..64 */
} mn_msg_kill_t;

/* PERSIST, ATTACH, DETACH, LIST and STATUS: a request to an agent. */
typedef struct {
  uint64_t req;
  const char *name;     /* 1..MN_MAX_NAME bytes (PERSIST, ATTACH, DETACH), else NULL */
  size_t name_len;
  const msgpack_object *pids;        /* PERSIST: an array */
  const msgpack_object *description; /* PERSIST: any value */
} mn_msg_request_t;

typedef struct {
  uint64_t version;
  const uint8_t *nonce; /* 32 bytes */
  const char *addr;     /* 1..MN_MSG_JOIN_MAX_ADDR bytes, not NUL-terminated; its form is checked by join.c */
  size_t addr_len;
  const uint8_t *mac;
  size_t mac_len;       /* checked by the MAC comparison, not here */
} mn_msg_join_t;

#define MN_MSG_JOIN_MAX_ADDR 280 /* longest "HOST:PORT" a JOIN may carry: an IPv6 address in brackets fits */

int mn_msg_parse_hello(const msgpack_object *m, mn_msg_hello_t *out, char *err, size_t errlen);
int mn_msg_parse_auth(const msgpack_object *m, mn_msg_auth_t *out, char *err, size_t errlen);
int mn_msg_parse_welcome(const msgpack_object *m, mn_msg_welcome_t *out, char *err, size_t errlen);
int mn_msg_parse_error(const msgpack_object *m, mn_msg_error_t *out, char *err, size_t errlen);
int mn_msg_parse_session(const msgpack_object *m, mn_msg_session_t *out, char *err, size_t errlen);
int mn_msg_parse_ack(const msgpack_object *m, uint64_t *acked, char *err, size_t errlen);
/* CANCEL: sets *seqs to its array of sequence numbers (every element checked to be one). */
int mn_msg_parse_cancel(const msgpack_object *m, const msgpack_object **seqs, char *err, size_t errlen);
int mn_msg_parse_call(const msgpack_object *m, mn_msg_call_t *out, char *err, size_t errlen);
int mn_msg_parse_result(const msgpack_object *m, mn_msg_result_t *out, char *err, size_t errlen);
int mn_msg_parse_spawn(const msgpack_object *m, mn_msg_spawn_t *out, char *err, size_t errlen);
int mn_msg_parse_kill(const msgpack_object *m, mn_msg_kill_t *out, char *err, size_t errlen);
/* Any of PERSIST, ATTACH, DETACH, LIST, STATUS, by m's type. */
int mn_msg_parse_request(const msgpack_object *m, mn_msg_request_t *out, char *err, size_t errlen);
/* CAST: *targets (an array of 3n uints), *rest and *rlen (its bin). */
int mn_msg_parse_cast(const msgpack_object *m, const msgpack_object **targets, const char **rest, size_t *rlen,
                      char *err, size_t errlen);
/* CAST's subs: *subs, the flat quads (NULL when absent); each quad's shape checked, not what lies deeper. */
int mn_msg_parse_cast_subs(const msgpack_object *m, const msgpack_object **subs, char *err, size_t errlen);
/* TREE: *epoch and *children, an array of 2n (addr str, session uint); *ping_ms and *silence_ms, 0 if absent. */
int mn_msg_parse_tree(const msgpack_object *m, uint64_t *epoch, const msgpack_object **children, uint64_t *ping_ms,
                      uint64_t *silence_ms, char *err, size_t errlen);
int mn_msg_parse_linked(const msgpack_object *m, uint64_t *epoch, uint64_t *index, int *up, char *err, size_t errlen);
/* ACKS: *pairs (an array of 2n uints). */
int mn_msg_parse_acks(const msgpack_object *m, const msgpack_object **pairs, char *err, size_t errlen);
/* ACKS's subs: *subs, the flat (index, pairs, subs) triples (NULL when absent); each triple's shape checked. */
int mn_msg_parse_acks_subs(const msgpack_object *m, const msgpack_object **subs, char *err, size_t errlen);
/* RESULTS: *n entries, entry i being tag (element 1 + 2i, a uint) and a RESULT (element 2 + 2i, an array). */
int mn_msg_parse_results(const msgpack_object *m, uint32_t *n, char *err, size_t errlen);

/*
 * A RESULTS frame read entry by entry instead of decoded whole: the
 * controller's hot path, where one frame carries a host's answers. Only a
 * value that is not [] (a kernel that returned nothing) is decoded, into
 * the caller's zone; every element is checked as mn_decode and the RESULT
 * parser would.
 */
typedef struct {
  const char *body;
  size_t len, off;
  uint32_t left; /* entries not read yet */
} mn_msg_results_reader_t;

/* Starts reading body (len bytes) if it is a RESULTS frame with an array32 head (as the agent writes
 * them): 0, or MN_EPROTO when it is not one (decode it whole instead). */
int mn_msg_results_open(mn_msg_results_reader_t *r, const char *body, size_t len);
/* The next entry: its tag and its RESULT in *out (value valid while zone is). Returns 1, 0 when none is
 * left, MN_EINVAL with err when this entry's result is not a RESULT (*tag is set; reading can go on),
 * or another MN_E* code with err (the frame is malformed from there on). */
int mn_msg_results_next(mn_msg_results_reader_t *r, msgpack_zone *zone, uint64_t *tag, mn_msg_result_t *out,
                        char *err, size_t errlen);
/* Moves r past its next entry when that is a RESULT in the quick form (a kernel that returned nothing),
 * with its tag in *tag: 1. Else 0, and r is left where it stopped: a scout reading ahead of next() (for
 * the caller to prefetch what the tags name) gives up there; next() still checks every entry. */
int mn_msg_results_skip(mn_msg_results_reader_t *r, uint64_t *tag);
int mn_msg_parse_join(const msgpack_object *m, mn_msg_join_t *out, char *err, size_t errlen);
/* JOINED: *mac and *mac_len (its length is checked by the MAC comparison). */
int mn_msg_parse_joined(const msgpack_object *m, const uint8_t **mac, size_t *mac_len, char *err, size_t errlen);
/* PING and PONG: [type, id], exactly; *id is any value. */
int mn_msg_parse_ping(const msgpack_object *m, const msgpack_object **id, char *err, size_t errlen);

#endif
