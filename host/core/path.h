/* path.h - where the installed tree is, found from the running binary. */
#ifndef MN_PATH_H
#define MN_PATH_H
#include <stddef.h>
/*
 * Writes the install prefix into out: the directory above bin/ for a
 * binary in <prefix>/bin, or above lib/monarch/lua/monarch/ for the Lua
 * module. `self` is an address inside the calling image. Returns 0, or
 * MN_ENOTFOUND (no image holds self, or its path has no
 * directory) or -errno from realpath.
 */
int mn_prefix(const void *self, char *out, size_t len);
#endif
