/* scratch.c - scratch memory for kernel calls; see scratch.h. */
#include "scratch.h"

#include <stdlib.h>

void *mn_scratch_get(mn_scratch_t *s, size_t n) {
  void *p = NULL;
  if (!s->used) {
    if (n > s->cap) {
      if (posix_memalign(&p, MN_SCRATCH_ALIGN, n) != 0) return NULL;
      free(s->first);
      s->first = p;
      s->cap = n;
    }
    s->used = 1;
    return s->first;
  }
  if (s->nextra == MN_MAX_SCRATCH || posix_memalign(&p, MN_SCRATCH_ALIGN, n ? n : MN_SCRATCH_ALIGN) != 0) return NULL;
  s->extra[s->nextra++] = p;
  return p;
}

void mn_scratch_release(mn_scratch_t *s) {
  for (int i = 0; i < s->nextra; i++) free(s->extra[i]);
  s->nextra = 0;
  s->used = 0;
}

void mn_scratch_close(mn_scratch_t *s) {
  mn_scratch_release(s);
  free(s->first);
  mn_scratch_init(s);
}
