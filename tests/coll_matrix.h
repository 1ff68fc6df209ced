/* The collective matrix of test_coll.c, for other tests that build their
 * communicators differently (two hosts in network namespaces). */
#ifndef LOOM_COLL_MATRIX_H
#define LOOM_COLL_MATRIX_H

#include "nccl.h"

/* Runs and checks every collective x type x op x count x placement on
 * `comm`; 0 on success, and *ncalls the number of calls checked. */
int coll_matrix(ncclComm_t comm, int rank, int nranks, int *ncalls);

/* A rank's whole run: init, the matrix, a check that the next rank is
 * reached over `transport` ("net/ib"), destroy; 0 on success. */
int coll_matrix_rank(int rank, int nranks, ncclUniqueId id, const char *transport, int *ncalls);

#endif
