/*
 * tcp_stream - the bulk-transfer baseline: one process streams N MiB to
 * another over loopback TCP with plain blocking send/recv from a buffer, as
 * fast as the kernel allows. Prints the median GB/s of several runs.
 *   tcp_stream [MiB] [runs]
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

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 256;
  int runs = argc > 2 ? atoi(argv[2]) : 5;
  size_t n = mib << 20, chunk = 4u << 20;
  int port;
  int lfd = mn_sock_listen("127.0.0.1", 0, &port);
  if (lfd < 0 || runs < 1 || runs > 64 || mib == 0) return 1;
  pid_t pid = fork();
  if (pid == 0) { /* receiver: lands every byte in one buffer, acks each run */
    int fd = accept(lfd, NULL, NULL);
    char *buf = malloc(n);
    for (int r = 0; r < runs; r++) {
      size_t got = 0;
      while (got < n) {
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k <= 0) _exit(1);
        got += (size_t)k;
      }
      if (mn_write_all(fd, "k", 1) != 0) _exit(1);
    }
    _exit(0);
  }
  int fd = mn_sock_connect("127.0.0.1", port);
  char *buf = malloc(n);
  memset(buf, 7, n);
  double gbs[64];
  for (int r = 0; r < runs; r++) {
    double t0 = mn_now_s();
    for (size_t off = 0; off < n; off += chunk)
      if (mn_write_all(fd, buf + off, off + chunk <= n ? chunk : n - off) != 0) return 1;
    char ack;
    if (recv(fd, &ack, 1, MSG_WAITALL) != 1) return 1;
    gbs[r] = (double)n / (mn_now_s() - t0) / 1e9;
  }
  qsort(gbs, (size_t)runs, sizeof(double), cmp);
  printf("tcp_stream_gbs %.3f\n", gbs[runs / 2]);
  waitpid(pid, NULL, 0);
  return 0;
}
