/*
 * ncclCommInitRankScalable with several unique ids: each root serves a
 * block of ranks (torch passes one id per TORCH_NCCL_RANKS_PER_ROOT
 * ranks), the ranks form one communicator whose collectives are right,
 * and ranks that disagree on the ids fail with a sentence that says so.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "sanitizer.h"
#include "test.h"

enum { MAX_IDS = 8 };

struct scal {
  int nids;
  ncclUniqueId ids[MAX_IDS];
  int swap_rank; /* this rank passes ids 0 and 1 swapped; -1: none */
  int same;      /* every id is the first */
};

/* AllReduce and AllGather on the new communicator: the ring the roots
 * stitched together holds every rank once, in order. */
static int works(ncclComm_t comm, int rank, int nranks) {
  int n = -1, me = -1;
  RCHECK(comm, ncclCommCount(comm, &n));
  RCHECK(comm, ncclCommUserRank(comm, &me));
  RASSERT(n == nranks && me == rank, "count %d rank %d", n, me);
  enum { N = 257 };
  float *b = malloc(N * sizeof *b);
  int *g = malloc(sizeof *g * (size_t)nranks * 4);
  RASSERT(b && g, "out of memory");
  for (int i = 0; i < N; i++)
    b[i] = (float)(rank + 1) + (float)(i % 3);
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < N; i++) {
    float want = (float)(nranks * (nranks + 1) / 2) + (float)(nranks * (i % 3));
    RASSERT(b[i] == want, "element %d is %g instead of %g", i, b[i], want);
  }
  int mine[4] = {rank, rank * 7, -rank, 12345};
  RCHECK(comm, ncclAllGather(mine, g, 4, ncclInt32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    RASSERT(g[4 * r] == r && g[4 * r + 1] == 7 * r && g[4 * r + 2] == -r && g[4 * r + 3] == 12345,
            "rank %d's piece is %d %d %d %d", r, g[4 * r], g[4 * r + 1], g[4 * r + 2], g[4 * r + 3]);
  free(b);
  free(g);
  return 0;
}

static int scal_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  (void)id;
  struct scal *s = arg;
  ncclComm_t comm = NULL;
  RCHECK(NULL, ncclCommInitRankScalable(&comm, nranks, rank, s->nids, s->ids, NULL));
  if (works(comm, rank, nranks) != 0)
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* The ranks are forked first and the ids made after, so that the roots
 * run in this process, as they would in the ranks that called
 * ncclGetUniqueId, and no rank is forked while a root thread is busy
 * (LeakSanitizer in the child would count that thread's OpenSSL state,
 * held where no thread of the child can reach it, as a leak). */
static int run_scal(int nranks, struct scal *s, rank_fn fn) {
  pid_t pids[32];
  int pipes[32][2];
  ASSERT(nranks <= 32);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    ASSERT(pipe(pipes[r]) == 0);
    pids[r] = fork();
    ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      sanitizer_settle();
      for (int q = 0; q < r; q++)
        close(pipes[q][1]);
      close(pipes[r][1]);
      if (harness_read_all(pipes[r][0], s->ids, sizeof s->ids) != 0)
        _exit(2);
      close(pipes[r][0]);
      ncclUniqueId unused;
      memset(&unused, 0, sizeof unused);
      int rc = sanitizer_leak_check(fn(r, nranks, unused, s));
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    close(pipes[r][0]);
  }
  for (int i = 0; i < s->nids; i++)
    if (i == 0 || !s->same)
      ASSERT_OK(ncclGetUniqueId(&s->ids[i]));
    else
      s->ids[i] = s->ids[0];
  for (int r = 0; r < nranks; r++) {
    ASSERT(harness_write_all(pipes[r][1], s->ids, sizeof s->ids) == 0);
    close(pipes[r][1]);
  }
  return wait_ranks(nranks, pids);
}

static int scalable(int nranks, int nids) {
  struct scal s = {.nids = nids, .swap_rank = -1};
  return run_scal(nranks, &s, scal_rank);
}

TEST_IMPL(scalable_ids_3_of_7) { return scalable(7, 3); }
TEST_IMPL(scalable_ids_one_per_rank) { return scalable(4, 4); }
TEST_IMPL(scalable_ids_5_of_24) { return scalable(24, 5); }

/* One id passed three times (NCCL_COMM_ID gives every caller the same)
 * is one root serving everyone. */
TEST_IMPL(scalable_ids_same_id) {
  struct scal s = {.nids = 3, .swap_rank = -1, .same = 1};
  return run_scal(3, &s, scal_rank);
}

static int order_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  (void)id;
  struct scal *s = arg;
  ncclUniqueId ids[MAX_IDS];
  memcpy(ids, s->ids, sizeof ids);
  if (rank == s->swap_rank) {
    ids[0] = s->ids[1];
    ids[1] = s->ids[0];
  }
  ncclComm_t comm = NULL;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRankScalable(&comm, nranks, rank, s->nids, ids, NULL);
  const char *why = ncclGetLastError(NULL);
  RASSERT(r == ncclInvalidUsage || r == ncclRemoteError, "rank %d: init returned %d (%s)", rank, (int)r, why);
  RASSERT(comm == NULL, "rank %d: a failed init left a communicator", rank);
  RASSERT(strstr(why, "same unique ids in the same order") && now_s() - t0 < 10.0, "rank %d after %.1f s: %s", rank,
          now_s() - t0, why);
  return 0;
}

/* Two ranks, one id each, rank 1 with them swapped. Each rank greets both
 * roots before it waits (its own, and the other as the next block's first
 * rank), and neither root can form with the greetings it gets, so both
 * see the two orders and fail the job at once, whoever comes first: every
 * rank hears why, long before LOOM_TIMEOUT. */
TEST_IMPL(scalable_ids_order_mismatch) {
  setenv("LOOM_TIMEOUT", "30", 1);
  struct scal s = {.nids = 2, .swap_rank = 1};
  return run_scal(2, &s, order_rank);
}

TEST_IMPL(scalable_ids_bad_args) {
  ncclUniqueId ids[3];
  for (int i = 0; i < 3; i++)
    ASSERT_OK(ncclGetUniqueId(&ids[i]));
  ncclComm_t comm = NULL;
  ASSERT(ncclCommInitRankScalable(&comm, 2, 0, 3, ids, NULL) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "nId is 3 but nranks is 2"), "%s", ncclGetLastError(NULL));
  ncclUniqueId dup[3] = {ids[0], ids[1], ids[0]};
  ASSERT(ncclCommInitRankScalable(&comm, 3, 0, 3, dup, NULL) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "unique ids 0 and 2 are the same"), "%s", ncclGetLastError(NULL));
  ncclUniqueId junk[2] = {ids[0]};
  memset(&junk[1], 0x5a, sizeof junk[1]);
  ASSERT(ncclCommInitRankScalable(&comm, 3, 0, 2, junk, NULL) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "unique id 1 of 2 was not made by ncclGetUniqueId"), "%s",
             ncclGetLastError(NULL));
  ASSERT(comm == NULL);
  return 0;
}
