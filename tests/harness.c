/* SPDX-License-Identifier: Apache-2.0 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "harness.h"
#include "loom.h"
#include "sanitizer.h"

#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int event_fd = -1;
static int (*rank_setup)(int rank, void *arg);

void harness_set_rank_setup(int (*setup)(int rank, void *arg)) { rank_setup = setup; }

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int wait_ranks_within(int n, const pid_t *pids, int *status, double limit_s) {
  enum { MAX = 64 };
  if (n > MAX) {
    fprintf(stderr, "wait_ranks_within: %d ranks, at most %d\n", n, MAX);
    exit(1);
  }
  int pfd[MAX], left = n, hung = 0;
  for (int r = 0; r < n; r++)
    pfd[r] = (int)syscall(SYS_pidfd_open, pids[r], 0);
  double t0 = now_s();
  while (left > 0) {
    struct pollfd p[MAX];
    for (int r = 0; r < n; r++)
      p[r] = (struct pollfd){.fd = pfd[r], .events = POLLIN};
    int ms = (int)((limit_s - (now_s() - t0)) * 1000);
    int got = ms > 0 ? poll(p, (nfds_t)n, ms) : 0;
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0 && !hung) {
      hung = 1;
      for (int r = 0; r < n; r++)
        if (pfd[r] >= 0)
          kill(pids[r], SIGKILL);
    }
    for (int r = 0; r < n; r++) {
      if (pfd[r] < 0 || (!hung && !(p[r].revents & POLLIN)))
        continue;
      while (waitpid(pids[r], &status[r], 0) < 0 && errno == EINTR)
        ;
      close(pfd[r]);
      pfd[r] = -1;
      left--;
    }
  }
  return hung;
}

void rank_signal(char byte) {
  if (event_fd >= 0 && write(event_fd, &byte, 1) != 1)
    perror("rank_signal");
}

int harness_write_all(int fd, const void *buf, size_t len) {
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

int harness_read_all(int fd, void *buf, size_t len) {
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

static int run_captured(char *const argv[], int merge_stderr, char *out, size_t len) {
  int p[2];
  if (pipe(p) != 0) {
    perror("harness_run: pipe");
    exit(1);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("harness_run: fork");
    exit(1);
  }
  if (pid == 0) {
    dup2(p[1], 1);
    if (merge_stderr)
      dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    execv(argv[0], argv);
    perror(argv[0]);
    _exit(127);
  }
  close(p[1]);
  size_t got = 0;
  ssize_t n;
  while ((n = read(p[0], out + got, len - 1 - got)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0)
      got += (size_t)n;
  out[got] = '\0';
  close(p[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  fputs(out, stdout);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int harness_run(char *const argv[], char *out, size_t len) { return run_captured(argv, 0, out, len); }

int harness_run_merged(char *const argv[], char *out, size_t len) { return run_captured(argv, 1, out, len); }

int start_ranks(int nranks, rank_fn fn, void *arg, pid_t *pids, int *events) {
  int (*pipes)[2] = calloc(nranks, sizeof *pipes);
  int ev[2] = {-1, -1};
  if (!pipes || (events && pipe(ev) != 0))
    return -1;
  for (int r = 0; r < nranks; r++)
    if (pipe(pipes[r]) != 0)
      return -1;
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid < 0)
      return -1;
    if (pid == 0) {
      event_fd = ev[1];
      sanitizer_settle();
      if (rank_setup && rank_setup(r, arg) != 0) {
        fprintf(stderr, "rank %d: setup failed\n", r);
        _exit(2);
      }
      ncclUniqueId id;
      if (r == 0) {
        ncclResult_t res = ncclGetUniqueId(&id);
        if (res != ncclSuccess) {
          fprintf(stderr, "rank 0: ncclGetUniqueId failed: %s: %s\n", ncclGetErrorString(res), ncclGetLastError(NULL));
          _exit(2);
        }
        for (int q = 1; q < nranks; q++)
          if (harness_write_all(pipes[q][1], &id, sizeof id) != 0)
            _exit(2);
      } else if (harness_read_all(pipes[r][0], &id, sizeof id) != 0) {
        fprintf(stderr, "rank %d: no unique id from rank 0\n", r);
        _exit(2);
      }
      for (int q = 0; q < nranks; q++) {
        close(pipes[q][0]);
        close(pipes[q][1]);
      }
      if (ev[0] >= 0)
        close(ev[0]);
      int rc = sanitizer_leak_check(fn(r, nranks, id, arg));
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  for (int q = 0; q < nranks; q++) {
    close(pipes[q][0]);
    close(pipes[q][1]);
  }
  free(pipes);
  if (events) {
    close(ev[1]);
    *events = ev[0];
  }
  return 0;
}

int wait_ranks(int nranks, pid_t *pids) {
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int st = 0;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
      ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
      continue;
    failed = 1;
    if (WIFEXITED(st))
      fprintf(stderr, "rank %d (pid %d) exited with status %d\n", r, (int)pids[r], WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
      fprintf(stderr, "rank %d (pid %d) was killed by signal %d (%s)\n", r, (int)pids[r], WTERMSIG(st),
              strsignal(WTERMSIG(st)));
  }
  return failed;
}

struct rank_thread {
  pthread_t th;
  int rank, nranks, rc;
  ncclUniqueId id;
  rank_fn fn;
  void *arg;
};

static void *rank_thread_main(void *p) {
  struct rank_thread *t = p;
  t->rc = t->fn(t->rank, t->nranks, t->id, t->arg);
  return NULL;
}

int run_rank_threads(int nranks, rank_fn fn, void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    /* Gone with the test, should the runner kill it for a hang. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct rank_thread *t = calloc((size_t)nranks, sizeof *t);
    ncclUniqueId id;
    if (!t || ncclGetUniqueId(&id) != ncclSuccess) {
      fprintf(stderr, "run_rank_threads: no memory or no unique id: %s\n", ncclGetLastError(NULL));
      _exit(1);
    }
    for (int r = 0; r < nranks; r++) {
      t[r] = (struct rank_thread){.rank = r, .nranks = nranks, .id = id, .fn = fn, .arg = arg};
      if (pthread_create(&t[r].th, NULL, rank_thread_main, &t[r]) != 0) {
        fprintf(stderr, "run_rank_threads: cannot start rank %d's thread\n", r);
        _exit(1);
      }
    }
    int failed = 0;
    for (int r = 0; r < nranks; r++) {
      pthread_join(t[r].th, NULL);
      if (t[r].rc != 0) {
        fprintf(stderr, "rank %d (a thread) returned %d\n", r, t[r].rc);
        failed = 1;
      }
    }
    fflush(stdout);
    fflush(stderr);
    _exit(failed);
  }
  return wait_ranks(1, &pid);
}

int run_ranks(int nranks, rank_fn fn, void *arg) {
  pid_t *pids = calloc(nranks, sizeof *pids);
  if (!pids || start_ranks(nranks, fn, arg, pids, NULL) != 0) {
    perror("start_ranks");
    free(pids);
    return 1;
  }
  int rc = wait_ranks(nranks, pids);
  free(pids);
  return rc;
}

/* Entries of a /proc or /dev folder, except the status page's memfd,
 * which stays for the process's life once made (src/status.h). */
int harness_count_entries(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || (prefix && strncmp(e->d_name, prefix, strlen(prefix)) != 0))
      continue;
    if (strcmp(dir, "/proc/self/fd") == 0) {
      char path[300], link[128];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      ssize_t k = readlink(path, link, sizeof link - 1);
      link[k > 0 ? k : 0] = '\0';
      if (strstr(link, "memfd:loom-status"))
        continue;
    }
    n++;
  }
  closedir(d);
  return n - (strcmp(dir, "/proc/self/fd") == 0); /* opendir's own */
}

int harness_shm_segments(void) {
  char mine[32]; /* this process's own segments: other tests may run */
  snprintf(mine, sizeof mine, "loom-%d-", (int)getpid());
  int n = harness_count_entries("/dev/shm", mine);
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    /* Segments are memfds now (an unnamed /dev/shm inode where memfds are
     * refused); named ones are what older builds made. */
    n += strstr(line, "memfd:loom-shm") || strstr(line, "/dev/shm/loom-") || strstr(line, "/dev/shm/#");
  if (f)
    fclose(f);
  return n;
}

void harness_rank_log(const char *tag, const char *subsys) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
  char file[160];
  snprintf(file, sizeof file, "/tmp/loom-%s-%d-%%p.log", tag, (int)getpid());
  setenv("NCCL_DEBUG_FILE", file, 1);
}

/* A rank's own log: its parent is the test that set the file's name. */
static void rank_log_path(const char *tag, char *path, size_t len) {
  snprintf(path, len, "/tmp/loom-%s-%d-%d.log", tag, (int)getppid(), (int)getpid());
}

int harness_rank_log_count(const char *tag, const char *want) {
  char path[200], line[4096];
  rank_log_path(tag, path, sizeof path);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, want) != NULL;
  fclose(f);
  return n;
}

void harness_rank_log_remove(const char *tag) {
  char path[200];
  rank_log_path(tag, path, sizeof path);
  unlink(path);
}

void harness_net_log(const char *tag, char *pattern, size_t len) {
  harness_rank_log(tag, "NET");
  snprintf(pattern, len, "/tmp/loom-%s-%d-%%d.log", tag, (int)getpid());
}

#if LOOM_TEST_CUDA
#include "misc/gpurt.h"

int harness_cuda_devices(void) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0)
    return 0;
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
      n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}
#else
int harness_cuda_devices(void) { return 0; }
#endif

/* ---- test buffers ---- */

int tbuf_is_cuda(ncclComm_t comm) {
  int is_host = 1;
  return loomCommIsHost(comm, &is_host) == ncclSuccess && !is_host;
}

/* What tbuf_alloc got from cudaMalloc, so that tbuf_free needs no
 * communicator. */
enum { TBUF_MAX = 64 };
static void *tbuf_dev[TBUF_MAX];
static pthread_mutex_t tbuf_mu = PTHREAD_MUTEX_INITIALIZER; /* ranks may be threads */

static void tbuf_cuda_fail(const char *what, const char *err) { fprintf(stderr, "%s failed: %s\n", what, err); }

void *tbuf_alloc(ncclComm_t comm, size_t bytes) {
  bytes = bytes ? bytes : 1;
  if (!tbuf_is_cuda(comm)) {
    void *p = malloc(bytes);
    if (!p)
      fprintf(stderr, "tbuf_alloc: no memory for %zu bytes\n", bytes);
    return p;
  }
#if LOOM_TEST_CUDA
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    tbuf_cuda_fail("tbuf_alloc: cudaMalloc", cudaGetErrorString(e));
    return NULL;
  }
  pthread_mutex_lock(&tbuf_mu);
  for (int i = 0; i < TBUF_MAX; i++)
    if (!tbuf_dev[i]) {
      tbuf_dev[i] = p;
      pthread_mutex_unlock(&tbuf_mu);
      return p;
    }
  pthread_mutex_unlock(&tbuf_mu);
  cudaFree(p);
  fprintf(stderr, "tbuf_alloc: more than %d device buffers at once\n", TBUF_MAX);
#else
  fprintf(stderr, "tbuf_alloc: a CUDA communicator, but the tests were built without CUDA\n");
#endif
  return NULL;
}

void tbuf_free(void *p) {
  if (!p)
    return;
#if LOOM_TEST_CUDA
  int dev = 0;
  pthread_mutex_lock(&tbuf_mu);
  for (int i = 0; i < TBUF_MAX && !dev; i++)
    if (tbuf_dev[i] == p) {
      tbuf_dev[i] = NULL;
      dev = 1;
    }
  pthread_mutex_unlock(&tbuf_mu);
  if (dev) {
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess)
      tbuf_cuda_fail("tbuf_free: cudaFree", cudaGetErrorString(e));
    return;
  }
#endif
  free(p);
}

static int tbuf_copy(ncclComm_t comm, void *dst, const void *src, size_t n, int to_dev) {
  if (!tbuf_is_cuda(comm)) {
    memcpy(dst, src, n);
    return 0;
  }
#if LOOM_TEST_CUDA
  cudaError_t e = cudaMemcpy(dst, src, n, to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (e == cudaSuccess)
    return 0;
  tbuf_cuda_fail(to_dev ? "tbuf_put: cudaMemcpy" : "tbuf_get: cudaMemcpy", cudaGetErrorString(e));
#endif
  return 1;
}

int tbuf_put(ncclComm_t comm, void *dst, const void *src, size_t n) { return tbuf_copy(comm, dst, src, n, 1); }
int tbuf_get(ncclComm_t comm, void *dst, const void *src, size_t n) { return tbuf_copy(comm, dst, src, n, 0); }

int tbuf_set(ncclComm_t comm, void *dst, int byte, size_t n) {
  if (!tbuf_is_cuda(comm)) {
    memset(dst, byte, n);
    return 0;
  }
#if LOOM_TEST_CUDA
  cudaError_t e = cudaMemset(dst, byte, n);
  if (e == cudaSuccess)
    return 0;
  tbuf_cuda_fail("tbuf_set: cudaMemset", cudaGetErrorString(e));
#endif
  return 1;
}

int tbuf_sync(ncclComm_t comm, ncclResult_t *async) {
  *async = ncclSuccess;
  if (!tbuf_is_cuda(comm))
    return ncclCommGetAsyncError(comm, async) != ncclSuccess;
#if LOOM_TEST_CUDA
  const char *t = getenv("LOOM_TIMEOUT");
  double limit = (t ? atof(t) : 600.0) + 5.0, t0 = now_s();
  for (;;) {
    cudaError_t e = cudaStreamQuery(NULL);
    if (ncclCommGetAsyncError(comm, async) != ncclSuccess)
      return 1;
    if (*async != ncclSuccess || e == cudaSuccess)
      return 0;
    if (e != cudaErrorNotReady) {
      tbuf_cuda_fail("tbuf_sync: cudaStreamQuery", cudaGetErrorString(e));
      return 1;
    }
    if (now_s() - t0 > limit) {
      fprintf(stderr, "tbuf_sync: the stream still runs after %.0f s, and no error\n", limit);
      return 1;
    }
    usleep(1000);
  }
#else
  return 1;
#endif
}

ncclResult_t tbuf_result(ncclComm_t comm, ncclResult_t r) {
  if (r != ncclSuccess || !tbuf_is_cuda(comm))
    return r;
  ncclResult_t async;
  return tbuf_sync(comm, &async) ? ncclInProgress : async;
}

#if LOOM_TEST_CUDA
int tbuf_cuda_warm(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return 0;
  }
  cudaFree(NULL);
  cudaStreamQuery(NULL);
  return 1;
}
#else
int tbuf_cuda_warm(void) { return 0; }
#endif

void harness_remove_dir(const char *dir) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

/* The first two CPUs of this process's affinity; 0 where it is unknown. */
static int pin_choices(int cpu[2]) {
  cpu_set_t have;
  if (sched_getaffinity(0, sizeof have, &have) != 0)
    return 0;
  int k = 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &have))
      cpu[k++] = c;
  return k;
}

int harness_pin_setup(int rank, void *arg) {
  (void)arg;
  return harness_pin(rank);
}

int harness_pin_cpus(void) {
  int cpu[2];
  return pin_choices(cpu);
}

int harness_pin(int rank) {
  int cpu[2], k = pin_choices(cpu);
  if (k == 0)
    return 1;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu[rank % k], &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) {
    fprintf(stderr, "rank %d: cannot pin to CPU %d: %s\n", rank, cpu[rank % k], strerror(errno));
    return 1;
  }
  return 0;
}
