/*
 * Windows (ncclCommWindowRegister) and what one-sided operations need of
 * them (comm_mem.c), for the one-sided calls (comm_rma.c). Registering a
 * window is collective: every rank all-gathers its window's description
 * and maps, for each peer it can reach by load and store (its own
 * process, or a process of this host whose window is memory from
 * ncclMemAlloc), the peer's window. The signals are set up with the
 * communicator: each rank's counters, in shared memory its peers map.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_RMA_H
#define LOOM_RMA_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/comm.h"
#include "misc/socket.h"

/* The signal indices and contexts a one-sided call may name: NCCL 2.29
 * takes 0 only, 2.30 a few; Loom takes these. */
#define RMA_SIGNALS 8
#define RMA_CTXS 4

/* How rank `peer`'s window is reached from this rank. */
struct rma_peer_win {
  char *ptr;      /* the peer's window as this process sees it; NULL: not reachable */
  size_t size;    /* its size, as the peer registered it */
  void *map;      /* a mapping of the peer's segment to unmap; NULL: none */
  size_t map_len;
  char *why;      /* where ptr is NULL: the sentence that says why (allocated) */
  /* A window of another process of this host that is not memory from
   * ncclMemAlloc: puts write into that process (process_vm_writev) at
   * vm_addr; 0 where not. */
  int vm_pid;
  uint64_t vm_addr;
  void *ipc_base; /* CUDA communicators: the peer's allocation opened by CUDA IPC, to close */
};

struct rma_win {
  uint64_t magic;
  uint64_t id; /* numbers the communicator's registrations from 1, the same on every rank */
  struct ncclComm *comm;
  void *buff;
  size_t size;
  struct rma_peer_win *peer; /* nranks */
  struct comm_win direct;    /* on comm->direct_wins where direct.peer is set */
  struct rma_win *next;      /* the communicator's windows */
  struct rma_win *next_all;  /* every window of the process */
};
#define RMA_WIN_MAGIC 0x4c6f6f6d57696e00ull

/* A communicator's signals: rank r's counters are
 * [ctx][sigIdx][sender] uint64, raised by senders (release) and read by
 * rank r (acquire); `consumed` is what rank r's waits took already. */
struct rma_state {
  int sig_ready;
  int sig_fd;
  _Atomic uint64_t *sig_own;
  size_t sig_len;
  _Atomic uint64_t **sig_peer;   /* nranks: the peer's counters here; NULL: not reachable */
  void **sig_map;                /* nranks: mappings to unmap */
  char **sig_why;                /* nranks: why not reachable */
  uint64_t *consumed;
  struct rma_win *wins;
  uint64_t win_seq;
  /* Held while the list of windows changes and while the service for
   * peers on other hosts (comm_rma_net.c) writes into a window. A peer
   * may put into a window as soon as its own registration returns, before
   * this rank's has: the service waits (win_cond) until win_done, the
   * last registration this rank has finished, reaches the window's id. */
  pthread_mutex_t lock;
  pthread_cond_t win_cond;
  uint64_t win_done;
  int net_stopping;
  struct rma_net *net; /* that service; NULL: none */
  /* CUDA communicators: signals queued on streams (cudaLaunchHostFunc)
   * and not yet raised; destroy waits for them, since they write into
   * the peers' counters this state maps. */
  _Atomic int pending;
};

static inline size_t rma_sig_index(const struct ncclComm *comm, int ctx, int sig, int sender) {
  return ((size_t)ctx * RMA_SIGNALS + (size_t)sig) * (size_t)comm->nranks + (size_t)sender;
}

/* At init: this rank's signal counters, described in
 * its peer_info before the all-gather (rma_signals_create), then the
 * peers' counters mapped once the pidfds are open (rma_signals_connect).
 * Only running out of memory fails; counters that cannot be shared make
 * signals to this rank from other processes refused, with the reason. */
ncclResult_t rma_signals_create(struct ncclComm *comm);
void rma_signals_connect(struct ncclComm *comm);

/* The ncclMemAlloc allocation (mem_alloc.c) that [p, p + size) lies in:
 * shared host memory, 1 with its memfd, the offset and the memfd's
 * size; device memory, 1 with its start and the offset; else 0. */
int mem_find_shared(const void *p, size_t size, int *fd, size_t *offset, size_t *seg_size);
int mem_find_device(const void *p, size_t size, void **base, size_t *offset);

/* A sealed memfd of `len` bytes, its pages reserved (a shortage is an
 * error here, not a SIGBUS later): the descriptor, or -1 with errno. */
int mem_shared_segment(size_t len);
size_t mem_page_round(size_t n);

/* The window `win` of `comm`, or NULL (with the sentence, naming `func`)
 * where it is no window of this communicator. */
ncclResult_t rma_win_lookup(struct ncclComm *comm, ncclWindow_t win, const char *func, struct rma_win **out);

/* The communicator of window `win` (NULL where it is none), found
 * without reading *win: any pointer may be asked. */
struct ncclComm *rma_win_owner(ncclWindow_t win);

/* Host communicators, peers on other hosts (comm_rma_net.c): whether
 * `peer` is one; the service, started at the first window registration
 * (its address in *addr); a peer's service address as the registration
 * told it; a put (win_id 0, bytes 0: a signal alone) as one frame to the
 * peer's service, which writes and raises the counter; the service
 * stopped and its connections closed (destroy). */
int rma_net_remote(const struct ncclComm *comm, int peer);
ncclResult_t rma_net_start(struct ncclComm *comm, union sock_addr *addr);
void rma_net_peer(struct ncclComm *comm, int peer, const union sock_addr *addr);
ncclResult_t rma_net_send(struct ncclComm *comm, int peer, uint64_t win_id, size_t offset, const void *data,
                          size_t bytes, int ctx, int sig, const char *func);
void rma_net_stop(struct ncclComm *comm);

/* Frees what the communicator's windows and signals hold (destroy). */
void rma_destroy(struct ncclComm *comm);

#endif
