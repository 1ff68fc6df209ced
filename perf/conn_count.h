/*
 * Connections made to a set of listening ports, counted in the kernel's
 * TCP tables (/proc/net/tcp and tcp6): each connection leaves an entry
 * there (established, or TIME-WAIT for 60 s) whatever a library says of
 * itself, so old and new code are counted alike. Used by
 * perf/bootstrap_scale.c and tests/test_bootstrap_conns.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CONN_COUNT_H
#define LOOM_CONN_COUNT_H

/* Records the connections already in the tables: a listener may get a
 * port that an earlier connection used and left in TIME-WAIT, and that
 * connection is none of the job's. */
void conn_count_snapshot(void);

/* Adds to conns[i] the connections made to ports[i] since the snapshot,
 * for i < n; returns the connections counted in all. */
unsigned long conn_count_tally(const unsigned *ports, int n, unsigned *conns);

#endif
