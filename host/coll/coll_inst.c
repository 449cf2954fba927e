/* coll_inst.c - the process's one instance, and watch groups over it (collective.h). */
#include "coll_int.h"

static mn_coll_t *proc_coll; /* opened once by mn_coll_instance_open */

int mn_coll_instance_open(const char *bind_host, const mn_auth_t *auth, int rank, char *err, size_t errlen) {
  return mn_coll_open(&proc_coll, bind_host, auth, rank, err, errlen);
}

mn_coll_t *mn_coll_instance(void) { return proc_coll; }

int mn_coll_watch(uint64_t gid, const char *what, char *err, size_t errlen) {
  group_t *g = proc_coll != NULL ? mn__coll_group_find(proc_coll, gid) : NULL;
  return g == NULL ? 0 : mn__coll_group_peer_check(g, what, err, errlen);
}

void mn_coll_watch_free(uint64_t gid) {
  if (proc_coll != NULL) mn_coll_group_free(proc_coll, gid);
}
