/* This host's topology, discovered, or loaded from NCCL_TOPO_FILE.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_TOPO_DISCOVER_H
#define LOOM_TOPO_DISCOVER_H

#include "nccl.h"
#include "topology/graph.h"

/* Discovers this host (paths computed). */
ncclResult_t topo_discover(struct topo_system **out);

/* The PCI bridges above `busid`, from the root down, as hwloc sees them
 * (chain gets their bus ids, numa the NUMA node hwloc places the device
 * on, or -1); -1 where hwloc is absent or does not know the device, so
 * that the caller reads sysfs instead. Loads hwloc for the one call:
 * for the tests. */
int discover_pci_chain_probe(const char *busid, char chain[][TOPO_BUSID_LEN], int max, int *numa);

/* The process's topology: NCCL_TOPO_FILE when set, else discovered; made
 * once, and written to NCCL_TOPO_DUMP_FILE when that is set. */
ncclResult_t topo_get_system(const struct topo_system **out);

#endif
