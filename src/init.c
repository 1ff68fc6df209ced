/*
 * Creating communicators: ncclGetUniqueId, ncclCommInitRank(Config),
 * ncclCommInitAll, ncclCommSplit. A rank with a CUDA device makes a CUDA
 * communicator (the CUDA executor runs its calls on the user's stream);
 * one without, or with LOOM_DEVICE=host, a host communicator (buffers in
 * host memory, stream ignored). Init also hooks in what the lower floors
 * may not call up for (comm->poison_conns, comm->gpu_nic_facts,
 * comm->gpu_path).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "bootstrap/bootstrap.h"
#include "algorithms/tuner.h"
#include "call_check.h"
#include "common/path_type.h"
#include "comm_api.h"
#include "rma.h"
#include "exec/cuda/cuda_exec.h"
#include "exec/reduce.h"
#include "group.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "plan.h"
#include "topology/search.h"
#include "topology/topo.h"
#include "status.h"
#include "transport/net/net.h"
#include "transport/shm_arena.h"
#include "transport/transport.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_once_t banner_once = PTHREAD_ONCE_INIT;

static void banner(void) {
  log_msg(LOG_VERSION, LOG_INIT, "Loom %s (NCCL API %d.%d.%d), transports: %s, reductions: %s", LOOM_VERSION_STRING,
          NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, TRANSPORTS_BUILT, red_isa());
  char names[512];
  size_t n = param_rccl_unread(names, sizeof names);
  if (n)
    WARN("%s set, but Loom reads no RCCL_* variable (RCCL's own features, MSCCL among them, are not in Loom): "
         "%s ignored; the NCCL_* variables work as documented in docs/environment.md", names,
         n == 1 ? "it is" : "they are");
}

NCCL_API(ncclResult_t, ncclGetVersion, int *version) {
  if (version == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclGetVersion: version is NULL"));
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId) {
  if (uniqueId == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL"));
  ncclResult_t r = param_check_all();
  if (r == ncclSuccess)
    r = bootstrap_get_unique_id(uniqueId);
  return api_finish(NULL, r);
}

ncclResult_t comm_alloc(struct ncclComm **out) {
  struct ncclComm *c;
  CHECK(comm_slot_alloc(sizeof *c, (void **)&c));
  c->magic = COMM_MAGIC;
  c->rank = -1;
  c->cuda_dev = -1;
  c->is_host = 1;
  c->poison_conns = transport_poison_conns;
  c->gpu_nic_facts = topo_gpu_nic_facts;
  c->gpu_path = topo_gpu_path;
  *out = c;
  return ncclSuccess;
}

/* A CUDA communicator allocates its collectives' FIFOs in init, and its
 * ranks leave init together: CUDA does not start a kernel while an
 * allocation issued after an earlier kernel is pending, so a rank
 * allocating at its first call while a peer's first kernel already runs
 * could keep its own kernel from starting, which that peer's kernel waits
 * for (ranks as threads of one process, sharing a device). */
static ncclResult_t connect_cuda(struct ncclComm *comm) {
  if (comm->nranks == 1)
    return ncclSuccess;
  CHECK(plan_connect_collectives(comm));
  CHECK(transport_connect_pending(&comm, 1));
  return bootstrap_barrier(comm->boot, "the end of init");
}

static ncclResult_t check_peers(struct ncclComm *comm) {
  const struct peer_info *me = &comm->peers[comm->rank];
  for (int r = 0; r < comm->nranks; r++) {
    const struct peer_info *p = &comm->peers[r];
    if ((p->cuda_dev < 0) != (me->cuda_dev < 0))
      return err_set(ncclInvalidUsage,
                     "rank %d (%s) made a %s communicator but rank %d (%s) a %s one: every rank must see a CUDA "
                     "device, or none (LOOM_DEVICE=host makes host communicators everywhere)",
                     comm->rank, me->hostname, me->cuda_dev < 0 ? "host" : "CUDA", r, p->hostname,
                     p->cuda_dev < 0 ? "host" : "CUDA");
    if (p->tuning_hash != me->tuning_hash)
      return err_set(ncclInvalidUsage,
                     "NCCL_ALGO or NCCL_PROTO differ between rank %d (%s) and rank %d (%s): every rank must choose "
                     "algorithms alike, so set them the same everywhere",
                     comm->rank, me->hostname, r, p->hostname);
    if (p->check_calls != me->check_calls)
      return err_set(ncclInvalidUsage,
                     "LOOM_CHECK_CALLS is %d on rank %d (%s) but %d on rank %d (%s): every rank must check its "
                     "calls, or none, so set it the same everywhere",
                     me->check_calls, comm->rank, me->hostname, p->check_calls, r, p->hostname);
    if (p->buffsize != me->buffsize)
      return err_set(ncclInvalidUsage,
                     "NCCL_BUFFSIZE differs between ranks: rank %d (%s) uses %lld, rank %d (%s) uses %lld; set it "
                     "the same everywhere",
                     comm->rank, me->hostname, (long long)me->buffsize, r, p->hostname, (long long)p->buffsize);
  }
  return ncclSuccess;
}

static ncclResult_t alive_cb(void *ctx, int peer) { return comm_peer_alive(ctx, peer); }

/* Opens a pidfd for each peer on this host, so waits notice its exit. */
static void open_pidfds(struct ncclComm *comm) {
  for (int r = 0; r < comm->nranks; r++) {
    comm->peer_pidfd[r] = -1;
    const struct peer_info *p = &comm->peers[r];
    const struct peer_info *me = &comm->peers[comm->rank];
    /* A pid of another pid namespace names another process here. */
    if (r == comm->rank || p->host_hash != me->host_hash || p->proc_id == me->proc_id || p->pid_ns != me->pid_ns)
      continue;
#ifdef SYS_pidfd_open
    comm->peer_pidfd[r] = (int)syscall(SYS_pidfd_open, p->pid, 0);
#endif
  }
}

/* Where ranks may move between CPUs, a waiting rank sleeps soon: a CPU
 * whose ranks all wait then idles, and the scheduler moves over a rank
 * that has work. A rank pinned to one CPU with others cannot be moved
 * to, and the ranks that could use its CPU are the ones pinned there:
 * yielding hands it straight to them, with no futex wake and no idle
 * CPU between the phases of a collective. 8 ranks pinned 4 to each of 2
 * CPUs, AllReduce 1 MiB: 774-846 us yielding up to 100 ms against
 * 921-1008 sleeping after 50 us (perf/README.md). */
static uint64_t yield_budget(int crowded, const struct place_cpus *mine) {
  int64_t us = param_int(P_YIELD_US);
  if (us >= 0)
    return (uint64_t)us * 1000;
  return crowded && place_cpu_count(mine) == 1 ? 10000000ull : WAIT_YIELD_NS;
}

/* Spinning answers a peer fastest but only while each rank has a core:
 * where more ranks may run on a rank's CPUs than there are of them, a
 * spinning rank holds the core its peer needs, so it yields at once
 * instead. Ranks pinned one to a CPU each (mpirun --bind-to core) spin. */
static uint64_t spin_budget(int oversubscribed) {
  int64_t us = param_int(P_SPIN_US);
  if (us >= 0)
    return (uint64_t)us * 1000;
  return oversubscribed ? 0 : 20000;
}

struct host_rank {
  uint64_t host_hash;
  int rank;
};

static int host_rank_cmp(const void *a, const void *b) {
  const struct host_rank *x = a, *y = b;
  if (x->host_hash != y->host_hash)
    return x->host_hash < y->host_hash ? -1 : 1;
  return x->rank - y->rank;
}

/* Hosts, the most ranks on one, and which ranks are crowded (more ranks
 * may run on their CPUs than there are CPUs: place_crowded), from every
 * rank's peer record, one host's ranks at a time. */
static ncclResult_t host_census(struct ncclComm *comm, int *nhosts, int *maxper, int *crowded, int *mine) {
  int n = comm->nranks;
  *nhosts = *maxper = *crowded = *mine = 0;
  struct host_rank *order = malloc((size_t)n * sizeof *order);
  const struct place_cpus **sets = malloc((size_t)n * sizeof *sets);
  if (!order || !sets) {
    free(order);
    free(sets);
    return err_set(ncclSystemError, "out of memory for the communicator's host census");
  }
  for (int r = 0; r < n; r++)
    order[r] = (struct host_rank){comm->peers[r].host_hash, r};
  qsort(order, (size_t)n, sizeof *order, host_rank_cmp);
  for (int a = 0, b; a < n; a = b) {
    for (b = a; b < n && order[b].host_hash == order[a].host_hash; b++)
      sets[b - a] = &comm->peers[order[b].rank].cpus;
    (*nhosts)++;
    *maxper = LOOM_MAX(*maxper, b - a);
    for (int i = 0; i < b - a; i++) {
      int c = place_crowded(sets, b - a, i);
      *crowded |= c;
      if (order[a + i].rank == comm->rank)
        *mine = c;
    }
  }
  free(order);
  free(sets);
  return ncclSuccess;
}

/* The tuning model's view of the communicator (tuner_shape). */
static ncclResult_t tune_setup(struct ncclComm *comm) {
  int nhosts, maxper, shm_off = 0, oversubscribed, mine_oversubscribed;
  CHECK(host_census(comm, &nhosts, &maxper, &oversubscribed, &mine_oversubscribed));
  for (int r = 0; r < comm->nranks; r++)
    shm_off |= comm->peers[r].shm_disabled;
  comm->nhosts = nhosts;
  comm->spin_ns = spin_budget(mine_oversubscribed);
  comm->yield_ns = yield_budget(mine_oversubscribed, &comm->peers[comm->rank].cpus);
  INFO(LOG_INIT, "rank %d: %s; %s; a wait spins %llu us before it yields, and yields %llu us before it sleeps",
       comm->rank,
       mine_oversubscribed ? "crowded (more of this host's ranks may run on its CPUs than there are of them)"
                           : "not crowded (a CPU for each rank that may run on its CPUs)",
       oversubscribed ? "a host of this communicator is crowded" : "no host is crowded",
       (unsigned long long)(comm->spin_ns / 1000), (unsigned long long)(comm->yield_ns / 1000));
  int64_t single = param_int(P_SHM_SINGLE_COPY);
  comm->single_copy_min = single < 0 ? 65536 : (size_t)single;
  comm->single_copy_local = single < 0;
  struct tune_input in;
  tuner_shape(&in, comm->nranks, nhosts, maxper, comm->nchannels, !comm->is_host, shm_off, comm->buffsize,
              comm->topo_chain_gbs, comm->topo_nic_gbs);
  /* Every rank sees the same peers, so all decide alike. */
  if (comm->is_host && oversubscribed)
    tuner_crowded(&in, shm_off);
  comm->tuner = calloc(1, sizeof *comm->tuner);
  if (!comm->tuner)
    return err_set(ncclSystemError, "out of memory for the communicator's tuner");
  return tuner_init(comm->tuner, &in);
}

ncclResult_t comm_arena_setup(struct ncclComm *comm) {
  CHECK(arena_setup(comm));
  /* Every rank has the arena or none has (arena_setup agrees on it). */
  comm->tuner->in.flat_ok = comm->arena != NULL;
  comm->tuner->in.flat_round_bytes = comm->arena ? comm->arena->region : 0;
  return ncclSuccess;
}

/* Does another rank of the communicator share rank r's host? */
static int host_shared(const struct ncclComm *comm, int r) {
  for (int q = 0; q < comm->nranks; q++)
    if (q != r && comm->peers[q].host_hash == comm->peers[r].host_hash)
      return 1;
  return 0;
}

/* The whole of a rank's init once its communicator struct exists, from
 * `nids` unique ids (bootstrap_init). */
static ncclResult_t comm_init_ids(struct ncclComm *comm, int nranks, const ncclUniqueId *ids, int nids, int rank,
                                  const ncclConfig_t *config) {
  const ncclUniqueId *id = &ids[0];
  log_set_rank(rank);
  pthread_once(&banner_once, banner);
  topo_log_host();
  CHECK(param_check_all());
  CHECK(net_check_name(param_str(P_NET)));
  /* A CUDA communicator on the current device where there is one, as NCCL
   * does; a host communicator otherwise. */
  int dev = cuda_pick_device();
  if (dev >= 0) {
    comm->cuda_dev = dev;
    comm->is_host = 0;
  }
  comm->rank = rank;
  comm->nranks = nranks;
  comm->blocking = config->blocking == 0 ? 0 : 1;
  /* Kept for a grow with config NULL to inherit (comm_grow.c); the
   * caller's strings may not outlive this call, so no pointers. */
  comm->config = *config;
  comm->config.commName = NULL;
  comm->config.netName = NULL;
  comm->comm_hash = bootstrap_id_hash(id);
  if (config->commName)
    snprintf(comm->name, sizeof comm->name, "%s", config->commName);
  /* A GPU's lanes move 512 KiB slots, as NCCL's do: a piece's handshake
   * is paid over twice the bytes. Host communicators keep 2 MiB FIFOs,
   * which their many shared-memory connections would otherwise double. */
  comm->buffsize = param_is_set(P_BUFFSIZE) || comm->is_host ? (size_t)param_int(P_BUFFSIZE) : (size_t)4 << 20;

  if (bootstrap_id_is_fixed(id) && rank == 0)
    CHECK(bootstrap_start_root(id));
  CHECK(bootstrap_init(ids, nids, rank, nranks, &comm->abort_flag, &comm->boot));
  comm->boot->alive = alive_cb;
  comm->boot->alive_ctx = comm;
  comm->boot->timeout_ns = &comm->timeout_ns;

  CHECK(UTIL_CALLOC(&comm->peers, nranks, "peer information"));
  struct peer_info *me = &comm->peers[rank];
  me->rank = rank;
  me->pid = (int)getpid();
  me->proc_id = util_process_id();
  me->pid_ns = util_pid_namespace();
  me->host_hash = topo_host_hash();
  gethostname(me->hostname, sizeof me->hostname - 1);
  me->buffsize = (int64_t)comm->buffsize;
  me->shm_disabled = (int)param_int(P_SHM_DISABLE);
  me->cuda_dev = comm->cuda_dev;
  me->p2p_disabled = (int)param_int(P_P2P_DISABLE);
  /* The topology's default only matters, and is only loaded, for GPUs. */
  me->p2p_level = PATH_SYS;
  if (param_is_set(P_P2P_LEVEL))
    CHECK(path_parse_level("NCCL_P2P_LEVEL", param_str(P_P2P_LEVEL), 1, &me->p2p_level));
  else if (!comm->is_host)
    me->p2p_level = topo_p2p_default_level();
  if (!comm->is_host) {
    CHECK(cuda_bus_id(comm->cuda_dev, me->busid));
    CHECK(cuda_device_lanes(&me->max_lanes));
  }
  /* Two wishes, since whether other ranks share this host is known only
   * once all have met; a rank whose GPUs do not write into each other's
   * memory leaves NVLink out. */
  struct topo_channel_rule rule;
  topo_rank_channels(!comm->is_host, me->busid, me->max_lanes, &rule);
  int nvlink_ok = topo_p2p_uses_nvlink(me->p2p_disabled, me->p2p_level);
  me->nchannels_wanted = topo_bound_channels(rule.alone, config->minCTAs, config->maxCTAs);
  me->nchannels_shared = topo_bound_channels(nvlink_ok ? rule.shared : rule.alone, config->minCTAs, config->maxCTAs);
  me->numa = topo_current_numa();
  place_cpus_self(&me->cpus);
  me->tuning_hash = (uint32_t)util_hash_str(param_str(P_ALGO), util_hash_str(param_str(P_PROTO), 0));
  me->check_calls = comm->is_host && call_check_enabled();
  me->sig_fd = -1;
  CHECK(rma_signals_create(comm));
  CHECK(bootstrap_allgather(comm->boot, comm->peers, sizeof *comm->peers));
  CHECK(check_peers(comm));
  comm->check_calls = me->check_calls;
  /* Channels must agree everywhere: every rank takes each rank's wish for
   * its case, from the same peers, and the fewest of them. */
  comm->nchannels = LOOM_MAX_CHANNELS;
  for (int r = 0; r < nranks; r++)
    comm->nchannels = LOOM_MIN(comm->nchannels, host_shared(comm, r) ? comm->peers[r].nchannels_shared
                                                                      : comm->peers[r].nchannels_wanted);
  if (log_enabled(LOG_INFO, LOG_INIT)) {
    char why[256];
    int shared = host_shared(comm, rank);
    topo_channel_why(&rule, shared && nvlink_ok, why, sizeof why);
    INFO(LOG_INIT, "rank %d: the topology gives %s; bounded by NCCL_MIN/MAX_NCHANNELS and the config, %d; the "
         "communicator takes %d channel(s), the fewest of its ranks", rank, why,
         shared ? me->nchannels_shared : me->nchannels_wanted, comm->nchannels);
  }
  CHECK(UTIL_CALLOC(&comm->p2p_send, nranks, "p2p connections"));
  CHECK(UTIL_CALLOC(&comm->p2p_recv, nranks, "p2p connections"));
  CHECK(UTIL_CALLOC(&comm->peer_pidfd, nranks, "peer pidfds"));
  open_pidfds(comm);
  rma_signals_connect(comm);
  CHECK(topo_setup_channels(comm));
  CHECK(tune_setup(comm));
  CHECK(comm_arena_setup(comm));
  if (!comm->is_host) {
    CHECK(cuda_comm_init(comm));
    CHECK(connect_cuda(comm));
  }
  status_comm_add(comm);
  if (comm->is_host)
    INFO(LOG_INIT, "comm %p rank %d nranks %d host communicator, %d channel(s), buffsize %zu - Init COMPLETE",
         (void *)comm, rank, nranks, comm->nchannels, comm->buffsize);
  else
    INFO(LOG_INIT, "comm %p rank %d nranks %d CUDA communicator on device %d (%s), %d channel(s), buffsize %zu - "
         "Init COMPLETE", (void *)comm, rank, nranks, comm->cuda_dev, me->busid, comm->nchannels, comm->buffsize);
  return ncclSuccess;
}

ncclResult_t comm_init(struct ncclComm *comm, int nranks, const ncclUniqueId *id, int rank,
                       const ncclConfig_t *config) {
  return comm_init_ids(comm, nranks, id, 1, rank, config);
}

static ncclResult_t check_init_args(ncclComm_t *out, int nranks, int rank, const ncclUniqueId *ids, int nids,
                                    const char *func) {
  if (out == NULL)
    return err_set(ncclInvalidArgument, "%s: the comm pointer is NULL", func);
  if (nranks < 1)
    return err_set(ncclInvalidArgument, "%s: nranks is %d; it must be at least 1", func, nranks);
  if (rank < 0 || rank >= nranks)
    return err_set(ncclInvalidArgument, "%s: rank %d is out of range for nranks %d", func, rank, nranks);
  for (int i = 0; i < nids; i++) {
    if (!bootstrap_id_valid(&ids[i]))
      return nids == 1 ? err_set(ncclInvalidArgument,
                                 "%s: the unique id was not made by ncclGetUniqueId (or was corrupted on the way)",
                                 func)
                       : err_set(ncclInvalidArgument,
                                 "%s: unique id %d of %d was not made by ncclGetUniqueId (or was corrupted on the "
                                 "way)",
                                 func, i, nids);
    if (i > 0 && bootstrap_id_is_fixed(&ids[i]))
      return err_set(ncclInvalidUsage,
                     "%s: unique id %d of %d has the root NCCL_COMM_ID fixes, which serves one id; make the ids "
                     "with ncclGetUniqueId without NCCL_COMM_ID",
                     func, i, nids);
  }
  return ncclSuccess;
}

struct init_job {
  struct group_job base;
  int nranks, rank;
  int device; /* the CUDA device to create it on, -1: the caller's current one */
  ncclConfig_t config;
  int nids;
  ncclUniqueId ids[];
};


static ncclResult_t init_job_run(struct group_job *job) {
  struct init_job *j = (struct init_job *)job;
  ncclResult_t r = j->device >= 0 ? cuda_set_device(j->device) : ncclSuccess;
  if (r == ncclSuccess)
    r = comm_init_ids(j->base.comm, j->nranks, j->ids, j->nids, j->rank, &j->config);
  if (r != ncclSuccess)
    comm_set_error(j->base.comm, r);
  return r;
}

static struct init_job *init_job_new(int nranks, int rank, const ncclUniqueId *ids, int nids,
                                     const ncclConfig_t *config) {
  struct init_job *j = calloc(1, sizeof *j + sizeof *ids * (size_t)nids);
  if (!j)
    return NULL;
  j->base.fn = init_job_run;
  j->nranks = nranks;
  j->rank = rank;
  j->config = *config;
  j->nids = nids;
  memcpy(j->ids, ids, sizeof *ids * (size_t)nids);
  return j;
}

/* A nonblocking creation, on the communicator's worker: the caller holds
 * the handle, and learns the result from ncclCommGetAsyncError. */
static void init_async(void *arg) {
  struct init_job *j = arg;
  ncclResult_t r = init_job_run(&j->base);
  api_finish(j->base.comm, r);
  free(j);
}

/* Creates the communicator now, at the end of the current group, or (a
 * nonblocking one) on its worker. */
static ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *ids, int nids, int rank,
                              const ncclConfig_t *config_in, const char *func, int device) {
  if (out)
    *out = NULL;
  CHECK(check_init_args(out, nranks, rank, ids, nids, func));
  ncclConfig_t config;
  CHECK(comm_read_config(config_in, &config, func));
  struct ncclComm *comm;
  CHECK(comm_alloc(&comm));
  if (group_depth() > 0) {
    struct init_job *j = init_job_new(nranks, rank, ids, nids, &config);
    if (!j) {
      comm_slot_free(comm);
      return err_set(ncclSystemError, "out of memory queueing a communicator creation");
    }
    /* A group's creations run on threads of their own: they take the
     * caller's current device with them. */
    j->device = device >= 0 ? device : cuda_pick_device();
    j->base.comm = comm;
    *out = comm;
    return group_add_job(&j->base);
  }
  if (config.blocking == 0) {
    struct init_job *j = init_job_new(nranks, rank, ids, nids, &config);
    if (!j) {
      comm_slot_free(comm);
      return err_set(ncclSystemError, "out of memory starting a nonblocking communicator creation");
    }
    j->base.comm = comm;
    j->device = device >= 0 ? device : cuda_pick_device();
    comm->blocking = 0;
    /* Entered here and left by the worker: an abort waits for the job. */
    comm_enter(comm, func);
    ncclResult_t r = async_submit(comm, &comm, 1, init_async, j);
    if (r != ncclSuccess) {
      comm_leave(comm);
      free(j);
      comm_destroy_all(comm);
      return r;
    }
    *out = comm;
    return ncclInProgress;
  }
  ncclResult_t r = comm_init_ids(comm, nranks, ids, nids, rank, &config);
  if (r != ncclSuccess) {
    char msg[LOOM_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", err_thread_last());
    comm_destroy_all(comm);
    err_set(r, "%s", msg);
    return r;
  }
  *out = comm;
  return ncclSuccess;
}

/* One id: ncclCommGrow's path into the same creation (comm_api.h). */
ncclResult_t comm_init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                            const ncclConfig_t *config_in, const char *func, int device) {
  return init_rank(out, nranks, id, 1, rank, config_in, func, device);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config) {
  return api_finish(NULL, init_rank(comm, nranks, &commId, 1, rank, config, "ncclCommInitRankConfig", -1));
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return api_finish(NULL, init_rank(comm, nranks, &commId, 1, rank, NULL, "ncclCommInitRank", -1));
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId,
         ncclUniqueId *commIds, ncclConfig_t *config) {
  if (commIds == NULL || nId < 1)
    return api_finish(NULL, err_set(ncclInvalidArgument,
                                    "ncclCommInitRankScalable: commIds is NULL or nId (%d) is less than 1", nId));
  if (nranks >= 1 && nId > nranks)
    return api_finish(NULL, err_set(ncclInvalidArgument,
                                    "ncclCommInitRankScalable: nId is %d but nranks is %d; there can be at most one "
                                    "unique id per rank",
                                    nId, nranks));
  /* One id passed nId times (NCCL_COMM_ID gives every caller of
   * ncclGetUniqueId the same) is one root; other repeats are a mistake. */
  int same = 1;
  for (int i = 1; i < nId && same; i++)
    same = memcmp(&commIds[i], &commIds[0], sizeof commIds[0]) == 0;
  if (same)
    nId = 1;
  /* Quadratic, so only where it is cheap; past that the roots still find
   * ranks that disagree on the ids (bootstrap_root.c). */
  for (int i = 1; i < nId && nId <= 1024; i++)
    for (int k = 0; k < i; k++)
      if (memcmp(&commIds[i], &commIds[k], sizeof commIds[0]) == 0)
        return api_finish(NULL, err_set(ncclInvalidArgument,
                                        "ncclCommInitRankScalable: unique ids %d and %d are the same; each root "
                                        "needs its own id from ncclGetUniqueId",
                                        k, i));
  return api_finish(NULL,
                    init_rank(newcomm, nranks, commIds, nId, myrank, config, "ncclCommInitRankScalable", -1));
}

/* Several ranks in one process: one thread per rank, as a group does. */
NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist) {
  if (comms == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclCommInitAll: comms is NULL"));
  if (ndev < 1)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclCommInitAll: ndev is %d; it must be at least 1", ndev));
  ncclUniqueId id;
  ncclResult_t r = param_check_all();
  if (r == ncclSuccess)
    r = bootstrap_create_root_id(&id);
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  /* Rank i on devlist[i], or on device i; more ranks than devices share
   * them round robin, which NCCL refuses and Loom allows. */
  int ndevices = cuda_pick_device() >= 0 ? cuda_device_count() : 0;
  for (int i = 0; devlist && ndevices > 0 && i < ndev; i++)
    if (devlist[i] < 0 || devlist[i] >= ndevices)
      return api_finish(NULL, err_set(ncclInvalidArgument,
                                      "ncclCommInitAll: devlist[%d] is %d but there are %d CUDA devices", i,
                                      devlist[i], ndevices));
  ncclGroupStart();
  for (int i = 0; i < ndev && r == ncclSuccess; i++)
    r = init_rank(&comms[i], ndev, &id, 1, i, NULL, "ncclCommInitAll",
                  ndevices > 0 ? (devlist ? devlist[i] : i % ndevices) : -1);
  if (r != ncclSuccess)
    group_record_error(r);
  ncclResult_t e = ncclGroupEnd();
  if (r == ncclSuccess)
    r = e;
  if (r != ncclSuccess) {
    for (int i = 0; i < ndev; i++) {
      if (comms[i])
        comm_destroy_all(comms[i]);
      comms[i] = NULL;
    }
  }
  return api_finish(NULL, r);
}

/* ---- split ---- */

struct split_job {
  struct group_job base;
  struct ncclComm *parent;
  int color, key;
  ncclComm_t *newcomm;
  ncclConfig_t config;
};

struct split_info {
  int32_t color, key;
  /* From the lowest member of each colour: where the child's root
   * listens. Its secret is derived by every member, never sent. */
  struct bootstrap_child at;
};

static ncclResult_t split_run(struct ncclComm *parent, int color, int key, const ncclConfig_t *config,
                              struct ncclComm *child) {
  int n = parent->nranks;
  struct split_info *all;
  CHECK(UTIL_CALLOC(&all, n, "split information"));
  ncclResult_t r;
  all[parent->rank].color = color;
  all[parent->rank].key = key;
  CHECK_GOTO(bootstrap_allgather(parent->boot, all, sizeof *all), r, out);
  /* Numbers this split: the bootstrap counts its all-gathers, the same
   * on every rank once one has completed. */
  uint64_t seq = parent->boot->seq;
  /* New rank: position among the same colour ordered by (key, old rank). */
  int newrank = 0, newn = 0, leader = -1;
  for (int i = 0; i < n; i++) {
    if (color == NCCL_SPLIT_NOCOLOR || all[i].color != color)
      continue;
    newn++;
    if (all[i].key < key || (all[i].key == key && i < parent->rank))
      newrank++;
    if (leader < 0 || all[i].key < all[leader].key)
      leader = i;
  }
  memset(all, 0, sizeof *all * n);
  all[parent->rank].color = color;
  if (color != NCCL_SPLIT_NOCOLOR && leader == parent->rank)
    CHECK_GOTO(bootstrap_child_root(parent->boot, "split", seq, color, &all[parent->rank].at), r, out);
  CHECK_GOTO(bootstrap_allgather(parent->boot, all, sizeof *all), r, out);
  if (color == NCCL_SPLIT_NOCOLOR) {
    r = ncclSuccess;
    goto out;
  }
  INFO(LOG_INIT, "split: rank %d color %d key %d -> rank %d of %d", parent->rank, color, key, newrank, newn);
  /* The child lives on its parent's device, whatever thread splits it. */
  r = parent->is_host ? ncclSuccess : cuda_set_device(parent->cuda_dev);
  ncclUniqueId id;
  if (r == ncclSuccess)
    r = bootstrap_child_id(parent->boot, "split", seq, color, &all[leader].at, &id);
  if (r == ncclSuccess) {
    r = comm_init(child, newn, &id, newrank, config);
    bootstrap_id_wipe(&id);
  }
out:
  free(all);
  return r;
}

static ncclResult_t split_job_run(struct group_job *job) {
  struct split_job *j = (struct split_job *)job;
  ncclResult_t r = split_run(j->parent, j->color, j->key, &j->config, j->base.comm);
  if (r != ncclSuccess) {
    comm_set_error(j->base.comm, r);
  } else if (j->color == NCCL_SPLIT_NOCOLOR) {
    free(j->base.comm);
    j->base.comm = NULL;
    *j->newcomm = NULL;
  }
  return r;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config) {
  /* A revoked communicator is split to go on, even where the work it
   * stopped failed it; the bootstrap that carries the split still works. */
  ncclResult_t r = comm_live(comm) && atomic_load(&comm->revoked) && comm->rank >= 0 && !comm_async_busy(comm)
                       ? ncclSuccess
                       : comm_check(comm, "ncclCommSplit");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  if (newcomm == NULL)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL"));
  *newcomm = NULL;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return api_finish(comm, err_set(ncclInvalidArgument,
                                    "ncclCommSplit: color %d is negative; use NCCL_SPLIT_NOCOLOR (-1) to opt out",
                                    color));
  ncclConfig_t cfg;
  if (config) {
    r = comm_read_config(config, &cfg, "ncclCommSplit");
    if (r != ncclSuccess)
      return api_finish(comm, r);
  } else {
    ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
    cfg = def;
    if (comm->name[0])
      cfg.commName = NULL;
  }
  struct ncclComm *child;
  r = comm_alloc(&child);
  if (r != ncclSuccess)
    return api_finish(comm, r);
  if (group_depth() > 0) {
    struct split_job *j = calloc(1, sizeof *j);
    if (!j) {
      comm_slot_free(child);
      return api_finish(comm, err_set(ncclSystemError, "out of memory queueing ncclCommSplit"));
    }
    j->base.fn = split_job_run;
    j->base.comm = child;
    j->parent = comm;
    j->color = color;
    j->key = key;
    j->newcomm = newcomm;
    j->config = cfg;
    *newcomm = child;
    return api_finish(comm, group_add_job(&j->base));
  }
  log_set_rank(comm->rank);
  r = split_run(comm, color, key, &cfg, child);
  if (r != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) {
    char msg[LOOM_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", err_thread_last());
    comm_destroy_all(child);
    if (r != ncclSuccess)
      err_set(r, "%s", msg);
    return api_finish(comm, r);
  }
  *newcomm = child;
  return ncclSuccess;
}
