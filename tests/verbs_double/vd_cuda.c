/*
 * CUDA device memory in the verbs test double: where a real NIC reaches a
 * GPU's memory over PCIe (GPUDirect RDMA), the double reaches it through
 * the CUDA driver of the process that executes the work request, so that
 * ranks sharing a GPU can run GPUDirect RDMA through it:
 *  - registration notes the allocation's CUDA IPC handle and GPU;
 *  - a peer opens that handle once per allocation (cuIpcOpenMemHandle),
 *    and the owner itself uses its own pointer;
 *  - bytes move with cuMemcpyAsync on a non-blocking stream of the
 *    double's own, so that a copy never waits for a kernel that is itself
 *    waiting for the copy (a legacy-stream copy would).
 * libcuda.so.1 is loaded with dlopen; a process that has not loaded it has
 * no device memory to describe, and the double does not load it there
 * unless a peer's device memory must be written. Nothing here proves
 * timing, PCIe ordering or what a real NIC's flush does.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "vd_internal.h"

/* The driver API types, as cuda.h declares them (no CUDA headers needed). */
typedef int vd_cu_result;
typedef unsigned long long vd_cu_ptr;
typedef void *vd_cu_ctx;
typedef void *vd_cu_stream;
typedef int vd_cu_dev;
typedef struct {
  char reserved[VD_CUDA_IPC_BYTES];
} vd_cu_ipc;

#define VD_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define VD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define VD_CU_MEMORYTYPE_DEVICE 2
#define VD_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1
#define VD_CU_STREAM_NON_BLOCKING 1
#define VD_CU_ERROR_NOT_LOADED 100000 /* the double's own code: no libcuda */

#define VD_CUDA_MAX_DEVS 64
#define VD_CUDA_MAX_OPEN 128

static struct {
  void *h;
  vd_cu_result (*init)(unsigned flags);
  vd_cu_result (*pointer_get_attribute)(void *data, int attr, vd_cu_ptr ptr);
  vd_cu_result (*mem_get_address_range)(vd_cu_ptr *base, size_t *size, vd_cu_ptr ptr);
  vd_cu_result (*ipc_get_mem_handle)(vd_cu_ipc *h, vd_cu_ptr ptr);
  vd_cu_result (*ipc_open_mem_handle)(vd_cu_ptr *ptr, vd_cu_ipc h, unsigned flags);
  vd_cu_result (*ipc_close_mem_handle)(vd_cu_ptr ptr);
  vd_cu_result (*memcpy_async)(vd_cu_ptr dst, vd_cu_ptr src, size_t n, vd_cu_stream s);
  vd_cu_result (*stream_create)(vd_cu_stream *s, unsigned flags);
  vd_cu_result (*stream_synchronize)(vd_cu_stream s);
  vd_cu_result (*ctx_push)(vd_cu_ctx c);
  vd_cu_result (*ctx_pop)(vd_cu_ctx *c);
  vd_cu_result (*primary_ctx_retain)(vd_cu_ctx *c, vd_cu_dev d);
  vd_cu_result (*device_get)(vd_cu_dev *d, int ordinal);
  vd_cu_result (*device_get_by_pci_bus_id)(vd_cu_dev *d, const char *busid);
  vd_cu_result (*device_get_pci_bus_id)(char *busid, int len, vd_cu_dev d);
} cu;

/* Per device: its primary context and the double's stream in it. */
static struct {
  vd_cu_ctx ctx;
  vd_cu_stream stream;
} vd_devs_cu[VD_CUDA_MAX_DEVS];

/* Peers' allocations opened here, least recently used first out. */
static struct {
  pid_t owner;
  vd_cu_ipc ipc;
  vd_cu_ptr base;
  int dev;
  uint64_t used;
} vd_open[VD_CUDA_MAX_OPEN];
static int vd_nopen;
static uint64_t vd_open_clock;
static pthread_mutex_t vd_cu_lock = PTHREAD_MUTEX_INITIALIZER;

/* Loads libcuda.so.1: only if the process already has it, unless `force`. */
static int vd_cu_load(int force) {
  if (cu.h)
    return 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (force ? 0 : RTLD_NOLOAD));
  if (!h)
    return -1;
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"cuInit", (void **)&cu.init},
      {"cuPointerGetAttribute", (void **)&cu.pointer_get_attribute},
      {"cuMemGetAddressRange_v2", (void **)&cu.mem_get_address_range},
      {"cuIpcGetMemHandle", (void **)&cu.ipc_get_mem_handle},
      {"cuIpcOpenMemHandle_v2", (void **)&cu.ipc_open_mem_handle},
      {"cuIpcCloseMemHandle", (void **)&cu.ipc_close_mem_handle},
      {"cuMemcpyAsync", (void **)&cu.memcpy_async},
      {"cuStreamCreate", (void **)&cu.stream_create},
      {"cuStreamSynchronize", (void **)&cu.stream_synchronize},
      {"cuCtxPushCurrent_v2", (void **)&cu.ctx_push},
      {"cuCtxPopCurrent_v2", (void **)&cu.ctx_pop},
      {"cuDevicePrimaryCtxRetain", (void **)&cu.primary_ctx_retain},
      {"cuDeviceGet", (void **)&cu.device_get},
      {"cuDeviceGetByPCIBusId", (void **)&cu.device_get_by_pci_bus_id},
      {"cuDeviceGetPCIBusId", (void **)&cu.device_get_pci_bus_id},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
      vd_log("libcuda.so.1 has no %s: device memory is out of reach", syms[i].name);
      memset(&cu, 0, sizeof(cu));
      dlclose(h);
      return -1;
    }
  }
  if (cu.init(0) != 0) {
    memset(&cu, 0, sizeof(cu));
    dlclose(h);
    return -1;
  }
  cu.h = h;
  return 0;
}

/* Makes device `ordinal`'s primary context current (and its stream
 * exist); vd_cu_leave undoes it. With vd_cu_lock held. */
static vd_cu_result vd_cu_enter(int ordinal) {
  if (ordinal < 0 || ordinal >= VD_CUDA_MAX_DEVS)
    return 101; /* CUDA_ERROR_INVALID_DEVICE */
  vd_cu_result r = 0;
  if (!vd_devs_cu[ordinal].ctx) {
    vd_cu_dev d;
    if ((r = cu.device_get(&d, ordinal)) != 0 || (r = cu.primary_ctx_retain(&vd_devs_cu[ordinal].ctx, d)) != 0)
      return r;
  }
  if ((r = cu.ctx_push(vd_devs_cu[ordinal].ctx)) != 0)
    return r;
  if (!vd_devs_cu[ordinal].stream && (r = cu.stream_create(&vd_devs_cu[ordinal].stream, VD_CU_STREAM_NON_BLOCKING))) {
    vd_cu_ctx c;
    cu.ctx_pop(&c);
  }
  return r;
}

static void vd_cu_leave(void) {
  vd_cu_ctx c;
  cu.ctx_pop(&c);
}

int vd_cuda_describe(uint64_t addr, uint64_t len, struct vd_mem *m) {
  if (vd_cu_load(0) != 0)
    return 0;
  unsigned type = 0;
  int ordinal = -1;
  if (cu.pointer_get_attribute(&type, VD_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) != 0 ||
      type != VD_CU_MEMORYTYPE_DEVICE ||
      cu.pointer_get_attribute(&ordinal, VD_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr) != 0)
    return 0;
  pthread_mutex_lock(&vd_cu_lock);
  vd_cu_result r = vd_cu_enter(ordinal);
  vd_cu_ptr base = 0;
  size_t size = 0;
  vd_cu_ipc ipc;
  vd_cu_dev d = 0;
  if (!r) {
    if (!(r = cu.mem_get_address_range(&base, &size, addr)) && !(r = cu.ipc_get_mem_handle(&ipc, base)) &&
        !(r = cu.device_get(&d, ordinal)))
      r = cu.device_get_pci_bus_id(m->busid, VD_CUDA_BUSID_BYTES, d);
    vd_cu_leave();
  }
  pthread_mutex_unlock(&vd_cu_lock);
  if (r) {
    vd_log("device memory at 0x%llx cannot be registered: CUDA driver error %d", (unsigned long long)addr, r);
    errno = EFAULT;
    return -1;
  }
  if (addr + len > base + size) {
    errno = EFAULT; /* past the allocation: no NIC could pin that either */
    return -1;
  }
  m->kind = VD_MEM_CUDA;
  m->cuda_base = base;
  memcpy(m->ipc, &ipc, sizeof(ipc));
  return 1;
}

/* The owner's allocation opened in this process, with vd_cu_lock held. */
static vd_cu_result vd_cu_open(pid_t owner, const struct vd_mem *m, int dev, vd_cu_ptr *base) {
  for (int i = 0; i < vd_nopen; i++) {
    if (vd_open[i].owner == owner && memcmp(&vd_open[i].ipc, m->ipc, sizeof(vd_open[i].ipc)) == 0) {
      vd_open[i].used = ++vd_open_clock;
      *base = vd_open[i].base;
      return 0;
    }
  }
  int slot = vd_nopen;
  if (vd_nopen == VD_CUDA_MAX_OPEN) {
    slot = 0;
    for (int i = 1; i < vd_nopen; i++)
      if (vd_open[i].used < vd_open[slot].used)
        slot = i;
    if (vd_cu_enter(vd_open[slot].dev) == 0) {
      cu.ipc_close_mem_handle(vd_open[slot].base);
      vd_cu_leave();
    }
  }
  vd_cu_ipc ipc;
  memcpy(&ipc, m->ipc, sizeof(ipc));
  vd_cu_result r = vd_cu_enter(dev);
  if (r)
    return r;
  r = cu.ipc_open_mem_handle(base, ipc, VD_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  vd_cu_leave();
  if (r) {
    if (slot < vd_nopen)
      vd_open[slot] = vd_open[--vd_nopen];
    return r;
  }
  vd_open[slot].owner = owner;
  vd_open[slot].ipc = ipc;
  vd_open[slot].base = *base;
  vd_open[slot].dev = dev;
  vd_open[slot].used = ++vd_open_clock;
  if (slot == vd_nopen)
    vd_nopen++;
  return 0;
}

int vd_cuda_resolve(pid_t owner, const struct vd_mem *m, uint64_t addr, uint64_t *local, int *dev) {
  if (vd_cu_load(1) != 0)
    return VD_CU_ERROR_NOT_LOADED;
  pthread_mutex_lock(&vd_cu_lock);
  vd_cu_dev d;
  int ordinal = -1;
  vd_cu_result r = cu.device_get_by_pci_bus_id(&d, m->busid);
  /* The ordinal of that device here: the one whose handle it is. */
  for (int i = 0; !r && i < VD_CUDA_MAX_DEVS && ordinal < 0; i++) {
    vd_cu_dev x;
    if (cu.device_get(&x, i) != 0)
      break;
    if (x == d)
      ordinal = i;
  }
  if (!r && ordinal < 0)
    r = 101; /* CUDA_ERROR_INVALID_DEVICE: the GPU is not visible here */
  vd_cu_ptr base = m->cuda_base;
  if (!r && owner != getpid())
    r = vd_cu_open(owner, m, ordinal, &base);
  pthread_mutex_unlock(&vd_cu_lock);
  if (r)
    return r;
  *local = base + (addr - m->cuda_base);
  *dev = ordinal;
  return 0;
}

int vd_cuda_copy(int dev, uint64_t dst, uint64_t src, uint64_t n) {
  if (!cu.h)
    return VD_CU_ERROR_NOT_LOADED;
  pthread_mutex_lock(&vd_cu_lock);
  vd_cu_result r = vd_cu_enter(dev);
  if (!r) {
    r = cu.memcpy_async(dst, src, n, vd_devs_cu[dev].stream);
    if (!r)
      r = cu.stream_synchronize(vd_devs_cu[dev].stream);
    vd_cu_leave();
  }
  pthread_mutex_unlock(&vd_cu_lock);
  return r;
}
