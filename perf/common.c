/*
 * The benchmark driver shared by all perf/ programs: the nccl-tests command
 * line, ranks as threads of this process and/or processes started by
 * loomrun, the timing loop, data checking (data.c) and nccl-tests' output.
 *
 * Ranks: with -t T each process runs T ranks as threads, each with its own
 * communicator. Under loomrun (LOOM_RANK, LOOM_NRANKS, LOOM_UNIQUE_ID in
 * the environment) process p runs ranks p*T .. p*T+T-1 of LOOM_NRANKS*T,
 * all from the one id loomrun made. Otherwise this process makes the id.
 * The *_perf_mpi builds (LOOM_PERF_MPI) take the process's place and the id
 * from MPI instead (mpi_launch.c), and MPI also carries the final verdict.
 *
 * On a host communicator buffers are host memory and calls return when
 * done (stream NULL). Where the library makes CUDA communicators (a GPU is
 * visible and LOOM_DEVICE is not "host"), each rank takes a GPU (its local
 * rank modulo the GPUs, so several ranks may share one), its buffers are
 * device memory, its calls go on a stream of its own, and a timed batch
 * ends with a stream synchronisation. Data is prepared and checked on host
 * mirrors copied to and from the device.
 * Everything that combines values across ranks (times for -a, #wrong, the
 * device list) goes through the communicator under test.
 *
 * A failing call ends the whole process at once with _exit(1): its peers
 * would otherwise wait for it inside the library, and exit() would run
 * destructors while other threads are still in there.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "register.h"
#include "loom.h"
#ifdef LOOM_PERF_MPI
#include "mpi_launch.h"
#endif

#define GUARD_BYTES 4096 /* poison checked before and after each output */
#define LINE_BYTES 256   /* one "# Using devices" line */
#define MAX_REPORTS 3    /* mismatch lines per rank */

static const char *const TYPE_NAMES[ncclNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
static const struct {
  const char *alias;
  ncclDataType_t type;
} TYPE_ALIASES[] = {{"char", ncclInt8},        {"int", ncclInt32},        {"fp16", ncclFloat16},
                    {"float16", ncclFloat16},  {"fp32", ncclFloat32},     {"float32", ncclFloat32},
                    {"fp64", ncclFloat64},     {"float64", ncclFloat64},  {"bf16", ncclBfloat16},
                    {"e4m3", ncclFloat8e4m3},  {"fp8_e4m3", ncclFloat8e4m3},
                    {"e5m2", ncclFloat8e5m2},  {"fp8_e5m2", ncclFloat8e5m2}};
/* In nccl-tests' order and spelling; PERF_OP_SUM..AVG equal ncclSum..ncclAvg. */
static const char *const OP_NAMES[] = {"sum", "prod", "max", "min", "avg", "mulsum"};
#define N_OPS 6

typedef struct {
  int nthreads, ngpus;
  size_t minbytes, maxbytes, stepbytes, stepfactor;
  int iters, warmup, agg, check, blocking, average, graph, cputime, reg;
  double timeout;
  int op;   /* perf_op, or -1 for all */
  int type; /* ncclDataType_t, or -1 for all */
  int root; /* -1 for all */
} config_t;

static config_t cfg = {
    .nthreads = 1, .ngpus = 1, .minbytes = 32u << 20, .maxbytes = 32u << 20,
    .stepbytes = 1u << 20, .stepfactor = 1, .iters = 20, .warmup = 5, .agg = 1, .check = 1,
    .average = 1, .op = PERF_OP_SUM, .type = ncclFloat32, .root = 0};

static const perf_bench *B;
static const char *progname = "perf";
static char hostname[64];
static int nprocs = 1, proc = 0, nranks = 1;
static int gpus; /* GPUs to use; 0: host communicators */
static ncclUniqueId uid;

typedef struct {
  int rank, thread, is_main;
  ncclComm_t comm;
  char *sendalloc, *recvalloc, *send, *recv; /* host memory, or the host mirrors */
  perf_reg sendreg, recvreg;                  /* -R */
  size_t alloc_bytes;
  int dev;                                    /* CUDA device, -1 on the host */
  void *stream;
  char *dsendalloc, *drecvalloc, *dsend, *drecv; /* device buffers */
  char *scratch;                              /* device memory for values combined across ranks */
  double bw_sum;
  int bw_count, errors, reports_left;
  int own_failed; /* checks in which this rank itself found wrong elements */
  int64_t rss_max, rss_sum; /* rank 0: peak RSS beyond the buffers, over all ranks (KiB) */
  int rss_max_rank;
  uint64_t seq;
  char label[160]; /* what is running, for messages */
  pthread_t tid;
} rank_t;

/* ---- failures ------------------------------------------------------------ */

static _Thread_local struct {
  const char *call, *file;
  int line;
} last_failure;

void perf_note_failure(const char *call, const char *file, int line) {
  last_failure.call = call;
  last_failure.file = file;
  last_failure.line = line;
}

static _Noreturn void quit(int code) {
  fflush(stdout);
  fflush(stderr);
  _exit(code);
}

__attribute__((format(printf, 2, 3))) static _Noreturn void die(const rank_t *r, const char *fmt,
                                                                ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  if (r) fprintf(stderr, "%s: rank %d (%s pid %d): ", progname, r->rank, hostname, (int)getpid());
  else fprintf(stderr, "%s: ", progname);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  quit(1);
}

static _Noreturn void die_nccl(const rank_t *r, const char *call, const char *file, int line,
                               ncclResult_t res) {
  const char *last = ncclGetLastError(r ? r->comm : NULL);
  die(r, "%s%s%s failed (%s:%d): %s%s%s", r && r->label[0] ? r->label : "",
      r && r->label[0] ? ": " : "", call, file, line, ncclGetErrorString(res),
      last && *last ? ": " : "", last ? last : "");
}

#define NCCL_OR_DIE(r, call)                                                   \
  do {                                                                         \
    ncclResult_t res_ = (call);                                                \
    if (res_ != ncclSuccess) die_nccl((r), #call, __FILE__, __LINE__, res_);   \
  } while (0)

/* ---- time and the -T watchdog -------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Calls that returned so far: counted, not timed, so that the watchdog
 * costs the timed loop no clock reads. */
static _Atomic unsigned long progress_count;

static void progress(void) { atomic_fetch_add_explicit(&progress_count, 1, memory_order_relaxed); }

/* nccl-tests' -T: give up when no call has returned for that long, rather
 * than hang a CI job on a library that never answers. */
static void *watchdog(void *arg) {
  (void)arg;
  unsigned long seen = atomic_load(&progress_count);
  double since = now_s();
  for (;;) {
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    unsigned long now_count = atomic_load(&progress_count);
    double now = now_s();
    if (now_count != seen) {
      seen = now_count;
      since = now;
    } else if (now - since >= cfg.timeout) {
      fprintf(stderr, "%s: %s pid %d: test timeout: no call returned for %.0f s (-T %g)\n",
              progname, hostname, (int)getpid(), now - since, cfg.timeout);
      quit(1);
    }
  }
  return NULL;
}

/* ---- command line -------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "Usage: %s [options]   (nccl-tests command line; host memory, host communicators)\n"
          "  -t, --nthreads N       ranks as threads of this process (default 1)\n"
          "  -g, --ngpus N          GPUs per thread: must be 1 (host memory)\n"
          "  -b, --minbytes SIZE    smallest size (default 32M; K, M, G suffixes)\n"
          "  -e, --maxbytes SIZE    largest size (default 32M)\n"
          "  -i, --stepbytes SIZE   size increment (default 1M)\n"
          "  -f, --stepfactor N     size multiplier, used instead of -i when > 1\n"
          "  -n, --iters N          timed iterations (default 20)\n"
          "  -w, --warmup_iters N   warmup iterations (default 5)\n"
          "  -m, --agg_iters N      calls aggregated in one group per iteration (default 1)\n"
          "  -c, --check N          check results N times per size, 0 to skip (default 1)\n"
          "  -o, --op OP            sum, prod, min, max, avg, mulsum (premulsum), all\n"
          "  -d, --datatype TYPE    int8 uint8 int32 uint32 int64 uint64 half float double\n"
          "                         bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
          "  -r, --root N           root rank, or -1/all for each rank in turn (default 0)\n"
          "  -z, --blocking 0/1     barrier after each call (calls always complete on host)\n"
          "  -a, --average 0-3      time reported: 0 rank 0, 1 average, 2 min, 3 max (default 1)\n"
          "  -T, --timeout S        give up when no call returns for S seconds\n"
          "  -R, --local_register N 0 plain buffers (default), 1 ncclCommRegister, 2 ncclMemAlloc\n"
          "                         as a symmetric window (host ranks read each other's in place)\n"
          "  -G, --cudagraph N      CUDA graphs: not available with host communicators\n"
          "  -p, -y, -C             accepted for compatibility (parallel init, stream null,\n"
          "                         cputime: the same as time with host communicators)\n"
          "  -h, --help             this text\n"
          "Processes: loomrun -n N %s ... (see perf/README.md).\n",
          progname, progname);
}

__attribute__((format(printf, 1, 2))) static _Noreturn void bad_arg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", progname);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see %s -h)\n", progname);
  va_end(ap);
  exit(1);
}

static int parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int int_arg(const char *opt, const char *s, long lo, long hi) {
  long v;
  if (parse_long(s, lo, hi, &v) != 0) {
    if (hi == LONG_MAX || hi == INT_MAX)
      bad_arg("%s wants an integer >= %ld, not \"%s\"", opt, lo, s);
    bad_arg("%s wants an integer from %ld to %ld, not \"%s\"", opt, lo, hi, s);
  }
  return (int)v;
}

/* Sizes as nccl-tests: a number with an optional K, M or G (powers of 1024). */
static size_t size_arg(const char *opt, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double mult = 1;
  if (end != s) {
    switch (*end) {
      case 'k': case 'K': mult = 1024.0; end++; break;
      case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
      case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
      default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
  }
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0 ||
      v * mult > (double)(SIZE_MAX / 4))
    bad_arg("%s wants a size such as 8, 1K, 64M or 2G, not \"%s\"", opt, s);
  return (size_t)(v * mult);
}

static int type_arg(const char *s) {
  if (strcmp(s, "all") == 0) return -1;
  for (int t = 0; t < ncclNumTypes; t++)
    if (strcmp(s, TYPE_NAMES[t]) == 0) return t;
  for (size_t i = 0; i < sizeof(TYPE_ALIASES) / sizeof(TYPE_ALIASES[0]); i++)
    if (strcmp(s, TYPE_ALIASES[i].alias) == 0) return TYPE_ALIASES[i].type;
  bad_arg("unknown datatype \"%s\" (int8 uint8 int32 uint32 int64 uint64 half float double "
          "bfloat16 f8e4m3 f8e5m2 all)", s);
}

static int op_arg(const char *s) {
  if (strcmp(s, "all") == 0) return -1;
  if (strcmp(s, "premulsum") == 0) return PERF_OP_MULSUM;
  for (int o = 0; o < N_OPS; o++)
    if (strcmp(s, OP_NAMES[o]) == 0) return o;
  bad_arg("unknown op \"%s\" (sum prod min max avg mulsum premulsum all)", s);
}

static void parse_args(int argc, char **argv) {
  static const struct option longopts[] = {
      {"nthreads", required_argument, NULL, 't'},     {"ngpus", required_argument, NULL, 'g'},
      {"minbytes", required_argument, NULL, 'b'},     {"maxbytes", required_argument, NULL, 'e'},
      {"stepbytes", required_argument, NULL, 'i'},    {"stepfactor", required_argument, NULL, 'f'},
      {"iters", required_argument, NULL, 'n'},        {"agg_iters", required_argument, NULL, 'm'},
      {"warmup_iters", required_argument, NULL, 'w'},
      {"parallel_init", required_argument, NULL, 'p'},
      {"check", required_argument, NULL, 'c'},        {"op", required_argument, NULL, 'o'},
      {"datatype", required_argument, NULL, 'd'},     {"root", required_argument, NULL, 'r'},
      {"blocking", required_argument, NULL, 'z'},     {"stream_null", required_argument, NULL, 'y'},
      {"timeout", required_argument, NULL, 'T'},      {"cudagraph", required_argument, NULL, 'G'},
      {"report_cputime", required_argument, NULL, 'C'}, {"average", required_argument, NULL, 'a'},
      {"local_register", required_argument, NULL, 'R'},
      {"help", no_argument, NULL, 'h'},               {NULL, 0, NULL, 0}};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":t:g:b:e:i:f:n:m:w:p:c:o:d:r:z:y:T:G:C:a:R:h", longopts,
                          NULL)) != -1) {
    switch (c) {
      case 't': cfg.nthreads = int_arg("-t", optarg, 1, 4096); break;
      case 'g': cfg.ngpus = int_arg("-g", optarg, 1, INT_MAX); break;
      case 'b': cfg.minbytes = size_arg("-b", optarg); break;
      case 'e': cfg.maxbytes = size_arg("-e", optarg); break;
      case 'i': cfg.stepbytes = size_arg("-i", optarg); break;
      case 'f': cfg.stepfactor = (size_t)int_arg("-f", optarg, 1, INT_MAX); break;
      case 'n': cfg.iters = int_arg("-n", optarg, 1, INT_MAX); break;
      case 'm': cfg.agg = int_arg("-m", optarg, 1, INT_MAX); break;
      case 'w': cfg.warmup = int_arg("-w", optarg, 0, INT_MAX); break;
      case 'p': int_arg("-p", optarg, 0, 1); break; /* ranks always init in parallel */
      case 'c': cfg.check = int_arg("-c", optarg, 0, INT_MAX); break;
      case 'o': cfg.op = op_arg(optarg); break;
      case 'd': cfg.type = type_arg(optarg); break;
      case 'r':
        cfg.root = strcmp(optarg, "all") == 0 ? -1 : int_arg("-r", optarg, -1, INT_MAX);
        break;
      case 'z': cfg.blocking = int_arg("-z", optarg, 0, 1); break;
      case 'y': int_arg("-y", optarg, 0, 1); break; /* the stream is always NULL */
      case 'T': cfg.timeout = int_arg("-T", optarg, 0, INT_MAX); break;
      case 'G': cfg.graph = int_arg("-G", optarg, 0, INT_MAX); break;
      case 'C': cfg.cputime = int_arg("-C", optarg, 0, 1); break;
      case 'a': cfg.average = int_arg("-a", optarg, 0, 3); break;
      case 'R': cfg.reg = int_arg("-R", optarg, 0, 2); break;
      case 'h': usage(stdout); exit(0);
      case ':': bad_arg("option %s needs a value", argv[optind - 1]);
      default:
        if (optopt) bad_arg("unknown option -%c", optopt);
        bad_arg("unknown option %s", argv[optind - 1]);
    }
  }
  if (optind < argc) bad_arg("unexpected argument \"%s\"", argv[optind]);
  if (cfg.ngpus != 1)
    bad_arg("-g %d: each rank (a thread or a process) drives one GPU; "
            "use -t %d for %d ranks in this process", cfg.ngpus, cfg.ngpus, cfg.ngpus);
  if (cfg.graph != 0)
    bad_arg("-G %d: CUDA graphs need CUDA communicators; host communicators have no CUDA "
            "graphs (use -G 0)", cfg.graph);
  if (cfg.minbytes > cfg.maxbytes)
    bad_arg("minbytes (%zu) is larger than maxbytes (%zu)", cfg.minbytes, cfg.maxbytes);
  if (cfg.stepfactor <= 1 && cfg.stepbytes == 0 && cfg.minbytes < cfg.maxbytes)
    bad_arg("-i 0 with -f 1 would never reach maxbytes");
}

/* ---- ranks and their communicators --------------------------------------- */

static void setup_ranks(void) {
#ifdef LOOM_PERF_MPI
  /* The *_perf_mpi builds take their place and the id from MPI alone
   * (perf/mpi_launch.c); loomrun's variables are not read. */
  perf_mpi_setup(progname, cfg.nthreads, &proc, &nprocs, &uid);
#else
  const char *er = getenv("LOOM_RANK"), *en = getenv("LOOM_NRANKS");
  const char *eid = getenv("LOOM_UNIQUE_ID");
  if (er || en || eid) {
    long r, n;
    if (!er || !en || !eid)
      die(NULL, "LOOM_RANK, LOOM_NRANKS and LOOM_UNIQUE_ID must be set together (loomrun sets "
          "them); found only some");
    if (parse_long(en, 1, INT_MAX, &n) != 0 || parse_long(er, 0, n - 1, &r) != 0)
      die(NULL, "bad LOOM_RANK=%s / LOOM_NRANKS=%s", er, en);
    if (n > INT_MAX / cfg.nthreads)
      die(NULL, "LOOM_NRANKS=%ld times -t %d is too many ranks", n, cfg.nthreads);
    ncclResult_t res = loomUniqueIdFromHex(eid, &uid);
    if (res != ncclSuccess)
      die(NULL, "LOOM_UNIQUE_ID is not a unique id (256 hex digits): %s", ncclGetErrorString(res));
    nprocs = (int)n;
    proc = (int)r;
  } else {
    NCCL_OR_DIE(NULL, ncclGetUniqueId(&uid));
  }
#endif
  nranks = nprocs * cfg.nthreads;
  if (B->uses_root && cfg.root >= nranks)
    die(NULL, "-r %d: the root must be below the number of ranks (%d)", cfg.root, nranks);
}

#define SCRATCH_HALF(r) ((size_t)nranks * LINE_BYTES + 4096)

/* Values combined across ranks go through the communicator under test; on
 * a CUDA one, through device scratch memory: dev_in puts `bytes` of input
 * there, dev_out is where the output lands, dev_done brings it back. */
static void *dev_in(rank_t *r, const void *host, size_t bytes) {
  if (r->dev < 0)
    return (void *)host;
  if (perf_copy_to_dev(r->scratch, host, bytes, r->stream)) die(r, "staging a value for the GPU");
  return r->scratch;
}

static void *dev_out(rank_t *r, void *host) { return r->dev < 0 ? host : r->scratch + SCRATCH_HALF(r); }

static void dev_done(rank_t *r, void *host, size_t bytes) {
  if (r->dev >= 0 && perf_copy_to_host(host, r->scratch + SCRATCH_HALF(r), bytes, r->stream))
    die(r, "reading a value back from the GPU");
}

static void barrier(rank_t *r) {
  int one = 1, sum = 0;
  NCCL_OR_DIE(r, ncclAllReduce(dev_in(r, &one, sizeof one), dev_out(r, &sum), 1, ncclInt32, ncclSum, r->comm,
                               r->stream));
  dev_done(r, &sum, sizeof sum);
}

/* Rank 0 prints every rank's line, gathered through the communicator so
 * that other processes' (and hosts') ranks show their own pid and host. */
static void print_devices(rank_t *r) {
  char mine[LINE_BYTES];
  memset(mine, 0, sizeof(mine));
  char name[128] = "[host] host memory";
  if (r->dev >= 0) perf_device_name(r->dev, name, sizeof(name));
  snprintf(mine, sizeof(mine), "#  Rank %2d Group %2d Pid %6d on %10s device %2d %s\n", r->rank, 0,
           (int)getpid(), hostname, r->dev, name);
  char *all = calloc((size_t)nranks, LINE_BYTES);
  if (all == NULL) die(r, "out of memory for the device list");
  NCCL_OR_DIE(r, ncclAllGather(dev_in(r, mine, LINE_BYTES), dev_out(r, all), LINE_BYTES, ncclInt8, r->comm,
                               r->stream));
  dev_done(r, all, (size_t)nranks * LINE_BYTES);
  if (r->is_main) {
    for (int i = 0; i < nranks; i++) {
      char *line = all + (size_t)i * LINE_BYTES;
      line[LINE_BYTES - 1] = '\0';
      fputs(line, stdout);
    }
    const char *t = cfg.cputime ? "cputime" : "time";
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
           "in-place          \n", "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
           "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
  }
  free(all);
}

static void alloc_buffers(rank_t *r) {
  size_t bytes = ((cfg.maxbytes + 4095) & ~(size_t)4095) + 2 * GUARD_BYTES;
  const char *why = NULL;
  r->sendalloc = perf_reg_alloc(cfg.reg, bytes, &why);
  r->recvalloc = r->sendalloc ? perf_reg_alloc(cfg.reg, bytes, &why) : NULL;
  if (!r->sendalloc || !r->recvalloc)
    die(r, "cannot allocate 2 x %zu bytes of host memory for maxbytes %zu%s%s", bytes, cfg.maxbytes,
        why ? ": " : "", why ? why : "");
  if (r->dev < 0) {
    NCCL_OR_DIE(r, perf_reg_register(r->comm, cfg.reg, r->sendalloc, bytes, &r->sendreg));
    NCCL_OR_DIE(r, perf_reg_register(r->comm, cfg.reg, r->recvalloc, bytes, &r->recvreg));
  }
  /* Zeros (not garbage that may be denormal or NaN) until data is checked;
   * touching the pages also keeps first-touch faults out of the timing. */
  memset(r->sendalloc, 0, bytes);
  memset(r->recvalloc, 0, bytes);
  r->send = r->sendalloc + GUARD_BYTES;
  r->recv = r->recvalloc + GUARD_BYTES;
  r->alloc_bytes = bytes;
  if (r->dev < 0)
    return;
  if (perf_dev_alloc((void **)&r->dsendalloc, bytes, "cudaMalloc of the send buffer") ||
      perf_dev_alloc((void **)&r->drecvalloc, bytes, "cudaMalloc of the receive buffer") ||
      perf_dev_alloc((void **)&r->scratch, 2 * SCRATCH_HALF(r), "cudaMalloc of scratch memory"))
    die(r, "cannot allocate device memory for maxbytes %zu", cfg.maxbytes);
  r->dsend = r->dsendalloc + GUARD_BYTES;
  r->drecv = r->drecvalloc + GUARD_BYTES;
}

/* Host mirrors to the device before a checked call, and back after it. */
static void mirror_to_dev(rank_t *r) {
  if (r->dev >= 0 && (perf_copy_to_dev(r->dsendalloc, r->sendalloc, r->alloc_bytes, r->stream) ||
                      perf_copy_to_dev(r->drecvalloc, r->recvalloc, r->alloc_bytes, r->stream)))
    die(r, "copying the input to the GPU");
}

static void mirror_to_host(rank_t *r) {
  if (r->dev >= 0 && (perf_copy_to_host(r->sendalloc, r->dsendalloc, r->alloc_bytes, r->stream) ||
                      perf_copy_to_host(r->recvalloc, r->drecvalloc, r->alloc_bytes, r->stream)))
    die(r, "copying the output from the GPU");
}

static void wait_calls(rank_t *r) {
  if (r->dev >= 0 && perf_stream_sync(r->stream, "cudaStreamSynchronize"))
    die(r, "waiting for the GPU");
}

/* ---- one collective, timed and checked ----------------------------------- */

static void run_once(rank_t *r, const perf_call *c, const perf_counts *cn, int in_place,
                     size_t shift) {
  size_t es = perf_type_size(c->type);
  char *recv = (r->dev >= 0 ? r->drecv : r->recv) + shift, *send = (r->dev >= 0 ? r->dsend : r->send) + shift;
  const void *sb = in_place ? recv + cn->send_inplace_off * (size_t)c->rank * es : send;
  void *rb = in_place ? recv + cn->recv_inplace_off * (size_t)c->rank * es : recv;
  last_failure.call = NULL;
  ncclResult_t res = B->run(c, sb, rb);
  if (res != ncclSuccess)
    die_nccl(r, last_failure.call ? last_failure.call : B->name,
             last_failure.call ? last_failure.file : __FILE__,
             last_failure.call ? last_failure.line : __LINE__, res);
  progress();
}

static double combine_time(rank_t *r, double t) {
  double out = t;
  void *in = dev_in(r, &t, sizeof t), *o = dev_out(r, &out);
  switch (cfg.average) {
    case 0: NCCL_OR_DIE(r, ncclBroadcast(in, o, 1, ncclFloat64, 0, r->comm, r->stream)); break;
    case 1: NCCL_OR_DIE(r, ncclAllReduce(in, o, 1, ncclFloat64, ncclSum, r->comm, r->stream)); break;
    case 2: NCCL_OR_DIE(r, ncclAllReduce(in, o, 1, ncclFloat64, ncclMin, r->comm, r->stream)); break;
    default: NCCL_OR_DIE(r, ncclAllReduce(in, o, 1, ncclFloat64, ncclMax, r->comm, r->stream)); break;
  }
  dev_done(r, &out, sizeof out);
  return cfg.average == 1 ? out / nranks : out;
}

static uint64_t next_seed(rank_t *r) { return 0x5eed0000ull + r->seq++; }

static void bench_time(rank_t *r, const perf_call *c, const perf_counts *cn, perf_op op,
                       int in_place, const char *opname) {
  if (in_place && B->no_in_place) {
    if (r->is_main)
      printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  size_t es = perf_type_size(c->type);
  size_t total = (cn->sendcount > cn->recvcount ? cn->sendcount : cn->recvcount) * es;
  snprintf(r->label, sizeof(r->label), "%s %s %s root %d, %zu bytes, %s", B->name,
           TYPE_NAMES[c->type], opname, B->uses_root ? c->root : -1, total,
           in_place ? "in place" : "out of place");
  perf_check_ctx x = {.bench = B, .call = c, .counts = cn, .op = op, .in_place = in_place,
                      .sendbuff = r->send, .recvbuff = r->recv, .guard = GUARD_BYTES};
  if (cfg.check) {
    x.seed = next_seed(r);
    perf_prepare(&x);
    mirror_to_dev(r);
  }
  run_once(r, c, cn, in_place, 0);
  barrier(r);

  /* Like nccl-tests, move through the buffer from one call to the next, so
   * that small sizes are not always served from the same cache lines. */
  size_t steps = total ? cfg.maxbytes / total : 1;
  if (steps == 0) steps = 1;
  double t0 = now_s();
  for (int it = 0; it < cfg.iters; it++) {
    if (cfg.agg > 1) NCCL_OR_DIE(r, ncclGroupStart());
    for (int a = 0; a < cfg.agg; a++)
      run_once(r, c, cn, in_place, total * (((size_t)it * (size_t)cfg.agg + (size_t)a) % steps));
    if (cfg.agg > 1) NCCL_OR_DIE(r, ncclGroupEnd());
    if (cfg.blocking) barrier(r);
  }
  wait_calls(r);
  double dt = combine_time(r, (now_s() - t0) / ((double)cfg.iters * cfg.agg));
  double algbw = dt > 0 ? (double)total / 1.0e9 / dt : 0;
  double busbw = algbw * B->busbw_factor(nranks);

  int64_t wrong = -1; /* N/A */
  if (cfg.check && (!in_place || B->checks_in_place)) {
    wrong = 0;
    for (int k = 0; k < cfg.check && wrong == 0; k++) {
      x.seed = next_seed(r);
      perf_prepare(&x);
      mirror_to_dev(r);
      run_once(r, c, cn, in_place, 0);
      wait_calls(r);
      mirror_to_host(r);
      int64_t mine = perf_verify(&x, r->label, &r->reports_left);
      r->own_failed += mine != 0;
      NCCL_OR_DIE(r, ncclAllReduce(dev_in(r, &mine, sizeof mine), dev_out(r, &wrong), 1, ncclInt64, ncclSum,
                                   r->comm, r->stream));
      dev_done(r, &wrong, sizeof wrong);
    }
    if (wrong) r->errors++;
  }
  if (r->is_main) {
    double us = dt * 1e6;
    char ts[32], ws[32];
    snprintf(ts, sizeof(ts), us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
    if (wrong < 0) snprintf(ws, sizeof(ws), "N/A");
    else snprintf(ws, sizeof(ws), "%lld", (long long)wrong);
    printf("  %7s  %6.2f  %6.2f  %5s", ts, algbw, busbw, ws);
  }
  r->bw_sum += busbw;
  r->bw_count++;
  r->label[0] = '\0';
}

static void warmup(rank_t *r, perf_call *c, size_t bytes) {
  perf_counts cn;
  B->counts(bytes / perf_type_size(c->type), nranks, &cn);
  c->count = cn.paramcount;
  snprintf(r->label, sizeof(r->label), "%s %s warmup, %zu bytes", B->name, TYPE_NAMES[c->type],
           bytes);
  for (int i = 0; i < cfg.warmup; i++) run_once(r, c, &cn, 0, 0);
  wait_calls(r);
  r->label[0] = '\0';
}

static size_t next_size(size_t size) {
  if (cfg.stepfactor > 1) {
    if (size == 0) return 1; /* 0 * factor would never grow */
    if (size > SIZE_MAX / cfg.stepfactor) return SIZE_MAX;
    return size * cfg.stepfactor;
  }
  if (cfg.stepbytes == 0 || size > SIZE_MAX - cfg.stepbytes) return SIZE_MAX;
  return size + cfg.stepbytes;
}

static void time_test(rank_t *r, ncclDataType_t type, perf_op op, int root) {
  perf_call c = {.rank = r->rank, .nranks = nranks, .root = root < 0 ? 0 : root, .type = type,
                 .op = ncclSum, .comm = r->comm, .stream = r->stream};
  const char *opname = op == PERF_OP_NONE ? "none" : OP_NAMES[op];
  if (op == PERF_OP_MULSUM) {
    unsigned char scalar[8];
    perf_mulsum_scalar(type, r->rank, scalar);
    NCCL_OR_DIE(r, ncclRedOpCreatePreMulSum(&c.op, scalar, type, ncclScalarHostImmediate, r->comm));
  } else if (op != PERF_OP_NONE) {
    c.op = (ncclRedOp_t)op;
  }
  barrier(r);
  warmup(r, &c, cfg.maxbytes);
  warmup(r, &c, cfg.minbytes);
  size_t es = perf_type_size(type);
  for (size_t size = cfg.minbytes; size <= cfg.maxbytes; size = next_size(size)) {
    perf_counts cn;
    B->counts(size / es, nranks, &cn);
    c.count = cn.paramcount;
    if (r->is_main)
      printf("%12zu  %12zu  %8s  %6s  %6d",
             (cn.sendcount > cn.recvcount ? cn.sendcount : cn.recvcount) * es, cn.paramcount,
             TYPE_NAMES[type], opname, B->uses_root ? root : -1);
    bench_time(r, &c, &cn, op, 0, opname);
    bench_time(r, &c, &cn, op, 1, opname);
    if (r->is_main) printf("\n");
    if (size == SIZE_MAX) break;
  }
  if (op == PERF_OP_MULSUM) NCCL_OR_DIE(r, ncclRedOpDestroy(c.op, r->comm));
}

/* The process's peak resident set (VmHWM) in KiB, or -1. */
static int64_t process_hwm_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* What the library (and the process around it) holds beyond the two
 * buffers the benchmark allocated per rank: the process's peak resident
 * set, shared-memory FIFOs the rank touched included, less the threads'
 * buffers, split evenly between the process's ranks. Gathered so that
 * rank 0 reports the worst rank. Called after every test, before
 * teardown, while the communicator still works. */
static void peak_rss(rank_t *r) {
  barrier(r);
  int64_t hwm = process_hwm_kib();
  int64_t mine = hwm < 0 ? -1 : (hwm - (int64_t)cfg.nthreads * (int64_t)(2 * r->alloc_bytes / 1024)) / cfg.nthreads;
  int64_t *all = calloc((size_t)nranks, sizeof *all);
  if (all == NULL) die(r, "out of memory");
  NCCL_OR_DIE(r, ncclAllGather(dev_in(r, &mine, sizeof mine), dev_out(r, all), 1, ncclInt64, r->comm, r->stream));
  dev_done(r, all, (size_t)nranks * sizeof *all);
  r->rss_max = -1;
  r->rss_sum = 0;
  for (int i = 0; i < nranks; i++) {
    if (all[i] > r->rss_max) {
      r->rss_max = all[i];
      r->rss_max_rank = i;
    }
    r->rss_sum += all[i];
  }
  free(all);
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  snprintf(r->label, sizeof(r->label), "communicator setup");
  r->dev = -1;
  if (gpus > 0) {
    /* The rank's place among the ranks of this host picks its GPU. */
    const char *lr = getenv("LOOM_LOCAL_RANK");
    long local = 0;
    if (lr == NULL || parse_long(lr, 0, INT_MAX, &local) != 0) local = proc;
    r->dev = (int)((local * cfg.nthreads + r->thread) % gpus);
    if (perf_set_device(r->dev, "cudaSetDevice") || perf_stream_create(&r->stream))
      die(r, "cannot use GPU %d", r->dev);
  }
  /* Into a local, so that a failed init leaves r->comm NULL for the
   * error message's ncclGetLastError. */
  ncclComm_t comm = NULL;
  NCCL_OR_DIE(r, ncclCommInitRank(&comm, nranks, uid, r->rank));
  r->comm = comm;
  int is_host = 0;
  NCCL_OR_DIE(r, loomCommIsHost(r->comm, &is_host));
  if (is_host != (r->dev < 0))
    die(r, "the library made a %s communicator where the benchmark expected a %s one (is LOOM_DEVICE set the "
        "same for the benchmark and the library?)", is_host ? "host" : "CUDA", is_host ? "CUDA" : "host");
  progress();
  r->label[0] = '\0';
  print_devices(r);
  alloc_buffers(r);

  int types[ncclNumTypes], ntypes = 0;
  for (int t = 0; t < ncclNumTypes; t++)
    if (cfg.type < 0 || cfg.type == t) types[ntypes++] = t;
  int ops[N_OPS], nops = 0;
  if (!B->uses_op) ops[nops++] = PERF_OP_NONE;
  else
    for (int o = 0; o < N_OPS; o++)
      if (cfg.op < 0 || cfg.op == o) ops[nops++] = o;
  int root_lo = -1, root_hi = -1;
  if (B->uses_root) {
    root_lo = cfg.root < 0 ? 0 : cfg.root;
    root_hi = cfg.root < 0 ? nranks - 1 : cfg.root;
  }
  for (int ti = 0; ti < ntypes; ti++)
    for (int oi = 0; oi < nops; oi++)
      for (int root = root_lo; root <= root_hi; root++)
        time_test(r, (ncclDataType_t)types[ti], (perf_op)ops[oi], root);

  peak_rss(r);
  snprintf(r->label, sizeof(r->label), "communicator teardown");
  NCCL_OR_DIE(r, perf_reg_release(r->comm, &r->sendreg));
  NCCL_OR_DIE(r, perf_reg_release(r->comm, &r->recvreg));
  NCCL_OR_DIE(r, ncclCommDestroy(r->comm));
  r->comm = NULL;
  perf_reg_free(cfg.reg, r->sendalloc);
  perf_reg_free(cfg.reg, r->recvalloc);
  perf_dev_free(r->dsendalloc);
  perf_dev_free(r->drecvalloc);
  perf_dev_free(r->scratch);
  perf_stream_destroy(r->stream);
  return NULL;
}

int perf_main(int argc, char **argv, const perf_bench *bench) {
  B = bench;
  const char *slash = strrchr(argv[0], '/');
  progname = slash ? slash + 1 : argv[0];
  setlinebuf(stdout);
  parse_args(argc, argv);
  if (gethostname(hostname, sizeof(hostname)) != 0) snprintf(hostname, sizeof(hostname), "unknown");
  hostname[sizeof(hostname) - 1] = '\0';
  char *dot = strchr(hostname, '.');
  if (dot) *dot = '\0';
  gpus = perf_gpus();
  if (gpus > 0 && cfg.reg)
    bad_arg("-R %d: registered buffers are not implemented yet in this benchmark with GPUs (host ranks only)", cfg.reg);
  setup_ranks();

  if (proc == 0) {
    int version = 0;
    ncclGetVersion(&version);
    printf("# Collective test starting: %s\n", progname);
    printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: %d validation: %d graph: %d\n",
           cfg.nthreads, cfg.ngpus, cfg.minbytes, cfg.maxbytes,
           cfg.stepfactor > 1 ? cfg.stepfactor : cfg.stepbytes,
           cfg.stepfactor > 1 ? "factor" : "bytes", cfg.warmup, cfg.iters, cfg.agg, cfg.check,
           cfg.graph);
    if (cfg.blocking)
      printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
    printf("# Loom %s communicators, NCCL API %d (library %d): %d rank%s as %d process%s x %d "
           "thread%s\n", gpus > 0 ? "CUDA" : "host", NCCL_VERSION_CODE, version, nranks, nranks == 1 ? "" : "s", nprocs,
           nprocs == 1 ? "" : "es", cfg.nthreads, cfg.nthreads == 1 ? "" : "s");
    printf("#\n# Using devices\n");
  }

  progress();
  if (cfg.timeout > 0) {
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0) die(NULL, "cannot start the -T watchdog");
    pthread_detach(wd);
  }
  rank_t *ranks = calloc((size_t)cfg.nthreads, sizeof(rank_t));
  if (ranks == NULL) die(NULL, "out of memory");
  for (int t = 0; t < cfg.nthreads; t++) {
    rank_t *r = &ranks[t];
    r->thread = t;
    r->rank = proc * cfg.nthreads + t;
    r->is_main = r->rank == 0;
    r->reports_left = MAX_REPORTS;
    int e = pthread_create(&r->tid, NULL, rank_main, r);
    if (e != 0) die(NULL, "cannot start the thread of rank %d: %s", r->rank, strerror(e));
  }
  for (int t = 0; t < cfg.nthreads; t++) pthread_join(ranks[t].tid, NULL);

  /* #wrong was summed over all ranks, so every rank knows the outcome. */
  rank_t *r0 = &ranks[0];
#ifdef LOOM_PERF_MPI
  /* The verdict also travels through MPI, outside the library under test,
   * so that a communicator whose AllReduce is broken cannot report its own
   * wrong results as right: each rank's own count of failed checks, the
   * largest over all processes, wins where it is larger. */
  int own = 0;
  for (int t = 0; t < cfg.nthreads; t++)
    if (ranks[t].own_failed > own) own = ranks[t].own_failed;
  own = (int)perf_mpi_max(own);
  if (own > r0->errors) r0->errors = own;
#endif
  double avg_bw = r0->bw_count ? r0->bw_sum / r0->bw_count : 0;
  const char *min_env = getenv("NCCL_TESTS_MIN_BW");
  double min_bw = min_env ? atof(min_env) : -1;
  int bw_failed = min_env && avg_bw < min_bw * 0.9;
  if (proc == 0) {
    printf("# Out of bounds values : %d %s\n", r0->errors, r0->errors ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g %s\n", avg_bw,
           min_env ? (bw_failed ? "FAILED" : "OK") : "");
    if (r0->rss_max >= 0)
      printf("# Peak RSS per rank beyond the benchmark's buffers: max %.1f MiB (rank %d), mean %.1f MiB\n",
             r0->rss_max / 1024.0, r0->rss_max_rank, r0->rss_sum / 1024.0 / nranks);
    printf("#\n");
  }
  int rc = (r0->errors || bw_failed) ? 1 : 0;
  free(ranks);
  fflush(stdout);
#ifdef LOOM_PERF_MPI
  perf_mpi_finalize();
#endif
  return rc;
}
