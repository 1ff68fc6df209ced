/*
 * Completion queues of the verbs test double: a ring in shared memory
 * under a robust process-shared lock, since a peer process appends the
 * receive completions of its writes. Overflow is fatal to the CQ, as on
 * hardware: the CQ is marked overrun, the completion that did not fit is
 * lost, the QP that produced it goes to the error state, poll_cq returns -1
 * from then on and the owner gets an IBV_EVENT_CQ_ERR async event.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vd_internal.h"

VD_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector) {
  struct vd_context *c = (struct vd_context *)context;
  if (!c || cqe < 1 || cqe > VD_MAX_CQE || comp_vector < 0 ||
      comp_vector >= c->ctx.num_comp_vectors) {
    errno = EINVAL;
    return NULL;
  }
  if (channel) {
    /* There is no ibv_create_comp_channel in this double: completions are
     * polled. */
    errno = EOPNOTSUPP;
    return NULL;
  }
  struct vd_cq *q = calloc(1, sizeof(*q));
  if (!q)
    return NULL;
  size_t len = sizeof(struct vd_cq_shm) + (size_t)cqe * sizeof(struct vd_cqe);
  uint32_t id;
  q->shm = vd_shm_create(VD_KIND_CQ, 1, VD_NUM_MAX, len, &id);
  if (!q->shm) {
    int e = errno;
    free(q);
    errno = e;
    return NULL;
  }
  q->shm_len = len;
  q->shm->id = id;
  q->shm->cap = (uint32_t)cqe;
  vd_mutex_init_shared(&q->shm->lock);
  q->ctx = c;
  q->cq.context = context;
  q->cq.cq_context = cq_context;
  q->cq.handle = id;
  q->cq.cqe = cqe;
  pthread_mutex_init(&q->cq.mutex, NULL);
  pthread_cond_init(&q->cq.cond, NULL);
  return &q->cq;
}

VD_EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
  struct vd_cq *q = (struct vd_cq *)cq;
  if (!q)
    return EINVAL;
  if (atomic_load(&q->nqp))
    return EBUSY;
  vd_shm_destroy(VD_KIND_CQ, q->shm->id, q->shm, q->shm_len);
  pthread_cond_destroy(&q->cq.cond);
  pthread_mutex_destroy(&q->cq.mutex);
  free(q);
  return 0;
}

int vd_cq_push(struct vd_cq_shm *s, const struct vd_cqe *e) {
  vd_lock(&s->lock);
  uint32_t n = atomic_load_explicit(&s->count, memory_order_relaxed);
  int rc = 0;
  if (atomic_load(&s->overrun) || n == s->cap) {
    atomic_store(&s->overrun, 1);
    rc = -1;
  } else {
    s->ring[(s->head + n) % s->cap] = *e;
    /* Release: a poller that sees the count sees the entry, and the data
     * its writer moved before pushing. */
    atomic_store_explicit(&s->count, n + 1, memory_order_release);
  }
  vd_unlock(&s->lock);
  return rc;
}

void vd_cq_purge(struct vd_cq_shm *s, uint32_t qpn) {
  vd_lock(&s->lock);
  uint32_t n = atomic_load_explicit(&s->count, memory_order_relaxed), kept = 0;
  for (uint32_t i = 0; i < n; i++) {
    struct vd_cqe *e = &s->ring[(s->head + i) % s->cap];
    if (e->wc.qp_num != qpn)
      s->ring[(s->head + kept++) % s->cap] = *e;
  }
  atomic_store_explicit(&s->count, kept, memory_order_release);
  vd_unlock(&s->lock);
}

/* Events a peer raised on QPs whose receive CQ this is. */
static void vd_cq_collect_events(struct vd_cq *q) {
  if (!atomic_load(&q->shm->event_hint) || !atomic_exchange(&q->shm->event_hint, 0))
    return;
  pthread_mutex_lock(&vd_qps_lock);
  for (struct vd_qp *p = vd_qps; p; p = p->next) {
    if (p->rcq != q)
      continue;
    uint32_t bits = atomic_exchange(&p->shm->async_pending, 0);
    for (int t = 0; bits; t++, bits >>= 1)
      if (bits & 1)
        vd_event_raise(p->ctx, (enum ibv_event_type)t, &p->qp);
  }
  pthread_mutex_unlock(&vd_qps_lock);
}

int vd_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc) {
  struct vd_cq *q = (struct vd_cq *)cq;
  /* Progress happens inside the poster's own verbs calls: work requests
   * waiting on a receiver (RNR) are retried here. */
  vd_progress_pending();
  vd_cq_collect_events(q);
  if (atomic_load(&q->shm->overrun)) {
    if (!atomic_exchange(&q->overrun_reported, 1))
      vd_event_raise(q->ctx, IBV_EVENT_CQ_ERR, cq);
    errno = EOVERFLOW;
    return -1;
  }
  if (num <= 0 || atomic_load_explicit(&q->shm->count, memory_order_acquire) == 0)
    return 0;
  struct vd_cq_shm *s = q->shm;
  pid_t self = getpid();
  vd_lock(&s->lock);
  uint32_t n = atomic_load_explicit(&s->count, memory_order_relaxed);
  int got = 0;
  while (got < num && (uint32_t)got < n) {
    struct vd_cqe *e = &s->ring[s->head];
    wc[got++] = e->wc;
    /* A polled send completion frees the send-queue slots of its WR and
     * of the unsignaled ones before it, as on mlx5. Done under the CQ lock:
     * destroying the QP purges its entries under it too. */
    if (e->qp && e->writer_pid == self)
      atomic_store(&e->qp->sq_retired, e->seq + 1);
    s->head = (s->head + 1) % s->cap;
  }
  atomic_store_explicit(&s->count, n - (uint32_t)got, memory_order_release);
  vd_unlock(&s->lock);
  return got;
}

/* CQs here have no completion channel (ibv_create_cq refuses one), so
 * arming one changes nothing, which verbs allows: the request succeeds and
 * no event can follow. */
int vd_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return cq ? 0 : EINVAL; }
