/* This host's topology, discovered, or loaded from NCCL_TOPO_FILE.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_TOPO_DISCOVER_H
#define LOOM_TOPO_DISCOVER_H

#include "nccl.h"
#include "topology/graph.h"

/* Discovers this host (paths computed). */
ncclResult_t topo_discover(struct topo_system **out);

/* The process's topology: NCCL_TOPO_FILE when set, else discovered; made
 * once, and written to NCCL_TOPO_DUMP_FILE when that is set. */
ncclResult_t topo_get_system(const struct topo_system **out);

#endif
