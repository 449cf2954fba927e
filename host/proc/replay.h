/*
 * replay.h - a proc's cache of RESULT frames the controller has not yet
 * acknowledged. After a reconnect the controller resends every unanswered
 * CALL; a CALL that already ran is answered from here instead of running
 * twice. Bounded: past MN_REPLAY_MAX_BYTES the oldest entries are evicted,
 * and a resend that needs one gets a clear "lost" error.
 */
#ifndef MN_REPLAY_H
#define MN_REPLAY_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

#define MN_REPLAY_MAX_BYTES (64u << 20) /* most bytes of unacknowledged results kept */

typedef struct {
  uint64_t seq;
  char *frame;
  size_t len;
} mn_replay_ent_t;

typedef struct {
  mn_replay_ent_t *ring;
  size_t head, count, cap;
  size_t bytes;
  size_t max_bytes;
  uint64_t evicted; /* highest seq dropped for space (not by ack) */
} mn_replay_t;

void mn_replay_init(mn_replay_t *r, size_t max_bytes);
/* Copies a frame in; seqs must arrive in increasing order. 0 or MN_ENOMEM. */
int mn_replay_add(mn_replay_t *r, uint64_t seq, const char *frame, size_t len);
/* Drops entries with seq <= acked. */
void mn_replay_trim(mn_replay_t *r, uint64_t acked);
/* The frame for seq, or NULL (never cached, acknowledged, or evicted: see r->evicted). */
const char *mn_replay_find(const mn_replay_t *r, uint64_t seq, size_t *len);
void mn_replay_clear(mn_replay_t *r);

#endif
