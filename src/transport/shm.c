/*
 * Shared memory between processes of one host. The receiver creates a
 * segment holding the FIFO (control words and NCCL_STEPS slots); the sender
 * maps it and writes slots directly, so data crosses with one copy in and
 * one copy out, or (single copy, host ranks) a slot carries the address
 * of data the receiver reads from the sender's buffer itself. The name is
 * unlinked as soon as both sides have it mapped, so a crash leaves nothing
 * behind in /dev/shm.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm.h"
#include "misc/cudamem.h"
#include "misc/place.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

/* Counters on their own cache lines: the sender writes tail, the receiver
 * head, and neither should slow the other down. */
struct shm_ctrl {
  /* Each counter shares its line with the count of its sleepers: the
   * side that moves the counter reads that count right after. */
  _Atomic uint64_t tail;
  _Atomic uint32_t tail_sleepers;
  char pad0[LOOM_CACHE_LINE - sizeof(uint64_t) - sizeof(uint32_t)];
  _Atomic uint64_t head;
  _Atomic uint32_t head_sleepers;
  char pad1[LOOM_CACHE_LINE - sizeof(uint64_t) - sizeof(uint32_t)];
  _Atomic uint32_t failed[2]; /* indexed by the failing side's conn_dir */
  /* Why that side failed (its communicator's error), written before
   * failed[]: a rank that waits on a rank that gave up because a third
   * died learns of the third. Empty when it was aborted without an error. */
  char why[2][LOOM_ERR_LEN];
};

#define SHM_DATA_OFFSET 4096
_Static_assert(sizeof(struct shm_ctrl) <= SHM_DATA_OFFSET, "the control block overlaps the data");

struct shm_info {
  char name[64];
  uint64_t size;
  uint64_t capacity;
  uint64_t probe; /* an address in the receiver, to try a single-copy read on */
};

struct shm_priv {
  char name[64];
  void *map;
  size_t size;
  int linked;     /* this side must still unlink the name */
  void *dev_map;  /* the mapping as the GPU sees it (CUDA communicators) */
};

static int shm_can_connect(struct ncclComm *comm, int peer) {
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  return me->host_hash == p->host_hash && !me->shm_disabled && !p->shm_disabled;
}

/* On a CUDA communicator kernels read and write the segment directly:
 * device buffers cross through this pinned host memory. */
static ncclResult_t shm_attach(struct conn *c, struct shm_priv *sp, size_t capacity) {
  struct shm_ctrl *ctrl = sp->map;
  c->fifo.base = (char *)sp->map + SHM_DATA_OFFSET;
  c->fifo.capacity = capacity;
  c->fifo.stride = SLOT_HDR_BYTES + capacity;
  c->fifo.tail = &ctrl->tail;
  c->fifo.head = &ctrl->head;
  c->fifo.ref_pid = c->comm->peers[c->peer].pid;
  c->fifo.ref_local = c->fifo.ref_pid == (int)getpid();
  if (c->comm->is_host) {
    c->fifo.tail_sleepers = &ctrl->tail_sleepers;
    c->fifo.head_sleepers = &ctrl->head_sleepers;
    return ncclSuccess;
  }
  CHECK(cuda_host_register(sp->map, sp->size, &sp->dev_map, "a shared-memory FIFO"));
  char *d = sp->dev_map;
  c->dev.base = d + SHM_DATA_OFFSET;
  c->dev.tail = (uint64_t *)(d + offsetof(struct shm_ctrl, tail));
  c->dev.head = (uint64_t *)(d + offsetof(struct shm_ctrl, head));
  return ncclSuccess;
}

static ncclResult_t shm_setup(struct conn *c, void *info, size_t *len) {
  struct shm_priv *sp;
  CHECK(UTIL_CALLOC(&sp, 1, "shm connection"));
  c->priv = sp;
  if (c->dir == CONN_SEND) {
    *len = 0;
    return ncclSuccess;
  }
  static _Atomic unsigned counter;
  uint32_t rnd = 0;
  CHECK(util_random(&rnd, sizeof rnd));
  snprintf(sp->name, sizeof sp->name, "/loom-%d-%u-%08x", (int)getpid(), atomic_fetch_add(&counter, 1), rnd);
  size_t capacity = (c->comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  sp->size = SHM_DATA_OFFSET + NCCL_STEPS * (SLOT_HDR_BYTES + capacity);
  int fd = shm_open(sp->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return err_set(ncclSystemError, "shm_open(%s) failed: %s", sp->name, strerror(errno));
  sp->linked = 1;
  /* Reserving the pages now turns a too-small /dev/shm into an error
   * here instead of a SIGBUS in the middle of a collective. */
  int e = posix_fallocate(fd, 0, (off_t)sp->size);
  if (e != 0) {
    close(fd);
    return err_set(ncclSystemError,
                   "cannot allocate %zu bytes in /dev/shm for the connection from rank %d: %s%s", sp->size, c->peer,
                   strerror(e), e == ENOSPC ? " (/dev/shm is full or too small; containers need a larger --shm-size)" : "");
  }
  sp->map = mmap(NULL, sp->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (sp->map == MAP_FAILED) {
    sp->map = NULL;
    return err_set(ncclSystemError, "mmap of %zu bytes of shared memory failed: %s", sp->size, strerror(errno));
  }
  /* The receiver reads its FIFO most: its pages go on the receiver's
   * NUMA node. */
  place_memory(sp->map, sp->size, c->comm->peers[c->comm->rank].numa);
  memset(sp->map, 0, sizeof(struct shm_ctrl));
  CHECK(shm_attach(c, sp, capacity));
  struct shm_info *si = info;
  memset(si, 0, sizeof *si);
  snprintf(si->name, sizeof si->name, "%s", sp->name);
  si->size = sp->size;
  si->capacity = capacity;
  si->probe = (uint64_t)(uintptr_t)sp->map;
  *len = sizeof *si;
  return ncclSuccess;
}

/* Single copy needs the right to read the peer's memory (same user, and
 * no ptrace restriction such as Yama's scope 2 or a seccomp filter); the
 * sender tries it once, on the receiver's segment, and posts by reference
 * only where it works, saying why where it does not. */
static void shm_probe_single_copy(struct conn *c, uint64_t probe) {
  if (!c->fifo.ref_local && c->comm->single_copy_local)
    return;
  if (!c->fifo.ref_local) {
    uint64_t word;
    struct iovec local = {&word, sizeof word}, remote = {(void *)(uintptr_t)probe, sizeof word};
    if (process_vm_readv(c->fifo.ref_pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof word) {
      INFO(LOG_SHM, "single copy to rank %d is off: process_vm_readv from pid %d failed: %s", c->peer,
           c->fifo.ref_pid, strerror(errno));
      return;
    }
  }
  c->fifo.ref_min = c->comm->single_copy_min;
}

static ncclResult_t shm_connect(struct conn *c, const void *peer_info, size_t len) {
  struct shm_priv *sp = c->priv;
  if (c->dir == CONN_RECV)
    return ncclSuccess; /* the sender maps it; connection setup waits for its word */
  struct shm_info si;
  if (len != sizeof si)
    return err_set(ncclInternalError, "shm connection info from rank %d has %zu bytes, expected %zu", c->peer, len,
                   sizeof si);
  memcpy(&si, peer_info, sizeof si);
  si.name[sizeof si.name - 1] = '\0';
  int fd = shm_open(si.name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return err_set(ncclSystemError, "cannot open rank %d's shared memory %s: %s", c->peer, si.name, strerror(errno));
  sp->map = mmap(NULL, si.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (sp->map == MAP_FAILED) {
    sp->map = NULL;
    return err_set(ncclSystemError, "mmap of rank %d's shared memory failed: %s", c->peer, strerror(errno));
  }
  sp->size = si.size;
  /* The sender maps last, so it removes the name. */
  shm_unlink(si.name);
  CHECK(shm_attach(c, sp, si.capacity));
  if (c->comm->is_host && c->comm->single_copy_min > 0)
    shm_probe_single_copy(c, si.probe);
  return ncclSuccess;
}

static int shm_flushed(struct conn *c) { return 1; }

static ncclResult_t shm_check(struct conn *c) {
  struct shm_priv *sp = c->priv;
  struct shm_ctrl *ctrl = sp ? sp->map : NULL;
  if (ctrl && atomic_load(&ctrl->failed[!c->dir])) {
    const char *why = ctrl->why[!c->dir];
    if (memchr(why, '\0', LOOM_ERR_LEN) && why[0] != '\0')
      return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation (its error: %s)", c->peer,
                     c->comm->peers[c->peer].hostname, why);
    char note[512];
    transport_note_exited(c->comm, note, sizeof note);
    return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation%s", c->peer,
                   c->comm->peers[c->peer].hostname, note);
  }
  return transport_peer_alive(c->comm, c->peer);
}

static void shm_poison(struct conn *c) {
  struct shm_priv *sp = c->priv;
  struct shm_ctrl *ctrl = sp ? sp->map : NULL;
  if (!ctrl || atomic_load(&ctrl->failed[c->dir]))
    return;
  if (c->comm->async_error != ncclSuccess)
    snprintf(ctrl->why[c->dir], sizeof ctrl->why[c->dir], "%s", c->comm->last_error);
  atomic_store(&ctrl->failed[c->dir], 1);
}

static void shm_free(struct conn *c) {
  struct shm_priv *sp = c->priv;
  if (!sp)
    return;
  if (sp->dev_map)
    cuda_host_unregister(sp->map);
  if (sp->map)
    munmap(sp->map, sp->size);
  if (sp->linked && c->dir == CONN_RECV)
    shm_unlink(sp->name); /* unless the sender already did: ENOENT is fine */
  free(sp);
  c->priv = NULL;
}

const struct transport transport_shm = {
    .size = sizeof(struct transport),
    .version = TRANSPORT_VERSION,
    .name = "shm",
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .progress = NULL,
    .flushed = shm_flushed,
    .check = shm_check,
    .poison = shm_poison,
    .free = shm_free,
};
