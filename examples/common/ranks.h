/*
 * What every example needs besides its model: start N ranks as processes
 * of one host, check NCCL calls, parse a few options, read a clock.
 *
 * ex_run_ranks forks the ranks itself, so an example runs with nothing but
 * `--ranks N`: no launcher, no MPI. Rank 0 makes the ncclUniqueId and hands
 * it to the others through pipes, each rank has a time limit (alarm), and
 * the parent exits non-zero when any rank failed.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef EX_RANKS_H
#define EX_RANKS_H

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status that means "could not run here" (no CUDA device): CTest's
 * SKIP_RETURN_CODE, as automake uses it. */
#define EX_SKIP 77

/* One rank's work; returns its exit status (0 on success). */
typedef int (*ex_rank_fn)(int rank, int nranks, const ncclUniqueId *id, void *arg);

/* Runs fn in nranks forked processes, each killed by SIGALRM after
 * timeout_s seconds, and waits for all of them. Returns 0 when every rank
 * returned 0, EX_SKIP when the ranks returned only 0 or EX_SKIP and at
 * least one EX_SKIP, and 1 otherwise, after saying on stderr which rank
 * failed and how. A failed rank gives the others a few seconds to notice
 * (they should get an error from NCCL) before they are killed. Call it
 * before anything starts threads or initialises CUDA: the children are
 * plain fork()s of the caller. */
int ex_run_ranks(const char *prog, int nranks, unsigned timeout_s, ex_rank_fn fn, void *arg);

/* The rank this process runs as (-1 in the parent), for messages. */
extern int ex_rank;

/* Prints "rank R: <what> failed at file:line: <error> (<last error>)" on
 * stderr, aborts comm when it is not NULL, and exits the rank with 1. */
void ex_nccl_fail(const char *what, ncclResult_t res, ncclComm_t comm, const char *file, int line);

/* Every NCCL call in the examples goes through this: a failure is printed
 * with ncclGetLastError and ends the rank (the parent then fails). */
#define EX_NCCL(comm, call)                                          \
  do {                                                               \
    ncclResult_t ex_res_ = (call);                                   \
    if (ex_res_ != ncclSuccess)                                      \
      ex_nccl_fail(#call, ex_res_, (comm), __FILE__, __LINE__);      \
  } while (0)

/* Host communicators block until the data is there, so one AllReduce of a
 * byte is a barrier. */
void ex_barrier(ncclComm_t comm);

/* Monotonic seconds; CLOCK_MONOTONIC is one clock for all processes of a
 * host, so timestamps of different ranks can be compared. */
double ex_now(void);
/* The CPUs this host has online. */
int ex_ncpus(void);
/* Prints a "note:" line when the timings that follow are distorted: more
 * ranks than CPUs, or a load average (other processes) above the CPUs. */
void ex_note_cpu_sharing(int nranks);

/* Command-line options: --name VALUE (or --name=VALUE) for ints, doubles
 * and strings, --name alone for flags (set to 1). --help prints them. */
typedef enum { EX_OPT_INT, EX_OPT_DOUBLE, EX_OPT_FLAG, EX_OPT_STRING } ex_opt_kind;
typedef struct {
  const char *name;   /* without the leading dashes */
  ex_opt_kind kind;
  void *value;        /* int *, double *, int * or const char ** */
  const char *help;
} ex_opt;
/* Parses argv against opts (terminated by an entry with name NULL); on an
 * unknown option or a bad value prints the usage and exits with 2. */
void ex_parse_args(int argc, char **argv, const char *summary, const ex_opt *opts);

#ifdef __cplusplus
}
#endif

#endif
