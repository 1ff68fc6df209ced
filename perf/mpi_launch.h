/*
 * The MPI launcher of the *_perf_mpi benchmarks (perf/mpi_launch.c), used
 * by common.c where LOOM_PERF_MPI is defined. Not named mpi.h, which would
 * hide MPI's own header.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PERF_MPI_LAUNCH_H
#define LOOM_PERF_MPI_LAUNCH_H

#include <stdint.h>

#include "nccl.h"

/* MPI_Init, then this process's place from MPI_COMM_WORLD (*proc of
 * *nprocs) and the unique id that world rank 0 made with ncclGetUniqueId,
 * broadcast with MPI_Bcast. Sets LOOM_LOCAL_RANK to the process's place
 * among the processes of its node, which common.c reads to pick a GPU.
 * Any failure is printed and aborts the whole MPI job. */
void perf_mpi_setup(const char *progname, int nthreads, int *proc, int *nprocs, ncclUniqueId *uid);

/* MPI_Allreduce(MPI_MAX) of one value over all processes. */
int64_t perf_mpi_max(int64_t v);

/* MPI_Finalize. */
void perf_mpi_finalize(void);

#endif
