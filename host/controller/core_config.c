/*
 * core_config.c - monarch.core's settings and counters: core.configure
 * (heartbeats, reconnects, casts, the tree's fan-out, the pool of direct
 * links) and core.cast_stats.
 */
#include "core_lua_int.h"

/* t[k] = v for the table on top of the stack. */
static void set_number(lua_State *L, const char *k, lua_Number v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

/* core.cast_stats() -> {casts = CAST frames sent, calls = the proc calls they carried, tree = whether casts
 * go through the tree, links_up = agents whose parent link is up, routed = agents cast to through their
 * parent, vouched = agents their parent watches (not PINGed), agent_pings = PINGs written to agents,
 * tree_agents = agents in the tree, cast_min, and the pool of direct links to pooled procs (ctl_pool.c):
 * direct_links = open or opening now, direct_max, direct_opened and direct_closed since the start,
 * conn_bytes = the connection table's memory outside malloc (huge-page blocks), resent = relayed calls
 * taken off the tree and resent (an agent lost, a link down, a rebuild),
 * direct_waiting = procs waiting for one, spawn_relayed = SPAWNs sent through a parent, spawn_resent = those
 * sent again directly (a relay on the way lost), links_wanted = the parent links the current tree has} */
int mn__core_cast_stats(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  int active, up, routed, vouched;
  mn_ctl_tree_stats(&c->ctl, &active, &up, &routed, &vouched);
  lua_createtable(L, 0, 20);
  set_number(L, "casts", (lua_Number)c->ctl.casts);
  set_number(L, "vouched", vouched);
  set_number(L, "agent_pings", (lua_Number)c->ctl.agent_pings);
  set_number(L, "calls", (lua_Number)c->ctl.cast_calls);
  lua_pushboolean(L, active);
  lua_setfield(L, -2, "tree");
  set_number(L, "links_up", up);
  set_number(L, "routed", routed);
  set_number(L, "tree_agents", c->ctl.ntree);
  set_number(L, "cast_min", c->ctl.cast_min);
  set_number(L, "direct_links", c->ctl.npool);
  set_number(L, "direct_max", c->ctl.direct_max);
  set_number(L, "conn_bytes", (lua_Number)c->ctl.slab_bytes);
  set_number(L, "resent", (lua_Number)c->ctl.tree_resent);
  set_number(L, "spawn_relayed", (lua_Number)c->ctl.spawn_relayed);
  set_number(L, "spawn_resent", (lua_Number)c->ctl.spawn_resent);
  set_number(L, "links_wanted", mn_ctl_tree_wanted(&c->ctl));
  set_number(L, "direct_opened", (lua_Number)c->ctl.pool_opened);
  set_number(L, "direct_closed", (lua_Number)c->ctl.pool_closed);
  set_number(L, "direct_waiting", c->ctl.nwaitq - c->ctl.waitq_at);
  return 1;
}

/* core.configure's direct_max = n (most pooled links open at once) and direct_idle = s (an unused one closes). */
static int configure_pool(lua_State *L, lctl_t *c) {
  int max = 0;
  uint64_t idle = 0;
  lua_getfield(L, 1, "direct_max");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (n < 1 || n > MN_MAX_CONNS || n != (lua_Number)(int)n)
      return luaL_error(L, "core.configure: direct_max must be an integer in 1..%d", MN_MAX_CONNS);
    max = (int)n;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "direct_idle");
  if (!lua_isnil(L, -1)) {
    double d = luaL_checknumber(L, -1);
    if (d <= 0 || d > 86400) return luaL_error(L, "core.configure: direct_idle must be in (0, 86400] seconds");
    idle = (uint64_t)(d * 1000 + 0.5);
    if (idle == 0) idle = 1;
  }
  lua_pop(L, 1);
  mn_ctl_pool_configure(&c->ctl, max, idle);
  return 0;
}

/* core.configure{heartbeat = s, heartbeat_timeout = s, reconnect = s, cast_min = n, fanout = k,
 * direct_max = n, direct_idle = s} */
int mn__core_configure(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  uint64_t v[3] = {0, 0, 0};
  static const char *const keys[3] = {"heartbeat", "heartbeat_timeout", "reconnect"};
  for (int i = 0; i < 3; i++) {
    lua_getfield(L, 1, keys[i]);
    if (!lua_isnil(L, -1)) {
      double d = luaL_checknumber(L, -1);
      if (d <= 0 || d > 86400) return luaL_error(L, "core.configure: %s must be in (0, 86400] seconds", keys[i]);
      v[i] = (uint64_t)(d * 1000 + 0.5);
      if (v[i] == 0) v[i] = 1;
    }
    lua_pop(L, 1);
  }
  mn_ctl_configure(&c->ctl, v[0], v[1], v[2]);
  lua_getfield(L, 1, "cast_min");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (n < 1 || n > 1e9 || n != (lua_Number)(int)n) return luaL_error(L, "core.configure: cast_min must be a positive integer");
    c->ctl.cast_min = (int)n;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "fanout");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (!(n == 0 || (n >= 2 && n <= MN_TREE_MAX_FANOUT)) || n != (lua_Number)(int)n)
      return luaL_error(L, "core.configure: fanout must be 0 (no tree) or an integer in 2..%d", MN_TREE_MAX_FANOUT);
    c->ctl.fanout = (int)n;
    c->ctl.tree_dirty = 1; /* the next cast rebuilds the tree for it */
  }
  lua_pop(L, 1);
  return configure_pool(L, c);
}
