/*
 * Where communicators live: slots of memory that the process never hands
 * out twice, so that a destroyed communicator's handle can never name a
 * newer one. ncclComm_t stays a plain pointer (NCCL's ABI), and any
 * pointer can be asked whether it is a live communicator without reading
 * memory that is not Loom's.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_COMM_SLOTS_H
#define LOOM_COMM_SLOTS_H

#include <stddef.h>

#include "nccl.h"

/* `size` zeroed bytes at an address no earlier slot had. */
ncclResult_t comm_slot_alloc(size_t size, void **out);
/* Gives the slot's memory back; its address stays reserved and reads as
 * zeros, so a stale handle finds no communicator there. */
void comm_slot_free(void *p);
/* Whether `p` is the start of a slot handed out and not yet freed. */
int comm_slot_live(const void *p);

#endif
