/*
 * The GPU executor's kernel: one thread block per lane walks its works'
 * schedule steps in order, one FIFO slot at a time, exactly as the host
 * executor does. One source for NVIDIA GPUs (nvcc), AMD GPUs (hipcc) and
 * the CPU emulation: what differs between them is port.cuh's. With the Simple protocol thread 0 waits for the slots
 * and publishes them, in a warp of its own that overlaps the next piece's
 * handshake with the current piece's data (kernel_simple.cuh); the other
 * warps move data, 16 bytes at a time where all pointers allow it, with
 * UNROLL such loads in flight per source before any store, since one
 * 16-byte load per thread leaves a block latency-bound far below the
 * links (docs/gpu-performance.md). LL works, small collectives on one
 * host, send flagged lines instead (kernel_ll.cuh).
 *
 * Arithmetic matches the host kernels (reduce.c): integers wrap, fp16 /
 * bf16 / fp8 are rounded once from the exact result (fp8 saturating; fp32
 * as the host does, or fp16 / bf16 pairs in their own type, the same
 * bits), and a + b * s is never contracted into an FMA, so a GPU rank and
 * a CPU rank of the same type produce the same bits.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <type_traits>

#include "core.h"
#include "common/coll.h"
#include "exec/cuda/dev.h"
#include "exec/cuda/port.cuh"

/* ---- element types ----------------------------------------------------- */

/* How each storage type is combined: C is the type arithmetic is done in. */
template <typename T> struct Num {
  typedef T C;
  static __device__ __forceinline__ C in(T v) { return v; }
  static __device__ __forceinline__ T out(C v) { return v; }
};

struct Half {
  uint16_t v;
};
struct Bf16 {
  uint16_t v;
};
struct E4m3 {
  uint8_t v;
};
struct E5m2 {
  uint8_t v;
};

template <> struct Num<Half> {
  typedef float C;
  static __device__ __forceinline__ float in(Half h) { return port_half_in(h.v); }
  static __device__ __forceinline__ Half out(float f) { return Half{port_half_out(f)}; }
};
template <> struct Num<Bf16> {
  typedef float C;
  static __device__ __forceinline__ float in(Bf16 b) { return port_bf16_in(b.v); }
  static __device__ __forceinline__ Bf16 out(float f) { return Bf16{port_bf16_out(f)}; }
};
template <> struct Num<E4m3> {
  typedef float C;
  static __device__ __forceinline__ float in(E4m3 e) { return port_e4m3_in(e.v); }
  static __device__ __forceinline__ E4m3 out(float f) { return E4m3{port_e4m3_out(f)}; }
};
template <> struct Num<E5m2> {
  typedef float C;
  static __device__ __forceinline__ float in(E5m2 e) { return port_e5m2_in(e.v); }
  static __device__ __forceinline__ E5m2 out(float f) { return E5m2{port_e5m2_out(f)}; }
};

/* Integer sums and products wrap: they are done on the unsigned type. */
template <typename T> struct Unsigned {
  typedef T U;
};
template <> struct Unsigned<int8_t> {
  typedef uint8_t U;
};
template <> struct Unsigned<int32_t> {
  typedef uint32_t U;
};
template <> struct Unsigned<int64_t> {
  typedef uint64_t U;
};

template <typename C> __device__ __forceinline__ C add(C a, C b) {
  typedef typename Unsigned<C>::U U;
  return (C)((U)a + (U)b);
}
template <> __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
template <> __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }

template <typename C> __device__ __forceinline__ C mul(C a, C b) {
  typedef typename Unsigned<C>::U U;
  return (C)((U)a * (U)b);
}
template <> __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
template <> __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }

template <typename C> __device__ __forceinline__ C scalar_of(const struct red_op &op);
#define SCALAR_INT(T, field) \
  template <> __device__ __forceinline__ T scalar_of<T>(const struct red_op &op) { return (T)op.scalar.field; }
SCALAR_INT(int8_t, i)
SCALAR_INT(int32_t, i)
SCALAR_INT(int64_t, i)
SCALAR_INT(uint8_t, u)
SCALAR_INT(uint32_t, u)
SCALAR_INT(uint64_t, u)
template <> __device__ __forceinline__ float scalar_of<float>(const struct red_op &op) { return (float)op.scalar.f; }
template <> __device__ __forceinline__ double scalar_of<double>(const struct red_op &op) { return op.scalar.f; }

template <typename C> __device__ __forceinline__ C divide(C v, int d) { return v / (C)d; }

/* a (a peer's partial result) combined with b (this rank's input). */
template <typename T, int KIND> struct Combine {
  typedef typename Num<T>::C C;
  C s;
  int premul, div;
  __device__ Combine(const struct red_op &op, int final)
      : s(scalar_of<C>(op)), premul(op.premul), div(final && op.postdiv && op.divisor > 1 ? op.divisor : 0) {}
  __device__ __forceinline__ T operator()(T ta, T tb) const {
    C a = Num<T>::in(ta), b = Num<T>::in(tb);
    if (premul)
      b = mul(b, s);
    C r = KIND == RED_SUM ? add(a, b) : KIND == RED_PROD ? mul(a, b) : KIND == RED_MAX ? (a > b ? a : b)
                                                                                         : (a < b ? a : b);
    if (div)
      r = divide(r, div);
    return Num<T>::out(r);
  }
  /* The local input alone: premul and the final division still apply. */
  __device__ __forceinline__ T alone(T tb) const {
    C b = Num<T>::in(tb);
    if (premul)
      b = mul(b, s);
    if (div)
      b = divide(b, div);
    return Num<T>::out(b);
  }
};

/* fp16 and bf16 sums and products, two lanes per instruction in the type
 * itself (the exact result rounded once). The fp32 path gives the same
 * bits for every input but NaN: fp32 holds 24 >= 2p + 2 bits, so rounding
 * there first never moves the final rounding, and a product of two such
 * values is exact in fp32 or too small to be near a midpoint
 * (unit_reduce_once checks codes against the exact result rounded once).
 * Only without PreMulSum or a final division, which go through fp32. */
template <typename H> __device__ __forceinline__ H h2_of(uint32_t u) {
  H h;
  memcpy((void *)&h, &u, sizeof h);
  return h;
}
template <typename H> __device__ __forceinline__ uint32_t bits_of_h2(H h) {
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}
/* The CUDA pair type of a storage type that has one (none on AMD). */
template <typename T> struct Pair2 {
  typedef void H;
};
#if PORT_PAIRS
template <> struct Pair2<Half> {
  typedef __half2 H;
};
template <> struct Pair2<Bf16> {
  typedef __nv_bfloat162 H;
};
#endif
template <typename T, int KIND> struct Paired {
  typedef typename Pair2<T>::H H;
  static const bool ok = !std::is_same<H, void>::value && (KIND == RED_SUM || KIND == RED_PROD);
  static __device__ __forceinline__ uint32_t op(uint32_t a, uint32_t b) {
    const H x = h2_of<H>(a), y = h2_of<H>(b);
    return bits_of_h2(KIND == RED_SUM ? __hadd2_rn(x, y) : __hmul2_rn(x, y));
  }
};

/* Combine without premul or division, a pair of elements at a time in
 * 16-byte packs; one element at a time (the tail) as Combine does. */
template <typename T, int KIND> struct PairCombine : Combine<T, KIND> {
  __device__ PairCombine(const struct red_op &op, int final) : Combine<T, KIND>(op, final) {}
};

/* ---- block-wide loops --------------------------------------------------- */

/* 16-byte packs in flight per thread and source. */
#define UNROLL 4

template <typename T> union Vec {
  uint4 raw;
  uint32_t w[4];
  T e[16 / sizeof(T)];
};

/* y = f(x, y) over one pack: element by element, or a pair at a time. */
template <typename T, typename F> __device__ __forceinline__ void combine_pack(const F &f, const Vec<T> &x, Vec<T> &y) {
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); k++)
    y.e[k] = f(x.e[k], y.e[k]);
}
template <typename T, int KIND>
__device__ __forceinline__ void combine_pack(const PairCombine<T, KIND> &, const Vec<T> &x, Vec<T> &y) {
#pragma unroll
  for (int k = 0; k < 4; k++)
    y.w[k] = Paired<T, KIND>::op(x.w[k], y.w[k]);
}

__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Packs v, v + nthr, ... of one thread's group of U: loaded (a's and b's),
 * then combined and stored. In place (dst the same as a or b) is fine:
 * an element is read before it is written, by the same thread. */
template <int U, typename T, typename F>
__device__ __forceinline__ void apply_group(uint4 *dst, uint4 *dst2, const uint4 *a, const uint4 *b, uint64_t v,
                                            uint64_t nthr, const F &f) {
  const int V = 16 / sizeof(T);
  Vec<T> x[U], y[U];
#pragma unroll
  for (int u = 0; u < U; u++)
    y[u].raw = ld_pack(b + v + u * nthr);
  if (a) {
#pragma unroll
    for (int u = 0; u < U; u++)
      x[u].raw = ld_pack(a + v + u * nthr);
#pragma unroll
    for (int u = 0; u < U; u++)
      combine_pack(f, x[u], y[u]);
  } else {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int k = 0; k < V; k++)
        y[u].e[k] = f.alone(y[u].e[k]);
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    st_pack(dst + v + u * nthr, y[u].raw);
    if (dst2)
      st_pack(dst2 + v + u * nthr, y[u].raw);
  }
}

/* dst (and dst2) = f(a[i], b[i]); f.alone(b[i]) when a is NULL. */
template <typename T, typename F>
__device__ void apply(T *dst, T *dst2, const T *a, const T *b, uint64_t n, const F &f, uint64_t tid, uint64_t nthr) {
  const int V = 16 / sizeof(T);
  uint64_t i0 = 0;
  if (aligned16(dst) && (!dst2 || aligned16(dst2)) && (!a || aligned16(a)) && aligned16(b)) {
    uint64_t nv = n / V, v = tid;
    uint4 *d = (uint4 *)dst, *d2 = (uint4 *)dst2;
    const uint4 *pa = (const uint4 *)a, *pb = (const uint4 *)b;
    for (; v + (UNROLL - 1) * nthr < nv; v += UNROLL * nthr)
      apply_group<UNROLL, T>(d, d2, pa, pb, v, nthr, f);
    for (; v < nv; v += nthr)
      apply_group<1, T>(d, d2, pa, pb, v, nthr, f);
    i0 = nv * V;
  }
  for (uint64_t i = i0 + tid; i < n; i += nthr) {
    T r = a ? f(a[i], b[i]) : f.alone(b[i]);
    dst[i] = r;
    if (dst2)
      dst2[i] = r;
  }
}

template <int U>
__device__ __forceinline__ void copy_group(uint4 *dst, uint4 *dst2, const uint4 *src, uint64_t v, uint64_t nthr) {
  uint4 x[U];
#pragma unroll
  for (int u = 0; u < U; u++)
    x[u] = ld_pack(src + v + u * nthr);
#pragma unroll
  for (int u = 0; u < U; u++) {
    st_pack(dst + v + u * nthr, x[u]);
    if (dst2)
      st_pack(dst2 + v + u * nthr, x[u]);
  }
}

/* Bytes to one or two places, 16 at a time where aligned. */
__device__ void copy_bytes(char *dst, char *dst2, const char *src, uint64_t n, uint64_t tid, uint64_t nthr) {
  uint64_t i0 = 0;
  if (aligned16(dst) && (!dst2 || aligned16(dst2)) && aligned16(src)) {
    uint64_t nv = n / 16, v = tid;
    uint4 *d = (uint4 *)dst, *d2 = (uint4 *)dst2;
    const uint4 *s = (const uint4 *)src;
    for (; v + (UNROLL - 1) * nthr < nv; v += UNROLL * nthr)
      copy_group<UNROLL>(d, d2, s, v, nthr);
    for (; v < nv; v += nthr)
      copy_group<1>(d, d2, s, v, nthr);
    i0 = nv * 16;
  }
  for (uint64_t i = i0 + tid; i < n; i += nthr) {
    char x = src[i];
    dst[i] = x;
    if (dst2)
      dst2[i] = x;
  }
}

template <typename T, int KIND>
__device__ void reduce_kind(const struct red_op &op, void *dst, void *dst2, const void *a, const void *b, uint64_t n,
                            int final, uint64_t tid, uint64_t nthr) {
  T *d = (T *)dst, *d2 = (T *)dst2;
  const T *x = (const T *)a, *y = (const T *)b;
  Combine<T, KIND> f(op, final);
  if constexpr (Paired<T, KIND>::ok) {
    if (!f.premul && !f.div) {
      apply(d, d2, x, y, n, PairCombine<T, KIND>(op, final), tid, nthr);
      return;
    }
  }
  apply(d, d2, x, y, n, f, tid, nthr);
}

template <typename T>
__device__ void reduce_typed(const struct red_op &op, void *dst, void *dst2, const void *a, const void *b, uint64_t n,
                             int final, uint64_t tid, uint64_t nthr) {
  switch (op.kind) {
  case RED_SUM: reduce_kind<T, RED_SUM>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case RED_PROD: reduce_kind<T, RED_PROD>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case RED_MAX: reduce_kind<T, RED_MAX>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  default: reduce_kind<T, RED_MIN>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  }
}

/* dst = a OP b, or the transformed b alone when a is NULL. */
__device__ void reduce_any(const struct red_op &op, void *dst, void *dst2, const void *a, const void *b, uint64_t n,
                           int final, uint64_t tid, uint64_t nthr) {
  switch (op.dtype) {
  case ncclInt8: reduce_typed<int8_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclUint8: reduce_typed<uint8_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclInt32: reduce_typed<int32_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclUint32: reduce_typed<uint32_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclInt64: reduce_typed<int64_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclUint64: reduce_typed<uint64_t>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclFloat16: reduce_typed<Half>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclFloat32: reduce_typed<float>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclFloat64: reduce_typed<double>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclBfloat16: reduce_typed<Bf16>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclFloat8e4m3: reduce_typed<E4m3>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  case ncclFloat8e5m2: reduce_typed<E5m2>(op, dst, dst2, a, b, n, final, tid, nthr); break;
  }
}

/* ---- FIFO handshakes (thread 0) ----------------------------------------- */

__device__ __forceinline__ bool aborted(const struct dev_status *st) { return status_load(&st->abort) != 0; }

/* Spins until `*p` (a counter the peer advances) reaches `want`; false if
 * the communicator is aborted meanwhile. */
__device__ bool wait_counter(const uint64_t *p, uint64_t want, const struct dev_status *st) {
  for (uint32_t spins = 0;; spins++) {
    if (load_acquire(p) >= want)
      return true;
    if ((spins & 1023) == 1023 && aborted(st))
      return false;
  }
}

/* The header a peer wrote, read word by word: it may change under us only
 * if the peer misbehaves, but it must be read from memory, not a cache. */
__device__ struct slot_hdr read_hdr(const char *slot) {
  struct slot_hdr h;
  uint64_t *d = (uint64_t *)&h;
  const volatile uint64_t *s = (const volatile uint64_t *)slot;
  for (unsigned k = 0; k < sizeof h / 8; k++)
    d[k] = s[k];
  return h;
}

/* Written word by word too: the host's proxy may be copying the header
 * of a slot just released while the sender writes the next one there; it
 * then sees the release count moved and discards what it read (p2p.c). */
__device__ void write_hdr(char *slot, const struct slot_hdr &h) {
  const uint64_t *s = (const uint64_t *)&h;
  volatile uint64_t *d = (volatile uint64_t *)slot;
  for (unsigned k = 0; k < sizeof h / 8; k++)
    status_store(d + k, s[k]);
}

__device__ bool hdr_matches(const struct slot_hdr &want, const struct slot_hdr &got, int check_seq) {
  /* A Send's op is the collective it belongs to, for sentences only. */
  return got.coll == want.coll && got.dtype == want.dtype && got.count == want.count &&
         (got.op == want.op || got.coll == COLL_SEND) &&
         got.root == want.root && (!check_seq || got.seq == want.seq) && got.bytes == want.bytes;
}

__device__ void record(struct dev_status *st, int32_t err, uint32_t lane, uint32_t work, uint32_t step, int32_t peer,
                       const struct slot_hdr *got, const struct slot_hdr *want) {
  /* The first block to fail claims the record, writes what the host will
   * read, and only then publishes the error that makes the host read it. */
  if (atomicCAS((int *)&st->claim, 0, 1) == 0) {
    st->peer = peer;
    st->lane = (int32_t)lane;
    st->work = (int32_t)work;
    st->step = (int32_t)step;
    if (got)
      st->got = *got;
    if (want)
      st->want = *want;
    status_publish(&st->error, err);
  }
  __threadfence_system();
  status_store(&st->abort, (int32_t)1);
  __threadfence_system();
}

/* ---- the kernel ---------------------------------------------------------- */

__device__ void read_scalar(struct red_op &red, const void *p) {
  /* A PreMulSum scalar in device memory is read when the work runs. */
  switch (red.dtype) {
  case ncclInt8: red.scalar.i = *(const int8_t *)p; break;
  case ncclUint8: red.scalar.u = *(const uint8_t *)p; break;
  case ncclInt32: red.scalar.i = *(const int32_t *)p; break;
  case ncclUint32: red.scalar.u = *(const uint32_t *)p; break;
  case ncclInt64: red.scalar.i = *(const int64_t *)p; break;
  case ncclUint64: red.scalar.u = *(const uint64_t *)p; break;
  case ncclFloat16: red.scalar.f = Num<Half>::in(*(const Half *)p); break;
  case ncclFloat32: red.scalar.f = *(const float *)p; break;
  case ncclFloat64: red.scalar.f = *(const double *)p; break;
  case ncclBfloat16: red.scalar.f = Num<Bf16>::in(*(const Bf16 *)p); break;
  case ncclFloat8e4m3: red.scalar.f = Num<E4m3>::in(*(const E4m3 *)p); break;
  case ncclFloat8e5m2: red.scalar.f = Num<E5m2>::in(*(const E5m2 *)p); break;
  }
}

#include "exec/cuda/kernel_simple.cuh"
#include "exec/cuda/kernel_ll.cuh"

__global__ void __launch_bounds__(DEV_THREADS) loom_kernel(KERNEL_PARAMS) {
  __shared__ struct simple_shared S;
  const uint32_t nthr = blockDim.x;
  const struct dev_plan &plan = params.hdr;
  const char *base = plan.plan ? plan.plan : params.inline_plan;
  const struct dev_lane lane = ((const struct dev_lane *)(base + plan.lanes_off))[blockIdx.x];
  const struct dev_work *works = (const struct dev_work *)(base + plan.works_off);
  const struct dev_conn *conns = (const struct dev_conn *)(base + plan.conns_off);
  /* A sync warp and at least one data warp, or every thread in turn. */
  const uint32_t sw = sync_width(nthr);
  const uint32_t end = lane.first + lane.count;
  for (uint32_t wi = lane.first; wi < end;) {
    /* A run of Simple works goes through the piece loop, which overlaps
     * them; an LL work (kernel_ll.cuh) moves its slots apart, every
     * thread at once. Both start from the counts the last work left. */
    uint32_t run = wi;
    while (run < end && works[run].proto != PROTO_LL)
      run++;
    if (run > wi) {
      if (threadIdx.x == 0) {
        S.W.wi = wi;
        S.W.wend = run;
        S.W.loaded = 0;
      }
      __syncthreads();
      if (PORT_NAMED_BARRIERS && nthr >= 2 * sw)
        simple_warp(S, sw, base, works, conns, plan.status);
      else
        simple_serial(S, base, works, conns, plan.status);
      __syncthreads();
      /* The walk ends past its last work; stopped inside one, the kernel
       * found a mismatch or an abort. */
      if (S.W.loaded || S.W.wi < run)
        return;
      wi = run;
      continue;
    }
    if (threadIdx.x == 0) {
      S.W.wi = wi;
      work_load(S.W, base, works, conns, NULL);
    }
    __syncthreads();
    if (!ll_work(S.W.w, S.W.sends, S.W.recvs, S.W.sstep, S.W.rstep, plan.status, wi))
      return;
    if (threadIdx.x == 0)
      work_end(S.W, plan.status);
    __syncthreads();
    wi++;
  }
}

__global__ void __launch_bounds__(DEV_THREADS) bench_kernel(struct red_op op, void *dst, const void *a, const void *b,
                                                             uint64_t n) {
  reduce_any(op, dst, NULL, a, b, n, 1, (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
             (uint64_t)gridDim.x * blockDim.x);
}

#ifdef LOOM_CUDA_EMU
static void loom_kernel_emu(const void *params) { loom_kernel(*(const struct dev_params *)params); }

extern "C" int cuda_kernel_launch(const struct dev_params *params, uint32_t nlanes, void *stream) {
  return emu_launch_params(stream, nlanes, loom_kernel_emu, params, sizeof *params);
}

extern "C" int cuda_kernel_max_lanes(unsigned *lanes) {
  *lanes = emu_resident_blocks();
  return 0;
}
#else
extern "C" int cuda_kernel_launch(const struct dev_params *params, uint32_t nlanes, void *stream) {
  loom_kernel<<<nlanes, DEV_THREADS, 0, (cudaStream_t)stream>>>(*params);
  return (int)cudaGetLastError();
}

extern "C" int cuda_kernel_max_lanes(unsigned *lanes) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, loom_kernel, DEV_THREADS, 0);
  *lanes = (unsigned)(sms * per_sm);
  return (int)e;
}

extern "C" int cuda_bench_reduce(const struct red_op *op, void *dst, const void *a, const void *b, uint64_t n,
                                 void *stream) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess)
    return (int)e;
  bench_kernel<<<sms * 4, DEV_THREADS, 0, (cudaStream_t)stream>>>(*op, dst, a, b, n);
  return (int)cudaGetLastError();
}
#endif
