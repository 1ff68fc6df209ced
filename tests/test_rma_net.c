/*
 * One-sided operations between host communicator ranks on different
 * hosts (each rank its own NCCL_HOSTID): every rank puts to every rank,
 * 8 MiB each, before any of them waits, which only works if the targets'
 * services take the data while they are busy in their own puts; signals
 * alone; strangers on a service's port refused while the job goes on;
 * a put to a peer that exited fails naming it.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

static void own_host(int rank) {
  char host[32];
  snprintf(host, sizeof host, "rmanethost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
}

enum { BIG = 8 << 20, NR = 3 };

static uint32_t word(int from, int to, size_t i) {
  return (uint32_t)(from * 0x1000000u + to * 0x100000u) ^ (uint32_t)i;
}

/* Rank r's window has a slot of BIG bytes per sender. */
static int all_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  own_host(rank);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  char *win_buf;
  size_t bytes = (size_t)n * BIG;
  RCHECK(comm, ncclMemAlloc((void **)&win_buf, bytes));
  memset(win_buf, 0, bytes);
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, win_buf, bytes, &win, 0));
  uint32_t *src = malloc(BIG);
  RASSERT(src, "out of memory");
  /* Every put first, then the waits: a target is never in a call that
   * would take the data itself. */
  for (int k = 1; k <= n; k++) {
    int to = (rank + k) % n;
    for (size_t i = 0; i < BIG / 4; i++)
      src[i] = word(rank, to, i);
    RCHECK(comm, ncclPutSignal(src, BIG / 4, ncclUint32, to, win, (size_t)rank * BIG, 0, 1, 0, comm, NULL));
    RCHECK(comm, ncclSignal(to, 3, 2, 0, comm, NULL));
    RCHECK(comm, ncclSignal(to, 3, 2, 0, comm, NULL));
  }
  ncclWaitSignalDesc_t d[2 * NR];
  for (int r = 0; r < n; r++) {
    d[2 * r] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = r, .sigIdx = 0, .ctx = 1};
    d[2 * r + 1] = (ncclWaitSignalDesc_t){.opCnt = 2, .peer = r, .sigIdx = 3, .ctx = 2};
  }
  RCHECK(comm, ncclWaitSignal(2 * n, d, comm, NULL));
  for (int from = 0; from < n; from++) {
    const uint32_t *got = (const uint32_t *)(win_buf + (size_t)from * BIG);
    for (size_t i = 0; i < BIG / 4; i++)
      RASSERT(got[i] == word(from, rank, i), "rank %d: word %zu from rank %d is 0x%x, not 0x%x", rank, i, from,
              got[i], word(from, rank, i));
  }
  /* A second window, and small puts at its end: the window is told
   * apart from the first, the offset checked against its size. */
  int32_t *small;
  RCHECK(comm, ncclMemAlloc((void **)&small, 4096));
  ncclWindow_t win2;
  RCHECK(comm, ncclCommWindowRegister(comm, small, 4096, &win2, 0));
  int32_t v = 1000 + rank;
  for (int to = 0; to < n; to++)
    RCHECK(comm, ncclPutSignal(&v, 1, ncclInt32, to, win2, (size_t)rank * 4, 1, 0, 0, comm, NULL));
  int peer = (rank + 1) % n;
  ncclResult_t r = ncclPutSignal(&v, 2, ncclInt32, peer, win2, 4096 - 4, 1, 0, 0, comm, NULL);
  RASSERT(r == ncclInvalidArgument && strstr(ncclGetLastError(comm), "do not fit"), "%d: %s", (int)r,
          ncclGetLastError(comm));
  void *p;
  r = ncclGetPeerDevicePointer(win2, 0, peer, &p);
  RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "another host"), "%d: %s", (int)r,
          ncclGetLastError(comm));
  for (int k = 0; k < n; k++)
    d[k] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = k, .sigIdx = 1, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
  for (int k = 0; k < n; k++)
    RASSERT(small[k] == 1000 + k, "rank %d: rank %d's small put wrote %d", rank, k, small[k]);
  /* Every rank has all it waits for; none puts after its waits, so the
   * windows may go. */
  RCHECK(comm, ncclCommWindowDeregister(comm, win2));
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(small));
  RCHECK(comm, ncclMemFree(win_buf));
  free(src);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_net_put_all) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(NR, all_rank, NULL);
}

/* The listening sockets of this process, as a bit per descriptor. */
static void listeners(uint8_t *set, int max) {
  memset(set, 0, (size_t)max);
  DIR *dir = opendir("/proc/self/fd");
  if (!dir)
    return;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    int fd = atoi(e->d_name);
    int on = 0;
    socklen_t len = sizeof on;
    if (fd > 0 && fd < max && getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on)
      set[fd] = 1;
  }
  closedir(dir);
}

/* A stranger's connection to the listener `lfd`: a socket that has sent
 * `garbage` (or nothing). */
static int stranger(int lfd, int garbage) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  if (getsockname(lfd, (struct sockaddr *)&a, &len) != 0)
    return -1;
  int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, len) != 0)
    return -1;
  if (garbage) {
    char junk[200];
    for (size_t i = 0; i < sizeof junk; i++)
      junk[i] = (char)(i * 37 + 11);
    if (send(fd, junk, sizeof junk, MSG_NOSIGNAL) != (ssize_t)sizeof junk)
      return -1;
  }
  return fd;
}

/* Whether the other end closed `fd` within `ms`. */
static int closed_within(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  for (;;) {
    int k = poll(&p, 1, ms);
    if (k <= 0)
      return 0;
    char b[256];
    ssize_t got = recv(fd, b, sizeof b, 0);
    if (got <= 0)
      return 1;
    /* The listener may answer part of a greeting before it gives up. */
  }
}

static int stranger_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  own_host(rank);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { MAXFD = 4096 };
  static uint8_t before[MAXFD], after[MAXFD];
  listeners(before, MAXFD);
  int32_t *buf;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  listeners(after, MAXFD);
  int service = -1;
  for (int fd = 0; fd < MAXFD; fd++)
    if (after[fd] && !before[fd]) {
      RASSERT(service < 0, "rank %d: two new listeners (%d, %d) after the registration", rank, service, fd);
      service = fd;
    }
  RASSERT(service >= 0, "rank %d: no one-sided service listens after the registration", rank);
  int junk = stranger(service, 1), silent = stranger(service, 0);
  RASSERT(junk >= 0 && silent >= 0, "rank %d: cannot connect to the service: %s", rank, strerror(errno));
  RASSERT(closed_within(junk, 10000), "rank %d: the service did not close a stranger's connection", rank);
  /* The job goes on while the silent stranger holds its connection. */
  int peer = 1 - rank;
  int32_t v = 40 + rank;
  RCHECK(comm, ncclPutSignal(&v, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  RASSERT(buf[0] == 40 + peer, "rank %d: the put wrote %d", rank, buf[0]);
  RASSERT(closed_within(silent, 15000), "rank %d: the service kept a silent stranger's connection", rank);
  close(junk);
  close(silent);
  /* Both have what they waited for before either deregisters. */
  RCHECK(comm, ncclSignal(peer, 1, 0, 0, comm, NULL));
  d.sigIdx = 1;
  RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(buf));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_net_stranger) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, stranger_rank, NULL);
}

/* Rank 1 exits once it has rank 0's first put; rank 0 goes on putting
 * until a put fails, which names rank 1. */
static int dead_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  own_host(rank);
  setenv("LOOM_TIMEOUT", "30", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t *buf;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  if (rank == 1) {
    ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 0, .sigIdx = 0, .ctx = 0};
    RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
    _exit(0); /* gone, like a crash */
  }
  int32_t v = 9;
  RCHECK(comm, ncclPutSignal(&v, 1, ncclInt32, 1, win, 0, 0, 0, 0, comm, NULL));
  double t0 = now_s();
  ncclResult_t r = ncclSuccess;
  long puts = 0;
  while (r == ncclSuccess && now_s() - t0 < 20) {
    r = ncclPutSignal(&v, 1, ncclInt32, 1, win, 0, 0, 0, 0, comm, NULL);
    puts++;
  }
  const char *msg = ncclGetLastError(comm);
  fprintf(stderr, "rank 0: failed after %ld puts, %.2f s: %s\n", puts, now_s() - t0, msg);
  RASSERT(r == ncclRemoteError && strstr(msg, "rank 1"), "%d: %s", (int)r, msg);
  /* And so does every later one, without trying again. */
  r = ncclSignal(1, 0, 0, 0, comm, NULL);
  RASSERT(r == ncclRemoteError && strstr(ncclGetLastError(comm), "rank 1"), "%d: %s", (int)r,
          ncclGetLastError(comm));
  RCHECK(NULL, ncclCommAbort(comm));
  RCHECK(NULL, ncclMemFree(buf));
  return 0;
}

TEST_IMPL(rma_net_dead_peer) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, dead_rank, NULL);
}
