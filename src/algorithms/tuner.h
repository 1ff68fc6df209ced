/*
 * The tuning model: for each call, the algorithm (ring, tree, recursive
 * doubling), protocol and number of channels, from an alpha-beta estimate
 * time = steps * latency + bytes moved / bandwidth of each candidate, with
 * NCCL_ALGO and NCCL_PROTO (NCCL's syntax) restricting the candidates.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TUNER_H
#define LOOM_TUNER_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "common/coll.h"
#include "transport/slot_hdr.h"

/* ALGO_FLAT: on the host's arena (exec/flat.h), host ranks of one host. */
enum algo { ALGO_RING = 0, ALGO_TREE = 1, ALGO_RD = 2, ALGO_FLAT = 3, ALGO_COUNT };

const char *algo_name(int algo);

/* The machine as the model sees it. */
struct tune_input {
  int nranks, nhosts;
  int tree_depth;     /* the longest path to the tree's root, in hops */
  int nchannels;      /* channels the communicator has connected */
  double lat_local;   /* seconds per step between ranks of a host */
  double lat_net;     /* seconds per step between hosts */
  double bw_local;    /* bytes/s a rank moves to a neighbour on its host */
  double bw_net;      /* bytes/s a rank moves to another host */
  size_t rd_max_bytes; /* recursive doubling sends before it receives: what fits in a FIFO */
  int ll_ok;           /* the LL protocol can run: CUDA ranks on one host, shm (and p2p) connections */
  size_t ll_max_bytes; /* the largest call LL takes by default */
  int flat_ok;         /* the ranks share an arena (set after tuner_shape, once it exists) */
  double lat_barrier;  /* seconds per barrier of every rank on the arena */
  double bw_flat;      /* bytes/s of a flat round's copies, per rank */
  size_t flat_round_bytes; /* what a flat round moves per rank (the arena's region) */
  /* Flat is taken over the model's choice up to FLAT_WHOLE_MAX, and up to
   * this on hosts with more ranks than CPUs (perf/README.md: measured). */
  size_t flat_pref_max;
};

/* Protocol bits of NCCL_PROTO (enum loom_proto's). */
#define PROTO_BIT_SIMPLE (1u << PROTO_SIMPLE)
#define PROTO_BIT_LL (1u << PROTO_LL)

struct tuner {
  struct tune_input in;
  /* Allowed algorithms per collective (bit per enum algo), from NCCL_ALGO. */
  unsigned allowed[COLL_COUNT];
  uint64_t logged[COLL_COUNT]; /* size classes already logged, per collective */
  uint64_t logged_symmetric; /* size classes plan_pick_algo logged as symmetric Flat */
  unsigned fell_back;  /* collectives already logged as run as Ring against NCCL_ALGO */
  unsigned protos;     /* PROTO_BIT_*, from NCCL_PROTO */
};

/* The model's inputs for a communicator of this shape. Latencies are per
 * transport class (shared memory, sockets, GPU kernels); bandwidths come
 * from the topology where it has them: chain_gbs, the narrowest link
 * between neighbours in any host's chains (GPU ranks), and nic_gbs, what
 * the NICs the channels use carry together, on the poorest host (0 for
 * either: not known, a per-class figure instead). Built only from what every rank knows alike (the
 * caller takes the minimum over all ranks), so every rank picks the same
 * algorithm for a call. */
void tuner_shape(struct tune_input *in, int nranks, int nhosts, int max_ranks_per_host, int nchannels, int gpu,
                 int shm_disabled, size_t buffsize, double chain_gbs, double nic_gbs);

/* A host with more ranks than CPUs (any rank crowded, as init's census
 * finds): over shared memory, a longer step latency and Flat preferred at
 * every size; over sockets on one host, recursive doubling only up to 512
 * KiB over the square of the ranks (measured, tuner.c). */
void tuner_crowded(struct tune_input *in, int shm_disabled);

/* Reads NCCL_ALGO and NCCL_PROTO; refuses unknown names, and settings
 * that leave Loom nothing it implements, with a sentence. */
ncclResult_t tuner_init(struct tuner *t, const struct tune_input *in);

/* Parses an NCCL_ALGO value into per-collective masks (exposed for the
 * tests). `allowed` has one mask per enum coll_kind. */
ncclResult_t tuner_parse_algo(const char *spec, unsigned *allowed, int ncoll);
/* NCCL_PROTO into PROTO_BIT_* (LL128 is accepted beside another protocol
 * and stands for nothing; alone it is refused: Loom does not have it). */
ncclResult_t tuner_parse_proto(const char *spec, unsigned *protos);

/* enum loom_proto for a collective of `bytes` run with `algo`: LL where
 * the communicator can run it and NCCL_PROTO allows it, by default up to
 * ll_max_bytes, with LL alone at any size; else Simple. A function of
 * what every rank knows alike. */
int tuner_proto(const struct tuner *t, enum coll_kind coll, int algo, size_t bytes);
const char *proto_name(int proto);

/* The algorithm and channel count for a collective of `bytes` (the
 * larger of its input and output); est gets the model's estimate in
 * seconds. Where NCCL_ALGO leaves nothing that can run the call, a ring
 * (as NCCL falls back). */
ncclResult_t tuner_pick(struct tuner *t, enum coll_kind coll, size_t bytes, int *algo, int *nchannels, double *est);

/* The model's estimate for one algorithm (infinity where it cannot run). */
double tuner_estimate(const struct tune_input *in, enum coll_kind coll, int algo, size_t bytes);

#endif
