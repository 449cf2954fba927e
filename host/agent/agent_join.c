/*
 * agent_join.c - `monarch-worker --join HOST:PORT`: a host agent started
 * after the job asks its controller to dial it.
 *
 * Once listening, the agent dials the controller's join port, answers its
 * HELLO with a JOIN naming the address to dial back (the --listen address;
 * for a wildcard one, the address this connection left from, which the
 * controller can route to) and the port we listen on, and closes after
 * JOINED. The controller then connects as to any agent. A controller that
 * is not up yet is dialled again with backoff for MONARCH_JOIN_TIMEOUT
 * seconds; a refusal that retrying cannot fix (a wrong token, another
 * protocol version, not a join port) stops the agent with exit status 2.
 * A controller that said JOINED but has not connected MONARCH_JOIN_WAIT
 * seconds later (it died, or cannot route to us) is joined again, so that
 * its successor at the same address takes us in.
 */
#include "agent_int.h"

#include "clock.h"
#include "join.h"
#include "sock.h"

struct ajoin_s {
  agent_t *a;
  char host[256];             /* the join port's host (a name or an address) */
  char port[8];
  uv_getaddrinfo_t resolve;
  int resolving;
  uv_tcp_t tcp;
  uv_connect_t connect;
  int tcp_open;               /* tcp is initialised and not closed yet */
  uv_timer_t timer;           /* the next attempt, or the current exchange's deadline */
  mn_buf_t in;
  uint8_t nj[MN_NONCE_LEN], na[MN_NONCE_LEN];
  int greeted;                /* HELLO answered with JOIN: the next frame is the verdict */
  int timer_open;             /* the struct is freed once the timer, tcp and the resolve are all done */
  int attempts;
  int done;                   /* joined, or given up */
  int64_t started_ms;         /* mn_now_ms of the first attempt */
  uint64_t timeout_ms;
  uint64_t wait_ms;           /* after JOINED: time for the controller to connect */
  int served_at_join;         /* a->served when JOINED came */
  char last[300];             /* why the last attempt failed */
};

static void attempt(ajoin_t *j);

/* After mn__agent_join_close: frees j once nothing of it is left in the loop. */
static void maybe_free(ajoin_t *j) {
  if (j->timer_open || j->tcp_open || j->resolving) return;
  j->a->join = NULL;
  mn_buf_free(&j->in);
  free(j);
}

static void tcp_closed(uv_handle_t *h) {
  ajoin_t *j = h->data;
  j->tcp_open = 0;
  if (!j->timer_open) maybe_free(j);
}

/* Ends the current connection, if any. */
static void hang_up(ajoin_t *j) {
  j->in.len = 0;
  j->greeted = 0;
  if (j->tcp_open && !uv_is_closing((uv_handle_t *)&j->tcp)) uv_close((uv_handle_t *)&j->tcp, tcp_closed);
}

/* Gives up for good: one line saying why, and the agent stops with exit status 2. */
static void give_up(ajoin_t *j, const char *why) {
  fprintf(stderr, "monarch-worker: cannot join the controller at %s:%s: %s\n", j->host, j->port, why);
  j->done = 1;
  hang_up(j);
  uv_timer_stop(&j->timer);
  j->a->exit_code = 2;
  mn__agent_stop(j->a);
}

static void on_retry(uv_timer_t *t) { attempt(t->data); }

/* This attempt failed (why): try again after the backoff, unless the time to join is spent. */
static void retry_later(ajoin_t *j, const char *why) {
  char msg[400];
  hang_up(j);
  snprintf(j->last, sizeof(j->last), "%s", why);
  int64_t spent = mn_now_ms() - j->started_ms;
  if (spent >= (int64_t)j->timeout_ms) {
    snprintf(msg, sizeof(msg), "%s (gave up after %d attempts in %.0f s; MONARCH_JOIN_TIMEOUT)", why, j->attempts,
             (double)spent / 1000.0);
    give_up(j, msg);
    return;
  }
  uint64_t wait = MN_JOIN_BACKOFF_MIN_MS;
  for (int i = 1; i < j->attempts && wait < MN_JOIN_BACKOFF_MAX_MS; i++) wait *= 2;
  if (wait > MN_JOIN_BACKOFF_MAX_MS) wait = MN_JOIN_BACKOFF_MAX_MS;
  uv_timer_start(&j->timer, on_retry, wait, 0);
}

static void on_deadline(uv_timer_t *t) { retry_later(t->data, "the join port did not answer in time"); }

/* The address the controller is to dial: our --listen host, or for a wildcard the address this connection left from. */
static void our_address(ajoin_t *j, char *out, size_t n) {
  const char *h = j->a->host;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  char ip[INET6_ADDRSTRLEN];
  int wildcard = strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0 || strcmp(h, "[::]") == 0;
  if (wildcard && uv_tcp_getsockname(&j->tcp, (struct sockaddr *)&ss, &len) == 0) {
    int v6 = ss.ss_family == AF_INET6;
    if (v6) uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
    else uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
    h = ip;
  }
  snprintf(out, n, strchr(h, ':') ? "[%s]:%d" : "%s:%d", h, j->a->port);
}

/* Sends a frame (copied by mn__agent_send_buf's way: one uv_write); 0 or libuv's code. */
static int send_frame(ajoin_t *j, const mn_buf_t *b) {
  uv_buf_t ub = uv_buf_init(b->data, (unsigned)b->len);
  int n = uv_try_write((uv_stream_t *)&j->tcp, &ub, 1);
  return n == (int)b->len ? 0 : (n < 0 ? n : UV_EAGAIN); /* a fresh socket takes a JOIN (< 400 bytes) whole */
}

/* HELLO from the join port: answer with JOIN. */
static void answer_hello(ajoin_t *j, const msgpack_object *m) {
  char addr[MN_MSG_JOIN_MAX_ADDR + 1], err[400];
  mn_buf_t out;
  our_address(j, addr, sizeof(addr));
  mn_buf_init(&out);
  int rc = mn_join_answer(&out, &j->a->auth, m, addr, j->nj, j->na, err, sizeof(err));
  if (rc == 0 && send_frame(j, &out) != 0) rc = MN_ECLOSED;
  mn_buf_free(&out);
  if (rc == MN_EPROTO || rc == MN_EVERSION || rc == MN_EAUTH) give_up(j, err);
  else if (rc == MN_ECLOSED) retry_later(j, "could not send JOIN");
  else if (rc != 0) retry_later(j, err); /* an ERROR in place of HELLO, such as too many joins at once */
  else j->greeted = 1;
}

/* JOINED came wait_ms ago: if no controller has connected since, join again (from a fresh time budget). */
static void on_waited(uv_timer_t *t) {
  ajoin_t *j = t->data;
  if (j->done || j->a->served != j->served_at_join) {
    j->done = 1; /* taken in: nothing more to do */
    return;
  }
  fprintf(stderr, "monarch-worker: the controller at %s:%s did not connect within %.0f s of taking the join; joining again\n",
          j->host, j->port, (double)j->wait_ms / 1000.0);
  j->attempts = 0;
  j->started_ms = mn_now_ms();
  attempt(j);
}

/* The controller's verdict on our JOIN. */
static void take_verdict(ajoin_t *j, const msgpack_object *m) {
  char err[400], addr[MN_MSG_JOIN_MAX_ADDR + 1];
  int rc = mn_join_check_joined(&j->a->auth, m, j->nj, j->na, err, sizeof(err));
  if (rc == MN_EAUTH || rc == MN_EVERSION || rc == MN_EPROTO) {
    give_up(j, err);
    return;
  }
  if (rc != 0) {
    retry_later(j, err); /* busy, or timed out: worth another try */
    return;
  }
  our_address(j, addr, sizeof(addr));
  printf("monarch-worker: joined the controller at %s:%s; it connects to %s\n", j->host, j->port, addr);
  fflush(stdout);
  hang_up(j);
  j->served_at_join = j->a->served;
  uv_timer_start(&j->timer, on_waited, j->wait_ms, 0);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  ajoin_t *j = h->data;
  (void)hint;
  if (mn_buf_reserve(&j->in, 4096) != 0) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init(j->in.data + j->in.len, (unsigned)(j->in.cap - j->in.len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  ajoin_t *j = s->data;
  const char *body;
  char err[300];
  (void)buf;
  if (j->done || uv_is_closing((uv_handle_t *)s)) return;
  if (n < 0) {
    retry_later(j, j->greeted ? "the controller closed the join connection without an answer"
                              : "the join port closed the connection before its HELLO");
    return;
  }
  j->in.len += (size_t)n;
  int64_t len = mn_frame_peek(j->in.data, j->in.len, 4096, &body);
  if (len == MN_EAGAIN) return;
  if (len < 0) {
    give_up(j, "the peer sent a frame over 4096 bytes (not a monarch join port?)");
    return;
  }
  msgpack_zone zone;
  msgpack_object m;
  if (!msgpack_zone_init(&zone, 2048)) {
    retry_later(j, "out of memory");
    return;
  }
  int rc = mn_decode(body, (size_t)len, &zone, &m, err, sizeof(err));
  size_t used = MN_FRAME_HEADER + (size_t)len;
  if (rc != 0) give_up(j, err);
  else if (!j->greeted) answer_hello(j, &m);
  else take_verdict(j, &m);
  msgpack_zone_destroy(&zone);
  if (!j->done && j->tcp_open && !uv_is_closing((uv_handle_t *)s)) mn_buf_consume(&j->in, used);
}

static void on_connect(uv_connect_t *req, int status) {
  ajoin_t *j = req->data;
  char why[300];
  if (j->done) return;
  if (status != 0) {
    snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(status));
    retry_later(j, why);
    return;
  }
  uv_timer_start(&j->timer, on_deadline, MN_HANDSHAKE_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&j->tcp, on_alloc, on_read);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  ajoin_t *j = req->data;
  char why[300];
  j->resolving = 0;
  if (j->done) { /* cancelled, or joined meanwhile */
    if (res) uv_freeaddrinfo(res);
    if (!j->timer_open) maybe_free(j);
    return;
  }
  if (status != 0) {
    snprintf(why, sizeof(why), "cannot resolve %s: %s", j->host, uv_strerror(status));
    if (res) uv_freeaddrinfo(res);
    retry_later(j, why);
    return;
  }
  uv_tcp_init(j->a->loop, &j->tcp);
  j->tcp.data = j;
  j->tcp_open = 1;
  j->connect.data = j;
  int rc = uv_tcp_connect(&j->connect, &j->tcp, res->ai_addr, on_connect);
  uv_freeaddrinfo(res);
  if (rc != 0) {
    snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(rc));
    retry_later(j, why);
  }
}

/* One attempt: resolve the join port's host afresh (a service's address may change), then dial it. */
static void attempt(ajoin_t *j) {
  if (j->done) return;
  if (j->tcp_open) { /* the last attempt's socket is still closing */
    uv_timer_start(&j->timer, on_retry, 10, 0);
    return;
  }
  j->attempts++;
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  j->resolve.data = j;
  int rc = uv_getaddrinfo(j->a->loop, &j->resolve, on_resolved, j->host, j->port, &hints);
  if (rc != 0) {
    char why[300];
    snprintf(why, sizeof(why), "cannot resolve %s: %s", j->host, uv_strerror(rc));
    retry_later(j, why);
    return;
  }
  j->resolving = 1;
}

int mn__agent_join_start(agent_t *a) {
  char host[256];
  int port;
  if (mn_parse_addr(a->o->join, host, sizeof(host), &port) != 0 || port == 0 || host[0] == '\0') {
    fprintf(stderr, "monarch-worker: --join wants the controller's join address HOST:PORT, got '%s'\n", a->o->join);
    return 2;
  }
  ajoin_t *j = calloc(1, sizeof(*j));
  if (j == NULL) return 2;
  j->a = a;
  snprintf(j->host, sizeof(j->host), "%s", host);
  snprintf(j->port, sizeof(j->port), "%d", port);
  const char *t = getenv("MONARCH_JOIN_TIMEOUT"), *w = getenv("MONARCH_JOIN_WAIT");
  j->timeout_ms = (uint64_t)((t && atof(t) > 0 ? atof(t) : MN_JOIN_TIMEOUT_S) * 1000);
  j->wait_ms = (uint64_t)((w && atof(w) > 0 ? atof(w) : MN_JOIN_WAIT_S) * 1000);
  j->started_ms = mn_now_ms();
  uv_timer_init(a->loop, &j->timer);
  j->timer.data = j;
  j->timer_open = 1;
  a->join = j;
  attempt(j);
  return 0;
}

static void timer_closed(uv_handle_t *h) {
  ajoin_t *j = h->data;
  j->timer_open = 0;
  maybe_free(j);
}

void mn__agent_join_close(agent_t *a) {
  ajoin_t *j = a->join;
  if (j == NULL || !j->timer_open || uv_is_closing((uv_handle_t *)&j->timer)) return;
  j->done = 1;
  if (j->resolving) uv_cancel((uv_req_t *)&j->resolve); /* its callback still runs, and sees done */
  hang_up(j);
  uv_close((uv_handle_t *)&j->timer, timer_closed);
}
