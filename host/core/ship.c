/*
 * ship.c - content hashes, ELF identities and the SHIP messages (ship.h).
 */
#include "ship.h"

#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- hashes --------------------------------------------------------------------------------- */

void mn_ship_hex(const uint8_t hash[MN_SHIP_HASH_LEN], char out[MN_SHIP_HEX_LEN + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < MN_SHIP_HASH_LEN; i++) {
    out[2 * i] = digits[hash[i] >> 4];
    out[2 * i + 1] = digits[hash[i] & 15];
  }
  out[MN_SHIP_HEX_LEN] = '\0';
}

static int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

int mn_ship_unhex(const char *hex, size_t n, uint8_t hash[MN_SHIP_HASH_LEN]) {
  if (n != MN_SHIP_HEX_LEN) return MN_EINVAL;
  for (int i = 0; i < MN_SHIP_HASH_LEN; i++) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return MN_EINVAL;
    hash[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

/*
 * The content address is a tree of BLAKE2b-256 hashes: each MN_SHIP_CHUNK piece is hashed alone (a leaf),
 * and the address is the hash of the file's size and its leaves in order. Pieces hash apart, so the
 * controller hashes a file on every core and an agent checks each chunk as it comes. The personalisations
 * keep a leaf from ever standing for a root.
 */
static const unsigned char LEAF[crypto_generichash_blake2b_PERSONALBYTES] = "monarch-ship-pc1";
static const unsigned char ROOT[crypto_generichash_blake2b_PERSONALBYTES] = "monarch-ship-rt1";

uint64_t mn_ship_pieces(uint64_t size) { return (size + MN_SHIP_CHUNK - 1) / MN_SHIP_CHUNK; }

void mn_ship_leaf(const void *p, size_t n, uint8_t leaf[MN_SHIP_HASH_LEN]) {
  crypto_generichash_blake2b_salt_personal(leaf, MN_SHIP_HASH_LEN, p, n, NULL, 0, NULL, LEAF);
}

/* The root's state with the file's size in it (8 bytes, little endian); its leaves follow. */
static void root_begin(crypto_generichash_blake2b_state *st, uint64_t size) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(size >> (8 * i));
  crypto_generichash_blake2b_init_salt_personal(st, NULL, 0, MN_SHIP_HASH_LEN, NULL, ROOT);
  crypto_generichash_blake2b_update(st, le, sizeof(le));
}

void mn_ship_root(const uint8_t *leaves, uint64_t size, uint8_t hash[MN_SHIP_HASH_LEN]) {
  crypto_generichash_blake2b_state st;
  root_begin(&st, size);
  crypto_generichash_blake2b_update(&st, leaves, (size_t)mn_ship_pieces(size) * MN_SHIP_HASH_LEN);
  crypto_generichash_blake2b_final(&st, hash, MN_SHIP_HASH_LEN);
}

typedef struct {
  const uint8_t *p;
  size_t n;
  uint8_t *leaves;
  uint64_t first, step;
} leafwork_t;

static void *leaf_thread(void *arg) {
  leafwork_t *w = arg;
  for (uint64_t i = w->first; i * MN_SHIP_CHUNK < w->n; i += w->step) {
    size_t off = (size_t)i * MN_SHIP_CHUNK, len = w->n - off < MN_SHIP_CHUNK ? w->n - off : MN_SHIP_CHUNK;
    mn_ship_leaf(w->p + off, len, w->leaves + i * MN_SHIP_HASH_LEN);
  }
  return NULL;
}

#define MAX_HASH_THREADS 8

/* The same hash on one thread, each leaf into the root as it is made (no array of leaves). */
static void hash_one_thread(const uint8_t *p, size_t n, uint8_t hash[MN_SHIP_HASH_LEN]) {
  crypto_generichash_blake2b_state st;
  uint8_t leaf[MN_SHIP_HASH_LEN];
  root_begin(&st, (uint64_t)n);
  for (size_t off = 0; off < n; off += MN_SHIP_CHUNK) {
    mn_ship_leaf(p + off, n - off < MN_SHIP_CHUNK ? n - off : MN_SHIP_CHUNK, leaf);
    crypto_generichash_blake2b_update(&st, leaf, sizeof(leaf));
  }
  crypto_generichash_blake2b_final(&st, hash, MN_SHIP_HASH_LEN);
}

void mn_ship_hash(const void *p, size_t n, uint8_t hash[MN_SHIP_HASH_LEN]) {
  uint64_t pieces = mn_ship_pieces(n);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = (int)(pieces < MAX_HASH_THREADS ? pieces : MAX_HASH_THREADS);
  if (cpus > 0 && nt > cpus) nt = (int)cpus;
  uint8_t *leaves = nt > 1 ? malloc((size_t)pieces * MN_SHIP_HASH_LEN) : NULL;
  if (leaves == NULL) { /* one piece, one core, or no memory for the leaves */
    hash_one_thread(p, n, hash);
    return;
  }
  leafwork_t w[MAX_HASH_THREADS];
  pthread_t th[MAX_HASH_THREADS];
  int started[MAX_HASH_THREADS] = {0};
  for (int t = 0; t < nt; t++) {
    w[t] = (leafwork_t){p, n, leaves, (uint64_t)t, (uint64_t)nt};
    if (t > 0) started[t] = pthread_create(&th[t], NULL, leaf_thread, &w[t]) == 0;
  }
  leaf_thread(&w[0]);
  for (int t = 1; t < nt; t++) {
    if (started[t]) pthread_join(th[t], NULL);
    else leaf_thread(&w[t]); /* a thread that could not start: its share here */
  }
  mn_ship_root(leaves, (uint64_t)n, hash);
  free(leaves);
}

int mn_ship_hash_fd(int fd, uint8_t hash[MN_SHIP_HASH_LEN], uint64_t *size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  uint64_t pieces = mn_ship_pieces((uint64_t)st.st_size) + 1; /* room for a file that grew since */
  uint8_t *leaves = malloc((size_t)pieces * MN_SHIP_HASH_LEN);
  char *buf = malloc(MN_SHIP_CHUNK);
  int rc = leaves == NULL || buf == NULL ? -ENOMEM : 0;
  uint64_t total = 0, i = 0;
  while (rc == 0) {
    size_t have = 0; /* a piece is filled whole before it is hashed: reads may come short */
    while (have < MN_SHIP_CHUNK) {
      ssize_t r = pread(fd, buf + have, MN_SHIP_CHUNK - have, (off_t)(total + have));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) rc = -errno;
      if (r <= 0) break;
      have += (size_t)r;
    }
    if (rc != 0 || have == 0) break;
    if (i == pieces) rc = -EAGAIN; /* grew by more than a piece while read: not one file's bytes */
    else mn_ship_leaf(buf, have, leaves + (i++) * MN_SHIP_HASH_LEN);
    total += have;
    if (have < MN_SHIP_CHUNK) break;
  }
  if (rc == 0) mn_ship_root(leaves, total, hash);
  if (rc == 0) *size = total;
  free(buf);
  free(leaves);
  return rc;
}

int mn_ship_hash_file(const char *path, uint8_t hash[MN_SHIP_HASH_LEN], uint64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = mn_ship_hash_fd(fd, hash, size);
  close(fd);
  return rc;
}

/* ---- verification records ------------------------------------------------------------------- */

static void record_text(const struct stat *st, char *out, size_t n) {
  snprintf(out, n, "v1 %llu %llu %llu %lld.%09ld\n", (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
           (unsigned long long)st->st_size, (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec);
}

int mn_ship_record_write(const char *blob, int fd) {
  static unsigned long long counter; /* unique temporary names within this process */
  char text[MN_SHIP_RECORD_MAX], tmp[PATH_MAX], rec[PATH_MAX];
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  record_text(&st, text, sizeof(text));
  if (snprintf(rec, sizeof(rec), "%s.ok", blob) >= (int)sizeof(rec) ||
      snprintf(tmp, sizeof(tmp), "%s.ok.%d.%llu", blob, (int)getpid(), ++counter) >= (int)sizeof(tmp))
    return MN_EINVAL;
  int w = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (w < 0) return -errno;
  size_t n = strlen(text);
  ssize_t wr = write(w, text, n);
  int rc = wr == (ssize_t)n ? 0 : wr < 0 ? -errno : MN_EINVAL; /* a short write of a few bytes: a full disk */
  close(w);
  /* By rename: a reader sees the old record or the new one, never half of one. */
  if (rc == 0 && rename(tmp, rec) != 0) rc = -errno;
  if (rc != 0) unlink(tmp);
  return rc;
}

int mn_ship_record_ok(const char *blob) {
  char want[MN_SHIP_RECORD_MAX], have[MN_SHIP_RECORD_MAX], rec[PATH_MAX];
  struct stat st;
  if (stat(blob, &st) != 0 || snprintf(rec, sizeof(rec), "%s.ok", blob) >= (int)sizeof(rec)) return 0;
  int fd = open(rec, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t r = read(fd, have, sizeof(have) - 1);
  close(fd);
  if (r <= 0) return 0;
  have[r] = '\0';
  record_text(&st, want, sizeof(want));
  return strcmp(want, have) == 0;
}

/* ---- ELF identity --------------------------------------------------------------------------- */

int mn_elf_identify(const void *p, size_t n, mn_elf_id_t *out) {
  const uint8_t *b = p;
  if (n < MN_ELF_HEAD || memcmp(b, "\x7f" "ELF", 4) != 0) return MN_EINVAL;
  if ((b[4] != 1 && b[4] != 2) || (b[5] != 1 && b[5] != 2)) return MN_EINVAL;
  out->elf_class = b[4];
  /* e_type and e_machine are 16-bit in the file's own byte order (EI_DATA: 1 little, 2 big). */
  out->type = b[5] == 1 ? b[16] | b[17] << 8 : b[16] << 8 | b[17];
  out->machine = b[5] == 1 ? b[18] | b[19] << 8 : b[18] << 8 | b[19];
  return 0;
}

int mn_elf_self(mn_elf_id_t *out) {
  uint8_t head[MN_ELF_HEAD];
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t r = read(fd, head, sizeof(head));
  close(fd);
  return r == (ssize_t)sizeof(head) ? mn_elf_identify(head, sizeof(head), out) : MN_EINVAL;
}

const char *mn_elf_machine_name(int machine, char *buf, size_t n) {
  static const struct {
    int m;
    const char *name;
  } names[] = {{3, "i386"}, {8, "mips"}, {20, "ppc"}, {21, "ppc64"}, {22, "s390x"}, {40, "arm"},
               {62, "x86_64"}, {183, "aarch64"}, {190, "cuda"}, {243, "riscv"}, {258, "loongarch"}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (names[i].m == machine) return names[i].name;
  snprintf(buf, n, "machine %d", machine);
  return buf;
}

/* ---- messages ------------------------------------------------------------------------------- */

static int bad(char *err, size_t errlen, const char *name, const char *layout, const char *what) {
  snprintf(err, errlen, "malformed %s: want %s; %s", name, layout, what);
  return MN_EPROTO;
}

#define ASK_LAYOUT "[40, hash: bin(32), size, path, place]"
#define DATA_LAYOUT "[41, hash: bin(32), size, offset, chunk: bin, self: bool, subs]"

static int get_hash(const msgpack_object *m, const uint8_t **hash) {
  const char *p;
  size_t n;
  if (mn_get_bin(m, 1, &p, &n) != 0 || n != MN_SHIP_HASH_LEN) return MN_EPROTO;
  *hash = (const uint8_t *)p;
  return 0;
}

int mn_msg_parse_ship_ask(const msgpack_object *m, mn_msg_ship_ask_t *out, char *err, size_t errlen) {
  if (mn_msg_type(m) != MN_MSG_SHIP_ASK || m->via.array.size < 5) return bad(err, errlen, "SHIP_ASK", ASK_LAYOUT, "too few elements");
  if (get_hash(m, &out->hash) != 0) return bad(err, errlen, "SHIP_ASK", ASK_LAYOUT, "hash (element 1) is not a bin of 32 bytes");
  if (mn_get_u64(m, 2, &out->size) != 0 || out->size > MN_SHIP_MAX_SIZE)
    return bad(err, errlen, "SHIP_ASK", ASK_LAYOUT, "size (element 2) is not a uint up to MN_SHIP_MAX_SIZE");
  if (mn_get_str(m, 3, &out->path, &out->path_len) != 0 || out->path_len > MN_SHIP_MAX_PATH)
    return bad(err, errlen, "SHIP_ASK", ASK_LAYOUT, "path (element 3) is not a str of at most 4096 bytes");
  if (mn_get_str(m, 4, &out->place, &out->place_len) != 0 || out->place_len > MN_SHIP_MAX_PATH)
    return bad(err, errlen, "SHIP_ASK", ASK_LAYOUT, "place (element 4) is not a str of at most 4096 bytes");
  return 0;
}

int mn_msg_parse_ship_data(const msgpack_object *m, mn_msg_ship_data_t *out, char *err, size_t errlen) {
  const msgpack_object *a = m->via.array.ptr;
  if (mn_msg_type(m) != MN_MSG_SHIP_DATA || m->via.array.size < 7) return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "too few elements");
  if (get_hash(m, &out->hash) != 0) return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "hash (element 1) is not a bin of 32 bytes");
  if (mn_get_u64(m, 2, &out->size) != 0 || mn_get_u64(m, 3, &out->offset) != 0 || out->size > MN_SHIP_MAX_SIZE)
    return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "size or offset (elements 2, 3) is not a uint");
  if (mn_get_bin(m, 4, &out->chunk, &out->len) != 0 || out->offset > out->size || out->len > out->size - out->offset)
    return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "chunk (element 4) is not a bin inside the file");
  if (a[5].type != MSGPACK_OBJECT_BOOLEAN || a[6].type != MSGPACK_OBJECT_ARRAY || a[6].via.array.size % 3 != 0)
    return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "self (element 5) is not a bool or subs (element 6) not triples");
  out->self = a[5].via.boolean;
  out->subs = &a[6];
  for (uint32_t i = 0; i < out->subs->via.array.size; i += 3) {
    const msgpack_object *t = &out->subs->via.array.ptr[i];
    if (t[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || t[1].type != MSGPACK_OBJECT_BOOLEAN ||
        t[2].type != MSGPACK_OBJECT_ARRAY || t[2].via.array.size % 3 != 0)
      return bad(err, errlen, "SHIP_DATA", DATA_LAYOUT, "a sub is not an (index, self, subs) triple");
  }
  return 0;
}

static int pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

static int pack_hash(msgpack_packer *pk, const uint8_t hash[MN_SHIP_HASH_LEN]) {
  return msgpack_pack_bin(pk, MN_SHIP_HASH_LEN) | msgpack_pack_bin_body(pk, hash, MN_SHIP_HASH_LEN);
}

static int finish(mn_buf_t *b, size_t start, int failed) {
  if (failed) {
    b->len = start;
    return MN_ENOMEM;
  }
  mn_frame_end(b, start);
  return 0;
}

int mn_msg_pack_ship_ask(mn_buf_t *b, const uint8_t hash[MN_SHIP_HASH_LEN], uint64_t size, const char *path,
                         const char *place) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, mn_buf_write_cb);
  size_t s = mn_frame_begin(b);
  int f = msgpack_pack_array(&pk, 5) | msgpack_pack_int(&pk, MN_MSG_SHIP_ASK) | pack_hash(&pk, hash);
  f |= msgpack_pack_uint64(&pk, size) | pack_str(&pk, path) | pack_str(&pk, place);
  return finish(b, s, f);
}

int mn_msg_ship_data_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint8_t hash[MN_SHIP_HASH_LEN],
                          uint64_t size, uint64_t offset, const char *chunk, size_t len, int self, uint32_t nsubs) {
  msgpack_packer_init(pk, b, mn_buf_write_cb);
  *start = mn_frame_begin(b);
  int f = msgpack_pack_array(pk, 7) | msgpack_pack_int(pk, MN_MSG_SHIP_DATA) | pack_hash(pk, hash);
  f |= msgpack_pack_uint64(pk, size) | msgpack_pack_uint64(pk, offset);
  f |= msgpack_pack_bin(pk, len) | msgpack_pack_bin_body(pk, chunk, len);
  f |= (self ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) | msgpack_pack_array(pk, 3 * nsubs);
  if (f != 0) b->len = *start;
  return f != 0 ? MN_ENOMEM : 0;
}

int mn_msg_pack_ship_state(mn_buf_t *b, const uint8_t hash[MN_SHIP_HASH_LEN], const char *state, const char *detail) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, b, mn_buf_write_cb);
  size_t s = mn_frame_begin(b);
  int f = msgpack_pack_array(&pk, 4) | msgpack_pack_int(&pk, MN_MSG_SHIP_STATE) | pack_hash(&pk, hash);
  f |= pack_str(&pk, state) | pack_str(&pk, detail);
  return finish(b, s, f);
}
