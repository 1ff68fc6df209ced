/*
 * loom-verbs-double-janitor: removes what a process of the verbs test
 * double left in /dev/shm once that process has ended, however it ended
 * (killed, or by _exit, which runs no destructor). The double starts one
 * per process that makes objects (vd_shm.c), with the process's pidfd as
 * descriptor 3: a program of its own rather than a fork, so that starting
 * it copies nothing of a large or multithreaded process.
 * Usage (by the double only): loom-verbs-double-janitor PID START
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vd_shm.h"

#define VD_JANITOR_PIDFD 3

struct vd_dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

/* Descriptors the spawner's process had without close-on-exec (a test's
 * pipes, say) would stay open here for as long as the spawner lives. */
static void close_others(void) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, VD_JANITOR_PIDFD + 1, ~0u, 0) == 0)
    return;
#endif
  for (int fd = VD_JANITOR_PIDFD + 1; fd < 65536; fd++)
    close(fd);
}

/* Under the directory lock that creation holds (vd_shm.c), a header that
 * is short or not the double's is debris of a creator that died halfway. */
static void reap(int dfd, const char *name, int32_t pid, uint64_t start) {
  if (strncmp(name, VD_SHM_PREFIX, strlen(VD_SHM_PREFIX)) != 0)
    return;
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return;
  struct vd_hdr h;
  ssize_t n = pread(fd, &h, sizeof(h), 0);
  close(fd);
  if (n != (ssize_t)sizeof(h) || h.magic != VD_MAGIC || (h.owner_pid == pid && h.owner_start == start))
    unlinkat(dfd, name, 0);
}

int main(int argc, char **argv) {
  if (argc != 3)
    return 2;
  int32_t pid = (int32_t)strtol(argv[1], NULL, 10);
  uint64_t start = strtoull(argv[2], NULL, 10);
  close_others();
  prctl(PR_SET_NAME, "loomvd-janitor", 0, 0, 0);
  /* A session of its own: the test runner kills the test's process group
   * when the test ends, which is when this has work to do. And the
   * spawner waits only for the first process: the janitor is nobody's
   * child to wait for. */
  setsid();
  pid_t c = fork();
  if (c != 0)
    _exit(c < 0);
  struct pollfd p = {.fd = VD_JANITOR_PIDFD, .events = POLLIN};
  while (poll(&p, 1, -1) < 0 && errno == EINTR)
    ;
  int dfd = open(VD_SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    _exit(1);
  while (flock(dfd, LOCK_EX) != 0 && errno == EINTR)
    ;
  char buf[8192] __attribute__((aligned(8)));
  long n;
  while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0)
    for (long off = 0; off < n;) {
      struct vd_dirent64 *e = (struct vd_dirent64 *)(buf + off);
      reap(dfd, e->d_name, pid, start);
      off += e->d_reclen;
    }
  _exit(0);
}
