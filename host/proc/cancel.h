/*
 * cancel.h - which calls the controller asked a proc to stop (CANCEL).
 *
 * Whichever thread holds the connection records requests; the executor asks, before each call,
 * whether it was cancelled (then it answers without running it) and marks
 * it running, so a request for the running call sets the kernel's cancel
 * flag (mk_cancelled, proc.cancelled) instead. A request never falls
 * between "not cancelled yet" and "running", and a late request for a call
 * that ended never reaches the next one; the executor takes the lock only
 * when a request is pending (cancel.c says how).
 */
#ifndef MN_CANCEL_H
#define MN_CANCEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define MN_CANCEL_MAX 4096 /* cancelled calls remembered ahead of the executor; more are refused */

typedef struct {
  pthread_mutex_t lock;
  uint64_t session;        /* the session the recorded sequence numbers belong to */
  uint64_t seqs[MN_CANCEL_MAX]; /* cancelled and not yet reached, in no order */
  int n;
  _Atomic uint64_t running; /* seq of the call running now (0: none) */
  atomic_int hit;           /* the running call was asked to stop */
  atomic_int npending;      /* n, for the executor's look without the lock */
  atomic_int *flag;         /* the executor's cancel flag, which kernels poll */
  _Atomic uint64_t retired; /* a session another one took over: none of its calls runs any more */
} mn_cancel_t;

/* flag: the cancel flag the executor's kernels see. Returns 0 or -errno. */
int mn_cancel_init(mn_cancel_t *c, atomic_int *flag);
void mn_cancel_close(mn_cancel_t *c);

/*
 * The connection's holder: the controller asks that call `seq` of `session` stop.
 * Returns 1 when it is running now (its flag is set), 0 when recorded for
 * when the executor reaches it (or it already ran: then the request is
 * dropped there), MN_ELIMIT when MN_CANCEL_MAX requests are pending.
 */
int mn_cancel_request(mn_cancel_t *c, uint64_t session, uint64_t seq);

/*
 * Executor, before running call `seq` of `session`: marks it running and
 * returns 1 if it was cancelled before it started (then the caller answers
 * "cancelled" without running it and calls mn_cancel_end), else 0.
 * Requests for older calls of the session are forgotten: they have run. A call of a retired session is
 * cancelled.
 */
int mn_cancel_begin(mn_cancel_t *c, uint64_t session, uint64_t seq);

/*
 * The connection's holder, when another controller's session takes the proc over from `session`: the
 * call running now is stopped (a collective of the old controller would wait for peers that refuse it
 * now, and hold up the new one's calls behind it), and any of session's calls that would start later
 * is answered "cancelled" without running.
 */
void mn_cancel_retire(mn_cancel_t *c, uint64_t session);

/* Executor, after the call: returns 1 if a request arrived while it ran (and clears the flag it set), else 0. */
int mn_cancel_end(mn_cancel_t *c);

#endif
