/*
 * ctl_join.h - the controller's join port: host agents started after the
 * job (`monarch-worker --join ADDR`) ask the controller to dial them.
 *
 * A uv_tcp server on the controller's loop, opened only when the script
 * asks (monarch.listen, monarch-run --listen-joins). It speaks first with
 * a fresh nonce; an agent that answers with a JOIN whose MAC proves it
 * holds the cluster token gets JOINED, and its address is queued for the
 * script, which dials it like any agent (docs/protocol.md, section 4).
 * Everything else is refused with one ERROR and recorded (mn_join_take):
 * a wrong MAC, garbage, a frame above MN_JOIN_MAX_FRAME, a peer slower than
 * MN_HANDSHAKE_TIMEOUT_MS, and connections beyond MN_JOIN_MAX_PENDING.
 * libuv never calls Lua: the script takes what arrived with mn_join_take.
 */
#ifndef MN_CTL_JOIN_H
#define MN_CTL_JOIN_H

#include "ctl.h"

#include "msg.h"

#define MN_JOIN_MAX_PENDING 16   /* join connections mid-exchange at once; more are refused at accept */
#define MN_JOIN_MAX_FRAME 4096   /* largest frame a joining agent may send (as for any handshake) */
#define MN_JOIN_MAX_EVENTS 1024  /* joins and refusals waiting for the script; later refusals are only counted */

typedef struct mn_jconn_s mn_jconn_t;

/* What happened on the join port: an agent joined (ok), or a peer was refused (why). */
typedef struct {
  int ok;
  int quiet;                           /* refused, but the peer sent nothing (a port probe): not worth a warning */
  char addr[MN_MSG_JOIN_MAX_ADDR + 1]; /* ok: the "HOST:PORT" to dial */
  char peer[64];                       /* the address the connection came from */
  char why[240];                       /* refused: what was wrong */
} mn_join_ev_t;

typedef struct {
  mn_ctl_t *ctl;
  uv_tcp_t server;
  int listening;
  int server_open;     /* the server handle is initialised and not yet closed */
  char addr[80];       /* what it listens on, "HOST:PORT" with the port bound */
  mn_jconn_t *conns;   /* connections mid-exchange */
  int pending;         /* how many */
  mn_join_ev_t *events;
  size_t nevents, evcap;
  uint64_t dropped;    /* refusals not queued (MN_JOIN_MAX_EVENTS reached) since the last take */
  uint64_t joined, refused; /* totals, for the script's stats */
} mn_join_t;

/*
 * Starts listening on host:port (numeric; port 0 picks one) on c's loop.
 * Returns the port bound (> 0), or MN_EINVAL (a bad address, or already
 * listening) / -errno from bind or listen, with err saying which.
 */
int mn_join_listen(mn_join_t *j, mn_ctl_t *c, const char *host, int port, char *err, size_t errlen);
/* Stops listening and drops the connections mid-exchange; their memory goes in close callbacks (run c's loop). */
void mn_join_close(mn_join_t *j);
/* The events since the last take, oldest first, in *n; valid until the loop runs again. Then mn_join_done. */
const mn_join_ev_t *mn_join_events(mn_join_t *j, size_t *n, uint64_t *dropped);
void mn_join_done(mn_join_t *j);

#endif
