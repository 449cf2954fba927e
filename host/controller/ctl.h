/*
 * ctl.h - the controller's connections, in C.
 *
 * One libuv loop and a table of connections (host agents and procs), each a
 * client that authenticates with the cluster token. Calls are appended to a
 * connection's output buffer and written before the loop sleeps; replies stay
 * in the connection's input buffer until the Lua side drains them, so libuv
 * never calls into Lua. Each connection keeps a FIFO of the calls in flight:
 * a proc answers in order, so a RESULT always matches the oldest entry.
 */
#ifndef MN_CTL_H
#define MN_CTL_H

#include "auth.h"
#include "wire.h"

#include <uv.h>

#define MN_MAX_CONNS 65536 /* most connections one controller may open */

typedef enum { MN_CONN_AGENT = 0, MN_CONN_PROC = 1 } mn_conn_kind_t;
typedef enum {
  MN_CS_CONNECTING = 0,
  MN_CS_HELLO,        /* TCP up, waiting for HELLO */
  MN_CS_WELCOME,      /* AUTH sent, waiting for WELCOME */
  MN_CS_READY,
  MN_CS_RECONNECTING, /* lost; retrying with backoff inside the reconnect window */
  MN_CS_CLOSED
} mn_conn_state_t;

typedef enum {
  MN_EV_CONNECTED = 1,
  MN_EV_CLOSED,
  MN_EV_AGENT_EXIT,
  MN_EV_RECONNECTING,
  MN_EV_RECONNECTED
} mn_ev_kind_t;

#define MN_HEARTBEAT_MS 500         /* default interval between PINGs to every peer */
#define MN_HEARTBEAT_TIMEOUT_MS 3000 /* default silence after which a connection is lost */
#define MN_ACK_TICKS 4              /* procs' ACKs (and handshake checks) go every this many heartbeats */
#define MN_RECONNECT_MS 5000        /* default window for reconnecting a lost connection */
#define MN_BACKOFF_MIN_MS 50        /* first reconnect delay; doubles per attempt */
#define MN_BACKOFF_MAX_MS 1000      /* longest reconnect delay */
#define MN_REFUSED_MS 300           /* an agent's address that refuses for this long has no agent: the host is lost */
#define MN_HB_PING_BASE (1ull << 40) /* PING ids at or above this are heartbeats, not Lua pings */

typedef struct mn_cast_rest_s mn_cast_rest_t;

typedef struct {
  double call;  /* Lua call id */
  int32_t slot; /* index of this proc in the call's targets */
  int32_t relay; /* sent through the proc's agent (a cast) */
  mn_cast_rest_t *rest; /* a relayed call's bytes after its seq, shared by the cast's procs (ctl_cast.c) */
} mn_pending_t;

typedef struct mn_ctl_s mn_ctl_t;
/* A connection: opaque, owned by ctl.c (its buffers, pending FIFO and state). */
typedef struct mn_conn_s mn_conn_t;

/* What happened to a connection, in the order mn_ctl_events() reports it. */
typedef struct {
  mn_ev_kind_t kind;
  int conn;      /* 0 for MN_EV_AGENT_EXIT */
  int64_t a, b;  /* CONNECTED, RECONNECTED: a = pid; AGENT_EXIT: a = status, b = signal */
} mn_event_t;

/* A connection as the script sees it; the strings live until the next ctl call. */
typedef struct {
  mn_conn_kind_t kind;
  mn_conn_state_t state;
  const char *state_name; /* "connecting", "handshake", "ready", "reconnecting", "closed" */
  const char *host;       /* WELCOME's hostname, else the host dialled */
  int64_t pid;            /* WELCOME's pid */
  const char *reason;     /* why it closed or is reconnecting */
  size_t inflight;        /* calls sent and not answered */
  int direct;             /* a pooled proc (ctl_pool.c): 1 while its link is up, else 0; -1: not pooled */
  int elf_class, elf_machine, ship; /* an agent's WELCOME (mn_msg_welcome_t); 0, 0, -1 for others */
  const char *cache_id;   /* an agent's ship cache id, "" if none: agents telling one id share one cache */
} mn_conn_info_t;

struct mn_ctl_s {
  uv_loop_t loop;
  mn_auth_t auth;
  mn_conn_t **conns; /* by id; index 0 unused */
  int nconns;
  mn_conn_t *slab;      /* the current block of conns, handed out in id order (ctl_slab.c) */
  int slab_used, slab_cap;
  size_t slab_bytes;    /* the blocks mapped outside malloc (its counts do not see them) */
  void **slabs;         /* every block, freed at the end (a conn lives as long as ctl) */
  int nslabs;
  int *dirty, ndirty;
  int *readable, nreadable, readable_at; /* connections with frames to read; the next to hand out */
  mn_event_t *events;
  size_t nevents, evcap;
  uv_timer_t timer;
  uv_timer_t heartbeat;
  uint64_t hb_ms, hb_timeout_ms, reconnect_ms;
  uint64_t hb_count;
  uint64_t last_tick;   /* uv_now of the previous heartbeat, to notice our own stalls */
  int *released;        /* payload refs whose writes are over */
  int nreleased, released_cap;
  int no_acks;          /* MONARCH_NO_ACK=1: no unacked copies (to measure their cost) */
  int proc_heartbeats;  /* MONARCH_PROC_HEARTBEAT=1: PING procs too (their agents watch them otherwise) */
  uv_process_t agent;   /* the embedded local agent, when started */
  int agent_running;
  int agent_port;
  uv_pipe_t agent_pipe;
  char agent_buf[32];
  size_t agent_blen;
  int closing;
  int *casting, ncasting; /* agents with a cast gathered (ctl_cast.c) */
  int tree_routed;        /* agents whose casts go through their parent now (ctl_tree.c) */
  uint64_t tree_resent;   /* relayed calls taken off the tree and resent since the start */
  mn_buf_t gathered;      /* the batch's uints, one run per agent while its procs come together (ctl_cast.c) */
  int gather_last;        /* the agent the last uints gathered were for */
  int *agent_ids, nagent_ids, agent_ids_cap; /* the agents' conn ids: most heartbeats visit only these */
  uint64_t casts, cast_calls; /* CAST frames sent, and the calls they carried (core.cast_stats) */
  uint64_t agent_pings;       /* PINGs written to host agents (core.cast_stats: the tree vouches for the rest) */
  int cast_min;           /* a call to this many procs or more is cast (MN_CAST_MIN_TARGETS) */
  int fanout;             /* past this many agents, casts go through a tree of them (ctl_tree.c); 0: never */
  int tree_k;             /* the fan-out the current tree was built for: a new `fanout` holds from its rebuild */
  int *tree, ntree;       /* agent conn ids by tree position */
  int tree_roots;         /* positions 0 .. tree_roots-1 are cast to by the controller itself */
  uint64_t tree_epoch;    /* bumped per rebuild; named in TREE and LINKED */
  int tree_dirty;         /* the agents changed since the last rebuild */
  int *touched, ntouched; /* agents the cast being sent touched */
  int ans_via;            /* answers through the tree not yet taken off their route's counts: their agent, */
  uint32_t ans_n;         /* and how many (a RESULTS frame brings each agent's procs together) */
  mn_cast_rest_t *cur_rest; /* the cast being gathered: its bytes after the seq, shared by its relayed calls */
  int direct_max;           /* most pooled procs' links open at once (ctl_pool.c; MN_DIRECT_MAX) */
  uint64_t direct_idle_ms;  /* a pooled link unused this long closes (MN_DIRECT_IDLE_MS) */
  int *pool, npool, pool_cap; /* pooled procs with a link open or opening, by conn id */
  int *pool_waitq, nwaitq, waitq_at, waitq_cap; /* pooled procs waiting for a link, oldest first */
  uint64_t pool_opened, pool_closed; /* pooled links opened and closed since the start (core.cast_stats) */
  int *spawning, nspawning; /* agents whose spawn goes through the tree, gathered (ctl_spawn.c) */
  uint64_t spawn_relayed, spawn_resent; /* spawns sent through the tree, and sent again directly (core.cast_stats) */
  uint64_t ship_bytes, ship_frames; /* shipped file bytes this controller wrote, and their SHIP_DATA frames (ctl_ship.c) */
};

/*
 * Shipping (ctl_ship.c). One chunk [offset, offset + len) of a file of `size` bytes with `hash`, for the
 * agents ids[0..n): each gets it through its parents in the cast tree where their links are up (the
 * controller writes one frame per top agent), or, with direct, on its own connection. 0 or MN_ENOMEM.
 */
int mn_ctl_ship_data(mn_ctl_t *c, const int *ids, int n, const uint8_t *hash, uint64_t size, uint64_t offset,
                     const char *chunk, size_t len, int direct);
/* Bytes queued and not yet written to every agent: what a sender waits on before its next chunk. */
size_t mn_ctl_agents_pending(mn_ctl_t *c);

/* 0, or MN_EAUTH (a bad token) or MN_ENOMEM. */
int mn_ctl_init(mn_ctl_t *c, const char *token, size_t toklen);
/* Closes every connection, stops the local agent and frees everything. */
void mn_ctl_close(mn_ctl_t *c);

/* Starts connecting; returns the new connection id (> 0) or a negative code.
 * A lost connection is retried for c->reconnect_ms before it is closed. */
int mn_ctl_connect(mn_ctl_t *c, const char *host, int port, mn_conn_kind_t kind);
/* Sets heartbeat interval, silence timeout and reconnect window (ms; 0 keeps). */
void mn_ctl_configure(mn_ctl_t *c, uint64_t hb_ms, uint64_t hb_timeout_ms, uint64_t reconnect_ms);
void mn_ctl_disconnect(mn_ctl_t *c, int id, const char *reason);
static inline mn_conn_t *mn_ctl_conn(mn_ctl_t *c, int id) { return id > 0 && id <= c->nconns ? c->conns[id] : NULL; }

/* Queues a whole frame (copied) and marks the connection dirty; for a pooled proc whose link is not up, it
 * waits for the link, which is asked for (ctl_pool.c). 0 or MN_ENOMEM. */
int mn_ctl_send(mn_ctl_t *c, mn_conn_t *conn, const char *frame, size_t n);
/*
 * Queues a CALL frame for a proc (built by mn_msg_call_head): gives it the
 * next sequence number (mn_msg_set_seq), keeps a copy until its RESULT
 * arrives and records (call, slot) as pending. Works while reconnecting too.
 * Returns 0 or MN_ENOMEM.
 */
int mn_ctl_call(mn_ctl_t *c, mn_conn_t *conn, char *frame, size_t n, double call, int32_t slot);
/*
 * Queues a CALL whose last bytes are a large payload written straight from
 * the caller's memory (no copy): `head` (n bytes, a frame prefix ending in
 * a bin header, from mn_msg_put_head) is copied, `payload` is referenced until written, then
 * `ref` is reported by mn_ctl_take_released(). Needs a ready connection.
 * A reconnect cannot resend the payload: its CALL is replaced by one that
 * fails with kind "lost" unless the proc already ran it. Returns 0, or
 * MN_ECLOSED (conn is not ready, or is a pooled proc whose link is not up:
 * it is asked for, mn_ctl_pool_linked) or MN_ENOMEM.
 */
int mn_ctl_call_bulk(mn_ctl_t *c, mn_conn_t *conn, char *head, size_t n, const char *payload, size_t plen,
                     int ref, double call, int32_t slot);
/* Hands out refs whose payload writes finished; returns how many (at most max). */
int mn_ctl_take_released(mn_ctl_t *c, int *refs, int max);

/* ---- what a connection holds, for the Lua face -------------------------------- */

/* Fills *out; returns 0, or MN_EPROTO when there is no connection `id`. */
int mn_ctl_info(mn_ctl_t *c, int id, mn_conn_info_t *out);
mn_conn_state_t mn_ctl_conn_state(const mn_conn_t *conn);
mn_conn_kind_t mn_ctl_conn_kind(const mn_conn_t *conn);
/* Calls sent to conn and not answered yet. */
size_t mn_ctl_inflight(const mn_conn_t *conn);
/* What a RESULT's seq is to its conn (mn_ctl_take_result); the values are those its callers knew as 0, 1, -code. */
typedef enum {
  MN_TAKE_ANSWERED = 0,       /* the oldest call in flight: taken */
  MN_TAKE_SECOND = 1,         /* answered already (a resent call, answered both ways): to be ignored */
  MN_TAKE_STRAY = MN_EPROTO   /* no call in flight has it: nothing taken, the peer is at fault */
} mn_take_t;
/*
 * A RESULT for `seq` arrived on conn: if it answers the oldest call in
 * flight (procs answer in order), pops that call's (call, slot) into *out,
 * drops its frame copy and returns MN_TAKE_ANSWERED; MN_TAKE_SECOND if seq
 * was answered already (a call resent after a reconnect, answered both
 * through the proc's agent and directly); otherwise MN_TAKE_STRAY.
 */
mn_take_t mn_ctl_take_result(mn_conn_t *conn, uint64_t seq, mn_pending_t *out);
/*
 * Asks the proc to stop every call of Lua call `call` still in flight on
 * conn (CANCEL with their sequence numbers). Their RESULTs still come, in
 * order. Returns how many calls were named (0: none in flight), or a
 * negative code.
 */
int mn_ctl_cancel(mn_ctl_t *c, mn_conn_t *conn, double call);
/* The oldest unanswered call (the one the proc runs now) into *out: 0, or MN_ENOTFOUND when none. */
int mn_ctl_oldest(const mn_conn_t *conn, mn_pending_t *out);
/* Pops the oldest unanswered call into *out; returns 1, or 0 when none is left (never fails). */
int mn_ctl_take_pending(mn_conn_t *conn, mn_pending_t *out);

/* ---- casts through host agents (ctl_cast.c) ---- */

/* Calls to fewer procs go straight to each (monarch.configure{cast_min = n} changes it): below this the
 * agent's extra hop costs more latency than it saves (bench/core.lua on 2 cores: 8 local procs gathered in
 * 141 us directly, 178 us through their agent; 16 in about the same; 32 in 622 and 543). */
#define MN_CAST_MIN_TARGETS 16
#define MN_TREE_FANOUT 16      /* default fanout (monarch.configure{fanout = k}) */
#define MN_TREE_MAX_FANOUT 64
/* LINKED from agent conn a: its link to a child came up or went. 0 or MN_EPROTO (err says why). */
int mn_ctl_take_linked(mn_ctl_t *c, mn_conn_t *a, const msgpack_object *m, char *err, size_t errlen);
/* What of conn id to start loading from memory: a cast's targets and its answers touch thousands of
 * conns, each a cache miss otherwise, so a loop over them fetches each in stages, further ahead for
 * what the nearer stages need loaded: its hot fields, then its pending ring's slot (the next free one
 * to send, the oldest to answer) and its agent's conn, then its agent's own part. */
typedef enum { MN_PF_CONN, MN_PF_SEND, MN_PF_ANSWER, MN_PF_AGENT } mn_prefetch_t;
void mn_ctl_prefetch(mn_ctl_t *c, uint64_t id, mn_prefetch_t what);
/*
 * A spawn for agent conn a: body is its SPAWN's req and spec, packed one after the other. It goes directly
 * now, or, where a cast would go through a's parent, is gathered for mn_ctl_spawn_end, which sends the
 * gathered ones down the tree (ctl_spawn.c). 0, MN_EPROTO (a is no agent, or req is 0) or MN_ENOMEM.
 */
int mn_ctl_spawn_add(mn_ctl_t *c, mn_conn_t *a, uint64_t req, const char *body, size_t n);
int mn_ctl_spawn_end(mn_ctl_t *c);
/* Rebuilds the tree if the agents changed and no cast is being gathered; returns mn_ctl_tree_wanted. */
int mn_ctl_tree_build(mn_ctl_t *c);
/* The parent links the current tree has (every agent's but the top ones'); 0 while it is not active. */
int mn_ctl_tree_wanted(const mn_ctl_t *c);
/* SPAWNED or SPAWN_FAILED m came from agent conn a: a spawn kept for it is answered. */
void mn_ctl_spawn_answered(mn_conn_t *a, const msgpack_object *m);
/* The tree now: whether casts use it, agents whose parent link is up, agents cast to through their parent. */
void mn_ctl_tree_stats(mn_ctl_t *c, int *active, int *up, int *routed, int *vouched);

/*
 * Lets agent conn `agent` relay casts to proc conn `proc`, which it knows
 * as `pid` (it spawned it). MONARCH_RELAY=0 turns casts off (every call
 * then goes straight to each proc, as to measure the difference).
 */
void mn_ctl_set_relay(mn_ctl_t *c, mn_conn_t *proc, int agent, int64_t pid);
/*
 * Queues a CALL (frame and n as for mn_ctl_call) to conn as part of a cast:
 * through its agent when `prefer` (a mesh-wide call) and nothing is in
 * flight on its own link, or when calls are in flight through the agent
 * already (order per proc holds: a proc's calls in flight all go one way);
 * else on its own link, as mn_ctl_call. 0 or MN_ENOMEM. mn_ctl_cast_end
 * sends what was gathered.
 */
int mn_ctl_cast_add(mn_ctl_t *c, mn_conn_t *conn, char *frame, size_t n, double call, int32_t slot, int prefer);
/* Sends one CAST frame to each agent with procs gathered, sharing frame's bytes after its seq. 0 or MN_ENOMEM. */
int mn_ctl_cast_end(mn_ctl_t *c, const char *frame, size_t n);
/* Calls in flight to conn through its agent (a bulk put waits until none is). */
size_t mn_ctl_relayed(const mn_conn_t *conn);
/* The proc conn that agent conn `agent` names `tag` in a RESULTS frame, or NULL if it relays no such proc. */
mn_conn_t *mn_ctl_relayed_conn(mn_ctl_t *c, int agent, uint64_t tag);

/* ---- pooled procs (ctl_pool.c) ---- */

#define MN_DIRECT_MAX 256        /* default most pooled links open at once (monarch.configure{direct_max = n}) */
#define MN_DIRECT_IDLE_MS 30000  /* default idle time after which a pooled link closes (direct_idle = s) */
#define MN_POOL_HOLD_MS 1000     /* a link used this recently is not closed for a call's want (at most direct_idle / 2) */
#define MN_POOL_RETRY_MS 100     /* a pooled link that failed is not dialled again sooner */

/*
 * A proc of a large mesh: like mn_ctl_connect, but its link is one of a
 * capped pool. Its first link opens when the pool has room and carries its
 * SESSION; it then closes once idle, and opens again on demand: calls to
 * fewer than cast_min procs want it (they go through agent conn `agent`,
 * which knows the proc as `pid`, while it opens), CANCEL, messages and bulk
 * puts wait for it. Losing that link is no loss of the proc (its agent
 * reports deaths): its calls go through the agent. Without casts
 * (MONARCH_RELAY=0) it is a plain connection. Returns the id or a negative code.
 */
int mn_ctl_connect_pooled(mn_ctl_t *c, const char *host, int port, int agent, int64_t pid);
/* Pooled conn k's link is up: 1 (a plain conn: always 1); else 0, and the link is wanted (`must`). */
int mn_ctl_pool_linked(mn_ctl_t *c, mn_conn_t *k);
/* Sets the pool's cap (>= 1) and idle time (ms); 0 keeps either. */
void mn_ctl_pool_configure(mn_ctl_t *c, int direct_max, uint64_t idle_ms);

/* ---- relay-only procs (ctl_relayed.c) ---- */

/*
 * A proc its agent reported with port 0 (a simulated one: `monarch-worker
 * --simulate`): a connection with no link and no file descriptor, ready at
 * once (a CONNECTED event follows), whose every call, call_one included, is
 * a cast through agent conn `agent`, which knows it as `pid`. It gets no
 * heartbeat (its agent is watched) and no CANCEL, its ACK only in its
 * agent's ACKS, and it cannot take a bulk put; it is closed when its agent
 * is closed for good. Returns the new
 * connection id (> 0), or MN_EINVAL (agent is not a ready agent conn),
 * MN_ELIMIT or MN_ENOMEM.
 */
int mn_ctl_connect_relayed(mn_ctl_t *c, int agent, int64_t pid);
/* 1 if conn is such a proc, else 0. */
int mn_ctl_relay_only(const mn_conn_t *conn);

/*
 * The next whole frame read from conn: returns its body's length and sets
 * *body (valid until the next call for conn), or MN_EAGAIN when no whole
 * frame is left (the bytes read so far are then released), or MN_EFRAME
 * when the peer announced one above MN_MAX_FRAME (conn is closed).
 */
int64_t mn_ctl_read_frame(mn_ctl_t *c, mn_conn_t *conn, const char **body);
/* Closes conn for a protocol error in what it sent; its unread bytes are dropped. */
void mn_ctl_refuse(mn_ctl_t *c, mn_conn_t *conn, const char *reason);
/* Takes the next connection with frames to read (each once per arrival); 0 when none. */
int mn_ctl_take_readable(mn_ctl_t *c);

/*
 * The events since the last mn_ctl_events_done(), oldest first; *n is set
 * to their count. Valid until the next ctl call that runs the loop.
 */
const mn_event_t *mn_ctl_events(mn_ctl_t *c, size_t *n);
void mn_ctl_events_done(mn_ctl_t *c);
/* The script's name of an event kind ("connected", "closed", ...). */
const char *mn_ctl_event_name(mn_ev_kind_t kind);
/* The pid of the embedded local agent (0 if none was started). */
int mn_ctl_agent_pid(const mn_ctl_t *c);
/*
 * Runs the loop until something arrives or timeout_ms passes (<0: no limit,
 * 0: just poll). Returns 1 if frames or events are waiting to be drained, else 0 (never fails).
 */
int mn_ctl_wait(mn_ctl_t *c, int timeout_ms);
int mn_ctl_has_work(const mn_ctl_t *c);

/*
 * Starts `exe --listen 127.0.0.1:0 --once --parent <us> --port-fd 3`; returns
 * its port (> 0), or a negative code with err: -errno from spawning it,
 * MN_ETIMEDOUT (no port in 10 s), MN_EPEER (it exited first) or MN_ENOMEM.
 */
int mn_ctl_start_agent(mn_ctl_t *c, const char *exe, const char *token, char *err, size_t errlen);

#endif
