/*
 * Small services: clocks and deadlines, randomness, hashing, waiting.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_UTILS_H
#define LOOM_UTILS_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"

uint64_t time_ns(void);
/* Now plus LOOM_TIMEOUT, the bound on any wait that sees no progress. */
uint64_t deadline_from_timeout(void);
int64_t timeout_seconds(void);
/* A wait's bound where it may belong to a communicator: `set_ns` is the
 * communicator's own (loomCommSetTimeout), 0 where it has none, which
 * leaves LOOM_TIMEOUT. The comm floor's comm_timeout_ns picks set_ns. */
uint64_t timeout_ns(uint64_t set_ns);
uint64_t deadline_after(uint64_t set_ns);
/* The bound as a timeout sentence names it: "1.5 s (loomCommSetTimeout)",
 * or "LOOM_TIMEOUT=600s" (loom_s: LOOM_TIMEOUT's value, passed in for the
 * threads that must not read the environment). Returns buf. */
#define TIMEOUT_NAME_LEN 64
const char *timeout_name(uint64_t set_ns, int64_t loom_s, char *buf, size_t len);

/* 64 random bits from the kernel (getrandom), for secrets. */
ncclResult_t util_random(void *buf, size_t len);

/* This process's identity among the ranks of a host: 64 random bits drawn
 * on first use and again in a forked child. A pid cannot serve: processes
 * of two pid namespaces that share a network namespace can have the same
 * one. Never 0. */
uint64_t util_process_id(void);
/* The inode of this process's pid namespace (/proc/self/ns/pid), 0 where
 * it cannot be read: pids of peers are meaningful here only where theirs
 * is the same. */
uint64_t util_pid_namespace(void);

uint64_t util_hash(const void *data, size_t len, uint64_t seed);
uint64_t util_hash_str(const char *s, uint64_t seed);

/* Spin, then yield, then sleep briefly: the state of one wait. Call
 * wait_reset when progress is made. spin_ns is how long to spin before
 * yielding, yield_ns how long to yield after that before sleeping
 * (wait_init sets them, wait_reset keeps them). */
struct waiter {
  uint32_t spins;
  uint64_t since_ns;
  uint64_t spin_ns;
  uint64_t yield_ns;
};
/* How long a wait yields before it sleeps, unless the rank is crowded on
 * one CPU (LOOM_YIELD_US, init.c). */
#define WAIT_YIELD_NS 50000ull
/* Pauses a spinning wait makes before it reads the clock. */
#define WAIT_FIRST_PAUSES 64u
/* Whether the wait is past its first pauses, where a caller may look for
 * something to sleep on. */
static inline int wait_spun(const struct waiter *w) { return w->spin_ns == 0 || w->spins >= WAIT_FIRST_PAUSES; }
void wait_init(struct waiter *w, uint64_t spin_ns, uint64_t yield_ns);
void wait_reset(struct waiter *w);
void wait_pause(struct waiter *w);
/* Like wait_pause while `*counter == seen`, but once it has yielded for
 * yield_ns, sleeps on the counter (a futex on its low word) until
 * the peer that moves it wakes this thread, at most a millisecond so the
 * caller's periodic checks still run. `sleepers` counts the sleeping
 * threads, for the peer's fifo_wake. */
void wait_sleep_on(struct waiter *w, _Atomic uint64_t *counter, uint64_t seen, _Atomic uint32_t *sleepers);
/* For a wait whose every round costs a system call (sockets): spins for
 * spin_ns from the wait's first round (not at all where spin_ns is 0),
 * yields for 100 us (or yield_ns, if longer) more, then blocks in poll() until one of the
 * descriptors is ready, at most a millisecond so the caller's periodic
 * checks still run. */
struct pollfd;
void wait_poll(struct waiter *w, struct pollfd *fds, int nfds);

/* The futex word of a 64-bit counter: its low half. */
static inline _Atomic uint32_t *util_low_word(_Atomic uint64_t *p) {
  return (_Atomic uint32_t *)p + (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__);
}
void util_futex_wake_all(_Atomic uint32_t *word);

/* Allocation helpers that record a sentence on failure. */
ncclResult_t util_calloc(void **ptr, size_t n, size_t size, const char *what);
#define UTIL_CALLOC(pp, n, what) util_calloc((void **)(pp), (n), sizeof(**(pp)), (what))

#endif
