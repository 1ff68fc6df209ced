/* SPDX-License-Identifier: Apache-2.0 */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if LOOM_PERF_CUDA
#include "misc/gpurt.h"

static int report(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  fprintf(stderr, "%s failed: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

int perf_gpus(void) {
  const char *d = getenv("LOOM_DEVICE");
  if (d && strcasecmp(d, "host") == 0)
    return 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int perf_set_device(int dev, const char *what) { return report(cudaSetDevice(dev), what); }

int perf_dev_alloc(void **p, size_t bytes, const char *what) {
  if (report(cudaMalloc(p, bytes), what))
    return 1;
  return report(cudaMemset(*p, 0, bytes), what);
}

void perf_dev_free(void *p) {
  if (p)
    cudaFree(p);
}

int perf_copy_to_dev(void *dev, const void *host, size_t bytes, void *stream) {
  if (report(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream), "copying to the GPU"))
    return 1;
  return report(cudaStreamSynchronize((cudaStream_t)stream), "copying to the GPU");
}

int perf_copy_to_host(void *host, const void *dev, size_t bytes, void *stream) {
  if (report(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream), "copying from the GPU"))
    return 1;
  return report(cudaStreamSynchronize((cudaStream_t)stream), "copying from the GPU");
}

int perf_stream_create(void **stream) {
  cudaStream_t s;
  if (report(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"))
    return 1;
  *stream = s;
  return 0;
}

void perf_stream_destroy(void *stream) {
  if (stream)
    cudaStreamDestroy((cudaStream_t)stream);
}

int perf_stream_sync(void *stream, const char *what) {
  return report(cudaStreamSynchronize((cudaStream_t)stream), what);
}

const char *perf_device_name(int dev, char *buf, size_t len) {
  struct cudaDeviceProp p;
  char bus[32] = "?";
  if (cudaGetDeviceProperties(&p, dev) == cudaSuccess)
    snprintf(buf, len, "[%04x:%02x:%02x.0] %s", p.pciDomainID, p.pciBusID, p.pciDeviceID, p.name);
  else
    snprintf(buf, len, "[%s] unknown", bus);
  return buf;
}

#else

int perf_gpus(void) { return 0; }
int perf_set_device(int dev, const char *what) { return 1; }
int perf_dev_alloc(void **p, size_t bytes, const char *what) { return 1; }
void perf_dev_free(void *p) {}
int perf_copy_to_dev(void *dev, const void *host, size_t bytes, void *stream) { return 1; }
int perf_copy_to_host(void *host, const void *dev, size_t bytes, void *stream) { return 1; }
int perf_stream_create(void **stream) { return 1; }
void perf_stream_destroy(void *stream) {}
int perf_stream_sync(void *stream, const char *what) { return 0; }
const char *perf_device_name(int dev, char *buf, size_t len) {
  snprintf(buf, len, "none");
  return buf;
}

#endif
