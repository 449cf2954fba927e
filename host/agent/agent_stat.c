/*
 * agent_stat.c - what STATUS tells of a proc beyond its own status line, for
 * `monarch-run --top`: its CPU time and resident memory as the kernel counts
 * them (/proc/PID/stat), how long its current call has run, how
 * old its last status line is, whether it is hung or still starting, and its
 * GPU memory (agent_gpu.c). All of it is read when a STATUS asks, so an
 * agent nobody watches pays nothing.
 */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>

/*
 * Notes a status line of p (before its fields take the new values): a call
 * has been running since the first line that showed it. A line whose count of
 * calls run moved on shows a new call, even under the same kernel name. The
 * call started between the previous line and this one, so the time reported
 * is a lower bound, short by at most one status interval (a second).
 */
void mn__agent_stat_line(aproc_t *p, uint64_t executed, const char *running, uint64_t now) {
  if (strcmp(running, "-") == 0) p->running_since = 0;
  else if (p->running_since == 0 || executed != p->executed || strcmp(running, p->running) != 0)
    p->running_since = now;
}

/* Reads /proc/PID/stat into buf (NUL-terminated); 0 or -errno. One open and one read: no stdio buffer to fill. */
static int read_stat(int64_t pid, char *buf, size_t n) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t got = read(fd, buf, n - 1);
  int e = errno;
  close(fd);
  if (got <= 0) return got < 0 ? -e : -EIO;
  buf[got] = '\0';
  return 0;
}

/*
 * CPU seconds (user + system) and resident bytes of pid, from the one file
 * that holds both; 0, or -errno / MN_EPROTO for an unreadable or odd file.
 */
static int cpu_and_rss(int64_t pid, double *cpu, int64_t *rss) {
  char buf[1024];
  int rc = read_stat(pid, buf, sizeof(buf));
  if (rc != 0) return rc;
  /* The command name (field 2) may hold blanks and parentheses: fields are counted after its last ')'. */
  const char *s = strrchr(buf, ')');
  unsigned long long ut, st;
  long long pages;
  if (s == NULL || sscanf(s + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
                                 "%*u %*u %lld", &ut, &st, &pages) != 3)
    return MN_EPROTO;
  long hz = sysconf(_SC_CLK_TCK);
  *cpu = (double)(ut + st) / (double)(hz > 0 ? hz : 100);
  *rss = pages * (int64_t)sysconf(_SC_PAGESIZE);
  return 0;
}

/* Packs a key and a double, or nil when it is unknown. */
static void pack_opt_double(msgpack_packer *pk, const char *key, int known, double v) {
  mn_pack_cstr(pk, key);
  if (known) msgpack_pack_double(pk, v);
  else msgpack_pack_nil(pk);
}

/* Packs a key and an int, or nil when it is unknown (negative). */
static void pack_opt_int(msgpack_packer *pk, const char *key, int64_t v) {
  mn_pack_cstr(pk, key);
  if (v >= 0) msgpack_pack_int64(pk, v);
  else msgpack_pack_nil(pk);
}

void mn__agent_stat_pack(msgpack_packer *pk, const aproc_t *p, int64_t pid, uint64_t now) {
  double cpu = 0;
  int64_t rss = -1;
  int ok = cpu_and_rss(pid, &cpu, &rss) == 0;
  pack_opt_double(pk, "cpu", ok, cpu);
  pack_opt_int(pk, "rss", ok ? rss : -1);
  pack_opt_int(pk, "gpu_mem", mn__agent_gpu_bytes(pid));
  mn_pack_cstr(pk, "running_for");
  msgpack_pack_double(pk, p->running_since ? (double)(now - p->running_since) / 1e3 : 0.0);
  mn_pack_cstr(pk, "status_age");
  msgpack_pack_double(pk, (double)(now - p->last_status) / 1e3);
  mn_pack_cstr(pk, "hung");
  if (p->hung) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
  mn_pack_cstr(pk, "ready");
  if (p->reported) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
}
