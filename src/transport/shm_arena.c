/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "misc/utils.h"
#include "transport/shm_arena.h"
#include "transport/shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARENA_MAGIC 0x4c6f6f6d4172656eull /* "LoomAren" */

_Static_assert(sizeof(struct arena_rank) % 64 == 0, "a rank's part is whole cache lines");
_Static_assert(offsetof(struct arena_head, total) % 64 == 0, "the count has a line of its own");
_Static_assert(offsetof(struct arena_head, gen) % 64 == 0, "the generation has a line of its own");
_Static_assert(offsetof(struct arena_head, posted) % 64 == 0, "the posted count has a line of its own");
_Static_assert(sizeof(struct arena_cpu) == 128 && offsetof(struct arena_cpu, ready) == 64,
               "a CPU's two counters have a line each");
_Static_assert(sizeof(struct arena_call) == 64 && offsetof(struct arena_rank, call) % 64 == 0,
               "a call's header has a line of its own");
_Static_assert(sizeof(struct arena_slot) % 64 == 0 && offsetof(struct arena_rank, slot) % 64 == 0,
               "slots are whole cache lines");
_Static_assert(sizeof(struct slot_hdr) + 8 <= 40, "a slot's flag, header and first data share its first line");

/* Each rank's region per buffer: a round of a flat call moves at most
 * this much per rank. Up to 1 MiB, and at most 8 MiB for all regions of
 * both buffers, so that a communicator of many ranks reserves little
 * (the segment's pages are reserved at creation). */
static size_t region_bytes(int n) {
  size_t r = ((size_t)8 << 20) / (2 * (size_t)n);
  r = LOOM_MIN(r, (size_t)1 << 20);
  r = LOOM_MAX(r, (size_t)64 << 10);
  return r & ~(size_t)4095;
}

static size_t ranks_offset(void) { return (sizeof(struct arena_head) + 63) & ~(size_t)63; }

static size_t data_offset(int n) {
  return (ranks_offset() + (size_t)n * sizeof(struct arena_rank) + 4095) & ~(size_t)4095;
}

/* What each rank says at setup: whether it wants the arena, and (rank 0)
 * where the segment is. */
struct arena_rec {
  int32_t want, ok, fd, by_cpu;
  uint64_t size, dev, ino;
};

static void attach(struct shm_arena *a, void *map, size_t size, int n, int me) {
  a->head = map;
  a->ranks = (struct arena_rank *)((char *)map + ranks_offset());
  a->data = (char *)map + data_offset(n);
  a->map_size = size;
  a->region = region_bytes(n);
  a->nranks = n;
  a->me = me;
}

/* A flat call's round per CPU by CPU: the sum and result of 256 KiB
 * measured faster at 8 ranks on 2 CPUs than 64 KiB, 128 KiB or 1 MiB
 * (perf/README.md). */
#define CPU_ROUND ((size_t)256 << 10)

/* Flat by CPU where every rank is pinned to one CPU, at most
 * ARENA_MAX_CPUS of them, each with two ranks or more: from the
 * affinities every rank has of every rank, so all decide alike. */
static void cpu_groups(struct shm_arena *a, const struct ncclComm *comm) {
  int n = a->nranks, ncpus = 0, of[ARENA_MAX_RANKS], count[ARENA_MAX_CPUS] = {0}, first[ARENA_MAX_CPUS];
  for (int r = 0; r < n; r++) {
    const struct place_cpus *c = &comm->peers[r].cpus;
    if (place_cpu_count(c) != 1)
      return;
    int k = 0;
    while (k < ncpus && memcmp(c, &comm->peers[first[k]].cpus, sizeof *c) != 0)
      k++;
    if (k == ncpus) {
      if (ncpus == ARENA_MAX_CPUS)
        return;
      first[ncpus++] = r;
    }
    of[r] = k;
    count[k]++;
  }
  for (int k = 0; k < ncpus; k++)
    if (count[k] < 2)
      return;
  int me = a->me;
  memcpy(a->cpu_of, of, (size_t)n * sizeof of[0]);
  a->cpu = of[me];
  a->cpu_ranks = count[of[me]];
  a->cpu_leader = first[of[me]];
  a->cpu_prev = -1;
  a->cpu_pos = 0;
  for (int r = 0; r < me; r++)
    if (of[r] == of[me]) {
      a->cpu_prev = r;
      a->cpu_pos++;
    }
  /* A sum and a result per CPU in each buffer's regions. */
  size_t room = (size_t)n * a->region / (2 * (size_t)ncpus);
  a->cpu_round = LOOM_MIN(CPU_ROUND, room) & ~(size_t)4095;
  a->ncpus = ncpus;
  INFO(LOG_SHM, "rank %d: flat AllReduces go by CPU: %d ranks pinned to %d CPUs, this rank %d of %d on its CPU "
       "(rank %d leads it), rounds of %zu bytes", me, n, ncpus, a->cpu_pos + 1, a->cpu_ranks, a->cpu_leader,
       a->cpu_round);
}

static int same_file(int fd, const void *arg) {
  const struct arena_rec *r = arg;
  struct stat st;
  return fstat(fd, &st) == 0 && (uint64_t)st.st_dev == r->dev && (uint64_t)st.st_ino == r->ino &&
         (uint64_t)st.st_size == r->size;
}

/* Rank 0's segment, mapped here: the mapping, or NULL with `why`. */
static void *map_owner(struct ncclComm *comm, const struct arena_rec *o, char *why, size_t len) {
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[0];
  int fd = -1, e1, e2, own = p->proc_id == me->proc_id;
  if (own) {
    /* A thread of the owner's process: its descriptor is ours. */
    fd = o->fd;
    if (!same_file(fd, o)) {
      snprintf(why, len, "descriptor %d of this process is not rank 0's segment", o->fd);
      return NULL;
    }
  } else if (p->pid_ns != me->pid_ns) {
    snprintf(why, len, "rank 0 runs in another pid namespace");
    return NULL;
  } else {
    int pidfd = comm->peer_pidfd && param_int(P_SHM_PIDFD_GETFD) ? comm->peer_pidfd[0] : -1;
    if (shm_seg_take(pidfd, p->pid, o->fd, same_file, o, &fd, &e1, &e2) != 0) {
      snprintf(why, len, "cannot take rank 0's segment from its process (pid %d): pidfd_getfd: %s; /proc: %s",
               p->pid, e1 == ESTALE ? "another file" : strerror(e1), e2 == ESTALE ? "another file" : strerror(e2));
      return NULL;
    }
  }
  void *m = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  if (!own)
    close(fd);
  if (m == MAP_FAILED) {
    snprintf(why, len, "cannot map rank 0's segment (%llu bytes): %s", (unsigned long long)o->size, strerror(e));
    return NULL;
  }
  const struct arena_head *h = m;
  if (h->magic != ARENA_MAGIC || h->nranks != (uint32_t)comm->nranks) {
    munmap(m, o->size);
    snprintf(why, len, "rank 0's segment is not this communicator's arena");
    return NULL;
  }
  return m;
}

ncclResult_t arena_setup(struct ncclComm *comm) {
  int n = comm->nranks, me = comm->rank;
  /* Decided from what every rank knows alike, so that all of them or
   * none take part in the all-gathers below. */
  if (!comm->is_host || n < 2 || n > ARENA_MAX_RANKS || comm->nhosts != 1)
    return ncclSuccess;
  for (int r = 0; r < n; r++)
    if (comm->peers[r].shm_disabled)
      return ncclSuccess;
  struct arena_rec *recs;
  CHECK(UTIL_CALLOC(&recs, (size_t)n, "the arena's setup"));
  struct arena_rec *mine = &recs[me];
  mine->want = param_int(P_SHM_FLAT) != 0;
  mine->by_cpu = param_int(P_FLAT_BY_CPU) != 0;
  mine->fd = -1;
  size_t size = data_offset(n) + 2 * (size_t)n * region_bytes(n);
  void *map = NULL;
  char why[320] = "";
  if (me == 0 && mine->want) {
    int fd = -1;
    struct stat st;
    if (shm_seg_create(size, 0, &fd) != ncclSuccess) {
      snprintf(why, sizeof why, "%s", err_thread_last());
    } else if ((map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      snprintf(why, sizeof why, "cannot map %zu bytes: %s", size, strerror(errno));
      map = NULL;
    } else if (fstat(fd, &st) != 0) {
      snprintf(why, sizeof why, "fstat: %s", strerror(errno));
    } else {
      struct arena_head *h = map;
      h->nranks = (uint32_t)n;
      h->region = region_bytes(n);
      h->magic = ARENA_MAGIC;
      *mine = (struct arena_rec){.want = 1, .ok = 1, .fd = fd, .by_cpu = mine->by_cpu, .size = size,
                                 .dev = st.st_dev, .ino = st.st_ino};
    }
    if (!mine->ok) {
      if (map)
        munmap(map, size);
      map = NULL;
      if (fd >= 0)
        close(fd);
    }
  }
  ncclResult_t r = bootstrap_allgather(comm->boot, recs, sizeof *recs);
  int all = r == ncclSuccess && recs[0].ok;
  for (int q = 0; q < n && all; q++)
    all = recs[q].want;
  if (all && me != 0) {
    map = map_owner(comm, &recs[0], why, sizeof why);
    mine->ok = map != NULL;
  }
  /* Rank 0 keeps its descriptor open until every rank has mapped. */
  int agreed = 0;
  if (all) {
    r = bootstrap_allgather(comm->boot, recs, sizeof *recs);
    agreed = r == ncclSuccess;
    for (int q = 0; q < n && agreed; q++)
      agreed = recs[q].ok;
  }
  if (me == 0 && recs[0].fd >= 0)
    close(recs[0].fd);
  if (agreed) {
    struct shm_arena *a = calloc(1, sizeof *a);
    if (a && (!(a->peer_src = calloc((size_t)n, sizeof *a->peer_src)) ||
              !(a->peer_dst = calloc((size_t)n, sizeof *a->peer_dst)))) {
      free(a->peer_src);
      free(a);
      a = NULL;
    }
    if (a) {
      attach(a, map, recs[0].size, n, me);
      int by_cpu = 1;
      for (int q = 0; q < n; q++)
        by_cpu &= recs[q].by_cpu != 0;
      if (by_cpu)
        cpu_groups(a, comm);
      comm->arena = a;
      INFO(LOG_SHM, "rank %d: the %d ranks share an arena of %zu bytes (%zu per rank and buffer) for flat "
           "collectives", me, n, a->map_size, a->region);
    } else {
      /* Too late to tell the others: a later flat call fails loudly
       * instead of hanging (plan.c refuses it without an arena). */
      munmap(map, recs[0].size);
      r = err_set(ncclSystemError, "out of memory for the arena's state");
    }
  } else {
    if (map)
      munmap(map, size);
    if (why[0])
      INFO(LOG_SHM, "rank %d: no arena for flat collectives: %s", me, why);
    else if (r == ncclSuccess && me == 0)
      INFO(LOG_SHM, "rank %d: no arena for flat collectives (LOOM_SHM_FLAT=0, or a rank could not map it)", me);
  }
  free(recs);
  return r;
}

void arena_free(struct ncclComm *comm) {
  struct shm_arena *a = comm->arena;
  if (!a)
    return;
  munmap(a->head, a->map_size);
  free(a->peer_src);
  free(a->peer_dst);
  free(a);
  comm->arena = NULL;
}

void arena_poison(struct ncclComm *comm, const char *why) {
  struct shm_arena *a = comm->arena;
  if (!a)
    return;
  int32_t none = 0;
  /* The sentence before the word: a rank that sees `failed` reads `why`
   * at once, and one that saw it empty would lose the first cause. */
  if (atomic_compare_exchange_strong(&a->head->claimed, &none, comm->rank + 1)) {
    snprintf(a->head->why, sizeof a->head->why, "%s", why ? why : "");
    atomic_store(&a->head->failed, comm->rank + 1);
    /* Moving nothing: sleepers wake and read failed. */
    util_futex_wake_all(util_low_word(&a->head->gen));
    util_futex_wake_all(util_low_word(&a->head->posted));
    for (int k = 0; k < ARENA_MAX_CPUS; k++) {
      util_futex_wake_all(util_low_word(&a->head->cpu[k].added));
      util_futex_wake_all(util_low_word(&a->head->cpu[k].ready));
    }
  }
}

void arena_cpu_move(_Atomic uint64_t *counter, _Atomic uint32_t *sleepers) {
  /* As arena_arrive: the move, then the count of sleepers (both
   * sequentially consistent), against a sleeper's count, then its read. */
  atomic_fetch_add(counter, 1);
  if (atomic_load(sleepers))
    util_futex_wake_all(util_low_word(counter));
}

uint64_t arena_arrive(struct shm_arena *a) {
  uint64_t b = a->bar++;
  atomic_store_explicit(&a->ranks[a->me].arrived, b + 1, memory_order_release);
  /* The count's read-modify-writes chain every rank's writes to the
   * last one's, whose store of the generation releases them all. */
  uint64_t t = atomic_fetch_add(&a->head->total, 1) + 1;
  if (t == (b + 1) * (uint64_t)a->nranks) {
    atomic_store(&a->head->gen, b + 1);
    if (atomic_load(&a->head->sleepers))
      util_futex_wake_all(util_low_word(&a->head->gen));
  }
  return b;
}

void arena_post(struct shm_arena *a, uint64_t use) {
  arena_hdr_end(&a->ranks[a->me].slot[use & 1].flag, use);
  /* Every post moves the count, so that a rank that read it before
   * finding a slot missing sleeps only while none was posted since. */
  atomic_fetch_add(&a->head->posted, 1);
  if (atomic_load(&a->head->posted_sleepers))
    util_futex_wake_all(util_low_word(&a->head->posted));
}

ncclResult_t arena_failed(struct ncclComm *comm) {
  struct shm_arena *a = comm->arena;
  int32_t f = atomic_load(&a->head->failed);
  if (f <= 0 || f - 1 == comm->rank)
    return ncclSuccess;
  const char *why = a->head->why;
  if (why[0])
    return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation (its error: %.1000s)", f - 1,
                   comm->peers[f - 1].hostname, why);
  char note[512];
  comm_note_exited(comm, -1, note, sizeof note);
  return err_set(ncclRemoteError, "rank %d (%s) failed and abandoned the operation%s", f - 1,
                 comm->peers[f - 1].hostname, note);
}
