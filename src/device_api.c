/*
 * NCCL's device API (nccl_device.h, 2.28 on) as Loom has it: not at all.
 * Its kernels-side structures and inline functions are compiled into the
 * caller's own kernels against NVIDIA's layout of a device communicator,
 * which Loom does not build. Its host functions are exported so that
 * programs and frameworks linked against NCCL 2.30 load; each one that can
 * fail says so with ncclInvalidUsage and the sentence. The team functions
 * are arithmetic on a communicator and answer truly; the load/store
 * accessible team (LSA) is the block of consecutive ranks on this host.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"

#include <stdbool.h>
#include <string.h>

/* The layouts of nccl_device/core.h's types these functions pass by value
 * or fill in; the others are only pointers here, never followed. */
struct dev_team {
  int nRanks, rank, stride;
};

static ncclResult_t no_device_api(const char *func) {
  return err_set(ncclInvalidUsage,
                 "%s: NCCL's device API (nccl_device.h: device communicators, teams' barriers, GIN, LLA2A) is "
                 "not implemented in Loom; use the host API's collectives and point-to-point calls",
                 func);
}

#define DEVICE_API_REFUSED(func, ...) \
  NCCL_API(ncclResult_t, func, __VA_ARGS__) { return api_finish(NULL, no_device_api(#func)); }

DEVICE_API_REFUSED(ncclDevCommCreate, ncclComm_t comm, const void *reqs, void *outDevComm)
DEVICE_API_REFUSED(ncclDevCommDestroy, ncclComm_t comm, const void *devComm)
DEVICE_API_REFUSED(ncclLsaBarrierCreateRequirement, struct dev_team team, int nBarriers, void *outHandle,
                   void *outReq)
DEVICE_API_REFUSED(ncclGinBarrierCreateRequirement, ncclComm_t comm, struct dev_team team, int nBarriers,
                   void *outHandle, void *outReq)
DEVICE_API_REFUSED(ncclGinOutboxCreateRequirement, int nBlocks, int size_log2, void *outHandle, void *outReq)
DEVICE_API_REFUSED(ncclGinInboxA2ACreateRequirement, struct dev_team peers, int nBlocks, int size_log2,
                   void *outHandle, void *outReq)
DEVICE_API_REFUSED(ncclLLA2ACreateRequirement, int nBlocks, int nSlots, void *outHandle, void *outReq)
DEVICE_API_REFUSED(ncclGetLsaMultimemDevicePointer, ncclWindow_t window, size_t offset, void **outPtr)
/* The multimem handle is a structure passed by value; this never reads it,
 * and it comes after the arguments that are read, so its size (one
 * pointer in 2.30) does not matter here. */
DEVICE_API_REFUSED(ncclGetMultimemDevicePointer, ncclWindow_t window, size_t offset, void *multimem,
                   void **outPtr)

/* LLA2A's slot count is a number, not a result: -1, with the sentence. */
NCCL_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize) {
  api_finish(NULL, no_device_api("ncclLLA2ACalcSlots"));
  return -1;
}

/* The consecutive ranks around this one on its host: [first, first + n). */
static void lsa_block(const struct ncclComm *comm, int rank, int *first, int *n) {
  uint64_t h = comm->peers[rank].host_hash;
  int lo = rank, hi = rank;
  while (lo > 0 && comm->peers[lo - 1].host_hash == h)
    lo--;
  while (hi + 1 < comm->nranks && comm->peers[hi + 1].host_hash == h)
    hi++;
  *first = lo;
  *n = hi - lo + 1;
}

/* A team function cannot return an error: a communicator that is not one
 * gives the empty team, with the sentence in ncclGetLastError(NULL). */
static int team_comm(const struct ncclComm *comm, const char *func) {
  ncclResult_t r = comm_check_even_suspended(comm, func);
  if (r != ncclSuccess)
    api_finish(NULL, r);
  return r == ncclSuccess;
}

NCCL_API(struct dev_team, ncclTeamWorld, ncclComm_t comm) {
  if (!team_comm(comm, "ncclTeamWorld"))
    return (struct dev_team){0, 0, 0};
  return (struct dev_team){comm->nranks, comm->rank, 1};
}

NCCL_API(struct dev_team, ncclTeamLsa, ncclComm_t comm) {
  if (!team_comm(comm, "ncclTeamLsa"))
    return (struct dev_team){0, 0, 0};
  int first, n;
  lsa_block(comm, comm->rank, &first, &n);
  return (struct dev_team){n, comm->rank - first, 1};
}

/* The ranks of every host at this rank's place in its host's block: a
 * rail is the set of ranks that share a local index. Loom builds it only
 * where every host holds the same number of consecutive ranks; elsewhere
 * the rail is this rank alone. */
NCCL_API(struct dev_team, ncclTeamRail, ncclComm_t comm) {
  if (!team_comm(comm, "ncclTeamRail"))
    return (struct dev_team){0, 0, 0};
  int first, n;
  lsa_block(comm, comm->rank, &first, &n);
  int even = comm->nranks % n == 0;
  for (int b = 0; even && b < comm->nranks; b += n) {
    int f, m;
    lsa_block(comm, b, &f, &m);
    even = f == b && m == n;
  }
  if (!even)
    return (struct dev_team){1, 0, 1};
  return (struct dev_team){comm->nranks / n, first / n, n};
}

/* A team rank's world rank, or -1 (with the sentence) outside the team. */
static int team_to_world(const struct ncclComm *comm, struct dev_team team, int rank, const char *func) {
  if (!team_comm(comm, func))
    return -1;
  if (rank < 0 || rank >= team.nRanks || team.rank < 0 || team.rank >= team.nRanks) {
    api_finish(NULL, err_set(ncclInvalidArgument, "%s: rank %d is not in a team of %d ranks (this rank is %d of it)",
                             func, rank, team.nRanks, team.rank));
    return -1;
  }
  long w = (long)comm->rank + (long)(rank - team.rank) * team.stride;
  if (w < 0 || w >= comm->nranks) {
    api_finish(NULL, err_set(ncclInvalidArgument, "%s: the team (%d ranks, stride %d, this rank %d of it) is not one "
                             "of this communicator of %d ranks", func, team.nRanks, team.stride, team.rank,
                             comm->nranks));
    return -1;
  }
  return (int)w;
}

NCCL_API(int, ncclTeamRankToWorld, ncclComm_t comm, struct dev_team team, int rank) {
  return team_to_world(comm, team, rank, "ncclTeamRankToWorld");
}

/* A team rank's index in this rank's LSA team, or -1 where it is outside. */
NCCL_API(int, ncclTeamRankToLsa, ncclComm_t comm, struct dev_team team, int rank) {
  int w = team_to_world(comm, team, rank, "ncclTeamRankToLsa");
  if (w < 0)
    return -1;
  int first, n;
  lsa_block(comm, comm->rank, &first, &n);
  return w >= first && w < first + n ? w - first : -1;
}

/* ---- what a communicator offers ---- */

NCCL_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, ncclCommProperties_t *props) {
  ncclResult_t r = comm_check_even_suspended(comm, "ncclCommQueryProperties");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  if (props == NULL)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclCommQueryProperties: props is NULL"));
  if (props->magic != NCCL_API_MAGIC || props->size < offsetof(ncclCommProperties_t, rank))
    return api_finish(comm, err_set(ncclInvalidArgument,
                                    "ncclCommQueryProperties: props was not initialised with "
                                    "NCCL_COMM_PROPERTIES_INITIALIZER (magic 0x%x, size %zu)",
                                    props->magic, props->size));
  ncclCommProperties_t p;
  memset(&p, 0, sizeof p);
  p.rank = comm->rank;
  p.nRanks = comm->nranks;
  p.cudaDev = comm->cuda_dev;
  p.nvmlDev = -1; /* Loom does not load NVML */
  p.deviceApiSupport = false;
  p.multimemSupport = false;
  p.ginType = NCCL_GIN_TYPE_NONE;
  int teams = 0;
  for (int first = 0, n; first < comm->nranks; first += n, teams++)
    lsa_block(comm, first, &(int){0}, &n);
  p.nLsaTeams = teams;
  /* ncclPutSignal and its kin work between any ranks of a host
   * communicator (comm_rma.c, comm_rma_net.c), and between ranks of one
   * host of a CUDA one; across hosts a CUDA one refuses. */
  p.hostRmaSupport = comm->is_host || comm->nhosts == 1;
  p.railedGinType = NCCL_GIN_TYPE_NONE;
  /* Only what the caller's layout holds: an older one is shorter. */
  size_t n = props->size < sizeof p ? props->size : sizeof p;
  memcpy((char *)props + offsetof(ncclCommProperties_t, rank), (char *)&p + offsetof(ncclCommProperties_t, rank),
         n - offsetof(ncclCommProperties_t, rank));
  return api_finish(comm, ncclSuccess);
}
