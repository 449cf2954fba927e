/*
 * agent_pids.c - the agent's live procs by pid. CAST, ACKS, KILL and PERSIST
 * name procs by pid; they find each one here in a few probes instead of
 * walking every handle of the loop (which, for a simulated group, holds
 * thousands of other agents' handles too). An open-addressing table with
 * linear probing; a removal shifts the entries behind it back, so there are
 * no tombstones and a lookup ends at the first empty slot. A proc is added
 * once uv_spawn has given it a pid and removed when it exits.
 */
#include "agent_int.h"

#define MN_PIDS_MIN 16 /* slots of the first table; it doubles before it is half full */

/* The slot where pid's probe starts. Pids come in runs: Fibonacci hashing spreads them. */
static size_t home(const apids_t *t, int64_t pid) {
  return (size_t)(((uint64_t)pid * 0x9E3779B97F4A7C15ull) >> 32) & (t->cap - 1);
}

/* The slot holding pid, or the empty slot where its probe ends. */
static size_t probe(const apids_t *t, int64_t pid) {
  size_t i = home(t, pid);
  while (t->slot[i].p != NULL && t->slot[i].pid != pid) i = (i + 1) & (t->cap - 1);
  return i;
}

int mn__agent_pids_reserve(agent_t *a) {
  apids_t *t = &a->pids;
  if ((t->count + 1) * 2 <= t->cap) return 0;
  apids_t grown = {NULL, t->cap ? t->cap * 2 : MN_PIDS_MIN, t->count};
  if ((grown.slot = calloc(grown.cap, sizeof(*grown.slot))) == NULL) return UV_ENOMEM;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slot[i].p != NULL) grown.slot[probe(&grown, t->slot[i].pid)] = t->slot[i];
  free(t->slot);
  *t = grown;
  return 0;
}

void mn__agent_pids_add(agent_t *a, aproc_t *p) {
  apids_t *t = &a->pids;
  size_t i = probe(t, p->proc.pid);
  if (t->slot[i].p == NULL) t->count++;
  /* An entry for the same pid is a proc whose exit has not been seen yet: the pid is the new one's now. */
  t->slot[i].pid = p->proc.pid;
  t->slot[i].p = p;
}

void mn__agent_pids_remove(agent_t *a, aproc_t *p) {
  apids_t *t = &a->pids;
  if (t->count == 0) return;
  size_t i = probe(t, p->proc.pid), mask = t->cap - 1;
  if (t->slot[i].p != p) return;
  /* Each later entry of the run moves into the hole unless its probe starts after the hole (cyclically). */
  for (size_t j = (i + 1) & mask; t->slot[j].p != NULL; j = (j + 1) & mask) {
    size_t k = home(t, t->slot[j].pid);
    int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    t->slot[i] = t->slot[j];
    i = j;
  }
  t->slot[i].p = NULL;
  t->count--;
}

aproc_t *mn__agent_pids_find(const agent_t *a, int64_t pid) {
  const apids_t *t = &a->pids;
  if (t->count == 0) return NULL;
  return t->slot[probe(t, pid)].p;
}

void mn__agent_pids_free(agent_t *a) {
  free(a->pids.slot);
  memset(&a->pids, 0, sizeof(a->pids));
}
