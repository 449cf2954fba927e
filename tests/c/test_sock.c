/*
 * test_sock.c - unit tests for the small helpers of host/core/sock.c:
 * address parsing, and reading whole frames from a socketpair and over
 * TCP loopback.
 */
#include "wire_helpers.h"

static void test_parse_addr(void **state) {
  (void)state;
  char host[64];
  int port = -1;
  assert_int_equal(mn_parse_addr("127.0.0.1:80", host, sizeof(host), &port), 0);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 80);
  assert_int_equal(mn_parse_addr("[::1]:9", host, sizeof(host), &port), 0);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 9);
  assert_int_equal(mn_parse_addr("localhost:0", host, sizeof(host), &port), 0);
  assert_string_equal(host, "localhost");
  assert_int_equal(port, 0);
  assert_int_equal(mn_parse_addr("h:65535", host, sizeof(host), &port), 0);
  assert_string_equal(host, "h");
  assert_int_equal(port, 65535);
  /* The last colon splits, so a bare IPv6 address still parses. */
  assert_int_equal(mn_parse_addr("fe80::1:443", host, sizeof(host), &port), 0);
  assert_string_equal(host, "fe80::1");
  assert_int_equal(port, 443);

  static const char *const bad[] = {"nocolon", "h:", "h:99999", "h:12x", "h:-1", "h:65536",
                                    "[::1:9",  "",   ":",       "h:x12", "[::1]x:9"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    port = 12345;
    int rc = mn_parse_addr(bad[i], host, sizeof(host), &port);
    if (rc != -EINVAL) print_error("mn_parse_addr(\"%s\") returned %d\n", bad[i], rc);
    assert_int_equal(rc, -EINVAL);
    assert_int_equal(port, 12345);
  }
  /* A host that does not fit the caller's buffer. */
  char small[4];
  assert_int_equal(mn_parse_addr("longhost:80", small, sizeof(small), &port), -EINVAL);
  assert_int_equal(mn_parse_addr("abc:80", small, sizeof(small), &port), 0);
  assert_string_equal(small, "abc");
  assert_int_equal(mn_parse_addr("abcd:80", small, sizeof(small), &port), -EINVAL);
}

static void test_read_frame_socketpair(void **state) {
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  mn_buf_t out, in;
  mn_buf_init(&out);
  mn_buf_init(&in);
  size_t n1 = pack_frame(&out, MN_MSG_PING, "over a socket");
  size_t n2 = pack_frame(&out, MN_MSG_PONG, "two");

  const char *body = NULL;
  /* Nothing sent yet: times out. */
  assert_int_equal(mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 20), MN_ETIMEDOUT);
  /* Half a frame: still times out, keeping what came. */
  assert_int_equal(mn_write_all(sv[0], out.data, 3), 0);
  assert_int_equal(mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 20), MN_ETIMEDOUT);
  assert_int_equal(in.len, 3);
  /* The rest of both frames. */
  assert_int_equal(mn_write_all(sv[0], out.data + 3, out.len - 3), 0);
  int64_t n = mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 1000);
  assert_int_equal(n, n1 - MN_FRAME_HEADER);
  decoded_t d;
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_PING);
  decoded_free(&d);
  mn_buf_consume(&in, MN_FRAME_HEADER + (size_t)n);
  n = mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 1000);
  assert_int_equal(n, n2 - MN_FRAME_HEADER);
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  assert_int_equal(mn_msg_type(&d.obj), MN_MSG_PONG);
  decoded_free(&d);
  mn_buf_consume(&in, MN_FRAME_HEADER + (size_t)n);
  assert_int_equal(in.len, 0);

  /* An oversized length prefix is refused without reading the body. */
  char hdr[MN_FRAME_HEADER];
  mn_put_be32(hdr, MN_MAX_FRAME + 1);
  assert_int_equal(mn_write_all(sv[0], hdr, sizeof(hdr)), 0);
  assert_int_equal(mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 1000), MN_EFRAME);
  mn_buf_consume(&in, in.len);

  /* The peer closes mid-frame. */
  assert_int_equal(mn_write_all(sv[0], out.data, 2), 0);
  close(sv[0]);
  assert_int_equal(mn_read_frame(sv[1], &in, &body, MN_MAX_FRAME, 1000), MN_ECLOSED);
  close(sv[1]);
  mn_buf_free(&in);
  mn_buf_free(&out);
}

static void test_tcp_loopback(void **state) {
  (void)state;
  int port = 0;
  int lfd = mn_sock_listen("127.0.0.1", 0, &port);
  if (lfd < 0) {
    print_message("loopback TCP unavailable (%s); skipping\n", strerror(-lfd));
    skip();
  }
  assert_true(port > 0 && port < 65536);
  int cfd = mn_sock_connect("127.0.0.1", port);
  assert_true(cfd >= 0);
  int sfd = accept(lfd, NULL, NULL);
  assert_true(sfd >= 0);

  mn_buf_t out, in;
  mn_buf_init(&out);
  mn_buf_init(&in);
  /* A frame larger than one recv() so the read loop has to iterate. */
  char *big = malloc(300000);
  assert_non_null(big);
  memset(big, 'z', 299999);
  big[299999] = '\0';
  size_t n1 = pack_frame(&out, MN_MSG_PING, big);
  free(big);
  assert_int_equal(mn_write_all(cfd, out.data, out.len), 0);
  const char *body;
  int64_t n = mn_read_frame(sfd, &in, &body, MN_MAX_FRAME, 5000);
  assert_int_equal(n, n1 - MN_FRAME_HEADER);
  decoded_t d;
  assert_int_equal(decode(&d, body, (size_t)n), 0);
  const char *s;
  size_t sl;
  assert_int_equal(mn_get_str(&d.obj, 1, &s, &sl), 0);
  assert_int_equal(sl, 299999);
  assert_int_equal(s[0], 'z');
  assert_int_equal(s[sl - 1], 'z');
  decoded_free(&d);

  /* Once the listener is closed, connecting to its port is refused. */
  close(cfd);
  close(sfd);
  close(lfd);
  assert_true(mn_sock_connect("127.0.0.1", port) < 0);
  mn_buf_free(&in);
  mn_buf_free(&out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_parse_addr),
    cmocka_unit_test(test_read_frame_socketpair),
    cmocka_unit_test(test_tcp_loopback),
  };
  return cmocka_run_group_tests_name("sock", tests, NULL, NULL);
}
