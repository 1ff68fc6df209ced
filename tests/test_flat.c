/*
 * Flat AllReduce on the host's arena (src/exec/flat.c): the collective
 * matrix's AllReduces with the algorithm forced, on 2, 3, 5 and 8 ranks
 * as processes and on ranks as threads of one process driven by one
 * thread; each rank's log must show the arena and the Flat choice, so a
 * silent fall back to rings fails. Then what must not go wrong: calls
 * that differ between ranks are named, a rank that sets LOOM_SHM_FLAT=0
 * turns the arena off for everyone, and a rank that dies or stops at a
 * barrier is named by the others. The same by CPU, with each rank pinned
 * to one of two CPUs (harness_pin), as loomrun pins ranks that outnumber
 * the CPUs: the matrix, a rank that turns it off, mismatched calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

/* Each rank's log, one file per process. */
static void flat_log(void) { harness_rank_log("flat", "SHM,TUNING"); }

static int log_count(const char *want) { return harness_rank_log_count("flat", want); }

static void log_remove(void) { harness_rank_log_remove("flat"); }

/* arg: whether the ranks are pinned to one CPU each, and so go by CPU. */
static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int by_cpu = arg != NULL;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  int arena = log_count("ranks share an arena of"), flat = log_count(": Flat,");
  int cpu = log_count("flat AllReduces go by CPU");
  log_remove();
  RASSERT(arena == 1, "rank %d: the log says %d time(s) that the ranks share an arena", rank, arena);
  RASSERT(flat >= 3, "rank %d: the tuner chose Flat for %d size classes", rank, flat);
  RASSERT(cpu == by_cpu, "rank %d: the log says %d time(s) that flat AllReduces go by CPU, not %d", rank, cpu, by_cpu);
  if (rank == 0)
    printf("%d ranks%s: %d AllReduce calls checked on the arena\n", n, by_cpu ? " by CPU" : "", calls);
  return 0;
}

static int matrix_test(int n, int pinned) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  flat_log();
  if (pinned)
    harness_set_rank_setup(harness_pin_setup);
  /* Where this process may run on one CPU only, so may every rank: they
   * are pinned to it all the same. */
  int by_cpu = pinned || harness_pin_cpus() == 1;
  return run_ranks(n, matrix_rank, by_cpu ? (void *)1 : NULL);
}

TEST_IMPL(flat_shm_2) { return matrix_test(2, 0); }
TEST_IMPL(flat_shm_3) { return matrix_test(3, 0); }
TEST_IMPL(flat_shm_5) { return matrix_test(5, 0); }
TEST_IMPL(flat_shm_8) { return matrix_test(8, 0); }

/* Every rank pinned to one of two CPUs (or all to one), two or more to
 * each: flat AllReduces above 4 KiB go by CPU. */
TEST_IMPL(flat_cpu_4) { return matrix_test(4, 1); }
TEST_IMPL(flat_cpu_8) { return matrix_test(8, 1); }

/* Ranks as threads of one process: the arena's descriptor is shared
 * rather than taken from another process, and one thread drives every
 * rank's calls in one group, so that a barrier must never block it. */
TEST_IMPL(flat_threads_one_driver) {
  enum { N = 4, COUNT = 300000 }; /* 1.2 MB: two rounds of the arena */
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  ncclComm_t comms[N];
  ASSERT_OK(ncclCommInitAll(comms, N, NULL));
  float *buf[N];
  for (int r = 0; r < N; r++) {
    buf[r] = malloc(sizeof(float) * COUNT);
    ASSERT(buf[r] != NULL);
  }
  for (int round = 0; round < 3; round++) {
    size_t count = round == 0 ? 5 : round == 1 ? 4099 : COUNT;
    for (int r = 0; r < N; r++)
      for (size_t i = 0; i < count; i++)
        buf[r][i] = (float)((r + 1) * (int)(i % 97));
    ASSERT_OK(ncclGroupStart());
    for (int r = 0; r < N; r++)
      ASSERT_OK(ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, comms[r], NULL));
    ASSERT_OK(ncclGroupEnd());
    for (int r = 0; r < N; r++)
      for (size_t i = 0; i < count; i++)
        ASSERT_MSG(buf[r][i] == (float)(10 * (int)(i % 97)), "count %zu: rank %d element %zu is %g", count, r, i,
                   buf[r][i]);
  }
  for (int r = 0; r < N; r++) {
    ASSERT_OK(ncclCommDestroy(comms[r]));
    free(buf[r]);
  }
  return 0;
}

/* Calls that differ: each rank names the difference instead of reducing
 * what does not belong together. */
static int mismatch_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const char *what = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  /* 64 floats: posted slots; 5000: a barrier before the slices. */
  enum { BIG = 5000 };
  static float buf[BIG + 1];
  RCHECK(comm, ncclAllReduce(buf, buf, 64, ncclFloat, ncclSum, comm, NULL));
  int slices = strstr(what, "_slices") != NULL, op_differs = strncmp(what, "op", 2) == 0;
  size_t count = slices ? BIG : 64;
  ncclRedOp_t op = ncclSum;
  if (rank == 1 && strncmp(what, "count", 5) == 0)
    count++;
  /* One rank posts its slot, the others wait at a barrier. */
  if (rank == 1 && strcmp(what, "modes") == 0)
    count = BIG;
  if (rank == 1 && op_differs)
    op = ncclMax;
  for (size_t i = 0; i <= BIG; i++)
    buf[i] = 1.0f;
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, op, comm, NULL);
  double took = now_s() - t0;
  char msg[4096], name[32];
  snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
  fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), msg);
  RASSERT(r == ncclInvalidUsage || r == ncclRemoteError, "rank %d: the mismatched call returned %d", rank, (int)r);
  /* Named from the headers, not found by LOOM_TIMEOUT (20 s). */
  RASSERT(took < 5, "rank %d took %.1f s to name the mismatch", rank, took);
  snprintf(name, sizeof name, "count %d", strcmp(what, "count_slices") == 0 ? BIG + 1 : strcmp(what, "modes") == 0 ? BIG : 65);
  RASSERT(strstr(msg, op_differs ? "max" : name) != NULL,
          "rank %d: the message does not name the difference: %s", rank, msg);
  /* Nothing of the others' data was reduced into the output. */
  for (size_t i = 0; i <= BIG; i++)
    RASSERT(buf[i] == 1.0f, "rank %d: element %zu became %g", rank, i, buf[i]);
  ncclCommAbort(comm);
  return 0;
}

static int mismatch_test(const char *what, int pinned) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  setenv("LOOM_TIMEOUT", "20", 1);
  if (pinned)
    harness_set_rank_setup(harness_pin_setup);
  /* Pinned, 4 ranks: rank 1 leads its CPU, and rank 3 adds after it. */
  return run_ranks(pinned ? 4 : 3, mismatch_rank, (void *)what);
}

TEST_IMPL(flat_mismatch_count) { return mismatch_test("count", 0); }

TEST_IMPL(flat_mismatch_count_slices) { return mismatch_test("count_slices", 0); }

TEST_IMPL(flat_mismatch_modes) { return mismatch_test("modes", 0); }

TEST_IMPL(flat_mismatch_op) { return mismatch_test("op", 0); }

/* By CPU: rank 3 finds rank 1's call differs before adding to their
 * CPU's sum; one rank posting a slot while the others go by CPU. */
TEST_IMPL(flat_cpu_mismatch_count) { return mismatch_test("count_slices", 1); }

TEST_IMPL(flat_cpu_mismatch_modes) { return mismatch_test("modes", 1); }

TEST_IMPL(flat_cpu_mismatch_op) { return mismatch_test("op_slices", 1); }

/* One rank without the arena (LOOM_SHM_FLAT=0): nobody uses it, and the
 * forced algorithm falls back to rings with the right results. */
static int one_off_setup(int rank, void *arg) {
  if (rank == 2)
    setenv("LOOM_SHM_FLAT", "0", 1);
  return 0;
}

static int one_off_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float buf[4096];
  for (int i = 0; i < 4096; i++)
    buf[i] = (float)(rank + i % 5);
  RCHECK(comm, ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 4096; i++)
    RASSERT(buf[i] == (float)(3 + 3 * (i % 5)), "rank %d: element %d is %g", rank, i, buf[i]);
  RCHECK(comm, ncclCommDestroy(comm));
  int arena = log_count("ranks share an arena of"), flat = log_count(": Flat,");
  log_remove();
  RASSERT(arena == 0 && flat == 0, "rank %d: the arena was used (%d, %d) though rank 2 set LOOM_SHM_FLAT=0", rank,
          arena, flat);
  return 0;
}

TEST_IMPL(flat_off_on_one_rank) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  flat_log();
  harness_set_rank_setup(one_off_setup);
  return run_ranks(3, one_off_rank, NULL);
}

/* Pinned, but one rank with LOOM_FLAT_BY_CPU=0: every rank goes by
 * slices, with the right results. */
static int cpu_off_setup(int rank, void *arg) {
  if (rank == 2)
    setenv("LOOM_FLAT_BY_CPU", "0", 1);
  return harness_pin_setup(rank, arg);
}

static int cpu_off_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  enum { COUNT = 300000 }; /* two rounds, by slices or by CPU */
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = malloc(COUNT * sizeof *buf);
  RASSERT(buf != NULL, "rank %d: out of memory", rank);
  for (int i = 0; i < COUNT; i++)
    buf[i] = (float)(rank + i % 5);
  RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  int bad = -1;
  for (int i = 0; i < COUNT && bad < 0; i++)
    if (buf[i] != (float)(n * (n - 1) / 2 + n * (i % 5)))
      bad = i;
  float got = bad >= 0 ? buf[bad] : 0;
  free(buf);
  RASSERT(bad < 0, "rank %d: element %d is %g", rank, bad, got);
  RCHECK(comm, ncclCommDestroy(comm));
  int arena = log_count("ranks share an arena of"), cpu = log_count("go by CPU");
  log_remove();
  RASSERT(arena == 1 && cpu == 0, "rank %d: arena %d, by CPU %d (rank 2 set LOOM_FLAT_BY_CPU=0)", rank, arena, cpu);
  return 0;
}

TEST_IMPL(flat_cpu_off_on_one_rank) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  flat_log();
  harness_set_rank_setup(cpu_off_setup);
  return run_ranks(4, cpu_off_rank, NULL);
}

/* By CPU, a rank that never makes its second call: rank 3 waits for rank 1,
 * before it on their CPU, to add its data, and LOOM_TIMEOUT's sentence
 * says so (the wait's own description, not the barrier's); ranks 0 and 2,
 * at the barrier, hear of rank 3's failure, which names rank 1. Rank 1
 * stays until the others have gone: it reads a pipe whose write ends only
 * they still hold. */
static int absent_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *fds = arg;
  /* Rank 3's timeout comes first; the others hear of its failure. */
  setenv("LOOM_TIMEOUT", rank == 3 ? "2" : "20", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  static float buf[300000];
  /* A first call together: it sets up every connection. */
  RCHECK(comm, ncclAllReduce(buf, buf, 300000, ncclFloat, ncclSum, comm, NULL));
  if (rank == 1) {
    close(fds[1]);
    char c;
    while (read(fds[0], &c, 1) > 0)
      ;
    ncclCommAbort(comm);
    return 0;
  }
  close(fds[0]);
  ncclResult_t r = ncclAllReduce(buf, buf, 300000, ncclFloat, ncclSum, comm, NULL);
  char msg[4096];
  snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
  fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), msg);
  ncclCommAbort(comm);
  RASSERT(r != ncclSuccess, "rank %d: the call succeeded without rank 1", rank);
  if (rank == 3)
    RASSERT(strstr(msg, "rank 1, before this rank on its CPU, to add its data") != NULL,
            "rank 3: the message does not say it waits for rank 1's data: %s", msg);
  else
    RASSERT(strstr(msg, "rank 1") != NULL, "rank %d: the message does not name rank 1: %s", rank, msg);
  return 0;
}

TEST_IMPL(flat_cpu_absent_rank) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  if (harness_pin_cpus() < 2)
    SKIP("one CPU: all four ranks on it, rank 3 would wait for rank 2, not rank 1");
  static int fds[2];
  ASSERT(pipe(fds) == 0);
  harness_set_rank_setup(harness_pin_setup);
  pid_t pids[4];
  ASSERT(start_ranks(4, absent_rank, fds, pids, NULL) == 0);
  close(fds[1]);
  close(fds[0]);
  return wait_ranks(4, pids);
}
