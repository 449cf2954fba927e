/* replay.c - see replay.h. */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

void mn_replay_init(mn_replay_t *r, size_t max_bytes) {
  memset(r, 0, sizeof(*r));
  r->max_bytes = max_bytes;
}

static void drop_front(mn_replay_t *r) {
  mn_replay_ent_t *e = &r->ring[r->head];
  r->bytes -= e->len;
  free(e->frame);
  e->frame = NULL;
  r->head = (r->head + 1) % r->cap;
  r->count--;
}

void mn_replay_clear(mn_replay_t *r) {
  while (r->count > 0) drop_front(r);
  r->evicted = 0;
}

int mn_replay_add(mn_replay_t *r, uint64_t seq, const char *frame, size_t len) {
  if (r->count == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 1024;
    mn_replay_ent_t *ring = malloc(cap * sizeof(*ring));
    if (ring == NULL) return MN_ENOMEM;
    for (size_t i = 0; i < r->count; i++) ring[i] = r->ring[(r->head + i) % r->cap];
    free(r->ring);
    r->ring = ring;
    r->cap = cap;
    r->head = 0;
  }
  char *copy = malloc(len);
  if (copy == NULL) return MN_ENOMEM;
  memcpy(copy, frame, len);
  r->ring[(r->head + r->count) % r->cap] = (mn_replay_ent_t){seq, copy, len};
  r->count++;
  r->bytes += len;
  while (r->bytes > r->max_bytes && r->count > 1) {
    r->evicted = r->ring[r->head].seq;
    drop_front(r);
  }
  return 0;
}

void mn_replay_trim(mn_replay_t *r, uint64_t acked) {
  while (r->count > 0 && r->ring[r->head].seq <= acked) drop_front(r);
}

const char *mn_replay_find(const mn_replay_t *r, uint64_t seq, size_t *len) {
  if (r->count == 0) return NULL;
  uint64_t first = r->ring[r->head].seq;
  if (seq < first) return NULL;
  /* Seqs are dense from the executor, so the index is usually seq - first. */
  size_t guess = (size_t)(seq - first);
  if (guess < r->count && r->ring[(r->head + guess) % r->cap].seq == seq) {
    const mn_replay_ent_t *e = &r->ring[(r->head + guess) % r->cap];
    *len = e->len;
    return e->frame;
  }
  for (size_t i = 0; i < r->count; i++) {
    const mn_replay_ent_t *e = &r->ring[(r->head + i) % r->cap];
    if (e->seq == seq) {
      *len = e->len;
      return e->frame;
    }
  }
  return NULL;
}
