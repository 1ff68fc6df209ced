/*
 * Where the benchmarks' buffers live: host memory for host communicators,
 * device memory for CUDA ones. Built without CUDA, there is never a GPU.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PERF_DEVICE_H
#define LOOM_PERF_DEVICE_H

#include <stddef.h>

/* How many GPUs the benchmarks may use: 0 without CUDA, without a driver,
 * or with LOOM_DEVICE=host. */
int perf_gpus(void);
/* On failure these print the CUDA error with `what` and return non-zero. */
int perf_set_device(int dev, const char *what);
int perf_dev_alloc(void **p, size_t bytes, const char *what);
void perf_dev_free(void *p);
int perf_copy_to_dev(void *dev, const void *host, size_t bytes, void *stream);
int perf_copy_to_host(void *host, const void *dev, size_t bytes, void *stream);
int perf_stream_create(void **stream);
void perf_stream_destroy(void *stream);
int perf_stream_sync(void *stream, const char *what);
const char *perf_device_name(int dev, char *buf, size_t len);

#endif
