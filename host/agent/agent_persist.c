/* agent_persist.c - persistent meshes (PERSIST, ATTACH, DETACH), STATUS and LIST. */
#include "agent_int.h"

/* ---- persistent meshes ------------------------------------------------------ */

/* Starts [REPLY, req, ok, ...] in a new b; the caller packs the value and ends the frame at the returned offset. */
static size_t reply_begin(mn_buf_t *b, msgpack_packer *pk, uint64_t req, int ok) {
  mn_buf_init(b);
  return mn_msg_reply_head(b, pk, req, ok);
}

static void reply_end(aconn_t *c, mn_buf_t *b, size_t s) {
  mn_frame_end(b, s);
  mn__agent_send_buf(c, b);
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
  case EACH_UNMARK: mn__agent_persist_unmark(p); break;
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

/* Runs op over the live procs of record r; returns how many it counted (>= 0, never fails). */
static int each_proc(agent_t *a, apersist_t *r, asession_t *me, int op, msgpack_packer *pk) {
  each_t e = {r, me, op, 0, pk};
  uv_walk(a->loop, walk_each, &e);
  return e.count;
}

/* Reads a request (msg.c checks its layout); refuses the connection (and returns MN_EPROTO) when malformed. */
static int get_request(aconn_t *c, const msgpack_object *m, mn_msg_request_t *r) {
  char err[300];
  if (mn_msg_parse_request(m, r, err, sizeof(err)) != 0) {
    mn__agent_refuse(c, MN_EPROTO, err);
    return MN_EPROTO;
  }
  return 0;
}

/* Why PERSIST cannot be granted (written into msg), or NULL: the agent, the pids and the name must allow it. */
static const char *persist_refusal(aconn_t *c, const mn_msg_request_t *q, apersist_t *r, char *msg, size_t n) {
  agent_t *a = c->a;
  const msgpack_object *pids = q->pids;
  if (a->o->once)
    return "this host agent exits with its controller (--once), so nothing can outlive it: run "
           "long-lived agents (monarch-worker --listen HOST:PORT) and connect with --hosts";
  if (pids->type != MSGPACK_OBJECT_ARRAY || pids->via.array.size == 0) return "PERSIST names no procs";
  for (uint32_t i = 0; i < pids->via.array.size; i++) {
    const msgpack_object *o = &pids->via.array.ptr[i];
    aproc_t *p = o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? mn__agent_pids_find(a, (int64_t)o->via.u64) : NULL;
    if (p == NULL || p->owner != c->session) {
      snprintf(msg, n, "pid %lld is not a live proc of this controller on this host",
               o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long long)o->via.u64 : -1LL);
      return msg;
    }
  }
  if (r != NULL && each_proc(a, r, c->session, EACH_HELD_ELSEWHERE, NULL) > 0) {
    snprintf(msg, n, "a persistent mesh named '%.*s' is already held by another controller here", (int)q->name_len,
             q->name);
    return msg;
  }
  if (r == NULL && a->npersisted >= MN_MAX_PERSISTED) {
    snprintf(msg, n, "this host already keeps %d persistent meshes (MN_MAX_PERSISTED)", MN_MAX_PERSISTED);
    return msg;
  }
  return NULL;
}

/* [PERSIST, req, name, pids, description]: these procs (this controller's) outlive it, under `name`. */
void mn__agent_handle_persist(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  mn_msg_request_t q;
  char msg[400];
  if (get_request(c, m, &q) != 0) return;
  uint64_t req = q.req;
  const char *name = q.name;
  size_t nl = q.name_len;
  const msgpack_object *pids = q.pids;
  apersist_t *r = find_record(a, name, nl);
  const char *refusal = persist_refusal(c, &q, r, msg, sizeof(msg));
  if (refusal != NULL) {
    reply_fail(c, req, refusal);
    return;
  }
  mn_buf_t blob;
  msgpack_packer bpk;
  mn_buf_init(&blob);
  msgpack_packer_init(&bpk, &blob, mn_buf_write_cb);
  if (msgpack_pack_object(&bpk, *q.description) != 0) {
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
    aproc_t *p = mn__agent_pids_find(a, (int64_t)pids->via.array.ptr[i].via.u64);
    if (p->persist == r) continue; /* listed twice */
    mn__agent_persist_unmark(p);
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
void mn__agent_handle_attach(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  mn_msg_request_t q;
  char msg[600], known[300];
  if (get_request(c, m, &q) != 0) return;
  uint64_t req = q.req;
  const char *name = q.name;
  size_t nl = q.name_len;
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
void mn__agent_handle_detach(aconn_t *c, const msgpack_object *m) {
  mn_msg_request_t q;
  char msg[400];
  if (get_request(c, m, &q) != 0) return;
  uint64_t req = q.req;
  const char *name = q.name;
  size_t nl = q.name_len;
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
  msgpack_pack_map(pk, 8 + MN_STAT_FIELDS);
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
  mn__agent_stat_pack(pk, p, ((uv_process_t *)h)->pid, w->now);
}

/* [STATUS, req] -> REPLY {blas, hostname, pid, uptime, procs = [...], exits = [...]} */
void mn__agent_handle_status(aconn_t *c, const msgpack_object *m) {
  agent_t *a = c->a;
  mn_msg_request_t q;
  char host[256];
  if (get_request(c, m, &q) != 0) return;
  uint64_t req = q.req;
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "?");
  host[sizeof(host) - 1] = '\0';
  mn_buf_t b;
  msgpack_packer pk;
  size_t s = reply_begin(&b, &pk, req, 1);
  uint64_t now = uv_now(a->loop);
  mn__agent_gpu_refresh(a->loop);
  status_walk_t w = {&pk, now, c->session, 0, 0};
  uv_walk(a->loop, walk_status, &w);
  msgpack_pack_map(&pk, 6);
  mn_pack_cstr(&pk, "blas");
  mn__agent_blas_pack(&pk);
  mn_pack_cstr(&pk, "hostname");
  mn_pack_cstr(&pk, host);
  mn_pack_cstr(&pk, "pid");
  msgpack_pack_int64(&pk, (int64_t)getpid());
  mn_pack_cstr(&pk, "uptime");
  msgpack_pack_double(&pk, (double)(now - a->started) / 1e3);
  mn_pack_cstr(&pk, "procs");
  msgpack_pack_array(&pk, (size_t)w.count + (size_t)mn__agent_sim_count(a));
  w.pack = 1;
  uv_walk(a->loop, walk_status, &w);
  mn__agent_sim_status(a, &pk, c->session, now);
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

void mn__agent_handle_list(aconn_t *c, const msgpack_object *m) {
  mn_msg_request_t q;
  if (get_request(c, m, &q) != 0) return;
  uint64_t req = q.req;
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
