/*
 * Choosing a transport per peer and connecting: every connection created
 * during a group is set up at the group's end, with the information both
 * sides need exchanged over the bootstrap.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "transport/shm_arena.h"
#include "transport/transport.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* In order of preference. */
static const struct transport *const transports[] = {&transport_p2p, &transport_shm, &transport_net};

struct conn_msg {
  char transport[16];
  uint32_t len;
  uint32_t pad;
  char info[CONN_INFO_BYTES];
};

#define ACK_TAG (1ull << 40)

static uint64_t conn_tag(int kind, int channel, int dir) {
  return (1ull << 61) | ((uint64_t)kind << 16) | ((uint64_t)channel << 8) | (uint64_t)dir;
}

static struct conn **find_extra(struct ncclComm *comm, int kind, int channel, int peer, int dir) {
  struct conn **p = &comm->extra_conns;
  for (; *p; p = &(*p)->next_extra)
    if ((*p)->kind == kind && (*p)->channel == channel && (*p)->peer == peer && (*p)->dir == dir)
      return p;
  return p; /* the empty end of the list, where a new one goes */
}

ncclResult_t transport_get_conn(struct ncclComm *comm, int kind, int channel, int peer, int dir,
                                struct conn **out) {
  struct conn **slot = kind == CONN_RING  ? (dir == CONN_SEND ? &comm->ring_send[channel] : &comm->ring_recv[channel])
                       : kind == CONN_P2P ? (dir == CONN_SEND ? &comm->p2p_send[peer] : &comm->p2p_recv[peer])
                                          : find_extra(comm, kind, channel, peer, dir);
  if (*slot == NULL) {
    struct conn *c;
    CHECK(UTIL_CALLOC(&c, 1, "a connection"));
    c->comm = comm;
    c->peer = peer;
    c->dir = dir;
    c->kind = kind;
    c->channel = channel;
    for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++) {
      if (transports[i]->can_connect(comm, peer)) {
        c->tr = transports[i];
        break;
      }
    }
    if (c->tr == NULL) {
      free(c);
      return err_set(ncclSystemError, "no transport can reach rank %d from rank %d", peer, comm->rank);
    }
    c->next_pending = comm->pending;
    comm->pending = c;
    *slot = c;
  }
  *out = *slot;
  return ncclSuccess;
}

static const char *dir_name(int dir) { return dir == CONN_SEND ? "send" : "receive"; }

/* Transports of a CUDA communicator allocate and map memory for its
 * device; one thread may set up several communicators on several. */
static ncclResult_t on_device(const struct conn *c) {
  return c->comm->is_host ? ncclSuccess : cuda_set_device(c->comm->cuda_dev);
}

static ncclResult_t publish(struct conn *c) {
  struct ncclComm *comm = c->comm;
  CHECK(on_device(c));
  struct conn_msg msg = {0};
  snprintf(msg.transport, sizeof msg.transport, "%s", c->tr->name);
  size_t len = sizeof msg.info;
  ncclResult_t r = c->tr->setup(c, msg.info, &len);
  if (r != ncclSuccess) {
    err_context("rank %d: setting up the %s connection with rank %d over %s", comm->rank, dir_name(c->dir), c->peer,
                c->tr->name);
    return r;
  }
  msg.len = (uint32_t)len;
  r = bootstrap_send(comm->boot, c->peer, conn_tag(c->kind, c->channel, c->dir), &msg, sizeof msg);
  if (r != ncclSuccess)
    err_context("rank %d: setting up the %s connection to rank %d", comm->rank, dir_name(c->dir), c->peer);
  return r;
}

ncclResult_t transport_connect_pending(struct ncclComm **comms, int ncomms) {
  int total = 0;
  for (int i = 0; i < ncomms; i++)
    for (struct conn *c = comms[i]->pending; c; c = c->next_pending)
      total++;
  if (total == 0)
    return ncclSuccess;
  struct conn **list;
  struct conn_msg *msgs;
  CHECK(UTIL_CALLOC(&list, total, "pending connections"));
  ncclResult_t r = UTIL_CALLOC(&msgs, total, "connection messages");
  if (r != ncclSuccess) {
    free(list);
    return r;
  }
  int k = 0;
  for (int i = 0; i < ncomms; i++)
    for (struct conn *c = comms[i]->pending; c; c = c->next_pending)
      list[k++] = c;
  /* Every side first publishes its information, then reads its peers':
   * one thread driving several ranks cannot deadlock on itself. */
  for (k = 0; k < total; k++)
    CHECK_GOTO(publish(list[k]), r, out);
  for (k = 0; k < total; k++) {
    struct conn *c = list[k];
    r = bootstrap_recv(c->comm->boot, c->peer, conn_tag(c->kind, c->channel, !c->dir), &msgs[k], sizeof msgs[k]);
    if (r != ncclSuccess) {
      err_context("rank %d: setting up the %s connection with rank %d", c->comm->rank, dir_name(c->dir), c->peer);
      goto out;
    }
    msgs[k].transport[sizeof msgs[k].transport - 1] = '\0';
    if (strcmp(msgs[k].transport, c->tr->name) != 0) {
      r = err_set(ncclInvalidUsage,
                  "rank %d chose transport %s to reach rank %d, but rank %d chose %s: the ranks' settings differ "
                  "(NCCL_SHM_DISABLE, NCCL_HOSTID?)",
                  c->comm->rank, c->tr->name, c->peer, c->peer, msgs[k].transport);
      goto out;
    }
  }
  /* One deadline for all: several communicators of a group each bound
   * it by their own timeout, and the shortest wins. */
  uint64_t deadline = UINT64_MAX;
  struct ncclComm *bound_by = NULL;
  for (int i = 0; i < ncomms; i++)
    if (comms[i]->pending && comm_deadline(comms[i]) < deadline) {
      deadline = comm_deadline(comms[i]);
      bound_by = comms[i];
    }
  struct waiter w;
  wait_init(&w, 0, WAIT_YIELD_NS);
  for (;;) {
    int left = 0;
    for (k = 0; k < total; k++) {
      struct conn *c = list[k];
      if (c->connected)
        continue;
      r = on_device(c);
      if (r == ncclSuccess)
        r = c->tr->connect(c, msgs[k].info, msgs[k].len);
      if (r == ncclSuccess) {
        c->connected = 1;
        static const char *kinds[] = {"ring", "p2p", "tree", "recursive doubling"};
        INFO(LOG_INIT, "channel %d: %s %s rank %d via %s", c->channel, kinds[c->kind],
             c->dir == CONN_SEND ? "to" : "from", c->peer, c->tr->name);
        wait_reset(&w);
        continue;
      }
      if (r != ncclInProgress) {
        err_context("rank %d: connecting to rank %d over %s", c->comm->rank, c->peer, c->tr->name);
        goto out;
      }
      if (comm_aborted(c->comm)) {
        r = err_set(ncclInvalidUsage, "the communicator was aborted while connecting to rank %d", c->peer);
        goto out;
      }
      if (w.spins > 4096 && (r = comm_peer_alive(c->comm, c->peer)) != ncclSuccess) {
        err_context("rank %d: connecting to rank %d over %s", c->comm->rank, c->peer, c->tr->name);
        goto out;
      }
      left++;
    }
    if (left == 0)
      break;
    if (time_ns() > deadline) {
      char bound[TIMEOUT_NAME_LEN];
      r = err_set(ncclRemoteError, "rank %d timed out after %s: %d connection(s) were not established",
                  bound_by->rank, comm_timeout_name(bound_by, bound, sizeof bound), left);
      goto out;
    }
    wait_pause(&w);
  }
  /* Each side tells its peer that it now holds what the peer shared
   * (a segment, an IPC handle), so that neither frees memory the other has
   * not mapped yet, whichever finishes its first operation sooner. */
  for (k = 0; k < total; k++) {
    char ack = 1;
    struct conn *c = list[k];
    CHECK_GOTO(bootstrap_send(c->comm->boot, c->peer, conn_tag(c->kind, c->channel, c->dir) | ACK_TAG, &ack, 1), r,
               out);
  }
  for (k = 0; k < total; k++) {
    char ack;
    struct conn *c = list[k];
    r = bootstrap_recv(c->comm->boot, c->peer, conn_tag(c->kind, c->channel, !c->dir) | ACK_TAG, &ack, 1);
    if (r != ncclSuccess) {
      err_context("rank %d: finishing the %s connection with rank %d", c->comm->rank, dir_name(c->dir), c->peer);
      goto out;
    }
  }
  for (int i = 0; i < ncomms; i++)
    comms[i]->pending = NULL;
  r = ncclSuccess;
out:
  free(list);
  free(msgs);
  return r;
}

void fifo_wake(_Atomic uint64_t *counter, _Atomic uint32_t *sleepers) {
  if (sleepers && atomic_load(sleepers))
    util_futex_wake_all(util_low_word(counter));
}

void transport_free_conn(struct conn *c) {
  if (!c)
    return;
  if (c->tr)
    c->tr->free(c);
  free(c);
}

void transport_each_conn(struct ncclComm *comm, void (*fn)(struct conn *, void *), void *arg) {
  for (int c = 0; c < LOOM_MAX_CHANNELS; c++) {
    if (comm->ring_send[c])
      fn(comm->ring_send[c], arg);
    if (comm->ring_recv[c])
      fn(comm->ring_recv[c], arg);
  }
  for (int p = 0; comm->p2p_send && p < comm->nranks; p++) {
    if (comm->p2p_send[p])
      fn(comm->p2p_send[p], arg);
    if (comm->p2p_recv[p])
      fn(comm->p2p_recv[p], arg);
  }
  for (struct conn *c = comm->extra_conns, *next; c; c = next) {
    next = c->next_extra; /* fn may free it */
    fn(c, arg);
  }
}

static void poison_conn(struct conn *c, void *why) {
  if (c->tr && c->priv)
    c->tr->poison(c, why);
}

void transport_poison_conns(struct ncclComm *comm, const char *why) {
  transport_each_conn(comm, poison_conn, (void *)why);
  arena_poison(comm, why);
}

ncclResult_t transport_peer_failed(struct conn *c, const char *why) {
  if (why && why[0] != '\0')
    return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation (its error: %s)", c->peer,
                   c->comm->peers[c->peer].hostname, why);
  char note[512];
  comm_note_exited(c->comm, -1, note, sizeof note);
  return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation%s", c->peer,
                 c->comm->peers[c->peer].hostname, note);
}

static void add_activity(struct conn *c, void *sum) {
  if (c->tr)
    *(uint64_t *)sum += transport_activity(c);
}

/* ---- the stubs for ops a transport does not need ---- */

ncclResult_t transport_no_progress(struct conn *c) { return ncclSuccess; }
ncclResult_t transport_no_failure(struct conn *c) { return ncclSuccess; }
uint64_t transport_no_activity(struct conn *c) { return 0; }
const char *transport_plain_name(const struct conn *c) { return c->tr->name; }
void transport_no_poison(struct conn *c, const char *why) {}
int transport_no_wait_fds(struct conn *c, struct pollfd *fds, int max) { return -1; }

_Static_assert(sizeof(struct slot_hdr) % sizeof(uint64_t) == 0, "a slot header is read in words");

int transport_fifo_next_hdr(struct conn *c, struct slot_hdr *out) {
  if (c->dir != CONN_RECV || !c->fifo.tail || !c->fifo.base)
    return 0;
  uint64_t head = atomic_load_explicit(c->fifo.head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(c->fifo.tail, memory_order_acquire);
  if (tail <= head)
    return 0;
  const char *at = c->fifo.hdrs ? c->fifo.hdrs + (head % NCCL_STEPS) * SLOT_HDR_BYTES : (const char *)fifo_hdr(&c->fifo, head);
  /* Word by word, as the kernel or the peer may be writing: the slot is
   * the one read only if head has not moved meanwhile, since a sender
   * rewrites a slot only once it has been released. */
  uint64_t w[sizeof *out / sizeof(uint64_t)];
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    w[i] = __atomic_load_n((const uint64_t *)at + i, __ATOMIC_RELAXED);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(c->fifo.head, memory_order_relaxed) != head)
    return 0;
  memcpy(out, w, sizeof *out);
  return 1;
}

static void free_one(struct conn *c, void *unused) { transport_free_conn(c); }

void transport_free_all(struct ncclComm *comm) {
  transport_each_conn(comm, free_one, NULL);
  memset(comm->ring_send, 0, sizeof comm->ring_send);
  memset(comm->ring_recv, 0, sizeof comm->ring_recv);
  if (comm->p2p_send)
    memset(comm->p2p_send, 0, sizeof *comm->p2p_send * (size_t)comm->nranks);
  if (comm->p2p_recv)
    memset(comm->p2p_recv, 0, sizeof *comm->p2p_recv * (size_t)comm->nranks);
  comm->extra_conns = NULL;
  comm->pending = NULL;
  comm->coll_conns = 0;
}

static void add_mem(struct conn *c, void *arg) {
  uint64_t *sum = arg;
  sum[0] += c->mem_dev;
  sum[1] += c->mem_host;
}

void transport_mem(struct ncclComm *comm, uint64_t *dev, uint64_t *host) {
  uint64_t sum[2] = {0, 0};
  transport_each_conn(comm, add_mem, sum);
  *dev = sum[0];
  *host = sum[1];
}

uint64_t transport_comm_activity(struct ncclComm *comm) {
  uint64_t a = 0;
  transport_each_conn(comm, add_activity, &a);
  return a;
}
