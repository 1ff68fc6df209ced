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

#include <sched.h>
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
  /* This side's own slot count (posted by a sender, released by a
   * receiver), kept by its kernels: the counter it advances lives in the
   * peer's memory, too far to read when every work starts. */
  uint64_t step __attribute__((aligned(64)));
};
_Static_assert(sizeof(struct p2p_ctrl) <= P2P_CTRL_BYTES, "p2p control page too small");

struct p2p_info {
  char handle[CUDA_IPC_HANDLE_BYTES];
  uint64_t ptr; /* the memory's address in its own process */
  uint64_t size, capacity;
  int32_t pid;
  int32_t pad;
};

/* What the proxy last read of a connection's device memory, through a
 * peek (cudamem.h: a plain read could wait behind a stuck kernel). */
struct p2p_snap {
  struct p2p_ctrl ctrl;   /* this side's control page */
  uint64_t head[2];       /* receiver: slots it released, before and after the header */
  char hdr[SLOT_HDR_BYTES];
};

#define P2P_NO_STEP UINT64_MAX

struct p2p_priv {
  void *local;      /* receiver: counter page and slots; sender: counter page */
  void *remote;     /* the peer's memory, as mapped here */
  int remote_ipc;   /* it was opened through IPC and must be closed */
  /* The peek's buffer holds a snapshot being read, then the words this
   * side writes into the peer's page when it fails. */
  struct cuda_peek peek;
  struct p2p_snap seen; /* the last snapshot read in full */
  int seen_ok;
  /* Receiver: the step whose slot header the snapshot under way reads
   * (one the previous snapshot saw posted), and that of `seen`. */
  uint64_t hdr_step, seen_hdr_step;
  int peek_failed;      /* the copies failed: the memory is going */
  int poisoned;         /* the peer was told, once: its words may be in flight */
};

#define P2P_POISON_AT sizeof(struct p2p_snap)

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
  /* The receiver's memory: control page, Simple slots, LL slots. */
  size_t simple = P2P_CTRL_BYTES + NCCL_STEPS * (SLOT_HDR_BYTES + capacity);
  size_t size = c->dir == CONN_RECV ? simple + LL_FIFO_BYTES : P2P_CTRL_BYTES;
  CHECK(cuda_malloc(&pp->local, size, c->dir == CONN_RECV ? "a p2p FIFO" : "a p2p counter"));
  c->mem_dev = size;
  /* Zeroed before the handle is published: a peer may write the counters
   * as soon as it has it. The LL lines too: a flag is never 0. */
  CHECK(cuda_memset(pp->local, 0, P2P_CTRL_BYTES));
  if (c->dir == CONN_RECV)
    CHECK(cuda_memset((char *)pp->local + simple, 0, LL_FIFO_BYTES));
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
  c->dev.ll = c->dev.base + NCCL_STEPS * c->fifo.stride;
  c->dev.step = (uint64_t *)(local + offsetof(struct p2p_ctrl, step));
  return cuda_peek_init(&pp->peek, sizeof(struct p2p_snap) + sizeof(struct p2p_ctrl), "a p2p connection's peek");
}

/* Starts reading this side's control page and, on the receiving side,
 * the count of slots released; if the last snapshot saw a slot posted
 * and not released, also its header, then that count again: the header
 * is the posted one if the count has not moved (a sender rewrites a slot
 * only once it has been released). Only a slot seen posted is read, as
 * the receiver itself would: the others may be being written. */
static ncclResult_t snap_start(struct conn *c, struct p2p_priv *pp) {
  CHECK(cuda_peek_read(&pp->peek, offsetof(struct p2p_snap, ctrl), pp->local, sizeof(struct p2p_ctrl)));
  pp->hdr_step = P2P_NO_STEP;
  if (c->dir == CONN_RECV) {
    CHECK(cuda_peek_read(&pp->peek, offsetof(struct p2p_snap, head), c->dev.head, sizeof(uint64_t)));
    if (pp->seen_ok && pp->seen.ctrl.counter > pp->seen.head[0]) {
      uint64_t step = pp->seen.head[0];
      CHECK(cuda_peek_read(&pp->peek, offsetof(struct p2p_snap, hdr), c->dev.base + (step % NCCL_STEPS) * c->fifo.stride,
                           SLOT_HDR_BYTES));
      CHECK(cuda_peek_read(&pp->peek, offsetof(struct p2p_snap, head) + sizeof(uint64_t), c->dev.head,
                           sizeof(uint64_t)));
      pp->hdr_step = step;
    }
  }
  return cuda_peek_issue(&pp->peek);
}

/* Whether the snapshot under way has ended: 1 (now in `seen`), 0 (not
 * yet, or none under way), -1 (the copies failed). */
static int snap_take(struct p2p_priv *pp) {
  int done = cuda_peek_done(&pp->peek);
  if (done < 0)
    pp->peek_failed = 1;
  else if (done > 0) {
    memcpy(&pp->seen, pp->peek.buf, sizeof pp->seen);
    pp->seen_hdr_step = pp->hdr_step;
    pp->seen_ok = 1;
  }
  return done;
}

/* Takes the snapshot that has ended, if one has, and starts the next:
 * callers see what the connection was at most one look ago. */
static void snap_refresh(struct conn *c, struct p2p_priv *pp) {
  if (!pp->peek.buf || pp->peek_failed || snap_take(pp) < 0)
    return;
  if (!pp->peek.pending && snap_start(c, pp) != ncclSuccess)
    pp->peek_failed = 1;
}

/* Waits for the snapshot under way until `until_ns` at most; 1 once it
 * has ended (or failed). */
static int snap_wait(struct p2p_priv *pp, uint64_t until_ns) {
  while (pp->peek.pending) {
    if (snap_take(pp) != 0)
      return 1;
    if (time_ns() >= until_ns)
      return 0;
    sched_yield();
  }
  return 1;
}

/* A snapshot started now, waited for until `until_ns` at most: a peek
 * held up behind a kernel is given up, and the last one stands. */
static void snap_fresh(struct conn *c, struct p2p_priv *pp, uint64_t until_ns) {
  if (!snap_wait(pp, until_ns) || pp->peek_failed)
    return;
  if (snap_start(c, pp) != ncclSuccess) {
    pp->peek_failed = 1;
    return;
  }
  snap_wait(pp, until_ns);
}

static int send_flushed(const struct p2p_priv *pp) {
  /* A failed read says nothing of the peer: the memory goes. The slots
   * posted are the kernels' count, not the host's: a CUDA graph's
   * replays post slots the host never counted. */
  return pp->peek_failed || (pp->seen_ok && pp->seen.ctrl.counter >= pp->seen.ctrl.step);
}

/* A send is flushed once the peer's kernel released every slot posted:
 * that release is its last write into this rank's memory. Asked where
 * the answer decides whether a peer that has exited is to blame, so an
 * old "no" is checked again with a fresh look. */
static int p2p_flushed(struct conn *c) {
  struct p2p_priv *pp = c->priv;
  if (c->dir != CONN_SEND || !pp || !pp->peek.buf)
    return 1;
  snap_refresh(c, pp);
  if (!send_flushed(pp))
    snap_fresh(c, pp, time_ns() + 20000000ull);
  return send_flushed(pp);
}

static ncclResult_t p2p_check(struct conn *c) {
  struct p2p_priv *pp = c->priv;
  if (pp && pp->peek.buf) {
    snap_refresh(c, pp);
    if (pp->seen_ok && pp->seen.ctrl.failed) {
      pp->seen.ctrl.why[sizeof pp->seen.ctrl.why - 1] = '\0';
      return transport_peer_failed(c, pp->seen.ctrl.why);
    }
  }
  return comm_peer_alive(c->comm, c->peer);
}

static int p2p_next_hdr(struct conn *c, struct slot_hdr *out) {
  struct p2p_priv *pp = c->priv;
  if (c->dir != CONN_RECV || !pp || !pp->peek.buf)
    return 0;
  snap_refresh(c, pp);
  if (!pp->seen_ok || pp->seen_hdr_step == P2P_NO_STEP || pp->seen.head[1] != pp->seen_hdr_step)
    return 0;
  memcpy(out, pp->seen.hdr, sizeof *out);
  return 1;
}

/* Tells the peer, in its own memory, that this side failed: queued, not
 * waited for, as its kernel may be what holds the stream up. Only
 * through IPC: a rank of this process frees that memory with its
 * communicator, which it may have destroyed already, while an IPC
 * mapping holds it. */
static void p2p_poison(struct conn *c, const char *why) {
  struct p2p_priv *pp = c->priv;
  if (!pp || !pp->remote_ipc || !pp->peek.buf || pp->poisoned)
    return;
  pp->poisoned = 1;
  struct p2p_ctrl *note = (struct p2p_ctrl *)(pp->peek.buf + P2P_POISON_AT);
  snprintf(note->why, sizeof note->why, "%s", why ? why : "");
  note->failed = 1;
  char *page = pp->remote;
  /* The sentence first, on one stream: the word says it is there. */
  if (cuda_peek_write(&pp->peek, page + offsetof(struct p2p_ctrl, why), P2P_POISON_AT + offsetof(struct p2p_ctrl, why),
                      strlen(note->why) + 1) == ncclSuccess)
    cuda_peek_write(&pp->peek, page + offsetof(struct p2p_ctrl, failed),
                    P2P_POISON_AT + offsetof(struct p2p_ctrl, failed), sizeof note->failed);
}

static void p2p_free(struct conn *c) {
  struct p2p_priv *pp = c->priv;
  if (!pp)
    return;
  /* Frees the peek's buffer once its copies (a poisoning write among
   * them) are done: cudaFreeHost waits for the device. */
  cuda_peek_free(&pp->peek);
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
    .wait_fds = transport_no_wait_fds,
    .next_hdr = p2p_next_hdr,
    .conn_name = transport_plain_name,
    .poison = p2p_poison,
    .free = p2p_free,
};
