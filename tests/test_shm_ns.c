/*
 * Ranks of one host in two pid namespaces that share the network
 * namespace (containers of one pod, say): each rank is pid 1 of a pid
 * namespace of its own, so their pids are equal though they are two
 * processes. Loom must not take them for one process: the segment's
 * descriptor comes over the receiver's Unix socket (a pid means nothing
 * across pid namespaces, so no pidfd_getfd), single copy by reference
 * (a memcpy from the peer's address, or process_vm_readv by pid) stays
 * off, and the data is right. Needs root (unshare(CLONE_NEWPID)).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { COUNT = 1 << 18 };

/* In each rank's process: a new pid namespace, whose first process (pid
 * 1) goes on as the rank while this one waits for it and passes on how it
 * ended. Each rank logs to a file of its own (their pids are equal). */
static int ns_setup(int rank, void *arg) {
  const char *tag = arg;
  char file[160];
  snprintf(file, sizeof file, "/tmp/loom-shmns-%s-%d.log", tag, rank);
  unlink(file);
  setenv("NCCL_DEBUG_FILE", file, 1);
  if (unshare(CLONE_NEWPID) != 0) {
    fprintf(stderr, "rank %d: unshare(CLONE_NEWPID): %s\n", rank, strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  if (child < 0)
    return 1;
  if (child == 0)
    return 0;
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR)
    ;
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

static int ns_rank(int rank, int n, ncclUniqueId id, void *arg) {
  RASSERT(getpid() == 1, "rank %d is pid %d, not 1 of its own pid namespace", rank, (int)getpid());
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *buf = malloc(sizeof *buf * COUNT), *peer = malloc(sizeof *peer * COUNT);
  RASSERT(buf && peer, "out of memory");
  for (size_t i = 0; i < COUNT; i++)
    buf[i] = (float)((rank + 1) * (int)(i % 13 + 1));
  RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < COUNT; i++)
    RASSERT(buf[i] == (float)(n * (n + 1) / 2 * (int)(i % 13 + 1)), "AllReduce: element %zu is %g", i, buf[i]);
  /* Point to point, one way each, large enough for single copy. */
  for (size_t i = 0; i < COUNT; i++)
    buf[i] = (float)(rank * 1000 + (int)(i % 97));
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclSend(buf, COUNT, ncclFloat, 1 - rank, comm, NULL));
  RCHECK(comm, ncclRecv(peer, COUNT, ncclFloat, 1 - rank, comm, NULL));
  RCHECK(comm, ncclGroupEnd());
  for (size_t i = 0; i < COUNT; i++)
    RASSERT(peer[i] == (float)((1 - rank) * 1000 + (int)(i % 97)), "Recv: element %zu is %g", i, peer[i]);
  RCHECK(NULL, ncclCommDestroy(comm));
  free(buf);
  free(peer);
  return 0;
}

static int count_in(const char *tag, int rank, const char *what) {
  char path[160], line[1024];
  snprintf(path, sizeof path, "/tmp/loom-shmns-%s-%d.log", tag, rank);
  FILE *f = fopen(path, "r");
  int hits = 0;
  while (f && fgets(line, sizeof line, f))
    hits += strstr(line, what) != NULL;
  if (f)
    fclose(f);
  return hits;
}

/* Whether this process may make a pid namespace. */
static int can_unshare_pid(void) {
  pid_t p = fork();
  if (p == 0)
    _exit(unshare(CLONE_NEWPID) == 0 ? 0 : 1);
  int st = 0;
  while (p > 0 && waitpid(p, &st, 0) < 0 && errno == EINTR)
    ;
  return p > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

TEST_IMPL(shm_pid_namespaces) {
  if (!can_unshare_pid())
    SKIP("cannot make a pid namespace here (needs root or CAP_SYS_ADMIN)");
  unsetenv("NCCL_SHM_DISABLE");
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_TIMEOUT", "30", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,SHM", 1);
  /* The default (by reference only within one process), then by
   * reference between processes too where allowed. */
  const char *single[] = {"-1", "4096"};
  for (int k = 0; k < 2; k++) {
    char tag[64];
    snprintf(tag, sizeof tag, "%d-%d", (int)getpid(), k);
    setenv("LOOM_SHM_SINGLE_COPY", single[k], 1);
    harness_set_rank_setup(ns_setup);
    int rc = run_ranks(2, ns_rank, tag);
    harness_set_rank_setup(NULL);
    int via_shm = 0, by_socket = 0, single_off = 0;
    for (int r = 0; r < 2; r++) {
      via_shm += count_in(tag, r, "via shm");
      by_socket += count_in(tag, r, "over its Unix socket");
      single_off += count_in(tag, r, "another pid namespace");
    }
    for (int r = 0; r < 2; r++) {
      char path[160];
      snprintf(path, sizeof path, "/tmp/loom-shmns-%s-%d.log", tag, r);
      unlink(path);
    }
    printf("LOOM_SHM_SINGLE_COPY=%s: %d connections via shm, %d segments over the socket, single copy off %d times\n",
           single[k], via_shm, by_socket, single_off);
    ASSERT_MSG(rc == 0, "a rank failed with LOOM_SHM_SINGLE_COPY=%s", single[k]);
    ASSERT_MSG(via_shm > 0 && by_socket > 0, "the ranks did not connect over shared memory through the socket");
    ASSERT_MSG(k == 0 || single_off > 0, "single copy between pid namespaces was not switched off");
  }
  unsetenv("LOOM_SHM_SINGLE_COPY");
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_SUBSYS");
  unsetenv("NCCL_DEBUG_FILE");
  return 0;
}
