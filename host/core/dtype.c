/* dtype.c - names of the kernel ABI's element types, shared by procs and collectives. */
#include "dtype.h"
#include "err.h"

#include <string.h>

/* The names are the kernel ABI's own (mk_dtype_name), so the host and the kernels cannot disagree. */
int mn_dtype_parse(const char *s, size_t n) {
  for (int i = 0; i < MK_DTYPE_COUNT; i++) {
    const char *name = mk_dtype_name((mk_dtype_t)i);
    if (strlen(name) == n && memcmp(name, s, n) == 0) return i;
  }
  return MN_EINVAL;
}

const char *mn_dtype_name(mk_dtype_t d) { return (unsigned)d < MK_DTYPE_COUNT ? mk_dtype_name(d) : "?"; }
