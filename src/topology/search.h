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

#include "nccl.h"
#include "topology/graph.h"

#define TOPO_MAX_CHANNELS 32
#define TREE_MAX_CHILDREN 3

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
