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
#include "agent_int.h"

void mn__agent_on_write(uv_write_t *w, int status) {
  (void)status; /* a failed write shows up as a read error on the same conn */
  free(w->data);
  free(w);
}

/* Sends b's bytes to c (copied; b stays the caller's). */
void mn__agent_send_buf(aconn_t *c, const mn_buf_t *b) {
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
  if (uv_write(w, (uv_stream_t *)&c->tcp, &ub, 1, mn__agent_on_write) != 0) mn__agent_on_write(w, -1);
}

/* Delivers b to the session's controller, or keeps it until the controller is back. */
void mn__agent_session_send(asession_t *s, const mn_buf_t *b) {
  if (s == NULL || s->ended) return;
  if (s->conn != NULL) mn__agent_send_buf(s->conn, b);
  else if (s->backlog.len + b->len <= MN_MAX_BACKLOG && mn_buf_append(&s->backlog, b->data, b->len) != 0)
    return; /* dropped: the controller will see its procs as lost */
}

void mn__agent_maybe_exit(agent_t *a) {
  if (a->o->once && a->served && a->nconns == 0 && a->nprocs == 0 && a->sessions == NULL && !a->stopping) {
    a->stopping = 1;
    uv_stop(a->loop);
  }
}

/* Unmarks a persistent proc; its mesh's record goes with the last one. */
void mn__agent_persist_unmark(aproc_t *p) {
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
  mn__agent_maybe_exit(a);
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
    mn__agent_persist_unmark(p);
    uv_process_kill((uv_process_t *)h, SIGKILL);
  }
}

/* Kills a session's procs and forgets it. */
static void session_end(asession_t *s) {
  agent_t *a = s->a;
  s->ended = 1;
  uv_walk(a->loop, walk_kill, s);
  if (a->sim != NULL) mn__agent_sim_session_end(s);
  asession_t **pp = &a->sessions;
  while (*pp && *pp != s) pp = &(*pp)->next;
  if (*pp) *pp = s->next;
  if (s->conn) s->conn->session = NULL;
  for (aconn_t *c = a->conns; c; c = c->next)
    if (c->relay_of == s) c->relay_of = NULL;
  mn__agent_tree_release(s);
  mn__agent_tree_close(s);
  mn__agent_ship_session_end(s);
  mn_buf_free(&s->backlog);
  mn__agent_relay_session_gone(s);
  free(s);
  mn__agent_maybe_exit(a);
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
    mn__agent_send_buf(c, &s->backlog);
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
    /* A controller that reaches us through a parent agent (the cast tree) writes nothing here directly. */
    if (!a->o->once && c->ready && !c->closing && !c->held && now - c->last_rx > a->silence_ms &&
        !(c->session != NULL && mn__agent_tree_heard(a, c->session, a->silence_ms)))
      conn_close(c);
  }
}

static void conn_close(aconn_t *c) {
  if (c->closing) return;
  c->closing = 1;
  for (asession_t *s = c->a->sessions; c->held && s; s = s->next)
    if (s->held == c) s->held = NULL;
  if (c->relay_of != NULL && c->relay_of->up == c) c->relay_of->up = NULL;
  if (c->session != NULL && c->session->up == c) c->session->up = NULL;
  c->relay_of = NULL;
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

void mn__agent_refuse(aconn_t *c, int code, const char *msg) {
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_error(&b, code, msg) == 0) mn__agent_send_buf(c, &b);
  mn_buf_free(&b);
  conn_close(c);
}

static void on_hs_timeout(uv_timer_t *t) {
  aconn_t *c = t->data;
  if (!c->ready) mn__agent_refuse(c, MN_ETIMEDOUT, "handshake not completed in time");
}

/* Starts session s's procs of one SPAWN (sp checked), answering each with SPAWNED or SPAWN_FAILED. */
static void spawn_procs(asession_t *s, const mn_msg_spawn_t *sp) {
  agent_t *a = s->a;
  uint64_t req = sp->req;
  const msgpack_object *base = mn_map_get(sp->spec, "rank_base"), *world = mn_map_get(sp->spec, "world"),
                       *dev = mn_map_get(sp->spec, "device_base"), *hang = mn_map_get(sp->spec, "hang_ms");
  if (sp->count > MN_MAX_SPAWN) {
    mn__agent_send_spawn_failed(s, req, 0, "SPAWN count exceeds MN_MAX_SPAWN (4096)");
    return;
  }
  int n = (int)sp->count;
  int rb = base && base->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)base->via.u64 : 0;
  int w = world && world->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)world->via.u64 : n;
  /* device_base d: proc i is pinned to GPU d + i. Absent (or nil): CPU procs. */
  int db = -1;
  if (dev != NULL && dev->type == MSGPACK_OBJECT_POSITIVE_INTEGER && dev->via.u64 <= MN_MAX_SPAWN) db = (int)dev->via.u64;
  else if (dev != NULL && dev->type != MSGPACK_OBJECT_NIL) {
    mn__agent_send_spawn_failed(s, req, 0, "SPAWN device_base must be a GPU number 0..4096");
    return;
  }
  /* hang_ms: report a proc whose I/O thread is silent that long (the controller's heartbeat timeout). */
  if (hang != NULL && hang->type == MSGPACK_OBJECT_POSITIVE_INTEGER && hang->via.u64 > 0) {
    s->hang_ms = hang->via.u64;
    mn__agent_watch_hangs(a, hang->via.u64);
  }
  if (a->sim != NULL) {
    mn__agent_sim_spawn(s, req, n, rb, w); /* virtual procs: nothing to exec */
    return;
  }
  /* The cores shared out among this host's procs, these included (earlier procs keep theirs). */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cpus > 0 ? (int)(cpus / (a->nprocs + n)) : 1;
  int spin_us = cpus > 0 && a->nprocs + n <= cpus ? MN_AGENT_SPIN_US : 0;
  if (threads < 1) threads = 1;
  for (int i = 0; i < n; i++) {
    int rc = mn__agent_spawn_one(s, req, i, rb + i, w, db >= 0 ? db + i : -1, threads, spin_us);
    if (rc != 0) {
      char msg[200];
      snprintf(msg, sizeof(msg), "cannot start %s: %s", a->o->exe, uv_strerror(rc));
      mn__agent_send_spawn_failed(s, req, i, msg);
    }
  }
}

/* Whether session s has had SPAWN `req` already (and notes it): the controller resends a spawn it sent
 * through the tree when a relay on the way was lost, and the first copy may have got here. */
static int spawn_seen(asession_t *s, uint64_t req) {
  if (req == 0) return 0; /* a relay's place holder: it spawns nothing itself */
  for (int i = 0; i < MN_SPAWNS_SEEN; i++)
    if (s->spawns_seen[i] == req) return 1;
  s->spawns_seen[s->spawns_next++ % MN_SPAWNS_SEEN] = req;
  return 0;
}

/* SPAWN for session s, from its controller or (through the cast tree) a parent agent's relay link c:
 * the children's parts go on first, then this agent starts its own procs. Answers go to s's controller. */
static void handle_spawn(aconn_t *c, asession_t *s, const msgpack_object *m) {
  mn_msg_spawn_t sp;
  char err[300];
  if (mn_msg_parse_spawn(m, &sp, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  if (s->ended) return;
  if (sp.subs != NULL) mn__agent_tree_forward_spawn(s, sp.subs);
  if (sp.count == 0 || spawn_seen(s, sp.req)) return;
  spawn_procs(s, &sp);
}

static void handle_kill(aconn_t *c, const msgpack_object *m) {
  mn_msg_kill_t kl;
  char err[300];
  if (mn_msg_parse_kill(m, &kl, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  /* Only this controller's own procs: it cannot signal arbitrary pids. */
  aproc_t *p = mn__agent_pids_find(c->a, kl.pid);
  if (p != NULL && p->owner == c->session && kl.sig > 0) uv_process_kill(&p->proc, kl.sig);
  if (c->a->sim != NULL) mn__agent_sim_kill(c->session, kl.pid, kl.sig);
}

/* SESSION [22, id, 0, true]: a parent agent's relay link for session id, which must be ours already. */
static void relay_attach(aconn_t *c, uint64_t id, uint64_t silence_ms) {
  asession_t *s = c->a->sessions;
  while (s && s->id != id) s = s->next;
  if (s == NULL || s->ended) {
    mn__agent_refuse(c, MN_EPROTO, "relay link for a session this agent does not have");
    return;
  }
  c->relay_of = s;
  c->relay_silence_ms = silence_ms;
}

/* A relay link carries casts, spawns, ACKS, shipped chunks and its parent's pings, nothing else. */
static void relay_link_handle(aconn_t *c, const msgpack_object *m, mn_buf_t *out) {
  char err[256];
  const msgpack_object *id;
  if (mn_msg_type(m) == MN_MSG_CAST) {
    mn__agent_handle_cast(c, m);
  } else if (mn_msg_type(m) == MN_MSG_SPAWN) {
    handle_spawn(c, c->relay_of, m);
  } else if (mn_msg_type(m) == MN_MSG_ACKS) {
    mn__agent_handle_acks(c, m);
  } else if (mn_msg_type(m) == MN_MSG_SHIP_DATA) {
    mn__agent_handle_ship_data(c, c->relay_of, m);
  } else if (mn_msg_type(m) == MN_MSG_PING && mn_msg_parse_ping(m, &id, err, sizeof(err)) == 0) {
    if (mn_msg_pack_pong(out, id) == 0) mn__agent_send_buf(c, out);
  } else {
    snprintf(err, sizeof(err), "a relay link does not carry message type %d", mn_msg_type(m));
    mn__agent_refuse(c, MN_EPROTO, err);
  }
}

static void handle(aconn_t *c, const msgpack_object *m) {
  char err[256];
  mn_buf_t out;
  mn_buf_init(&out);
  if (!c->ready) {
    uint8_t nc[MN_NONCE_LEN];
    int rc = mn_hs_check_auth(&c->a->auth, m, c->ns, nc, err, sizeof(err));
    if (rc != 0) {
      mn__agent_refuse(c, rc, err);
    } else {
      c->ready = 1;
      c->a->served++; /* a count: agent_join.c tells from it whether the controller it joined came */
      uv_timer_stop(&c->hs_timer);
      mn_hs_welcome_agent(&out, &c->a->auth, c->ns, nc, c->a->elf.elf_class, c->a->elf.machine,
                          mn__agent_ship_enabled(c->a), mn__agent_ship_id(c->a));
      mn__agent_send_buf(c, &out);
    }
    mn_buf_free(&out);
    return;
  }
  if (mn_msg_type(m) == MN_MSG_SESSION && c->relay_of == NULL) {
    mn_msg_session_t sess;
    if (mn_msg_parse_session(m, &sess, err, sizeof(err)) != 0) mn__agent_refuse(c, MN_EPROTO, err);
    else if (sess.relay && c->session != NULL) mn__agent_refuse(c, MN_EPROTO, "a controller's connection cannot become a relay link");
    else if (sess.relay) relay_attach(c, sess.session, sess.silence_ms);
    else if (session_attach(c, sess.session) == NULL) mn__agent_refuse(c, MN_ENOMEM, "out of memory");
    mn_buf_free(&out);
    return;
  }
  if (c->relay_of != NULL) {
    relay_link_handle(c, m, &out);
    mn_buf_free(&out);
    return;
  }
  if (c->session == NULL) {
    /* A controller that skips SESSION gets a private one (ended when it leaves). */
    uint64_t sid = ((uint64_t)(uintptr_t)c << 1) | 1;
    if (session_attach(c, sid) == NULL) {
      mn__agent_refuse(c, MN_ENOMEM, "out of memory");
      mn_buf_free(&out);
      return;
    }
  }
  switch (mn_msg_type(m)) {
  case MN_MSG_GOODBYE: session_end(c->session); break;
  case MN_MSG_SPAWN: handle_spawn(c, c->session, m); break;
  case MN_MSG_KILL: handle_kill(c, m); break;
  case MN_MSG_PERSIST: mn__agent_handle_persist(c, m); break;
  case MN_MSG_ATTACH: mn__agent_handle_attach(c, m); break;
  case MN_MSG_DETACH: mn__agent_handle_detach(c, m); break;
  case MN_MSG_LIST: mn__agent_handle_list(c, m); break;
  case MN_MSG_STATUS: mn__agent_handle_status(c, m); break;
  case MN_MSG_CAST: mn__agent_handle_cast(c, m); break;
  case MN_MSG_ACKS: mn__agent_handle_acks(c, m); break;
  case MN_MSG_TREE: mn__agent_tree_set(c, m); break;
  case MN_MSG_SHIP_ASK: mn__agent_handle_ship_ask(c, m); break;
  case MN_MSG_SHIP_DATA: mn__agent_handle_ship_data(c, c->session, m); break;
  case MN_MSG_PING: {
    const msgpack_object *id;
    /* A PING of another shape is ignored: nobody waits for its answer. */
    if (mn_msg_parse_ping(m, &id, err, sizeof(err)) == 0 && mn_msg_pack_pong(&out, id) == 0)
      mn__agent_send_buf(c, &out);
    break;
  }
  default:
    snprintf(err, sizeof(err), "agent does not accept message type %d", mn_msg_type(m));
    mn__agent_refuse(c, MN_EPROTO, err);
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
  uint64_t now = uv_now(c->a->loop);
  /* Bytes on a relay link after its parent's silence limit were held up by a cut: the parent has closed
   * its end and the controller resent them directly; run here, their answers would go up a dead link. */
  if (c->relay_of != NULL && c->relay_silence_ms > 0 && now - c->last_rx > c->relay_silence_ms) {
    conn_close(c);
    return;
  }
  c->in.len += (size_t)n;
  c->last_rx = now;
  size_t off = 0;
  while (!c->closing) {
    const char *body;
    char err[256];
    msgpack_object m;
    /* Before authentication only a small frame is acceptable. */
    int64_t len = mn_frame_peek(c->in.data + off, c->in.len - off, c->ready ? MN_MAX_FRAME : 4096, &body);
    if (len == MN_EAGAIN) break;
    if (len < 0) {
      mn__agent_refuse(c, MN_EFRAME, c->ready ? "frame exceeds MN_MAX_FRAME" : "handshake frame too large");
      return;
    }
    off += MN_FRAME_HEADER + (size_t)len;
    msgpack_zone_clear(&c->zone);
    int rc = mn_decode(body, (size_t)len, &c->zone, &m, err, sizeof(err));
    if (rc != 0) {
      mn__agent_refuse(c, rc, err);
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
  mn__agent_send_buf(c, &b);
  mn_buf_free(&b);
  uv_timer_start(&c->hs_timer, on_hs_timeout, MN_HANDSHAKE_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
}

void mn__agent_conn_hold(aconn_t *c, int hold) {
  if (c == NULL || c->closing || c->held == hold) return;
  c->held = hold;
  if (hold) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    return;
  }
  c->last_rx = uv_now(c->a->loop); /* what waited in the socket waited for us, not for a cut */
  if (uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read) != 0) conn_close(c);
}

void mn__agent_stop(agent_t *a) {
  for (aconn_t *c = a->conns; c; c = c->next) conn_close(c);
  while (a->sessions) session_end(a->sessions);
  uv_walk(a->loop, walk_kill_parked, NULL);
  a->stopping = 1;
  uv_stop(a->loop);
}

/* SIGTERM or SIGINT: every agent of this process stops (a simulated group shares one loop). */
static void on_signal(uv_signal_t *s, int sig) {
  (void)sig;
  agent_t *g = s->data;
  for (int i = 0; i < (g->o->group > 0 ? g->o->group : 1); i++) mn__agent_stop(&g[i]);
}

/* The listening socket on o's address; the i-th agent of a group takes the port after the (i-1)-th's
 * (each agent has its own, as on its own host), or any free one with port 0. */
static int agent_listen(agent_t *a, const mn_agent_opts_t *o, int i) {
  struct sockaddr_storage ss;
  int port = o->listen_port == 0 ? 0 : o->listen_port + i;
  if (uv_ip4_addr(o->listen_host, port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(o->listen_host, port, (struct sockaddr_in6 *)&ss) != 0) {
    fprintf(stderr, "monarch-worker: --listen wants a numeric address, got '%s'\n", o->listen_host);
    return 2;
  }
  uv_tcp_init(a->loop, &a->server);
  a->server.data = a;
  int rc = uv_tcp_bind(&a->server, (struct sockaddr *)&ss, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&a->server, 128, on_connection);
  if (rc != 0) {
    fprintf(stderr, "monarch-worker: cannot listen on %s:%d: %s\n", o->listen_host, port, uv_strerror(rc));
    return 2;
  }
  int len = sizeof(ss);
  uv_tcp_getsockname(&a->server, (struct sockaddr *)&ss, &len);
  a->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  return 0;
}

/* Says where a listens: a line on --port-fd, or the banner. */
static int agent_announce(const agent_t *a, const mn_agent_opts_t *o) {
  char line[64];
  if (o->port_fd >= 0) {
    int n = snprintf(line, sizeof(line), "%d\n", a->port);
    return write(o->port_fd, line, (size_t)n) == n ? 0 : 2;
  }
  printf("monarch-worker: host agent listening on %s:%d%s\n", o->listen_host, a->port,
         o->simulate ? " (simulated procs: a scale test)" : "");
  return 0;
}

/* Starts agent a on loop: its socket, timers and (with --simulate, --join) their parts; 0, or an exit status. */
static int agent_start(agent_t *a, const mn_agent_opts_t *o, uv_loop_t *loop, int i) {
  char err[256];
  memset(a, 0, sizeof(*a));
  a->o = o;
  a->loop = loop;
  if (mn_auth_load(&a->auth, NULL, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch-worker: %s\n", err);
    return 2;
  }
  snprintf(a->host, sizeof(a->host), "%s", o->listen_host);
  int rc = agent_listen(a, o, i);
  if (rc == 0) rc = agent_announce(a, o);
  if (rc != 0) return rc;
  const char *grace = getenv("MONARCH_AGENT_GRACE");
  a->grace_ms = grace ? (uint64_t)(atof(grace) * 1000) : MN_AGENT_GRACE_MS;
  a->started = uv_now(a->loop);
  const char *silence = getenv("MONARCH_AGENT_SILENCE");
  a->silence_ms = silence ? (uint64_t)(atof(silence) * 1000) : MN_AGENT_SILENCE_MS;
  uv_timer_init(a->loop, &a->tick);
  a->tick.data = a;
  uv_timer_start(&a->tick, on_tick, 1000, 1000);
  uv_unref((uv_handle_t *)&a->tick);
  if (o->simulate && mn__agent_sim_init(a) != 0) return 2;
  (void)mn_elf_self(&a->elf); /* unknown (zeros) if /proc is not mounted: controllers then skip the check */
  if (mn__agent_ship_init(a) != 0) return 2;
  if (o->join != NULL && mn__agent_join_start(a) != 0) return 2;
  return 0;
}

/* Stopped: kills what is left of a and closes its handles (their callbacks run in the caller's uv_run). */
static void agent_finish(agent_t *a) {
  mn__agent_join_close(a);
  for (aconn_t *c = a->conns; c; c = c->next) conn_close(c);
  while (a->sessions) session_end(a->sessions);
  uv_walk(a->loop, walk_kill_parked, NULL);
  uv_close((uv_handle_t *)&a->tick, NULL);
  mn__agent_relay_close(a);
  mn__agent_tree_stop(a);
  mn__agent_sim_close(a);
  mn__agent_ship_close(a);
  if (a->hang_period != 0) uv_close((uv_handle_t *)&a->hang_timer, NULL);
  uv_close((uv_handle_t *)&a->server, NULL);
}

int mn_agent_main(const mn_agent_opts_t *o) {
  int n = o->group > 0 ? o->group : 1, started = 0, rc = 0;
  agent_t *g = calloc((size_t)n, sizeof(*g));
  if (g == NULL) return 2;
  uv_loop_t *loop = uv_default_loop();
  signal(SIGPIPE, SIG_IGN);
  if (o->parent > 0 && (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != o->parent)) rc = 3;
  if (rc == 0 && !o->simulate) mn__agent_blas_init(o->exe, o->port_fd < 0); /* virtual procs run no BLAS */
  for (; rc == 0 && started < n; started++) rc = agent_start(&g[started], o, loop, started);
  if (o->port_fd >= 0) close(o->port_fd);
  fflush(stdout);
  if (rc != 0) { /* as before any loop ran: the process exits, and its sockets with it */
    free(g);
    return rc;
  }
  uv_signal_t sigterm, sigint;
  uv_signal_init(loop, &sigterm);
  uv_signal_init(loop, &sigint);
  sigterm.data = sigint.data = g;
  uv_signal_start(&sigterm, on_signal, SIGTERM);
  uv_signal_start(&sigint, on_signal, SIGINT);
  uv_unref((uv_handle_t *)&sigterm);
  uv_unref((uv_handle_t *)&sigint);
  uv_run(loop, UV_RUN_DEFAULT);
  for (int i = 0; i < started; i++) agent_finish(&g[i]);
  uv_close((uv_handle_t *)&sigterm, NULL);
  uv_close((uv_handle_t *)&sigint, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  for (int i = 0; i < started; i++) mn__agent_pids_free(&g[i]);
  rc = g[0].exit_code;
  free(g);
  return rc;
}
