/*
 * The communicator: who the ranks are, how to reach them, and what state the
 * communicator is in; and the primitives every floor above may use on it
 * (comm.c, comm_peers.c). What only the API floor does with a communicator
 * is declared in comm_api.h.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "core.h"
#include "comm/comm_slots.h"
#include "misc/place.h"

struct bootstrap;
struct conn;
struct task;
struct status_rec;
struct call_desc;
struct tuner;
struct rma_state;

/* A window of a one-host host communicator that every rank maps by
 * pointer, as the flat collectives see it: rank r's window is peer[r] in
 * this process, peer_size[r] bytes. Registration numbers windows alike
 * on every rank, so a rank names its window to the others by id. */
struct comm_win {
  uint64_t id;
  const char *buff; /* this rank's */
  size_t size;
  char **peer;
  size_t *peer_size;
  int symmetric; /* registered with NCCL_WIN_COLL_SYMMETRIC (by any rank: then by all) */
  struct comm_win *next;
};
struct suspend_state;
struct shm_arena;

#define COMM_MAGIC 0x4c6f6f6d436f6d6dull /* "LoomComm" */

/* What every rank learns about every other rank during init. */
struct peer_info {
  int32_t rank;
  int32_t pid;
  uint64_t host_hash;
  char hostname[64];
  int64_t buffsize;
  int32_t shm_disabled;
  int32_t cuda_dev;
  /* The channels the rank asks for (bounded by NCCL_MIN/MAX_NCHANNELS
   * and the config), alone on its host and with other ranks there. */
  int32_t nchannels_wanted, nchannels_shared;
  int32_t p2p_disabled;
  int32_t p2p_level; /* NCCL_P2P_LEVEL, or the topology's default: the farthest path p2p takes */
  int32_t max_lanes; /* blocks of the kernel the rank's device holds at once; 0 on host communicators */
  char busid[16]; /* PCI bus id of the rank's GPU, "" on host communicators */
  int32_t numa;   /* the NUMA node the rank runs on */
  uint32_t tuning_hash; /* of NCCL_ALGO and NCCL_PROTO: every rank must choose alike */
  int32_t check_calls;  /* LOOM_CHECK_CALLS: every rank must take part alike */
  /* Which process the rank is (util_process_id: pids of two pid
   * namespaces can be equal) and its pid namespace (0: unknown), where
   * `pid` means something only to ranks of the same one. */
  uint64_t proc_id;
  uint64_t pid_ns;
  /* The rank's one-sided signal counters (rma.h), a
   * memfd of sig_size bytes mapped at sig_addr in its process, its
   * descriptor there and identity; sig_size 0 where it has none. */
  uint64_t sig_addr, sig_size, sig_dev, sig_ino;
  int32_t sig_fd;
  struct place_cpus cpus; /* the CPUs it may run on (its affinity) */
};

struct channel {
  int id;
  int ring_prev, ring_next;
  int ring_index;   /* this rank's position in `ring` */
  int *ring;        /* the ranks in ring order (into comm->topo_rings) */
  int tree_up;      /* this rank's parent in the channel's tree, -1 at the root */
  int tree_down[3]; /* its children, -1 where there are fewer */
  int nic;          /* the host's NIC node the channel uses, -1 if none */
  /* That NIC as a network plugin names it ("" if none), so that the net
   * transport finds its device without reading the topology. */
  char nic_name[32];
  int nic_port;
};

/* A PreMulSum operator made by ncclRedOpCreatePreMulSum. */
struct user_op {
  int in_use;
  int dtype;
  int residence;       /* ncclScalarResidence_t */
  const void *scalar_ptr; /* ncclScalarDevice: read at each call */
  double scalar;       /* ncclScalarHostImmediate (ints stored exactly) */
  int64_t scalar_i;
};

struct ncclComm {
  uint64_t magic;
  int rank, nranks;
  int cuda_dev;    /* -1: host communicator */
  int is_host;
  uint64_t comm_hash;
  char name[64];
  int blocking;
  /* The config it was made with, read and checked, strings cleared: what
   * a grow with config NULL inherits (comm_grow.c). */
  ncclConfig_t config;

  struct bootstrap *boot;
  struct peer_info *peers;
  size_t buffsize;
  int nchannels;
  struct channel channels[LOOM_MAX_CHANNELS];
  int *topo_rings; /* every channel's ring, nchannels x nranks */
  char local_cpus[128]; /* the CPUs near this rank's GPU, for its threads */
  struct tuner *tuner; /* NCCL_ALGO and the cost model (algorithms/tuner.h) */
  int nhosts;
  uint64_t spin_ns; /* how long a host wait spins before yielding (LOOM_SPIN_US) */
  uint64_t yield_ns; /* and then yields before sleeping (LOOM_YIELD_US) */
  size_t single_copy_min; /* LOOM_SHM_SINGLE_COPY, 0: off */
  int single_copy_local;  /* ... and only between ranks of one process */
  /* The slowest chain link and the smallest NIC total of any rank's host
   * (GB/s, 0: none), for the tuner. */
  double topo_chain_gbs, topo_nic_gbs;
  int coll_conns; /* the connections of every collective algorithm exist */
  /* Connections, created on first use: [channel][peer] for rings would be
   * wasteful, so rings keep theirs per channel and p2p per peer. */
  struct conn *ring_send[LOOM_MAX_CHANNELS], *ring_recv[LOOM_MAX_CHANNELS];
  struct conn **p2p_send, **p2p_recv;
  struct conn *extra_conns; /* other kinds, looked up by kind, channel, peer, direction */
  struct conn *pending; /* created, not yet connected */
  int *peer_pidfd;      /* same-host peers' pidfds, -1 elsewhere */
  /* Windows and one-sided signals (rma.h), made at the first
   * ncclCommWindowRegister; NULL until then. */
  struct rma_state *rma;
  /* Of those, the windows every rank maps by pointer (comm_mem.c keeps
   * the list), where the flat collectives read and write the ranks'
   * buffers in place. */
  struct comm_win *direct_wins;
  /* The shared memory every rank of a one-host host communicator maps,
   * for the flat collectives (transport/shm_arena.h); NULL if none. */
  struct shm_arena *arena;

  struct user_op *user_ops;
  int n_user_ops;

  /* The CUDA executor's state (streams, device status, proxy thread);
   * NULL on host communicators. */
  struct cuda_comm *cuda;

  /* What the net transport asks of the topology, which sits above it
   * (set by comm_alloc in init.c): for CUDA device `gpu` and the NIC
   * a plugin device is (its sysfs PCI path, name and port), the type of
   * path between them (-1 where there is none) and whether the GPU has
   * an NVLink to another GPU or is the host's only one. Each is left as
   * it was where the topology does not know. */
  void (*gpu_nic_facts)(int gpu, const char *nic_pci_path, const char *nic_name, int nic_port, int *distance,
                        int *nvlink);
  /* What the p2p transport asks of it: the type of path between the GPUs
   * of two PCI bus ids of this host, -1 where it does not place both. */
  int (*gpu_path)(const char *busid_a, const char *busid_b);
  /* What a failure does to the connections besides (comm_set_error):
   * set by comm_alloc (init.c), on the floor that makes them. */
  void (*poison_conns)(struct ncclComm *comm, const char *why);
  /* Set by ncclCommAbort or by a failure; every wait polls it. */
  volatile int abort_flag;
  /* loomCommSetTimeout's bound in ns, 0: LOOM_TIMEOUT. Atomic: the CUDA
   * proxy and the bootstrap (through boot->timeout_ns) read it too. */
  _Atomic uint64_t timeout_ns;
  /* ncclCommRevoke: no more calls but split, shrink, destroy and abort. */
  _Atomic int revoked;
  /* ncclCommSuspend released the connections (and a CUDA communicator's
   * executor): no calls but ncclCommResume, ncclCommMemStats, the
   * queries, destroy and abort. suspend_queued: 1 while a suspend, 2
   * while a resume waits in an open group for its end. What Resume
   * rebuilds is kept in `suspend` (comm_suspend.c). */
  _Atomic int suspended;
  int suspend_queued;
  struct suspend_state *suspend;
  /* 1 while a thread is inside a call on this communicator (NCCL allows
   * one at a time): ncclCommAbort from another thread waits for it to see
   * abort_flag and leave before it frees anything. */
  _Atomic int in_call;
  const char *_Atomic in_call_func; /* which call, for a second thread's refusal */
  /* Nonblocking communicators: 1 while a job (init or launch) involving it
   * runs on a worker (async.c), whose thread this is, if started. */
  _Atomic int async_busy;
  struct async_worker *worker;
  /* Set once, by whichever thread fails first (the caller's, or a CUDA
   * proxy): error_claim picks it, the sentences are written, then the code
   * is published (release) for other threads to read them after it. */
  _Atomic int error_claim;
  _Atomic ncclResult_t async_error;
  char last_error[LOOM_ERR_LEN];
  /* The sentence of the failure that broke the communicator, written
   * once: every later call quotes it, so it never drowns in their
   * prefixes however many follow. */
  char first_error[LOOM_ERR_LEN];
  int finalized;
  uint64_t coll_seq; /* collectives started, for diagnostics */
  uint64_t shrink_seq; /* ncclCommShrink calls, which number their bootstrap messages */
  /* ncclCommGetUniqueId on this rank: the ids made (numbering their
   * secrets), and the one no grow has consumed yet, by its hash. */
  uint64_t grow_seq;
  int grow_pending;
  uint64_t grow_pending_seq, grow_pending_hash;
  /* LOOM_CHECK_CALLS, agreed by all ranks at init (host communicators
   * only): its all-gathers' own numbers, its buffers (this rank's
   * description, then every rank's), and whether the last launch was
   * refused by it, which leaves the communicator usable. */
  int check_calls;
  uint64_t check_seq;
  struct call_desc *check_buf;
  int call_checked; /* the call now being launched has passed the check */
  int call_refused;
  struct status_rec *status; /* this communicator's line in the status page, NULL if none */

  /* Group bookkeeping (owned by the thread in the group). */
  struct task *tasks_head, *tasks_tail;
  /* Reused from call to call so that a small collective allocates
   * nothing: the lanes of a launch, finished works (with their schedule
   * buffers), and the task of a call made outside a group. */
  struct lane *lanes;
  struct work *free_works;
  struct task *task_inline; /* allocated on first use */
  int task_inline_used;
  struct ncclComm *group_next;
  int in_group;
  const void *group_owner; /* a token of the thread whose open group holds it */
};

/* ---- the primitives (comm.c) ---- */

/* Validates a communicator argument; records the sentence on failure. */
ncclResult_t comm_check(const struct ncclComm *comm, const char *func);

/* The window of comm->direct_wins that holds [p, p + len) on this rank,
 * or NULL. */
const struct comm_win *comm_win_holding(const struct ncclComm *comm, const void *p, size_t len);
/* The same, but a suspended communicator passes: for the calls that work
 * on one (ncclCommResume, the queries). */
ncclResult_t comm_check_even_suspended(const struct ncclComm *comm, const char *func);
/* The refusal of a pointer that is no live communicator, for `func`. */
ncclResult_t comm_not_a_comm(const char *func);

/* Marks the communicator broken after a failure that leaves its
 * connections in an unknown state, and tells the peers (poison_conns). */
void comm_set_error(struct ncclComm *comm, ncclResult_t res);

/* Whether `comm` is a communicator that is not yet destroyed; any pointer
 * may be asked (comm_slots.h). */
static inline int comm_live(const struct ncclComm *comm) {
  return comm != NULL && comm_slot_live(comm) && comm->magic == COMM_MAGIC;
}

/* Brackets a call, one thread at a time (as NCCL allows), and against
 * ncclCommAbort from another thread. Enter fails, with the sentence and
 * without entering, if another thread is inside a call on the
 * communicator or an abort has begun; only a caller that entered may
 * leave, and leaving must be its last touch of the communicator. Enter
 * refuses a pointer that is not a communicator, but lets NULL through for
 * the call's own check to name; leave ignores both. */
ncclResult_t comm_enter(struct ncclComm *comm, const char *func);
void comm_leave(struct ncclComm *comm);
/* Waits until no thread is inside a call, then holds the communicator
 * (abort and revoke, once the abort flag is up). */
void comm_hold(struct ncclComm *comm, const char *func);

/* Whether ncclCommAbort (or a failure) has raised abort_flag; waits on
 * any thread read it through this, since another thread writes it. */
static inline int comm_aborted(const struct ncclComm *comm) {
  return __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE);
}

/* The bound of a wait that belongs to `comm`: its loomCommSetTimeout
 * value where set, else LOOM_TIMEOUT; the deadline of one that starts now;
 * and the bound as its timeout sentence names it (TIMEOUT_NAME_LEN). */
uint64_t comm_timeout_ns(const struct ncclComm *comm);
uint64_t comm_deadline(const struct ncclComm *comm);
const char *comm_timeout_name(const struct ncclComm *comm, char *buf, size_t len);

/* Whether a nonblocking communicator's job is running on its worker
 * (async.c), during which the communicator takes no other call. */
static inline int comm_async_busy(const struct ncclComm *comm) {
  return atomic_load_explicit(&comm->async_busy, memory_order_acquire);
}

/* ---- whether peers live (comm_peers.c) ---- */

/* Fails with "rank 2 (pid 123 on h) has exited" if it has, naming the
 * other ranks of this host that have exited as well. */
ncclResult_t comm_peer_alive(struct ncclComm *comm, int peer);
/* The ranks of this host that have exited, as "; rank 2 (pid 123 on h)
 * has exited" (empty if none; rank `skip` left out), for a peer that gave up on an operation or
 * closed its connection: it did so most likely because one of them died,
 * which it cannot tell this rank itself. */
void comm_note_exited(struct ncclComm *comm, int skip, char *buf, size_t len);
/* Whether rank `peer` is known to live, as "; rank 1 (pid 123 on h) is
 * still running", "... has exited", or that it is on another host, whose
 * processes this rank cannot see: a broken connection says only that. */
void comm_note_peer(struct ncclComm *comm, int peer, char *buf, size_t len);

#endif
