/*
 * The schedules as Loom built them before they were stored as loops: every
 * step expanded, in order, empty ones dropped (unit_schedule_ref.c). The
 * tests compare the loops' expansion with these step for step. Steps go to
 * a sink one at a time, so a reference for a huge count needs no memory.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_SCHED_REF_H
#define LOOM_TEST_SCHED_REF_H

#include "algorithms/schedule.h"

struct ref_sink {
  void (*push)(struct ref_sink *sink, const struct step *st);
};

void ref_ring(const struct ring_args *a, struct ref_sink *sink);
void ref_tree(int parent, int nchildren, size_t off, size_t len, size_t chunk, struct ref_sink *sink);
void ref_rd(int rank, int nranks, size_t count, struct ref_sink *sink);
void ref_p2p(int coll, size_t count, struct ref_sink *sink);

#endif
