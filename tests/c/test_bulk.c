/*
 * test_bulk.c - unit tests for host/proc/bulk.c and bulk_map.c: the peer
 * proof, the copies (by process_vm and through maps of a memfd), and the
 * maps' lifetime, with this process as its own "controller".
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bulk.h"
#include "err.h"

static uint64_t cookie = 0x5eedf00dULL;

static mn_bulk_peer_t self_peer(void) { return (mn_bulk_peer_t){getpid(), (uint64_t)(uintptr_t)&cookie, cookie}; }

static void proves_itself_and_refuses_a_wrong_cookie(void **state) {
  char err[256];
  mn_bulk_peer_t p = self_peer();
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), 0);
  p.cookie++;
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), MN_EPEER);
  assert_non_null(strstr(err, "not the controller that asked"));
  p = self_peer();
  setenv("MONARCH_BULK_LOCAL_SIMULATE", "eperm", 1);
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), -EPERM);
  assert_non_null(strstr(err, "simulated"));
  unsetenv("MONARCH_BULK_LOCAL_SIMULATE");
}

static void copies_both_ways_striped(void **state) {
  char err[256];
  size_t n = 3 * MN_BULK_STRIPE_MIN + 12345;
  char *a = malloc(n), *b = calloc(1, n);
  assert_non_null(a);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) a[i] = (char)(i * 31 + 7);
  mn_bulk_peer_t p = self_peer();
  setenv("MONARCH_BULK_THREADS", "3", 1);
  assert_int_equal(mn_bulk_threads(n, 0), 3);
  assert_int_equal(mn_bulk_copy(&p, 0, b, (uint64_t)(uintptr_t)a, NULL, n, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a, b, n);
  memset(a, 0, n);
  assert_int_equal(mn_bulk_copy(&p, 1, b, (uint64_t)(uintptr_t)a, NULL, n, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a, b, n);
  unsetenv("MONARCH_BULK_THREADS");
  free(a);
  free(b);
}

static void counts_threads_within_limits(void **state) {
  setenv("MONARCH_BULK_THREADS", "1000", 1);
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100, 0), MN_BULK_MAX_THREADS);
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100, 1), MN_BULK_MAX_THREADS);
  assert_int_equal(mn_bulk_threads(10, 0), 1); /* one stripe: small copies stay on the caller's thread */
  setenv("MONARCH_BULK_THREADS", "0", 1);
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100, 0), 1);
  unsetenv("MONARCH_BULK_THREADS");
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100, 1), 1); /* a mapped copy: one thread unless told */
}

static void stops_when_cancelled_and_names_a_bad_address(void **state) {
  char err[256], buf[64];
  mn_bulk_peer_t p = self_peer();
  atomic_int cancel;
  atomic_init(&cancel, 1);
  assert_int_equal(mn_bulk_copy(&p, 0, buf, (uint64_t)(uintptr_t)buf, NULL, sizeof(buf), &cancel, err, sizeof(err)),
                   MN_ECANCELED);
  assert_non_null(strstr(err, "cancelled"));
  atomic_store(&cancel, 0);
  assert_int_equal(mn_bulk_copy(&p, 0, buf, 16, NULL, sizeof(buf), &cancel, err, sizeof(err)), -EFAULT);
  assert_non_null(strstr(err, "reading the controller's memory at 0x10"));
}

/* A memfd of n bytes, as the controller makes for a big HostTensor, filled from seed; its map in *at. */
static int region(size_t n, int seed, char **at) {
  int fd = memfd_create("test-region", MFD_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)n), 0);
  *at = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(*at != MAP_FAILED);
  for (size_t i = 0; i < n; i++) (*at)[i] = (char)(i * 13 + (size_t)seed);
  return fd;
}

static void copies_both_ways_through_a_map_made_once(void **state) {
  char err[256], *ours, *mapped;
  size_t n = 3 * MN_BULK_STRIPE_MIN + 12345;
  int fd = region(n, 1, &ours);
  char *b = calloc(1, n);
  assert_non_null(b);
  mn_bulk_peer_t p = self_peer();
  uint64_t made = mn_bulk_stats()->maps_made, via_map = mn_bulk_stats()->mapped_bytes;
  setenv("MONARCH_BULK_THREADS", "3", 1);
  assert_int_equal(mn_bulk_map(&p, fd, 0, n, &mapped, err, sizeof(err)), 0);
  assert_ptr_not_equal(mapped, ours); /* a map of its own, of the same pages */
  assert_int_equal(mn_bulk_copy(&p, 0, b, (uint64_t)(uintptr_t)ours, mapped, n, NULL, err, sizeof(err)), 0);
  assert_memory_equal(ours, b, n);
  memset(b, 7, n);
  char *again;
  assert_int_equal(mn_bulk_map(&p, fd, 4096, n - 4096, &again, err, sizeof(err)), 0);
  assert_ptr_equal(again, mapped + 4096);
  assert_int_equal(mn_bulk_copy(&p, 1, b, (uint64_t)(uintptr_t)ours + 4096, again, n - 4096, NULL, err, sizeof(err)), 0);
  assert_memory_equal(ours + 4096, b, n - 4096);
  assert_int_equal(mn_bulk_stats()->maps_made, made + 1);
  assert_int_equal(mn_bulk_stats()->mapped_bytes, via_map + n + n - 4096);
  unsetenv("MONARCH_BULK_THREADS");
  mn_bulk_unmap_all();
  munmap(ours, n);
  close(fd);
  free(b);
}

static void refuses_a_range_outside_the_region_and_a_file_that_is_no_memfd(void **state) {
  char err[256], *ours, *at;
  mn_bulk_peer_t p = self_peer();
  int fd = region(8192, 2, &ours);
  assert_int_equal(mn_bulk_map(&p, fd, 8000, 200, &at, err, sizeof(err)), MN_EINVAL);
  assert_non_null(strstr(err, "outside the controller's region of 8192 bytes"));
  FILE *f = tmpfile();
  assert_non_null(f);
  assert_int_equal(mn_bulk_map(&p, fileno(f), 0, 0, &at, err, sizeof(err)), MN_EINVAL);
  assert_non_null(strstr(err, "is not a memfd"));
  fclose(f);
  /* An fd the controller does not hold: no map, the caller copies by process_vm. */
  assert_int_equal(mn_bulk_map(&p, 1000, 0, 10, &at, err, sizeof(err)), 1);
  assert_non_null(strstr(mn_bulk_stats()->why_unmapped, "fd 1000"));
  p.cookie++;
  assert_int_equal(mn_bulk_map(&p, fd, 0, 10, &at, err, sizeof(err)), MN_EPEER);
  assert_int_equal(mn_bulk_maps_held(), 0);
  munmap(ours, 8192);
  close(fd);
}

static void drops_a_map_once_its_region_is_closed_and_never_reuses_it_for_a_new_one(void **state) {
  char err[256], *a, *b, *at;
  mn_bulk_peer_t p = self_peer();
  int fa = region(65536, 3, &a);
  assert_int_equal(mn_bulk_map(&p, fa, 0, 65536, &at, err, sizeof(err)), 0);
  assert_int_equal(mn_bulk_sweep(), 1);
  munmap(a, 65536);
  close(fa);
  int fb = region(65536, 4, &b); /* most likely the same fd number */
  assert_int_equal(mn_bulk_map(&p, fb, 0, 65536, &at, err, sizeof(err)), 0);
  assert_memory_equal(at, b, 65536);
  assert_int_equal(mn_bulk_maps_held(), fb == fa ? 1 : 2); /* a reused number took the old slot over */
  munmap(b, 65536);
  close(fb);
  assert_int_equal(mn_bulk_sweep(), 0);
}

static void keeps_at_most_MN_BULK_MAPS_maps(void **state) {
  char err[256], *at, *ours[MN_BULK_MAPS + 2];
  int fds[MN_BULK_MAPS + 2];
  mn_bulk_peer_t p = self_peer();
  for (int i = 0; i < MN_BULK_MAPS + 2; i++) {
    fds[i] = region(4096, i, &ours[i]);
    assert_int_equal(mn_bulk_map(&p, fds[i], 0, 4096, &at, err, sizeof(err)), 0);
    assert_memory_equal(at, ours[i], 4096);
  }
  assert_int_equal(mn_bulk_maps_held(), MN_BULK_MAPS);
  for (int i = 0; i < MN_BULK_MAPS + 2; i++) {
    munmap(ours[i], 4096);
    close(fds[i]);
  }
  assert_int_equal(mn_bulk_sweep(), 0);
}

static void streams_any_alignment_and_length(void **state) {
  size_t n = 3 * 16384 + 777;
  char *a = malloc(n + 64), *b = malloc(n + 64);
  assert_non_null(a);
  assert_non_null(b);
  for (size_t i = 0; i < n + 64; i++) a[i] = (char)(i * 7 + 3);
  size_t lens[] = {0, 1, 15, 63, 64, 4097, 16384, n};
  for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
    for (size_t shift = 0; shift < 3; shift++) {
      memset(b, 0, n + 64);
      mn__bulk_copy_stream(b + shift * 5, a + shift * 3, lens[k]);
      assert_memory_equal(b + shift * 5, a + shift * 3, lens[k]);
      assert_int_equal(b[shift * 5 + lens[k]], 0); /* not a byte past the end */
    }
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(proves_itself_and_refuses_a_wrong_cookie),
      cmocka_unit_test(copies_both_ways_striped),
      cmocka_unit_test(counts_threads_within_limits),
      cmocka_unit_test(stops_when_cancelled_and_names_a_bad_address),
      cmocka_unit_test(copies_both_ways_through_a_map_made_once),
      cmocka_unit_test(refuses_a_range_outside_the_region_and_a_file_that_is_no_memfd),
      cmocka_unit_test(drops_a_map_once_its_region_is_closed_and_never_reuses_it_for_a_new_one),
      cmocka_unit_test(keeps_at_most_MN_BULK_MAPS_maps),
      cmocka_unit_test(streams_any_alignment_and_length),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
