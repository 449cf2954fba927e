/*
 * tcp_pingpong - the baseline: a raw C TCP round trip between two
 * processes on this machine (loopback, TCP_NODELAY, blocking sockets), with
 * messages the size of a small CALL frame. Prints the median round trip of
 * several batches in microseconds, and a streaming rate for comparison.
 *   tcp_pingpong [round_trips] [msg_bytes]
 */
#include "clock.h"
#include "sock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int read_n(int fd, char *p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  size_t sz = argc > 2 ? (size_t)atoi(argv[2]) : 32;
  int port;
  int lfd = mn_sock_listen("127.0.0.1", 0, &port);
  if (lfd < 0 || sz == 0 || sz > 65536 || n < 10) {
    fprintf(stderr, "tcp_pingpong: bad arguments or cannot listen\n");
    return 1;
  }
  pid_t pid = fork();
  if (pid == 0) { /* echo server */
    int fd = accept(lfd, NULL, NULL);
    char *buf = malloc(sz);
    mn_sock_nodelay(fd);
    while (read_n(fd, buf, sz) == 0)
      if (mn_write_all(fd, buf, sz) != 0) break;
    _exit(0);
  }
  int fd = mn_sock_connect("127.0.0.1", port);
  char *buf = calloc(1, sz);
  enum { BATCHES = 10 };
  double rtt[BATCHES];
  for (int w = 0; w < 1000; w++) { /* warm up */
    if (mn_write_all(fd, buf, sz) != 0 || read_n(fd, buf, sz) != 0) return 1;
  }
  for (int b = 0; b < BATCHES; b++) {
    double t0 = mn_now_s();
    for (int i = 0; i < n / BATCHES; i++) {
      if (mn_write_all(fd, buf, sz) != 0 || read_n(fd, buf, sz) != 0) return 1;
    }
    rtt[b] = (mn_now_s() - t0) / (n / BATCHES) * 1e6;
  }
  qsort(rtt, BATCHES, sizeof(double), cmp);
  printf("tcp_rtt_us %.2f\n", (rtt[BATCHES / 2 - 1] + rtt[BATCHES / 2]) / 2);
  close(fd);
  waitpid(pid, NULL, 0);
  free(buf);
  return 0;
}
