/* sock.c - see sock.h. */
#include "sock.h"

#include "clock.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

void mn_sock_nodelay(int fd) {
  int one = 1;
  /* Best effort: a socket without NODELAY is slower, not wrong. */
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) return;
}

void mn_sock_keepalive(int fd, uint64_t timeout_ms) {
  int on = 1, third = timeout_ms >= 6000 ? (int)(timeout_ms / 3000) : 1, count = 2;
  unsigned int user = (unsigned int)timeout_ms;
  /* Best effort, as for NODELAY: without it only a cut that nobody writes across goes unseen. */
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0) return;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &third, sizeof(third));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &third, sizeof(third));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res) {
  struct addrinfo hints;
  char service[16];
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  snprintf(service, sizeof(service), "%d", port);
  return getaddrinfo(host, service, &hints, res) == 0 ? 0 : -EHOSTUNREACH;
}

int mn_sock_listen(const char *host, int port, int *bound) {
  struct addrinfo *res, *ai;
  int fd = -EADDRNOTAVAIL;
  if (resolve(host, port, 1, &res) != 0) return -EHOSTUNREACH;
  for (ai = res; ai != NULL; ai = ai->ai_next) {
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s < 0) continue;
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 64) == 0) {
      fd = s;
      break;
    }
    fd = -errno;
    close(s);
  }
  freeaddrinfo(res);
  if (fd >= 0 && bound != NULL) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
      close(fd);
      return -errno;
    }
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
  }
  return fd;
}

int mn_sock_connect(const char *host, int port) {
  struct addrinfo *res, *ai;
  int fd = -ECONNREFUSED;
  if (resolve(host, port, 0, &res) != 0) return -EHOSTUNREACH;
  for (ai = res; ai != NULL; ai = ai->ai_next) {
    int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) {
      fd = s;
      break;
    }
    fd = -errno;
    close(s);
  }
  freeaddrinfo(res);
  if (fd >= 0) mn_sock_nodelay(fd);
  return fd;
}

int mn_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == ENOTSOCK) w = write(fd, c, n); /* a pipe or file: the proc's port line on stdout */
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int mn_write2_all(int fd, const void *a, size_t an, const void *b, size_t bn) {
  struct iovec iov[2] = {{(void *)a, an}, {(void *)b, bn}};
  struct msghdr mh;
  memset(&mh, 0, sizeof(mh));
  mh.msg_iov = iov;
  mh.msg_iovlen = 2;
  while (iov[0].iov_len + iov[1].iov_len > 0) {
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    size_t left = (size_t)w;
    for (int i = 0; i < 2; i++) {
      size_t k = left < iov[i].iov_len ? left : iov[i].iov_len;
      iov[i].iov_base = (char *)iov[i].iov_base + k;
      iov[i].iov_len -= k;
      left -= k;
    }
    if (iov[0].iov_len == 0) { /* skip the emptied first segment */
      mh.msg_iov = &iov[1];
      mh.msg_iovlen = 1;
    }
  }
  return 0;
}

int64_t mn_read_frame(int fd, mn_buf_t *in, const char **body, size_t max, int timeout_ms) {
  int64_t deadline = timeout_ms >= 0 ? mn_now_ms() + timeout_ms : 0;
  for (;;) {
    int64_t n = mn_frame_peek(in->data, in->len, max, body);
    if (n != MN_EAGAIN) return n;
    if (timeout_ms >= 0) {
      struct pollfd pfd = {.fd = fd, .events = POLLIN};
      int64_t left = deadline - mn_now_ms();
      if (left <= 0) return MN_ETIMEDOUT;
      int r = poll(&pfd, 1, (int)left);
      if (r == 0) return MN_ETIMEDOUT;
      if (r < 0 && errno != EINTR) return -errno;
      if (r < 0) continue;
    }
    if (mn_buf_reserve(in, 64 * 1024) != 0) return MN_ENOMEM;
    ssize_t r = recv(fd, in->data + in->len, in->cap - in->len, 0);
    if (r == 0) return MN_ECLOSED;
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    in->len += (size_t)r;
  }
}

int mn_parse_addr(const char *addr, char *host, size_t hostlen, int *port) {
  const char *colon = strrchr(addr, ':');
  char *end;
  if (colon == NULL || (size_t)(colon - addr) >= hostlen) return -EINVAL;
  if (colon[1] < '0' || colon[1] > '9') return -EINVAL;
  long p = strtol(colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535 || end == colon + 1) return -EINVAL;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  if (host[0] == '[') { /* [::1]:port */
    size_t l = strlen(host);
    if (l < 2 || host[l - 1] != ']') return -EINVAL;
    memmove(host, host + 1, l - 2);
    host[l - 2] = '\0';
  }
  *port = (int)p;
  return 0;
}
