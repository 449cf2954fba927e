/*
 * ctl_int.h - what the controller's C files share and nothing else sees:
 * the connection struct, then one section per file naming what it defines
 * for the others (ctl.h is the face core_lua.c and core_results.c see).
 */
#ifndef MN_CTL_INT_H
#define MN_CTL_INT_H

#include "ctl.h"

#include "handshake.h"

/* ==== the connection (every file) ==================================================== */

/* One TCP attempt of a connection; replaced on every reconnect. */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t req;
  int writing;       /* uv_writes in flight (each owns its bytes) */
  mn_conn_t *k;      /* NULL once this attempt is abandoned */
  uint64_t started;  /* uv_now when the attempt began, for the handshake deadline */
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN]; /* this attempt's handshake nonces */
  size_t chunk;      /* bytes offered to the next read: small first, doubled by each read that fills it */
  size_t offered;    /* bytes the last read was offered */
  uint8_t phase;     /* mn_conn_state_t: a pooled proc's link reopened (ctl_pool.c): its own handshake, the conn staying ready */
} mn_link_t;

/* What only an agent connection holds: its gathered batch and its place in the cast tree (ctl_tree.c). */
typedef struct {
  /* The batch being gathered, uint64s: a cast's (pid, seq, tag) triples, or ACKS' pairs. They lie in ctl's
   * shared `gathered` (run_at, run_len bytes) while its procs come one after the other, as a mesh in host
   * order has them; in `cast` of its own once another agent's came between (spilled). */
  mn_buf_t cast;
  size_t run_at, run_len;
  uint8_t spilled;
  int in_cast;       /* on ctl's list of agents with a batch gathered */
  int tree_pos;      /* its position (host order), -1 when not in the tree */
  int tree_up;       /* its parent reported their link up (LINKED) in the current tree */
  int route;         /* the agent its casts go through now (its parent), 0: directly */
  int64_t tree_inflight; /* its own procs' relayed calls in flight (what passes through it: ctl_tree.c) */
  uint32_t tree_count;   /* this cast's triples in its subtree */
  int in_tree, tree_root; /* this cast touched it; it is cast to directly */
  /* A spawn for it (ctl_spawn.c): its req and spec packed, kept from mn_ctl_spawn_add until it is sent
   * directly, or, sent through the tree, until its agent answers it (a relay's loss sends it again). */
  mn_buf_t spawn;
  uint64_t spawn_req;    /* 0: none */
  uint8_t spawn_new;     /* among those the spawn being sent now is for */
  /* What its WELCOME told (ctl_ship.c, lua/monarch/ship.lua): ELF class and machine (0: not said), and
   * whether it takes shipped files (1), refuses them (0, --no-ship), or predates shipping (-1). */
  int16_t elf_class, elf_machine;
  int8_t ship;
  char cache_id[33];     /* its ship cache's id (MN_SHIP_ID_LEN hex digits), "" if it told none */
  uint8_t ship_mark;     /* ctl_ship.c, while one chunk is packed: wants it, or hands it on */
} mn_agent_part_t;

/* What only a pooled proc holds (ctl_pool.c). */
typedef struct {
  uint64_t used_at;  /* uv_now of its link's last use; 0: none since its spawn's link opened */
  mn_buf_t waiting;  /* frames (CANCEL, PING) for its link, queued while it opens */
  uint64_t owed_at;  /* uv_now of the last PING sent (its PONG comes on the link): idle once heard since */
  int at;            /* its index + 1 in c->pool; 0: no link counted */
  uint8_t wait;      /* on c->pool_waitq */
  uint8_t ping_waits; /* a PING is among the frames waiting: owed_at starts when they go */
} mn_pool_part_t;

#define MN_RING_INLINE 2 /* pending entries a conn holds in itself: a ring of its own only past that depth */

/* 64-aligned, from ctl's slab in id order (mn__ctl_new_conn): a mesh-wide call walks thousands in id order,
 * and what it touches of each is its first two cache lines. */
struct __attribute__((aligned(64))) mn_conn_s {
  /* Hot, line 0: what a cast's call and its answer read and write. */
  mn_pending_t *ring; /* ring0 until more than MN_RING_INLINE calls are in flight at once */
  uint64_t seq;      /* last CALL sequence number sent */
  uint64_t acked;    /* highest seq whose RESULT arrived */
  uint64_t via_pid;  /* its pid, by which its agent knows it (casts, ctl_cast.c) */
  uint32_t rhead, rcount, rcap;
  uint32_t on_relay; /* calls in flight through the agent; while any is, every call goes that way (order) */
  int id;
  int via;           /* a proc: the agent conn that relays its casts (0: none) */
  uint8_t kind;      /* mn_conn_kind_t */
  uint8_t state;     /* mn_conn_state_t */
  uint8_t relay_only; /* no link of its own (SPAWNED port 0): every call goes through its agent (ctl_relayed.c) */
  uint8_t lazy;       /* pooled (ctl_pool.c): its link opens on demand and closes when idle */
  uint8_t direct;     /* pooled: its link is up, its SESSION sent */
  uint8_t dirty;      /* on ctl's dirty list */
  /* Hot, line 1: the inline ring, and what a cast reads of an agent. */
  mn_pending_t ring0[MN_RING_INLINE];
  mn_ctl_t *ctl;
  mn_agent_part_t *ag; /* an agent's own fields (NULL for a proc: tens of thousands need none of them) */
  /* Cold. */
  uint8_t readable;   /* on ctl's readable list */
  uint8_t ever_ready;
  uint8_t peer_closed; /* the last loss was an EOF or reset from the peer, not silence */
  mn_link_t *link;
  mn_buf_t in;       /* bytes read, not yet drained */
  size_t in_off;     /* bytes at the front of `in` already drained (compacted lazily) */
  mn_buf_t out;      /* frames queued, not yet written */
  mn_buf_t unacked;  /* CALL frames (procs) without a RESULT yet, in seq order: resent after a reconnect */
  size_t unacked_off; /* bytes at the front of `unacked` already answered (compacted lazily) */
  uint64_t session;  /* random id; the same across reconnects */
  uint64_t ack_sent; /* highest seq announced in an ACK */
  uint64_t last_rx;  /* uv_now of the last bytes received */
  uint64_t lost_at;  /* uv_now when reconnecting began; a pooled proc: when its link last failed */
  uint64_t reconnect_ms;
  int attempt;
  uv_timer_t *retry; /* pending reconnect attempt */
  void *data;
  mn_pool_part_t *pl; /* a pooled proc's place in the pool (NULL unless lazy: a relay-only proc needs none) */
  /* Cold: the names and texts, last. On the heap (NULL for a relay-only proc, which goes by its agent's
   * names): a proc costs no more than it uses. */
  int port;
  int64_t info_pid;
  char *host;        /* the address dialled */
  char *info_host;   /* WELCOME's hostname, else host */
  char *reason;      /* why it closed, or why it is reconnecting; NULL: none yet */
};

/* A cast's CALL bytes after the seq, kept once for all its relayed calls instead of a copy per proc in
 * `unacked`: a proc's frame is rebuilt from it only if its call must be resent on its own link. */
struct mn_cast_rest_s {
  int refs;
  uint32_t len;
  char data[];
};

/* No link to write to now: a relay-only proc, or a pooled one whose link is closed or still opening. */
static inline int mn__ctl_no_link(const mn_conn_t *k) { return k->relay_only || (k->lazy && !k->direct); }
/* Where k's handshake stands: a pooled proc's reopened link has its own (k itself stays ready). */
static inline uint8_t *mn__ctl_phase(mn_conn_t *k) {
  return k->lazy && k->state == MN_CS_READY && k->link != NULL ? &k->link->phase : &k->state;
}
/* k's reason, "" before it has one. */
static inline const char *mn__ctl_reason(const mn_conn_t *k) { return k->reason ? k->reason : ""; }

/* ==== ctl.c: the connection table, lifecycles, calls in flight ===================== */

/* A new connection of `kind`, zeroed but for its id, in c's table as *out; 0, MN_ELIMIT or MN_ENOMEM. */
int mn__ctl_new_conn(mn_ctl_t *c, mn_conn_kind_t kind, mn_conn_t **out);
/* A new connection to host:port, not yet dialled (mn__ctl_start_link), as mn__ctl_new_conn. */
int mn__ctl_new_dialled(mn_ctl_t *c, const char *host, int port, mn_conn_kind_t kind, mn_conn_t **out);
/* Queues an event for the Lua face; 0 or MN_ENOMEM. */
int mn__ctl_push_event(mn_ctl_t *c, mn_ev_kind_t k, int conn, int64_t a, int64_t b);
/* Sets *dst to a copy of the formatted text (at most 1 KiB); keeps the old text if out of memory. */
void mn__ctl_set_text(char **dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Room for ids[n] in an int array of *cap that doubles (from 64) as it fills; 0 or MN_ENOMEM (unchanged). */
int mn__ctl_room(int **ids, int *cap, int n);
/* A ready conn lost (error, EOF or silence): its link dropped, a reconnect scheduled (MN_CHANGE_LOST), or,
 * a pooled proc, only its link back to the pool (MN_CHANGE_LINK_LOST). */
void mn__ctl_conn_lost(mn_conn_t *k, const char *why);
/* The next reconnect attempt after a backoff, or k closed, its reconnect window spent. */
void mn__ctl_schedule_retry(mn_conn_t *k, const char *why);
/* This attempt at k's link failed (why): a pooled proc's reopened link goes back to the pool, the proc
 * staying ready; any other link is retried, if k was ever ready, or k closes. */
void mn__ctl_attempt_failed(mn_conn_t *k, const char *why);
/* Appends a pending entry (call, slot, relayed with its shared bytes) to k's ring; 0 or MN_ENOMEM. */
int mn__ctl_push_pending(mn_conn_t *k, double call, int32_t slot, int relay, mn_cast_rest_t *rest);
/* Gives a CALL frame k's next seq and records it in flight: a pending entry, and an unacked copy
 * unless `rest` (a relayed call's shared bytes) stands for it; 0 or MN_ENOMEM. */
int mn__ctl_track(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot, int relay,
                  mn_cast_rest_t *rest);
/* A CALL on k's own link (queued while it reconnects), tracked; 0 or MN_ENOMEM. */
int mn__ctl_call_direct(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot);

/* ==== ctl_io.c: links, reads, writes, the handshake, the loop's turn =============== */

/* Starts a TCP attempt for k (its handshake follows); a failure comes back as mn__ctl_attempt_failed. */
void mn__ctl_start_link(mn_conn_t *k);
/* Abandons k's current attempt; its callbacks then do nothing. */
void mn__ctl_drop_link(mn_conn_t *k);
/* An agent the tree vouches for hears nothing from us directly: the kernel's keepalive, at the heartbeat
 * timeout, sees its link die. */
void mn__ctl_keep_alive(mn_conn_t *k);
/* Marks k for the next mn__ctl_before_sleep. */
void mn__ctl_set_dirty(mn_ctl_t *c, mn_conn_t *k);
/* Writes k's queued output now (what the socket takes; libuv the rest), as before the loop sleeps. */
void mn__ctl_flush_now(mn_conn_t *k);
/* Appends raw bytes to k's output and marks it dirty; 0 or MN_ENOMEM. */
int mn__ctl_queue_out(mn_ctl_t *c, mn_conn_t *k, const char *frame, size_t n);
/* Queues k's unanswered CALL frames (`unacked`) on its link; 0 or MN_ENOMEM. */
int mn__ctl_resend_unacked(mn_ctl_t *c, mn_conn_t *k);
/* Before the loop sleeps (uv_run, or the script between waits), every queued write goes out. */
void mn__ctl_before_sleep(mn_ctl_t *c);
/* Tells agents we are leaving on purpose (GOODBYE, written now if it can be), so they stop our procs at once. */
void mn__ctl_say_goodbye(mn_ctl_t *c);
/* A timer callback that does nothing: its firing only ends a uv_run(UV_RUN_ONCE). */
void mn__ctl_on_timer(uv_timer_t *t);

/* ==== ctl_route.c: the hub (where a call goes; who hears of a conn's change) ======= */

/* Which way a call (or resend, or ACK) to a proc goes. */
typedef enum {
  MN_ROUTE_DIRECT, /* on its own link (queued while it reconnects) */
  MN_ROUTE_RELAY,  /* in a CAST to its host agent */
  MN_ROUTE_TREE,   /* in a CAST down the cast tree, through its agent's route */
  MN_ROUTE_PARK    /* no way now: kept in unacked until its agent or its pooled link is back */
} mn_route_t;
/* What is being sent. */
typedef enum {
  MN_SEND_ONE,    /* a call to one proc (mn_ctl_call: call_as) */
  MN_SEND_CALL,   /* a target of a call to fewer than cast_min procs (mn_ctl_cast_add, prefer 0) */
  MN_SEND_CAST,   /* a target of a mesh-wide call: through the agent when the proc is idle and the call small */
  MN_SEND_RESEND, /* calls taken off their relay, again (RELAY here: a one-target CAST to the agent itself) */
  MN_SEND_ACK     /* the heartbeat's ACK (PARK: not sent, the next covers it) */
} mn_send_t;
/* A change in a conn's life, told to the modules by mn__ctl_conn_changed. */
typedef enum {
  MN_CHANGE_UP,        /* ready for the first time, its session open */
  MN_CHANGE_BACK,      /* ready again after reconnecting, same session */
  MN_CHANGE_LOST,      /* reconnecting */
  MN_CHANGE_CLOSED,    /* closed for good (after its CLOSED event) */
  MN_CHANGE_LINK_UP,   /* a pooled proc's reopened link finished its handshake (the proc stayed ready) */
  MN_CHANGE_LINK_LOST  /* a pooled proc's link failed or was lost (the proc stays ready) */
} mn_conn_change_t;

/* The one decision of which way `what` (a CALL frame of n bytes, for calls) to proc k goes. */
mn_route_t mn__ctl_route(const mn_ctl_t *c, const mn_conn_t *k, mn_send_t what, size_t n);
/* How the batch gathered for the agents goes: RELAY (one CAST or ACKS each) or TREE. */
mn_route_t mn__ctl_route_batch(const mn_ctl_t *c);
/* Whether k's agent can carry its casts and ACKs now (both ready). */
int mn__ctl_relay_usable(const mn_ctl_t *c, const mn_conn_t *k);
/* Tells the pool, the tree, casts and relay-only procs, in that order, that k changed; 0, or MN_ENOMEM from
 * MN_CHANGE_LINK_UP (the pool's resends). */
int mn__ctl_conn_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what);

/* ==== ctl_slab.c: where conns live ================================================= */

/* The next conn of the slab, zeroed; NULL when out of memory. */
mn_conn_t *mn__ctl_slab_conn(mn_ctl_t *c);
/* Lets go of every block of conns (at mn_ctl_close, after each conn's own allocations). */
void mn__ctl_slab_free(mn_ctl_t *c);

/* ==== ctl_cast.c: casts, gathered batches, relayed calls taken off ================= */

/* Sends a CALL to k the way mn__ctl_route says (ctl.h's mn_ctl_call and mn_ctl_cast_add); 0 or MN_ENOMEM. */
int mn__ctl_send_call(mn_ctl_t *c, mn_conn_t *k, char *frame, size_t n, double call, int32_t slot, mn_send_t what);
void mn__ctl_rest_unref(mn_cast_rest_t *r);
/* Agent a's gathered batch: its uints, and their count as *n entries of `width` uints (0 when none). */
const uint64_t *mn__ctl_batch(const mn_ctl_t *c, const mn_conn_t *a, size_t width, size_t *n);
/* The batch went out: every agent's is empty again (the caller cleared their in_cast). */
void mn__ctl_batch_done(mn_ctl_t *c);
/* Queues k's ACK in its agent's ACKS batch (sent by mn__ctl_relay_acks_end); 0 or MN_ENOMEM. */
int mn__ctl_relay_ack(mn_ctl_t *c, mn_conn_t *k);
/* Sends each agent its gathered ACKS. */
void mn__ctl_relay_acks_end(mn_ctl_t *c);
/* k's unanswered calls are (being) resent on its own link: none is relayed any more. */
void mn__ctl_unrelay(mn_conn_t *k);
/* Takes k's calls off their relay (mn__ctl_unrelay) and resends them the way the hub says (MN_SEND_RESEND). */
void mn__ctl_unrelay_resend(mn_ctl_t *c, mn_conn_t *k);
/* The hub's handler: an agent lost or closed has its procs' relayed calls resent the way left to each. */
void mn__ctl_cast_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what);

/* ==== ctl_tree.c: the cast tree ==================================================== */

/* Whether casts go through the tree: past the fan-out it was built for (inline: the hub asks per call). */
static inline int mn__ctl_tree_active(const mn_ctl_t *c) { return c->tree_k > 1 && c->ntree > c->tree_k; }
/* a's parent in the tree, if the tree is active, their link up and the parent ready; else NULL (ctl_ship.c). */
mn_conn_t *mn__ctl_tree_linked_parent(mn_ctl_t *c, const mn_conn_t *a);
/* Child j of a in the tree, or NULL past its last. */
mn_conn_t *mn__ctl_tree_child(mn_ctl_t *c, const mn_conn_t *a, int j);
/* The hub's handler: an agent up, back, lost or closed marks the tree for a rebuild. */
void mn__ctl_tree_conn_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what);
/* Rebuilds the tree if the agents changed (TREE to each agent when it is, or was, active). */
void mn__ctl_tree_refresh(mn_ctl_t *c);
/* A relayed answer for proc k arrived. */
void mn__ctl_tree_answered(mn_ctl_t *c, mn_conn_t *k);
/* Sends the gathered cast (each agent's triples) down the tree; 0 or MN_ENOMEM. */
int mn__ctl_tree_cast_end(mn_ctl_t *c, const char *rest, size_t rlen);
/* Sends the gathered ACKs (each agent's pairs) down the routes casts take; 0 or MN_ENOMEM. */
int mn__ctl_tree_acks_end(mn_ctl_t *c);
/* Whether agent a's parent answers for it (its link is up): the heartbeat neither PINGs nor times it out. */
int mn__ctl_tree_vouched(mn_ctl_t *c, const mn_conn_t *a);
/* Whether a spawn for agent a goes through its parent (the route a cast would take now, settled). */
int mn__ctl_tree_route_spawn(mn_ctl_t *c, mn_conn_t *a);
/* Sends the spawns of agents ids[0..n) (each routed through its parent), one SPAWN per top agent with the
 * rest as subs; 0 or MN_ENOMEM. */
int mn__ctl_tree_spawn_end(mn_ctl_t *c, const int *ids, int n);
/* An agent in the tree is lost: with any route through a parent, every relayed call goes direct (1); else 0,
 * and only the lost agent's own procs' calls move. */
int mn__ctl_tree_unrelay_agent(mn_ctl_t *c);

/* ==== ctl_spawn.c: spawns down the tree ============================================ */

/* Every spawn sent through the tree and not answered goes to its agent directly (a relay on the way is, or
 * may be, lost: the agent drops a second copy). Before the routes are reset. */
void mn__ctl_spawn_resend(mn_ctl_t *c);

/* ==== ctl_pool.c: pooled procs ===================================================== */

/* Pooled proc k wants its link: opened now if the pool has room or an idle link to close (for `must`,
 * any idle one; else one unused for the hold time), else, for `must`, once one frees. */
void mn__ctl_pool_want(mn_ctl_t *c, mn_conn_t *k, int must);
/* Opens links for procs waiting for one, as room frees (mn__ctl_before_sleep calls it when any waits). */
void mn__ctl_pool_serve(mn_ctl_t *c);
/* The heartbeat's part: idle links past direct_idle close, the pool shrinks to direct_max. */
void mn__ctl_pool_tick(mn_ctl_t *c, uint64_t now);
/* The hub's handler: a first link up counts, a reopened one sends what waited (0 or MN_ENOMEM), a lost one's
 * direct calls go through the agent, a closed conn's link no longer counts. */
int mn__ctl_pool_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what);

/* ==== ctl_relayed.c: relay-only procs ============================================== */

/* Queues every unanswered call of relay-only proc k to its agent a again, each a one-target CAST, in seq order
 * (its unacked copies: mn__ctl_unrelay rebuilt them). */
void mn__ctl_relayed_resend(mn_ctl_t *c, mn_conn_t *a, mn_conn_t *k);
/* The hub's handler: an agent back gets its relay-only procs' unanswered calls again; one closed closes them. */
void mn__ctl_relayed_changed(mn_ctl_t *c, mn_conn_t *k, mn_conn_change_t what);

/* ==== ctl_heartbeat.c ============================================================== */

/* The heartbeat timer's callback. */
void mn__ctl_on_heartbeat(uv_timer_t *t);

#endif
