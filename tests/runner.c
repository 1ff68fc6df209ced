/*
 * Runs one test from test_list.h in a child process of its own, in its own
 * process group, and kills the whole group when the test's time limit
 * passes, so a hang fails the test instead of the run.
 * Usage: runner NAME | runner --list
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sanitizer.h"
#include "test.h"

#ifdef RUNNER_UNIT
#define UNIT_TEST(name, timeout) int test_##name(void);
#define TEST(name, timeout)
#else
#define UNIT_TEST(name, timeout)
#define TEST(name, timeout) int test_##name(void);
#endif
#include "test_list.h"
#undef UNIT_TEST
#undef TEST

struct entry {
  const char *name;
  int (*fn)(void);
  int timeout;
};

static const struct entry entries[] = {
#ifdef RUNNER_UNIT
#define UNIT_TEST(name, timeout) {#name, test_##name, timeout},
#define TEST(name, timeout)
#else
#define UNIT_TEST(name, timeout)
#define TEST(name, timeout) {#name, test_##name, timeout},
#endif
#include "test_list.h"
#undef UNIT_TEST
#undef TEST
    {NULL, NULL, 0},
};

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifndef LOOM_TEST_TIME_SCALE
#define LOOM_TEST_TIME_SCALE 1
#endif

/* The test's process group, for the signal handler. */
static volatile pid_t test_group;

/* A runner stopped from outside (`timeout`, Ctrl-C) takes its test with
 * it: the test has a process group of its own, which the terminal's and
 * timeout's signals do not reach, and a hung test left behind spins on. */
static void stop_group(int sig) {
  if (test_group > 0)
    kill(-test_group, SIGKILL);
  signal(sig, SIG_DFL);
  raise(sig);
}

static int run(const struct entry *e) {
  const int limit = e->timeout * LOOM_TEST_TIME_SCALE;
  fflush(stdout);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    /* A runner killed outright (SIGKILL) runs no handler. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    sanitizer_settle();
    int rc = sanitizer_leak_check(e->fn());
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  setpgid(pid, pid);
  test_group = pid;
  signal(SIGTERM, stop_group);
  signal(SIGINT, stop_group);
  signal(SIGHUP, stop_group);
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  double start = mono();
  int timed_out = 0;
  if (pfd >= 0) {
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    int r;
    while ((r = poll(&p, 1, limit * 1000)) < 0 && errno == EINTR)
      ;
    timed_out = r == 0;
    close(pfd);
  }
  if (timed_out) {
    fprintf(stderr, "TIMEOUT: %s did not finish within %d s; killing its process group\n", e->name, limit);
    kill(-pid, SIGKILL);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  /* Ranks a failed test left behind must not outlive it. */
  kill(-pid, SIGKILL);
  double took = mono() - start;
  if (timed_out)
    return 1;
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "FAIL: %s killed by signal %d (%s) after %.2f s\n", e->name, WTERMSIG(st), strsignal(WTERMSIG(st)),
            took);
    return 1;
  }
  int rc = WEXITSTATUS(st);
  if (rc == TEST_SKIP)
    printf("SKIP: %s (%.2f s)\n", e->name, took);
  else if (rc == 0)
    printf("PASS: %s (%.2f s)\n", e->name, took);
  else
    fprintf(stderr, "FAIL: %s exited with %d after %.2f s\n", e->name, rc, took);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (const struct entry *e = entries; e->name; e++)
      printf("%s %d\n", e->name, e->timeout);
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: %s TEST | --list\n", argv[0]);
    return 2;
  }
  for (const struct entry *e = entries; e->name; e++)
    if (strcmp(e->name, argv[1]) == 0)
      return run(e);
  fprintf(stderr, "%s: no test named %s (see --list)\n", argv[0], argv[1]);
  return 2;
}
