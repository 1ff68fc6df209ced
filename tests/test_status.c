/*
 * The hang report: while ranks wait in a collective for a rank that is not
 * there (it has not called it, or it is stopped), loom-info --status and
 * SIGUSR1 say what each rank does, and name the rank the others wait on;
 * a rank that times out names it in its error.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { N = 3, LATE = 1, COUNT = 1 << 18 };

struct status_cfg {
  int release[2]; /* a byte here lets rank LATE call the collective */
  char dir[64];   /* each rank's stderr goes to dir/rank<r> */
  int stop;       /* rank LATE stops itself as it calls the collective */
};

static int late_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct status_cfg *cfg = arg;
  char path[128];
  snprintf(path, sizeof path, "%s/rank%d", cfg->dir, rank);
  RASSERT(freopen(path, "w", stderr) != NULL, "cannot write %s", path);
  setvbuf(stderr, NULL, _IONBF, 0);
  close(cfg->release[1]);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = malloc(COUNT * sizeof *buf);
  RASSERT(buf, "out of memory");
  for (int i = 0; i < COUNT; i++)
    buf[i] = (float)(rank + 1);
  /* One collective every rank makes, so that the one that follows has
   * its connections and the late rank is the only thing missing. */
  RCHECK(comm, ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, NULL));
  buf[0] = (float)(rank + 1);
  rank_signal('r');
  if (rank == LATE && !cfg->stop) {
    char b;
    RASSERT(read(cfg->release[0], &b, 1) == 1, "the test never released rank %d", rank);
  }
  /* Stopped by a signal where a debugger or a scheduler's suspend could
   * have caught it: at the call, so that it has sent nothing of it (the
   * test kills it). */
  if (rank == LATE && cfg->stop)
    raise(SIGSTOP);
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  if (cfg->stop) {
    free(buf); /* before any return: a rank that passes is leak-checked */
    /* The stopped rank never gets here before it is killed. */
    /* A copy: the message lives in the communicator, which the abort frees. */
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
    fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), msg);
    RASSERT(r == ncclRemoteError || r == ncclSystemError, "rank %d: expected an error, got %d", rank, (int)r);
    ncclCommAbort(comm);
    if (!strstr(msg, "LOOM_TIMEOUT"))
      return 3; /* it heard of another rank's timeout */
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid ", LATE);
    RASSERT(strstr(msg, want) && strstr(msg, "is stopped"), "rank %d's timeout does not name rank %d as stopped: %s",
            rank, LATE, msg);
    return 0;
  }
  RCHECK(comm, r);
  for (int i = 0; i < COUNT; i++)
    RASSERT(buf[i] == (float)(N * (N + 1) / 2), "rank %d: element %d is %g", rank, i, buf[i]);
  RCHECK(comm, ncclCommDestroy(comm));
  free(buf);
  return 0;
}

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Runs loom-info --status on the ranks until both waiting ranks show a
 * wait, or 20 s pass; the last output in out. */
static int status_until_waiting(pid_t *pids, char *out, size_t len) {
  char p[N][16];
  char *argv[N + 3] = {LOOM_TOOLS_DIR "/loom-info", "--status"};
  for (int r = 0; r < N; r++) {
    snprintf(p[r], sizeof p[r], "%d", (int)pids[r]);
    argv[2 + r] = p[r];
  }
  argv[N + 2] = NULL;
  double t0 = now_s();
  while (now_s() - t0 < 20) {
    if (harness_run(argv, out, len) == 0) {
      int waiting = 0;
      for (char *l = out; (l = strstr(l, "loom-status: rank ")) != NULL; l++) {
        char *end = strchr(l, '\n');
        int r = atoi(l + strlen("loom-status: rank "));
        if (r != LATE && end && memmem(l, (size_t)(end - l), ", waiting ", 10))
          waiting++;
      }
      if (waiting == N - 1)
        return 0;
    }
    pause_ms(100);
  }
  return 1;
}

static int file_has(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, what) != NULL;
}

static int setup(struct status_cfg *cfg, pid_t *pids, int *events) {
  snprintf(cfg->dir, sizeof cfg->dir, "/tmp/loom-status-XXXXXX");
  ASSERT(mkdtemp(cfg->dir) != NULL);
  ASSERT(pipe(cfg->release) == 0);
  ASSERT(start_ranks(N, late_rank, cfg, pids, events) == 0);
  close(cfg->release[0]);
  for (int k = 0; k < N; k++) {
    char b;
    ASSERT_MSG(read(*events, &b, 1) == 1 && b == 'r', "a rank failed before the collective");
  }
  return 0;
}

static void cleanup(struct status_cfg *cfg) { harness_remove_dir(cfg->dir); }

/* Rank 1 has not called the AllReduce the others wait in. */
TEST_IMPL(status_names_absent_rank) {
  struct status_cfg cfg = {0};
  pid_t pids[N];
  int events;
  setup(&cfg, pids, &events);
  static char out[1 << 16];
  int rc = status_until_waiting(pids, out, sizeof out);
  if (rc)
    fprintf(stderr, "the waiting ranks never showed their wait\n");
  char want[128];
  snprintf(want, sizeof want, "wait, directly or through others, on rank %d (pid %d), which has not called it", LATE,
           (int)pids[LATE]);
  if (!rc && !strstr(out, want)) {
    fprintf(stderr, "loom-info --status does not say \"%s\"\n", want);
    rc = 1;
  }
  /* Without pids it finds them among all the host's processes. */
  char *all[] = {LOOM_TOOLS_DIR "/loom-info", "--status", NULL};
  char mine[64];
  snprintf(mine, sizeof mine, "rank %d/%d pid %d on ", LATE, N, (int)pids[LATE]);
  if (!rc && (harness_run(all, out, sizeof out) != 0 || !strstr(out, mine))) {
    fprintf(stderr, "loom-info --status without pids does not list \"%s\"\n", mine);
    rc = 1;
  }
  /* SIGUSR1: each rank writes its line to its stderr. */
  for (int r = 0; r < N; r++)
    kill(pids[r], SIGUSR1);
  for (int r = 0; r < N && !rc; r++) {
    char path[128], line[64];
    snprintf(path, sizeof path, "%s/rank%d", cfg.dir, r);
    snprintf(line, sizeof line, "loom-status: rank %d/%d pid %d", r, N, (int)pids[r]);
    double t0 = now_s();
    while (!file_has(path, line) && now_s() - t0 < 10)
      pause_ms(10);
    if (!file_has(path, line) || !file_has(path, r == LATE ? "not in an operation" : "in AllReduce #1 (count 262144")) {
      fprintf(stderr, "rank %d's SIGUSR1 report is missing or wrong (want \"%s\"); its stderr:\n", r, line);
      char cmd[160];
      snprintf(cmd, sizeof cmd, "cat %s >&2", path);
      if (system(cmd) != 0)
        fprintf(stderr, "(cannot show it)\n");
      rc = 1;
    }
  }
  /* Released, the late rank joins and every rank gets the right sum. */
  char b = 1;
  ASSERT(write(cfg.release[1], &b, 1) == 1);
  close(cfg.release[1]);
  if (wait_ranks(N, pids) != 0)
    rc = 1;
  close(events);
  cleanup(&cfg);
  return rc;
}

/* Rank 1 is stopped as it calls the AllReduce: loom-info says so, and
 * the ranks that time out name it. */
TEST_IMPL(status_names_stopped_rank) {
  setenv("LOOM_TIMEOUT", "4", 1);
  struct status_cfg cfg = {.stop = 1};
  pid_t pids[N];
  int events;
  setup(&cfg, pids, &events);
  int st;
  ASSERT(waitpid(pids[LATE], &st, WUNTRACED) == pids[LATE] && WIFSTOPPED(st));
  static char out[1 << 16];
  int rc = status_until_waiting(pids, out, sizeof out);
  char want[128];
  snprintf(want, sizeof want, "on rank %d (pid %d), which is stopped", LATE, (int)pids[LATE]);
  if (rc || !strstr(out, want) || !strstr(out, "[process stopped]")) {
    fprintf(stderr, "loom-info --status does not say \"%s\"\n", want);
    rc = 1;
  }
  int named = 0;
  for (int r = 0; r < N; r++) {
    if (r == LATE)
      continue;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
      ;
    named += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    int ok = WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "grep -v ' INFO ' %s/rank%d", cfg.dir, r);
    printf("rank %d %s (status 0x%x); its stderr:\n", r, ok ? "ended as expected" : "FAILED", st);
    fflush(stdout);
    if (system(cmd) < 0)
      printf("(cannot show it)\n");
    rc |= !ok;
  }
  if (named == 0) {
    fprintf(stderr, "no rank timed out naming rank %d\n", LATE);
    rc = 1;
  }
  kill(pids[LATE], SIGKILL);
  waitpid(pids[LATE], NULL, 0);
  close(cfg.release[1]);
  close(events);
  cleanup(&cfg);
  return rc;
}
