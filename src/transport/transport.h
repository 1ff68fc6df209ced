/*
 * Transports: how bytes get from one rank to another. Every connection,
 * whatever carries it, looks the same to the executor: a FIFO of
 * NCCL_STEPS slots with a tail (slots the sender posted) and a head (slots
 * the receiver released). The sender waits for a free slot, the receiver
 * for a filled one. Each slot starts with a header that says what the
 * sender thinks the operation is, so a receiver can name a mismatch.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TRANSPORT_H
#define LOOM_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/slot_hdr.h"

struct ncclComm;
struct conn;
struct pollfd;

enum conn_dir { CONN_SEND = 0, CONN_RECV = 1 };
/* Connections of different algorithms never share a FIFO, so that their
 * slots cannot interleave: rings per channel, point to point per peer,
 * trees per channel and peer, recursive doubling per peer. */
enum conn_kind { CONN_RING = 0, CONN_P2P = 1, CONN_TREE = 2, CONN_RD = 3 };

struct fifo {
  char *base;          /* NCCL_STEPS slots of `stride` bytes */
  size_t stride;       /* SLOT_HDR_BYTES + capacity */
  size_t capacity;     /* payload bytes per slot */
  _Atomic uint64_t *tail;
  _Atomic uint64_t *head;
  /* How many threads sleep on tail / head (futex on the counter's low
   * word), where the FIFO is shared memory between host ranks; NULL
   * where nobody can sleep on it (network, GPU). */
  _Atomic uint32_t *tail_sleepers;
  _Atomic uint32_t *head_sleepers;
  /* Single copy, on shared memory between host ranks: a sender may post
   * payloads of at least ref_min bytes by reference (0: never), and a
   * receiver reads such a payload from process ref_pid with
   * process_vm_readv, or with memcpy where ref_local (one process). */
  size_t ref_min;
  int ref_pid;
  int ref_local;
  /* The slots' headers apart from the slots, in host memory (net with
   * GPUDirect RDMA, whose slots are device memory); NULL where each slot
   * starts with its header. */
  char *hdrs;
};

/* After moving a FIFO counter: wakes a peer asleep on it. */
void fifo_wake(_Atomic uint64_t *counter, _Atomic uint32_t *sleepers);

static inline struct slot_hdr *fifo_hdr(const struct fifo *f, uint64_t step) {
  return (struct slot_hdr *)(f->base + (step % NCCL_STEPS) * f->stride);
}
static inline char *fifo_data(const struct fifo *f, uint64_t step) {
  return f->base + (step % NCCL_STEPS) * f->stride + SLOT_HDR_BYTES;
}

#define CONN_INFO_BYTES 256

/* A transport's operations, filled with designated initialisers. Every
 * op is there: one a transport does not need is one of the named stubs
 * below, so that callers (through the inline wrappers) never test for
 * NULL. The table is Loom's own, so it carries no size or version. */
struct transport {
  const char *name;
  /* Whether this transport can reach `peer` (both sides must agree). */
  int (*can_connect)(struct ncclComm *comm, int peer);
  /* Creates this side's resources and writes what the peer needs. */
  ncclResult_t (*setup)(struct conn *c, void *info, size_t *info_len);
  /* Uses the peer's info; returns ncclInProgress until connected. */
  ncclResult_t (*connect)(struct conn *c, const void *peer_info, size_t len);
  /* Moves posted slots (network transports); transport_no_progress where
   * memory does it. A failure is kept and returned by check, when a wait
   * needs the peer. */
  ncclResult_t (*progress)(struct conn *c);
  /* Send side: whether every posted slot has left this process. */
  int (*flushed)(struct conn *c);
  /* Called while a wait makes no progress: the error if the peer is gone. */
  ncclResult_t (*check)(struct conn *c);
  /* The failure progress recorded on this connection, if any, without
   * asking about the peer; transport_no_failure where progress cannot
   * fail. Asked of every connection of a stalled operation, not only the
   * awaited one: a failed send can leave every rank of a ring waiting on
   * a receive. */
  ncclResult_t (*failed)(struct conn *c);
  /* A count that grows while bytes move on the connection below the
   * slot level (a slot of a slow network link is under way);
   * transport_no_activity where slots are the only progress there is
   * (memory). */
  uint64_t (*activity)(struct conn *c);
  /* Receive side, for the CUDA proxy's look at connections no kernel is
   * reading: the header of the oldest slot posted and not yet released,
   * read without waiting. 1 and *out if there is one; 0 if none, or if
   * not known yet (device memory is read through a copy that a stuck
   * kernel may hold up: started now, answered at a later call). */
  int (*next_hdr)(struct conn *c, struct slot_hdr *out);
  /* For a rank with nothing else to do: the descriptors whose readiness
   * would let this connection's transfers in flight move. Fills at most
   * `max` and returns how many (0: nothing in flight), or -1 where
   * progress does not come from descriptors (memory, helper threads,
   * bytes already buffered) and the rank must not block
   * (transport_no_wait_fds, memory's transports). */
  int (*wait_fds)(struct conn *c, struct pollfd *fds, int max);
  /* What the connection is called in loomCommPeerTransport: the
   * transport's name (transport_plain_name), or more ("net/ib"). */
  const char *(*conn_name)(const struct conn *c);
  /* Tells the peer that this side failed, so it stops waiting: `why` is
   * the sentence of the failure, NULL for an abort. */
  void (*poison)(struct conn *c, const char *why);
  void (*free)(struct conn *c);
};

/* The stubs for the ops a transport does not need (transport.c). */
ncclResult_t transport_no_progress(struct conn *c);
ncclResult_t transport_no_failure(struct conn *c);
uint64_t transport_no_activity(struct conn *c);
const char *transport_plain_name(const struct conn *c);
void transport_no_poison(struct conn *c, const char *why);
int transport_no_wait_fds(struct conn *c, struct pollfd *fds, int max);
/* next_hdr of a FIFO whose counters and headers are host memory (shm,
 * net). */
int transport_fifo_next_hdr(struct conn *c, struct slot_hdr *out);

struct conn {
  const struct transport *tr;
  struct ncclComm *comm;
  int peer;
  int dir;     /* enum conn_dir */
  int kind;    /* enum conn_kind */
  int channel;
  int connected;
  struct fifo fifo;
  uint64_t step;     /* slots this side produced (send) or consumed (recv) */
  uint64_t op_seq;   /* operations this side started on the connection */
  uint64_t ref_until; /* send: the slot count the receiver must release before
                         the payloads posted by reference may change */
  void *priv;        /* the transport's own state */
  /* Bytes this side allocated for the connection (its FIFO, counters),
   * for ncclCommMemStats: device memory, and host memory (pinned or
   * shared included). Memory mapped from the peer is the peer's. */
  size_t mem_dev, mem_host;
  /* The same FIFO as a GPU sees it, on CUDA communicators: where kernels
   * read and write slots and counters (device or mapped host addresses).
   * hdrs: the slots' headers in mapped host memory, apart from the slots
   * (net with GPUDirect RDMA, where the slots are device memory and the
   * proxy reads and checks the headers); NULL where each slot starts with
   * its header. */
  struct {
    char *base;
    char *hdrs;
    /* The LL slots (LL_FIFO_BYTES after the Simple ones, slot_hdr.h);
     * NULL where the transport has none (network). */
    char *ll;
    uint64_t *tail, *head;
    /* This side's slot count as its kernels keep it (dev.h, dev_conn):
     * its own counter (the tail of a send, the head of a receive) where
     * the kernels can read it at little cost, else a word of its own in
     * this side's device memory. */
    uint64_t *step;
  } dev;
  int proxied;       /* a CUDA communicator's proxy thread drives it */
  int packed_lane;   /* the lane of the launch numbered packed_in using it (cuda_launch.c) */
  uint64_t packed_in;
  int crossed_watch; /* ... and looks at it for crossed calls */
  struct conn *next_pending;
  struct conn *next_extra; /* trees and recursive doubling: comm->extra_conns */
};

extern const struct transport transport_p2p;
extern const struct transport transport_shm;
extern const struct transport transport_net;

/* Returns the connection, creating it (not yet connected) on first use. */
ncclResult_t transport_get_conn(struct ncclComm *comm, int kind, int channel, int peer, int dir,
                                struct conn **out);

/* Connects every connection created since the last call, for all the
 * communicators of a group at once (one thread may drive several ranks). */
ncclResult_t transport_connect_pending(struct ncclComm **comms, int ncomms);

void transport_free_conn(struct conn *c);
/* Frees every connection of `comm` and forgets them, so that the next
 * use creates them anew (ncclCommSuspend); nothing may use them then. */
void transport_free_all(struct ncclComm *comm);
/* What the connections of `comm` hold: device and host bytes. */
void transport_mem(struct ncclComm *comm, uint64_t *dev, uint64_t *host);

/* What this build has, for the banner and loomTransports(). */
#if LOOM_HAVE_CUDA
#define TRANSPORTS_P2P_ "p2p "
#else
#define TRANSPORTS_P2P_ ""
#endif
#if LOOM_HAVE_IBVERBS_HEADERS
#define TRANSPORTS_IB_ " net/ib"
#else
#define TRANSPORTS_IB_ ""
#endif
#define TRANSPORTS_BUILT TRANSPORTS_P2P_ "shm net/socket" TRANSPORTS_IB_

/* Calls fn on every connection of `comm` (rings, point to point, trees
 * and recursive doubling); fn may free the one it is given. */
void transport_each_conn(struct ncclComm *comm, void (*fn)(struct conn *, void *), void *arg);
/* Tells every connection's peer that this side has failed, with the
 * sentence `why` (NULL: an abort); comm_set_error calls it through
 * comm->poison_conns. */
void transport_poison_conns(struct ncclComm *comm, const char *why);
/* The error of a connection whose peer said it failed (poisoned it),
 * quoting the peer's sentence `why` when there is one. */
ncclResult_t transport_peer_failed(struct conn *c, const char *why);

/* The sum of the activity counts of every connection of `comm`: a wait
 * that sees it change is not stalled, though no slot has moved. */
uint64_t transport_comm_activity(struct ncclComm *comm);

/* How everything outside a transport calls its ops. */
static inline ncclResult_t transport_progress(struct conn *c) { return c->tr->progress(c); }
static inline int transport_flushed(struct conn *c) { return c->tr->flushed(c); }
static inline ncclResult_t transport_check(struct conn *c) { return c->tr->check(c); }
static inline ncclResult_t transport_failed(struct conn *c) { return c->tr->failed(c); }
static inline uint64_t transport_activity(struct conn *c) { return c->tr->activity(c); }
static inline int transport_next_hdr(struct conn *c, struct slot_hdr *out) { return c->tr->next_hdr(c, out); }
static inline const char *transport_conn_name(const struct conn *c) { return c->tr->conn_name(c); }
static inline int transport_wait_fds(struct conn *c, struct pollfd *fds, int max) {
  return c->tr->wait_fds(c, fds, max);
}

#endif
