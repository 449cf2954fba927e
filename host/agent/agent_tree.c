/*
 * agent_tree.c - the cast tree: past a fan-out, the controller casts to a
 * few agents and each hands the rest on to its children (TREE names them),
 * over relay links it opens itself: a TCP connection with the usual
 * handshake, then SESSION [22, id, 0, true], which binds the link to the
 * child's session with the controller without taking it over. The child
 * answers up the link it was cast on, and this agent folds those answers
 * into its own RESULTS, so the controller reads one frame per subtree.
 *
 * A link that breaks, stalls in its handshake or goes silent is reported
 * with LINKED(epoch, index, false); the controller then resends what was in
 * flight below it on the procs' own links (their replay caches keep that
 * exactly-once) and casts to that child directly.
 */
#include "agent_int.h"

/* When TREE does not say (an older controller): PING every second, lost after 3 s of silence. */
#define LINK_PING_MS 1000
#define LINK_SILENCE_MS 3000

#define LINK_REDIAL_MS 1000 /* a link that broke, or never came up, is dialled again this long after */

enum { L_CONNECTING, L_HELLO, L_WELCOME, L_UP, L_CLOSED };

/* A child as TREE named it: dialled again after its link goes, until the next TREE. */
struct tree_child_s {
  char addr[300];
  uint64_t session;
  uint64_t redial_at; /* uv_now after which its link is dialled again (while links[i] is NULL) */
};

struct alink_s {
  uv_tcp_t tcp;
  uv_connect_t req;
  asession_t *s;        /* ours: the session whose casts it carries; NULL once that session is gone */
  uint32_t index;
  uint64_t session;     /* the child's session with the controller */
  int state;
  uint8_t ns[MN_NONCE_LEN], nc[MN_NONCE_LEN];
  mn_buf_t in;
  msgpack_zone zone;
  int64_t outstanding;  /* triples handed to it and not answered */
  uint64_t started, last_rx;
};

static void tell_controller(asession_t *s, uint32_t index, int up) {
  mn_buf_t b;
  mn_buf_init(&b);
  if (mn_msg_pack_linked(&b, s->tree_epoch, index, up) == 0) mn__agent_session_send(s, &b);
  mn_buf_free(&b);
}

static void link_freed(uv_handle_t *h) {
  alink_t *l = h->data;
  mn_buf_free(&l->in);
  msgpack_zone_destroy(&l->zone);
  free(l);
}

/* Whether every link of s has at most MN_SHIP_RELAY_LOW bytes queued: a held parent is read again. */
static int links_drained(const asession_t *s) {
  for (uint32_t i = 0; i < s->nlinks; i++) {
    const alink_t *l = s->links[i];
    if (l != NULL && uv_stream_get_write_queue_size((const uv_stream_t *)&l->tcp) > MN_SHIP_RELAY_LOW) return 0;
  }
  return 1;
}

void mn__agent_tree_release(asession_t *s) {
  aconn_t *c = s->held;
  s->held = NULL;
  if (c != NULL) mn__agent_conn_hold(c, 0);
}

/* Closes l; its unanswered triples are no longer waited for (the controller resends them directly). */
static void link_close(alink_t *l) {
  if (l->state == L_CLOSED) return;
  int was_up = l->state == L_UP;
  l->state = L_CLOSED;
  asession_t *s = l->s;
  if (s != NULL) {
    s->links[l->index] = NULL;
    s->children[l->index].redial_at = uv_now(s->a->loop) + LINK_REDIAL_MS;
    s->relayed -= l->outstanding < s->relayed ? l->outstanding : s->relayed;
    if (was_up) tell_controller(s, l->index, 0);
    if (s->relayed == 0) mn__agent_relay_flush(s);
    if (s->held != NULL && links_drained(s)) mn__agent_tree_release(s); /* a stuck child does not hold us */
  }
  uv_close((uv_handle_t *)&l->tcp, link_freed);
}

static void link_wrote(uv_write_t *w, int status) {
  alink_t *l = w->handle->data;
  mn__agent_on_write(w, status);
  if (l->state != L_CLOSED && l->s != NULL && l->s->held != NULL && links_drained(l->s)) mn__agent_tree_release(l->s);
}

static void link_send(alink_t *l, mn_buf_t *b) {
  uv_write_t *w = malloc(sizeof(*w));
  if (w == NULL) {
    link_close(l);
    return;
  }
  w->data = b->data;
  uv_buf_t ub = uv_buf_init(b->data, (unsigned)b->len);
  mn_buf_init(b); /* the write owns the bytes now */
  if (uv_write(w, (uv_stream_t *)&l->tcp, &ub, 1, link_wrote) != 0) {
    mn__agent_on_write(w, -1);
    link_close(l);
  }
}

/* The handshake, client side: HELLO -> AUTH, WELCOME -> SESSION (relay). 0, or -1 when l was closed. */
static int link_handshake(alink_t *l, const msgpack_object *m) {
  agent_t *a = l->s->a;
  char err[256];
  mn_buf_t b;
  mn_buf_init(&b);
  int rc;
  if (l->state == L_HELLO) {
    rc = mn_hs_answer(&b, &a->auth, m, l->ns, l->nc, err, sizeof(err));
    if (rc == 0) l->state = L_WELCOME;
  } else {
    rc = mn_hs_check_welcome(&a->auth, m, l->ns, l->nc, err, sizeof(err));
    if (rc == 0) rc = mn_msg_pack_relay_session(&b, l->session, l->s->link_silence_ms);
    if (rc == 0) l->state = L_UP;
  }
  if (rc != 0) {
    mn_buf_free(&b);
    link_close(l);
    return -1;
  }
  link_send(l, &b);
  if (l->state == L_UP) tell_controller(l->s, l->index, 1);
  return 0;
}

/* A child's RESULTS: checked whole, then its entries join our batch as they are. */
static int link_results(alink_t *l, const char *body, size_t len, const msgpack_object *m) {
  uint32_t n;
  char err[256];
  if (mn_msg_parse_results(m, &n, err, sizeof(err)) != 0 || len < MN_MSG_RESULTS_HEAD - MN_FRAME_HEADER) return -1;
  l->outstanding -= n;
  mn__agent_relay_take_batch(l->s, body + (MN_MSG_RESULTS_HEAD - MN_FRAME_HEADER),
                             len - (MN_MSG_RESULTS_HEAD - MN_FRAME_HEADER), n);
  return 0;
}

/* A child's RESULTS in the array32 form agents write, walked entry by entry rather than decoded whole
 * (a top agent's children bring thousands): its entries join our batch as they are. 0, or -1 when it is
 * malformed (the link is no good). */
static int link_results_read(alink_t *l, mn_msg_results_reader_t *rr, const char *body, size_t len) {
  uint32_t n = rr->left;
  uint64_t tag;
  mn_msg_result_t r;
  char err[256];
  int rc;
  while ((rc = mn_msg_results_next(rr, &l->zone, &tag, &r, err, sizeof(err))) == 1 || rc == MN_EINVAL)
    msgpack_zone_clear(&l->zone); /* an entry that is no RESULT spoils only itself, at the controller */
  if (rc != 0) return -1;
  l->outstanding -= n;
  mn__agent_relay_take_batch(l->s, body + (MN_MSG_RESULTS_HEAD - MN_FRAME_HEADER),
                             len - (MN_MSG_RESULTS_HEAD - MN_FRAME_HEADER), n);
  return 0;
}

static int link_frame(alink_t *l, const char *body, size_t len) {
  msgpack_object m;
  char err[256];
  mn_msg_results_reader_t rr;
  msgpack_zone_clear(&l->zone);
  if (l->state == L_UP && mn_msg_results_open(&rr, body, len) == 0) return link_results_read(l, &rr, body, len);
  if (mn_decode(body, len, &l->zone, &m, err, sizeof(err)) != 0) return -1;
  if (l->state != L_UP) return link_handshake(l, &m);
  if (mn_msg_type(&m) == MN_MSG_RESULTS) return link_results(l, body, len, &m);
  return mn_msg_type(&m) == MN_MSG_PONG ? 0 : -1; /* an ERROR, or anything else: the link is no good */
}

static void link_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  alink_t *l = h->data;
  (void)hint;
  if (mn_buf_reserve(&l->in, 64 * 1024) != 0) *buf = uv_buf_init(NULL, 0);
  else *buf = uv_buf_init(l->in.data + l->in.len, (unsigned)(l->in.cap - l->in.len));
}

static void link_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  alink_t *l = st->data;
  (void)buf;
  if (n < 0 || l->s == NULL) {
    link_close(l);
    return;
  }
  l->in.len += (size_t)n;
  l->last_rx = uv_now(l->s->a->loop);
  size_t off = 0;
  while (l->state != L_CLOSED) {
    const char *body;
    int64_t len = mn_frame_peek(l->in.data + off, l->in.len - off, l->state == L_UP ? MN_MAX_FRAME : 4096, &body);
    if (len == MN_EAGAIN) break;
    off += MN_FRAME_HEADER + (size_t)(len < 0 ? 0 : len);
    if (len < 0 || link_frame(l, body, (size_t)len) != 0) {
      link_close(l);
      return;
    }
  }
  if (l->state != L_CLOSED) mn_buf_consume(&l->in, off);
}

static void on_link_connect(uv_connect_t *req, int status) {
  alink_t *l = req->data;
  if (l->state == L_CLOSED) return;
  if (status != 0 || l->s == NULL) {
    link_close(l);
    return;
  }
  uv_tcp_nodelay(&l->tcp, 1);
  l->state = L_HELLO;
  if (uv_read_start((uv_stream_t *)&l->tcp, link_alloc, link_read) != 0) link_close(l);
}

/* Parses "host:port" (numeric, v4 or v6) into ss; 0 or -1. */
static int parse_addr(const char *p, size_t n, struct sockaddr_storage *ss) {
  char host[300];
  if (n >= sizeof(host)) return -1;
  memcpy(host, p, n);
  host[n] = '\0';
  char *colon = strrchr(host, ':');
  if (colon == NULL) return -1;
  *colon = '\0';
  int port = atoi(colon + 1);
  char *h = host;
  if (h[0] == '[' && colon > h && colon[-1] == ']') {
    h++;
    colon[-1] = '\0';
  }
  if (port <= 0 || port > 65535) return -1;
  if (uv_ip4_addr(h, port, (struct sockaddr_in *)ss) == 0) return 0;
  return uv_ip6_addr(h, port, (struct sockaddr_in6 *)ss) == 0 ? 0 : -1;
}

static alink_t *link_open(asession_t *s, uint32_t index) {
  struct sockaddr_storage ss;
  const struct tree_child_s *ch = &s->children[index];
  if (parse_addr(ch->addr, strlen(ch->addr), &ss) != 0) return NULL;
  alink_t *l = calloc(1, sizeof(*l));
  if (l == NULL) return NULL;
  if (!msgpack_zone_init(&l->zone, 4096)) {
    free(l);
    return NULL;
  }
  l->s = s;
  l->index = index;
  l->session = ch->session;
  l->started = l->last_rx = uv_now(s->a->loop);
  uv_tcp_init(s->a->loop, &l->tcp);
  l->tcp.data = l;
  l->req.data = l;
  if (uv_tcp_connect(&l->req, &l->tcp, (struct sockaddr *)&ss, on_link_connect) != 0) {
    l->state = L_CLOSED;
    uv_close((uv_handle_t *)&l->tcp, link_freed);
    return NULL;
  }
  return l;
}

static void links_drop(asession_t *s) {
  for (uint32_t i = 0; i < s->nlinks; i++) {
    alink_t *l = s->links[i];
    if (l == NULL) continue;
    s->relayed -= l->outstanding < s->relayed ? l->outstanding : s->relayed;
    l->s = NULL; /* no LINKED for links the controller itself replaced */
    link_close(l);
  }
  free(s->links);
  free(s->children);
  s->links = NULL;
  s->children = NULL;
  s->nlinks = 0;
}

static void links_tick(uv_timer_t *t);

/* The links' timer runs at the quickest pace any session's TREE asked for. */
static void links_timer_at(agent_t *a, uint64_t period) {
  if (a->link_period == 0) {
    uv_timer_init(a->loop, &a->link_timer);
    a->link_timer.data = a;
  } else if (uv_is_active((uv_handle_t *)&a->link_timer) && period >= a->link_period) {
    return;
  }
  a->link_period = period;
  uv_timer_start(&a->link_timer, links_tick, period, period);
  uv_unref((uv_handle_t *)&a->link_timer);
}

void mn__agent_tree_set(aconn_t *c, const msgpack_object *m) {
  char err[300];
  uint64_t epoch, ping_ms, silence_ms;
  const msgpack_object *ch;
  asession_t *s = c->session;
  if (mn_msg_parse_tree(m, &epoch, &ch, &ping_ms, &silence_ms, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return;
  }
  links_drop(s);
  s->tree_epoch = epoch;
  s->link_silence_ms = silence_ms > 0 ? silence_ms : LINK_SILENCE_MS;
  uint32_t n = ch->via.array.size / 2;
  if (n == 0) return;
  s->links = calloc(n, sizeof(*s->links));
  s->children = calloc(n, sizeof(*s->children));
  if (s->links == NULL || s->children == NULL) {
    links_drop(s); /* no links: the controller hears no LINKED and casts to them directly */
    return;
  }
  s->nlinks = n;
  for (uint32_t i = 0; i < n; i++) {
    const msgpack_object *addr = &ch->via.array.ptr[2 * i];
    memcpy(s->children[i].addr, addr->via.str.ptr, addr->via.str.size); /* < 300: parse_tree checked */
    s->children[i].session = ch->via.array.ptr[2 * i + 1].via.u64;
    s->links[i] = link_open(s, i);
  }
  links_timer_at(s->a, ping_ms > 0 ? ping_ms : LINK_PING_MS);
}

int64_t mn__agent_tree_forward(asession_t *s, const msgpack_object *subs, const char *rest, size_t rlen) {
  int64_t handed = 0;
  for (uint32_t i = 0; subs != NULL && i + 3 < subs->via.array.size; i += 4) {
    const msgpack_object *q = &subs->via.array.ptr[i];
    alink_t *l = q[0].via.u64 < s->nlinks ? s->links[q[0].via.u64] : NULL;
    if (l == NULL || l->state != L_UP) continue; /* the controller hears LINKED false and resends them */
    mn_buf_t b;
    mn_buf_init(&b);
    if (mn_msg_pack_cast_obj(&b, &q[2], rest, rlen, &q[3]) != 0) {
      mn_buf_free(&b);
      continue;
    }
    int64_t count = (int64_t)q[1].via.u64;
    l->outstanding += count;
    handed += count;
    link_send(l, &b);
  }
  return handed;
}

void mn__agent_tree_forward_spawn(asession_t *s, const msgpack_object *subs) {
  for (uint32_t i = 0; i + 3 < subs->via.array.size; i += 4) {
    const msgpack_object *q = &subs->via.array.ptr[i];
    alink_t *l = q[0].via.u64 < s->nlinks ? s->links[q[0].via.u64] : NULL;
    if (l == NULL || l->state != L_UP) continue; /* the controller hears LINKED false and sends it directly */
    mn_buf_t b;
    mn_buf_init(&b);
    if (mn_msg_pack_spawn_obj(&b, q[1].via.u64, &q[2], &q[3]) == 0) link_send(l, &b);
    else mn_buf_free(&b);
  }
}

void mn__agent_tree_forward_acks(asession_t *s, const msgpack_object *subs) {
  for (uint32_t i = 0; i + 2 < subs->via.array.size; i += 3) {
    const msgpack_object *q = &subs->via.array.ptr[i];
    alink_t *l = q[0].via.u64 < s->nlinks ? s->links[q[0].via.u64] : NULL;
    if (l == NULL || l->state != L_UP) continue; /* those procs keep their replay caches until a later ACK */
    mn_buf_t b;
    mn_buf_init(&b);
    if (mn_msg_pack_acks_obj(&b, &q[1], &q[2]) == 0) link_send(l, &b);
    else mn_buf_free(&b);
  }
}

void mn__agent_tree_forward_ship(asession_t *s, aconn_t *from, const mn_msg_ship_data_t *d) {
  int full = 0;
  for (uint32_t i = 0; i + 2 < d->subs->via.array.size; i += 3) {
    const msgpack_object *q = &d->subs->via.array.ptr[i];
    alink_t *l = q[0].via.u64 < s->nlinks ? s->links[q[0].via.u64] : NULL;
    if (l == NULL || l->state != L_UP) continue; /* the controller hears no answer from it and sends directly */
    mn_buf_t b;
    msgpack_packer pk;
    size_t start;
    mn_buf_init(&b);
    int f = mn_msg_ship_data_head(&b, &pk, &start, d->hash, d->size, d->offset, d->chunk, d->len, q[1].via.boolean,
                                  q[2].via.array.size / 3);
    for (uint32_t j = 0; f == 0 && j < q[2].via.array.size; j++) f |= msgpack_pack_object(&pk, q[2].via.array.ptr[j]);
    if (f == 0) {
      mn_frame_end(&b, start);
      link_send(l, &b);
    } else {
      mn_buf_free(&b);
    }
    l = s->links[q[0].via.u64]; /* NULL if the write failed and closed it */
    full |= l != NULL && uv_stream_get_write_queue_size((uv_stream_t *)&l->tcp) > MN_SHIP_RELAY_HIGH;
  }
  if (full && s->held == NULL && from != NULL && !from->closing) {
    s->held = from;
    mn__agent_conn_hold(from, 1);
  }
}

int mn__agent_tree_heard(agent_t *a, const asession_t *s, uint64_t ms) {
  uint64_t now = uv_now(a->loop);
  for (aconn_t *c = a->conns; c; c = c->next)
    if (c->relay_of == s && !c->closing && now - c->last_rx <= ms) return 1;
  return 0;
}

/* Every link_period: pings up links, drops silent or stalled ones; stops when no session has links. */
static void links_tick(uv_timer_t *t) {
  agent_t *a = t->data;
  uint64_t now = uv_now(a->loop);
  int any = 0;
  for (asession_t *s = a->sessions; s; s = s->next)
    for (uint32_t i = 0; i < s->nlinks; i++) {
      alink_t *l = s->links[i];
      any = 1;
      /* Gone (broken, or its dial failed): dialled again, so that a healed cut brings the link back. */
      if (l == NULL && now >= s->children[i].redial_at) s->links[i] = l = link_open(s, i);
      if (l == NULL) {
        s->children[i].redial_at = s->children[i].redial_at > now ? s->children[i].redial_at : now + LINK_REDIAL_MS;
        continue;
      }
      if (l->state != L_UP ? now - l->started > MN_HANDSHAKE_TIMEOUT_MS : now - l->last_rx > s->link_silence_ms) {
        link_close(l);
        continue;
      }
      /* A link heard within half a period (a child's RESULTS) needs no PING: a stream of casts keeps it checked. */
      if (l->state != L_UP || now - l->last_rx < a->link_period / 2) continue;
      mn_buf_t b;
      mn_buf_init(&b);
      if (mn_msg_pack_ping(&b, 1) == 0) link_send(l, &b); /* the write takes the buffer */
      else mn_buf_free(&b);
    }
  if (!any) uv_timer_stop(t);
}

void mn__agent_tree_stop(agent_t *a) {
  if (a->link_period != 0) uv_close((uv_handle_t *)&a->link_timer, NULL);
}

void mn__agent_tree_close(asession_t *s) { links_drop(s); }
