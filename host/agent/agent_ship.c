/*
 * agent_ship.c - the agent's side of shipping: a per-user cache of files the
 * controller sent, by content address (BLAKE2b-256, host/core/ship.h).
 *
 * SHIP_ASK is answered with what the agent has: "cached" (the file is in the
 * cache), "local" (the controller's path holds the same bytes here: used as
 * is), "placed" (also linked into the job's workspace), "need", or "refused"
 * (--no-ship). SHIP_DATA chunks arrive in order (handed on to children in the
 * cast tree first, agent_tree.c); each is written to a temporary file and
 * hashed as it comes, on libuv's thread pool (the tree's leaves hash apart, so
 * an agent checks several chunks at once while its loop takes the next), and
 * once every chunk is in and hashed the root decides: the file is renamed into
 * the cache ("cached") or removed ("corrupt"). Answers go on the agent's own
 * connection to the controller, as SPAWN's do.
 *
 * The cache is <dir>/blobs/<hex> (mode 0500 files in 0700 directories owned
 * by the agent's user: anything else is refused), each with its verification
 * record <hex>.ok (ship.h: a blob whose stat no longer matches it is hashed
 * again before use, and removed if it does not hash right), capped at ship_max
 * bytes by least-recently-used eviction (a hit touches the record's mtime; a
 * file linked into a workspace is kept). Workspaces are <dir>/work/<session>/,
 * hard links into the cache, removed when the session ends.
 *
 * Several agents (jobs, or one agent per GPU on a machine) may share one
 * cache: files appear by rename only, under unique temporary names. The cache
 * has an id, <dir>/id (random, made once by whichever agent comes first, by
 * link so that no agent reads half of it), told in WELCOME: the controller
 * ships a file once to agents of one id, and the others find it in the cache.
 * A simulated agent (--simulate) verifies the bytes and stores nothing; the
 * simulated hosts of one process share one pretend cache (its id, the hashes
 * verified), as the agents of one machine share its disk.
 */
#include "agent_int.h"

#include "ship.h"

#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sodium.h>
#include <sys/stat.h>

#define MN_SHIP_MAX_XFERS 64 /* transfers in progress at once per agent (hosts:sync sends files back to back) */

typedef struct shipx_s {
  uint8_t hash[MN_SHIP_HASH_LEN];
  uint64_t size, got;     /* got: the bytes taken (some may still be on the thread pool) */
  int fd;                 /* -1 for a simulated agent */
  char tmp[PATH_MAX];
  uint8_t *leaves;         /* each piece's leaf hash as it comes (ship.c's tree) */
  agent_t *a;
  asession_t *s;          /* where the answer goes: the last chunk's session (NULL once it ended) */
  int busy;               /* chunks on the thread pool */
  int err;                /* the first failed write's -errno */
  int dead;               /* out of the list while chunks were on the pool: dropped when the last returns */
  struct shipx_s *next;
} shipx_t;

struct aship_s {
  char dir[PATH_MAX - 80];
  uint64_t max;
  int enabled;
  shipx_t *xfers;
  int nxfers;
  uint64_t counter;       /* for unique temporary names */
  char id[MN_SHIP_ID_LEN + 1]; /* the cache's id ("": none could be read or made: shared with nobody) */
  int sim;                /* a simulated agent's: it uses sim_cache (agent_sim.c drops a->sim before us) */
  int flip;               /* MONARCH_TEST_SHIP_FLIP: flip a byte of the next file received (a test hook) */
};

/* The simulated hosts' pretend cache, one per process: the hashes they verified, and its id. */
static struct {
  uint8_t (*seen)[MN_SHIP_HASH_LEN];
  size_t nseen, capseen;
  char id[MN_SHIP_ID_LEN + 1];
  int users; /* simulated agents alive: the last one frees it */
} sim_cache;

/* snprintf for paths: 0, or MN_EINVAL (after an empty out) when the path would not fit. */
__attribute__((format(printf, 3, 4))) static int pathf(char *out, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(out, n, fmt, ap);
  va_end(ap);
  if (r >= 0 && (size_t)r < n) return 0;
  out[0] = '\0';
  return MN_EINVAL;
}

/* pwrite of all n bytes at off (chunks are written from several threads, each at its place). */
static int write_all(int fd, const char *p, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

static int cache_dirs(const aship_t *sh, char *err, size_t errlen);
static void random_id(char out[MN_SHIP_ID_LEN + 1]);
static void cache_id(aship_t *sh);

int mn__agent_ship_init(agent_t *a) {
  aship_t *sh = calloc(1, sizeof(*sh));
  if (sh == NULL) return MN_ENOMEM;
  const char *d = a->o->ship_cache, *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (d != NULL) (void)pathf(sh->dir, sizeof(sh->dir), "%s", d);
  else if (x != NULL && x[0] == '/') (void)pathf(sh->dir, sizeof(sh->dir), "%s/monarch/ship", x);
  else if (h != NULL && h[0] == '/') (void)pathf(sh->dir, sizeof(sh->dir), "%s/.cache/monarch/ship", h);
  else snprintf(sh->dir, sizeof(sh->dir), "/tmp/monarch-ship-%u", (unsigned)geteuid());
  sh->max = a->o->ship_max > 0 ? a->o->ship_max : MN_SHIP_CACHE_MAX;
  sh->enabled = !a->o->no_ship;
  const char *flip = getenv("MONARCH_TEST_SHIP_FLIP");
  sh->flip = flip != NULL && flip[0] == '1';
  a->ship = sh;
  if (a->sim != NULL) {
    if (sim_cache.id[0] == '\0') random_id(sim_cache.id);
    sim_cache.users++;
    sh->sim = 1;
    memcpy(sh->id, sim_cache.id, sizeof(sh->id));
  } else if (sh->enabled) {
    cache_id(sh);
  }
  return 0;
}

const char *mn__agent_ship_id(const agent_t *a) { return a->ship != NULL ? a->ship->id : ""; }

static void xfer_drop(shipx_t *x) {
  if (x->fd >= 0) {
    close(x->fd);
    unlink(x->tmp);
  }
  free(x->leaves);
  free(x);
}

void mn__agent_ship_close(agent_t *a) {
  if (a->ship == NULL) return;
  while (a->ship->xfers != NULL) {
    shipx_t *x = a->ship->xfers;
    a->ship->xfers = x->next;
    if (x->busy > 0) x->dead = 1; /* its last chunk back from the pool drops it */
    else xfer_drop(x);
  }
  if (a->ship->sim && --sim_cache.users == 0) {
    free(sim_cache.seen);
    memset(&sim_cache, 0, sizeof(sim_cache)); /* the next simulated process's cache is a new one */
  }
  free(a->ship);
  a->ship = NULL;
}

int mn__agent_ship_enabled(const agent_t *a) { return a->ship != NULL && a->ship->enabled; }

void mn__agent_ship_paths(const agent_t *a, const asession_t *s, char *blobs, size_t bn, char *work, size_t wn) {
  (void)pathf(blobs, bn, "%s/blobs", a->ship->dir);
  (void)pathf(work, wn, "%s/work/%016llx", a->ship->dir, (unsigned long long)s->id);
}

/* ---- the cache's directories ------------------------------------------------------------------ */

/* Makes dir (mode 0700) if it is not there, then checks that it is ours and private. */
static int private_dir(const char *dir, char *err, size_t errlen) {
  struct stat st;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot make the ship cache %.300s: %s", dir, strerror(errno));
    return -errno;
  }
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "the ship cache %.300s is not a directory", dir);
    return MN_EINVAL;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    snprintf(err, errlen, "the ship cache %.300s is not private (owner uid %u, mode %03o; want uid %u, mode 700)", dir,
             (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
    return MN_EINVAL;
  }
  return 0;
}

/* mkdir -p of path's every component below the cache dir, each private. */
static int make_dirs(const aship_t *sh, const char *path, char *err, size_t errlen) {
  char p[PATH_MAX];
  if (pathf(p, sizeof(p), "%s", path) != 0) return MN_EINVAL;
  int rc = 0;
  for (char *q = p + strlen(sh->dir); rc == 0 && q != NULL; q = strchr(q + 1, '/')) {
    if (*q != '/') continue;
    *q = '\0';
    rc = private_dir(p, err, errlen);
    *q = '/';
  }
  return rc == 0 ? private_dir(p, err, errlen) : rc;
}

static int cache_dirs(const aship_t *sh, char *err, size_t errlen) {
  char p[PATH_MAX];
  (void)pathf(p, sizeof(p), "%s", sh->dir);
  /* The parents may be shared (~/.cache): made if missing (a failure shows below), not checked. Only the
   * cache itself and what is below it must be private. */
  for (char *q = p + 1; (q = strchr(q, '/')) != NULL; q++) {
    *q = '\0';
    (void)mkdir(p, 0700);
    *q = '/';
  }
  int rc = private_dir(sh->dir, err, errlen);
  (void)pathf(p, sizeof(p), "%s/blobs", sh->dir);
  if (rc == 0) rc = private_dir(p, err, errlen);
  (void)pathf(p, sizeof(p), "%s/work", sh->dir);
  if (rc == 0) rc = private_dir(p, err, errlen);
  return rc;
}

/* ---- the cache's id -------------------------------------------------------------------------- */

static void random_id(char out[MN_SHIP_ID_LEN + 1]) {
  uint8_t r[MN_SHIP_ID_LEN / 2];
  static const char digits[] = "0123456789abcdef";
  randombytes_buf(r, sizeof(r));
  for (size_t i = 0; i < sizeof(r); i++) {
    out[2 * i] = digits[r[i] >> 4];
    out[2 * i + 1] = digits[r[i] & 15];
  }
  out[MN_SHIP_ID_LEN] = '\0';
}

static int read_id(const char *path, char out[MN_SHIP_ID_LEN + 1]) {
  char buf[MN_SHIP_ID_LEN + 2];
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  ssize_t r = read(fd, buf, sizeof(buf));
  close(fd);
  if (r < MN_SHIP_ID_LEN || (r > MN_SHIP_ID_LEN && buf[MN_SHIP_ID_LEN] != '\n')) return MN_EINVAL;
  for (int i = 0; i < MN_SHIP_ID_LEN; i++)
    if (!isxdigit((unsigned char)buf[i])) return MN_EINVAL;
  memcpy(out, buf, MN_SHIP_ID_LEN);
  out[MN_SHIP_ID_LEN] = '\0';
  return 0;
}

/* sh->id <- <dir>/id, made now if the cache has none. The first agent writes a temporary file whole and links
 * it in (link fails if another agent's came first): every agent of the cache reads one complete id. */
static void cache_id(aship_t *sh) {
  char err[512], path[PATH_MAX], tmp[PATH_MAX], id[MN_SHIP_ID_LEN + 2];
  sh->id[0] = '\0';
  if (cache_dirs(sh, err, sizeof(err)) != 0) return; /* no cache (yet): the first use says why */
  (void)pathf(path, sizeof(path), "%s/id", sh->dir);
  if (read_id(path, sh->id) == 0) return;
  (void)pathf(tmp, sizeof(tmp), "%s/.id.%d", sh->dir, (int)getpid());
  random_id(id);
  id[MN_SHIP_ID_LEN] = '\n';
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0 && write_all(fd, id, MN_SHIP_ID_LEN + 1, 0) == 0 && link(tmp, path) != 0 && errno != EEXIST)
    fprintf(stderr, "monarch-worker: cannot make the ship cache's id %s: %s\n", path, strerror(errno));
  if (fd >= 0) close(fd);
  unlink(tmp);
  if (read_id(path, sh->id) != 0) sh->id[0] = '\0';
}

/* ---- eviction --------------------------------------------------------------------------------- */

typedef struct {
  char name[MN_SHIP_HEX_LEN + 1];
  struct timespec at;
  uint64_t size;
} blob_t;

static int older(const void *x, const void *y) {
  const blob_t *a = x, *b = y;
  if (a->at.tv_sec != b->at.tv_sec) return a->at.tv_sec < b->at.tv_sec ? -1 : 1;
  return a->at.tv_nsec < b->at.tv_nsec ? -1 : a->at.tv_nsec > b->at.tv_nsec;
}

/* The cache's evictable files (complete, not linked into a workspace), oldest first; *total: every file's size. */
static blob_t *list_blobs(const char *dir, size_t *n, uint64_t *total) {
  DIR *d = opendir(dir);
  blob_t *v = NULL;
  size_t cap = 0;
  *n = 0;
  *total = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
    struct stat st;
    if (strlen(e->d_name) != MN_SHIP_HEX_LEN || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    *total += (uint64_t)st.st_size;
    if (st.st_nlink > 1) continue;
    struct stat rec;
    char rname[MN_SHIP_HEX_LEN + 4];
    memcpy(rname, e->d_name, MN_SHIP_HEX_LEN); /* length checked above */
    memcpy(rname + MN_SHIP_HEX_LEN, ".ok", 4);
    if (fstatat(dirfd(d), rname, &rec, AT_SYMLINK_NOFOLLOW) == 0) st.st_mtim = rec.st_mtim; /* its last use */
    if (*n == cap) {
      blob_t *w = realloc(v, (cap = cap ? cap * 2 : 64) * sizeof(*v));
      if (w == NULL) break;
      v = w;
    }
    memcpy(v[*n].name, e->d_name, MN_SHIP_HEX_LEN + 1); /* length checked above */
    v[*n].at = st.st_mtim;
    v[(*n)++].size = (uint64_t)st.st_size;
  }
  if (d != NULL) closedir(d);
  if (v != NULL) qsort(v, *n, sizeof(*v), older);
  return v;
}

/* Removes the least recently used files until the cache is within its cap; never `keep`. */
static void evict(aship_t *sh, const char *keep) {
  char dir[PATH_MAX], p[PATH_MAX];
  size_t n;
  uint64_t total;
  (void)pathf(dir, sizeof(dir), "%s/blobs", sh->dir);
  blob_t *v = list_blobs(dir, &n, &total);
  for (size_t i = 0; i < n && total > sh->max; i++) {
    if (strcmp(v[i].name, keep) == 0) continue;
    if (pathf(p, sizeof(p), "%s/%s", dir, v[i].name) != 0 || unlink(p) != 0) continue;
    total -= v[i].size;
    if (pathf(p, sizeof(p), "%s/%s.ok", dir, v[i].name) == 0) unlink(p);
  }
  free(v);
}

/* ---- workspaces ------------------------------------------------------------------------------- */

/* A workspace path must stay inside it: relative, no "." or ".." component, no empty one. */
static int place_ok(const char *rel, size_t n) {
  if (n == 0 || rel[0] == '/' || memchr(rel, '\0', n) != NULL) return 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && rel[j] != '/') j++;
    size_t len = j - i;
    if (len == 0 || (len == 1 && rel[i] == '.') || (len == 2 && rel[i] == '.' && rel[i + 1] == '.')) return 0;
    i = j + 1;
  }
  return rel[n - 1] != '/';
}

/* Links the cached blob into session s's workspace at rel (replacing what was there, atomically). */
static int place(agent_t *a, asession_t *s, const char *blob, const char *rel, size_t n, char *out, size_t outn,
                 char *err, size_t errlen) {
  char blobs[PATH_MAX], work[PATH_MAX], tmp[PATH_MAX + 64];
  if (!place_ok(rel, n)) {
    snprintf(err, errlen, "workspace path '%.*s' is not a relative path inside the workspace", (int)(n > 200 ? 200 : n), rel);
    return MN_EINVAL;
  }
  mn__agent_ship_paths(a, s, blobs, sizeof(blobs), work, sizeof(work));
  if (pathf(out, outn, "%s/%.*s", work, (int)n, rel) != 0) {
    snprintf(err, errlen, "workspace path too long");
    return MN_EINVAL;
  }
  char *slash = strrchr(out, '/');
  *slash = '\0';
  int rc = make_dirs(a->ship, out, err, errlen);
  *slash = '/';
  if (rc != 0) return rc;
  (void)pathf(tmp, sizeof(tmp), "%s.part.%d.%llu", out, (int)getpid(), (unsigned long long)++a->ship->counter);
  if (link(blob, tmp) != 0 || rename(tmp, out) != 0) {
    snprintf(err, errlen, "cannot place %.300s in the workspace: %s", out, strerror(errno));
    unlink(tmp);
    return -errno;
  }
  return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p) == 0 ? 0 : 0; /* best effort: what cannot go stays */
}

void mn__agent_ship_session_end(asession_t *s) {
  agent_t *a = s->a;
  char blobs[PATH_MAX], work[PATH_MAX];
  for (shipx_t *x = a->ship != NULL ? a->ship->xfers : NULL; x != NULL; x = x->next)
    if (x->s == s) x->s = NULL; /* a transfer still on the pool answers nobody */
  /* A persistent mesh's procs outlive the session and may read its workspace still. */
  if (a->ship == NULL || a->sim != NULL || a->npersisted > 0) return;
  mn__agent_ship_paths(a, s, blobs, sizeof(blobs), work, sizeof(work));
  if (access(work, F_OK) == 0) (void)nftw(work, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- SHIP_ASK --------------------------------------------------------------------------------- */

static void answer(asession_t *s, const uint8_t *hash, const char *state, const char *detail) {
  mn_buf_t b;
  mn_buf_init(&b);
  if (s != NULL && mn_msg_pack_ship_state(&b, hash, state, detail) == 0) mn__agent_session_send(s, &b);
  mn_buf_free(&b);
}

static int seen(const uint8_t *hash) {
  for (size_t i = 0; i < sim_cache.nseen; i++)
    if (memcmp(sim_cache.seen[i], hash, MN_SHIP_HASH_LEN) == 0) return 1;
  return 0;
}

/*
 * Whether the cache's blob holds q's bytes: its record matches (nothing wrote to it since an agent hashed it),
 * or it hashes right now (its record is written again). A blob that does not is removed, and travels again.
 */
static int blob_ready(const char *blob, const uint8_t *hash, uint64_t size) {
  struct stat st;
  char rec[PATH_MAX + 4];
  if (stat(blob, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) return 0;
  (void)pathf(rec, sizeof(rec), "%s.ok", blob);
  if (mn_ship_record_ok(blob)) {
    (void)utimensat(AT_FDCWD, rec, NULL, 0); /* used now: the last to be evicted */
    return 1;
  }
  uint8_t h[MN_SHIP_HASH_LEN];
  uint64_t n = 0;
  int fd = open(blob, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  int ok = fd >= 0 && mn_ship_hash_fd(fd, h, &n) == 0 && n == size && memcmp(h, hash, MN_SHIP_HASH_LEN) == 0;
  if (ok) (void)mn_ship_record_write(blob, fd); /* if it cannot be written, the next use hashes it again */
  if (fd >= 0) close(fd);
  if (!ok && unlink(blob) == 0) unlink(rec); /* changed since it was stored: it is fetched again */
  return ok;
}

/* Whether the controller's own path holds the same bytes here (a shared file system): used as is. */
static int same_local(const mn_msg_ship_ask_t *q) {
  char path[MN_SHIP_MAX_PATH + 1];
  struct stat st;
  uint8_t h[MN_SHIP_HASH_LEN];
  uint64_t size;
  if (q->path_len == 0 || q->path[0] != '/') return 0;
  snprintf(path, sizeof(path), "%.*s", (int)q->path_len, q->path);
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != q->size) return 0;
  return mn_ship_hash_file(path, h, &size) == 0 && memcmp(h, q->hash, MN_SHIP_HASH_LEN) == 0;
}

/* What a real agent has of q's file: answers "cached", "placed", "local", "need" or "error". */
static void ask_cache(agent_t *a, asession_t *s, const mn_msg_ship_ask_t *q) {
  char err[512], hex[MN_SHIP_HEX_LEN + 1], blob[PATH_MAX], out[PATH_MAX + 8];
  mn_ship_hex(q->hash, hex);
  if (cache_dirs(a->ship, err, sizeof(err)) != 0) {
    answer(s, q->hash, "error", err);
    return;
  }
  (void)pathf(blob, sizeof(blob), "%s/blobs/%s", a->ship->dir, hex);
  if (blob_ready(blob, q->hash, q->size)) {
    if (q->place_len == 0) answer(s, q->hash, "cached", blob);
    else if (place(a, s, blob, q->place, q->place_len, out, sizeof(out), err, sizeof(err)) == 0) answer(s, q->hash, "placed", out);
    else answer(s, q->hash, "error", err);
    return;
  }
  if (q->place_len == 0 && same_local(q)) {
    (void)pathf(out, sizeof(out), "%.*s", (int)q->path_len, q->path);
    answer(s, q->hash, "local", out);
    return;
  }
  answer(s, q->hash, "need", "");
}

void mn__agent_handle_ship_ask(aconn_t *c, const msgpack_object *m) {
  mn_msg_ship_ask_t q;
  char err[300];
  if (mn_msg_parse_ship_ask(m, &q, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  agent_t *a = c->a;
  /* --no-ship: the controller's path holding the same bytes here is still used as is; nothing else is. */
  if (!mn__agent_ship_enabled(a) && a->sim == NULL && q.place_len == 0 && same_local(&q)) answer(c->session, q.hash, "local", "");
  else if (!mn__agent_ship_enabled(a)) answer(c->session, q.hash, "refused", "this host agent was started with --no-ship");
  else if (a->sim != NULL) answer(c->session, q.hash, seen(q.hash) ? (q.place_len ? "placed" : "cached") : "need", "(simulated)");
  else ask_cache(a, c->session, &q);
}

/* ---- SHIP_DATA -------------------------------------------------------------------------------- */

static shipx_t *xfer_find(aship_t *sh, const uint8_t *hash, shipx_t ***at) {
  for (shipx_t **p = &sh->xfers; *p != NULL; p = &(*p)->next)
    if (memcmp((*p)->hash, hash, MN_SHIP_HASH_LEN) == 0) {
      *at = p;
      return *p;
    }
  return NULL;
}

static void xfer_unlink(aship_t *sh, shipx_t **at) {
  shipx_t *x = *at;
  *at = x->next;
  sh->nxfers--;
  if (x->busy > 0) x->dead = 1; /* its chunks on the pool still use it: the last one back drops it */
  else xfer_drop(x);
}

/* A transfer of d's file from its start: a temporary file in the cache (none for a simulated agent). */
static shipx_t *xfer_start(agent_t *a, const mn_msg_ship_data_t *d, char *err, size_t errlen) {
  aship_t *sh = a->ship;
  if (sh->nxfers >= MN_SHIP_MAX_XFERS) {
    snprintf(err, errlen, "more than %d files in transfer at once", MN_SHIP_MAX_XFERS);
    return NULL;
  }
  if (a->sim == NULL && cache_dirs(sh, err, errlen) != 0) return NULL;
  shipx_t *x = calloc(1, sizeof(*x));
  if (x == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  memcpy(x->hash, d->hash, MN_SHIP_HASH_LEN);
  x->size = d->size;
  x->fd = -1;
  x->a = a;
  x->leaves = malloc((size_t)(mn_ship_pieces(d->size) + 1) * MN_SHIP_HASH_LEN);
  if (x->leaves == NULL) {
    snprintf(err, errlen, "out of memory");
    free(x);
    return NULL;
  }
  if (a->sim == NULL) {
    (void)pathf(x->tmp, sizeof(x->tmp), "%s/blobs/.part.%d.%llu", sh->dir, (int)getpid(), (unsigned long long)++sh->counter);
    x->fd = open(x->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (x->fd < 0) {
      snprintf(err, errlen, "cannot write to the ship cache %.300s: %s", sh->dir, strerror(errno));
      free(x->leaves);
      free(x);
      return NULL;
    }
  }
  x->next = sh->xfers;
  sh->xfers = x;
  sh->nxfers++;
  return x;
}

/* The last chunk is in: the hash decides. The file goes into the cache under its hash, or away. */
static void xfer_finish(agent_t *a, shipx_t **at) {
  shipx_t *x = *at;
  asession_t *s = x->s;
  uint8_t got[MN_SHIP_HASH_LEN];
  char hex[MN_SHIP_HEX_LEN + 1], ghex[MN_SHIP_HEX_LEN + 1], blob[PATH_MAX], msg[400];
  mn_ship_root(x->leaves, x->size, got);
  mn_ship_hex(x->hash, hex);
  if (memcmp(got, x->hash, MN_SHIP_HASH_LEN) != 0) {
    mn_ship_hex(got, ghex);
    snprintf(msg, sizeof(msg), "the bytes received hash to %.16s..., not %.16s...: refused", ghex, hex);
    answer(s, x->hash, "corrupt", msg);
    xfer_unlink(a->ship, at);
    return;
  }
  if (a->sim != NULL) {
    if (!seen(x->hash) && sim_cache.nseen == sim_cache.capseen) {
      size_t cap = sim_cache.capseen ? sim_cache.capseen * 2 : 8;
      void *w = realloc(sim_cache.seen, cap * MN_SHIP_HASH_LEN);
      if (w != NULL) sim_cache.seen = w, sim_cache.capseen = cap;
    }
    if (!seen(x->hash) && sim_cache.nseen < sim_cache.capseen) memcpy(sim_cache.seen[sim_cache.nseen++], x->hash, MN_SHIP_HASH_LEN);
    answer(s, x->hash, "cached", "(simulated)");
    xfer_unlink(a->ship, at);
    return;
  }
  (void)pathf(blob, sizeof(blob), "%s/blobs/%s", a->ship->dir, hex);
  int rc = fchmod(x->fd, 0500) == 0 && rename(x->tmp, blob) == 0 ? 0 : -errno;
  if (rc != 0) {
    snprintf(msg, sizeof(msg), "cannot store %.300s: %s", blob, strerror(-rc));
    answer(s, x->hash, "error", msg);
  } else {
    x->tmp[0] = '\0'; /* renamed: nothing to remove */
    (void)mn_ship_record_write(blob, x->fd); /* without one, the next use hashes it again */
    evict(a->ship, hex);
    answer(s, x->hash, "cached", blob);
  }
  close(x->fd);
  x->fd = -1;
  xfer_unlink(a->ship, at);
}

/* The place of x in its agent's list (NULL: not there). */
static shipx_t **xfer_at(shipx_t *x) {
  for (shipx_t **p = &x->a->ship->xfers; *p != NULL; p = &(*p)->next)
    if (*p == x) return p;
  return NULL;
}

/* After a chunk: a failed write ends the transfer; the last chunk hashed finishes it. */
static void xfer_settle(shipx_t *x) {
  shipx_t **at = xfer_at(x);
  char err[400];
  if (at == NULL) return;
  if (x->err != 0 && x->busy == 0) {
    snprintf(err, sizeof(err), "cannot write to the ship cache %.300s: %s", x->a->ship->dir, strerror(-x->err));
    answer(x->s, x->hash, "error", err);
    xfer_unlink(x->a->ship, at);
  } else if (x->err == 0 && x->got == x->size && x->busy == 0) {
    xfer_finish(x->a, at);
  }
}

/*
 * A chunk's leaf and write, on libuv's thread pool. At most POOL_BYTES of chunks are out there per process
 * (64 simulated hosts share one): past that a chunk is done on the loop, which then reads no more for that
 * long, as the sender's window expects. Small chunks are done on the loop (a thread's wake costs more).
 */
#define POOL_BYTES (8u << 20)
#define POOL_MIN (64u << 10)
static size_t pool_bytes;

typedef struct {
  uv_work_t req;
  shipx_t *x;
  char *bytes;
  size_t len;
  uint64_t off;
  int rc;
} chunkjob_t;

static void chunk_do(shipx_t *x, const char *p, size_t len, uint64_t off, int *rc) {
  mn_ship_leaf(p, len, x->leaves + (off / MN_SHIP_CHUNK) * MN_SHIP_HASH_LEN);
  *rc = x->fd >= 0 ? write_all(x->fd, p, len, off) : 0;
}

static void chunk_work(uv_work_t *w) {
  chunkjob_t *j = w->data;
  chunk_do(j->x, j->bytes, j->len, j->off, &j->rc);
}

static void chunk_done(uv_work_t *w, int status) {
  chunkjob_t *j = w->data;
  shipx_t *x = j->x;
  pool_bytes -= j->len;
  x->busy--;
  if (x->err == 0) x->err = status != 0 ? -ECANCELED : j->rc;
  free(j->bytes);
  free(j);
  if (!x->dead) xfer_settle(x);
  else if (x->busy == 0) xfer_drop(x);
}

/* Hands a chunk (bytes: malloc'd, now the job's) to the pool; 0, or nonzero (then done on the loop). */
static int chunk_queue(shipx_t *x, char *bytes, size_t len, uint64_t off) {
  chunkjob_t *j = malloc(sizeof(*j));
  if (j == NULL) return -1;
  *j = (chunkjob_t){.x = x, .bytes = bytes, .len = len, .off = off};
  j->req.data = j;
  if (uv_queue_work(x->a->loop, &j->req, chunk_work, chunk_done) != 0) {
    free(j);
    return -1;
  }
  pool_bytes += len;
  x->busy++;
  return 0;
}

/*
 * d's chunk for this agent. Chunks of one file come in order on one way, but the controller may send the
 * file again directly while the tree's copy is still on its way (a relay lost, a stalled attempt): a chunk
 * at offset 0 starts the file again, and one that does not follow what the agent has is dropped without an
 * answer (every copy holds the same bytes, so whichever way the chunks in order come, the file is whole; a
 * file that never completes gets no answer, and the controller sends it again directly).
 */
static void take_chunk(agent_t *a, asession_t *s, const mn_msg_ship_data_t *d) {
  char err[400];
  shipx_t **at = NULL, *x = xfer_find(a->ship, d->hash, &at);
  if (x != NULL && d->offset == 0) xfer_unlink(a->ship, at); /* sent again from the start */
  if (x == NULL || d->offset == 0) {
    if (d->offset != 0) return; /* a late copy's chunk, after the file was done (or before its start) */
    if ((x = xfer_start(a, d, err, sizeof(err))) == NULL) {
      answer(s, d->hash, "error", err);
      return;
    }
    at = &a->ship->xfers;
  }
  if (d->offset != x->got || d->size != x->size) return;
  x->s = s;
  if (d->len != (x->size - x->got < MN_SHIP_CHUNK ? x->size - x->got : MN_SHIP_CHUNK)) {
    snprintf(err, sizeof(err), "a chunk of %zu bytes at offset %llu of %llu: chunks are whole %u-byte pieces",
             d->len, (unsigned long long)d->offset, (unsigned long long)x->size, MN_SHIP_CHUNK);
    answer(s, d->hash, "error", err);
    xfer_unlink(a->ship, at);
    return;
  }
  int pooled = d->len >= POOL_MIN && pool_bytes + d->len <= POOL_BYTES;
  char *copy = pooled || a->ship->flip ? malloc(d->len > 0 ? d->len : 1) : NULL;
  if (copy != NULL) memcpy(copy, d->chunk, d->len);
  if (copy != NULL && a->ship->flip && d->len > 0) {
    copy[d->len / 2] ^= 0x01; /* a flipped bit in flight, as a test hook makes it */
    a->ship->flip = 0;
  }
  uint64_t off = x->got;
  x->got += d->len;
  if (pooled && copy != NULL && chunk_queue(x, copy, d->len, off) == 0) return;
  int rc;
  chunk_do(x, copy != NULL ? copy : d->chunk, d->len, off, &rc);
  free(copy);
  if (x->err == 0) x->err = rc;
  xfer_settle(x);
}

void mn__agent_handle_ship_data(aconn_t *c, asession_t *s, const msgpack_object *m) {
  mn_msg_ship_data_t d;
  char err[300];
  if (mn_msg_parse_ship_data(m, &d, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  if (s == NULL || s->ended) return;
  /* Handed on first, as SPAWN's subs are: the children write while this agent hashes. */
  if (d.subs->via.array.size > 0) mn__agent_tree_forward_ship(s, c, &d);
  if (!d.self) return;
  if (!mn__agent_ship_enabled(c->a)) answer(s, d.hash, "refused", "this host agent was started with --no-ship");
  else take_chunk(c->a, s, &d);
}
