/*
 * The CUDA runtime API on the CPU: the part of it that Loom and its tests
 * call, with the semantics that decide whether host code is right.
 * Linked in place of libcudart by the emulated build (docs/emulation.md),
 * so cudamem.c, cuda_exec.c, the transports and the GPU tests run
 * unchanged while the kernel runs on the CPU.
 *
 * What is kept of CUDA, because Loom's correctness depends on it:
 * - Streams run in order on their own thread, asynchronously to the
 *   caller; the legacy default stream waits for the blocking streams and
 *   they for it; cudaStreamNonBlocking streams for neither. Events and
 *   cudaStreamWaitEvent order streams; cudaLaunchHostFunc runs on the
 *   stream.
 * - cudaMemset on device memory is asynchronous (it is queued on the
 *   legacy stream); cudaMemcpy is synchronous. After an allocation of
 *   device or page-locked memory, no command starts before every command
 *   issued before the allocation has ended (the programming guide's
 *   "implicit synchronization"); cudaFree and cudaFreeHost wait for all
 *   the work of every stream. Code that allocates between two launches
 *   whose kernels wait on each other hangs here as it does there.
 * - Device memory is memory only through its own pointers: cudaMalloc
 *   maps a memfd, so that an IPC handle (the pid and the fd) opens in
 *   another process of the host; cudaPointerGetAttributes tells device,
 *   pinned and ordinary memory apart.
 * - A process forked after the runtime started gets
 *   cudaErrorInitializationError, as from a real driver.
 * - Stream capture records into a graph that launches replay, with the
 *   capture modes' rules on unsafe calls (emu_graph.cpp, which also has
 *   events and synchronisation).
 *
 * What is not: GPU memory ordering weaker than the CPU's, real peer access
 * checks, timing. The device script (tests/gpu/run.sh) covers those.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <cuda_runtime_api.h>

#include "exec/cuda/emu/emu.h"
#include "exec/cuda/emu/emu_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <map>

namespace emu {

/* ---- configuration ------------------------------------------------------ */

config g_cfg;
static std::once_flag g_cfg_once;

static bool read_uint(const char *name, unsigned long long lo, unsigned long long hi, unsigned long long *out) {
  const char *v = getenv(name);
  if (!v || !*v)
    return true;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0);
  if (errno || *end || x < lo || x > hi)
    return false;
  *out = x;
  return true;
}

static void config_read() {
  unsigned long long x;
  struct {
    const char *name;
    unsigned long long lo, hi;
  } spec[] = {{"LOOM_EMU_DEVICES", 1, 16}, {"LOOM_EMU_THREADS", 1, 1024}, {"LOOM_EMU_RESIDENT", 1, 4096},
              {"LOOM_EMU_SEED", 0, ~0ull}};
  for (int i = 0; i < 4; i++) {
    x = i == 0 ? g_cfg.devices : i == 1 ? g_cfg.threads : i == 2 ? g_cfg.resident : g_cfg.seed;
    if (!read_uint(spec[i].name, spec[i].lo, spec[i].hi, &x)) {
      snprintf(g_cfg.why, sizeof g_cfg.why, "loom emu: %s=%s is not a number from %llu to %llu", spec[i].name,
               getenv(spec[i].name), spec[i].lo, spec[i].hi);
      g_cfg.bad = g_cfg.why;
      fprintf(stderr, "%s\n", g_cfg.why);
      return;
    }
    if (i == 0)
      g_cfg.devices = (int)x;
    else if (i == 1)
      g_cfg.threads = (unsigned)x;
    else if (i == 2)
      g_cfg.resident = (unsigned)x;
    else
      g_cfg.seed = x;
  }
  /* CUDA_VISIBLE_DEVICES as CUDA reads it: indices, up to the first that
   * is not one (UUIDs and MIG names are not emulated). */
  int n = 0;
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  for (const char *p = vis; p && n < 16;) {
    char *end;
    errno = 0;
    long d = strtol(p, &end, 10);
    if (end == p || errno || d < 0 || d >= g_cfg.devices || (*end != ',' && *end != '\0'))
      break;
    g_cfg.physical[n++] = (int)d;
    if (*end == '\0')
      break;
    p = end + 1;
  }
  if (!vis)
    for (n = 0; n < g_cfg.devices; n++)
      g_cfg.physical[n] = n;
  g_cfg.devices = n;
}

/* ---- process state ------------------------------------------------------- */

std::mutex g_mu;
static std::atomic<bool> g_started{false}, g_forked{false};
thread_local int t_dev = 0;
static thread_local cudaError_t t_last = cudaSuccess;

static void on_fork_child() {
  if (g_started.load())
    g_forked.store(true);
}

cudaError_t enter() {
  std::call_once(g_cfg_once, [] {
    config_read();
    pthread_atfork(nullptr, nullptr, on_fork_child);
  });
  if (g_cfg.bad)
    return cudaErrorInitializationError;
  if (g_forked.load())
    return cudaErrorInitializationError;
  if (t_in_destructor) {
    fprintf(stderr, "loom emu: a CUDA call inside a user object's destructor, which CUDA forbids "
                    "(cudaUserObjectCreate)\n");
    return cudaErrorNotPermitted;
  }
  return cudaSuccess;
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess)
    t_last = e;
  return e;
}

/* ---- memory -------------------------------------------------------------- */

enum mem_kind { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED, MEM_IPC };

struct alloc {
  size_t size;
  int device;
  mem_kind kind;
  int fd;
};

static std::map<uintptr_t, alloc> g_allocs;

static size_t page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (n + pg - 1) / pg * pg;
}

/* The allocation holding p, under g_mu; null if none. */
static const std::pair<const uintptr_t, alloc> *find_alloc(const void *p) {
  uintptr_t a = (uintptr_t)p;
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin())
    return nullptr;
  --it;
  if (a >= it->first + it->second.size)
    return nullptr;
  return &*it;
}

/* ---- streams and events --------------------------------------------------- */

std::mutex g_ev_mu;
std::condition_variable g_ev_cv;

std::vector<stream *> g_streams;
/* What every command issued from now on waits for: the commands issued
 * before the last allocation (under g_mu). */
static std::vector<dep> g_barrier;
static stream *g_legacy[16];
static thread_local stream *t_per_thread[16];
static std::atomic<uint64_t> g_launches{0};

void wait_stream(stream *s, uint64_t count) {
  std::unique_lock<std::mutex> l(s->mu);
  s->cv.wait(l, [&] { return s->done >= count; });
}

/* The host may copy memory a kernel writes at the same time (a counter,
 * then the slot header it announces), as CUDA allows: small aligned
 * copies go word by word as atomics, acquiring what a kernel released
 * (a copy is complete before the next is issued, as a GPU's are, and
 * sees what the kernel wrote before the counter it read), which is also
 * what ThreadSanitizer then sees; the rest as memmove. */
static void copy(void *dst, const void *src, size_t n) {
  if (n <= 4096 && ((uintptr_t)dst | (uintptr_t)src | n) % 8 == 0) {
    for (size_t i = 0; i < n / 8; i++)
      __atomic_store_n((uint64_t *)dst + i, __atomic_load_n((const uint64_t *)src + i, __ATOMIC_ACQUIRE),
                       __ATOMIC_RELEASE);
    return;
  }
  memmove(dst, src, n);
}

static void run_op(op &o) {
  for (const dep &d : o.deps)
    wait_stream(d.s, d.count);
  switch (o.kind) {
  case OP_COPY: copy(o.dst, o.src, o.n); break;
  case OP_SET: memset(o.dst, o.value, o.n); break;
  case OP_KERNEL:
    emu_run_grid(o.blocks, g_cfg.threads, g_cfg.resident, o.kernel, o.src, g_cfg.seed + g_launches.fetch_add(1));
    break;
  case OP_HOSTFN: o.fn(o.dst); break;
  case OP_TASK: o.task(); break;
  case OP_RECORD: {
    std::lock_guard<std::mutex> l(g_ev_mu);
    if (o.ev->done < o.gen)
      o.ev->done = o.gen;
    g_ev_cv.notify_all();
    break;
  }
  case OP_WAIT: {
    std::unique_lock<std::mutex> l(g_ev_mu);
    g_ev_cv.wait(l, [&] { return o.ev->done >= o.gen; });
    break;
  }
  case OP_STOP: break;
  }
}

static void *stream_main(void *p) {
  stream *s = (stream *)p;
  for (;;) {
    op o;
    {
      std::unique_lock<std::mutex> l(s->mu);
      s->cv.wait(l, [&] { return !s->q.empty(); });
      o = std::move(s->q.front());
      s->q.pop_front();
    }
    run_op(o);
    std::lock_guard<std::mutex> l(s->mu);
    s->done++;
    s->cv.notify_all();
    if (o.kind == OP_STOP) {
      if (!s->joined)
        pthread_detach(pthread_self());
      return nullptr;
    }
  }
}

static stream *stream_new(int dev, bool legacy, bool blocking) {
  stream *s = new stream;
  s->device = dev;
  s->legacy = legacy;
  s->blocking = blocking;
  if (pthread_create(&s->th, nullptr, stream_main, s) != 0) {
    fprintf(stderr, "loom emu: cannot start a stream's thread\n");
    abort();
  }
  g_started.store(true);
  std::lock_guard<std::mutex> l(g_mu);
  g_streams.push_back(s);
  return s;
}

stream *legacy_of(int dev) {
  static std::once_flag once[16];
  std::call_once(once[dev], [dev] { g_legacy[dev] = stream_new(dev, true, true); });
  return g_legacy[dev];
}

stream *resolve(cudaStream_t h) {
  uintptr_t v = (uintptr_t)h;
  if (v == 0 || v == (uintptr_t)cudaStreamLegacy)
    return legacy_of(t_dev);
  if (v == (uintptr_t)cudaStreamPerThread) {
    if (!t_per_thread[t_dev])
      t_per_thread[t_dev] = stream_new(t_dev, false, true);
    return t_per_thread[t_dev];
  }
  return (stream *)h;
}

uint64_t enqueue(stream *s, op o) {
  /* The end of a stream waits for its own queue only. */
  if (o.kind != OP_STOP) {
    std::lock_guard<std::mutex> l(g_mu);
    for (const dep &d : g_barrier)
      if (d.s != s)
        o.deps.push_back(d);
    /* The legacy stream waits for the blocking streams, and they for it. */
    for (size_t i = 0; s->blocking && i < g_streams.size(); i++) {
      stream *x = g_streams[i];
      if (x == s || x->device != s->device || !x->blocking || x->legacy == s->legacy)
        continue;
      std::lock_guard<std::mutex> lx(x->mu);
      if (x->enq > x->done)
        o.deps.push_back({x, x->enq});
    }
  }
  std::lock_guard<std::mutex> l(s->mu);
  s->q.push_back(std::move(o));
  s->cv.notify_all();
  return ++s->enq;
}

void sync_stream(stream *s) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> l(s->mu);
    target = s->enq;
  }
  wait_stream(s, target);
}

/* An allocation: later commands wait for all those issued until now. */
static void serialise() {
  std::lock_guard<std::mutex> l(g_mu);
  g_barrier.clear();
  for (stream *x : g_streams) {
    std::lock_guard<std::mutex> lx(x->mu);
    if (x->enq > x->done)
      g_barrier.push_back({x, x->enq});
  }
}

void sync_all() {
  std::vector<stream *> all;
  {
    std::lock_guard<std::mutex> l(g_mu);
    all = g_streams;
  }
  for (stream *s : all)
    sync_stream(s);
}

/* Frees an allocation of `kind` once every stream's work is done (cudaFree
 * and friends synchronise the device). */
static cudaError_t release(void *p, mem_kind kind) {
  sync_all();
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_allocs.find((uintptr_t)p);
  if (it == g_allocs.end() || it->second.kind != kind)
    return ret(cudaErrorInvalidValue);
  munmap(p, it->second.size);
  if (it->second.fd >= 0)
    close(it->second.fd);
  g_allocs.erase(it);
  return cudaSuccess;
}

/* Queues (or captures) a copy on s; *count, the count at which it is done. */
static cudaError_t copy_on(stream *s, void *dst, const void *src, size_t n, uint64_t *count = nullptr) {
  op o;
  o.kind = OP_COPY;
  o.dst = dst;
  o.src = src;
  o.n = n;
  return submit(s, std::move(o), count);
}

/* The IPC handle's bytes. */
struct ipc_handle {
  char magic[8];
  int32_t pid, fd;
  uint64_t size;
};
static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t), "IPC handle");
static const char kMagic[8] = {'L', 'O', 'O', 'M', 'E', 'M', 'U', '1'};

} // namespace emu

/* ---- the API ------------------------------------------------------------- */

using namespace emu;

extern "C" {

unsigned emu_resident_blocks(void) {
  enter();
  return g_cfg.resident;
}

int emu_launch(void *h, unsigned blocks, emu_kernel_fn kernel, const void *arg) {
  ENTER();
  if (blocks == 0 || !kernel)
    return ret(cudaErrorInvalidConfiguration);
  op o;
  o.kind = OP_KERNEL;
  o.kernel = kernel;
  o.src = arg;
  o.blocks = blocks;
  return ret(submit(resolve((cudaStream_t)h), std::move(o)));
}

int emu_launch_params(void *h, unsigned blocks, emu_kernel_fn kernel, const void *params, size_t bytes) {
  ENTER();
  if (blocks == 0 || !kernel)
    return ret(cudaErrorInvalidConfiguration);
  if (bytes > 32764 || (bytes && !params)) {
    fprintf(stderr, "loom emu: emu_launch_params: %zu bytes of parameters at %p (a kernel takes at most 32764)\n",
            bytes, params);
    return ret(cudaErrorInvalidValue);
  }
  /* The copy a GPU's launch makes, shared by the graph a capture records
   * it into and each of its launches, freed with the last of them. */
  void *copy = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
  if (!copy)
    return ret(cudaErrorMemoryAllocation);
  if (bytes)
    memcpy(copy, params, bytes);
  op o;
  o.kind = OP_KERNEL;
  o.kernel = kernel;
  o.src = copy;
  o.params = std::shared_ptr<void>(copy, free);
  o.blocks = blocks;
  return ret(submit(resolve((cudaStream_t)h), std::move(o)));
}

cudaError_t cudaGetDeviceCount(int *n) {
  ENTER();
  *n = g_cfg.devices;
  if (g_cfg.devices == 0)
    return ret(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
  ENTER();
  *dev = t_dev;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  ENTER();
  if (dev < 0 || dev >= g_cfg.devices)
    return ret(cudaErrorInvalidDevice);
  t_dev = dev;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev) {
  ENTER();
  if (dev < 0 || dev >= g_cfg.devices)
    return ret(cudaErrorInvalidDevice);
  snprintf(id, (size_t)len, "0000:%02X:00.0", 0x40 + g_cfg.physical[dev]);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *dev, const char *id) {
  ENTER();
  for (int d = 0; d < g_cfg.devices; d++) {
    char mine[32];
    snprintf(mine, sizeof mine, "0000:%02X:00.0", 0x40 + g_cfg.physical[d]);
    if (strcasecmp(mine, id) == 0) {
      *dev = d;
      return cudaSuccess;
    }
  }
  return ret(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int *ok, int dev, int peer) {
  ENTER();
  if (dev < 0 || dev >= g_cfg.devices || peer < 0 || peer >= g_cfg.devices)
    return ret(cudaErrorInvalidDevice);
  *ok = dev != peer;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  ENTER();
  static bool enabled[16][16];
  if (peer < 0 || peer >= g_cfg.devices || peer == t_dev || flags != 0)
    return ret(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> l(g_mu);
  if (enabled[t_dev][peer])
    return ret(cudaErrorPeerAccessAlreadyEnabled);
  enabled[t_dev][peer] = true;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev) {
  ENTER();
  if (dev < 0 || dev >= g_cfg.devices)
    return ret(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMultiProcessorCount: *v = (int)g_cfg.resident; break;
  default: *v = 0; break; /* no GPUDirect RDMA, no dma-buf, ... */
  }
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status) {
  ENTER();
  *fn = nullptr;
  if (status)
    *status = cudaDriverEntryPointSymbolNotFound;
  return ret(cudaErrorSymbolNotFound);
}

cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInitializationError: return "cudaErrorInitializationError";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
  case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
  case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
  case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
  case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
  case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
  case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
  case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  case cudaErrorIllegalState: return "cudaErrorIllegalState";
  case cudaErrorMapBufferObjectFailed: return "cudaErrorMapBufferObjectFailed";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInitializationError:
    return g_cfg.bad ? g_cfg.bad : "initialization error (the emulated runtime was started before a fork)";
  case cudaErrorMapBufferObjectFailed: return "cannot map the IPC handle's memory (emulated)";
  default: return cudaGetErrorName(e);
  }
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t size) {
  ENTER();
  *p = nullptr;
  cudaError_t e = capture_unsafe();
  if (e != cudaSuccess)
    return ret(e);
  if (size == 0)
    return cudaSuccess;
  serialise();
  size_t n = page_round(size);
  int fd = memfd_create("loom-emu-device", MFD_CLOEXEC);
  if (fd < 0)
    return ret(cudaErrorMemoryAllocation);
  void *m = ftruncate(fd, (off_t)n) == 0 ? mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (m == MAP_FAILED) {
    close(fd);
    return ret(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> l(g_mu);
  g_allocs[(uintptr_t)m] = alloc{n, t_dev, MEM_DEVICE, fd};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  ENTER();
  cudaError_t e = capture_unsafe();
  if (e != cudaSuccess)
    return ret(e);
  return p ? release(p, MEM_DEVICE) : cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  ENTER();
  cudaError_t e = capture_unsafe();
  if (e != cudaSuccess)
    return ret(e);
  serialise();
  size_t n = page_round(size ? size : 1);
  void *m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return ret(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> l(g_mu);
  g_allocs[(uintptr_t)m] = alloc{n, t_dev, MEM_PINNED, -1};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }

cudaError_t cudaFreeHost(void *p) {
  ENTER();
  cudaError_t e = capture_unsafe();
  if (e != cudaSuccess)
    return ret(e);
  return p ? release(p, MEM_PINNED) : cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  ENTER();
  if (!p || size == 0)
    return ret(cudaErrorInvalidValue);
  serialise();
  std::lock_guard<std::mutex> l(g_mu);
  if (find_alloc(p) || find_alloc((char *)p + size - 1))
    return ret(cudaErrorHostMemoryAlreadyRegistered);
  auto after = g_allocs.lower_bound((uintptr_t)p);
  if (after != g_allocs.end() && after->first < (uintptr_t)p + size)
    return ret(cudaErrorHostMemoryAlreadyRegistered);
  g_allocs[(uintptr_t)p] = alloc{size, t_dev, MEM_REGISTERED, -1};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) {
  ENTER();
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_allocs.find((uintptr_t)p);
  if (it == g_allocs.end() || it->second.kind != MEM_REGISTERED)
    return ret(cudaErrorHostMemoryNotRegistered);
  g_allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags) {
  ENTER();
  std::lock_guard<std::mutex> l(g_mu);
  auto a = find_alloc(h);
  if (!a || (a->second.kind != MEM_PINNED && a->second.kind != MEM_REGISTERED))
    return ret(cudaErrorInvalidValue);
  *d = h;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
  ENTER();
  memset(attr, 0, sizeof *attr);
  std::lock_guard<std::mutex> l(g_mu);
  auto a = find_alloc(p);
  if (!a) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    return cudaSuccess;
  }
  attr->device = a->second.device;
  attr->devicePointer = (void *)p;
  if (a->second.kind == MEM_DEVICE || a->second.kind == MEM_IPC) {
    attr->type = cudaMemoryTypeDevice;
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = (void *)p;
  }
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
  ENTER();
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_allocs.find((uintptr_t)p);
  if (it == g_allocs.end() || it->second.kind != MEM_DEVICE)
    return ret(cudaErrorInvalidValue);
  ipc_handle x;
  memcpy(x.magic, kMagic, sizeof kMagic);
  x.pid = (int32_t)getpid();
  x.fd = it->second.fd;
  x.size = it->second.size;
  memset(h, 0, sizeof *h);
  memcpy(h, &x, sizeof x);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags) {
  ENTER();
  ipc_handle x;
  memcpy(&x, &h, sizeof x);
  if (memcmp(x.magic, kMagic, sizeof kMagic) != 0)
    return ret(cudaErrorInvalidResourceHandle);
  if (x.pid == (int32_t)getpid())
    return ret(cudaErrorInvalidResourceHandle); /* as CUDA: not in the process that made it */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)x.pid, (int)x.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return ret(cudaErrorMapBufferObjectFailed);
  void *m = mmap(nullptr, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED)
    return ret(cudaErrorMapBufferObjectFailed);
  std::lock_guard<std::mutex> l(g_mu);
  g_allocs[(uintptr_t)m] = alloc{x.size, t_dev, MEM_IPC, -1};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p) {
  ENTER();
  return release(p, MEM_IPC);
}

/* ---- copies ---- */

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h) {
  ENTER();
  if (n == 0)
    return cudaSuccess;
  if (!dst || !src)
    return ret(cudaErrorInvalidValue);
  return ret(copy_on(resolve(h), dst, src, n));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  ENTER();
  if (n == 0)
    return cudaSuccess;
  if (!dst || !src)
    return ret(cudaErrorInvalidValue);
  cudaError_t e = capture_unsafe();
  if (e != cudaSuccess)
    return ret(e);
  stream *s = legacy_of(t_dev);
  uint64_t count;
  e = copy_on(s, dst, src, n, &count);
  if (e == cudaSuccess)
    wait_stream(s, count);
  return ret(e);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t h) {
  ENTER();
  if (n == 0)
    return cudaSuccess;
  op o;
  o.kind = OP_SET;
  o.dst = dst;
  o.value = value;
  o.n = n;
  return ret(submit(resolve(h), std::move(o)));
}

cudaError_t cudaMemset(void *dst, int value, size_t n) {
  ENTER();
  bool pinned;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto a = find_alloc(dst);
    pinned = a && (a->second.kind == MEM_PINNED || a->second.kind == MEM_REGISTERED);
  }
  cudaError_t e = cudaMemsetAsync(dst, value, n, 0);
  if (e == cudaSuccess && pinned)
    sync_stream(legacy_of(t_dev)); /* the one case CUDA makes synchronous */
  return e;
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *h, unsigned int flags) {
  ENTER();
  *h = (cudaStream_t)stream_new(t_dev, false, !(flags & cudaStreamNonBlocking));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *h) { return cudaStreamCreateWithFlags(h, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t h) {
  ENTER();
  stream *s = resolve(h);
  if (s->legacy)
    return ret(cudaErrorInvalidResourceHandle);
  /* Its work still runs, as CUDA's does; an idle stream's thread is gone
   * when this returns, so that counting a process's threads after it
   * sees a steady number. */
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->joined = s->q.empty() && s->done == s->enq;
  }
  bool join = s->joined;
  op o;
  o.kind = OP_STOP;
  enqueue(s, std::move(o));
  if (join)
    pthread_join(s->th, nullptr);
  return cudaSuccess;
}

} /* extern "C" */
