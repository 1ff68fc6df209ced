/*
 * The shared part of the nccl-tests compatible benchmarks. Each benchmark
 * file describes one collective with a perf_bench (how its buffers are
 * sized, how to call it, where each output element comes from, its busbw
 * factor) and calls perf_main; everything else (command line, ranks as
 * threads and/or processes, timing, data checking, output) lives in
 * common.c and data.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PERF_COMMON_H
#define LOOM_PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Element counts of one call, in nccl-tests' terms. */
typedef struct {
  size_t sendcount;        /* elements in each rank's input */
  size_t recvcount;        /* elements in each rank's output */
  size_t paramcount;       /* the count argument of the call */
  size_t send_inplace_off; /* in place, the input is at recvbuff + rank * this */
  size_t recv_inplace_off; /* in place, the output is at recvbuff + rank * this */
} perf_counts;

/* One call as a benchmark's run and expect functions see it. */
typedef struct {
  int rank, nranks, root;
  size_t count; /* the call's count argument (paramcount) */
  ncclDataType_t type;
  ncclRedOp_t op;
  ncclComm_t comm;
  void *stream; /* cudaStream_t on a CUDA communicator, NULL on a host one */
} perf_call;

/* Where one element of a rank's output comes from. */
typedef enum {
  PERF_SRC_REDUCE, /* the reduction over all ranks of their input[index] */
  PERF_SRC_COPY,   /* input[index] of rank `rank` */
  PERF_SRC_POISON  /* nothing: the call must leave it as it was */
} perf_src_kind;

typedef struct {
  perf_src_kind kind;
  int rank;
  size_t index;
} perf_src;

typedef struct {
  const char *name;    /* "AllReduce" */
  int uses_op;         /* has a reduction operator (-o applies, redop column) */
  int uses_root;       /* has a root (-r applies, root column) */
  int checks_in_place; /* 0: in place is timed but not checked (#wrong N/A), as nccl-tests */
  int no_in_place;     /* 1: the call has no in-place form (AlltoAll): that half of the line is N/A */
  double (*busbw_factor)(int nranks);
  /* Sizes for a buffer of `count` elements (the -b..-e size divided by the
   * element size), rounded down to whole elements per rank. */
  void (*counts)(size_t count, int nranks, perf_counts *c);
  ncclResult_t (*run)(const perf_call *c, const void *sendbuff, void *recvbuff);
  void (*expect)(const perf_call *c, int in_place, size_t j, perf_src *src);
} perf_bench;

int perf_main(int argc, char **argv, const perf_bench *bench);

size_t perf_type_size(ncclDataType_t type);

/* For run functions: on failure, remember which call failed (for the error
 * message perf_main prints) and return its result. */
void perf_note_failure(const char *call, const char *file, int line);
#define PERF_NCCL(call)                                    \
  do {                                                     \
    ncclResult_t perf_r_ = (call);                         \
    if (perf_r_ != ncclSuccess) {                          \
      perf_note_failure(#call, __FILE__, __LINE__);        \
      return perf_r_;                                      \
    }                                                      \
  } while (0)

/* ---- data.c: inputs, expected outputs and checking ----------------------- */

/* The operators as the benchmarks name them; PERF_OP_NONE for collectives
 * without one. MULSUM is ncclRedOpCreatePreMulSum's operator. */
typedef enum {
  PERF_OP_SUM,
  PERF_OP_PROD,
  PERF_OP_MAX,
  PERF_OP_MIN,
  PERF_OP_AVG,
  PERF_OP_MULSUM,
  PERF_OP_NONE
} perf_op;

typedef struct {
  const perf_bench *bench;
  const perf_call *call;
  const perf_counts *counts;
  perf_op op;
  int in_place;
  uint64_t seed;
  char *sendbuff; /* the out-of-place input */
  char *recvbuff; /* the output, and the input in place */
  size_t guard;   /* bytes of poison checked before recvbuff and after the data */
} perf_check_ctx;

/* The input of a check run: poisons the output area and its guards, writes
 * this rank's input where the call will read it. */
void perf_prepare(const perf_check_ctx *x);
/* Number of wrong elements on this rank after the call; prints the first
 * few mismatches (while *reports_left > 0) to stderr. */
int64_t perf_verify(const perf_check_ctx *x, const char *label, int *reports_left);
/* The PreMulSum scalar of `rank` in `type`'s representation (up to 8 bytes). */
void perf_mulsum_scalar(ncclDataType_t type, int rank, void *out);

#endif
