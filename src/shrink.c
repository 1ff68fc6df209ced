/*
 * ncclCommShrink: a new communicator of the parent's ranks minus those
 * excluded, made by the survivors alone, so it works when the excluded
 * ranks are dead and the parent has failed. The survivors talk only to
 * the lowest of them (the leader) over the parent's bootstrap, point to
 * point, never through a ring that would pass a dead rank: each tells it
 * which ranks it excludes, and the leader answers with where the new
 * communicator's root listens (each survivor derives its secret from the
 * parent's: bootstrap_child_id), or with the survivor that disagreed or
 * did not answer.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "bootstrap/bootstrap.h"
#include "comm_api.h"
#include "group.h"
#include "misc/utils.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bootstrap tags of the shrink's messages; the transports' connection
 * setup uses bit 61. */
#define SHRINK_TAG (1ull << 60)
#define SHRINK_REPLY 1ull

struct shrink_ask {
  uint64_t excluded_hash;
  int32_t excluded_count;
  int32_t pad;
};

struct shrink_reply {
  int32_t ok;
  int32_t culprit;       /* the survivor that disagreed or did not answer */
  int32_t culprit_count; /* how many it excluded, -1 if it did not answer */
  int32_t leader_count;  /* how many the leader excluded */
  struct bootstrap_child at;
};

struct shrink_plan {
  int newrank, newn, leader;
  uint64_t hash; /* of the excluded set */
  uint64_t tag;
};

static ncclResult_t check_args(const struct ncclComm *comm, const int *list, int count, ncclComm_t *newcomm,
                               int flags, unsigned char *excluded) {
  if (newcomm == NULL)
    return err_set(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = NULL;
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT)
    return err_set(ncclInvalidArgument,
                   "ncclCommShrink: shrinkFlags is %d; it must be NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)",
                   flags);
  if (comm->rank < 0)
    return err_set(ncclInvalidUsage, "ncclCommShrink: the communicator is still being created");
  if (comm->in_group)
    return err_set(ncclInvalidUsage, "ncclCommShrink: the communicator has operations queued in an open group");
  if (count < 0 || count >= comm->nranks)
    return err_set(ncclInvalidArgument,
                   "ncclCommShrink: excludeRanksCount is %d; it must be at least 0 and below the %d ranks of the "
                   "communicator",
                   count, comm->nranks);
  if (count > 0 && list == NULL)
    return err_set(ncclInvalidArgument, "ncclCommShrink: excludeRanksList is NULL with excludeRanksCount %d", count);
  for (int i = 0; i < count; i++) {
    int r = list[i];
    if (r < 0 || r >= comm->nranks)
      return err_set(ncclInvalidArgument, "ncclCommShrink: excludeRanksList[%d] is %d, not a rank of 0..%d", i, r,
                     comm->nranks - 1);
    if (excluded[r])
      return err_set(ncclInvalidArgument, "ncclCommShrink: rank %d is in excludeRanksList twice", r);
    if (r == comm->rank)
      return err_set(ncclInvalidUsage,
                     "ncclCommShrink: rank %d excludes itself; the excluded ranks do not call ncclCommShrink", r);
    excluded[r] = 1;
  }
  return ncclSuccess;
}

static void plan(const struct ncclComm *comm, const unsigned char *excluded, int count, struct shrink_plan *p) {
  p->newrank = p->newn = 0;
  p->leader = -1;
  for (int r = 0; r < comm->nranks; r++) {
    if (excluded[r])
      continue;
    if (p->leader < 0)
      p->leader = r;
    p->newrank += r < comm->rank;
    p->newn++;
  }
  p->hash = util_hash(excluded, (size_t)comm->nranks, (uint64_t)count);
}

/* The leader hears every survivor, then answers them all alike. */
static ncclResult_t differ(const struct shrink_reply *reply, int leader) {
  return err_set(ncclInvalidUsage,
                 "ncclCommShrink: rank %d's excludeRanksList (%d rank%s) differs from rank %d's (%d rank%s): every "
                 "survivor must pass the same list, so no communicator was made",
                 reply->culprit, reply->culprit_count, reply->culprit_count == 1 ? "" : "s", leader,
                 reply->leader_count, reply->leader_count == 1 ? "" : "s");
}

static ncclResult_t lead(struct ncclComm *comm, const unsigned char *excluded, int count,
                         const struct shrink_plan *p, struct shrink_reply *reply) {
  struct bootstrap *b = comm->boot;
  memset(reply, 0, sizeof *reply);
  reply->culprit = -1;
  reply->leader_count = count;
  char why[LOOM_ERR_LEN] = "";
  for (int s = 0; s < comm->nranks; s++) {
    if (excluded[s] || s == comm->rank)
      continue;
    struct shrink_ask ask;
    ncclResult_t r = bootstrap_recv(b, s, p->tag, &ask, sizeof ask);
    if (r != ncclSuccess && reply->culprit < 0) {
      reply->culprit = s;
      reply->culprit_count = -1;
      snprintf(why, sizeof why, "%s", err_thread_last());
    } else if (r == ncclSuccess && ask.excluded_hash != p->hash && reply->culprit < 0) {
      reply->culprit = s;
      reply->culprit_count = ask.excluded_count;
    }
  }
  reply->ok = reply->culprit < 0;
  if (reply->ok && bootstrap_child_root(b, "shrink", p->tag, 0, &reply->at) != ncclSuccess) {
    reply->ok = 0;
    reply->culprit = comm->rank;
    reply->culprit_count = -1;
    snprintf(why, sizeof why, "%s", err_thread_last());
  }
  /* Every survivor that asked gets the answer, a refusal too, so none
   * waits for a communicator that will not be made. */
  for (int s = 0; s < comm->nranks; s++)
    if (!excluded[s] && s != comm->rank && (s != reply->culprit || reply->culprit_count >= 0))
      bootstrap_send(b, s, p->tag | SHRINK_REPLY, reply, sizeof *reply);
  if (reply->ok)
    return ncclSuccess;
  if (reply->culprit_count < 0)
    return err_set(ncclRemoteError, "ncclCommShrink: rank %d (the leader of the survivors) could not hear rank %d: %s",
                   comm->rank, reply->culprit, why);
  return differ(reply, comm->rank);
}

static ncclResult_t follow(struct ncclComm *comm, int count, const struct shrink_plan *p, struct shrink_reply *reply) {
  struct shrink_ask ask = {.excluded_hash = p->hash, .excluded_count = count};
  ncclResult_t r = bootstrap_send(comm->boot, p->leader, p->tag, &ask, sizeof ask);
  if (r == ncclSuccess)
    r = bootstrap_recv(comm->boot, p->leader, p->tag | SHRINK_REPLY, reply, sizeof *reply);
  if (r != ncclSuccess) {
    err_context("ncclCommShrink: rank %d, waiting for rank %d (the lowest rank not excluded, which leads)",
                comm->rank, p->leader);
    return r;
  }
  if (reply->ok)
    return ncclSuccess;
  if (reply->culprit_count < 0)
    return err_set(ncclRemoteError,
                   "ncclCommShrink: rank %d (the leader of the survivors) could not hear rank %d, so no communicator "
                   "was made; exclude it too",
                   p->leader, reply->culprit);
  return differ(reply, p->leader);
}

static ncclResult_t shrink_run(struct ncclComm *comm, const int *list, int count, const ncclConfig_t *config,
                               int flags, struct ncclComm *child) {
  unsigned char *excluded;
  CHECK(UTIL_CALLOC(&excluded, (size_t)comm->nranks, "ncclCommShrink"));
  for (int i = 0; i < count; i++)
    excluded[list[i]] = 1;
  struct shrink_plan p;
  plan(comm, excluded, count, &p);
  p.tag = SHRINK_TAG | (comm->shrink_seq++ << 1);
  /* A nonblocking parent's job in flight: NCCL_SHRINK_ABORT stops it (it
   * fails, and the parent with it); the flag then comes down again so the
   * parent's bootstrap can carry the shrink. */
  if (comm_async_busy(comm) && flags == NCCL_SHRINK_ABORT) {
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
    async_wait(comm);
    __atomic_store_n(&comm->abort_flag, 0, __ATOMIC_SEQ_CST);
  }
  struct shrink_reply reply;
  ncclResult_t r = p.leader == comm->rank ? lead(comm, excluded, count, &p, &reply) : follow(comm, count, &p, &reply);
  free(excluded);
  CHECK(r);
  INFO(LOG_INIT, "shrink: rank %d excludes %d rank(s) -> rank %d of %d", comm->rank, count, p.newrank, p.newn);
  /* p.tag numbers this shrink: the survivors' messages matched it. */
  ncclUniqueId id;
  CHECK(bootstrap_child_id(comm->boot, "shrink", p.tag, 0, &reply.at, &id));
  r = comm_init(child, p.newn, &id, p.newrank, config);
  bootstrap_id_wipe(&id);
  return r;
}

struct shrink_job {
  struct group_job base;
  struct ncclComm *parent;
  int *list, count, flags;
  ncclConfig_t config;
};

static ncclResult_t shrink_job_run(struct group_job *job) {
  struct shrink_job *j = (struct shrink_job *)job;
  ncclResult_t r = shrink_run(j->parent, j->list, j->count, &j->config, j->flags, j->base.comm);
  if (r != ncclSuccess)
    comm_set_error(j->base.comm, r);
  free(j->list);
  return r;
}

/* The parent may have failed (a peer died mid-collective): that is what
 * shrinking is for, so only its being a communicator is checked. */
NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  if (!comm_live(comm))
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclCommShrink: comm is %s",
                                    comm ? "not a communicator (never created, or already destroyed)" : "NULL"));
  if (atomic_load(&comm->suspended) || comm->suspend_queued)
    return api_finish(comm, err_set(ncclInvalidUsage,
                                    "ncclCommShrink: the communicator is suspended; call ncclCommResume"));
  unsigned char *excluded;
  ncclResult_t r = UTIL_CALLOC(&excluded, (size_t)comm->nranks, "ncclCommShrink");
  if (r == ncclSuccess) {
    r = check_args(comm, excludeRanksList, excludeRanksCount, newcomm, shrinkFlags, excluded);
    free(excluded);
  }
  if (r == ncclSuccess && comm_async_busy(comm) && shrinkFlags != NCCL_SHRINK_ABORT)
    r = err_set(ncclInvalidUsage,
                "ncclCommShrink: the communicator's previous call is still in progress (a nonblocking "
                "communicator); wait for it, or pass NCCL_SHRINK_ABORT to stop it");
  ncclConfig_t cfg;
  if (r == ncclSuccess)
    r = comm_read_config(config, &cfg, "ncclCommShrink");
  struct ncclComm *child = NULL;
  if (r == ncclSuccess)
    r = comm_alloc(&child);
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  if (group_depth() > 0) {
    struct shrink_job *j = calloc(1, sizeof *j);
    int *copy = excludeRanksCount ? malloc(sizeof *copy * (size_t)excludeRanksCount) : NULL;
    if (!j || (excludeRanksCount && !copy)) {
      free(j);
      free(copy);
      comm_slot_free(child);
      return api_finish(NULL, err_set(ncclSystemError, "out of memory queueing ncclCommShrink"));
    }
    if (copy)
      memcpy(copy, excludeRanksList, sizeof *copy * (size_t)excludeRanksCount);
    j->base.fn = shrink_job_run;
    j->base.comm = child;
    j->parent = comm;
    j->list = copy;
    j->count = excludeRanksCount;
    j->flags = shrinkFlags;
    j->config = cfg;
    *newcomm = child;
    return group_add_job(&j->base);
  }
  log_set_rank(comm->rank);
  r = shrink_run(comm, excludeRanksList, excludeRanksCount, &cfg, shrinkFlags, child);
  if (r != ncclSuccess) {
    char msg[LOOM_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", err_thread_last());
    comm_destroy_all(child);
    err_set(r, "%s", msg);
    return api_finish(NULL, r);
  }
  *newcomm = child;
  return ncclSuccess;
}
