/*
 * Misuse of communicators that must be refused, never mixed or redirected:
 * two threads calling one communicator at once (NCCL takes one call at a
 * time), a call into another thread's open group, and a destroyed
 * communicator's handle used after a newer communicator was made.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { COUNT = 4096 };

struct racer {
  ncclComm_t comm;
  float buf[COUNT];
  float base; /* what this thread's input holds */
  ncclResult_t result, destroy_result;
  char msg[1024], destroy_msg[1024];
  int release_fd; /* written once this thread was refused */
};

static void *racer_main(void *arg) {
  struct racer *r = arg;
  r->result = ncclAllReduce(r->buf, r->buf, COUNT, ncclFloat, ncclSum, r->comm, NULL);
  if (r->result == ncclSuccess)
    return NULL;
  snprintf(r->msg, sizeof r->msg, "%s", ncclGetLastError(NULL));
  /* The other thread is still inside, waiting for rank 1: a destroy now
   * would free what it uses. */
  r->destroy_result = ncclCommDestroy(r->comm);
  snprintf(r->destroy_msg, sizeof r->destroy_msg, "%s", ncclGetLastError(NULL));
  /* Only now may rank 1 make its call and let the first thread finish. */
  if (write(r->release_fd, "x", 1) != 1)
    perror("write");
  return NULL;
}

/* Rank 0 starts two threads that call AllReduce on the same communicator;
 * rank 1 calls only once one of them was refused, so the one that got in
 * is still inside when the other arrives. */
static int concurrent_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *release = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (rank == 1) {
    close(release[1]);
    char b;
    RASSERT(read(release[0], &b, 1) == 1, "rank 1: rank 0 never reported a refused thread");
    static float buf[COUNT];
    for (int i = 0; i < COUNT; i++)
      buf[i] = 1000.0f;
    RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
    for (int i = 0; i < COUNT; i++)
      RASSERT(buf[i] == 1001.0f || buf[i] == 1002.0f, "rank 1: element %d is %g, a mix", i, buf[i]);
    RCHECK(comm, ncclCommDestroy(comm));
    return 0;
  }
  static struct racer rc[2];
  pthread_t th[2];
  for (int t = 0; t < 2; t++) {
    rc[t].comm = comm;
    rc[t].base = (float)(t + 1);
    rc[t].release_fd = release[1];
    for (int i = 0; i < COUNT; i++)
      rc[t].buf[i] = rc[t].base;
    RASSERT(pthread_create(&th[t], NULL, racer_main, &rc[t]) == 0, "pthread_create");
  }
  for (int t = 0; t < 2; t++)
    pthread_join(th[t], NULL);
  int ok = (rc[0].result == ncclSuccess) + (rc[1].result == ncclSuccess);
  RASSERT(ok == 1, "rank 0: %d of the two concurrent calls succeeded (results %d and %d)", ok, (int)rc[0].result,
          (int)rc[1].result);
  struct racer *in = rc[0].result == ncclSuccess ? &rc[0] : &rc[1], *out = in == &rc[0] ? &rc[1] : &rc[0];
  printf("refused: %s\nrefused destroy: %s\n", out->msg, out->destroy_msg);
  RASSERT(out->result == ncclInvalidUsage, "rank 0: the second thread's call returned %d", (int)out->result);
  RASSERT(strstr(out->msg, "another thread is inside ncclAllReduce") != NULL, "rank 0: the refusal says: %s",
          out->msg);
  RASSERT(out->destroy_result == ncclInvalidUsage && strstr(out->destroy_msg, "another thread is inside ncclAllReduce"),
          "rank 0: ncclCommDestroy during the other thread's call returned %d: %s", (int)out->destroy_result,
          out->destroy_msg);
  for (int i = 0; i < COUNT; i++) {
    RASSERT(in->buf[i] == in->base + 1000.0f, "rank 0: element %d of the call that ran is %g, not %g", i, in->buf[i],
            in->base + 1000.0f);
    RASSERT(out->buf[i] == out->base, "rank 0: the refused call's buffer changed: element %d is %g", i, out->buf[i]);
  }
  /* Refused calls leave the communicator as it was. */
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(misuse_concurrent_calls) {
  /* Should both threads get in, rank 0 waits for a rank that never comes:
   * a bound instead of the runner's limit. */
  setenv("LOOM_TIMEOUT", "10", 1);
  int release[2];
  ASSERT(pipe(release) == 0);
  return run_ranks(2, concurrent_rank, release);
}

struct grouped {
  ncclComm_t comm;
  float *buf;
  ncclResult_t result;
  char msg[1024];
};

static void *outsider_main(void *arg) {
  struct grouped *g = arg;
  g->result = ncclAllReduce(g->buf, g->buf, 4, ncclFloat, ncclSum, g->comm, NULL);
  snprintf(g->msg, sizeof g->msg, "%s", ncclGetLastError(NULL));
  return NULL;
}

/* One thread queues a call in its group; another calls the same
 * communicator before the group ends and must not launch the queued call
 * with its own. */
TEST_IMPL(misuse_other_threads_group) {
  ncclUniqueId id;
  ncclComm_t comm;
  ASSERT_OK(ncclGetUniqueId(&id));
  ASSERT_OK(ncclCommInitRank(&comm, 1, id, 0));
  float mine[4] = {1, 2, 3, 4}, out[4] = {0}, theirs[4] = {9, 9, 9, 9};
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclAllReduce(mine, out, 4, ncclFloat, ncclSum, comm, NULL));
  struct grouped g = {.comm = comm, .buf = theirs};
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, outsider_main, &g) == 0);
  pthread_join(th, NULL);
  printf("refused: %s\n", g.msg);
  ASSERT_MSG(g.result == ncclInvalidUsage, "the other thread's call returned %d", (int)g.result);
  ASSERT_MSG(strstr(g.msg, "another thread's open group") != NULL, "%s", g.msg);
  for (int i = 0; i < 4; i++)
    ASSERT_MSG(out[i] == 0, "the group's queued call ran before ncclGroupEnd: element %d is %g", i, out[i]);
  ASSERT_OK(ncclGroupEnd());
  for (int i = 0; i < 4; i++)
    ASSERT_MSG(out[i] == mine[i], "element %d is %g after the group", i, out[i]);
  ASSERT_OK(ncclAllReduce(theirs, theirs, 4, ncclFloat, ncclSum, comm, NULL)); /* usable from any thread now */
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* Destroyed handles kept while new communicators are made (new jobs and
 * splits, the way a program makes them): each stale one is refused
 * whatever was made since, and never reaches a live communicator. */
TEST_IMPL(misuse_stale_handle) {
  enum { ROUNDS = 8 };
  ncclComm_t stale[2 * ROUNDS];
  int nstale = 0;
  for (int round = 0; round < ROUNDS; round++) {
    ncclUniqueId id;
    ncclComm_t comm, child;
    ASSERT_OK(ncclGetUniqueId(&id));
    ASSERT_OK(ncclCommInitRank(&comm, 1, id, 0));
    ASSERT_OK(ncclCommSplit(comm, 0, 0, &child, NULL));
    for (int s = 0; s < nstale; s++) {
      ASSERT_MSG(stale[s] != comm && stale[s] != child, "round %d: a new communicator has the address of destroyed "
                 "handle %d", round, s);
      float f = 1;
      ncclResult_t r = ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, stale[s], NULL);
      ASSERT_MSG(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "already destroyed"),
                 "round %d: AllReduce on destroyed handle %d returned %d: %s", round, s, (int)r,
                 ncclGetLastError(NULL));
      int count;
      ASSERT(ncclCommCount(stale[s], &count) == ncclInvalidArgument);
      ASSERT(ncclCommDestroy(stale[s]) == ncclInvalidArgument);
      ASSERT(ncclCommAbort(stale[s]) == ncclInvalidArgument);
    }
    /* The stale handles' refusals touched neither live communicator. */
    float f = 2;
    ASSERT_OK(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, child, NULL));
    ASSERT_OK(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, comm, NULL));
    ASSERT(f == 2);
    ASSERT_OK(ncclCommDestroy(child));
    ASSERT_OK(ncclCommDestroy(comm));
    stale[nstale++] = child;
    stale[nstale++] = comm;
  }
  return 0;
}
