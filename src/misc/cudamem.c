/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/cudamem.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

int gpu_arch_fp8_fnuz(const char *arch) {
  static const char *fnuz[] = {"gfx940", "gfx941", "gfx942"};
  for (size_t i = 0; arch && i < sizeof fnuz / sizeof fnuz[0]; i++)
    if (strncmp(arch, fnuz[i], 6) == 0 && (arch[6] == '\0' || arch[6] == ':'))
      return 1;
  return 0;
}

#if LOOM_HAVE_CUDA
#include "misc/gpurt.h"
#if !LOOM_HIP
#include <cuda.h>
#endif

__attribute__((format(printf, 2, 3))) static ncclResult_t fail(cudaError_t e, const char *fmt, ...) {
  char call[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(call, sizeof call, fmt, ap);
  va_end(ap);
  int dev = -1;
  cudaGetDevice(&dev);
  char name[sizeof call + 4];
  return err_set(ncclUnhandledCudaError, "%s on device %d failed: %s (%s)", gpurt_call(call, name, sizeof name), dev,
                 cudaGetErrorName(e), cudaGetErrorString(e));
}

int cuda_pick_device(void) {
  if (strcasecmp(param_str(P_DEVICE), "host") == 0)
    return -1;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    /* No driver or no GPU is the normal state of a CPU host. */
    cudaGetLastError();
    INFO(LOG_INIT, "no " GPURT_NAME " device (%s): making a host communicator", e == cudaSuccess ? "none visible"
                                                                                       : cudaGetErrorString(e));
    return -1;
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess)
    return -1;
  return dev;
}

int cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

ncclResult_t cuda_bus_id(int dev, char *busid) {
  cudaError_t e = cudaDeviceGetPCIBusId(busid, CUDA_BUSID_BYTES, dev);
  if (e != cudaSuccess)
    return fail(e, "cudaDeviceGetPCIBusId(%d)", dev);
  for (char *p = busid; *p; p++)
    if (*p >= 'A' && *p <= 'F')
      *p = (char)(*p - 'A' + 'a');
  return ncclSuccess;
}

int cuda_device_of_bus_id(const char *busid) {
  int dev = -1;
  if (cudaDeviceGetByPCIBusId(&dev, busid) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

int cuda_can_access_peer(int dev, int peer_dev) {
  if (dev == peer_dev)
    return 1;
  int ok = 0;
  if (cudaDeviceCanAccessPeer(&ok, dev, peer_dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return ok;
}

ncclResult_t cuda_set_device(int dev) {
  cudaError_t e = cudaSetDevice(dev);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaSetDevice(%d)", dev);
}

int cuda_current_device(void) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

void cuda_restore_device(int dev) {
  int cur = -1;
  if (dev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != dev)
    cudaSetDevice(dev);
}

int cuda_capture_relax(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    cudaGetLastError();
    return (int)cudaStreamCaptureModeRelaxed;
  }
  return (int)mode;
}

void cuda_capture_restore(int mode) {
  enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)mode;
  cudaThreadExchangeStreamCaptureMode(&m);
}

ncclResult_t cuda_malloc(void **ptr, size_t size, const char *what) {
  cudaError_t e = cudaMalloc(ptr, size);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaMalloc for %s (%zu bytes)", what, size);
}

void cuda_free(void *ptr) {
  if (ptr)
    cudaFree(ptr);
}

/* Loom's own small sets and reads of device memory run on non-blocking
 * streams, one per device and use, made once: not the legacy stream,
 * where they would wait behind the program's work, and not a stream per
 * call. cuda_memset's callers wait on theirs; the proxy's peeks never
 * wait, and have a stream of their own so that a peek held up behind a
 * stuck kernel holds up no memset. */
#define AUX_DEVICES 64
enum { AUX_SET = 0, AUX_PEEK = 1, AUX_KINDS = 2 };
static pthread_mutex_t aux_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t aux_streams[AUX_KINDS][AUX_DEVICES];

static int aux_holders;

void cuda_aux_hold(void) {
  pthread_mutex_lock(&aux_mu);
  aux_holders++;
  pthread_mutex_unlock(&aux_mu);
}

/* The streams go with the last CUDA communicator, so that a process that
 * has destroyed them all holds nothing of Loom's. */
void cuda_aux_release(void) {
  pthread_mutex_lock(&aux_mu);
  if (--aux_holders == 0) {
    int saved = -1;
    cudaGetDevice(&saved);
    for (int k = 0; k < AUX_KINDS; k++)
      for (int d = 0; d < AUX_DEVICES; d++)
        if (aux_streams[k][d]) {
          cudaSetDevice(d);
          cudaStreamDestroy(aux_streams[k][d]);
          aux_streams[k][d] = NULL;
        }
    if (saved >= 0)
      cudaSetDevice(saved);
  }
  pthread_mutex_unlock(&aux_mu);
}

static ncclResult_t aux_stream(int kind, cudaStream_t *out) {
  int dev = -1;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return fail(e, "cudaGetDevice");
  if (dev < 0 || dev >= AUX_DEVICES)
    return err_set(ncclInternalError, "CUDA device %d: Loom handles devices 0 to %d", dev, AUX_DEVICES - 1);
  pthread_mutex_lock(&aux_mu);
  if (!aux_streams[kind][dev])
    e = cudaStreamCreateWithFlags(&aux_streams[kind][dev], cudaStreamNonBlocking);
  *out = aux_streams[kind][dev];
  pthread_mutex_unlock(&aux_mu);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaStreamCreateWithFlags");
}

ncclResult_t cuda_memset(void *ptr, int value, size_t size) {
  cudaStream_t s;
  CHECK(aux_stream(AUX_SET, &s));
  cudaError_t e = cudaMemsetAsync(ptr, value, size, s);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaMemset of %zu bytes", size);
}

ncclResult_t cuda_peek_init(struct cuda_peek *p, size_t size, const char *what) {
  memset(p, 0, sizeof *p);
  void *dev;
  CHECK(cuda_host_alloc((void **)&p->buf, &dev, size, what));
  p->size = size;
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cuda_peek_free(p);
    return fail(e, "cudaEventCreate for %s", what);
  }
  p->event = ev;
  return ncclSuccess;
}

void cuda_peek_free(struct cuda_peek *p) {
  if (p->event)
    cudaEventDestroy((cudaEvent_t)p->event);
  cuda_host_free(p->buf);
  memset(p, 0, sizeof *p);
}

static ncclResult_t peek_copy(struct cuda_peek *p, void *dst, const void *src, size_t n, const char *what) {
  cudaStream_t s;
  CHECK(aux_stream(AUX_PEEK, &s));
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
  return e == cudaSuccess ? ncclSuccess : fail(e, "%s %zu bytes of device memory", what, n);
}

ncclResult_t cuda_peek_read(struct cuda_peek *p, size_t at, const void *src, size_t n) {
  if (at + n > p->size)
    return err_set(ncclInternalError, "a peek of %zu bytes at %zu overflows its %zu-byte buffer", n, at, p->size);
  return peek_copy(p, p->buf + at, src, n, "reading");
}

ncclResult_t cuda_peek_write(struct cuda_peek *p, void *dst, size_t at, size_t n) {
  if (at + n > p->size)
    return err_set(ncclInternalError, "a write of %zu bytes at %zu overflows its %zu-byte buffer", n, at, p->size);
  return peek_copy(p, dst, p->buf + at, n, "writing");
}

ncclResult_t cuda_peek_issue(struct cuda_peek *p) {
  cudaStream_t s;
  CHECK(aux_stream(AUX_PEEK, &s));
  cudaError_t e = cudaEventRecord((cudaEvent_t)p->event, s);
  if (e != cudaSuccess)
    return fail(e, "cudaEventRecord");
  p->pending = 1;
  return ncclSuccess;
}

int cuda_peek_done(struct cuda_peek *p) {
  if (!p->pending)
    return 0;
  cudaError_t e = cudaEventQuery((cudaEvent_t)p->event);
  if (e == cudaErrorNotReady)
    return 0;
  p->pending = 0;
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return 1;
}

ncclResult_t cuda_enable_peer(int peer_dev) {
  cudaError_t e = cudaDeviceEnablePeerAccess(peer_dev, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return ncclSuccess;
  }
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaDeviceEnablePeerAccess(%d)", peer_dev);
}

ncclResult_t cuda_stream_capturing(void *stream, const char *func, int rank, int *capturing) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &st);
  if (e != cudaSuccess)
    return fail(e, "%s: cudaStreamIsCapturing(%p)", func, stream);
  if (st == cudaStreamCaptureStatusInvalidated)
    return err_set(ncclInvalidUsage,
                   "%s: rank %d: stream %p's capture into a CUDA graph was invalidated by an earlier call that a "
                   "capture does not allow; nothing was enqueued", func, rank, stream);
  *capturing = st != cudaStreamCaptureStatusNone;
  return ncclSuccess;
}

ncclResult_t cuda_stream_check(void *stream, const char *func, int rank, int capture_ok) {
  int capturing = 0;
  CHECK(cuda_stream_capturing(stream, func, rank, &capturing));
  if (capturing && !capture_ok)
    return err_set(ncclInvalidUsage,
                   "%s: rank %d: stream %p is being captured into a CUDA graph, which Loom supports for collectives and point-to-point calls only; "
                   "call it outside the capture (nothing was enqueued)",
                   func, rank, stream);
  return ncclSuccess;
}

ncclResult_t cuda_host_register(void *ptr, size_t size, void **dev, const char *what) {
  cudaError_t e = cudaHostRegister(ptr, size, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e == cudaSuccess)
    e = cudaHostGetDevicePointer(dev, ptr, 0);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaHostRegister of %s (%zu bytes)", what, size);
}

void cuda_host_unregister(void *ptr) {
  if (ptr)
    cudaHostUnregister(ptr);
}

ncclResult_t cuda_host_alloc(void **host, void **dev, size_t size, const char *what) {
  cudaError_t e = cudaHostAlloc(host, size, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess)
    e = cudaHostGetDevicePointer(dev, *host, 0);
  if (e == cudaSuccess)
    memset(*host, 0, size);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaHostAlloc for %s (%zu bytes)", what, size);
}

void cuda_host_free(void *host) {
  if (host)
    cudaFreeHost(host);
}

_Static_assert(sizeof(cudaIpcMemHandle_t) <= CUDA_IPC_HANDLE_BYTES, "IPC handle size");

ncclResult_t cuda_ipc_get(void *ptr, void *handle) {
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, ptr);
  if (e != cudaSuccess)
    return fail(e, "cudaIpcGetMemHandle(%p)", ptr);
  memcpy(handle, &h, sizeof h);
  return ncclSuccess;
}

ncclResult_t cuda_ipc_open(const void *handle, void **ptr, const char *what) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  cudaError_t e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaIpcOpenMemHandle of %s", what);
}

void cuda_ipc_close(void *ptr) {
  if (ptr)
    cudaIpcCloseMemHandle(ptr);
}

/* One attribute of the device; 0 (the error cleared) where CUDA cannot
 * say. */
static int dev_attr(int dev, enum cudaDeviceAttr attr, int *v) {
  if (cudaDeviceGetAttribute(v, attr, dev) == cudaSuccess)
    return 1;
  cudaGetLastError();
  return 0;
}

#if LOOM_HIP
/* HIP has no attribute saying whether a NIC may reach the device's memory
 * (RCCL asks the kernel for amdgpu's peer-memory module instead): an AMD
 * device counts as not supporting it, and the network stages its data
 * through host memory, which net_gdr says at init. */
int cuda_gdr_supported(int dev) { return 0; }
#else
int cuda_gdr_supported(int dev) {
  int v;
  return dev_attr(dev, cudaDevAttrGPUDirectRDMASupported, &v) ? v : 0;
}
#endif

int cuda_compute_capability(int dev) {
  int major, minor;
  if (!dev_attr(dev, cudaDevAttrComputeCapabilityMajor, &major) ||
      !dev_attr(dev, cudaDevAttrComputeCapabilityMinor, &minor))
    return 0;
  return major * 10 + minor;
}

#if LOOM_HIP
/* HIP 5.2 cannot export device memory as a dma-buf (ROCm 6 added
 * hipMemGetHandleForAddressRange; not used yet): the network stages. */
int cuda_dmabuf_supported(int dev, char *why, size_t len) {
  snprintf(why, len, "Loom's HIP build cannot export AMD GPU memory as a dma-buf");
  return 0;
}

ncclResult_t cuda_dmabuf_fd(void *ptr, size_t size, int *fd) {
  return err_set(ncclInternalError, "Loom's HIP build cannot export AMD GPU memory as a dma-buf");
}
#else
/* The driver API entries dma-buf needs, from the driver the runtime has
 * loaded: the library never links libcuda itself. */
typedef CUresult (*cu_device_get_fn)(CUdevice *dev, int ordinal);
typedef CUresult (*cu_device_attr_fn)(int *v, CUdevice_attribute attr, CUdevice dev);
typedef CUresult (*cu_range_handle_fn)(void *handle, CUdeviceptr ptr, size_t size, CUmemRangeHandleType type,
                                       unsigned long long flags);

static void *driver_entry(const char *sym) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(sym, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return fn;
}

int cuda_dmabuf_supported(int dev, char *why, size_t len) {
  cu_device_get_fn get = (cu_device_get_fn)driver_entry("cuDeviceGet");
  cu_device_attr_fn attr = (cu_device_attr_fn)driver_entry("cuDeviceGetAttribute");
  if (!get || !attr || !driver_entry("cuMemGetHandleForAddressRange")) {
    snprintf(why, len, "the CUDA driver has no cuMemGetHandleForAddressRange (a driver for CUDA 11.7 or later has)");
    return 0;
  }
  CUdevice d;
  int v = 0;
  CUresult r = get(&d, dev);
  if (r == CUDA_SUCCESS)
    r = attr(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
  if (r != CUDA_SUCCESS) {
    snprintf(why, len, "the CUDA driver cannot say whether GPU %d exports dma-bufs (error %d)", dev, (int)r);
    return 0;
  }
  if (!v)
    snprintf(why, len, "the CUDA driver does not export GPU %d's memory as dma-buf (it needs NVIDIA's open kernel "
             "modules and Linux 5.12 or later)", dev);
  return v;
}

ncclResult_t cuda_dmabuf_fd(void *ptr, size_t size, int *fd) {
  cu_range_handle_fn fn = (cu_range_handle_fn)driver_entry("cuMemGetHandleForAddressRange");
  if (!fn)
    return err_set(ncclSystemError, "the CUDA driver has no cuMemGetHandleForAddressRange: device memory cannot be "
                   "exported as a dma-buf");
  int h = -1;
  CUresult r = fn(&h, (CUdeviceptr)(uintptr_t)ptr, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS || h < 0)
    return err_set(ncclUnhandledCudaError, "cuMemGetHandleForAddressRange of %zu bytes of device memory at %p as a "
                   "dma-buf failed (CUDA driver error %d)", size, ptr, (int)r);
  *fd = h;
  return ncclSuccess;
}

#endif

ncclResult_t cuda_check_pointer(const void *ptr, size_t bytes, int dev, const char *func, const char *name) {
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  /* HIP before 6.0 answers ordinary host memory with an error, CUDA with
   * a type. */
  if (e != cudaSuccess) {
    cudaGetLastError();
    return err_set(ncclInvalidArgument, "%s: %s %p is not memory " GPURT_NAME " knows (%s); a " GPURT_NAME
                   " communicator needs device memory (or host memory registered with " GPURT_PREFIX "HostRegister), or use "
                   "a host communicator (LOOM_DEVICE=host)", func, name, ptr, cudaGetErrorString(e));
  }
#if !LOOM_HIP
  if (a.type == cudaMemoryTypeUnregistered)
    return err_set(ncclInvalidArgument,
                   "%s: %s %p is ordinary host memory; a CUDA communicator needs device memory (or host memory "
                   "registered with cudaHostRegister), or use a host communicator (LOOM_DEVICE=host)",
                   func, name, ptr);
#endif
  if (GPURT_MEMORY_TYPE(a) == cudaMemoryTypeDevice && a.device != dev && !cuda_can_access_peer(dev, a.device))
    return err_set(ncclInvalidArgument, "%s: %s %p is memory of device %d, which device %d (the communicator's) "
                   "cannot reach", func, name, ptr, a.device, dev);
  (void)bytes;
  return ncclSuccess;
}

ncclResult_t cuda_memcpy_async(void *dst, const void *src, size_t n, void *stream, const char *what) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)stream);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaMemcpyAsync of %zu bytes (%s)", n, what);
}

ncclResult_t cuda_host_func(void *stream, void (*fn)(void *), void *arg, const char *what) {
  cudaError_t e = cudaLaunchHostFunc((cudaStream_t)stream, fn, arg);
  return e == cudaSuccess ? ncclSuccess : fail(e, "cudaLaunchHostFunc (%s)", what);
}

#if LOOM_HIP
/* Asked once per device: the properties take a while. */
int cuda_fp8_fnuz(int dev) {
  static _Atomic int known[AUX_DEVICES]; /* 0 unknown, 1 OCP, 2 FNUZ */
  if (dev < 0 || dev >= AUX_DEVICES)
    return 0;
  int k = known[dev];
  if (!k) {
    hipDeviceProp_t p;
    k = hipGetDeviceProperties(&p, dev) == hipSuccess && gpu_arch_fp8_fnuz(p.gcnArchName) ? 2 : 1;
    known[dev] = k;
  }
  return k == 2;
}
#else
int cuda_fp8_fnuz(int dev) { return 0; }
#endif

#else /* host-only build */
int cuda_fp8_fnuz(int dev) { return 0; }

static ncclResult_t none(const char *what) {
  return err_set(ncclInternalError, "%s: this build of Loom has no CUDA", what);
}
int cuda_pick_device(void) { return -1; }
int cuda_device_count(void) { return 0; }
int cuda_current_device(void) { return -1; }
void cuda_restore_device(int dev) {}
int cuda_capture_relax(void) { return 0; }
void cuda_capture_restore(int mode) {}
ncclResult_t cuda_bus_id(int dev, char *busid) { return none("cuda_bus_id"); }
int cuda_device_of_bus_id(const char *busid) { return -1; }
int cuda_can_access_peer(int dev, int peer_dev) { return 0; }
ncclResult_t cuda_set_device(int dev) { return none("cudaSetDevice"); }
ncclResult_t cuda_malloc(void **ptr, size_t size, const char *what) { return none("cudaMalloc"); }
void cuda_free(void *ptr) {}
ncclResult_t cuda_memset(void *ptr, int value, size_t size) { return none("cudaMemset"); }
ncclResult_t cuda_host_register(void *ptr, size_t size, void **dev, const char *what) { return none("cudaHostRegister"); }
void cuda_host_unregister(void *ptr) {}
ncclResult_t cuda_host_alloc(void **host, void **dev, size_t size, const char *what) { return none("cudaHostAlloc"); }
void cuda_host_free(void *host) {}
ncclResult_t cuda_ipc_get(void *ptr, void *handle) { return none("cudaIpcGetMemHandle"); }
ncclResult_t cuda_ipc_open(const void *handle, void **ptr, const char *what) { return none("cudaIpcOpenMemHandle"); }
void cuda_ipc_close(void *ptr) {}
ncclResult_t cuda_memcpy_async(void *dst, const void *src, size_t n, void *stream, const char *what) {
  return none("cudaMemcpyAsync");
}
ncclResult_t cuda_host_func(void *stream, void (*fn)(void *), void *arg, const char *what) {
  return none("cudaLaunchHostFunc");
}
int cuda_gdr_supported(int dev) { return 0; }
int cuda_compute_capability(int dev) { return 0; }
int cuda_dmabuf_supported(int dev, char *why, size_t len) {
  snprintf(why, len, "this build of Loom has no CUDA");
  return 0;
}
ncclResult_t cuda_dmabuf_fd(void *ptr, size_t size, int *fd) { return none("cuMemGetHandleForAddressRange"); }
ncclResult_t cuda_check_pointer(const void *ptr, size_t bytes, int dev, const char *func, const char *name) {
  return none(func);
}
ncclResult_t cuda_enable_peer(int peer_dev) { return none("cudaDeviceEnablePeerAccess"); }
void cuda_aux_hold(void) {}
void cuda_aux_release(void) {}
ncclResult_t cuda_peek_init(struct cuda_peek *p, size_t size, const char *what) { return none("cudaHostAlloc"); }
void cuda_peek_free(struct cuda_peek *p) {}
ncclResult_t cuda_peek_read(struct cuda_peek *p, size_t at, const void *src, size_t n) { return none("cudaMemcpy"); }
ncclResult_t cuda_peek_write(struct cuda_peek *p, void *dst, size_t at, size_t n) { return none("cudaMemcpy"); }
ncclResult_t cuda_peek_issue(struct cuda_peek *p) { return none("cudaEventRecord"); }
int cuda_peek_done(struct cuda_peek *p) { return -1; }
ncclResult_t cuda_stream_capturing(void *stream, const char *func, int rank, int *capturing) { return none(func); }
ncclResult_t cuda_stream_check(void *stream, const char *func, int rank, int capture_ok) { return none(func); }
#endif
