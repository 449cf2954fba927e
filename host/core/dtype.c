/* dtype.c - names of the kernel ABI's element types, shared by procs and collectives. */
#include "dtype.h"
#include "err.h"

#include <string.h>

static const char *const dtype_names[MK_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};

int mn_dtype_parse(const char *s, size_t n) {
  for (int i = 0; i < MK_DTYPE_COUNT; i++)
    if (strlen(dtype_names[i]) == n && memcmp(dtype_names[i], s, n) == 0) return i;
  return MN_EINVAL;
}

const char *mn_dtype_name(mk_dtype_t d) { return (unsigned)d < MK_DTYPE_COUNT ? dtype_names[d] : "?"; }
