/*
 * The Simple protocol's piece loop of loom_kernel (kernel.cu), included
 * there. A piece is one FIFO slot's worth of a step: thread 0 walks the
 * lane's works and steps (`walk_next`), waits for each piece's slots
 * (`hand_wait`) and publishes them (`hand_publish`); the other threads
 * move the data (`move_piece`).
 *
 * With a warp of its own for thread 0 (`simple_warp`, every NVIDIA block),
 * the handshake of piece k+1 overlaps the data of piece k: while the data
 * warps move k, thread 0 expands k+1 and polls its counters, without ever
 * blocking on them, since k+1's data may depend on this rank's k (a tree
 * sends k up and receives k+1, the parent's answer, down). Once the data
 * warps are done with k (a count in shared memory they bump) it stops
 * polling, publishes k, and only then waits for k+1 for good. Named
 * barriers hand the pieces over: READY (thread 0's warp arrives, the data
 * warps wait) and DONE (the data warps arrive and go on to wait at READY,
 * thread 0's warp waits; bar_sync and the rest are port.cuh's). Blocks
 * too small for two warps run the serial loop (`simple_serial`), which
 * the emulation's 1-thread blocks take, and so does every block on AMD
 * GPUs, which have no named barriers.
 * SPDX-License-Identifier: Apache-2.0
 */

/* What the data threads move for one piece: filled by thread 0, read by
 * all between the barriers that hand it over. */
struct piece {
  const char *in; /* the received slot's payload, or NULL */
  char *out;      /* the sent slot's payload, or NULL */
  const char *src;
  char *dst;
  uint64_t n, bytes;
  struct red_op op;
  int32_t kind, final, transform;
};

/* A piece's handshake, thread 0's alone: the counters it waits for, the
 * ones publishing it advances, and the headers. */
struct hand {
  const uint64_t *rtail, *shead;
  uint64_t rwant, swant;
  uint64_t *rhead, *stail;
  uint64_t rheadv, stailv;
  char *rhdr, *shdr;
  struct slot_hdr mine, expect;
  int32_t recv, send, check_seq, peer;
  uint32_t work, step;
  int32_t rok, sok; /* counters already seen at their goal while polling */
};

/* Thread 0's walk over the lane's works, steps and pieces. */
struct walk {
  struct dev_work w;
  struct dev_conn sends[WORK_MAX_PEERS], recvs[WORK_MAX_PEERS];
  /* Slot counts of the work's connections, the pieces walked so far
   * included (published or not). */
  uint64_t rstep[WORK_MAX_PEERS], sstep[WORK_MAX_PEERS];
  struct step st;
  uint32_t wi, wend;
  uint64_t si, off;
  int32_t loaded, have_step;
};

/* Everything the block shares for the Simple loop. */
struct simple_shared {
  struct walk W;
  struct hand h[2];
  struct piece pc[2];
  int32_t stop;
  uint32_t done; /* data warps done with their share, summed over pieces: a hint */
};

/* A connection's count when a work starts: the word its last work left,
 * unless that is a counter the piece still to be published (`pend`)
 * advances: the count then includes it. */
__device__ uint64_t count_at_start(const uint64_t *p, const struct hand *pend) {
  if (!p)
    return 0;
  if (pend && pend->send && p == pend->stail)
    return pend->stailv;
  if (pend && pend->recv && p == pend->rhead)
    return pend->rheadv;
  return status_load(p);
}

__device__ void work_load(struct walk &W, const char *base, const struct dev_work *works, const struct dev_conn *conns,
                          const struct hand *pend) {
  struct dev_work &w = W.w;
  w = works[W.wi];
  w.sched.tmpl = (struct step_tmpl *)(base + w.tmpl_off);
  if (w.scalar_dev)
    read_scalar(w.red, w.scalar_dev);
  /* Each connection goes on from the count its last work left, which
   * only this side's kernels write: so a graph's replays go on too. */
  for (int k = 0; k < w.nsends; k++) {
    W.sends[k] = conns[w.conn0 + k];
    W.sstep[k] = count_at_start(W.sends[k].step, pend);
  }
  for (int k = 0; k < w.nrecvs; k++) {
    W.recvs[k] = conns[w.conn0 + w.nsends + k];
    W.rstep[k] = count_at_start(W.recvs[k].step, pend);
  }
}

/* Where the count is not the connection's own counter, it is kept. With
 * the overlap this runs before the work's last piece is published: the
 * counts already include it, and nothing can stop the kernel between the
 * two (thread 0 waits for no peer until it has published). */
__device__ void work_end(struct walk &W, struct dev_status *status) {
  for (int k = 0; k < W.w.nsends; k++)
    if (W.sends[k].step && W.sends[k].step != W.sends[k].tail)
      status_store(W.sends[k].step, W.sstep[k]);
  for (int k = 0; k < W.w.nrecvs; k++)
    if (W.recvs[k].step && W.recvs[k].step != W.recvs[k].head)
      status_store(W.recvs[k].step, W.rstep[k]);
  status_store(&status->progress, progress_stamp());
}

/* The lane's next piece into pc and h, its slots counted; false at the
 * lane's end. Steps are expanded as the host executor expands them; an
 * empty one (nelem 0) moves no slot on either side. */
__device__ bool walk_next(struct walk &W, const char *base, const struct dev_work *works, const struct dev_conn *conns,
                          struct dev_status *status, struct piece &pc, struct hand &h, const struct hand *pend) {
  const struct dev_work &w = W.w;
  for (;;) {
    if (!W.loaded) {
      if (W.wi >= W.wend)
        return false;
      work_load(W, base, works, conns, pend);
      W.loaded = 1;
      W.si = 0;
      W.have_step = 0;
    }
    if (!W.have_step) {
      if (W.si >= w.sched.nsteps) {
        work_end(W, status);
        W.loaded = 0;
        W.wi++;
        continue;
      }
      sched_at(&w.sched, W.si, &W.st);
      W.off = 0;
      W.have_step = 1;
    }
    if (W.off >= W.st.nelem) {
      W.have_step = 0;
      W.si++;
      continue;
    }
    break;
  }
  const struct step &st = W.st;
  const uint64_t off = W.off;
  const uint64_t n = st.nelem - off < w.piece ? st.nelem - off : w.piece;
  const uint64_t bytes = n * w.esize;
  W.off += n;
  h.recv = step_recvs(st.kind);
  h.send = step_sends(st.kind);
  h.rok = !h.recv;
  h.sok = !h.send;
  h.check_seq = w.check_seq;
  h.work = W.wi;
  h.step = (uint32_t)W.si;
  char *rslot = NULL, *sslot = NULL;
  if (h.recv) {
    const struct dev_conn *rc = &W.recvs[st.ri];
    const uint64_t rs = W.rstep[st.ri]++;
    rslot = rc->base + (rs % NCCL_STEPS) * rc->stride;
    h.rhdr = rc->hdrs ? rc->hdrs + (rs % NCCL_STEPS) * SLOT_HDR_BYTES : rslot;
    h.rtail = rc->tail;
    h.rwant = rs + 1;
    h.rhead = rc->head;
    h.rheadv = rs + 1;
    h.peer = rc->peer;
    h.expect = w.expect;
    h.expect.bytes = (uint32_t)bytes;
  }
  if (h.send) {
    const struct dev_conn *sc = &W.sends[st.si];
    const uint64_t ss = W.sstep[st.si]++;
    sslot = sc->base + (ss % NCCL_STEPS) * sc->stride;
    h.shdr = sc->hdrs ? sc->hdrs + (ss % NCCL_STEPS) * SLOT_HDR_BYTES : sslot;
    h.shead = sc->head;
    h.swant = ss + 1 > NCCL_STEPS ? ss + 1 - NCCL_STEPS : 0;
    h.stail = sc->tail;
    h.stailv = ss + 1;
    h.mine = w.mine;
    h.mine.bytes = (uint32_t)bytes;
  }
  const int final = st.flags & STEP_FINAL;
  pc.in = rslot ? rslot + SLOT_HDR_BYTES : NULL;
  pc.out = sslot ? sslot + SLOT_HDR_BYTES : NULL;
  const char *src_base = (st.flags & STEP_SRC_DST) ? w.dst : w.src;
  pc.src = src_base ? src_base + (st.src_off + off) * w.esize : NULL;
  pc.dst = w.dst ? w.dst + (st.dst_off + off) * w.esize : NULL;
  pc.n = n;
  pc.bytes = bytes;
  /* A partial result as local input had PreMulSum applied already. */
  pc.op = w.red;
  if (st.flags & STEP_NO_PREMUL)
    pc.op.premul = 0;
  pc.kind = st.kind;
  pc.final = final;
  pc.transform = (w.red.premul && !(st.flags & STEP_NO_PREMUL)) || (final && w.red.postdiv);
  return true;
}

/* Whether the piece's slots are there, without waiting. */
__device__ bool hand_ready(struct hand &h) {
  if (!h.rok)
    h.rok = load_acquire(h.rtail) >= h.rwant;
  if (!h.sok)
    h.sok = load_acquire(h.shead) >= h.swant;
  return h.rok && h.sok;
}

/* Waits for the piece's slots and checks the received header; false
 * (the kernel stops) on a mismatch, recorded, or an abort. */
__device__ bool hand_wait(struct hand &h, struct dev_status *status) {
  if (!h.rok && !wait_counter(h.rtail, h.rwant, status))
    return false;
  if (h.recv) {
    struct slot_hdr got = read_hdr(h.rhdr);
    if (!hdr_matches(h.expect, got, h.check_seq)) {
      record(status, DEV_ERR_MISMATCH, blockIdx.x, h.work, h.step, h.peer, &got, &h.expect);
      return false;
    }
  }
  if (!h.sok && !wait_counter(h.shead, h.swant, status))
    return false;
  return true;
}

/* Thread 0, once every thread's data writes are ordered before it by a
 * barrier (bar.sync or bar.arrive: PTX performs a thread's prior accesses
 * for all the barrier's threads when it completes, CTA scope): the
 * release of the tail (system scope, cumulative) makes them visible to
 * the peer that acquires it. No thread fences on its own. */
__device__ void hand_publish(const struct hand &h, struct dev_status *status) {
  if (h.send) {
    write_hdr(h.shdr, h.mine);
    store_release(h.stail, h.stailv);
  }
  if (h.recv)
    store_release(h.rhead, h.rheadv);
  /* Written, never read (a posted write): the proxy only looks for a
   * change. Every slot, since a kernel that moves none for 100 ms while a
   * peer has exited is taken for one stuck on that peer. */
  status_store(&status->progress, progress_stamp());
}

__device__ void move_piece(const struct piece &p, uint64_t tid, uint64_t nthr) {
  switch (p.kind) {
  case STEP_SEND:
    if (p.transform)
      reduce_any(p.op, p.out, NULL, NULL, p.src, p.n, p.final, tid, nthr);
    else
      copy_bytes(p.out, NULL, p.src, p.bytes, tid, nthr);
    break;
  case STEP_RECV: copy_bytes(p.dst, NULL, p.in, p.bytes, tid, nthr); break;
  case STEP_COPY_SEND: copy_bytes(p.out, p.dst != p.src ? p.dst : NULL, p.src, p.bytes, tid, nthr); break;
  case STEP_RECV_COPY_SEND: copy_bytes(p.out, p.dst, p.in, p.bytes, tid, nthr); break;
  case STEP_RECV_REDUCE_SEND: reduce_any(p.op, p.out, NULL, p.in, p.src, p.n, 0, tid, nthr); break;
  case STEP_RECV_REDUCE_COPY: reduce_any(p.op, p.dst, NULL, p.in, p.src, p.n, p.final, tid, nthr); break;
  case STEP_RECV_REDUCE_COPY_SEND: reduce_any(p.op, p.dst, p.out, p.in, p.src, p.n, p.final, tid, nthr); break;
  case STEP_COPY:
    if (p.transform)
      reduce_any(p.op, p.dst, NULL, NULL, p.src, p.n, p.final, tid, nthr);
    else if (p.dst != p.src)
      copy_bytes(p.dst, NULL, p.src, p.bytes, tid, nthr);
    break;
  }
}

/* ---- the loops ------------------------------------------------------------ */

/* Every thread moves data; thread 0 waits and publishes in between. */
__device__ void simple_serial(struct simple_shared &S, const char *base, const struct dev_work *works,
                              const struct dev_conn *conns, struct dev_status *status) {
  const uint32_t tid = threadIdx.x, nthr = blockDim.x;
  for (;;) {
    if (tid == 0)
      S.stop = !walk_next(S.W, base, works, conns, status, S.pc[0], S.h[0], NULL) || !hand_wait(S.h[0], status);
    __syncthreads();
    if (S.stop)
      return;
    move_piece(S.pc[0], tid, nthr);
    /* Every thread's writes to the outgoing slot before thread 0's
     * release, and every thread done with pc before thread 0 refills it. */
    __syncthreads();
    if (tid == 0)
      hand_publish(S.h[0], status);
  }
}

/* Threads [0, sw) are the sync warp (thread 0 works, its other lanes
 * follow it through the barriers); the others move data. */
__device__ void simple_warp(struct simple_shared &S, uint32_t sw, const char *base, const struct dev_work *works,
                            const struct dev_conn *conns, struct dev_status *status) {
  const uint32_t tid = threadIdx.x, nthr = blockDim.x;
  const uint32_t nd = nthr - sw, ndw = (nd + 31) / 32;
  if (tid >= sw) {
    const uint32_t d = tid - sw;
    for (uint32_t k = 0;; k++) {
      bar_sync(BAR_READY, nthr);
      if (S.stop)
        return;
      move_piece(S.pc[k & 1], d, nd);
      /* A hint only: early (a lane of the warp still storing) costs
       * nothing, since thread 0 then waits at DONE. */
      if ((d & 31) == 0)
        hint_bump(&S.done);
      /* bar.arrive orders these stores before DONE's completion, after
       * which thread 0 releases them; the warp goes on to READY. */
      bar_arrive(BAR_DONE, nthr);
    }
  }
  bool next = false;
  if (tid == 0) {
    S.done = 0;
    next = walk_next(S.W, base, works, conns, status, S.pc[0], S.h[0], NULL);
    S.stop = !next || !hand_wait(S.h[0], status);
  }
  for (uint32_t k = 0;; k++) {
    const uint32_t cur = k & 1, nx = cur ^ 1;
    sync_warp_sync(sw);
    bar_arrive(BAR_READY, nthr);
    if (S.stop)
      return;
    if (tid == 0) {
      /* Piece k+1's counters polled, never waited for, until the data
       * warps are done with k: k+1's slots may come only once this
       * rank's k is published, which needs the data warps' k first. */
      next = walk_next(S.W, base, works, conns, status, S.pc[nx], S.h[nx], &S.h[cur]);
      const uint32_t goal = (k + 1) * ndw;
      while (next && !hand_ready(S.h[nx]) && hint_load(&S.done) != goal)
        poll_pause();
    }
    sync_warp_sync(sw);
    bar_sync(BAR_DONE, nthr);
    if (tid == 0) {
      hand_publish(S.h[cur], status);
      S.stop = !next || !hand_wait(S.h[nx], status);
    }
  }
}
