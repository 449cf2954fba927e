/* sock.h - blocking socket helpers for the proc runtime, tests and benchmarks. */
#ifndef MN_SOCK_H
#define MN_SOCK_H

#include "wire.h"

/* Listens on host:port (port 0 picks one); returns the fd or -errno and sets *bound. */
int mn_sock_listen(const char *host, int port, int *bound);
/* Connects to host:port; returns the fd or -errno. TCP_NODELAY is set. */
int mn_sock_connect(const char *host, int port);
void mn_sock_nodelay(int fd);
/* TCP keepalive that ends a connection whose peer's kernel stays silent about timeout_ms (probes after a
 * third of it idle, then every third; unacknowledged data the same): a link nobody writes to still dies. */
void mn_sock_keepalive(int fd, uint64_t timeout_ms);
/* Writes all n bytes, retrying on EINTR and short writes; returns 0 or -errno. */
int mn_write_all(int fd, const void *p, size_t n);
/* Writes a then b with one writev where possible (b straight from its memory); 0 or -errno. */
int mn_write2_all(int fd, const void *a, size_t an, const void *b, size_t bn);
/*
 * Reads until `in` holds one complete frame of at most `max` bytes; returns
 * its body length and sets *body (pointing into in), or MN_ECLOSED /
 * MN_ETIMEDOUT (timeout_ms is a total, not per read) / MN_EFRAME / -errno.
 * The caller consumes MN_FRAME_HEADER + length bytes when done.
 */
int64_t mn_read_frame(int fd, mn_buf_t *in, const char **body, size_t max, int timeout_ms);
/* Splits "host:port"; returns 0 or -EINVAL. */
int mn_parse_addr(const char *addr, char *host, size_t hostlen, int *port);

#endif
