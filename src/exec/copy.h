/*
 * Copies into memory that is not read again soon: an output far larger
 * than the caches. Ordinary stores read each line before writing it (the
 * read-for-ownership), a third of the memory traffic of a copy; streaming
 * stores write whole lines without reading them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_COPY_H
#define LOOM_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Calls of at least this many bytes (a rank's count) write the outputs
 * they have not read with copy_streaming: the flat AllReduce's gathers
 * and writes into windows (flat.c), the host executor's last copy of a
 * received payload into the output and the ring's final reduction
 * (host_exec.c; exec_streams).
 * Measured: 4 and 8 ranks' flat 1 MiB and 2 ranks' rings from 1 MiB
 * faster; in place, or below it, no gain (perf/README.md). */
#define COPY_STREAM_MIN ((uint64_t)1 << 20)

/* memcpy with streaming stores where the machine has them (x86-64's
 * MOVNTDQ), memcpy elsewhere and for short copies. The stores are fenced
 * before it returns: whatever the caller publishes next (a barrier, a
 * flag) is ordered after them, as after memcpy. Only worth it where the
 * destination's lines are not in the cache: over lines just read it is
 * slower than memcpy (perf/README.md). */
void copy_streaming(void *dst, const void *src, size_t bytes);

#endif
