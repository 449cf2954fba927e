/* proc.h - the proc runtime: one process that runs kernels in order. */
#ifndef MN_PROC_H
#define MN_PROC_H

#include <sys/types.h>

typedef struct {
  const char *bind_host;   /* address to listen on */
  int rank;
  int world;
  pid_t parent;            /* exit if this process goes away (0: don't watch) */
  int port_fd;             /* write "port\n" here once listening (-1: stdout) */
  double orphan_timeout;   /* seconds without a controller before exiting */
  const char *prefix;      /* install prefix, for kernel libraries */
  int device;              /* GPU to pin this proc to (mn_gpu_pin), -1: a CPU proc */
  int relay_fd;            /* the agent's end of a socketpair for cast CALLs and their RESULTs (-1: none) */
} mn_proc_opts_t;

/* Runs until orphaned or killed; returns the process exit code. */
int mn_proc_main(const mn_proc_opts_t *o);

#endif
