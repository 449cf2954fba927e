/*
 * coll_int.h - what the files of the CPU data plane share and nothing else
 * sees: the instance and group structs, the link and transfer helpers
 * (coll_link.c), the ring engine (coll_ring.c) and the group helpers
 * (collective.c) that the copies (coll_copy.c) and the process instance
 * (coll_inst.c) use. The public API is collective.h.
 */
#ifndef MN_COLL_INT_H
#define MN_COLL_INT_H

#include "collective.h"

#include "clock.h"
#include "coll_shm.h"
#include "dtype.h"
#include "handshake.h"
#include "sock.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MN_COLL_POLL_SLICE_MS 100 /* longest single poll, so cancellation is seen promptly */
#define MN_COLL_MAX_HS_FRAME 4096 /* largest handshake frame read before authentication */
#define MN_COLL_CMA_CHUNK (1u << 20) /* same host: bytes per announcement and per copy (measured best) */
#define MN_COLL_CTL_LEN 24        /* bytes of a same-host control message */
#define MN_COLL_CTL_ANNOUNCE 1    /* sender -> receiver: [kind, step, address, bytes ready] */
#define MN_COLL_CTL_ACK 2         /* receiver -> sender: [kind, step, bytes copied, 0] */
#define MN_COLL_COPY_PULL 1       /* a copy's go-ahead, in the header's op: the receiver copies from the sender's memory */
#define MN_COLL_PULL_CHUNK (16u << 20) /* same host: bytes a copy reads per call */
#define MN_COLL_PULL_MIN_RATE 100e6    /* bytes/s a same-host copy is given at least, on top of the timeout */

typedef struct {
  int kind;        /* mn_coll_link_t; 0 marks a free slot */
  uint64_t key;    /* group id or copy tag */
  uint32_t from;   /* member index (ring, star) or sender rank (p2p) */
  uint64_t nbytes; /* p2p: bytes the sender will send */
  int dtype;       /* p2p: the sender's dtype */
  uint64_t pid, addr, cookie_addr, cookie; /* p2p: where to copy from directly, and the proof of a shared host */
  int fd;
  uint64_t order;  /* arrival order: the oldest is evicted when the table is full */
} parked_t;

typedef struct group_s {
  uint64_t id;
  int n, me;
  int next_fd, prev_fd;  /* ring: we send to next, receive from prev */
  int next_cma;          /* next copies from our memory itself (same host) */
  int prev_cma;          /* we copy from prev's memory (same host) */
  int key_no_copy;       /* a ring neighbour has our host key but no direct copy works: no shared memory */
  int *lmembers;         /* MN_COLL_HOSTS / ONE_HOST: the group index of each member of this host, in order */
  int nlocal;
  pid_t prev_pid;
  int *star;             /* member 0: star[i] links member i; others: star[0] links member 0 */
  char **addrs;          /* member data addresses, for messages */
  int *ranks;            /* member global ranks, for messages (-1: unknown) */
  int layout;            /* mn_coll_layout_t */
  mn_shm_t *shm;         /* the region of this member's host (coll_shm.h); NULL when flat or alone on it */
  int nhosts, host;      /* MN_COLL_HOSTS: hosts, and this member's (numbered by their first member) */
  int lead;              /* MN_COLL_HOSTS: this member leads its host in the leaders' ring */
  int lnext, lprev;      /* MN_COLL_HOSTS, leaders: the next and previous leaders (member indices) */
  int lnext_fd, lprev_fd; /* and the links to them */
  uint64_t seq;          /* collectives started on this group */
  struct group_s *next;
} group_t;

struct mn_coll_s {
  mn_auth_t auth;
  int rank;
  int lfd, port;
  pthread_t acceptor;
  int acceptor_started;
  atomic_int stopping;
  pthread_mutex_t lock;   /* guards parked[] */
  pthread_cond_t cond;    /* signalled when a link is parked */
  parked_t parked[MN_COLL_MAX_PARKED];
  uint64_t arrivals;
  int timeout_ms;
  int cma;                /* 1: try single-copy links to members on this host */
  int shm;                /* 1: groups entirely on this host use shared memory (needs cma) */
  size_t shm_piece;       /* bytes per staging buffer asked for (0: the default) */
  char host_key[MN_COLL_HOST_KEY]; /* names this proc's host to its groups (mn_coll_set_host_key) */
  int spin_us;            /* a transfer yields this long before it sleeps (MONARCH_SPIN_US) */
  uint64_t cookie;        /* random; a peer that can read it from our memory shares our host */
  atomic_int *cancel;
  group_t *groups;        /* executor thread only, like everything below */
  int ngroups;
  char *tmp;              /* MN_COLL_CHUNK bytes for reducing receives */
  char *star_buf;         /* member 0's star receive buffer */
  size_t star_cap;
};

/* ---- small helpers ------------------------------------------------------------------------ */

static inline int mn__coll_cancelled(const mn_coll_t *c) { return c->cancel != NULL && atomic_load(c->cancel) != 0; }

static inline void mn__coll_close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static inline int mn__coll_mod(int a, int n) { return ((a % n) + n) % n; }

static inline void mn__coll_put_be64(unsigned char *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static inline uint64_t mn__coll_get_be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return v;
}

/* ---- links and transfers (coll_link.c) ------------------------------------------------------ */

/* Blocking-with-deadline I/O: 0, MN_ECLOSED, MN_ETIMEDOUT or -errno. */
int mn__coll_read_exact(int fd, void *p, size_t n, int64_t deadline);
int mn__coll_write_exact(int fd, const void *p, size_t n, int64_t deadline);
/* Waits for the link parked under (kind, key, from): 0, MN_ECANCELED or MN_ETIMEDOUT. */
int mn__coll_claim(mn_coll_t *c, int kind, uint64_t key, int64_t from, parked_t *out);
/*
 * Connects to a peer's data port, authenticates and identifies the link: the
 * fd (>= 0), or a negative code with err: MN_EINVAL (bad address), -errno
 * (connecting), the handshake's MN_E* code, or the I/O code.
 */
int mn__coll_link_open(mn_coll_t *c, const char *addr, int kind, uint64_t key, uint32_t from, uint64_t nbytes,
                       int dtype, const void *data, char *err, size_t errlen);
/*
 * Fill err for a failed or a stalled transfer. fail_io returns MN_EPEER for
 * code MN_ECLOSED (the peer closed its link), else code itself (-errno,
 * MN_ETIMEDOUT); fail_stall returns MN_ECANCELED or MN_ETIMEDOUT.
 */
int mn__coll_fail_io(char *err, size_t errlen, const char *what, const char *who, int sending, int code);
int mn__coll_fail_stall(mn_coll_t *c, char *err, size_t errlen, const char *what, const char *who, int sending);
/* One nonblocking attempt: bytes moved (0: would block) or a negative code. */
ssize_t mn__coll_try_io(int fd, int send_, char *p, size_t n);

typedef struct {
  int fd;
  int send;         /* 1: send buf; 0: receive into buf */
  char *buf;
  size_t len, done;
  const char *who;  /* the peer, for messages: "rank 3 (host:port)" */
} xfer_t;

/* poll(), after yielding the core for MONARCH_SPIN_US while nothing is ready: the ready count, or -errno. */
int mn__coll_poll(mn_coll_t *c, struct pollfd *pf, nfds_t n, int timeout_ms);

/*
 * Runs every transfer to completion; 0, or a negative code with err:
 * fail_io's or fail_stall's, MN_ENOMEM, or -errno from poll.
 */
int mn__coll_xfer_run(mn_coll_t *c, xfer_t *xs, int nx, const char *what, char *err, size_t errlen);

/* ---- the ring (coll_ring.c) ------------------------------------------------------------------ */

/*
 * A piece is what one step sends or receives. A received piece either lands
 * in place (a == NULL: the bytes go straight into buf) or is reduced:
 * buf = a op received, through the chunk buffer.
 */
typedef struct {
  char *buf;
  const char *a;
  size_t len;
  int divide; /* the last reduction of an average: divide after reducing */
} piece_t;

typedef struct ring_s ring_t;
struct ring_s {
  int send_fd, recv_fd;
  int send_cma;       /* same host: announce ready bytes; the next member copies them itself */
  int recv_cma;       /* same host: copy from the previous member's memory (process_vm_readv) */
  pid_t prev_pid;
  int nsend, nrecv;   /* steps in each stream */
  int lag;            /* send step j >= lag waits on receive step j - lag; < 0: never waits */
  int reuse_from;     /* receive step j >= reuse_from overwrites what send step j - reuse_dist sent: */
  int reuse_dist;     /* it waits until the next member has copied that (0: never) */
  void (*piece)(const ring_t *r, int step, int sending, piece_t *p);
  mk_dtype_t dtype;
  int op, n, me;
  size_t esize;
  const char *next_who, *prev_who, *what;
  /* algorithm data */
  char *data;         /* the tensor (all_reduce, broadcast), dst (all_gather) */
  const char *src;    /* reduce_scatter input */
  char *buf[2];       /* reduce_scatter double buffer */
  size_t count;       /* elements: whole tensor (all_reduce), one block (gather, scatter) */
};

/*
 * Runs r's two streams to completion; 0, or a negative code with err: as
 * mn__coll_xfer_run, and MN_EPROTO (a control message out of step), MN_EPEER
 * (a same-host copy read nothing), MN_EINVAL (a ring that cannot progress).
 */
int mn__coll_ring_run(mn_coll_t *c, ring_t *r, char *err, size_t errlen);

/* ---- groups (collective.c) ------------------------------------------------------------------- */

group_t *mn__coll_group_find(mn_coll_t *c, uint64_t gid);
/* Closes the group's links and region and frees it. */
void mn__coll_group_destroy(mn_coll_t *c, group_t *g);
/* 1 when process pid holds cookie at addr: it shares our host and lets us copy from its memory; else 0. */
int mn__coll_same_host(const mn_coll_t *c, uint64_t pid, uint64_t addr, uint64_t cookie);
/* 0 for a CPU tensor; MN_EINVAL with err naming `arg` otherwise. */
int mn__coll_check_cpu(const mk_tensor_t *t, const char *what, const char *arg, char *err, size_t errlen);
/* "rank 3 (host:port)" for member i, for messages. */
void mn__coll_member_name(const group_t *g, int i, char *buf, size_t n);
/* Waits for member `from`'s link of `kind` to group g; 0, or MN_ETIMEDOUT or MN_ECANCELED with err naming it. */
int mn__coll_claim_member(mn_coll_t *c, group_t *g, int kind, int from, int *fd, char *err, size_t errlen);
/*
 * Lays g out by host (coll_layout.c): regions, layout, leaders' links. A
 * negative code with err only when a link fails or memory runs out.
 */
int mn__coll_setup_layout(mn_coll_t *c, group_t *g, char *err, size_t errlen);
/*
 * For a group that sends nothing on its links: 0 while they are quiet, else
 * MN_EPEER, MN_EPROTO or the link's -errno, with err naming who died or gave up.
 */
int mn__coll_group_peer_check(group_t *g, const char *what, char *err, size_t errlen);

#endif
