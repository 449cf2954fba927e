/*
 * proc_int.h - what the proc's three files share: its state and the
 * functions one of them calls in another. proc.c starts the process;
 * proc_io.c reads the connection (the I/O side, on whichever thread holds
 * it); proc_handover.c runs calls on the executor, writes their RESULTs and
 * hands the connection between the executor and the I/O thread. The
 * public entry point is proc.h.
 */
#ifndef MN_PROC_INT_H
#define MN_PROC_RETIRED 8 /* sessions remembered as taken over (a controller that froze and woke up) */
#define MN_PROC_INT_H

#include "proc.h"

#include "exec.h"
#include "handshake.h"
#include "replay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- the proc's state -------------------------------------------------------- */

/* A CALL read off the connection, run at once or queued for the executor. */
typedef struct item_s {
  struct item_s *next;
  uint64_t session; /* session the call arrived on */
  int relay;        /* it came through the agent (a cast): its RESULT goes back that way */
  size_t len;
  char data[];
} item_t;

typedef struct proc_s proc_t;

/* A connection: a controller's (authenticated by a handshake thread), or the agent's relay. */
typedef struct {
  proc_t *p;
  int fd;
  int relay;   /* the agent's relay: CALLs only, of the session being served */
  int held;    /* the relay: frames wait unread in `in` for the controller's SESSION (run_held_relay) */
  mn_buf_t in; /* bytes that arrived right behind AUTH */
} conn_t;

/* What each fd in the epoll set is: its event's tag. */
typedef enum { IO_LISTEN, IO_HANDSHAKE, IO_CONN, IO_RELAY, IO_WAKE, IO_NFDS } io_fd_t;

/* The connection's state: owned by the thread that holds it, handed over under proc_t's lock. */
typedef struct {
  int lfd;                /* the listening socket */
  conn_t *cur;            /* the current controller connection (NULL: none) */
  conn_t *relay;          /* the agent's relay (NULL: none) */
  int has_session;        /* cur has sent its SESSION */
  int relay_session;      /* the relay carries CALLs of the session served, no SESSION: always 1 */
  int64_t last_rx;        /* when a controller was last heard from (the orphan clock) */
  int64_t next_status;    /* when the next status line is due */
  int64_t orphan_ns;      /* --orphan-timeout; "never" is a far future */
  int64_t slice_ns;       /* longest sleep in poll: status lines keep their pace */
} io_t;

/* The one proc of the process: the queue between the threads, the write side, the executor. */
struct proc_s {
  pthread_mutex_t lock;     /* guards the queue and who holds the connection */
  pthread_cond_t cond;      /* signalled when items arrive or the connection comes back to the executor */
  pthread_cond_t space;     /* signalled when queued bytes drop */
  item_t *head, *tail;
  size_t queued_bytes;
  int io_on_exec;           /* the executor holds the connection (else the I/O thread does) */
  int want_io;              /* the executor's queue ran dry: it asks for the connection back */
  int64_t inline_since;     /* when the executor began running calls while holding the connection (0: it is not) */
  int timer_fd;             /* fires MN_INLINE_NS into such a run: the I/O thread's cue to take over */
  int wake_fd;              /* eventfd: wakes the I/O thread's poll when want_io is set */
  int ep;                   /* epoll set of the connection's fds (io_fd_t tags): none is re-armed per call */
  io_t io;
  pthread_mutex_t wlock;    /* guards fd, session, replay and every write */
  int fd;                   /* the controller connection, -1 when none */
  int relay_fd;             /* the agent's relay for casts (--relay-fd), -1 when none */
  uint64_t session;         /* the controller session now served (0: none yet) */
  uint64_t retired[MN_PROC_RETIRED]; /* sessions another one took over from: refused if they come back */
  int nretired;             /* how many were ever retired (retired[] is a ring of the newest) */
  mn_replay_t replay;       /* unacknowledged RESULTs of `session` */
  int replay_on;            /* MONARCH_NO_REPLAY=1 turns the cache off (for measuring it) */
  atomic_int cancel;
  mn_cancel_t cancels;      /* calls the controller asked to stop (CANCEL) */
  atomic_int handshakes;    /* handshake threads running */
  int hs_pipe[2];           /* handshake threads hand authenticated conns to the connection's holder */
  const mn_auth_t *auth;
  mn_exec_t exec;
  long spin_ns;
  int64_t swept_ns;         /* when the executor last dropped bulk maps the controller no longer holds (bulk.h) */
  atomic_ullong executed;   /* calls run, for the agent's status report */
  atomic_ullong received;   /* calls read; received - executed are in flight */
  int status_fd;            /* the port pipe, kept for status lines to the agent (-1: none) */
  int64_t status_ms;        /* interval of status lines (MONARCH_STATUS_MS) */
};

/* Frames split off one poll's reads, for the executor to run or the I/O thread to queue. */
typedef struct {
  item_t *first, *last;
  size_t bytes;
  int n;
} batch_t;

/* ---- proc.c: the process -------------------------------------------------------- */

/* Whether __persist(true) made this proc part of a persistent mesh: it then outlives the orphan timeout. */
int mn__proc_persistent(void);

/* ---- proc_io.c: the connection's I/O ------------------------------------------------ */

/* Status lines to the agent (MONARCH_STATUS_MS), on the port pipe port_fd (> 2) that it keeps reading. */
void mn__proc_status_init(proc_t *p, int port_fd);
/* The connection's state before the executor first holds it, and its epoll set. 0 or -errno. */
int mn__proc_io_init(proc_t *p, int lfd, double orphan_timeout, int relay_fd);
/*
 * One round of the connection's holder: the status line, the orphan clock,
 * one poll of at most wait_ns, then what arrived, its CALLs into q for the
 * caller to run or queue. Returns 1 when the proc should leave (orphaned,
 * or poll failed), else 0.
 */
int mn__proc_io_step(proc_t *p, batch_t *q, int64_t wait_ns);

/* ---- proc_handover.c: the executor, its writes, and who holds the connection ------------ */

/* Writes bytes to `session`'s controller connection, if that session is the one being served (PONGs). */
void mn__proc_send_bytes(proc_t *p, uint64_t session, const char *data, size_t n);
/* The executor thread (pthread entry): runs calls, holding the connection while it is idle. */
void *mn__proc_executor(void *arg);
/* The I/O thread, run by the process's main thread; it never returns (the proc leaves by _exit). */
_Noreturn void mn__proc_io_thread(proc_t *p);

#endif
