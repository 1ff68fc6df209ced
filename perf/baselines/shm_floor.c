/*
 * The floor of a 2-rank AllReduce through shared memory on plain buffers,
 * with nothing around the passes: no library, no launch, no checks, waits
 * that only spin, each process pinned to a CPU of its own.
 *
 *   shm_floor MODE BYTES [CALLS [ROUNDS [PIECE [FIFO]]]]
 *                       (defaults 200 calls, 5 rounds, 256K pieces, 4M FIFO)
 *
 * Two processes, float32, out of place, in pieces of PIECE bytes through
 * FIFOs in shared memory. MODE:
 *   ring      the passes of Loom's host ring for 2 ranks (and of Intel
 *             MPI's shared-memory path, by its profile). Rank r owns half
 *             r. Per piece: the piece of the peer's half is copied from
 *             the input into the data FIFO toward the peer; the peer's
 *             piece of this rank's half is added to the input's into the
 *             result FIFO toward the peer and copied from there into the
 *             output; the peer's result for its half is copied from the
 *             result FIFO into the output. Output copies use streaming
 *             stores from 1 MiB, as Loom's do (src/exec/copy.h).
 *   exchange  no reduction: each rank copies its whole input into the FIFO
 *             toward the peer and the peer's out of the other FIFO into its
 *             output. Each rank needs every element of the peer's
 *             contribution (as data or inside a result) and must hand over
 *             its own, so a byte of each rank's buffer crossing between the
 *             processes once each way is the least any AllReduce on plain
 *             buffers moves: this is that movement alone.
 * Each round times CALLS calls back to back and prints the mean per call
 * (the slower rank's); the line at the end has the median and the range
 * over the rounds:
 *   shm_floor MODE BYTES PIECE median_us min_us max_us
 * The output of the last call is checked on both ranks (the sum, or the
 * peer's input); a wrong element fails the run (exit 1). Built with the
 * benchmarks (perf/CMakeLists.txt), with Loom's src/exec/copy.c for the
 * streaming copies; perf/compare_host.sh --quick runs it.
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exec/copy.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#else
#define PAUSE() ((void)0)
#endif

#define MAX_ROUNDS 101

/* Spinning is the floor where each rank has a CPU; where the two share
 * one (a test limited to a CPU), the spinner lets the other run now and
 * then, so that the run still ends. */
static void spin(unsigned *n) {
  PAUSE();
  if (++*n % (1u << 16) == 0)
    sched_yield();
}

/* One queue of pieces, one way: its own lines for each counter. */
struct queue {
  _Alignas(64) _Atomic uint64_t head; /* pieces written */
  _Alignas(64) _Atomic uint64_t tail; /* pieces consumed */
  _Alignas(64) char pad[64];
};

struct shared {
  struct queue q[2][2];         /* [from rank][0: data, 1: result] */
  _Atomic int ready;            /* ranks at the start of a round */
  double us[2][MAX_ROUNDS];
  int bad[2];
};

static size_t piece, slots;
static char *fifo[2][2]; /* same indices as the queues */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The output's copies as Loom's: streaming stores from 1 MiB, with the
 * library's own copy (src/exec/copy.c, linked in). */
static void copy_out(void *dst, const void *src, size_t bytes, int stream) {
  if (stream)
    copy_streaming(dst, src, bytes);
  else
    memcpy(dst, src, bytes);
}

/* The widest vectors the CPU has, chosen at load as Loom's reductions
 * choose theirs (src/exec/reduce.c), not by -march=native. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void add(float *restrict out, const float *restrict a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

/* The slot for the queue's next piece, once the reader has freed it. */
static char *put_begin(struct queue *q, char *base) {
  uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
  unsigned n = 0;
  while (h - atomic_load_explicit(&q->tail, memory_order_acquire) >= slots)
    spin(&n);
  return base + (h % slots) * piece;
}

static void put_end(struct queue *q) { atomic_fetch_add_explicit(&q->head, 1, memory_order_release); }

static const char *get_begin(struct queue *q, char *base) {
  uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
  unsigned n = 0;
  while (atomic_load_explicit(&q->head, memory_order_acquire) == t)
    spin(&n);
  return base + (t % slots) * piece;
}

static void get_end(struct queue *q) { atomic_fetch_add_explicit(&q->tail, 1, memory_order_release); }

static void allreduce(struct shared *sh, int me, const float *in, float *out, size_t bytes) {
  int peer = !me, stream = bytes >= (1u << 20);
  size_t half = bytes / 2;
  const char *mine_in = (const char *)in + me * half, *theirs_in = (const char *)in + peer * half;
  char *mine_out = (char *)out + me * half, *theirs_out = (char *)out + peer * half;
  for (size_t off = 0; off < half; off += piece) {
    size_t b = half - off < piece ? half - off : piece;
    char *slot = put_begin(&sh->q[me][0], fifo[me][0]);
    memcpy(slot, theirs_in + off, b);
    put_end(&sh->q[me][0]);
    const char *got = get_begin(&sh->q[peer][0], fifo[peer][0]);
    char *res = put_begin(&sh->q[me][1], fifo[me][1]);
    add((float *)res, (const float *)got, (const float *)(mine_in + off), b / sizeof(float));
    get_end(&sh->q[peer][0]);
    put_end(&sh->q[me][1]);
    copy_out(mine_out + off, res, b, stream);
    const char *back = get_begin(&sh->q[peer][1], fifo[peer][1]);
    copy_out(theirs_out + off, back, b, stream);
    get_end(&sh->q[peer][1]);
  }
}

static void exchange(struct shared *sh, int me, const float *in, float *out, size_t bytes) {
  int peer = !me, stream = bytes >= (1u << 20);
  for (size_t off = 0; off < bytes; off += piece) {
    size_t b = bytes - off < piece ? bytes - off : piece;
    char *slot = put_begin(&sh->q[me][0], fifo[me][0]);
    memcpy(slot, (const char *)in + off, b);
    put_end(&sh->q[me][0]);
    const char *got = get_begin(&sh->q[peer][0], fifo[peer][0]);
    copy_out((char *)out + off, got, b, stream);
    get_end(&sh->q[peer][0]);
  }
}

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k')
    v *= 1024;
  else if (*end == 'M' || *end == 'm')
    v *= 1024 * 1024;
  else if (*end == 'G' || *end == 'g')
    v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

typedef void pass_fn(struct shared *sh, int me, const float *in, float *out, size_t bytes);

static void run_rank(struct shared *sh, int me, pass_fn *call, float *in, float *out, size_t bytes, int calls,
                     int rounds) {
  /* Rank r on the r-th CPU this process may use (mod their count). */
  cpu_set_t have, set;
  if (sched_getaffinity(0, sizeof have, &have) == 0) {
    int k = me % CPU_COUNT(&have);
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &have) && k-- == 0) {
        CPU_ZERO(&set);
        CPU_SET(c, &set);
        sched_setaffinity(0, sizeof set, &set);
        break;
      }
  }
  size_t n = bytes / sizeof(float);
  for (size_t i = 0; i < n; i++)
    in[i] = (float)((me + 1) * (int)(i % 97));
  memset(out, 0, bytes);
  call(sh, me, in, out, bytes); /* warmup: pages and caches */
  for (int r = 0; r < rounds; r++) {
    /* Both at the line before timing: a round starts together. */
    atomic_fetch_add(&sh->ready, 1);
    unsigned spins = 0;
    while (atomic_load(&sh->ready) < 2 * (r + 1))
      spin(&spins);
    double t0 = now();
    for (int c = 0; c < calls; c++)
      call(sh, me, in, out, bytes);
    sh->us[me][r] = (now() - t0) / calls * 1e6;
  }
  /* The sum of both inputs, or the peer's input. */
  int times = call == exchange ? 2 - me : 3;
  for (size_t i = 0; i < n; i++)
    if (out[i] != (float)(times * (int)(i % 97))) {
      sh->bad[me] = 1;
      fprintf(stderr, "shm_floor: rank %d element %zu is %g, expected %d\n", me, i, out[i], times * (int)(i % 97));
      break;
    }
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  pass_fn *call = argc < 2 ? NULL : strcmp(argv[1], "ring") == 0 ? allreduce : strcmp(argv[1], "exchange") == 0 ? exchange : NULL;
  size_t bytes = argc > 2 ? parse_size(argv[2]) : 0;
  int calls = argc > 3 ? atoi(argv[3]) : 200, rounds = argc > 4 ? atoi(argv[4]) : 5;
  piece = argc > 5 ? parse_size(argv[5]) : 256u << 10;
  size_t fifo_bytes = argc > 6 ? parse_size(argv[6]) : 4u << 20;
  if (!call || bytes < 2 * sizeof(float) || bytes % (2 * sizeof(float)) || calls < 1 || rounds < 1 ||
      rounds > MAX_ROUNDS || piece < 64 || piece % 64 || fifo_bytes < 4 * piece) {
    fprintf(stderr, "usage: shm_floor ring|exchange BYTES [CALLS [ROUNDS [PIECE [FIFO]]]]: BYTES a multiple of 8, "
                    "PIECE of 64, FIFO at least 4 pieces, at most %d rounds\n", MAX_ROUNDS);
    return 2;
  }
  /* Each of the 4 queues gets a quarter of the FIFO bytes, as Loom's one
   * FIFO per direction carries both kinds of piece. */
  slots = fifo_bytes / 2 / piece;
  struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *mem = mmap(NULL, 4 * slots * piece, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED || mem == MAP_FAILED) {
    perror("shm_floor: mmap");
    return 1;
  }
  for (int i = 0; i < 4; i++)
    fifo[i / 2][i % 2] = mem + (size_t)i * slots * piece;
  /* Allocated before the fork, so that neither rank is left waiting for
   * one that could not; each writes its own copy, private to it. */
  size_t alloc = (bytes + 4095) & ~(size_t)4095; /* aligned_alloc wants a multiple */
  float *in = aligned_alloc(4096, alloc), *out = aligned_alloc(4096, alloc);
  if (!in || !out) {
    fprintf(stderr, "shm_floor: cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  pid_t kid = fork();
  if (kid < 0) {
    perror("shm_floor: fork");
    return 1;
  }
  run_rank(sh, kid == 0, call, in, out, bytes, calls, rounds);
  if (kid == 0)
    _exit(0);
  int status;
  waitpid(kid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || sh->bad[0] || sh->bad[1])
    return 1;
  /* A call ends on both ranks: the slower rank's time per round. */
  double us[MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    us[r] = sh->us[0][r] > sh->us[1][r] ? sh->us[0][r] : sh->us[1][r];
    printf("round %d: %.1f us per call\n", r, us[r]);
  }
  qsort(us, (size_t)rounds, sizeof us[0], cmp_double);
  printf("shm_floor %s %zu %zu %.1f %.1f %.1f\n", argv[1], bytes, piece, us[rounds / 2], us[0], us[rounds - 1]);
  return 0;
}
