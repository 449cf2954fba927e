/*
 * ctl_join.c - the controller's join port; see ctl_join.h. Each connection
 * lives for one exchange (HELLO, JOIN, then JOINED or an ERROR), bounded in
 * time, size and number; whatever a peer sends ends in one event for the
 * script, never in a crash or a connection the controller dials.
 */
#include "ctl_join.h"

#include "handshake.h"
#include "join.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mn_jconn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;     /* the exchange's deadline */
  mn_join_t *j;
  mn_buf_t in;
  uint8_t nj[MN_NONCE_LEN];
  char peer[64];
  int closing;
  int handles;          /* open handles: the struct is freed when the last one has closed */
  mn_jconn_t *next;
};

/* ---- events for the script ---------------------------------------------------- */

/* Queues an event; 0, or MN_ELIMIT when the queue is full (a refusal is then only counted). */
static int push_event(mn_join_t *j, int ok, int quiet, const char *peer, const char *addr, const char *why) {
  if (j->nevents >= MN_JOIN_MAX_EVENTS) {
    if (!ok) j->dropped++;
    return MN_ELIMIT;
  }
  if (j->nevents == j->evcap) {
    size_t cap = j->evcap ? j->evcap * 2 : 16;
    mn_join_ev_t *e = realloc(j->events, cap * sizeof(*e));
    if (e == NULL) return MN_ENOMEM;
    j->events = e;
    j->evcap = cap;
  }
  mn_join_ev_t *e = &j->events[j->nevents++];
  e->ok = ok;
  e->quiet = quiet;
  snprintf(e->peer, sizeof(e->peer), "%s", peer);
  snprintf(e->addr, sizeof(e->addr), "%s", addr ? addr : "");
  snprintf(e->why, sizeof(e->why), "%s", why ? why : "");
  if (ok) j->joined++;
  else j->refused++;
  return 0;
}

const mn_join_ev_t *mn_join_events(mn_join_t *j, size_t *n, uint64_t *dropped) {
  *n = j->nevents;
  *dropped = j->dropped;
  return j->events;
}

void mn_join_done(mn_join_t *j) {
  j->nevents = 0;
  j->dropped = 0;
}

/* ---- one join connection ---------------------------------------------------------- */

static void jconn_closed(uv_handle_t *h) {
  mn_jconn_t *k = h->data;
  if (--k->handles > 0) return;
  mn_buf_free(&k->in);
  free(k);
}

static void jconn_close(mn_jconn_t *k) {
  if (k->closing) return;
  k->closing = 1;
  mn_join_t *j = k->j;
  mn_jconn_t **pp = &j->conns;
  while (*pp && *pp != k) pp = &(*pp)->next;
  if (*pp) *pp = k->next;
  j->pending--;
  uv_close((uv_handle_t *)&k->timer, jconn_closed);
  uv_close((uv_handle_t *)&k->tcp, jconn_closed);
}

/* Writes a small frame now (a fresh socket's buffer takes it whole); 0, or a negative code. */
static int send_now(mn_jconn_t *k, const mn_buf_t *b) {
  uv_buf_t ub = uv_buf_init(b->data, (unsigned)b->len);
  int n = uv_try_write((uv_stream_t *)&k->tcp, &ub, 1);
  return n == (int)b->len ? 0 : (n < 0 ? n : MN_EAGAIN);
}

/* Tells the peer why (one ERROR), records it for the script and closes. */
static void refuse(mn_jconn_t *k, int code, const char *why) {
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_error(&b, code, why) == 0) (void)send_now(k, &b); /* best effort: it is closed either way */
  mn_buf_free(&b);
  push_event(k->j, 0, code == MN_ECLOSED && k->in.len == 0, k->peer, NULL, why);
  jconn_close(k);
}

static void on_deadline(uv_timer_t *t) {
  refuse(t->data, MN_ETIMEDOUT, "join not completed in time (5 s)");
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  mn_jconn_t *k = h->data;
  (void)hint;
  /* One frame's room: on_read refuses a length prefix above MN_JOIN_MAX_FRAME, so `in` stays that small. */
  if (mn_buf_reserve(&k->in, MN_FRAME_HEADER + MN_JOIN_MAX_FRAME) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(k->in.data + k->in.len, (unsigned)(k->in.cap - k->in.len));
}

/* The first whole frame arrived: a JOIN, we hope. */
static void take_join(mn_jconn_t *k, const char *body, size_t len) {
  char err[300], addr[MN_MSG_JOIN_MAX_ADDR + 1], f[128];
  mn_buf_t out = {f, 0, sizeof(f)};
  msgpack_zone zone;
  msgpack_object m;
  if (!msgpack_zone_init(&zone, 2048)) {
    refuse(k, MN_ENOMEM, "out of memory");
    return;
  }
  int rc = mn_decode(body, len, &zone, &m, err, sizeof(err));
  if (rc == 0) rc = mn_join_accept(&out, &k->j->ctl->auth, &m, k->nj, addr, sizeof(addr), err, sizeof(err));
  msgpack_zone_destroy(&zone);
  if (rc != 0) {
    refuse(k, rc, err);
  } else if (k->j->nevents >= MN_JOIN_MAX_EVENTS) {
    refuse(k, MN_ELIMIT, "too many joins waiting for the script; try again later");
  } else if ((rc = send_now(k, &out)) != 0) {
    push_event(k->j, 0, 0, k->peer, NULL, "could not send JOINED");
    jconn_close(k);
  } else {
    push_event(k->j, 1, 0, k->peer, addr, NULL);
    jconn_close(k);
  }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  mn_jconn_t *k = s->data;
  const char *body;
  (void)buf;
  if (k->closing) return;
  if (n < 0) {
    refuse(k, MN_ECLOSED, k->in.len == 0 ? "closed the connection without a word" : "closed the connection mid-frame");
    return;
  }
  k->in.len += (size_t)n;
  int64_t len = mn_frame_peek(k->in.data, k->in.len, MN_JOIN_MAX_FRAME, &body);
  if (len == MN_EAGAIN) return;
  if (len < 0) refuse(k, MN_EFRAME, "join frame too large or empty (a join frame is at most 4096 bytes)");
  else take_join(k, body, (size_t)len);
}

/* "1.2.3.4:5678" or "[::1]:5678" for the peer of tcp. */
static void peer_name(uv_tcp_t *tcp, char *out, size_t n) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  char ip[INET6_ADDRSTRLEN] = "?";
  snprintf(out, n, "unknown peer");
  if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0) return;
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
    snprintf(out, n, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
  } else {
    uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
    snprintf(out, n, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
  }
}

/* A new connection: greet it with a fresh nonce and start its deadline, or refuse it when too many wait. */
static void on_connection(uv_stream_t *server, int status) {
  mn_join_t *j = server->data;
  char f[128];
  mn_buf_t hello = {f, 0, sizeof(f)};
  if (status != 0) return;
  mn_jconn_t *k = calloc(1, sizeof(*k));
  if (k == NULL) return; /* the connection stays in the backlog; the next accept takes it */
  k->j = j;
  uv_tcp_init(&j->ctl->loop, &k->tcp);
  uv_timer_init(&j->ctl->loop, &k->timer);
  k->tcp.data = k->timer.data = k;
  k->handles = 2;
  k->next = j->conns;
  j->conns = k;
  j->pending++;
  if (uv_accept(server, (uv_stream_t *)&k->tcp) != 0) {
    snprintf(k->peer, sizeof(k->peer), "unknown peer");
    refuse(k, MN_ECLOSED, "could not accept the connection");
    return;
  }
  peer_name(&k->tcp, k->peer, sizeof(k->peer));
  if (j->pending > MN_JOIN_MAX_PENDING) {
    refuse(k, MN_ELIMIT, "too many join connections at once (MN_JOIN_MAX_PENDING is 16); try again later");
    return;
  }
  uv_tcp_nodelay(&k->tcp, 1);
  if (mn_join_hello(&hello, k->nj) != 0 || send_now(k, &hello) != 0) {
    refuse(k, MN_ECLOSED, "could not send HELLO");
    return;
  }
  uv_update_time(&j->ctl->loop); /* the loop's clock stands still while the script runs */
  uv_timer_start(&k->timer, on_deadline, MN_HANDSHAKE_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read);
}

/* ---- the listener -------------------------------------------------------------------- */

static void server_closed(uv_handle_t *h) {
  mn_join_t *j = h->data;
  j->server_open = 0; /* a later listen may init it again */
}

/* Binds and listens; on failure the server handle is closed again. Returns the bound port or a negative code. */
static int bind_listen(mn_join_t *j, const struct sockaddr *sa, int v6, char *err, size_t errlen, const char *host,
                       int port) {
  int rc = uv_tcp_bind(&j->server, sa, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&j->server, 64, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "cannot listen for joins on %s:%d: %s", host, port, uv_strerror(rc));
    uv_close((uv_handle_t *)&j->server, server_closed);
    return rc; /* libuv's codes are -errno */
  }
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  uv_tcp_getsockname(&j->server, (struct sockaddr *)&ss, &len);
  int bound = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
  snprintf(j->addr, sizeof(j->addr), v6 ? "[%s]:%d" : "%s:%d", host, bound);
  j->listening = 1;
  return bound;
}

int mn_join_listen(mn_join_t *j, mn_ctl_t *c, const char *host, int port, char *err, size_t errlen) {
  struct sockaddr_storage ss;
  if (j->listening) {
    snprintf(err, errlen, "already listening for joins on %s", j->addr);
    return MN_EINVAL;
  }
  if (j->server_open) {
    snprintf(err, errlen, "the previous join listener is still closing");
    return MN_EINVAL;
  }
  int v6 = 0;
  if (port < 0 || port > 65535 || uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0) {
    v6 = 1;
    if (port < 0 || port > 65535 || uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
      snprintf(err, errlen, "cannot listen for joins on '%s:%d': want a numeric address and a port 0..65535", host,
               port);
      return MN_EINVAL;
    }
  }
  j->ctl = c;
  uv_tcp_init(&c->loop, &j->server);
  j->server.data = j;
  j->server_open = 1;
  return bind_listen(j, (struct sockaddr *)&ss, v6, err, errlen, host, port);
}

void mn_join_close(mn_join_t *j) {
  if (j->listening) {
    j->listening = 0;
    uv_close((uv_handle_t *)&j->server, server_closed);
  }
  while (j->conns) jconn_close(j->conns);
  free(j->events);
  j->events = NULL;
  j->nevents = j->evcap = 0;
}
