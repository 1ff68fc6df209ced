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
 * slot. */
enum slot_where { SLOT_INLINE = 0, SLOT_BY_REF = 1 };
struct slot_ref {
  uint64_t addr; /* in the sender's address space */
};
#ifndef __cplusplus
_Static_assert(sizeof(struct slot_hdr) <= SLOT_HDR_BYTES, "slot header too large");
#endif

#endif
