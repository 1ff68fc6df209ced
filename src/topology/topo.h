/*
 * Topology, as much as host communicators need so far: which ranks share a
 * host, and rings that visit each host's ranks together.
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

/* Logs what the host has (cores, NUMA nodes) at INFO, once per process. */
void topo_log_host(void);

#endif
