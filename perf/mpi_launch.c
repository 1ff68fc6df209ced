/*
 * The benchmarks' MPI launcher, as nccl-tests built with MPI=1: whatever
 * started the processes (mpirun, srun, a batch system's PMI), MPI says
 * which process this is, and world rank 0 hands its unique id to the
 * others with MPI_Bcast. MPI carries nothing else of the benchmark but the
 * final verdict (common.c): the timed collectives and the values combined
 * per size go through the communicator under test, as under loomrun.
 *
 * Only the main thread calls MPI (the ranks' threads never do), so
 * MPI_THREAD_FUNNELED is enough.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "mpi_launch.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static _Noreturn void mpi_fail(const char *progname, int wrank, const char *what, int code) {
  char err[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (code != MPI_SUCCESS) MPI_Error_string(code, err, &len);
  fprintf(stderr, "%s: MPI rank %d: %s%s%s\n", progname, wrank, what, err[0] ? ": " : "", err);
  fflush(stderr);
  /* The other processes wait in MPI (the id's broadcast) or in the
   * library for this one: only MPI_Abort ends all of them. */
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

void perf_mpi_setup(const char *progname, int nthreads, int *proc, int *nprocs, ncclUniqueId *uid) {
  int provided = 0;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) {
    fprintf(stderr, "%s: MPI_Init_thread failed (%d): is this run under mpirun or srun?\n", progname, rc);
    exit(1);
  }
  int wrank = 0, wsize = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  if (provided < MPI_THREAD_FUNNELED)
    mpi_fail(progname, wrank, "the MPI library does not provide MPI_THREAD_FUNNELED", MPI_SUCCESS);
  if (wsize > INT_MAX / nthreads) mpi_fail(progname, wrank, "too many ranks: MPI processes times -t", MPI_SUCCESS);

  /* The GPU of a rank follows its place among the processes of its node,
   * which MPI knows better than any launcher's variables (OMPI_*, SLURM_*
   * or PMI_* depending on who started us). */
  MPI_Comm node;
  rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) mpi_fail(progname, wrank, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed", rc);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  char buf[16];
  snprintf(buf, sizeof buf, "%d", local);
  setenv("LOOM_LOCAL_RANK", buf, 1);

  /* A job started with NCCL_COMM_ID is joinable only by processes that
   * hold LOOM_SECRET: unless the user gave one, rank 0 draws it and MPI
   * hands it out, as the unique id below. */
  char secret[65] = "";
  if (wrank == 0 && !(getenv("LOOM_SECRET") && getenv("LOOM_SECRET")[0]) &&
      !(getenv("LOOM_SECRET_FILE") && getenv("LOOM_SECRET_FILE")[0])) {
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
      mpi_fail(progname, wrank, "cannot draw a random LOOM_SECRET", MPI_SUCCESS);
    for (size_t i = 0; i < sizeof raw; i++)
      snprintf(secret + 2 * i, 3, "%02x", raw[i]);
    /* explicit_bzero: a zeroing the compiler keeps (the benchmarks do
     * not link libcrypto for OPENSSL_cleanse). */
    explicit_bzero(raw, sizeof raw);
  }
  rc = MPI_Bcast(secret, (int)sizeof secret, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) mpi_fail(progname, wrank, "MPI_Bcast of LOOM_SECRET failed", rc);
  /* setenv keeps its own copy, which Loom reads. */
  if (secret[0]) setenv("LOOM_SECRET", secret, 1);
  explicit_bzero(secret, sizeof secret);

  if (wrank == 0) {
    ncclResult_t res = ncclGetUniqueId(uid);
    if (res != ncclSuccess) {
      char what[512];
      snprintf(what, sizeof what, "ncclGetUniqueId failed: %s: %s", ncclGetErrorString(res), ncclGetLastError(NULL));
      mpi_fail(progname, wrank, what, MPI_SUCCESS);
    }
  }
  rc = MPI_Bcast(uid, (int)sizeof *uid, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) mpi_fail(progname, wrank, "MPI_Bcast of the unique id failed", rc);
  *proc = wrank;
  *nprocs = wsize;
}

int64_t perf_mpi_max(int64_t v) {
  int64_t out = v;
  int rc = MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) {
    int wrank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    mpi_fail("perf", wrank, "MPI_Allreduce of the result failed", rc);
  }
  return out;
}

void perf_mpi_finalize(void) { MPI_Finalize(); }
