/*
 * LOOM_CHECK_CALLS: ranks that disagree about a collective are all told,
 * with the same sentence naming the ranks and what they called, before
 * any data moves; the communicator then still works. The slot headers
 * (test_comm_mismatch.c) cannot do this for every rank, nor at all for a
 * Broadcast whose ranks disagree on the root.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_PAIR };

struct call {
  int coll;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int root;
};

#define MAX_RANKS 4

struct case_ {
  int nranks;
  struct call c[MAX_RANKS];
  const char *want[4]; /* every rank's message contains these */
};

/* Refusal comes from one small all-gather: anything near LOOM_TIMEOUT
 * means it hung. */
#define BOUND_S 5.0

static ncclResult_t do_call(const struct call *c, double *buf, double *out, int nranks, ncclComm_t comm) {
  switch (c->coll) {
  case C_ALLREDUCE: return ncclAllReduce(buf, out, c->count, c->dtype, c->op, comm, NULL);
  case C_BROADCAST: return ncclBroadcast(buf, out, c->count, c->dtype, c->root, comm, NULL);
  case C_REDUCE: return ncclReduce(buf, out, c->count, c->dtype, c->op, c->root, comm, NULL);
  case C_ALLGATHER: return ncclAllGather(buf, out, c->count, c->dtype, comm, NULL);
  default: /* two collectives in one group */
    ncclGroupStart();
    ncclAllReduce(buf, out, c->count, c->dtype, c->op, comm, NULL);
    ncclAllGather(buf, out, c->count, c->dtype, comm, NULL);
    return ncclGroupEnd();
  }
}

static int case_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  const struct case_ *k = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  size_t n = 4096;
  double *buf = calloc(n * nranks, sizeof *buf), *out = calloc(n * nranks, sizeof *out);
  for (size_t i = 0; i < n; i++)
    buf[i] = rank + 1;
  double t0 = now_s();
  ncclResult_t r = do_call(&k->c[rank], buf, out, nranks, comm);
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(comm);
  RASSERT(took < BOUND_S, "rank %d took %.1f s to return %d: %s", rank, took, (int)r, msg);
  RASSERT(r == ncclInvalidUsage, "rank %d: the mismatched call returned %d (%s): %s", rank, (int)r,
          ncclGetErrorString(r), msg);
  char me[32];
  snprintf(me, sizeof me, "rank %d: ", rank);
  RASSERT(strncmp(msg, me, strlen(me)) == 0 || strstr(msg, me), "rank %d: the error does not say \"%s\": %s", rank,
          me, msg);
  for (const char *const *kw = k->want; *kw; kw++)
    RASSERT(strstr(msg, *kw) != NULL, "rank %d: the error does not mention \"%s\": %s", rank, *kw, msg);
  /* Nothing moved, so nothing is broken: the next call agrees and works. */
  RCHECK(comm, ncclAllReduce(buf, out, n, ncclFloat64, ncclSum, comm, NULL));
  double want = nranks * (nranks + 1) / 2.0;
  for (size_t i = 0; i < n; i++)
    RASSERT(out[i] == want, "rank %d: element %zu of the AllReduce after the refusal is %g, not %g", rank, i, out[i],
            want);
  free(buf);
  free(out);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int run_case(const struct case_ *k) {
  setenv("LOOM_CHECK_CALLS", "1", 1);
  setenv("LOOM_TIMEOUT", "15", 1);
  return run_ranks(k->nranks, case_rank, (void *)k);
}

#define AR(cnt, t, o) {C_ALLREDUCE, cnt, t, o, -1}
#define BC(cnt, t, rt) {C_BROADCAST, cnt, t, ncclSum, rt}

/* The case slot headers miss entirely: both ranks think they are the
 * root, both send, nobody receives. */
TEST_IMPL(call_check_root_2) {
  static const struct case_ k = {
      .nranks = 2,
      .c = {BC(1000, ncclFloat, 0), BC(1000, ncclFloat, 1)},
      .want = {"differ in the root", "rank 0 called Broadcast(count 1000, float, root 0)",
               "rank 1 called Broadcast(count 1000, float, root 1)"},
  };
  return run_case(&k);
}

TEST_IMPL(call_check_root_4) {
  static const struct case_ k = {
      .nranks = 4,
      .c = {BC(1000, ncclFloat, 0), BC(1000, ncclFloat, 0), BC(1000, ncclFloat, 2), BC(1000, ncclFloat, 0)},
      .want = {"differ in the root", "ranks 0, 1, 3 called Broadcast(count 1000, float, root 0)",
               "rank 2 called Broadcast(count 1000, float, root 2)"},
  };
  return run_case(&k);
}

TEST_IMPL(call_check_count) {
  static const struct case_ k = {
      .nranks = 3,
      .c = {AR(100, ncclFloat, ncclSum), AR(100, ncclFloat, ncclSum), AR(101, ncclFloat, ncclSum)},
      .want = {"differ in the count", "ranks 0, 1 called AllReduce(count 100, float, sum)",
               "rank 2 called AllReduce(count 101, float, sum)"},
  };
  return run_case(&k);
}

TEST_IMPL(call_check_dtype) {
  static const struct case_ k = {
      .nranks = 2,
      .c = {AR(100, ncclFloat, ncclSum), AR(100, ncclInt32, ncclSum)},
      .want = {"differ in the datatype", "rank 1 called AllReduce(count 100, int32, sum)"},
  };
  return run_case(&k);
}

TEST_IMPL(call_check_op) {
  static const struct case_ k = {
      .nranks = 3,
      .c = {AR(100, ncclFloat, ncclSum), AR(100, ncclFloat, ncclMax), AR(100, ncclFloat, ncclSum)},
      .want = {"differ in the reduction op", "ranks 0, 2 called AllReduce(count 100, float, sum)",
               "rank 1 called AllReduce(count 100, float, max)"},
  };
  return run_case(&k);
}

TEST_IMPL(call_check_coll) {
  static const struct case_ k = {
      .nranks = 3,
      .c = {AR(100, ncclFloat, ncclSum), {C_REDUCE, 100, ncclFloat, ncclSum, 0}, AR(100, ncclFloat, ncclSum)},
      .want = {"differ in the collective", "rank 1 called Reduce(count 100, float, sum, root 0)",
               "ranks 0, 2 called AllReduce(count 100, float, sum)"},
  };
  return run_case(&k);
}

/* One rank's group holds a collective more than the others'. */
TEST_IMPL(call_check_group) {
  static const struct case_ k = {
      .nranks = 2,
      .c = {AR(100, ncclFloat, ncclSum), {C_PAIR, 100, ncclFloat, ncclSum, -1}},
      .want = {"differ in the number of collectives in the group",
               "rank 1 called a group of 2 collectives: AllReduce(count 100, float, sum), AllGather(count 100, float)"},
  };
  return run_case(&k);
}

/* The check is agreed at init: a rank that would check and one that
 * would not could only misread each other. */
static int env_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  setenv("LOOM_CHECK_CALLS", rank == 0 ? "1" : "0", 1);
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  const char *msg = ncclGetLastError(NULL);
  RASSERT(r == ncclInvalidUsage, "rank %d: init with LOOM_CHECK_CALLS differing returned %d: %s", rank, (int)r, msg);
  RASSERT(strstr(msg, "LOOM_CHECK_CALLS is") && strstr(msg, "set it the same everywhere"),
          "rank %d: the error does not name LOOM_CHECK_CALLS: %s", rank, msg);
  return 0;
}

TEST_IMPL(call_check_env_differs) {
  setenv("LOOM_TIMEOUT", "15", 1);
  return run_ranks(2, env_rank, NULL);
}
