/*
 * ncclCommAbort from another thread: a thread stuck in a collective (its
 * peer never calls it) returns promptly with an error, the abort waits for
 * it and then frees everything: no thread, file descriptor or shared
 * memory segment is left behind.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { COUNT = 1 << 16 };

struct stuck {
  ncclComm_t comm;
  float *buf;
  ncclResult_t result;
  char msg[1024];
};

static void *stuck_main(void *arg) {
  struct stuck *s = arg;
  s->result = ncclAllReduce(s->buf, s->buf, COUNT, ncclFloat, ncclSum, s->comm, NULL);
  /* The communicator is gone once the abort returns: the message is the
   * process-wide one. */
  snprintf(s->msg, sizeof s->msg, "%s", ncclGetLastError(NULL));
  return NULL;
}

/* Waits until this process's status page shows the stuck thread waiting. */
static int until_waiting(void) {
  char pid[16];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  char *argv[] = {LOOM_TOOLS_DIR "/loom-info", "--status", pid, NULL};
  static char out[1 << 14];
  double t0 = now_s();
  while (now_s() - t0 < 20) {
    if (harness_run(argv, out, sizeof out) == 0 && strstr(out, ", waiting "))
      return 0;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  return 1;
}

static int abort_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *release = arg;
  close(release[1]);
  int fds0 = harness_count_entries("/proc/self/fd", NULL), threads0 = harness_count_entries("/proc/self/task", NULL);
  int shm0 = harness_shm_segments();
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  /* Connected first, so that the abort has connections to free. */
  RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  /* Rank 0 made the unique id, and the bootstrap root's thread and
   * socket (which end on their own) would blur its counts: rank 1 is the
   * one that gets stuck. */
  if (rank == 0) {
    char b;
    ssize_t k = read(release[0], &b, 1); /* until the test closes it */
    (void)k;
    RCHECK(NULL, ncclCommAbort(comm));
    free(buf);
    return 0;
  }
  struct stuck s = {.comm = comm, .buf = buf};
  pthread_t th;
  RASSERT(pthread_create(&th, NULL, stuck_main, &s) == 0, "pthread_create");
  RASSERT(until_waiting() == 0, "the thread never showed as waiting in its AllReduce");
  double t0 = now_s();
  RCHECK(NULL, ncclCommAbort(comm));
  double took = now_s() - t0;
  pthread_join(th, NULL);
  rank_signal('a');
  printf("ncclCommAbort returned after %.3f s; the stuck call returned %s: %s\n", took,
         ncclGetErrorString(s.result), s.msg);
  RASSERT(took < 2, "ncclCommAbort took %.1f s", took);
  RASSERT(s.result == ncclInvalidUsage && strstr(s.msg, "aborted"), "the stuck call returned %d: %s",
          (int)s.result, s.msg);
  int fds1 = harness_count_entries("/proc/self/fd", NULL), threads1 = harness_count_entries("/proc/self/task", NULL);
  int shm1 = harness_shm_segments();
  printf("fds %d -> %d, threads %d -> %d, /dev/shm/loom-* %d -> %d\n", fds0, fds1, threads0, threads1, shm0, shm1);
  RASSERT(fds1 == fds0, "%d file descriptors before the communicator, %d after its abort", fds0, fds1);
  RASSERT(threads1 == threads0, "%d threads before, %d after", threads0, threads1);
  RASSERT(shm1 <= shm0, "%d shared memory segments before, %d after", shm0, shm1);
  free(buf);
  return 0;
}

TEST_IMPL(comm_abort_from_thread) {
  int release[2];
  ASSERT(pipe(release) == 0);
  pid_t pids[2];
  int events;
  ASSERT(start_ranks(2, abort_rank, release, pids, &events) == 0);
  close(release[0]);
  char b = 0;
  ssize_t got = read(events, &b, 1);
  /* Rank 1 has aborted (or failed); rank 0 may go. */
  close(release[1]);
  int rc = wait_ranks(2, pids);
  close(events);
  return rc != 0 || got != 1 || b != 'a';
}
