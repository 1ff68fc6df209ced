/*
 * The GPU runtime by CUDA's names. Loom's host code (cudamem.c, the CUDA
 * executor, the GPU tests) calls the CUDA runtime; built for AMD GPUs
 * (LOOM_HIP) the same code calls HIP's, which is CUDA's API renamed, so
 * this file maps each name Loom uses to HIP's and nothing else changes.
 * What HIP has under another shape is spelled out here (CUDA 12's graph
 * instantiation, host functions, a pointer's memory type) or, where only
 * one place needs it, there under #if LOOM_HIP (driver entry points,
 * device attributes HIP lacks), and what HIP lacks fails there with a
 * sentence.
 * Names are added here as code starts to use them: a CUDA name missing
 * from the list fails the HIP build (CI builds it), not a run.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_GPURT_H
#define LOOM_GPURT_H

#include "nccl.h" /* cudaStream_t: CUDA's, or HIP's stream under that name */

#if LOOM_HIP
#include <hip/hip_runtime_api.h>

#define GPURT_NAME "HIP"
#define GPURT_PREFIX "hip" /* of the runtime's calls, for sentences */
/* HIP 5.3 added graph user objects (a captured launch's plan freed with
 * its graph); without them that one case fails with a sentence. */
#define GPURT_USER_OBJECTS (HIP_VERSION >= 50300000)
#define CUDART_CB
/* A pointer's memory type: HIP before 6.0 names the field memoryType. */
#if HIP_VERSION_MAJOR >= 6
#define GPURT_MEMORY_TYPE(attr) ((attr).type)
#else
#define GPURT_MEMORY_TYPE(attr) ((attr).memoryType)
#endif

/* Types and enumerations. */
#define cudaDeviceAttr hipDeviceAttribute_t
#define cudaDeviceProp hipDeviceProp_t
#define cudaError_t hipError_t
#define cudaEvent_t hipEvent_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaGraphNode_t hipGraphNode_t
#define cudaGraph_t hipGraph_t
#define cudaIpcMemHandle_t hipIpcMemHandle_t
#define cudaPointerAttributes hipPointerAttribute_t /* the struct's tag */
#define cudaStreamCaptureMode hipStreamCaptureMode
#define cudaStreamCaptureStatus hipStreamCaptureStatus
#if GPURT_USER_OBJECTS
#define cudaUserObject_t hipUserObject_t
#endif

/* Constants. */
#define cudaSuccess hipSuccess
#define cudaErrorCapturedEvent hipErrorCapturedEvent
#define cudaErrorIllegalState hipErrorIllegalState
#define cudaErrorInvalidConfiguration hipErrorInvalidConfiguration
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotPermitted hipErrorNotSupported
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorPeerAccessAlreadyEnabled hipErrorPeerAccessAlreadyEnabled
#define cudaErrorStreamCaptureImplicit hipErrorStreamCaptureImplicit
#define cudaErrorStreamCaptureInvalidated hipErrorStreamCaptureInvalidated
#define cudaErrorStreamCaptureIsolation hipErrorStreamCaptureIsolation
#define cudaErrorStreamCaptureUnsupported hipErrorStreamCaptureUnsupported
#define cudaErrorStreamCaptureWrongThread hipErrorStreamCaptureWrongThread
#define cudaErrorUnknown hipErrorUnknown
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrComputeCapabilityMinor hipDeviceAttributeComputeCapabilityMinor
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaGraphInstantiateFlagAutoFreeOnLaunch hipGraphInstantiateFlagAutoFreeOnLaunch
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostRegisterMapped hipHostRegisterMapped
#define cudaHostRegisterPortable hipHostRegisterPortable
#define cudaIpcMemLazyEnablePeerAccess hipIpcMemLazyEnablePeerAccess
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemoryTypeDevice hipMemoryTypeDevice
#define cudaStreamCaptureModeGlobal hipStreamCaptureModeGlobal
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamCaptureStatusActive hipStreamCaptureStatusActive
#define cudaStreamCaptureStatusInvalidated hipStreamCaptureStatusInvalidated
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaStreamNonBlocking hipStreamNonBlocking
#if GPURT_USER_OBJECTS
#define cudaGraphUserObjectMove hipGraphUserObjectMove
#define cudaUserObjectNoDestructorSync hipUserObjectNoDestructorSync
#endif

/* Functions. */
#define cudaDeviceCanAccessPeer hipDeviceCanAccessPeer
#define cudaDeviceEnablePeerAccess hipDeviceEnablePeerAccess
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDeviceGetByPCIBusId hipDeviceGetByPCIBusId
#define cudaDeviceGetPCIBusId hipDeviceGetPCIBusId
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDestroy hipEventDestroy
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventQuery hipEventQuery
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaFree hipFree
#define cudaFreeHost hipHostFree
#define cudaGetDevice hipGetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy
/* CUDA 12's three-argument form; HIP's hipGraphInstantiate is CUDA 11's five. */
#define cudaGraphInstantiate(exec, graph, flags) hipGraphInstantiateWithFlags(exec, graph, flags)
#define cudaGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaHostAlloc hipHostMalloc
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaIpcCloseMemHandle hipIpcCloseMemHandle
#define cudaIpcGetMemHandle hipIpcGetMemHandle
#define cudaIpcOpenMemHandle hipIpcOpenMemHandle
#define cudaLaunchHostFunc gpurt_launch_host_func /* below */
#define cudaMalloc hipMalloc
#define cudaMallocHost(ptr, size) hipHostMalloc(ptr, size, 0)
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaSetDevice hipSetDevice
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamEndCapture hipStreamEndCapture
/* The six-argument form (CUDA 11.3 to 12.2), which Loom's code takes
 * where CUDART_VERSION is not set. */
#define cudaStreamGetCaptureInfo hipStreamGetCaptureInfo_v2
#define cudaStreamIsCapturing hipStreamIsCapturing
#define cudaStreamQuery hipStreamQuery
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
#if GPURT_USER_OBJECTS
#define cudaGraphReleaseUserObject hipGraphReleaseUserObject
#define cudaGraphRetainUserObject hipGraphRetainUserObject
#define cudaUserObjectCreate hipUserObjectCreate
#define cudaUserObjectRelease hipUserObjectRelease
#define cudaUserObjectRetain hipUserObjectRetain
#endif

#else /* CUDA */
#include <cuda_runtime.h>
#define GPURT_NAME "CUDA"
#define GPURT_PREFIX "cuda"
#define GPURT_USER_OBJECTS 1
#define GPURT_MEMORY_TYPE(attr) ((attr).type)
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if LOOM_HIP
/* HIP 5.2's header declares hipLaunchHostFunc, but its library does not
 * export it: a stream callback runs fn instead, once the stream reaches
 * it (failed or not, as HIP calls callbacks). */
struct gpurt_host_call {
  void (*fn)(void *);
  void *arg;
};

static inline void gpurt_host_call_run(hipStream_t stream, hipError_t status, void *p) {
  struct gpurt_host_call c = *(struct gpurt_host_call *)p;
  free(p);
  (void)stream;
  (void)status;
  c.fn(c.arg);
}

static inline hipError_t gpurt_launch_host_func(hipStream_t stream, void (*fn)(void *), void *arg) {
  struct gpurt_host_call *c = (struct gpurt_host_call *)malloc(sizeof *c);
  if (!c)
    return hipErrorOutOfMemory;
  c->fn = fn;
  c->arg = arg;
  hipError_t e = hipStreamAddCallback(stream, gpurt_host_call_run, c, 0);
  if (e != hipSuccess)
    free(c);
  return e;
}
#endif

/* A call named in a sentence the runtime's way: "cudaMalloc" reads
 * "hipMalloc" in the HIP build, so that a user looks up the right call. */
static inline const char *gpurt_call(const char *what, char *buf, size_t len) {
#if LOOM_HIP
  if (strncmp(what, "cuda", 4) == 0) {
    snprintf(buf, len, "hip%s", what + 4);
    return buf;
  }
#endif
  (void)buf;
  (void)len;
  return what;
}

#endif
