/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/tuner.h"
#include "common/coll.h"
#include "exec/flat.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *algo_names[ALGO_COUNT] = {"Ring", "Tree", "RecursiveDoubling", "Flat"};

const char *algo_name(int a) { return a >= 0 && a < ALGO_COUNT ? algo_names[a] : "?"; }

/* What each collective can run: AllReduce all four, the others rings. */
static unsigned implemented(enum coll_kind coll) {
  if (coll == COLL_ALLREDUCE)
    return (1u << ALGO_RING) | (1u << ALGO_TREE) | (1u << ALGO_RD) | (1u << ALGO_FLAT);
  return 1u << ALGO_RING;
}

/* NCCL's algorithm names, with the ones Loom lacks mapped to nothing, and
 * Loom's own small-message algorithm. Returns -2 for an unknown name. */
static int algo_of(const char *name) {
  static const char *absent[] = {"CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
  for (int a = 0; a < ALGO_COUNT; a++)
    if (strcasecmp(name, algo_names[a]) == 0)
      return a;
  if (strcasecmp(name, "RD") == 0)
    return ALGO_RD;
  for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
    if (strcasecmp(name, absent[i]) == 0)
      return -1;
  return -2;
}

static int coll_of(const char *name) {
  for (int c = 0; c < COLL_COUNT; c++)
    if (strcasecmp(name, coll_name(c)) == 0)
      return c;
  return -1;
}

/* One list, "Tree,Ring" or "^Tree": the mask it leaves of `all`. */
static ncclResult_t parse_list(const char *spec, const char *list, unsigned *mask) {
  int exclude = list[0] == '^';
  if (exclude)
    list++;
  unsigned m = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ')
      tok++;
    int a = algo_of(tok);
    if (a == -2)
      return err_set(ncclInvalidArgument,
                     "NCCL_ALGO=%s: unknown algorithm \"%s\" (NCCL's names are Ring, Tree, CollnetDirect, "
                     "CollnetChain, NVLS, NVLSTree, PAT; Loom also has RecursiveDoubling and Flat)",
                     spec, tok);
    if (a >= 0)
      m |= 1u << a;
  }
  *mask = exclude ? ~m & ((1u << ALGO_COUNT) - 1) : m;
  return ncclSuccess;
}

/* "Ring,Tree", "^Tree", or per collective: "allreduce:tree,ring;broadcast:ring". */
ncclResult_t tuner_parse_algo(const char *spec, unsigned *allowed, int ncoll) {
  for (int c = 0; c < ncoll; c++)
    allowed[c] = (1u << ALGO_COUNT) - 1;
  if (!spec || !spec[0])
    return ncclSuccess;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL;
  for (char *part = strtok_r(buf, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
    char *colon = strchr(part, ':');
    unsigned mask;
    if (!colon) {
      CHECK(parse_list(spec, part, &mask));
      for (int c = 0; c < ncoll; c++)
        allowed[c] = mask;
      continue;
    }
    *colon = '\0';
    int coll = coll_of(part);
    if (coll < 0 || coll >= ncoll)
      return err_set(ncclInvalidArgument, "NCCL_ALGO=%s: \"%s\" is not a collective", spec, part);
    CHECK(parse_list(spec, colon + 1, &mask));
    allowed[coll] = mask;
  }
  return ncclSuccess;
}

const char *proto_name(int proto) { return proto == PROTO_LL ? "LL" : "Simple"; }

ncclResult_t tuner_parse_proto(const char *spec, unsigned *protos) {
  *protos = PROTO_BIT_SIMPLE | PROTO_BIT_LL;
  if (!spec || !spec[0])
    return ncclSuccess;
  int exclude = spec[0] == '^';
  const char *list = exclude ? spec + 1 : spec;
  unsigned m = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ')
      tok++;
    if (strcasecmp(tok, "Simple") == 0)
      m |= PROTO_BIT_SIMPLE;
    else if (strcasecmp(tok, "LL") == 0)
      m |= PROTO_BIT_LL;
    else if (strcasecmp(tok, "LL128") != 0)
      return err_set(ncclInvalidArgument, "NCCL_PROTO=%s: unknown protocol \"%s\" (LL, LL128, Simple)", spec, tok);
  }
  if (exclude)
    m = ~m & (PROTO_BIT_SIMPLE | PROTO_BIT_LL);
  if (!m)
    return err_set(ncclInvalidUsage,
                   "NCCL_PROTO=%s leaves only LL128, and LL128 is not implemented in Loom (it has Simple and LL)",
                   spec);
  *protos = m;
  return ncclSuccess;
}

int tuner_proto(const struct tuner *t, enum coll_kind coll, int algo, size_t bytes) {
  if (!t->in.ll_ok || !(t->protos & PROTO_BIT_LL) || coll == COLL_SEND || coll == COLL_RECV)
    return PROTO_SIMPLE;
  /* Recursive doubling sends its whole buffer before it receives: it
   * must fit in the LL slots. */
  if (algo == ALGO_RD && bytes > (size_t)NCCL_STEPS * LL_SLOT_DATA)
    return PROTO_SIMPLE;
  if (!(t->protos & PROTO_BIT_SIMPLE))
    return PROTO_LL;
  return bytes <= t->in.ll_max_bytes ? PROTO_LL : PROTO_SIMPLE;
}

void tuner_shape(struct tune_input *in, int nranks, int nhosts, int max_ranks_per_host, int nchannels, int gpu,
                 int shm_disabled, size_t buffsize, double chain_gbs, double nic_gbs) {
  memset(in, 0, sizeof *in);
  in->nranks = nranks;
  in->nhosts = nhosts;
  in->nchannels = nchannels;
  int depth = 0;
  while ((1 << depth) < nhosts)
    depth++;
  in->tree_depth = depth + max_ranks_per_host;
  if (gpu) {
    in->lat_local = 5e-6;
    in->bw_local = 20e9;
  } else {
    /* Shared memory's per-step latency as perf/crossover.py measures it
     * where each rank has a CPU: recursive doubling and rings cross
     * between 16 and 32 KiB on 2 ranks. */
    in->lat_local = shm_disabled ? 15e-6 : 1.5e-6;
    in->bw_local = shm_disabled ? 2e9 : 8e9;
  }
  /* Links deliver about 80% of their rate to the Simple protocol (as in
   * NCCL's own tables); host ranks' shared memory is bounded by memory
   * copies, not by the graph's links, so it keeps the per-class figure. */
  if (gpu && chain_gbs > 0 && !shm_disabled)
    in->bw_local = chain_gbs * 1e9 * 0.8;
  in->lat_net = 15e-6;
  in->bw_net = nic_gbs > 0 ? nic_gbs * 1e9 * 0.8 : 1.25e9;
  /* Recursive doubling must fit its whole buffer in a FIFO. */
  in->rd_max_bytes = LOOM_MIN((size_t)NCCL_STEPS * ((buffsize / NCCL_STEPS) & ~(size_t)63), (size_t)256 << 10);
  /* LL needs the LL slots, which CUDA ranks' shm and p2p connections
   * have and network connections do not: one host, shm allowed on every
   * rank (so no pair falls back to sockets). Up to 64 KiB, as NCCL's LL
   * takes over small calls on NVLink. */
  in->ll_ok = gpu && nhosts == 1 && !shm_disabled;
  in->ll_max_bytes = (size_t)64 << 10;
  in->lat_barrier = in->lat_local;
  in->bw_flat = in->bw_local;
}

void tuner_crowded(struct tune_input *in, int shm_disabled) {
  if (!shm_disabled) {
    /* Every step waits for the peer to be scheduled: measured
     * (perf/crossover.py) as about 2.5 times the step latency, which moves
     * the switch from recursive doubling to rings from 16-32 KiB to 64-128
     * KiB. */
    in->lat_local *= 2.5;
    in->lat_barrier *= 2.5;
    /* Flat AllReduce, where the arena exists (arena_setup), measured
     * faster than rings and recursive doubling at every size on 8 ranks
     * over 2 CPUs, and as fast as rings from 16 MiB on 4 (its outputs
     * written by streaming stores from 1 MiB); where every rank has a
     * CPU, only its small calls are (perf/README.md). */
    in->flat_pref_max = SIZE_MAX;
    return;
  }
  /* Over sockets every exchange of recursive doubling moves the whole
   * buffer through the kernel on every rank at once, where a ring's steps
   * move a rank's share. On loopback, 4 and 8 ranks over 2 CPUs, with
   * sockets whose buffers the kernel has not grown yet (a job's first
   * hundred calls), rings overtake it from 64 and 16 KiB (64 KiB: 148
   * against 192 us, 396 against 954); once grown (1000 calls after 200),
   * the two are within 5% up to 32 KiB and rings lead from 64 KiB on 8
   * ranks (321 against 345 us; 128 KiB 535 against 650). The model put
   * the switch at 80 and 120 KiB; 512 KiB over the square of the ranks
   * puts it at 32 and 8 KiB, behind in neither case (perf/README.md).
   * Measured on one host: across hosts, where a ring's steps each cross
   * the network, the model decides alone. */
  if (in->nhosts > 1)
    return;
  size_t n = (size_t)LOOM_MAX(in->nranks, 1);
  in->rd_max_bytes = LOOM_MIN(in->rd_max_bytes, ((size_t)512 << 10) / (n * n));
}

ncclResult_t tuner_init(struct tuner *t, const struct tune_input *in) {
  memset(t, 0, sizeof *t);
  t->in = *in;
  CHECK(tuner_parse_algo(param_str(P_ALGO), t->allowed, COLL_COUNT));
  return tuner_parse_proto(param_str(P_PROTO), &t->protos);
}

double tuner_estimate(const struct tune_input *in, enum coll_kind coll, int algo, size_t bytes) {
  int n = in->nranks;
  double B = (double)bytes;
  int net = in->nhosts > 1;
  double lat = net ? in->lat_net : in->lat_local;
  double bw = net ? LOOM_MIN(in->bw_local, in->bw_net) : in->bw_local;
  if (n <= 1)
    return lat;
  if (!(implemented(coll) & (1u << algo)))
    return INFINITY;
  switch (algo) {
  case ALGO_RING: {
    /* Per rank 2(n-1)/n of the buffer for AllReduce, (n-1)/n for the
     * gathers and scatters, all of it along a chain for Broadcast/Reduce;
     * channels share the bandwidth of the links but add none. */
    double steps = coll == COLL_ALLREDUCE ? 2.0 * (n - 1) : n - 1;
    double moved = coll == COLL_ALLREDUCE ? 2.0 * (n - 1) / n * B
                   : (coll == COLL_BROADCAST || coll == COLL_REDUCE) ? B
                                                                     : (double)(n - 1) / n * B;
    return steps * lat + moved / bw;
  }
  case ALGO_TREE:
    /* Up and down the tree one after the other, each the whole buffer. */
    return 2.0 * LOOM_MAX(in->tree_depth, 1) * lat + 2.0 * B / bw;
  case ALGO_RD: {
    if (bytes > in->rd_max_bytes)
      return INFINITY;
    int p = 1, rounds = 0;
    while (p * 2 <= n) {
      p *= 2;
      rounds++;
    }
    int exchanges = rounds + (p < n ? 2 : 0);
    /* Each exchange moves the whole buffer, and sends before it reduces. */
    return exchanges * (lat + 1.5 * B / bw);
  }
  case ALGO_FLAT: {
    if (!in->flat_ok || net || in->flat_round_bytes == 0)
      return INFINITY;
    /* One barrier, then every rank reads all n inputs; or per round two
     * barriers, a copy in, the slice's reduction and a copy out. */
    if (bytes <= FLAT_WHOLE_MAX)
      return in->lat_barrier + (n + 1) * B / in->bw_flat;
    double rounds = ceil(B / (double)in->flat_round_bytes);
    return 2 * rounds * in->lat_barrier + 3 * B / in->bw_flat;
  }
  }
  return INFINITY;
}

ncclResult_t tuner_pick(struct tuner *t, enum coll_kind coll, size_t bytes, int *algo, int *nchannels, double *est) {
  unsigned mask = t->allowed[coll] & implemented(coll);
  int best = -1;
  double best_t = INFINITY, times[ALGO_COUNT];
  for (int a = 0; a < ALGO_COUNT; a++) {
    times[a] = (mask & (1u << a)) ? tuner_estimate(&t->in, coll, a, bytes) : INFINITY;
    if (best < 0 || times[a] < best_t) {
      best = a;
      best_t = times[a];
    }
  }
  /* Flat wins where the alpha-beta model cannot see why: a ring's n-1
   * hand-offs each wait for one more rank to be scheduled, the arena's
   * one barrier waits for all at once (crossovers measured, perf/README.md). */
  if ((mask & (1u << ALGO_FLAT)) && times[ALGO_FLAT] < INFINITY &&
      (bytes <= FLAT_WHOLE_MAX || bytes <= t->in.flat_pref_max)) {
    best = ALGO_FLAT;
    best_t = times[ALGO_FLAT];
  }
  if (best_t == INFINITY) {
    /* NCCL_ALGO left nothing that can run this call (Tree for a
     * Broadcast, recursive doubling for a large buffer): like NCCL, run it
     * as a ring, which every collective has at every size, and say so once
     * per collective. */
    if (!(implemented(coll) & (1u << ALGO_RING)))
      return err_set(ncclInternalError, "no algorithm can run %s of %zu bytes", coll_name(coll), bytes);
    best = ALGO_RING;
    best_t = tuner_estimate(&t->in, coll, ALGO_RING, bytes);
    times[ALGO_RING] = best_t;
    if ((int)coll >= 0 && coll < COLL_COUNT && !(t->fell_back & (1u << coll))) {
      t->fell_back |= 1u << coll;
      INFO(LOG_TUNING, "NCCL_ALGO=%s leaves %s of %zu bytes no algorithm Loom has for it (%s); it runs as Ring",
           param_str(P_ALGO), coll_name(coll), bytes,
           coll == COLL_ALLREDUCE ? "Ring, Tree, RecursiveDoubling up to a FIFO's size, Flat where one host's ranks "
                                    "share an arena" : "Ring");
    }
  }
  /* Small calls on one channel; large ones spread over every channel,
   * each with at least half a megabyte. */
  int nch = (int)LOOM_MIN((size_t)t->in.nchannels, LOOM_MAX((size_t)1, bytes / (512u << 10)));
  if (best == ALGO_RD || best == ALGO_FLAT)
    nch = 1;
  int cls = 0;
  while ((1ull << (cls + 1)) <= bytes && cls < 63)
    cls++;
  if ((int)coll >= 0 && coll < COLL_COUNT && !(t->logged[coll] & (1ull << cls))) {
    t->logged[coll] |= 1ull << cls;
    INFO(LOG_TUNING, "%s of %zu bytes (size class 2^%d): %s, %s, %d channel(s); model %.1f us (Ring %.1f, Tree "
         "%.1f, RecursiveDoubling %.1f, Flat %.1f)",
         coll_name(coll), bytes, cls, algo_name(best), proto_name(tuner_proto(t, coll, best, bytes)), nch, best_t * 1e6,
         times[ALGO_RING] * 1e6, times[ALGO_TREE] * 1e6, times[ALGO_RD] * 1e6, times[ALGO_FLAT] * 1e6);
  }
  *algo = best;
  *nchannels = nch;
  if (est)
    *est = best_t;
  return ncclSuccess;
}
