/*
 * ctl_slab.c - where the controller's conns live. They come in blocks, handed
 * out in id order: a first small one from malloc (most jobs need no more),
 * then 2 MiB blocks mapped on huge-page boundaries and offered to the kernel
 * as huge pages. A mesh-wide call walks thousands of conns in id order; with
 * 4 KiB pages each was a TLB miss as well as a cache miss. Conns are never
 * freed one by one (ids are never reused), so a block is only appended to.
 */
#include "ctl_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SLAB_FIRST 64
#define SLAB_HUGE (2u << 20)
/* The sanitizer build takes a block per conn from malloc: an overrun of one conn into the next is seen. */
#if defined(__SANITIZE_ADDRESS__)
#define SLAB_ONE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLAB_ONE 1
#endif
#endif
#ifndef SLAB_ONE
#define SLAB_ONE 0
#endif

/* A zeroed SLAB_HUGE block at a SLAB_HUGE boundary (mapped twice as large, the rest let go), or NULL. */
static void *huge_block(void) {
  size_t span = 2 * (size_t)SLAB_HUGE;
  char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  char *a = (char *)(((uintptr_t)p + SLAB_HUGE - 1) & ~((uintptr_t)SLAB_HUGE - 1));
  if (a > p) munmap(p, (size_t)(a - p));
  munmap(a + SLAB_HUGE, (size_t)(p + span - (a + SLAB_HUGE)));
  (void)madvise(a, SLAB_HUGE, MADV_HUGEPAGE); /* refused (no THP): 4 KiB pages, as malloc's */
  return a;
}

mn_conn_t *mn__ctl_slab_conn(mn_ctl_t *c) {
  if (c->slab == NULL || c->slab_used == c->slab_cap) {
    if (c->slabs == NULL) c->slabs = calloc(SLAB_ONE ? MN_MAX_CONNS + 1 : MN_MAX_CONNS / SLAB_FIRST + 1, sizeof(*c->slabs));
    if (c->slabs == NULL) return NULL;
    int huge = !SLAB_ONE && c->nslabs > 0;
    size_t bytes = SLAB_ONE ? sizeof(mn_conn_t) : huge ? SLAB_HUGE : SLAB_FIRST * sizeof(mn_conn_t);
    void *b = huge ? huge_block() : aligned_alloc(64, bytes);
    if (b == NULL) return NULL;
    if (huge) c->slab_bytes += bytes;
    c->slabs[c->nslabs++] = b;
    c->slab = b;
    c->slab_used = 0;
    c->slab_cap = (int)(bytes / sizeof(mn_conn_t));
  }
  mn_conn_t *k = &c->slab[c->slab_used++];
  memset(k, 0, sizeof(*k));
  return k;
}

void mn__ctl_slab_free(mn_ctl_t *c) {
  for (int i = 0; i < c->nslabs; i++) {
    if (SLAB_ONE || i == 0) free(c->slabs[i]);
    else munmap(c->slabs[i], SLAB_HUGE);
  }
  free(c->slabs);
}
