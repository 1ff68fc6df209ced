/*
 * Communicator slots. The allocator would hand a destroyed communicator's
 * address to the next one, and a user still holding the old handle would
 * then run collectives on, or destroy, a communicator that is not theirs.
 * Here addresses are never reused: slots come from mappings of growing
 * size, taken in order; a freed slot's pages go back to the kernel
 * (MADV_DONTNEED) but stay mapped, reading as zeros.
 *
 * The price is address space, not memory: one slot (the communicator's
 * size rounded up to pages, two pages today) per communicator the process
 * ever made. A process that makes a million spends 8 GiB of reserved
 * address space on them, which counts against `ulimit -v`.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm_slots.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define SLOTS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOTS_LSAN 1
#endif
#endif
#ifdef SLOTS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

/* The first mapping holds 16 slots and each next one twice as many, so a
 * lookup scans a handful of ranges: 40 cover more slots than any address
 * space. */
#define SLOTS_FIRST 16
#define SLOTS_MAX_CHUNKS 40

struct slot_chunk {
  char *base;
  size_t nslots;
  _Atomic unsigned char *live; /* one byte per slot */
};

static struct slot_chunk chunks[SLOTS_MAX_CHUNKS];
static _Atomic int nchunks;        /* chunks[0..nchunks) are published */
static size_t slot_bytes;          /* fixed by the first allocation */
static size_t next_slot;           /* in the newest chunk */
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t chunk_add(void) {
  int n = atomic_load_explicit(&nchunks, memory_order_relaxed);
  if (n == SLOTS_MAX_CHUNKS)
    return err_set(ncclSystemError, "no address space left for another communicator");
  size_t nslots = (size_t)SLOTS_FIRST << n;
  void *base = mmap(NULL, nslots * slot_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  if (base == MAP_FAILED)
    return err_set(ncclSystemError, "cannot reserve %zu bytes of address space for communicators: %s",
                   nslots * slot_bytes, strerror(errno));
  _Atomic unsigned char *live = calloc(nslots, sizeof *live);
  if (!live) {
    munmap(base, nslots * slot_bytes);
    return err_set(ncclSystemError, "out of memory for the communicator slots");
  }
#ifdef SLOTS_LSAN
  /* Communicators hold the only pointers to their heap blocks. */
  __lsan_register_root_region(base, nslots * slot_bytes);
#endif
  chunks[n] = (struct slot_chunk){.base = base, .nslots = nslots, .live = live};
  next_slot = 0;
  atomic_store_explicit(&nchunks, n + 1, memory_order_release);
  return ncclSuccess;
}

ncclResult_t comm_slot_alloc(size_t size, void **out) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&slots_lock);
  if (slot_bytes == 0) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    slot_bytes = LOOM_ALIGN_UP(size, page);
  }
  if (size > slot_bytes) {
    r = err_set(ncclInternalError, "a communicator slot of %zu bytes was asked for; slots have %zu", size, slot_bytes);
  } else {
    int n = atomic_load_explicit(&nchunks, memory_order_relaxed);
    if (n == 0 || next_slot == chunks[n - 1].nslots) {
      r = chunk_add();
      n++;
    }
    if (r == ncclSuccess) {
      struct slot_chunk *c = &chunks[n - 1];
      *out = c->base + next_slot * slot_bytes;
      atomic_store_explicit(&c->live[next_slot], 1, memory_order_release);
      next_slot++;
    }
  }
  pthread_mutex_unlock(&slots_lock);
  return r;
}

/* The chunk and slot index of `p`, or -1: only addresses are compared, so
 * any pointer may be asked about. */
static int slot_find(const void *p, size_t *index) {
  uintptr_t a = (uintptr_t)p;
  int n = atomic_load_explicit(&nchunks, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    uintptr_t base = (uintptr_t)chunks[i].base;
    if (a < base || a - base >= chunks[i].nslots * slot_bytes)
      continue;
    if ((a - base) % slot_bytes != 0)
      return -1;
    *index = (a - base) / slot_bytes;
    return i;
  }
  return -1;
}

int comm_slot_live(const void *p) {
  size_t i;
  int c = slot_find(p, &i);
  return c >= 0 && atomic_load_explicit(&chunks[c].live[i], memory_order_acquire);
}

void comm_slot_free(void *p) {
  size_t i;
  int c = p ? slot_find(p, &i) : -1;
  if (c < 0)
    return;
  atomic_store_explicit(&chunks[c].live[i], 0, memory_order_release);
  /* Zero pages from now on: whatever reads through a stale handle finds
   * no communicator's magic. */
  if (madvise(p, slot_bytes, MADV_DONTNEED) != 0)
    memset(p, 0, slot_bytes);
}
