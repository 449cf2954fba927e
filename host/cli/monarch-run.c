/*
 * monarch-run: the controller. Runs one Lua script (or -e code) in LuaJIT
 * with the monarch library; argument parsing and main() only.
 */
#include "path.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luajit.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int luaopen_monarch_core(lua_State *L);

static const char usage[] =
    "usage: monarch-run [options] [script.lua [args...]]\n"
    "\n"
    "Runs a Monarch controller script. With no --hosts, a host agent is started\n"
    "on this machine and procs are spawned there.\n"
    "\n"
    "  -e CODE            run CODE (after any script given before it is not run)\n"
    "  -l NAME            require library NAME before the script\n"
    "  --hosts H:P,...    connect to running host agents (needs MONARCH_TOKEN\n"
    "                     or MONARCH_TOKEN_FILE)\n"
    "  -i                 interactive REPL (not built yet: see docs)\n"
    "  -v, --version      print the version\n"
    "  -h, --help         this text\n"
    "\n"
    "The script's arguments are in the global table `arg` (arg[0] is the script).\n";

/* Adds a traceback to errors, keeping structured error objects intact. */
static int msgh(lua_State *L) {
  if (lua_type(L, 1) == LUA_TTABLE && luaL_callmeta(L, 1, "__tostring")) {
    /* stack: err, str */
  } else if (lua_type(L, 1) != LUA_TSTRING) {
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  } else {
    lua_pushvalue(L, 1);
  }
  lua_getglobal(L, "debug");
  lua_getfield(L, -1, "traceback");
  lua_pushvalue(L, -3);
  lua_pushinteger(L, 2);
  lua_call(L, 2, 1);
  return 1;
}

static int report(lua_State *L, int status) {
  if (status != 0) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "monarch-run: %s\n", msg ? msg : "(no message)");
    lua_pop(L, 1);
  }
  return status;
}

static int run_chunk(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  return report(L, status);
}

/* Calls monarch.shutdown() if the library was loaded: waits for tasks, stops procs. */
static int shutdown(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_getfield(L, -1, "monarch");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 3);
    return 0;
  }
  lua_getfield(L, -1, "shutdown");
  lua_remove(L, -2);
  lua_remove(L, -2);
  lua_remove(L, -2);
  return run_chunk(L, 0);
}

static void set_paths(lua_State *L, const char *prefix) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/share/monarch/lua/?.lua;%s/share/monarch/lua/?/init.lua;%s", prefix, prefix,
                  lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 1);
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_monarch_core);
  lua_setfield(L, -2, "monarch.core");
  lua_pop(L, 2);
}

/* Sets monarch.config.hosts from a comma-separated list, through package.loaded. */
static void set_hosts(lua_State *L, const char *hosts) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "monarch");
  if (run_chunk(L, 1) != 0) exit(1);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_getfield(L, -1, "monarch");
  lua_getfield(L, -1, "config");
  lua_newtable(L);
  int n = 0;
  const char *p = hosts;
  while (*p) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (len > 0) {
      lua_pushlstring(L, p, len);
      lua_rawseti(L, -2, ++n);
    }
    p += len + (c ? 1 : 0);
  }
  lua_setfield(L, -2, "hosts");
  lua_pop(L, 4);
}

int main(int argc, char **argv) {
  static char prefix[PATH_MAX];
  const char *code = NULL, *hosts = NULL, *script = NULL;
  const char *libs[32];
  int nlibs = 0, script_at = argc, interactive = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
      printf("monarch-run 0.1.0 (%s)\n", LUAJIT_VERSION);
      return 0;
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0 || strcmp(a, "--hosts") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "monarch-run: %s needs an argument\n", a);
        return 2;
      }
      if (a[1] == 'e') code = argv[++i];
      else if (a[1] == 'l') {
        if (nlibs == 32) return 2;
        libs[nlibs++] = argv[++i];
      } else hosts = argv[++i];
    } else if (strcmp(a, "-i") == 0) {
      interactive = 1;
    } else if (strcmp(a, "--") == 0) {
      script_at = i + 1;
      break;
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "monarch-run: unknown option '%s' (see --help)\n", a);
      return 2;
    } else {
      script_at = i;
      break;
    }
  }
  if (script_at < argc) script = argv[script_at];
  if (interactive) {
    fprintf(stderr, "monarch-run: the interactive REPL (-i) is not built yet\n");
    return 2;
  }
  if (script == NULL && code == NULL) {
    fputs(usage, stderr);
    return 2;
  }
  if (mn_prefix((const void *)main, prefix, sizeof(prefix)) != 0) {
    fprintf(stderr, "monarch-run: cannot find my own install prefix\n");
    return 2;
  }
  lua_State *L = luaL_newstate();
  if (L == NULL) return 1;
  luaL_openlibs(L);
  set_paths(L, prefix);
  if (hosts != NULL) set_hosts(L, hosts);

  /* arg: arg[0] is the script, arg[1..] its arguments, arg[-k] what came before. */
  lua_createtable(L, argc, 2);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - (script ? script_at : argc - 1));
  }
  lua_setglobal(L, "arg");

  int status = 0;
  for (int i = 0; i < nlibs && status == 0; i++) {
    lua_getglobal(L, "require");
    lua_pushstring(L, libs[i]);
    status = run_chunk(L, 1);
  }
  if (status == 0 && code != NULL) {
    status = luaL_loadbuffer(L, code, strlen(code), "=(command line)");
    status = status ? report(L, status) : run_chunk(L, 0);
  }
  if (status == 0 && script != NULL) {
    status = luaL_loadfile(L, script);
    if (status != 0) {
      report(L, status);
    } else {
      int nargs = argc - script_at - 1;
      luaL_checkstack(L, nargs + 8, "too many arguments");
      for (int i = script_at + 1; i < argc; i++) lua_pushstring(L, argv[i]);
      status = run_chunk(L, nargs);
    }
  }
  /* Always stop the cluster this script started, even after an error. */
  if (shutdown(L) != 0) status = 1;
  lua_close(L);
  return status == 0 ? 0 : 1;
}
