/*
 * shard: a proc writes and reads its own part of a training checkpoint, so
 * the bytes go from its memory to the file system and back without passing
 * through the controller (lua/monarch/train_ckpt.lua).
 *
 * A shard file has monarch.checkpoint's layout (lua/monarch/checkpoint.lua):
 * the controller packs the header (magic, version, step, meta, section
 * table: everything known without the bytes) and the proc appends the CRC-32
 * of the header and the payload, then the tensors' bytes. So a one-shard
 * checkpoint is an ordinary checkpoint file that checkpoint.read accepts.
 */
#include "monarch_kernel.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define PATH_MAX_LEN 4096
#define CRC_CHUNK (1u << 30) /* zlib's crc32 takes a uInt length */

static uint32_t crc_update(uint32_t crc, const void *p, size_t n) {
  const unsigned char *b = p;
  while (n > 0) {
    uInt k = n > CRC_CHUNK ? CRC_CHUNK : (uInt)n;
    crc = (uint32_t)crc32(crc, b, k);
    b += k;
    n -= k;
  }
  return crc;
}

/* Copies a string argument into out as a C string; fails on an empty or too long one. */
static int path_arg(mk_ctx_t *ctx, const mk_arg_t *a, char *out, const char *what) {
  if (a->v.str.len == 0 || a->v.str.len >= PATH_MAX_LEN)
    return mk_errorf(ctx, "%s: %s must be a path of 1..%d bytes", ctx->kernel, what, PATH_MAX_LEN - 1);
  memcpy(out, a->v.str.ptr, a->v.str.len);
  out[a->v.str.len] = '\0';
  return 0;
}

/* The tensors from argv[first] on: every one must be a CPU tensor. */
static int tensor_args(mk_ctx_t *ctx, int argc, const mk_arg_t *argv, int first) {
  for (int i = first; i < argc; i++) {
    if (argv[i].type != MK_ARG_TENSOR)
      return mk_errorf(ctx, "%s: argument %d is not a tensor", ctx->kernel, i + 1);
    if (argv[i].v.tensor->device >= 0)
      return mk_errorf(ctx, "%s: argument %d is on cuda:%d; shard reads and writes CPU tensors (copy it to one first)",
                       ctx->kernel, i + 1, argv[i].v.tensor->device);
  }
  return 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n > 0) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Syncs the directory of path, so that a rename in it survives a crash (best effort). */
static void sync_parent(const char *path) {
  char dir[PATH_MAX_LEN];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    slash[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof(dir), ".");
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

/* shard_write(tmp, path, head, t...): writes head, the CRC-32 and the tensors to tmp, syncs it and renames it to
 * path. Returns the CRC-32 (of head and payload, as stored). */
static int k_shard_write(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  char tmp[PATH_MAX_LEN], path[PATH_MAX_LEN];
  if (path_arg(ctx, &argv[0], tmp, "tmp") || path_arg(ctx, &argv[1], path, "path") || tensor_args(ctx, argc, argv, 3))
    return -1;
  const mk_arg_t *head = &argv[2];
  uint32_t crc = crc_update((uint32_t)crc32(0L, Z_NULL, 0), head->v.str.ptr, head->v.str.len);
  for (int i = 3; i < argc; i++)
    crc = crc_update(crc, argv[i].v.tensor->data, argv[i].v.tensor->nbytes);
  unsigned char le[4] = { (unsigned char)crc, (unsigned char)(crc >> 8), (unsigned char)(crc >> 16),
                          (unsigned char)(crc >> 24) };
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return mk_errorf(ctx, "shard_write: cannot create %s: %s", tmp, strerror(errno));
  int bad = write_all(fd, head->v.str.ptr, head->v.str.len) || write_all(fd, le, 4);
  for (int i = 3; i < argc && !bad; i++)
    bad = write_all(fd, argv[i].v.tensor->data, argv[i].v.tensor->nbytes);
  if (bad || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return mk_errorf(ctx, "shard_write: cannot write %s: %s", tmp, strerror(e));
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return mk_errorf(ctx, "shard_write: cannot rename %s to %s: %s", tmp, path, strerror(e));
  }
  sync_parent(path);
  return mk_return_int(ctx, (int64_t)crc);
}

/* Reads the rest of an open shard after its head (head_len bytes) into the tensors and checks the CRC-32. */
static int read_payload(mk_ctx_t *ctx, int fd, const char *path, size_t head_len, int argc, const mk_arg_t *argv,
                        int first) {
  unsigned char *head = malloc(head_len ? head_len : 1), le[4];
  if (!head)
    return mk_errorf(ctx, "shard_read: out of memory for the header of %s", path);
  if (read_all(fd, head, head_len) || read_all(fd, le, 4)) {
    free(head);
    return mk_errorf(ctx, "%s: truncated header", path);
  }
  uint32_t want = (uint32_t)le[0] | (uint32_t)le[1] << 8 | (uint32_t)le[2] << 16 | (uint32_t)le[3] << 24;
  uint32_t crc = crc_update((uint32_t)crc32(0L, Z_NULL, 0), head, head_len);
  free(head);
  for (int i = first; i < argc; i++) {
    mk_tensor_t *t = argv[i].v.tensor;
    if (read_all(fd, t->data, t->nbytes))
      return mk_errorf(ctx, "%s: truncated payload (section %d)", path, i - first + 1);
    crc = crc_update(crc, t->data, t->nbytes);
  }
  if (crc != want)
    return mk_errorf(ctx, "%s: checksum mismatch (stored %08x, computed %08x): the file is corrupt", path, want, crc);
  return 0;
}

/* shard_read(path, head_len, t...): fills the tensors from a shard whose header (head_len bytes, parsed by the
 * controller) describes exactly their sizes; fails on a wrong size or a CRC-32 mismatch. */
static int k_shard_read(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  char path[PATH_MAX_LEN];
  if (path_arg(ctx, &argv[0], path, "path") || tensor_args(ctx, argc, argv, 2))
    return -1;
  if (argv[1].v.i < 0)
    return mk_errorf(ctx, "shard_read: head_len must not be negative");
  size_t head_len = (size_t)argv[1].v.i, total = head_len + 4;
  for (int i = 2; i < argc; i++)
    total += argv[i].v.tensor->nbytes;
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return mk_errorf(ctx, "%s: cannot open: %s", path, strerror(errno));
  off_t size = lseek(fd, 0, SEEK_END);
  if (size != (off_t)total) {
    close(fd);
    return mk_errorf(ctx, "%s: size is %lld bytes but its tensors need %zu (truncated or padded)", path,
                     (long long)size, total);
  }
  lseek(fd, 0, SEEK_SET);
  int rc = read_payload(ctx, fd, path, head_len, argc, argv, 2);
  close(fd);
  return rc < 0 ? -1 : mk_return_nil(ctx);
}

/* shard_crc(t...): the CRC-32 of the tensors' bytes in order (zlib's, as checkpoint.crc32), so that replicas are
 * compared without fetching them. */
static int k_shard_crc(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  if (tensor_args(ctx, argc, argv, 0))
    return -1;
  uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
  for (int i = 0; i < argc; i++)
    crc = crc_update(crc, argv[i].v.tensor->data, argv[i].v.tensor->nbytes);
  return mk_return_int(ctx, (int64_t)crc);
}

/* shard_snap(tag, step, a1, b1, a2, b2, ...): b_i = a_i for every pair, then tag[0] = step. The tag says which step
 * the copies hold: it is -1 while they are being made, so a proc that is stopped half way is never trusted. */
static int k_shard_snap(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  if (tensor_args(ctx, 1, argv, 0) || tensor_args(ctx, argc, argv, 2))
    return -1;
  mk_tensor_t *tag = argv[0].v.tensor;
  if (tag->dtype != MK_I64 || tag->numel < 1)
    return mk_errorf(ctx, "shard_snap: the tag must be an i64 tensor of at least one element");
  if ((argc - 2) % 2 != 0)
    return mk_errorf(ctx, "shard_snap: wants pairs of tensors (source, copy) after the tag and the step");
  for (int i = 2; i < argc; i += 2) {
    const mk_tensor_t *a = argv[i].v.tensor, *b = argv[i + 1].v.tensor;
    if (a->nbytes != b->nbytes || a->dtype != b->dtype)
      return mk_errorf(ctx, "shard_snap: pair %d differs in dtype or size", i / 2);
  }
  int64_t *t = tag->data;
  t[0] = -1;
  for (int i = 2; i < argc; i += 2)
    if (argv[i].v.tensor->data != argv[i + 1].v.tensor->data)
      memmove(argv[i + 1].v.tensor->data, argv[i].v.tensor->data, argv[i].v.tensor->nbytes);
  t[0] = (int64_t)mk_arg_number(&argv[1]);
  return mk_return_nil(ctx);
}

static const mk_kernel_t kernels[] = {
  { "shard_snap", k_shard_snap, "tn*",
    "shard_snap(tag, step, a1, b1, ...): copies each a_i to b_i, then sets tag[0] = step (-1 while copying)." },
  { "shard_write", k_shard_write, "ssb*",
    "shard_write(tmp, path, head, t...): head, its CRC-32 and the tensors' bytes to tmp, synced, renamed to path; "
    "returns the CRC-32." },
  { "shard_read", k_shard_read, "si*",
    "shard_read(path, head_len, t...): fills the tensors from a shard written by shard_write, checking its size and "
    "CRC-32." },
  { "shard_crc", k_shard_crc, "*", "shard_crc(t...): CRC-32 of the tensors' bytes, in order." },
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "shard", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
