/*
 * The floor of a 2-rank AllReduce of a few bytes over TCP: two processes
 * on one loopback connection, each sending a message and reading the
 * other's, round after round, as one recursive-doubling step does, with
 * nothing else. Once with the reads blocking, once spinning on
 * non-blocking reads (what a rank with a core of its own does), and once
 * spinning over two connections, one per direction, as NCCL's network
 * API has them (a send and a receive connection per peer): there no
 * reply carries the ACK of a message, each goes as a packet of its own.
 *
 *   tcp_exchange [BYTES] [ROUNDS]        (default 16 bytes, 20000 rounds)
 *
 * prints "tcp_exchange BYTES blocking|spinning|two-connections US" per
 * mode: microseconds
 * per round, the slower process's. Loopback only; no arguments reach the
 * network.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void full_send(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      die("send");
    p += k;
    n -= (size_t)k;
  }
}

static void full_recv(int fd, char *p, size_t n, int spin) {
  while (n > 0) {
    ssize_t k = recv(fd, p, n, spin ? MSG_DONTWAIT : 0);
    if (k < 0 && (errno == EINTR || (spin && errno == EAGAIN)))
      continue;
    if (k <= 0)
      die("recv");
    p += k;
    n -= (size_t)k;
  }
}

/* Rounds of exchange, sending on `out_fd` and reading `in_fd`; the time
 * per round in us. */
static double exchange(int out_fd, int in_fd, size_t bytes, int rounds, int spin) {
  char out[4096], in[4096];
  memset(out, 1, sizeof out);
  for (int i = 0; i < rounds / 10 + 1; i++) { /* warmup */
    full_send(out_fd, out, bytes);
    full_recv(in_fd, in, bytes, spin);
  }
  double t0 = now_us();
  for (int i = 0; i < rounds; i++) {
    full_send(out_fd, out, bytes);
    full_recv(in_fd, in, bytes, spin);
  }
  return (now_us() - t0) / rounds;
}

int main(int argc, char **argv) {
  size_t bytes = argc > 1 ? (size_t)atol(argv[1]) : 16;
  int rounds = argc > 2 ? atoi(argv[2]) : 20000;
  if (bytes < 1 || bytes > 4096 || rounds < 1) {
    fprintf(stderr, "usage: tcp_exchange [BYTES 1-4096] [ROUNDS]\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &al))
    die("listen");
  int one = 1;
  int report[2];
  if (pipe(report))
    die("pipe");
  pid_t child = fork();
  if (child < 0)
    die("fork");
  int fd[2];
  for (int k = 0; k < 2; k++) {
    if (child == 0) {
      fd[k] = socket(AF_INET, SOCK_STREAM, 0);
      if (fd[k] < 0 || connect(fd[k], (struct sockaddr *)&a, sizeof a))
        die("connect");
    } else {
      fd[k] = accept(ls, NULL, NULL);
      if (fd[k] < 0)
        die("accept");
    }
    setsockopt(fd[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  static const char *modes[] = {"blocking", "spinning", "two-connections"};
  for (int m = 0; m < 3; m++) {
    /* Two connections: the parent sends on the first and reads the
     * second, the child the other way round. */
    int out_fd = fd[0], in_fd = fd[0];
    if (m == 2) {
      out_fd = child != 0 ? fd[0] : fd[1];
      in_fd = child != 0 ? fd[1] : fd[0];
    }
    double us = exchange(out_fd, in_fd, bytes, rounds, m > 0);
    if (child == 0) {
      if (write(report[1], &us, sizeof us) != (ssize_t)sizeof us)
        die("write");
    } else {
      double theirs;
      if (read(report[0], &theirs, sizeof theirs) != (ssize_t)sizeof theirs)
        die("read");
      printf("tcp_exchange %zu %s %.2f\n", bytes, modes[m], us > theirs ? us : theirs);
    }
  }
  close(fd[0]);
  close(fd[1]);
  if (child == 0)
    return 0;
  int st;
  waitpid(child, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
