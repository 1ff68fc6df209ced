/* The tuning model and NCCL_ALGO / NCCL_PROTO. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/tuner.h"
#include "core.h"
#include "enqueue.h"
#include "test.h"

/* A 2-rank CPU host, as tune_setup in init.c describes one. */
static struct tune_input host2(void) {
  struct tune_input in = {.nranks = 2, .nhosts = 1, .tree_depth = 2, .nchannels = 1, .lat_local = 0.5e-6,
                          .lat_net = 15e-6, .bw_local = 8e9, .bw_net = 1.25e9, .rd_max_bytes = 256 << 10};
  return in;
}

TEST_IMPL(unit_tuner_pick) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  struct tuner t;
  struct tune_input in = host2();
  ASSERT_OK(tuner_init(&t, &in));
  int algo, nch;
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT_MSG(algo == ALGO_RD, "8 B picks %s", algo_name(algo));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 64u << 20, &algo, &nch, NULL));
  ASSERT_MSG(algo == ALGO_RING, "64 MiB picks %s", algo_name(algo));
  /* Only AllReduce has other algorithms. */
  ASSERT_OK(tuner_pick(&t, COLL_ALLGATHER, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  /* Many hosts make trees worth it in the middle sizes. */
  in.nranks = 256;
  in.nhosts = 256;
  in.tree_depth = 9;
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 1u << 20, &algo, &nch, NULL));
  ASSERT_MSG(algo == ALGO_TREE, "1 MiB on 256 hosts picks %s", algo_name(algo));
  /* Recursive doubling never gets what does not fit a FIFO. */
  ASSERT(isinf(tuner_estimate(&in, COLL_ALLREDUCE, ALGO_RD, 1u << 20)));
  /* Channels: one for small calls, all for large ones. */
  in = host2();
  in.nchannels = 4;
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLGATHER, 4096, &algo, &nch, NULL));
  ASSERT(nch == 1);
  ASSERT_OK(tuner_pick(&t, COLL_ALLGATHER, 64u << 20, &algo, &nch, NULL));
  ASSERT(nch == 4);
  return 0;
}

/* Ranks outnumbering their host's CPUs over sockets: recursive doubling
 * gives way to rings where it measured slower (4 ranks from 64 KiB, 8 from
 * 16 KiB), not where the ranks have CPUs; over shared memory the steps
 * grow longer and Flat is preferred instead. */
TEST_IMPL(unit_tuner_crowded) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  static const struct {
    int n, crowded;
    size_t rd, ring; /* a size that picks recursive doubling, one that picks a ring */
  } cases[] = {{4, 1, 32 << 10, 64 << 10}, {8, 1, 8 << 10, 16 << 10}, {4, 0, 64 << 10, 1 << 20}, {8, 0, 64 << 10, 1 << 20}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tune_input in;
    tuner_shape(&in, cases[i].n, 1, cases[i].n, 1, 0, 1, 4 << 20, 0, 0);
    if (cases[i].crowded)
      tuner_crowded(&in, 1);
    struct tuner t;
    ASSERT_OK(tuner_init(&t, &in));
    int algo, nch;
    ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, cases[i].rd, &algo, &nch, NULL));
    ASSERT_MSG(algo == ALGO_RD, "%d ranks over sockets%s, %zu B: %s", cases[i].n, cases[i].crowded ? ", crowded" : "",
               cases[i].rd, algo_name(algo));
    ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, cases[i].ring, &algo, &nch, NULL));
    ASSERT_MSG(algo == ALGO_RING, "%d ranks over sockets%s, %zu B: %s", cases[i].n,
               cases[i].crowded ? ", crowded" : "", cases[i].ring, algo_name(algo));
  }
  /* Across hosts the model alone decides: the limit was measured on one. */
  struct tune_input in, plain;
  tuner_shape(&in, 8, 2, 4, 1, 0, 1, 4 << 20, 0, 0);
  plain = in;
  tuner_crowded(&in, 1);
  ASSERT(in.rd_max_bytes == plain.rd_max_bytes);
  /* Shared memory: the recursive doubling limit stays, the steps lengthen. */
  tuner_shape(&in, 4, 1, 4, 1, 0, 0, 4 << 20, 0, 0);
  plain = in;
  tuner_crowded(&in, 0);
  ASSERT(in.rd_max_bytes == plain.rd_max_bytes && in.lat_local > plain.lat_local && in.flat_pref_max == SIZE_MAX);
  return 0;
}

/* Flat AllReduce, where the ranks share an arena: its small calls always,
 * its larger ones up to flat_pref_max (hosts with more ranks than CPUs);
 * never without the arena, never for other collectives, never against
 * NCCL_ALGO. */
TEST_IMPL(unit_tuner_flat) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  struct tuner t;
  struct tune_input in;
  tuner_shape(&in, 4, 1, 4, 1, 0, 0, 2u << 20, 0, 0);
  int algo, nch;
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT_MSG(algo != ALGO_FLAT, "8 B picks Flat without an arena");
  ASSERT(isinf(tuner_estimate(&in, COLL_ALLREDUCE, ALGO_FLAT, 8)));
  in.flat_ok = 1;
  in.flat_round_bytes = 1u << 20;
  ASSERT_OK(tuner_init(&t, &in));
  static const struct {
    size_t bytes, pref_max;
    int algo;
  } cases[] = {{8, 0, ALGO_FLAT},        {4096, 0, ALGO_FLAT},           {4097, 0, ALGO_RING},
               {1u << 20, 0, ALGO_RING}, {1u << 20, 16u << 20, ALGO_FLAT}, {16u << 20, 16u << 20, ALGO_FLAT},
               {64u << 20, 16u << 20, ALGO_RING}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    in.flat_pref_max = cases[i].pref_max;
    ASSERT_OK(tuner_init(&t, &in));
    ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, cases[i].bytes, &algo, &nch, NULL));
    ASSERT_MSG(algo == cases[i].algo || (cases[i].algo == ALGO_RING && algo != ALGO_FLAT),
               "%zu bytes (flat up to %zu): %s", cases[i].bytes, cases[i].pref_max, algo_name(algo));
    ASSERT(nch == 1 || algo != ALGO_FLAT);
  }
  ASSERT_OK(tuner_pick(&t, COLL_ALLGATHER, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  setenv("NCCL_ALGO", "allreduce:ring", 1);
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  setenv("NCCL_ALGO", "Flat", 1);
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 256u << 20, &algo, &nch, NULL));
  ASSERT(algo == ALGO_FLAT);
  unsetenv("NCCL_ALGO");
  return 0;
}

/* With the many channels NVLink gives (24 on an H100 host), small calls
 * still run on one channel and a call takes one more channel per half
 * megabyte, all of them only from 12 MiB on. */
TEST_IMPL(unit_tuner_many_channels) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  struct tune_input in;
  tuner_shape(&in, 8, 1, 8, 24, 1, 0, 4u << 20, 370.8, 0);
  struct tuner t;
  ASSERT_OK(tuner_init(&t, &in));
  static const struct {
    enum coll_kind coll;
    size_t bytes;
    int nch;
  } cases[] = {{COLL_ALLREDUCE, 8, 1},          {COLL_ALLREDUCE, 4096, 1},       {COLL_ALLGATHER, 8, 1},
               {COLL_ALLGATHER, 65536, 1},      {COLL_BROADCAST, 1000, 1},      {COLL_ALLREDUCE, 512u << 10, 1},
               {COLL_ALLGATHER, 1u << 20, 2},   {COLL_ALLGATHER, 3u << 20, 6},  {COLL_ALLREDUCE, 12u << 20, 24},
               {COLL_ALLREDUCE, 1u << 30, 24}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int algo, nch;
    ASSERT_OK(tuner_pick(&t, cases[i].coll, cases[i].bytes, &algo, &nch, NULL));
    ASSERT_MSG(nch == cases[i].nch, "%s of %zu bytes on %s: %d channels, expected %d", coll_name(cases[i].coll),
               cases[i].bytes, algo_name(algo), nch, cases[i].nch);
  }
  return 0;
}

TEST_IMPL(unit_tuner_env) {
  unsigned m[COLL_COUNT];
  ASSERT_OK(tuner_parse_algo("Ring", m, COLL_COUNT));
  ASSERT(m[COLL_ALLREDUCE] == 1u << ALGO_RING);
  ASSERT_OK(tuner_parse_algo("^Tree", m, COLL_COUNT));
  ASSERT(m[COLL_ALLREDUCE] == ((1u << ALGO_RING) | (1u << ALGO_RD) | (1u << ALGO_FLAT)));
  ASSERT_OK(tuner_parse_algo("tree,RING", m, COLL_COUNT));
  ASSERT(m[COLL_ALLREDUCE] == ((1u << ALGO_RING) | (1u << ALGO_TREE)));
  ASSERT_OK(tuner_parse_algo("allreduce:tree;broadcast:ring", m, COLL_COUNT));
  ASSERT(m[COLL_ALLREDUCE] == 1u << ALGO_TREE && m[COLL_BROADCAST] == 1u << ALGO_RING);
  ASSERT(m[COLL_ALLGATHER] == (1u << ALGO_COUNT) - 1);
  /* NCCL's names Loom lacks are accepted and stand for nothing. */
  ASSERT_OK(tuner_parse_algo("NVLS,Ring", m, COLL_COUNT));
  ASSERT(m[COLL_ALLREDUCE] == 1u << ALGO_RING);
  ASSERT(tuner_parse_algo("Fast", m, COLL_COUNT) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "unknown algorithm \"Fast\"") != NULL);
  ASSERT(tuner_parse_algo("allsum:ring", m, COLL_COUNT) == ncclInvalidArgument);

  unsigned protos;
  ASSERT_OK(tuner_parse_proto("Simple", &protos));
  ASSERT(protos == PROTO_BIT_SIMPLE);
  ASSERT_OK(tuner_parse_proto("^LL,LL128", &protos));
  ASSERT(protos == PROTO_BIT_SIMPLE);
  ASSERT_OK(tuner_parse_proto("LL", &protos));
  ASSERT(protos == PROTO_BIT_LL);
  ASSERT_OK(tuner_parse_proto("^Simple", &protos));
  ASSERT(protos == PROTO_BIT_LL);
  ASSERT(tuner_parse_proto("LL128", &protos) == ncclInvalidUsage);
  ASSERT(strstr(err_thread_last(), "LL128 is not implemented") != NULL);
  ASSERT(tuner_parse_proto("^Simple,LL", &protos) == ncclInvalidUsage);
  ASSERT(tuner_parse_proto("Fast", &protos) == ncclInvalidArgument);

  /* A setting that leaves a call nothing Loom can run makes it a ring,
   * as NCCL falls back. */
  setenv("NCCL_ALGO", "NVLS", 1);
  struct tuner t;
  struct tune_input in = host2();
  ASSERT_OK(tuner_init(&t, &in));
  int algo, nch;
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  /* Recursive doubling alone cannot take a large buffer. */
  setenv("NCCL_ALGO", "RecursiveDoubling", 1);
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RD);
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 64u << 20, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  setenv("NCCL_ALGO", "tree", 1);
  ASSERT_OK(tuner_init(&t, &in));
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_TREE);
  ASSERT_OK(tuner_pick(&t, COLL_ALLREDUCE, 64u << 20, &algo, &nch, NULL));
  ASSERT(algo == ALGO_TREE);
  ASSERT_OK(tuner_pick(&t, COLL_BROADCAST, 8, &algo, &nch, NULL));
  ASSERT(algo == ALGO_RING);
  unsetenv("NCCL_ALGO");
  return 0;
}

/* The protocol: LL for collectives up to 64 KiB where the communicator
 * can run it (CUDA ranks on one host with shm allowed), Simple elsewhere
 * and for point-to-point; NCCL_PROTO=LL takes LL at any size where it
 * can run, Simple keeps Simple, LL128 alone is refused. */
TEST_IMPL(unit_tuner_proto) {
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");
  struct tune_input gpu1, gpu2hosts, gpu_noshm, host;
  tuner_shape(&gpu1, 4, 1, 4, 2, 1, 0, 4u << 20, 0, 0);
  tuner_shape(&gpu2hosts, 4, 2, 2, 2, 1, 0, 4u << 20, 0, 0);
  tuner_shape(&gpu_noshm, 4, 1, 4, 2, 1, 1, 4u << 20, 0, 0);
  tuner_shape(&host, 4, 1, 4, 1, 0, 0, 4u << 20, 0, 0);
  struct tuner t;
  ASSERT_OK(tuner_init(&t, &gpu1));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_LL);
  ASSERT(tuner_proto(&t, COLL_ALLGATHER, ALGO_RING, 64u << 10) == PROTO_LL);
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, (64u << 10) + 1) == PROTO_SIMPLE);
  ASSERT(tuner_proto(&t, COLL_BROADCAST, ALGO_RING, 1u << 20) == PROTO_SIMPLE);
  ASSERT(tuner_proto(&t, COLL_SEND, ALGO_RING, 8) == PROTO_SIMPLE);
  ASSERT(tuner_proto(&t, COLL_RECV, ALGO_RING, 8) == PROTO_SIMPLE);
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_TREE, 4096) == PROTO_LL);
  /* Not where a connection may have no LL slots, nor on host ranks. */
  const struct tune_input *no_ll[] = {&gpu2hosts, &gpu_noshm, &host};
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(tuner_init(&t, no_ll[i]));
    ASSERT_MSG(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_SIMPLE, "shape %d", i);
  }
  setenv("NCCL_PROTO", "LL", 1);
  ASSERT_OK(tuner_init(&t, &gpu1));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 256u << 20) == PROTO_LL);
  ASSERT(tuner_proto(&t, COLL_SEND, ALGO_RING, 8) == PROTO_SIMPLE);
  /* Recursive doubling sends all before it receives: LL only where it
   * fits in the LL slots. */
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RD, 256u << 10) == PROTO_LL);
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RD, (256u << 10) + 8) == PROTO_SIMPLE);
  ASSERT_OK(tuner_init(&t, &gpu2hosts));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_SIMPLE);
  setenv("NCCL_PROTO", "Simple", 1);
  ASSERT_OK(tuner_init(&t, &gpu1));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_SIMPLE);
  setenv("NCCL_PROTO", "^LL", 1);
  ASSERT_OK(tuner_init(&t, &gpu1));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_SIMPLE);
  setenv("NCCL_PROTO", "LL128,Simple", 1);
  ASSERT_OK(tuner_init(&t, &gpu1));
  ASSERT(tuner_proto(&t, COLL_ALLREDUCE, ALGO_RING, 8) == PROTO_SIMPLE);
  setenv("NCCL_PROTO", "LL128", 1);
  ASSERT(tuner_init(&t, &gpu1) == ncclInvalidUsage);
  ASSERT_MSG(strstr(err_thread_last(), "LL128 is not implemented") != NULL, "%s", err_thread_last());
  unsetenv("NCCL_PROTO");
  return 0;
}
