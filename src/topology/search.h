/*
 * Channels from the topology: for each channel a ring through every rank
 * and a tree, the same on every rank.
 *
 * Inside a host the ranks form a chain on the fastest links (NVLink
 * first, then one PCIe switch, several, the host bridge, the socket
 * interconnect), found by searching the orders of the host's devices.
 * With several hosts a channel uses one NIC per host, spread over the NICs
 * channel by channel: its chain enters at the device nearest that NIC and
 * leaves at the next nearest, and the ring visits the hosts in order, each
 * host's ranks together. Trees are NCCL's double binary trees over the
 * hosts (every inner node of one tree is a leaf of the other; even
 * channels use one, odd channels the other), with the host's chain hanging
 * below the host's first rank.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TOPO_SEARCH_H
#define LOOM_TOPO_SEARCH_H

#include <stddef.h>

#include "nccl.h"
#include "topology/graph.h"

#define TOPO_MAX_CHANNELS 32
#define TREE_MAX_CHILDREN 3

/* What one channel (one thread block of Loom's kernel, driving one ring)
 * is assumed to move over NVLink, GB/s: a GPU's NVLink bandwidth divided
 * by it is how many channels fill the links (24 on an H100 with 18
 * links, 16 on an A100 with 12). An assumption, not a measurement of
 * Loom's kernel; docs/topology.md, "How many channels". */
#define TOPO_CHANNEL_NVLINK_GBS 15.0

/* The channel count one rank asks for, and why. A host rank asks for 1;
 * a CUDA rank for one channel per NIC of its host (at least 2), so that
 * rings between hosts leave through every NIC, and where other ranks of
 * the communicator share its host and its GPU has NVLinks, for enough
 * channels to fill them. Both at most TOPO_MAX_CHANNELS, and at most half
 * the blocks the device holds at once where that is known (a launch's
 * blocks must all be resident; the other half is left to the
 * point-to-point lanes of the same launch, exec/cuda/cuda_launch.c). */
struct topo_channel_rule {
  int gpu;         /* a CUDA rank */
  int nics;        /* NICs of the host */
  int nvlinks;     /* NVLinks from the GPU to its widest NVLink peer (the NVSwitch, or one GPU); 0: none known */
  double link_gbs; /* what one of them carries, GB/s */
  int nvlink_channels; /* their bandwidth over TOPO_CHANNEL_NVLINK_GBS, before the caps */
  int lanes;       /* blocks of the kernel the device holds at once; 0: not known */
  int alone;       /* the count when no other rank of the communicator shares the host */
  int shared;      /* the count when some do: at least `alone` */
};

/* The rule for a rank on topology node `node` (its GPU; -1 where the
 * topology does not place it, which leaves NVLink out); t is not read
 * for a host rank (gpu 0). */
void topo_channel_rule(const struct topo_system *t, int gpu, int node, int lanes, struct topo_channel_rule *out);

/* Whether NVLink carries anything between a host's ranks, and so
 * whether their `shared` count applies: not where their GPUs do not
 * write into each other's memory (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL=LOC). */
static inline int topo_p2p_uses_nvlink(int p2p_disabled, int p2p_level) {
  return !p2p_disabled && p2p_level >= PATH_NVL;
}

/* One line for the log and loom-info: the count (shared or alone) and
 * where it comes from, "24 (NVLink: 18 links x 20.6 GB/s = 370.8 GB/s,
 * at 15 GB/s per channel)". */
void topo_channel_why(const struct topo_channel_rule *r, int shared, char *buf, size_t len);

/* One host's part of the channels. `dev[i]` is the topology node (a GPU,
 * or for host ranks the CPU of their NUMA node) of the host's i-th rank;
 * ranks sharing a device are kept together. For each channel, chain[c*n
 * .. c*n+n-1] lists the host's ranks (0..n-1) in chain order and nic[c]
 * the NIC node the channel uses (-1 on a single host or without NICs). */
struct host_plan {
  int n, nchannels;
  int *chain;
  int nic[TOPO_MAX_CHANNELS];
};

ncclResult_t topo_plan_host(const struct topo_system *t, int n, const int *dev, int nchannels, int multihost,
                            struct host_plan *out);
void topo_plan_free(struct host_plan *p);

/* What the tuning model needs of a host's plan, in GB/s (0 where there is
 * nothing to measure): the narrowest path between neighbours of any
 * channel's chain, dev[] as given to topo_plan_host, and the sum of the
 * NICs the channels use (distinct ones add up). */
void topo_plan_bw(const struct topo_system *t, const struct host_plan *p, const int *dev, int multihost,
                  double *chain_gbs, double *nic_gbs);

/* The whole communicator: ring[c*nranks + i] is the i-th rank of channel
 * c's ring; tree_up/tree_down give each rank's parent (-1 at the root) and
 * children (-1 padded) in channel c's tree. */
struct channels {
  int nranks, nchannels;
  int *ring;
  int *tree_up;   /* [c * nranks + rank] */
  int *tree_down; /* [(c * nranks + rank) * TREE_MAX_CHILDREN + k] */
};

/* hosts[h] is host h's plan; host_ranks[h] maps its local ranks to global
 * ranks. Hosts must come in the order of their lowest rank. */
ncclResult_t topo_build_channels(int nhosts, const struct host_plan *hosts, int *const *host_ranks, int nranks,
                                 struct channels *out);
void topo_channels_free(struct channels *c);

/* NCCL's double binary tree over n nodes: parent and two children of node
 * i in tree 0 or 1 (-1 when absent). */
void topo_dtree(int n, int i, int which, int *parent, int *child0, int *child1);

#endif
