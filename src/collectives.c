/*
 * The collective and point-to-point entry points: each validates its
 * arguments, says exactly what is wrong when something is, and queues a
 * task on its group.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"
#include "common/dtype.h"
#include "exec/cuda/cuda_exec.h"
#include "group.h"
#include "misc/cudamem.h"
#include "plan.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int is_reduction(int coll) {
  return coll == COLL_REDUCE || coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER;
}

/* The scalar of a PreMulSum or Avg, stored the way red_op wants it. */
static void set_scalar(struct red_op *r, int dtype, double f, int64_t i) {
  switch (dtype) {
  case ncclInt8: case ncclInt32: case ncclInt64: r->scalar.i = i; break;
  case ncclUint8: case ncclUint32: case ncclUint64: r->scalar.u = (uint64_t)i; break;
  default: r->scalar.f = f;
  }
}

static ncclResult_t resolve_op(struct ncclComm *comm, struct task *t, const char *func) {
  struct red_op *r = &t->red;
  memset(r, 0, sizeof *r);
  r->dtype = t->dtype;
  if (!is_reduction(t->coll))
    return ncclSuccess;
  /* Types 10 and 11 are OCP's fp8 in NCCL and in Loom's reductions, but
   * FNUZ's where RCCL runs on MI300: reducing them there in OCP's encoding
   * would hand a ROCm program the wrong numbers. Moving them is fine. */
  if (!comm->is_host && (t->dtype == ncclFloat8e4m3 || t->dtype == ncclFloat8e5m2) && cuda_fp8_fnuz(comm->cuda_dev))
    return err_set(ncclInvalidArgument, "%s: %s reductions on this GPU: RCCL reads datatypes 10 and 11 as the FNUZ "
                   "fp8 encodings of AMD's gfx940-942 (MI300), while Loom's reductions compute NCCL's OCP ones; "
                   "refused rather than reduced in another encoding (AllGather, Broadcast, Send and Recv move "
                   "them unchanged)", func, dtype_name(t->dtype));
  int op = t->op;
  if (op >= 0 && op < ncclAvg) {
    r->kind = op; /* ncclSum..ncclMin match red_kind */
    return ncclSuccess;
  }
  if (red_op_is_bitwise(op)) {
    const char *name = op == (int)loomBand ? "loomBand" : op == (int)loomBor ? "loomBor" : "loomBxor";
    if (dtype_is_float(t->dtype))
      return err_set(ncclInvalidArgument, "%s: %s is a bitwise operator, for integer datatypes only, and the call's "
                     "datatype is %s", func, name, dtype_name(t->dtype));
    if (!comm->is_host)
      return err_set(ncclInvalidArgument, "%s: %s is not implemented in Loom on CUDA communicators (host "
                     "communicators have it)", func, name);
    r->kind = RED_BAND + (op - (int)loomBand);
    return ncclSuccess;
  }
  r->kind = RED_SUM;
  if (op == ncclAvg) {
    if (dtype_is_float(t->dtype)) {
      /* NCCL's Avg on floats: every input times 1/nranks, in the type. */
      double inv = 1.0 / comm->nranks;
      char tmp[8];
      dtype_store(t->dtype, tmp, 0, inv);
      r->premul = 1;
      set_scalar(r, t->dtype, dtype_load(t->dtype, tmp, 0), 0);
    } else {
      r->postdiv = 1;
      r->divisor = comm->nranks;
    }
    return ncclSuccess;
  }
  int slot = op - ncclNumOps;
  if (op < 0 || slot >= comm->n_user_ops || !comm->user_ops[slot].in_use)
    return err_set(ncclInvalidArgument,
                   "%s: op %d is neither a built-in ncclRedOp_t, nor Loom's loomBand, loomBor or loomBxor, nor an "
                   "operator created on this communicator", func, op);
  const struct user_op *u = &comm->user_ops[slot];
  if (u->dtype != t->dtype)
    return err_set(ncclInvalidArgument, "%s: the PreMulSum operator %d was created for %s but the call uses %s", func,
                   op, dtype_name(u->dtype), dtype_name(t->dtype));
  r->premul = 1;
  if (u->scalar_ptr && !comm->is_host) {
    /* On a CUDA communicator "device" residence means the kernel reads
     * it when the collective runs, ordered with the stream. */
    t->scalar_dev = u->scalar_ptr;
  } else if (u->scalar_ptr) {
    int64_t iv = 0;
    if (t->dtype == ncclInt64 || t->dtype == ncclUint64)
      memcpy(&iv, u->scalar_ptr, sizeof iv);
    else
      iv = (int64_t)dtype_load(t->dtype, u->scalar_ptr, 0);
    set_scalar(r, t->dtype, dtype_load(t->dtype, u->scalar_ptr, 0), iv);
  } else {
    int64_t iv = (t->dtype == ncclInt64 || t->dtype == ncclUint64) ? u->scalar_i : (int64_t)u->scalar;
    set_scalar(r, t->dtype, u->scalar, iv);
  }
  return ncclSuccess;
}

/* In place is what NCCL documents per collective, and for ReduceScatter
 * also MPI's form (the result at the start of the input, which programs
 * written for MPI_IN_PLACE pass, and which the ring computes right: a
 * rank writes its block's result only after it has read every input at
 * that offset, and never posts ReduceScatter input by reference). Any
 * other overlap of a call's two buffers would have the call read what it
 * already wrote, so it is refused before data moves. Only buffers this
 * rank uses count (a non-root's sendbuff in Broadcast, its recvbuff in
 * Reduce). */
static ncclResult_t check_overlap(const struct ncclComm *comm, const struct task *t, const char *func) {
  size_t esize = dtype_size(t->dtype), block = t->count * esize; /* plan_check_size bounds it */
  size_t sbytes = block, rbytes = block;
  uintptr_t s = (uintptr_t)t->sendbuff, r = (uintptr_t)t->recvbuff, in_place;
  const char *rule;
  switch (t->coll) {
  case COLL_ALLGATHER:
    rbytes = block * (size_t)comm->nranks;
    in_place = r + (size_t)comm->rank * block;
    rule = "sendbuff == recvbuff + rank * sendcount elements";
    if (s == in_place)
      return ncclSuccess;
    break;
  case COLL_REDUCESCATTER:
    sbytes = block * (size_t)comm->nranks;
    in_place = s + (size_t)comm->rank * block;
    rule = "recvbuff == sendbuff + rank * recvcount elements, or MPI's recvbuff == sendbuff";
    if (r == in_place || r == s)
      return ncclSuccess;
    break;
  default:
    in_place = s;
    rule = "recvbuff == sendbuff";
    if (s == r)
      return ncclSuccess;
  }
  if (s + sbytes <= r || r + rbytes <= s)
    return ncclSuccess;
  char where[64] = "";
  if (t->coll == COLL_ALLGATHER || t->coll == COLL_REDUCESCATTER)
    snprintf(where, sizeof where, ", here %s %p", t->coll == COLL_ALLGATHER ? "sendbuff" : "recvbuff",
             (void *)in_place);
  return err_set(ncclInvalidArgument,
                 "%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap, and rank %d's call is not in "
                 "place (in place is %s%s); nothing was sent",
                 func, t->sendbuff, sbytes, t->recvbuff, rbytes, comm->rank, rule, where);
}

static ncclResult_t submit(struct ncclComm *comm, struct task *t, cudaStream_t stream, const char *func) {
  /* What an earlier kernel met refuses this call, though the proxy may
   * not have looked yet. */
  if (comm && !comm->is_host)
    cuda_comm_poll(comm);
  CHECK(comm_check(comm, func));
  log_set_rank(comm->rank);
  if (comm->is_host && stream != NULL)
    return err_set(ncclInvalidArgument,
                   "%s: stream must be NULL on a host communicator (its buffers are host memory and the call "
                   "returns when it is done)",
                   func);
  if (t->dtype < 0 || t->dtype >= ncclNumTypes)
    return err_set(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", func, t->dtype,
                   ncclNumTypes - 1);
  CHECK(plan_check_size(comm, t, func));
  if ((t->coll == COLL_BROADCAST || t->coll == COLL_REDUCE) && (t->root < 0 || t->root >= comm->nranks))
    return err_set(ncclInvalidArgument, "%s: root %d is out of range for a communicator of %d ranks", func, t->root,
                   comm->nranks);
  if ((t->coll == COLL_SEND || t->coll == COLL_RECV) && (t->peer < 0 || t->peer >= comm->nranks))
    return err_set(ncclInvalidArgument, "%s: peer %d is out of range for a communicator of %d ranks", func, t->peer,
                   comm->nranks);
  CHECK(resolve_op(comm, t, func));
  if (t->count > 0) {
    int me_root = t->root == comm->rank;
    int need_send = t->coll != COLL_RECV && (t->coll != COLL_BROADCAST || me_root);
    int need_recv = t->coll != COLL_SEND && (t->coll != COLL_REDUCE || me_root);
    /* ncclBcast has one buffer argument, and the sentence names it; the
     * name is only compared where a sentence may be needed. */
    int bcast = ((need_send && !t->sendbuff) || (need_recv && !t->recvbuff) || !comm->is_host) &&
                strcmp(func, "ncclBcast") == 0;
    if (need_send && t->sendbuff == NULL)
      return err_set(ncclInvalidArgument, "%s: %s is NULL (count %zu)", func, bcast ? "buff" : "sendbuff", t->count);
    if (need_recv && t->recvbuff == NULL)
      return err_set(ncclInvalidArgument, "%s: %s is NULL (count %zu)", func, bcast ? "buff" : "recvbuff", t->count);
    /* A host pointer given to a CUDA communicator is the classic crash of
     * NCCL programs; here it is a sentence. */
    if (!comm->is_host && need_send)
      CHECK(cuda_check_pointer(t->sendbuff, 0, comm->cuda_dev, func, bcast ? "buff" : "sendbuff"));
    if (!comm->is_host && need_recv)
      CHECK(cuda_check_pointer(t->recvbuff, 0, comm->cuda_dev, func, bcast ? "buff" : "recvbuff"));
    if (need_send && need_recv)
      CHECK(check_overlap(comm, t, func));
  }
  /* A stream being captured into a CUDA graph is fine: the kernels keep
   * their slot counts themselves, so every replay goes on from the last. */
  if (!comm->is_host)
    CHECK(cuda_stream_check(stream, func, comm->rank, 1));
  t->stream = stream;
  if (log_enabled(LOG_INFO, LOG_COLL)) {
    char d[200];
    task_describe(t, d, sizeof d);
    INFO(LOG_COLL, "%s: %s sendbuff %p recvbuff %p comm %p", func, d, t->sendbuff, (void *)t->recvbuff, (void *)comm);
  }
  return group_enqueue(comm, t);
}

/* The one exit of every entry point: a refused call inside a group also
 * fails the group, so no rank runs half of it. */
static ncclResult_t finish(struct ncclComm *comm, ncclResult_t r) {
  if (r != ncclSuccess && group_depth() > 0)
    group_record_error(r);
  return api_finish(comm, r);
}

/* A call runs between comm_enter and comm_leave, so that ncclCommAbort
 * from another thread waits for it instead of freeing what it uses. */
static ncclResult_t call(struct ncclComm *comm, struct task *t, cudaStream_t stream, const char *func) {
  ncclResult_t r = comm_enter(comm, func);
  if (r != ncclSuccess) /* the communicator's sentence is its own thread's to write */
    return finish(NULL, r);
  r = finish(comm, submit(comm, t, stream, func));
  /* A nonblocking communicator's worker leaves it when the call is done. */
  if (r != ncclInProgress)
    comm_leave(comm);
  return r;
}

#define TASK(...) ((struct task){__VA_ARGS__})

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_ALLREDUCE, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count,
                       .dtype = datatype, .op = op, .root = -1, .peer = -1);
  return call(comm, &t, stream, "ncclAllReduce");
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_ALLGATHER, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = sendcount,
                       .dtype = datatype, .op = ncclSum, .root = -1, .peer = -1);
  return call(comm, &t, stream, "ncclAllGather");
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_REDUCESCATTER, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = recvcount,
                       .dtype = datatype, .op = op, .root = -1, .peer = -1);
  return call(comm, &t, stream, "ncclReduceScatter");
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_BROADCAST, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count,
                       .dtype = datatype, .op = ncclSum, .root = root, .peer = -1);
  return call(comm, &t, stream, "ncclBroadcast");
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
         cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_BROADCAST, .sendbuff = buff, .recvbuff = buff, .count = count,
                       .dtype = datatype, .op = ncclSum, .root = root, .peer = -1);
  return call(comm, &t, stream, "ncclBcast");
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_REDUCE, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count,
                       .dtype = datatype, .op = op, .root = root, .peer = -1);
  return call(comm, &t, stream, "ncclReduce");
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_SEND, .sendbuff = sendbuff, .recvbuff = NULL, .count = count, .dtype = datatype,
                       .op = ncclSum, .root = -1, .peer = peer);
  return call(comm, &t, stream, "ncclSend");
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream) {
  struct task t = TASK(.coll = COLL_RECV, .sendbuff = NULL, .recvbuff = recvbuff, .count = count, .dtype = datatype,
                       .op = ncclSum, .root = -1, .peer = peer);
  return call(comm, &t, stream, "ncclRecv");
}

/* ---- AlltoAll, Gather, Scatter: one group of Send and Recv ------------- */

/* What only the whole call can check, before any of its parts is queued:
 * the root, the size of the buffers (nranks blocks), and overlap, which
 * would have the call read what it already wrote; in place is what NCCL
 * documents (Gather: sendbuff == recvbuff + root * count elements on the
 * root; Scatter: recvbuff == sendbuff + root * count; AlltoAll has none,
 * since a block would be overwritten before it is sent). */
static ncclResult_t check_p2p_coll(const struct ncclComm *comm, enum coll_via via, const void *sendbuff,
                                   const void *recvbuff, size_t count, ncclDataType_t dt, int root, const char *func) {
  if ((int)dt < 0 || dt >= ncclNumTypes)
    return err_set(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", func, (int)dt,
                   ncclNumTypes - 1);
  if (via != VIA_ALLTOALL && (root < 0 || root >= comm->nranks))
    return err_set(ncclInvalidArgument, "%s: root %d is out of range for a communicator of %d ranks", func, root,
                   comm->nranks);
  size_t es = dtype_size(dt), n = (size_t)comm->nranks;
  if (count > SIZE_MAX / es / n)
    return err_set(ncclInvalidArgument, "%s: count %zu times %d ranks of %s overflows the address space", func,
                   count, comm->nranks, dtype_name(dt));
  size_t block = count * es, all = block * n;
  int me_root = root == comm->rank;
  if (count == 0 || (via == VIA_GATHER && !me_root) || (via == VIA_SCATTER && !me_root) || !sendbuff || !recvbuff)
    return ncclSuccess; /* one buffer only, or none; a NULL one is its part's sentence */
  uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  size_t sbytes = via == VIA_GATHER ? block : all, rbytes = via == VIA_SCATTER ? block : all;
  if ((via == VIA_GATHER && s == r + (size_t)root * block) || (via == VIA_SCATTER && r == s + (size_t)root * block))
    return ncclSuccess;
  if (s + sbytes <= r || r + rbytes <= s)
    return ncclSuccess;
  const char *rule = via == VIA_GATHER    ? "in place is sendbuff == recvbuff + root * count elements"
                     : via == VIA_SCATTER ? "in place is recvbuff == sendbuff + root * count elements"
                                          : "AlltoAll has no in-place form";
  return err_set(ncclInvalidArgument,
                 "%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap on rank %d, and %s; nothing "
                 "was sent",
                 func, sendbuff, sbytes, recvbuff, rbytes, comm->rank, rule);
}

static ncclResult_t p2p_coll(struct ncclComm *comm, enum coll_via via, const void *sendbuff, void *recvbuff,
                             size_t count, ncclDataType_t dt, int root, cudaStream_t stream, const char *func) {
  ncclResult_t r = comm_enter(comm, func);
  if (r != ncclSuccess)
    return finish(NULL, r);
  r = comm_check(comm, func);
  if (r == ncclSuccess)
    r = check_p2p_coll(comm, via, sendbuff, recvbuff, count, dt, root, func);
  if (r != ncclSuccess) {
    r = finish(comm, r);
    comm_leave(comm);
    return r;
  }
  int n = comm->nranks, me = comm->rank;
  comm_leave(comm);
  if (count == 0)
    return finish(comm, ncclSuccess);
  size_t block = count * dtype_size(dt);
  struct task t = TASK(.sendbuff = NULL, .recvbuff = NULL, .count = count, .dtype = dt, .op = ncclSum, .root = -1,
                       .via = via);
  pncclGroupStart();
  for (int p = 0; p < n && r == ncclSuccess; p++) {
    int send_to = via == VIA_GATHER ? (p == 0 ? root : -1) : via == VIA_SCATTER ? (me == root ? p : -1) : p;
    int recv_from = via == VIA_GATHER ? (me == root ? p : -1) : via == VIA_SCATTER ? (p == 0 ? root : -1) : p;
    if (send_to >= 0) {
      t.coll = COLL_SEND;
      t.peer = send_to;
      t.sendbuff = via == VIA_GATHER ? sendbuff : (const char *)sendbuff + (size_t)p * block;
      t.recvbuff = NULL;
      r = call(comm, &t, stream, func);
    }
    if (recv_from >= 0 && r == ncclSuccess) {
      t.coll = COLL_RECV;
      t.peer = recv_from;
      t.sendbuff = NULL;
      t.recvbuff = via == VIA_SCATTER ? recvbuff : (char *)recvbuff + (size_t)p * block;
      r = call(comm, &t, stream, func);
    }
  }
  ncclResult_t e = pncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream) {
  return p2p_coll(comm, VIA_ALLTOALL, sendbuff, recvbuff, count, datatype, -1, stream, "ncclAlltoAll");
}

NCCL_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream) {
  return p2p_coll(comm, VIA_GATHER, sendbuff, recvbuff, count, datatype, root, stream, "ncclGather");
}

NCCL_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream) {
  return p2p_coll(comm, VIA_SCATTER, sendbuff, recvbuff, count, datatype, root, stream, "ncclScatter");
}

/* ---- RCCL's own names (include/rccl/rccl.h) ----------------------------
 * ROCm builds of PyTorch call ncclAllToAll and ncclAllToAllv where RCCL is
 * the library; Loom exports them from both its libraries. */

NCCL_API(ncclResult_t, ncclAllToAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream) {
  return p2p_coll(comm, VIA_ALLTOALL, sendbuff, recvbuff, count, datatype, -1, stream, "ncclAllToAll");
}

/* The arrays (one entry per rank, counts and displacements in elements)
 * and the buffers' extents: the receive blocks must not overlap the send
 * blocks, and, since the check looks at the spans the blocks cover, blocks
 * interleaved in one allocation are refused too. */
static ncclResult_t check_alltoallv(const struct ncclComm *comm, const void *sendbuff, const size_t *scounts,
                                    const size_t *sdispls, const void *recvbuff, const size_t *rcounts,
                                    const size_t *rdispls, ncclDataType_t dt, const char *func) {
  if ((int)dt < 0 || dt >= ncclNumTypes)
    return err_set(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", func, (int)dt,
                   ncclNumTypes - 1);
  const size_t *arrays[] = {scounts, sdispls, rcounts, rdispls};
  const char *names[] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
  for (int i = 0; i < 4; i++)
    if (!arrays[i])
      return err_set(ncclInvalidArgument, "%s: %s is NULL; it needs one entry per rank (%d)", func, names[i],
                     comm->nranks);
  size_t es = dtype_size(dt);
  uintptr_t lo[2] = {UINTPTR_MAX, UINTPTR_MAX}, hi[2] = {0, 0};
  for (int p = 0; p < comm->nranks; p++)
    for (int side = 0; side < 2; side++) {
      size_t c = side ? rcounts[p] : scounts[p], d = side ? rdispls[p] : sdispls[p];
      if (c == 0)
        continue;
      if (c > SIZE_MAX / es || d > SIZE_MAX / es || c * es > SIZE_MAX - d * es)
        return err_set(ncclInvalidArgument, "%s: %s[%d] = %zu at %s[%d] = %zu elements of %s overflows the address "
                       "space", func, names[2 * side], p, c, names[2 * side + 1], p, d, dtype_name(dt));
      const void *buf = side ? recvbuff : sendbuff;
      if (!buf)
        return err_set(ncclInvalidArgument, "%s: %s is NULL, and %s[%d] is %zu on rank %d", func,
                       side ? "recvbuff" : "sendbuff", names[2 * side], p, c, comm->rank);
      uintptr_t a = (uintptr_t)buf + d * es, b = a + c * es;
      lo[side] = a < lo[side] ? a : lo[side];
      hi[side] = b > hi[side] ? b : hi[side];
    }
  if (lo[0] < hi[0] && lo[1] < hi[1] && lo[0] < hi[1] && lo[1] < hi[0])
    return err_set(ncclInvalidArgument, "%s: on rank %d the send blocks (%#zx..%#zx) and the receive blocks "
                   "(%#zx..%#zx) overlap; AllToAllv has no in-place form. Nothing was sent", func, comm->rank,
                   (size_t)lo[0], (size_t)hi[0], (size_t)lo[1], (size_t)hi[1]);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllToAllv, const void *sendbuff, const size_t sendcounts[], const size_t sdispls[],
         void *recvbuff, const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream) {
  const char *func = "ncclAllToAllv";
  ncclResult_t r = comm_enter(comm, func);
  if (r != ncclSuccess)
    return finish(NULL, r);
  r = comm_check(comm, func);
  if (r == ncclSuccess)
    r = check_alltoallv(comm, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, func);
  if (r != ncclSuccess) {
    r = finish(comm, r);
    comm_leave(comm);
    return r;
  }
  int n = comm->nranks;
  comm_leave(comm);
  size_t es = dtype_size(datatype);
  struct task t = TASK(.count = 0, .dtype = datatype, .op = ncclSum, .root = -1, .via = VIA_ALLTOALLV);
  pncclGroupStart();
  for (int p = 0; p < n && r == ncclSuccess; p++) {
    if (sendcounts[p]) {
      t.coll = COLL_SEND;
      t.peer = p;
      t.count = sendcounts[p];
      t.sendbuff = (const char *)sendbuff + sdispls[p] * es;
      t.recvbuff = NULL;
      r = call(comm, &t, stream, func);
    }
    if (recvcounts[p] && r == ncclSuccess) {
      t.coll = COLL_RECV;
      t.peer = p;
      t.count = recvcounts[p];
      t.sendbuff = NULL;
      t.recvbuff = (char *)recvbuff + rdispls[p] * es;
      r = call(comm, &t, stream, func);
    }
  }
  ncclResult_t e = pncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

/* RCCL's MSCCL entry points, which its header still declares: Loom has no
 * MSCCL, so a program that asks for an algorithm file is told so (RCCL
 * itself now keeps them as no-ops; a no-op that returns success would
 * leave mscclRunAlgo's output unwritten). */
NCCL_API(ncclResult_t, mscclLoadAlgo, const char *mscclAlgoFilePath, int *mscclAlgoHandle, int rank) {
  return api_finish(NULL, err_set(ncclInvalidUsage, "mscclLoadAlgo(\"%s\", rank %d): Loom has no MSCCL; its "
                                  "collectives choose their own algorithms (NCCL_ALGO)",
                                  mscclAlgoFilePath ? mscclAlgoFilePath : "(null)", rank));
}

NCCL_API(ncclResult_t, mscclRunAlgo, const void *sendBuff, const size_t sendCounts[], const size_t sDisPls[],
         void *recvBuff, const size_t recvCounts[], const size_t rDisPls[], size_t count, ncclDataType_t dataType,
         int root, int peer, ncclRedOp_t op, int mscclAlgoHandle, ncclComm_t comm, cudaStream_t stream) {
  return api_finish(NULL, err_set(ncclInvalidUsage, "mscclRunAlgo: Loom has no MSCCL, and no algorithm %d was "
                                  "loaded; nothing was run", mscclAlgoHandle));
}

NCCL_API(ncclResult_t, mscclUnloadAlgo, int mscclAlgoHandle) {
  return api_finish(NULL, err_set(ncclInvalidUsage, "mscclUnloadAlgo: Loom has no MSCCL, and no algorithm %d was "
                                  "loaded", mscclAlgoHandle));
}
