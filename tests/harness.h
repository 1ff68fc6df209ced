/*
 * Multi-rank tests: each rank is a process forked from the test, given the
 * same unique id (rank 0 makes it and hands it over through pipes), and the
 * test waits for all of them and says which failed and how.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_HARNESS_H
#define LOOM_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include "nccl.h"

typedef int (*rank_fn)(int rank, int nranks, ncclUniqueId id, void *arg);

/* Called first in every rank process, before the unique id is made or
 * read (to enter a network namespace, say); NULL for none. */
void harness_set_rank_setup(int (*setup)(int rank, void *arg));

/* Pins the calling rank process to one CPU, as loomrun --bind cpu does
 * on two: the (rank mod k)-th of the first k = min(2, available) CPUs of
 * its affinity. Returns 0, or 1 if the kernel refused. */
int harness_pin(int rank);
/* harness_pin as a rank setup (harness_set_rank_setup). */
int harness_pin_setup(int rank, void *arg);
/* How many CPUs harness_pin spreads ranks over (1 or 2). */
int harness_pin_cpus(void);

/* Runs fn in nranks processes; 0 if every rank returned 0. */
int run_ranks(int nranks, rank_fn fn, void *arg);

/* Runs fn for nranks ranks as threads of one process (forked from the
 * test, so that CUDA starts there and not in the test's process); 0 if
 * every rank returned 0. Rank functions must then use no process-wide
 * state: their own stream, no environment changes. */
int run_rank_threads(int nranks, rank_fn fn, void *arg);

/* Like run_ranks, but lets the caller watch the ranks: `pids` gets their
 * pids and `events` (if not NULL) the read end of a pipe that ranks write
 * to with rank_signal(). Call wait_ranks to collect them. */
int start_ranks(int nranks, rank_fn fn, void *arg, pid_t *pids, int *events);
int wait_ranks(int nranks, pid_t *pids);
/* Waits for the ranks' exits into status[], killing every one still
 * running limit_s after the call (a hang): 0, or 1 on a hang. At most
 * 64 ranks. */
int wait_ranks_within(int nranks, const pid_t *pids, int *status, double limit_s);
/* From inside a rank: one byte to the test's `events` pipe. */
void rank_signal(char byte);

/* Whole reads and writes on pipes: 0, or -1 on error or end of file. */
int harness_write_all(int fd, const void *buf, size_t len);
int harness_read_all(int fd, void *buf, size_t len);

/* Entries of a folder (/proc/self/fd, /proc/self/task, /dev/shm) whose
 * names start with `prefix` (NULL: all), for leak checks: the status
 * page's memfd, which lives as long as the process, and opendir's own fd
 * are not counted. */
int harness_count_entries(const char *dir, const char *prefix);
/* This process's shared-memory segments: named ones in /dev/shm, and
 * mappings of any (a segment is unlinked once both sides have it mapped,
 * so a leak shows as a mapping). */
int harness_shm_segments(void);

/* How many CUDA devices a process sees (0 without CUDA or a driver),
 * asked in a child process: a test process that initialised CUDA itself
 * could not use it in the ranks it forks. */
int harness_cuda_devices(void);

/* Sends each rank's log of the subsystems `subsys` (NCCL_DEBUG=INFO) to
 * a file of its own, /tmp/loom-<tag>-<test pid>-<rank pid>.log. */
void harness_rank_log(const char *tag, const char *subsys);

/* In a rank that run_ranks started after harness_rank_log(tag, ...): the
 * lines of its own log that contain `want`, -1 without a log; and the
 * log removed. */
int harness_rank_log_count(const char *tag, const char *want);
void harness_rank_log_remove(const char *tag);

/* harness_rank_log(tag, "NET"); `pattern` gets the files' path with %d
 * for the rank's pid. */
void harness_net_log(const char *tag, char *pattern, size_t len);

/* Removes a folder a test made (mkdtemp) and all in it; says so where it
 * cannot. */
void harness_remove_dir(const char *dir);

/* Seconds since an arbitrary start, for measuring bounds. */
double now_s(void);

/* Runs argv (a path, no search) with its stdout in a pipe and waits for
 * it: its exit status (128 + the signal if one killed it), its output in
 * out (at most len - 1 bytes, then a NUL) and on our stdout; 127 if it
 * cannot be executed. No pipe or process fails the test (exit 1).
 * harness_run_merged takes its stderr too. */
int harness_run(char *const argv[], char *out, size_t len);
int harness_run_merged(char *const argv[], char *out, size_t len);

/* ---- Test buffers for a communicator of either kind ----
 * A host communicator takes host memory and its calls are done when they
 * return; a CUDA one (loomCommIsHost says 0: every communicator of
 * loom_tests_emu, or of loom_tests on a machine with a GPU) takes device
 * memory, and its calls only queue work on the stream (the tests use the
 * NULL stream): their results are there after tbuf_sync, and failures the
 * kernel meets (a dead peer, ranks' calls that disagree) come as the
 * communicator's asynchronous error, not as the call's result. */

/* 1 for a CUDA communicator, 0 for a host one. */
int tbuf_is_cuda(ncclComm_t comm);
/* `bytes` (at least 1 allocated) of memory comm's calls take: cudaMalloc
 * for a CUDA communicator, malloc for a host one; NULL, said on stderr,
 * when that fails. */
void *tbuf_alloc(ncclComm_t comm, size_t bytes);
/* Frees what tbuf_alloc gave (NULL: nothing). Needs no communicator: it
 * may come after ncclCommDestroy, as it should after a failure, since
 * cudaFree waits for every kernel of the device. */
void tbuf_free(void *p);
/* n bytes from host memory into a tbuf, out of one into host memory, or
 * bytes set to `byte`: 0, or 1 (said on stderr) if the copy fails. For a
 * CUDA communicator these are ordered after the work queued on the NULL
 * stream, so use them after a tbuf_sync that found no error. */
int tbuf_put(ncclComm_t comm, void *dst, const void *src, size_t n);
int tbuf_get(ncclComm_t comm, void *dst, const void *src, size_t n);
int tbuf_set(ncclComm_t comm, void *dst, int byte, size_t n);
/* Waits for comm's queued work on the NULL stream, and puts the
 * communicator's asynchronous error in *async. A CUDA kernel stuck on a
 * dead or mismatched peer would keep a stream sync waiting, so this polls
 * ncclCommGetAsyncError while cudaStreamQuery says the stream is busy, and
 * returns as soon as there is an error (the kernel may still be stopping;
 * destroy or abort the communicator next). Returns 0 when the work is
 * done or an error is reported, 1 (said on stderr) when neither happened
 * within LOOM_TIMEOUT (600 s unset) + 5 s, or on a CUDA error. A host
 * communicator has nothing queued: just the asynchronous error. */
int tbuf_sync(ncclComm_t comm, ncclResult_t *async);
/* The outcome of a call on comm that returned r: r itself where it failed
 * or comm is a host one; otherwise tbuf_sync's asynchronous error, or
 * ncclInProgress when tbuf_sync gave up. */
ncclResult_t tbuf_result(ncclComm_t comm, ncclResult_t r);
/* Where this process has a CUDA device (LOOM_TEST_CUDA builds), starts the
 * runtime and its NULL stream on the current device, so that counts of
 * threads and fds taken after it do not see the runtime's first use by
 * the library as a leak; returns 1 then, else 0 and does nothing. Not in
 * a process that forks ranks afterwards (they could not use CUDA). */
int tbuf_cuda_warm(void);

/* Checks an NCCL call inside a rank: prints the call, the error string and
 * ncclGetLastError, and returns 1 from the rank function. */
#define RCHECK(comm, call)                                                              \
  do {                                                                                  \
    ncclResult_t rcheck_r_ = (call);                                                    \
    if (rcheck_r_ != ncclSuccess) {                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,          \
              ncclGetErrorString(rcheck_r_), ncclGetLastError(comm));                   \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#define RASSERT(cond, ...)                                                              \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, #cond);     \
      fprintf(stderr, __VA_ARGS__);                                                     \
      fprintf(stderr, "\n");                                                            \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#endif
