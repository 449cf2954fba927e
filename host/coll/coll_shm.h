/*
 * coll_shm.h - collectives for groups whose members all share one host,
 * through one shared memory region per group instead of sockets.
 *
 * The first member of the group on the host creates the region (a memfd);
 * the others map it through /proc/<pid>/fd/<fd>, which needs the same
 * permission as reading that process's memory. Each member has a progress counter and a header slot;
 * staging buffers hold one piece of the tensor per member, twice (the next
 * piece fills while the last drains). A collective runs piece by piece in
 * two phases, each ended by waiting for every member's counter:
 *
 *   copy in  -> [all copied]  -> reduce my segment into the shared result
 *            -> [all reduced] -> copy the result out
 *
 * Waiting spins briefly, then sleeps on a futex in the region; between
 * sleeps a caller-supplied check looks for peers that died or gave up. Every
 * element is reduced by exactly one member in member order, so results are
 * bitwise identical on every member and from run to run.
 */
#ifndef MN_COLL_SHM_H
#define MN_COLL_SHM_H

#include "collective.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MN_SHM_PIECE_DEFAULT (256u << 10) /* bytes of the tensor per step, each member's own core (bench/collective.sh) */
#define MN_SHM_PIECE_SHARED (1u << 20)    /* the same with more members than cores: fewer waits pay more */
#define MN_SHM_DATA_MAX (64u << 20)       /* most staging bytes one region holds; the piece shrinks to fit */
#define MN_SHM_PIECE_MIN 4096u            /* smallest piece */
#define MN_SHM_MAX_MEMBERS 256            /* larger groups keep the ring */

typedef struct mn_shm_s mn_shm_t;

/* The piece a region for n members uses when `want` bytes are asked for (0: the default). */
size_t mn_shm_piece_for(int n, size_t want);
/*
 * The first member: creates a region for n members of group gid, marked
 * with a random nonce that the others must present. 0, or with err:
 * MN_EINVAL (bad geometry), MN_ENOMEM, or -errno from memfd_create,
 * ftruncate or mmap.
 */
int mn_shm_create(mn_shm_t **out, int n, size_t piece, uint64_t gid, uint64_t nonce, char *err, size_t errlen);
/*
 * Member me > 0: maps the region that process pid holds open as fd, if it is
 * group gid's with that nonce. 0, or with err: MN_EINVAL (bad geometry, or
 * pid and fd name something that is not this group's region), MN_ENOMEM, or
 * -errno from stat, open or mmap.
 */
int mn_shm_attach(mn_shm_t **out, int n, int me, long pid, int fd, size_t piece, uint64_t gid, uint64_t nonce,
                  char *err, size_t errlen);
/* The creator's descriptor, to name in /proc/<pid>/fd; -1 once dropped (or for other members). */
int mn_shm_fd(const mn_shm_t *s);
/* Closes the creator's descriptor once every member has mapped the region. */
void mn_shm_drop_fd(mn_shm_t *s);
void mn_shm_close(mn_shm_t *s);
/*
 * Tells every member this one gave up on the collective it is in (or
 * refuses the next): they fail that one, or the next they start, with
 * `why`; one they are still finishing is not failed.
 */
void mn_shm_abort(mn_shm_t *s, uint32_t rank, const char *why);

/* One collective, as every member calls it. */
typedef struct {
  const mn_coll_hdr_t *hdr; /* this member's step header: compared with every other member's */
  uint64_t gid;             /* for messages */
  const char *what;
  char *data;               /* all_reduce, broadcast: the tensor; all_gather, reduce_scatter: dst */
  const char *src;          /* all_gather, reduce_scatter: src */
  size_t count;             /* elements: the tensor (all_reduce, broadcast), src (all_gather), dst (reduce_scatter) */
  size_t esize;             /* bytes per element (1 for broadcast and all_gather) */
  int timeout_ms;           /* without any member making progress */
  atomic_int *cancel;       /* may be NULL */
  /* Called between sleeps: a negative code (with err) when a peer is gone, else 0. */
  int (*check)(void *arg, char *err, size_t errlen);
  /* Names member j in messages. */
  void (*name)(void *arg, int j, char *buf, size_t n);
  void *arg;
} mn_shm_op_t;

/*
 * Runs op's collective (the kind, op and dtype are in op->hdr). Returns 0,
 * or with err: MN_EPEER (a member gave up, died or called something else;
 * *mismatch is set for the last), MN_EPROTO (no header where one must be),
 * MN_ETIMEDOUT, MN_ECANCELED, or check's code. After a failure the region is
 * out of step and the group must go.
 */
int mn_shm_run(mn_shm_t *s, const mn_shm_op_t *op, char *err, size_t errlen, int *mismatch);

#endif
