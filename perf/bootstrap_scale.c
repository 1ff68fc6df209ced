/*
 * bootstrap_scale: how Loom's bootstrap grows with the number of ranks.
 *
 *   bootstrap_scale -n N [--threads] [--dir DIR]
 *
 * Starts N ranks on this host (processes forked before the unique id
 * exists, or with --threads threads of this process), hands them one id
 * at once, and has each run ncclCommInitRank, one small AllReduce (whose
 * connection setup also goes over the bootstrap) and ncclCommDestroy.
 * The process that made the id holds the bootstrap root, as a launcher
 * does. Prints one line of key=value figures:
 *
 *   init_max_s, init_med_s  ncclCommInitRank's time, slowest rank and median
 *   wall_s                  from handing out the id to the last rank's init
 *   first_coll_max_s        the first AllReduce (connections included)
 *   conns, conns_per_rank   TCP connections made to the ranks' and the root's
 *                           bootstrap listeners, counted from the kernel's
 *                           socket tables (/proc/net/tcp, tcp6) after the
 *                           job: each connection leaves an entry there
 *                           (established or TIME-WAIT) for 60 s, so this
 *                           counts any version of Loom the same way
 *   busiest                 connections to the busiest rank listener
 *   root_conns              connections to the root
 *   root_sent               bytes the root sent, from its INFO line
 *                           (NCCL_DEBUG_SUBSYS=BOOTSTRAP), where it has one
 *   opened_max, accepted_max  per rank, from each rank's closing INFO line
 *
 * The listeners' ports come from the ranks' INFO lines ("bootstrap: rank R
 * listens on ADDR"); the logs go to DIR (default a fresh folder in /tmp,
 * removed afterwards).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn_count.h"
#include "loom.h"
#include "nccl.h"

#define MAX_RANKS 4096
#define MAX_PORTS (MAX_RANKS + 8)

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static _Noreturn void die(const char *what, const char *detail) {
  fprintf(stderr, "bootstrap_scale: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

/* What a rank reports: when its init started and ended, its first
 * AllReduce's time, and its result. */
struct report {
  double t0, t1, coll_s;
  int code;
};

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void run_rank(int rank, int nranks, const ncclUniqueId *id, struct report *rep) {
  ncclComm_t comm;
  rep->t0 = mono_s();
  ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
  rep->t1 = mono_s();
  rep->code = r;
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRank: %s\n", rank, ncclGetLastError(NULL));
    return;
  }
  float x = 1;
  r = ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL);
  rep->coll_s = mono_s() - rep->t1;
  if (r == ncclSuccess && x != (float)nranks)
    r = ncclInternalError;
  if (r != ncclSuccess)
    fprintf(stderr, "rank %d: ncclAllReduce: %s\n", rank, ncclGetLastError(comm));
  rep->code = r;
  ncclCommDestroy(comm);
}

struct thread_arg {
  int rank, nranks;
  ncclUniqueId id;
  struct report rep;
};

static void *rank_thread(void *p) {
  struct thread_arg *a = p;
  run_rank(a->rank, a->nranks, &a->id, &a->rep);
  return NULL;
}

/* ---- counting connections ---- */

static int nports;
static unsigned ports[MAX_PORTS];
static unsigned conns[MAX_PORTS];

static int port_index(unsigned port) {
  for (int i = 0; i < nports; i++)
    if (ports[i] == port)
      return i;
  return -1;
}

static void add_port(unsigned port) {
  if (port != 0 && port_index(port) < 0 && nports < MAX_PORTS)
    ports[nports++] = port;
}

static unsigned addr_port(const char *a) {
  const char *c = strrchr(a, ':');
  return c ? (unsigned)strtoul(c + 1, NULL, 10) : 0;
}

/* Reads every log in dir: listener ports and the INFO counters. */
struct counters {
  long long root_sent;
  int opened_max, accepted_max, closes;
};

static void scan_logs(const char *dir, struct counters *c) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "cat '%s'/*.log 2>/dev/null", dir);
  FILE *f = popen(cmd, "r");
  if (!f)
    return;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    const char *p;
    char a[128];
    int r, o, acc;
    long long sent;
    if ((p = strstr(line, "bootstrap: rank ")) && sscanf(p, "bootstrap: rank %d listens on %127s", &r, a) == 2)
      add_port(addr_port(a));
    if ((p = strstr(line, "bootstrap: rank ")) &&
        sscanf(p, "bootstrap: rank %d closes: %d connection(s) opened, %d accepted", &r, &o, &acc) == 3) {
      c->opened_max = o > c->opened_max ? o : c->opened_max;
      c->accepted_max = acc > c->accepted_max ? acc : c->accepted_max;
      c->closes++;
    }
    if ((p = strstr(line, "ranks joined; it sent ")) && sscanf(p, "ranks joined; it sent %lld bytes", &sent) == 1)
      c->root_sent = sent;
  }
  pclose(f);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n = 0, threads = 0;
  const char *dir_arg = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0)
      threads = 1;
    else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
      dir_arg = argv[++i];
    else
      die("usage: bootstrap_scale -n N [--threads] [--dir DIR]; not understood", argv[i]);
  }
  if (n < 1 || n > MAX_RANKS)
    die("-n wants 1 to 4096 ranks", NULL);
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  char dir[256];
  if (dir_arg) {
    snprintf(dir, sizeof dir, "%s", dir_arg);
  } else {
    snprintf(dir, sizeof dir, "/tmp/loom-bootstrap-scale-XXXXXX");
    if (!mkdtemp(dir))
      die("cannot make a folder in /tmp", strerror(errno));
  }
  char path[400];
  /* The processes' logs, and the ids' root in this one. */
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("LOOM_DEVICE", "host", 1);
  if (!getenv("LOOM_TIMEOUT"))
    setenv("LOOM_TIMEOUT", "300", 1);
  snprintf(path, sizeof path, "%s/rank.%%p.log", dir);
  setenv("NCCL_DEBUG_FILE", path, 1);

  conn_count_snapshot();
  struct report *reps = calloc((size_t)n, sizeof *reps);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int *to = calloc((size_t)n, sizeof *to), *from = calloc((size_t)n, sizeof *from);
  if (!reps || !pids || !to || !from)
    die("out of memory", NULL);
  if (!threads) {
    for (int r = 0; r < n; r++) {
      int a[2], b[2];
      if (pipe(a) != 0 || pipe(b) != 0)
        die("pipe failed (raise the open-files limit, or use --threads)", strerror(errno));
      pid_t pid = fork();
      if (pid < 0)
        die("fork failed (use --threads)", strerror(errno));
      if (pid == 0) {
        for (int q = 0; q < r; q++) {
          close(to[q]);
          close(from[q]);
        }
        close(a[1]);
        close(b[0]);
        ncclUniqueId id;
        struct report rep = {0};
        if (read_all(a[0], &id, sizeof id) != 0)
          _exit(3);
        run_rank(r, n, &id, &rep);
        _exit(write_all(b[1], &rep, sizeof rep) == 0 && rep.code == ncclSuccess ? 0 : 1);
      }
      close(a[0]);
      close(b[1]);
      pids[r] = pid;
      to[r] = a[1];
      from[r] = b[0];
    }
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess)
    die("ncclGetUniqueId", ncclGetLastError(NULL));
  char root[128];
  loomUniqueIdRootAddress(&id, root, sizeof root);
  add_port(addr_port(root));
  unsigned root_port = addr_port(root);
  double start = mono_s();
  int failed = 0;
  if (threads) {
    struct thread_arg *ta = calloc((size_t)n, sizeof *ta);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!ta || !th)
      die("out of memory", NULL);
    for (int r = 0; r < n; r++) {
      ta[r] = (struct thread_arg){.rank = r, .nranks = n, .id = id};
      if (pthread_create(&th[r], NULL, rank_thread, &ta[r]) != 0)
        die("pthread_create failed", NULL);
    }
    for (int r = 0; r < n; r++) {
      pthread_join(th[r], NULL);
      reps[r] = ta[r].rep;
      failed |= reps[r].code != ncclSuccess;
    }
    free(ta);
    free(th);
  } else {
    for (int r = 0; r < n; r++)
      if (write_all(to[r], &id, sizeof id) != 0)
        die("a rank died before it got the id", NULL);
    for (int r = 0; r < n; r++) {
      if (read_all(from[r], &reps[r], sizeof reps[r]) != 0)
        failed = 1;
      int st;
      while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
        ;
      failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
      close(to[r]);
      close(from[r]);
    }
  }
  double *init = calloc((size_t)n, sizeof *init);
  double last = start, coll_max = 0;
  for (int r = 0; r < n; r++) {
    init[r] = reps[r].t1 - reps[r].t0;
    last = reps[r].t1 > last ? reps[r].t1 : last;
    coll_max = reps[r].coll_s > coll_max ? reps[r].coll_s : coll_max;
  }
  qsort(init, (size_t)n, sizeof *init, cmp_double);

  struct counters c = {.root_sent = -1};
  scan_logs(dir, &c);
  unsigned long nconns = conn_count_tally(ports, nports, conns);
  unsigned busiest = 0, root_conns = 0;
  for (int i = 0; i < nports; i++) {
    if (ports[i] == root_port)
      root_conns = conns[i];
    else if (conns[i] > busiest)
      busiest = conns[i];
  }
  printf("n=%d mode=%s ok=%d init_max_s=%.4f init_med_s=%.4f wall_s=%.4f first_coll_max_s=%.4f conns=%lu "
         "conns_per_rank=%.2f busiest=%u root_conns=%u listeners=%d root_sent=%lld opened_max=%d accepted_max=%d\n",
         n, threads ? "threads" : "processes", !failed, init[n - 1], init[n / 2], last - start, coll_max, nconns,
         (double)nconns / n, busiest, root_conns, nports - 1, c.root_sent, c.closes ? c.opened_max : -1,
         c.closes ? c.accepted_max : -1);
  if (!dir_arg) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      fprintf(stderr, "bootstrap_scale: could not remove %s\n", dir);
  }
  free(init);
  free(reps);
  free(pids);
  free(to);
  free(from);
  return failed;
}
