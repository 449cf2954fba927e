/* dtype.h - the kernel ABI's element types by name ("f32", ...). */
#ifndef MN_DTYPE_H
#define MN_DTYPE_H

#include "monarch_kernel.h"

#include <stddef.h>

/* Parses the first n bytes of s, "f32" etc: the mk_dtype_t (non-negative), or MN_EINVAL if unknown. */
int mn_dtype_parse(const char *s, size_t n);
/* "f32" etc, or "?" for a value outside the ABI. */
const char *mn_dtype_name(mk_dtype_t d);

#endif
