/*
 * NCCL 2.30's grow: ncclCommGetUniqueId and ncclCommGrow. One existing
 * rank (the root) makes an id whose secret derives from the communicator's
 * own, as a split's does (bootstrap_child_root), and hands it to the new
 * ranks out of band. The existing ranks then all call ncclCommGrow: they
 * all-gather over the old communicator's bootstrap who holds the id, and
 * the holder tells the others its root's address and number, never the
 * secret, which each derives. Every rank then creates the grown
 * communicator the way ncclCommInitRankConfig does, the existing ones
 * keeping their ranks and devices, the new ones taking the ranks above.
 * The old communicator is left as it was, for the caller to destroy.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "bootstrap/bootstrap.h"
#include "comm_api.h"
#include "group.h"
#include "misc/cudamem.h"
#include "misc/utils.h"

#include <stdlib.h>
#include <string.h>

#define GROW_KIND "grow"

/* Each existing rank's part of the grow, all-gathered. */
struct grow_info {
  int32_t holds;   /* passed the id */
  int32_t pending; /* made an id no grow has consumed */
  int32_t nranks;  /* its nRanks */
  int32_t pad;
  uint64_t seq; /* the holder's: which of its ids */
  struct bootstrap_child at;
};

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId *uniqueId) {
  const char *func = "ncclCommGetUniqueId";
  ncclResult_t r = comm_check(comm, func);
  if (r != ncclSuccess)
    return api_finish(comm_live(comm) ? comm : NULL, r);
  if (uniqueId == NULL)
    return api_finish(comm, err_set(ncclInvalidArgument, "%s: uniqueId is NULL", func));
  if (comm->grow_pending)
    return api_finish(comm, err_set(ncclInvalidUsage,
                                    "%s: this rank's previous grow id is not consumed yet; grow with it "
                                    "(ncclCommGrow) before asking for another, one grow at a time",
                                    func));
  r = comm_enter(comm, func);
  if (r != ncclSuccess)
    return api_finish(comm, r);
  uint64_t seq = comm->grow_seq;
  struct bootstrap_child at;
  r = bootstrap_child_root(comm->boot, GROW_KIND, seq, 0, &at);
  if (r == ncclSuccess)
    r = bootstrap_child_id(comm->boot, GROW_KIND, seq, 0, &at, uniqueId);
  if (r == ncclSuccess) {
    bootstrap_id_set_grow_from(uniqueId, comm->nranks);
    comm->grow_seq++;
    comm->grow_pending = 1;
    comm->grow_pending_seq = seq;
    comm->grow_pending_hash = bootstrap_id_hash(uniqueId);
    INFO(LOG_INIT, "comm %p rank %d nranks %d - grow id %d made", (void *)comm, comm->rank, comm->nranks, (int)seq);
  }
  comm_leave(comm);
  return api_finish(comm, r);
}

/* A new rank: only the id tells it what it joins. */
static ncclResult_t grow_new_rank(int nranks, const ncclUniqueId *id, int rank, ncclComm_t *newcomm,
                                  const ncclConfig_t *config) {
  const char *func = "ncclCommGrow";
  if (id == NULL)
    return err_set(ncclInvalidArgument,
                   "%s: uniqueId is NULL with comm NULL; a new rank passes the id that ncclCommGetUniqueId made on "
                   "the communicator it joins",
                   func);
  int from = bootstrap_id_valid(id) ? bootstrap_id_grow_from(id) : 0;
  if (from == 0)
    return err_set(ncclInvalidArgument,
                   "%s: uniqueId was not made by ncclCommGetUniqueId (an id of ncclGetUniqueId creates a new "
                   "communicator with ncclCommInitRank instead)",
                   func);
  if (nranks <= from)
    return err_set(ncclInvalidArgument,
                   "%s: nRanks is %d; it must be larger than %d, the size of the communicator being grown", func,
                   nranks, from);
  if (rank == -1)
    return err_set(ncclInvalidArgument,
                   "%s: rank is -1 with comm NULL; a new rank passes its rank in the grown communicator (%d to %d), "
                   "an existing one its communicator",
                   func, from, nranks - 1);
  if (rank < from || rank >= nranks)
    return err_set(ncclInvalidArgument,
                   "%s: rank %d is not one of the new ranks %d to %d; the existing ranks keep 0 to %d", func, rank,
                   from, nranks - 1, from - 1);
  return comm_init_rank(newcomm, nranks, id, rank, config, func, -1);
}

/* Finds the holder among the existing ranks' parts; every rank reads the
 * same parts, so every rank refuses alike. */
static ncclResult_t grow_agree(const struct ncclComm *comm, const struct grow_info *all, int *holder) {
  const char *func = "ncclCommGrow";
  int n = comm->nranks, maker = -1;
  *holder = -1;
  for (int i = 0; i < n; i++) {
    if (all[i].nranks != all[0].nranks)
      return err_set(ncclInvalidUsage,
                     "%s: rank 0 passes nRanks %d but rank %d passes %d; every rank must pass the grown size, so "
                     "nothing was created",
                     func, all[0].nranks, i, all[i].nranks);
    if (all[i].pending && maker < 0)
      maker = i;
    if (!all[i].holds)
      continue;
    if (*holder >= 0)
      return err_set(ncclInvalidUsage,
                     "%s: ranks %d and %d both pass a grow id; only the rank that made it (ncclCommGetUniqueId) "
                     "passes it, the others NULL, so nothing was created",
                     func, *holder, i);
    *holder = i;
  }
  if (*holder >= 0)
    return ncclSuccess;
  if (maker >= 0)
    return err_set(ncclInvalidUsage,
                   "%s: no existing rank passes the grow id; rank %d made one (ncclCommGetUniqueId) and must pass "
                   "it, so nothing was created",
                   func, maker);
  return err_set(ncclInvalidUsage,
                 "%s: no existing rank passes a grow id; one rank must make it with ncclCommGetUniqueId and pass "
                 "it, so nothing was created",
                 func);
}

/* An existing rank, inside the old communicator's call. */
static ncclResult_t grow_existing(struct ncclComm *comm, int nranks, const ncclUniqueId *id, ncclComm_t *newcomm,
                                  const ncclConfig_t *config) {
  struct grow_info *all;
  CHECK(UTIL_CALLOC(&all, comm->nranks, "ncclCommGrow"));
  struct grow_info *me = &all[comm->rank];
  me->holds = id != NULL;
  me->pending = comm->grow_pending;
  me->nranks = nranks;
  if (id) {
    me->seq = comm->grow_pending_seq;
    bootstrap_id_child_at(id, &me->at);
  }
  ncclResult_t r = bootstrap_allgather(comm->boot, all, sizeof *all);
  if (r != ncclSuccess) {
    err_context("ncclCommGrow: rank %d, meeting the communicator's other ranks", comm->rank);
    free(all);
    return r;
  }
  /* Met: the id is spent whatever follows, since new ranks may already
   * wait at its root, which cannot take a second round. */
  if (id)
    comm->grow_pending = 0;
  int holder;
  r = grow_agree(comm, all, &holder);
  ncclUniqueId child_id;
  if (r == ncclSuccess)
    r = bootstrap_child_id(comm->boot, GROW_KIND, all[holder].seq, 0, &all[holder].at, &child_id);
  if (r == ncclSuccess) {
    INFO(LOG_INIT, "grow: rank %d of %d -> rank %d of %d (id of rank %d)", comm->rank, comm->nranks, comm->rank,
         nranks, holder);
    /* The grown communicator lives on the old one's device, whatever
     * device the calling thread has current meanwhile. */
    int saved_dev = comm->is_host ? -1 : cuda_current_device();
    r = comm->is_host ? ncclSuccess : cuda_set_device(comm->cuda_dev);
    if (r == ncclSuccess)
      r = comm_init_rank(newcomm, nranks, &child_id, comm->rank, config, "ncclCommGrow",
                         comm->is_host ? -1 : comm->cuda_dev);
    cuda_restore_device(saved_dev);
    bootstrap_id_wipe(&child_id);
  }
  free(all);
  return r;
}

static ncclResult_t grow_check_existing(const struct ncclComm *comm, int nranks, const ncclUniqueId *id, int rank) {
  const char *func = "ncclCommGrow";
  if (rank != -1)
    return err_set(ncclInvalidArgument,
                   "%s: rank is %d with a communicator; an existing rank passes -1 and keeps its rank (%d)", func,
                   rank, comm->rank);
  if (nranks <= comm->nranks)
    return err_set(ncclInvalidArgument, "%s: nRanks is %d; it must be larger than %d, the communicator's size", func,
                   nranks, comm->nranks);
  if (id && (!comm->grow_pending || !bootstrap_id_valid(id) || bootstrap_id_hash(id) != comm->grow_pending_hash))
    return err_set(ncclInvalidUsage,
                   "%s: uniqueId is not this rank's unconsumed grow id (ncclCommGetUniqueId on this communicator; "
                   "each id serves one grow); existing ranks that did not make it pass NULL",
                   func);
  if (group_depth() > 0)
    return err_set(ncclInvalidUsage,
                   "%s inside ncclGroupStart/ncclGroupEnd is not implemented in Loom; call it outside a group", func);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
         ncclComm_t *newcomm, ncclConfig_t *config) {
  const char *func = "ncclCommGrow";
  if (newcomm == NULL)
    return api_finish(comm_live(comm) ? comm : NULL, err_set(ncclInvalidArgument, "%s: newcomm is NULL", func));
  *newcomm = NULL;
  if (comm == NULL) {
    if (group_depth() > 0)
      return api_finish(NULL, err_set(ncclInvalidUsage,
                                      "%s inside ncclGroupStart/ncclGroupEnd is not implemented in Loom; call it "
                                      "outside a group",
                                      func));
    return api_finish(NULL, grow_new_rank(nRanks, uniqueId, rank, newcomm, config));
  }
  ncclResult_t r = comm_check(comm, func);
  if (r == ncclSuccess)
    r = grow_check_existing(comm, nRanks, uniqueId, rank);
  if (r != ncclSuccess)
    return api_finish(comm_live(comm) ? comm : NULL, r);
  /* Config NULL: the parent's, as NCCL does for existing ranks. */
  ncclConfig_t cfg = comm->config;
  if (config) {
    r = comm_read_config(config, &cfg, func);
    if (r != ncclSuccess)
      return api_finish(comm, r);
  }
  r = comm_enter(comm, func);
  if (r != ncclSuccess)
    return api_finish(comm, r);
  log_set_rank(comm->rank);
  r = grow_existing(comm, nRanks, uniqueId, newcomm, &cfg);
  comm_leave(comm);
  return api_finish(comm, r);
}
