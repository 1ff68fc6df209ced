/*
 * The call agreement check (LOOM_CHECK_CALLS): before a launch runs, the
 * ranks of a host communicator all-gather a fixed-size description of the
 * collectives they called, and every rank compares all of them. Since
 * every rank sees the same descriptions, every rank reaches the same
 * verdict and refuses the call with the same sentence, before any of its
 * data has moved. Slot headers catch most mismatches without this, but
 * only on the ranks that receive from the one that differs, and not at
 * all where the difference changes who receives (a Broadcast whose ranks
 * disagree on the root).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CALL_CHECK_H
#define LOOM_CALL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

struct ncclComm;
struct task;

/* The sequence numbers of the check's own all-gathers, kept apart from the
 * collectives' so that these stay numbered as the user called them. */
#define CALL_CHECK_SEQ_BIT (1ull << 63)

#define CALL_CHECK_ITEMS 2

struct call_item {
  uint64_t count;
  int32_t root;
  uint8_t coll, dtype, op, pad;
};

/* 64 bytes, the unit the check all-gathers. */
struct call_desc {
  uint32_t magic;
  uint32_t ncolls;   /* collectives in the launch, empty ones too */
  uint64_t seq;      /* the first one's number */
  uint64_t hash;     /* of every collective's item, so later ones count too */
  struct call_item item[CALL_CHECK_ITEMS];
  uint32_t rank;
  uint32_t pad;
};

/* Whether this process checks calls (LOOM_CHECK_CALLS, read once). */
int call_check_enabled(void);

/* Describes the collectives among `tasks` (sends and receives are left to
 * the slot headers: ranks not involved call nothing); returns how many
 * there are. */
uint32_t call_check_describe(const struct task *tasks, uint64_t seq, int rank, struct call_desc *d);

/* What this rank described last, for the context of a failure during the
 * check: "AllReduce(count 8, float, sum) #3". */
void call_check_what(const struct ncclComm *comm, char *buf, size_t len);

/* Compares every rank's description (`all`, nranks of them, in rank
 * order); on a difference records the sentence and returns
 * ncclInvalidUsage. */
ncclResult_t call_check_compare(const struct ncclComm *comm, const struct call_desc *all);

#endif
