/* msg.c - names of the message types (msg.h). */
#include "msg.h"

#include <stddef.h>

static const struct {
  int type;
  const char *name;
} types[] = {
    {MN_MSG_HELLO, "HELLO"},
    {MN_MSG_AUTH, "AUTH"},
    {MN_MSG_WELCOME, "WELCOME"},
    {MN_MSG_ERROR, "ERROR"},
    {MN_MSG_PING, "PING"},
    {MN_MSG_PONG, "PONG"},
    {MN_MSG_SPAWN, "SPAWN"},
    {MN_MSG_SPAWNED, "SPAWNED"},
    {MN_MSG_SPAWN_FAILED, "SPAWN_FAILED"},
    {MN_MSG_PROC_EXIT, "PROC_EXIT"},
    {MN_MSG_KILL, "KILL"},
    {MN_MSG_PERSIST, "PERSIST"},
    {MN_MSG_ATTACH, "ATTACH"},
    {MN_MSG_REPLY, "REPLY"},
    {MN_MSG_DETACH, "DETACH"},
    {MN_MSG_LIST, "LIST"},
    {MN_MSG_CALL, "CALL"},
    {MN_MSG_RESULT, "RESULT"},
    {MN_MSG_SESSION, "SESSION"},
    {MN_MSG_ACK, "ACK"},
    {MN_MSG_GOODBYE, "GOODBYE"},
    {MN_MSG_LOG, "LOG"},
    {MN_MSG_STATUS, "STATUS"},
    {MN_MSG_CANCEL, "CANCEL"},
};

const char *mn_msg_name(int type) {
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (types[i].type == type) return types[i].name;
  return NULL;
}

void mn_msg_each(void (*fn)(void *data, int type, const char *name), void *data) {
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) fn(data, types[i].type, types[i].name);
}
