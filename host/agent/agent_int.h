/*
 * agent_int.h - what the host agent's files share: first the state they all
 * see, then one section per file with what that file defines for the
 * others (its limits and functions). agent.c holds the loop, controller
 * connections and sessions; agent_pids.c finds procs by pid; agent_proc.c
 * spawns procs and forwards their ports, exits, status lines and output;
 * agent_relay.c and agent_tree.c carry casts to procs and child agents;
 * agent_sim.c has --simulate's virtual procs; agent_persist.c keeps
 * persistent meshes and answers STATUS and LIST; agent_join.c joins a
 * controller (--join); agent_stat.c and agent_gpu.c measure procs for
 * STATUS; agent_blas.c picks the OpenBLAS core type procs run. The public entry point is agent.h.
 */
#ifndef MN_AGENT_INT_H
#define MN_AGENT_INT_H

#include "agent.h"

#include "handshake.h"
#include "ship.h"
#include "wire.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

/* ---- the agent's state, which every file sees ---------------------------------------------- */

#define MN_SPAWNS_SEEN 16         /* a session's latest SPAWN reqs, kept so that a resent one is not run twice */
#define MN_EXITS_KEPT 16          /* recent proc exits the agent remembers for STATUS */

typedef struct aconn_s aconn_t;
typedef struct ajoin_s ajoin_t;
typedef struct asession_s asession_t;
typedef struct apersist_s apersist_t;
typedef struct alink_s alink_t;
typedef struct asim_s asim_t;
typedef struct aproc_s aproc_t;
typedef struct aship_s aship_t;

/* A persistent mesh's record: its procs point at it. */
struct apersist_s {
  char name[MN_MAX_NAME + 1];
  mn_buf_t blob;     /* the controller's description, packed msgpack; returned verbatim by ATTACH */
  int nprocs;        /* live procs marked with this record; the record goes with the last */
  apersist_t *next;
};

/* The live procs by pid (agent_pids.c): open addressing over cap slots, a power of two. */
typedef struct {
  struct {
    int64_t pid;
    aproc_t *p; /* NULL: the slot is empty */
  } *slot;
  size_t cap;   /* 0 until the first proc */
  size_t count;
} apids_t;

typedef struct {
  uv_loop_t *loop;
  uv_tcp_t server;
  mn_auth_t auth;
  const mn_agent_opts_t *o;
  char host[256];
  aconn_t *conns;
  int nconns;
  asession_t *sessions;
  apersist_t *persisted;
  int npersisted;
  uv_timer_t tick;
  uv_timer_t hang_timer;  /* checks procs' status lines (hang_check), every hang_period ms */
  uint64_t hang_period;   /* 0 while no session asked for hang checks */
  uint64_t grace_ms;
  uint64_t silence_ms;
  int nprocs;          /* procs whose handles are not all closed yet */
  apids_t pids;        /* the live ones (not exited), by pid */
  int served;          /* controllers authenticated so far */
  int stopping;
  uint64_t started;
  struct {
    int rank;
    int64_t pid, status;
    int sig;
    uint64_t at;
  } exits[MN_EXITS_KEPT];
  int nexits;          /* total recorded; the ring holds the last MN_EXITS_KEPT */
  uv_timer_t relay_timer; /* flushes cast results that wait for slower siblings */
  uv_timer_t link_timer;  /* PINGs the cast tree's links to children and drops silent ones (agent_tree.c) */
  uint64_t link_period;   /* its interval; 0 while it was never started */
  int port;            /* the port we listen on */
  ajoin_t *join;       /* --join: the attempt to join a controller (agent_join.c) */
  int exit_code;       /* what mn_agent_main returns once the loop stops */
  asim_t *sim;         /* --simulate: the virtual procs (agent_sim.c); NULL otherwise */
  aship_t *ship;       /* the cache of shipped files (agent_ship.c) */
  mn_elf_id_t elf;     /* what this binary is (ELF class, machine), told in WELCOME: a library shipped must match */
} agent_t;

struct asession_s {
  uint64_t id;
  agent_t *a;
  aconn_t *conn;      /* NULL while the controller is away */
  uint64_t left_at;   /* uv_now when it went away */
  mn_buf_t backlog;   /* events to deliver when it comes back */
  int ended;          /* GOODBYE or grace expired: procs are being killed */
  uint64_t hang_ms;   /* a proc silent this long is reported (PROC_HUNG); 0: not watched */
  mn_buf_t batch;     /* RESULTS being gathered from its procs' relays */
  uint32_t nbatch;    /* entries in it */
  int64_t relayed;    /* cast CALLs handed to its procs, or to child agents, and not answered yet */
  aconn_t *up;        /* where its RESULTS go: the connection its last CAST came on (controller or parent agent) */
  alink_t **links;    /* its children in the cast tree (TREE), by index; NULL entries are gone (redialled) */
  struct tree_child_s *children; /* what TREE said of each: address and session, to dial it again */
  uint32_t nlinks;
  uint64_t tree_epoch; /* the TREE they came from, named in LINKED */
  uint64_t link_silence_ms; /* a link silent this long is lost (TREE says; the controller's heartbeat timeout / 2) */
  aconn_t *held;      /* the connection shipped chunks came on, not read while a child's link is full (agent_tree.c) */
  uint64_t spawns_seen[MN_SPAWNS_SEEN]; /* its latest SPAWN reqs (a ring): one sent again after a relay's loss is dropped */
  uint32_t spawns_next;
  asession_t *next;
};

struct aconn_s {
  uv_tcp_t tcp;
  agent_t *a;
  asession_t *session;
  asession_t *relay_of; /* a parent agent's relay link: it carries casts for this session and owns nothing */
  uint64_t relay_silence_ms; /* a relay link silent this long was given up by its parent (SESSION says) */
  uint64_t last_rx;
  int ready;
  int closing;
  int held;             /* not read for now (mn__agent_conn_hold): a child's link must drain first */
  uint8_t ns[MN_NONCE_LEN];
  mn_buf_t in;
  msgpack_zone zone;
  uv_timer_t hs_timer;
  aconn_t *next;
};

struct aproc_s {
  uv_process_t proc;
  uv_pipe_t pipe;     /* fd 3: the port report */
  uv_pipe_t out, err; /* the proc's stdout and stderr, forwarded as LOG */
  mn_buf_t obuf, ebuf; /* partial lines */
  agent_t *a;
  asession_t *owner;  /* NULL once killed, or while parked (persistent, no controller) */
  apersist_t *persist; /* the persistent mesh it belongs to, or NULL */
  uint64_t req;
  int index;
  int rank;
  char buf[256];       /* fd 3: the port line, then "S queued executed running" lines */
  size_t blen;
  int reported;
  int open_handles;
  uint64_t started;    /* uv_now at spawn */
  int queued;          /* the proc's last status report */
  uint64_t executed;
  char running[104];
  uint64_t last_status; /* uv_now of its last status line (or of its spawn) */
  uint64_t hang_ms;     /* its session's hang timeout when it was spawned (its status lines keep that pace) */
  int hung;             /* reported by PROC_HUNG, and no line since */
  uv_pipe_t relay;      /* our end of its --relay-fd socketpair: cast CALLs in, their RESULTs out */
  int relay_open;
  mn_buf_t rin;         /* relay bytes read, not yet a whole frame */
  uint64_t tag;         /* the controller's name for it in CAST and RESULTS */
  int64_t relayed;      /* cast CALLs handed to it and not answered yet */
  uint64_t running_since; /* uv_now of the first line that showed its current call; 0 while idle */
};

/* ---- agent.c: the loop, controller connections, sessions ------------------------------------ */

#define MN_MAX_SPAWN 4096         /* most procs one SPAWN may ask for */
#define MN_AGENT_GRACE_MS 10000   /* a departed controller's procs live this long (default) */
#define MN_AGENT_SILENCE_MS 10000 /* a controller connection silent this long is dropped */
#define MN_MAX_BACKLOG (1u << 20) /* bytes of events kept for a detached session */
#define MN_AGENT_SPIN_US 50       /* a proc's executor busy-wait while the host has a core per proc */

/* Ends the loop once a --once agent has nothing left: no connection, proc or session. */
void mn__agent_maybe_exit(agent_t *a);
/* Unmarks a persistent proc; its mesh's record goes with the last one. */
void mn__agent_persist_unmark(aproc_t *p);
/* Sends c an ERROR (code, msg) and closes it. */
void mn__agent_refuse(aconn_t *c, int code, const char *msg);
/* Sends b's bytes to c (copied; b stays the caller's). */
void mn__agent_send_buf(aconn_t *c, const mn_buf_t *b);
/* Completion of a uv_write whose data is a malloc'd buffer it owns: frees both. */
void mn__agent_on_write(uv_write_t *w, int status);
/* Delivers b to the session's controller, or keeps it (up to MN_MAX_BACKLOG) until the controller is back. */
void mn__agent_session_send(asession_t *s, const mn_buf_t *b);
/* Stops the agent: closes every connection, kills every proc, ends the loop. */
void mn__agent_stop(agent_t *a);

/* ---- agent_ship.c: the cache of shipped files ------------------------------------------------ */

#define MN_SHIP_CACHE_MAX (1ull << 30) /* default cap of the ship cache (--ship-cache-max), bytes */

/* Sets up a->ship from the options (the directories are made at first use); 0 or MN_ENOMEM. */
int mn__agent_ship_init(agent_t *a);
void mn__agent_ship_close(agent_t *a);
/* Whether this agent takes shipped files (not --no-ship). */
int mn__agent_ship_enabled(const agent_t *a);
/* Its ship cache's id, told in WELCOME ("" if it has none): agents of one id share one cache. */
const char *mn__agent_ship_id(const agent_t *a);
/* The cache's blob directory and session s's workspace, for its procs' environment. */
void mn__agent_ship_paths(const agent_t *a, const asession_t *s, char *blobs, size_t bn, char *work, size_t wn);
void mn__agent_handle_ship_ask(aconn_t *c, const msgpack_object *m);
/* SHIP_DATA for session s, from its controller or a parent's relay link c. */
void mn__agent_handle_ship_data(aconn_t *c, asession_t *s, const msgpack_object *m);
/* The session is over: its workspace goes (unless persistent meshes live on). */
void mn__agent_ship_session_end(asession_t *s);

/* ---- agent_pids.c: the live procs by pid ------------------------------------------------------ */

/* Makes room for one more proc, before it is spawned: 0, or UV_ENOMEM. */
int mn__agent_pids_reserve(agent_t *a);
/* Adds p under its pid (after uv_spawn, and a reserve); never fails. */
void mn__agent_pids_add(agent_t *a, aproc_t *p);
/* p exited: it is no longer found by its pid. */
void mn__agent_pids_remove(agent_t *a, aproc_t *p);
/* The live proc with this pid, or NULL. */
aproc_t *mn__agent_pids_find(const agent_t *a, int64_t pid);
/* Frees the table (the agent has stopped). */
void mn__agent_pids_free(agent_t *a);

/* ---- agent_proc.c: spawning procs, their ports, exits, status lines and output ---------------- */

#define MN_MAX_LOG_LINE (64u << 10) /* a longer unterminated line is forwarded in pieces */
#define MN_STATUS_MS_MAX 1000     /* longest interval between a proc's status lines */
#define MN_STATUS_MS_MIN 20       /* shortest, however short the hang timeout */

void mn__agent_send_spawn_failed(asession_t *c, uint64_t req, int index, const char *msg);
/* Close callback of each of a proc's handles; the last one frees it. */
void mn__agent_proc_handle_closed(uv_handle_t *h);
/*
 * Starts one proc. Where the user set none: threads is its BLAS/OpenMP
 * thread count, spin_us its executor's busy-wait (MONARCH_SPIN_US); -1
 * leaves either unset. Returns 0, or libuv's code (UV_E*, which is -errno):
 * UV_ENOMEM or what uv_spawn said.
 */
int mn__agent_spawn_one(asession_t *c, uint64_t req, int index, int rank, int world, int device, int threads,
                        int spin_us);
/* Starts (or speeds up) the check of procs' status lines for a session whose hang_ms is set. */
void mn__agent_watch_hangs(agent_t *a, uint64_t hang_ms);
/* Records an exit for STATUS's list of recent ones (sig 0: none). */
void mn__agent_note_exit(agent_t *a, int rank, int64_t pid, int64_t status, int sig);

/* ---- agent_relay.c: casts to this host's procs, their RESULTs batched back -------------------- */

#define MN_RELAY_FLUSH_MS 1        /* cast results wait at most this long for their siblings */
#define MN_RELAY_BATCH (256u << 10) /* a RESULTS frame this large goes at once */

/* Opens our end (fd) of p's relay and starts reading its RESULTs; 0 or libuv's code. */
int mn__agent_relay_open(aproc_t *p, int fd);
/* p exited: its unanswered casts will not be answered (the controller hears of its death). */
void mn__agent_relay_proc_gone(aproc_t *p);
/* CAST: hands each named proc of the session its CALL. */
void mn__agent_handle_cast(aconn_t *c, const msgpack_object *m);
/* ACKS: each named proc of c's session gets its ACK over its relay. */
void mn__agent_handle_acks(aconn_t *c, const msgpack_object *m);
/* The session ends: its batch goes. */
void mn__agent_relay_session_gone(asession_t *s);
/* At exit: closes the batches' flush timer. */
void mn__agent_relay_close(agent_t *a);
/* A child agent's RESULTS entries (n of them, raw bytes after the frame's head) join s's batch. */
void mn__agent_relay_take_batch(asession_t *s, const char *entries, size_t len, uint32_t n);
/* Sends s's batch now, if it has one. */
void mn__agent_relay_flush(asession_t *s);
/* Adds one RESULT body, named tag, to s's batch (sent at once if that makes it MN_RELAY_BATCH). */
void mn__agent_relay_answer(asession_t *s, uint64_t tag, const char *body, size_t len);
/* The end of a burst of answers: sends s's batch now, unless its procs still owe answers (then within MN_RELAY_FLUSH_MS). */
void mn__agent_relay_push(asession_t *s);

/* ---- agent_tree.c: the cast tree's links to child agents ------------------------------------ */

/* TREE from c's controller: (re)opens relay links to the children it names. */
void mn__agent_tree_set(aconn_t *c, const msgpack_object *m);
/* Hands sub-casts (CAST's subs) to the children's links; returns the triples handed on. */
int64_t mn__agent_tree_forward(asession_t *s, const msgpack_object *subs, const char *rest, size_t rlen);
/* Hands SPAWN's subs on to the children's links (one whose link is not up: the controller resends it). */
void mn__agent_tree_forward_spawn(asession_t *s, const msgpack_object *subs);
/* Hands ACKS's subs on to the children's links. */
void mn__agent_tree_forward_acks(asession_t *s, const msgpack_object *subs);
#define MN_SHIP_RELAY_HIGH (2u << 20) /* bytes queued on a child's link past which a relay stops reading its parent */
#define MN_SHIP_RELAY_LOW (1u << 20)  /* and below which (on every link) it reads again */

/* SHIP_DATA's subs: each (index, self, subs) triple's chunk to that child's link (ship.h). A link queued past
 * MN_SHIP_RELAY_HIGH holds `from` (the connection the chunk came on) until every link is below
 * MN_SHIP_RELAY_LOW: the backpressure goes up the tree to the controller, which waits on its own sockets. */
void mn__agent_tree_forward_ship(asession_t *s, aconn_t *from, const mn_msg_ship_data_t *d);
/* Stops (hold) or resumes reading c. */
void mn__agent_conn_hold(aconn_t *c, int hold);
/* Resumes s's held connection, if any (its links drained, or it is ending). */
void mn__agent_tree_release(asession_t *s);
/* Whether a parent's relay link for s was heard within ms: the controller reaches s through it. */
int mn__agent_tree_heard(agent_t *a, const asession_t *s, uint64_t ms);
/* At exit: stops the links' timer. */
void mn__agent_tree_stop(agent_t *a);
/* Closes s's links (the session ends). */
void mn__agent_tree_close(asession_t *s);

/* ---- agent_sim.c: --simulate, virtual procs answered inside the agent ------------------------ */

/* Sets up the simulation once the agent listens (its port is in the virtual pids); 0 or MN_ENOMEM. */
int mn__agent_sim_init(agent_t *a);
void mn__agent_sim_close(agent_t *a);
/* SPAWN: n virtual procs, ranks rank_base.., each answered SPAWNED with port 0 (one write for all). */
void mn__agent_sim_spawn(asession_t *s, uint64_t req, int n, int rank_base, int world);
/* KILL: a terminating signal ends the session's virtual proc `pid` with PROC_EXIT; other pids are ignored. */
void mn__agent_sim_kill(asession_t *s, int64_t pid, int sig);
/* CAST: answers the targets that are the session's virtual procs; the others are left to the relay. */
void mn__agent_sim_cast(asession_t *s, const msgpack_object *targets, const char *rest, size_t rlen);
/* The session is over: its virtual procs go, without PROC_EXIT (as killed real ones do). */
void mn__agent_sim_session_end(asession_t *s);
/* STATUS: how many virtual procs there are, then each one's entry (as a real proc's, plus simulated = true). */
int mn__agent_sim_count(const agent_t *a);
void mn__agent_sim_status(const agent_t *a, msgpack_packer *pk, const asession_t *me, uint64_t now);

/* ---- agent_persist.c: persistent meshes (PERSIST, ATTACH, DETACH), STATUS, LIST --------------- */

#define MN_MAX_PERSISTED 256      /* most persistent meshes one agent keeps */

void mn__agent_handle_attach(aconn_t *c, const msgpack_object *m);
void mn__agent_handle_detach(aconn_t *c, const msgpack_object *m);
void mn__agent_handle_list(aconn_t *c, const msgpack_object *m);
void mn__agent_handle_persist(aconn_t *c, const msgpack_object *m);
void mn__agent_handle_status(aconn_t *c, const msgpack_object *m);

/* ---- agent_join.c: --join, asking a controller to dial us ------------------------------------ */

#define MN_JOIN_BACKOFF_MIN_MS 100 /* first wait before dialling a join port again; doubles per attempt */
#define MN_JOIN_BACKOFF_MAX_MS 2000 /* longest wait between attempts */
#define MN_JOIN_TIMEOUT_S 60.0     /* default of MONARCH_JOIN_TIMEOUT: how long to keep trying to join */
#define MN_JOIN_WAIT_S 30.0        /* default of MONARCH_JOIN_WAIT: after JOINED, how long the controller has to connect */

/* --join: starts asking the controller at a->o->join to dial us; 0, or 2 (an exit status) for a bad address. */
int mn__agent_join_start(agent_t *a);
/* Stops any attempt and closes its handles (the agent is stopping). */
void mn__agent_join_close(agent_t *a);

/* ---- agent_stat.c: what STATUS adds per proc for `monarch-run --top` -------------------------- */

#define MN_STAT_FIELDS 7 /* the map entries mn__agent_stat_pack adds */
/* Notes a status line of p before its fields take the values: when its current call began. */
void mn__agent_stat_line(aproc_t *p, uint64_t executed, const char *running, uint64_t now);
/* Packs MN_STAT_FIELDS entries: cpu, rss, gpu_mem, running_for, status_age, hung, ready. */
void mn__agent_stat_pack(msgpack_packer *pk, const aproc_t *p, int64_t pid, uint64_t now);

/* ---- agent_blas.c: the OpenBLAS core type procs run ------------------------------------------ */

typedef struct {
  char core[32];      /* what procs run (openblas_get_corename() in a probe), "?" before or without one */
  const char *source; /* "user" (OPENBLAS_CORETYPE), "auto" (our pick), "named" (MONARCH_BLAS_CORETYPE=NAME),
                       * "off" (MONARCH_BLAS_CORETYPE=off), "openblas" (OpenBLAS's own choice stands) */
  double gflops;      /* its one-core sgemm rate: the geometric mean over our kernels' shapes */
  char own[32];       /* OpenBLAS's own choice and its rate */
  double own_gflops;
  char note[224];     /* why procs run OpenBLAS's own choice ("" where they run the pick, or it is the pick) */
  int ok;             /* the core procs run passed its self-check */
  double probe_ms;    /* what the probes added to the agent's start */
} mn_agent_blas_t;

/*
 * At start, before the loop: probes, decides, sets OPENBLAS_CORETYPE for the
 * procs. A dropped pick is logged (stderr) always; the one-line summary only
 * when verbose (a daemon that prints its banner, not monarch-run's own agent).
 */
void mn__agent_blas_init(const char *exe, int verbose);
/* The decision (before mn__agent_blas_init: core "?"). */
const mn_agent_blas_t *mn__agent_blas(void);
/*
 * Packs it for STATUS: a map {core, source, gflops, ok, openblas, openblas_gflops, note, probe_ms, tried,
 * cached, version}; tried lists what was measured, [{name, core, ok, gflops, why}], OpenBLAS's own first.
 */
void mn__agent_blas_pack(msgpack_packer *pk);

/* ---- agent_gpu.c: procs' GPU memory from NVML ------------------------------------------------- */

/* Starts a query of the procs' GPU memory on the thread pool, unless one runs or there is no NVML. */
void mn__agent_gpu_refresh(uv_loop_t *loop);
/* pid's GPU memory in bytes as the last query found it, or -1 (no GPU, no NVML, not known yet). */
int64_t mn__agent_gpu_bytes(int64_t pid);

#endif
