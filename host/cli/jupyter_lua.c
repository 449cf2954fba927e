/*
 * jupyter_lua.c - the Jupyter kernel's wire: the `monarch.jupyter_wire` module.
 *
 * The five sockets of a Jupyter kernel (libzmq), the messages' multipart
 * framing and their HMAC-SHA256 signatures (OpenSSL's libcrypto: its SHA-256
 * uses the CPU's SHA instructions, 6x faster than libsodium's portable one,
 * which was most of a message's cost; a cell signs six). JSON stays in Lua
 * (lua-cjson, lua/monarch/jupyter.lua): frames come and go as strings.
 *
 * The heartbeat is an echo that runs in a thread of its own (zmq_proxy
 * from the REP socket to itself), so the front end sees the kernel alive
 * even while a cell runs Lua for long. The other sockets are read by the
 * Lua state's thread only. Their ZMQ_FDs are watched by the controller's
 * libuv loop (uv_poll), so a message wakes the same waits the cluster
 * does: between cells the loop keeps turning (heartbeats to the hosts,
 * failures, on_host_loss), and an interrupt_request reaches a cell that
 * waits for a call. A ZMQ_FD is edge-triggered: the poll callback reads
 * ZMQ_EVENTS (which rearms it), and Lua reads each socket until it is empty
 * before the loop sleeps again.
 *
 *   local k = wire.open(connection_info)   -- the table of the connection file
 *   k:recv("shell") -> nil (nothing waiting) | idents, header, parent, metadata, content, signed_ok, signature
 *   k:send("iopub", idents|nil, header, parent, metadata, content)
 *   k:watch()       -- on the controller's loop, once it exists (true when watched)
 *   k:wait(ms)      -- without a controller: zmq_poll on shell and control
 *   k:close()
 *   wire.interrupt() -- as SIGINT does (core.catch_interrupts' flag)
 */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include <zmq.h>

#define MN_JW_KERNEL "monarch.jupyter_wire.kernel" /* registry name of the metatable */
#define MN_JW_MAX_PARTS 64                         /* most frames of one message (identities and buffers) */
#define MN_JW_MAX_KEY 1024                         /* longest signing key, bytes */
#define MN_JW_MAX_ENDPOINT 512                     /* longest "tcp://ip:port" */
#define MN_JW_LINGER_MS 1000                       /* how long close waits to deliver the last messages */
#define MN_JW_DELIM "<IDS|MSG>"

uv_loop_t *mn_lua_loop(lua_State *L, void (*fn)(void *data), void *data); /* core_lua.c */

enum { CH_SHELL, CH_CONTROL, CH_STDIN, CH_IOPUB, CH_HB, CH_COUNT };
static const char *const channel_names[] = {"shell", "control", "stdin", "iopub", "hb", NULL};
static const char *const port_fields[] = {"shell_port", "control_port", "stdin_port", "iopub_port", "hb_port"};

typedef struct {
  void *ctx;
  void *sock[CH_COUNT];
  pthread_t hb_thread;
  int hb_running;
  unsigned char key[MN_JW_MAX_KEY];
  size_t keylen; /* 0: messages are not signed */
  EVP_MAC_CTX *mac; /* HMAC-SHA256 keyed with key, reinitialised per message; NULL when unsigned */
  uv_loop_t *watched; /* the loop the polls are on, NULL when none */
  uv_poll_t poll[2];  /* shell and control */
  int closed;
} kernel_t;

static kernel_t *check_kernel(lua_State *L) {
  kernel_t *k = luaL_checkudata(L, 1, MN_JW_KERNEL);
  if (k->closed) luaL_error(L, "the Jupyter kernel's sockets are closed");
  return k;
}

/* ---- signing -------------------------------------------------------------------- */

/* Hex HMAC-SHA256 of the parts into hex[65] (an empty string when there is no key, or libcrypto failed). */
static void sign(const kernel_t *k, const char *const *parts, const size_t *lens, int n, char hex[65]) {
  hex[0] = '\0';
  if (k->mac == NULL) return;
  unsigned char mac[32];
  size_t maclen = 0;
  int ok = EVP_MAC_init(k->mac, NULL, 0, NULL); /* the key given at open */
  for (int i = 0; i < n && ok; i++) ok = EVP_MAC_update(k->mac, (const unsigned char *)parts[i], lens[i]);
  if (!ok || !EVP_MAC_final(k->mac, mac, &maclen, sizeof(mac)) || maclen != sizeof(mac)) return;
  sodium_bin2hex(hex, 65, mac, sizeof(mac));
}

/* Keys k->mac with k->key; 0, or -1 when libcrypto has no HMAC-SHA256. */
static int key_mac(kernel_t *k) {
  EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  if (hmac == NULL) return -1;
  k->mac = EVP_MAC_CTX_new(hmac);
  EVP_MAC_free(hmac); /* the context holds its own reference */
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  return k->mac != NULL && EVP_MAC_init(k->mac, k->key, k->keylen, params) ? 0 : -1;
}

/* ---- opening -------------------------------------------------------------------- */

/* The heartbeat: echoes every ping until the context shuts down. */
static void *hb_main(void *arg) {
  void *hb = arg; /* this thread's own from here: close_sockets does not touch it */
  zmq_proxy(hb, hb, NULL); /* returns at zmq_ctx_shutdown (ETERM) */
  int linger = 0;
  zmq_setsockopt(hb, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_close(hb);
  return NULL;
}

/* String field name of the table at idx (def when absent; its length in *len); raises when it is not a string. */
static const char *opt_field(lua_State *L, int idx, const char *name, const char *def, size_t *len) {
  lua_getfield(L, idx, name);
  const char *s = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "connection file: '%s' must be a string", name);
    s = lua_tolstring(L, -1, len);
  } else if (len) {
    *len = def ? strlen(def) : 0;
  }
  lua_pop(L, 1); /* the string stays alive: the table holds it */
  return s;
}

/* Makes and binds socket ch; raises with the endpoint and libzmq's reason. */
static void bind_channel(lua_State *L, kernel_t *k, int ch, const char *transport, const char *ip) {
  static const int types[] = {ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_PUB, ZMQ_REP};
  lua_getfield(L, 1, port_fields[ch]);
  if (!lua_isnumber(L, -1)) luaL_error(L, "connection file: '%s' must be a port number", port_fields[ch]);
  int port = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  char ep[MN_JW_MAX_ENDPOINT];
  if (strcmp(transport, "ipc") == 0) snprintf(ep, sizeof(ep), "ipc://%s-%d", ip, port);
  else snprintf(ep, sizeof(ep), "%s://%s:%d", transport, ip, port);
  k->sock[ch] = zmq_socket(k->ctx, types[ch]);
  if (k->sock[ch] == NULL) luaL_error(L, "cannot make the %s socket: %s", channel_names[ch], zmq_strerror(errno));
  int linger = MN_JW_LINGER_MS;
  zmq_setsockopt(k->sock[ch], ZMQ_LINGER, &linger, sizeof(linger));
  if (ch == CH_IOPUB) { /* a cell that prints fast must not lose lines to the default high-water mark */
    int hwm = 0;
    zmq_setsockopt(k->sock[ch], ZMQ_SNDHWM, &hwm, sizeof(hwm));
  }
  if (zmq_bind(k->sock[ch], ep) != 0)
    luaL_error(L, "cannot listen on %s (%s channel): %s", ep, channel_names[ch], zmq_strerror(errno));
}

static void close_sockets(kernel_t *k);

/* wire.open(info) -> kernel; raises with a one-line reason for a bad connection table or a port in use. */
static int l_open(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  size_t keylen = 0;
  const char *transport = opt_field(L, 1, "transport", "tcp", NULL);
  const char *ip = opt_field(L, 1, "ip", "127.0.0.1", NULL);
  const char *key = opt_field(L, 1, "key", "", &keylen);
  const char *scheme = opt_field(L, 1, "signature_scheme", "hmac-sha256", NULL);
  if (strcmp(transport, "tcp") != 0 && strcmp(transport, "ipc") != 0)
    return luaL_error(L, "connection file: transport '%s' is not tcp or ipc", transport);
  if (keylen > 0 && strcmp(scheme, "hmac-sha256") != 0)
    return luaL_error(L, "connection file: signature_scheme '%s' is not hmac-sha256", scheme);
  if (keylen > MN_JW_MAX_KEY) return luaL_error(L, "connection file: key longer than %d bytes", MN_JW_MAX_KEY);
  if (sodium_init() < 0) return luaL_error(L, "libsodium cannot start");
  kernel_t *k = lua_newuserdata(L, sizeof(*k));
  memset(k, 0, sizeof(*k));
  memcpy(k->key, key, keylen);
  k->keylen = keylen;
  luaL_getmetatable(L, MN_JW_KERNEL);
  lua_setmetatable(L, -2); /* from here a raise leaves k to __gc, which closes what was opened */
  if (keylen > 0 && key_mac(k) != 0) return luaL_error(L, "libcrypto has no HMAC-SHA256");
  k->ctx = zmq_ctx_new();
  if (k->ctx == NULL) return luaL_error(L, "cannot start libzmq: %s", zmq_strerror(errno));
  for (int ch = 0; ch < CH_COUNT; ch++) bind_channel(L, k, ch, transport, ip);
  if (pthread_create(&k->hb_thread, NULL, hb_main, k->sock[CH_HB]) != 0) return luaL_error(L, "cannot start the heartbeat");
  k->hb_running = 1;
  return 1;
}

/* ---- receiving ------------------------------------------------------------------ */

static int check_channel(lua_State *L, int idx) { return luaL_checkoption(L, idx, NULL, channel_names); }

/* Pushes a frame as a string. */
static void push_part(lua_State *L, zmq_msg_t *m) { lua_pushlstring(L, zmq_msg_data(m), zmq_msg_size(m)); }

/*
 * Reads the frames of one message into parts (all of them, so the next read starts at the next message);
 * the count, 0 when none is waiting, or -1 with errno.
 */
static int read_parts(void *s, zmq_msg_t *parts, int *extra) {
  int n = 0, more = 1;
  *extra = 0;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      int e = errno;
      zmq_msg_close(&m);
      if (n == 0 && e == EAGAIN) return 0;
      errno = e;
      return -1;
    }
    more = zmq_msg_more(&m);
    if (n < MN_JW_MAX_PARTS) parts[n++] = m;
    else {
      zmq_msg_close(&m); /* past the limit: dropped, and the message is refused below */
      *extra = 1;
    }
  }
  return n;
}

/* k:recv(channel) -> nil | idents, header, parent, metadata, content, signature_ok, signature (its hex, as
 * sent: the kernel refuses one it saw before); nil, why for a malformed one */
static int l_recv(lua_State *L) {
  kernel_t *k = check_kernel(L);
  int ch = check_channel(L, 2);
  zmq_msg_t parts[MN_JW_MAX_PARTS];
  int extra, n = read_parts(k->sock[ch], parts, &extra);
  if (n < 0) return luaL_error(L, "cannot read the %s channel: %s", channel_names[ch], zmq_strerror(errno));
  if (n == 0) return 0;
  int d = 0;
  while (d < n && !(zmq_msg_size(&parts[d]) == strlen(MN_JW_DELIM) &&
                    memcmp(zmq_msg_data(&parts[d]), MN_JW_DELIM, strlen(MN_JW_DELIM)) == 0))
    d++;
  int nres;
  if (extra || d + 6 > n) { /* the delimiter, the signature and four JSON frames */
    lua_pushnil(L);
    lua_pushfstring(L, "a message on the %s channel without its %s frames", channel_names[ch], MN_JW_DELIM);
    nres = 2;
  } else {
    lua_createtable(L, d, 0);
    for (int i = 0; i < d; i++) {
      push_part(L, &parts[i]);
      lua_rawseti(L, -2, i + 1);
    }
    const char *body[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
      body[i] = zmq_msg_data(&parts[d + 2 + i]);
      lens[i] = zmq_msg_size(&parts[d + 2 + i]);
      lua_pushlstring(L, body[i], lens[i]);
    }
    char hex[65];
    sign(k, body, lens, 4, hex);
    size_t sl = zmq_msg_size(&parts[d + 1]);
    int ok = sl == strlen(hex) && (sl == 0 || sodium_memcmp(zmq_msg_data(&parts[d + 1]), hex, sl) == 0);
    lua_pushboolean(L, ok);
    push_part(L, &parts[d + 1]);
    nres = 7;
  }
  for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
  return nres;
}

/* ---- sending -------------------------------------------------------------------- */

static int send_frame(void *s, const char *p, size_t n, int more) {
  return zmq_send(s, p, n, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

/* k:send(channel, idents|nil, header, parent, metadata, content) -> true, or nil and libzmq's reason */
static int l_send(lua_State *L) {
  kernel_t *k = check_kernel(L);
  int ch = check_channel(L, 2);
  const char *body[4];
  size_t lens[4];
  for (int i = 0; i < 4; i++) body[i] = luaL_checklstring(L, 4 + i, &lens[i]);
  if (!lua_isnil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  char hex[65];
  sign(k, body, lens, 4, hex);
  void *s = k->sock[ch];
  int bad = 0;
  int nid = lua_isnil(L, 3) ? 0 : (int)lua_objlen(L, 3);
  for (int i = 1; i <= nid && !bad; i++) {
    lua_rawgeti(L, 3, i);
    size_t il;
    const char *id = lua_tolstring(L, -1, &il);
    bad = id == NULL || send_frame(s, id, il, 1) != 0;
    lua_pop(L, 1);
  }
  bad = bad || send_frame(s, MN_JW_DELIM, strlen(MN_JW_DELIM), 1) != 0 || send_frame(s, hex, strlen(hex), 1) != 0;
  for (int i = 0; i < 4 && !bad; i++) bad = send_frame(s, body[i], lens[i], i < 3) != 0;
  if (!bad) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushnil(L);
  lua_pushfstring(L, "cannot send on the %s channel: %s", channel_names[ch], zmq_strerror(errno));
  return 2;
}

/* ---- waiting -------------------------------------------------------------------- */

/* A socket's fd woke the loop: ZMQ_EVENTS takes the edge (the fd is quiet until new traffic); Lua reads. */
static void on_poll(uv_poll_t *p, int status, int events) {
  void *s = p->data;
  int ev;
  size_t len = sizeof(ev);
  if (zmq_getsockopt(s, ZMQ_EVENTS, &ev, &len) != 0) {
    /* the socket is closing: nothing to take */
  }
}

/* The controller's loop is closing (core.shutdown): the polls close with it. */
static void unwatch(void *data) {
  kernel_t *k = data;
  if (k->watched == NULL) return;
  for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&k->poll[i], NULL);
  k->watched = NULL;
}

/* k:watch() -> true when the shell and control sockets wake the controller's loop (false: no loop yet) */
static int l_watch(lua_State *L) {
  kernel_t *k = check_kernel(L);
  uv_loop_t *loop = mn_lua_loop(L, unwatch, k);
  if (loop != NULL && loop != k->watched) {
    for (int i = 0; i < 2; i++) {
      int fd;
      size_t len = sizeof(fd);
      void *s = k->sock[i == 0 ? CH_SHELL : CH_CONTROL];
      if (zmq_getsockopt(s, ZMQ_FD, &fd, &len) != 0) return luaL_error(L, "ZMQ_FD: %s", zmq_strerror(errno));
      int rc = uv_poll_init(loop, &k->poll[i], fd);
      if (rc != 0) return luaL_error(L, "cannot watch the Jupyter sockets: %s", uv_strerror(rc));
      k->poll[i].data = s;
      uv_poll_start(&k->poll[i], UV_READABLE, on_poll);
    }
    k->watched = loop;
  }
  lua_pushboolean(L, loop != NULL);
  return 1;
}

/* k:wait(ms): waits for shell or control without the controller's loop (before it starts or after it ends). */
static int l_wait(lua_State *L) {
  kernel_t *k = check_kernel(L);
  long ms = (long)luaL_checkinteger(L, 2);
  zmq_pollitem_t items[2] = {{k->sock[CH_SHELL], 0, ZMQ_POLLIN, 0}, {k->sock[CH_CONTROL], 0, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, 2, ms) < 0 && errno != EINTR) return luaL_error(L, "zmq_poll: %s", zmq_strerror(errno));
  return 0;
}

/* wire.interrupt(): the flag a Ctrl-C sets, for an interrupt_request (the handler of core.catch_interrupts). */
static int l_interrupt(lua_State *L) {
  if (raise(SIGINT) != 0) return luaL_error(L, "cannot raise SIGINT");
  return 0;
}

/* ---- closing -------------------------------------------------------------------- */

static void close_sockets(kernel_t *k) {
  if (k->watched != NULL) {
    for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&k->poll[i], NULL);
    k->watched = NULL;
  }
  for (int ch = 0; ch < CH_COUNT; ch++) {
    if (k->sock[ch] != NULL && !(ch == CH_HB && k->hb_running)) zmq_close(k->sock[ch]);
    k->sock[ch] = NULL;
  }
  if (k->ctx != NULL) {
    zmq_ctx_shutdown(k->ctx); /* the heartbeat's proxy returns */
    if (k->hb_running) pthread_join(k->hb_thread, NULL);
    k->hb_running = 0;
    zmq_ctx_term(k->ctx); /* waits up to the linger for what iopub still has to send */
    k->ctx = NULL;
  }
}

static int l_close(lua_State *L) {
  kernel_t *k = luaL_checkudata(L, 1, MN_JW_KERNEL);
  if (k->closed) return 0;
  k->closed = 1;
  if (k->watched != NULL) mn_lua_loop(L, NULL, NULL); /* the loop has no polls of ours left to close */
  close_sockets(k);
  EVP_MAC_CTX_free(k->mac); /* frees its copy of the key too */
  k->mac = NULL;
  sodium_memzero(k->key, sizeof(k->key));
  return 0;
}

int luaopen_monarch_jupyter_wire(lua_State *L) {
  static const luaL_Reg methods[] = {{"recv", l_recv}, {"send", l_send},   {"watch", l_watch},
                                     {"wait", l_wait}, {"close", l_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, MN_JW_KERNEL)) {
    lua_newtable(L);
    luaL_register(L, NULL, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, l_open);
  lua_setfield(L, -2, "open");
  lua_pushcfunction(L, l_interrupt);
  lua_setfield(L, -2, "interrupt");
  return 1;
}
