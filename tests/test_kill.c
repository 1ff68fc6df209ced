/*
 * kill -9 of a rank at a random step of each collective, many times over:
 * N ranks (3 or 4) run one kind of collective in a loop on buffers of many
 * FIFO slots, and one of them (chosen at random) dies by SIGKILL at a
 * random moment: after a random number of completed calls, a second
 * thread of the victim spins for a random time of the order of one call
 * and raises SIGKILL, mostly while its main thread is inside the next
 * call. Every survivor must return an error (never success with wrong
 * data, never a hang) within BOUND_S of the death, with ncclGetLastError
 * naming the dead rank, and then tear its communicator down (ncclCommAbort
 * or ncclCommDestroy, chosen at random) promptly, leaving no segment in
 * /dev/shm. Over shared memory (the default) and over the socket net
 * transport (NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1).
 *
 * LOOM_TIMEOUT is 10 s: the death must be noticed by the exit itself (a
 * pidfd on one host, the closed socket), not by the timeout. The library
 * looks every 100 ms of a stalled wait, and a survivor that waits on
 * another survivor hears of the death one look later: 0.1 to 0.4 s was
 * measured on 2 loaded cores, so BOUND_S (3 s) leaves room for a loaded
 * machine and still fails a death noticed only by LOOM_TIMEOUT. A
 * survivor that waits on another survivor gets "rank 3 failed and
 * abandoned the operation" (shared memory) or "the connection was closed
 * by the peer" (sockets); the message must still name the dead rank,
 * which on one host the library learns from its pidfds.
 *
 * On a CUDA communicator (every one of loom_tests_emu, or with a GPU) a
 * call only queues its kernel on the stream: here a call is done when its
 * kernel is (tbuf_result), the failure a survivor must see is the
 * communicator's asynchronous error, when it shows, with its sentence in
 * ncclGetLastError, and the checks are the same.
 *
 * The seed is printed; LOOM_TEST_SEED replays one, LOOM_KILL_REPS changes
 * the number of repetitions (REPS by default; fewer when a loaded machine
 * runs past BUDGET_S, but never fewer than MIN_REPS).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { MAXR = 4, COUNT = 1 << 20, MAX_ITERS = 10000, REPS = 40, MIN_REPS = 10 };
/* Death to the survivor's error. A sanitizer build runs the same checks
 * several times slower (ThreadSanitizer most) and is there for races, not
 * speed: its bound is wider, still short of LOOM_TIMEOUT. */
#if defined(LOOM_TEST_TIME_SCALE) && LOOM_TEST_TIME_SCALE > 1
#define BOUND_S 8.0
#else
#define BOUND_S 3.0
#endif
#define TEARDOWN_S 5.0 /* ncclCommAbort / ncclCommDestroy after the error */
#define BUDGET_S 100.0 /* stop adding repetitions past this */
#define REP_LIMIT_S 60.0 /* one repetition, init included: past it, a hang */

enum kcoll { K_ALLREDUCE, K_ALLGATHER, K_REDUCESCATTER, K_BROADCAST, K_REDUCE, K_SENDRECV };
static const char *const kcoll_name[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send/Recv"};

/* What each rank reports, in memory shared by the test and its ranks. */
struct rank_report {
  _Atomic int in_call;  /* the victim's main thread is inside a call */
  int calls_done;
  int died_in_call;     /* victim: in_call when it raised SIGKILL */
  double t_kill;        /* victim: just before raise(SIGKILL) */
  double t_err;         /* survivor: when the failing call returned */
  double t_teardown;    /* survivor: how long abort/destroy took */
  int result;           /* survivor: what the failing call returned */
  int iter;             /* survivor: which call failed */
  int done;             /* survivor: all of the above is filled in */
  int fds[2], threads[2], shm_maps; /* survivor: before init, after teardown */
  char msg[1024];       /* survivor: ncclGetLastError after the failure */
};

struct rep {
  enum kcoll coll;
  int nranks, victim, root, warm, destroy;
  int cuda;         /* the ranks see a CUDA device: their communicators are CUDA ones */
  const char *algo; /* NCCL_ALGO, or NULL for the tuner's choice */
  int channels;     /* NCCL_MIN/MAX_NCHANNELS, or 0 for the tuner's */
  unsigned seed;
  struct rank_report *rep; /* shared, nranks of them */
};

/* Values whose sums over up to 4 ranks are exact in float. */
static float value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 13 + 1)); }
static float sum_value(int n, size_t i) { return (float)(n * (n + 1) / 2 * (int)(i % 13 + 1)); }

/* AllGather and ReduceScatter: COUNT / nranks per rank. */
static size_t per_rank(const struct rep *k) { return COUNT / (size_t)k->nranks; }
static size_t send_count(const struct rep *k) {
  return k->coll == K_ALLGATHER ? per_rank(k) : k->coll == K_REDUCESCATTER ? per_rank(k) * k->nranks : COUNT;
}
static size_t recv_count(const struct rep *k) {
  return k->coll == K_REDUCESCATTER ? per_rank(k) : k->coll == K_ALLGATHER ? per_rank(k) * k->nranks : COUNT;
}

static ncclResult_t one_call(const struct rep *k, int rank, const float *send, float *recv, ncclComm_t comm) {
  int n = k->nranks;
  switch (k->coll) {
  case K_ALLREDUCE:
    return ncclAllReduce(send, recv, COUNT, ncclFloat, ncclSum, comm, NULL);
  case K_ALLGATHER:
    return ncclAllGather(send, recv, per_rank(k), ncclFloat, comm, NULL);
  case K_REDUCESCATTER:
    return ncclReduceScatter(send, recv, per_rank(k), ncclFloat, ncclSum, comm, NULL);
  case K_BROADCAST:
    return ncclBroadcast(send, recv, COUNT, ncclFloat, k->root, comm, NULL);
  case K_REDUCE:
    return ncclReduce(send, recv, COUNT, ncclFloat, ncclSum, k->root, comm, NULL);
  case K_SENDRECV: {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
      return r;
    ncclResult_t a = ncclSend(send, COUNT, ncclFloat, (rank + 1) % n, comm, NULL);
    ncclResult_t b = ncclRecv(recv, COUNT, ncclFloat, (rank + n - 1) % n, comm, NULL);
    r = ncclGroupEnd();
    return a != ncclSuccess ? a : b != ncclSuccess ? b : r;
  }
  }
  return ncclInternalError;
}

static void fill_send(const struct rep *k, int rank, float *send) {
  size_t n = send_count(k);
  for (size_t i = 0; i < n; i++)
    send[i] = value(rank, k->coll == K_ALLGATHER ? i + (size_t)rank * n : i);
}

/* The index of the first wrong element of recv after a successful call,
 * or -1 when it is all right. */
static long check_recv(const struct rep *k, int rank, const float *recv) {
  int n = k->nranks;
  size_t cnt = recv_count(k);
  if (k->coll == K_REDUCE && rank != k->root)
    return -1;
  for (size_t i = 0; i < cnt; i++) {
    float want;
    switch (k->coll) {
    case K_ALLREDUCE:
    case K_REDUCE:
      want = sum_value(n, i);
      break;
    case K_REDUCESCATTER:
      want = sum_value(n, i + (size_t)rank * cnt);
      break;
    case K_ALLGATHER:
      want = value((int)(i / per_rank(k)), i);
      break;
    case K_BROADCAST:
      want = value(k->root, i);
      break;
    default:
      want = value((rank + n - 1) % n, i);
      break;
    }
    if (recv[i] != want)
      return (long)i;
  }
  return -1;
}

struct killer_arg {
  struct rank_report *me;
  unsigned spin_us;
};

/* Spins (the victim's other thread), then dies as kill -9 would kill it. */
static void *killer(void *p) {
  struct killer_arg *a = p;
  double t0 = now_s();
  while (now_s() - t0 < a->spin_us * 1e-6)
    ;
  a->me->died_in_call = atomic_load(&a->me->in_call);
  a->me->t_kill = now_s();
  raise(SIGKILL);
  return NULL;
}

/* Whether msg names rank r as a peer: "rank 2 (pid 123 on host) has
 * exited", "rank 2 (host) over NET/Socket: ...", "straight from rank 2
 * (host, pid 123)"; never the survivor's own "rank 0, AllReduce". */
static int names_rank(const char *msg, int r) {
  char pat[16];
  snprintf(pat, sizeof pat, "rank %d (", r);
  return strstr(msg, pat) != NULL;
}

/* Mappings of shared-memory segments: a connection's, left behind. */
static int shm_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    /* Segments are memfds now (an unnamed /dev/shm inode where memfds are
     * refused); named ones are what older builds made. */
    n += strstr(line, "memfd:loom-shm") || strstr(line, "/dev/shm/loom-") || strstr(line, "/dev/shm/#");
  if (f)
    fclose(f);
  return n;
}

/* A call's outcome: on a CUDA communicator the call only queues its
 * kernel, so this waits for it (tbuf_result), and what the kernel met is
 * the asynchronous error; a host one's call is done when it returns. */
static ncclResult_t call_done(const struct rep *k, int rank, const float *send, float *recv, ncclComm_t comm) {
  return tbuf_result(comm, one_call(k, rank, send, recv, comm));
}

static int kill_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct rep *k = arg;
  struct rank_report *me = &k->rep[rank];
  /* The CUDA runtime's own threads and fds, which stay for the process's
   * life, are there before the count. */
  if (k->cuda)
    tbuf_cuda_warm();
  me->fds[0] = harness_count_entries("/proc/self/fd", NULL);
  me->threads[0] = harness_count_entries("/proc/self/task", NULL);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  /* send and recv are what the calls take (device memory on a CUDA
   * communicator); hsend and hrecv their host views (the same buffers on a
   * host one). */
  int cuda = tbuf_is_cuda(comm);
  float *send = tbuf_alloc(comm, sizeof *send * COUNT), *recv = tbuf_alloc(comm, sizeof *recv * COUNT);
  float *hsend = cuda ? malloc(sizeof *hsend * COUNT) : send, *hrecv = cuda ? malloc(sizeof *hrecv * COUNT) : recv;
  RASSERT(send && recv && hsend && hrecv, "out of memory");
  fill_send(k, rank, hsend);
  RASSERT(!cuda || tbuf_put(comm, send, hsend, sizeof *send * send_count(k)) == 0, "copy to the device");
  if (rank == k->victim) {
    /* Warm calls, timed: the kill then comes within about one more. */
    double t0 = now_s();
    for (int it = 0; it < k->warm; it++)
      RCHECK(comm, call_done(k, rank, send, recv, comm));
    double per_call = (now_s() - t0) / k->warm;
    srand(k->seed);
    struct killer_arg a = {me, (unsigned)(per_call * 1e6 * (rand() % 1000) / 800.0)};
    pthread_t th;
    RASSERT(pthread_create(&th, NULL, killer, &a) == 0, "pthread_create");
    for (;;) {
      atomic_store(&me->in_call, 1);
      call_done(k, rank, send, recv, comm);
      atomic_store(&me->in_call, 0);
      me->calls_done++;
    }
  }
  ncclResult_t r = ncclSuccess;
  int it;
  for (it = 0; it < MAX_ITERS; it++) {
    /* NaN: what no call writes */
    RASSERT(tbuf_set(comm, recv, 0xff, sizeof *recv * recv_count(k)) == 0, "filling the receive buffer");
    r = call_done(k, rank, send, recv, comm);
    if (r != ncclSuccess)
      break;
    RASSERT(!cuda || tbuf_get(comm, hrecv, recv, sizeof *recv * recv_count(k)) == 0, "copy from the device");
    long bad = check_recv(k, rank, hrecv);
    RASSERT(bad < 0, "rank %d: %s #%d succeeded with element %ld wrong (%g)", rank, kcoll_name[k->coll], it, bad,
            hrecv[bad]);
  }
  me->t_err = now_s();
  me->result = (int)r;
  me->iter = it;
  snprintf(me->msg, sizeof me->msg, "%s", ncclGetLastError(comm));
  RASSERT(r != ncclSuccess, "rank %d: %d calls succeeded with rank %d killed", rank, MAX_ITERS, k->victim);
  double t0 = now_s();
  if (k->destroy)
    RCHECK(NULL, ncclCommDestroy(comm));
  else
    RCHECK(NULL, ncclCommAbort(comm));
  me->t_teardown = now_s() - t0;
  /* After the buffers: a device buffer of the emulation holds an fd. */
  tbuf_free(send);
  tbuf_free(recv);
  if (cuda) {
    free(hsend);
    free(hrecv);
  }
  me->fds[1] = harness_count_entries("/proc/self/fd", NULL);
  me->threads[1] = harness_count_entries("/proc/self/task", NULL);
  me->shm_maps = shm_maps();
  me->done = 1;
  return 0;
}

struct totals {
  int reps, kills, in_call, survivors, by_name;
  double max_detect, sum_detect, max_teardown;
};

static int run_rep(struct rep *k, struct totals *t) {
  memset(k->rep, 0, sizeof *k->rep * MAXR);
  pid_t pids[MAXR];
  int status[MAXR];
  ASSERT(start_ranks(k->nranks, kill_rank, k, pids, NULL) == 0);
  int hung = wait_ranks_within(k->nranks, pids, status, REP_LIMIT_S);
  int failed = 0;
  if (hung) {
    fprintf(stderr, "a rank was still running %.0f s after the start: a hang\n", REP_LIMIT_S);
    failed = 1;
  }
  const struct rank_report *v = &k->rep[k->victim];
  if (!WIFSIGNALED(status[k->victim]) || WTERMSIG(status[k->victim]) != SIGKILL || v->t_kill == 0) {
    fprintf(stderr, "the victim, rank %d, did not die by its SIGKILL (status 0x%x)\n", k->victim, status[k->victim]);
    failed = 1;
  } else {
    t->kills++;
    t->in_call += v->died_in_call;
  }
  for (int r = 0; r < k->nranks; r++) {
    if (r == k->victim)
      continue;
    const struct rank_report *s = &k->rep[r];
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0 || !s->done) {
      fprintf(stderr, "survivor rank %d ended with status 0x%x (its report %s)\n", r, status[r],
              s->done ? "is complete" : "is not complete");
      failed = 1;
      continue;
    }
    double detect = s->t_err - v->t_kill;
    t->survivors++;
    if (detect > t->max_detect)
      t->max_detect = detect;
    t->sum_detect += detect;
    if (s->t_teardown > t->max_teardown)
      t->max_teardown = s->t_teardown;
    if (s->result != ncclRemoteError && s->result != ncclSystemError) {
      fprintf(stderr, "rank %d: the failing call returned %d, not ncclRemoteError or ncclSystemError\n", r, s->result);
      failed = 1;
    }
    if (detect > BOUND_S) {
      fprintf(stderr, "rank %d: the error came %.2f s after the kill, more than %.1f s\n", r, detect, BOUND_S);
      failed = 1;
    }
    if (s->t_teardown > TEARDOWN_S) {
      fprintf(stderr, "rank %d: %s took %.2f s\n", r, k->destroy ? "ncclCommDestroy" : "ncclCommAbort", s->t_teardown);
      failed = 1;
    }
    /* Rank 0's bootstrap root (a thread and a socket) may still be there
     * before the init, and is gone after it: no more than before. */
    if (s->fds[1] > s->fds[0] || s->threads[1] > s->threads[0] || s->shm_maps != 0) {
      fprintf(stderr, "rank %d: after the teardown %d fds (%d before the init), %d threads (%d), %d shared-memory "
              "mappings\n", r, s->fds[1], s->fds[0], s->threads[1], s->threads[0], s->shm_maps);
      failed = 1;
    }
    if (!names_rank(s->msg, k->victim)) {
      fprintf(stderr, "rank %d: the message does not name the dead rank %d: %s\n", r, k->victim, s->msg);
      failed = 1;
    } else {
      t->by_name++;
    }
    /* Its sockets close as it dies, before its exit shows: the message
     * must not call it alive. */
    char alive[64];
    snprintf(alive, sizeof alive, "rank %d (pid %d on ", k->victim, (int)pids[k->victim]);
    const char *at = strstr(s->msg, alive), *end = at ? strchr(at, ')') : NULL;
    if (end && strncmp(end, ") is still running", strlen(") is still running")) == 0) {
      fprintf(stderr, "rank %d: the message calls the killed rank %d alive: %s\n", r, k->victim, s->msg);
      failed = 1;
    }
  }
  /* Segments are unlinked once both sides have mapped them, so not even
   * the victim's stay behind. */
  for (int r = 0; r < k->nranks; r++) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "loom-%d-", (int)pids[r]);
    int left = harness_count_entries("/dev/shm", prefix);
    if (left != 0) {
      fprintf(stderr, "rank %d left %d segments in /dev/shm\n", r, left);
      failed = 1;
    }
  }
  /* What the survivors saw: for the first repetition, and any that failed. */
  if (failed || t->reps == 0)
    printf("  rank %d died %s call %d\n", k->victim, v->died_in_call ? "inside" : "after", v->calls_done + k->warm);
  if (failed || t->reps == 0)
    for (int r = 0; r < k->nranks; r++)
      if (r != k->victim && k->rep[r].done)
        printf("  rank %d: %s #%d returned %s %.3f s after the kill (teardown %.3f s): %s\n", r, kcoll_name[k->coll],
               k->rep[r].iter, ncclGetErrorString((ncclResult_t)k->rep[r].result), k->rep[r].t_err - v->t_kill,
               k->rep[r].t_teardown, k->rep[r].msg);
  t->reps++;
  return failed;
}

static int kill_test(const char *name, enum kcoll coll) {
  setenv("LOOM_TIMEOUT", "10", 1);
  const char *s = getenv("LOOM_TEST_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
  const char *reps_env = getenv("LOOM_KILL_REPS");
  int reps = reps_env ? atoi(reps_env) : REPS;
  printf("%s: seed %u (LOOM_TEST_SEED replays it), %d repetitions\n", name, seed, reps);
  struct rank_report *shared =
      mmap(NULL, sizeof *shared * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(shared != MAP_FAILED);
  /* Asked in a child: this process forks the ranks. */
  int cuda = harness_cuda_devices() > 0;
  srand(seed);
  struct totals t = {0};
  double t0 = now_s();
  int failed = 0;
  for (int i = 0; i < reps && !failed; i++) {
    if (i >= MIN_REPS && now_s() - t0 > BUDGET_S && !reps_env) {
      printf("%s: stopping after %d repetitions, %.0f s (a loaded machine)\n", name, i, now_s() - t0);
      break;
    }
    struct rep k = {.coll = coll, .rep = shared, .cuda = cuda};
    k.nranks = 3 + rand() % 2;
    k.victim = rand() % k.nranks;
    k.root = rand() % k.nranks;
    k.warm = 1 + rand() % 4;
    k.destroy = rand() % 2;
    static const char *const algos[] = {NULL, "Ring", "Tree"};
    k.algo = algos[rand() % 3];
    k.channels = rand() % 2 ? 0 : 2 + rand() % 3;
    k.seed = (unsigned)rand();
    char ch[16];
    snprintf(ch, sizeof ch, "%d", k.channels);
    printf("rep %d: %d ranks, rank %d killed after %d call%s%s%s, %s%s, %s%s\n", i, k.nranks, k.victim, k.warm,
           k.warm == 1 ? "" : "s",
           coll == K_BROADCAST || coll == K_REDUCE ? (k.root == k.victim ? ", the root" : ", not the root") : "",
           k.destroy ? ", survivors destroy" : ", survivors abort", k.algo ? "NCCL_ALGO=" : "tuner's algorithm",
           k.algo ? k.algo : "", k.channels ? ch : "tuner's", k.channels ? " channels" : " channels");
    /* For every rank alike: the ranks inherit the environment. */
    if (k.algo)
      setenv("NCCL_ALGO", k.algo, 1);
    if (k.channels) {
      setenv("NCCL_MIN_NCHANNELS", ch, 1);
      setenv("NCCL_MAX_NCHANNELS", ch, 1);
    }
    failed = run_rep(&k, &t);
    unsetenv("NCCL_ALGO");
    unsetenv("NCCL_MIN_NCHANNELS");
    unsetenv("NCCL_MAX_NCHANNELS");
    if (failed)
      fprintf(stderr, "%s: repetition %d failed (seed %u)\n", name, i, seed);
  }
  printf("%s: %d kills (%d inside a call), %d survivors returned an error in max %.3f s (mean %.3f s), %d named the "
         "dead rank; teardown max %.3f s; %.1f s in all\n",
         name, t.kills, t.in_call, t.survivors, t.max_detect, t.survivors ? t.sum_detect / t.survivors : 0.0, t.by_name,
         t.max_teardown, now_s() - t0);
  munmap(shared, sizeof *shared * MAXR);
  return failed;
}

static int kill_test_socket(const char *name, enum kcoll coll) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  return kill_test(name, coll);
}

TEST_IMPL(kill_allreduce_shm) { return kill_test("kill_allreduce_shm", K_ALLREDUCE); }
TEST_IMPL(kill_allgather_shm) { return kill_test("kill_allgather_shm", K_ALLGATHER); }
TEST_IMPL(kill_reducescatter_shm) { return kill_test("kill_reducescatter_shm", K_REDUCESCATTER); }
TEST_IMPL(kill_broadcast_shm) { return kill_test("kill_broadcast_shm", K_BROADCAST); }
TEST_IMPL(kill_reduce_shm) { return kill_test("kill_reduce_shm", K_REDUCE); }
TEST_IMPL(kill_sendrecv_shm) { return kill_test("kill_sendrecv_shm", K_SENDRECV); }
TEST_IMPL(kill_allreduce_socket) { return kill_test_socket("kill_allreduce_socket", K_ALLREDUCE); }
TEST_IMPL(kill_allgather_socket) { return kill_test_socket("kill_allgather_socket", K_ALLGATHER); }
TEST_IMPL(kill_reducescatter_socket) { return kill_test_socket("kill_reducescatter_socket", K_REDUCESCATTER); }
TEST_IMPL(kill_broadcast_socket) { return kill_test_socket("kill_broadcast_socket", K_BROADCAST); }
TEST_IMPL(kill_reduce_socket) { return kill_test_socket("kill_reduce_socket", K_REDUCE); }
TEST_IMPL(kill_sendrecv_socket) { return kill_test_socket("kill_sendrecv_socket", K_SENDRECV); }
