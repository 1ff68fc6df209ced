/*
 * What the CUDA executor hands its kernel: plain structures shared by the
 * host code that builds a launch (cuda_exec.c) and the kernel (kernel.cu).
 * A launch runs one communicator's group: one thread block per lane, each
 * walking its works' schedule steps in order, one FIFO slot at a time,
 * exactly as the host executor does.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CUDA_DEV_H
#define LOOM_CUDA_DEV_H

#include <stdint.h>

#include "exec/sched.h"
#include "exec/reduce.h"
#include "transport/slot_hdr.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One side of a connection as the GPU sees it; base is NULL when unused. */
struct dev_conn {
  char *base;         /* slot 0, device-visible */
  char *hdrs;         /* the headers, SLOT_HDR_BYTES apart, where they are kept apart from the slots (in
                         mapped host memory, for the proxy); NULL: each slot starts with its header */
  uint64_t stride;    /* bytes per slot, header included */
  char *ll;           /* the LL slots, LL_STRIDE apart (slot_hdr.h); NULL where there are none */
  uint64_t *tail;     /* slots posted by the sender */
  uint64_t *head;     /* slots released by the receiver */
  /* This side's slot count, which only this side's kernels write: read
   * when a work starts and written back when it ends, so that a launch
   * replayed from a CUDA graph goes on from where the last one stopped
   * (the host cannot count replays). Where it is the side's own counter
   * (tail of a send, head of a receive), nothing is written back. */
  uint64_t *step;
  int32_t peer;
  int32_t pad;
};

/* A work as packed into a launch: its connections and step templates
 * are found by offset from the plan's start, since the plan may travel
 * in the kernel's parameters, whose address the host never learns. */
struct dev_work {
  const char *src;
  char *dst;
  struct schedule sched;   /* tmpl is set by the kernel, from tmpl_off */
  uint32_t esize;
  uint32_t tmpl_off;       /* its step templates, from the plan's start */
  uint64_t piece;          /* elements per slot */
  struct red_op red;
  const void *scalar_dev;  /* PreMulSum scalar read on the device, or NULL */
  struct slot_hdr mine;    /* what this rank writes into the slots it sends */
  struct slot_hdr expect;  /* what it must find in the slots it receives */
  int32_t check_seq;       /* collectives compare sequence numbers, p2p not */
  int32_t nsends, nrecvs;
  uint32_t conn0;          /* its sends, then its receives: the plan's conns[conn0...] (steps name them by si / ri) */
  uint32_t proto;          /* enum loom_proto: how its slots move (PROTO_LL: kernel_ll.cuh) */
};

struct dev_lane {
  uint32_t first, count; /* works [first, first + count) */
};

/* In mapped host memory, one per communicator: the proxy thread tells
 * running kernels to stop, and a kernel says why it stopped. */
struct dev_status {
  volatile int32_t abort;
  volatile int32_t error;  /* DEV_ERR_*, published after the fields below */
  volatile int32_t claim;  /* taken by the block that writes them */
  volatile int32_t lane, work, step;
  volatile int32_t peer;   /* the rank whose slot did not match */
  /* The proxy's sign of life: written by the kernels, never read by them
   * (a read of host memory would stall a block for a PCIe round trip). A
   * block writes the GPU's global timer, so any write changes it. */
  volatile uint64_t progress;
  struct slot_hdr got, want;
};

enum { DEV_ERR_NONE = 0, DEV_ERR_MISMATCH = 1, DEV_ERR_ABORTED = 2 };

/* What a launch hands its kernel, by value: the header, and the plan
 * itself (lanes, works, connections, step templates, at the offsets the
 * header gives) in `inline_plan` when it fits, so that a small call is a
 * single launch with nothing copied before it and a CUDA graph captures
 * the plan with the launch; else in device memory at `plan`. The total
 * stays within the 4 KiB of parameters every CUDA version takes. */
#define DEV_PARAM_BYTES 4096
struct dev_plan {
  uint32_t nlanes, nworks;
  struct dev_status *status; /* device pointer */
  const char *plan;          /* NULL: the plan is inline_plan */
  uint32_t lanes_off, works_off, conns_off;
  uint32_t size;
};
#define DEV_INLINE_BYTES (DEV_PARAM_BYTES - 64)
struct dev_params {
  struct dev_plan hdr;
  char inline_plan[DEV_INLINE_BYTES] __attribute__((aligned(64)));
};

#define DEV_THREADS 512

/* Launches the plan with `nlanes` blocks on `stream`; the parameters are
 * copied at the call. The CUDA error code, 0 on success. */
int cuda_kernel_launch(const struct dev_params *params, uint32_t nlanes, void *stream);

/* How many lanes (blocks) of the kernel can be resident on the current
 * device at once: a launch's lanes wait on each other, so it must not
 * need more. The CUDA error code. */
int cuda_kernel_max_lanes(unsigned *lanes);

/* For the kernel bandwidth benchmark: dst = a OP b over n elements with
 * the executor's reduction loop on a full grid. */
int cuda_bench_reduce(const struct red_op *op, void *dst, const void *a, const void *b, uint64_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
