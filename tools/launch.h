/*
 * Starting ranks as processes: the launcher behind `loomrun`, also usable by
 * tests. It makes one unique id (or reads one written by another host's
 * launcher), starts the program once per rank with the rank's environment,
 * waits for all of them, and when one fails says which and how, then stops
 * the others.
 *
 * Each rank gets, on top of the launcher's environment:
 *   LOOM_RANK=<r>          its rank in [0, nranks)
 *   LOOM_NRANKS=<n>        the number of ranks across all hosts
 *   LOOM_LOCAL_RANK=<i>    its position among the ranks started on this host
 *   LOOM_LOCAL_NRANKS=<m>  how many ranks this host starts
 *   LOOM_UNIQUE_ID=<hex>   the 256 hex digits of the unique id
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_LAUNCH_H
#define LOOM_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes loomLaunch returns besides a failing rank's own status. */
#define LOOM_LAUNCH_TIMEOUT 124   /* the timeout expired, as timeout(1) */
#define LOOM_LAUNCH_ERROR 125     /* the launcher itself failed */
#define LOOM_LAUNCH_NOEXEC 127    /* the program could not be started */

typedef struct {
  int nranks;               /* total ranks across all hosts; >= 1 */
  /* The ranks to start here, each in [0, nranks) and distinct; NULL (and
   * nlocal 0) starts all of them. */
  const int *ranks;
  int nlocal;
  double timeout_s;         /* kill everything after this long; 0: never */
  double grace_s;           /* SIGTERM to SIGKILL; 0 picks 3 s */
  /* At most one of these. id_out: write the id's hex digits and a newline
   * to this file (a FIFO is written in place, a regular file is replaced
   * atomically; "-" is stdout) before starting the ranks. id_in: take the
   * id from this file instead of making one ("-" is stdin). Both wait for
   * the other side (the file to appear, the FIFO to be opened) until
   * timeout_s, or 60 s without one. */
  const char *id_out;
  const char *id_in;
  /* The program and its arguments, NULL-terminated. A name without '/' is
   * looked up in PATH. */
  char *const *argv;
  /* Extra "NAME=VALUE" entries for every rank, NULL-terminated, or NULL. */
  char *const *extra_env;
  int verbose;              /* 1: also say what was started and how each rank ended */
  int bind;                 /* LOOM_BIND_*: where the ranks may run */
} loomLaunchOptions;

/* Where the ranks started here may run. NONE (0): wherever the launcher
 * may. CPU: the i-th rank started here on the (i mod k)-th of the k CPUs
 * the launcher may run on, each on one. AUTO: as CPU where the ranks
 * outnumber those CPUs, else as NONE. */
enum { LOOM_BIND_NONE = 0, LOOM_BIND_CPU = 1, LOOM_BIND_AUTO = 2 };

/* Runs the ranks to completion. Returns 0 when every rank exited with
 * status 0; otherwise the first failing rank's exit status (128 + signal
 * number when it was killed by a signal, 128 + the signal when the
 * launcher itself was interrupted), LOOM_LAUNCH_TIMEOUT, LOOM_LAUNCH_NOEXEC
 * or LOOM_LAUNCH_ERROR. Messages go to stderr, prefixed with `prog`.
 * While it runs, SIGCHLD, SIGINT, SIGTERM and SIGHUP are blocked in the
 * calling thread and taken with sigtimedwait; call it from the main thread
 * before other threads exist so that they inherit that mask. */
int loomLaunch(const char *prog, const loomLaunchOptions *opts);

/* Parses a rank list such as "0,1", "2-3" or "0,4-7" into a malloc'd array
 * in the order written. Returns 0, or -1 with a message in err (errlen
 * bytes) for a malformed list, a rank outside [0, nranks) or a repeat. */
int loomParseRankList(const char *list, int nranks, int **ranks, int *nlocal, char *err,
                      int errlen);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LAUNCH_H */
