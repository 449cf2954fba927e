/*
 * agent.c - the host agent.
 *
 * One libuv loop. A controller connects, proves it holds the cluster token,
 * and asks for procs with SPAWN. The agent execs `monarch-worker --proc`
 * once per proc, learns each proc's port from a pipe on its fd 3, and tells
 * the controller where to connect. SIGCHLD (via uv_process exit callbacks)
 * turns a dying proc into a PROC_EXIT at once.
 *
 * Procs belong to a controller session (SESSION, sent first by every
 * controller connection), not to a TCP connection: a controller that loses
 * its connection and comes back with the same session id within the grace
 * period finds its procs alive and receives the events it missed. A session
 * whose controller says GOODBYE, or stays away past the grace period, has
 * its procs killed: no orphans.
 *
 * The exception is a persistent mesh (PERSIST, from mesh:persist(name)): its
 * procs outlive their session, parked (no owner) until a controller takes
 * them over with ATTACH. The agent keeps the mesh's name and the
 * controller's description of it (an opaque msgpack value) for that.
 */
#include "agent.h"

#include "handshake.h"
#include "wire.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <uv.h>

#define MN_MAX_SPAWN 4096         /* most procs one SPAWN may ask for */
#define MN_AGENT_GRACE_MS 10000   /* a departed controller's procs live this long (default) */
#define MN_AGENT_SILENCE_MS 10000 /* a controller connection silent this long is dropped */
#define MN_MAX_BACKLOG (1u << 20) /* bytes of events kept for a detached session */
#define MN_EXITS_KEPT 16          /* recent proc exits the agent remembers for STATUS */
#define MN_MAX_LOG_LINE (64u << 10) /* a longer unterminated line is forwarded in pieces */
#define MN_MAX_PERSISTED 256      /* most persistent meshes one agent keeps */

typedef struct aconn_s aconn_t;
typedef struct asession_s asession_t;
typedef struct apersist_s apersist_t;

/* A persistent mesh's record: its procs point at it. */
struct apersist_s {
  char name[MN_MAX_NAME + 1];
  mn_buf_t blob;     /* the controller's description, packed msgpack; returned verbatim by ATTACH */
  int nprocs;        /* live procs marked with this record; the record goes with the last */
  apersist_t *next;
};

typedef struct {
  uv_loop_t *loop;
  uv_tcp_t server;
  mn_auth_t auth;
  const mn_agent_opts_t *o;
  char host[256];
  aconn_t *conns;
  int nconns;
  asession_t *sessions;
  apersist_t *persisted;
  int npersisted;
  uv_timer_t tick;
  uint64_t grace_ms;
  uint64_t silence_ms;
  int nprocs;
  int served;
  int stopping;
  uint64_t started;
  struct {
    int rank;
    int64_t pid, status;
    int sig;
    uint64_t at;
  } exits[MN_EXITS_KEPT];
  int nexits;          /* total recorded; the ring holds the last MN_EXITS_KEPT */
} agent_t;

struct asession_s {
  uint64_t id;
  agent_t *a;
  aconn_t *conn;      /* NULL while the controller is away */
  uint64_t left_at;   /* uv_now when it went away */
  mn_buf_t backlog;   /* events to deliver when it comes back */
  int ended;          /* GOODBYE or grace expired: procs are being killed */
  asession_t *next;
};

struct aconn_s {
  uv_tcp_t tcp;
  agent_t *a;
  asession_t *session;
  uint64_t last_rx;
  int ready;
  int closing;
  uint8_t ns[MN_NONCE_LEN];
  mn_buf_t in;
  msgpack_zone zone;
  uv_timer_t hs_timer;
  aconn_t *next;
};

typedef struct {
  uv_process_t proc;
  uv_pipe_t pipe;     /* fd 3: the port report */
  uv_pipe_t out, err; /* the proc's stdout and stderr, forwarded as LOG */
  mn_buf_t obuf, ebuf; /* partial lines */
  agent_t *a;
  asession_t *owner;  /* NULL once killed, or while parked (persistent, no controller) */
  apersist_t *persist; /* the persistent mesh it belongs to, or NULL */
  uint64_t req;
  int index;
  int rank;
  char buf[256];       /* fd 3: the port line, then "S queued executed running" lines */
  size_t blen;
  int reported;
  int open_handles;
  uint64_t started;    /* uv_now at spawn */
  int queued;          /* the proc's last status report */
  uint64_t executed;
  char running[104];
} aproc_t;

static void on_write(uv_write_t *w, int status) {
  (void)status; /* a failed write shows up as a read error on the same conn */
  free(w->data);
  free(w);
}

/* Sends b's bytes to c (copied; b stays the caller's). */
static void send_buf(aconn_t *c, const mn_buf_t *b) {
  if (c == NULL || c->closing || b->len == 0) return;
  uv_write_t *w = malloc(sizeof(*w));
  char *copy = malloc(b->len);
  if (w == NULL || copy == NULL) {
    free(w);
    free(copy);
    return;
  }
  memcpy(copy, b->data, b->len);
  w->data = copy;
  uv_buf_t ub = uv_buf_init(copy, (unsigned)b->len);
  if (uv_write(w, (uv_stream_t *)&c->tcp, &ub, 1, on_write) != 0) on_write(w, -1);
}

/* Delivers b to the session's controller, or keeps it until the controller is back. */
static void session_send(asession_t *s, const mn_buf_t *b) {
  if (s == NULL || s->ended) return;
  if (s->conn != NULL) send_buf(s->conn, b);
  else if (s->backlog.len + b->len <= MN_MAX_BACKLOG && mn_buf_append(&s->backlog, b->data, b->len) != 0)
    return; /* dropped: the controller will see its procs as lost */
}

static void maybe_exit(agent_t *a) {
  if (a->o->once && a->served && a->nconns == 0 && a->nprocs == 0 && a->sessions == NULL && !a->stopping) {
    a->stopping = 1;
    uv_stop(a->loop);
  }
}

/* Unmarks a persistent proc; its mesh's record goes with the last one. */
static void persist_unmark(aproc_t *p) {
  apersist_t *r = p->persist;
  if (r == NULL) return;
  p->persist = NULL;
  if (--r->nprocs > 0) return;
  agent_t *a = p->a;
  apersist_t **pp = &a->persisted;
  while (*pp && *pp != r) pp = &(*pp)->next;
  if (*pp) *pp = r->next;
  a->npersisted--;
  mn_buf_free(&r->blob);
  free(r);
}

/* ---- procs ----------------------------------------------------------------- */

static void proc_handle_closed(uv_handle_t *h) {
  aproc_t *p = h->data;
  if (--p->open_handles == 0) {
    agent_t *a = p->a;
    mn_buf_free(&p->obuf);
    mn_buf_free(&p->ebuf);
    free(p);
    a->nprocs--;
    maybe_exit(a);
  }
}

static void send_spawn_failed(asession_t *c, uint64_t req, int index, const char *msg) {
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t s = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_SPAWN_FAILED);
  msgpack_pack_uint64(&pk, req);
  msgpack_pack_int(&pk, index);
  mn_pack_cstr(&pk, msg);
  mn_frame_end(&b, s);
  session_send(c, &b);
  mn_buf_free(&b);
}

static void on_proc_exit(uv_process_t *h, int64_t status, int sig) {
  aproc_t *p = h->data;
  char msg[160];
  agent_t *ag = p->a;
  int slot = ag->nexits++ % MN_EXITS_KEPT;
  ag->exits[slot].rank = p->rank;
  ag->exits[slot].pid = h->pid;
  ag->exits[slot].status = status;
  ag->exits[slot].sig = sig;
  ag->exits[slot].at = uv_now(ag->loop);
  if (p->owner != NULL) {
    if (!p->reported) {
      snprintf(msg, sizeof(msg), "proc rank %d exited (%s %d) before it was ready", p->rank,
               sig ? "signal" : "code", sig ? sig : (int)status);
      send_spawn_failed(p->owner, p->req, p->index, msg);
    } else {
      mn_buf_t b;
      msgpack_packer pk;
      mn_buf_init(&b);
      msgpack_packer_init(&pk, &b, mn_buf_write_cb);
      size_t s = mn_frame_begin(&b);
      msgpack_pack_array(&pk, 5);
      msgpack_pack_int(&pk, MN_MSG_PROC_EXIT);
      msgpack_pack_int64(&pk, h->pid);
      msgpack_pack_int64(&pk, status);
      mn_pack_cstr(&pk, sig ? sigabbrev_np(sig) ? sigabbrev_np(sig) : "?" : "");
      msgpack_pack_int(&pk, p->rank);
      mn_frame_end(&b, s);
      session_send(p->owner, &b);
      mn_buf_free(&b);
    }
  }
  persist_unmark(p);
  uv_close((uv_handle_t *)&p->proc, proc_handle_closed);
  if (!uv_is_closing((uv_handle_t *)&p->pipe)) uv_close((uv_handle_t *)&p->pipe, proc_handle_closed);
}

static void pipe_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  aproc_t *p = h->data;
  (void)hint;
  *buf = uv_buf_init(p->buf + p->blen, (unsigned)(sizeof(p->buf) - 1 - p->blen));
}

/* Takes the proc's "S queued executed running" lines, once its port is known. */
static void take_status(aproc_t *p) {
  char *nl;
  while ((nl = memchr(p->buf, '\n', p->blen)) != NULL) {
    *nl = '\0';
    unsigned long long e;
    int q;
    char run[104];
    if (sscanf(p->buf, "S %d %llu %103s", &q, &e, run) == 3) {
      p->queued = q;
      p->executed = e;
      snprintf(p->running, sizeof(p->running), "%s", run);
    }
    size_t used = (size_t)(nl - p->buf) + 1;
    memmove(p->buf, p->buf + used, p->blen - used);
    p->blen -= used;
  }
  if (p->blen >= sizeof(p->buf) - 1) p->blen = 0; /* garbage without a newline: drop it */
}

static void on_port(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  aproc_t *p = s->data;
  (void)buf;
  if (n < 0) {
    uv_close((uv_handle_t *)&p->pipe, proc_handle_closed);
    return;
  }
  p->blen += (size_t)n;
  p->buf[p->blen] = '\0';
  if (p->reported || p->owner == NULL) {
    take_status(p);
    return;
  }
  if (strchr(p->buf, '\n') == NULL && p->blen < sizeof(p->buf) - 1) return;
  int port = atoi(p->buf);
  if (port > 0 && p->owner != NULL && !p->reported) {
    mn_buf_t b;
    msgpack_packer pk;
    mn_buf_init(&b);
    msgpack_packer_init(&pk, &b, mn_buf_write_cb);
    size_t st = mn_frame_begin(&b);
    msgpack_pack_array(&pk, 5);
    msgpack_pack_int(&pk, MN_MSG_SPAWNED);
    msgpack_pack_uint64(&pk, p->req);
    msgpack_pack_int(&pk, p->index);
    msgpack_pack_int64(&pk, p->proc.pid);
    msgpack_pack_int(&pk, port);
    mn_frame_end(&b, st);
    session_send(p->owner, &b);
    mn_buf_free(&b);
    p->reported = 1;
    char *nl = memchr(p->buf, '\n', p->blen);
    size_t used = nl ? (size_t)(nl - p->buf) + 1 : p->blen;
    memmove(p->buf, p->buf + used, p->blen - used);
    p->blen -= used;
    take_status(p);
    return; /* the pipe stays open for status lines */
  }
  uv_close((uv_handle_t *)&p->pipe, proc_handle_closed);
}

/* Sends [LOG, rank, stream, text] for the complete lines in b (all of b if `all`). */
static void forward_lines(aproc_t *p, int stream, mn_buf_t *b, int all) {
  size_t end = b->len;
  if (!all) {
    while (end > 0 && b->data[end - 1] != '\n') end--;
    if (end == 0 && b->len >= MN_MAX_LOG_LINE) end = b->len;
  }
  if (end == 0) return;
  mn_buf_t f;
  msgpack_packer pk;
  mn_buf_init(&f);
  msgpack_packer_init(&pk, &f, mn_buf_write_cb);
  size_t s = mn_frame_begin(&f);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_LOG);
  msgpack_pack_int(&pk, p->rank);
  msgpack_pack_int(&pk, stream);
  msgpack_pack_str(&pk, end);
  msgpack_pack_str_body(&pk, b->data, end);
  mn_frame_end(&f, s);
  session_send(p->owner, &f);
  mn_buf_free(&f);
  mn_buf_consume(b, end);
}

static void log_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  aproc_t *p = h->data;
  mn_buf_t *b = h == (uv_handle_t *)&p->out ? &p->obuf : &p->ebuf;
  (void)hint;
  if (mn_buf_reserve(b, 16 * 1024) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(b->data + b->len, (unsigned)(b->cap - b->len));
}

static void log_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  aproc_t *p = s->data;
  int stream = s == (uv_stream_t *)&p->out ? 1 : 2;
  mn_buf_t *b = stream == 1 ? &p->obuf : &p->ebuf;
  (void)buf;
  if (n > 0) b->len += (size_t)n;
  forward_lines(p, stream, b, n < 0);
  if (n < 0) uv_close((uv_handle_t *)s, proc_handle_closed);
}

static int spawn_one(asession_t *c, uint64_t req, int index, int rank, int world, int device) {
  agent_t *a = c->a;
  aproc_t *p = calloc(1, sizeof(*p));
  char srank[16], sworld[16], sparent[16], sorphan[32], sdevice[16];
  if (p == NULL) return UV_ENOMEM;
  p->a = a;
  p->owner = c;
  p->req = req;
  p->index = index;
  p->rank = rank;
  snprintf(srank, sizeof(srank), "%d", rank);
  snprintf(sworld, sizeof(sworld), "%d", world);
  snprintf(sparent, sizeof(sparent), "%d", (int)getpid());
  snprintf(sorphan, sizeof(sorphan), "%g", a->o->orphan_timeout);
  snprintf(sdevice, sizeof(sdevice), "%d", device);
  /* A GPU proc gets "--device D" (it pins itself); a CPU proc ends the list there. */
  char *args[] = {(char *)a->o->exe, "--proc", "--rank", srank, "--world", sworld, "--bind", a->host,
                  "--parent", sparent, "--port-fd", "3", "--orphan-timeout", sorphan,
                  device >= 0 ? "--device" : NULL, sdevice, NULL};
  uv_pipe_init(a->loop, &p->pipe, 0);
  uv_pipe_init(a->loop, &p->out, 0);
  uv_pipe_init(a->loop, &p->err, 0);
  p->pipe.data = p->out.data = p->err.data = p;
  p->proc.data = p;
  p->started = uv_now(a->loop);
  snprintf(p->running, sizeof(p->running), "-");
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&p->out;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&p->err;
  stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[3].data.stream = (uv_stream_t *)&p->pipe;
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.file = a->o->exe;
  po.args = args;
  po.exit_cb = on_proc_exit;
  po.stdio = stdio;
  po.stdio_count = 4;
  int rc = uv_spawn(a->loop, &p->proc, &po);
  if (rc != 0) {
    p->open_handles = 3;
    p->owner = NULL;
    a->nprocs++;
    uv_close((uv_handle_t *)&p->pipe, proc_handle_closed);
    uv_close((uv_handle_t *)&p->out, proc_handle_closed);
    uv_close((uv_handle_t *)&p->err, proc_handle_closed);
    return rc;
  }
  p->open_handles = 4;
  a->nprocs++;
  uv_read_start((uv_stream_t *)&p->pipe, pipe_alloc, on_port);
  uv_read_start((uv_stream_t *)&p->out, log_alloc, log_read);
  uv_read_start((uv_stream_t *)&p->err, log_alloc, log_read);
  return 0;
}

/* ---- controller connections -------------------------------------------------- */

static void conn_closed(uv_handle_t *h) {
  aconn_t *c = h->data;
  agent_t *a = c->a;
  aconn_t **pp = &a->conns;
  while (*pp && *pp != c) pp = &(*pp)->next;
  if (*pp) *pp = c->next;
  mn_buf_free(&c->in);
  msgpack_zone_destroy(&c->zone);
  free(c);
  a->nconns--;
  maybe_exit(a);
}

static void timer_closed(uv_handle_t *h) {
  aconn_t *c = h->data;
  uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void walk_kill(uv_handle_t *h, void *arg) {
  if (h->type != UV_PROCESS || uv_is_closing(h)) return;
  aproc_t *p = h->data;
  if (p->owner == arg) {
    p->owner = NULL;
    /* A persistent mesh's procs stay up, parked, for the next ATTACH. */
    if (p->persist == NULL) uv_process_kill((uv_process_t *)h, SIGKILL);
  }
}

/* The agent is stopping: parked procs go too (they would die with it anyway). */
static void walk_kill_parked(uv_handle_t *h, void *arg) {
  if (h->type != UV_PROCESS || uv_is_closing(h)) return;
  aproc_t *p = h->data;
  if (p->owner == NULL && p->persist != NULL) {
    persist_unmark(p);
    uv_process_kill((uv_process_t *)h, SIGKILL);
  }
}

/* Kills a session's procs and forgets it. */
static void session_end(asession_t *s) {
  agent_t *a = s->a;
  s->ended = 1;
  uv_walk(a->loop, walk_kill, s);
  asession_t **pp = &a->sessions;
  while (*pp && *pp != s) pp = &(*pp)->next;
  if (*pp) *pp = s->next;
  if (s->conn) s->conn->session = NULL;
  mn_buf_free(&s->backlog);
  free(s);
  maybe_exit(a);
}

/* Binds conn c to session `id`, adopting a detached one with that id. */
static asession_t *session_attach(aconn_t *c, uint64_t id) {
  agent_t *a = c->a;
  asession_t *s = a->sessions;
  while (s && s->id != id) s = s->next;
  if (s == NULL) {
    s = calloc(1, sizeof(*s));
    if (s == NULL) return NULL;
    s->id = id;
    s->a = a;
    s->next = a->sessions;
    a->sessions = s;
  } else if (s->conn != NULL && s->conn != c) {
    s->conn->session = NULL; /* the old connection is stale: its controller came back on a new one */
  }
  s->conn = c;
  c->session = s;
  if (s->backlog.len > 0) {
    send_buf(c, &s->backlog);
    s->backlog.len = 0;
  }
  return s;
}

static void conn_close(aconn_t *c);

/* Every second: end sessions past their grace, drop silent connections. */
static void on_tick(uv_timer_t *t) {
  agent_t *a = t->data;
  uint64_t now = uv_now(a->loop);
  asession_t *s = a->sessions;
  while (s) {
    asession_t *next = s->next;
    if (s->conn == NULL && now - s->left_at >= a->grace_ms) session_end(s);
    s = next;
  }
  for (aconn_t *c = a->conns; c; c = c->next) {
    /* A --once agent dies with its controller (PDEATHSIG): a quiet controller is only busy. */
    if (!a->o->once && c->ready && !c->closing && now - c->last_rx > a->silence_ms) {
      conn_close(c);
    }
  }
}

static void conn_close(aconn_t *c) {
  if (c->closing) return;
  c->closing = 1;
  if (c->session != NULL) {
    /* Keep the procs for the grace period: the controller may reconnect. */
    c->session->conn = NULL;
    c->session->left_at = uv_now(c->a->loop);
    c->session = NULL;
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  uv_timer_stop(&c->hs_timer);
  uv_close((uv_handle_t *)&c->hs_timer, timer_closed);
}

static void refuse(aconn_t *c, int code, const char *msg) {
  mn_buf_t b;
  mn_buf_init(&b);
  mn_pack_error(&b, code, msg);
  send_buf(c, &b);
  mn_buf_free(&b);
  conn_close(c);
}

static void on_hs_timeout(uv_timer_t *t) {
  aconn_t *c = t->data;
  if (!c->ready) refuse(c, MN_ETIMEDOUT, "handshake not completed in time");
}

static void handle_spawn(aconn_t *c, const msgpack_object *m) {
  uint64_t req;
  const msgpack_object *spec = m->via.array.size > 2 ? &m->via.array.ptr[2] : NULL;
  const msgpack_object *cnt = mn_map_get(spec, "count"), *base = mn_map_get(spec, "rank_base"),
                       *world = mn_map_get(spec, "world"), *dev = mn_map_get(spec, "device_base");
  if (mn_get_u64(m, 1, &req) != 0 || cnt == NULL || cnt->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    refuse(c, MN_EPROTO, "malformed SPAWN: want [10, req, {count=, rank_base=, world=}]");
    return;
  }
  if (cnt->via.u64 > MN_MAX_SPAWN) {
    send_spawn_failed(c->session, req, 0, "SPAWN count exceeds MN_MAX_SPAWN (4096)");
    return;
  }
  int n = (int)cnt->via.u64;
  int rb = base && base->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)base->via.u64 : 0;
  int w = world && world->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)world->via.u64 : n;
  /* device_base d: proc i is pinned to GPU d + i. Absent (or nil): CPU procs. */
  int db = -1;
  if (dev != NULL && dev->type == MSGPACK_OBJECT_POSITIVE_INTEGER && dev->via.u64 <= MN_MAX_SPAWN) db = (int)dev->via.u64;
  else if (dev != NULL && dev->type != MSGPACK_OBJECT_NIL) {
    send_spawn_failed(c->session, req, 0, "SPAWN device_base must be a GPU number 0..4096");
    return;
  }
  for (int i = 0; i < n; i++) {
    int rc = spawn_one(c->session, req, i, rb + i, w, db >= 0 ? db + i : -1);
    if (rc != 0) {
      char msg[200];
      snprintf(msg, sizeof(msg), "cannot start %s: %s", c->a->o->exe, uv_strerror(rc));
      send_spawn_failed(c->session, req, i, msg);
    }
  }
}

typedef struct {
  int64_t pid;
  int sig;
  asession_t *owner;
} kill_req_t;

static void walk_signal(uv_handle_t *h, void *arg) {
  kill_req_t *k = arg;
  if (h->type != UV_PROCESS || uv_is_closing(h)) return;
  aproc_t *p = h->data;
  if (p->owner == k->owner && ((uv_process_t *)h)->pid == k->pid && k->sig > 0)
    uv_process_kill((uv_process_t *)h, k->sig);
}

static void handle_kill(aconn_t *c, const msgpack_object *m) {
  int64_t pid, sig;
  if (mn_get_i64(m, 1, &pid) != 0 || mn_get_i64(m, 2, &sig) != 0 || sig < 0 || sig > 64) {
    refuse(c, MN_EPROTO, "malformed KILL: want [14, pid, signal]");
    return;
  }
  /* Only this controller's own procs: it cannot signal arbitrary pids. */
  kill_req_t k = {pid, (int)sig, c->session};
  uv_walk(c->a->loop, walk_signal, &k);
}

/* ---- persistent meshes ------------------------------------------------------ */

/* Starts [REPLY, req, ok, ...] in b; the caller packs the value and ends the frame at the returned offset. */
static size_t reply_begin(mn_buf_t *b, msgpack_packer *pk, uint64_t req, int ok) {
  mn_buf_init(b);
  msgpack_packer_init(pk, b, mn_buf_write_cb);
  size_t s = mn_frame_begin(b);
  msgpack_pack_array(pk, 4);
  msgpack_pack_int(pk, MN_MSG_REPLY);
  msgpack_pack_uint64(pk, req);
  if (ok) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  return s;
}

static void reply_end(aconn_t *c, mn_buf_t *b, size_t s) {
  mn_frame_end(b, s);
  send_buf(c, b);
  mn_buf_free(b);
}

/* A request that cannot be granted: [REPLY, req, false, message]; the connection stays open. */
static void reply_fail(aconn_t *c, uint64_t req, const char *msg) {
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 0);
  mn_pack_cstr(&pk, msg);
  reply_end(c, &b, s);
}

typedef struct {
  int64_t pid;
  aproc_t *found;
} find_t;

static void walk_find(uv_handle_t *h, void *arg) {
  find_t *f = arg;
  if (h->type == UV_PROCESS && !uv_is_closing(h) && ((uv_process_t *)h)->pid == f->pid) f->found = h->data;
}

/* The live proc with this pid, or NULL. */
static aproc_t *find_proc(agent_t *a, int64_t pid) {
  find_t f = {pid, NULL};
  uv_walk(a->loop, walk_find, &f);
  return f.found;
}

static apersist_t *find_record(agent_t *a, const char *name, size_t n) {
  for (apersist_t *r = a->persisted; r; r = r->next)
    if (strlen(r->name) == n && memcmp(r->name, name, n) == 0) return r;
  return NULL;
}

typedef struct {
  apersist_t *r;
  asession_t *me;   /* the asking controller's session */
  int op;           /* one of the EACH_* below */
  int count;
  msgpack_packer *pk;
} each_t;

enum { EACH_HELD_ELSEWHERE, EACH_UNMARK, EACH_TAKE, EACH_PARK, EACH_PACK_PID };

static void walk_each(uv_handle_t *h, void *arg) {
  each_t *e = arg;
  if (h->type != UV_PROCESS || uv_is_closing(h)) return;
  aproc_t *p = h->data;
  if (p->persist != e->r) return;
  switch (e->op) {
  case EACH_HELD_ELSEWHERE: /* owned by another controller that is connected now */
    if (p->owner != NULL && p->owner != e->me && p->owner->conn != NULL) e->count++;
    break;
  case EACH_UNMARK: persist_unmark(p); break;
  case EACH_TAKE: p->owner = e->me; break;
  case EACH_PARK:
    if (p->owner == e->me) {
      p->owner = NULL;
      e->count++;
    }
    break;
  case EACH_PACK_PID: msgpack_pack_int64(e->pk, ((uv_process_t *)h)->pid); break;
  }
}

static int each_proc(agent_t *a, apersist_t *r, asession_t *me, int op, msgpack_packer *pk) {
  each_t e = {r, me, op, 0, pk};
  uv_walk(a->loop, walk_each, &e);
  return e.count;
}

/* Reads [type, req, name, ...]; refuses the connection (and returns -1) when malformed. */
static int get_req_name(aconn_t *c, const msgpack_object *m, uint32_t size, uint64_t *req, const char **name,
                        size_t *nl, const char *want) {
  if (m->via.array.size != size || mn_get_u64(m, 1, req) != 0 || mn_get_str(m, 2, name, nl) != 0 || *nl == 0 ||
      *nl > MN_MAX_NAME) {
    char err[200];
    snprintf(err, sizeof(err), "malformed %s (name of 1..%d bytes)", want, MN_MAX_NAME);
    refuse(c, MN_EPROTO, err);
    return -1;
  }
  return 0;
}

/* [PERSIST, req, name, pids, description]: these procs (this controller's) outlive it, under `name`. */
static void handle_persist(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  uint64_t req;
  const char *name;
  size_t nl;
  char msg[400];
  if (get_req_name(c, m, 5, &req, &name, &nl, "PERSIST: want [15, req, name, pids, description]") != 0) return;
  const msgpack_object *pids = &m->via.array.ptr[3];
  if (a->o->once) {
    reply_fail(c, req, "this host agent exits with its controller (--once), so nothing can outlive it: run "
                       "long-lived agents (monarch-worker --listen HOST:PORT) and connect with --hosts");
    return;
  }
  if (pids->type != MSGPACK_OBJECT_ARRAY || pids->via.array.size == 0) {
    reply_fail(c, req, "PERSIST names no procs");
    return;
  }
  for (uint32_t i = 0; i < pids->via.array.size; i++) {
    const msgpack_object *o = &pids->via.array.ptr[i];
    aproc_t *p = o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? find_proc(a, (int64_t)o->via.u64) : NULL;
    if (p == NULL || p->owner != c->session) {
      snprintf(msg, sizeof(msg), "pid %lld is not a live proc of this controller on this host",
               o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long long)o->via.u64 : -1LL);
      reply_fail(c, req, msg);
      return;
    }
  }
  apersist_t *r = find_record(a, name, nl);
  if (r != NULL && each_proc(a, r, c->session, EACH_HELD_ELSEWHERE, NULL) > 0) {
    snprintf(msg, sizeof(msg), "a persistent mesh named '%.*s' is already held by another controller here",
             (int)nl, name);
    reply_fail(c, req, msg);
    return;
  }
  if (r == NULL && a->npersisted >= MN_MAX_PERSISTED) {
    snprintf(msg, sizeof(msg), "this host already keeps %d persistent meshes (MN_MAX_PERSISTED)", MN_MAX_PERSISTED);
    reply_fail(c, req, msg);
    return;
  }
  mn_buf_t blob;
  msgpack_packer bpk;
  mn_buf_init(&blob);
  msgpack_packer_init(&bpk, &blob, mn_buf_write_cb);
  if (msgpack_pack_object(&bpk, m->via.array.ptr[4]) != 0) {
    mn_buf_free(&blob);
    reply_fail(c, req, "out of memory");
    return;
  }
  if (r == NULL) {
    if ((r = calloc(1, sizeof(*r))) == NULL) {
      mn_buf_free(&blob);
      reply_fail(c, req, "out of memory");
      return;
    }
    memcpy(r->name, name, nl);
    r->next = a->persisted;
    a->persisted = r;
    a->npersisted++;
  }
  /* A new description replaces the old; procs it leaves out stop being persistent. */
  mn_buf_free(&r->blob);
  r->blob = blob;
  r->nprocs++; /* holds the record while its procs change */
  each_proc(a, r, c->session, EACH_UNMARK, NULL);
  for (uint32_t i = 0; i < pids->via.array.size; i++) {
    aproc_t *p = find_proc(a, (int64_t)pids->via.array.ptr[i].via.u64);
    if (p->persist == r) continue; /* listed twice */
    persist_unmark(p);
    p->persist = r;
    r->nprocs++;
  }
  r->nprocs--;
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  msgpack_pack_map(&pk, 2);
  mn_pack_cstr(&pk, "name");
  mn_pack_cstr(&pk, r->name);
  mn_pack_cstr(&pk, "procs");
  msgpack_pack_int(&pk, r->nprocs);
  reply_end(c, &b, s);
}

/* Names the meshes kept here, for the message of a failed ATTACH. */
static void known_names(agent_t *a, char *out, size_t n) {
  size_t len = (size_t)snprintf(out, n, a->persisted ? "kept here:" : "none is kept here");
  for (apersist_t *r = a->persisted; r && len < n; r = r->next)
    len += (size_t)snprintf(out + len, n - len, " '%s'%s", r->name, r->next ? "," : "");
}

/* [ATTACH, req, name]: this controller takes the mesh's procs over; the reply carries their pids and the description. */
static void handle_attach(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  uint64_t req;
  const char *name;
  size_t nl;
  char msg[600], known[300];
  if (get_req_name(c, m, 3, &req, &name, &nl, "ATTACH: want [16, req, name]") != 0) return;
  apersist_t *r = find_record(a, name, nl);
  if (r == NULL) {
    known_names(a, known, sizeof(known));
    snprintf(msg, sizeof(msg), "no persistent mesh named '%.*s' on this host (%s)", (int)nl, name, known);
    reply_fail(c, req, msg);
    return;
  }
  if (each_proc(a, r, c->session, EACH_HELD_ELSEWHERE, NULL) > 0) {
    snprintf(msg, sizeof(msg), "persistent mesh '%s' is held by another controller that is still connected: "
             "detach it there (mesh:detach()) or end that controller first", r->name);
    reply_fail(c, req, msg);
    return;
  }
  each_proc(a, r, c->session, EACH_TAKE, NULL);
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  msgpack_pack_map(&pk, 3);
  mn_pack_cstr(&pk, "name");
  mn_pack_cstr(&pk, r->name);
  mn_pack_cstr(&pk, "pids");
  msgpack_pack_array(&pk, (size_t)r->nprocs);
  each_proc(a, r, c->session, EACH_PACK_PID, &pk);
  mn_pack_cstr(&pk, "description");
  mn_buf_append(&b, r->blob.data, r->blob.len);
  reply_end(c, &b, s);
}

/* [DETACH, req, name]: this controller lets go of the mesh's procs; they stay up, parked. */
static void handle_detach(aconn_t *c, const msgpack_object *m) {
  uint64_t req;
  const char *name;
  size_t nl;
  char msg[400];
  if (get_req_name(c, m, 3, &req, &name, &nl, "DETACH: want [18, req, name]") != 0) return;
  apersist_t *r = find_record(c->a, name, nl);
  if (r == NULL) {
    snprintf(msg, sizeof(msg), "no persistent mesh named '%.*s' on this host", (int)nl, name);
    reply_fail(c, req, msg);
    return;
  }
  int parked = each_proc(c->a, r, c->session, EACH_PARK, NULL);
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  msgpack_pack_map(&pk, 2);
  mn_pack_cstr(&pk, "name");
  mn_pack_cstr(&pk, r->name);
  mn_pack_cstr(&pk, "procs");
  msgpack_pack_int(&pk, parked);
  reply_end(c, &b, s);
}

/* [LIST, req]: the persistent meshes kept here, as [{name, procs}]. */
typedef struct {
  msgpack_packer *pk;
  uint64_t now;
  asession_t *me;
  int count; /* first pass counts, second packs */
  int pack;
} status_walk_t;

static void walk_status(uv_handle_t *h, void *arg) {
  status_walk_t *w = arg;
  if (h->type != UV_PROCESS || uv_is_closing(h) || h->data == NULL) return;
  aproc_t *p = h->data;
  if (p->a == NULL) return;
  if (!w->pack) {
    w->count++;
    return;
  }
  msgpack_packer *pk = w->pk;
  const char *state = p->persist != NULL ? (p->owner ? "persistent" : "parked")
                      : p->owner == NULL   ? "stopping"
                      : p->owner->conn     ? "attached"
                                           : "detached";
  msgpack_pack_map(pk, 8);
  mn_pack_cstr(pk, "rank");
  msgpack_pack_int(pk, p->rank);
  mn_pack_cstr(pk, "pid");
  msgpack_pack_int64(pk, ((uv_process_t *)h)->pid);
  mn_pack_cstr(pk, "uptime");
  msgpack_pack_double(pk, (double)(w->now - p->started) / 1e3);
  mn_pack_cstr(pk, "state");
  mn_pack_cstr(pk, state);
  mn_pack_cstr(pk, "mine");
  if (p->owner != NULL && p->owner == w->me) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  mn_pack_cstr(pk, "queued");
  msgpack_pack_int(pk, p->queued);
  mn_pack_cstr(pk, "executed");
  msgpack_pack_uint64(pk, p->executed);
  mn_pack_cstr(pk, "running");
  mn_pack_cstr(pk, p->running);
}

/* [STATUS, req] -> REPLY {hostname, pid, uptime, procs = [...], exits = [...]} */
static void handle_status(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  uint64_t req;
  char host[256];
  if (mn_get_u64(m, 1, &req) != 0) {
    refuse(c, MN_EPROTO, "malformed STATUS: want [27, req]");
    return;
  }
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "?");
  host[sizeof(host) - 1] = '\0';
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  uint64_t now = uv_now(a->loop);
  status_walk_t w = {&pk, now, c->session, 0, 0};
  uv_walk(a->loop, walk_status, &w);
  msgpack_pack_map(&pk, 5);
  mn_pack_cstr(&pk, "hostname");
  mn_pack_cstr(&pk, host);
  mn_pack_cstr(&pk, "pid");
  msgpack_pack_int64(&pk, (int64_t)getpid());
  mn_pack_cstr(&pk, "uptime");
  msgpack_pack_double(&pk, (double)(now - a->started) / 1e3);
  mn_pack_cstr(&pk, "procs");
  msgpack_pack_array(&pk, (size_t)w.count);
  w.pack = 1;
  uv_walk(a->loop, walk_status, &w);
  int kept = a->nexits < MN_EXITS_KEPT ? a->nexits : MN_EXITS_KEPT;
  mn_pack_cstr(&pk, "exits");
  msgpack_pack_array(&pk, (size_t)kept);
  for (int i = 0; i < kept; i++) { /* newest first */
    int j = ((a->nexits - 1 - i) % MN_EXITS_KEPT + MN_EXITS_KEPT) % MN_EXITS_KEPT;
    msgpack_pack_map(&pk, 5);
    mn_pack_cstr(&pk, "rank");
    msgpack_pack_int(&pk, a->exits[j].rank);
    mn_pack_cstr(&pk, "pid");
    msgpack_pack_int64(&pk, a->exits[j].pid);
    mn_pack_cstr(&pk, "status");
    msgpack_pack_int64(&pk, a->exits[j].status);
    mn_pack_cstr(&pk, "signal");
    mn_pack_cstr(&pk, a->exits[j].sig ? (sigabbrev_np(a->exits[j].sig) ? sigabbrev_np(a->exits[j].sig) : "?") : "");
    mn_pack_cstr(&pk, "ago");
    msgpack_pack_double(&pk, (double)(now - a->exits[j].at) / 1e3);
  }
  reply_end(c, &b, s);
}

static void handle_list(aconn_t *c, const msgpack_object *m) {
  uint64_t req;
  if (m->via.array.size != 2 || mn_get_u64(m, 1, &req) != 0) {
    refuse(c, MN_EPROTO, "malformed LIST: want [19, req]");
    return;
  }
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  msgpack_pack_array(&pk, (size_t)c->a->npersisted);
  for (apersist_t *r = c->a->persisted; r; r = r->next) {
    msgpack_pack_map(&pk, 2);
    mn_pack_cstr(&pk, "name");
    mn_pack_cstr(&pk, r->name);
    mn_pack_cstr(&pk, "procs");
    msgpack_pack_int(&pk, r->nprocs);
  }
  reply_end(c, &b, s);
}

static void handle(aconn_t *c, const msgpack_object *m) {
  char err[256];
  mn_buf_t out;
  mn_buf_init(&out);
  if (!c->ready) {
    uint8_t nc[MN_NONCE_LEN];
    int rc = mn_hs_check_auth(&c->a->auth, m, c->ns, nc, err, sizeof(err));
    if (rc != 0) {
      refuse(c, rc, err);
    } else {
      c->ready = 1;
      c->a->served = 1;
      uv_timer_stop(&c->hs_timer);
      mn_hs_welcome(&out, &c->a->auth, c->ns, nc, "agent");
      send_buf(c, &out);
    }
    mn_buf_free(&out);
    return;
  }
  if (mn_msg_type(m) == MN_MSG_SESSION) {
    uint64_t sid;
    if (mn_get_u64(m, 1, &sid) != 0 || sid == 0) refuse(c, MN_EPROTO, "malformed SESSION: want [22, id, acked]");
    else if (session_attach(c, sid) == NULL) refuse(c, MN_ENOMEM, "out of memory");
    mn_buf_free(&out);
    return;
  }
  if (c->session == NULL) {
    /* A controller that skips SESSION gets a private one (ended when it leaves). */
    uint64_t sid = ((uint64_t)(uintptr_t)c << 1) | 1;
    if (session_attach(c, sid) == NULL) {
      refuse(c, MN_ENOMEM, "out of memory");
      mn_buf_free(&out);
      return;
    }
  }
  switch (mn_msg_type(m)) {
  case MN_MSG_GOODBYE: session_end(c->session); break;
  case MN_MSG_SPAWN: handle_spawn(c, m); break;
  case MN_MSG_KILL: handle_kill(c, m); break;
  case MN_MSG_PERSIST: handle_persist(c, m); break;
  case MN_MSG_ATTACH: handle_attach(c, m); break;
  case MN_MSG_DETACH: handle_detach(c, m); break;
  case MN_MSG_LIST: handle_list(c, m); break;
  case MN_MSG_STATUS: handle_status(c, m); break;
  case MN_MSG_PING:
    if (m->via.array.size == 2) {
      msgpack_packer pk;
      msgpack_packer_init(&pk, &out, mn_buf_write_cb);
      size_t s = mn_frame_begin(&out);
      msgpack_pack_array(&pk, 2);
      msgpack_pack_int(&pk, MN_MSG_PONG);
      msgpack_pack_object(&pk, m->via.array.ptr[1]);
      mn_frame_end(&out, s);
      send_buf(c, &out);
    }
    break;
  default:
    snprintf(err, sizeof(err), "agent does not accept message type %d", mn_msg_type(m));
    refuse(c, MN_EPROTO, err);
  }
  mn_buf_free(&out);
}

static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  aconn_t *c = h->data;
  (void)hint;
  if (mn_buf_reserve(&c->in, 64 * 1024) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(c->in.data + c->in.len, (unsigned)(c->in.cap - c->in.len));
}

static void conn_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  aconn_t *c = s->data;
  (void)buf;
  if (n < 0) {
    conn_close(c);
    return;
  }
  c->in.len += (size_t)n;
  c->last_rx = uv_now(c->a->loop);
  size_t off = 0;
  while (!c->closing) {
    const char *body;
    char err[256];
    msgpack_object m;
    /* Before authentication only a small frame is acceptable. */
    int64_t len = mn_frame_peek(c->in.data + off, c->in.len - off, c->ready ? (1u << 20) : 4096, &body);
    if (len == MN_EAGAIN) break;
    if (len < 0) {
      refuse(c, MN_EFRAME, c->ready ? "frame exceeds the agent's limit (1 MiB)" : "handshake frame too large");
      return;
    }
    off += MN_FRAME_HEADER + (size_t)len;
    msgpack_zone_clear(&c->zone);
    int rc = mn_decode(body, (size_t)len, &c->zone, &m, err, sizeof(err));
    if (rc != 0) {
      refuse(c, rc, err);
      return;
    }
    handle(c, &m);
  }
  if (!c->closing) mn_buf_consume(&c->in, off);
}

static void on_connection(uv_stream_t *server, int status) {
  agent_t *a = server->data;
  if (status != 0) return;
  aconn_t *c = calloc(1, sizeof(*c));
  if (c == NULL) return;
  c->a = a;
  if (!msgpack_zone_init(&c->zone, 4096)) {
    free(c);
    return;
  }
  uv_tcp_init(a->loop, &c->tcp);
  c->tcp.data = c;
  uv_timer_init(a->loop, &c->hs_timer);
  c->hs_timer.data = c;
  c->next = a->conns;
  a->conns = c;
  a->nconns++;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  mn_buf_t b;
  mn_buf_init(&b);
  mn_hs_hello(&b, "agent", c->ns);
  send_buf(c, &b);
  mn_buf_free(&b);
  uv_timer_start(&c->hs_timer, on_hs_timeout, MN_HANDSHAKE_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
}

static void on_signal(uv_signal_t *s, int sig) {
  agent_t *a = s->data;
  (void)sig;
  for (aconn_t *c = a->conns; c; c = c->next) conn_close(c);
  while (a->sessions) session_end(a->sessions);
  uv_walk(a->loop, walk_kill_parked, NULL);
  a->stopping = 1;
  uv_stop(a->loop);
}

int mn_agent_main(const mn_agent_opts_t *o) {
  static agent_t A;
  agent_t *a = &A;
  char err[256];
  struct sockaddr_storage ss;
  memset(a, 0, sizeof(*a));
  a->o = o;
  a->loop = uv_default_loop();
  signal(SIGPIPE, SIG_IGN);
  if (o->parent > 0 && (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != o->parent)) return 3;
  if (mn_auth_load(&a->auth, NULL, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch-worker: %s\n", err);
    return 2;
  }
  snprintf(a->host, sizeof(a->host), "%s", o->listen_host);
  if (uv_ip4_addr(o->listen_host, o->listen_port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(o->listen_host, o->listen_port, (struct sockaddr_in6 *)&ss) != 0) {
    fprintf(stderr, "monarch-worker: --listen wants a numeric address, got '%s'\n", o->listen_host);
    return 2;
  }
  uv_tcp_init(a->loop, &a->server);
  a->server.data = a;
  int rc = uv_tcp_bind(&a->server, (struct sockaddr *)&ss, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&a->server, 128, on_connection);
  if (rc != 0) {
    fprintf(stderr, "monarch-worker: cannot listen on %s:%d: %s\n", o->listen_host, o->listen_port,
            uv_strerror(rc));
    return 2;
  }
  int len = sizeof(ss);
  uv_tcp_getsockname(&a->server, (struct sockaddr *)&ss, &len);
  int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
  char line[64];
  if (o->port_fd >= 0) {
    int n = snprintf(line, sizeof(line), "%d\n", port);
    if (write(o->port_fd, line, (size_t)n) != n) return 2;
    close(o->port_fd);
  } else {
    printf("monarch-worker: host agent listening on %s:%d\n", o->listen_host, port);
    fflush(stdout);
  }
  const char *grace = getenv("MONARCH_AGENT_GRACE");
  a->grace_ms = grace ? (uint64_t)(atof(grace) * 1000) : MN_AGENT_GRACE_MS;
  a->started = uv_now(a->loop);
  const char *silence = getenv("MONARCH_AGENT_SILENCE");
  a->silence_ms = silence ? (uint64_t)(atof(silence) * 1000) : MN_AGENT_SILENCE_MS;
  uv_timer_init(a->loop, &a->tick);
  a->tick.data = a;
  uv_timer_start(&a->tick, on_tick, 1000, 1000);
  uv_unref((uv_handle_t *)&a->tick);
  uv_signal_t sigterm, sigint;
  uv_signal_init(a->loop, &sigterm);
  uv_signal_init(a->loop, &sigint);
  sigterm.data = sigint.data = a;
  uv_signal_start(&sigterm, on_signal, SIGTERM);
  uv_signal_start(&sigint, on_signal, SIGINT);
  uv_unref((uv_handle_t *)&sigterm);
  uv_unref((uv_handle_t *)&sigint);
  uv_run(a->loop, UV_RUN_DEFAULT);
  /* Stopped: kill what is left and let the close callbacks run. */
  for (aconn_t *c = a->conns; c; c = c->next) conn_close(c);
  while (a->sessions) session_end(a->sessions);
  uv_walk(a->loop, walk_kill_parked, NULL);
  uv_close((uv_handle_t *)&a->tick, NULL);
  uv_close((uv_handle_t *)&a->server, NULL);
  uv_close((uv_handle_t *)&sigterm, NULL);
  uv_close((uv_handle_t *)&sigint, NULL);
  uv_run(a->loop, UV_RUN_DEFAULT);
  return 0;
}
