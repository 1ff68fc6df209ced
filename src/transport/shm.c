/*
 * Shared memory between processes of one host. The receiver creates a
 * segment holding the FIFO (control words and NCCL_STEPS slots); the sender
 * maps it and writes slots directly, so data crosses with one copy in and
 * one copy out, or (single copy, host ranks) a slot carries the address
 * of data the receiver reads from the sender's buffer itself. The segment
 * has no name (shm_seg.c): the receiver holds its descriptor until the
 * sender has taken a copy and mapped it, so no kill, at any moment, leaves
 * anything behind in /dev/shm. A sender that gives up before it has the
 * segment mapped says so over the receiver's socket, and a receiver that
 * fails tells the senders that wait there: neither waits for the other
 * until LOOM_TIMEOUT.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "misc/cudamem.h"
#include "misc/place.h"
#include "misc/utils.h"
#include "misc/param.h"
#include "transport/shm_seg.h"
#include "transport/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* Counters on their own cache lines: the sender writes tail, the receiver
 * head, and neither should slow the other down. */
struct shm_ctrl {
  /* Each counter shares its line with the count of its sleepers: the
   * side that moves the counter reads that count right after. */
  _Atomic uint64_t tail;
  _Atomic uint32_t tail_sleepers;
  char pad0[LOOM_CACHE_LINE - sizeof(uint64_t) - sizeof(uint32_t)];
  _Atomic uint64_t head;
  _Atomic uint32_t head_sleepers;
  char pad1[LOOM_CACHE_LINE - sizeof(uint64_t) - sizeof(uint32_t)];
  _Atomic uint32_t failed[2]; /* indexed by the failing side's conn_dir */
  /* The sender has mapped the segment: the receiver lets go of what
   * handed it over. */
  _Atomic uint32_t attached;
  uint32_t pad2;
  /* The receiver's mark, which the sender checks before it trusts a
   * descriptor it got from another process. */
  uint64_t token;
  /* Why that side failed (its communicator's error), written before
   * failed[]: a rank that waits on a rank that gave up because a third
   * died learns of the third. Empty when it was aborted without an error. */
  char why[2][LOOM_ERR_LEN];
};

#define SHM_DATA_OFFSET 4096
_Static_assert(sizeof(struct shm_ctrl) <= SHM_DATA_OFFSET, "the control block overlaps the data");

struct shm_info {
  uint64_t size;
  uint64_t capacity;
  uint64_t probe; /* the receiver's address of ctrl->token, to try a single-copy read on */
  uint64_t token; /* what the segment's control block must hold */
  int32_t pid;    /* the receiver, and the segment's descriptor in it */
  int32_t fd;
  char sock[64];  /* the receiver's socket that hands the descriptor over; "" if none */
};

struct shm_priv {
  void *map;
  size_t size;
  void *dev_map;  /* the mapping as the GPU sees it (CUDA communicators) */
  int seg_fd;     /* receiver: the segment, until the sender has mapped it */
  struct shm_seg_server server; /* receiver: its socket, as long as seg_fd */
  int sock_fd;    /* sender: connected to that socket, waiting for the descriptor */
  /* Over the sockets and descriptors: a CUDA communicator's proxy thread
   * may poison the connection while this rank's thread connects it. */
  pthread_mutex_t lock;
  int tried_pidfd; /* sender: pidfd_getfd was tried (why_pidfd says how it went) */
  int have_si;     /* sender: si holds the receiver's information */
  int reported;    /* sender: told the receiver that it gave up */
  struct shm_info si;
  char why_pidfd[160];
};

/* Whether rank `peer` is a thread of this process; not by pid, which a
 * process of another pid namespace can share. */
static int same_process(const struct ncclComm *comm, int peer) {
  return comm->peers[peer].proc_id == comm->peers[comm->rank].proc_id;
}

/* Whether the pid rank `peer` reported names it here too. */
static int same_pid_ns(const struct ncclComm *comm, int peer) {
  return comm->peers[peer].pid_ns == comm->peers[comm->rank].pid_ns;
}

/* The pid a socket of rank `peer` must be served by or served to: 0 (any
 * process of this user) where its pid means nothing here. */
static pid_t expected_pid(const struct ncclComm *comm, int peer) {
  return same_pid_ns(comm, peer) ? (pid_t)comm->peers[peer].pid : 0;
}

static int shm_can_connect(struct ncclComm *comm, int peer) {
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  return me->host_hash == p->host_hash && !me->shm_disabled && !p->shm_disabled;
}

/* On a CUDA communicator kernels read and write the segment directly:
 * device buffers cross through this pinned host memory. */
static ncclResult_t shm_attach(struct conn *c, struct shm_priv *sp, size_t capacity) {
  struct shm_ctrl *ctrl = sp->map;
  c->fifo.base = (char *)sp->map + SHM_DATA_OFFSET;
  c->fifo.capacity = capacity;
  c->fifo.stride = SLOT_HDR_BYTES + capacity;
  c->fifo.tail = &ctrl->tail;
  c->fifo.head = &ctrl->head;
  c->fifo.ref_pid = c->comm->peers[c->peer].pid;
  c->fifo.ref_local = same_process(c->comm, c->peer);
  if (c->comm->is_host) {
    c->fifo.tail_sleepers = &ctrl->tail_sleepers;
    c->fifo.head_sleepers = &ctrl->head_sleepers;
    return ncclSuccess;
  }
  CHECK(cuda_host_register(sp->map, sp->size, &sp->dev_map, "a shared-memory FIFO"));
  char *d = sp->dev_map;
  c->dev.base = d + SHM_DATA_OFFSET;
  c->dev.tail = (uint64_t *)(d + offsetof(struct shm_ctrl, tail));
  c->dev.head = (uint64_t *)(d + offsetof(struct shm_ctrl, head));
  c->dev.step = c->dir == CONN_SEND ? c->dev.tail : c->dev.head;
  /* The LL slots after the Simple ones: a segment made for a CUDA
   * communicator has them (zero, as a new segment is). */
  if (sp->size >= SHM_DATA_OFFSET + NCCL_STEPS * c->fifo.stride + LL_FIFO_BYTES)
    c->dev.ll = c->dev.base + NCCL_STEPS * c->fifo.stride;
  return ncclSuccess;
}

static ncclResult_t shm_setup(struct conn *c, void *info, size_t *len) {
  struct shm_priv *sp;
  CHECK(UTIL_CALLOC(&sp, 1, "shm connection"));
  sp->seg_fd = sp->sock_fd = -1;
  shm_seg_server_init(&sp->server);
  pthread_mutex_init(&sp->lock, NULL);
  c->priv = sp;
  if (c->dir == CONN_SEND) {
    *len = 0;
    return ncclSuccess;
  }
  shm_seg_sweep_stale();
  uint64_t token;
  CHECK(util_random(&token, sizeof token));
  size_t capacity = (c->comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  sp->size = SHM_DATA_OFFSET + NCCL_STEPS * (SLOT_HDR_BYTES + capacity) + (c->comm->is_host ? 0 : LL_FIFO_BYTES);
  CHECK(shm_seg_create(sp->size, c->peer, &sp->seg_fd));
  sp->map = mmap(NULL, sp->size, PROT_READ | PROT_WRITE, MAP_SHARED, sp->seg_fd, 0);
  if (sp->map == MAP_FAILED) {
    sp->map = NULL;
    return err_set(ncclSystemError, "mmap of %zu bytes of shared memory failed: %s", sp->size, strerror(errno));
  }
  c->mem_host = sp->size;
  /* The receiver reads its FIFO most: its pages go on the receiver's
   * NUMA node. */
  place_memory(sp->map, sp->size, c->comm->peers[c->comm->rank].numa);
  struct shm_ctrl *ctrl = sp->map;
  memset(ctrl, 0, sizeof *ctrl);
  ctrl->token = token;
  CHECK(shm_attach(c, sp, capacity));
  struct shm_info *si = info;
  memset(si, 0, sizeof *si);
  si->size = sp->size;
  si->capacity = capacity;
  si->probe = (uint64_t)(uintptr_t)&ctrl->token;
  si->token = token;
  si->pid = (int32_t)getpid();
  si->fd = sp->seg_fd;
  /* A sender in this process uses the descriptor itself, but it too says
   * over the socket when it gives up. */
  shm_seg_listen(&sp->server, token, expected_pid(c->comm, c->peer), si->sock, sizeof si->sock);
  *len = sizeof *si;
  return ncclSuccess;
}

/* What handed the segment over is not needed once the sender has mapped
 * it: from then on the mappings alone keep it alive. */
static void shm_let_go(struct shm_priv *sp) {
  if (sp->seg_fd >= 0)
    close(sp->seg_fd);
  shm_seg_server_close(&sp->server);
  if (sp->sock_fd >= 0)
    close(sp->sock_fd);
  sp->seg_fd = sp->sock_fd = -1;
}

/* The sender gave up before it had the segment mapped: it tells the
 * receiver, which would otherwise serve it until the sender's process
 * exits or LOOM_TIMEOUT passes. */
static void shm_report(struct conn *c, const char *why) {
  struct shm_priv *sp = c->priv;
  if (!sp || c->dir != CONN_SEND || !sp->have_si || sp->map || sp->reported)
    return;
  sp->reported = 1;
  /* Not on a connection that asked for the segment: the owner reads only
   * the first record of each. */
  if (sp->sock_fd >= 0)
    close(sp->sock_fd);
  sp->sock_fd = -1;
  char name[sizeof sp->si.sock];
  memcpy(name, sp->si.sock, sizeof name);
  name[sizeof name - 1] = '\0';
  shm_seg_report(name, sp->si.token, expected_pid(c->comm, c->peer), why);
}

/* The sender's copy of the receiver's segment descriptor: its own where
 * both ranks are threads of one process, else taken with pidfd_getfd,
 * else asked for over the receiver's socket (ncclInProgress until it
 * comes). */
static ncclResult_t shm_fetch(struct conn *c, const struct shm_info *si, int *fd, int *by_pidfd, int *trusted) {
  struct shm_priv *sp = c->priv;
  struct ncclComm *comm = c->comm;
  *trusted = 1;
  if (same_process(comm, c->peer)) {
    *fd = fcntl(si->fd, F_DUPFD_CLOEXEC, 0);
    if (*fd < 0)
      return err_set(ncclSystemError, "cannot duplicate the descriptor of rank %d's shared memory: %s", c->peer,
                     strerror(errno));
    return ncclSuccess;
  }
  if (!sp->tried_pidfd) {
    sp->tried_pidfd = 1;
    int pidfd = comm->peer_pidfd ? comm->peer_pidfd[c->peer] : -1;
    if (!param_int(P_SHM_PIDFD_GETFD)) {
      snprintf(sp->why_pidfd, sizeof sp->why_pidfd, "pidfd_getfd is off (LOOM_SHM_PIDFD_GETFD=0)");
    } else if (!same_pid_ns(comm, c->peer)) {
      snprintf(sp->why_pidfd, sizeof sp->why_pidfd, "pid %d is of another pid namespace", (int)si->pid);
    } else if (pidfd < 0) {
      snprintf(sp->why_pidfd, sizeof sp->why_pidfd, "no pidfd for pid %d", (int)si->pid);
    } else {
      int e = shm_seg_pidfd_getfd(pidfd, si->fd, fd);
      if (e == 0) {
        INFO(LOG_SHM, "rank %d: took rank %d's segment with pidfd_getfd", comm->rank, c->peer);
        *by_pidfd = 1;
        return ncclSuccess;
      }
      snprintf(sp->why_pidfd, sizeof sp->why_pidfd, "pidfd_getfd on pid %d: %s", (int)si->pid, strerror(e));
      INFO(LOG_SHM, "rank %d: pidfd_getfd refused rank %d's segment (%s): asking its Unix socket", comm->rank, c->peer,
           strerror(e));
    }
  }
  if (si->sock[0] == '\0')
    return err_set(ncclSystemError,
                   "cannot get rank %d's shared memory: %s, and it has no socket to hand it over "
                   "(NCCL_SHM_DISABLE=1 makes ranks of one host use the network)",
                   c->peer, sp->why_pidfd);
  /* What came from the rank's own process, as far as this rank can tell,
   * may be mapped unsealed. */
  pid_t expect = expected_pid(comm, c->peer);
  *trusted = expect != 0;
  char why[LOOM_ERR_LEN];
  if (sp->sock_fd < 0) {
    char name[sizeof si->sock];
    memcpy(name, si->sock, sizeof name);
    name[sizeof name - 1] = '\0';
    int e = shm_seg_ask(name, si->token, expect, &sp->sock_fd, why, sizeof why);
    if (e == EAGAIN)
      return ncclInProgress; /* its backlog is full */
    if (e != 0 && comm_peer_alive(comm, c->peer) != ncclSuccess)
      return ncclRemoteError;
    if (e != 0)
      return err_set(ncclSystemError,
                     "cannot get rank %d's shared memory: %s; its socket @%s: %s%s (NCCL_SHM_DISABLE=1 makes ranks "
                     "of one host use the network)",
                     c->peer, sp->why_pidfd, name, why,
                     e == ECONNREFUSED ? " (the rank closed it: it failed, or it is exiting)" : "");
  }
  int e = shm_seg_recv(sp->sock_fd, fd, why, sizeof why);
  if (e == EAGAIN)
    return ncclInProgress;
  close(sp->sock_fd);
  sp->sock_fd = -1;
  if (e == ECANCELED)
    return err_set(ncclRemoteError, "rank %d (%s) failed while this rank asked for its shared memory (its error: %s)",
                   c->peer, comm->peers[c->peer].hostname, why);
  if (e != 0 && comm_peer_alive(comm, c->peer) != ncclSuccess)
    return ncclRemoteError;
  if (e != 0)
    return err_set(ncclSystemError, "cannot get rank %d's shared memory: %s; its socket: %s", c->peer, sp->why_pidfd,
                   e == ECONNRESET ? "closed without handing it over (the rank is exiting)" : why);
  INFO(LOG_SHM, "rank %d: got rank %d's segment over its Unix socket", comm->rank, c->peer);
  return ncclSuccess;
}

/* Maps the descriptor the sender got, if it is the segment the receiver
 * announced: another process's descriptor could be anything (a pid of
 * another pid namespace names another process here). */
static ncclResult_t shm_map_peer(struct conn *c, const struct shm_info *si, int fd, int trusted) {
  struct shm_priv *sp = c->priv;
  char why[200];
  if (shm_seg_check(fd, si->size, trusted, why, sizeof why) != 0) {
    close(fd);
    return err_set(ncclSystemError, "the descriptor rank %d handed over is not its shared memory: %s", c->peer, why);
  }
  void *map = mmap(NULL, si->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED)
    return err_set(ncclSystemError, "mmap of rank %d's shared memory failed: %s", c->peer, strerror(errno));
  if (((struct shm_ctrl *)map)->token != si->token) {
    munmap(map, si->size);
    return err_set(ncclSystemError, "the segment rank %d handed over is not the one it announced", c->peer);
  }
  sp->map = map;
  sp->size = si->size;
  return ncclSuccess;
}

/* Single copy needs the right to read the peer's memory (same user, and
 * no ptrace restriction such as Yama's scope 2 or a seccomp filter); the
 * sender tries it once, on the receiver's segment, and posts by reference
 * only where it works, saying why where it does not. */
static void shm_probe_single_copy(struct conn *c, const struct shm_info *si) {
  if (!c->fifo.ref_local && c->comm->single_copy_local)
    return;
  if (!c->fifo.ref_local && !same_pid_ns(c->comm, c->peer)) {
    INFO(LOG_SHM, "single copy to rank %d is off: it runs in another pid namespace", c->peer);
    return;
  }
  if (!c->fifo.ref_local) {
    /* The word read must be the segment's token: the pid is the rank. */
    uint64_t word = 0;
    struct iovec local = {&word, sizeof word}, remote = {(void *)(uintptr_t)si->probe, sizeof word};
    ssize_t n = process_vm_readv(c->fifo.ref_pid, &local, 1, &remote, 1, 0);
    if (n != (ssize_t)sizeof word || word != si->token) {
      INFO(LOG_SHM, "single copy to rank %d is off: process_vm_readv from pid %d %s: %s", c->peer, c->fifo.ref_pid,
           n == (ssize_t)sizeof word ? "read another process" : "failed",
           n == (ssize_t)sizeof word ? "its token differs" : strerror(errno));
      return;
    }
  }
  c->fifo.ref_min = c->comm->single_copy_min;
}

/* The sender's side: the receiver's descriptor, checked and mapped. */
static ncclResult_t shm_connect_send(struct conn *c, const struct shm_info *si) {
  struct shm_priv *sp = c->priv;
  for (;;) {
    int fd, by_pidfd = 0, trusted = 0;
    ncclResult_t r = shm_fetch(c, si, &fd, &by_pidfd, &trusted);
    if (r != ncclSuccess)
      return r;
    r = shm_map_peer(c, si, fd, trusted);
    if (r == ncclSuccess)
      break;
    if (!by_pidfd)
      return r;
    /* The pid named another process: the rank runs in another pid
     * namespace. Its socket knows no such trouble. */
    snprintf(sp->why_pidfd, sizeof sp->why_pidfd, "pidfd_getfd on pid %d gave another file", (int)si->pid);
    INFO(LOG_SHM, "rank %d: pidfd_getfd on pid %d gave another file than rank %d's segment: asking its Unix socket",
         c->comm->rank, (int)si->pid, c->peer);
  }
  atomic_store(&((struct shm_ctrl *)sp->map)->attached, 1);
  CHECK(shm_attach(c, sp, si->capacity));
  if (c->comm->is_host && c->comm->single_copy_min > 0)
    shm_probe_single_copy(c, si);
  return ncclSuccess;
}

static ncclResult_t shm_connect_locked(struct conn *c, const void *peer_info, size_t len) {
  struct shm_priv *sp = c->priv;
  if (c->dir == CONN_RECV) {
    /* Serves the sender until it has the segment mapped, or says that it
     * gave up. */
    if (!atomic_load(&((struct shm_ctrl *)sp->map)->attached)) {
      char why[LOOM_ERR_LEN];
      if (shm_seg_serve(&sp->server, sp->seg_fd, why, sizeof why))
        return err_set(ncclRemoteError, "rank %d (%s) could not map this rank's shared memory and gave up (its error: %s)",
                       c->peer, c->comm->peers[c->peer].hostname, why);
      return ncclInProgress;
    }
    shm_let_go(sp);
    return ncclSuccess;
  }
  if (len != sizeof sp->si)
    return err_set(ncclInternalError, "shm connection info from rank %d has %zu bytes, expected %zu", c->peer, len,
                   sizeof sp->si);
  if (!sp->have_si) {
    memcpy(&sp->si, peer_info, sizeof sp->si);
    sp->have_si = 1;
  }
  ncclResult_t r = shm_connect_send(c, &sp->si);
  if (r != ncclSuccess && r != ncclInProgress)
    shm_report(c, err_thread_last());
  return r;
}

static ncclResult_t shm_connect(struct conn *c, const void *peer_info, size_t len) {
  struct shm_priv *sp = c->priv;
  pthread_mutex_lock(&sp->lock);
  ncclResult_t r = shm_connect_locked(c, peer_info, len);
  pthread_mutex_unlock(&sp->lock);
  return r;
}

static int shm_flushed(struct conn *c) { return 1; }

static ncclResult_t shm_check(struct conn *c) {
  struct shm_priv *sp = c->priv;
  struct shm_ctrl *ctrl = sp ? sp->map : NULL;
  if (ctrl && atomic_load(&ctrl->failed[!c->dir])) {
    const char *why = ctrl->why[!c->dir];
    return transport_peer_failed(c, memchr(why, '\0', LOOM_ERR_LEN) ? why : NULL);
  }
  return comm_peer_alive(c->comm, c->peer);
}

static void shm_poison(struct conn *c, const char *why) {
  struct shm_priv *sp = c->priv;
  if (!sp)
    return;
  /* A peer that has not mapped the segment learns it over the socket. */
  const char *failure = why ? why : "it was aborted";
  pthread_mutex_lock(&sp->lock);
  if (c->dir == CONN_SEND)
    shm_report(c, failure);
  else if (sp->server.lsock >= 0)
    shm_seg_refuse(&sp->server, failure);
  pthread_mutex_unlock(&sp->lock);
  struct shm_ctrl *ctrl = sp->map;
  if (!ctrl || atomic_load(&ctrl->failed[c->dir]))
    return;
  if (why)
    snprintf(ctrl->why[c->dir], sizeof ctrl->why[c->dir], "%s", why);
  atomic_store(&ctrl->failed[c->dir], 1);
}

static void shm_free(struct conn *c) {
  struct shm_priv *sp = c->priv;
  if (!sp)
    return;
  shm_report(c, "it destroyed its communicator before it had mapped this rank's shared memory");
  if (sp->dev_map)
    cuda_host_unregister(sp->map);
  if (sp->map)
    munmap(sp->map, sp->size);
  shm_let_go(sp);
  pthread_mutex_destroy(&sp->lock);
  free(sp);
  c->priv = NULL;
}

const struct transport transport_shm = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .progress = transport_no_progress,
    .flushed = shm_flushed,
    .check = shm_check,
    .failed = transport_no_failure,
    .activity = transport_no_activity,
    .wait_fds = transport_no_wait_fds,
    .next_hdr = transport_fifo_next_hdr,
    .conn_name = transport_plain_name,
    .poison = shm_poison,
    .free = shm_free,
};
