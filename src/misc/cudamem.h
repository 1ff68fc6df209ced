/*
 * The CUDA runtime as the rest of Loom needs it: device choice, memory the
 * GPU can reach (device memory, host memory mapped for it, IPC handles),
 * each failure turned into a sentence that names the call, the size, the
 * device and CUDA's own words. Built without CUDA these report that the
 * build has no CUDA; host communicators never call them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CUDAMEM_H
#define LOOM_CUDAMEM_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define CUDA_IPC_HANDLE_BYTES 64
#define CUDA_BUSID_BYTES 16

/* The device a new communicator should use, or -1 for a host communicator
 * (LOOM_DEVICE=host, no CUDA in this build, no driver, or no device). */
int cuda_pick_device(void);
/* How many devices this process sees (0 without CUDA or a driver). */
int cuda_device_count(void);
/* The PCI bus id of a device ("0000:19:00.0"), to recognise it in other
 * processes whatever CUDA_VISIBLE_DEVICES says there. */
ncclResult_t cuda_bus_id(int dev, char *busid);
/* The local ordinal of the device with this bus id, or -1. */
int cuda_device_of_bus_id(const char *busid);
int cuda_can_access_peer(int dev, int peer_dev);
ncclResult_t cuda_set_device(int dev);
/* The calling thread's current device (-1 without CUDA), and putting it
 * back: Loom's calls leave the caller's current device as they found it. */
int cuda_current_device(void);
void cuda_restore_device(int dev);
/* The calling thread's stream-capture mode set to relaxed, returning the
 * mode it had: a call captured into a CUDA graph may have to connect to a
 * new peer, whose memory allocation the default mode forbids during a
 * capture (the allocation is made now, not captured). */
int cuda_capture_relax(void);
void cuda_capture_restore(int mode);

ncclResult_t cuda_malloc(void **ptr, size_t size, const char *what);
void cuda_free(void *ptr);
/* Sets device memory and waits until it is set, on a stream of its own:
 * cudaMemset is queued on the legacy stream, behind whatever the program
 * has there, and a peer given the memory meanwhile would see it change. */
ncclResult_t cuda_memset(void *ptr, int value, size_t size);
/* The auxiliary streams of cuda_memset and the peeks are kept while a
 * CUDA communicator holds them (hold at its init, release at its end). */
void cuda_aux_hold(void);
void cuda_aux_release(void);

/* Reads and writes of device memory that never wait, for the proxy: a
 * plain cudaMemcpy can be held up behind a kernel stuck on a dead peer
 * (after an allocation, CUDA starts no command before every one issued
 * earlier has ended), and the proxy is what unsticks that kernel. Copies
 * go between `buf` (pinned) and device memory on a stream of their own;
 * cuda_peek_issue ends a batch, and cuda_peek_done says, without
 * waiting, when it has ended: 1 (buf holds what was read), 0 (not yet,
 * or nothing issued), -1 (the copies failed). One batch at a time. */
struct cuda_peek {
  char *buf;
  size_t size;
  void *event; /* cudaEvent_t */
  int pending;
};
ncclResult_t cuda_peek_init(struct cuda_peek *p, size_t size, const char *what);
void cuda_peek_free(struct cuda_peek *p);
ncclResult_t cuda_peek_read(struct cuda_peek *p, size_t at, const void *src, size_t n);
ncclResult_t cuda_peek_write(struct cuda_peek *p, void *dst, size_t at, size_t n);
ncclResult_t cuda_peek_issue(struct cuda_peek *p);
int cuda_peek_done(struct cuda_peek *p);
/* Lets this device's kernels reach the memory of `peer_dev` (in this
 * process); already enabled is fine. */
ncclResult_t cuda_enable_peer(int peer_dev);
/* Refuses a stream that is not valid or whose capture into a CUDA graph
 * was invalidated, and one being captured unless capture_ok, with the
 * sentence. */
ncclResult_t cuda_stream_check(void *stream, const char *func, int rank, int capture_ok);
/* Whether a valid stream is being captured into a CUDA graph; a stream
 * whose capture was invalidated is refused with the sentence. */
ncclResult_t cuda_stream_capturing(void *stream, const char *func, int rank, int *capturing);
/* Pins and maps existing host memory for the GPU; *dev is its device address. */
ncclResult_t cuda_host_register(void *ptr, size_t size, void **dev, const char *what);
void cuda_host_unregister(void *ptr);
/* Pinned, mapped host memory. */
ncclResult_t cuda_host_alloc(void **host, void **dev, size_t size, const char *what);
void cuda_host_free(void *host);

ncclResult_t cuda_ipc_get(void *ptr, void *handle);
ncclResult_t cuda_ipc_open(const void *handle, void **ptr, const char *what);
void cuda_ipc_close(void *ptr);

/* One-sided operations (comm_rma.c): a copy of any memory to any queued
 * on `stream`, and fn(arg) run on the host once the stream reaches it
 * (fn must not call CUDA). */
ncclResult_t cuda_memcpy_async(void *dst, const void *src, size_t n, void *stream, const char *what);
ncclResult_t cuda_host_func(void *stream, void (*fn)(void *), void *arg, const char *what);

/* GPUDirect RDMA (src/transport/net/net_gdr.c). Whether the device lets a NIC
 * reach its memory at all (cudaDevAttrGPUDirectRDMASupported). */
int cuda_gdr_supported(int dev);
/* Compute capability x 10 (90 for sm_90), 0 where unknown. */
int cuda_compute_capability(int dev);
/* Whether the driver exports the device's memory as a dma-buf
 * (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, with cuMemGetHandleForAddressRange
 * reached through cudaGetDriverEntryPoint, so that nothing links libcuda);
 * if not, `why` says what is missing. */
int cuda_dmabuf_supported(int dev, char *why, size_t len);
/* A dma-buf file descriptor for [ptr, ptr+size) of device memory (both
 * host-page aligned); the caller closes it once registered. */
ncclResult_t cuda_dmabuf_fd(void *ptr, size_t size, int *fd);

/* Whether the device reads fp8 as the FNUZ encodings (AMD's gfx940-942,
 * MI300: RCCL's ncclFp8E4M3/E5M2 there), not the OCP ones NCCL defines
 * and Loom's reductions compute; 0 on NVIDIA and in builds without HIP.
 * gpu_arch_fp8_fnuz answers for an architecture name ("gfx942:sramecc+"). */
int cuda_fp8_fnuz(int dev);
int gpu_arch_fp8_fnuz(const char *arch);

/* Whether `ptr` .. ptr+bytes is memory the current device can use in a
 * kernel (device, managed, or mapped host memory); the sentence if not. */
ncclResult_t cuda_check_pointer(const void *ptr, size_t bytes, int dev, const char *func, const char *name);

#endif
