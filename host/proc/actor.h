/*
 * actor.h - Lua actors inside a proc: the "__actor_" built-ins.
 *
 * Each executor that hosts actors owns one LuaJIT state, made on the first
 * actor built-in and used only on the executor thread. The Lua half of the
 * actor host is lua/monarch/proc/actor_host.lua, loaded from
 * <prefix>/share/monarch/lua/monarch/. The built-ins are:
 *
 *   __actor_define(hash, source, chunkname)   caches a module's source by its content hash
 *   __actor_has(hash)                         true if that source is cached here
 *   __actor_spawn(name, hash, args, deps)     runs the module and its new(args, ctx)
 *   __actor_call(name, endpoint, args...)     calls an endpoint; returns its results, or
 *                                             {__mn_yield = token, rank, request} when the endpoint
 *                                             waits on a call to another mesh (docs/actors.md)
 *   __actor_resume(name, token, ok, value)    hands that call's result to the waiting endpoint;
 *                                             returns like __actor_call
 *   __actor_stop(name)                        drops the actor and the tensors it made
 *   __actor_stats()                           counters and Lua memory, as a map
 *
 * An error inside Lua never takes the proc down: it comes back as a reply of
 * kind "actor" whose message carries the worker-side Lua traceback.
 */
#ifndef MN_ACTOR_H
#define MN_ACTOR_H

#include "exec.h"

#define MN_ACTOR_MAX_STATES 8           /* executors in one process that may host actors (a proc has one) */
#define MN_ACTOR_MEM_MB_DEFAULT 1024    /* Lua heap limit of one proc's actors, MiB (MONARCH_ACTOR_MEM_MB) */
#define MN_ACTOR_MAX_KRESULTS 256       /* most values one proc.call may return to Lua */
#define MN_ACTOR_TENSOR_BASE (1ull << 48) /* first id of tensors actors create; the controller counts up from 1 */
#define MN_ACTOR_HOST_LUA "/share/monarch/lua/monarch/proc/actor_host.lua" /* under the install prefix */

/* Registers the "__actor_" built-ins with the executor; 0, or MN_ELIMIT if the table of modules is full. */
int mn_actor_register(void);

/*
 * Closes the actor state of executor x, if it has one: stops every actor,
 * frees the tensors they made and closes the Lua state. A later actor
 * built-in on x starts a fresh state. Safe to call on an x without one.
 */
void mn_actor_close(mn_exec_t *x);

#endif
