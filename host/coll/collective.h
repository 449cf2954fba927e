/*
 * collective.h - the proc's CPU data plane: collectives (all_reduce,
 * broadcast, all_gather, reduce_scatter, barrier) over groups of procs, and
 * proc-to-proc tensor copies, all over direct proc-to-proc TCP links that
 * never pass through the controller. docs/collectives.md is the design.
 *
 * Each proc opens a second listening socket, the data port. An acceptor
 * thread runs the server side of the token handshake on every connection,
 * reads one identification frame saying what the link is for, and parks the
 * authenticated socket in a table. The executor thread, running a built-in,
 * claims the sockets it waits for from that table (with a timeout naming the
 * peer that never came). Everything else - groups, collectives, copies - runs
 * on the executor thread alone.
 *
 * Layers: pure helpers (reduction ops, segment arithmetic, step headers:
 * coll_ops.c), then an mn_coll_t instance API that tests drive directly
 * (several instances in one process: coll_link.c, coll_ring.c,
 * collective.c, coll_layout.c, coll_shm.c, coll_copy.c), then mn_coll_start(), which opens
 * the process's instance and registers the "__coll_" built-ins with the
 * executor (coll_proc.c).
 */
#ifndef MN_COLLECTIVE_H
#define MN_COLLECTIVE_H

#include "auth.h"
#include "monarch_kernel.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MN_COLL_MAGIC 0x4d4e434cu         /* "MNCL": first bytes of every step header */
#define MN_COLL_HDR_LEN 32                 /* bytes of a step header on the wire */
#define MN_COLL_CHUNK (1u << 20)           /* bytes a reducing receive takes in before reducing */
#define MN_COLL_SMALL (64u << 10)          /* all_reduce below this many bytes uses the star */
#define MN_COLL_STAR_MAX (16u << 20)       /* most bytes member 0 buffers for the star */
#define MN_COLL_CMA_MIN (1u << 20)         /* same-host links copy directly from this many bytes up */
#define MN_COLL_TIMEOUT_DEFAULT 60.0       /* seconds without progress before failing; MONARCH_COLL_TIMEOUT */
#define MN_COLL_MAX_MEMBERS 4096           /* most members of one group */
#define MN_COLL_MAX_GROUPS 1024            /* most groups one proc holds at once */
#define MN_COLL_MAX_PARKED 1024            /* most accepted links waiting to be claimed */
#define MN_COLL_MAX_IDENT 256              /* largest identification frame, bytes */
#define MN_COLL_MAX_ABORT_MSG 900          /* longest reason an ABORT header carries */
#define MN_COLL_MAX_ADDR 300               /* longest "host:port" of a member */
#define MN_COLL_HOST_KEY 32                /* bytes naming a member's host: a hash of its boot id or MONARCH_HOST_KEY */

/* What a step header announces. */
typedef enum {
  MN_COLL_ALL_REDUCE = 1,
  MN_COLL_BROADCAST = 2,
  MN_COLL_ALL_GATHER = 3,
  MN_COLL_REDUCE_SCATTER = 4,
  MN_COLL_BARRIER = 5,
  MN_COLL_SEND = 6,    /* proc-to-proc copy: the receiver's go-ahead */
  MN_COLL_ABORT = 7,   /* the sender gave up; nbytes of reason text follow */
  MN_COLL_KERNEL_END = 8, /* a kernel given the group returned (mn_coll_fence) */
} mn_coll_kind_t;

typedef enum { MN_COLL_SUM = 0, MN_COLL_MAX = 1, MN_COLL_MIN = 2, MN_COLL_AVG = 3 } mn_coll_op_t;

/* What an accepted link is for (the first element of its identification frame). */
typedef enum { MN_COLL_LINK_RING = 1, MN_COLL_LINK_STAR = 2, MN_COLL_LINK_P2P = 3, MN_COLL_LINK_LEADER = 4 } mn_coll_link_t;

/* ---- pure helpers (no sockets; unit-tested) ------------------------------- */

/* "sum" | "max" | "min" | "avg" -> mn_coll_op_t (non-negative), or MN_EINVAL. */
int mn_coll_op_parse(const char *s, size_t n);
const char *mn_coll_op_name(int op);
const char *mn_coll_kind_name(int kind);
/* 1 when all_reduce / reduce_scatter support the dtype (f32, f64, i32, i64), else 0 (a predicate, never fails). */
int mn_coll_dtype_ok(mk_dtype_t dt);
/*
 * out[i] = a[i] op b[i] for count elements. out may be a (in place); b
 * must not overlap out. Integer sums wrap (two's complement) instead of
 * overflowing. MN_COLL_AVG reduces like MN_COLL_SUM; mn_coll_divide finishes it.
 */
void mn_coll_reduce(void *out, const void *a, const void *b, size_t count, mk_dtype_t dt, int op);
/* p[i] /= n, for the average; integers truncate toward zero. */
void mn_coll_divide(void *p, size_t count, mk_dtype_t dt, int n);
/* Segment i of n over count elements: the first count % n segments hold one more. */
void mn_coll_segment(size_t count, int n, int i, size_t *first, size_t *len);

typedef struct {
  uint8_t kind;     /* mn_coll_kind_t */
  uint8_t op;       /* mn_coll_op_t, for reductions */
  uint8_t dtype;    /* mk_dtype_t */
  uint32_t rank;    /* the sender's global rank, for messages */
  uint32_t root;    /* broadcast root (member index) */
  uint64_t seq;     /* collectives this group ran before this one, plus one */
  uint64_t nbytes;  /* bytes of the caller's tensor (ABORT: of the reason) */
} mn_coll_hdr_t;

void mn_coll_hdr_pack(const mn_coll_hdr_t *h, unsigned char out[MN_COLL_HDR_LEN]);
/* Returns 0, or MN_EPROTO when the magic is wrong (the peer is not in step with us). */
int mn_coll_hdr_unpack(const unsigned char in[MN_COLL_HDR_LEN], mn_coll_hdr_t *h);
/*
 * Compares the header a peer sent with ours for the same step. Returns 0
 * when they describe the same collective, else MN_EPEER with a message like
 * "rank 2 called all_reduce(sum, f32) of 4096 bytes but rank 1 called
 * broadcast(root 0, f32) of 16 bytes".
 */
int mn_coll_hdr_check(const mn_coll_hdr_t *mine, const mn_coll_hdr_t *theirs, char *err, size_t errlen);

/* ---- instances ------------------------------------------------------------ */

typedef struct mn_coll_s mn_coll_t;

/*
 * Opens an instance: listens on bind_host (a free port) and starts the
 * acceptor thread. auth is copied. rank names this proc in messages.
 * Returns 0 and sets *out, or a negative code with err set: MN_ENOMEM, or
 * -errno from listening or starting the thread.
 */
int mn_coll_open(mn_coll_t **out, const char *bind_host, const mn_auth_t *auth, int rank, char *err,
                 size_t errlen);
/* Stops the acceptor, closes every link and group, frees the instance. */
void mn_coll_close(mn_coll_t *c);
/* The data port (bound at open, so always a port number) and the rank given to mn_coll_open. */
int mn_coll_port(const mn_coll_t *c);
int mn_coll_rank(const mn_coll_t *c);
/* Seconds without progress before a wait fails (default MONARCH_COLL_TIMEOUT or 60). */
void mn_coll_set_timeout(mn_coll_t *c, double seconds);
/*
 * Whether groups set up from now on may copy directly from the memory of
 * members on this host (process_vm_readv; one copy instead of TCP's two).
 * On by default unless MONARCH_COLL_CMA=0; TCP is used wherever it fails.
 */
void mn_coll_set_cma(mn_coll_t *c, int on);
/*
 * Whether groups set up from now on whose members all share this host run
 * their collectives in shared memory (coll_shm.h) instead of over their
 * links. On by default unless MONARCH_COLL_SHM=0; needs cma on too.
 */
void mn_coll_set_shm(mn_coll_t *c, int on);
/*
 * What names this proc's host to its groups' other members (any string;
 * its hash is what is sent): by default the kernel's boot id, so procs
 * sharing a kernel (network namespaces included) are one host;
 * MONARCH_HOST_KEY overrides it. Groups set up from now on use it.
 */
void mn_coll_set_host_key(mn_coll_t *c, const char *key);
/* A flag that, once nonzero, makes waits fail with "cancelled" (may be NULL). */
void mn_coll_set_cancel(mn_coll_t *c, atomic_int *cancel);

/*
 * The operations below run on one thread per instance (the executor) and
 * block until done. Each returns 0, or a negative code (err.h) with a
 * message in err:
 *   MN_ENOTFOUND  this proc has no such group
 *   MN_EINVAL     bad arguments (a collective's: the group is aborted too)
 *   MN_EPEER      a member died, gave up, refused or called something else
 *   MN_ETIMEDOUT  a member sent or took nothing for the timeout
 *   MN_ECANCELED  the cancel flag was set
 *   MN_EPROTO     a member sent bytes out of step
 *   MN_ENOMEM, MN_ELIMIT (mn_coll_group), or -errno from a failed system call
 * A failure inside a group's collective tears the group down on this member
 * (its links close, so the other members fail fast too) and the group must be
 * set up again under a new id. *mismatch, when not NULL, is set to 1 when the
 * failure (MN_EPEER) was two members calling different collectives.
 */

/*
 * Joins group gid as member `me` of n: connects to the next member of the
 * ring (and, unless me is 0, to member 0 for the star), then waits for the
 * previous member (and, on member 0, every other member). addrs are the
 * members' data addresses "host:port"; ranks (may be NULL) their global
 * ranks, for messages. A group already known under gid is replaced. Fails
 * with MN_EINVAL (me, n or an address out of range), MN_ELIMIT (this proc
 * holds MN_COLL_MAX_GROUPS), MN_ETIMEDOUT (a member never connected) or a
 * link's code (-errno from connecting, MN_EAUTH, ...).
 */
int mn_coll_group(mn_coll_t *c, uint64_t gid, int me, int n, const char *const *addrs, const int *ranks,
                  char *err, size_t errlen);
/* How group gid is laid out: MN_COLL_FLAT, MN_COLL_ONE_HOST or MN_COLL_HOSTS (>= 0); MN_ENOTFOUND when unknown. */
typedef enum {
  MN_COLL_FLAT = 0,     /* every collective over the links (ring, star) */
  MN_COLL_ONE_HOST = 1, /* every member on this host: every collective in shared memory */
  MN_COLL_HOSTS = 2     /* several hosts with several members on some: all_reduce in shared memory per host
                           and a ring of one leader per host; the other collectives over the links */
} mn_coll_layout_t;
int mn_coll_group_layout(mn_coll_t *c, uint64_t gid);
/* Forgets group gid, closing its links; 0 whether or not it existed. */
int mn_coll_group_free(mn_coll_t *c, uint64_t gid);
/*
 * Gives up on group gid between collectives: the next member is told why
 * (it fails its current or next collective with that reason) and the links
 * close. For a member that cannot take part, e.g. given bad arguments.
 * Returns 0 whether or not the group existed.
 */
int mn_coll_group_abort(mn_coll_t *c, uint64_t gid, const char *why);

int mn_coll_all_reduce(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int op, char *err, size_t errlen,
                       int *mismatch);
int mn_coll_broadcast(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int root, char *err, size_t errlen,
                      int *mismatch);
/* dst holds n * numel(src) elements, member i's src at block i. */
int mn_coll_all_gather(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, char *err,
                       size_t errlen, int *mismatch);
/* src holds n * numel(dst) elements; member i gets the reduction of block i. src is not modified. */
int mn_coll_reduce_scatter(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, int op,
                           char *err, size_t errlen, int *mismatch);
int mn_coll_barrier(mn_coll_t *c, uint64_t gid, char *err, size_t errlen, int *mismatch);
/*
 * A barrier that marks the end of a kernel that was given the group: a
 * member that ran fewer collectives in the kernel than another meets that
 * one's next collective here and both fail with a mismatch ("rank 1
 * returned from its kernel but rank 0 called all_reduce(...)") instead of
 * waiting for the timeout.
 */
int mn_coll_fence(mn_coll_t *c, uint64_t gid, char *err, size_t errlen, int *mismatch);
/* This member's index and the member count of group gid: 0, or MN_ENOTFOUND. */
int mn_coll_group_info(mn_coll_t *c, uint64_t gid, int *me, int *n);

/*
 * Proc-to-proc copy. send connects to the receiver's data port ("host:port")
 * and, once the receiver's recv for the same tag has checked the size and
 * dtype, streams t's memory; recv lands the bytes in place in t. (The
 * __coll_send built-in also takes the address "local": a copy within one
 * proc, done by the matching __coll_recv.) Both fail as above; MN_EPEER
 * also when the two ends disagree on size or dtype (recv refuses, send hears
 * why), MN_ETIMEDOUT when the other end never comes.
 */
int mn_coll_send(mn_coll_t *c, const mk_tensor_t *t, const char *addr, uint64_t tag, char *err,
                 size_t errlen);
int mn_coll_recv(mn_coll_t *c, mk_tensor_t *t, uint64_t tag, char *err, size_t errlen);

/* ---- the proc's instance ---------------------------------------------------- */

/*
 * The process's one instance (a proc has one data port): opened once by
 * the proc at start, then reached through mn_coll_instance() (NULL before).
 * Returns 0, or mn_coll_open's code with err set.
 */
int mn_coll_instance_open(const char *bind_host, const mn_auth_t *auth, int rank, char *err, size_t errlen);
mn_coll_t *mn_coll_instance(void);

/*
 * Watching peers from other code on the executor thread (the NCCL waits in
 * gpu.c): gid names a group of the process's instance on which nothing is
 * ever sent. Returns 0 while every member's links are quiet, or a negative
 * code with err naming the member that died or gave up (`what` names the
 * caller's operation): MN_EPEER, MN_EPROTO (it sent bytes), or the link's
 * -errno. 0 when there is no such group.
 */
int mn_coll_watch(uint64_t gid, const char *what, char *err, size_t errlen);
/* Frees a watch group (closing its links, so its other members notice too). */
void mn_coll_watch_free(uint64_t gid);

#endif
