/* path.c - see path.h. */
#include "path.h"

#include "err.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void strip(char *p, int n) {
  for (int i = 0; i < n; i++) {
    char *s = strrchr(p, '/');
    if (s == NULL) return;
    *s = '\0';
  }
}

int mn_prefix(const void *self, char *out, size_t len) {
  Dl_info info;
  char real[PATH_MAX];
  const char *env = getenv("MONARCH_PREFIX");
  if (env != NULL && *env) {
    snprintf(out, len, "%s", env);
    return 0;
  }
  if (dladdr(self, &info) == 0 || info.dli_fname == NULL) return MN_ENOTFOUND;
  /* For the main executable dladdr may give argv[0]; /proc/self/exe is exact. */
  const char *src = info.dli_fname;
  if (strstr(src, ".so") == NULL) src = "/proc/self/exe";
  if (realpath(src, real) == NULL) return -errno;
  char *dir = strrchr(real, '/');
  if (dir == NULL) return MN_ENOTFOUND;
  *dir = '\0';
  size_t dl = strlen(real);
  if (dl >= 4 && strcmp(real + dl - 4, "/bin") == 0) strip(real, 1);
  else if (strstr(real, "/lib/monarch/lua/monarch") != NULL) strip(real, 4);
  snprintf(out, len, "%s", real);
  return 0;
}
