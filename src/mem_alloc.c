/*
 * ncclMemAlloc and ncclMemFree: device memory where this thread would
 * make a CUDA communicator, host memory (a shared memfd where it can be
 * made) where it would make a host one; windows (comm_mem.c) ask which
 * allocation a buffer lies in (rma.h).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "rma.h"
#include "transport/shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- ncclMemAlloc ----
 * Device memory (cudaMalloc, which CUDA IPC can share and a CUDA
 * communicator can register) where this thread would make a CUDA
 * communicator; host memory where it would make a host one: a sealed
 * memfd mapped shared, page-aligned, or plain memory where memfds cannot
 * be made. The allocations are remembered, so that ncclMemFree frees
 * each the way it was made and refuses a pointer that is not one, and a
 * window knows whether peers can map it. */
struct mem_block {
  void *ptr;
  size_t size;
  int device; /* -1: host memory */
  int fd;     /* the memfd of host memory; -1: plain memory */
};
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mem_block *mem_blocks;
static size_t mem_count, mem_cap;

static ncclResult_t mem_remember(struct mem_block b) {
  pthread_mutex_lock(&mem_lock);
  if (mem_count == mem_cap) {
    size_t cap = mem_cap ? 2 * mem_cap : 16;
    struct mem_block *nb = realloc(mem_blocks, cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&mem_lock);
      return err_set(ncclSystemError, "ncclMemAlloc: out of memory recording an allocation");
    }
    mem_blocks = nb;
    mem_cap = cap;
  }
  mem_blocks[mem_count++] = b;
  pthread_mutex_unlock(&mem_lock);
  return ncclSuccess;
}

/* The record of `ptr`, removed; .device -2 if ncclMemAlloc did not
 * return it. */
static struct mem_block mem_forget(void *ptr) {
  struct mem_block b = {.device = -2, .fd = -1};
  pthread_mutex_lock(&mem_lock);
  for (size_t i = 0; i < mem_count; i++)
    if (mem_blocks[i].ptr == ptr) {
      b = mem_blocks[i];
      mem_blocks[i] = mem_blocks[--mem_count];
      break;
    }
  pthread_mutex_unlock(&mem_lock);
  return b;
}

/* The shared host allocation [p, p + size) lies in: 1 with its memfd
 * and the offset, else 0. */
int mem_find_shared(const void *p, size_t size, int *fd, size_t *offset, size_t *seg_size) {
  int found = 0;
  pthread_mutex_lock(&mem_lock);
  for (size_t i = 0; i < mem_count && !found; i++) {
    const struct mem_block *b = &mem_blocks[i];
    const char *base = b->ptr;
    if (b->device == -1 && b->fd >= 0 && (const char *)p >= base && (size_t)((const char *)p - base) < b->size &&
        size <= b->size - (size_t)((const char *)p - base)) {
      *fd = b->fd;
      *offset = (size_t)((const char *)p - base);
      *seg_size = b->size;
      found = 1;
    }
  }
  pthread_mutex_unlock(&mem_lock);
  return found;
}

/* The device allocation [p, p + size) lies in: 1 with its start and the
 * offset, else 0. */
int mem_find_device(const void *p, size_t size, void **base, size_t *offset) {
  int found = 0;
  pthread_mutex_lock(&mem_lock);
  for (size_t i = 0; i < mem_count && !found; i++) {
    const struct mem_block *b = &mem_blocks[i];
    const char *start = b->ptr;
    if (b->device >= 0 && (const char *)p >= start && (size_t)((const char *)p - start) < b->size &&
        size <= b->size - (size_t)((const char *)p - start)) {
      *base = b->ptr;
      *offset = (size_t)((const char *)p - start);
      found = 1;
    }
  }
  pthread_mutex_unlock(&mem_lock);
  return found;
}

/* A sealed memfd of `len` bytes, its pages reserved (a shortage is an
 * error here, not a SIGBUS later): the descriptor, or -1 with errno. */
int mem_shared_segment(size_t len) {
  int fd = memfd_create("loom-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -1;
  int e = posix_fallocate(fd, 0, (off_t)len);
  if (e == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    e = errno;
  if (e != 0) {
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

size_t mem_page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (n + pg - 1) / pg * pg;
}

static ncclResult_t host_alloc(size_t size, struct mem_block *b) {
  size_t len = mem_page_round(size);
  if (len < size)
    return err_set(ncclInvalidArgument, "ncclMemAlloc: size %zu is too large", size);
  int fd = mem_shared_segment(len);
  if (fd >= 0) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      *b = (struct mem_block){.ptr = p, .size = len, .device = -1, .fd = fd};
      return ncclSuccess;
    }
    int e = errno;
    close(fd);
    errno = e;
  }
  if (errno == ENOMEM || errno == ENOSPC)
    return err_set(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of shared host memory: %s", size,
                   strerror(errno));
  /* No memfds here (an old kernel, a seccomp filter): plain memory, which
   * a window's peers in other processes cannot map. */
  INFO(LOG_INIT, "ncclMemAlloc: no shared memory (%s): plain host memory, which other processes cannot map",
       strerror(errno));
  void *p = NULL;
  if (posix_memalign(&p, 4096, size) != 0)
    return err_set(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory", size);
  *b = (struct mem_block){.ptr = p, .size = size, .device = -1, .fd = -1};
  return ncclSuccess;
}

static void block_free(const struct mem_block *b) {
  if (b->device >= 0) {
    int saved = cuda_current_device();
    cuda_set_device(b->device);
    cuda_free(b->ptr);
    cuda_restore_device(saved);
  } else if (b->fd >= 0) {
    munmap(b->ptr, b->size);
    close(b->fd);
  } else {
    free(b->ptr);
  }
}

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size) {
  if (ptr == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL"));
  *ptr = NULL;
  if (size == 0)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclMemAlloc: size is 0"));
  int device = cuda_pick_device();
  struct mem_block b = {.size = size, .device = device, .fd = -1};
  ncclResult_t r;
  if (device >= 0) {
    r = cuda_malloc(&b.ptr, size, "ncclMemAlloc");
    if (r != ncclSuccess)
      err_context("ncclMemAlloc on device %d", device);
  } else {
    r = host_alloc(size, &b);
  }
  if (r == ncclSuccess && (r = mem_remember(b)) != ncclSuccess)
    block_free(&b);
  if (r == ncclSuccess)
    *ptr = b.ptr;
  return api_finish(NULL, r);
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr) {
  if (ptr == NULL)
    return ncclSuccess;
  struct mem_block b = mem_forget(ptr);
  if (b.device == -2)
    return api_finish(NULL, err_set(ncclInvalidArgument,
                                    "ncclMemFree: %p was not returned by ncclMemAlloc (or was freed already); "
                                    "nothing was freed",
                                    ptr));
  block_free(&b);
  return ncclSuccess;
}
