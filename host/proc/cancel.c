/* cancel.c - the calls a proc was asked to stop; see cancel.h. */
#include "cancel.h"

#include "err.h"

#include <string.h>

int mn_cancel_init(mn_cancel_t *c, atomic_int *flag) {
  memset(c, 0, sizeof(*c));
  c->flag = flag;
  int rc = pthread_mutex_init(&c->lock, NULL);
  return rc == 0 ? 0 : -rc;
}

void mn_cancel_close(mn_cancel_t *c) { pthread_mutex_destroy(&c->lock); }

/* Drops what belongs to another session. Caller holds the lock. */
static void adopt_session(mn_cancel_t *c, uint64_t session) {
  if (c->session == session) return;
  c->session = session;
  c->n = 0;
  atomic_store(&c->npending, 0);
}

/*
 * The executor takes the lock only when a request is pending or hit its
 * call: each side publishes its half (running; npending) before it reads the
 * other's, so with sequentially consistent atomics at least one of them sees
 * the other and the lock then orders them.
 */
int mn_cancel_request(mn_cancel_t *c, uint64_t session, uint64_t seq) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  adopt_session(c, session);
  if (c->n == MN_CANCEL_MAX) {
    rc = MN_ELIMIT;
  } else {
    c->seqs[c->n++] = seq;
    atomic_fetch_add(&c->npending, 1);
    if (seq != 0 && atomic_load(&c->running) == seq) {
      atomic_store(&c->hit, 1);
      atomic_store(c->flag, 1);
      rc = 1;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int mn_cancel_begin(mn_cancel_t *c, uint64_t session, uint64_t seq) {
  atomic_store(&c->running, seq);
  /* After publishing `running`: mn_cancel_retire publishes `retired` before it reads `running`. */
  if (session != 0 && atomic_load(&c->retired) == session) return 1;
  if (atomic_load(&c->npending) == 0) return 0; /* the common case: nothing was asked */
  int found = 0;
  pthread_mutex_lock(&c->lock);
  adopt_session(c, session);
  for (int i = 0; i < c->n;) {
    if (c->seqs[i] <= seq) {
      found |= c->seqs[i] == seq;
      c->seqs[i] = c->seqs[--c->n];
    } else {
      i++;
    }
  }
  atomic_store(&c->npending, c->n);
  pthread_mutex_unlock(&c->lock);
  return found;
}

/* A request for the running call, as CANCEL makes one: its ordering with mn_cancel_end is request's own. */
void mn_cancel_retire(mn_cancel_t *c, uint64_t session) {
  if (session == 0) return;
  atomic_store(&c->retired, session);
  uint64_t seq = atomic_load(&c->running);
  if (seq != 0) (void)mn_cancel_request(c, session, seq);
}

int mn_cancel_end(mn_cancel_t *c) {
  atomic_store(&c->running, 0);
  if (atomic_load(&c->npending) == 0 && !atomic_load(&c->hit)) return 0;
  pthread_mutex_lock(&c->lock); /* a request may be setting the flag: let it finish, then clear it */
  int hit = atomic_exchange(&c->hit, 0);
  if (hit) atomic_store(c->flag, 0);
  pthread_mutex_unlock(&c->lock);
  return hit;
}
