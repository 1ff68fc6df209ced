/*
 * Soak: 10,000 mixed operations over 4 ranks (processes, shared memory):
 * AllReduce, AllGather, ReduceScatter, Broadcast, Reduce and groups of
 * Send/Recv between random pairs (self included), of random sizes (mostly
 * small, some up to 384 KiB per rank), every datatype, every reduction
 * (PreMulSum too), random roots, in place or not. Every rank draws the
 * same sequence from one seed, and checks every result against the value
 * it computes itself: the reductions' inputs are small integers (0 to 3;
 * 0 or 1 for the fp8 types) whose sums, products, averages and scalings
 * are exact in every type, so results must equal the reference bit for
 * bit; copies are random bytes.
 *
 * Then no leak. A warm-up communicator runs SOAK_WARM operations of the
 * same mix and is destroyed first, so that what a process allocates once
 * for good (the status page, libc's arenas and buffers, lazily loaded
 * code) is already there; the figures taken then are the baseline. The
 * soak communicator runs SOAK_OPS operations and is destroyed, and the
 * figures must come back to the baseline:
 * - open fds (/proc/self/fd) and threads (/proc/self/task): exactly;
 * - this process's segments in /dev/shm: none;
 * - mappings (/proc/self/maps lines): within MAPS_SLACK. A leaked
 *   connection or buffer of the library's is at least one mapping; libc
 *   may split or merge its heaps' mappings by a few;
 * - bytes malloc has handed out and not had back (mallinfo2 uordblks +
 *   hblkhd): within HEAP_SLACK (32 KiB). A leak of one allocation per
 *   operation would be at least 32 bytes (glibc's smallest chunk) x 10,000
 *   = 320 KB, ten times the slack. What the slack admits is glibc's: the
 *   chunks its per-thread cache (tcache) holds count as in use, and which
 *   sizes it holds depends on the order of frees; that is 0.5 to 2 KB
 *   here, per communicator made and destroyed, while valgrind finds the
 *   same reachable memory after one communicator as after six.
 * And while the soak communicator lives, its heap must not grow with the
 * number of operations: the figure after SOAK_OPS operations is within
 * HEAP_SLACK of the one after SOAK_OPS / 5 (a cache that never stops
 * growing, freed only at destroy, is a leak too). RSS is printed, not
 * checked: freed memory stays resident at libc's discretion.
 *
 * The seed is printed; LOOM_TEST_SEED replays one, LOOM_SOAK_OPS changes
 * the number of operations.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { NR = 4, SOAK_OPS = 10000, SOAK_WARM = 300, MAXB = 384 << 10, MAPS_SLACK = 4 };
#define HEAP_SLACK (32 << 10)

/* Under a sanitizer the allocator is the sanitizer's: mallinfo2 reads 0
 * and its size-class regions add mappings as they fill, so the mapping
 * and heap figures say nothing of Loom there (LeakSanitizer checks every
 * rank for leaks instead, tests/sanitizer.c). fds, threads and /dev/shm
 * are checked in every build. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOCATOR_FIGURES 0
#else
#define ALLOCATOR_FIGURES 1
#endif

enum kind { K_ALLREDUCE, K_ALLGATHER, K_REDUCESCATTER, K_BROADCAST, K_REDUCE, K_SENDRECV, K_NKINDS };
static const char *const kind_name[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send/Recv"};
static const char *const red_name[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
enum { RED_PREMUL = 5 };

struct op {
  enum kind kind;
  int dtype, red, root, inplace;
  size_t count;            /* elements per rank (AllGather, ReduceScatter: each block) */
  size_t pcount[NR][NR];   /* Send/Recv: elements from [src] to [dst], 0: none */
  int psend[NR][NR];
  uint64_t dseed;          /* the data's */
};

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct rng {
  uint64_t s;
};
static uint64_t next(struct rng *r) { return mix(r->s++); }
static unsigned below(struct rng *r, unsigned n) { return (unsigned)(next(r) % n); }

/* Mostly small, as a training step's calls are: elements of `esize`. */
static size_t draw_count(struct rng *r, size_t esize, size_t max_bytes) {
  unsigned p = below(r, 100);
  size_t bytes;
  if (p < 10)
    return below(r, 9); /* 0 to 8 elements */
  else if (p < 60)
    bytes = below(r, 4096 + 1);
  else if (p < 85)
    bytes = below(r, (64 << 10) + 1);
  else
    bytes = below(r, (unsigned)max_bytes + 1);
  return bytes / esize;
}

static void draw(struct rng *r, struct op *o) {
  memset(o, 0, sizeof *o);
  unsigned k = below(r, 100);
  o->kind = k < 30 ? K_ALLREDUCE : k < 42 ? K_ALLGATHER : k < 54 ? K_REDUCESCATTER : k < 66 ? K_BROADCAST
            : k < 80 ? K_REDUCE : K_SENDRECV;
  o->dtype = (int)below(r, ncclNumTypes);
  o->red = (int)below(r, 6);
  o->root = (int)below(r, NR);
  o->inplace = below(r, 4) == 0;
  o->dseed = next(r);
  size_t es = dtype_size(o->dtype);
  if (o->kind == K_SENDRECV) {
    for (int s = 0; s < NR; s++)
      for (int d = 0; d < NR; d++) {
        o->psend[s][d] = below(r, 2);
        o->pcount[s][d] = o->psend[s][d] ? draw_count(r, es, MAXB / 4) : 0;
      }
  } else {
    o->count = draw_count(r, es, MAXB);
  }
}

static int reduces(const struct op *o) {
  return o->kind == K_ALLREDUCE || o->kind == K_REDUCESCATTER || o->kind == K_REDUCE;
}

/* A reduction's input: element i of rank r's buffer, a small integer. */
static double red_input(const struct op *o, int r, size_t i) {
  int fp8 = o->dtype == ncclFloat8e4m3 || o->dtype == ncclFloat8e5m2;
  uint64_t h = mix(o->dseed ^ ((uint64_t)r << 56) ^ i);
  if (o->red == ncclAvg) {
    /* a + b everywhere, the sum n * (a + b): exact whether the division
     * comes first (floats' premul by 1/n) or last (integers'). */
    unsigned a = fp8 ? 0 : (unsigned)(h % 3), b = (unsigned)((h >> 8) % 2);
    return a + ((size_t)r == i % NR ? (double)NR * b : 0);
  }
  return (double)(h % (fp8 ? 2 : 4));
}

static double red_expect(const struct op *o, size_t i) {
  double acc = red_input(o, 0, i);
  for (int r = 1; r < NR; r++) {
    double v = red_input(o, r, i);
    switch (o->red) {
    case ncclProd: acc *= v; break;
    case ncclMax: acc = v > acc ? v : acc; break;
    case ncclMin: acc = v < acc ? v : acc; break;
    default: acc += v; break;
    }
  }
  if (o->red == ncclAvg)
    acc /= NR;
  if (o->red == RED_PREMUL)
    acc *= 2;
  return acc;
}

/* Copies: random bytes, of block `blk` (a rank's, or a Send/Recv pair's). */
static void fill_bytes(const struct op *o, uint64_t blk, unsigned char *buf, size_t bytes) {
  for (size_t j = 0; j < bytes; j += 8) {
    uint64_t h = mix(o->dseed ^ (blk << 48) ^ j);
    memcpy(buf + j, &h, bytes - j < 8 ? bytes - j : 8);
  }
}

static void fill_red(const struct op *o, int rank, void *buf, size_t first, size_t n) {
  for (size_t i = 0; i < n; i++)
    dtype_store(o->dtype, buf, i, red_input(o, rank, first + i));
}

struct bufs {
  unsigned char *send, *recv, *want;           /* NR * MAXB each */
  unsigned char *psend[NR], *precv[NR];        /* MAXB / 4 each */
};

static void describe(const struct op *o, char *buf, size_t len) {
  snprintf(buf, len, "%s of %zu %s, %s, root %d%s", kind_name[o->kind], o->count, dtype_name(o->dtype),
           reduces(o) ? red_name[o->red] : "no op", o->root, o->inplace ? ", in place" : "");
}

static int compare(const struct op *o, int rank, long idx, const void *got, const void *want, size_t bytes,
                   const char *what) {
  if (memcmp(got, want, bytes) == 0)
    return 0;
  size_t es = dtype_size(o->dtype), at = 0;
  while (at < bytes && ((const char *)got)[at] == ((const char *)want)[at])
    at++;
  char d[200];
  describe(o, d, sizeof d);
  fprintf(stderr, "rank %d: operation %ld (%s): %s element %zu is %g, not %g\n", rank, idx, d, what, at / es,
          dtype_load(o->dtype, got, at / es), dtype_load(o->dtype, want, at / es));
  return 1;
}

/* Runs and checks one operation: 0, or 1 with the reason on stderr. */
static int one_op(const struct op *o, long idx, int rank, ncclComm_t comm, struct bufs *b) {
  size_t es = dtype_size(o->dtype), n = o->count, bytes = n * es;
  ncclDataType_t dt = (ncclDataType_t)o->dtype;
  ncclRedOp_t red = (ncclRedOp_t)o->red;
  if (reduces(o) && o->red == RED_PREMUL) {
    double two = 2;
    unsigned char scalar[8];
    dtype_store(o->dtype, scalar, 0, two);
    RCHECK(comm, ncclRedOpCreatePreMulSum(&red, scalar, dt, ncclScalarHostImmediate, comm));
  }
  unsigned char *send = b->send, *recv = b->recv;
  ncclResult_t r = ncclSuccess;
  const char *what = "the result's";
  switch (o->kind) {
  case K_ALLREDUCE:
    fill_red(o, rank, send, 0, n);
    memset(recv, 0xa5, bytes);
    if (o->inplace)
      recv = send;
    r = ncclAllReduce(send, recv, n, dt, red, comm, NULL);
    for (size_t i = 0; i < n; i++)
      dtype_store(o->dtype, b->want, i, red_expect(o, i));
    bytes = n * es;
    break;
  case K_REDUCE:
    fill_red(o, rank, send, 0, n);
    memset(recv, 0xa5, bytes);
    if (o->inplace)
      recv = send;
    r = ncclReduce(send, recv, n, dt, red, o->root, comm, NULL);
    for (size_t i = 0; i < n; i++)
      dtype_store(o->dtype, b->want, i, red_expect(o, i));
    if (rank != o->root)
      bytes = 0; /* nothing to check */
    break;
  case K_REDUCESCATTER:
    fill_red(o, rank, send, 0, n * NR);
    memset(recv, 0xa5, bytes);
    if (o->inplace)
      recv = send + (size_t)rank * bytes;
    r = ncclReduceScatter(send, recv, n, dt, red, comm, NULL);
    for (size_t i = 0; i < n; i++)
      dtype_store(o->dtype, b->want, i, red_expect(o, (size_t)rank * n + i));
    break;
  case K_ALLGATHER:
    memset(recv, 0xa5, bytes * NR);
    if (o->inplace)
      send = recv + (size_t)rank * bytes;
    fill_bytes(o, (uint64_t)rank, send, bytes);
    r = ncclAllGather(send, recv, n, dt, comm, NULL);
    for (int q = 0; q < NR; q++)
      fill_bytes(o, (uint64_t)q, b->want + (size_t)q * bytes, bytes);
    bytes *= NR;
    break;
  case K_BROADCAST:
    memset(recv, 0xa5, bytes);
    if (o->inplace)
      send = recv;
    if (rank == o->root)
      fill_bytes(o, (uint64_t)o->root, send, bytes);
    r = ncclBroadcast(send, recv, n, dt, o->root, comm, NULL);
    fill_bytes(o, (uint64_t)o->root, b->want, bytes);
    break;
  case K_SENDRECV: {
    RCHECK(comm, ncclGroupStart());
    for (int q = 0; q < NR; q++) {
      if (o->psend[rank][q]) {
        fill_bytes(o, (uint64_t)(rank * NR + q), b->psend[q], o->pcount[rank][q] * es);
        RCHECK(comm, ncclSend(b->psend[q], o->pcount[rank][q], dt, q, comm, NULL));
      }
      if (o->psend[q][rank]) {
        memset(b->precv[q], 0xa5, o->pcount[q][rank] * es);
        RCHECK(comm, ncclRecv(b->precv[q], o->pcount[q][rank], dt, q, comm, NULL));
      }
    }
    r = ncclGroupEnd();
    bytes = 0;
    break;
  }
  default:
    break;
  }
  char d[200];
  describe(o, d, sizeof d);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: operation %ld (%s) returned %s: %s\n", rank, idx, d, ncclGetErrorString(r),
            ncclGetLastError(comm));
    return 1;
  }
  if (reduces(o) && o->red == RED_PREMUL)
    RCHECK(comm, ncclRedOpDestroy(red, comm));
  if (o->kind == K_SENDRECV) {
    for (int q = 0; q < NR; q++) {
      if (!o->psend[q][rank])
        continue;
      size_t pb = o->pcount[q][rank] * es;
      fill_bytes(o, (uint64_t)(q * NR + rank), b->want, pb);
      char from[40];
      snprintf(from, sizeof from, "the message from rank %d's", q);
      if (compare(o, rank, idx, b->precv[q], b->want, pb, from))
        return 1;
    }
    return 0;
  }
  return compare(o, rank, idx, recv, b->want, bytes, what);
}

struct figures {
  int fds, threads, maps, shm;
  size_t heap, rss_kb;
};

static size_t rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  size_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %zu kB", &kb) == 1)
      break;
  if (f)
    fclose(f);
  return kb;
}

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  int n = 0, c;
  while (f && (c = getc(f)) != EOF)
    n += c == '\n';
  if (f)
    fclose(f);
  return n;
}

static void measure(struct figures *m) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "loom-%d-", (int)getpid());
  m->fds = harness_count_entries("/proc/self/fd", NULL);
  m->threads = harness_count_entries("/proc/self/task", NULL);
  m->shm = harness_count_entries("/dev/shm", prefix);
  m->maps = count_lines("/proc/self/maps");
  struct mallinfo2 mi = mallinfo2();
  m->heap = mi.uordblks + mi.hblkhd;
  m->rss_kb = rss_kb();
}

/* Runs `nops` operations drawn from `seed` on a new communicator, which it
 * destroys; `mid` and `end` (if not NULL) get the figures after nops / 5
 * operations and after the last, with the communicator alive. */
static int phase(int rank, ncclUniqueId id, uint64_t seed, long nops, struct bufs *b, struct figures *mid,
                 struct figures *end, long *per_kind) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, NR, id, rank));
  struct rng rng = {seed};
  for (long i = 0; i < nops; i++) {
    if (mid && i == nops / 5)
      measure(mid);
    struct op o;
    draw(&rng, &o);
    if (one_op(&o, i, rank, comm, b))
      return 1;
    if (per_kind)
      per_kind[o.kind]++;
  }
  if (end)
    measure(end);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

struct soak_arg {
  uint64_t seed;
  long ops;
  int id_pipe[2]; /* the soak communicator's id, made by the test */
};

static int soak_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct soak_arg *a = arg;
  struct bufs b;
  b.send = malloc(NR * MAXB);
  b.recv = malloc(NR * MAXB);
  b.want = malloc(NR * MAXB);
  RASSERT(b.send && b.recv && b.want, "out of memory");
  for (int q = 0; q < NR; q++) {
    b.psend[q] = malloc(MAXB / 4);
    b.precv[q] = malloc(MAXB / 4);
    RASSERT(b.psend[q] && b.precv[q], "out of memory");
  }
  /* The test makes the soak communicator's id after the fork: its root
   * thread and socket are the test's, not in any rank's figures. */
  ncclUniqueId id2;
  RASSERT(harness_read_all(a->id_pipe[0], &id2, sizeof id2) == 0, "no unique id from the test");
  close(a->id_pipe[0]);
  close(a->id_pipe[1]);
  double t0 = now_s();
  if (phase(rank, id, a->seed ^ 0x5741524dull, SOAK_WARM, &b, NULL, NULL, NULL))
    return 1;
  struct figures base, mid, end, after;
  measure(&base);
  double t1 = now_s();
  long per_kind[K_NKINDS] = {0};
  if (phase(rank, id2, a->seed, a->ops, &b, &mid, &end, per_kind))
    return 1;
  double t2 = now_s();
  measure(&after);
  printf("rank %d: %ld operations in %.1f s (%.0f us each; warm-up %d in %.1f s): AllReduce %ld, AllGather %ld, "
         "ReduceScatter %ld, Broadcast %ld, Reduce %ld, Send/Recv groups %ld\n",
         rank, a->ops, t2 - t1, (t2 - t1) / a->ops * 1e6, SOAK_WARM, t1 - t0, per_kind[K_ALLREDUCE],
         per_kind[K_ALLGATHER], per_kind[K_REDUCESCATTER], per_kind[K_BROADCAST], per_kind[K_REDUCE],
         per_kind[K_SENDRECV]);
  printf("rank %d: baseline / at op %ld / at op %ld / destroyed: fds %d/%d/%d/%d, threads %d/%d/%d/%d, maps "
         "%d/%d/%d/%d, heap %zu/%zu/%zu/%zu B, RSS %zu/%zu/%zu/%zu kB, /dev/shm %d/%d/%d/%d\n",
         rank, a->ops / 5, a->ops, base.fds, mid.fds, end.fds, after.fds, base.threads, mid.threads, end.threads,
         after.threads, base.maps, mid.maps, end.maps, after.maps, base.heap, mid.heap, end.heap, after.heap,
         base.rss_kb, mid.rss_kb, end.rss_kb, after.rss_kb, base.shm, mid.shm, end.shm, after.shm);
  RASSERT(after.fds == base.fds, "rank %d: %d fds open after the soak, %d before", rank, after.fds, base.fds);
  RASSERT(after.threads == base.threads, "rank %d: %d threads after the soak, %d before", rank, after.threads,
          base.threads);
  RASSERT(after.shm == 0, "rank %d: %d segments of this process left in /dev/shm", rank, after.shm);
  if (ALLOCATOR_FIGURES) {
    RASSERT(after.maps <= base.maps + MAPS_SLACK, "rank %d: %d mappings after the soak, %d before (slack %d)", rank,
            after.maps, base.maps, MAPS_SLACK);
    RASSERT(after.heap <= base.heap + HEAP_SLACK, "rank %d: %zu bytes of heap in use after the soak, %zu before", rank,
            after.heap, base.heap);
    RASSERT(end.heap <= mid.heap + HEAP_SLACK,
            "rank %d: the live communicator's heap grew from %zu bytes (op %ld) to %zu (op %ld)", rank, mid.heap,
            a->ops / 5, end.heap, a->ops);
    RASSERT(end.maps <= mid.maps + MAPS_SLACK, "rank %d: the live communicator's mappings grew from %d to %d", rank,
            mid.maps, end.maps);
  } else if (rank == 0) {
    printf("rank 0: a sanitizer build: mappings and heap not checked (its allocator's), leaks by LeakSanitizer\n");
  }
  for (int q = 0; q < NR; q++) {
    free(b.psend[q]);
    free(b.precv[q]);
  }
  free(b.send);
  free(b.recv);
  free(b.want);
  return 0;
}

TEST_IMPL(soak_mixed_shm_4) {
  const char *s = getenv("LOOM_TEST_SEED"), *ops = getenv("LOOM_SOAK_OPS");
  struct soak_arg a = {.seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid(),
                       .ops = ops ? atol(ops) : SOAK_OPS};
  printf("soak: seed %llu (LOOM_TEST_SEED replays it), %ld operations over %d ranks\n", (unsigned long long)a.seed,
         a.ops, NR);
  ASSERT(pipe(a.id_pipe) == 0);
  double t0 = now_s();
  pid_t pids[NR];
  ASSERT(start_ranks(NR, soak_rank, &a, pids, NULL) == 0);
  /* The soak communicator's id, made here: the harness makes only one. */
  ncclUniqueId id2;
  ASSERT_OK(ncclGetUniqueId(&id2));
  for (int r = 0; r < NR; r++)
    ASSERT(harness_write_all(a.id_pipe[1], &id2, sizeof id2) == 0);
  close(a.id_pipe[0]);
  close(a.id_pipe[1]);
  int rc = wait_ranks(NR, pids);
  printf("soak: %s in %.1f s\n", rc ? "failed" : "passed", now_s() - t0);
  return rc;
}
