/*
 * The LL protocol's works in loom_kernel (included by kernel.cu, which
 * dispatches on dev_work.proto). A small call's cost is its handshakes:
 * here a receiver learns that data arrived from the data itself, each
 * 16-byte line {data32, flag32, data32, flag32} written in one store and
 * polled until both flags are the slot use's, with no counter to acquire
 * and no fence (slot_hdr.h has the layout). Half of what crosses the link
 * is flags, which is why only small calls take it (tuner.c).
 *
 * The counters still say where each side is, as the Simple path keeps
 * them, so that either protocol may follow the other on a connection and
 * a CUDA graph's replays go on from the right slot: the sender reads the
 * receiver's head only when it needs room, and each side posts its own
 * counter (tail, head) at the work's end and whenever a thread of the
 * block has spun 1024 times waiting. That also keeps two ranks that wait
 * for room from each other (every rank's sends ahead of its receiver's
 * last posted head) from waiting forever, and lets the proxy's stall and
 * mismatch diagnosis, which reads the Simple header of a posted slot,
 * work as before: every LL slot's header is written there too.
 * SPDX-License-Identifier: Apache-2.0
 */

/* The flag of slot use number s: never 0 (what the zeroed buffer holds),
 * and the same for two uses of one slot only 2^32-1 uses apart. */
__device__ __forceinline__ uint32_t ll_flag(uint64_t s) { return (uint32_t)(s % 0xFFFFFFFFull) + 1; }

/* What a waiting thread needs to post the work's counters. */
struct ll_ctx {
  const struct dev_work *w;
  const struct dev_conn *sends, *recvs;
  const uint64_t *sstep, *rstep; /* slots of this work's connections done so far */
  struct dev_status *status;
};

/* Posts the slots done so far: sent (tail) and read (head). The steps
 * change only between the block's barriers, never while a thread waits. */
__device__ void ll_post(const struct ll_ctx &c) {
  for (int k = 0; k < c.w->nsends; k++)
    if (c.sends[k].tail)
      store_release(c.sends[k].tail, c.sstep[k]);
  for (int k = 0; k < c.w->nrecvs; k++)
    if (c.recvs[k].head)
      store_release(c.recvs[k].head, c.rstep[k]);
}

/* Every 1024 spins of a wait: false when the communicator is aborted,
 * else the counters posted and true. */
__device__ bool ll_spun(const struct ll_ctx &c) {
  if (aborted(c.status))
    return false;
  ll_post(c);
  return true;
}

__device__ __forceinline__ bool ll_poll(const char *line, uint32_t flag, uint64_t *v, const struct ll_ctx &c) {
  for (uint32_t spins = 1;; spins++) {
    if (ll_read(line, flag, v))
      return true;
    if ((spins & 1023) == 0 && !ll_spun(c))
      return false;
  }
}

/* One piece's lines: thread t takes lines t, t + nthr, ...; each line's
 * elements are read (from the peer's line and the input), combined, and
 * written (to the output and the next peer's line), as the Simple path's
 * step kinds do. False if aborted while waiting. */
template <typename T, typename F>
__device__ bool ll_lines(int kind, const F &f, bool transform, const T *src, T *dst, const char *rl, char *sl,
                         uint32_t rflag, uint32_t sflag, uint64_t n, const struct ll_ctx &c) {
  const int V = 8 / sizeof(T);
  const uint64_t nlines = (n + V - 1) / V;
  for (uint64_t i = threadIdx.x; i < nlines; i += blockDim.x) {
    union {
      uint64_t u;
      T e[8 / sizeof(T)];
    } in, out;
    in.u = 0;
    out.u = 0;
    const uint64_t e0 = i * V;
    const int cnt = n - e0 < (uint64_t)V ? (int)(n - e0) : V;
    if (rl && !ll_poll(rl + (LL_HDR_LINES + i) * LL_LINE_BYTES, rflag, &in.u, c))
      return false;
    for (int k = 0; k < cnt; k++) {
      const uint64_t e = e0 + k;
      switch (kind) {
      case STEP_SEND: out.e[k] = transform ? f.alone(src[e]) : src[e]; break;
      case STEP_RECV: dst[e] = in.e[k]; break;
      case STEP_COPY_SEND: {
        T x = src[e];
        out.e[k] = x;
        if (dst && dst != src) /* as copy_bytes' second output: none where there is no output */
          dst[e] = x;
        break;
      }
      case STEP_RECV_COPY_SEND:
        out.e[k] = in.e[k];
        if (dst)
          dst[e] = in.e[k];
        break;
      case STEP_RECV_REDUCE_SEND: out.e[k] = f(in.e[k], src[e]); break;
      case STEP_RECV_REDUCE_COPY: dst[e] = f(in.e[k], src[e]); break;
      case STEP_RECV_REDUCE_COPY_SEND: {
        T r = f(in.e[k], src[e]);
        dst[e] = r;
        out.e[k] = r;
        break;
      }
      case STEP_COPY:
        if (transform)
          dst[e] = f.alone(src[e]);
        else if (dst != src)
          dst[e] = src[e];
        break;
      }
    }
    if (sl)
      ll_write(sl + (LL_HDR_LINES + i) * LL_LINE_BYTES, out.u, sflag);
  }
  return true;
}

template <typename T>
__device__ bool ll_typed(int kind, const struct red_op &op, int final, bool transform, const char *src, char *dst,
                         const char *rl, char *sl, uint32_t rflag, uint32_t sflag, uint64_t n,
                         const struct ll_ctx &c) {
  /* A partial result sent on is not final (as reduce_any's final = 0). */
  const int fin = kind == STEP_RECV_REDUCE_SEND ? 0 : final;
  const T *s = (const T *)src;
  T *d = (T *)dst;
  switch (op.kind) {
  case RED_SUM: return ll_lines(kind, Combine<T, RED_SUM>(op, fin), transform, s, d, rl, sl, rflag, sflag, n, c);
  case RED_PROD: return ll_lines(kind, Combine<T, RED_PROD>(op, fin), transform, s, d, rl, sl, rflag, sflag, n, c);
  case RED_MAX: return ll_lines(kind, Combine<T, RED_MAX>(op, fin), transform, s, d, rl, sl, rflag, sflag, n, c);
  default: return ll_lines(kind, Combine<T, RED_MIN>(op, fin), transform, s, d, rl, sl, rflag, sflag, n, c);
  }
}

__device__ bool ll_data(int kind, const struct red_op &op, int final, bool transform, const char *src, char *dst,
                        const char *rl, char *sl, uint32_t rflag, uint32_t sflag, uint64_t n, const struct ll_ctx &c) {
#define LL_TYPED(T) ll_typed<T>(kind, op, final, transform, src, dst, rl, sl, rflag, sflag, n, c)
  switch (op.dtype) {
  case ncclInt8: return LL_TYPED(int8_t);
  case ncclUint8: return LL_TYPED(uint8_t);
  case ncclInt32: return LL_TYPED(int32_t);
  case ncclUint32: return LL_TYPED(uint32_t);
  case ncclInt64: return LL_TYPED(int64_t);
  case ncclUint64: return LL_TYPED(uint64_t);
  case ncclFloat16: return LL_TYPED(Half);
  case ncclFloat32: return LL_TYPED(float);
  case ncclFloat64: return LL_TYPED(double);
  case ncclBfloat16: return LL_TYPED(Bf16);
  case ncclFloat8e4m3: return LL_TYPED(E4m3);
  case ncclFloat8e5m2: return LL_TYPED(E5m2);
  }
#undef LL_TYPED
  return true;
}

/* Thread 0, before a piece: room in the send slot (head read only when
 * the cached value says there may be none), the slot's header written
 * (in its LL lines, and plain where the proxy reads headers), and the
 * received slot's header read from its lines and checked. While waiting
 * for that header it also looks at the peer's tail: a peer that posted a
 * slot another way (a Simple call against this LL one: different
 * counts, so the tuner chose differently) is found by its plain header.
 * False to stop (aborted, or a mismatch recorded). */
__device__ bool ll_handshake(const struct ll_ctx &c, uint64_t *shead, const struct dev_conn *rc,
                             const struct dev_conn *sc, int si, uint64_t rs, uint64_t ss, uint32_t bytes,
                             uint32_t lane, uint32_t wi, uint32_t step) {
  if (sc) {
    const uint64_t need = ss + 1 > NCCL_STEPS ? ss + 1 - NCCL_STEPS : 0;
    for (uint32_t spins = 1; shead[si] < need; spins++) {
      shead[si] = load_acquire(sc->head);
      if ((spins & 1023) == 0 && !ll_spun(c))
        return false;
    }
    struct slot_hdr h = c.w->mine;
    h.bytes = bytes;
    const uint64_t slot = ss % NCCL_STEPS;
    write_hdr(sc->hdrs ? sc->hdrs + slot * SLOT_HDR_BYTES : sc->base + slot * sc->stride, h);
    char *sl = sc->ll + slot * LL_STRIDE;
    const uint64_t *hw = (const uint64_t *)&h;
    for (unsigned j = 0; j < sizeof h / 8; j++)
      ll_write(sl + j * LL_LINE_BYTES, hw[j], ll_flag(ss));
  }
  if (rc) {
    struct slot_hdr got, want = c.w->expect;
    want.bytes = bytes;
    uint64_t *gw = (uint64_t *)&got;
    const uint64_t slot = rs % NCCL_STEPS;
    const char *rl = rc->ll + slot * LL_STRIDE;
    const uint32_t flag = ll_flag(rs);
    for (unsigned j = 0; j < sizeof got / 8; j++) {
      for (uint32_t spins = 1; !ll_read(rl + j * LL_LINE_BYTES, flag, &gw[j]); spins++) {
        if ((spins & 1023) != 0)
          continue;
        if (!ll_spun(c))
          return false;
        if (load_acquire(rc->tail) >= rs + 1) {
          struct slot_hdr plain = read_hdr(rc->hdrs ? rc->hdrs + slot * SLOT_HDR_BYTES : rc->base + slot * rc->stride);
          if (!hdr_matches(want, plain, c.w->check_seq)) {
            record(c.status, DEV_ERR_MISMATCH, lane, wi, step, rc->peer, &plain, &want);
            return false;
          }
        }
      }
    }
    if (!hdr_matches(want, got, c.w->check_seq)) {
      record(c.status, DEV_ERR_MISMATCH, lane, wi, step, rc->peer, &got, &want);
      return false;
    }
  }
  return true;
}

/* A work of the LL protocol, by the whole block, from the slot counts
 * loom_kernel read at its start (sstep, rstep, kept in shared memory by
 * thread 0) to its end, where the counters are posted; loom_kernel writes
 * the counts back. False when the block must stop. */
__device__ bool ll_work(const struct dev_work &w, const struct dev_conn *sends, const struct dev_conn *recvs,
                        uint64_t *sstep, uint64_t *rstep, struct dev_status *status, uint32_t wi) {
  __shared__ struct step st;
  /* Set by thread 0 before a piece, and by any thread that finds the
   * communicator aborted while moving one: two words, each read after
   * the barrier that follows its writes and before the next writes. */
  __shared__ int stop, dstop;
  __shared__ uint64_t shead[WORK_MAX_PEERS];
  const uint32_t tid = threadIdx.x;
  const struct ll_ctx c = {&w, sends, recvs, sstep, rstep, status};
  if (tid == 0) {
    stop = dstop = 0;
    for (int k = 0; k < WORK_MAX_PEERS; k++)
      shead[k] = 0;
  }
  for (uint64_t si = 0; si < w.sched.nsteps; si++) {
    __syncthreads();
    if (tid == 0)
      sched_at(&w.sched, si, &st);
    __syncthreads();
    const int recv = step_recvs(st.kind), send = step_sends(st.kind);
    const int final = st.flags & STEP_FINAL;
    const bool transform = (w.red.premul && !(st.flags & STEP_NO_PREMUL)) || (final && w.red.postdiv);
    const struct dev_conn *rc = recv ? &recvs[st.ri] : NULL, *sc = send ? &sends[st.si] : NULL;
    for (uint64_t off = 0; off < st.nelem; off += w.piece) {
      const uint64_t n = st.nelem - off < w.piece ? st.nelem - off : w.piece;
      const uint32_t bytes = (uint32_t)(n * w.esize);
      if (tid == 0 && !ll_handshake(c, shead, rc, sc, send ? st.si : 0, recv ? rstep[st.ri] : 0,
                                    send ? sstep[st.si] : 0, bytes, blockIdx.x, wi, (uint32_t)si))
        stop = 1;
      __syncthreads();
      if (stop)
        return false;
      const uint64_t rs = recv ? rstep[st.ri] : 0, ss = send ? sstep[st.si] : 0;
      const char *rl = recv ? rc->ll + (rs % NCCL_STEPS) * LL_STRIDE : NULL;
      char *sl = send ? sc->ll + (ss % NCCL_STEPS) * LL_STRIDE : NULL;
      const char *src_base = (st.flags & STEP_SRC_DST) ? w.dst : w.src;
      const char *src = src_base ? src_base + (st.src_off + off) * w.esize : NULL;
      char *dst = w.dst ? w.dst + (st.dst_off + off) * w.esize : NULL;
      struct red_op op = w.red;
      if (st.flags & STEP_NO_PREMUL)
        op.premul = 0;
      if (!ll_data(st.kind, op, final, transform, src, dst, rl, sl, ll_flag(rs), ll_flag(ss), n, c))
        dstop = 1;
      __syncthreads();
      if (dstop)
        return false;
      if (tid == 0) {
        if (send)
          sstep[st.si]++;
        if (recv)
          rstep[st.ri]++;
        status_store(&status->progress, progress_stamp());
      }
    }
  }
  __syncthreads();
  /* The progress word follows in work_end, which loom_kernel runs next. */
  if (tid == 0)
    ll_post(c);
  return true;
}
