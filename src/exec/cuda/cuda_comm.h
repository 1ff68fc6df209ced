/*
 * The CUDA executor's state of one communicator, shared by its two halves:
 * cuda_exec.c (the proxy thread, init and teardown) and cuda_launch.c
 * (packing a group's works into launches and starting them). Private to
 * src/exec/cuda/.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CUDA_COMM_H
#define LOOM_CUDA_COMM_H

#include "core.h"
#include "exec/cuda/dev.h"
#include "misc/gpurt.h"
#include "transport/slot_hdr.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdatomic.h>

/* Launch arenas a communicator makes at init (more launches in flight
 * with plans too big for the kernel's parameters wait for the oldest),
 * and at most: a group of many launches, and launches whose plans are in
 * their parameters, which need only an arena's event (up to
 * MAX_ARENAS - MAX_BATCHES of them in flight before one is waited for). */
#define CUDA_ARENAS 4
#define MAX_ARENAS 96
/* Launches one group may need: its lanes beyond what the device holds at
 * once run in later launches (cuda_launch.c). */
#define MAX_BATCHES 32
/* Collectives of recent launches whose headers the proxy compares. */
#define MAX_RECENT 64

/* What a peer's slot for the collective numbered `seq` must say. */
struct expected {
  uint64_t seq;
  int set;
  struct slot_hdr want;
};

struct arena {
  void *host, *dev;
  size_t cap;
  cudaEvent_t done;
  int used;
  /* For the proxy's sentences, under recent_lock: which launch this is,
   * the header of its first work, and how many works of other calls. */
  uint64_t launch_no;
  struct slot_hdr first;
  uint32_t others;
  int reserved; /* packed by cuda_prepare, not launched yet */
};

/* One launch cuda_prepare packed and cuda_launch starts. */
struct batch {
  struct arena *a;       /* its event, and the plan's memory where it is not in the parameters */
  char *captured;        /* the plan of a captured launch too big for its parameters (malloc'd) */
  size_t size, works, tmpl;
  uint32_t lanes;
  struct slot_hdr first; /* its first work's header, for the proxy's sentences */
  uint32_t others;       /* its works of other calls than the first's */
  struct dev_params params; /* last: pack() clears the fields before it */
};

/* Arena memory outgrown: freed with the communicator, never before, since
 * cudaFree waits for every kernel of the device, and one of them may wait
 * for a launch this process has yet to make. */
struct retired {
  void *host, *dev;
  size_t cap;
  struct retired *next;
};

struct cuda_comm {
  struct ncclComm *comm;
  struct dev_status *status, *status_dev;
  struct arena arenas[MAX_ARENAS];
  int narenas;
  struct retired *retired;
  /* What cuda_prepare packed and cuda_launch starts, in order. */
  struct batch ready[MAX_BATCHES];
  int nready;
  int capturing;    /* cuda_prepare found the stream capturing into a CUDA graph */
  uint64_t npacked; /* launches packed, to number them for conn.packed_in */
  cudaEvent_t last; /* recorded after every launch */
  void *last_stream;
  _Atomic int launched; /* set by launches, read by the proxy */
  /* Blocks of the kernel resident at once: the fewest of any rank's
   * device, so that every rank splits a group alike. */
  unsigned max_lanes;
  /* Set by finalize: the proxy reports when every connection's sends have
   * left (drained), or why they cannot. */
  _Atomic int draining, drained;
  /* Connections the proxy watches; appended by the launching thread,
   * read by the proxy up to the published count. */
  struct conn **watch;
  int watch_cap;
  _Atomic int nwatch;
  /* The collective connections this rank receives on, published like
   * `watch`, and the headers recent launches expect: a peer that called
   * another collective may write where this rank's kernel never reads,
   * which only the proxy can see. */
  struct conn **crecv;
  int crecv_cap;
  _Atomic int ncrecv;
  pthread_mutex_t recent_lock;
  struct expected recent[MAX_RECENT]; /* by seq % MAX_RECENT */
  uint64_t nlaunches;
  pthread_t proxy;
  int proxy_started;
  _Atomic int stop;
  /* A kernel's mismatch report becomes the error once, whichever thread
   * sees it first (the proxy, or the caller's next call or query). */
  _Atomic int kernel_reported;
  /* The connections the proxy moves are poisoned on its thread only (a
   * network connection's plugin comm is closed by poisoning, and must not
   * be while the proxy is inside it): another thread asks. */
  _Atomic int poison_asked;
  /* LOOM_TIMEOUT, read at init: the proxy thread never reads the
   * environment, which the program may be changing meanwhile (setenv
   * beside getenv can crash). A loomCommSetTimeout value (comm->timeout_ns)
   * takes its place. */
  int64_t timeout_s;
  int ignore_affinity; /* NCCL_IGNORE_CPU_AFFINITY, for the same reason */
};

static inline ncclResult_t cuda_fail(cudaError_t e, const char *what) {
  char name[160];
  return err_set(ncclUnhandledCudaError, "%s failed: %s (%s)", gpurt_call(what, name, sizeof name),
                 cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUDA_TRY(call, what)            \
  do {                                  \
    cudaError_t cuda_try_e_ = (call);   \
    if (cuda_try_e_ != cudaSuccess)     \
      return cuda_fail(cuda_try_e_, what); \
  } while (0)

/* An arena of at least `size` bytes, not reserved by cuda_prepare, whose
 * earlier launch is done (waited for if need be). */
ncclResult_t cuda_arena_get(struct cuda_comm *cc, size_t size, struct arena **out);
/* A new arena of at least `size` bytes. */
ncclResult_t cuda_arena_add(struct cuda_comm *cc, size_t size, struct arena **out);
/* Frees the device memory of captured plans whose CUDA graphs are gone. */
void cuda_graph_plans_free(void);

#endif
