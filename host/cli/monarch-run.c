/*
 * monarch-run: the controller. Runs one Lua script (or -e code) in LuaJIT
 * with the monarch library, or with -i an interactive REPL (lua/monarch/repl.lua);
 * argument parsing and main() only.
 */
#include "blas_choose.h"
#include "err.h"
#include "path.h"
#include "version.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luajit.h>
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_RUN_MAX_LIBS 32 /* most -l options */
#define MN_RUN_MAX_RAY 16  /* most --ray-NAME options */

int luaopen_monarch_core(lua_State *L);
int luaopen_monarch_lineedit(lua_State *L);
int luaopen_monarch_term(lua_State *L);
int luaopen_monarch_jupyter_wire(lua_State *L);

static const char usage[] =
    "usage: monarch-run [options] [script.lua [args...]]\n"
    "\n"
    "Runs a Monarch controller script. With no --hosts, a host agent is started\n"
    "on this machine and procs are spawned there.\n"
    "\n"
    "  -e CODE            run CODE (before the script, when both are given)\n"
    "  -l NAME            require library NAME before the script\n"
    "  -i                 interactive REPL, after the script if one is given\n"
    "                     (its globals and meshes stay; see docs/repl.md)\n"
    "  --hosts H:P,...    connect to running host agents (needs MONARCH_TOKEN\n"
    "                     or MONARCH_TOKEN_FILE)\n"
    "  --hostfile FILE    the same, one HOST:PORT per line (# starts a comment)\n"
    "  --listen-joins HOST:PORT\n"
    "                     let host agents join the running job: listen there for\n"
    "                     `monarch-worker --join` (also MONARCH_JOIN_ADDR)\n"
    "  --slurm            start host agents on the nodes of this Slurm allocation\n"
    "  --ray [ADDRESS]    start host agents on a Ray cluster (default: RAY_ADDRESS,\n"
    "                     then a local one), one per node; --ray-hosts N,\n"
    "                     --ray-cpus N, --ray-gpus N, --ray-timeout S, --ray-elastic\n"
    "                     (nodes added later join), --ray-max-hosts N; with\n"
    "                     --status or --top, the job running there (--ray-job NAME\n"
    "                     picks one of several; MONARCH_TOKEN is the job's)\n"
    "  --status           report on the cluster and exit\n"
  "  --top              a live full-screen view of the hosts of --hosts, --hostfile\n"
  "                     or --slurm, refreshed every second: each proc's state,\n"
  "                     calls/s, queue, running kernel, CPU, memory, recent\n"
  "                     failures; q or Ctrl-C quits (in the REPL: top())\n"
    "  --jupyter-kernel CONNECTION_FILE\n"
    "                     a Jupyter kernel: notebook cells run as REPL lines\n"
    "  --install-kernel [--user | --prefix P]\n"
    "                     write the kernelspec \"Monarch (Lua)\"; options before it\n"
    "                     are passed to the kernel (see docs/jupyter.md)\n"
    "  --quiet            drop what procs print on stdout (stderr still shows)\n"
    "  --log-level LEVEL  debug, info, warn or error (default info)\n"
    "  -v, --version      print the version\n"
    "  -h, --help         this text\n"
    "\n"
    "The script's arguments are in the global table `arg` (arg[0] is the script).\n";

typedef struct {
  const char *code, *hosts, *hostfile, *log_level, *listen_joins;
  const char *jupyter; /* --jupyter-kernel's connection file */
  int install_at;      /* argv index of --install-kernel, 0 if none */
  const char *libs[MN_RUN_MAX_LIBS];
  int nlibs;
  const char *ray_opts[2 * MN_RUN_MAX_RAY]; /* --ray-NAME VALUE pairs, NAME without the prefix */
  int nray;
  int script_at; /* argv index of the script, argc if none */
  int interactive, slurm, ray, status, top, quiet;
} opts_t;

/* Adds a traceback to errors, except to structured ones (a MonarchError: a lost host, a failed proc,
 * a timeout): those are expected failures, and their text already says what failed and where. */
static int msgh(lua_State *L) {
  if (lua_type(L, 1) == LUA_TTABLE && luaL_callmeta(L, 1, "__tostring")) {
    return 1; /* stack: err, str */
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

/* Calls the function below its nargs arguments; leaves nresults results (LUA_MULTRET: all). */
static int run_chunk_n(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return report(L, status);
}

static int run_chunk(lua_State *L, int nargs) { return run_chunk_n(L, nargs, 0); }

/* Pushes package.loaded[name][field] (nil if either is missing). */
static void push_loaded_field(lua_State *L, const char *name, const char *field) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_getfield(L, -1, name);
  if (lua_istable(L, -1)) lua_getfield(L, -1, field);
  else lua_pushnil(L);
  lua_replace(L, -4);
  lua_pop(L, 2);
}

/* Calls monarch.shutdown() if the library was loaded: waits for tasks, stops procs. */
static int shutdown(lua_State *L) {
  push_loaded_field(L, "monarch", "shutdown");
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 1);
    return 0;
  }
  return run_chunk(L, 0);
}

/* require(name), leaving its value on the stack; 0 or a Lua status (reported). */
static int require(lua_State *L, const char *name) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  return run_chunk_n(L, 1, 1);
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
  lua_pushcfunction(L, luaopen_monarch_lineedit);
  lua_setfield(L, -2, "monarch.lineedit");
  lua_pushcfunction(L, luaopen_monarch_term);
  lua_setfield(L, -2, "monarch.term");
  lua_pushcfunction(L, luaopen_monarch_jupyter_wire);
  lua_setfield(L, -2, "monarch.jupyter_wire");
  lua_pop(L, 2);
}

/* Appends the comma-separated addresses in list to the table on top; returns the new count (never fails). */
static int add_host_list(lua_State *L, const char *list, int n) {
  const char *p = list;
  while (*p) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (len > 0) {
      lua_pushlstring(L, p, len);
      lua_rawseti(L, -2, ++n);
    }
    p += len + (c ? 1 : 0);
  }
  return n;
}

/* HOST:PORT, with a numeric port and no blanks inside. */
static int is_host_port(const char *s, size_t n) {
  size_t colon = n;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ' || s[i] == '\t' || s[i] == ',') return 0;
    if (s[i] == ':') colon = i;
  }
  if (colon == 0 || colon + 1 >= n) return 0;
  for (size_t i = colon + 1; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

/*
 * Appends the hosts of a --hostfile to the table on top; returns the new
 * count (>= 0), or (reported on stderr) -errno from opening it or MN_EINVAL
 * for a line that is not HOST:PORT.
 */
static int add_hostfile(lua_State *L, const char *path, int n) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    int e = errno;
    fprintf(stderr, "monarch-run: cannot read --hostfile %s: %s\n", path, strerror(e));
    return -e;
  }
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0, bad = 0;
  while (!bad && getline(&line, &cap, f) >= 0) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash != NULL) *hash = '\0';
    char *s = line;
    while (*s == ' ' || *s == '\t') s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n' || s[len - 1] == '\r')) len--;
    if (len == 0) continue;
    if (!is_host_port(s, len)) {
      fprintf(stderr, "monarch-run: %s:%d: '%.*s' is not HOST:PORT\n", path, lineno, (int)len, s);
      bad = 1;
    } else {
      lua_pushlstring(L, s, len);
      lua_rawseti(L, -2, ++n);
    }
  }
  free(line);
  fclose(f);
  return bad ? MN_EINVAL : n;
}

/* Fills monarch.config from the options (which loads the library); 0, or an exit code. */
static int set_config(lua_State *L, const opts_t *o) {
  if (require(L, "monarch") != 0) return 1;
  lua_getfield(L, -1, "config");
  if (!lua_istable(L, -1)) {
    fprintf(stderr, "monarch-run: the monarch library has no config table\n");
    return 1;
  }
  if (o->hosts != NULL || o->hostfile != NULL) {
    lua_newtable(L);
    int n = o->hosts ? add_host_list(L, o->hosts, 0) : 0;
    if (o->hostfile != NULL && (n = add_hostfile(L, o->hostfile, n)) < 0) return 2;
    if (n == 0) {
      fprintf(stderr, "monarch-run: %s names no hosts\n", o->hostfile ? o->hostfile : "--hosts");
      return 2;
    }
    lua_setfield(L, -2, "hosts");
  }
  if (o->hostfile != NULL) { /* HostMesh:refresh reads it again */
    lua_pushstring(L, o->hostfile);
    lua_setfield(L, -2, "hostfile");
  }
  if (o->listen_joins != NULL) {
    lua_pushstring(L, o->listen_joins);
    lua_setfield(L, -2, "listen_joins");
  }
  if (o->slurm || o->ray) {
    lua_pushstring(L, o->slurm ? "slurm" : "ray");
    lua_setfield(L, -2, "launcher");
  }
  if (o->ray) { /* config.ray: {NAME = VALUE}, checked by monarch.launch_ray */
    lua_newtable(L);
    for (int i = 0; i + 1 < o->nray; i += 2) {
      lua_pushstring(L, o->ray_opts[i + 1]);
      lua_setfield(L, -2, o->ray_opts[i]);
    }
    lua_setfield(L, -2, "ray");
  }
  if (o->status || o->top) { /* under --ray, monarch.hosts() then finds the running job's agents */
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, o->status ? "status" : "top");
  }
  if (o->quiet) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "quiet");
  }
  if (o->log_level != NULL) {
    lua_pushstring(L, o->log_level);
    lua_setfield(L, -2, "log_level");
  }
  lua_pop(L, 2);
  return 0;
}

/* For parse_args: main is to return `code` at once. */
static int stop(int *status, int code) {
  *status = code;
  return 1;
}

/* Options that cannot go together (said on stderr): 1, else 0. */
static int conflicts(const opts_t *o, int argc) {
  if ((o->slurm || o->ray) && (o->hosts != NULL || o->hostfile != NULL || (o->slurm && o->ray))) {
    fprintf(stderr, "monarch-run: %s starts its own host agents; it cannot be combined with --hosts, --hostfile or %s\n",
            o->ray ? "--ray" : "--slurm", o->ray ? "--slurm" : "--ray");
    return 1;
  }
  if (o->top && (o->status || o->interactive || o->code != NULL || o->nlibs > 0 || o->script_at < argc)) {
    fprintf(stderr, "monarch-run: --top only watches the cluster: it takes no script, -e, -l, -i or --status "
                    "(from the REPL, call top())\n");
    return 1;
  }
  if (!o->jupyter || !(o->status || o->top || o->interactive || o->code || o->nlibs || o->script_at < argc)) return 0;
  fputs("monarch-run: --jupyter-kernel runs notebook cells: it takes no script, -e, -l, -i, --status or --top\n", stderr);
  return 1;
}

/* Whether s, after --ray, is its cluster address rather than the script: "auto", or HOST:PORT / ray://... */
static int is_ray_address(const char *s) {
  size_t n = strlen(s);
  if (s[0] == '-' || (n >= 4 && strcmp(s + n - 4, ".lua") == 0)) return 0;
  return strcmp(s, "auto") == 0 || strchr(s, ':') != NULL;
}

/*
 * --ray [ADDRESS], --ray=ADDRESS, --ray-elastic, --ray-NAME VALUE at argv[*i]: recorded in o (the
 * names are checked in Lua). Returns 0, or 2 (reported) for a missing value or too many options.
 */
static int parse_ray(int argc, char **argv, int *i, opts_t *o) {
  const char *a = argv[*i], *name = NULL, *value = NULL;
  o->ray = 1;
  if (strcmp(a, "--ray") == 0) {
    if (*i + 1 < argc && is_ray_address(argv[*i + 1])) name = "address", value = argv[++*i];
  } else if (strncmp(a, "--ray=", 6) == 0) {
    name = "address", value = a + 6;
  } else if (strcmp(a, "--ray-elastic") == 0) {
    name = "elastic", value = "true";
  } else if (*i + 1 < argc) {
    name = a + 6, value = argv[++*i];
  } else {
    fprintf(stderr, "monarch-run: %s needs an argument\n", a);
    return 2;
  }
  if (name == NULL) return 0;
  if (o->nray == 2 * MN_RUN_MAX_RAY) {
    fprintf(stderr, "monarch-run: more than %d --ray options\n", MN_RUN_MAX_RAY);
    return 2;
  }
  o->ray_opts[o->nray++] = name;
  o->ray_opts[o->nray++] = value;
  return 0;
}

/*
 * Parses argv into o. Returns 0 to go on, or 1 when main is to return
 * *status at once: 0 after --help or --version, 2 for a usage error.
 */
static int parse_args(int argc, char **argv, opts_t *o, int *status) {
  memset(o, 0, sizeof(*o));
  o->script_at = argc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int takes = strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0 || strcmp(a, "--hosts") == 0 || strcmp(a, "--hostfile") == 0 ||
                strcmp(a, "--log-level") == 0 || strcmp(a, "--listen-joins") == 0 || strcmp(a, "--jupyter-kernel") == 0;
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "monarch-run: %s needs an argument\n", a);
      return stop(status, 2);
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return stop(status, 0);
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
      printf("monarch-run %s (%s)\n", MN_VERSION, LUAJIT_VERSION);
      return stop(status, 0);
    } else if (strcmp(a, "-e") == 0) {
      o->code = argv[++i];
    } else if (strcmp(a, "-l") == 0) {
      if (o->nlibs == MN_RUN_MAX_LIBS) {
        fprintf(stderr, "monarch-run: more than %d -l options\n", MN_RUN_MAX_LIBS);
        return stop(status, 2);
      }
      o->libs[o->nlibs++] = argv[++i];
    } else if (strcmp(a, "--hosts") == 0) {
      o->hosts = argv[++i];
    } else if (strcmp(a, "--hostfile") == 0) {
      o->hostfile = argv[++i];
    } else if (strcmp(a, "--jupyter-kernel") == 0) {
      o->jupyter = argv[++i];
    } else if (strcmp(a, "--install-kernel") == 0) {
      o->install_at = i; /* the rest are its own options (monarch.jupyter.install) */
      return 0;
    } else if (strcmp(a, "--listen-joins") == 0) {
      o->listen_joins = argv[++i];
    } else if (strcmp(a, "--log-level") == 0) {
      o->log_level = argv[++i];
      if (strcmp(o->log_level, "debug") != 0 && strcmp(o->log_level, "info") != 0 &&
          strcmp(o->log_level, "warn") != 0 && strcmp(o->log_level, "error") != 0) {
        fprintf(stderr, "monarch-run: --log-level wants debug, info, warn or error, got '%s'\n", o->log_level);
        return stop(status, 2);
      }
    } else if (strcmp(a, "--slurm") == 0) {
      o->slurm = 1;
    } else if (strcmp(a, "--ray") == 0 || strncmp(a, "--ray=", 6) == 0 || strncmp(a, "--ray-", 6) == 0) {
      if (parse_ray(argc, argv, &i, o) != 0) return stop(status, 2);
    } else if (strcmp(a, "--status") == 0) {
      o->status = 1;
    } else if (strcmp(a, "--top") == 0) {
      o->top = 1;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = 1;
    } else if (strcmp(a, "-i") == 0) {
      o->interactive = 1;
    } else if (strcmp(a, "--") == 0) {
      o->script_at = i + 1;
      break;
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "monarch-run: unknown option '%s' (see --help)\n", a);
      return stop(status, 2);
    } else {
      o->script_at = i;
      break;
    }
  }
  if (conflicts(o, argc)) return stop(status, 2);
  if (o->script_at >= argc && o->code == NULL && !o->interactive && !o->status && !o->top && !o->jupyter) {
    fputs(usage, stderr);
    return stop(status, 2);
  }
  return 0;
}

/* --status: monarch.status() reports (the library is loaded by now). */
static int run_status(lua_State *L) {
  push_loaded_field(L, "monarch", "status");
  return run_chunk(L, 0) == 0 ? 0 : 1;
}

/* --top: monarch.top{retry = true} until q (the library is loaded by now). */
static int run_top(lua_State *L) {
  push_loaded_field(L, "monarch", "top");
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "retry");
  return run_chunk(L, 1) == 0 ? 0 : 1;
}

/* The script (if any) with its arguments; 0 or a Lua status (reported). */
static int run_script(lua_State *L, int argc, char **argv, int script_at) {
  int status = luaL_loadfile(L, argv[script_at]);
  if (status != 0) return report(L, status);
  int nargs = argc - script_at - 1;
  luaL_checkstack(L, nargs + 8, "too many arguments");
  for (int i = script_at + 1; i < argc; i++) lua_pushstring(L, argv[i]);
  return run_chunk(L, nargs);
}

/*
 * --jupyter-kernel FILE: monarch.jupyter.run(FILE); --install-kernel ARGS:
 * monarch.jupyter.install(ARGS, the options before it). The exit status.
 */
static int run_jupyter(lua_State *L, const opts_t *o, int argc, char **argv) {
  if (require(L, "monarch.jupyter") != 0) return 1;
  lua_getfield(L, -1, o->install_at ? "install" : "run");
  lua_remove(L, -2);
  if (o->install_at) {
    lua_createtable(L, argc - o->install_at, 0);
    for (int i = o->install_at + 1; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i - o->install_at);
    }
    lua_createtable(L, o->install_at, 0);
    for (int i = 1; i < o->install_at; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i);
    }
  } else {
    lua_pushstring(L, o->jupyter);
    lua_pushnil(L);
  }
  if (run_chunk_n(L, 2, 1) != 0) return 1;
  int code = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return code;
}

/* monarch.repl.run(): the REPL's own exit status (it shuts the cluster down itself). */
static int run_repl(lua_State *L) {
  push_loaded_field(L, "monarch.repl", "run");
  if (run_chunk_n(L, 0, 1) != 0) return 1;
  int code = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return code;
}

int main(int argc, char **argv) {
  static char prefix[PATH_MAX];
  opts_t o;
  int rc;
  if (parse_args(argc, argv, &o, &rc) != 0) return rc;
  const char *script = o.script_at < argc ? argv[o.script_at] : NULL;
  if (mn_prefix((const void *)main, prefix, sizeof(prefix)) != 0) {
    fprintf(stderr, "monarch-run: cannot find my own install prefix\n");
    return 2;
  }
  if (!o.status && !o.top) mn_blas_env_init(prefix); /* controller-side kernels: before OpenBLAS loads */
  /* Line editing decodes the terminal's characters in the user's locale (an unknown one stays "C"). */
  if (o.interactive) (void)setlocale(LC_CTYPE, "");
  lua_State *L = luaL_newstate();
  if (L == NULL) return 1;
  luaL_openlibs(L);
  set_paths(L, prefix);
  if (o.hosts || o.hostfile || o.slurm || o.ray || o.status || o.top || o.quiet || o.log_level || o.interactive ||
      o.listen_joins || o.jupyter) {
    if ((rc = set_config(L, &o)) != 0) {
      lua_close(L);
      return rc;
    }
  }

  /* arg: arg[0] is the script, arg[1..] its arguments, arg[-k] what came before. */
  lua_createtable(L, argc, 2);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - (script ? o.script_at : argc - 1));
  }
  lua_setglobal(L, "arg");

  int status = 0;
  if (o.jupyter || o.install_at) { /* the kernel shuts the cluster down itself */
    rc = run_jupyter(L, &o, argc, argv);
    lua_close(L);
    return rc;
  }
  if (o.status || o.top) {
    status = o.top ? run_top(L) : run_status(L);
    if (shutdown(L) != 0 && status == 0) status = 1;
    lua_close(L);
    return status;
  }
  /* The REPL is set up first, so a Ctrl-C in the script stops its wait, not the process. */
  if (o.interactive) {
    if (require(L, "monarch.repl") != 0) {
      lua_close(L);
      return 1;
    }
    lua_getfield(L, -1, "start");
    lua_remove(L, -2);
    if (run_chunk(L, 0) != 0) {
      lua_close(L);
      return 1;
    }
  }
  for (int i = 0; i < o.nlibs && (status == 0 || o.interactive); i++) {
    lua_getglobal(L, "require");
    lua_pushstring(L, o.libs[i]);
    status = run_chunk(L, 1);
  }
  if ((status == 0 || o.interactive) && o.code != NULL) {
    status = luaL_loadbuffer(L, o.code, strlen(o.code), "=(command line)");
    status = status ? report(L, status) : run_chunk(L, 0);
  }
  if ((status == 0 || o.interactive) && script != NULL) status = run_script(L, argc, argv, o.script_at);
  if (o.interactive) {
    /* Errors above were reported; the REPL starts anyway, with what the script left. */
    rc = run_repl(L);
    lua_close(L);
    return rc;
  }
  /* Always stop the cluster this script started, even after an error. */
  if (shutdown(L) != 0) status = 1;
  lua_close(L);
  return status == 0 ? 0 : 1;
}
