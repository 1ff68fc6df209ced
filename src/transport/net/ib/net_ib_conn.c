/*
 * IB connections: RC queue pairs, set up over a TCP connection that the
 * listen handle names (the handle itself travels over the bootstrap; the
 * plugin interface gives a plugin only that one-way handle, so the QP
 * numbers and addresses cross here, as in NCCL), and isend/irecv on top of
 * one-sided RDMA writes:
 *  - irecv posts a receive work request on every QP (it only catches the
 *    immediate) and RDMA-writes a clear-to-send entry (buffer address, rkey,
 *    size, sequence number) into the sender's CTS ring;
 *  - isend waits for the CTS entry of its sequence number, then RDMA-writes
 *    the data straight into the receiver's buffer with immediate, split
 *    across the QPs; the immediate carries the message size.
 * So data moves once, NIC to NIC, and the receiver's CPU only sees the
 * completion. Where that data landed in device memory (GPUDirect RDMA),
 * iflush reads one byte of it back over a QP connected to itself, as NCCL
 * does: the read cannot complete before the NIC's earlier writes have
 * reached the GPU.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/ib/net_ib.h"

#if LOOM_HAVE_IBVERBS_HEADERS
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IB_MAX_QPS 16
/* Requests in flight per connection, and the CTS ring's length: a receive
 * may only be announced once the one IB_MAX_REQS before it has completed,
 * so its ring slot has been read. */
#define IB_MAX_REQS 32
#define IB_WR_CTS 1 /* wr_id of CTS writes; requests are aligned pointers */

static const char ib_magic[8] = "LOOMIB1";

struct ib_handle {
  char magic[8];
  union sock_addr addr;
  uint64_t cookie;
};
_Static_assert(sizeof(struct ib_handle) <= NET_HANDLE_MAXSIZE, "IB handle too large");

/* What each side tells the other about its QPs. */
struct ib_info {
  uint64_t cookie;
  uint32_t nqps;
  uint32_t qpn[IB_MAX_QPS];
  uint16_t lid;
  uint8_t link_layer;
  uint8_t mtu;
  uint8_t gid[16];
  uint64_t cts_addr; /* sender: its CTS ring; receiver: 0 */
  uint32_t cts_rkey;
  char dev[IB_NAME_LEN];
};

struct ib_cts {
  uint64_t addr;
  uint32_t rkey;
  uint32_t size;
  _Atomic uint64_t seq; /* written last by the NIC: 0 until then */
};

struct ib_listen {
  int fd;
  int dev;
  uint64_t cookie;
  char where[SOCK_ADDR_STRLEN];
};

struct ib_comm;

enum ib_req_kind { IB_REQ_RECV = 0, IB_REQ_SEND = 1, IB_REQ_FLUSH = 2 };

struct ib_req {
  struct ib_comm *comm;
  int used, kind; /* enum ib_req_kind */
  int pending; /* completions still to come, one per QP */
  size_t size;
} __attribute__((aligned(8)));

struct ib_comm {
  int is_send;
  struct ib_dev *dev;
  /* Set-up: the TCP conversation that exchanges ib_info. The connection
   * stays open afterwards, idle: RC gives a receiver no word when its
   * sender dies, but the kernel closes this socket, which says so. */
  int state, fd;
  unsigned idle_tests;
  size_t io_done;
  struct ib_info local, remote;
  uint8_t ready;
  struct ib_listen *listen;
  char where[SOCK_ADDR_STRLEN];
  /* Verbs objects. */
  struct ibv_cq *cq;
  int nqps;
  struct ibv_qp *qp[IB_MAX_QPS];
  struct ib_cts *cts; /* send: the ring the peer writes; recv: what we write from */
  struct ibv_mr *cts_mr;
  /* Receive side with GPUDirect RDMA: the loopback QP that flushes, made
   * at the first iflush, and the host byte its reads land in. */
  struct ibv_qp *flush_qp;
  struct ibv_mr *flush_mr;
  char flush_buf[64];
  /* Requests, oldest first, in [head, tail). */
  struct ib_req reqs[IB_MAX_REQS];
  uint64_t head, tail;
  uint64_t seq; /* messages started: the CTS sequence */
  uint64_t completions; /* work completions seen, for LOOM_TIMEOUT */
  ncclResult_t failed;
  char why[LOOM_ERR_LEN];
};

struct ib_dev *ib_comm_dev(void *comm) { return ((struct ib_comm *)comm)->dev; }

struct ibv_qp *ib_comm_qp(void *comm, int i) {
  struct ib_comm *c = comm;
  return i >= 0 && i < c->nqps ? c->qp[i] : NULL;
}

static ncclResult_t comm_fail(struct ib_comm *c, ncclResult_t r) {
  if (c->failed == ncclSuccess) {
    c->failed = r;
    snprintf(c->why, sizeof c->why, "%s", err_thread_last());
  }
  return c->failed;
}

ncclResult_t ib_listen(int dev, void *handle, void **listen_comm) {
  CHECK(ib_devices_init());
  if (dev < 0 || dev >= ib_ndevs)
    return err_set(ncclInternalError, "IB plugin: no device %d", dev);
  struct sock_iface ifs[SOCK_MAX_IFACES];
  int nifs = 0;
  CHECK(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &nifs));
  struct ib_listen *l;
  CHECK(UTIL_CALLOC(&l, 1, "IB listener"));
  l->dev = dev;
  union sock_addr bind_addr = ifs[0].addr, bound;
  if (bind_addr.sa.sa_family == AF_INET)
    bind_addr.sin.sin_port = 0;
  else
    bind_addr.sin6.sin6_port = 0;
  ncclResult_t r = sock_listen(&bind_addr, &l->fd, &bound);
  if (r == ncclSuccess)
    r = util_random(&l->cookie, sizeof l->cookie);
  if (r != ncclSuccess) {
    if (l->fd > 0)
      close(l->fd);
    free(l);
    return r;
  }
  sock_set_nonblocking(l->fd);
  sock_addr_str(&bound, l->where, sizeof l->where);
  struct ib_handle h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, ib_magic, sizeof h.magic);
  h.addr = bound;
  h.cookie = l->cookie;
  memcpy(handle, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

/* Moves bytes of a set-up message; *complete once all of it has. */
static ncclResult_t move(struct ib_comm *c, void *buf, size_t len, int sending, int *complete) {
  while (c->io_done < len) {
    char *p = (char *)buf + c->io_done;
    ssize_t n = sending ? send(c->fd, p, len - c->io_done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->fd, p, len - c->io_done, MSG_DONTWAIT);
    if (n > 0) {
      c->io_done += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      *complete = 0;
      return ncclSuccess;
    }
    return err_set(ncclRemoteError, "NET/IB: the set-up connection with %s broke: %s", c->where,
                   n == 0 ? "closed by the peer" : strerror(errno));
  }
  c->io_done = 0;
  *complete = 1;
  return ncclSuccess;
}

static ncclResult_t verbs_fail(struct ib_comm *c, const char *what) {
  return err_set(ncclSystemError, "NET/IB %s:%d: %s failed: %s", c->dev->name, c->dev->port, what, strerror(errno));
}

/* An RC QP on the comm's CQ, moved to INIT with `access` for peers. */
static ncclResult_t qp_new(struct ib_comm *c, int depth, int access, struct ibv_qp **out) {
  struct ib_dev *d = c->dev;
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = c->cq;
  ia.recv_cq = c->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = (uint32_t)depth;
  ia.cap.max_recv_wr = (uint32_t)depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ib_ibv->create_qp(d->pd, &ia);
  if (!qp)
    return verbs_fail(c, "ibv_create_qp");
  *out = qp;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = (uint8_t)d->port;
  a.qp_access_flags = (unsigned)access;
  if (ib_ibv->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return verbs_fail(c, "moving a QP to INIT");
  return ncclSuccess;
}

/* The CQ, the QPs in INIT, the CTS ring, and this side's ib_info. */
static ncclResult_t create_qps(struct ib_comm *c) {
  struct ib_dev *d = c->dev;
  c->nqps = (int)param_int(P_IB_QPS_PER_CONNECTION);
  if (c->is_send == 0)
    c->nqps = (int)c->remote.nqps; /* the sender decides; both must match */
  int depth = 2 * IB_MAX_REQS + 8;
  c->cq = ib_ibv->create_cq(d->ctx, 2 * depth * c->nqps, NULL, NULL, 0);
  if (!c->cq)
    return verbs_fail(c, "ibv_create_cq");
  for (int i = 0; i < c->nqps; i++) {
    CHECK(qp_new(c, depth, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &c->qp[i]));
    c->local.qpn[i] = c->qp[i]->qp_num;
  }
  size_t ring = IB_MAX_REQS * sizeof(struct ib_cts);
  if (posix_memalign((void **)&c->cts, 4096, ring) != 0)
    return err_set(ncclSystemError, "out of memory for an IB CTS ring");
  memset(c->cts, 0, ring);
  c->cts_mr = ib_ibv->reg_mr(d->pd, c->cts, ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!c->cts_mr)
    return verbs_fail(c, "ibv_reg_mr of the CTS ring");
  c->local.nqps = (uint32_t)c->nqps;
  c->local.lid = d->lid;
  c->local.link_layer = (uint8_t)d->link_layer;
  c->local.mtu = (uint8_t)d->mtu;
  memcpy(c->local.gid, d->gid.raw, sizeof c->local.gid);
  if (c->is_send) {
    c->local.cts_addr = (uint64_t)(uintptr_t)c->cts;
    c->local.cts_rkey = c->cts_mr->rkey;
  }
  snprintf(c->local.dev, sizeof c->local.dev, "%.48s:%d", d->name, d->port);
  return ncclSuccess;
}

/* INIT -> RTR -> RTS towards QP `qpn` at the address `r` describes. */
static ncclResult_t qp_ready(struct ib_comm *c, struct ibv_qp *qp, const struct ib_info *r, uint32_t qpn) {
  struct ib_dev *d = c->dev;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)LOOM_MIN((int)d->mtu, (int)r->mtu);
  a.dest_qp_num = qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)d->port;
  a.ah_attr.sl = (uint8_t)param_int(P_IB_SL);
  if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, r->gid, sizeof r->gid);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = (uint8_t)param_int(P_IB_TC);
  } else {
    a.ah_attr.dlid = r->lid;
  }
  if (ib_ibv->modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
    return verbs_fail(c, "moving a QP to RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = (uint8_t)param_int(P_IB_TIMEOUT);
  a.retry_cnt = (uint8_t)param_int(P_IB_RETRY_CNT);
  a.rnr_retry = 7; /* forever: a receiver that is late is not an error */
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (ib_ibv->modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC) != 0)
    return verbs_fail(c, "moving a QP to RTS");
  return ncclSuccess;
}

/* INIT -> RTR -> RTS towards the peer's QPs. */
static ncclResult_t connect_qps(struct ib_comm *c) {
  struct ib_dev *d = c->dev;
  const struct ib_info *r = &c->remote;
  if ((int)r->nqps != c->nqps)
    return err_set(ncclInvalidUsage, "NET/IB: %s uses %u QPs per connection and this side %d: set "
                   "NCCL_IB_QPS_PER_CONNECTION alike on all ranks", c->where, r->nqps, c->nqps);
  if ((r->link_layer == IBV_LINK_LAYER_ETHERNET) != (d->link_layer == IBV_LINK_LAYER_ETHERNET))
    return err_set(ncclInvalidUsage, "NET/IB: %s:%d is %s and the peer's %s at %s is %s: they cannot connect",
                   d->name, d->port, d->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", r->dev,
                   c->where, r->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
  for (int i = 0; i < c->nqps; i++)
    CHECK(qp_ready(c, c->qp[i], r, r->qpn[i]));
  return ncclSuccess;
}

/* Sender: connect, send our info, receive the receiver's (its QPs are then
 * ready to receive), connect our QPs, and say so with one byte, after
 * which the receiver may write CTS entries to us. */
ncclResult_t ib_connect(int dev, const void *handle, void **send_comm) {
  struct ib_comm *c = *send_comm;
  if (c == NULL) {
    struct ib_handle h;
    memcpy(&h, handle, sizeof h);
    if (memcmp(h.magic, ib_magic, sizeof h.magic) != 0)
      return err_set(ncclInternalError, "IB plugin: the connection handle is not an IB handle");
    CHECK(ib_devices_init());
    if (dev < 0 || dev >= ib_ndevs)
      return err_set(ncclInternalError, "IB plugin: no device %d", dev);
    CHECK(UTIL_CALLOC(&c, 1, "IB connection"));
    *send_comm = c;
    c->is_send = 1;
    c->dev = &ib_devs[dev];
    c->fd = -1;
    sock_addr_str(&h.addr, c->where, sizeof c->where);
    c->local.cookie = h.cookie;
    CHECK(create_qps(c));
    c->fd = socket(h.addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
      return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
    sock_set_nodelay(c->fd);
    if (connect(c->fd, &h.addr.sa, sock_addr_len(&h.addr)) != 0 && errno != EINPROGRESS)
      return err_set(ncclRemoteError, "NET/IB: cannot connect to %s: %s", c->where, strerror(errno));
  }
  int complete = 0;
  switch (c->state) {
  case 0: {
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0)
      return ncclInProgress;
    int e = 0;
    socklen_t len = sizeof e;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len);
    if (e != 0)
      return err_set(ncclRemoteError, "NET/IB: cannot connect to %s: %s", c->where, strerror(e));
    c->state = 1;
  } /* fall through */
  case 1:
    CHECK(move(c, &c->local, sizeof c->local, 1, &complete));
    if (!complete)
      return ncclInProgress;
    c->state = 2; /* fall through */
  case 2:
    CHECK(move(c, &c->remote, sizeof c->remote, 0, &complete));
    if (!complete)
      return ncclInProgress;
    c->remote.dev[sizeof c->remote.dev - 1] = '\0';
    CHECK(connect_qps(c));
    c->state = 3; /* fall through */
  case 3:
    CHECK(move(c, &c->ready, 1, 1, &complete));
    if (!complete)
      return ncclInProgress;
    c->state = 4;
  }
  return ncclSuccess;
}

ncclResult_t ib_accept(void *listen_comm, void **recv_comm) {
  struct ib_listen *l = listen_comm;
  struct ib_comm *c = *recv_comm;
  int complete = 0;
  for (;;) {
    if (c == NULL) {
      int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
          return ncclInProgress;
        return err_set(ncclSystemError, "NET/IB: accept on %s failed: %s", l->where, strerror(errno));
      }
      CHECK(UTIL_CALLOC(&c, 1, "IB connection"));
      c->fd = fd;
      c->dev = &ib_devs[l->dev];
      c->listen = l;
      union sock_addr peer;
      socklen_t alen = sizeof peer;
      memset(&peer, 0, sizeof peer);
      getpeername(fd, &peer.sa, &alen);
      sock_addr_str(&peer, c->where, sizeof c->where);
      sock_set_nodelay(fd);
      *recv_comm = c;
    }
    if (c->state == 0) {
      ncclResult_t r = move(c, &c->remote, sizeof c->remote, 0, &complete);
      if (r == ncclSuccess && !complete)
        return ncclInProgress;
      if (r == ncclSuccess && c->remote.cookie == l->cookie && c->remote.nqps >= 1 && c->remote.nqps <= IB_MAX_QPS) {
        c->remote.dev[sizeof c->remote.dev - 1] = '\0';
        break;
      }
      /* Somebody else's connection: drop it and keep waiting for ours. */
      WARN("NET/IB: dropped a connection to %s from %s that did not present the expected cookie", l->where,
           c->where);
      close(c->fd);
      free(c);
      c = NULL;
      *recv_comm = NULL;
      continue;
    }
    break;
  }
  switch (c->state) {
  case 0:
    c->local.cookie = c->remote.cookie;
    CHECK(create_qps(c));
    CHECK(connect_qps(c));
    c->state = 1; /* fall through */
  case 1:
    CHECK(move(c, &c->local, sizeof c->local, 1, &complete));
    if (!complete)
      return ncclInProgress;
    c->state = 2; /* fall through */
  case 2:
    CHECK(move(c, &c->ready, 1, 0, &complete));
    if (!complete)
      return ncclInProgress;
    c->state = 3;
  }
  return ncclSuccess;
}

static struct ib_req *req_new(struct ib_comm *c, int kind, size_t size) {
  if (c->tail - c->head >= IB_MAX_REQS)
    return NULL;
  struct ib_req *r = &c->reqs[c->tail % IB_MAX_REQS];
  r->comm = c;
  r->used = 1;
  r->kind = kind;
  r->pending = c->nqps;
  r->size = size;
  c->tail++;
  return r;
}

static ncclResult_t post_failed(struct ib_comm *c, const char *what, int rc) {
  return comm_fail(c, err_set(ncclSystemError, "NET/IB %s:%d: posting %s to %s failed: %s", c->dev->name,
                              c->dev->port, what, c->where, strerror(rc)));
}

ncclResult_t ib_isend(void *send_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ib_comm *c = send_comm;
  *request = NULL;
  if (c->failed)
    return err_set(c->failed, "%s", c->why);
  struct ib_cts *slot = &c->cts[c->seq % IB_MAX_REQS];
  if (atomic_load_explicit(&slot->seq, memory_order_acquire) != c->seq + 1 || c->tail - c->head >= IB_MAX_REQS)
    return ncclSuccess; /* the receiver has not posted its buffer yet */
  if (size > slot->size)
    return comm_fail(c, err_set(ncclInvalidUsage, "NET/IB: a message of %zu bytes for a %u-byte receive buffer at %s",
                                size, slot->size, c->where));
  struct ib_req *r = req_new(c, IB_REQ_SEND, size);
  struct ibv_mr *mr = ((struct ib_mr_entry *)mhandle)->mr;
  size_t chunk = (size + (size_t)c->nqps - 1) / (size_t)c->nqps;
  for (int i = 0; i < c->nqps; i++) {
    size_t off = LOOM_MIN(size, (size_t)i * chunk), len = LOOM_MIN(chunk, size - off);
    struct ibv_sge sge = {.addr = (uintptr_t)data + off, .length = (uint32_t)len, .lkey = mr->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)r;
    wr.sg_list = len ? &sge : NULL;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl((uint32_t)size);
    wr.wr.rdma.remote_addr = slot->addr + off;
    wr.wr.rdma.rkey = slot->rkey;
    int rc = ibv_post_send(c->qp[i], &wr, &bad);
    if (rc != 0)
      return post_failed(c, "an RDMA write", rc);
  }
  c->seq++;
  *request = r;
  return ncclSuccess;
}

ncclResult_t ib_irecv(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ib_comm *c = recv_comm;
  *request = NULL;
  if (c->failed)
    return err_set(c->failed, "%s", c->why);
  if (size > UINT32_MAX)
    return err_set(ncclInternalError, "NET/IB: a %zu-byte receive is larger than an immediate can describe", size);
  struct ib_req *r = req_new(c, IB_REQ_RECV, size);
  if (!r)
    return ncclSuccess;
  for (int i = 0; i < c->nqps; i++) {
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)r;
    int rc = ibv_post_recv(c->qp[i], &wr, &bad);
    if (rc != 0)
      return post_failed(c, "a receive", rc);
  }
  struct ib_cts *e = &c->cts[c->seq % IB_MAX_REQS];
  e->addr = (uintptr_t)data;
  e->rkey = ((struct ib_mr_entry *)mhandle)->mr->rkey;
  e->size = (uint32_t)size;
  atomic_store_explicit(&e->seq, c->seq + 1, memory_order_relaxed);
  struct ibv_sge sge = {.addr = (uintptr_t)e, .length = sizeof *e, .lkey = c->cts_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = IB_WR_CTS;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = c->remote.cts_addr + (c->seq % IB_MAX_REQS) * sizeof *e;
  wr.wr.rdma.rkey = c->remote.cts_rkey;
  int rc = ibv_post_send(c->qp[0], &wr, &bad);
  if (rc != 0)
    return post_failed(c, "a clear-to-send write", rc);
  c->seq++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t wc_failed(struct ib_comm *c, const struct ibv_wc *wc) {
  int kind = wc->wr_id == IB_WR_CTS ? -1 : ((struct ib_req *)(uintptr_t)wc->wr_id)->kind;
  if (kind == IB_REQ_FLUSH)
    return comm_fail(c, err_set(ncclSystemError,
                                "NET/IB %s:%d: the flush of data received from %s (%s) into device memory, a one-byte "
                                "RDMA read over a loopback QP, failed: %s (completion status %d, vendor error 0x%x, "
                                "QP 0x%x)",
                                c->dev->name, c->dev->port, c->where, c->remote.dev,
                                ib_ibv->wc_status_str(wc->status), (int)wc->status, wc->vendor_err, wc->qp_num));
  const char *what = kind < 0 ? "a clear-to-send RDMA write" : kind == IB_REQ_SEND ? "an RDMA write of data"
                                                                                   : "a receive";
  return comm_fail(c, err_set(ncclRemoteError,
                              "NET/IB %s:%d: %s to %s (%s) failed: %s (completion status %d, vendor error 0x%x, "
                              "QP 0x%x)",
                              c->dev->name, c->dev->port, what, c->where, c->remote.dev,
                              ib_ibv->wc_status_str(wc->status), (int)wc->status, wc->vendor_err, wc->qp_num));
}

/* A failed work request puts its QP in the error state, which flushes the
 * others: the failure reported is the first one that is not a flush, so
 * the user reads the cause (say, retries exceeded) rather than its echo. */
static ncclResult_t poll_cq(struct ib_comm *c) {
  struct ibv_wc wc[16], bad;
  int have_bad = 0;
  for (;;) {
    int n = ibv_poll_cq(c->cq, 16, wc);
    if (n < 0)
      return comm_fail(c, err_set(ncclSystemError, "NET/IB %s:%d: ibv_poll_cq failed", c->dev->name, c->dev->port));
    /* Each QP's part of a message, and each clear-to-send, completes on
     * its own: what RC lets one see of a message under way. */
    c->completions += (uint64_t)n;
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (!have_bad || (bad.status == IBV_WC_WR_FLUSH_ERR && wc[i].status != IBV_WC_WR_FLUSH_ERR))
          bad = wc[i];
        have_bad = 1;
        continue;
      }
      if (have_bad || wc[i].wr_id == IB_WR_CTS)
        continue;
      struct ib_req *r = (struct ib_req *)(uintptr_t)wc[i].wr_id;
      if (r->kind == IB_REQ_RECV) {
        size_t got = ntohl(wc[i].imm_data);
        if (got > r->size)
          return comm_fail(c, err_set(ncclRemoteError, "NET/IB: %s said it wrote %zu bytes into a %zu-byte buffer",
                                      c->where, got, r->size));
        r->size = got;
      }
      r->pending--;
    }
    if (n < 16)
      return have_bad ? wc_failed(c, &bad) : ncclSuccess;
  }
}

/* Nothing is ever sent on the set-up connection after the handshake, so
 * anything it reports is the end: the peer process exited or closed. Looked
 * at now and then while a request waits, to keep syscalls off the path. */
static ncclResult_t check_peer(struct ib_comm *c) {
  if (c->fd < 0 || ++c->idle_tests % 64 != 0)
    return ncclSuccess;
  char b;
  ssize_t n = recv(c->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    return comm_fail(c, err_set(ncclRemoteError, "NET/IB %s:%d: the set-up connection with %s (%s) %s",
                                c->dev->name, c->dev->port, c->where, c->remote.dev, sock_broken_reason(n, errno)));
  return ncclSuccess;
}

uint64_t ib_activity(void *comm) { return ((struct ib_comm *)comm)->completions; }

ncclResult_t ib_test(void *request, int *done, size_t *size) {
  struct ib_req *r = request;
  struct ib_comm *c = r->comm;
  *done = 0;
  if (r->pending > 0 && !c->failed && poll_cq(c) == ncclSuccess && r->pending > 0)
    check_peer(c);
  if (r->pending > 0) {
    if (c->failed)
      return err_set(c->failed, "%s", c->why);
    return ncclSuccess;
  }
  *done = 1;
  if (size)
    *size = r->size;
  r->used = 0;
  while (c->head != c->tail && !c->reqs[c->head % IB_MAX_REQS].used)
    c->head++;
  return ncclSuccess;
}

/* The loopback QP: connected to itself, at this port's own address. */
static ncclResult_t flush_open(struct ib_comm *c) {
  CHECK(qp_new(c, IB_MAX_REQS, IBV_ACCESS_REMOTE_READ, &c->flush_qp));
  CHECK(qp_ready(c, c->flush_qp, &c->local, c->flush_qp->qp_num));
  c->flush_mr = ib_ibv->reg_mr(c->dev->pd, c->flush_buf, sizeof c->flush_buf, IBV_ACCESS_LOCAL_WRITE);
  if (!c->flush_mr)
    return verbs_fail(c, "ibv_reg_mr of the flush buffer");
  return ncclSuccess;
}

ncclResult_t ib_iflush(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ib_comm *c = recv_comm;
  *request = NULL;
  if (c->failed)
    return err_set(c->failed, "%s", c->why);
  /* As NCCL: NCCL_GDR_FLUSH_DISABLE leaves the data's visibility to the
   * hardware, and an empty receive wrote nothing to flush. */
  if (size == 0 || param_int(P_GDR_FLUSH_DISABLE))
    return ncclSuccess;
  if (!c->flush_qp) {
    ncclResult_t res = flush_open(c);
    if (res != ncclSuccess)
      return comm_fail(c, res);
  }
  struct ib_req *r = req_new(c, IB_REQ_FLUSH, 0);
  if (!r)
    return err_set(ncclInternalError, "NET/IB: no request left for a flush (%d in flight)", IB_MAX_REQS);
  r->pending = 1;
  struct ibv_sge sge = {.addr = (uintptr_t)c->flush_buf, .length = 1, .lkey = c->flush_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = (uintptr_t)r;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uintptr_t)data;
  wr.wr.rdma.rkey = ((struct ib_mr_entry *)mhandle)->mr->rkey;
  int rc = ibv_post_send(c->flush_qp, &wr, &bad);
  if (rc != 0)
    return post_failed(c, "a flush (RDMA read)", rc);
  *request = r;
  return ncclSuccess;
}

ncclResult_t ib_close(void *comm) {
  struct ib_comm *c = comm;
  if (!c)
    return ncclSuccess;
  if (c->flush_qp)
    ib_ibv->destroy_qp(c->flush_qp);
  if (c->flush_mr)
    ib_ibv->dereg_mr(c->flush_mr);
  for (int i = 0; i < c->nqps; i++)
    if (c->qp[i])
      ib_ibv->destroy_qp(c->qp[i]);
  if (c->cts_mr)
    ib_ibv->dereg_mr(c->cts_mr);
  if (c->cq)
    ib_ibv->destroy_cq(c->cq);
  if (c->fd >= 0)
    close(c->fd);
  free(c->cts);
  free(c);
  return ncclSuccess;
}

ncclResult_t ib_close_listen(void *listen_comm) {
  struct ib_listen *l = listen_comm;
  if (l) {
    close(l->fd);
    free(l);
  }
  return ncclSuccess;
}
#endif
