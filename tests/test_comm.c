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
#include <unistd.h>

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

/* ---- ncclConfig_t of every version ----
 * Layouts, as NVIDIA's headers have them (x86-64): 2.14-2.16, 24 bytes
 * (blocking); 2.17-2.26, 48 (to splitShare, trafficClass from 2.25 in
 * what was padding before); 2.27, 72 (to nvlsCTAs); 2.30, 96. The
 * library reads a field where `size` covers it and `version` is at least
 * the NCCL that added it, as NVIDIA's parseCommConfig does. */

union config_buf {
  ncclConfig_t c;
  unsigned char bytes[128];
};

/* `fields` as a program built against an older or newer header passes
 * them: its `size` bytes of them, then whatever its memory holds (0xa5,
 * which as an int is negative, so read it would be refused). */
static void config_as(union config_buf *b, const ncclConfig_t *fields, size_t size, unsigned version) {
  memset(b, 0xa5, sizeof *b);
  memcpy(b, fields, size < sizeof *fields ? size : sizeof *fields);
  b->c.size = size;
  b->c.version = version;
}

/* A one-rank communicator from `cfg` (waited for, if nonblocking): it
 * must have `want_channels` channels (0: any) and sum right. */
static int config_one_rank(ncclConfig_t *cfg, int want_channels, int nonblocking) {
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, cfg);
  ASSERT_MSG(r == (nonblocking ? ncclInProgress : ncclSuccess), "ncclCommInitRankConfig returned %d: %s", (int)r,
             ncclGetLastError(NULL));
  for (int i = 0; r == ncclInProgress && i < 20000; i++) {
    ASSERT_OK(ncclCommGetAsyncError(comm, &r));
    if (r == ncclInProgress)
      usleep(1000);
  }
  ASSERT_MSG(r == ncclSuccess, "the nonblocking creation ended with %d: %s", (int)r, ncclGetLastError(comm));
  int nch = 0;
  ASSERT_OK(loomCommChannels(comm, &nch));
  ASSERT_MSG(want_channels == 0 || nch == want_channels, "%d channels, expected %d from minCTAs/maxCTAs", nch,
             want_channels);
  if (!nonblocking) {
    ncclComm_t one[1] = {comm};
    if (group_allreduce(one, 1) != 0)
      return 1;
  }
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* Every field a 2.30 header has, set to a value NVIDIA takes. */
static ncclConfig_t config_v230(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 1;
  c.cgaClusterSize = 2;
  c.minCTAs = 3;
  c.maxCTAs = 3;
  c.netName = "socket"; /* NCCL_NET's plugin, in any case */
  c.splitShare = 0;
  c.trafficClass = 5;
  c.commName = "loom-config-v230";
  c.collnetEnable = 0;
  c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
  c.shrinkShare = 1;
  c.nvlsCTAs = 4;
  c.nChannelsPerNetPeer = 2;
  c.nvlinkCentricSched = 1;
  c.graphUsageMode = 1;
  c.numRmaCtx = 0;
  c.maxP2pPeers = 8;
  c.graphStreamOrdering = 1;
  return c;
}

TEST_IMPL(comm_config_v230) {
  setenv("NCCL_NET", "Socket", 1);
  ncclConfig_t c = config_v230();
  ASSERT(c.size == 96 || sizeof(void *) != 8);
  ASSERT(c.version == 23007);
  if (config_one_rank(&c, 3, 0) != 0)
    return 1;
  /* What NVIDIA takes and adjusts is taken too: channel counts beyond
   * the library's (Loom's 32, NVIDIA's 64) are capped, both CTA policies
   * become ZERO, and unordered graph streams with graph mixing (the
   * default graphUsageMode) ordered ones. */
  c.minCTAs = 64;
  c.maxCTAs = 64;
  c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  c.graphUsageMode = NCCL_CONFIG_UNDEF_INT;
  c.graphStreamOrdering = 0;
  c.collnetEnable = 1;
  c.nChannelsPerNetPeer = 64;
  return config_one_rank(&c, 32, 0);
}

/* One bad field each, NVIDIA's refusals: ncclInvalidArgument, a sentence
 * naming the call, the field and the value, and no communicator. */
struct bad_config {
  const char *what[3]; /* words the sentence must hold */
  int field;
  int value;
};

enum {
  F_BLOCKING, F_CGA, F_MIN, F_MAX, F_MINMAX, F_SPLIT, F_COLLNET, F_POLICY, F_SHRINK, F_NVLS, F_PERPEER,
  F_NVLINK, F_GRAPH, F_RMA, F_P2P, F_ORDER, F_NETEMPTY, F_NETCTRL, F_SIZE, F_MAGIC, F_NBMIN
};

static void bad_apply(ncclConfig_t *c, const struct bad_config *b) {
  switch (b->field) {
  case F_BLOCKING: c->blocking = b->value; break;
  case F_CGA: c->cgaClusterSize = b->value; break;
  case F_MIN: c->minCTAs = b->value; break;
  case F_MAX: c->maxCTAs = b->value; break;
  case F_MINMAX: c->minCTAs = 8; c->maxCTAs = 4; break;
  case F_SPLIT: c->splitShare = b->value; break;
  case F_COLLNET: c->collnetEnable = b->value; break;
  case F_POLICY: c->CTAPolicy = b->value; break;
  case F_SHRINK: c->shrinkShare = b->value; break;
  case F_NVLS: c->nvlsCTAs = b->value; break;
  case F_PERPEER: c->nChannelsPerNetPeer = b->value; break;
  case F_NVLINK: c->nvlinkCentricSched = b->value; break;
  case F_GRAPH: c->graphUsageMode = b->value; break;
  case F_RMA: c->numRmaCtx = b->value; break;
  case F_P2P: c->maxP2pPeers = b->value; break;
  case F_ORDER: c->graphStreamOrdering = b->value; break;
  case F_NETEMPTY: c->netName = ""; break;
  case F_NETCTRL: c->netName = "Sock\net"; break;
  case F_SIZE: c->size = (size_t)b->value; break;
  case F_MAGIC: c->magic = (unsigned)b->value; break;
  case F_NBMIN: c->blocking = 0; c->minCTAs = b->value; break;
  }
}

static const struct bad_config bad_configs[] = {
    {{"config.blocking", "2"}, F_BLOCKING, 2},
    {{"config.cgaClusterSize", "-1"}, F_CGA, -1},
    {{"config.minCTAs", "0"}, F_MIN, 0},
    {{"config.maxCTAs", "-4"}, F_MAX, -4},
    {{"config.minCTAs (8) is larger than config.maxCTAs (4)"}, F_MINMAX, 0},
    {{"config.splitShare", "2"}, F_SPLIT, 2},
    {{"config.collnetEnable", "-1"}, F_COLLNET, -1},
    {{"config.CTAPolicy", "4"}, F_POLICY, 4},
    {{"config.CTAPolicy", "-2"}, F_POLICY, -2},
    {{"config.shrinkShare", "3"}, F_SHRINK, 3},
    {{"config.nvlsCTAs", "0"}, F_NVLS, 0},
    {{"config.nChannelsPerNetPeer", "0"}, F_PERPEER, 0},
    {{"config.nChannelsPerNetPeer", "65"}, F_PERPEER, 65},
    {{"config.nvlinkCentricSched", "2"}, F_NVLINK, 2},
    {{"config.graphUsageMode", "3"}, F_GRAPH, 3},
    {{"config.numRmaCtx", "-1"}, F_RMA, -1},
    {{"config.maxP2pPeers", "0"}, F_P2P, 0},
    {{"config.graphStreamOrdering", "2"}, F_ORDER, 2},
    {{"config.netName", "empty"}, F_NETEMPTY, 0},
    {{"config.netName", "control character 0x0a"}, F_NETCTRL, 0},
    {{"config.size 8", "magic"}, F_SIZE, 8},
    {{"NCCL_CONFIG_INITIALIZER", "0x12345678"}, F_MAGIC, 0x12345678},
    /* A nonblocking creation is refused at once, not in the background. */
    {{"config.minCTAs", "-1"}, F_NBMIN, -1},
};

static int refused(ncclResult_t r, const char *func, const struct bad_config *b) {
  const char *msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == ncclInvalidArgument, "%s with %s returned %d: %s", func, b->what[0], (int)r, msg);
  ASSERT_MSG(strstr(msg, func) != NULL, "the sentence for %s does not name %s: %s", b->what[0], func, msg);
  for (int k = 0; k < 3 && b->what[k]; k++)
    ASSERT_MSG(strstr(msg, b->what[k]) != NULL, "the sentence for %s lacks \"%s\": %s", b->what[0], b->what[k], msg);
  return 0;
}

TEST_IMPL(comm_config_refused) {
  setenv("NCCL_NET", "Socket", 1);
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  size_t nbad = sizeof bad_configs / sizeof bad_configs[0];
  for (size_t i = 0; i < nbad; i++) {
    ncclConfig_t c = config_v230();
    bad_apply(&c, &bad_configs[i]);
    ncclComm_t comm = (ncclComm_t)(void *)&id;
    if (refused(ncclCommInitRankConfig(&comm, 1, id, 0, &c), "ncclCommInitRankConfig", &bad_configs[i]) != 0)
      return 1;
    ASSERT_MSG(comm == NULL, "a refused config (%s) left %p in *comm", bad_configs[i].what[0], (void *)comm);
  }
  /* Nothing of that reached the bootstrap: the id still makes a
   * communicator, whose split and shrink refuse the same configs. */
  ncclComm_t comm;
  ASSERT_OK(ncclCommInitRank(&comm, 1, id, 0));
  for (size_t i = 0; i < nbad; i++) {
    ncclConfig_t c = config_v230();
    bad_apply(&c, &bad_configs[i]);
    ncclComm_t child = comm;
    if (refused(ncclCommSplit(comm, 0, 0, &child, &c), "ncclCommSplit", &bad_configs[i]) != 0)
      return 1;
    ASSERT_MSG(child == NULL, "ncclCommSplit refused a config (%s) but left %p", bad_configs[i].what[0],
               (void *)child);
    child = comm;
    if (refused(ncclCommShrink(comm, NULL, 0, &child, &c, NCCL_SHRINK_DEFAULT), "ncclCommShrink", &bad_configs[i]) !=
        0)
      return 1;
    ASSERT_MSG(child == NULL, "ncclCommShrink refused a config (%s) but left %p", bad_configs[i].what[0],
               (void *)child);
  }
  ncclComm_t one[1] = {comm};
  if (group_allreduce(one, 1) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* From a newer header than the library's: its size (128 here, or any,
 * as NVIDIA clamps what it does not know) and version, fields the
 * library does not know after the 2.30 ones; those it knows are read. */
TEST_IMPL(comm_config_larger) {
  setenv("NCCL_NET", "Socket", 1);
  ncclConfig_t c = config_v230();
  c.minCTAs = 2;
  c.maxCTAs = 2;
  union config_buf b;
  config_as(&b, &c, sizeof b, 23300);
  if (config_one_rank(&b.c, 2, 0) != 0)
    return 1;
  b.c.size = (size_t)1 << 40;
  return config_one_rank(&b.c, 2, 0);
}

/* A 2.27 program's config, 72 bytes: its fields are honoured (blocking 0,
 * minCTAs), the bytes after it never read; nor are 2.28-2.30 fields that
 * a larger size covers in a config whose version predates them. */
TEST_IMPL(comm_config_v227) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.minCTAs = 2;
  c.maxCTAs = 2;
  c.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  c.nvlsCTAs = 2;
  union config_buf b;
  config_as(&b, &c, offsetof(ncclConfig_t, nvlsCTAs) + sizeof(int), NCCL_VERSION(2, 27, 3));
  ASSERT(b.c.size == 72 || sizeof(void *) != 8);
  if (config_one_rank(&b.c, 2, 1) != 0)
    return 1;
  config_as(&b, &c, sizeof c, NCCL_VERSION(2, 27, 3));
  b.c.blocking = 1;
  b.c.nChannelsPerNetPeer = 0;
  b.c.graphUsageMode = 9;
  b.c.graphStreamOrdering = -3;
  return config_one_rank(&b.c, 2, 0);
}

/* Older still: a 2.19 config (48 bytes, trafficClass's place padding, so
 * garbage) and a 2.14 one (24 bytes, blocking alone); and fields a config
 * of 2.16 has no say over are ignored whatever they hold. */
TEST_IMPL(comm_config_v219) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 1;
  c.minCTAs = 2;
  c.maxCTAs = 2;
  c.splitShare = 1;
  union config_buf b;
  config_as(&b, &c, offsetof(ncclConfig_t, trafficClass), NCCL_VERSION(2, 19, 3));
  ASSERT(b.c.size == 44 || sizeof(void *) != 8);
  b.c.size = 48; /* the compiler's padding after splitShare */
  if (config_one_rank(&b.c, 2, 0) != 0)
    return 1;
  config_as(&b, &c, 24, NCCL_VERSION(2, 14, 3));
  b.c.cgaClusterSize = -5; /* padding in 2.14's layout */
  if (config_one_rank(&b.c, 0, 0) != 0)
    return 1;
  config_as(&b, &c, sizeof c, NCCL_VERSION(2, 16, 5));
  b.c.minCTAs = 0;
  b.c.maxCTAs = -1;
  b.c.netName = "";
  return config_one_rank(&b.c, 0, 0);
}

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
  /* Host memory where this thread would make host communicators; the
   * device case is gpu_mem_alloc. */
  setenv("LOOM_DEVICE", "host", 1);
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
  /* Freed twice, or never allocated here: refused, nothing freed. */
  ASSERT(ncclMemFree(p) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "not returned by ncclMemAlloc") != NULL, "%s", ncclGetLastError(NULL));
  static char stack_like[64];
  ASSERT(ncclMemFree(stack_like) == ncclInvalidArgument);
  ASSERT_OK(ncclMemFree(NULL));
  ASSERT(ncclMemAlloc(NULL, 64) == ncclInvalidArgument);
  ASSERT(ncclMemAlloc(&p, 0) == ncclInvalidArgument && p == NULL);
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
