/*
 * Loom extensions to the NCCL API. Everything here is prefixed `loom` and is
 * not part of NCCL; programs that only use nccl.h never need this header.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_H_
#define LOOM_H_

#include "nccl.h"

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* A unique id as 256 lowercase hex digits, so that launchers can pass it
 * through the environment or a pipe. `hex` must hold 257 bytes. */
ncclResult_t loomUniqueIdToHex(const ncclUniqueId *id, char *hex);
ncclResult_t loomUniqueIdFromHex(const char *hex, ncclUniqueId *id);

/* Where the bootstrap root of `id` listens, as "ip:port" or "[ip6]:port",
 * to say in a log or an error which root a rank tried to reach. */
ncclResult_t loomUniqueIdRootAddress(const ncclUniqueId *id, char *buf, size_t len);

/* The transports this build of the library has, as a space-separated list
 * such as "shm net/socket". */
const char *loomTransports(void);

/* Whether `comm` is a host communicator (buffers in host memory, stream
 * NULL). Returns ncclInvalidArgument for a NULL comm or result pointer. */
ncclResult_t loomCommIsHost(ncclComm_t comm, int *isHost);

/* How many channels (parallel rings and trees) `comm` has: the most a
 * call may split over (the tuner gives small calls fewer). */
ncclResult_t loomCommChannels(ncclComm_t comm, int *nchannels);

/* The transport used to reach `peer` once a collective or a send/recv has
 * connected it (point to point, rings, trees, recursive doubling): "p2p",
 * "shm", "net/socket", "self", or "none" before the first use. For tests
 * and diagnostics. */
ncclResult_t loomCommPeerTransport(ncclComm_t comm, int peer, const char **name);

/* Bitwise AND, OR and XOR reductions, for ncclAllReduce, ncclReduce and
 * ncclReduceScatter on integer types (int8, uint8, int32, uint32, int64,
 * uint64) of host communicators. Fixed values at the top of ncclRedOp_t's
 * range, which Loom reserves (0x7ffffff0..0x7fffffff): they never collide
 * with ncclRedOpCreatePreMulSum's handles, and need no creating. */
#define loomBand ((ncclRedOp_t)0x7ffffff0)
#define loomBor ((ncclRedOp_t)0x7ffffff1)
#define loomBxor ((ncclRedOp_t)0x7ffffff2)

/* This rank's bound on the waits of `comm` (collectives, send/recv,
 * connection set-up, one-sided waits, its bootstrap barriers and
 * all-gathers), in place of LOOM_TIMEOUT: from 0.001 to 1e9 seconds,
 * fractions kept to the nanosecond; 0 goes back to LOOM_TIMEOUT; a
 * negative, NaN or infinite value is ncclInvalidArgument. Not collective:
 * it changes only this rank's waits that begin after it, so ranks should
 * all set the same value. A timed-out wait returns what it did before
 * (ncclRemoteError) with a sentence that says "timed out after 1.5 s
 * (loomCommSetTimeout)". Get returns the bound in effect: the value set,
 * else LOOM_TIMEOUT's. Communicators made from `comm` (split, shrink,
 * grow) start on LOOM_TIMEOUT. */
ncclResult_t loomCommSetTimeout(ncclComm_t comm, double seconds);
ncclResult_t loomCommGetTimeout(ncclComm_t comm, double *seconds);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_H_ */
