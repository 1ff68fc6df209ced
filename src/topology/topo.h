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

/* How many channels this rank asks for when NCCL_MIN/MAX_NCHANNELS leave
 * it free (the communicator takes the smallest wish of its ranks): a GPU
 * rank one per NIC of its host, at least 2, so that rings leave through
 * every NIC; a host rank 1, since one thread drives all its channels and
 * more would only cut the buffers smaller. 1 where the topology cannot be
 * had: init reports that error itself, after every rank has met. */
int topo_default_channels(int gpu);

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
