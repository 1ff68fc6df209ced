/*
 * Flat collectives on the host's arena (transport/shm_arena.h), for host
 * communicators whose ranks are all on one host. An AllReduce of a few
 * KiB: every rank posts its input in its slot, with its call's header
 * and a flag in the slot's first cache line, and once every slot is
 * posted reduces all of them, in rank order, into its output. Larger
 * ones go in rounds of a region each: every rank writes its input, and
 * after a barrier reduces its own slice of everyone's into its output
 * and its region; after a second barrier it copies the other slices'
 * results. Two barriers per round, against a ring's 2(n-1) hand-offs,
 * each of which waits for one more rank to be scheduled. A rank whose
 * buffer lies in a window every rank maps (comm->direct_wins) skips the
 * copies: the others read its input and write its output in place.
 * Where every rank is pinned to one of a few CPUs that it shares with
 * other ranks (shm_arena.h's ncpus), and no window is registered, the
 * larger ones go by CPU instead:
 * the ranks of a CPU add their data into the CPU's sum in rank order,
 * and after one barrier per round each CPU's leader adds up the CPUs'
 * sums into the CPU's result, which its other ranks copy.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_FLAT_H
#define LOOM_FLAT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/shm_arena.h"

struct work;

/* The largest AllReduce, in bytes, that every rank reduces whole from
 * the others' posted slots; above it, each rank reduces its slice. */
#define FLAT_WHOLE_MAX ARENA_SLOT_DATA

/* As exec_progress, for a work with w->flat.on. */
ncclResult_t flat_progress(struct work *w, int *moved, int *done);

/* As exec_sleep_target: the arena's generation while blocked. */
int flat_sleep_target(const struct work *w, _Atomic uint64_t **counter, uint64_t *seen, _Atomic uint32_t **sleepers);

/* While nothing moves: the error if a rank failed or exited before the
 * barrier this work waits at. */
ncclResult_t flat_check(const struct work *w);

/* While nothing moves, for any collective work of a communicator with an
 * arena: another rank's header in the arena with this call's number that
 * describes another call (the ranks' calls crossed). */
ncclResult_t flat_check_crossed(const struct work *w);

/* The first rank that has not reached the barrier, -1 if none. */
int flat_waiting_rank(const struct work *w);

void flat_describe_wait(const struct work *w, char *buf, size_t len);

#endif
