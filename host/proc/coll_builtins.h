/* coll_builtins.h - the proc's "__coll_" built-ins (coll_builtins.c). */
#ifndef MN_COLL_BUILTINS_H
#define MN_COLL_BUILTINS_H

#include "auth.h"

/*
 * Opens the process's collective instance on bind_host and registers the
 * "__coll_" built-ins. Called once by the proc after mn_exec_init. Returns
 * 0, or a negative code after printing why to stderr.
 */
int mn_coll_start(const char *bind_host, const mn_auth_t *auth, int rank);

#endif
