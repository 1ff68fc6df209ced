/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "comm/comm.h"
#include "exec/copy.h"
#include "exec/flat.h"
#include "exec/host_exec.h"
#include "exec/slot.h"
#include "exec/reduce.h"
#include "transport/transport.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

static void fill_hdr(const struct work *w, struct slot_hdr *h, size_t bytes) {
  slot_mine(w->task, w->seq, w->comm->rank, h);
  h->bytes = (uint32_t)bytes;
}

/* The receiver compares what the sender wrote with its own call: the
 * first slot of a mismatched call names the disagreement instead of
 * corrupting data or hanging. */
static ncclResult_t check_hdr(const struct work *w, const struct conn *rc, const struct slot_hdr *h, size_t bytes) {
  struct slot_hdr want;
  slot_expect(w->task, w->seq, &want);
  want.bytes = (uint32_t)bytes;
  int check_seq = w->task->coll != COLL_RECV;
  if (slot_matches(&want, h, check_seq))
    return ncclSuccess;
  return slot_mismatch(&want, h, w->comm->rank, rc->peer, check_seq);
}

/* A payload posted by reference: read from the sender's buffer into `to`,
 * the one copy it makes. */
static ncclResult_t fetch_ref(const struct conn *rc, const char *slot, char *to, size_t bytes) {
  struct slot_ref ref;
  memcpy(&ref, slot, sizeof ref);
  if (rc->fifo.ref_local) {
    memcpy(to, (const char *)(uintptr_t)ref.addr, bytes);
    return ncclSuccess;
  }
  for (size_t done = 0; done < bytes;) {
    struct iovec local = {to + done, bytes - done}, remote = {(char *)(uintptr_t)ref.addr + done, bytes - done};
    ssize_t n = process_vm_readv(rc->fifo.ref_pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int e = n < 0 ? errno : EFAULT;
      return err_set(e == ESRCH ? ncclRemoteError : ncclSystemError,
                     "reading %zu bytes straight from rank %d (%s, pid %d) failed: %s%s", bytes, rc->peer,
                     rc->comm->peers[rc->peer].hostname, rc->fifo.ref_pid, strerror(e),
                     e == EPERM ? " (this process may not read its peer's memory; LOOM_SHM_SINGLE_COPY=0 turns "
                                  "single copy off)"
                                : "");
    }
    done += (size_t)n;
  }
  return ncclSuccess;
}

/* What a send step may post by reference instead of copying: data that
 * is final where it lies in a user buffer, so the rest of the call leaves
 * it alone, and that the caller cannot change before the call returns,
 * which waits for the receiver to release the slot (ref_until). A
 * forwarded value (RECV_COPY_SEND, COPY_SEND) is final in the output; the
 * input is, where the call never writes over it (AllGather, Broadcast);
 * a reduction's result is, once final (the second half of ring AllReduce). */
static const char *ref_source(const struct work *w, const struct step *st, const char *src, const char *dst,
                              int transform) {
  switch (st->kind) {
  case STEP_RECV_COPY_SEND:
  case STEP_COPY_SEND:
    return dst;
  case STEP_RECV_REDUCE_COPY_SEND:
    return (st->flags & STEP_FINAL) ? dst : NULL;
  case STEP_SEND:
    return !transform && (w->task->coll == COLL_ALLGATHER || w->task->coll == COLL_BROADCAST) ? src : NULL;
  default:
    return NULL;
  }
}

/* One slot's worth of the current step, if its FIFOs allow it now. */
static ncclResult_t piece(struct work *w, const struct step *st, int *moved) {
  int recv = step_recvs(st->kind), send = step_sends(st->kind);
  struct conn *rc = recv ? w->recvs[st->ri] : NULL, *sc = send ? w->sends[st->si] : NULL;
  if (recv && atomic_load_explicit(rc->fifo.tail, memory_order_acquire) <= rc->step)
    return ncclSuccess;
  if (send && sc->step - atomic_load_explicit(sc->fifo.head, memory_order_acquire) >= NCCL_STEPS)
    return ncclSuccess;
  size_t n = LOOM_MIN(w->piece, st->nelem - w->step_off);
  size_t bytes = n * w->esize;
  const char *in = NULL;
  int in_ref = 0;
  if (recv) {
    const struct slot_hdr *h = fifo_hdr(&rc->fifo, rc->step);
    CHECK(check_hdr(w, rc, h, bytes));
    in = fifo_data(&rc->fifo, rc->step);
    in_ref = h->where == SLOT_BY_REF;
  }
  char *out = send ? fifo_data(&sc->fifo, sc->step) : NULL;
  const char *src_base = (st->flags & STEP_SRC_DST) ? w->dst : w->src;
  const char *src = src_base ? src_base + (st->src_off + w->step_off) * w->esize : NULL;
  char *dst = w->dst ? w->dst + (st->dst_off + w->step_off) * w->esize : NULL;
  /* A partial result as local input had PreMulSum applied already. */
  struct red_op partial;
  const struct red_op *op = &w->task->red;
  if ((st->flags & STEP_NO_PREMUL) && op->premul) {
    partial = *op;
    partial.premul = 0;
    op = &partial;
  }
  int final = st->flags & STEP_FINAL;
  /* Where the local input enters a reduction alone, PreMulSum and Avg
   * still have to be applied to it. */
  int transform = op->premul || (final && op->postdiv);
  const char *ref = send && sc->fifo.ref_min && bytes >= sc->fifo.ref_min ? ref_source(w, st, src, dst, transform) : NULL;
  /* A payload left in the sender's buffer lands in the output at once
   * where the step only copies it, and in this side's own slot where it
   * is reduced. */
  int landed = 0;
  if (in_ref && (st->kind == STEP_RECV || st->kind == STEP_RECV_COPY_SEND)) {
    CHECK(fetch_ref(rc, in, dst, bytes));
    landed = 1;
  } else if (in_ref) {
    CHECK(fetch_ref(rc, in, (char *)in, bytes));
  }
  switch (st->kind) {
  case STEP_SEND:
    if (ref)
      break;
    if (transform)
      red_copy(op, out, NULL, src, n, final);
    else
      memcpy(out, src, bytes);
    break;
  case STEP_RECV:
    /* The payload's last stop: an output this call has not read, out of
     * place (copy.h, COPY_STREAM_MIN); in place its lines were read as
     * the input and ordinary stores find them in the cache. */
    if (landed)
      break;
    if (exec_streams_out(w))
      copy_streaming(dst, in, bytes);
    else
      memcpy(dst, in, bytes);
    break;
  case STEP_COPY_SEND:
    if (!ref)
      memcpy(out, src, bytes);
    if (dst != src)
      memcpy(dst, src, bytes);
    break;
  case STEP_RECV_COPY_SEND:
    if (!landed)
      memcpy(dst, in, bytes);
    if (!ref)
      memcpy(out, dst, bytes);
    break;
  case STEP_RECV_REDUCE_SEND:
    red_reduce(op, out, NULL, in, src, n, 0);
    break;
  case STEP_RECV_REDUCE_COPY:
    red_reduce(op, dst, NULL, in, src, n, final);
    break;
  case STEP_RECV_REDUCE_COPY_SEND:
    /* A final result out of place: the output's lines are not read
     * again, so they are written from the slot, where the reduction
     * leaves the piece in this core's cache, with streaming stores rather
     * than alongside it with ordinary ones (2 ranks, 1-64 MiB: 7-11% less
     * time per call, perf/README.md). */
    if (!ref && final && exec_streams_out(w)) {
      red_reduce(op, out, NULL, in, src, n, final);
      copy_streaming(dst, out, bytes);
    } else {
      red_reduce(op, dst, ref ? NULL : out, in, src, n, final);
    }
    break;
  case STEP_COPY:
    if (transform)
      red_copy(op, dst, NULL, src, n, final);
    else if (dst != src)
      memcpy(dst, src, bytes);
    break;
  default:
    return err_set(ncclInternalError, "unknown step kind %d", st->kind);
  }
  if (send) {
    struct slot_hdr *h = fifo_hdr(&sc->fifo, sc->step);
    fill_hdr(w, h, bytes);
    if (ref) {
      struct slot_ref r = {.addr = (uint64_t)(uintptr_t)ref};
      memcpy(out, &r, sizeof r);
      h->where = SLOT_BY_REF;
      sc->ref_until = sc->step + 1;
    }
    atomic_store_explicit(sc->fifo.tail, ++sc->step, memory_order_seq_cst);
    fifo_wake(sc->fifo.tail, sc->fifo.tail_sleepers);
  }
  if (recv) {
    atomic_store_explicit(rc->fifo.head, ++rc->step, memory_order_seq_cst);
    fifo_wake(rc->fifo.head, rc->fifo.head_sleepers);
  }
  w->step_off += n;
  *moved = 1;
  return ncclSuccess;
}

ncclResult_t exec_progress(struct work *w, int *moved, int *done) {
  if (w->flat.on)
    return flat_progress(w, moved, done);
  *done = 0;
  while (w->step < w->sched.nsteps) {
    /* Steps are expanded as they are reached; the ones clipping left
     * empty are skipped, as the peer skips them. */
    if (w->cur_at != w->step) {
      sched_at(&w->sched, w->step, &w->cur);
      w->cur_at = w->step;
    }
    const struct step *st = &w->cur;
    if (st->nelem > 0) {
      int m = 0;
      CHECK(piece(w, st, &m));
      if (!m)
        return ncclSuccess;
      *moved = 1;
      if (w->step_off < st->nelem)
        continue;
    }
    w->step++;
    w->step_off = 0;
  }
  *done = 1;
  return ncclSuccess;
}

/* The step the work is at or will reach next, past empty ones; 0 when it
 * has done them all. */
static int current_step(const struct work *w, struct step *st, uint64_t *index) {
  for (uint64_t k = w->step; k < w->sched.nsteps; k++) {
    sched_at(&w->sched, k, st);
    if (st->nelem > 0) {
      *index = k;
      return 1;
    }
  }
  return 0;
}

/* Whether a send connection's posted slots no longer need this side:
 * gone over the network, and those posted by reference released. */
static int send_flushed(struct conn *c) {
  if (c->ref_until && atomic_load_explicit(c->fifo.head, memory_order_acquire) < c->ref_until)
    return 0;
  return transport_flushed(c);
}

int exec_flushed(const struct work *w) {
  for (int i = 0; i < w->nsends; i++)
    if (w->sends[i] && !send_flushed(w->sends[i]))
      return 0;
  return 1;
}

int exec_sleep_target(const struct work *w, _Atomic uint64_t **counter, uint64_t *seen, _Atomic uint32_t **sleepers) {
  if (w->flat.on)
    return flat_sleep_target(w, counter, seen, sleepers);
  struct step cur;
  uint64_t k;
  if (!current_step(w, &cur, &k)) {
    /* Done but for a receiver still reading what was posted by reference. */
    for (int i = 0; i < w->nsends; i++) {
      struct conn *c = w->sends[i];
      if (!c || !c->ref_until || !c->fifo.head_sleepers)
        continue;
      uint64_t head = atomic_load(c->fifo.head);
      if (head < c->ref_until) {
        *counter = c->fifo.head;
        *seen = head;
        *sleepers = c->fifo.head_sleepers;
        return 1;
      }
    }
    return 0;
  }
  const struct step *st = &cur;
  struct conn *rc = step_recvs(st->kind) ? w->recvs[st->ri] : NULL;
  struct conn *sc = step_sends(st->kind) ? w->sends[st->si] : NULL;
  if (rc && atomic_load(rc->fifo.tail) <= rc->step) {
    if (!rc->fifo.tail_sleepers)
      return 0;
    *counter = rc->fifo.tail;
    *seen = rc->step;
    *sleepers = rc->fifo.tail_sleepers;
    return 1;
  }
  if (sc && sc->step - atomic_load(sc->fifo.head) >= NCCL_STEPS) {
    if (!sc->fifo.head_sleepers)
      return 0;
    *counter = sc->fifo.head;
    *seen = sc->step - NCCL_STEPS;
    *sleepers = sc->fifo.head_sleepers;
    return 1;
  }
  return 0;
}

int exec_waiting_on(const struct work *w, struct conn **out) {
  int n = 0;
  struct step cur;
  uint64_t k;
  if (!current_step(w, &cur, &k)) {
    for (int i = 0; i < w->nsends; i++)
      if (w->sends[i] && !send_flushed(w->sends[i]))
        out[n++] = w->sends[i];
    return n;
  }
  const struct step *st = &cur;
  struct conn *rc = step_recvs(st->kind) ? w->recvs[st->ri] : NULL;
  struct conn *sc = step_sends(st->kind) ? w->sends[st->si] : NULL;
  if (rc && atomic_load(rc->fifo.tail) <= rc->step)
    out[n++] = rc;
  else if (sc)
    out[n++] = sc;
  else if (rc)
    out[n++] = rc;
  return n;
}

void exec_describe_wait(const struct work *w, char *buf, size_t len) {
  if (w->flat.on) {
    flat_describe_wait(w, buf, len);
    return;
  }
  struct step cur;
  uint64_t k;
  if (!current_step(w, &cur, &k)) {
    /* The first send whose data has not left, else the first send (a
     * tree's root has no parent: entries may be NULL). */
    struct conn *pending[WORK_MAX_PEERS];
    const struct conn *c = exec_waiting_on(w, pending) > 0 ? pending[0] : NULL;
    for (int i = 0; i < w->nsends && !c; i++)
      c = w->sends[i];
    snprintf(buf, len, "its data to rank %d to leave (all %llu steps done)", c ? c->peer : -1,
             (unsigned long long)w->sched.nsteps);
    return;
  }
  const struct step *st = &cur;
  int recv = step_recvs(st->kind);
  const struct conn *rc = recv ? w->recvs[st->ri] : NULL, *sc = step_sends(st->kind) ? w->sends[st->si] : NULL;
  int blocked_on_recv = recv && atomic_load(rc->fifo.tail) <= rc->step;
  const struct conn *c = blocked_on_recv ? rc : sc;
  snprintf(buf, len, "%s rank %d (%s) at step %llu of %llu (%s), FIFO slot %llu",
           blocked_on_recv ? "data from" : "a free slot at", c ? c->peer : -1,
           c ? c->comm->peers[c->peer].hostname : "?", (unsigned long long)k + 1,
           (unsigned long long)w->sched.nsteps, step_name(st->kind), (unsigned long long)(c ? c->step : 0));
}

int exec_waiting_rank(const struct work *w) { return w->flat.on ? flat_waiting_rank(w) : -1; }

ncclResult_t exec_check_waiting(const struct work *w) {
  if (w->comm->arena)
    CHECK(flat_check_crossed(w));
  return w->flat.on ? flat_check(w) : ncclSuccess;
}
