/*
 * test_ship.c - unit tests for host/core/ship.c: content hashes and their hex
 * spelling, ELF identities, the SHIP messages (built, parsed, malformed ones
 * refused) and an agent's WELCOME info.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ship.h"
#include "wire.h"

/* Decodes the one frame in b into *m (zone z); 0 or the decoder's code. */
static int decode(const mn_buf_t *b, msgpack_zone *z, msgpack_object *m) {
  char err[256];
  return mn_decode(b->data + MN_FRAME_HEADER, b->len - MN_FRAME_HEADER, z, m, err, sizeof(err));
}

static void test_hex_roundtrip(void **state) {
  (void)state;
  uint8_t h[MN_SHIP_HASH_LEN], back[MN_SHIP_HASH_LEN];
  char hex[MN_SHIP_HEX_LEN + 1];
  mn_ship_hash("abc", 3, h);
  mn_ship_hex(h, hex);
  assert_int_equal(strlen(hex), MN_SHIP_HEX_LEN);
  /* The tree of docs/protocol.md section 5 as Python's hashlib computes it: leaf = blake2b(b"abc",
   * digest_size=32, person=b"monarch-ship-pc1"), then blake2b(struct.pack("<Q", 3) + leaf, digest_size=32,
   * person=b"monarch-ship-rt1"). */
  assert_string_equal(hex, "1c9c0925768d531f08562282b0d7d5f72a27cec7a6e26c8319c4e23bba52c170");
  assert_int_equal(mn_ship_unhex(hex, strlen(hex), back), 0);
  assert_memory_equal(h, back, sizeof(h));
  assert_int_equal(mn_ship_unhex(hex, 63, back), MN_EINVAL);
  hex[5] = 'G';
  assert_int_equal(mn_ship_unhex(hex, MN_SHIP_HEX_LEN, back), MN_EINVAL);
}

static void test_hash_file(void **state) {
  (void)state;
  char path[] = "/tmp/test_ship_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  static char big[3 * MN_SHIP_CHUNK + 12345]; /* pieces hashed on threads, the last one short */
  for (size_t i = 0; i < sizeof(big); i++) big[i] = (char)(i * 31);
  assert_int_equal(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
  close(fd);
  uint8_t a[MN_SHIP_HASH_LEN], b[MN_SHIP_HASH_LEN];
  uint64_t size = 0;
  assert_int_equal(mn_ship_hash_file(path, a, &size), 0);
  assert_int_equal(size, sizeof(big));
  mn_ship_hash(big, sizeof(big), b);
  assert_memory_equal(a, b, sizeof(a)); /* streamed or at once (on threads): one hash */
  uint8_t leaves[4 * MN_SHIP_HASH_LEN], c[MN_SHIP_HASH_LEN]; /* and piece by piece, as an agent makes it */
  assert_int_equal(mn_ship_pieces(sizeof(big)), 4);
  for (size_t i = 0; i < 4; i++) {
    size_t off = i * MN_SHIP_CHUNK, n = sizeof(big) - off < MN_SHIP_CHUNK ? sizeof(big) - off : MN_SHIP_CHUNK;
    mn_ship_leaf(big + off, n, leaves + i * MN_SHIP_HASH_LEN);
  }
  mn_ship_root(leaves, sizeof(big), c);
  assert_memory_equal(a, c, sizeof(a));
  mn_ship_root(leaves, sizeof(big) - 1, c); /* the size is part of the address */
  assert_memory_not_equal(a, c, sizeof(a));
  mn_ship_hash(big, 0, a);
  mn_ship_root(leaves, 0, b);
  assert_memory_equal(a, b, sizeof(a));
  unlink(path);
  assert_true(mn_ship_hash_file(path, a, &size) < 0);
}

static void test_elf_identify(void **state) {
  (void)state;
  uint8_t h[MN_ELF_HEAD] = {0x7f, 'E', 'L', 'F', 2, 1};
  h[16] = 3, h[18] = 62; /* ET_DYN, EM_X86_64, little-endian */
  mn_elf_id_t id;
  assert_int_equal(mn_elf_identify(h, sizeof(h), &id), 0);
  assert_int_equal(id.elf_class, 2);
  assert_int_equal(id.machine, 62);
  assert_int_equal(id.type, 3);
  h[5] = 2, h[16] = 0, h[17] = 3, h[18] = 0, h[19] = 183; /* big-endian aarch64 */
  assert_int_equal(mn_elf_identify(h, sizeof(h), &id), 0);
  assert_int_equal(id.machine, 183);
  assert_int_equal(id.type, 3);
  assert_int_equal(mn_elf_identify(h, 10, &id), MN_EINVAL);
  h[1] = 'X';
  assert_int_equal(mn_elf_identify(h, sizeof(h), &id), MN_EINVAL);
  char buf[32];
  assert_string_equal(mn_elf_machine_name(62, buf, sizeof(buf)), "x86_64");
  assert_string_equal(mn_elf_machine_name(9999, buf, sizeof(buf)), "machine 9999");
  assert_int_equal(mn_elf_self(&id), 0); /* this test binary */
  assert_int_equal(id.elf_class, sizeof(void *) == 8 ? 2 : 1);
}

static void test_ask_roundtrip(void **state) {
  (void)state;
  uint8_t h[MN_SHIP_HASH_LEN];
  mn_ship_hash("x", 1, h);
  mn_buf_t b;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_ship_ask(&b, h, 1234, "/opt/k.so", ""), 0);
  msgpack_zone z;
  msgpack_zone_init(&z, 1024);
  msgpack_object m;
  assert_int_equal(decode(&b, &z, &m), 0);
  mn_msg_ship_ask_t q;
  char err[256];
  assert_int_equal(mn_msg_parse_ship_ask(&m, &q, err, sizeof(err)), 0);
  assert_memory_equal(q.hash, h, sizeof(h));
  assert_int_equal(q.size, 1234);
  assert_int_equal(q.path_len, 9);
  assert_int_equal(q.place_len, 0);
  /* A short hash is refused with the layout. */
  m.via.array.ptr[1].via.bin.size = 31;
  assert_int_equal(mn_msg_parse_ship_ask(&m, &q, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "malformed SHIP_ASK"));
  msgpack_zone_destroy(&z);
  mn_buf_free(&b);
}

/* A chunk with subs for children 0 (wants it) and 3 (passes it on to its child 1). */
static void test_data_roundtrip(void **state) {
  (void)state;
  uint8_t h[MN_SHIP_HASH_LEN];
  mn_ship_hash("y", 1, h);
  mn_buf_t b;
  mn_buf_init(&b);
  msgpack_packer pk;
  size_t start;
  assert_int_equal(mn_msg_ship_data_head(&b, &pk, &start, h, 10, 4, "abcd", 4, 0, 2), 0);
  msgpack_pack_uint64(&pk, 0), msgpack_pack_true(&pk), msgpack_pack_array(&pk, 0);
  msgpack_pack_uint64(&pk, 3), msgpack_pack_false(&pk), msgpack_pack_array(&pk, 3);
  msgpack_pack_uint64(&pk, 1), msgpack_pack_true(&pk), msgpack_pack_array(&pk, 0);
  mn_frame_end(&b, start);
  msgpack_zone z;
  msgpack_zone_init(&z, 1024);
  msgpack_object m;
  assert_int_equal(decode(&b, &z, &m), 0);
  mn_msg_ship_data_t d;
  char err[256];
  assert_int_equal(mn_msg_parse_ship_data(&m, &d, err, sizeof(err)), 0);
  assert_int_equal(d.size, 10);
  assert_int_equal(d.offset, 4);
  assert_int_equal(d.len, 4);
  assert_memory_equal(d.chunk, "abcd", 4);
  assert_false(d.self);
  assert_int_equal(d.subs->via.array.size, 6);
  /* A chunk past the file's end is refused. */
  m.via.array.ptr[3].via.u64 = 8;
  assert_int_equal(mn_msg_parse_ship_data(&m, &d, err, sizeof(err)), MN_EPROTO);
  assert_non_null(strstr(err, "inside the file"));
  msgpack_zone_destroy(&z);
  mn_buf_free(&b);
}

static void test_state_and_welcome(void **state) {
  (void)state;
  uint8_t h[MN_SHIP_HASH_LEN] = {1}, mac[32] = {2};
  mn_buf_t b;
  mn_buf_init(&b);
  assert_int_equal(mn_msg_pack_ship_state(&b, h, "cached", "/c/blobs/x"), 0);
  msgpack_zone z;
  msgpack_zone_init(&z, 1024);
  msgpack_object m;
  assert_int_equal(decode(&b, &z, &m), 0);
  assert_int_equal(mn_msg_type(&m), MN_MSG_SHIP_STATE);
  assert_string_equal(mn_msg_name(MN_MSG_SHIP_STATE), "SHIP_STATE");
  b.len = 0;
  /* An agent's WELCOME tells its machine and whether it ships; a proc's says neither (ship -1). */
  assert_int_equal(mn_msg_pack_welcome_agent(&b, mac, "h", 7, 2, 62, 0, "0123456789abcdef0123456789abcdef"), 0);
  assert_int_equal(decode(&b, &z, &m), 0);
  mn_msg_welcome_t w;
  char err[256];
  assert_int_equal(mn_msg_parse_welcome(&m, &w, err, sizeof(err)), 0);
  assert_int_equal(w.elf_class, 2);
  assert_int_equal(w.elf_machine, 62);
  assert_int_equal(w.ship, 0);
  assert_int_equal(w.pid, 7);
  assert_int_equal(w.cache_len, MN_SHIP_ID_LEN);
  assert_memory_equal(w.cache, "0123456789abcdef0123456789abcdef", MN_SHIP_ID_LEN);
  b.len = 0;
  /* An id that is not 32 hex digits is no id: that agent shares its cache with nobody. */
  assert_int_equal(mn_msg_pack_welcome_agent(&b, mac, "h", 7, 2, 62, 1, "not-an-id"), 0);
  assert_int_equal(decode(&b, &z, &m), 0);
  assert_int_equal(mn_msg_parse_welcome(&m, &w, err, sizeof(err)), 0);
  assert_null(w.cache);
  b.len = 0;
  assert_int_equal(mn_msg_pack_welcome(&b, mac, "h", 7, "proc"), 0);
  assert_int_equal(decode(&b, &z, &m), 0);
  assert_int_equal(mn_msg_parse_welcome(&m, &w, err, sizeof(err)), 0);
  assert_int_equal(w.ship, -1);
  assert_int_equal(w.elf_machine, 0);
  assert_null(w.cache);
  msgpack_zone_destroy(&z);
  mn_buf_free(&b);
}

/* A blob's record holds while nothing writes to it; a write (the mtime moves) or a missing record fails it. */
static void test_record(void **state) {
  (void)state;
  char dir[] = "/tmp/test_ship_rec.XXXXXX", blob[128], rec[160];
  assert_non_null(mkdtemp(dir));
  snprintf(blob, sizeof(blob), "%s/blob", dir);
  snprintf(rec, sizeof(rec), "%s.ok", blob);
  int fd = open(blob, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "hello", 5), 5);
  assert_int_equal(mn_ship_record_ok(blob), 0); /* no record yet */
  assert_int_equal(mn_ship_record_write(blob, fd), 0);
  assert_int_equal(mn_ship_record_ok(blob), 1);
  struct timespec later[2] = {{0, UTIME_OMIT}, {12345, 0}};
  assert_int_equal(futimens(fd, later), 0); /* as a write would move it */
  assert_int_equal(mn_ship_record_ok(blob), 0);
  uint8_t h[MN_SHIP_HASH_LEN], want[MN_SHIP_HASH_LEN];
  uint64_t n = 0;
  assert_int_equal(mn_ship_hash_fd(fd, h, &n), 0);
  mn_ship_hash("hello", 5, want);
  assert_int_equal(n, 5);
  assert_memory_equal(h, want, MN_SHIP_HASH_LEN);
  close(fd);
  unlink(rec);
  unlink(blob);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hex_roundtrip),  cmocka_unit_test(test_hash_file),
      cmocka_unit_test(test_elf_identify),   cmocka_unit_test(test_ask_roundtrip),
      cmocka_unit_test(test_data_roundtrip), cmocka_unit_test(test_state_and_welcome),
      cmocka_unit_test(test_record),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
