/*
 * No kill leaves a shared-memory segment behind. Ranks of one host (2 to
 * 4, over the shm transport) are killed by SIGKILL or SIGTERM at random
 * moments of ncclCommInitRank and of the first collective's connection
 * setup, 40 times over; afterwards /dev/shm must hold nothing of theirs.
 *
 * The moments: a calibration run without kills measures how long the init
 * and the first AllReduce take here. In each repetition one rank (two,
 * now and then, of 3 or 4) dies by a signal that a thread of its own
 * raises, half the time at a random moment of the init, half the time a
 * random while after the rank entered its first AllReduce. The other
 * ranks come to that call late by a random time, so that a victim often
 * dies while it waits there for them: the case that leaked, since a peer
 * that finds it dead gives up before it ever opens the victim's segment;
 * others die once the peers came, while the connections are made.
 * Half the repetitions make
 * the peers fetch segments over the Unix socket instead of pidfd_getfd
 * (LOOM_SHM_PIDFD_GETFD=0), so kills land in that path too. Survivors
 * just run on to their errors (LOOM_TIMEOUT=2 bounds a wait on a rank
 * that died in the bootstrap); a rank still running after REP_LIMIT_S is
 * a hang and fails the test.
 *
 * Also here: the socket path moves data correctly and is the one taken
 * when pidfd_getfd is switched off; the sweep of stale named segments
 * (loom-<pid>-*, as Loom made before it used memfds) removes those of dead
 * owners and nothing else; and the verbs test double's objects
 * (loomvd-*) are gone once their process ended by _exit or SIGKILL, with
 * no later allocation to sweep them.
 *
 * The seed is printed; LOOM_TEST_SEED replays one, LOOM_LEAK_REPS changes
 * the number of repetitions.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"
#ifdef LOOM_VERBS_DOUBLE_PATH
#include "vd_client.h"
#endif

enum { MAXR = 4, COUNT = 1 << 16, REPS = 40, MIN_REPS = 15 };
#define BUDGET_S 100.0   /* stop adding repetitions past this */
#define REP_LIMIT_S 30.0 /* one repetition: past it, a hang */

/* In memory the test shares with its ranks. */
struct rank_report {
  double t_start, t_init, t_first; /* now_s() at the start, after init, after the first call */
  int phase;                       /* 0 in init, 1 late before the first call, 2 in it, 3 after */
  int kill_sig;                    /* the signal this rank will raise, 0 for none */
  int kill_in_call;                /* ... kill_at seconds after entering its first call, else after t_start */
  double kill_at;
  double late;                     /* seconds this rank waits before its first call */
};

struct rep {
  int nranks;
  struct rank_report *rep;
};

static void sleep_until(double t) {
  struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

static sem_t in_call; /* posted by a victim's main thread as it enters its first call */

static void *killer(void *p) {
  struct rank_report *me = p;
  double from = me->t_start;
  if (me->kill_in_call) {
    while (sem_wait(&in_call) != 0)
      ;
    from = now_s();
  }
  sleep_until(from + me->kill_at);
  kill(getpid(), me->kill_sig);
  return NULL;
}

static int leak_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct rep *k = arg;
  struct rank_report *me = &k->rep[rank];
  me->t_start = now_s();
  if (me->kill_sig) {
    RASSERT(sem_init(&in_call, 0, 0) == 0, "sem_init");
    pthread_t th;
    RASSERT(pthread_create(&th, NULL, killer, me) == 0, "pthread_create");
  }
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, n, id, rank);
  me->t_init = now_s();
  me->phase = 1;
  if (r != ncclSuccess)
    return 0; /* a rank died in the bootstrap: what this test looks at comes after the exit */
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  sleep_until(me->t_init + me->late);
  me->phase = 2;
  if (me->kill_sig)
    sem_post(&in_call);
  r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  me->t_first = now_s();
  me->phase = 3;
  if (r == ncclSuccess)
    r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  if (r == ncclSuccess)
    ncclCommDestroy(comm);
  else
    ncclCommAbort(comm);
  free(buf);
  return 0;
}

/* Names in /dev/shm that start with prefix, joined into out. */
static int list_entries(const char *prefix, char *out, size_t len) {
  out[0] = '\0';
  DIR *d = opendir("/dev/shm");
  if (!d)
    return 0;
  int n = 0;
  size_t used = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
      continue;
    n++;
    int w = snprintf(out + used, len - used, "%s%s", used ? " " : "", e->d_name);
    if (w > 0 && (size_t)w < len - used)
      used += (size_t)w;
  }
  closedir(d);
  return n;
}

static const char *const phase_name[] = {"in the init", "before its first call", "in the first call's setup",
                                         "after the first call"};

/* One repetition: 0 if nothing is left behind and nothing hung. */
static int run_rep(struct rep *k, int *kills) {
  pid_t pids[MAXR];
  int status[MAXR] = {0};
  if (start_ranks(k->nranks, leak_rank, k, pids, NULL) != 0) {
    fprintf(stderr, "start_ranks failed\n");
    return 1;
  }
  int failed = 0;
  if (wait_ranks_within(k->nranks, pids, status, REP_LIMIT_S)) {
    fprintf(stderr, "a rank was still running %.0f s after the start: a hang\n", REP_LIMIT_S);
    failed = 1;
  }
  for (int r = 0; r < k->nranks; r++) {
    const struct rank_report *m = &k->rep[r];
    int by_sig = WIFSIGNALED(status[r]) && m->kill_sig && WTERMSIG(status[r]) == m->kill_sig;
    if (by_sig) {
      (*kills)++;
      printf("  rank %d died by %s %s (%.3f s after %s)\n", r, m->kill_sig == SIGKILL ? "SIGKILL" : "SIGTERM",
             phase_name[m->phase], m->kill_at, m->kill_in_call ? "entering the call" : "its start");
    } else if (m->kill_sig) {
      printf("  rank %d ended %s, before its %s\n", r, phase_name[m->phase],
             m->kill_sig == SIGKILL ? "SIGKILL" : "SIGTERM");
    }
    if (!by_sig && (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0)) {
      fprintf(stderr, "rank %d ended with status 0x%x\n", r, status[r]);
      failed = 1;
    }
    char prefix[32], names[1024];
    snprintf(prefix, sizeof prefix, "loom-%d-", (int)pids[r]);
    int left = list_entries(prefix, names, sizeof names);
    if (left != 0) {
      fprintf(stderr, "rank %d (pid %d, %s %s) left %d segment(s) in /dev/shm: %s\n", r, (int)pids[r],
              by_sig ? "killed" : "survived", phase_name[m->phase], left, names);
      failed = 1;
    }
  }
  return failed;
}

static double uniform(double lo, double hi) { return lo + (hi - lo) * (rand() / (RAND_MAX + 1.0)); }

TEST_IMPL(shm_leak_kill_setup) {
  setenv("LOOM_TIMEOUT", "2", 1);
  unsetenv("NCCL_SHM_DISABLE");
  const char *s = getenv("LOOM_TEST_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
  const char *reps_env = getenv("LOOM_LEAK_REPS");
  int reps = reps_env ? atoi(reps_env) : REPS;
  printf("shm_leak_kill_setup: seed %u (LOOM_TEST_SEED replays it), %d repetitions\n", seed, reps);
  struct rank_report *shared =
      mmap(NULL, sizeof *shared * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(shared != MAP_FAILED);
  srand(seed);

  /* Calibration: the same job without kills, which must leave nothing
   * either; the slowest rank's init and first call set the span. */
  struct rep k = {.nranks = MAXR, .rep = shared};
  memset(shared, 0, sizeof *shared * MAXR);
  int kills = 0;
  ASSERT_MSG(run_rep(&k, &kills) == 0, "the run without kills failed");
  double t_init = 0, t_setup = 0;
  for (int r = 0; r < MAXR; r++) {
    ASSERT_MSG(shared[r].phase == 3, "rank %d of the run without kills stopped %s", r, phase_name[shared[r].phase]);
    if (shared[r].t_init - shared[r].t_start > t_init)
      t_init = shared[r].t_init - shared[r].t_start;
    if (shared[r].t_first - shared[r].t_init > t_setup)
      t_setup = shared[r].t_first - shared[r].t_init;
  }
  double late_max = 3 * t_setup > 0.02 ? 3 * t_setup : 0.02;
  printf("calibration: init %.3f s, first call %.3f s; peers up to %.3f s late\n", t_init, t_setup, late_max);

  double t0 = now_s();
  int failed = 0, done = 0;
  for (int i = 0; i < reps && !failed; i++) {
    if (i >= MIN_REPS && now_s() - t0 > BUDGET_S && !reps_env) {
      printf("stopping after %d repetitions, %.0f s (a loaded machine)\n", i, now_s() - t0);
      break;
    }
    memset(shared, 0, sizeof *shared * MAXR);
    k.nranks = 2 + rand() % 3;
    int nvictims = k.nranks > 2 && rand() % 4 == 0 ? 2 : 1;
    int socket_only = rand() % 2;
    for (int v = 0; v < nvictims; v++) {
      int r = rand() % k.nranks;
      if (shared[r].kill_sig) {
        v--;
        continue;
      }
      shared[r].kill_sig = rand() % 2 ? SIGKILL : SIGTERM;
    }
    for (int r = 0; r < k.nranks; r++) {
      struct rank_report *m = &shared[r];
      /* A victim comes to its first call at once, its peers late. */
      m->late = m->kill_sig ? 0 : uniform(0, late_max);
      m->kill_in_call = rand() % 2;
      if (m->kill_sig)
        m->kill_at = m->kill_in_call ? uniform(0, late_max + t_setup) : uniform(0, t_init);
    }
    printf("rep %d: %d ranks, %d killed, %s\n", i, k.nranks, nvictims,
           socket_only ? "segments over the socket" : "segments by pidfd_getfd");
    if (socket_only)
      setenv("LOOM_SHM_PIDFD_GETFD", "0", 1);
    failed = run_rep(&k, &kills);
    unsetenv("LOOM_SHM_PIDFD_GETFD");
    done++;
    if (failed)
      fprintf(stderr, "repetition %d failed (seed %u)\n", i, seed);
  }
  printf("shm_leak_kill_setup: %d repetitions, %d kills, %.1f s\n", done, kills, now_s() - t0);
  munmap(shared, sizeof *shared * MAXR);
  ASSERT_MSG(failed || kills >= done / 2, "only %d of %d repetitions killed a rank: the moments miss the run", kills,
             done);
  return failed;
}

/* ---- the socket path ---- */

struct log_arg {
  char pattern[160]; /* the ranks' NCCL_DEBUG_FILE, %d for the pid */
};

static int data_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = malloc(sizeof *buf * COUNT);
  RASSERT(buf, "out of memory");
  for (size_t i = 0; i < COUNT; i++)
    buf[i] = (float)((rank + 1) * (int)(i % 7 + 1));
  RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < COUNT; i++)
    RASSERT(buf[i] == (float)(n * (n + 1) / 2 * (int)(i % 7 + 1)), "element %zu is %g", i, buf[i]);
  RCHECK(NULL, ncclCommDestroy(comm));
  free(buf);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "loom-%d-", (int)getpid());
  RASSERT(harness_count_entries("/dev/shm", prefix) == 0, "segments of this rank in /dev/shm");
  return 0;
}

/* How many of the ranks' log lines contain what. */
static int count_in_logs(const char *pattern, const pid_t *pids, int n, const char *what) {
  int hits = 0;
  for (int r = 0; r < n; r++) {
    char path[200], line[1024];
    snprintf(path, sizeof path, pattern, (int)pids[r]);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
      hits += strstr(line, what) != NULL;
    if (f)
      fclose(f);
  }
  return hits;
}

static void remove_logs(const char *pattern, const pid_t *pids, int n) {
  for (int r = 0; r < n; r++) {
    char path[200];
    snprintf(path, sizeof path, pattern, (int)pids[r]);
    unlink(path);
  }
}

/* 3 ranks on a ring: each rank maps the segments of two peers. */
static int socket_run(const char *getfd, int *by_socket, int *by_pidfd, int *refused) {
  char pattern[160], file[160];
  snprintf(pattern, sizeof pattern, "/tmp/loom-shmleak-%d-%%d.log", (int)getpid());
  snprintf(file, sizeof file, "/tmp/loom-shmleak-%d-%%p.log", (int)getpid());
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "SHM", 1);
  setenv("NCCL_DEBUG_FILE", file, 1);
  setenv("LOOM_SHM_PIDFD_GETFD", getfd, 1);
  pid_t pids[3];
  int rc = start_ranks(3, data_rank, NULL, pids, NULL);
  rc = rc ? rc : wait_ranks(3, pids);
  *by_socket = count_in_logs(pattern, pids, 3, "over its Unix socket");
  *by_pidfd = count_in_logs(pattern, pids, 3, "with pidfd_getfd");
  *refused = count_in_logs(pattern, pids, 3, "pidfd_getfd refused");
  remove_logs(pattern, pids, 3);
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_SUBSYS");
  unsetenv("NCCL_DEBUG_FILE");
  unsetenv("LOOM_SHM_PIDFD_GETFD");
  return rc;
}

TEST_IMPL(shm_leak_fd_passing) {
  unsetenv("NCCL_SHM_DISABLE");
  int sock, pidfd, refused;
  ASSERT_MSG(socket_run("0", &sock, &pidfd, &refused) == 0, "a rank failed with LOOM_SHM_PIDFD_GETFD=0");
  printf("LOOM_SHM_PIDFD_GETFD=0: %d segments over the socket, %d by pidfd_getfd\n", sock, pidfd);
  ASSERT_MSG(sock > 0 && pidfd == 0, "with pidfd_getfd off every segment comes over the socket");
  ASSERT_MSG(socket_run("1", &sock, &pidfd, &refused) == 0, "a rank failed with LOOM_SHM_PIDFD_GETFD=1");
  printf("LOOM_SHM_PIDFD_GETFD=1: %d segments by pidfd_getfd, %d over the socket (%d refused)\n", pidfd, sock,
         refused);
  /* Where the kernel or a seccomp filter refuses pidfd_getfd, the socket
   * takes over, and the log says so. */
  ASSERT_MSG(pidfd > 0 || (sock > 0 && refused > 0), "the segments came neither way");
  return 0;
}

/* ---- stale named segments ---- */

/* A pid that is dead here: a child's, reaped. */
static pid_t dead_pid(void) {
  pid_t p = fork();
  if (p == 0)
    _exit(0);
  int st;
  while (waitpid(p, &st, 0) < 0 && errno == EINTR)
    ;
  return p;
}

/* Makes /dev/shm/name, aged by `age` seconds. */
static int make_segment(const char *name, double age) {
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0)
    return -1;
  int ok = ftruncate(fd, 4096) == 0;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct timespec t[2] = {{now.tv_sec - (time_t)age, 0}, {now.tv_sec - (time_t)age, 0}};
  ok = ok && futimens(fd, t) == 0;
  close(fd);
  return ok ? 0 : -1;
}

static int exists(const char *name) {
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  return access(path, F_OK) == 0;
}

TEST_IMPL(shm_leak_stale_swept) {
  unsetenv("NCCL_SHM_DISABLE");
  setenv("LOOM_TIMEOUT", "20", 1);
  pid_t dead = dead_pid();
  char stale[64], fresh[64], alive[64], foreign[64], odd[64];
  /* Dead owner, untouched for longer than LOOM_TIMEOUT and an hour:
   * swept. */
  snprintf(stale, sizeof stale, "loom-%d-0-0badc0de", (int)dead);
  /* Dead owner here but touched just now: perhaps a live job in a pid
   * namespace that shares /dev/shm, still connecting: kept. */
  snprintf(fresh, sizeof fresh, "loom-%d-1-0badc0de", (int)dead);
  /* Old but its owner (this test) lives: kept. */
  snprintf(alive, sizeof alive, "loom-%d-2-0badc0de", (int)getpid());
  /* Not Loom's name pattern: kept whatever its age. */
  snprintf(foreign, sizeof foreign, "loom-%d-x", (int)dead);
  snprintf(odd, sizeof odd, "loom-%d-3-0badc0de-more", (int)dead);
  ASSERT(make_segment(stale, 7200) == 0 && make_segment(fresh, 0) == 0 && make_segment(alive, 3600) == 0 &&
         make_segment(foreign, 3600) == 0 && make_segment(odd, 3600) == 0);
  pid_t pids[2];
  int rc = start_ranks(2, data_rank, NULL, pids, NULL);
  rc = rc ? rc : wait_ranks(2, pids);
  int stale_left = exists(stale), fresh_kept = exists(fresh), alive_kept = exists(alive),
      foreign_kept = exists(foreign), odd_kept = exists(odd);
  const char *all[] = {stale, fresh, alive, foreign, odd};
  for (int i = 0; i < 5; i++) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", all[i]);
    unlink(path);
  }
  ASSERT_MSG(rc == 0, "a rank failed");
  ASSERT_MSG(!stale_left, "%s (dead owner, two hours old) was not swept", stale);
  ASSERT_MSG(fresh_kept, "%s (dead owner here, touched just now) was swept", fresh);
  ASSERT_MSG(alive_kept, "%s (live owner) was swept", alive);
  ASSERT_MSG(foreign_kept && odd_kept, "a name outside Loom's pattern was swept");
  return 0;
}

/* ---- the verbs test double ---- */

#ifdef LOOM_VERBS_DOUBLE_PATH
/* The janitor the double started for `owner`, or -1 if there is none
 * (any more): argv is loom-verbs-double-janitor PID START. */
static pid_t janitor_of(pid_t owner) {
  DIR *d = opendir("/proc");
  if (!d)
    return -1;
  pid_t found = -1;
  struct dirent *e;
  while (found < 0 && (e = readdir(d)) != NULL) {
    char path[300], args[512];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    ssize_t n = read(fd, args, sizeof args - 1);
    close(fd);
    if (n <= 0)
      continue;
    args[n] = '\0';
    const char *base = strrchr(args, '/');
    size_t len = strlen(args);
    if (strcmp(base ? base + 1 : args, "loom-verbs-double-janitor") == 0 && (ssize_t)len + 1 < n &&
        atoi(args + len + 1) == (int)owner)
      found = (pid_t)atoi(e->d_name);
  }
  closedir(d);
  return found;
}

/* A device, a PD, a CQ and a QP, then the end: by _exit or by SIGKILL. */
static int double_child(int how, int ready) {
  vd_env(NULL, NULL, NULL);
  struct vd_node n;
  if (vd_node_open(&n, "mlx5_0", 4096) != 0 || !vd_qp_new(&n))
    _exit(1);
  char c = 1;
  if (harness_write_all(ready, &c, 1) != 0)
    _exit(1);
  if (how == SIGKILL)
    for (;;)
      pause();
  _exit(0);
}

TEST_IMPL(shm_leak_verbs_double) {
  for (int how = 0; how < 2; how++) {
    int sig = how ? SIGKILL : 0;
    int p[2];
    ASSERT(pipe(p) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
      close(p[0]);
      double_child(sig, p[1]);
    }
    close(p[1]);
    char c;
    int made = harness_read_all(p[0], &c, 1) == 0;
    close(p[0]);
    if (made && sig)
      kill(child, sig);
    int st;
    while (waitpid(child, &st, 0) < 0 && errno == EINTR)
      ;
    ASSERT_MSG(made, "the child could not make its objects (status 0x%x)", st);
    /* The janitor removes them once the child has ended: wait for it to
     * finish (if it still runs), then look. */
    pid_t j = janitor_of(child);
    if (j > 0) {
      int pfd = (int)syscall(SYS_pidfd_open, j, 0);
      struct pollfd pf = {.fd = pfd, .events = POLLIN};
      ASSERT_MSG(pfd < 0 || poll(&pf, 1, 20000) == 1, "the janitor of pid %d still runs after 20 s", (int)child);
      if (pfd >= 0)
        close(pfd);
    }
    int left = vd_leftovers(child);
    printf("%s: %d object(s) of pid %d left in /dev/shm\n", sig ? "SIGKILL" : "_exit", left, (int)child);
    ASSERT_MSG(left == 0, "the double's objects outlived their process (%s)", sig ? "SIGKILL" : "_exit");
  }
  return 0;
}
#else
TEST_IMPL(shm_leak_verbs_double) { SKIP("the verbs test double was not built: no <infiniband/verbs.h>"); }
#endif
