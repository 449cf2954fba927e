/*
 * ctl_agent.c - the embedded local host agent: with no hosts given, the
 * controller starts `monarch-worker --once` as its child and reads the port
 * it reports on fd 3 (see ctl.h, mn_ctl_start_agent).
 */
#include "ctl.h"
#include "ctl_int.h"

#include "clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void on_agent_exit(uv_process_t *p, int64_t status, int sig) {
  mn_ctl_t *c = p->data;
  c->agent_running = 0;
  if (!c->closing) mn__ctl_push_event(c, MN_EV_AGENT_EXIT, 0, status, sig);
}

static void agent_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  mn_ctl_t *c = h->data;
  (void)hint;
  *buf = uv_buf_init(c->agent_buf + c->agent_blen, (unsigned)(sizeof(c->agent_buf) - 1 - c->agent_blen));
}

static void agent_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  mn_ctl_t *c = s->data;
  (void)buf;
  if (n > 0) c->agent_blen += (size_t)n;
  c->agent_buf[c->agent_blen] = '\0';
  if (n < 0 || strchr(c->agent_buf, '\n') != NULL || c->agent_blen >= sizeof(c->agent_buf) - 1) {
    c->agent_port = atoi(c->agent_buf) > 0 ? atoi(c->agent_buf) : -1;
    uv_read_stop(s);
  }
}

int mn_ctl_start_agent(mn_ctl_t *c, const char *exe, const char *token, char *err, size_t errlen) {
  char parent[16], envtok[MN_MAX_TOKEN + 32];
  extern char **environ;
  snprintf(parent, sizeof(parent), "%d", (int)getpid());
  snprintf(envtok, sizeof(envtok), "MONARCH_TOKEN=%s", token);
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 2, sizeof(char *));
  if (env == NULL) {
    snprintf(err, errlen, "out of memory starting the local host agent");
    return MN_ENOMEM;
  }
  size_t j = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "MONARCH_TOKEN", 13) != 0) env[j++] = environ[i];
  env[j++] = envtok;
  /* --orphan-timeout 0: its procs die with it (PDEATHSIG), never of a quiet controller. */
  char *args[] = {(char *)exe, "--listen", "127.0.0.1:0", "--once", "--parent", parent, "--port-fd", "3",
                  "--orphan-timeout", "0", NULL};
  uv_pipe_init(&c->loop, &c->agent_pipe, 0);
  c->agent_pipe.data = c;
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 1;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[3].data.stream = (uv_stream_t *)&c->agent_pipe;
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.file = exe;
  po.args = args;
  po.env = env;
  po.exit_cb = on_agent_exit;
  /* Its own process group: a Ctrl-C at the terminal (which the REPL turns into
   * "stop waiting") must not reach the agent and its procs. It still dies with us (--parent). */
  po.flags = UV_PROCESS_DETACHED;
  po.stdio = stdio;
  po.stdio_count = 4;
  c->agent.data = c;
  int rc = uv_spawn(&c->loop, &c->agent, &po);
  free(env);
  if (rc != 0) {
    snprintf(err, errlen, "cannot start host agent %s: %s", exe, uv_strerror(rc));
    return rc; /* libuv's codes are -errno */
  }
  c->agent_running = 1;
  c->agent_port = 0;
  uv_read_start((uv_stream_t *)&c->agent_pipe, agent_alloc, agent_read);
  int64_t deadline = mn_now_ms() + 10000;
  while (c->agent_port == 0 && c->agent_running && mn_now_ms() < deadline) {
    uv_timer_start(&c->timer, mn__ctl_on_timer, 100, 0);
    uv_run(&c->loop, UV_RUN_ONCE);
  }
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->agent_pipe, NULL);
  if (c->agent_port <= 0) {
    snprintf(err, errlen, "host agent %s did not start (%s)", exe,
             c->agent_running ? "no port reported in 10 s" : "it exited");
    return c->agent_running ? MN_ETIMEDOUT : MN_EPEER;
  }
  return c->agent_port;
}
