/*
 * scratch.h - the scratch memory behind mk_scratch(), for kernels run by the
 * executor (exec.c) and by actors' proc.call (actor.c). The first block of a
 * call is kept and reused by the next call, so a kernel that asks for the
 * same size every time allocates once; further blocks in the same call are
 * fresh, so every pointer a kernel got stays valid until it returns.
 */
#ifndef MN_SCRATCH_H
#define MN_SCRATCH_H

#include <stddef.h>

#define MN_MAX_SCRATCH 16 /* most scratch blocks one kernel call may hold besides the first */
#define MN_SCRATCH_ALIGN 64 /* alignment of every block (a cache line; enough for any vector load) */

typedef struct {
  void *first;     /* the kept block */
  size_t cap;      /* its size */
  int used;        /* handed out in the running call */
  void *extra[MN_MAX_SCRATCH];
  int nextra;
} mn_scratch_t;

/* A zeroed struct is an empty allocator; this makes one. */
static inline void mn_scratch_init(mn_scratch_t *s) { *s = (mn_scratch_t){0}; }

/* n bytes valid until mn_scratch_release; NULL if out of memory or past MN_MAX_SCRATCH blocks. */
void *mn_scratch_get(mn_scratch_t *s, size_t n);

/* Ends a call: frees the extra blocks and keeps the first for the next call. */
void mn_scratch_release(mn_scratch_t *s);

/* Frees every block; s is empty afterwards and may be used again. */
void mn_scratch_close(mn_scratch_t *s);

#endif
