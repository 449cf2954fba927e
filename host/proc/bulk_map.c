/* bulk_map.c - maps of the controller's shared HostTensors, and the copy through them; see bulk.h. */
#include "bulk.h"

#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- the streaming copy -------------------------------------------------------- */

#if defined(__SSE2__)
/* 64 bytes from s to d (16-byte aligned) with stores that bypass the cache. */
static inline void line_stream(char *d, const char *s) {
  __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
  __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
  _mm_stream_si128((__m128i *)d, a);
  _mm_stream_si128((__m128i *)(d + 16), b);
  _mm_stream_si128((__m128i *)(d + 32), c);
  _mm_stream_si128((__m128i *)(d + 48), e);
}
#endif

/*
 * memcpy streams (bypasses the cache) only above a threshold of its own
 * (190 MiB here) that our pieces never reach, and below it runs at about
 * 0.6x; a copy bigger than the cache gains nothing from caching the
 * destination. Reading four pages side by side keeps more DRAM rows open.
 */
void mn__bulk_copy_stream(char *dst, const char *src, size_t n) {
#if defined(__SSE2__)
  size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
  if (head > n) head = n;
  memcpy(dst, src, head);
  char *d = dst + head;
  const char *s = src + head;
  size_t left = n - head, i = 0;
  for (; i + 16384 <= left; i += 16384)
    for (size_t l = 0; l < 4096; l += 64)
      for (size_t pg = 0; pg < 16384; pg += 4096) line_stream(d + i + pg + l, s + i + pg + l);
  for (; i + 64 <= left; i += 64) line_stream(d + i, s + i);
  _mm_sfence(); /* streaming stores are weakly ordered: done before the reply says so */
  memcpy(d + i, s + i, left - i);
#else
  memcpy(dst, src, n);
#endif
}

/* ---- maps ------------------------------------------------------------------------ */

typedef struct {
  char *base;  /* our map of the whole region; NULL: a free slot */
  size_t size;
  pid_t pid;   /* the controller that holds it, as its fd `fd` */
  int fd;
  dev_t dev;   /* the file, so that a reused fd number is not taken for it */
  ino_t ino;
  uint64_t used; /* when last used, for the least recently used to go */
} region_t;

static region_t regions[MN_BULK_MAPS];
static uint64_t clock_uses;
static mn_bulk_stats_t stats;

const mn_bulk_stats_t *mn_bulk_stats(void) { return &stats; }

void mn__bulk_count(int mapped, size_t n) {
  if (mapped) stats.mapped_bytes += n;
  else stats.vm_bytes += n;
}

static void unmap(region_t *r) {
  /* munmap fails only for a range that is no map: then there is nothing to keep either. */
  if (r->base != NULL && munmap(r->base, r->size) != 0)
    snprintf(stats.why_unmapped, sizeof(stats.why_unmapped), "unmapping a region: %s", strerror(errno));
  memset(r, 0, sizeof(*r));
}

/*
 * The file behind the controller's fd `fd`, opened as one of ours (close
 * it), or -errno. Through /proc rather than pidfd_getfd: it works on every
 * kernel and under valgrind, and the caller proves the process afterwards.
 */
static int take_fd(pid_t pid, int fd) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
  int got = open(path, O_RDWR | O_CLOEXEC);
  return got >= 0 ? got : -errno;
}

/* Whether the controller still holds r's file as its fd r->fd. */
static int still_held(const region_t *r) {
  int lfd = take_fd(r->pid, r->fd);
  if (lfd < 0) return 0;
  struct stat st;
  int same = fstat(lfd, &st) == 0 && st.st_dev == r->dev && st.st_ino == r->ino;
  close(lfd);
  return same;
}

int mn_bulk_sweep(void) {
  int left = 0;
  for (int i = 0; i < MN_BULK_MAPS; i++) {
    if (regions[i].base != NULL && !still_held(&regions[i])) unmap(&regions[i]);
    left += regions[i].base != NULL;
  }
  return left;
}

/* Drops the maps of every controller but pid: one that is gone left nothing to punch their pages out. */
static void drop_others(pid_t pid) {
  for (int i = 0; i < MN_BULK_MAPS; i++)
    if (regions[i].base != NULL && regions[i].pid != pid) unmap(&regions[i]);
}

int mn_bulk_maps_held(void) {
  int n = 0;
  for (int i = 0; i < MN_BULK_MAPS; i++) n += regions[i].base != NULL;
  return n;
}

void mn_bulk_unmap_all(void) {
  for (int i = 0; i < MN_BULK_MAPS; i++) unmap(&regions[i]);
}

/*
 * The slot of (pid, fd, st), or the one to fill: a free one, else the least
 * recently used (unmapped). A map of an older file at that fd goes: the
 * controller has closed it.
 */
static region_t *slot_for(pid_t pid, int fd, const struct stat *st, int *found) {
  region_t *pick = NULL;
  for (int i = 0; i < MN_BULK_MAPS; i++) {
    region_t *r = &regions[i];
    if (r->base != NULL && r->pid == pid && r->fd == fd) {
      if (r->dev == st->st_dev && r->ino == st->st_ino) {
        *found = 1;
        return r;
      }
      unmap(r);
    }
    if (pick == NULL || (pick->base != NULL && (r->base == NULL || r->used < pick->used))) pick = r;
  }
  *found = 0;
  unmap(pick);
  return pick;
}

/* Records why a region could not be mapped; 1 (copy with process_vm instead). */
static int unmapped(const char *what, int fd, int code, char *err, size_t errlen) {
  snprintf(stats.why_unmapped, sizeof(stats.why_unmapped), "%s the controller's fd %d: %s", what, fd,
           mn_strerror(code));
  snprintf(err, errlen, "%s", stats.why_unmapped);
  return 1;
}

/* Checks the controller's file behind lfd: a memfd that holds off .. off+len. 0, or MN_EINVAL with err. */
static int check_region(int lfd, int fd, uint64_t off, size_t len, struct stat *st, char *err, size_t errlen) {
  if (fstat(lfd, st) != 0 || !S_ISREG(st->st_mode) || fcntl(lfd, F_GET_SEALS) < 0) {
    snprintf(err, errlen, "the controller's fd %d is not a memfd", fd);
    return MN_EINVAL;
  }
  if (off > (uint64_t)st->st_size || len > (uint64_t)st->st_size - off) {
    snprintf(err, errlen, "range %llu+%zu is outside the controller's region of %lld bytes (fd %d)",
             (unsigned long long)off, len, (long long)st->st_size, fd);
    return MN_EINVAL;
  }
  return 0;
}

int mn_bulk_map(const mn_bulk_peer_t *peer, int fd, uint64_t off, size_t len, char **at, char *err, size_t errlen) {
  drop_others(peer->pid);
  int lfd = take_fd(peer->pid, fd);
  if (lfd < 0) return unmapped("opening", fd, lfd, err, errlen);
  /* Proved after the fd was taken: the process it came from was the controller (not a reused pid). */
  int rc = mn_bulk_check_peer(peer, err, errlen);
  struct stat st;
  if (rc == 0) rc = check_region(lfd, fd, off, len, &st, err, errlen);
  if (rc != 0) {
    close(lfd);
    return rc;
  }
  int found;
  region_t *r = slot_for(peer->pid, fd, &st, &found);
  if (!found && st.st_size > 0) {
    /* Filled now, in one pass, rather than by a fault per page during the copy. */
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, lfd, 0);
    if (base == MAP_FAILED) {
      int e = -errno;
      close(lfd);
      return unmapped("mapping", fd, e, err, errlen);
    }
    *r = (region_t){base, (size_t)st.st_size, peer->pid, fd, st.st_dev, st.st_ino, 0};
    stats.maps_made++;
  }
  close(lfd);
  if (r->base == NULL) return unmapped("mapping (empty)", fd, MN_EINVAL, err, errlen);
  r->used = ++clock_uses;
  stats.why_unmapped[0] = '\0';
  *at = r->base + off;
  return 0;
}
