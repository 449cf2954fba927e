/* monarch-worker: the host agent, or with --proc a proc. Argument parsing only. */
#include "agent.h"
#include "auth.h"
#include "path.h"
#include "proc.h"
#include "sock.h"
#include "version.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: monarch-worker [--listen HOST:PORT] [--join HOST:PORT] [--once] [--parent PID] [--port-fd FD] [--simulate [--hosts N]]\n"
    "                      [--ship-cache DIR] [--ship-cache-max BYTES] [--no-ship]\n"
    "       monarch-worker --blas-probe [CORETYPE [M N K [TA TB]]]\n"
    "       monarch-worker --proc --rank R --world W --bind HOST [--parent PID] [--port-fd FD] [--relay-fd FD] [--device D]\n"
    "\n"
    "Runs a Monarch host agent: it authenticates controllers with the cluster\n"
    "token (MONARCH_TOKEN, or the file in MONARCH_TOKEN_FILE) and spawns procs.\n"
    "  --listen HOST:PORT   address to listen on (default 127.0.0.1:0; a\n"
    "                       non-loopback address needs a token configured)\n"
    "  --join HOST:PORT     ask the controller listening for joins there (monarch-run\n"
    "                       --listen-joins) to take this host into its running job\n"
    "  --once               exit when the first controller disconnects\n"
    "  --orphan-timeout S   procs exit S seconds after losing their controller (default 10)\n"
    "  --simulate           a scale test, not for real work: procs are virtual, emulated inside\n"
    "                       the agent (no process each; SPAWNED with port 0), and answer only\n"
    "                       the built-in kernels noop, echo, rank and sleep (docs/operations.md)\n"
    "  --hosts N            with --simulate: N simulated host agents in this one process, on one\n"
    "                       event loop, each on its own port (one banner line each; with a\n"
    "                       --listen port P, ports P to P+N-1), so thousands fit on a machine\n"
    "  --ship-cache DIR     keep files the controller ships (kernel libraries, hosts:sync) in DIR\n"
    "                       (default ~/.cache/monarch/ship; must be ours, mode 700)\n"
    "  --ship-cache-max N   cap that cache at N bytes (suffix K, M or G; default 1G), least\n"
    "                       recently used files evicted first\n"
    "  --no-ship            refuse shipped files (docs/security.md)\n"
    "  --blas-probe         check and time sgemm under OpenBLAS core type CORETYPE (\"-\": its own\n"
    "                       choice), in this process, at our kernels' shapes (or M N K, TA TB 0|1):\n"
    "                       a line per shape and a summary (the agent and monarch-run run it)\n"
    "  --version            print the version\n";

/* Reads s, the value of option flag, into *out; 0, or MN_EINVAL (reported on stderr). */
static int parse_int(const char *s, const char *flag, int *out) {
  char *end;
  long v = strtol(s ? s : "", &end, 10);
  if (s == NULL || *end != '\0' || end == s || v < INT_MIN || v > INT_MAX) {
    fprintf(stderr, "monarch-worker: %s wants an integer, got '%s'\n", flag, s ? s : "");
    return MN_EINVAL;
  }
  *out = (int)v;
  return 0;
}

typedef struct {
  const char *cache;
  unsigned long long max;
  int off;
} ship_opts_t;

/* The shipping options (--ship-cache DIR, --ship-cache-max BYTES, --no-ship): the arguments they took (0: not
 * one of them), or -1 after a message on stderr. */
static int ship_option(const char *a, const char *v, ship_opts_t *o) {
  if (strcmp(a, "--no-ship") == 0) return o->off = 1;
  if (strcmp(a, "--ship-cache") == 0 && v != NULL && v[0] == '/') return o->cache = v, 2;
  if (strcmp(a, "--ship-cache") == 0) {
    fprintf(stderr, "monarch-worker: --ship-cache wants an absolute directory, got '%s'\n", v ? v : "");
    return -1;
  }
  if (strcmp(a, "--ship-cache-max") != 0) return 0;
  char *end;
  unsigned long long n = strtoull(v ? v : "", &end, 10);
  int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (v == NULL || end == v || n == 0 || (shift ? end[1] != '\0' : *end != '\0') || n > (1ull << 50) >> shift) {
    fprintf(stderr, "monarch-worker: --ship-cache-max wants a positive byte count (suffix K, M or G), got '%s'\n",
            v ? v : "");
    return -1;
  }
  o->max = n << shift;
  return 2;
}

int main(int argc, char **argv) {
  static char prefix[PATH_MAX], exe[PATH_MAX + 32], host[256] = "127.0.0.1";
  int proc = 0, rank = 0, world = 1, parent = 0, port_fd = -1, relay_fd = -1, port = 0, once = 0, device = -1,
      simulate = 0, group = 1;
  double orphan = 10.0;
  ship_opts_t ship = {NULL, 0, 0};
  const char *bind = "127.0.0.1", *join = NULL;
  if (argc >= 2 && strcmp(argv[1], "--blas-probe") == 0) return mn_blas_probe_main(argc - 2, argv + 2);
  /* Before any libsodium call (auth, ship hashes): it picks its fastest code for this CPU then. */
  if (mn_auth_global_init() != 0) {
    fprintf(stderr, "monarch-worker: libsodium cannot start\n");
    return 1;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int rc = 0, took = ship_option(a, v, &ship);
    if (took < 0) return 2;
    if (took > 0) i += took - 1;
    else if (strcmp(a, "--proc") == 0) proc = 1;
    else if (strcmp(a, "--once") == 0) once = 1;
    else if (strcmp(a, "--simulate") == 0) simulate = 1;
    else if (strcmp(a, "--hosts") == 0) rc = parse_int(v, a, &group), i++;
    else if (strcmp(a, "--rank") == 0) rc = parse_int(v, a, &rank), i++;
    else if (strcmp(a, "--world") == 0) rc = parse_int(v, a, &world), i++;
    else if (strcmp(a, "--parent") == 0) rc = parse_int(v, a, &parent), i++;
    else if (strcmp(a, "--port-fd") == 0) rc = parse_int(v, a, &port_fd), i++;
    else if (strcmp(a, "--relay-fd") == 0) rc = parse_int(v, a, &relay_fd), i++;
    else if (strcmp(a, "--device") == 0) rc = parse_int(v, a, &device), i++;
    else if (strcmp(a, "--bind") == 0 && v) bind = v, i++;
    else if (strcmp(a, "--join") == 0 && v) {
      char jh[256];
      int jp;
      if (mn_parse_addr(v, jh, sizeof(jh), &jp) != 0 || jp == 0 || jh[0] == '\0') {
        fprintf(stderr, "monarch-worker: --join wants the controller's join address HOST:PORT, got '%s'\n", v);
        return 2;
      }
      join = v, i++;
    }
    else if (strcmp(a, "--orphan-timeout") == 0 && v) orphan = atof(v), i++;
    else if (strcmp(a, "--listen") == 0 && v) {
      if (mn_parse_addr(v, host, sizeof(host), &port) != 0) {
        fprintf(stderr, "monarch-worker: --listen wants HOST:PORT, got '%s'\n", v);
        return 2;
      }
      i++;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("monarch-worker %s\n", MN_VERSION);
      return 0;
    } else {
      fprintf(stderr, "monarch-worker: unknown or incomplete option '%s'\n%s", a, usage);
      return 2;
    }
    if (rc != 0) return 2;
  }
  if (mn_prefix((const void *)main, prefix, sizeof(prefix)) != 0) {
    fprintf(stderr, "monarch-worker: cannot find my own install prefix\n");
    return 2;
  }
  if (proc) {
    mn_proc_opts_t o = {bind, rank, world, parent, port_fd, orphan, prefix, device, relay_fd};
    return mn_proc_main(&o);
  }
  snprintf(exe, sizeof(exe), "%s/bin/monarch-worker", prefix);
  if (simulate && proc) {
    fprintf(stderr, "monarch-worker: --simulate is for a host agent, not with --proc\n");
    return 2;
  }
  if (group != 1 && (!simulate || group < 1 || group > MN_MAX_GROUP || once || join)) {
    fprintf(stderr, "monarch-worker: --hosts N (1 to %d) is for simulated hosts: it needs --simulate, and neither"
            " --once nor --join; got --hosts %d\n", MN_MAX_GROUP, group);
    return 2;
  }
  mn_agent_opts_t o = {host, port, port_fd, parent, once, exe, orphan, join, simulate, group,
                       ship.cache, ship.max, ship.off};
  return mn_agent_main(&o);
}
