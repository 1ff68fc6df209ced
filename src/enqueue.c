/*
 * The end of a group on host communicators: each task becomes one work per
 * channel (collectives) or one work per peer (send/recv), planned by
 * plan.c; works that share connections queue on the same lane and run in
 * call order, lanes run concurrently. The calling thread drives every
 * lane until all are done, a peer fails, or nothing moves for the
 * communicator's timeout (loomCommSetTimeout, else LOOM_TIMEOUT).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "call_check.h"
#include "comm/comm.h"
#include "enqueue.h"
#include "algorithms/tuner.h"
#include "exec/cuda/cuda_exec.h"
#include "exec/host_exec.h"
#include "exec/slot.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "plan.h"
#include "status.h"
#include "transport/transport.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ncclResult_t progress_conn(struct conn *c) {
  return c ? transport_progress(c) : ncclSuccess;
}

static ncclResult_t check_conn(struct conn *c) { return c ? transport_check(c) : ncclSuccess; }

static ncclResult_t failed_conn(struct conn *c) { return c ? transport_failed(c) : ncclSuccess; }

static void fail_context(const struct work *w, const char *what) {
  char desc[200];
  task_describe(w->task, desc, sizeof desc);
  if (w->task->coll == COLL_SEND || w->task->coll == COLL_RECV) {
    err_context("rank %d, %s%s", w->comm->rank, desc, what);
  } else if (w->seq & CALL_CHECK_SEQ_BIT) {
    call_check_what(w->comm, desc, sizeof desc);
    err_context("rank %d, %s, comparing its call with the other ranks' (LOOM_CHECK_CALLS)%s", w->comm->rank, desc,
                what);
  } else {
    err_context("rank %d, %s #%llu%s", w->comm->rank, desc, (unsigned long long)w->seq, what);
  }
}

/* Every connection of the work, in a fixed order: receives, then sends. */
static ncclResult_t each_conn(struct work *w, ncclResult_t (*fn)(struct conn *)) {
  for (int i = 0; i < w->nrecvs; i++)
    CHECK(fn(w->recvs[i]));
  for (int i = 0; i < w->nsends; i++)
    CHECK(fn(w->sends[i]));
  return ncclSuccess;
}

/* Data waiting on a collective connection nobody reads now, stamped with
 * the number of a collective this rank is stuck in but another call: the
 * peer called something else (and so uses other connections), which no
 * slot this rank reads would ever show. */
static ncclResult_t check_crossed(struct comm_plan *p, struct conn *c) {
  if (!c || c->dir != CONN_RECV || !c->connected || c->kind == CONN_P2P || !c->fifo.tail)
    return ncclSuccess;
  /* A network connection's slots arrive only when moved. */
  CHECK(transport_progress(c));
  if (atomic_load_explicit(c->fifo.tail, memory_order_acquire) <= c->step)
    return ncclSuccess;
  const struct slot_hdr *got = fifo_hdr(&c->fifo, c->step);
  for (int l = 0; l < p->nlanes; l++) {
    const struct work *w = p->lanes[l].head;
    if (!w || w->task->coll == COLL_SEND || w->task->coll == COLL_RECV || w->seq != got->seq)
      continue;
    struct slot_hdr want;
    slot_expect(w->task, w->seq, &want);
    ncclResult_t r = slot_check_crossed(&want, got, p->comm->rank, c->peer);
    if (r != ncclSuccess) {
      fail_context(w, "");
      return r;
    }
  }
  return ncclSuccess;
}

/* Periodic checks while nothing moves: abort, dead peers, mismatched
 * calls, the timeout. */
static ncclResult_t check_stalled(struct comm_plan *plans, int n, uint64_t idle_ns) {
  uint64_t since = time_ns() - idle_ns;
  for (int i = 0; i < n; i++) {
    struct comm_plan *p = &plans[i];
    for (int l = 0; l < p->nlanes; l++)
      if (p->lanes[l].head) {
        status_waiting(p->comm, p->lanes[l].head, since);
        break;
      }
    for (int c = 0; c < p->comm->nchannels; c++)
      CHECK(check_crossed(p, p->comm->ring_recv[c]));
    for (struct conn *c = p->comm->extra_conns; c; c = c->next_extra)
      CHECK(check_crossed(p, c));
    if (comm_aborted(p->comm))
      return err_set(ncclInvalidUsage, "rank %d: the communicator was aborted during the operation", p->comm->rank);
    for (int l = 0; l < p->nlanes; l++) {
      struct work *w = p->lanes[l].head;
      if (!w)
        continue;
      /* A failure of its own comes first: it is the cause, while a peer
       * that has exited may only have seen it first. */
      ncclResult_t r = each_conn(w, failed_conn);
      if (r == ncclSuccess)
        r = exec_check_waiting(w);
      struct conn *blocked[WORK_MAX_PEERS];
      int nb = exec_waiting_on(w, blocked);
      for (int k = 0; k < nb && r == ncclSuccess; k++)
        r = check_conn(blocked[k]);
      if (r != ncclSuccess) {
        fail_context(w, "");
        return r;
      }
      if (idle_ns >= comm_timeout_ns(p->comm)) {
        /* The ranks this one waits for may wait for others in turn: on
         * this host their status pages name the one everybody waits on. */
        char wait[LOOM_ERR_LEN - 200];
        exec_describe_wait(w, wait, sizeof wait);
        int peer = nb > 0 ? blocked[0]->peer : exec_waiting_rank(w);
        if (peer >= 0)
          status_explain_peer(p->comm, peer, wait, sizeof wait);
        status_log(p->comm);
        char bound[TIMEOUT_NAME_LEN];
        r = err_set(ncclRemoteError, "timed out after %s with no progress while waiting for %s",
                    comm_timeout_name(p->comm, bound, sizeof bound), wait);
        fail_context(w, "");
        return r;
      }
    }
  }
  return ncclSuccess;
}

/* Descriptors to block on: those of every connection of the active works,
 * as long as each of them has its progress announced by descriptors (the
 * network's sockets); 0 where one does not, and the rank must poll. */
#define RUN_WAIT_FDS 64
static int run_wait_fds(struct comm_plan *plans, int n, struct pollfd *fds) {
  int nf = 0;
  for (int i = 0; i < n; i++)
    for (int l = 0; l < plans[i].nlanes; l++) {
      struct work *w = plans[i].lanes[l].head;
      /* A flat collective moves in the arena, which no descriptor shows. */
      if (w && w->flat.on)
        return 0;
      for (int k = 0; w && k < w->nrecvs + w->nsends; k++) {
        struct conn *c = k < w->nrecvs ? w->recvs[k] : w->sends[k - w->nrecvs];
        if (!c)
          continue;
        int m = transport_wait_fds(c, fds + nf, RUN_WAIT_FDS - nf);
        if (m < 0)
          return 0;
        nf += m;
      }
    }
  return nf;
}

static ncclResult_t run(struct comm_plan *plans, int n) {
  struct waiter wt;
  uint64_t spin = n > 0 ? plans[0].comm->spin_ns : 0, yield = n > 0 ? plans[0].comm->yield_ns : WAIT_YIELD_NS;
  for (int i = 1; i < n; i++) {
    spin = LOOM_MIN(spin, plans[i].comm->spin_ns);
    yield = LOOM_MIN(yield, plans[i].comm->yield_ns);
  }
  wait_init(&wt, spin, yield);
  /* The clock is read only every few idle rounds: a small collective
   * that completes within its first polls never reads it. */
  uint64_t last_moved = 0, next_check = 0, activity = 0;
  unsigned idle = 0;
  for (;;) {
    int moved = 0, active = 0;
    struct work *only = NULL; /* the head work of the one active lane */
    for (int i = 0; i < n; i++) {
      struct comm_plan *p = &plans[i];
      for (int l = 0; l < p->nlanes; l++) {
        struct lane *lane = &p->lanes[l];
        while (lane->head) {
          struct work *w = lane->head;
          int done = 0;
          ncclResult_t r = each_conn(w, progress_conn);
          if (r == ncclSuccess)
            r = exec_progress(w, &moved, &done);
          /* What was just posted leaves now rather than next round. */
          for (int k = 0; r == ncclSuccess && k < w->nsends; k++)
            r = progress_conn(w->sends[k]);
          if (r != ncclSuccess) {
            fail_context(w, "");
            return r;
          }
          if (!done || !exec_flushed(w))
            break;
          lane->head = w->next;
          if (!lane->head)
            lane->tail = NULL;
          plan_work_free(w);
          moved = 1;
        }
        if (lane->head) {
          active++;
          only = lane->head;
        }
      }
    }
    if (!active)
      return ncclSuccess;
    if (moved) {
      wait_reset(&wt);
      if (next_check != 0) { /* it had stalled long enough to be reported */
        for (int i = 0; i < n; i++)
          status_moving(plans[i].comm);
      }
      last_moved = 0;
      next_check = 0;
      idle = 0;
      continue;
    }
    if ((++idle & 31) == 0) {
      uint64_t now = time_ns();
      if (next_check == 0)
        next_check = now + 100000000ull;
      if (last_moved == 0)
        last_moved = now;
      if (now >= next_check) {
        next_check = now + 100000000ull;
        /* Bytes under way on a network link are progress, though no slot
         * has moved: LOOM_TIMEOUT is for links where nothing moves. */
        uint64_t a = 0;
        for (int i = 0; i < n; i++)
          a += transport_comm_activity(plans[i].comm);
        if (a != activity) {
          activity = a;
          last_moved = now;
        }
        CHECK(check_stalled(plans, n, now - last_moved));
      }
    }
    /* One work blocked on one shared-memory FIFO can sleep until its peer
     * moves it; with several, each may be the one to move first. Works
     * that wait only on network sockets, where every round of polling is
     * a system call, spin, yield a little, then block in poll() on them
     * (wait_poll) instead of yielding on: a rank that only yields keeps
     * taking the CPU from the peers on this host it waits for. */
    _Atomic uint64_t *counter;
    _Atomic uint32_t *sleepers;
    uint64_t seen;
    struct pollfd fds[RUN_WAIT_FDS];
    int nfds;
    if (wait_spun(&wt) && active == 1 && exec_sleep_target(only, &counter, &seen, &sleepers))
      wait_sleep_on(&wt, counter, seen, sleepers);
    else if ((nfds = run_wait_fds(plans, n, fds)) > 0)
      wait_poll(&wt, fds, nfds);
    else
      wait_pause(&wt);
  }
}

/* The shape of a call, as far as its schedule and connections go. */
static int key_matches(const struct work *w, const struct task *t, int symmetric, int wins) {
  return w->key.coll == (int)t->coll + 1 && w->key.count == t->count && w->key.dtype == t->dtype &&
         w->key.root == t->root && w->key.symmetric == symmetric && w->key.wins == wins;
}

/* Small collectives are most of a training step's calls, and their
 * latency is mostly this code: a call with the same shape as the last one
 * takes its work back from the communicator as it is (schedule,
 * connections, slot size), with no task copy, plan or tuner. Only calls
 * whose work is one lane's come here; the first collective, which sets
 * up the connections, never does. */
/* LOOM_CHECK_CALLS for a call of its own (below); sets comm->call_checked
 * where it ran. */
static ncclResult_t check_single(struct ncclComm *comm, struct task *t, int *refused);

ncclResult_t enqueue_single(struct ncclComm *comm, struct task *t, int *handled) {
  *handled = 0;
  if (t->coll == COLL_SEND || t->coll == COLL_RECV || (comm->nranks > 1 && !comm->coll_conns))
    return ncclSuccess;
  if (comm->check_calls && !t->call_check && comm->nranks > 1) {
    int refused = 0;
    ncclResult_t r = check_single(comm, t, &refused);
    if (r != ncclSuccess || refused) {
      *handled = 1;
      if (!refused)
        status_op_end(comm, r);
      return r;
    }
    if (!comm->call_checked)
      return ncclSuccess; /* the group path checks it and runs it */
  }
  /* Calls of a few shapes in turn (a training step's) find theirs among
   * the last works freed. */
  struct work *w = comm->free_works, **link = &comm->free_works;
  /* A work planned before windows were registered, or after they were
   * all deregistered, would go by CPU where the others now go by slices
   * (plan_flat), or the other way round: a rank that plans afresh (a
   * call in a group) must choose as one that takes its work back. */
  int symmetric = plan_symmetric(comm, t), wins = comm->direct_wins != NULL;
  for (int k = 0; w && k < PLAN_KEPT_SHAPES && !key_matches(w, t, symmetric, wins); k++) {
    link = &w->next;
    w = w->next;
  }
  int hit = w && key_matches(w, t, symmetric, wins);
  int algo = ALGO_RING, nch = 1;
  if (!hit && comm->nranks > 1 && t->count > 0) {
    CHECK(plan_pick_algo(comm, t, &algo, &nch));
    if (nch != 1 && algo != ALGO_RD)
      return ncclSuccess;
  }
  *handled = 1;
  comm->call_checked = 0;
  uint64_t seq = t->call_check ? CALL_CHECK_SEQ_BIT | comm->check_seq++ : comm->coll_seq++;
  if (t->count == 0)
    return ncclSuccess;
  if (!t->call_check)
    status_op_start(comm, t, seq, 1);
  struct lane lane = {0};
  struct comm_plan p = {.comm = comm, .lanes = &lane, .nlanes = 1};
  ncclResult_t r = ncclSuccess;
  if (hit) {
    *link = w->next;
    w->task = t;
    w->seq = seq;
    w->src = t->sendbuff;
    w->dst = t->recvbuff;
    exec_rewind(w);
    w->next = NULL;
    plan_lane_push(&lane, w);
  } else {
    r = plan_algo(&p, t, seq, algo, 1);
    if (r != ncclSuccess) {
      char desc[200];
      task_describe(t, desc, sizeof desc);
      err_context("rank %d, preparing %s", comm->rank, desc);
    } else if (lane.head) {
      lane.head->key.coll = (int)t->coll + 1;
      lane.head->key.count = t->count;
      lane.head->key.dtype = t->dtype;
      lane.head->key.root = t->root;
      lane.head->key.symmetric = symmetric;
      lane.head->key.wins = wins;
      r = transport_connect_pending(&comm, 1);
    }
  }
  if (r == ncclSuccess)
    r = run(&p, 1);
  if (r != ncclSuccess) {
    plan_free(&p, 1);
    comm_set_error(comm, r);
  }
  if (!t->call_check)
    status_op_end(comm, r);
  return r;
}

/* The all-gather of LOOM_CHECK_CALLS for the list `tasks`, from and into
 * the communicator's buffers; *ncolls: the collectives it describes. */
static ncclResult_t check_prepare(struct ncclComm *comm, const struct task *tasks, struct task *check,
                                  uint32_t *ncolls) {
  if (!comm->check_buf)
    CHECK(UTIL_CALLOC(&comm->check_buf, (size_t)comm->nranks + 1, "call check buffers"));
  *ncolls = call_check_describe(tasks, comm->coll_seq, comm->rank, &comm->check_buf[0]);
  *check = (struct task){.coll = COLL_ALLGATHER, .sendbuff = &comm->check_buf[0], .recvbuff = &comm->check_buf[1],
                         .count = sizeof(struct call_desc), .dtype = ncclUint8, .op = ncclSum, .root = -1,
                         .peer = -1, .call_check = 1};
  check->red.dtype = ncclUint8;
  return ncclSuccess;
}

/* LOOM_CHECK_CALLS for a call of its own: the check's all-gather takes
 * the same quick path as the call, and the call is then marked checked,
 * whichever path runs it. *refused: the ranks disagree (the sentence is
 * recorded, nothing moved). */
static ncclResult_t check_single(struct ncclComm *comm, struct task *t, int *refused) {
  struct task *next = t->next, check;
  uint32_t ncolls;
  t->next = NULL;
  ncclResult_t pr = check_prepare(comm, t, &check, &ncolls);
  t->next = next;
  CHECK(pr);
  status_op_start(comm, t, comm->coll_seq, 1);
  int handled;
  CHECK(enqueue_single(comm, &check, &handled));
  if (!handled)
    return ncclSuccess; /* the group path checks it */
  ncclResult_t r = call_check_compare(comm, &comm->check_buf[1]);
  if (r != ncclSuccess) {
    status_op_end(comm, ncclSuccess); /* refused, not failed */
    *refused = 1;
    return r;
  }
  comm->call_checked = 1;
  return ncclSuccess;
}

/* Host communicators run here and now; CUDA ones are enqueued on their
 * stream, and run() only drives the host ones. */
static ncclResult_t execute(struct comm_plan *plans, int n) {
  int nhost = 0;
  for (int i = 0; i < n; i++) {
    struct ncclComm *comm = plans[i].comm;
    if (comm->is_host) {
      if (nhost != i) {
        struct comm_plan tmp = plans[nhost];
        plans[nhost] = plans[i];
        plans[i] = tmp;
      }
      nhost++;
      continue;
    }
    void *stream = comm->tasks_head ? comm->tasks_head->stream : NULL;
    ncclResult_t r = cuda_prepare(comm, plans[i].lanes, plans[i].nlanes, stream);
    if (r != ncclSuccess) {
      err_context("rank %d", comm->rank);
      return r;
    }
  }
  /* Only once every launch of the group is packed (and its memory
   * allocated) does the first kernel start. */
  for (int i = nhost; i < n; i++) {
    struct ncclComm *comm = plans[i].comm;
    ncclResult_t r = cuda_launch(comm, comm->tasks_head ? comm->tasks_head->stream : NULL);
    if (r != ncclSuccess) {
      err_context("rank %d", comm->rank);
      return r;
    }
  }
  return run(plans, nhost);
}

/* Plans, connects and runs the tasks queued on these communicators. */
static ncclResult_t launch_tasks(struct ncclComm **comms, int ncomms, struct comm_plan *plans) {
  ncclResult_t r = ncclSuccess;
  memset(plans, 0, sizeof *plans * (size_t)ncomms);
  for (int i = 0; i < ncomms && r == ncclSuccess; i++) {
    plans[i].comm = comms[i];
    log_set_rank(comms[i]->rank);
    r = plan_comm(&plans[i]);
    if (r != ncclSuccess && comms[i]->tasks_head) {
      char desc[200];
      task_describe(comms[i]->tasks_head, desc, sizeof desc);
      err_context("rank %d, preparing %s", comms[i]->rank, desc);
    }
  }
  if (r == ncclSuccess)
    r = transport_connect_pending(comms, ncomms);
  if (r == ncclSuccess)
    r = execute(plans, ncomms);
  plan_free(plans, ncomms);
  return r;
}

/* LOOM_CHECK_CALLS: one all-gather of the calls' descriptions over all the
 * communicators of the launch at once (their other ranks may be this
 * thread's too), run before any of the calls; on a difference every
 * communicator of the launch refuses, as a group does. */
struct call_check_slot {
  struct ncclComm *comm;
  struct task check, *calls_head, *calls_tail;
};

static ncclResult_t check_calls(struct ncclComm **comms, int ncomms, struct comm_plan *plans) {
  struct call_check_slot few[8], *cs = few;
  if (ncomms > 8)
    CHECK(UTIL_CALLOC(&cs, ncomms, "call check"));
  struct ncclComm *sel_few[8], **sel = sel_few;
  ncclResult_t r = ncomms > 8 ? UTIL_CALLOC(&sel, ncomms, "call check") : ncclSuccess;
  int n = 0;
  for (int i = 0; i < ncomms && r == ncclSuccess; i++) {
    struct ncclComm *comm = comms[i];
    if (!comm->check_calls || comm->nranks == 1 || comm->call_checked) {
      comm->call_checked = 0; /* by check_single, for a call the quick path left to this one */
      continue;
    }
    uint32_t ncolls;
    r = check_prepare(comm, comm->tasks_head, &cs[n].check, &ncolls);
    if (r != ncclSuccess || ncolls == 0)
      continue;
    cs[n].comm = sel[n] = comm;
    n++;
  }
  if (r == ncclSuccess && n > 0) {
    /* The calls wait aside while the check runs alone. */
    for (int i = 0; i < n; i++) {
      cs[i].calls_head = cs[i].comm->tasks_head;
      cs[i].calls_tail = cs[i].comm->tasks_tail;
      cs[i].comm->tasks_head = cs[i].comm->tasks_tail = &cs[i].check;
    }
    r = launch_tasks(sel, n, plans);
    for (int i = 0; i < n; i++) {
      cs[i].comm->tasks_head = cs[i].calls_head;
      cs[i].comm->tasks_tail = cs[i].calls_tail;
    }
    for (int i = 0; i < n && r == ncclSuccess; i++) {
      r = call_check_compare(cs[i].comm, &cs[i].comm->check_buf[1]);
      /* Nothing of the calls has moved: the communicators stay usable. */
      for (int k = 0; r != ncclSuccess && k < ncomms; k++)
        comms[k]->call_refused = 1;
    }
  }
  if (cs != few)
    free(cs);
  if (sel != sel_few && sel)
    free(sel);
  return r;
}

ncclResult_t enqueue_launch(struct ncclComm **comms, int ncomms) {
  struct comm_plan few[8], *plans = few;
  if (ncomms > 8)
    CHECK(UTIL_CALLOC(&plans, ncomms, "plans"));
  ncclResult_t r = ncclSuccess;
  int any_cuda = 0;
  for (int i = 0; i < ncomms; i++)
    any_cuda |= !comms[i]->is_host;
  int saved_dev = any_cuda ? cuda_current_device() : -1;
  int saved_mode = any_cuda ? cuda_capture_relax() : 0;
  for (int i = 0; i < ncomms; i++) {
    int ntasks = 0;
    for (struct task *t = comms[i]->tasks_head; t; t = t->next)
      ntasks++;
    status_op_start(comms[i], comms[i]->tasks_head, comms[i]->coll_seq, ntasks);
  }
  r = check_calls(comms, ncomms, plans);
  if (r == ncclSuccess)
    r = launch_tasks(comms, ncomms, plans);
  for (int i = 0; i < ncomms; i++)
    status_op_end(comms[i], r);
  if (plans != few)
    free(plans);
  if (any_cuda)
    cuda_capture_restore(saved_mode);
  cuda_restore_device(saved_dev);
  return r;
}
