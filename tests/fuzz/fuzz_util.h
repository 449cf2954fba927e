/*
 * fuzz_util.h - helpers shared by the libFuzzer targets (header-only: each
 * target is one translation unit plus the project's objects).
 */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Aborts with a message: libFuzzer records the input as a crash. */
#define FZ_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz: check failed: %s: ", #cond);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

static inline uint64_t fz_be(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/*
 * Known issue F1 (docs/security.md, "Fuzzing"): msgpack-c allocates an
 * array's or map's storage from the count in its header before any element
 * arrives, so a 5-byte body announcing 2^31 elements asks for 64 GiB. This
 * walks the raw msgpack and returns 1 when some header announces more
 * elements than the bytes left could hold (str/bin payloads are not
 * copied, so a short one costs nothing). With
 * FUZZ_SKIP_OVERCOUNT=1 in the environment the targets skip such inputs so
 * that fuzzing can go on looking for other bugs while F1 is open.
 */
static inline int fz_overcount(const char *body, size_t len) {
  const unsigned char *p = (const unsigned char *)body;
  size_t i = 0;
  uint64_t need = 1; /* objects still to read */
  while (need > 0 && i < len) {
    unsigned c = p[i++];
    uint64_t items = 0, skip = 0;
    int hdr = 0;
    need--;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) { /* one byte */
    } else if (c >= 0x80 && c <= 0x8f) items = 2u * (c & 0x0f);
    else if (c >= 0x90 && c <= 0x9f) items = c & 0x0f;
    else if (c >= 0xa0 && c <= 0xbf) skip = c & 0x1f;
    else switch (c) {
      case 0xc4: case 0xd9: hdr = 1; break;                 /* bin8, str8 */
      case 0xc5: case 0xda: hdr = 2; break;                 /* bin16, str16 */
      case 0xc6: case 0xdb: hdr = 4; break;                 /* bin32, str32 */
      case 0xc7: hdr = 1; skip = 1; break;                  /* ext8: + type */
      case 0xc8: hdr = 2; skip = 1; break;
      case 0xc9: hdr = 4; skip = 1; break;
      case 0xca: skip = 4; break;
      case 0xcb: skip = 8; break;
      case 0xcc: case 0xd0: skip = 1; break;
      case 0xcd: case 0xd1: skip = 2; break;
      case 0xce: case 0xd2: skip = 4; break;
      case 0xcf: case 0xd3: skip = 8; break;
      case 0xd4: skip = 2; break;                           /* fixext: type + data */
      case 0xd5: skip = 3; break;
      case 0xd6: skip = 5; break;
      case 0xd7: skip = 9; break;
      case 0xd8: skip = 17; break;
      case 0xdc: case 0xdd: hdr = c == 0xdc ? 2 : 4; break; /* array16/32 */
      case 0xde: case 0xdf: hdr = c == 0xde ? 2 : 4; break; /* map16/32 */
      default: return 0;                                    /* 0xc1: msgpack-c refuses it */
      }
    if (hdr > 0) {
      if (len - i < (size_t)hdr) return 0; /* truncated: msgpack-c reports it */
      uint64_t n = fz_be(p + i, hdr);
      i += (size_t)hdr;
      if (c == 0xdc || c == 0xdd) items = n;
      else if (c == 0xde || c == 0xdf) items = 2 * n;
      else skip += n;
    }
    if (skip > len - i) return 0; /* a short str/bin/ext: refused without allocating */
    i += (size_t)skip;
    need += items;
    if (need > len - i) return 1; /* every element takes at least one byte */
  }
  return 0;
}

/*
 * A deterministic stand-in for libsodium's random source (nonces), reset
 * per input with fz_rng_reset, so that the same input always takes the
 * same path: install it with fz_rng_install() in LLVMFuzzerInitialize.
 * Only for targets that include <sodium.h>.
 */
#ifdef sodium_H
static uint64_t fz_rng_state;

static inline uint64_t fz_rng_next(void) {
  uint64_t x = fz_rng_state += 0x9E3779B97F4A7C15ull; /* splitmix64 */
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
static inline const char *fz_rng_name(void) { return "fuzz-counter"; }
static inline uint32_t fz_rng_random(void) { return (uint32_t)fz_rng_next(); }
static inline void fz_rng_buf(void *const buf, const size_t size) {
  unsigned char *p = buf;
  for (size_t i = 0; i < size; i++) p[i] = (unsigned char)fz_rng_next();
}
static randombytes_implementation fz_rng_impl = {fz_rng_name, fz_rng_random, NULL, NULL, fz_rng_buf, NULL};

static inline int fz_rng_install(void) { return randombytes_set_implementation(&fz_rng_impl); }
static inline void fz_rng_reset(void) { fz_rng_state = 0; }
#endif

static inline int fz_skip_overcount(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("FUZZ_SKIP_OVERCOUNT");
    v = e != NULL && strcmp(e, "1") == 0;
  }
  return v;
}

#endif
