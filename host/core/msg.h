/*
 * msg.h - the protocol's message types: their numbers and names, in one
 * place for C and (as core.MSG) for Lua. docs/protocol.md describes each.
 */
#ifndef MN_MSG_H
#define MN_MSG_H

typedef enum {
  MN_MSG_HELLO = 1,       /* server -> client: version, nonce, role */
  MN_MSG_AUTH = 2,        /* client -> server: version, nonce, mac */
  MN_MSG_WELCOME = 3,     /* server -> client: mac, info */
  MN_MSG_ERROR = 4,       /* either way: code, message; then the sender closes */
  MN_MSG_PING = 5,        /* either way: id */
  MN_MSG_PONG = 6,        /* reply: id */
  MN_MSG_SPAWN = 10,      /* controller -> agent: req, spec */
  MN_MSG_SPAWNED = 11,    /* agent -> controller: req, index, pid, port */
  MN_MSG_SPAWN_FAILED = 12, /* agent -> controller: req, index, message */
  MN_MSG_PROC_EXIT = 13,  /* agent -> controller: pid, exit code, signal name */
  MN_MSG_KILL = 14,       /* controller -> agent: pid, signal number */
  MN_MSG_PERSIST = 15,    /* controller -> agent: req, name, pids, description: keep these procs up */
  MN_MSG_ATTACH = 16,     /* controller -> agent: req, name: take over a persistent mesh */
  MN_MSG_REPLY = 17,      /* agent -> controller: req, ok, value (answers 15, 16, 18, 19) */
  MN_MSG_DETACH = 18,     /* controller -> agent: req, name: let go of a persistent mesh */
  MN_MSG_LIST = 19,       /* controller -> agent: req: the persistent meshes kept here */
  MN_MSG_CALL = 20,       /* controller -> proc: seq, kernel, args */
  MN_MSG_RESULT = 21,     /* proc -> controller: seq, ok, value */
  MN_MSG_SESSION = 22,    /* controller -> agent/proc, first after WELCOME: session id, acked seq */
  MN_MSG_ACK = 24,        /* controller -> proc: highest seq whose RESULT arrived */
  MN_MSG_GOODBYE = 25,    /* controller -> agent: clean exit, stop my procs now */
  MN_MSG_LOG = 26,        /* agent -> controller: rank, stream (1 stdout, 2 stderr), text of whole lines */
  MN_MSG_STATUS = 27,     /* controller -> agent: req; answered by REPLY with the agent's procs and recent exits */
  MN_MSG_CANCEL = 28,     /* controller -> proc: [seq, ...]: stop these calls (queued: skip; running: cancel flag) */
} mn_msg_t;

/* The name of a type ("CALL"), or NULL for a number that is not one. */
const char *mn_msg_name(int type);
/* Calls fn for every message type in numeric order (exports to Lua). */
void mn_msg_each(void (*fn)(void *data, int type, const char *name), void *data);

#endif
