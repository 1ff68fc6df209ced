/*
 * Inside the emulated CUDA runtime: what emu_runtime.cpp (configuration,
 * memory, streams) and emu_graph.cpp (events, synchronisation, stream
 * capture, graphs, user objects) share. C++, never included by Loom.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_EMU_INTERNAL_H
#define LOOM_EMU_INTERNAL_H

#include <cuda_runtime_api.h>

#include "exec/cuda/emu/emu.h"

#include <pthread.h>
#include <stdint.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace emu {

/* ---- configuration and entry (emu_runtime.cpp) ---- */

struct config {
  int devices = 2;  /* visible ones, after CUDA_VISIBLE_DEVICES */
  int physical[16]; /* a visible device's index among LOOM_EMU_DEVICES */
  unsigned threads = 32;
  unsigned resident = 64;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  const char *bad = nullptr; /* the sentence when the environment is wrong */
  char why[200];
};

extern config g_cfg;
extern thread_local int t_dev;

/* Every entry point starts here: the configuration, once, and the state
 * a real runtime would refuse in. */
cudaError_t enter();
/* e, kept for cudaGetLastError when it is an error. */
cudaError_t ret(cudaError_t e);

#define ENTER()                          \
  do {                                   \
    cudaError_t enter_e_ = emu::enter(); \
    if (enter_e_ != cudaSuccess)         \
      return emu::ret(enter_e_);         \
  } while (0)

/* ---- streams and events ---- */

struct capture;

struct event {
  uint64_t recorded = 0; /* records issued; under g_ev_mu */
  uint64_t done = 0;     /* records run */
  /* The capture sequence the event was last recorded in (its id), 0 if
   * its last record was not captured; under g_cap_mu. */
  uint64_t captured = 0;
};
extern std::mutex g_ev_mu;
extern std::condition_variable g_ev_cv;

struct stream;
struct dep {
  stream *s;
  uint64_t count;
};

enum op_kind { OP_COPY, OP_SET, OP_KERNEL, OP_HOSTFN, OP_RECORD, OP_WAIT, OP_TASK, OP_STOP };

/* A command: queued on a stream, or kept in a graph (copied at each of
 * its launches). */
struct op {
  op_kind kind;
  void *dst = nullptr;
  const void *src = nullptr; /* a kernel's argument */
  size_t n = 0;
  int value = 0;
  emu_kernel_fn kernel = nullptr;
  unsigned blocks = 0;
  cudaHostFn_t fn = nullptr;
  event *ev = nullptr;
  uint64_t gen = 0;
  std::shared_ptr<void> params;     /* what src points at when emu_launch_params copied it */
  std::function<void()> task;       /* OP_TASK: the runtime's own work in stream order */
  std::vector<dep> deps;
};

/* Streams are never freed: a dependency or an event record may still
 * name one after cudaStreamDestroy. They are few. */
struct stream {
  int device;
  bool legacy, blocking;
  capture *cap = nullptr; /* the capture sequence it records into; under g_cap_mu */
  std::mutex mu;
  std::condition_variable cv;
  std::deque<op> q;
  uint64_t enq = 0, done = 0;
  pthread_t th;
  bool joined = false; /* cudaStreamDestroy waits for the thread's end */
};

extern std::mutex g_mu; /* allocations, streams, peer access */
extern std::vector<stream *> g_streams; /* under g_mu */

stream *legacy_of(int dev);
stream *resolve(cudaStream_t h);
/* Queues o on s behind what the legacy stream rule and the allocations
 * say it waits for, whatever s's capture; the count at which it is done. */
uint64_t enqueue(stream *s, op o);
void wait_stream(stream *s, uint64_t count);
void sync_stream(stream *s);
void sync_all();

/* ---- stream capture (emu_graph.cpp) ---- */

/* Queues o on s, or records it into the graph s is capturing into: the
 * CUDA error (a capture invalidated, the legacy stream while a blocking
 * stream captures). *count, if given, gets the count at which it is done
 * (0 when it was captured). */
cudaError_t submit(stream *s, op o, uint64_t *count = nullptr);
/* A call that capture makes unsafe (cudaMalloc, cudaFree, ...) by this
 * thread: cudaSuccess, or the error, and the captures that forbid it are
 * invalidated. */
cudaError_t capture_unsafe();
/* True on the thread that runs user objects' destructors. */
extern thread_local bool t_in_destructor;

} // namespace emu

#endif
