/*
 * GPU to GPU on one host: the receiver's FIFO is device memory that the
 * sender maps through a CUDA IPC handle (or uses directly in the same
 * process) and writes into over NVLink or PCIe. Each side polls a counter
 * in its own memory and writes the other's: the tail lives with the
 * receiver's slots, the head in a small buffer of the sender's. Several
 * ranks may share one GPU, which NCCL refuses and Loom allows.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define P2P_CTRL_BYTES 4096

/* The page at the start of each side's memory: the counter the peer
 * writes, and where the peer says it failed and why (as shm's control
 * page does), read by this side's checks. */
struct p2p_ctrl {
  uint64_t counter; /* tail (receiver's page) or head (sender's) */
  uint64_t pad[7];
  uint32_t failed;
  char why[LOOM_ERR_LEN];
};
_Static_assert(sizeof(struct p2p_ctrl) <= P2P_CTRL_BYTES, "p2p control page too small");

struct p2p_info {
  char handle[CUDA_IPC_HANDLE_BYTES];
  uint64_t ptr; /* the memory's address in its own process */
  uint64_t size, capacity;
  int32_t pid;
  int32_t pad;
};

struct p2p_priv {
  void *local;      /* receiver: counter page and slots; sender: counter page */
  void *remote;     /* the peer's memory, as mapped here */
  int remote_ipc;   /* it was opened through IPC and must be closed */
};

/* Decided from what both ranks know alike where possible, since each side
 * chooses its transport alone: the topology's path between the two GPUs
 * against the stricter of the two ranks' NCCL_P2P_LEVEL. A peer GPU this
 * process cannot see (CUDA_VISIBLE_DEVICES per process, as Slurm sets
 * it) is still reached through CUDA IPC, as NCCL does, when the topology
 * places it; one it sees must also pass CUDA's own peer check. */
static int p2p_can_connect(struct ncclComm *comm, int peer) {
#if LOOM_HAVE_CUDA
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  if (comm->is_host || me->host_hash != p->host_hash || me->p2p_disabled || p->p2p_disabled || !p->busid[0])
    return 0;
  int path = comm->gpu_path ? comm->gpu_path(me->busid, p->busid) : -1;
  int level = me->p2p_level < p->p2p_level ? me->p2p_level : p->p2p_level;
  if (path >= 0 && path > level)
    return 0;
  int dev = cuda_device_of_bus_id(p->busid);
  if (dev >= 0)
    return cuda_can_access_peer(comm->cuda_dev, dev);
  return path >= 0;
#else
  return 0;
#endif
}

static ncclResult_t p2p_setup(struct conn *c, void *info, size_t *len) {
  struct p2p_priv *pp;
  CHECK(UTIL_CALLOC(&pp, 1, "p2p connection"));
  c->priv = pp;
  size_t capacity = (c->comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  size_t size = c->dir == CONN_RECV ? P2P_CTRL_BYTES + NCCL_STEPS * (SLOT_HDR_BYTES + capacity) : P2P_CTRL_BYTES;
  CHECK(cuda_malloc(&pp->local, size, c->dir == CONN_RECV ? "a p2p FIFO" : "a p2p counter"));
  /* Zeroed before the handle is published: a peer may write the counters
   * as soon as it has it. */
  CHECK(cuda_memset(pp->local, 0, P2P_CTRL_BYTES));
  c->fifo.capacity = capacity;
  c->fifo.stride = SLOT_HDR_BYTES + capacity;
  struct p2p_info *pi = info;
  memset(pi, 0, sizeof *pi);
  CHECK(cuda_ipc_get(pp->local, pi->handle));
  pi->ptr = (uint64_t)(uintptr_t)pp->local;
  pi->size = size;
  pi->capacity = capacity;
  pi->pid = (int32_t)getpid();
  *len = sizeof *pi;
  return ncclSuccess;
}

static ncclResult_t p2p_connect(struct conn *c, const void *peer_info, size_t len) {
  struct p2p_priv *pp = c->priv;
  struct p2p_info pi;
  if (len != sizeof pi)
    return err_set(ncclInternalError, "p2p connection info from rank %d has %zu bytes", c->peer, len);
  memcpy(&pi, peer_info, sizeof pi);
  /* Not pi.pid == getpid(): a rank of another pid namespace can have
   * this process's pid. */
  const struct peer_info *me = &c->comm->peers[c->comm->rank];
  if (c->comm->peers[c->peer].proc_id == me->proc_id) {
    /* Another GPU of this process: its memory is reachable only once
     * peer access is on (an illegal address otherwise). */
    int peer_dev = c->comm->peers[c->peer].cuda_dev;
    if (peer_dev != c->comm->cuda_dev)
      CHECK(cuda_enable_peer(peer_dev));
    pp->remote = (void *)(uintptr_t)pi.ptr; /* IPC cannot reopen this process's own memory */
  } else {
    CHECK(cuda_ipc_open(pi.handle, &pp->remote, c->dir == CONN_SEND ? "the peer's p2p FIFO" : "the peer's p2p counter"));
    pp->remote_ipc = 1;
  }
  char *local = pp->local, *remote = pp->remote;
  if (c->dir == CONN_SEND) {
    c->dev.base = remote + P2P_CTRL_BYTES;
    c->dev.tail = (uint64_t *)remote;
    c->dev.head = (uint64_t *)local;
  } else {
    c->dev.base = local + P2P_CTRL_BYTES;
    c->dev.tail = (uint64_t *)local;
    c->dev.head = (uint64_t *)remote;
  }
  return ncclSuccess;
}

/* A send is flushed once the peer's kernel released every slot posted:
 * that release is its last write into this rank's memory. */
static int p2p_flushed(struct conn *c) {
  if (c->dir != CONN_SEND || c->step == 0 || !c->dev.head)
    return 1;
  uint64_t head = 0;
  /* An error reading it says nothing of the peer: the memory goes. */
  return cuda_read_u64(c->dev.head, &head) != ncclSuccess || head >= c->step;
}

static ncclResult_t p2p_check(struct conn *c) {
  struct p2p_priv *pp = c->priv;
  uint32_t failed = 0;
  if (pp && pp->local &&
      cuda_read(&failed, (char *)pp->local + offsetof(struct p2p_ctrl, failed), sizeof failed) == ncclSuccess &&
      failed) {
    char why[LOOM_ERR_LEN];
    if (cuda_read(why, (char *)pp->local + offsetof(struct p2p_ctrl, why), sizeof why) != ncclSuccess)
      why[0] = '\0';
    why[sizeof why - 1] = '\0';
    return transport_peer_failed(c, why);
  }
  return comm_peer_alive(c->comm, c->peer);
}

/* Tells the peer, in its own memory, that this side failed. Only through
 * IPC: a rank of this process frees that memory with its communicator,
 * which it may have destroyed already, while an IPC mapping holds it. */
static void p2p_poison(struct conn *c, const char *why) {
  struct p2p_priv *pp = c->priv;
  if (!pp || !pp->remote_ipc)
    return;
  char *page = pp->remote;
  char text[LOOM_ERR_LEN];
  snprintf(text, sizeof text, "%s", why ? why : "");
  uint32_t one = 1;
  /* The sentence first: the word says it is there. */
  if (cuda_write(page + offsetof(struct p2p_ctrl, why), text, strlen(text) + 1) == ncclSuccess)
    cuda_write(page + offsetof(struct p2p_ctrl, failed), &one, sizeof one);
}

static void p2p_free(struct conn *c) {
  struct p2p_priv *pp = c->priv;
  if (!pp)
    return;
  if (pp->remote_ipc)
    cuda_ipc_close(pp->remote);
  cuda_free(pp->local);
  free(pp);
  c->priv = NULL;
}

const struct transport transport_p2p = {
    .name = "p2p",
    .can_connect = p2p_can_connect,
    .setup = p2p_setup,
    .connect = p2p_connect,
    .progress = transport_no_progress,
    .flushed = p2p_flushed,
    .check = p2p_check,
    .failed = transport_no_failure,
    .activity = transport_no_activity,
    .conn_name = transport_plain_name,
    .poison = p2p_poison,
    .free = p2p_free,
};
