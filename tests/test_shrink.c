/*
 * ncclCommShrink: after a rank is killed in the middle of an AllReduce,
 * the survivors make a communicator without it and their next AllReduce
 * is right; survivors that disagree on whom to exclude, or forget a dead
 * rank, are told so instead of hanging; bad arguments are refused.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

#define BIG (4 << 20) /* floats: an AllReduce of many FIFO steps */
#define BOUND_S 10.0

struct kill_case {
  int nranks;
  int victims[2], nvictims;
  unsigned seed;
};

static int is_victim(const struct kill_case *k, int rank) {
  for (int i = 0; i < k->nvictims; i++)
    if (k->victims[i] == rank)
      return 1;
  return 0;
}

/* Dies after a few hundred microseconds of spinning: inside the victim's
 * AllReduce most times; before or after it the survivors' loop still
 * meets the death. */
static void *killer(void *arg) {
  unsigned spins = *(unsigned *)arg;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do
    clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < (long)spins * 1000L);
  raise(SIGKILL);
  return NULL;
}

static int kill_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct kill_case *k = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = malloc(sizeof *buf * BIG);
  RASSERT(buf, "out of memory");
  for (int i = 0; i < BIG; i++)
    buf[i] = 1;
  /* Connected and warm before anyone dies. */
  RCHECK(comm, ncclAllReduce(buf, buf, BIG, ncclFloat, ncclSum, comm, NULL));
  if (is_victim(k, rank)) {
    srand(k->seed + (unsigned)rank);
    unsigned us = 200 + (unsigned)(rand() % 3000);
    pthread_t th;
    RASSERT(pthread_create(&th, NULL, killer, &us) == 0, "pthread_create");
    for (;;)
      ncclAllReduce(buf, buf, BIG, ncclFloat, ncclSum, comm, NULL);
  }
  ncclResult_t r = ncclSuccess;
  double t0 = now_s();
  for (int iter = 0; iter < 10000 && r == ncclSuccess; iter++) {
    t0 = now_s();
    r = ncclAllReduce(buf, buf, BIG, ncclFloat, ncclSum, comm, NULL);
  }
  double took = now_s() - t0;
  RASSERT(r != ncclSuccess, "rank %d: 10000 AllReduces succeeded with a rank killed", rank);
  RASSERT(took < BOUND_S, "rank %d: the failing AllReduce took %.1f s", rank, took);
  printf("rank %d: the AllReduce failed after %.3f s: %s\n", rank, took, ncclGetLastError(comm));
  ncclComm_t small;
  t0 = now_s();
  RCHECK(comm, ncclCommShrink(comm, (int *)k->victims, k->nvictims, &small, NULL, NCCL_SHRINK_ABORT));
  printf("rank %d: ncclCommShrink took %.3f s\n", rank, now_s() - t0);
  int nr, me;
  RCHECK(small, ncclCommCount(small, &nr));
  RCHECK(small, ncclCommUserRank(small, &me));
  int want_rank = 0;
  for (int r2 = 0; r2 < rank; r2++)
    want_rank += !is_victim(k, r2);
  RASSERT(nr == n - k->nvictims && me == want_rank, "rank %d: the new communicator says rank %d of %d, not %d of %d",
          rank, me, nr, want_rank, n - k->nvictims);
  for (int i = 0; i < BIG; i++)
    buf[i] = (float)(rank + 1);
  RCHECK(small, ncclAllReduce(buf, buf, BIG, ncclFloat, ncclSum, small, NULL));
  float want = 0;
  for (int r2 = 0; r2 < n; r2++)
    want += is_victim(k, r2) ? 0 : (float)(r2 + 1);
  for (int i = 0; i < BIG; i++)
    RASSERT(buf[i] == want, "rank %d: element %d of the survivors' AllReduce is %g, not %g", rank, i, buf[i], want);
  RCHECK(small, ncclCommDestroy(small));
  RCHECK(NULL, ncclCommAbort(comm));
  free(buf);
  return 0;
}

static int run_kill(struct kill_case *k) {
  setenv("LOOM_TIMEOUT", "30", 1);
  k->seed = (unsigned)time(NULL);
  printf("seed %u\n", k->seed);
  pid_t pids[8];
  ASSERT(start_ranks(k->nranks, kill_rank, k, pids, NULL) == 0);
  /* The victims die by SIGKILL: only the survivors' statuses count. */
  int rc = 0;
  for (int r = 0; r < k->nranks; r++) {
    int st;
    ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
    int ok = is_victim(k, r) ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!ok) {
      fprintf(stderr, "rank %d (pid %d) ended with status 0x%x\n", r, (int)pids[r], st);
      rc = 1;
    }
  }
  return rc;
}

TEST_IMPL(shrink_after_kill_shm) {
  struct kill_case k = {.nranks = 4, .victims = {2}, .nvictims = 1};
  return run_kill(&k);
}

TEST_IMPL(shrink_after_kill_socket) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  struct kill_case k = {.nranks = 4, .victims = {1}, .nvictims = 1};
  return run_kill(&k);
}

/* Two of five die, the leader (rank 0) among them. */
TEST_IMPL(shrink_after_kill_two) {
  struct kill_case k = {.nranks = 5, .victims = {0, 3}, .nvictims = 2};
  return run_kill(&k);
}

/* ---- survivors that disagree, or forget the dead ---- */

static int disagree_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (rank == 3) {
    RCHECK(comm, ncclCommDestroy(comm));
    return 0;
  }
  int one[] = {3}, two[] = {1, 3};
  ncclComm_t small = (ncclComm_t)0x1;
  double t0 = now_s();
  ncclResult_t r = rank == 2 ? ncclCommShrink(comm, two, 2, &small, NULL, NCCL_SHRINK_DEFAULT)
                             : ncclCommShrink(comm, one, 1, &small, NULL, NCCL_SHRINK_DEFAULT);
  const char *msg = ncclGetLastError(NULL);
  printf("rank %d: %s after %.3f s: %s\n", rank, ncclGetErrorString(r), now_s() - t0, msg);
  RASSERT(now_s() - t0 < BOUND_S, "rank %d: the refusal took %.1f s", rank, now_s() - t0);
  RASSERT(r == ncclInvalidUsage && small == NULL, "rank %d: a shrink with differing lists returned %d", rank, (int)r);
  RASSERT(strstr(msg, "rank 2's excludeRanksList (2 ranks) differs from rank 0's (1 rank)"),
          "rank %d: the error does not say who disagreed: %s", rank, msg);
  /* The parent is untouched by the refusal. */
  float x[16];
  for (int i = 0; i < 16; i++)
    x[i] = 1;
  ncclComm_t again;
  RCHECK(NULL, ncclCommShrink(comm, one, 1, &again, NULL, NCCL_SHRINK_DEFAULT));
  RCHECK(again, ncclAllReduce(x, x, 16, ncclFloat, ncclSum, again, NULL));
  RASSERT(x[0] == 3 && x[15] == 3, "rank %d: the AllReduce of the agreed shrink gave %g", rank, x[0]);
  RCHECK(again, ncclCommDestroy(again));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(shrink_lists_differ) {
  setenv("LOOM_TIMEOUT", "30", 1);
  return run_ranks(4, disagree_rank, NULL);
}

/* Rank 0 is dead but nobody excludes it: it would lead, so the others
 * must learn that it is gone, not wait for it. */
static int forgot_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float x[16] = {0};
  RCHECK(comm, ncclAllReduce(x, x, 16, ncclFloat, ncclSum, comm, NULL));
  if (rank == 0)
    raise(SIGKILL);
  RASSERT(ncclAllReduce(x, x, 16, ncclFloat, ncclSum, comm, NULL) != ncclSuccess, "rank %d: AllReduce succeeded",
          rank);
  ncclComm_t small;
  double t0 = now_s();
  ncclResult_t r = ncclCommShrink(comm, NULL, 0, &small, NULL, NCCL_SHRINK_ABORT);
  const char *msg = ncclGetLastError(NULL);
  printf("rank %d: %s after %.3f s: %s\n", rank, ncclGetErrorString(r), now_s() - t0, msg);
  RASSERT(r != ncclSuccess && now_s() - t0 < BOUND_S, "rank %d: shrink returned %d after %.1f s", rank, (int)r,
          now_s() - t0);
  RASSERT(strstr(msg, "rank 0"), "rank %d: the error does not name rank 0: %s", rank, msg);
  RCHECK(NULL, ncclCommAbort(comm));
  return 0;
}

TEST_IMPL(shrink_forgot_dead) {
  setenv("LOOM_TIMEOUT", "30", 1);
  pid_t pids[3];
  ASSERT(start_ranks(3, forgot_rank, NULL, pids, NULL) == 0);
  int rc = 0;
  for (int r = 0; r < 3; r++) {
    int st;
    ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
    rc |= r == 0 ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return rc;
}

/* ---- arguments ---- */

static int expect(int rank, ncclResult_t got, ncclResult_t want, const char *needle) {
  const char *msg = ncclGetLastError(NULL);
  RASSERT(got == want && strstr(msg, needle), "rank %d: returned %d, not %d, with \"%s\" instead of \"%s\"", rank,
          (int)got, (int)want, msg, needle);
  return 0;
}

static int args_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm, out;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int next = (rank + 1) % n;
  int self[] = {rank}, far[] = {7}, twice[] = {next, next}, ok[] = {next}, all[] = {0, 1, 2};
  int bad = 0;
  bad |= expect(rank, ncclCommShrink(comm, self, 1, &out, NULL, 0), ncclInvalidUsage, "excludes itself");
  bad |= expect(rank, ncclCommShrink(comm, far, 1, &out, NULL, 0), ncclInvalidArgument, "excludeRanksList[0] is 7");
  bad |= expect(rank, ncclCommShrink(comm, twice, 2, &out, NULL, 0), ncclInvalidArgument, "in excludeRanksList twice");
  bad |= expect(rank, ncclCommShrink(comm, all, 3, &out, NULL, 0), ncclInvalidArgument, "excludeRanksCount is 3");
  bad |= expect(rank, ncclCommShrink(comm, NULL, 1, &out, NULL, 0), ncclInvalidArgument, "excludeRanksList is NULL");
  bad |= expect(rank, ncclCommShrink(comm, ok, 1, NULL, NULL, 0), ncclInvalidArgument, "newcomm is NULL");
  bad |= expect(rank, ncclCommShrink(comm, ok, 1, &out, NULL, 5), ncclInvalidArgument, "shrinkFlags is 5");
  bad |= expect(rank, ncclCommShrink(NULL, ok, 1, &out, NULL, 0), ncclInvalidArgument, "comm is NULL");
  RCHECK(comm, ncclCommDestroy(comm));
  return bad;
}

TEST_IMPL(shrink_bad_args) { return run_ranks(3, args_rank, NULL); }

/* One thread drives several ranks (ncclCommInitAll): their shrinks must
 * run together, inside a group, as splits do. Rank 2 is dropped alive. */
TEST_IMPL(shrink_in_group) {
  ncclComm_t comms[3], small[2];
  ASSERT_OK(ncclCommInitAll(comms, 3, NULL));
  int drop[] = {2};
  ASSERT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++)
    ASSERT_OK(ncclCommShrink(comms[i], drop, 1, &small[i], NULL, NCCL_SHRINK_DEFAULT));
  ASSERT_OK(ncclGroupEnd());
  float x[2][64];
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 64; k++)
      x[i][k] = (float)(i + 1);
  ASSERT_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++)
    ASSERT_OK(ncclAllReduce(x[i], x[i], 64, ncclFloat, ncclSum, small[i], NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++)
    ASSERT_MSG(x[i][0] == 3 && x[i][63] == 3, "rank %d: %g", i, x[i][0]);
  for (int i = 0; i < 2; i++)
    ASSERT_OK(ncclCommDestroy(small[i]));
  for (int i = 0; i < 3; i++)
    ASSERT_OK(ncclCommDestroy(comms[i]));
  return 0;
}
