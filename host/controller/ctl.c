/* ctl.c - controller connections; see ctl.h. */
#include "ctl.h"

#include "handshake.h"
#include "sock.h"

#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MN_READ_CHUNK (256 * 1024) /* bytes offered to each read */

static int push_event(mn_ctl_t *c, mn_ev_kind_t k, int conn, int64_t a, int64_t b) {
  if (c->nevents == c->evcap) {
    size_t cap = c->evcap ? c->evcap * 2 : 64;
    mn_event_t *e = realloc(c->events, cap * sizeof(*e));
    if (e == NULL) return MN_ENOMEM;
    c->events = e;
    c->evcap = cap;
  }
  c->events[c->nevents++] = (mn_event_t){k, conn, a, b};
  return 0;
}

static void mark(int **list, int *n, int nconns, int id) {
  if (*list == NULL) *list = calloc((size_t)MN_MAX_CONNS, sizeof(int));
  (void)nconns;
  if (*list != NULL) (*list)[(*n)++] = id;
}

int mn_ctl_init(mn_ctl_t *c, const char *token, size_t toklen) {
  memset(c, 0, sizeof(*c));
  signal(SIGPIPE, SIG_IGN);
  if (mn_auth_init(&c->auth, token, toklen) != 0) return MN_EAUTH;
  if (uv_loop_init(&c->loop) != 0) return MN_ENOMEM;
  uv_timer_init(&c->loop, &c->timer);
  c->conns = calloc(MN_MAX_CONNS, sizeof(*c->conns));
  return c->conns ? 0 : MN_ENOMEM;
}

mn_conn_t *mn_ctl_conn(mn_ctl_t *c, int id) {
  return id > 0 && id <= c->nconns ? c->conns[id] : NULL;
}

/* ---- closing ---------------------------------------------------------------- */

static void on_tcp_closed(uv_handle_t *h) {
  mn_conn_t *k = h->data;
  k->handle_open = 0;
}

void mn_ctl_disconnect(mn_ctl_t *c, int id, const char *reason) {
  mn_conn_t *k = mn_ctl_conn(c, id);
  if (k == NULL || k->state == MN_CS_CLOSED) return;
  k->state = MN_CS_CLOSED;
  snprintf(k->reason, sizeof(k->reason), "%s", reason);
  if (k->handle_open && !uv_is_closing((uv_handle_t *)&k->tcp))
    uv_close((uv_handle_t *)&k->tcp, on_tcp_closed);
  k->out.len = 0;
  push_event(c, MN_EV_CLOSED, id, 0, 0);
}

static void free_conn(mn_conn_t *k) {
  mn_buf_free(&k->in);
  mn_buf_free(&k->out);
  mn_buf_free(&k->inflight);
  free(k->ring);
  free(k);
}

static void on_agent_closed(uv_handle_t *h) { (void)h; }

void mn_ctl_close(mn_ctl_t *c) {
  c->closing = 1;
  for (int i = 1; i <= c->nconns; i++) mn_ctl_disconnect(c, i, "controller closing");
  if (c->agent_running) {
    /* The agent was started with --once: our goodbye is enough, the signal is a backstop. */
    uv_process_kill(&c->agent, SIGTERM);
  }
  uv_close((uv_handle_t *)&c->timer, NULL);
  if (!uv_is_closing((uv_handle_t *)&c->agent_pipe) && c->agent_pipe.type == UV_NAMED_PIPE)
    uv_close((uv_handle_t *)&c->agent_pipe, on_agent_closed);
  /* Let close callbacks and the agent's exit run, bounded. */
  for (int i = 0; i < 200 && uv_loop_alive(&c->loop); i++) {
    if (c->agent_running && i == 100) uv_process_kill(&c->agent, SIGKILL);
    uv_run(&c->loop, UV_RUN_NOWAIT);
    if (!uv_loop_alive(&c->loop)) break;
    usleep(10000);
  }
  if (c->agent.type == UV_PROCESS && !uv_is_closing((uv_handle_t *)&c->agent))
    uv_close((uv_handle_t *)&c->agent, NULL);
  uv_run(&c->loop, UV_RUN_NOWAIT);
  if (uv_loop_close(&c->loop) != 0) {
    /* Handles still open (a stuck agent): leave the loop; the process is exiting. */
  }
  for (int i = 1; i <= c->nconns; i++) free_conn(c->conns[i]);
  free(c->conns);
  free(c->dirty);
  free(c->readable);
  free(c->events);
}

/* ---- writing ------------------------------------------------------------------ */

char *mn_ctl_reserve(mn_ctl_t *c, mn_conn_t *k, size_t n) {
  if (mn_buf_reserve(&k->out, n) != 0) return NULL;
  char *p = k->out.data + k->out.len;
  k->out.len += n;
  if (!k->dirty) {
    k->dirty = 1;
    mark(&c->dirty, &c->ndirty, c->nconns, k->id);
  }
  return p;
}

int mn_ctl_push_pending(mn_conn_t *k, double call, int32_t slot) {
  if (k->rcount == k->rcap) {
    size_t cap = k->rcap ? k->rcap * 2 : 256;
    mn_pending_t *r = malloc(cap * sizeof(*r));
    if (r == NULL) return MN_ENOMEM;
    for (size_t i = 0; i < k->rcount; i++) r[i] = k->ring[(k->rhead + i) % k->rcap];
    free(k->ring);
    k->ring = r;
    k->rcap = cap;
    k->rhead = 0;
  }
  k->ring[(k->rhead + k->rcount) % k->rcap] = (mn_pending_t){call, slot};
  k->rcount++;
  return 0;
}

static void flush_conn(mn_conn_t *k);

static void on_written(uv_write_t *w, int status) {
  mn_conn_t *k = w->data;
  k->writing = 0;
  k->inflight.len = 0;
  if (status != 0) {
    mn_ctl_disconnect(k->ctl, k->id, uv_strerror(status));
    return;
  }
  if (k->out.len > 0) flush_conn(k);
}

static void flush_conn(mn_conn_t *k) {
  if (k->state != MN_CS_READY && k->state != MN_CS_WELCOME && k->state != MN_CS_HELLO) return;
  if (k->writing || k->out.len == 0) return;
  uv_buf_t b = uv_buf_init(k->out.data, (unsigned)k->out.len);
  int n = uv_try_write((uv_stream_t *)&k->tcp, &b, 1);
  if (n == (int)k->out.len) {
    k->out.len = 0;
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    mn_ctl_disconnect(k->ctl, k->id, uv_strerror(n));
    return;
  }
  if (n > 0) mn_buf_consume(&k->out, (size_t)n);
  /* Hand the rest to libuv; new frames keep appending to `out`. */
  mn_buf_t t = k->inflight;
  k->inflight = k->out;
  k->out = t;
  k->out.len = 0;
  k->writing = 1;
  k->wreq.data = k;
  b = uv_buf_init(k->inflight.data, (unsigned)k->inflight.len);
  int rc = uv_write(&k->wreq, (uv_stream_t *)&k->tcp, &b, 1, on_written);
  if (rc != 0) {
    k->writing = 0;
    mn_ctl_disconnect(k->ctl, k->id, uv_strerror(rc));
  }
}

void mn_ctl_flush(mn_ctl_t *c) {
  for (int i = 0; i < c->ndirty; i++) {
    mn_conn_t *k = mn_ctl_conn(c, c->dirty[i]);
    if (k == NULL) continue;
    k->dirty = 0;
    if (k->state == MN_CS_READY) flush_conn(k);
  }
  c->ndirty = 0;
}

/* ---- reading and the handshake ------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  mn_conn_t *k = h->data;
  (void)hint;
  if (mn_buf_reserve(&k->in, MN_READ_CHUNK) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(k->in.data + k->in.len, (unsigned)(k->in.cap - k->in.len));
}

/* Runs handshake frames at the front of k->in; returns 0 to go on, -1 if closed. */
static int handshake_step(mn_ctl_t *c, mn_conn_t *k) {
  while (k->state == MN_CS_HELLO || k->state == MN_CS_WELCOME) {
    const char *body;
    char err[300];
    msgpack_zone zone;
    msgpack_object m;
    int64_t n = mn_frame_peek(k->in.data, k->in.len, 4096, &body);
    if (n == MN_EAGAIN) return 0;
    if (n < 0) {
      mn_ctl_disconnect(c, k->id, "peer sent an oversized handshake frame (not a monarch worker?)");
      return -1;
    }
    if (!msgpack_zone_init(&zone, 1024)) return -1;
    int rc = mn_decode(body, (size_t)n, &zone, &m, err, sizeof(err));
    if (rc == 0 && k->state == MN_CS_HELLO) {
      mn_buf_t out;
      mn_buf_init(&out);
      rc = mn_hs_answer(&out, &c->auth, &m, k->ns, k->nc, err, sizeof(err));
      if (rc == 0) {
        char *p = mn_ctl_reserve(c, k, out.len);
        if (p) memcpy(p, out.data, out.len);
        k->state = MN_CS_WELCOME;
        flush_conn(k);
      }
      mn_buf_free(&out);
    } else if (rc == 0) {
      rc = mn_hs_check_welcome(&c->auth, &m, k->ns, k->nc, err, sizeof(err));
      if (rc == 0) {
        const msgpack_object *info = m.via.array.size > 2 ? &m.via.array.ptr[2] : NULL;
        const msgpack_object *h = mn_map_get(info, "hostname"), *pid = mn_map_get(info, "pid");
        if (h && h->type == MSGPACK_OBJECT_STR)
          snprintf(k->info_host, sizeof(k->info_host), "%.*s", (int)h->via.str.size, h->via.str.ptr);
        if (pid && pid->type == MSGPACK_OBJECT_POSITIVE_INTEGER) k->info_pid = (int64_t)pid->via.u64;
        k->state = MN_CS_READY;
        push_event(c, MN_EV_CONNECTED, k->id, k->info_pid, 0);
      }
    }
    msgpack_zone_destroy(&zone);
    mn_buf_consume(&k->in, MN_FRAME_HEADER + (size_t)n);
    if (rc != 0) {
      mn_ctl_disconnect(c, k->id, err);
      return -1;
    }
  }
  return 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  mn_conn_t *k = s->data;
  mn_ctl_t *c = k->ctl;
  (void)buf;
  if (n < 0) {
    mn_ctl_disconnect(c, k->id, n == UV_EOF ? "connection closed by peer" : uv_strerror((int)n));
    if (!k->readable && k->in.len > 0) {
      k->readable = 1;
      mark(&c->readable, &c->nreadable, c->nconns, k->id);
    }
    return;
  }
  k->in.len += (size_t)n;
  if (k->state != MN_CS_READY && handshake_step(c, k) != 0) return;
  if (k->state == MN_CS_READY && k->in.len > 0 && !k->readable) {
    k->readable = 1;
    mark(&c->readable, &c->nreadable, c->nconns, k->id);
  }
}

static void on_connect(uv_connect_t *req, int status) {
  mn_conn_t *k = req->data;
  if (k->state == MN_CS_CLOSED) return;
  if (status != 0) {
    char msg[256];
    snprintf(msg, sizeof(msg), "cannot connect: %s", uv_strerror(status));
    mn_ctl_disconnect(k->ctl, k->id, msg);
    return;
  }
  uv_tcp_nodelay(&k->tcp, 1);
  k->state = MN_CS_HELLO;
  uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read);
}

int mn_ctl_connect(mn_ctl_t *c, const char *host, int port, mn_conn_kind_t kind) {
  struct addrinfo hints, *res = NULL;
  char service[16];
  if (c->nconns + 1 >= MN_MAX_CONNS) return MN_ELIMIT;
  mn_conn_t *k = calloc(1, sizeof(*k));
  if (k == NULL) return MN_ENOMEM;
  k->ctl = c;
  k->kind = kind;
  k->id = ++c->nconns;
  c->conns[k->id] = k;
  k->tcp.data = k;
  k->creq.data = k;
  snprintf(k->info_host, sizeof(k->info_host), "%s", host);
  uv_tcp_init(&c->loop, &k->tcp);
  k->handle_open = 1;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  snprintf(service, sizeof(service), "%d", port);
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc != 0) {
    char msg[256];
    snprintf(msg, sizeof(msg), "cannot resolve %s: %s", host, gai_strerror(rc));
    mn_ctl_disconnect(c, k->id, msg);
    return k->id;
  }
  rc = uv_tcp_connect(&k->creq, &k->tcp, res->ai_addr, on_connect);
  freeaddrinfo(res);
  if (rc != 0) {
    char msg[256];
    snprintf(msg, sizeof(msg), "cannot connect: %s", uv_strerror(rc));
    mn_ctl_disconnect(c, k->id, msg);
  }
  return k->id;
}

/* ---- waiting ---------------------------------------------------------------------- */

int mn_ctl_has_work(const mn_ctl_t *c) { return c->nreadable > 0 || c->nevents > 0; }

static void on_timer(uv_timer_t *t) { (void)t; }

int mn_ctl_wait(mn_ctl_t *c, int timeout_ms) {
  mn_ctl_flush(c);
  if (mn_ctl_has_work(c) || timeout_ms == 0) {
    uv_run(&c->loop, UV_RUN_NOWAIT);
    mn_ctl_flush(c);
    return mn_ctl_has_work(c);
  }
  if (timeout_ms > 0) uv_timer_start(&c->timer, on_timer, (uint64_t)timeout_ms, 0);
  uv_run(&c->loop, UV_RUN_ONCE);
  if (timeout_ms > 0) uv_timer_stop(&c->timer);
  mn_ctl_flush(c);
  return mn_ctl_has_work(c);
}

/* ---- the embedded local agent ----------------------------------------------------- */

static void on_agent_exit(uv_process_t *p, int64_t status, int sig) {
  mn_ctl_t *c = p->data;
  c->agent_running = 0;
  if (!c->closing) push_event(c, MN_EV_AGENT_EXIT, 0, status, sig);
}

static void agent_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  mn_ctl_t *c = h->data;
  (void)hint;
  *buf = uv_buf_init(c->agent_buf + c->agent_blen, (unsigned)(sizeof(c->agent_buf) - 1 - c->agent_blen));
}

static void agent_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  mn_ctl_t *c = s->data;
  (void)buf;
  if (n > 0) c->agent_blen += (size_t)n;
  c->agent_buf[c->agent_blen] = '\0';
  if (n < 0 || strchr(c->agent_buf, '\n') != NULL || c->agent_blen >= sizeof(c->agent_buf) - 1) {
    c->agent_port = atoi(c->agent_buf) > 0 ? atoi(c->agent_buf) : -1;
    uv_read_stop(s);
  }
}

int mn_ctl_start_agent(mn_ctl_t *c, const char *exe, const char *token, char *err, size_t errlen) {
  char parent[16], envtok[MN_MAX_TOKEN + 32];
  extern char **environ;
  snprintf(parent, sizeof(parent), "%d", (int)getpid());
  snprintf(envtok, sizeof(envtok), "MONARCH_TOKEN=%s", token);
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 2, sizeof(char *));
  if (env == NULL) return MN_ENOMEM;
  size_t j = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "MONARCH_TOKEN", 13) != 0) env[j++] = environ[i];
  env[j++] = envtok;
  char *args[] = {(char *)exe, "--listen", "127.0.0.1:0", "--once", "--parent", parent, "--port-fd", "3", NULL};
  uv_pipe_init(&c->loop, &c->agent_pipe, 0);
  c->agent_pipe.data = c;
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 1;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[3].data.stream = (uv_stream_t *)&c->agent_pipe;
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.file = exe;
  po.args = args;
  po.env = env;
  po.exit_cb = on_agent_exit;
  po.stdio = stdio;
  po.stdio_count = 4;
  c->agent.data = c;
  int rc = uv_spawn(&c->loop, &c->agent, &po);
  free(env);
  if (rc != 0) {
    snprintf(err, errlen, "cannot start host agent %s: %s", exe, uv_strerror(rc));
    return MN_EPROTO;
  }
  c->agent_running = 1;
  c->agent_port = 0;
  uv_read_start((uv_stream_t *)&c->agent_pipe, agent_alloc, agent_read);
  uint64_t deadline = uv_hrtime() + 10ull * 1000000000ull;
  while (c->agent_port == 0 && c->agent_running && uv_hrtime() < deadline) {
    uv_timer_start(&c->timer, on_timer, 100, 0);
    uv_run(&c->loop, UV_RUN_ONCE);
  }
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->agent_pipe, NULL);
  if (c->agent_port <= 0) {
    snprintf(err, errlen, "host agent %s did not start (%s)", exe,
             c->agent_running ? "no port reported in 10 s" : "it exited");
    return MN_EPROTO;
  }
  return c->agent_port;
}
