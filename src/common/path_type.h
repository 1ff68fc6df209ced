/*
 * The kinds of path between two devices of a host, best first, with
 * NCCL's names: the words of NCCL_NET_GDR_LEVEL and NCCL_P2P_LEVEL, which
 * the transports read, as well as the topology's measure of distance.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PATH_TYPE_H
#define LOOM_PATH_TYPE_H

#include "core.h"

enum path_type {
  PATH_LOC = 0, /* the same node */
  PATH_NVL = 1, /* one NVLink hop, or through an NVSwitch */
  PATH_NVB = 2, /* NVLink through another GPU */
  PATH_PIX = 3, /* through one PCIe switch */
  PATH_PXB = 4, /* through several PCIe switches, not the host bridge */
  PATH_PHB = 5, /* through a CPU's host bridge */
  PATH_SYS = 6, /* across CPUs (sockets) */
  PATH_NET = 7, /* through the network (another host) */
  PATH_DIS = 8, /* no path */
  PATH_NTYPES = 9,
};

/* "PIX" and so on; "?" for a value that is no kind. */
const char *path_type_name(int type);

/* The value of a level variable (`var`, for the sentence): a path name,
 * or NCCL's legacy number (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS);
 * NVL too where `with_nvl`. ncclInvalidArgument, with the sentence,
 * otherwise. */
ncclResult_t path_parse_level(const char *var, const char *value, int with_nvl, int *level);

#endif
