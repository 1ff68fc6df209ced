/*
 * The shm transport's segments and how they change hands (shm_seg.c), at
 * the level where each safeguard can be made to matter:
 * - a sender that gives up on the receiver's segment says so, and the
 *   receiver fails at once with the sender's sentence instead of serving
 *   it until LOOM_TIMEOUT (both processes alive, LOOM_TIMEOUT=600);
 * - segments are sealed against resizing, and an unsealed one is mapped
 *   only from the verified peer process;
 * - the socket's other end is checked (user, and pid where it is known);
 * - an answer that is malformed or whose descriptor was cut off
 *   (MSG_CTRUNC) is refused, with every descriptor it carried closed;
 * - either side's failure record reaches the other (and only for its
 *   segment);
 * - the sweep of old named segments waits an hour whatever LOOM_TIMEOUT;
 * - a process's identity survives threads and changes with fork.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "misc/utils.h"
#include "nccl.h"
#include "test.h"
#include "transport/shm_seg.h"

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n - 1; /* opendir's own */
}

static void wait_child(pid_t p, int *st) {
  while (waitpid(p, st, 0) < 0 && errno == EINTR)
    ;
}

/* ---- a sender that gives up is heard at once ---- */

enum { GIVE_UP_COUNT = 1 << 18 };

struct give_up_result {
  int res;
  double seconds;
  char err[LOOM_ERR_LEN];
};

/* Rank 0 sends to rank 1 and refuses every segment; it reports, then
 * stays alive (its communicator too) until the test lets it go, so only
 * its word can end rank 1's wait. */
static int give_up_rank(int rank, int in, int out, int go) {
  ncclComm_t comm;
  ncclUniqueId id;
  struct give_up_result g;
  memset(&g, 0, sizeof g);
  if (read(in, &id, sizeof id) != (ssize_t)sizeof id)
    return 3;
  g.res = ncclCommInitRank(&comm, 2, id, rank);
  if (g.res != ncclSuccess) {
    snprintf(g.err, sizeof g.err, "init: %s", ncclGetLastError(NULL));
    return write(out, &g, sizeof g) == (ssize_t)sizeof g ? 1 : 3;
  }
  float *buf = calloc(GIVE_UP_COUNT, sizeof *buf);
  if (!buf)
    return 3;
  double t0 = mono_s();
  if (rank == 0) {
    shm_seg_test_refuse = 1;
    g.res = ncclSend(buf, GIVE_UP_COUNT, ncclFloat, 1, comm, NULL);
  } else {
    g.res = ncclRecv(buf, GIVE_UP_COUNT, ncclFloat, 0, comm, NULL);
  }
  g.seconds = mono_s() - t0;
  snprintf(g.err, sizeof g.err, "%s", ncclGetLastError(comm));
  int rc = write(out, &g, sizeof g) == (ssize_t)sizeof g ? 0 : 3;
  char byte;
  while (read(go, &byte, 1) < 0 && errno == EINTR)
    ;
  ncclCommAbort(comm);
  free(buf);
  return rc;
}

/* One run: both ranks' results within `limit` seconds, else the ranks are
 * killed and 1 returned. */
static int give_up_run(struct give_up_result g[2], double limit) {
  ncclUniqueId id;
  int in[2][2], out[2][2], go[2][2];
  pid_t pids[2];
  /* Forked before the id, whose root is a thread of this process: a child
   * forked while it runs could inherit a lock it holds. */
  for (int r = 0; r < 2; r++) {
    ASSERT(pipe(in[r]) == 0 && pipe(out[r]) == 0 && pipe(go[r]) == 0);
    fflush(stdout);
    fflush(stderr);
    pids[r] = fork();
    ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      close(in[r][1]);
      close(out[r][0]);
      close(go[r][1]);
      _exit(give_up_rank(r, in[r][0], out[r][1], go[r][0]));
    }
    close(in[r][0]);
    close(out[r][1]);
    close(go[r][0]);
  }
  ASSERT_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < 2; r++) {
    ASSERT(write(in[r][1], &id, sizeof id) == (ssize_t)sizeof id);
    close(in[r][1]);
  }
  int late = 0;
  double start = mono_s();
  for (int r = 0; r < 2; r++) {
    struct pollfd p = {.fd = out[r][0], .events = POLLIN};
    double left = limit - (mono_s() - start);
    if (left < 0 || poll(&p, 1, (int)(left * 1000)) != 1 ||
        read(out[r][0], &g[r], sizeof g[r]) != (ssize_t)sizeof g[r]) {
      fprintf(stderr, "rank %d: no result within %.0f s\n", r, limit);
      late = 1;
    }
  }
  for (int r = 0; r < 2; r++) {
    if (late)
      kill(pids[r], SIGKILL);
    ASSERT(write(go[r][1], "x", 1) == 1 || late);
    int st;
    wait_child(pids[r], &st);
    close(out[r][0]);
    close(go[r][1]);
  }
  return late;
}

TEST_IMPL(unit_shm_sender_gives_up) {
  setenv("LOOM_DEVICE", "host", 1);
  unsetenv("NCCL_SHM_DISABLE");
  /* Only the sender's word can end the receiver's wait in time. */
  setenv("LOOM_TIMEOUT", "600", 1);
  const char *ways[] = {"1", "0"}; /* pidfd_getfd, then the socket alone */
  for (int w = 0; w < 2; w++) {
    setenv("LOOM_SHM_PIDFD_GETFD", ways[w], 1);
    struct give_up_result g[2];
    memset(g, 0, sizeof g);
    ASSERT_MSG(give_up_run(g, 20.0) == 0, "LOOM_SHM_PIDFD_GETFD=%s: a rank still waits after 20 s", ways[w]);
    printf("LOOM_SHM_PIDFD_GETFD=%s: the sender failed with \"%s\"; the receiver %.2f s later with \"%s\"\n", ways[w],
           g[0].err, g[1].seconds, g[1].err);
    ASSERT_MSG(g[0].res != ncclSuccess && strstr(g[0].err, "shm_seg_test_refuse"), "the sender: %d %s", g[0].res,
               g[0].err);
    ASSERT_MSG(g[1].res == ncclRemoteError, "the receiver returned %d", g[1].res);
    ASSERT_MSG(strstr(g[1].err, "could not map this rank's shared memory") && strstr(g[1].err, "shm_seg_test_refuse"),
               "the receiver's error does not give the sender's reason: %s", g[1].err);
    ASSERT_MSG(g[1].seconds < 10.0, "the receiver took %.1f s to learn of it", g[1].seconds);
  }
  unsetenv("LOOM_SHM_PIDFD_GETFD");
  return 0;
}

/* ---- sealed segments ---- */

TEST_IMPL(unit_shm_seg_sealed) {
  const size_t size = 1 << 16;
  int fd;
  char why[200];
  ASSERT_OK(shm_seg_create(size, 1, &fd));
  int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_MSG(seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
                               (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
             "seals 0x%x", seals);
  ASSERT_MSG(ftruncate(fd, 0) != 0 && errno == EPERM, "a segment could be shrunk");
  ASSERT_MSG(shm_seg_check(fd, size, 0, why, sizeof why) == 0, "%s", why);
  ASSERT(shm_seg_check(fd, size * 2, 1, why, sizeof why) == EINVAL);
  close(fd);
  /* What a stranger could hand over: a file it may still shrink. */
  int loose = memfd_create("stranger", MFD_CLOEXEC);
  ASSERT(loose >= 0 && ftruncate(loose, (off_t)size) == 0);
  ASSERT_MSG(shm_seg_check(loose, size, 0, why, sizeof why) == EPERM, "an unsealed file from a stranger was accepted");
  printf("unsealed, unverified: %s\n", why);
  ASSERT_MSG(shm_seg_check(loose, size, 1, why, sizeof why) == 0, "from the verified peer: %s", why);
  close(loose);
  return 0;
}

/* ---- who serves the socket ---- */

/* A child (as user `uid` where not -1) serves a fresh segment on a new
 * name until killed; the name comes back through `name`. */
static pid_t serving_child(int uid, char *name, size_t len) {
  int p[2];
  ASSERT(pipe(p) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (uid >= 0 && setresuid(uid, uid, uid) != 0)
      _exit(2);
    int seg;
    struct shm_seg_server s;
    shm_seg_server_init(&s);
    char n[64] = "";
    if (shm_seg_create(4096, 0, &seg) != ncclSuccess || shm_seg_listen(&s, 42, 0, n, sizeof n) != 0)
      _exit(3);
    if (write(p[1], n, sizeof n) != (ssize_t)sizeof n)
      _exit(4);
    for (;;) {
      char why[64];
      shm_seg_serve(&s, seg, why, sizeof why);
      usleep(1000);
    }
  }
  close(p[1]);
  char n[64] = "";
  ASSERT(read(p[0], n, sizeof n) == (ssize_t)sizeof n && n[0]);
  close(p[0]);
  snprintf(name, len, "%s", n);
  return pid;
}

static int ask_and_wait(const char *name, pid_t expect, int *fd, char *why, size_t len) {
  int sock, e = shm_seg_ask(name, 42, expect, &sock, why, len);
  if (e != 0)
    return e;
  double end = mono_s() + 10;
  while ((e = shm_seg_recv(sock, fd, why, len)) == EAGAIN && mono_s() < end)
    usleep(1000);
  close(sock);
  return e;
}

TEST_IMPL(unit_shm_seg_peer_checked) {
  char name[64], why[LOOM_ERR_LEN];
  int fd = -1, st;
  /* The pid the rank announced must be the one serving. */
  pid_t child = serving_child(-1, name, sizeof name);
  int e = ask_and_wait(name, getpid(), &fd, why, sizeof why);
  ASSERT_MSG(e == EACCES && strstr(why, "not the rank's pid"), "served by pid %d, expected this one: %d %s", (int)child,
             e, why);
  printf("another pid: %s\n", why);
  e = ask_and_wait(name, child, &fd, why, sizeof why);
  ASSERT_MSG(e == 0 && fd >= 0, "from the expected pid: %d %s", e, why);
  ASSERT_MSG(shm_seg_check(fd, 4096, 0, why, sizeof why) == 0, "%s", why);
  close(fd);
  /* The same name, asked by another pid: the owner refuses (it expects
   * no one in particular, but it does expect the token). */
  kill(child, SIGKILL);
  wait_child(child, &st);
  if (geteuid() != 0) {
    printf("not root: the check of the serving user is not tried\n");
    return 0;
  }
  /* Another user serving: a stranger that took a released name. */
  child = serving_child(65534, name, sizeof name);
  e = ask_and_wait(name, 0, &fd, why, sizeof why);
  kill(child, SIGKILL);
  wait_child(child, &st);
  ASSERT_MSG(e == EACCES && strstr(why, "of user 65534"), "a socket of user 65534 was trusted: %d %s", e, why);
  printf("another user: %s\n", why);
  return 0;
}

/* ---- malformed and truncated answers ---- */

TEST_IMPL(unit_shm_seg_bad_answer) {
  char why[LOOM_ERR_LEN];
  /* Not Loom's record, but with a descriptor: refused, the descriptor
   * closed. */
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  int before = open_fds();
  int extra = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT(extra >= 0);
  char junk[3] = "abc";
  struct iovec iov = {junk, sizeof junk};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &extra, sizeof extra);
  ASSERT(sendmsg(sv[0], &m, 0) == (ssize_t)sizeof junk);
  close(extra);
  int fd = -1;
  int e = shm_seg_recv(sv[1], &fd, why, sizeof why);
  ASSERT_MSG(e == EPROTO && fd < 0, "a malformed answer was taken: %d", e);
  ASSERT_MSG(open_fds() == before, "the malformed answer's descriptor was left open (%d -> %d)", before, open_fds());
  close(sv[0]);
  close(sv[1]);

  /* A real answer whose descriptor cannot be installed here (no free
   * descriptor): MSG_CTRUNC, refused. */
  int seg;
  struct shm_seg_server s;
  shm_seg_server_init(&s);
  char name[64];
  ASSERT_OK(shm_seg_create(4096, 0, &seg));
  ASSERT(shm_seg_listen(&s, 7, getpid(), name, sizeof name) == 0);
  int sock;
  ASSERT(shm_seg_ask(name, 7, getpid(), &sock, why, sizeof why) == 0);
  for (int i = 0; i < 100; i++)
    shm_seg_serve(&s, seg, why, sizeof why);
  struct rlimit old, low;
  ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0);
  int lowest = dup(0);
  ASSERT(lowest >= 0);
  close(lowest);
  low = old;
  low.rlim_cur = (rlim_t)lowest; /* no new descriptor fits */
  ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
  e = shm_seg_recv(sock, &fd, why, sizeof why);
  ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0);
  ASSERT_MSG(e == EPROTO && fd < 0 && strstr(why, "MSG_CTRUNC"), "a truncated answer: %d %s", e, why);
  printf("truncated: %s\n", why);
  close(sock);
  shm_seg_server_close(&s);
  close(seg);
  return 0;
}

/* ---- failures told over the socket ---- */

TEST_IMPL(unit_shm_seg_failure_records) {
  char name[64], why[LOOM_ERR_LEN];
  int seg, sock, fd = -1;
  struct shm_seg_server s;
  shm_seg_server_init(&s);
  ASSERT_OK(shm_seg_create(4096, 0, &seg));
  ASSERT(shm_seg_listen(&s, 9, getpid(), name, sizeof name) == 0);
  /* A client that gave up: the owner learns its sentence; one that names
   * another segment is not heard. */
  shm_seg_report(name, 8, getpid(), "not this segment's");
  shm_seg_report(name, 9, getpid(), "the sender's own reason");
  int failed = 0;
  for (int i = 0; i < 100 && !failed; i++)
    failed = shm_seg_serve(&s, seg, why, sizeof why);
  ASSERT_MSG(failed && strcmp(why, "the sender's own reason") == 0, "the owner heard %d \"%s\"", failed,
             failed ? why : "");
  /* The owner fails while a client waits: the client hears why, and a
   * later one is refused at once instead of waiting in the backlog. */
  ASSERT(shm_seg_ask(name, 9, getpid(), &sock, why, sizeof why) == 0);
  shm_seg_refuse(&s, "the owner's reason");
  int e = shm_seg_recv(sock, &fd, why, sizeof why);
  ASSERT_MSG(e == ECANCELED && strcmp(why, "the owner's reason") == 0, "the waiting client got %d \"%s\"", e, why);
  close(sock);
  e = shm_seg_ask(name, 9, getpid(), &sock, why, sizeof why);
  ASSERT_MSG(e == ECONNREFUSED, "a client after the owner failed got %d (%s)", e, why);
  close(seg);
  return 0;
}

/* ---- the sweep's grace ---- */

static int make_old(const char *name, time_t age) {
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0)
    return -1;
  struct timespec t[2] = {{time(NULL) - age, 0}, {time(NULL) - age, 0}};
  int ok = futimens(fd, t) == 0;
  close(fd);
  return ok ? 0 : -1;
}

TEST_IMPL(unit_shm_seg_sweep_grace) {
  /* A rank with a short timeout must not decide for a job of another
   * pid namespace, which may wait far longer. */
  setenv("LOOM_TIMEOUT", "3", 1);
  pid_t dead = fork();
  if (dead == 0)
    _exit(0);
  int st;
  wait_child(dead, &st);
  char minutes[64], hours[64], path[128];
  snprintf(minutes, sizeof minutes, "loom-%d-0-0badc0de", (int)dead);
  snprintf(hours, sizeof hours, "loom-%d-1-0badc0de", (int)dead);
  ASSERT(make_old(minutes, 600) == 0 && make_old(hours, 7200) == 0);
  shm_seg_sweep_stale();
  snprintf(path, sizeof path, "/dev/shm/%s", minutes);
  int minutes_kept = access(path, F_OK) == 0;
  unlink(path);
  snprintf(path, sizeof path, "/dev/shm/%s", hours);
  int hours_kept = access(path, F_OK) == 0;
  unlink(path);
  ASSERT_MSG(minutes_kept, "a segment untouched for 10 minutes was swept with LOOM_TIMEOUT=3");
  ASSERT_MSG(!hours_kept, "a segment of a dead pid untouched for 2 hours was kept");
  return 0;
}

/* ---- the process's identity ---- */

static void *id_thread(void *p) {
  *(uint64_t *)p = util_process_id();
  return NULL;
}

TEST_IMPL(unit_process_id) {
  uint64_t id = util_process_id(), in_thread = 0, in_child = 0;
  ASSERT(id != 0 && util_process_id() == id);
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, id_thread, &in_thread) == 0 && pthread_join(t, NULL) == 0);
  ASSERT_MSG(in_thread == id, "a thread is another process?");
  int p[2];
  ASSERT(pipe(p) == 0);
  pid_t c = fork();
  ASSERT(c >= 0);
  if (c == 0) {
    uint64_t mine = util_process_id();
    _exit(write(p[1], &mine, sizeof mine) == (ssize_t)sizeof mine ? 0 : 1);
  }
  int st;
  ASSERT(read(p[0], &in_child, sizeof in_child) == (ssize_t)sizeof in_child);
  wait_child(c, &st);
  close(p[0]);
  close(p[1]);
  ASSERT_MSG(in_child != 0 && in_child != id, "a forked child kept its parent's identity");
  ASSERT(util_pid_namespace() != 0);
  return 0;
}
