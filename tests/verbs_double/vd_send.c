/*
 * The send side of the verbs test double: posting, and executing work
 * requests against the peer QP. There are no helper threads: a QP's WRs
 * run in order inside its own process's verbs calls (post_send runs them at
 * once; a WR the receiver was not ready for, RNR, is retried by later
 * post_send and poll_cq calls once the responder's RNR timer has passed).
 * Bytes move with process_vm_writev/readv straight into or out of the
 * peer's registered memory; the peer's CPU takes no part, and its receive
 * completion is pushed after the data is in place. Where either end is
 * CUDA device memory (vd_cuda.c), bytes go through a bounce buffer of this
 * process, copied to and from the device by its CUDA driver.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "vd_internal.h"

#define VD_RNR (-1)       /* the responder has no receive WR */
#define VD_NOT_READY (-2) /* the responder is not yet at RTR: packets dropped */

static _Atomic long vd_send_count; /* send WRs posted by this process */

/* The RNR NAK timer encoding of the IB spec, in microseconds. */
static const uint32_t vd_rnr_us[32] = {
    655360, 10,   20,   30,   40,    60,    80,    120,   160,   240,   320,
    480,    640,  960,  1280, 1920,  2560,  3840,  5120,  7680,  10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

uint32_t vd_vendor_err(int status) {
  switch (status) {
  case IBV_WC_LOC_LEN_ERR: return 0x01;
  case IBV_WC_LOC_QP_OP_ERR: return 0x02;
  case IBV_WC_LOC_PROT_ERR: return 0x04;
  case IBV_WC_WR_FLUSH_ERR: return 0x05;
  case IBV_WC_MW_BIND_ERR: return 0x06;
  case IBV_WC_BAD_RESP_ERR: return 0x10;
  case IBV_WC_LOC_ACCESS_ERR: return 0x11;
  case IBV_WC_REM_INV_REQ_ERR: return 0x12;
  case IBV_WC_REM_ACCESS_ERR: return 0x13;
  case IBV_WC_REM_OP_ERR: return 0x14;
  case IBV_WC_RETRY_EXC_ERR: return 0x15;
  case IBV_WC_RNR_RETRY_EXC_ERR: return 0x16;
  case IBV_WC_REM_ABORT_ERR: return 0x22;
  default: return 0;
  }
}

static struct vd_swqe *vd_swqe_at(struct vd_qp *q, uint64_t seq) {
  return (struct vd_swqe *)(q->sq + (size_t)(seq % q->cap.max_send_wr) * q->sq_stride);
}

static int vd_wc_opcode(int wr_opcode) {
  switch (wr_opcode) {
  case IBV_WR_RDMA_WRITE:
  case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
  case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
  default: return IBV_WC_SEND;
  }
}

int vd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  struct vd_qp *q = (struct vd_qp *)qp;
  long fail_nth;
  int fail_status, rc = 0;
  vd_fail_config(&fail_nth, &fail_status);
  pthread_mutex_lock(&q->sq_lock);
  for (; wr; wr = wr->next) {
    /* As mlx5: below RTS is refused; in the error state the WR is taken
     * and flushed. */
    uint32_t state = atomic_load(&q->shm->state);
    if (state < IBV_QPS_RTS || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge ||
        (wr->send_flags & ~(unsigned)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED |
                                      IBV_SEND_INLINE))) {
      rc = EINVAL;
      break;
    }
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
        wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
        wr->opcode != IBV_WR_RDMA_READ) {
      rc = EINVAL; /* atomics, memory windows, invalidation: not in this double */
      break;
    }
    uint64_t length = 0;
    for (int i = 0; i < wr->num_sge; i++)
      length += wr->sg_list[i].length;
    int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
    if (inl && (wr->opcode == IBV_WR_RDMA_READ || length > q->cap.max_inline_data)) {
      rc = EINVAL;
      break;
    }
    if (q->sq_posted - atomic_load(&q->sq_retired) >= q->cap.max_send_wr) {
      rc = ENOMEM;
      break;
    }
    struct vd_swqe *w = vd_swqe_at(q, q->sq_posted);
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->flags = wr->send_flags;
    w->imm = wr->imm_data;
    w->remote_addr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    w->num_sge = wr->num_sge;
    w->length = length;
    w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) || q->sq_sig_all;
    w->inline_len = 0;
    if (inl) {
      /* Inline data is taken now; the buffers need no lkey and may be
       * reused as soon as post_send returns. */
      unsigned char *dst = (unsigned char *)&w->sge[q->cap.max_send_sge];
      for (int i = 0; i < wr->num_sge; i++) {
        memcpy(dst + w->inline_len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        w->inline_len += wr->sg_list[i].length;
      }
      w->num_sge = 0;
    } else if (wr->num_sge) {
      memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
    }
    long nth = atomic_fetch_add(&vd_send_count, 1) + 1;
    w->inject = fail_nth && nth == fail_nth ? fail_status : 0;
    q->sq_posted++;
  }
  if (q->sq_exec < q->sq_posted)
    vd_qp_progress(q);
  pthread_mutex_unlock(&q->sq_lock);
  if (rc && bad)
    *bad = wr;
  return rc;
}

static struct vd_peer *vd_peer_get(struct vd_qp *q) {
  struct vd_peer *p = &q->peer;
  uint32_t want = q->attr.dest_qp_num;
  if (p->qp && p->qpn == want)
    return p;
  vd_peer_drop(p);
  struct vd_qp_shm *r = vd_shm_map(VD_KIND_QP, want, &p->qp_len);
  if (!r)
    return NULL;
  p->qp = r;
  p->qpn = want;
  p->pid = r->hdr.owner_pid;
  /* The pidfd pins the owner: checked alive after opening it, it cannot
   * name a process that later reused the pid. */
  p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
  if (p->pidfd < 0 || !vd_hdr_alive(&r->hdr) ||
      !(p->pd = vd_shm_map(VD_KIND_PD, r->pd_id, &p->pd_len)) ||
      !(p->cq = vd_shm_map(VD_KIND_CQ, r->recv_cq_id, &p->cq_len))) {
    vd_peer_drop(p);
    return NULL;
  }
  return p;
}

static int vd_peer_dead(const struct vd_peer *p) {
  struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
  return atomic_load(&p->qp->hdr.gone) || poll(&pf, 1, 0) != 0;
}

/* Whether the packets of q reach r: r's port must be up and its address
 * the one q was given (RoCE: dgid among its GIDs; IB: its LID). */
static int vd_addr_ok(const struct vd_qp *q, const struct vd_qp_shm *r) {
  const struct vd_port_spec *ps = &q->ctx->dev->port[q->attr.port_num - 1];
  const struct ibv_ah_attr *ah = &q->attr.ah_attr;
  if (!ps->active || !r->port_num || !r->port_active || r->link_layer != ps->link_layer)
    return 0;
  if (ps->link_layer == IBV_LINK_LAYER_ETHERNET) {
    for (uint32_t i = 0; ah->is_global && i < r->ngid; i++)
      if (memcmp(&ah->grh.dgid, &r->gid[i], sizeof(r->gid[i])) == 0)
        return 1;
    return 0;
  }
  if (ah->dlid != r->lid)
    return 0;
  return !ah->is_global || memcmp(&ah->grh.dgid, &r->gid[0], sizeof(r->gid[0])) == 0;
}

/* Drops the first n bytes of an iovec array. */
static void vd_iov_advance(struct iovec **v, int *cnt, size_t n) {
  while (n && *cnt) {
    size_t k = n < (*v)->iov_len ? n : (*v)->iov_len;
    (*v)->iov_base = (char *)(*v)->iov_base + k;
    (*v)->iov_len -= k;
    n -= k;
    if ((*v)->iov_len == 0) {
      (*v)++;
      (*cnt)--;
    }
  }
}

/* Moves all bytes between the local and remote vectors; 0 or an errno. */
static int vd_move(pid_t pid, int write, struct iovec *l, int nl, struct iovec *r, int nr) {
  size_t total = 0;
  for (int i = 0; i < nl; i++)
    total += l[i].iov_len;
  while (total) {
    ssize_t n = write ? process_vm_writev(pid, l, (unsigned long)nl, r, (unsigned long)nr, 0)
                      : process_vm_readv(pid, l, (unsigned long)nl, r, (unsigned long)nr, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return errno;
    if (n == 0)
      return EFAULT;
    /* A partial transfer stops at a fault; going on from there makes the
     * next call report it. */
    total -= (size_t)n;
    vd_iov_advance(&l, &nl, (size_t)n);
    vd_iov_advance(&r, &nr, (size_t)n);
  }
  return 0;
}

static int vd_move_status(int err, const struct iovec *l, int nl) {
  static _Atomic int eperm_told;
  switch (err) {
  case 0: return IBV_WC_SUCCESS;
  case ESRCH: return IBV_WC_RETRY_EXC_ERR; /* the peer process is gone */
  case EPERM:
    if (!atomic_exchange(&eperm_told, 1))
      vd_log("process_vm_writev/readv into the peer failed with EPERM: both processes must run "
             "as the same user (or root, or with CAP_SYS_PTRACE); completing with "
             "REM_ACCESS_ERR");
    return IBV_WC_REM_ACCESS_ERR;
  default:
    for (int i = 0; i < nl; i++)
      if (!vd_range_mapped((uintptr_t)l[i].iov_base, l[i].iov_len))
        return IBV_WC_LOC_PROT_ERR;
    return IBV_WC_REM_ACCESS_ERR; /* the peer unmapped memory it had registered */
  }
}

/* Where an MR's bytes at owner address `va` are for this process: the
 * address itself (host memory of `owner`, *dev -1) or a device pointer
 * valid here and its device. 0, or the status of a failure. */
static int vd_reach(pid_t owner, int local, uint64_t va, const struct vd_mem *m, void **addr, int *dev) {
  *dev = -1;
  *addr = (void *)(uintptr_t)va;
  if (m->kind != VD_MEM_CUDA)
    return IBV_WC_SUCCESS;
  uint64_t here;
  int r = vd_cuda_resolve(owner, m, va, &here, dev);
  if (r) {
    vd_log("device memory of pid %d on GPU %s is out of reach here: CUDA driver error %d", (int)owner, m->busid, r);
    return local ? IBV_WC_LOC_PROT_ERR : IBV_WC_REM_ACCESS_ERR;
  }
  *addr = (void *)(uintptr_t)here;
  return IBV_WC_SUCCESS;
}

/* One end of a transfer: segments of host memory of `pid`, or of device
 * memory reachable here (dev[i] >= 0). */
struct vd_span {
  struct iovec *v;
  const int *dev;
  int n;
  pid_t pid;
  int local; /* this process's own SGEs: a fault there is a local one */
};

/* n bytes at `off` of segment i to (into_buf) or from the bounce buffer. */
static int vd_span_io(const struct vd_span *s, int i, size_t off, char *buf, size_t n, int into_buf) {
  char *a = (char *)s->v[i].iov_base + off;
  if (s->dev[i] >= 0) {
    int r = into_buf ? vd_cuda_copy(s->dev[i], (uintptr_t)buf, (uintptr_t)a, n)
                     : vd_cuda_copy(s->dev[i], (uintptr_t)a, (uintptr_t)buf, n);
    if (r == 0)
      return IBV_WC_SUCCESS;
    vd_log("a copy of %zu bytes %s device memory at %p failed: CUDA driver error %d", n, into_buf ? "from" : "to",
           (void *)a, r);
    return s->local ? IBV_WC_LOC_PROT_ERR : IBV_WC_REM_ACCESS_ERR;
  }
  struct iovec lv = {buf, n}, rv = {a, n};
  int err = vd_move(s->pid, !into_buf, &lv, 1, &rv, 1);
  if (err == 0)
    return IBV_WC_SUCCESS;
  return s->local ? IBV_WC_LOC_PROT_ERR : vd_move_status(err, NULL, 0);
}

/* n bytes between the bounce buffer and `s` from segment *i, offset *off
 * on, which it moves past them. */
static int vd_span_pass(const struct vd_span *s, int *i, size_t *off, char *buf, size_t n, int into_buf) {
  int st = IBV_WC_SUCCESS;
  for (size_t done = 0; done < n && st == IBV_WC_SUCCESS && *i < s->n;) {
    size_t k = s->v[*i].iov_len - *off < n - done ? s->v[*i].iov_len - *off : n - done;
    st = vd_span_io(s, *i, *off, buf + done, k, into_buf);
    done += k;
    if ((*off += k) == s->v[*i].iov_len) {
      (*i)++;
      *off = 0;
    }
  }
  return st;
}

/* Moves all of `src` into `dst` through a bounce buffer, a piece at a
 * time: one end at least is device memory. */
static int vd_xfer(const struct vd_span *src, const struct vd_span *dst) {
  size_t total = 0;
  for (int i = 0; i < src->n; i++)
    total += src->v[i].iov_len;
  size_t cap = total < (1u << 20) ? total : (1u << 20);
  char *buf = malloc(cap ? cap : 1);
  if (!buf)
    return IBV_WC_GENERAL_ERR;
  int si = 0, di = 0, st = IBV_WC_SUCCESS;
  size_t so = 0, dof = 0;
  while (total && st == IBV_WC_SUCCESS) {
    size_t n = total < cap ? total : cap;
    st = vd_span_pass(src, &si, &so, buf, n, 1);
    if (st == IBV_WC_SUCCESS)
      st = vd_span_pass(dst, &di, &dof, buf, n, 0);
    total -= n;
  }
  free(buf);
  return st;
}

/* The WR's bytes between its local segments and the remote ones, in the
 * direction `write` says; a completion status. */
static int vd_transfer(pid_t pid, int write, struct iovec *l, const int *ldev, int nl, struct iovec *r,
                       const int *rdev, int nr) {
  int dev = 0;
  for (int i = 0; i < nl; i++)
    dev |= ldev[i] >= 0;
  for (int i = 0; i < nr; i++)
    dev |= rdev[i] >= 0;
  if (!dev)
    return vd_move_status(vd_move(pid, write, l, nl, r, nr), l, nl);
  struct vd_span ls = {l, ldev, nl, getpid(), 1}, rs = {r, rdev, nr, pid, 0};
  return write ? vd_xfer(&ls, &rs) : vd_xfer(&rs, &ls);
}

/* The responder saw a fault it owns: its QP goes to the error state and
 * its owner gets the async event on its next poll of the receive CQ. */
static void vd_responder_err(struct vd_peer *p, enum ibv_event_type ev) {
  vd_qp_shm_to_err(p->qp, p->cq);
  atomic_fetch_or(&p->qp->async_pending, 1u << ev);
  atomic_store(&p->cq->event_hint, 1);
}

static void vd_recv_complete(struct vd_qp *q, struct vd_peer *p, const struct vd_swqe *w,
                             int status, int opcode) {
  struct vd_qp_shm *r = p->qp;
  struct vd_rwqe *rw = (struct vd_rwqe *)(r->rq + (size_t)(r->rq_head % r->max_recv_wr) * r->rq_stride);
  struct vd_cqe e = {0};
  e.wc.wr_id = rw->wr_id;
  e.wc.status = status;
  e.wc.opcode = opcode;
  e.wc.vendor_err = vd_vendor_err(status);
  e.wc.byte_len = (uint32_t)w->length;
  e.wc.qp_num = r->qpn;
  e.wc.src_qp = q->qp.qp_num;
  e.wc.slid = vd_port_lid(q->ctx->dev, q->attr.port_num);
  e.wc.sl = q->attr.ah_attr.sl;
  if (q->attr.ah_attr.is_global)
    e.wc.wc_flags |= IBV_WC_GRH;
  if (w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND_WITH_IMM) {
    e.wc.wc_flags |= IBV_WC_WITH_IMM;
    e.wc.imm_data = w->imm;
  }
  r->rq_head++;
  r->rq_count--;
  if (vd_cq_push(p->cq, &e) != 0 || status != IBV_WC_SUCCESS)
    vd_qp_shm_to_err(r, p->cq);
}

/* With the responder's QP locked. */
static int vd_execute_locked(struct vd_qp *q, const struct vd_swqe *w, struct vd_peer *p,
                             struct iovec *l, const int *ldev, int nl) {
  struct vd_qp_shm *r = p->qp;
  uint32_t rs = atomic_load(&r->state);
  /* A responder still on its way to RTR drops the packets and the
   * requester retransmits: it may get there in time. */
  if (rs == IBV_QPS_RESET || rs == IBV_QPS_INIT)
    return VD_NOT_READY;
  /* One that is gone, in error, connected elsewhere or addressed wrongly
   * never answers: the requester runs out of retries. The double reports
   * that at once rather than after timeout x retry_cnt. */
  if (atomic_load(&r->hdr.gone) || (rs != IBV_QPS_RTR && rs != IBV_QPS_RTS) ||
      r->dest_qpn != q->qp.qp_num || !vd_addr_ok(q, r) || r->epsn != q->next_psn)
    return IBV_WC_RETRY_EXC_ERR;
  uint32_t mtu = vd_mtu_bytes(q->attr.path_mtu);
  uint32_t npkt = w->length ? (uint32_t)((w->length + mtu - 1) / mtu) : 1;
  uint64_t va;
  int st;
  struct iovec riov[VD_MAX_SGE];
  int rdev[VD_MAX_SGE];
  struct vd_mem m;
  switch (w->opcode) {
  case IBV_WR_RDMA_WRITE:
  case IBV_WR_RDMA_WRITE_WITH_IMM: {
    int imm = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (imm && r->rq_count == 0)
      return VD_RNR;
    /* A zero-length write checks no rkey, as in the IB spec. */
    if (w->length) {
      if (!(r->access & IBV_ACCESS_REMOTE_WRITE) ||
          vd_mr_lookup(p->pd, w->rkey, w->remote_addr, w->length, IBV_ACCESS_REMOTE_WRITE, &va, &m)) {
        vd_responder_err(p, IBV_EVENT_QP_ACCESS_ERR);
        return IBV_WC_REM_ACCESS_ERR;
      }
      riov[0].iov_len = w->length;
      if ((st = vd_reach(p->pid, 0, va, &m, &riov[0].iov_base, &rdev[0])) != IBV_WC_SUCCESS ||
          (st = vd_transfer(p->pid, 1, l, ldev, nl, riov, rdev, 1)) != IBV_WC_SUCCESS)
        return st;
    }
    if (imm)
      vd_recv_complete(q, p, w, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM);
    break;
  }
  case IBV_WR_SEND:
  case IBV_WR_SEND_WITH_IMM: {
    if (r->rq_count == 0)
      return VD_RNR;
    struct vd_rwqe *rw =
        (struct vd_rwqe *)(r->rq + (size_t)(r->rq_head % r->max_recv_wr) * r->rq_stride);
    uint64_t room = 0, left = w->length;
    int nr = 0;
    for (uint32_t i = 0; i < rw->num_sge; i++) {
      const struct ibv_sge *g = &rw->sge[i];
      if (vd_mr_lookup(p->pd, g->lkey, g->addr, g->length, IBV_ACCESS_LOCAL_WRITE, &va, &m)) {
        vd_recv_complete(q, p, w, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV);
        return IBV_WC_REM_OP_ERR;
      }
      room += g->length;
      uint64_t k = left < g->length ? left : g->length;
      if (k) {
        riov[nr].iov_len = k;
        if ((st = vd_reach(p->pid, 0, va, &m, &riov[nr].iov_base, &rdev[nr])) != IBV_WC_SUCCESS)
          return st;
        nr++;
        left -= k;
      }
    }
    if (w->length > room) {
      vd_recv_complete(q, p, w, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
      return IBV_WC_REM_INV_REQ_ERR;
    }
    if ((st = vd_transfer(p->pid, 1, l, ldev, nl, riov, rdev, nr)) != IBV_WC_SUCCESS)
      return st;
    vd_recv_complete(q, p, w, IBV_WC_SUCCESS, IBV_WC_RECV);
    break;
  }
  case IBV_WR_RDMA_READ:
    if (r->max_dest_rd_atomic == 0)
      return IBV_WC_REM_INV_REQ_ERR;
    if (w->length) {
      if (!(r->access & IBV_ACCESS_REMOTE_READ) ||
          vd_mr_lookup(p->pd, w->rkey, w->remote_addr, w->length, IBV_ACCESS_REMOTE_READ, &va, &m)) {
        vd_responder_err(p, IBV_EVENT_QP_ACCESS_ERR);
        return IBV_WC_REM_ACCESS_ERR;
      }
      riov[0].iov_len = w->length;
      if ((st = vd_reach(p->pid, 0, va, &m, &riov[0].iov_base, &rdev[0])) != IBV_WC_SUCCESS ||
          (st = vd_transfer(p->pid, 0, l, ldev, nl, riov, rdev, 1)) != IBV_WC_SUCCESS)
        return st;
    }
    break;
  }
  r->epsn = (r->epsn + npkt) & VD_NUM_MAX;
  q->next_psn = (q->next_psn + npkt) & VD_NUM_MAX;
  return IBV_WC_SUCCESS;
}

static int vd_execute(struct vd_qp *q, struct vd_swqe *w) {
  if (w->length > VD_MAX_MSG)
    return IBV_WC_LOC_LEN_ERR;
  struct iovec l[VD_MAX_SGE];
  int ldev[VD_MAX_SGE];
  int nl = 0;
  if (w->inline_len) {
    ldev[nl] = -1;
    l[nl++] = (struct iovec){&w->sge[q->cap.max_send_sge], w->inline_len};
  } else {
    /* Reads land in local memory: that needs local write access. */
    uint32_t need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
    for (int i = 0; i < w->num_sge; i++) {
      uint64_t va;
      struct vd_mem m;
      if (w->sge[i].length == 0)
        continue;
      if (vd_mr_lookup(q->pd->shm, w->sge[i].lkey, w->sge[i].addr, w->sge[i].length, need, &va, &m))
        return IBV_WC_LOC_PROT_ERR;
      l[nl].iov_len = w->sge[i].length;
      int st = vd_reach(getpid(), 1, va, &m, &l[nl].iov_base, &ldev[nl]);
      if (st != IBV_WC_SUCCESS)
        return st;
      nl++;
    }
  }
  struct vd_peer *p = vd_peer_get(q);
  if (!p || vd_peer_dead(p))
    return IBV_WC_RETRY_EXC_ERR;
  vd_lock(&p->qp->lock);
  int st = vd_execute_locked(q, w, p, l, ldev, nl);
  vd_unlock(&p->qp->lock);
  return st;
}

void vd_qp_progress(struct vd_qp *q) {
  while (q->sq_exec < q->sq_posted) {
    struct vd_swqe *w = vd_swqe_at(q, q->sq_exec);
    int st, injected = 0;
    if (atomic_load(&q->shm->state) == IBV_QPS_ERR) {
      st = IBV_WC_WR_FLUSH_ERR;
    } else if (w->inject) {
      st = w->inject;
      injected = 1;
    } else {
      if (q->rnr_tries && vd_now() < q->rnr_next)
        break;
      st = vd_execute(q, w);
      if (st == VD_NOT_READY) {
        /* Retransmission: timeout is 4.096 us << timeout (0: forever),
         * retry_cnt retries after the first try. */
        double now = vd_now();
        if (!q->retry_deadline)
          q->retry_deadline = q->attr.timeout ? now + 4.096e-6 * (double)(1ull << q->attr.timeout) *
                                                          (q->attr.retry_cnt + 1)
                                              : 1e300;
        if (now < q->retry_deadline)
          break;
        st = IBV_WC_RETRY_EXC_ERR;
      } else if (st == VD_RNR) {
        if (q->attr.rnr_retry != 7 && q->rnr_tries >= q->attr.rnr_retry) {
          st = IBV_WC_RNR_RETRY_EXC_ERR;
        } else {
          q->rnr_tries++;
          q->rnr_next = vd_now() + vd_rnr_us[q->peer.qp ? q->peer.qp->min_rnr_timer & 31 : 0] * 1e-6;
          break;
        }
      }
    }
    q->rnr_tries = 0;
    q->retry_deadline = 0;
    if (st != IBV_WC_SUCCESS && (st != IBV_WC_WR_FLUSH_ERR || injected))
      vd_qp_to_err(q);
    /* Errors complete whether signaled or not, as on hardware. */
    if (st != IBV_WC_SUCCESS || w->signaled) {
      struct vd_cqe e = {0};
      e.wc.wr_id = w->wr_id;
      e.wc.status = st;
      e.wc.opcode = vd_wc_opcode(w->opcode);
      e.wc.vendor_err = vd_vendor_err(st);
      e.wc.byte_len = (uint32_t)w->length;
      e.wc.qp_num = q->qp.qp_num;
      e.seq = q->sq_exec;
      e.qp = q;
      e.writer_pid = getpid();
      if (vd_cq_push(q->scq->shm, &e) != 0 && st == IBV_WC_SUCCESS)
        vd_qp_to_err(q);
    }
    q->sq_exec++;
  }
  int pend = q->sq_exec < q->sq_posted;
  if (atomic_exchange(&q->pending, pend) != pend)
    atomic_fetch_add(&vd_qps_pending, pend ? 1 : -1);
}

void vd_progress_pending(void) {
  if (!atomic_load(&vd_qps_pending) || pthread_mutex_trylock(&vd_qps_lock) != 0)
    return;
  for (struct vd_qp *q = vd_qps; q; q = q->next) {
    if (!atomic_load(&q->pending) || pthread_mutex_trylock(&q->sq_lock) != 0)
      continue;
    vd_qp_progress(q);
    pthread_mutex_unlock(&q->sq_lock);
  }
  pthread_mutex_unlock(&vd_qps_lock);
}
