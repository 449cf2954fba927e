/*
 * core_ship.c - monarch.core's face of shipping (lua/monarch/ship.lua): a
 * file's hash and ELF identity, SHIP_ASK to one agent, one chunk down the
 * tree (ctl_ship.c), what is still queued, the bytes counted, and a
 * directory's entries for hosts:sync.
 */
#include "core_lua_int.h"

#include "ship.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static mn_conn_t *agent_arg(lua_State *L, lctl_t *c, int i) {
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, i));
  if (k == NULL || mn_ctl_conn_kind(k) != MN_CONN_AGENT) luaL_argerror(L, i, "not a host agent's connection");
  return k;
}

static void hash_arg(lua_State *L, int i, uint8_t hash[MN_SHIP_HASH_LEN]) {
  size_t n;
  const char *hex = luaL_checklstring(L, i, &n);
  if (mn_ship_unhex(hex, n, hash) != 0) luaL_argerror(L, i, "want a hash of 64 hex digits");
}

/* core.ship_hash(bytes) -> hex of its BLAKE2b-256 */
int mn__core_ship_hash(lua_State *L) {
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  uint8_t h[MN_SHIP_HASH_LEN];
  char hex[MN_SHIP_HEX_LEN + 1];
  mn_ship_hash(p, n, h);
  mn_ship_hex(h, hex);
  lua_pushstring(L, hex);
  return 1;
}

/* core.ship_read(path) -> bytes, hex | nil, err: a file's bytes and hash, read once. Mapped, not read into a
 * growing buffer (what io.read("*a") does, at twice the cost of hashing it on this path's first read). */
static int read_failed(lua_State *L, const char *path, int e) {
  lua_pushnil(L);
  lua_pushfstring(L, "cannot read %s: %s", path, e == EISDIR ? "not a regular file" : strerror(e));
  return 2;
}

int mn__core_ship_read(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return read_failed(L, path, errno);
  struct stat st;
  int e = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EISDIR;
  size_t n = e == 0 ? (size_t)st.st_size : 0;
  void *p = n > 0 ? mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : NULL;
  if (p == MAP_FAILED) e = errno;
  close(fd);
  if (e != 0) return read_failed(L, path, e);
  uint8_t h[MN_SHIP_HASH_LEN];
  char hex[MN_SHIP_HEX_LEN + 1];
  mn_ship_hash(n > 0 ? p : "", n, h);
  mn_ship_hex(h, hex);
  lua_pushlstring(L, n > 0 ? p : "", n);
  if (n > 0) munmap(p, n);
  lua_pushstring(L, hex);
  return 2;
}

/* core.ship_elf(bytes) -> class, machine, type | nil (not ELF); core.ship_elf(nil, machine) -> its name */
int mn__core_ship_elf(lua_State *L) {
  char buf[32];
  if (lua_isnoneornil(L, 1)) {
    lua_pushstring(L, mn_elf_machine_name((int)luaL_checkinteger(L, 2), buf, sizeof(buf)));
    return 1;
  }
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  mn_elf_id_t id;
  if (mn_elf_identify(p, n, &id) != 0) return 0;
  lua_pushinteger(L, id.elf_class);
  lua_pushinteger(L, id.machine);
  lua_pushinteger(L, id.type);
  return 3;
}

/* core.ship_ask(agent, hex, size, path, place): SHIP_ASK; the answer comes as a SHIP_STATE message. */
int mn__core_ship_ask(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = agent_arg(L, c, 1);
  uint8_t h[MN_SHIP_HASH_LEN];
  hash_arg(L, 2, h);
  lua_Number size = luaL_checknumber(L, 3);
  const char *path = luaL_checkstring(L, 4), *place = luaL_optstring(L, 5, "");
  if (size < 0 || size > (lua_Number)MN_SHIP_MAX_SIZE) return luaL_argerror(L, 3, "want a size up to 64 GiB");
  mn_buf_t b;
  mn_buf_init(&b);
  int rc = mn_msg_pack_ship_ask(&b, h, (uint64_t)size, path, place);
  if (rc == 0) rc = mn_ctl_send(&c->ctl, k, b.data, b.len);
  mn_buf_free(&b);
  if (rc != 0) return luaL_error(L, "core.ship_ask: %s", mn_strerror(rc));
  return 0;
}

/* core.ship_send({agent, ...}, hex, size, offset, bytes, direct): the chunk of the file's bytes (all of them:
 * no copy of the chunk is made in Lua) at offset to those agents (ctl_ship.c). */
int mn__core_ship_send(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  uint8_t h[MN_SHIP_HASH_LEN];
  hash_arg(L, 2, h);
  uint64_t size = (uint64_t)luaL_checknumber(L, 3), off = (uint64_t)luaL_checknumber(L, 4);
  size_t all;
  const char *bytes = luaL_checklstring(L, 5, &all);
  int direct = lua_toboolean(L, 6), n = (int)lua_objlen(L, 1);
  if (all != size || off > size || (off == size && size > 0) || off % MN_SHIP_CHUNK != 0)
    return luaL_argerror(L, 4, "want the file's bytes (size of them) and a chunk's offset inside it");
  const char *chunk = bytes + off;
  size_t len = size - off < MN_SHIP_CHUNK ? (size_t)(size - off) : MN_SHIP_CHUNK;
  int *ids = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (ids == NULL) return luaL_error(L, "core.ship_send: out of memory");
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    ids[i] = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  (void)mn_ctl_tree_build(&c->ctl); /* a tree due for a rebuild is rebuilt first, as a cast would */
  int rc = mn_ctl_ship_data(&c->ctl, ids, n, h, size, off, chunk, len, direct);
  free(ids);
  if (rc != 0) return luaL_error(L, "core.ship_send: %s", mn_strerror(rc));
  return 0;
}

/* core.ship_stats() -> {bytes = file bytes this controller wrote, frames = SHIP_DATA frames, pending = bytes
 * still queued to the agents} */
int mn__core_ship_stats(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, (lua_Number)c->ctl.ship_bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushnumber(L, (lua_Number)c->ctl.ship_frames);
  lua_setfield(L, -2, "frames");
  lua_pushnumber(L, (lua_Number)mn_ctl_agents_pending(&c->ctl));
  lua_setfield(L, -2, "pending");
  return 1;
}

/* core.stat(path) -> size, mtime (ns), inode, device | nil: what tells the controller a file it hashed is unchanged */
int mn__core_stat(lua_State *L) {
  struct stat st;
  if (stat(luaL_checkstring(L, 1), &st) != 0) return 0;
  lua_pushnumber(L, (lua_Number)st.st_size);
  lua_pushnumber(L, (lua_Number)st.st_mtim.tv_sec * 1e9 + (lua_Number)st.st_mtim.tv_nsec);
  lua_pushnumber(L, (lua_Number)st.st_ino);
  lua_pushnumber(L, (lua_Number)st.st_dev);
  return 4;
}

/* core.listdir(path) -> {{name, "f" | "d" | "l" | "o"}, ...} | nil, err: a directory's entries (hosts:sync) */
int mn__core_listdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  DIR *d = opendir(path);
  if (d == NULL) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot list %s: %s", path, strerror(errno));
    return 2;
  }
  lua_newtable(L);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    lua_createtable(L, 2, 0);
    lua_pushstring(L, e->d_name);
    lua_rawseti(L, -2, 1);
    lua_pushstring(L, S_ISREG(st.st_mode) ? "f" : S_ISDIR(st.st_mode) ? "d" : S_ISLNK(st.st_mode) ? "l" : "o");
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, ++n);
  }
  closedir(d);
  return 1;
}
