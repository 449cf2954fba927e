/* agent.h - the host agent: authenticates controllers, spawns and watches procs. */
#ifndef MN_AGENT_H
#define MN_AGENT_H

#include <sys/types.h>

#define MN_MAX_GROUP 4096 /* most simulated agents one process runs (--hosts); each holds a few sockets */

typedef struct {
  const char *listen_host;
  int listen_port;
  int port_fd;            /* write "port\n" here once listening; -1: print a banner */
  pid_t parent;           /* exit when this process dies (0: don't watch) */
  int once;               /* exit after the first controller leaves */
  const char *exe;        /* path of monarch-worker, exec'd for procs */
  double orphan_timeout;  /* passed to procs */
  const char *join;       /* a controller's join port, "HOST:PORT", to ask to dial us (NULL: wait to be dialled) */
  int simulate;           /* --simulate: procs are virtual, emulated inside the agent (agent_sim.c); a scale test */
  int group;              /* --hosts N with --simulate: N agents, each on its own port, share this process and
                           * its one event loop (a scale test's thousands of hosts); 0 or 1: one agent */
  const char *ship_cache; /* --ship-cache DIR: where shipped files are kept (NULL: ~/.cache/monarch/ship) */
  unsigned long long ship_max; /* --ship-cache-max BYTES: its cap (0: 1 GiB) */
  int no_ship;            /* --no-ship: refuse shipped files */
} mn_agent_opts_t;

/*
 * Runs the host agent until it is stopped. Returns the process's exit
 * status, not an err.h code: 0, 2 when it cannot start (or, with join,
 * when the controller refused it or could not be reached), 3 when its
 * parent is already gone.
 */
int mn_agent_main(const mn_agent_opts_t *o);

/*
 * `monarch-worker --blas-probe [CORETYPE [M N K]]` (blas_probe.c): argv
 * holds what follows the flag (CORETYPE "-" or "": OpenBLAS's own choice).
 * Prints one line "blas core=NAME ok=0|1 gflops=G m=M n=N k=K"; returns 0
 * when the product passed its check, 1 when not, 2 for bad arguments.
 */
int mn_blas_probe_main(int argc, char **argv);

#endif
