/* ctl_int.h - what ctl.c and ctl_agent.c share, and nothing else sees. */
#ifndef MN_CTL_INT_H
#define MN_CTL_INT_H

#include "ctl.h"

/* Queues an event for the Lua face; 0 or MN_ENOMEM. */
int mn__ctl_push_event(mn_ctl_t *c, mn_ev_kind_t k, int conn, int64_t a, int64_t b);
/* A timer callback that does nothing: its firing only ends a uv_run(UV_RUN_ONCE). */
void mn__ctl_on_timer(uv_timer_t *t);

#endif
