/*
 * The API floor's side of the communicator: its lifecycle after creation
 * (finalize, destroy, abort), the queries, the API's exit with the error
 * sentence, PreMulSum operators, registration, and Loom's own extensions.
 * The primitives every floor uses are comm.c's.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "bootstrap/bootstrap.h"
#include "comm_api.h"
#include "exec/cuda/cuda_exec.h"
#include "common/dtype.h"
#include "loom.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "rma.h"
#include "status.h"
#include "transport/shm_arena.h"
#include "transport/transport.h"

#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ncclResult_t api_finish(struct ncclComm *comm, ncclResult_t res) {
  if (res == ncclSuccess || res == ncclInProgress)
    return res;
  const char *msg = err_thread_last();
  if (msg[0] == '\0')
    msg = err_string(res);
  /* While a nonblocking communicator's job runs, its sentence is the
   * job's to write (comm_set_error): a call refused meanwhile says why in
   * ncclGetLastError(NULL) only. */
  if (comm_live(comm) && comm->last_error != msg && !comm_async_busy(comm))
    snprintf(comm->last_error, sizeof comm->last_error, "%s", msg);
  err_set_global(msg);
  WARN("%s", msg);
  return res;
}

void comm_destroy_all(struct ncclComm *comm) {
  if (comm == NULL)
    return;
  async_stop(comm);
  status_comm_remove(comm);
  /* Kernels first: they use the connections' memory, which is freed on
   * the communicator's device. */
  int saved_dev = comm->is_host ? -1 : cuda_current_device();
  cuda_comm_fini(comm, comm->abort_flag);
  transport_free_all(comm);
  arena_free(comm);
  cuda_restore_device(saved_dev);
  bootstrap_close(comm->boot);
  rma_destroy(comm);
  for (int r = 0; comm->peer_pidfd && r < comm->nranks; r++)
    if (comm->peer_pidfd[r] >= 0)
      close(comm->peer_pidfd[r]);
  free(comm->peer_pidfd);
  free(comm->peers);
  free(comm->p2p_send);
  free(comm->p2p_recv);
  free(comm->topo_rings);
  free(comm->user_ops);
  free(comm->tuner);
  for (struct task *t = comm->tasks_head, *n; t; t = n) {
    n = t->next;
    if (t != comm->task_inline)
      free(t);
  }
  free(comm->task_inline);
  comm_free_works(comm);
  free(comm->lanes);
  free(comm->check_buf);
  comm_suspend_free(comm);
  comm->magic = 0;
  comm_slot_free(comm);
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm) {
  ncclResult_t r = comm_check(comm, "ncclCommFinalize");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  /* Host operations are complete when they return, so nothing is left to
   * flush; a CUDA communicator's kernels are waited for and their network
   * sends let leave. Later calls are refused. */
  comm->finalized = 1;
  if (!comm->is_host) {
    int saved_dev = cuda_current_device();
    r = cuda_comm_finalize(comm);
    cuda_restore_device(saved_dev);
  }
  return api_finish(comm, r);
}

/* Destroy and abort tolerate communicators in any state, failed ones
 * included: that is when users need them most. */
NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  if (comm == NULL)
    return ncclSuccess;
  if (!comm_live(comm))
    return api_finish(NULL, comm_not_a_comm("ncclCommDestroy"));
  /* A nonblocking communicator's job finishes first (it is bounded by
   * LOOM_TIMEOUT); ncclCommAbort is the way not to wait. */
  async_wait(comm);
  /* Entered and never left: a thread that comes later is refused until
   * the slot is gone, after which the communicator is no more. */
  ncclResult_t r = comm_enter(comm, "ncclCommDestroy");
  if (r == ncclSuccess && (comm->in_group || comm->suspend_queued)) {
    comm_leave(comm);
    r = err_set(ncclInvalidUsage, "ncclCommDestroy: the communicator has %s queued in an open group",
                comm->in_group ? "operations" : comm->suspend_queued == 1 ? "ncclCommSuspend" : "ncclCommResume");
  }
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void *)comm, comm->rank, comm->nranks);
  comm_destroy_all(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  if (comm == NULL)
    return ncclSuccess;
  if (!comm_live(comm))
    return api_finish(NULL, comm_not_a_comm("ncclCommAbort"));
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  comm_hold(comm, "ncclCommAbort");
  /* What another thread destroyed meanwhile (its slot reads as zeros) is
   * not there to abort. */
  if (!comm_live(comm))
    return api_finish(NULL, comm_not_a_comm("ncclCommAbort"));
  /* The proxy of a CUDA communicator moves its connections: it stops
   * first, with its kernels. */
  if (!comm->is_host)
    cuda_comm_stop(comm);
  transport_poison_conns(comm, comm->async_error != ncclSuccess ? comm->first_error : NULL);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void *)comm, comm->rank, comm->nranks);
  comm_destroy_all(comm);
  return ncclSuccess;
}

/* Queries work on failed communicators too, as NCCL's do. */
static ncclResult_t check_query(const struct ncclComm *comm, const void *out, const char *func) {
  if (comm == NULL)
    return err_set(ncclInvalidArgument, "%s: comm is NULL", func);
  if (!comm_live(comm))
    return comm_not_a_comm(func);
  if (out == NULL)
    return err_set(ncclInvalidArgument, "%s: the result pointer is NULL", func);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count) {
  ncclResult_t r = check_query(comm, count, "ncclCommCount");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *count = comm->nranks;
  return ncclSuccess;
}

/* A host communicator has no device: -1, which no CUDA device number is. */
NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device) {
  ncclResult_t r = check_query(comm, device, "ncclCommCuDevice");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *device = comm->cuda_dev;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank) {
  ncclResult_t r = check_query(comm, rank, "ncclCommUserRank");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError) {
  ncclResult_t r = check_query(comm, asyncError, "ncclCommGetAsyncError");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  /* A kernel's report is the error as soon as its stream is done, not
   * only once the proxy looks. */
  if (!comm->is_host)
    cuda_comm_poll(comm);
  /* The job's result is written before it is marked done. */
  *asyncError = comm_async_busy(comm) ? ncclInProgress : comm->async_error;
  return ncclSuccess;
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result) { return err_string(result); }

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm) {
  if (comm_live(comm))
    return comm->last_error;
  return err_global_last();
}

NCCL_API(void, ncclResetDebugInit, void) { log_reset(); }
/* What NVIDIA's library exports under the name its deprecated
 * ncclResetDebugInit calls; a program linked against it may bind it. */
NCCL_API(void, ncclResetDebugInitInternal, void) { log_reset(); }

/* Registration is a hint: host collectives work the same without it, so a
 * handle records the range and nothing else yet. */
struct reg_handle {
  uint64_t magic;
  const struct ncclComm *comm;
  void *buff;
  size_t size;
};
#define REG_MAGIC 0x4c6f6f6d52656700ull

static ncclResult_t reg_new(const struct ncclComm *comm, void *buff, size_t size, void **handle, const char *func) {
  CHECK(comm_check(comm, func));
  if (buff == NULL || handle == NULL)
    return err_set(ncclInvalidArgument, "%s: %s is NULL", func, buff == NULL ? "buff" : "handle");
  if (size == 0)
    return err_set(ncclInvalidArgument, "%s: size is 0", func);
  struct reg_handle *h = malloc(sizeof *h);
  if (!h)
    return err_set(ncclSystemError, "%s: out of memory", func);
  *h = (struct reg_handle){.magic = REG_MAGIC, .comm = comm, .buff = buff, .size = size};
  *handle = h;
  return ncclSuccess;
}

static ncclResult_t reg_free(const struct ncclComm *comm, void *handle, const char *func) {
  CHECK(comm_check(comm, func));
  struct reg_handle *h = handle;
  if (h == NULL || h->magic != REG_MAGIC || h->comm != comm)
    return err_set(ncclInvalidArgument, "%s: the handle was not registered on this communicator", func);
  h->magic = 0;
  free(h);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle) {
  return api_finish(comm, reg_new(comm, buff, size, handle, "ncclCommRegister"));
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle) {
  return api_finish(comm, reg_free(comm, handle, "ncclCommDeregister"));
}

/* ---- PreMulSum operators ---- */

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t r = comm_check(comm, "ncclRedOpCreatePreMulSum");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  if (op == NULL || scalar == NULL)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: %s is NULL",
                                    op == NULL ? "op" : "scalar"));
  if ((int)datatype < 0 || datatype >= ncclNumTypes)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: datatype %d is not an "
                                    "ncclDataType_t", (int)datatype));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: residence %d is neither "
                                    "ncclScalarDevice nor ncclScalarHostImmediate", (int)residence));
  int slot = -1;
  for (int i = 0; i < comm->n_user_ops; i++)
    if (!comm->user_ops[i].in_use)
      slot = i;
  if (slot < 0) {
    int n = comm->n_user_ops ? comm->n_user_ops * 2 : 8;
    /* Handles stop below the range reserved for Loom's own operators. */
    if (n > RED_OP_RESERVED_FIRST - ncclNumOps)
      return api_finish(comm, err_set(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: too many operators"));
    struct user_op *ops = realloc(comm->user_ops, sizeof *ops * n);
    if (!ops)
      return api_finish(comm, err_set(ncclSystemError, "ncclRedOpCreatePreMulSum: out of memory"));
    memset(ops + comm->n_user_ops, 0, sizeof *ops * (n - comm->n_user_ops));
    slot = comm->n_user_ops;
    comm->user_ops = ops;
    comm->n_user_ops = n;
  }
  struct user_op *u = &comm->user_ops[slot];
  memset(u, 0, sizeof *u);
  u->in_use = 1;
  u->dtype = datatype;
  u->residence = residence;
  /* On a host communicator "device" memory is host memory that is read
   * when each collective starts. */
  u->scalar_ptr = scalar;
  if (residence == ncclScalarHostImmediate) {
    u->scalar = dtype_load(datatype, scalar, 0);
    if (datatype == ncclInt64 || datatype == ncclUint64)
      memcpy(&u->scalar_i, scalar, sizeof u->scalar_i);
    u->scalar_ptr = NULL;
  }
  *op = (ncclRedOp_t)(ncclNumOps + slot);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm) {
  ncclResult_t r = comm_check(comm, "ncclRedOpDestroy");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  if ((int)op >= 0 && (int)op < ncclNumOps)
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclRedOpDestroy: op %d is a built-in operator", (int)op));
  if (red_op_is_bitwise((int)op))
    return api_finish(comm, err_set(ncclInvalidArgument, "ncclRedOpDestroy: op %d is one of Loom's built-in "
                                    "bitwise operators", (int)op));
  int slot = (int)op - ncclNumOps;
  if ((int)op < 0 || slot >= comm->n_user_ops || !comm->user_ops[slot].in_use)
    return api_finish(comm, err_set(ncclInvalidArgument,
                                    "ncclRedOpDestroy: op %d was not created on this communicator (or was destroyed)",
                                    (int)op));
  comm->user_ops[slot].in_use = 0;
  return ncclSuccess;
}

/* ---- Loom extensions ---- */

LOOM_EXPORT ncclResult_t loomUniqueIdToHex(const ncclUniqueId *id, char *hex) {
  if (id == NULL || hex == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdToHex: %s is NULL", id ? "hex" : "id"));
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned char b = (unsigned char)id->internal[i];
    hex[2 * i] = digits[b >> 4];
    hex[2 * i + 1] = digits[b & 15];
  }
  hex[2 * NCCL_UNIQUE_ID_BYTES] = '\0';
  return ncclSuccess;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

LOOM_EXPORT ncclResult_t loomUniqueIdFromHex(const char *hex, ncclUniqueId *id) {
  if (id == NULL || hex == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdFromHex: %s is NULL", id ? "hex" : "id"));
  if (strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES)
    return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdFromHex: expected %d hex digits, got %zu",
                                    2 * NCCL_UNIQUE_ID_BYTES, strlen(hex)));
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdFromHex: character %d is not a hex digit",
                                      hi < 0 ? 2 * i : 2 * i + 1));
    id->internal[i] = (char)(hi << 4 | lo);
  }
  return ncclSuccess;
}

LOOM_EXPORT ncclResult_t loomUniqueIdRootAddress(const ncclUniqueId *id, char *buf, size_t len) {
  if (id == NULL || buf == NULL || len == 0)
    return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdRootAddress: %s is NULL or empty",
                                    id ? "buf" : "id"));
  if (!bootstrap_id_valid(id))
    return api_finish(NULL, err_set(ncclInvalidArgument, "loomUniqueIdRootAddress: not a unique id"));
  bootstrap_id_root(id, buf, len);
  return ncclSuccess;
}

LOOM_EXPORT const char *loomTransports(void) { return TRANSPORTS_BUILT; }

LOOM_EXPORT ncclResult_t loomCommIsHost(ncclComm_t comm, int *isHost) {
  ncclResult_t r = check_query(comm, isHost, "loomCommIsHost");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *isHost = comm->is_host;
  return ncclSuccess;
}

LOOM_EXPORT ncclResult_t loomCommChannels(ncclComm_t comm, int *nchannels) {
  ncclResult_t r = check_query(comm, nchannels, "loomCommChannels");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *nchannels = comm->nchannels;
  return ncclSuccess;
}

static const char *conn_name(const struct conn *c) {
  if (c == NULL || !c->connected)
    return NULL;
  return transport_conn_name(c);
}

LOOM_EXPORT ncclResult_t loomCommPeerTransport(ncclComm_t comm, int peer, const char **name) {
  ncclResult_t r = check_query(comm, name, "loomCommPeerTransport");
  if (r == ncclSuccess && (peer < 0 || peer >= comm->nranks))
    r = err_set(ncclInvalidArgument, "loomCommPeerTransport: peer %d is out of range for %d ranks", peer,
                comm->nranks);
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *name = "none";
  if (peer == comm->rank) {
    *name = "self";
    return ncclSuccess;
  }
  const char *n = conn_name(comm->p2p_send[peer]);
  if (!n)
    n = conn_name(comm->p2p_recv[peer]);
  for (int c = 0; !n && c < comm->nchannels; c++) {
    if (comm->channels[c].ring_next == peer)
      n = conn_name(comm->ring_send[c]);
    if (!n && comm->channels[c].ring_prev == peer)
      n = conn_name(comm->ring_recv[c]);
  }
  for (const struct conn *c = comm->extra_conns; !n && c; c = c->next_extra)
    if (c->peer == peer)
      n = conn_name(c);
  if (n)
    *name = n;
  return ncclSuccess;
}

/* The bound is per rank and per communicator: no peer is told, so that
 * setting it is no collective (docs/failures.md). It is read when each
 * wait begins, so a group's operations use the value at ncclGroupEnd. */
#define TIMEOUT_MAX_S 1e9 /* ~31 years: ns still fit in 64 bits after any uptime */

LOOM_EXPORT ncclResult_t loomCommSetTimeout(ncclComm_t comm, double seconds) {
  ncclResult_t r = comm_check_even_suspended(comm, "loomCommSetTimeout");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  /* NaN fails every comparison, so the test is written to let it through
   * to the refusal. */
  if (!(seconds == 0 || (seconds >= 1e-3 && seconds <= TIMEOUT_MAX_S)))
    return api_finish(comm, err_set(ncclInvalidArgument,
                                    "loomCommSetTimeout: seconds is %g; it must be a finite number of seconds from "
                                    "0.001 to 1e9, or 0 to go back to LOOM_TIMEOUT",
                                    seconds));
  r = comm_enter(comm, "loomCommSetTimeout");
  if (r != ncclSuccess)
    return api_finish(comm, r);
  uint64_t ns = (uint64_t)(seconds * 1e9 + 0.5);
  atomic_store(&comm->timeout_ns, ns);
  comm_leave(comm);
  return ncclSuccess;
}

LOOM_EXPORT ncclResult_t loomCommGetTimeout(ncclComm_t comm, double *seconds) {
  ncclResult_t r = check_query(comm, seconds, "loomCommGetTimeout");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  *seconds = (double)comm_timeout_ns(comm) / 1e9;
  return ncclSuccess;
}
