/*
 * For tests that watch a connection a library thread (the bootstrap root,
 * a listener) should drop: reads and discards until the peer closes.
 * Header-only, so that the unit tests and the tests against libnccl.so,
 * two programs, share it.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_SOCK_WAIT_H
#define LOOM_TEST_SOCK_WAIT_H

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

static inline double sock_wait_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The seconds until the peer closed `fd`, or -1 when it had not after
 * `limit` seconds. */
static inline double sock_wait_closed(int fd, double limit) {
  double t0 = sock_wait_now();
  char buf[4096];
  for (;;) {
    double left = limit - (sock_wait_now() - t0);
    if (left <= 0)
      return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
      continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0 || (n < 0 && errno == EINTR))
      continue;
    return sock_wait_now() - t0;
  }
}

#endif
