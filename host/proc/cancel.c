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
}

int mn_cancel_request(mn_cancel_t *c, uint64_t session, uint64_t seq) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  adopt_session(c, session);
  if (c->running == seq && seq != 0) {
    c->hit = 1;
    atomic_store(c->flag, 1);
    rc = 1;
  } else if (c->n == MN_CANCEL_MAX) {
    rc = MN_ELIMIT;
  } else {
    c->seqs[c->n++] = seq;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int mn_cancel_begin(mn_cancel_t *c, uint64_t session, uint64_t seq) {
  int found = 0;
  pthread_mutex_lock(&c->lock);
  adopt_session(c, session);
  c->running = seq;
  for (int i = 0; i < c->n;) {
    if (c->seqs[i] <= seq) {
      found |= c->seqs[i] == seq;
      c->seqs[i] = c->seqs[--c->n];
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return found;
}

int mn_cancel_end(mn_cancel_t *c) {
  pthread_mutex_lock(&c->lock);
  int hit = c->hit;
  c->running = 0;
  c->hit = 0;
  if (hit) atomic_store(c->flag, 0);
  pthread_mutex_unlock(&c->lock);
  return hit;
}
