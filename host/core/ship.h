/*
 * ship.h - what the controller and the host agents share to ship files: the
 * content hash (BLAKE2b-256, libsodium), the ELF identity a library is checked
 * against, and the three SHIP messages (docs/protocol.md section 5, "Shipping").
 * The agent's cache is host/agent/agent_ship.c; the controller's sending,
 * host/controller/ctl_ship.c and lua/monarch/ship.lua.
 */
#ifndef MN_SHIP_H
#define MN_SHIP_H

#include "wire.h"

#include <stddef.h>
#include <stdint.h>

#define MN_SHIP_HASH_LEN 32            /* BLAKE2b-256 (a tree of them, ship.c): a file's content address */
#define MN_SHIP_HEX_LEN 64             /* its hex spelling, the cache's file name */
#define MN_SHIP_CHUNK (1u << 20)       /* bytes per SHIP_DATA: big files never travel as one frame */
#define MN_SHIP_MAX_SIZE (1ull << 36)  /* largest file shipped (64 GiB) */
#define MN_SHIP_MAX_PATH 4096          /* longest path in SHIP_ASK */
#define MN_SHIP_ID_LEN 32              /* a cache directory's id: hex of 16 random bytes, told in WELCOME */
#define MN_SHIP_RECORD_MAX 128         /* a verification record's text */

/* The hex spelling of a hash, NUL-terminated. */
void mn_ship_hex(const uint8_t hash[MN_SHIP_HASH_LEN], char out[MN_SHIP_HEX_LEN + 1]);
/* hash <- hex; 0, or MN_EINVAL for anything but 64 hex digits. */
int mn_ship_unhex(const char *hex, size_t n, uint8_t hash[MN_SHIP_HASH_LEN]);
/* The hash of n bytes: leaves on up to 8 threads (a tree of BLAKE2b-256, ship.c). */
void mn_ship_hash(const void *p, size_t n, uint8_t hash[MN_SHIP_HASH_LEN]);
/* Its parts, for bytes that come a chunk at a time: the number of MN_SHIP_CHUNK pieces of a file of size
 * bytes, the leaf hash of one piece, and the hash from the file's size and its pieces' leaves in order. */
uint64_t mn_ship_pieces(uint64_t size);
void mn_ship_leaf(const void *p, size_t n, uint8_t leaf[MN_SHIP_HASH_LEN]);
void mn_ship_root(const uint8_t *leaves, uint64_t size, uint8_t hash[MN_SHIP_HASH_LEN]);
/* The hash of a file (streamed); 0 and *size, or -errno. */
int mn_ship_hash_file(const char *path, uint8_t hash[MN_SHIP_HASH_LEN], uint64_t *size);
/* The same of an open file, read from its start (the caller keeps fd). */
int mn_ship_hash_fd(int fd, uint8_t hash[MN_SHIP_HASH_LEN], uint64_t *size);

/*
 * Verification records. A cached file <blob> that an agent hashed has a record <blob>.ok: the device, inode,
 * size and mtime (ns) its stat gave right after. While a stat of the blob still says the same, nothing wrote
 * to it since (any write moves the mtime), so an agent or proc sharing the cache uses it without hashing it
 * again; one that differs is hashed again before use. The record guards against accidents (a disk, an edit,
 * a half-copied cache), not against the cache's owner, who can run anything as the agent anyway.
 */
/* Writes blob's record from fd (open on blob, whose bytes were just hashed); 0 or -errno. */
int mn_ship_record_write(const char *blob, int fd);
/* 1 if blob's record matches what stat says of blob now; 0 if not, or there is no record. */
int mn_ship_record_ok(const char *blob);

/* An ELF file's identity, from its first bytes. */
typedef struct {
  int elf_class; /* 1 ELFCLASS32, 2 ELFCLASS64 */
  int machine;   /* e_machine (EM_X86_64 62, EM_AARCH64 183, ...) */
  int type;      /* e_type (ET_DYN 3 for a shared object) */
} mn_elf_id_t;

#define MN_ELF_HEAD 20 /* bytes of an ELF header that hold class, byte order, type and machine */

/* Reads the identity of the n bytes at p; 0, or MN_EINVAL (not ELF, or too short). */
int mn_elf_identify(const void *p, size_t n, mn_elf_id_t *out);
/* The running binary's (/proc/self/exe); 0, or a negative code. */
int mn_elf_self(mn_elf_id_t *out);
/* A machine's name ("x86_64", "aarch64", ...), or "machine N" written into buf. */
const char *mn_elf_machine_name(int machine, char *buf, size_t n);

/* SHIP_ASK [40, hash, size, path, place]: does the agent hold this file? path: where the controller has it
 * (an agent that has the same bytes there uses them as is); place: "" or a relative path in the job's
 * workspace to put it at (hosts:sync). */
typedef struct {
  const uint8_t *hash;
  uint64_t size;
  const char *path, *place;
  size_t path_len, place_len;
} mn_msg_ship_ask_t;

/* SHIP_DATA [41, hash, size, offset, chunk, self, subs]: bytes [offset, offset + len) of the file; self: this
 * agent wants them (else it only hands them on); subs: flat (index, self, subs) triples for its children. */
typedef struct {
  const uint8_t *hash;
  uint64_t size, offset;
  const char *chunk;
  size_t len;
  int self;
  const msgpack_object *subs;
} mn_msg_ship_data_t;

int mn_msg_parse_ship_ask(const msgpack_object *m, mn_msg_ship_ask_t *out, char *err, size_t errlen);
int mn_msg_parse_ship_data(const msgpack_object *m, mn_msg_ship_data_t *out, char *err, size_t errlen);
int mn_msg_pack_ship_ask(mn_buf_t *b, const uint8_t hash[MN_SHIP_HASH_LEN], uint64_t size, const char *path,
                         const char *place);
/* SHIP_DATA's head up to its subs array (the caller packs nsubs * 3 elements after it, then mn_frame_end). */
int mn_msg_ship_data_head(mn_buf_t *b, msgpack_packer *pk, size_t *start, const uint8_t hash[MN_SHIP_HASH_LEN],
                          uint64_t size, uint64_t offset, const char *chunk, size_t len, int self, uint32_t nsubs);
/* SHIP_STATE [42, hash, state, detail]. */
int mn_msg_pack_ship_state(mn_buf_t *b, const uint8_t hash[MN_SHIP_HASH_LEN], const char *state, const char *detail);

#endif
