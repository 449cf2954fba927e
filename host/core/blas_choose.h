/*
 * blas_choose.h - the OpenBLAS core type a process gives what it starts
 * (issue 34), measured rather than guessed: each candidate core type
 * (blas_cpu.h) runs in a probe process of its own (`monarch-worker
 * --blas-probe CORE`: the products of our kernels, checked and timed), and
 * the fastest that computes right wins if it beats OpenBLAS's own choice by
 * MN_BLAS_GAIN. The answer is kept in the user's cache directory for this
 * CPU and this OpenBLAS library (blas_cache.c), so only the first agent or
 * monarch-run on a machine pays for the probes. Used by the host agent
 * (agent_blas.c) for its procs and by monarch-run for its own process.
 */
#ifndef MN_BLAS_CHOOSE_H
#define MN_BLAS_CHOOSE_H

#include "blas_cpu.h"

#include <stddef.h>

#define MN_BLAS_MAX_TRIALS (MN_BLAS_MAX_CANDIDATES + 1) /* OpenBLAS's own choice and the candidates */
#define MN_BLAS_GAIN 1.10      /* a candidate must beat OpenBLAS's own choice by this factor */
#define MN_BLAS_PROBE_MS 5000  /* a probe that has not answered by then is killed and counts as failed */
#define MN_BLAS_PICKED "MONARCH_BLAS_PICKED" /* set beside OPENBLAS_CORETYPE where we set it, not the user */

typedef struct {
  mn_blas_trial_t trial[MN_BLAS_MAX_TRIALS]; /* [0]: OpenBLAS's own choice */
  int n;                                     /* trials made */
  int chosen;                                /* the one to run: 0, or a candidate that won */
  char version[16];                          /* OpenBLAS's version, as its probe read it: "0.3.21" */
  char lib[256];                             /* the library's real path, as its probe found it */
  int cached;                                /* read from the cache, not measured now */
  double probe_ms;                           /* what finding it cost */
} mn_blas_choice_t;

/*
 * Runs `worker --blas-probe CORE` (core NULL: OpenBLAS's own choice, with
 * the environment as it is) and fills t from its summary line; where the
 * probe ran, its library's version and path into c (may be NULL).
 */
void mn_blas_probe(const char *worker, const char *core, mn_blas_trial_t *t, mn_blas_choice_t *c);
/*
 * The automatic choice: from the cache where it holds one for this CPU and
 * library, else by probing OpenBLAS's own choice and each candidate, one
 * after another (they would slow each other down side by side); the answer
 * is then cached. Call it with OPENBLAS_CORETYPE unset. Fills c.
 */
void mn_blas_choose(const char *worker, mn_blas_choice_t *c);
/* Whether OPENBLAS_CORETYPE, if set, was set by us (MN_BLAS_PICKED beside it), not by the user. */
int mn_blas_env_ours(void);
/* Sets OPENBLAS_CORETYPE (and MN_BLAS_PICKED) to core, or unsets both for NULL. */
void mn_blas_env_set(const char *core);
/*
 * monarch-run's own process, before anything loads OpenBLAS (prefix: the
 * install's, whose bin/monarch-worker probes): the user's OPENBLAS_CORETYPE
 * stands; else MONARCH_BLAS_CORETYPE (auto, off or a core type name, checked
 * by one probe) decides OPENBLAS_CORETYPE, which the agent monarch-run
 * starts inherits marked as ours (MN_BLAS_PICKED).
 */
void mn_blas_env_init(const char *prefix);

/* ---- blas_cache.c: the choice kept per CPU and OpenBLAS library ---------------------------------- */

/*
 * The cache file for this CPU into path: $XDG_CACHE_HOME/monarch (or
 * ~/.cache/monarch) /blas-<hash of the CPU and the library search path>.
 * Returns 0, or -1 where there is no home to keep it in.
 */
int mn_blas_cache_path(char *path, size_t n);
/* Fills c from the cache; 0, or -1 (none, another CPU, or its library changed since: stat differs). */
int mn_blas_cache_read(const char *path, mn_blas_choice_t *c);
/* Writes c (atomically: a new file renamed over the old); 0 or -1. */
int mn_blas_cache_write(const char *path, const mn_blas_choice_t *c);
/* Holds the lock beside the cache file while probing, so agents starting at once probe once; fd or -1. */
int mn_blas_cache_lock(const char *path);

#endif
