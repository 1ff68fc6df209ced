/*
 * The header at the start of every FIFO slot: what the sender thinks the
 * operation is, so a receiver can name a mismatch. Shared by the host
 * executor and the CUDA kernels (plain C, no atomics).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SLOT_H
#define LOOM_SLOT_H

#include <stdint.h>

struct slot_hdr {
  uint64_t count;  /* the sender's count argument */
  uint32_t bytes;  /* payload bytes in this slot */
  uint8_t coll;    /* enum coll_kind */
  uint8_t dtype;
  uint8_t op;      /* red_op_code of the op (common/red_op.h) */
  uint8_t where;   /* enum slot_where */
  int32_t root;
  uint32_t sender; /* rank that wrote the slot */
  uint64_t seq;    /* the sender's operation number on this connection */
};
#define SLOT_HDR_BYTES 64

/* Where a slot's payload is. By reference (single copy between host
 * processes), the slot holds a struct slot_ref and the payload stays in
 * the sender's buffer until the receiver has read it and released the
 * slot. SLOT_BY_CPU marks a flat call's header in the arena whose data
 * goes into its CPU's sum rather than its rank's region (exec/flat.c). */
enum slot_where { SLOT_INLINE = 0, SLOT_BY_REF = 1, SLOT_BY_CPU = 2 };
struct slot_ref {
  uint64_t addr; /* in the sender's address space */
};
/* The protocols a CUDA kernel moves a work's slots with (dev_work.proto). */
enum loom_proto { PROTO_SIMPLE = 0, PROTO_LL = 1 };

/* LL ("low latency", NCCL's protocol for small messages): after its
 * Simple slots, a connection that a CUDA kernel uses has NCCL_STEPS LL
 * slots of its own, so that calls of either protocol follow each other
 * without a drain. An LL slot is lines of 16 bytes {data32, flag32,
 * data32, flag32}, each written in one store: a receiver polls a line
 * until both flags are the slot use's flag, with no counter and no
 * fence. Each 8-byte half carries its own flag, so a line is whole even
 * where only 8-byte stores are atomic (the emulation). The first
 * LL_HDR_LINES lines carry the slot's struct slot_hdr, the rest 8 bytes
 * of payload each. */
#define LL_LINE_BYTES 16
#define LL_HDR_LINES 4
#define LL_SLOT_DATA 32768 /* payload bytes per LL slot: a piece stays small */
#define LL_STRIDE ((LL_HDR_LINES + LL_SLOT_DATA / 8) * LL_LINE_BYTES)
#define LL_FIFO_BYTES (NCCL_STEPS * LL_STRIDE)

#ifndef __cplusplus
_Static_assert(sizeof(struct slot_hdr) <= SLOT_HDR_BYTES, "slot header too large");
_Static_assert(sizeof(struct slot_hdr) <= LL_HDR_LINES * 8, "slot header does not fit its LL lines");
#endif

#endif
