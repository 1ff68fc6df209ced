/*
 * The communicator API: version, creation (InitAll, group init, configs of
 * older and newer layouts), queries, split, finalize/abort, registration,
 * unique ids as hex. Mismatched calls between ranks and the debug log are
 * in test_comm_mismatch.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#define MAXR 8
enum { N = 1024 };

static float value(int rank, int i) { return (float)(rank + 1) * 0.5f + (float)(i % 13); }

static float sum_of(int nranks, int i) {
  float s = 0;
  for (int r = 0; r < nranks; r++)
    s += value(r, i);
  return s;
}

/* An AllReduce on every comm of `comms` from this one thread: a group is
 * what lets one thread drive several ranks. */
static int group_allreduce(ncclComm_t *comms, int n) {
  float *buf[MAXR];
  for (int r = 0; r < n; r++) {
    buf[r] = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
      buf[r][i] = value(r, i);
  }
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    ASSERT_OK(ncclAllReduce(buf[r], buf[r], N, ncclFloat, ncclSum, comms[r], NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < N; i++)
      ASSERT_MSG(buf[r][i] == sum_of(n, i), "comm %d element %d is %g, expected %g", r, i, buf[r][i], sum_of(n, i));
    free(buf[r]);
  }
  return 0;
}

static int check_queries(ncclComm_t comm, int want_rank, int want_count) {
  int count = -5, rank = -5, dev = -5, host = -5;
  ASSERT_OK(ncclCommCount(comm, &count));
  ASSERT_OK(ncclCommUserRank(comm, &rank));
  ASSERT_OK(ncclCommCuDevice(comm, &dev));
  ASSERT_OK(loomCommIsHost(comm, &host));
  ASSERT_MSG(count == want_count, "ncclCommCount says %d, expected %d", count, want_count);
  ASSERT_MSG(rank == want_rank, "ncclCommUserRank says %d, expected %d", rank, want_rank);
  ASSERT_MSG(dev == -1, "a host communicator's ncclCommCuDevice is %d, expected -1", dev);
  ASSERT_MSG(host == 1, "loomCommIsHost says %d", host);
  return 0;
}

/* In a rank process: a failed check returns 1 from the rank. */
static int rank_allreduce(ncclComm_t comm, int rank, int nranks) {
  float *b = malloc(N * sizeof *b);
  for (int i = 0; i < N; i++)
    b[i] = value(rank, i);
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < N; i++)
    RASSERT(b[i] == sum_of(nranks, i), "rank %d element %d is %g, expected %g", rank, i, b[i], sum_of(nranks, i));
  free(b);
  return 0;
}

TEST_IMPL(comm_version) {
  int v = 0;
  ASSERT_OK(ncclGetVersion(&v));
  ASSERT_MSG(v == NCCL_VERSION_CODE, "ncclGetVersion says %d, the header %d", v, NCCL_VERSION_CODE);
  ASSERT(NCCL_VERSION_CODE == 22700);
  ASSERT(NCCL_VERSION(2, 27, 0) == 22700);
  /* Programs compare against old codes too, which use the old encoding. */
  ASSERT(NCCL_VERSION(2, 8, 4) == 2804);
  ASSERT(ncclGetVersion(NULL) == ncclInvalidArgument);
  return 0;
}

/* ---- several ranks in one process ---- */

static int init_all(int n) {
  ncclComm_t comms[MAXR];
  ASSERT_OK(ncclCommInitAll(comms, n, NULL));
  for (int r = 0; r < n; r++)
    if (check_queries(comms[r], r, n) != 0)
      return 1;
  if (group_allreduce(comms, n) != 0)
    return 1;
  for (int r = 0; r < n; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

TEST_IMPL(comm_init_all_1) { return init_all(1); }
TEST_IMPL(comm_init_all_3) { return init_all(3); }
TEST_IMPL(comm_init_all_4) { return init_all(4); }

/* Creations inside a group run at ncclGroupEnd, together, so one thread
 * can create every rank of a communicator. */
TEST_IMPL(comm_group_init) {
  enum { R = 3 };
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comms[R];
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommInitRank(&comms[r], R, id, r));
  ASSERT_OK(ncclGroupEnd());
  for (int r = 0; r < R; r++)
    if (check_queries(comms[r], r, R) != 0)
      return 1;
  if (group_allreduce(comms, R) != 0)
    return 1;
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

/* ---- configs ---- */

static int config_name_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "loom-test-comm";
  cfg.blocking = 1;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg));
  if (rank_allreduce(comm, rank, nranks) != 0)
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_config_name) { return run_ranks(2, config_name_rank, NULL); }

/* A program built against an older or newer nccl.h passes a config of
 * its own size: the library must read only the fields that size covers,
 * whatever lies after them. */
static int config_sized(size_t size) {
  union {
    ncclConfig_t c;
    unsigned char bytes[sizeof(ncclConfig_t) + 64];
  } buf;
  memset(&buf, 0xa5, sizeof buf);
  ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
  memcpy(&buf, &init, size < sizeof init ? size : sizeof init);
  buf.c.size = size;
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  ASSERT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &buf.c));
  ncclComm_t one[1] = {comm};
  if (group_allreduce(one, 1) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_config_older) { return config_sized(offsetof(ncclConfig_t, CTAPolicy)); }
TEST_IMPL(comm_config_newer) { return config_sized(sizeof(ncclConfig_t) + 64); }

/* ---- split ---- */

static int split_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm, sub = NULL;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  /* key = -rank reverses the order within each colour: of {c, c+2}, old
   * rank c+2 becomes 0. */
  RCHECK(comm, ncclCommSplit(comm, rank % 2, -rank, &sub, NULL));
  RASSERT(sub != NULL, "rank %d got no sub-communicator", rank);
  int want_rank = rank < 2 ? 1 : 0, got_rank = -1, got_n = -1;
  RCHECK(sub, ncclCommUserRank(sub, &got_rank));
  RCHECK(sub, ncclCommCount(sub, &got_n));
  RASSERT(got_rank == want_rank && got_n == 2, "old rank %d: new rank %d of %d, expected %d of 2", rank, got_rank,
          got_n, want_rank);
  float b[N];
  for (int i = 0; i < N; i++)
    b[i] = (float)(rank * 1000 + i);
  RCHECK(sub, ncclBroadcast(b, b, N, ncclFloat, 0, sub, NULL));
  int root_old = rank % 2 + 2;
  for (int i = 0; i < N; i++)
    RASSERT(b[i] == (float)(root_old * 1000 + i), "old rank %d: Broadcast element %d is %g", rank, i, b[i]);
  for (int i = 0; i < N; i++)
    b[i] = (float)rank;
  RCHECK(sub, ncclAllReduce(b, b, N, ncclFloat, ncclSum, sub, NULL));
  for (int i = 0; i < N; i++)
    RASSERT(b[i] == (float)(2 * (rank % 2) + 2), "old rank %d: AllReduce element %d is %g", rank, i, b[i]);
  /* The parent is unaffected by its child. */
  if (rank_allreduce(comm, rank, nranks) != 0)
    return 1;
  RCHECK(sub, ncclCommDestroy(sub));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_split) { return run_ranks(4, split_rank, NULL); }

static int split_nocolor_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm, sub = (ncclComm_t)(void *)&id;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  int color = rank == nranks - 1 ? NCCL_SPLIT_NOCOLOR : 7;
  RCHECK(comm, ncclCommSplit(comm, color, 0, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    RASSERT(sub == NULL, "the rank that passed NCCL_SPLIT_NOCOLOR got %p", (void *)sub);
  } else {
    RASSERT(sub != NULL, "rank %d got no sub-communicator", rank);
    int n = -1, r = -1;
    RCHECK(sub, ncclCommCount(sub, &n));
    RCHECK(sub, ncclCommUserRank(sub, &r));
    RASSERT(n == nranks - 1 && r == rank, "rank %d: new rank %d of %d", rank, r, n);
    if (rank_allreduce(sub, rank, nranks - 1) != 0)
      return 1;
    RCHECK(sub, ncclCommDestroy(sub));
  }
  if (rank_allreduce(comm, rank, nranks) != 0)
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_split_nocolor) { return run_ranks(4, split_nocolor_rank, NULL); }

/* Reverse all four, then halve the reversed communicator: old ranks
 * {3, 2} and {1, 0} end up together. */
static int split_twice_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm, rev, half;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  RCHECK(comm, ncclCommSplit(comm, 0, -rank, &rev, NULL));
  int r1 = -1;
  RCHECK(rev, ncclCommUserRank(rev, &r1));
  RASSERT(r1 == nranks - 1 - rank, "old rank %d: reversed rank %d", rank, r1);
  RCHECK(rev, ncclCommSplit(rev, r1 / 2, r1, &half, NULL));
  int r2 = -1, n2 = -1;
  RCHECK(half, ncclCommUserRank(half, &r2));
  RCHECK(half, ncclCommCount(half, &n2));
  RASSERT(r2 == r1 % 2 && n2 == 2, "old rank %d: rank %d of %d in the half", rank, r2, n2);
  float b[N];
  for (int i = 0; i < N; i++)
    b[i] = (float)rank;
  RCHECK(half, ncclAllReduce(b, b, N, ncclFloat, ncclSum, half, NULL));
  float want = rank >= 2 ? 5.0f : 1.0f;
  for (int i = 0; i < N; i++)
    RASSERT(b[i] == want, "old rank %d: element %d is %g, expected %g", rank, i, b[i], want);
  RCHECK(half, ncclCommDestroy(half));
  if (rank_allreduce(rev, r1, nranks) != 0)
    return 1;
  RCHECK(rev, ncclCommDestroy(rev));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_split_twice) { return run_ranks(4, split_twice_rank, NULL); }

/* One thread splits every rank: only a group lets the splits meet. */
TEST_IMPL(comm_split_group) {
  enum { R = 4 };
  ncclComm_t comms[R], sub[R];
  ASSERT_OK(ncclCommInitAll(comms, R, NULL));
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommSplit(comms[r], r % 2, r, &sub[r], NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int r = 0; r < R; r++)
    if (check_queries(sub[r], r / 2, 2) != 0)
      return 1;
  float b[R][N];
  for (int r = 0; r < R; r++)
    for (int i = 0; i < N; i++)
      b[r][i] = (float)r;
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclAllReduce(b[r], b[r], N, ncclFloat, ncclSum, sub[r], NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int r = 0; r < R; r++)
    for (int i = 0; i < N; i++)
      ASSERT_MSG(b[r][i] == (float)(2 * (r % 2) + 2), "sub %d element %d is %g", r, i, b[r][i]);
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommDestroy(sub[r]));
  if (group_allreduce(comms, R) != 0)
    return 1;
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

/* ---- lifecycle ---- */

static ncclComm_t one_rank_comm(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    fprintf(stderr, "cannot create a 1-rank communicator: %s\n", ncclGetLastError(NULL));
    exit(1);
  }
  return comm;
}

TEST_IMPL(comm_finalize) {
  ncclComm_t comm = one_rank_comm();
  float b[4] = {1, 2, 3, 4};
  ASSERT_OK(ncclAllReduce(b, b, 4, ncclFloat, ncclSum, comm, NULL));
  ASSERT_OK(ncclCommFinalize(comm));
  ncclResult_t r = ncclAllReduce(b, b, 4, ncclFloat, ncclSum, comm, NULL);
  ASSERT_MSG(r == ncclInvalidUsage, "a collective after ncclCommFinalize returned %d", (int)r);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "finalized") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_MSG(strstr(ncclGetLastError(comm), "ncclAllReduce") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

static int abort_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  if (rank_allreduce(comm, rank, nranks) != 0)
    return 1;
  double t0 = now_s();
  RCHECK(NULL, ncclCommAbort(comm));
  RASSERT(now_s() - t0 < 5, "ncclCommAbort took %.1f s", now_s() - t0);
  return 0;
}

TEST_IMPL(comm_abort) { return run_ranks(2, abort_rank, NULL); }

/* Aborting a communicator that is not connected yet, and one of several
 * in a process, must not disturb the others. */
TEST_IMPL(comm_abort_one_of_many) {
  ncclComm_t a = one_rank_comm();
  ncclComm_t comms[2];
  ASSERT_OK(ncclCommInitAll(comms, 2, NULL));
  ASSERT_OK(ncclCommAbort(a));
  if (group_allreduce(comms, 2) != 0)
    return 1;
  ASSERT_OK(ncclCommAbort(comms[0]));
  ASSERT_OK(ncclCommAbort(comms[1]));
  return 0;
}

TEST_IMPL(comm_async_error) {
  ncclComm_t comms[2];
  ASSERT_OK(ncclCommInitAll(comms, 2, NULL));
  ncclResult_t e = ncclInternalError;
  ASSERT_OK(ncclCommGetAsyncError(comms[0], &e));
  ASSERT_MSG(e == ncclSuccess, "a new communicator reports async error %d", (int)e);
  if (group_allreduce(comms, 2) != 0)
    return 1;
  /* An argument error is the caller's, not the communicator's. */
  ASSERT(ncclAllReduce(NULL, NULL, 4, (ncclDataType_t)99, ncclSum, comms[0], NULL) == ncclInvalidArgument);
  for (int r = 0; r < 2; r++) {
    e = ncclInternalError;
    ASSERT_OK(ncclCommGetAsyncError(comms[r], &e));
    ASSERT_MSG(e == ncclSuccess, "comm %d reports async error %d after healthy use", r, (int)e);
  }
  ASSERT(ncclCommGetAsyncError(comms[0], NULL) == ncclInvalidArgument);
  ASSERT(ncclCommGetAsyncError(NULL, &e) == ncclInvalidArgument);
  for (int r = 0; r < 2; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

/* ---- registration and memory ---- */

TEST_IMPL(comm_register) {
  ncclComm_t comms[2];
  ASSERT_OK(ncclCommInitAll(comms, 2, NULL));
  static float buf[2][N];
  void *h[2];
  for (int r = 0; r < 2; r++)
    ASSERT_OK(ncclCommRegister(comms[r], buf[r], sizeof buf[r], &h[r]));
  /* Registered buffers are used like any other. */
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < N; i++)
      buf[r][i] = value(r, i);
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++)
    ASSERT_OK(ncclAllReduce(buf[r], buf[r], N, ncclFloat, ncclSum, comms[r], NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int i = 0; i < N; i++)
    ASSERT(buf[0][i] == sum_of(2, i) && buf[1][i] == sum_of(2, i));
  /* A handle belongs to the communicator that made it. */
  ASSERT(ncclCommDeregister(comms[1], h[0]) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(comms[1]), "not registered") != NULL, "%s", ncclGetLastError(comms[1]));
  for (int r = 0; r < 2; r++)
    ASSERT_OK(ncclCommDeregister(comms[r], h[r]));
  /* A readable struct that was never a handle. */
  static char bogus[64];
  ASSERT(ncclCommDeregister(comms[0], bogus) == ncclInvalidArgument);
  ASSERT(ncclCommDeregister(comms[0], NULL) == ncclInvalidArgument);
  void *hh;
  ASSERT(ncclCommRegister(comms[0], NULL, 64, &hh) == ncclInvalidArgument);
  ASSERT(ncclCommRegister(comms[0], buf[0], 0, &hh) == ncclInvalidArgument);
  ASSERT(ncclCommRegister(comms[0], buf[0], 64, NULL) == ncclInvalidArgument);
  for (int r = 0; r < 2; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

TEST_IMPL(comm_window_register) {
  ncclComm_t comm = one_rank_comm();
  static char buf[4096];
  ncclWindow_t w1, w2;
  ASSERT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &w1, NCCL_WIN_DEFAULT));
  ASSERT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &w2, NCCL_WIN_COLL_SYMMETRIC));
  ASSERT(w1 != NULL && w2 != NULL && w1 != w2);
  ASSERT_OK(ncclCommWindowDeregister(comm, w1));
  ASSERT_OK(ncclCommWindowDeregister(comm, w2));
  static char bogus[64];
  ASSERT(ncclCommWindowDeregister(comm, (ncclWindow_t)(void *)bogus) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "ncclCommWindowDeregister") != NULL, "%s", ncclGetLastError(comm));
  ASSERT(ncclCommWindowRegister(comm, buf, sizeof buf, &w1, 0x100) == ncclInvalidArgument);
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_mem_alloc) {
  void *p = NULL;
  ASSERT_OK(ncclMemAlloc(&p, N * sizeof(float)));
  ASSERT(p != NULL);
  float *f = p;
  for (int i = 0; i < N; i++)
    f[i] = (float)i;
  ncclComm_t comm = one_rank_comm();
  ASSERT_OK(ncclAllReduce(f, f, N, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < N; i++)
    ASSERT(f[i] == (float)i);
  ASSERT_OK(ncclCommDestroy(comm));
  ASSERT_OK(ncclMemFree(p));
  ASSERT(ncclMemAlloc(NULL, 64) == ncclInvalidArgument);
  return 0;
}

/* ---- unique ids as text ---- */

TEST_IMPL(comm_unique_id_hex) {
  ncclUniqueId id, back;
  ASSERT_OK(ncclGetUniqueId(&id));
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
  memset(hex, 'x', sizeof hex);
  ASSERT_OK(loomUniqueIdToHex(&id, hex));
  ASSERT(strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES);
  for (int i = 0; i < 2 * NCCL_UNIQUE_ID_BYTES; i++)
    ASSERT_MSG((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'), "character %d is '%c'", i,
               hex[i]);
  memset(&back, 0, sizeof back);
  ASSERT_OK(loomUniqueIdFromHex(hex, &back));
  ASSERT(memcmp(&id, &back, sizeof id) == 0);
  /* Upper case is what a user may paste. */
  char upper[sizeof hex];
  for (size_t i = 0; i < sizeof hex; i++)
    upper[i] = (hex[i] >= 'a' && hex[i] <= 'f') ? (char)(hex[i] - 32) : hex[i];
  ASSERT_OK(loomUniqueIdFromHex(upper, &back));
  ASSERT(memcmp(&id, &back, sizeof id) == 0);
  /* The decoded id is as good as the original. */
  ncclComm_t comm;
  ASSERT_OK(ncclCommInitRank(&comm, 1, back, 0));
  ASSERT_OK(ncclCommDestroy(comm));

  char bad[sizeof hex + 1];
  memcpy(bad, hex, sizeof hex);
  bad[2 * NCCL_UNIQUE_ID_BYTES - 1] = '\0';
  ASSERT(loomUniqueIdFromHex(bad, &back) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "255") != NULL, "%s", ncclGetLastError(NULL));
  memcpy(bad, hex, sizeof hex);
  bad[2 * NCCL_UNIQUE_ID_BYTES] = '0';
  bad[2 * NCCL_UNIQUE_ID_BYTES + 1] = '\0';
  ASSERT(loomUniqueIdFromHex(bad, &back) == ncclInvalidArgument);
  memcpy(bad, hex, sizeof hex);
  bad[17] = 'g';
  ASSERT(loomUniqueIdFromHex(bad, &back) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "character 17") != NULL, "%s", ncclGetLastError(NULL));
  ASSERT(loomUniqueIdFromHex("", &back) == ncclInvalidArgument);
  ASSERT(loomUniqueIdFromHex(NULL, &back) == ncclInvalidArgument);
  ASSERT(loomUniqueIdFromHex(hex, NULL) == ncclInvalidArgument);
  ASSERT(loomUniqueIdToHex(NULL, hex) == ncclInvalidArgument);
  ASSERT(loomUniqueIdToHex(&id, NULL) == ncclInvalidArgument);
  return 0;
}

/* ---- teardown right after use ---- */

/* A rank whose part of an operation is only to send (the sender of a
 * Send that fits the FIFO, the root of a Broadcast) is done before its
 * peer has looked at anything, and may destroy its communicator at once:
 * the peer must still finish. Repeated because it is a race: each job
 * races on communicators split off its first one, then on the first one
 * itself, whose destroy is followed by the process's exit. Splits, not
 * new jobs, make most rounds, since forking ranks and discovering the
 * host's topology are most of a job's start and a sanitizer multiplies
 * both. */
enum { DESTROY_JOBS = 10, DESTROY_SPLITS = 4 };

static int send_then_destroy(ncclComm_t comm, int rank, int bcast) {
  float b[100];
  for (int i = 0; i < 100; i++)
    b[i] = rank == 0 ? (float)i : -1.0f;
  if (bcast)
    RCHECK(comm, ncclBroadcast(b, b, 100, ncclFloat, 0, comm, NULL));
  else if (rank == 0)
    RCHECK(comm, ncclSend(b, 100, ncclFloat, 1, comm, NULL));
  else
    RCHECK(comm, ncclRecv(b, 100, ncclFloat, 0, comm, NULL));
  for (int i = 0; i < 100; i++)
    RASSERT(b[i] == (float)i, "rank %d: element %d is %g", rank, i, b[i]);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int send_destroy_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  int bcast = arg != NULL;
  ncclComm_t parent;
  RCHECK(NULL, ncclCommInitRank(&parent, nranks, id, rank));
  for (int i = 0; i < DESTROY_SPLITS; i++) {
    ncclComm_t comm;
    RCHECK(parent, ncclCommSplit(parent, 0, rank, &comm, NULL));
    if (send_then_destroy(comm, rank, bcast) != 0) {
      fprintf(stderr, "rank %d: failed in split %d of %d\n", rank, i + 1, DESTROY_SPLITS);
      return 1;
    }
  }
  return send_then_destroy(parent, rank, bcast);
}

static int destroy_race(int bcast) {
  for (int i = 0; i < DESTROY_JOBS; i++)
    if (run_ranks(2, send_destroy_rank, bcast ? (void *)1 : NULL) != 0) {
      fprintf(stderr, "failed in job %d of %d\n", i + 1, DESTROY_JOBS);
      return 1;
    }
  return 0;
}

TEST_IMPL(comm_destroy_after_send) { return destroy_race(0); }
TEST_IMPL(comm_destroy_after_bcast) { return destroy_race(1); }
