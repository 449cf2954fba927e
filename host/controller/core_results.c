/*
 * core_results.c - monarch.core's results path: what the procs and agents
 * sent, drained into Lua. core.poll decodes each connection's frames into
 * one array of events; a RESULTS frame from an agent is read entry by entry
 * (a scout ahead fetches the procs it names), and a collected call's
 * successes go straight into its values table (core.collect), so Lua sees
 * one entry per run of them instead of one per proc.
 */
#include "core_lua_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Adds (0, conn, kind) to the event list at ev, which holds n entries; returns the new count. */
static int push_event(lua_State *L, int ev, int n, int conn, const char *kind) {
  lua_pushnumber(L, 0);
  lua_rawseti(L, ev, ++n);
  lua_pushinteger(L, conn);
  lua_rawseti(L, ev, ++n);
  lua_pushstring(L, kind);
  lua_rawseti(L, ev, ++n);
  return n;
}

/* Pushes a RESULT's value for (call, slot) as Lua sees it: a fetch into
 * place (core.fetch_into) lands in its destination and Lua gets the byte
 * count; one value comes unwrapped, none as nil; a failure as its error map. */
static void push_result_value(lua_State *L, lctl_t *c, mn_pending_t p, const mn_msg_result_t *r) {
  const msgpack_object *v = r->value;
  mn_dest_t *d = NULL;
  for (size_t i = 0; i < c->ndests && d == NULL; i++)
    if (c->dests[i].call == p.call && c->dests[i].slot == p.slot) d = &c->dests[i];
  if (d != NULL) {
    const msgpack_object *b = r->ok && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 1 ? &v->via.array.ptr[0] : NULL;
    if (b != NULL && b->type == MSGPACK_OBJECT_BIN && b->via.bin.size <= d->cap) {
      memcpy(d->dest, b->via.bin.ptr, b->via.bin.size);
      lua_pushnumber(L, (lua_Number)b->via.bin.size);
    } else {
      mn__core_push_obj(L, v);
    }
    *d = c->dests[--c->ndests];
  } else if (r->ok && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size <= 1) {
    if (v->via.array.size == 1) mn__core_push_obj(L, &v->via.array.ptr[0]);
    else lua_pushnil(L);
  } else {
    mn__core_push_obj(L, v);
  }
}

/* Lets go of what (call, slot) held: its proc has answered, so it copies no more. */
static void release_hold(lua_State *L, lctl_t *c, mn_pending_t p) {
  for (size_t i = 0; i < c->nholds; i++)
    if (c->holds[i].call == p.call && c->holds[i].slot == p.slot) {
      luaL_unref(L, LUA_REGISTRYINDEX, c->holds[i].ref);
      c->holds[i] = c->holds[--c->nholds];
      return;
    }
}

/* Lets go of what calls on closed connections held once their process is gone (kill(pid, 0): ESRCH). */
static void sweep_holds(lua_State *L, lctl_t *c) {
  for (size_t i = 0; i < c->nholds;) {
    mn_hold_t *h = &c->holds[i];
    mn_conn_t *k = mn_ctl_conn(&c->ctl, h->conn);
    int closed = k == NULL || mn_ctl_conn_state(k) == MN_CS_CLOSED;
    if (closed && (h->pid <= 0 || (kill((pid_t)h->pid, 0) != 0 && errno == ESRCH))) {
      luaL_unref(L, LUA_REGISTRYINDEX, h->ref);
      *h = c->holds[--c->nholds];
    } else {
      i++;
    }
  }
}

static int collect_slot(double call) { return (int)((uint64_t)call & (MN_COLLECT_SLOTS - 1)); }

/* Tells Lua of the run of answers stored into one call's values: call_id, -count, true, nil. */
static int flush_run(lua_State *L, lctl_t *c, int ev, int n) {
  if (c->run_n == 0) return n;
  lua_pushnumber(L, c->run_call);
  lua_rawseti(L, ev, ++n);
  lua_pushinteger(L, -c->run_n);
  lua_rawseti(L, ev, ++n);
  lua_pushboolean(L, 1);
  lua_rawseti(L, ev, ++n);
  lua_pushnil(L);
  lua_rawseti(L, ev, ++n);
  c->run_n = 0;
  return n;
}

/* A successful answer of a collected call goes into its values table at its slot; 1 if it did. */
static int collected(lua_State *L, lctl_t *c, mn_pending_t p, const mn_msg_result_t *r) {
  int i = collect_slot(p.call);
  if (!r->ok || c->collect[i].ref == LUA_NOREF || c->collect[i].call != p.call || c->ndests > 0) return 0;
  /* The kernel returned nothing: its slot stays nil, as a new values table has it (no Lua touched). */
  if (r->value->type == MSGPACK_OBJECT_ARRAY && r->value->via.array.size == 0) return 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->collect[i].ref);
  push_result_value(L, c, p, r);
  lua_rawseti(L, -2, p.slot);
  lua_pop(L, 1);
  return 1;
}

/* Adds a proc's RESULT r to ev as call_id, slot, ok, value (or, for a collected call, to the run of
 * its answers); returns the new count (>= 0), or MN_EPROTO when it answers no call in flight (conn is
 * then closed). */
static int take_parsed(lua_State *L, lctl_t *c, mn_conn_t *k, const mn_msg_result_t *r, int ev, int n) {
  mn_pending_t p;
  mn_take_t taken = mn_ctl_take_result(k, r->seq, &p);
  if (taken == MN_TAKE_SECOND) return n; /* a second answer to a resent call: the first one counted */
  if (taken != MN_TAKE_ANSWERED) {
    mn_ctl_refuse(&c->ctl, k, "proc sent a RESULT that matches no call in flight");
    return MN_EPROTO;
  }
  if (c->nholds > 0) release_hold(L, c, p);
  if (c->run_n > 0 && c->run_call != p.call) n = flush_run(L, c, ev, n);
  if (collected(L, c, p, r)) {
    c->run_call = p.call;
    c->run_n++;
    return n;
  }
  n = flush_run(L, c, ev, n);
  lua_pushnumber(L, p.call);
  lua_rawseti(L, ev, ++n);
  lua_pushinteger(L, p.slot);
  lua_rawseti(L, ev, ++n);
  lua_pushboolean(L, r->ok);
  lua_rawseti(L, ev, ++n);
  push_result_value(L, c, p, r);
  lua_rawseti(L, ev, ++n);
  return n;
}

/* A decoded RESULT message m from proc conn k, as take_parsed; a malformed one closes k (MN_EPROTO). */
static int take_result(lua_State *L, lctl_t *c, mn_conn_t *k, const msgpack_object *m, int ev, int n) {
  char err[300];
  mn_msg_result_t r;
  if (mn_msg_parse_result(m, &r, err, sizeof(err)) != 0) {
    mn_ctl_refuse(&c->ctl, k, err);
    return MN_EPROTO;
  }
  return take_parsed(L, c, k, &r, ev, n);
}

/* A PONG to a heartbeat PING: receiving it was the point (the connection's last_rx). 1 or 0 (a predicate). */
static int is_heartbeat(const msgpack_object *m) {
  const msgpack_object *id;
  char err[200];
  return mn_msg_type(m) == MN_MSG_PONG && mn_msg_parse_ping(m, &id, err, sizeof(err)) == 0 &&
         id->type == MSGPACK_OBJECT_POSITIVE_INTEGER && id->via.u64 >= MN_HB_PING_BASE;
}

/* A scout reads a RESULTS frame ahead of the entry being taken, so that the procs it names come from
 * memory meanwhile (through the tree one frame names thousands, scattered, each cold), in the stages
 * of mn_ctl_prefetch: SCOUT_FAR entries ahead a proc's table entry, then nearer its conn, its oldest
 * call and agent, and its agent's own part (the answer comes off its route's count). */
#define SCOUT_FAR 16
static const struct {
  int ahead;
  mn_prefetch_t what;
} scout_stages[] = {{16, MN_PF_CONN}, {8, MN_PF_ANSWER}, {4, MN_PF_AGENT}};
typedef struct {
  mn_msg_results_reader_t r;
  uint64_t tags[SCOUT_FAR]; /* the last SCOUT_FAR tags read, entry e at e % SCOUT_FAR */
  uint32_t n;               /* entries read */
  int live;                 /* 0 once it met an entry it cannot skip: prefetching stops there */
} scout_t;

static void scout_step(mn_ctl_t *ctl, scout_t *s) {
  uint64_t t = 0;
  if (s->live && mn_msg_results_skip(&s->r, &t) != 1) s->live = 0, t = 0;
  s->tags[s->n++ % SCOUT_FAR] = t;
  /* The scout is at entry n-1, SCOUT_FAR ahead of the one being taken: a stage `ahead` of that is
   * SCOUT_FAR - ahead behind the scout. */
  for (size_t i = 0; i < sizeof(scout_stages) / sizeof(scout_stages[0]); i++) {
    uint32_t back = (uint32_t)(SCOUT_FAR - scout_stages[i].ahead);
    if (s->n > back) mn_ctl_prefetch(ctl, s->tags[(s->n - 1 - back) % SCOUT_FAR], scout_stages[i].what);
  }
}

/* A RESULTS frame (body, len) from agent conn `agent`, read entry by entry: each of its procs' results
 * as if the proc had sent it. A malformed frame closes the agent's conn (MN_EPROTO), a malformed entry
 * only its proc's. */
static int take_results(lua_State *L, lctl_t *c, mn_conn_t *a, int agent, mn_msg_results_reader_t *rr, int ev, int n) {
  char err[300];
  uint64_t tag;
  mn_msg_result_t r;
  int rc;
  scout_t s = {.r = *rr, .live = 1};
  for (int i = 0; i < SCOUT_FAR; i++) scout_step(&c->ctl, &s);
  while ((rc = mn_msg_results_next(rr, &c->zone, &tag, &r, err, sizeof(err))) != 0) {
    scout_step(&c->ctl, &s);
    mn_conn_t *k = rc == 1 || rc == MN_EINVAL ? mn_ctl_relayed_conn(&c->ctl, agent, tag) : NULL;
    if (rc != 1 && rc != MN_EINVAL) {
      mn_ctl_refuse(&c->ctl, a, err);
      return MN_EPROTO;
    }
    if (k == NULL) continue; /* a proc closed since (its calls failed with it) */
    if (rc == MN_EINVAL) {
      mn_ctl_refuse(&c->ctl, k, err);
      continue;
    }
    int got = take_parsed(L, c, k, &r, ev, n);
    if (got >= 0) n = got; /* a bad one closed its proc's conn; the others stand */
  }
  return n;
}

/* A RESULTS frame m decoded whole (one whose head is not the array32 the agent writes), as take_results. */
static int take_results_decoded(lua_State *L, lctl_t *c, mn_conn_t *a, int agent, const msgpack_object *m, int ev,
                                int n) {
  char err[300];
  uint32_t nr;
  if (mn_msg_parse_results(m, &nr, err, sizeof(err)) != 0) {
    mn_ctl_refuse(&c->ctl, a, err);
    return MN_EPROTO;
  }
  for (uint32_t i = 0; i < nr; i++) {
    const msgpack_object *e = &m->via.array.ptr[1 + 2 * i];
    mn_conn_t *k = mn_ctl_relayed_conn(&c->ctl, agent, e[0].via.u64);
    if (k == NULL) continue; /* a proc closed since (its calls failed with it) */
    int r = take_result(L, c, k, &e[1], ev, n);
    if (r >= 0) n = r; /* a bad one closed its proc's conn; the others stand */
  }
  return n;
}

/* Decodes the frames waiting on conn `id` into ev; returns the new count. */
static int drain_conn(lua_State *L, lctl_t *c, int id, int ev, int n) {
  mn_conn_t *k = mn_ctl_conn(&c->ctl, id);
  const char *body;
  int64_t len;
  while ((len = mn_ctl_read_frame(&c->ctl, k, &body)) >= 0) {
    char err[300];
    msgpack_object m;
    mn_msg_results_reader_t rr;
    msgpack_zone_clear(&c->zone);
    if (mn_ctl_conn_kind(k) == MN_CONN_AGENT && mn_msg_results_open(&rr, body, (size_t)len) == 0) {
      int r = take_results(L, c, k, id, &rr, ev, n); /* the hot path: not decoded whole */
      if (r < 0) break;
      n = r;
      continue;
    }
    if (mn_decode(body, (size_t)len, &c->zone, &m, err, sizeof(err)) != 0) {
      mn_ctl_refuse(&c->ctl, k, err);
      break;
    }
    if (mn_msg_type(&m) == MN_MSG_RESULT && mn_ctl_conn_kind(k) == MN_CONN_PROC) {
      int r = take_result(L, c, k, &m, ev, n);
      if (r < 0) break;
      n = r;
    } else if (mn_msg_type(&m) == MN_MSG_RESULTS && mn_ctl_conn_kind(k) == MN_CONN_AGENT) {
      int r = take_results_decoded(L, c, k, id, &m, ev, n); /* not in the agent's own form */
      if (r < 0) break;
      n = r;
    } else if (mn_msg_type(&m) == MN_MSG_LINKED && mn_ctl_conn_kind(k) == MN_CONN_AGENT) {
      if (mn_ctl_take_linked(&c->ctl, k, &m, err, sizeof(err)) != 0) {
        mn_ctl_refuse(&c->ctl, k, err);
        break;
      }
    } else if (!is_heartbeat(&m)) {
      if ((mn_msg_type(&m) == MN_MSG_SPAWNED || mn_msg_type(&m) == MN_MSG_SPAWN_FAILED) &&
          mn_ctl_conn_kind(k) == MN_CONN_AGENT)
        mn_ctl_spawn_answered(k, &m);
      n = push_event(L, ev, n, id, "message");
      mn__core_push_obj(L, &m);
      lua_rawseti(L, ev, ++n);
    }
  }
  return n;
}

/* Adds an event's value (the fourth entry) to ev: what Lua gets with its kind. */
static int push_event_value(lua_State *L, lctl_t *c, const mn_event_t *e, int ev, int n) {
  mn_conn_info_t i;
  if (e->kind == MN_EV_CONNECTED) {
    mn_ctl_info(&c->ctl, e->conn, &i);
    lua_createtable(L, 0, 5);
    lua_pushstring(L, i.host);
    lua_setfield(L, -2, "host");
    lua_pushnumber(L, (lua_Number)e->a);
    lua_setfield(L, -2, "pid");
    if (i.ship >= 0) { /* an agent that knows shipping (ship.lua) */
      lua_pushboolean(L, i.ship);
      lua_setfield(L, -2, "ship");
      lua_pushinteger(L, i.elf_class);
      lua_setfield(L, -2, "elf_class");
      lua_pushinteger(L, i.elf_machine);
      lua_setfield(L, -2, "elf_machine");
      if (i.cache_id[0] != '\0') {
        lua_pushstring(L, i.cache_id);
        lua_setfield(L, -2, "cache");
      }
    }
  } else if (e->kind == MN_EV_CLOSED || e->kind == MN_EV_RECONNECTING) {
    mn_ctl_info(&c->ctl, e->conn, &i);
    lua_pushstring(L, i.reason);
  } else if (e->kind == MN_EV_RECONNECTED) {
    lua_pushnumber(L, (lua_Number)e->a);
  } else { /* MN_EV_AGENT_EXIT */
    lua_createtable(L, 0, 2);
    lua_pushnumber(L, (lua_Number)e->a);
    lua_setfield(L, -2, "status");
    lua_pushnumber(L, (lua_Number)e->b);
    lua_setfield(L, -2, "signal");
  }
  lua_rawseti(L, ev, ++n);
  return n;
}

/*
 * core.poll(ev, timeout_ms) -> n. Fills ev[1..n] with entries of four:
 *   call_id, slot, ok, value            a RESULT
 *   0, conn, "message", msg             another message (agent events, PONG, ERROR)
 *   0, conn, "connected", {host, pid}   handshake done
 *   0, conn, "closed", reason           connection gone for good
 *   0, conn, "reconnecting", reason     lost; retrying within the reconnect window
 *   0, conn, "reconnected", pid         back, unanswered calls resent
 *   0, 0, "agent_exit", {status, signal}  the embedded agent died
 */
int mn__core_poll(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  int timeout = (int)luaL_optinteger(L, 2, -1);
  mn_ctl_t *ctl = &c->ctl;
  mn_ctl_wait(ctl, timeout);
  int refs[256], nr;
  while ((nr = mn_ctl_take_released(ctl, refs, 256)) > 0) /* payloads the sockets are done with */
    for (int i = 0; i < nr; i++) luaL_unref(L, LUA_REGISTRYINDEX, refs[i]);
  if (c->nholds > 0) sweep_holds(L, c);
  int n = 0, id;
  size_t ne;
  const mn_event_t *evs = mn_ctl_events(ctl, &ne);
  /* Connected events first, then data, then the rest: a proc's last results precede its death. */
  for (size_t i = 0; i < ne; i++)
    if (evs[i].kind == MN_EV_CONNECTED) {
      n = push_event(L, 1, n, evs[i].conn, mn_ctl_event_name(evs[i].kind));
      n = push_event_value(L, c, &evs[i], 1, n);
    }
  while ((id = mn_ctl_take_readable(ctl)) > 0) n = drain_conn(L, c, id, 1, n);
  n = flush_run(L, c, 1, n);
  evs = mn_ctl_events(ctl, &ne); /* draining may have closed connections */
  for (size_t i = 0; i < ne; i++)
    if (evs[i].kind != MN_EV_CONNECTED) {
      n = push_event(L, 1, n, evs[i].conn, mn_ctl_event_name(evs[i].kind));
      n = push_event_value(L, c, &evs[i], 1, n);
    }
  mn_ctl_events_done(ctl);
  lua_pushinteger(L, n);
  return 1;
}

/* core.collect(call_id, values) -> true if C will store the call's successful answers straight into
 * values[slot] (and report them in runs: call_id, -count), false if its slot is taken (per-slot events). */
int mn__core_collect(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  double call = luaL_checknumber(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int i = collect_slot(call);
  if (c->collect[i].ref != LUA_NOREF) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushvalue(L, 2);
  c->collect[i].ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->collect[i].call = call;
  lua_pushboolean(L, 1);
  return 1;
}

/* core.uncollect(call_id): its answers come per slot again (the call finished). */
int mn__core_uncollect(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  double call = luaL_checknumber(L, 1);
  int i = collect_slot(call);
  if (c->collect[i].ref != LUA_NOREF && c->collect[i].call == call) {
    luaL_unref(L, LUA_REGISTRYINDEX, c->collect[i].ref);
    c->collect[i].ref = LUA_NOREF;
  }
  return 0;
}
