/*
 * Protection domains and memory regions of the verbs test double. Each PD
 * is a table in shared memory, so that a peer checks an rkey against the
 * table of the PD its destination QP belongs to, as an HCA does. Keys are
 * slot << 8 | an 8-bit generation, lkey == rkey as on mlx5. An MR is host
 * memory, or CUDA device memory (a device pointer given to ibv_reg_mr, as
 * nvidia-peermem allows, or a dma-buf over device memory), which peers
 * reach through the CUDA driver instead (vd_cuda.c).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vd_internal.h"

VD_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
  if (!context) {
    errno = EINVAL;
    return NULL;
  }
  struct vd_pd *p = calloc(1, sizeof(*p));
  if (!p)
    return NULL;
  uint32_t id;
  p->shm = vd_shm_create(VD_KIND_PD, 1, VD_NUM_MAX, sizeof(struct vd_pd_shm), &id);
  if (!p->shm) {
    int e = errno;
    free(p);
    errno = e;
    return NULL;
  }
  p->shm->id = id;
  p->shm->nslots = VD_MR_SLOTS;
  p->ctx = (struct vd_context *)context;
  p->pd.context = context;
  p->pd.handle = id;
  /* Generations start from the PD's id so that a key of one PD rarely
   * passes as a key of another. */
  memset(p->gen, (int)(id & 0xff), sizeof(p->gen));
  pthread_mutex_init(&p->lock, NULL);
  return &p->pd;
}

VD_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
  struct vd_pd *p = (struct vd_pd *)pd;
  if (!p)
    return EINVAL;
  if (p->nmr || atomic_load(&p->nqp))
    return EBUSY;
  vd_shm_destroy(VD_KIND_PD, p->shm->id, p->shm, sizeof(struct vd_pd_shm));
  pthread_mutex_destroy(&p->lock);
  free(p);
  return 0;
}

int vd_range_mapped(uint64_t addr, uint64_t len) {
  if (len == 0)
    return 1;
  if (addr + len < addr)
    return 0;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t start = addr & ~(page - 1), end = addr + len;
  unsigned char vec[4096];
  /* mincore fails with ENOMEM on any unmapped page: what pinning the
   * range would fail on in a real ibv_reg_mr. */
  while (start < end) {
    uint64_t chunk = end - start;
    if (chunk > page * sizeof(vec))
      chunk = page * sizeof(vec);
    if (mincore((void *)(uintptr_t)start, chunk, vec) != 0)
      return 0;
    start += chunk;
  }
  return 1;
}

/* Access bits this double honours; those in the optional range (relaxed
 * ordering and its kin) are hints a device may ignore, as verbs allows. */
#define VD_ACCESS_KNOWN                                                                    \
  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |             \
   IBV_ACCESS_REMOTE_ATOMIC)

/* Checks the access flags as verbs does; 0 or an errno. */
static int vd_access_check(unsigned access) {
  unsigned a = access & ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
  if (a & ~(unsigned)VD_ACCESS_KNOWN & ~(unsigned)(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED |
                                                 IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB))
    return EINVAL;
  if (a & ~(unsigned)VD_ACCESS_KNOWN)
    return EOPNOTSUPP; /* no ODP, zero-based MRs or memory windows here */
  /* Remote write or atomic access needs local write, as in verbs. */
  if ((a & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(a & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}

/* Publishes an MR of `pd`: [iova, iova+length) stands for `vaddr` in this
 * process, of memory `mem`. */
static struct ibv_mr *vd_mr_add(struct ibv_pd *pd, void *vaddr, size_t length, uint64_t iova, unsigned access,
                                const struct vd_mem *mem) {
  struct vd_pd *p = (struct vd_pd *)pd;
  unsigned a = access & ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
  struct vd_mr *m = calloc(1, sizeof(*m));
  if (!m)
    return NULL;
  pthread_mutex_lock(&p->lock);
  uint32_t slot = VD_MR_SLOTS;
  for (uint32_t i = 0; i < VD_MR_SLOTS; i++) {
    uint32_t s = (p->hint + i) % VD_MR_SLOTS;
    if (atomic_load_explicit(&p->shm->slot[s].key, memory_order_relaxed) == 0) {
      slot = s;
      break;
    }
  }
  if (slot == VD_MR_SLOTS) {
    pthread_mutex_unlock(&p->lock);
    free(m);
    errno = ENOMEM;
    return NULL;
  }
  p->hint = slot + 1;
  if (++p->gen[slot] == 0)
    p->gen[slot] = 1;
  uint32_t key = slot << 8 | p->gen[slot];
  struct vd_mr_slot *sl = &p->shm->slot[slot];
  /* Seqlock order: the fields, then the key that makes them valid. */
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&sl->access, a, memory_order_relaxed);
  atomic_store_explicit(&sl->iova, iova, memory_order_relaxed);
  atomic_store_explicit(&sl->length, length, memory_order_relaxed);
  atomic_store_explicit(&sl->vaddr, (uintptr_t)vaddr, memory_order_relaxed);
  sl->mem = *mem;
  atomic_store_explicit(&sl->key, key, memory_order_release);
  p->nmr++;
  pthread_mutex_unlock(&p->lock);
  m->pd = p;
  m->slot = slot;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = vaddr;
  m->mr.length = length;
  m->mr.handle = key;
  m->mr.lkey = key;
  m->mr.rkey = key;
  return &m->mr;
}

VD_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access) {
  int err = pd && length ? vd_access_check(access) : EINVAL;
  if (err) {
    errno = err;
    return NULL;
  }
  struct vd_mem mem = {.kind = VD_MEM_HOST};
  if (iova + length < iova) {
    errno = EFAULT;
    return NULL;
  }
  /* Memory the CPU cannot reach may be device memory, which a NIC with
   * nvidia-peermem registers by its pointer. */
  if (!vd_range_mapped((uintptr_t)addr, length) && vd_cuda_describe((uintptr_t)addr, length, &mem) != 1) {
    errno = EFAULT;
    return NULL;
  }
  return vd_mr_add(pd, addr, length, iova, access, &mem);
}

#undef ibv_reg_mr
VD_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

#undef ibv_reg_mr_iova
VD_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                         uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

/* A dma-buf: LOOM_VERBS_DOUBLE_DMABUF=0 makes this a NIC without dma-buf
 * support (EOPNOTSUPP, what NCCL's probe looks for). Otherwise the double
 * must reach the memory behind the fd as the process that moves the bytes
 * does: device memory of this process at `iova` (CUDA exports dma-bufs of
 * device memory, which a NIC then addresses by the iova given here, and
 * NCCL gives the device pointer), reached through CUDA; or a dma-buf it
 * can map, such as a memfd in the tests, mapped here and reached with
 * process_vm_writev like any host memory. */
VD_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                           uint64_t iova, int fd, int access) {
  const char *env = getenv("LOOM_VERBS_DOUBLE_DMABUF");
  if (env && strcmp(env, "0") == 0) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  int err = pd && length ? vd_access_check((unsigned)access) : EINVAL;
  if (!err && fcntl(fd, F_GETFD) < 0)
    err = EBADF;
  off_t size = err ? 0 : lseek(fd, 0, SEEK_END);
  if (!err && (size < 0 || offset + length < offset || offset + length > (uint64_t)size || iova + length < iova))
    err = EINVAL; /* the range lies outside the dma-buf */
  if (err) {
    errno = err;
    return NULL;
  }
  struct vd_mem mem = {.kind = VD_MEM_HOST};
  if (vd_cuda_describe(iova, length, &mem) == 1)
    return vd_mr_add(pd, (void *)(uintptr_t)iova, length, iova, (unsigned)access, &mem);
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), skip = offset % page;
  void *map = mmap(NULL, length + skip, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(offset - skip));
  if (map == MAP_FAILED) {
    vd_log("ibv_reg_dmabuf_mr: fd %d is not a dma-buf this double can reach (mmap: %s) and iova 0x%llx is no "
           "CUDA device memory of this process",
           fd, strerror(errno), (unsigned long long)iova);
    errno = EOPNOTSUPP;
    return NULL;
  }
  struct ibv_mr *mr = vd_mr_add(pd, (char *)map + skip, length, iova, (unsigned)access, &mem);
  if (!mr) {
    int e = errno;
    munmap(map, length + skip);
    errno = e;
    return NULL;
  }
  ((struct vd_mr *)mr)->map = map;
  ((struct vd_mr *)mr)->map_len = length + skip;
  /* The NIC addresses the memory by iova, whatever address the mapping
   * got in this process. */
  mr->addr = (void *)(uintptr_t)iova;
  return mr;
}

VD_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
  struct vd_mr *m = (struct vd_mr *)mr;
  if (!m)
    return EINVAL;
  struct vd_pd *p = m->pd;
  pthread_mutex_lock(&p->lock);
  atomic_store_explicit(&p->shm->slot[m->slot].key, 0, memory_order_release);
  p->nmr--;
  pthread_mutex_unlock(&p->lock);
  if (m->map)
    munmap(m->map, m->map_len);
  free(m);
  return 0;
}

int vd_mr_lookup(struct vd_pd_shm *t, uint32_t key, uint64_t addr, uint64_t len,
                 uint32_t access, uint64_t *vaddr, struct vd_mem *mem) {
  uint32_t slot = key >> 8;
  if (slot >= VD_MR_SLOTS || key == 0)
    return -1;
  struct vd_mr_slot *s = &t->slot[slot];
  if (atomic_load_explicit(&s->key, memory_order_acquire) != key)
    return -1;
  uint32_t a = atomic_load_explicit(&s->access, memory_order_relaxed);
  uint64_t iova = atomic_load_explicit(&s->iova, memory_order_relaxed);
  uint64_t length = atomic_load_explicit(&s->length, memory_order_relaxed);
  uint64_t base = atomic_load_explicit(&s->vaddr, memory_order_relaxed);
  if (mem)
    *mem = s->mem;
  atomic_thread_fence(memory_order_acquire);
  /* Deregistered or re-registered while we read: the fields may mix. */
  if (atomic_load_explicit(&s->key, memory_order_relaxed) != key)
    return -1;
  if ((a & access) != access)
    return -1;
  if (addr < iova || addr + len < addr || addr + len > iova + length)
    return -1;
  *vaddr = base + (addr - iova);
  return 0;
}
