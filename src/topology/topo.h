/*
 * What the rest of Loom asks of the topology: which ranks share a host,
 * the channels' rings and trees (from the search over this host's graph,
 * all-gathered), the default channel count, and the GPU-NIC facts the net
 * transport is handed.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TOPO_H
#define LOOM_TOPO_H

#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* Ranks with equal hashes share memory. A host is a kernel instance (boot
 * id) and a network namespace: ranks in different namespaces are treated as
 * different hosts, which is how tests emulate several hosts on one machine.
 * NCCL_HOSTID overrides it. */
uint64_t topo_host_hash(void);

/* Fills every channel's ring and tree from the topology (search.h): each
 * rank plans its own host, the plans are all-gathered, and every rank
 * ends with the same channels. */
ncclResult_t topo_setup_channels(struct ncclComm *comm);

/* The NUMA node of the CPU the calling thread runs on. */
int topo_current_numa(void);

/* The channel counts this rank asks for (search.h, topo_channel_rule:
 * one when it is alone on its host, one when others share it), from the
 * process's topology: `gpu` 0 for a host rank, else its GPU's PCI bus id
 * and the kernel blocks the device holds at once (0: not known). 1 where
 * the topology cannot be had: init reports that error itself, after
 * every rank has met. */
struct topo_channel_rule;
void topo_rank_channels(int gpu, const char *busid, int lanes, struct topo_channel_rule *out);

/* A count bounded by NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS, then by a
 * config's minCTAs (raises it, to at most LOOM_MAX_CHANNELS) and
 * maxCTAs (lowers it); NCCL_CONFIG_UNDEF_INT leaves either out. */
int topo_bound_channels(int n, int min_ctas, int max_ctas);

/* Logs what the host has (cores, NUMA nodes) at INFO, once per process. */
void topo_log_host(void);

/* comm->gpu_path for the p2p transport: the path between two GPUs of this
 * host by PCI bus id, -1 where the topology does not place both. */
int topo_gpu_path(const char *busid_a, const char *busid_b);

/* The farthest path over which GPUs write into each other's memory when
 * NCCL_P2P_LEVEL is not set: as NCCL, PXB on Intel and ARM hosts (their
 * PCIe peer-to-peer through the CPU is slow or absent), SYS elsewhere. */
int topo_p2p_default_level(void);

/* comm->gpu_nic_facts for the net transport (comm/comm.h says what it
 * answers), from this host's topology. */
void topo_gpu_nic_facts(int gpu, const char *nic_pci_path, const char *nic_name, int nic_port, int *distance,
                        int *nvlink);

#endif
