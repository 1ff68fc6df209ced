/*
 * Counts no buffer can have: a call is refused with ncclInvalidArgument
 * and a sentence naming the count and why, at once and without planning
 * it. Each rank runs under an address-space limit of 4 GiB, so a planner
 * that sized anything by the count (a schedule of 2^61 floats once grew to
 * 11.7 GB) fails the test instead of the machine.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1 /* its shadow memory is reserved address space */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#define LIMIT_BYTES ((rlim_t)4 << 30)

/* The call returns `want` quickly, and the sentence holds every keyword. */
static int refused(ncclComm_t comm, const char *call, ncclResult_t r, double t0, const char *const *kw) {
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(comm);
  if (r != ncclInvalidArgument) {
    fprintf(stderr, "%s returned %d (%s), expected ncclInvalidArgument; last error: %s\n", call, (int)r,
            ncclGetErrorString(r), msg);
    return 0;
  }
  for (; *kw; kw++)
    if (!strstr(msg, *kw)) {
      fprintf(stderr, "%s: the last error does not mention \"%s\": %s\n", call, *kw, msg);
      return 0;
    }
  if (took > 1.0) {
    fprintf(stderr, "%s took %.2f s to be refused\n", call, took);
    return 0;
  }
  return 1;
}

#define REFUSED(comm, call, ...)                                                          \
  do {                                                                                    \
    const char *const refused_kw_[] = {__VA_ARGS__, NULL};                                \
    double refused_t0_ = now_s();                                                         \
    ncclResult_t refused_r_ = (call);                                                     \
    if (!refused(comm, #call, refused_r_, refused_t0_, refused_kw_))                      \
      return 1;                                                                           \
  } while (0)

static char count_kw[64];
static const char *count_is(size_t count) {
  snprintf(count_kw, sizeof count_kw, "count %zu", count);
  return count_kw;
}

static float sbuf[64], rbuf[64];

static int huge_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
#ifndef UNDER_SANITIZER
  struct rlimit rl = {LIMIT_BYTES, LIMIT_BYTES};
  RASSERT(setrlimit(RLIMIT_AS, &rl) == 0, "setrlimit(RLIMIT_AS) failed");
  void *big = malloc((size_t)LIMIT_BYTES);
  RASSERT(big == NULL, "the address-space limit does not hold: a 4 GiB malloc succeeded");
#endif
  setenv("LOOM_DEVICE", "host", 1); /* host buffers, even where there is a GPU */
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  int peer = (rank + 1) % nranks;
  /* 2^61 - 1 floats: the byte count fits in size_t but no buffer is that
   * large. */
  size_t huge = ((size_t)1 << 61) - 1;
  const char *why = "larger than any buffer";
  REFUSED(comm, ncclAllReduce(sbuf, rbuf, huge, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce", count_is(huge),
          why);
  /* Again, now that the communicator has made its connections. */
  RCHECK(comm, ncclAllReduce(sbuf, rbuf, 64, ncclFloat, ncclSum, comm, NULL));
  REFUSED(comm, ncclAllReduce(sbuf, rbuf, huge, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce", count_is(huge),
          why);
  REFUSED(comm, ncclBroadcast(sbuf, rbuf, huge, ncclFloat, 0, comm, NULL), "ncclBroadcast", count_is(huge), why);
  REFUSED(comm, ncclReduce(sbuf, rbuf, huge, ncclFloat, ncclSum, 0, comm, NULL), "ncclReduce", count_is(huge), why);
  REFUSED(comm, ncclSend(sbuf, huge, ncclFloat, peer, comm, NULL), "ncclSend", count_is(huge), why);
  REFUSED(comm, ncclRecv(rbuf, huge, ncclFloat, peer, comm, NULL), "ncclRecv", count_is(huge), why);
  /* The gathered and scattered sides are nranks times the count. */
  size_t block = ((size_t)1 << 57) / 4 / (size_t)nranks + 1;
  REFUSED(comm, ncclAllGather(sbuf, rbuf, block, ncclFloat, comm, NULL), "ncclAllGather", count_is(block), why,
          "times nranks");
  REFUSED(comm, ncclReduceScatter(sbuf, rbuf, block, ncclFloat, ncclSum, comm, NULL), "ncclReduceScatter",
          count_is(block), why, "times nranks");
  /* Count times the type's size overflows size_t. */
  size_t over = ((size_t)1 << 62) + 1;
  REFUSED(comm, ncclAllReduce(sbuf, rbuf, over, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce", count_is(over),
          "overflows the address space");
  REFUSED(comm, ncclAllReduce(sbuf, rbuf, over, ncclFloat64, ncclSum, comm, NULL), "ncclAllReduce", count_is(over),
          "overflows the address space");
  /* A count that could be a buffer, at an address where it cannot:
   * wrapping around the end of the address space. (High addresses are
   * not refused as such: pointers may carry tags in their top bits.) */
  void *wrap = (void *)(uintptr_t)(UINTPTR_MAX - 15);
  REFUSED(comm, ncclAllReduce(sbuf, wrap, 64, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce", "recvbuff",
          count_is(64), "past the end");
  REFUSED(comm, ncclBcast(wrap, 64, ncclFloat, rank, comm, NULL), "ncclBcast", "buff", count_is(64), "past the end");
  /* Inside a group the call is refused and the group runs nothing. */
  RCHECK(comm, ncclGroupStart());
  REFUSED(comm, ncclAllReduce(sbuf, rbuf, huge, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce", count_is(huge),
          why);
  ncclResult_t r = ncclGroupEnd();
  RASSERT(r == ncclInvalidArgument, "ncclGroupEnd after a refused call returned %d (%s)", (int)r,
          ncclGetErrorString(r));
  /* None of it broke the communicator. */
  for (int i = 0; i < 64; i++)
    sbuf[i] = (float)(rank + 1) * (float)i;
  RCHECK(comm, ncclAllReduce(sbuf, rbuf, 64, ncclFloat, ncclSum, comm, NULL));
  float sum = (float)(nranks * (nranks + 1) / 2);
  for (int i = 0; i < 64; i++)
    RASSERT(rbuf[i] == sum * (float)i, "element %d is %g, expected %g", i, rbuf[i], sum * (float)i);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(huge_count_host_1) { return run_ranks(1, huge_rank, NULL); }
TEST_IMPL(huge_count_host_2) { return run_ranks(2, huge_rank, NULL); }
