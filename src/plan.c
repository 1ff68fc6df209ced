/*
 * Planning: the tasks a communicator queued become works, each with its
 * schedule and connections, queued on lanes (one per channel for the
 * collectives of every algorithm, one per peer and direction for
 * send/recv). The tuner picks each collective's algorithm and channels;
 * the first collective sets up the connections of all of them.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "algorithms/schedule.h"
#include "algorithms/tuner.h"
#include "call_check.h"
#include "comm/comm.h"
#include "enqueue.h"
#include "common/dtype.h"
#include "exec/flat.h"
#include "exec/host_exec.h"
#include "misc/utils.h"
#include "plan.h"
#include "transport/shm_arena.h"
#include "transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void plan_lane_push(struct lane *l, struct work *w) {
  if (l->tail)
    l->tail->next = w;
  else
    l->head = w;
  l->tail = w;
}

/* Works go back to their communicator, schedule buffer and all: a small
 * collective then costs no allocation (comm_free_works releases them). */
void plan_work_free(struct work *w) {
  w->next = w->comm->free_works;
  w->comm->free_works = w;
}

void comm_free_works(struct ncclComm *comm) {
  for (struct work *w = comm->free_works, *n; w; w = n) {
    n = w->next;
    schedule_free(&w->sched);
    free(w);
  }
  comm->free_works = NULL;
}

/* A free work to build on: one that keeps no call's shape, or else the
 * oldest of the PLAN_KEPT_SHAPES most recent shapes (enqueue_single);
 * NULL when fewer are kept, so that a new one is made. */
static struct work *take_free(struct ncclComm *comm) {
  struct work **link = &comm->free_works, **oldest = NULL;
  int kept = 0;
  for (struct work *w = *link; w; link = &w->next, w = *link) {
    if (!w->key.coll) {
      *link = w->next;
      return w;
    }
    oldest = link;
    if (++kept == PLAN_KEPT_SHAPES)
      break;
  }
  if (kept < PLAN_KEPT_SHAPES)
    return NULL;
  struct work *w = *oldest;
  *oldest = w->next;
  return w;
}

static ncclResult_t new_work(struct ncclComm *comm, struct task *t, uint64_t seq, struct work **out) {
  struct work *w = take_free(comm);
  if (w) {
    struct schedule keep = w->sched;
    memset(w, 0, sizeof *w);
    w->sched = keep;
    schedule_clear(&w->sched);
  } else {
    CHECK(UTIL_CALLOC(&w, 1, "a work item"));
  }
  w->comm = comm;
  w->task = t;
  w->seq = seq;
  w->cur_at = UINT64_MAX; /* the schedule about to be built is another */
  w->esize = dtype_size(t->dtype);
  w->src = t->sendbuff;
  w->dst = t->recvbuff;
  *out = w;
  return ncclSuccess;
}

static size_t slot_elems(const struct ncclComm *comm, size_t esize) {
  size_t capacity = (comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  return capacity / esize;
}

/* Elements per slot of the protocol: the schedules' chunks are counted
 * in slots, so that a step never needs more slots than the FIFO has. */
static size_t proto_elems(const struct ncclComm *comm, size_t esize, int proto) {
  return proto == PROTO_LL ? LL_SLOT_DATA / esize : slot_elems(comm, esize);
}

/* A work's connections of one kind to the schedule's peers, by index. */
static ncclResult_t peer_conns(struct ncclComm *comm, struct work *w, int kind, int channel,
                               const struct sched_peers *pe) {
  w->nsends = pe->nsend;
  w->nrecvs = pe->nrecv;
  for (int i = 0; i < pe->nsend; i++)
    if (pe->send[i] >= 0)
      CHECK(transport_get_conn(comm, kind, channel, pe->send[i], CONN_SEND, &w->sends[i]));
  for (int i = 0; i < pe->nrecv; i++)
    if (pe->recv[i] >= 0)
      CHECK(transport_get_conn(comm, kind, channel, pe->recv[i], CONN_RECV, &w->recvs[i]));
  return ncclSuccess;
}

static ncclResult_t plan_ring(struct comm_plan *p, struct task *t, uint64_t seq, int nch, int proto) {
  struct ncclComm *comm = p->comm;
  size_t esize = dtype_size(t->dtype);
  size_t align = LOOM_MAX((size_t)1, 64 / esize);
  for (int c = 0; c < nch; c++) {
    struct channel *ch = &comm->channels[c];
    struct ring_args a = {
        .coll = t->coll,
        .nranks = comm->nranks,
        .ring = ch->ring,
        .index = ch->ring_index,
        .root = t->root,
        .count = t->count,
        .chunk = proto_elems(comm, esize, proto) * (NCCL_STEPS / 2),
        .align = align,
    };
    schedule_channel_range(t->count, c, nch, align, &a.off, &a.len);
    struct work *w;
    CHECK(new_work(comm, t, seq, &w));
    ncclResult_t r = ring_schedule(&a, &w->sched);
    if (r == ncclSuccess && w->sched.nsteps > 0 && comm->nranks > 1) {
      w->nsends = w->nrecvs = 1;
      r = transport_get_conn(comm, CONN_RING, c, ch->ring_next, CONN_SEND, &w->sends[0]);
      if (r == ncclSuccess)
        r = transport_get_conn(comm, CONN_RING, c, ch->ring_prev, CONN_RECV, &w->recvs[0]);
    }
    if (r != ncclSuccess || w->sched.nsteps == 0) {
      plan_work_free(w);
      CHECK(r);
      continue;
    }
    w->channel = c;
    w->piece = proto_elems(comm, esize, proto);
    w->proto = proto;
    plan_lane_push(&p->lanes[c], w);
  }
  return ncclSuccess;
}

/* Collectives of every algorithm queue on the channel lanes, so that they
 * run in call order whatever connections they use. */
static ncclResult_t plan_tree(struct comm_plan *p, struct task *t, uint64_t seq, int nch, int proto) {
  struct ncclComm *comm = p->comm;
  size_t esize = dtype_size(t->dtype), align = LOOM_MAX((size_t)1, 64 / esize);
  for (int c = 0; c < nch; c++) {
    const struct channel *ch = &comm->channels[c];
    int children[3], nchild = 0;
    for (int k = 0; k < 3; k++)
      if (ch->tree_down[k] >= 0)
        children[nchild++] = ch->tree_down[k];
    size_t off, len;
    schedule_channel_range(t->count, c, nch, align, &off, &len);
    if (len == 0)
      continue;
    struct work *w;
    CHECK(new_work(comm, t, seq, &w));
    struct sched_peers pe;
    ncclResult_t r = tree_schedule(ch->tree_up, children, nchild, off, len, proto_elems(comm, esize, proto) * 2, &w->sched,
                                   &pe);
    if (r == ncclSuccess)
      r = peer_conns(comm, w, CONN_TREE, c, &pe);
    if (r != ncclSuccess) {
      plan_work_free(w);
      return r;
    }
    w->channel = c;
    w->piece = proto_elems(comm, esize, proto);
    w->proto = proto;
    plan_lane_push(&p->lanes[c], w);
  }
  return ncclSuccess;
}

static ncclResult_t plan_rd(struct comm_plan *p, struct task *t, uint64_t seq, int proto) {
  struct ncclComm *comm = p->comm;
  struct work *w;
  CHECK(new_work(comm, t, seq, &w));
  struct sched_peers pe;
  ncclResult_t r = rd_schedule(comm->rank, comm->nranks, t->count, &w->sched, &pe);
  if (r == ncclSuccess)
    r = peer_conns(comm, w, CONN_RD, 0, &pe);
  if (r != ncclSuccess) {
    plan_work_free(w);
    return r;
  }
  w->piece = proto_elems(comm, w->esize, proto);
  w->proto = proto;
  plan_lane_push(&p->lanes[0], w);
  return ncclSuccess;
}

/* A flat AllReduce: one work on the first lane, in call order with the
 * collectives of every other algorithm. */
static ncclResult_t plan_flat(struct comm_plan *p, struct task *t, uint64_t seq) {
  struct ncclComm *comm = p->comm;
  if (!comm->arena || !comm->is_host || t->coll != COLL_ALLREDUCE)
    return err_set(ncclInternalError, "rank %d: the tuner chose Flat for %s on a communicator that cannot run it",
                   comm->rank, coll_name(t->coll));
  struct work *w;
  CHECK(new_work(comm, t, seq, &w));
  size_t bytes = t->count * w->esize, align = LOOM_MAX((size_t)1, 64 / w->esize);
  w->flat.on = 1;
  w->flat.whole = bytes <= FLAT_WHOLE_MAX;
  /* Where windows that every rank maps are registered, by slices, which
   * reads and writes buffers that lie in them in place (each byte moved
   * once, faster than any copy) and copies the others: whether they are
   * is the same on every rank (comm_mem.c's win_direct agrees on it),
   * while where each rank's buffers lie is not. */
  w->flat.by_cpu = !w->flat.whole && comm->arena->ncpus > 0 && !comm->direct_wins;
  size_t round = w->flat.by_cpu ? comm->arena->cpu_round : comm->arena->region;
  w->flat.per_round = w->flat.whole ? t->count : round / w->esize / align * align;
  w->flat.nrounds = (t->count + w->flat.per_round - 1) / w->flat.per_round;
  w->piece = 0;
  plan_lane_push(&p->lanes[0], w);
  return ncclSuccess;
}

/* The first collective sets up the connections of every collective
 * algorithm at once: ranks whose calls differ (a mistake, or the tuner
 * choosing differently for different calls) then still meet on
 * connections, where the slot headers name the disagreement, instead of
 * each waiting for the other's connection setup. */
ncclResult_t plan_connect_collectives(struct ncclComm *comm) {
  struct conn *c;
  for (int ch = 0; ch < comm->nchannels; ch++) {
    const struct channel *x = &comm->channels[ch];
    CHECK(transport_get_conn(comm, CONN_RING, ch, x->ring_next, CONN_SEND, &c));
    CHECK(transport_get_conn(comm, CONN_RING, ch, x->ring_prev, CONN_RECV, &c));
    int peers[4] = {x->tree_up, x->tree_down[0], x->tree_down[1], x->tree_down[2]};
    for (int k = 0; k < 4; k++) {
      if (peers[k] < 0)
        continue;
      CHECK(transport_get_conn(comm, CONN_TREE, ch, peers[k], CONN_SEND, &c));
      CHECK(transport_get_conn(comm, CONN_TREE, ch, peers[k], CONN_RECV, &c));
    }
  }
  struct schedule s = {0};
  struct sched_peers pe;
  CHECK(rd_schedule(comm->rank, comm->nranks, 1, &s, &pe));
  schedule_free(&s);
  for (int i = 0; i < pe.nsend; i++) {
    CHECK(transport_get_conn(comm, CONN_RD, 0, pe.send[i], CONN_SEND, &c));
    CHECK(transport_get_conn(comm, CONN_RD, 0, pe.recv[i], CONN_RECV, &c));
  }
  comm->coll_conns = 1;
  return ncclSuccess;
}

/* "count N of T", with the factor of the gathered or scattered side, for
 * the sentences of plan_check_size (only ever formatted for one). */
static const char *count_desc(const struct ncclComm *comm, const struct task *t, char *buf, size_t len) {
  int n = snprintf(buf, len, "count %zu of %s", t->count, dtype_name(t->dtype));
  if (plan_gathered(t) && n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, " times nranks (%d)", comm->nranks);
  return buf;
}

static ncclResult_t check_range(const struct ncclComm *comm, const struct task *t, const void *buf, const char *name,
                                size_t bytes, const char *func) {
  uintptr_t end;
  if (!buf || !__builtin_add_overflow((uintptr_t)buf, bytes, &end))
    return ncclSuccess; /* a NULL one has the NULL check's sentence */
  char d[96];
  return err_set(ncclInvalidArgument, "%s: %s %p plus the %zu bytes of %s runs past the end of the address space",
                 func, strcmp(func, "ncclBcast") == 0 ? "buff" : name, buf, bytes,
                 count_desc(comm, t, d, sizeof d));
}

ncclResult_t plan_refuse_size(const struct ncclComm *comm, const struct task *t, const char *func) {
  size_t esize = dtype_size(t->dtype), mult = plan_gathered(t) ? (size_t)comm->nranks : 1, one, all;
  char d[96];
  if (__builtin_mul_overflow(t->count, esize, &one) || __builtin_mul_overflow(one, mult, &all))
    return err_set(ncclInvalidArgument,
                   "%s: %s overflows the address space: at %zu bytes an element, the buffer's size in bytes does "
                   "not fit in size_t",
                   func, count_desc(comm, t, d, sizeof d), esize);
  if (all > PLAN_MAX_BUFFER_BYTES)
    return err_set(ncclInvalidArgument,
                   "%s: %s is larger than any buffer can be: %zu bytes, more than the 2^57 bytes of the largest "
                   "user address space of any platform Loom runs on",
                   func, count_desc(comm, t, d, sizeof d), all);
  /* Buffers the call ignores (a non-root's of Broadcast and Reduce) may
   * be anything. */
  int me_root = t->root == comm->rank;
  if (t->coll != COLL_RECV && (t->coll != COLL_BROADCAST || me_root))
    CHECK(check_range(comm, t, t->sendbuff, "sendbuff", t->coll == COLL_REDUCESCATTER ? all : one, func));
  if (t->coll != COLL_SEND && (t->coll != COLL_REDUCE || me_root))
    CHECK(check_range(comm, t, t->recvbuff, "recvbuff", t->coll == COLL_ALLGATHER ? all : one, func));
  return ncclSuccess;
}

/* The tuner's algorithm and channel count for a collective, by the size
 * of its largest buffer. */
/* The bytes the tuner weighs. plan_check_size refused what overflows;
 * the tuner only compares sizes, so saturating is enough should a caller
 * have skipped it. */
static size_t task_bytes(const struct ncclComm *comm, const struct task *t) {
  size_t bytes;
  size_t mult = plan_gathered(t) ? (size_t)comm->nranks : 1;
  if (__builtin_mul_overflow(t->count, dtype_size(t->dtype), &bytes) || __builtin_mul_overflow(bytes, mult, &bytes))
    bytes = SIZE_MAX;
  return bytes;
}

int plan_symmetric(const struct ncclComm *comm, const struct task *t) {
  if (t->coll != COLL_ALLREDUCE || !comm->arena || !comm->direct_wins)
    return 0;
  size_t bytes = task_bytes(comm, t);
  const struct comm_win *s = comm_win_holding(comm, t->sendbuff, bytes);
  const struct comm_win *d = comm_win_holding(comm, t->recvbuff, bytes);
  return s && d && s->symmetric && d->symmetric;
}

ncclResult_t plan_pick_algo(struct ncclComm *comm, const struct task *t, int *algo, int *nch) {
  CHECK(tuner_pick(comm->tuner, t->coll, task_bytes(comm, t), algo, nch, NULL));
  /* Reading and writing every rank's buffers in place moves each byte
   * once, where rings copy through FIFOs: Flat measured faster at every
   * size and rank count (perf/README.md), unless NCCL_ALGO leaves it out. */
  if (*algo != ALGO_FLAT && (comm->tuner->allowed[t->coll] & (1u << ALGO_FLAT)) && plan_symmetric(comm, t)) {
    size_t bytes = task_bytes(comm, t);
    int cls = 0;
    while ((1ull << (cls + 1)) <= bytes && cls < 63)
      cls++;
    if (!(comm->tuner->logged_symmetric & (1ull << cls))) {
      comm->tuner->logged_symmetric |= 1ull << cls;
      INFO(LOG_TUNING, "%s of %zu bytes (size class 2^%d) in symmetric windows: Flat, in place in the ranks' buffers "
           "(for other buffers %s)", coll_name(t->coll), bytes, cls, algo_name(*algo));
    }
    *algo = ALGO_FLAT;
    *nch = 1;
  }
  return ncclSuccess;
}

ncclResult_t plan_estimate(struct ncclComm *comm, const struct task *t, double *seconds) {
  size_t bytes = task_bytes(comm, t);
  if (t->coll != COLL_SEND && t->coll != COLL_RECV) {
    int algo, nch;
    *seconds = 0;
    return tuner_pick(comm->tuner, t->coll, bytes, &algo, &nch, seconds);
  }
  /* One message over the link to the peer: its latency and bandwidth
   * class as the collectives' model has them; to itself, a copy. */
  const struct tune_input *in = &comm->tuner->in;
  int local = comm->peers[t->peer].host_hash == comm->peers[comm->rank].host_hash;
  double bw = local ? in->bw_local : in->bw_net, lat = t->peer == comm->rank ? 0 : local ? in->lat_local : in->lat_net;
  *seconds = lat + (bw > 0 ? (double)bytes / bw : 0);
  return ncclSuccess;
}

ncclResult_t plan_algo(struct comm_plan *p, struct task *t, uint64_t seq, int algo, int nch) {
  /* The protocol follows from what every rank's tuner sees alike. */
  int proto = p->comm->nranks > 1 ? tuner_proto(p->comm->tuner, t->coll, algo, task_bytes(p->comm, t)) : PROTO_SIMPLE;
  switch (algo) {
  case ALGO_TREE: return plan_tree(p, t, seq, nch, proto);
  case ALGO_RD: return plan_rd(p, t, seq, proto);
  case ALGO_FLAT: return plan_flat(p, t, seq);
  default: return plan_ring(p, t, seq, nch, proto);
  }
}

static ncclResult_t plan_collective(struct comm_plan *p, struct task *t, uint64_t seq) {
  struct ncclComm *comm = p->comm;
  if (comm->nranks == 1)
    return plan_ring(p, t, seq, 1, PROTO_SIMPLE);
  if (!comm->coll_conns)
    CHECK(plan_connect_collectives(comm));
  int algo, nch;
  CHECK(plan_pick_algo(comm, t, &algo, &nch));
  return plan_algo(p, t, seq, algo, nch);
}

static ncclResult_t plan_p2p(struct comm_plan *p, struct task *t) {
  struct ncclComm *comm = p->comm;
  struct work *w;
  CHECK(new_work(comm, t, 0, &w));
  ncclResult_t r = p2p_schedule(t->coll, t->count, &w->sched);
  /* Both directions with a peer are set up together, so that two ranks
   * that each send first (outside a group) set up matching pairs instead
   * of each waiting for the other's half. */
  struct conn *send = NULL, *recv = NULL;
  if (r == ncclSuccess)
    r = transport_get_conn(comm, CONN_P2P, 0, t->peer, CONN_SEND, &send);
  if (r == ncclSuccess)
    r = transport_get_conn(comm, CONN_P2P, 0, t->peer, CONN_RECV, &recv);
  if (t->coll == COLL_SEND) {
    w->sends[0] = send;
    w->nsends = 1;
  } else {
    w->recvs[0] = recv;
    w->nrecvs = 1;
  }
  if (r != ncclSuccess) {
    plan_work_free(w);
    return r;
  }
  w->piece = slot_elems(comm, w->esize);
  int lane = comm->nchannels + (t->coll == COLL_SEND ? 0 : comm->nranks) + t->peer;
  plan_lane_push(&p->lanes[lane], w);
  return ncclSuccess;
}

/* On a CUDA communicator the copy is a work of its own, a copy step run
 * by the kernel in stream order: the buffers are device memory, and the
 * data may not be there yet when the call is made. */
static ncclResult_t plan_self_copy(struct comm_plan *p, struct task *s, struct task *r) {
  struct ncclComm *comm = p->comm;
  struct work *w;
  CHECK(new_work(comm, r, 0, &w));
  w->src = s->sendbuff;
  ncclResult_t e = schedule_loop(&w->sched, 0, 0, r->count, r->count, 1);
  if (e == ncclSuccess)
    e = schedule_tmpl(&w->sched, STEP_COPY, 0, 0, 0, 0, TMPL_REL_SRC | TMPL_REL_DST, 0, 0);
  e = schedule_finish(&w->sched, e);
  if (e != ncclSuccess) {
    plan_work_free(w);
    return e;
  }
  w->piece = slot_elems(comm, w->esize);
  plan_lane_push(&p->lanes[comm->nchannels + comm->rank], w);
  return ncclSuccess;
}

/* A send to oneself is a copy into the matching receive from oneself, in
 * call order. */
static ncclResult_t run_self(struct comm_plan *p) {
  struct ncclComm *comm = p->comm;
  int nsend = 0, nrecv = 0;
  for (struct task *t = comm->tasks_head; t; t = t->next)
    if (t->peer == comm->rank && (t->coll == COLL_SEND || t->coll == COLL_RECV))
      *(t->coll == COLL_SEND ? &nsend : &nrecv) += 1;
  if (nsend != nrecv)
    return err_set(ncclInvalidUsage,
                   "rank %d posted %d send(s) to itself but %d receive(s) from itself in the same group; each "
                   "ncclSend to self needs a matching ncclRecv from self",
                   comm->rank, nsend, nrecv);
  struct task *s = comm->tasks_head, *r = comm->tasks_head;
  for (int k = 0; k < nsend; k++) {
    while (!(s->coll == COLL_SEND && s->peer == comm->rank))
      s = s->next;
    while (!(r->coll == COLL_RECV && r->peer == comm->rank))
      r = r->next;
    if (s->count != r->count || s->dtype != r->dtype)
      return err_set(ncclInvalidUsage,
                     "rank %d sends %zu x %s to itself but receives %zu x %s from itself: counts and datatypes "
                     "must match",
                     comm->rank, s->count, dtype_name(s->dtype), r->count, dtype_name(r->dtype));
    size_t bytes = s->count * dtype_size(s->dtype);
    const char *from = s->sendbuff;
    char *to = r->recvbuff;
    if (to != from && bytes > 0) {
      if (comm->is_host) {
        memmove(to, from, bytes);
      } else {
        /* The kernel copies forward in parallel: buffers that overlap
         * without being the same are refused, not corrupted. */
        if (to < from + bytes && from < to + bytes)
          return err_set(ncclInvalidArgument,
                         "rank %d sends %zu bytes to itself from %p into %p, which overlap; on a CUDA communicator "
                         "the buffers of a copy to oneself must be the same or apart",
                         comm->rank, bytes, (const void *)from, (void *)to);
        CHECK(plan_self_copy(p, s, r));
      }
    }
    s = s->next;
    r = r->next;
  }
  return ncclSuccess;
}

ncclResult_t plan_comm(struct comm_plan *p) {
  struct ncclComm *comm = p->comm;
  /* One launch per communicator and group, on one stream. */
  for (struct task *t = comm->tasks_head; t && !comm->is_host; t = t->next)
    if (t->stream != comm->tasks_head->stream)
      return err_set(ncclInvalidUsage,
                     "rank %d: the operations of one communicator in one group must use the same stream (%p and "
                     "%p here)",
                     comm->rank, comm->tasks_head->stream, t->stream);
  p->nlanes = comm->nchannels + 2 * comm->nranks;
  if (!comm->lanes)
    CHECK(UTIL_CALLOC(&comm->lanes, p->nlanes, "lanes"));
  p->lanes = comm->lanes;
  memset(p->lanes, 0, sizeof *p->lanes * (size_t)p->nlanes);
  CHECK(run_self(p));
  for (struct task *t = comm->tasks_head; t; t = t->next) {
    if (t->coll == COLL_SEND || t->coll == COLL_RECV) {
      if (t->peer != comm->rank && t->count > 0)
        CHECK(plan_p2p(p, t));
      continue;
    }
    /* Every rank numbers every collective, empty ones too, so a rank that
     * skipped one is caught by the next. */
    uint64_t seq = t->call_check ? CALL_CHECK_SEQ_BIT | comm->check_seq++ : comm->coll_seq++;
    if (t->count > 0)
      CHECK(plan_collective(p, t, seq));
  }
  return ncclSuccess;
}

void plan_free(struct comm_plan *plans, int n) {
  for (int i = 0; i < n; i++) {
    for (int l = 0; l < plans[i].nlanes; l++)
      for (struct work *w = plans[i].lanes[l].head, *nx; w; w = nx) {
        nx = w->next;
        plan_work_free(w);
      }
    if (plans[i].lanes)
      memset(plans[i].lanes, 0, sizeof *plans[i].lanes * (size_t)plans[i].nlanes);
  }
}

