/* agent_proc.c - the host agent's procs: spawning, port reports, exits, status lines and output. */
#include "agent_int.h"

#include <limits.h>

/* ---- procs ----------------------------------------------------------------- */

void mn__agent_proc_handle_closed(uv_handle_t *h) {
  aproc_t *p = h->data;
  if (--p->open_handles == 0) {
    agent_t *a = p->a;
    mn_buf_free(&p->obuf);
    mn_buf_free(&p->ebuf);
    free(p);
    a->nprocs--;
    mn__agent_maybe_exit(a);
  }
}

void mn__agent_send_spawn_failed(asession_t *c, uint64_t req, int index, const char *msg) {
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_spawn_failed(&b, req, index, msg) == 0) mn__agent_session_send(c, &b);
  mn_buf_free(&b);
}

void mn__agent_note_exit(agent_t *a, int rank, int64_t pid, int64_t status, int sig) {
  int slot = a->nexits++ % MN_EXITS_KEPT;
  a->exits[slot].rank = rank;
  a->exits[slot].pid = pid;
  a->exits[slot].status = status;
  a->exits[slot].sig = sig;
  a->exits[slot].at = uv_now(a->loop);
}

static void on_proc_exit(uv_process_t *h, int64_t status, int sig) {
  aproc_t *p = h->data;
  char msg[160];
  mn__agent_note_exit(p->a, p->rank, h->pid, status, sig);
  if (p->owner != NULL) {
    if (!p->reported) {
      snprintf(msg, sizeof(msg), "proc rank %d exited (%s %d) before it was ready", p->rank,
               sig ? "signal" : "code", sig ? sig : (int)status);
      mn__agent_send_spawn_failed(p->owner, p->req, p->index, msg);
    } else {
      mn_buf_t b;
      mn_buf_init(&b);
      const char *name = sig ? sigabbrev_np(sig) ? sigabbrev_np(sig) : "?" : "";
      if (mn_msg_pack_proc_exit(&b, h->pid, status, name, p->rank) == 0) mn__agent_session_send(p->owner, &b);
      mn_buf_free(&b);
    }
  }
  mn__agent_persist_unmark(p);
  mn__agent_relay_proc_gone(p);
  mn__agent_pids_remove(p->a, p);
  uv_close((uv_handle_t *)&p->proc, mn__agent_proc_handle_closed);
  if (!uv_is_closing((uv_handle_t *)&p->pipe)) uv_close((uv_handle_t *)&p->pipe, mn__agent_proc_handle_closed);
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
      mn__agent_stat_line(p, e, run, uv_now(p->a->loop));
      p->last_status = uv_now(p->a->loop);
      p->hung = 0;
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
    uv_close((uv_handle_t *)&p->pipe, mn__agent_proc_handle_closed);
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
    mn_buf_init(&b);
    if (mn_msg_pack_spawned(&b, p->req, p->index, p->proc.pid, port) == 0) mn__agent_session_send(p->owner, &b);
    mn_buf_free(&b);
    p->reported = 1;
    char *nl = memchr(p->buf, '\n', p->blen);
    size_t used = nl ? (size_t)(nl - p->buf) + 1 : p->blen;
    memmove(p->buf, p->buf + used, p->blen - used);
    p->blen -= used;
    take_status(p);
    return; /* the pipe stays open for status lines */
  }
  uv_close((uv_handle_t *)&p->pipe, mn__agent_proc_handle_closed);
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
  mn_buf_init(&f);
  if (mn_msg_pack_log(&f, p->rank, stream, b->data, end) == 0) mn__agent_session_send(p->owner, &f);
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
  if (n < 0) uv_close((uv_handle_t *)s, mn__agent_proc_handle_closed);
}

/* ---- hangs: a proc's I/O thread writes a status line every MONARCH_STATUS_MS ---- */

static void walk_hang(uv_handle_t *h, void *arg) {
  uint64_t now = *(uint64_t *)arg;
  if (h->type != UV_PROCESS || uv_is_closing(h) || h->data == NULL) return;
  aproc_t *p = h->data;
  asession_t *s = p->owner;
  if (s == NULL || s->ended || p->hang_ms == 0 || !p->reported || p->hung || now - p->last_status <= p->hang_ms) return;
  p->hung = 1;
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_proc_hung(&b, ((uv_process_t *)h)->pid, p->rank, now - p->last_status) == 0)
    mn__agent_session_send(s, &b);
  mn_buf_free(&b);
}

static void on_hang_check(uv_timer_t *t) {
  agent_t *a = t->data;
  uint64_t now = uv_now(a->loop);
  if (a->nprocs > 0) uv_walk(a->loop, walk_hang, &now); /* only real procs are watched (and are handles) */
}

/* The interval of status lines (and of the check) for a hang timeout: a quarter of it, within bounds. */
static uint64_t status_ms(uint64_t hang_ms) {
  uint64_t ms = hang_ms / 4;
  return ms < MN_STATUS_MS_MIN ? MN_STATUS_MS_MIN : ms > MN_STATUS_MS_MAX ? MN_STATUS_MS_MAX : ms;
}

void mn__agent_watch_hangs(agent_t *a, uint64_t hang_ms) {
  uint64_t period = status_ms(hang_ms) / 2; /* a hang is seen at most hang_ms plus half a line late */
  if (a->hang_period != 0 && a->hang_period <= period) return;
  if (a->hang_period == 0) {
    uv_timer_init(a->loop, &a->hang_timer);
    a->hang_timer.data = a;
  }
  a->hang_period = period;
  uv_timer_start(&a->hang_timer, on_hang_check, period, period);
  uv_unref((uv_handle_t *)&a->hang_timer);
}

#define PROC_ENV_VARS 4 /* what proc_env may add, and the two paths of shipped files */
#define PROC_ENV_SHIP 2

/*
 * The proc's environment: the agent's, plus what the user left unset of
 *  - a BLAS/OpenMP thread count, so procs sharing a host do not each start
 *    a thread per core (OpenBLAS's default) and fight over the cores;
 *  - MONARCH_SPIN_US, how long the proc's threads keep yielding the core
 *    before they sleep: 50 us while the host has a core per proc (a
 *    sleeping core takes tens of microseconds to wake on a VM: call_one
 *    about 20 us instead of 60), 0 when procs outnumber cores (waiting
 *    then takes a core another proc needs: 8 procs on 2 cores gathered
 *    2.4x slower). bench/core.lua;
 *  - MONARCH_STATUS_MS, how often its I/O thread writes a status line: a
 *    quarter of the session's hang timeout, so the agent sees a hang in time;
 * and, always ours (agent_ship.c), ship[0] MONARCH_SHIP_CACHE=, where shipped libraries
 * are (ship:<hash> names resolve there), and ship[1] MONARCH_WORKSPACE=, the session's files.
 * Fills env (room for environ, PROC_ENV_VARS + PROC_ENV_SHIP more and the NULL) from bufs.
 */
static void proc_env(char **env, size_t room, char bufs[PROC_ENV_VARS][48], int threads, int spin_us, int st_ms,
                     char *const ship[PROC_ENV_SHIP]) {
  extern char **environ;
  static const char *const vars[PROC_ENV_VARS] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MONARCH_SPIN_US",
                                                  "MONARCH_STATUS_MS"};
  int vals[PROC_ENV_VARS] = {threads, threads, spin_us, st_ms};
  size_t n = 0;
  int have[PROC_ENV_VARS] = {0};
  for (char **e = environ; *e != NULL && n + PROC_ENV_VARS + PROC_ENV_SHIP + 1 < room; e++) {
    if (strncmp(*e, "MONARCH_SHIP_CACHE=", 19) == 0 || strncmp(*e, "MONARCH_WORKSPACE=", 18) == 0) continue;
    for (int v = 0; v < PROC_ENV_VARS; v++)
      if (strncmp(*e, vars[v], strlen(vars[v])) == 0 && (*e)[strlen(vars[v])] == '=') have[v] = 1;
    env[n++] = *e;
  }
  for (int v = 0; v < PROC_ENV_VARS; v++) {
    if (have[v] || vals[v] < 0) continue;
    snprintf(bufs[v], sizeof(bufs[v]), "%s=%d", vars[v], vals[v]);
    env[n++] = bufs[v];
  }
  for (int v = 0; v < PROC_ENV_SHIP; v++) env[n++] = ship[v];
  env[n] = NULL;
}

/* Execs the proc with its stdout, stderr and port pipe, and the relay's end sv[1] as its fd 4; sv[0] stays ours. */
static int spawn_exec(aproc_t *p, char **args, char **env, const int sv[2]) {
  uv_stdio_container_t stdio[5];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&p->out;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&p->err;
  stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[3].data.stream = (uv_stream_t *)&p->pipe;
  stdio[4].flags = UV_INHERIT_FD; /* dup'ed to fd 4 in the child, without CLOEXEC */
  stdio[4].data.fd = sv[1];
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.file = p->a->o->exe;
  po.args = args;
  po.env = env;
  po.exit_cb = on_proc_exit;
  po.stdio = stdio;
  po.stdio_count = 5;
  int rc = uv_spawn(p->a->loop, &p->proc, &po);
  close(sv[1]); /* the child has its copy */
  if (rc != 0) close(sv[0]);
  return rc;
}

int mn__agent_spawn_one(asession_t *c, uint64_t req, int index, int rank, int world, int device, int threads,
                        int spin_us) {
  agent_t *a = c->a;
  extern char **environ;
  size_t nenv = 0;
  while (environ[nenv] != NULL) nenv++;
  char **env = malloc(sizeof(char *) * (nenv + PROC_ENV_VARS + PROC_ENV_SHIP + 1)), bufs[PROC_ENV_VARS][48];
  char blobs[PATH_MAX], work[PATH_MAX], ship_env[PROC_ENV_SHIP][PATH_MAX + 24], *ship[PROC_ENV_SHIP];
  aproc_t *p = calloc(1, sizeof(*p));
  char srank[16], sworld[16], sparent[16], sorphan[32], sdevice[16];
  if (p == NULL || env == NULL || mn__agent_pids_reserve(a) != 0) { /* reserved: the add below cannot fail */
    free(p);
    free(env);
    return UV_ENOMEM;
  }
  mn__agent_ship_paths(a, c, blobs, sizeof(blobs), work, sizeof(work));
  snprintf(ship_env[0], sizeof(ship_env[0]), "MONARCH_SHIP_CACHE=%s", blobs);
  snprintf(ship_env[1], sizeof(ship_env[1]), "MONARCH_WORKSPACE=%s", work);
  ship[0] = ship_env[0];
  ship[1] = ship_env[1];
  proc_env(env, nenv + PROC_ENV_VARS + PROC_ENV_SHIP + 1, bufs, threads, spin_us,
           c->hang_ms > 0 ? (int)status_ms(c->hang_ms) : -1, ship);
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
                  "--parent", sparent, "--port-fd", "3", "--relay-fd", "4", "--orphan-timeout", sorphan,
                  device >= 0 ? "--device" : NULL, sdevice, NULL};
  uv_pipe_init(a->loop, &p->pipe, 0);
  uv_pipe_init(a->loop, &p->out, 0);
  uv_pipe_init(a->loop, &p->err, 0);
  p->pipe.data = p->out.data = p->err.data = p;
  p->proc.data = p;
  p->started = p->last_status = uv_now(a->loop);
  p->hang_ms = c->hang_ms;
  snprintf(p->running, sizeof(p->running), "-");
  int sv[2];
  int rc = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ? uv_translate_sys_error(errno)
                                                                        : spawn_exec(p, args, env, sv);
  free(env); /* the child has exec'd (or failed to) by now */
  if (rc != 0) {
    p->open_handles = 3;
    p->owner = NULL;
    a->nprocs++;
    uv_close((uv_handle_t *)&p->pipe, mn__agent_proc_handle_closed);
    uv_close((uv_handle_t *)&p->out, mn__agent_proc_handle_closed);
    uv_close((uv_handle_t *)&p->err, mn__agent_proc_handle_closed);
    return rc;
  }
  p->open_handles = 5;
  a->nprocs++;
  mn__agent_pids_add(a, p);
  mn__agent_relay_open(p, sv[0]); /* on failure the proc still serves, only not through casts */
  uv_read_start((uv_stream_t *)&p->pipe, pipe_alloc, on_port);
  uv_read_start((uv_stream_t *)&p->out, log_alloc, log_read);
  uv_read_start((uv_stream_t *)&p->err, log_alloc, log_read);
  return 0;
}
