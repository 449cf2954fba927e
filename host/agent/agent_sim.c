/*
 * agent_sim.c - the scale simulation (`monarch-worker --listen ADDR
 * --simulate`): the agent emulates its procs inside itself instead of
 * starting processes, so that thousands of agents fit on one machine while
 * every controller, cast and relay path is the production code over real
 * TCP. Only the procs are pretend; nothing here is for real work.
 *
 * A SPAWN makes virtual procs: each is answered SPAWNED with a pid above
 * Linux's PID_MAX_LIMIT, which no process can have (so the controller's
 * kill(pid, 0) finds nobody), and port 0, "no link of its own: reach it
 * through me". A CAST naming them is answered here, through the same RESULTS
 * batching as relayed real procs (agent_relay.c), by the kernels of its table
 * sim_kernels (basic's names, answered here without basic's code):
 *   noop          nothing
 *   echo(...)     its arguments
 *   rank          rank, world
 *   sleep(s)      nothing, s seconds later, as basic's sleep; the proc's
 *                 later calls are answered after it (in order)
 *   __load(lib)   lib and how many kernels sim_kernels holds: any library loads
 *                 (its kernels are these)
 * Anything else fails as unknown_kernel. KILL ends one with PROC_EXIT, STATUS
 * lists them. Not simulated: tensors, bulk, collectives, actors, persistence.
 */
#include "agent_int.h"

#include <stdarg.h>

#define MN_SIM_PID_BASE 4194304 /* PID_MAX_LIMIT (2^22): no Linux process has a pid this high */
#define MN_SIM_SLOT_BITS 14     /* a virtual pid is base + (port << 14) + slot: unique per agent on a host */
#define MN_SIM_SLOTS (1u << MN_SIM_SLOT_BITS) /* most virtual procs one agent holds at once */
#define MN_SIM_MAX_SLEEP 86400.0 /* seconds, as basic's sleep */

typedef struct {
  asession_t *owner;
  int rank, world;
  uint64_t started;  /* uv_now at spawn */
  uint64_t free_at;  /* uv_now when its last sleep ends: a later call is answered after it */
  uint64_t executed; /* calls answered */
} vproc_t;

/* A RESULT that waits for a sleep to end. */
typedef struct {
  uint64_t due; /* uv_now to answer at */
  uint32_t slot;
  uint64_t tag;
  char *body; /* owned */
  size_t len;
} later_t;

struct asim_s {
  agent_t *a;
  vproc_t **slot;  /* by slot, NULL where free; grows as needed up to MN_SIM_SLOTS */
  uint32_t nslot;  /* entries allocated */
  uint32_t next;   /* where the search for a free slot starts */
  int live;
  int64_t pid_base;
  later_t *later;  /* by due time; equal times in arrival order, so each proc's answers stay in order */
  size_t nlater, later_cap;
  uv_timer_t timer;
  mn_buf_t val;    /* the value every target of the cast being answered gets */
  mn_buf_t body;   /* one RESULT body */
  msgpack_zone zone;
};

/* What a cast asks of each target. */
typedef struct {
  int ok;
  int per_rank;    /* the value is each proc's [rank, world], not s->val */
  uint64_t delay;  /* ms */
} sim_call_t;

int mn__agent_sim_init(agent_t *a) {
  asim_t *s = calloc(1, sizeof(*s));
  if (s == NULL || !msgpack_zone_init(&s->zone, 4096)) {
    free(s);
    return MN_ENOMEM;
  }
  s->a = a;
  s->pid_base = MN_SIM_PID_BASE + ((int64_t)(a->port & 0xffff) << MN_SIM_SLOT_BITS);
  uv_timer_init(a->loop, &s->timer);
  s->timer.data = s;
  uv_unref((uv_handle_t *)&s->timer);
  a->sim = s;
  return 0;
}

static void sim_closed(uv_handle_t *h) {
  asim_t *s = h->data;
  for (uint32_t i = 0; i < s->nslot; i++) free(s->slot[i]);
  for (size_t i = 0; i < s->nlater; i++) free(s->later[i].body);
  free(s->slot);
  free(s->later);
  mn_buf_free(&s->val);
  mn_buf_free(&s->body);
  msgpack_zone_destroy(&s->zone);
  free(s);
}

void mn__agent_sim_close(agent_t *a) {
  if (a->sim == NULL) return;
  uv_close((uv_handle_t *)&a->sim->timer, sim_closed);
  a->sim = NULL;
}

/* ---- virtual procs ------------------------------------------------------------------------- */

/* A free slot (growing the table), or -1 when MN_SIM_SLOTS are taken. */
static int64_t free_slot(asim_t *s) {
  for (uint32_t i = 0; i < s->nslot; i++) {
    uint32_t j = (s->next + i) % s->nslot; /* round the table: a freed pid is not handed out again at once */
    if (s->slot[j] == NULL) {
      s->next = j + 1;
      return j;
    }
  }
  if (s->nslot == MN_SIM_SLOTS) return -1;
  uint32_t n = s->nslot ? 2 * s->nslot : 16;
  vproc_t **t = realloc(s->slot, n * sizeof(*t));
  if (t == NULL) return -1;
  memset(t + s->nslot, 0, (n - s->nslot) * sizeof(*t));
  s->slot = t;
  s->next = s->nslot + 1;
  s->nslot = n;
  return s->next - 1;
}

/* The session's virtual proc with this pid, or NULL; *slot is its slot. */
static vproc_t *find(asim_t *s, const asession_t *owner, int64_t pid, uint32_t *slot) {
  if (pid < s->pid_base || pid >= s->pid_base + (int64_t)s->nslot) return NULL;
  vproc_t *v = s->slot[pid - s->pid_base];
  *slot = (uint32_t)(pid - s->pid_base);
  return v != NULL && v->owner == owner ? v : NULL;
}

/* Frees slot i and every answer still waiting for it. */
static void drop(asim_t *s, uint32_t i) {
  size_t k = 0;
  for (size_t j = 0; j < s->nlater; j++) {
    if (s->later[j].slot == i) free(s->later[j].body);
    else s->later[k++] = s->later[j];
  }
  s->nlater = k;
  free(s->slot[i]);
  s->slot[i] = NULL;
  s->live--;
}

void mn__agent_sim_spawn(asession_t *ss, uint64_t req, int n, int rank_base, int world) {
  asim_t *s = ss->a->sim;
  mn_buf_t b;
  mn_buf_init(&b);
  for (int i = 0; i < n; i++) {
    int64_t j = free_slot(s);
    vproc_t *v = j >= 0 ? calloc(1, sizeof(*v)) : NULL;
    if (v == NULL) {
      mn_msg_pack_spawn_failed(&b, req, i, j < 0 ? "this simulated agent holds its most virtual procs (16384) already"
                                                 : "out of memory");
      continue;
    }
    *v = (vproc_t){ss, rank_base + i, world, uv_now(ss->a->loop), 0, 0};
    s->slot[j] = v;
    s->live++;
    mn_msg_pack_spawned(&b, req, i, s->pid_base + j, 0); /* port 0: reached through this agent only */
  }
  mn__agent_session_send(ss, &b);
  mn_buf_free(&b);
}

/* Signals that end a process by default; the rest (stop, continue, ...) leave a virtual proc as it is. */
static int ends(int sig) {
  return sig > 0 && sig != SIGSTOP && sig != SIGCONT && sig != SIGTSTP && sig != SIGTTIN && sig != SIGTTOU &&
         sig != SIGCHLD && sig != SIGURG && sig != SIGWINCH;
}

void mn__agent_sim_kill(asession_t *ss, int64_t pid, int sig) {
  asim_t *s = ss->a->sim;
  uint32_t i;
  vproc_t *v = find(s, ss, pid, &i);
  if (v == NULL || !ends(sig)) return;
  int rank = v->rank;
  drop(s, i);
  mn__agent_note_exit(ss->a, rank, pid, 0, sig);
  mn_buf_t b;
  mn_buf_init(&b);
  const char *name = sigabbrev_np(sig) ? sigabbrev_np(sig) : "?";
  if (mn_msg_pack_proc_exit(&b, pid, 0, name, rank) == 0) mn__agent_session_send(ss, &b);
  mn_buf_free(&b);
}

void mn__agent_sim_session_end(asession_t *ss) {
  asim_t *s = ss->a->sim;
  for (uint32_t i = 0; i < s->nslot; i++)
    if (s->slot[i] != NULL && s->slot[i]->owner == ss) drop(s, i);
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* Packs a failure's value {kind, message, kernel} into s->val; returns the call's outcome. */
static sim_call_t fail(asim_t *s, const char *kind, const char *kernel, size_t kl, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static sim_call_t fail(asim_t *s, const char *kind, const char *kernel, size_t kl, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &s->val, mn_buf_write_cb);
  mn_msg_pack_failure(&pk, kind, msg, kernel, kl);
  return (sim_call_t){0, 0, 0};
}

/* Bytes of the msgpack str header at p (the kernel name that starts a cast's rest). */
static size_t str_header(const char *p) {
  uint8_t b = (uint8_t)p[0];
  return b == 0xd9 ? 2 : b == 0xda ? 3 : b == 0xdb ? 5 : 1;
}

/* A simulated kernel: call c (decoded from rest, its CAST's bytes after the seq) answered into s->val. */
typedef sim_call_t (*sim_fn)(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen);

/* The answer of a kernel that returns nothing, after delay_ms. */
static sim_call_t nothing(asim_t *s, uint64_t delay_ms) {
  char empty = (char)0x90; /* [] */
  mn_buf_append(&s->val, &empty, 1);
  return (sim_call_t){1, 0, delay_ms};
}

static sim_call_t k_noop(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen) { return nothing(s, 0); }

/* sleep(s): nothing, s seconds later; the delay defers the answer (agent's loop never waits), as basic's sleep. */
static sim_call_t k_sleep(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen) {
  const msgpack_object_array *args = &c->args->via.array;
  const msgpack_object *a = args->size == 1 ? &args->ptr[0] : NULL;
  int num = a && (a->type == MSGPACK_OBJECT_FLOAT64 || a->type == MSGPACK_OBJECT_FLOAT32 ||
                  a->type == MSGPACK_OBJECT_POSITIVE_INTEGER || a->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
  if (!num) return fail(s, "bad_args", c->kernel, c->kernel_len, "sleep wants one number (seconds)");
  double secs = a->type == MSGPACK_OBJECT_POSITIVE_INTEGER   ? (double)a->via.u64
                : a->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (double)a->via.i64
                                                             : a->via.f64;
  if (!(secs >= 0 && secs <= MN_SIM_MAX_SLEEP))
    return fail(s, "kernel", c->kernel, c->kernel_len, "sleep: seconds must be in [0, 86400], got %g", secs);
  return nothing(s, (uint64_t)(secs * 1e3 + 0.5));
}

/* echo(...): its arguments, as they came: the bytes after the kernel name. */
static sim_call_t k_echo(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen) {
  size_t h = str_header(rest) + c->kernel_len;
  mn_buf_append(&s->val, rest + h, rlen - h);
  return (sim_call_t){1, 0, 0};
}

/* rank: each target's own [rank, world], packed per proc by build(). */
static sim_call_t k_rank(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen) {
  return (sim_call_t){1, 1, 0};
}

/* The kernels a virtual proc has: basic's names, answered without running basic's code. */
static const struct {
  const char *name;
  sim_fn fn;
} sim_kernels[] = {{"noop", k_noop}, {"echo", k_echo}, {"rank", k_rank}, {"sleep", k_sleep}};

#define MN_SIM_NKERNELS (sizeof(sim_kernels) / sizeof(sim_kernels[0]))

/* __load(lib): lib and the count of sim_kernels, whatever lib is (its kernels are these). */
static sim_call_t k_load(asim_t *s, const mn_msg_call_t *c) {
  const msgpack_object_array *args = &c->args->via.array;
  if (args->size != 1 || args->ptr[0].type != MSGPACK_OBJECT_STR)
    return fail(s, "bad_args", c->kernel, c->kernel_len, "__load wants a library name");
  msgpack_packer pk;
  msgpack_packer_init(&pk, &s->val, mn_buf_write_cb);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_object(&pk, args->ptr[0]);
  msgpack_pack_int(&pk, (int)MN_SIM_NKERNELS);
  return (sim_call_t){1, 0, 0};
}

static int named(const mn_msg_call_t *c, const char *name) {
  return c->kernel_len == strlen(name) && memcmp(c->kernel, name, c->kernel_len) == 0;
}

/* Runs call c (decoded from rest) as its kernel in sim_kernels would: the value into s->val, or a failure. */
static sim_call_t run(asim_t *s, const mn_msg_call_t *c, const char *rest, size_t rlen) {
  s->val.len = 0;
  for (size_t i = 0; i < MN_SIM_NKERNELS; i++)
    if (named(c, sim_kernels[i].name)) return sim_kernels[i].fn(s, c, rest, rlen);
  if (named(c, "__load")) return k_load(s, c);
  char list[64] = "";
  for (size_t i = 0, off = 0; i < MN_SIM_NKERNELS && off < sizeof(list); i++)
    off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "", sim_kernels[i].name);
  return fail(s, "unknown_kernel", c->kernel, c->kernel_len,
              "no kernel named '%.*s' on a simulated proc (monarch-worker --simulate runs %s)", (int)c->kernel_len,
              c->kernel, list);
}

/* ---- answers ------------------------------------------------------------------------------- */

/* Builds v's RESULT for seq into s->body (value: s->val, or v's rank); returns 0 or MN_ENOMEM. */
static int build(asim_t *s, const vproc_t *v, uint64_t seq, const sim_call_t *r) {
  msgpack_packer pk;
  s->body.len = 0;
  mn_msg_result_head(&s->body, &pk, seq, r->ok);
  if (r->per_rank) {
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, v->rank);
    msgpack_pack_int(&pk, v->world);
  } else if (mn_buf_append(&s->body, s->val.data, s->val.len) != 0) {
    return MN_ENOMEM;
  }
  return s->body.len > MN_FRAME_HEADER ? 0 : MN_ENOMEM;
}

static void on_timer(uv_timer_t *t);

/* (Re)arms the timer for the earliest answer still waiting. */
static void arm(asim_t *s) {
  if (s->nlater == 0) {
    uv_timer_stop(&s->timer);
    return;
  }
  uint64_t now = uv_now(s->a->loop), due = s->later[0].due;
  uv_timer_start(&s->timer, on_timer, due > now ? due - now : 0, 0);
}

/* Keeps s->body as slot's answer until `due`; 0 or MN_ENOMEM. */
static int defer(asim_t *s, uint32_t slot, uint64_t tag, uint64_t due) {
  if (s->nlater == s->later_cap) {
    size_t cap = s->later_cap ? 2 * s->later_cap : 64;
    later_t *l = realloc(s->later, cap * sizeof(*l));
    if (l == NULL) return MN_ENOMEM;
    s->later = l;
    s->later_cap = cap;
  }
  size_t len = s->body.len - MN_FRAME_HEADER, at = s->nlater;
  char *body = malloc(len);
  if (body == NULL) return MN_ENOMEM;
  memcpy(body, s->body.data + MN_FRAME_HEADER, len);
  while (at > 0 && s->later[at - 1].due > due) at--; /* after every answer due no later: arrival order */
  memmove(s->later + at + 1, s->later + at, (s->nlater - at) * sizeof(*s->later));
  s->later[at] = (later_t){due, slot, tag, body, len};
  s->nlater++;
  return 0;
}

/* Answers what is due by now, in order, and pushes every session's batch. */
static void run_due(asim_t *s, uint64_t now) {
  size_t k = 0;
  while (k < s->nlater && s->later[k].due <= now) {
    later_t *l = &s->later[k++];
    vproc_t *v = s->slot[l->slot]; /* alive: drop() takes a proc's answers with it */
    v->executed++;
    mn__agent_relay_answer(v->owner, l->tag, l->body, l->len);
    free(l->body);
  }
  if (k == 0) return;
  memmove(s->later, s->later + k, (s->nlater - k) * sizeof(*s->later));
  s->nlater -= k;
  for (asession_t *ss = s->a->sessions; ss; ss = ss->next) mn__agent_relay_push(ss);
}

static void on_timer(uv_timer_t *t) {
  asim_t *s = t->data;
  run_due(s, uv_now(s->a->loop));
  arm(s);
}

void mn__agent_sim_cast(asession_t *ss, const msgpack_object *targets, const char *rest, size_t rlen) {
  asim_t *s = ss->a->sim;
  uint64_t now = uv_now(ss->a->loop);
  run_due(s, now); /* what is due goes first: it answers earlier calls */
  /* The CALL the relay would write, decoded once for every target. */
  char head[MN_MSG_CALL_HEAD];
  mn_msg_call_from_cast(head, 0, rlen);
  mn_buf_t f;
  char err[200];
  msgpack_object m;
  mn_msg_call_t c;
  msgpack_zone_clear(&s->zone);
  mn_buf_init(&f);
  if (mn_buf_append(&f, head, sizeof(head)) != 0 || mn_buf_append(&f, rest, rlen) != 0) {
    mn_buf_free(&f);
    return; /* as for a lost relay write: the controller's timeout ends the call */
  }
  int bad = mn_decode(f.data + MN_FRAME_HEADER, f.len - MN_FRAME_HEADER, &s->zone, &m, err, sizeof(err)) != 0 ||
            mn_msg_parse_call(&m, &c, err, sizeof(err)) != 0;
  sim_call_t r = bad ? fail(s, "bad_args", "?", 1, "%s", err) : run(s, &c, rest, rlen);
  const msgpack_object *t = targets->via.array.ptr;
  for (uint32_t i = 0; i + 2 < targets->via.array.size; i += 3) {
    uint32_t slot;
    vproc_t *v = find(s, ss, (int64_t)t[i].via.u64, &slot);
    if (v == NULL || build(s, v, t[i + 1].via.u64, &r) != 0) continue; /* not ours (or no memory): skipped */
    uint64_t due = (v->free_at > now ? v->free_at : now) + r.delay;
    v->free_at = due;
    if (due > now) {
      if (defer(s, slot, t[i + 2].via.u64, due) != 0) continue;
    } else {
      v->executed++;
      mn__agent_relay_answer(ss, t[i + 2].via.u64, s->body.data + MN_FRAME_HEADER, s->body.len - MN_FRAME_HEADER);
    }
  }
  mn_buf_free(&f);
  mn__agent_relay_push(ss);
  arm(s);
}

/* ---- STATUS -------------------------------------------------------------------------------- */

int mn__agent_sim_count(const agent_t *a) { return a->sim ? a->sim->live : 0; }

/* One virtual proc's STATUS entry: the keys of a real proc's, what /proc or NVML would say as nil. */
static void pack_status(msgpack_packer *pk, const vproc_t *v, int64_t pid, const asession_t *me, uint64_t now) {
  int busy = v->free_at > now;
  msgpack_pack_map(pk, 16);
  mn_pack_cstr(pk, "rank");
  msgpack_pack_int(pk, v->rank);
  mn_pack_cstr(pk, "pid");
  msgpack_pack_int64(pk, pid);
  mn_pack_cstr(pk, "uptime");
  msgpack_pack_double(pk, (double)(now - v->started) / 1e3);
  mn_pack_cstr(pk, "state");
  mn_pack_cstr(pk, v->owner->conn ? "attached" : "detached");
  mn_pack_cstr(pk, "mine");
  if (v->owner == me) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  mn_pack_cstr(pk, "queued");
  msgpack_pack_int(pk, 0);
  mn_pack_cstr(pk, "executed");
  msgpack_pack_uint64(pk, v->executed);
  mn_pack_cstr(pk, "running");
  mn_pack_cstr(pk, busy ? "sleep" : "-");
  static const char *const unknown[] = {"cpu", "rss", "gpu_mem"};
  for (int i = 0; i < 3; i++) {
    mn_pack_cstr(pk, unknown[i]);
    msgpack_pack_nil(pk);
  }
  mn_pack_cstr(pk, "running_for");
  msgpack_pack_double(pk, 0.0);
  mn_pack_cstr(pk, "status_age");
  msgpack_pack_double(pk, 0.0);
  mn_pack_cstr(pk, "hung");
  msgpack_pack_false(pk);
  mn_pack_cstr(pk, "ready");
  msgpack_pack_true(pk);
  mn_pack_cstr(pk, "simulated");
  msgpack_pack_true(pk);
}

void mn__agent_sim_status(const agent_t *a, msgpack_packer *pk, const asession_t *me, uint64_t now) {
  const asim_t *s = a->sim;
  for (uint32_t i = 0; s != NULL && i < s->nslot; i++)
    if (s->slot[i] != NULL) pack_status(pk, s->slot[i], s->pid_base + i, me, now);
}
