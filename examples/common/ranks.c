/*
 * The examples' rank launcher and helpers (ranks.h).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include "ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int ex_rank = -1;

/* How long the other ranks get, after one failed, to report their own
 * error (an NCCL timeout or remote error) before they are killed. */
#define EX_GRACE_S 10.0

double ex_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ex_ncpus(void)
{
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void ex_note_cpu_sharing(int nranks)
{
  int ncpus = ex_ncpus();
  if (nranks > ncpus)
    printf("note: %d ranks on %d CPUs: the ranks take turns on the cores, so waiting and computing overlap "
           "on the clock and the times below are distorted\n", nranks, ncpus);
  double load = 0.0;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &load) != 1)
      load = 0.0;
    fclose(f);
  }
  if (load > ncpus)
    printf("note: load average %.1f on %d CPUs: other processes compete for the cores, so the times below "
           "are noisy\n", load, ncpus);
}

void ex_nccl_fail(const char *what, ncclResult_t res, ncclComm_t comm, const char *file, int line)
{
  fprintf(stderr, "rank %d: %s failed at %s:%d: %s (%s)\n", ex_rank, what, file, line,
          ncclGetErrorString(res), ncclGetLastError(comm));
  /* Abort rather than destroy: the peers may be gone or stuck, and abort
   * always returns. */
  if (comm)
    ncclCommAbort(comm);
  exit(1);
}

void ex_barrier(ncclComm_t comm)
{
  static unsigned char token;
  EX_NCCL(comm, ncclAllReduce(&token, &token, 1, ncclUint8, ncclMax, comm, NULL));
}

static int write_all(int fd, const void *buf, size_t n)
{
  const char *p = buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t n)
{
  char *p = buf;
  while (n > 0) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* One rank: gets (or makes) the unique id, runs fn, exits with its status.
 * pipes[r] carries the id from rank 0 to rank r (pipes[0] is unused); each
 * child closes every end but its own so that a reader sees end-of-file,
 * not a hang, when rank 0 dies before writing. */
static void run_child(int rank, int nranks, unsigned timeout_s, int (*pipes)[2], ex_rank_fn fn,
                      void *arg, pid_t parent)
{
  ex_rank = rank;
  /* A rank outlives neither a killed parent nor its time limit. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(1);
  alarm(timeout_s);
  /* Line-buffered: output is not lost when the time limit kills the rank,
   * and lines of different ranks do not interleave mid-line. */
  setvbuf(stdout, NULL, _IOLBF, 0);

  ncclUniqueId id;
  if (rank == 0) {
    for (int r = 1; r < nranks; r++)
      close(pipes[r][0]);
    /* A rank that died early must not kill rank 0 with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess)
      ex_nccl_fail("ncclGetUniqueId(&id)", res, NULL, __FILE__, __LINE__);
    for (int r = 1; r < nranks; r++) {
      if (write_all(pipes[r][1], &id, sizeof id) != 0) {
        fprintf(stderr, "rank 0: cannot hand the unique id to rank %d: %s\n", r, strerror(errno));
        exit(1);
      }
      close(pipes[r][1]);
    }
  } else {
    for (int r = 1; r < nranks; r++) {
      close(pipes[r][1]);
      if (r != rank)
        close(pipes[r][0]);
    }
    if (read_all(pipes[rank][0], &id, sizeof id) != 0) {
      fprintf(stderr, "rank %d: rank 0 exited without handing over the unique id\n", rank);
      exit(1);
    }
    close(pipes[rank][0]);
  }
  int rc = fn(rank, nranks, &id, arg);
  fflush(stdout);
  exit(rc);
}

static void describe_exit(const char *prog, int rank, int status, unsigned timeout_s, int killed_by_us)
{
  if (WIFEXITED(status)) {
    fprintf(stderr, "%s: rank %d exited with status %d\n", prog, rank, WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    if (killed_by_us)
      fprintf(stderr, "%s: rank %d was still running %.0f s after another rank failed; killed it\n",
              prog, rank, EX_GRACE_S);
    else if (sig == SIGALRM)
      fprintf(stderr, "%s: rank %d ran past its time limit of %u s (--timeout) and was killed\n", prog,
              rank, timeout_s);
    else
      fprintf(stderr, "%s: rank %d was killed by signal %d (%s)\n", prog, rank, sig, strsignal(sig));
  }
}

int ex_run_ranks(const char *prog, int nranks, unsigned timeout_s, ex_rank_fn fn, void *arg)
{
  if (nranks < 1) {
    fprintf(stderr, "%s: --ranks must be at least 1\n", prog);
    return 1;
  }
  pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
  int (*pipes)[2] = calloc((size_t)nranks, sizeof(*pipes));
  int *killed = calloc((size_t)nranks, sizeof(*killed));
  if (!pids || !pipes || !killed) {
    fprintf(stderr, "%s: out of memory\n", prog);
    return 1;
  }
  for (int r = 1; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) {
      fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
      return 1;
    }
  }
  /* Whatever the parent buffered would otherwise be printed once per child. */
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  int started = 0, failed = 0, skipped = 0;
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0)
      run_child(r, nranks, timeout_s, pipes, fn, arg, parent);
    if (pid < 0) {
      fprintf(stderr, "%s: fork of rank %d: %s\n", prog, r, strerror(errno));
      failed = 1;
      break;
    }
    pids[r] = pid;
    started++;
  }
  for (int r = 1; r < nranks; r++) {
    close(pipes[r][0]);
    close(pipes[r][1]);
  }
  if (failed)
    for (int r = 0; r < started; r++)
      kill(pids[r], SIGKILL);

  /* Poll rather than block, so that a failure starts the grace period
   * for the others and a rank stuck past it can be killed. */
  int remaining = started;
  double kill_at = 0.0;
  while (remaining > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    if (pid == 0) {
      if (kill_at > 0.0 && ex_now() > kill_at) {
        for (int r = 0; r < started; r++)
          if (pids[r] > 0 && !killed[r]) {
            kill(pids[r], SIGKILL);
            killed[r] = 1;
          }
        kill_at = 0.0;
      }
      struct timespec pause = {0, 10 * 1000 * 1000};
      nanosleep(&pause, NULL);
      continue;
    }
    int rank = -1;
    for (int r = 0; r < started; r++)
      if (pids[r] == pid)
        rank = r;
    if (rank < 0)
      continue;
    pids[rank] = 0;
    remaining--;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
      continue;
    if (WIFEXITED(status) && WEXITSTATUS(status) == EX_SKIP) {
      skipped++;
      continue;
    }
    describe_exit(prog, rank, status, timeout_s, killed[rank]);
    if (!failed)
      kill_at = ex_now() + EX_GRACE_S;
    failed++;
  }
  free(pids);
  free(pipes);
  free(killed);
  if (failed) {
    fprintf(stderr, "%s: FAILED (%d of %d ranks)\n", prog, failed, nranks);
    return 1;
  }
  return skipped ? EX_SKIP : 0;
}

static void usage(FILE *f, const char *prog, const char *summary, const ex_opt *opts)
{
  fprintf(f, "usage: %s [options]\n%s\n\noptions:\n", prog, summary);
  for (const ex_opt *o = opts; o->name; o++) {
    char value[64] = "";
    switch (o->kind) {
    case EX_OPT_INT: snprintf(value, sizeof value, " N (default %d)", *(int *)o->value); break;
    case EX_OPT_DOUBLE: snprintf(value, sizeof value, " X (default %g)", *(double *)o->value); break;
    case EX_OPT_STRING: snprintf(value, sizeof value, " S (default %s)", *(const char **)o->value); break;
    case EX_OPT_FLAG: break;
    }
    fprintf(f, "  --%s%s\n      %s\n", o->name, value, o->help);
  }
}

void ex_parse_args(int argc, char **argv, const char *summary, const ex_opt *opts)
{
  const char *prog = argv[0];
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      usage(stdout, prog, summary, opts);
      exit(0);
    }
    const ex_opt *o = NULL;
    const char *value = NULL;
    if (strncmp(arg, "--", 2) == 0) {
      for (const ex_opt *c = opts; c->name && !o; c++) {
        size_t n = strlen(c->name);
        if (strncmp(arg + 2, c->name, n) == 0 && (arg[2 + n] == '\0' || arg[2 + n] == '=')) {
          o = c;
          value = arg[2 + n] == '=' ? arg + 3 + n : NULL;
        }
      }
    }
    if (!o) {
      fprintf(stderr, "%s: unknown option %s\n", prog, arg);
      usage(stderr, prog, summary, opts);
      exit(2);
    }
    if (o->kind == EX_OPT_FLAG) {
      *(int *)o->value = 1;
      continue;
    }
    if (!value) {
      if (a + 1 >= argc) {
        fprintf(stderr, "%s: --%s needs a value\n", prog, o->name);
        exit(2);
      }
      value = argv[++a];
    }
    char *end = NULL;
    errno = 0;
    if (o->kind == EX_OPT_INT) {
      long v = strtol(value, &end, 10);
      if (errno || end == value || *end || v < -2147483647L || v > 2147483647L) {
        fprintf(stderr, "%s: --%s wants an integer, not '%s'\n", prog, o->name, value);
        exit(2);
      }
      *(int *)o->value = (int)v;
    } else if (o->kind == EX_OPT_DOUBLE) {
      double v = strtod(value, &end);
      if (errno || end == value || *end) {
        fprintf(stderr, "%s: --%s wants a number, not '%s'\n", prog, o->name, value);
        exit(2);
      }
      *(double *)o->value = v;
    } else {
      *(const char **)o->value = value;
    }
  }
}
