/*
 * The host's arena: one shared-memory segment that every rank of a host
 * communicator maps when all its ranks are on one host, for the flat
 * algorithms (exec/flat.c). Each rank owns a region per buffer to write
 * its data in, a line to say which barrier it reached and the header of
 * its call; a barrier is one shared count that the last rank to arrive
 * turns into a new generation, waking the ranks asleep on it. A ring
 * pays n-1 hand-offs per half of an AllReduce, each waiting for the next
 * rank to be scheduled; a barrier waits for all of them at once.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SHM_ARENA_H
#define LOOM_SHM_ARENA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/slot_hdr.h"

struct ncclComm;

/* A barrier of more ranks than this costs more than a tree's steps. */
#define ARENA_MAX_RANKS 64

/* Flat by CPU (exec/flat.c) for ranks pinned to at most this many CPUs:
 * each CPU's leader reads every CPU's sum. */
#define ARENA_MAX_CPUS 4

/* A small call's data posted with its header and a flag, so that a peer
 * reads all three in the cache lines it polls, with no shared count. */
#define ARENA_SLOT_DATA 4096

struct arena_slot {
  _Atomic uint64_t flag;      /* 1 + the round whose data the slot holds */
  struct slot_hdr hdr;
  char data[ARENA_SLOT_DATA];
  char pad[24];
};

/* A round's call, written under its flag as a slot's header is: another
 * rank's stall check reads both without waiting (arena_hdr_read). */
struct arena_call {
  _Atomic uint64_t flag;      /* 1 + the round, 0 while being written */
  struct slot_hdr hdr;
  /* Where the rank's buffers lie in a window every rank maps
   * (comm->direct_wins), read and written in place by the other ranks:
   * the window's id and the offset in it; id 0: the data goes through
   * the rank's regions. */
  uint32_t src_win, dst_win;
  uint64_t src_off, dst_off;
};

struct arena_rank {
  _Atomic uint64_t arrived;   /* barriers this rank has reached */
  uint64_t pad[7];
  struct arena_call call[2];  /* its call, per buffer (rounds that meet at barriers) */
  struct arena_slot slot[2];  /* per buffer */
};

/* Writing a header (and a slot's data) under its flag: 0 first, the
 * round's flag last, so that a reader that sees the same non-zero flag
 * before and after its copy has a whole header. */
static inline void arena_hdr_begin(_Atomic uint64_t *flag) {
  atomic_store_explicit(flag, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static inline void arena_hdr_end(_Atomic uint64_t *flag, uint64_t use) {
  atomic_store_explicit(flag, use + 1, memory_order_release);
}

/* A peer's header read while it may be writing it: 1 and *out where the
 * copy is whole, 0 where it is being written (or was never). */
static inline int arena_hdr_read(_Atomic uint64_t *flag, const volatile struct slot_hdr *h, struct slot_hdr *out) {
  uint64_t f1 = atomic_load_explicit(flag, memory_order_acquire);
  out->count = h->count;
  out->bytes = h->bytes;
  out->coll = h->coll;
  out->dtype = h->dtype;
  out->op = h->op;
  out->where = h->where;
  out->root = h->root;
  out->sender = h->sender;
  out->seq = h->seq;
  atomic_thread_fence(memory_order_acquire);
  return f1 != 0 && atomic_load_explicit(flag, memory_order_relaxed) == f1;
}

/* One CPU's ranks in a flat call by CPU: each round they add their data
 * to the CPU's sum in rank order, and after the barrier the CPU's leader
 * adds up the CPUs' sums into the CPU's result, which the others copy. */
struct arena_cpu {
  _Atomic uint64_t added;          /* data added to the sum, all rounds (futex on its low word) */
  _Atomic uint32_t added_sleepers;
  uint32_t pad0;
  uint64_t pad1[6];
  _Atomic uint64_t ready;          /* rounds whose result is written (futex on its low word) */
  _Atomic uint32_t ready_sleepers;
  uint32_t pad2;
  uint64_t pad3[6];
};

struct arena_head {
  uint64_t magic;
  uint32_t nranks, pad0;
  uint64_t region;            /* bytes of each rank's region in each buffer */
  uint64_t pad1[5];
  _Atomic uint64_t total;     /* arrivals at barriers, all ranks together */
  uint64_t pad2[7];
  _Atomic uint64_t gen;       /* barriers completed (futex on its low word) */
  _Atomic uint32_t sleepers;  /* ranks asleep on gen */
  _Atomic int32_t failed;     /* 1 + the first rank that failed, 0: none; set once `why` is written */
  _Atomic int32_t claimed;    /* 1 + the rank that writes `why`: one writer, before `failed` */
  _Alignas(64) _Atomic uint64_t posted; /* slots posted, all ranks together (futex on its low word) */
  _Atomic uint32_t posted_sleepers;
  char why[1024];             /* that rank's sentence ("" for an abort) */
  _Alignas(64) struct arena_cpu cpu[ARENA_MAX_CPUS];
};

/* A rank's view of the arena; the counters are its own, moved alike by
 * every rank since all make the same calls. */
struct shm_arena {
  struct arena_head *head;
  struct arena_rank *ranks;
  char *data;                 /* 2 buffers x nranks regions */
  size_t region, map_size;
  int nranks, me;
  uint64_t bar;               /* barriers this rank has entered */
  uint64_t use;               /* rounds of data this rank has written */
  /* The flat call under way (one at a time): each rank's buffers where
   * its call header places them in a window, as this process sees them;
   * NULL where they go through its regions. */
  const char **peer_src;
  char **peer_dst;
  int said_direct; /* the log told the first call that found some */
  /* Flat by CPU, where every rank is pinned to one of at most
   * ARENA_MAX_CPUS CPUs that other ranks share: ncpus of them (0: not
   * by CPU), this rank's CPU (its index among them, by first rank) and
   * place on it, the rank before it there (-1: the first, its leader),
   * the ranks on its CPU, its leader, the bytes of a round per CPU, and
   * the rounds done by CPU (alike on every rank). */
  int ncpus, cpu, cpu_pos, cpu_prev, cpu_ranks, cpu_leader;
  int cpu_of[ARENA_MAX_RANKS]; /* each rank's CPU, by index */
  size_t cpu_round;
  uint64_t cpu_rounds;
};

/* A CPU's sum and result buffers of round `use`, by CPU: in the space
 * of that round's regions (arena_region), so that a round by CPU after
 * one by slices (buffers in symmetric windows) never writes where the
 * ranks may still read the last round's regions. */
static inline char *arena_cpu_sum(const struct shm_arena *a, uint64_t use, int cpu) {
  return a->data + (use & 1) * (size_t)a->nranks * a->region + (size_t)cpu * a->cpu_round;
}

static inline char *arena_cpu_result(const struct shm_arena *a, uint64_t use, int cpu) {
  return a->data + (use & 1) * (size_t)a->nranks * a->region + ((size_t)a->ncpus + (size_t)cpu) * a->cpu_round;
}

/* Moves a CPU's counter (added or ready) on and wakes its sleepers. */
void arena_cpu_move(_Atomic uint64_t *counter, _Atomic uint32_t *sleepers);

/* Sets up comm->arena where every rank is on one host, a host
 * communicator, shared memory allowed and LOOM_SHM_FLAT on every rank:
 * rank 0 makes the segment, the others map it, and all agree that all
 * could. Where one cannot, nobody uses it (the SHM log says why) and the
 * call still succeeds: the other algorithms remain. Collective: every
 * rank calls it at the same point of init. */
ncclResult_t arena_setup(struct ncclComm *comm);

/* Unmaps it (comm_destroy). */
void arena_free(struct ncclComm *comm);

/* This rank failed: the others waiting at a barrier stop with `why`
 * (NULL for an abort). The first failure is the one they quote. */
void arena_poison(struct ncclComm *comm, const char *why);

static inline char *arena_region(const struct shm_arena *a, uint64_t use, int rank) {
  return a->data + ((use & 1) * (size_t)a->nranks + (size_t)rank) * a->region;
}

/* Enters the next barrier (after this rank's writes for it) and returns
 * its number; never blocks. */
uint64_t arena_arrive(struct shm_arena *a);

static inline int arena_passed(const struct shm_arena *a, uint64_t b) {
  return atomic_load_explicit(&a->head->gen, memory_order_acquire) > b;
}

/* Posts this rank's slot of round `use` (its data and header written
 * after arena_hdr_begin on its flag): the flag, then the count that
 * sleepers wait on. */
void arena_post(struct shm_arena *a, uint64_t use);

static inline int arena_slot_posted(const struct shm_arena *a, int rank, uint64_t use) {
  return atomic_load_explicit(&a->ranks[rank].slot[use & 1].flag, memory_order_acquire) == use + 1;
}

/* The sentence of a rank that failed (arena_poison) while this one waits;
 * ncclSuccess where none has. */
ncclResult_t arena_failed(struct ncclComm *comm);

#endif
