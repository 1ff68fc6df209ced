/*
 * Queue pairs of the verbs test double: RC only. The receive queue and
 * the state a peer checks live in /dev/shm/loomvd-qp-<qp_num>, so creating
 * that file is what makes the QP number unique on the machine. State
 * changes follow the RC rows of the IB spec's modify-QP table (the
 * kernel's ib_modify_qp_is_ok): required and allowed attribute masks per
 * transition, EINVAL otherwise. SQD and SQE are not modelled.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vd_internal.h"

pthread_mutex_t vd_qps_lock = PTHREAD_MUTEX_INITIALIZER;
struct vd_qp *vd_qps;
_Atomic int vd_qps_pending;

uint32_t vd_mtu_bytes(enum ibv_mtu m) { return 128u << (int)m; }

VD_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia) {
  struct vd_pd *p = (struct vd_pd *)pd;
  if (!p || !ia || !ia->send_cq || !ia->recv_cq || ia->send_cq->context != pd->context ||
      ia->recv_cq->context != pd->context) {
    errno = EINVAL;
    return NULL;
  }
  if (ia->qp_type != IBV_QPT_RC || ia->srq) {
    errno = EOPNOTSUPP; /* RC without SRQ only */
    return NULL;
  }
  struct ibv_qp_cap *cap = &ia->cap;
  if (cap->max_send_wr > VD_MAX_QP_WR || cap->max_recv_wr > VD_MAX_QP_WR ||
      cap->max_send_sge > VD_MAX_SGE || cap->max_recv_sge > VD_MAX_SGE ||
      cap->max_inline_data > VD_MAX_INLINE) {
    errno = EINVAL;
    return NULL;
  }
  struct vd_qp *q = calloc(1, sizeof(*q));
  if (!q)
    return NULL;
  q->cap = *cap;
  q->sq_stride = sizeof(struct vd_swqe) + cap->max_send_sge * sizeof(struct ibv_sge) +
                 cap->max_inline_data;
  q->sq_stride = (q->sq_stride + 7) & ~(size_t)7;
  if (cap->max_send_wr && !(q->sq = calloc(cap->max_send_wr, q->sq_stride))) {
    free(q);
    return NULL;
  }
  uint32_t rq_stride = (uint32_t)(sizeof(struct vd_rwqe) + cap->max_recv_sge * sizeof(struct ibv_sge));
  size_t len = sizeof(struct vd_qp_shm) + (size_t)cap->max_recv_wr * rq_stride;
  uint32_t qpn;
  /* QP numbers 0 and 1 are the special QPs; start above mlx5's reserved. */
  q->shm = vd_shm_create(VD_KIND_QP, 0x100, VD_NUM_MAX, len, &qpn);
  if (!q->shm) {
    int e = errno;
    free(q->sq);
    free(q);
    errno = e;
    return NULL;
  }
  q->shm_len = len;
  struct vd_qp_shm *s = q->shm;
  vd_mutex_init_shared(&s->lock);
  s->qpn = qpn;
  s->state = IBV_QPS_RESET;
  s->pd_id = p->shm->id;
  s->recv_cq_id = ((struct vd_cq *)ia->recv_cq)->shm->id;
  s->max_recv_wr = cap->max_recv_wr;
  s->max_recv_sge = cap->max_recv_sge;
  s->rq_stride = rq_stride;
  q->ctx = p->ctx;
  q->pd = p;
  q->scq = (struct vd_cq *)ia->send_cq;
  q->rcq = (struct vd_cq *)ia->recv_cq;
  q->sq_sig_all = ia->sq_sig_all;
  q->peer.pidfd = -1;
  pthread_mutex_init(&q->sq_lock, NULL);
  q->qp.context = pd->context;
  q->qp.qp_context = ia->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = ia->send_cq;
  q->qp.recv_cq = ia->recv_cq;
  q->qp.handle = qpn;
  q->qp.qp_num = qpn;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q->qp.mutex, NULL);
  pthread_cond_init(&q->qp.cond, NULL);
  atomic_fetch_add(&p->nqp, 1);
  atomic_fetch_add(&q->scq->nqp, 1);
  atomic_fetch_add(&q->rcq->nqp, 1);
  pthread_mutex_lock(&vd_qps_lock);
  q->next = vd_qps;
  vd_qps = q;
  pthread_mutex_unlock(&vd_qps_lock);
  return &q->qp;
}

static struct vd_rwqe *vd_rwqe_at(struct vd_qp_shm *s, uint32_t i) {
  return (struct vd_rwqe *)(s->rq + (size_t)(i % s->max_recv_wr) * s->rq_stride);
}

void vd_qp_shm_to_err(struct vd_qp_shm *s, struct vd_cq_shm *cq) {
  atomic_store(&s->state, IBV_QPS_ERR);
  /* Flushed receives complete in order, each with its wr_id. */
  for (; s->rq_count; s->rq_count--, s->rq_head++) {
    struct vd_cqe e = {0};
    e.wc.wr_id = vd_rwqe_at(s, s->rq_head)->wr_id;
    e.wc.status = IBV_WC_WR_FLUSH_ERR;
    e.wc.opcode = IBV_WC_RECV;
    e.wc.vendor_err = vd_vendor_err(IBV_WC_WR_FLUSH_ERR);
    e.wc.qp_num = s->qpn;
    vd_cq_push(cq, &e);
  }
}

void vd_qp_to_err(struct vd_qp *q) {
  vd_lock(&q->shm->lock);
  vd_qp_shm_to_err(q->shm, q->rcq->shm);
  vd_unlock(&q->shm->lock);
  q->qp.state = IBV_QPS_ERR;
}

void vd_peer_drop(struct vd_peer *p) {
  if (p->qp)
    munmap(p->qp, p->qp_len);
  if (p->pd)
    munmap(p->pd, p->pd_len);
  if (p->cq)
    munmap(p->cq, p->cq_len);
  if (p->pidfd >= 0)
    close(p->pidfd);
  memset(p, 0, sizeof(*p));
  p->pidfd = -1;
}

/* Required and allowed masks for RC, by (current, next) state. */
static int vd_transition(enum ibv_qp_state cur, enum ibv_qp_state next, int mask) {
  int req = 0, opt = 0;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    if (cur > IBV_QPS_ERR || (cur == IBV_QPS_RESET && next == IBV_QPS_ERR))
      return -1;
  } else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
          IBV_QP_MAX_QP_RD_ATOMIC;
    opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
          IBV_QP_PATH_MIG_STATE;
  } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
          IBV_QP_MIN_RNR_TIMER;
  } else {
    return -1;
  }
  if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS)
    return -1;
  if ((mask & req) != req || (mask & ~(req | opt | IBV_QP_STATE)))
    return -1;
  return 0;
}

/* Values verbs rejects with EINVAL. */
static int vd_check_attr(struct vd_qp *q, const struct ibv_qp_attr *a, int mask) {
  unsigned port = (mask & IBV_QP_PORT) ? a->port_num : q->attr.port_num;
  if ((mask & IBV_QP_PORT) && !vd_port_valid(q->ctx, port))
    return -1;
  /* Without a port (a QP in RESET) no port-dependent attribute can pass
   * the transition table, so `ib` is then unused. */
  int ib = vd_port_valid(q->ctx, port) &&
           q->ctx->dev->port[port - 1].link_layer == IBV_LINK_LAYER_INFINIBAND;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index >= (ib ? VD_IB_PKEY_TBL_LEN : 1))
    return -1;
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
    return -1;
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
    return -1;
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > VD_NUM_MAX)
    return -1;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > VD_MAX_RD_ATOM)
    return -1;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > VD_MAX_RD_ATOM)
    return -1;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
    return -1;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
    return -1;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
    return -1;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
    return -1;
  if (mask & IBV_QP_AV) {
    /* RoCE needs a GRH (the kernel fails resolving the MAC without one);
     * the source GID must be a filled entry of the port's table. */
    if (!ib && !a->ah_attr.is_global)
      return -1;
    if (!vd_port_valid(q->ctx, port))
      return -1;
    if (a->ah_attr.is_global) {
      struct vd_gid_tab t;
      vd_port_gids(q->ctx->dev, (int)port, &t);
      if (a->ah_attr.grh.sgid_index >= t.n)
        return -1;
    }
  }
  return 0;
}

VD_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
  struct vd_qp *q = (struct vd_qp *)qp;
  if (!q || !a)
    return EINVAL;
  pthread_mutex_lock(&q->sq_lock);
  enum ibv_qp_state cur = (enum ibv_qp_state)atomic_load(&q->shm->state);
  enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  if ((unsigned)next > IBV_QPS_ERR || vd_transition(cur, next, mask) != 0 ||
      ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) || vd_check_attr(q, a, mask) != 0) {
    pthread_mutex_unlock(&q->sq_lock);
    return EINVAL;
  }
  struct ibv_qp_attr *s = &q->attr;
  if (mask & IBV_QP_ACCESS_FLAGS) s->qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) s->pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s->port_num = a->port_num;
  if (mask & IBV_QP_AV) s->ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s->path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s->dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s->rq_psn = a->rq_psn & VD_NUM_MAX;
  if (mask & IBV_QP_SQ_PSN) s->sq_psn = a->sq_psn & VD_NUM_MAX;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s->max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s->max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s->min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s->retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s->rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_ALT_PATH) {
    s->alt_ah_attr = a->alt_ah_attr;
    s->alt_pkey_index = a->alt_pkey_index;
    s->alt_port_num = a->alt_port_num;
    s->alt_timeout = a->alt_timeout;
  }
  if (mask & IBV_QP_PATH_MIG_STATE) s->path_mig_state = a->path_mig_state;

  struct vd_qp_shm *sh = q->shm;
  vd_lock(&sh->lock);
  sh->access = s->qp_access_flags;
  sh->min_rnr_timer = s->min_rnr_timer;
  if (next == IBV_QPS_INIT && (mask & IBV_QP_PORT)) {
    /* The address peers must use is the port's as of now. */
    struct vd_gid_tab t;
    vd_port_gids(q->ctx->dev, s->port_num, &t);
    sh->port_num = s->port_num;
    sh->link_layer = q->ctx->dev->port[s->port_num - 1].link_layer;
    sh->lid = vd_port_lid(q->ctx->dev, s->port_num);
    sh->port_active = q->ctx->dev->port[s->port_num - 1].active;
    sh->ngid = (uint32_t)t.n;
    memcpy(sh->gid, t.gid, sizeof(sh->gid));
  }
  if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
    sh->dest_qpn = s->dest_qp_num;
    sh->epsn = s->rq_psn;
    sh->max_dest_rd_atomic = s->max_dest_rd_atomic;
  }
  if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR)
    q->next_psn = s->sq_psn;
  int flush = 0;
  if (next == IBV_QPS_ERR) {
    vd_qp_shm_to_err(sh, q->rcq->shm);
    flush = 1;
  } else if (next == IBV_QPS_RESET) {
    /* Reset empties both queues without completions. */
    sh->rq_count = 0;
    sh->access = 0;
    sh->dest_qpn = 0;
    sh->port_num = 0;
    atomic_store(&sh->state, IBV_QPS_RESET);
  } else {
    atomic_store(&sh->state, next);
  }
  vd_unlock(&sh->lock);
  if (flush) {
    vd_qp_progress(q); /* flushes the send queue */
  } else if (next == IBV_QPS_RESET) {
    q->sq_exec = q->sq_posted;
    atomic_store(&q->sq_retired, q->sq_posted);
    if (atomic_exchange(&q->pending, 0))
      atomic_fetch_sub(&vd_qps_pending, 1);
    vd_cq_purge(q->scq->shm, qp->qp_num);
    vd_cq_purge(q->rcq->shm, qp->qp_num);
    vd_peer_drop(&q->peer);
    memset(&q->attr, 0, sizeof(q->attr));
    q->rnr_tries = 0;
    q->retry_deadline = 0;
  }
  q->qp.state = next;
  pthread_mutex_unlock(&q->sq_lock);
  return 0;
}

VD_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
                           struct ibv_qp_init_attr *ia) {
  struct vd_qp *q = (struct vd_qp *)qp;
  if (!q || !a || !ia)
    return EINVAL;
  pthread_mutex_lock(&q->sq_lock);
  *a = q->attr;
  /* A peer may have moved the QP to the error state. */
  a->qp_state = (enum ibv_qp_state)atomic_load(&q->shm->state);
  a->cur_qp_state = a->qp_state;
  a->cap = q->cap;
  q->qp.state = a->qp_state;
  memset(ia, 0, sizeof(*ia));
  ia->qp_context = q->qp.qp_context;
  ia->send_cq = q->qp.send_cq;
  ia->recv_cq = q->qp.recv_cq;
  ia->cap = q->cap;
  ia->qp_type = IBV_QPT_RC;
  ia->sq_sig_all = q->sq_sig_all;
  pthread_mutex_unlock(&q->sq_lock);
  return 0;
}

VD_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
  struct vd_qp *q = (struct vd_qp *)qp;
  if (!q)
    return EINVAL;
  pthread_mutex_lock(&vd_qps_lock);
  for (struct vd_qp **pp = &vd_qps; *pp; pp = &(*pp)->next) {
    if (*pp == q) {
      *pp = q->next;
      break;
    }
  }
  pthread_mutex_unlock(&vd_qps_lock);
  pthread_mutex_lock(&q->sq_lock);
  if (atomic_exchange(&q->pending, 0))
    atomic_fetch_sub(&vd_qps_pending, 1);
  /* As mlx5 does, the QP's completions leave its CQs with it (and no
   * polled entry can point at it afterwards). */
  vd_cq_purge(q->scq->shm, qp->qp_num);
  vd_cq_purge(q->rcq->shm, qp->qp_num);
  vd_peer_drop(&q->peer);
  pthread_mutex_unlock(&q->sq_lock);
  /* A peer still sending here sees the QP gone: RETRY_EXC_ERR, as when
   * packets reach a QP number nobody owns. */
  vd_shm_destroy(VD_KIND_QP, qp->qp_num, q->shm, q->shm_len);
  atomic_fetch_sub(&q->pd->nqp, 1);
  atomic_fetch_sub(&q->scq->nqp, 1);
  atomic_fetch_sub(&q->rcq->nqp, 1);
  pthread_mutex_destroy(&q->sq_lock);
  pthread_cond_destroy(&q->qp.cond);
  pthread_mutex_destroy(&q->qp.mutex);
  free(q->sq);
  free(q);
  return 0;
}

int vd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  struct vd_qp *q = (struct vd_qp *)qp;
  struct vd_qp_shm *s = q->shm;
  int rc = 0;
  vd_lock(&s->lock);
  for (; wr; wr = wr->next) {
    uint32_t state = atomic_load(&s->state);
    if (state == IBV_QPS_RESET || wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_recv_sge) {
      rc = EINVAL;
      break;
    }
    if (state == IBV_QPS_ERR) {
      /* Posting to a QP in error is allowed; the WR is flushed. */
      struct vd_cqe e = {0};
      e.wc.wr_id = wr->wr_id;
      e.wc.status = IBV_WC_WR_FLUSH_ERR;
      e.wc.opcode = IBV_WC_RECV;
      e.wc.vendor_err = vd_vendor_err(IBV_WC_WR_FLUSH_ERR);
      e.wc.qp_num = s->qpn;
      vd_cq_push(q->rcq->shm, &e);
      continue;
    }
    if (s->rq_count == s->max_recv_wr) {
      rc = ENOMEM;
      break;
    }
    struct vd_rwqe *r = vd_rwqe_at(s, s->rq_head + s->rq_count);
    r->wr_id = wr->wr_id;
    r->num_sge = (uint32_t)wr->num_sge;
    if (wr->num_sge)
      memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
    s->rq_count++;
  }
  vd_unlock(&s->lock);
  if (rc && bad)
    *bad = wr;
  return rc;
}
