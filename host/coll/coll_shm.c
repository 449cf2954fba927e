/* coll_shm.c - same-host collectives through shared memory; see coll_shm.h and docs/collectives.md. */
#include "coll_shm.h"

#include "coll_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x4d4e534du /* "MNSM" */
#define SLOT_BYTES 128        /* one member's counter and headers: two cache lines, so neighbours never share one */
#define SLEEP_MIN_MS 1        /* first sleep between checks for dead peers; doubles up to SLEEP_MAX_MS */
#define SLEEP_MAX_MS 20
#define SPIN_US_DEFAULT 50    /* busy-wait before sleeping when every member can have its own core */
#define YIELD_US_DEFAULT 100  /* then yield the core before sleeping (bench/collective.sh: 2-5x at 4 procs on 2 cores) */
#define YIELD_US_SHARED 1000  /* the same with more members than cores: a wait spans other members' turns (bench/kcoll.sh) */
#define REDUCE_CHUNK (16u << 10) /* bytes of each member's input reduced at a time: the partial result stays in L1 */
#define OWN_IN_PLACE_MIN (16u << 10) /* all_reduce pieces from this size read a member's own segment from its tensor;
                                        smaller ones copy it in too (reading the tensor was 15% slower at 4 KiB) */

typedef struct {
  uint32_t magic, n;
  uint64_t piece, size;
  uint64_t gid, nonce; /* whose region this is: checked on attach */
  char pad0[64 - 40];
  _Atomic uint32_t gen;      /* bumped by every post; sleepers wait on it */
  _Atomic uint32_t sleepers; /* members inside futex_wait: a post wakes them only when nonzero */
  char pad1[64 - 8];
  _Atomic uint32_t abort_claim; /* the first member to give up claims the reason slot */
  _Atomic uint32_t aborted;     /* set once the reason below is written */
  uint32_t abort_rank;
  uint64_t abort_tick;          /* the aborter's tick: collectives the others finished before it are not failed */
  char reason[MN_COLL_MAX_ABORT_MSG + 1];
} shm_head_t;

typedef struct {
  _Atomic uint64_t progress;                    /* steps this member finished, over the group's life */
  unsigned char hdr[2][MN_COLL_HDR_LEN];         /* step headers, by the collective's seq parity */
  _Atomic int64_t pid;                          /* the member's process, to notice it die */
} shm_slot_t;

_Static_assert(sizeof(shm_slot_t) <= SLOT_BYTES, "slot fits");
_Static_assert(sizeof(shm_head_t) <= 4096, "head fits one page");

struct mn_shm_s {
  char *base;
  size_t size, piece;
  size_t data_off;
  int n, me, fd;
  uint64_t tick;  /* progress every member has reached when no collective runs; identical on all */
  int spin_us;    /* busy-wait before sleeping */
  int yield_us;   /* then sched_yield() before sleeping */
};

static shm_head_t *head(const mn_shm_t *s) { return (shm_head_t *)s->base; }
static shm_slot_t *slot(const mn_shm_t *s, int j) { return (shm_slot_t *)(s->base + 4096 + (size_t)j * SLOT_BYTES); }
static char *in_buf(const mn_shm_t *s, int j, int b) { return s->base + s->data_off + ((size_t)j * 2 + (size_t)b) * s->piece; }
static char *res_buf(const mn_shm_t *s, int b) { return s->base + s->data_off + ((size_t)s->n * 2 + (size_t)b) * s->piece; }

static size_t data_offset(int n) { return (4096 + (size_t)n * SLOT_BYTES + 4095) & ~(size_t)4095; }
static size_t region_size(int n, size_t piece) { return data_offset(n) + ((size_t)n * 2 + 2) * piece; }

/* Members that must share cores pay a sleep per wait, so they take fewer, larger pieces. */
static int oversubscribed(int n) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && n > cpus;
}

size_t mn_shm_piece_for(int n, size_t want) {
  size_t p = want ? want : oversubscribed(n) ? MN_SHM_PIECE_SHARED : MN_SHM_PIECE_DEFAULT;
  size_t most = MN_SHM_DATA_MAX / ((size_t)n * 2 + 2);
  if (p > most) p = most;
  p &= ~(size_t)63; /* whole cache lines, and a multiple of every element size */
  return p < MN_SHM_PIECE_MIN ? MN_SHM_PIECE_MIN : p;
}

static int spin_default(int n) {
  const char *e = getenv("MONARCH_COLL_SPIN_US");
  if (e != NULL && *e) return atoi(e);
  return oversubscribed(n) ? 0 : SPIN_US_DEFAULT; /* spinning pays only when the awaited member can run meanwhile */
}

/* On shared cores the awaited member runs only when another yields: the wait outlasts their turns, not a post. */
static int yield_default(int n) {
  const char *e = getenv("MONARCH_COLL_YIELD_US");
  if (e != NULL && *e) return atoi(e);
  return oversubscribed(n) ? YIELD_US_SHARED : YIELD_US_DEFAULT;
}

static mn_shm_t *shm_new(int n, int me, size_t piece) {
  mn_shm_t *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  s->n = n;
  s->me = me;
  s->piece = piece;
  s->fd = -1;
  s->data_off = data_offset(n);
  s->size = region_size(n, piece);
  s->spin_us = spin_default(n);
  s->yield_us = yield_default(n);
  return s;
}

int mn_shm_create(mn_shm_t **out, int n, size_t piece, uint64_t gid, uint64_t nonce, char *err, size_t errlen) {
  *out = NULL;
  if (n < 2 || n > MN_SHM_MAX_MEMBERS || piece < MN_SHM_PIECE_MIN || piece % 64) {
    snprintf(err, errlen, "shared memory: bad geometry (%d members, piece %zu)", n, piece);
    return MN_EINVAL;
  }
  mn_shm_t *s = shm_new(n, 0, piece);
  if (s == NULL) {
    snprintf(err, errlen, "shared memory: out of memory");
    return MN_ENOMEM;
  }
  s->fd = memfd_create("monarch-coll", MFD_CLOEXEC);
  if (s->fd < 0 || ftruncate(s->fd, (off_t)s->size) != 0) {
    int e = errno;
    snprintf(err, errlen, "shared memory: cannot create a %zu-byte region: %s", s->size, strerror(e));
    mn_shm_close(s);
    return -e;
  }
  s->base = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (s->base == MAP_FAILED) {
    int e = errno;
    s->base = NULL;
    snprintf(err, errlen, "shared memory: cannot map %zu bytes: %s", s->size, strerror(e));
    mn_shm_close(s);
    return -e;
  }
  shm_head_t *h = head(s);
  h->n = (uint32_t)n;
  h->piece = piece;
  h->size = s->size;
  h->gid = gid;
  h->nonce = nonce;
  atomic_store(&slot(s, 0)->pid, (int64_t)getpid());
  h->magic = SHM_MAGIC; /* the others attach only after a socket round trip, which orders this */
  *out = s;
  return 0;
}

int mn_shm_attach(mn_shm_t **out, int n, int me, long pid, int fd, size_t piece, uint64_t gid, uint64_t nonce,
                  char *err, size_t errlen) {
  *out = NULL;
  if (n < 2 || n > MN_SHM_MAX_MEMBERS || me < 1 || me >= n || piece < MN_SHM_PIECE_MIN || piece % 64 ||
      piece > MN_SHM_DATA_MAX || pid <= 0 || fd < 0) {
    snprintf(err, errlen, "shared memory: bad geometry from member 0 (%d members, piece %zu, pid %ld, fd %d)", n,
             piece, pid, fd);
    return MN_EINVAL;
  }
  mn_shm_t *s = shm_new(n, me, piece);
  if (s == NULL) {
    snprintf(err, errlen, "shared memory: out of memory");
    return MN_ENOMEM;
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/%ld/fd/%d", pid, fd);
  /* Only a regular file (a memfd is one): never open a device or FIFO a confused peer names. */
  struct stat st;
  const char *why = NULL;
  int f = -1, rc = 0;
  if (stat(path, &st) != 0) rc = -errno;
  else if (!S_ISREG(st.st_mode)) why = "not a regular file";
  else if ((f = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK)) < 0) rc = -errno;
  else if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) why = "not a regular file"; /* what was opened, not named */
  else if ((size_t)st.st_size < s->size) why = "too small";
  if (rc != 0) why = strerror(-rc);
  else if (why != NULL) rc = MN_EINVAL; /* pid and fd name something that is not a region */
  if (why != NULL) {
    snprintf(err, errlen, "shared memory: cannot open %s: %s", path, why);
    if (f >= 0) close(f);
    mn_shm_close(s);
    return rc;
  }
  s->base = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  rc = s->base == MAP_FAILED ? -errno : 0;
  close(f);
  if (rc != 0) {
    s->base = NULL;
    snprintf(err, errlen, "shared memory: cannot map %s: %s", path, strerror(-rc));
    mn_shm_close(s);
    return rc;
  }
  shm_head_t *h = head(s);
  if (h->magic != SHM_MAGIC || h->n != (uint32_t)n || h->piece != piece || h->size != s->size || h->gid != gid ||
      h->nonce != nonce) {
    snprintf(err, errlen, "shared memory: %s is not this group's region", path);
    mn_shm_close(s);
    return MN_EINVAL;
  }
  atomic_store(&slot(s, me)->pid, (int64_t)getpid());
  *out = s;
  return 0;
}

int mn_shm_fd(const mn_shm_t *s) { return s->fd; }

void mn_shm_drop_fd(mn_shm_t *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

void mn_shm_close(mn_shm_t *s) {
  if (s == NULL) return;
  if (s->base != NULL) munmap(s->base, s->size);
  mn_shm_drop_fd(s);
  free(s);
}

/* ---- waiting ------------------------------------------------------------------------------ */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  /* Not FUTEX_PRIVATE: the word is shared between processes. */
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void wake_all(mn_shm_t *s) {
  shm_head_t *h = head(s);
  atomic_fetch_add(&h->gen, 1);
  if (atomic_load(&h->sleepers) > 0) futex(&h->gen, FUTEX_WAKE, INT_MAX, NULL);
}

static void post(mn_shm_t *s, uint64_t v) {
  atomic_store(&slot(s, s->me)->progress, v);
  wake_all(s);
}

void mn_shm_abort(mn_shm_t *s, uint32_t rank, const char *why) {
  shm_head_t *h = head(s);
  uint32_t expect = 0;
  if (atomic_compare_exchange_strong(&h->abort_claim, &expect, 1)) {
    h->abort_rank = rank;
    h->abort_tick = s->tick; /* the collective it gave up in, or refused to start */
    snprintf(h->reason, sizeof(h->reason), "%s", why);
    atomic_store(&h->aborted, 1);
  }
  wake_all(s);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* MN_EPEER with err when a member gave up on this collective or an earlier one (not one this member still finishes). */
static int failed_abort(const mn_shm_t *s, const mn_shm_op_t *op, char *err, size_t errlen) {
  shm_head_t *h = head(s);
  if (!atomic_load(&h->aborted) || s->tick < h->abort_tick) return 0;
  /* Bounded: the reason lives in memory every member can write. */
  snprintf(err, errlen, "%s: rank %u gave up on group %llu: %.*s", op->what, h->abort_rank,
           (unsigned long long)op->gid, MN_COLL_MAX_ABORT_MSG, h->reason[0] ? h->reason : "(no reason given)");
  return MN_EPEER;
}

/* The first member whose counter is below target, or n. */
static int laggard(const mn_shm_t *s, int from, uint64_t target) {
  int j = from;
  while (j < s->n && atomic_load_explicit(&slot(s, j)->progress, memory_order_acquire) >= target) j++;
  return j;
}

/*
 * Waits until every member's counter reaches target; 0, or with err:
 * MN_EPEER (a member gave up or died), MN_ECANCELED, MN_ETIMEDOUT, or the
 * check callback's code.
 */
static int wait_all(mn_shm_t *s, const mn_shm_op_t *op, uint64_t target, char *err, size_t errlen) {
  int j = laggard(s, 0, target);
  if (j == s->n) return 0;
  shm_head_t *h = head(s);
  int64_t start = mn_now_us(), moved = start;
  uint64_t seen = atomic_load(&slot(s, j)->progress);
  /* Busy-wait first: a peer on another core posts within microseconds. */
  for (unsigned i = 1; s->spin_us > 0; i++) {
    cpu_relax();
    if ((j = laggard(s, j, target)) == s->n) return 0;
    if ((i & 255) == 0 && mn_now_us() - start > s->spin_us) break;
  }
  /* Then yield: on a shared core this lets the member we wait for run now rather than at the next tick.
   * An abort or a cancel ends it at once: the loop below reports them. */
  for (int64_t t0 = mn_now_us(); s->yield_us > 0 && mn_now_us() - t0 < s->yield_us;) {
    sched_yield();
    if ((j = laggard(s, j, target)) == s->n) return 0;
    if (atomic_load(&h->aborted) || (op->cancel != NULL && atomic_load(op->cancel))) break;
  }
  int sleep_ms = SLEEP_MIN_MS, rc;
  for (;;) {
    if ((rc = failed_abort(s, op, err, errlen)) != 0) return rc;
    atomic_fetch_add(&h->sleepers, 1);
    uint32_t g = atomic_load(&h->gen);
    j = laggard(s, j, target);
    if (j < s->n && !atomic_load(&h->aborted)) {
      struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
      futex(&h->gen, FUTEX_WAIT, g, &ts);
    }
    atomic_fetch_sub(&h->sleepers, 1);
    if ((j = laggard(s, j, target)) == s->n) return 0;
    if ((rc = failed_abort(s, op, err, errlen)) != 0) return rc;
    if (op->cancel != NULL && atomic_load(op->cancel)) {
      snprintf(err, errlen, "%s cancelled", op->what);
      return MN_ECANCELED;
    }
    if (op->check != NULL && (rc = op->check(op->arg, err, errlen)) != 0) return rc < 0 ? rc : MN_EPEER;
    int64_t pid = atomic_load(&slot(s, j)->pid);
    if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
      char who[400];
      op->name(op->arg, j, who, sizeof(who));
      snprintf(err, errlen, "%s: %s died (its process %lld is gone)", op->what, who, (long long)pid);
      return MN_EPEER;
    }
    int64_t now = mn_now_us();
    uint64_t p = atomic_load(&slot(s, j)->progress);
    if (p != seen) {
      seen = p;
      moved = now;
    } else if (now - moved >= (int64_t)op->timeout_ms * 1000) {
      char who[400];
      op->name(op->arg, j, who, sizeof(who));
      snprintf(err, errlen, "%s: no progress from %s for %g s (MONARCH_COLL_TIMEOUT; is it running the same collective?)",
               op->what, who, op->timeout_ms / 1000.0);
      return MN_ETIMEDOUT;
    }
    sleep_ms = sleep_ms * 2 > SLEEP_MAX_MS ? SLEEP_MAX_MS : sleep_ms * 2;
  }
}

/* ---- the collectives ------------------------------------------------------------------------ */

/* Every member's header for this step must describe the same collective: 0, MN_EPROTO or MN_EPEER with err. */
static int check_headers(const mn_shm_t *s, const mn_shm_op_t *op, char *err, size_t errlen, int *mismatch) {
  int par = (int)(op->hdr->seq & 1);
  for (int j = 0; j < s->n; j++) {
    if (j == s->me) continue;
    mn_coll_hdr_t theirs;
    if (mn_coll_hdr_unpack(slot(s, j)->hdr[par], &theirs) != 0) {
      char who[400];
      op->name(op->arg, j, who, sizeof(who));
      snprintf(err, errlen, "%s: %s left no step header in shared memory (the group is out of step)", op->what, who);
      return MN_EPROTO;
    }
    int rc = mn_coll_hdr_check(op->hdr, &theirs, err, errlen);
    if (rc != 0) {
      if (mismatch != NULL) *mismatch = 1;
      return rc;
    }
  }
  return 0;
}

/*
 * out = in[0] op in[1] op ... op in[n-1] at byte offset off, l elements of es bytes; member order fixes the
 * rounding. `mine` is this member's own input, read in place: nobody else reads that part of its buffer, so it
 * is never copied in. Chunk by chunk, so the partial result stays in L1 instead of going round n-1 times;
 * `also`, when not NULL, receives a copy of each finished chunk.
 */
static void reduce_members(const mn_shm_t *s, int b, size_t off, const char *mine, char *out, char *also, size_t l,
                           size_t es, mk_dtype_t dt, int op) {
  size_t per = REDUCE_CHUNK / es;
  for (size_t i = 0; i < l; i += per) {
    size_t m = l - i < per ? l - i : per, at = off + i * es;
    const char *own = mine + i * es;
    char *o = out + i * es;
    mn_coll_reduce(o, s->me == 0 ? own : in_buf(s, 0, b) + at, s->me == 1 ? own : in_buf(s, 1, b) + at, m, dt, op);
    for (int j = 2; j < s->n; j++) mn_coll_reduce(o, o, j == s->me ? own : in_buf(s, j, b) + at, m, dt, op);
    if (op == MN_COLL_AVG) mn_coll_divide(o, m, dt, s->n);
    if (also != NULL) memcpy(also + i * es, o, m * es); /* while it is in L1 */
  }
}

typedef struct {
  size_t o, l; /* first element and elements of this piece */
  int b;       /* staging buffer */
} piece_at_t;

/* 1 when this member reads its own segment of all_reduce piece p from its tensor instead of copying it in. */
static int own_in_place(const mn_shm_op_t *op, piece_at_t p) { return p.l * op->esize >= OWN_IN_PLACE_MIN; }

static void copy_in(mn_shm_t *s, const mn_shm_op_t *op, piece_at_t p) {
  size_t es = op->esize;
  char *mine = in_buf(s, s->me, p.b);
  switch (op->hdr->kind) {
  case MN_COLL_ALL_REDUCE: { /* all but the segment this member reduces, which it can read from its tensor */
    size_t first, len;
    mn_coll_segment(p.l, s->n, s->me, &first, &len);
    if (!own_in_place(op, p)) first = p.l, len = 0;
    memcpy(mine, op->data + p.o * es, first * es);
    memcpy(mine + (first + len) * es, op->data + (p.o + first + len) * es, (p.l - first - len) * es);
    break;
  }
  case MN_COLL_ALL_GATHER: memcpy(mine, op->src + p.o * es, p.l * es); break;
  case MN_COLL_REDUCE_SCATTER: /* this piece of every member's block, block after block (dst may lie in src) */
    for (int i = 0; i < s->n; i++) memcpy(mine + (size_t)i * p.l * es, op->src + ((size_t)i * op->count + p.o) * es, p.l * es);
    break;
  default: break;
  }
}

static void reduce(mn_shm_t *s, const mn_shm_op_t *op, piece_at_t p) {
  const mn_coll_hdr_t *h = op->hdr;
  size_t es = op->esize;
  switch (h->kind) {
  case MN_COLL_ALL_REDUCE: {
    size_t first, len;
    mn_coll_segment(p.l, s->n, s->me, &first, &len);
    const char *own = own_in_place(op, p) ? op->data + (p.o + first) * es : in_buf(s, s->me, p.b) + first * es;
    /* The result of its own segment goes straight into its tensor too: copy_out skips it. */
    reduce_members(s, p.b, first * es, own, res_buf(s, p.b) + first * es, op->data + (p.o + first) * es, len, es,
                   (mk_dtype_t)h->dtype, h->op);
    break;
  }
  case MN_COLL_BROADCAST:
    if (s->me == (int)h->root) memcpy(res_buf(s, p.b), op->data + p.o, p.l);
    break;
  case MN_COLL_ALL_GATHER:
    for (int j = 0; j < s->n; j++)
      if (j != s->me) memcpy(op->data + ((size_t)j * op->count + p.o) * es, in_buf(s, j, p.b), p.l * es);
    break;
  case MN_COLL_REDUCE_SCATTER: {
    size_t off = (size_t)s->me * p.l * es;
    reduce_members(s, p.b, off, in_buf(s, s->me, p.b) + off, op->data + p.o * es, NULL, p.l, es, (mk_dtype_t)h->dtype,
                   h->op);
    break;
  }
  default: break;
  }
}

/* 1 when this member copies the shared result out, after every member reduced. */
static int copies_out(const mn_shm_t *s, const mn_shm_op_t *op) {
  return op->hdr->kind == MN_COLL_ALL_REDUCE || (op->hdr->kind == MN_COLL_BROADCAST && s->me != (int)op->hdr->root);
}

/* all_reduce: all but this member's own segment, which reduce() already wrote into its tensor. */
static void copy_out(mn_shm_t *s, const mn_shm_op_t *op, piece_at_t p) {
  size_t es = op->esize, first = p.l, len = 0;
  if (op->hdr->kind == MN_COLL_ALL_REDUCE) mn_coll_segment(p.l, s->n, s->me, &first, &len);
  memcpy(op->data + p.o * es, res_buf(s, p.b), first * es);
  memcpy(op->data + (p.o + first + len) * es, res_buf(s, p.b) + (first + len) * es, (p.l - first - len) * es);
}

int mn_shm_run(mn_shm_t *s, const mn_shm_op_t *op, char *err, size_t errlen, int *mismatch) {
  const mn_coll_hdr_t *h = op->hdr;
  size_t es = op->esize ? op->esize : 1;
  size_t per = s->piece / es, total = h->kind == MN_COLL_BARRIER ? 0 : op->count;
  if (h->kind == MN_COLL_REDUCE_SCATTER) per = s->piece / (size_t)s->n / es;
  if (per == 0) per = 1;
  size_t pieces = total == 0 ? 1 : (total + per - 1) / per;
  uint64_t base = s->tick;
  int rc = failed_abort(s, op, err, errlen);
  if (rc != 0) return rc;
  mn_coll_hdr_pack(h, slot(s, s->me)->hdr[h->seq & 1]);
  /* Buffers alternate by the group's piece count, across collectives too: a member that starts the next
   * collective early fills the buffer the others are not reading. */
#define PIECE(k) ((piece_at_t){(k) * per, total - (k) * per < per ? total - (k) * per : per, (int)((base / 2 + (k)) & 1)})
  copy_in(s, op, PIECE(0));
  post(s, base + 1);
  for (size_t k = 0; k < pieces; k++) {
    if ((rc = wait_all(s, op, base + 2 * k + 1, err, errlen)) != 0) return rc;
    if (k == 0 && (rc = check_headers(s, op, err, errlen, mismatch)) != 0) return rc;
    /* Safe to overwrite: every member finished copying out piece k-2 before posting piece k. */
    reduce(s, op, PIECE(k));
    post(s, base + 2 * k + 2);
    if (k + 1 < pieces) {
      /* Safe to refill: every member reduced piece k-1 before posting piece k. */
      copy_in(s, op, PIECE(k + 1));
      post(s, base + 2 * k + 3);
    }
    if (copies_out(s, op)) {
      if ((rc = wait_all(s, op, base + 2 * k + 2, err, errlen)) != 0) return rc;
      copy_out(s, op, PIECE(k));
    }
  }
#undef PIECE
  s->tick = base + 2 * pieces;
  return 0;
}
