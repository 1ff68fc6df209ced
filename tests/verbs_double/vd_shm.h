/*
 * The head of every shared-memory object of the verbs test double
 * (/dev/shm/loomvd-<kind>-<number>): who owns it, so that stale objects of
 * dead processes can be told apart and removed. Included by the double and
 * by its tests (which look for leftovers of their own processes).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_VD_SHM_H
#define LOOM_VD_SHM_H

#include <stdatomic.h>
#include <stdint.h>

#define VD_SHM_PREFIX "loomvd-"
#define VD_SHM_DIR "/dev/shm"
#define VD_MAGIC 0x6c6d7664u /* "lmvd" */

struct vd_hdr {
  uint32_t magic;
  uint32_t kind;         /* enum vd_kind */
  int32_t owner_pid;
  uint32_t reserved;
  uint64_t owner_start;  /* owner's start time in clock ticks since boot: pids get reused */
  _Atomic uint32_t gone; /* destroyed, or the owner exited */
  uint32_t reserved2;
};

#endif
