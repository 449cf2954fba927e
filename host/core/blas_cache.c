/*
 * blas_cache.c - the BLAS choice of blas_choose.c kept per CPU and OpenBLAS
 * library, so the probes (~100 ms each) run once per machine, not at every
 * agent's and monarch-run's start. The file is named by a hash of what
 * decides the answer (the CPU's identity and features, and the library
 * search path) and holds that key in full; the library the probes loaded is
 * recorded with its size and mtime, so an upgraded OpenBLAS (a new file) is
 * measured again. Text, a line each:
 *   monarch-blas 1
 *   key AuthenticAMD|AMD EPYC|a20f10|avx,avx2,fma|LD_LIBRARY_PATH=
 *   lib /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so 123456 1671400000
 *   version 0.3.21
 *   trial - Zen 1 35.8
 *   trial HASWELL Haswell 1 47.8
 *   trial SKYLAKEX ? 0 0 killed by SIGILL
 *   chosen 1
 */
#include "blas_choose.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CACHE_FORMAT 1          /* bumped when the probe's shapes or the file's layout change */
#define CACHE_LOCK_WAIT_MS 3000 /* how long a start waits for another's probes before probing itself */

/* What decides the answer, as one line. */
static void cache_key(char *key, size_t n) {
  mn_cpu_features_t f;
  mn_cpu_read(&f);
  const char *lp = getenv("LD_LIBRARY_PATH");
  snprintf(key, n, "%s|%s|%x|%s%s%s%s%s%s%s%s%s|LD_LIBRARY_PATH=%s", f.vendor, f.brand, f.signature,
           f.avx ? "avx," : "", f.avx2 ? "avx2," : "", f.fma ? "fma," : "", f.avx512f ? "avx512f," : "",
           f.avx512bw ? "avx512bw," : "", f.avx512vl ? "avx512vl," : "", f.avx512dq ? "avx512dq," : "",
           f.avx512cd ? "avx512cd," : "", f.avx512_bf16 ? "avx512_bf16," : "", lp ? lp : "");
}

/* FNV-1a, 64 bits: a file name for the key (the key itself is checked inside). */
static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int mn_blas_cache_path(char *path, size_t n) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char dir[400];
  if (xdg != NULL && xdg[0] == '/') snprintf(dir, sizeof(dir), "%s/monarch", xdg);
  else if (home != NULL && home[0] == '/') snprintf(dir, sizeof(dir), "%s/.cache/monarch", home);
  else return -1;
  char *slash = strrchr(dir, '/'); /* the parent first: ~/.cache may not exist yet */
  *slash = '\0';
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -1;
  *slash = '/';
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -1;
  char key[512];
  cache_key(key, sizeof(key));
  int w = snprintf(path, n, "%s/blas-%016llx", dir, (unsigned long long)hash(key));
  return w > 0 && (size_t)w < n ? 0 : -1;
}

/* Reads one "trial NAME CORE OK GFLOPS [WHY]" line into t; 0 or -1. */
static int read_trial(const char *line, mn_blas_trial_t *t) {
  int used = 0;
  memset(t, 0, sizeof(*t));
  if (sscanf(line, "trial %23s %31s %d %lf %n", t->name, t->core, &t->ok, &t->gflops, &used) < 4) return -1;
  if (strcmp(t->name, "-") == 0) t->name[0] = '\0';
  if (used > 0) snprintf(t->why, sizeof(t->why), "%.*s", (int)strcspn(line + used, "\n"), line + used);
  return 0;
}

/* Whether the library at lib still has this size and mtime. */
static int lib_same(const char *lib, long long size, long long mtime) {
  struct stat st;
  return stat(lib, &st) == 0 && (long long)st.st_size == size && (long long)st.st_mtime == mtime;
}

int mn_blas_cache_read(const char *path, mn_blas_choice_t *c) {
  FILE *fp = fopen(path, "r");
  if (fp == NULL) return -1;
  char line[640], key[512], want[512];
  long long size = -1, mtime = -1;
  int format = 0, ok = 1, keyed = 0;
  memset(c, 0, sizeof(*c));
  c->chosen = -1;
  cache_key(want, sizeof(want));
  while (ok && fgets(line, sizeof(line), fp) != NULL) {
    if (sscanf(line, "monarch-blas %d", &format) == 1) ok = format == CACHE_FORMAT;
    else if (strncmp(line, "key ", 4) == 0) {
      snprintf(key, sizeof(key), "%.*s", (int)strcspn(line + 4, "\n"), line + 4);
      ok = keyed = strcmp(key, want) == 0;
    } else if (sscanf(line, "lib %255s %lld %lld", c->lib, &size, &mtime) == 3) ok = lib_same(c->lib, size, mtime);
    else if (sscanf(line, "version %15s", c->version) == 1) {
    } else if (strncmp(line, "trial ", 6) == 0) ok = c->n < MN_BLAS_MAX_TRIALS && read_trial(line, &c->trial[c->n++]) == 0;
    else if (sscanf(line, "chosen %d", &c->chosen) != 1) ok = 0;
  }
  fclose(fp);
  if (!ok || !keyed || format != CACHE_FORMAT || size < 0 || c->n < 1 || c->chosen < 0 || c->chosen >= c->n) {
    memset(c, 0, sizeof(*c));
    return -1;
  }
  c->cached = 1;
  return 0;
}

int mn_blas_cache_write(const char *path, const mn_blas_choice_t *c) {
  struct stat st;
  if (stat(c->lib, &st) != 0) return -1; /* no library to check it against later */
  char tmp[600], key[512];
  snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
  FILE *fp = fopen(tmp, "w");
  if (fp == NULL) return -1;
  cache_key(key, sizeof(key));
  fprintf(fp, "monarch-blas %d\nkey %s\nlib %s %lld %lld\nversion %s\n", CACHE_FORMAT, key, c->lib,
          (long long)st.st_size, (long long)st.st_mtime, c->version);
  for (int i = 0; i < c->n; i++) {
    const mn_blas_trial_t *t = &c->trial[i];
    fprintf(fp, "trial %s %s %d %.1f%s%s\n", t->name[0] ? t->name : "-", t->core, t->ok, t->gflops,
            t->ok ? "" : " ", t->ok ? "" : t->why);
  }
  fprintf(fp, "chosen %d\n", c->chosen);
  int bad = ferror(fp);
  if (fclose(fp) != 0 || bad || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

int mn_blas_cache_lock(const char *path) {
  char lp[600];
  snprintf(lp, sizeof(lp), "%s.lock", path);
  int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  struct timespec step = {0, 10 * 1000000};
  for (int waited = 0; waited < CACHE_LOCK_WAIT_MS; waited += 10) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK && errno != EINTR) break;
    nanosleep(&step, NULL);
  }
  close(fd); /* waited long enough: probe anyway, unlocked */
  return -1;
}
