/*
 * Bootstrap: the out-of-band network that ranks use to find each other and
 * exchange connection information during init and connection setup.
 *
 * ncclGetUniqueId starts a root (a thread) listening on this host; the id
 * holds its address and a random secret. Each rank listens on a socket of
 * its own, presents the secret and its address to the root, and gets every
 * rank's address back. From then on ranks send each other tagged messages
 * directly; all-gathers and barriers are rings of such messages.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_BOOTSTRAP_H
#define LOOM_BOOTSTRAP_H

#include <pthread.h>
#include <stdint.h>

#include "misc/socket.h"
#include "nccl.h"

/* Tags of messages the bootstrap itself sends; other layers use tags below
 * BOOT_TAG_INTERNAL. */
#define BOOT_TAG_INTERNAL (1ull << 62)
#define BOOT_TAG_PING (1ull << 63)

struct boot_stash;
struct boot_pending;

/* Asks whether `peer` is still alive; returns ncclSuccess or the error that
 * says it is gone. Lets a wait on a dead peer end before the timeout. */
typedef ncclResult_t (*boot_alive_fn)(void *ctx, int peer);

struct bootstrap {
  int rank, nranks;
  uint64_t secret;
  int listen_fd;
  union sock_addr addr;   /* where this rank listens */
  union sock_addr *peers; /* where every rank listens */
  struct boot_stash *stash;
  /* Accepted connections whose header is still arriving, read all at once
   * so that a silent one delays nobody. */
  struct boot_pending *pend;
  int npend;
  uint64_t seq; /* numbers the all-gathers and barriers, same on all ranks */
  pthread_mutex_t lock;
  const volatile int *abort_flag;
  boot_alive_fn alive;
  void *alive_ctx;
};

/* Fills `id` and, unless NCCL_COMM_ID fixes the root's address, starts the
 * root in this process. */
ncclResult_t bootstrap_get_unique_id(ncclUniqueId *id);

/* Always starts a new root in this process (NCCL_COMM_ID is for the
 * first communicator of a job, not for those made from it). */
ncclResult_t bootstrap_create_root_id(ncclUniqueId *id);

/* With NCCL_COMM_ID rank 0 starts the root at that address. */
int bootstrap_id_is_fixed(const ncclUniqueId *id);
ncclResult_t bootstrap_start_root(const ncclUniqueId *id);
uint64_t bootstrap_id_hash(const ncclUniqueId *id);
const char *bootstrap_id_root(const ncclUniqueId *id, char *buf, size_t len);
/* Whether `id` looks like one that ncclGetUniqueId made. */
int bootstrap_id_valid(const ncclUniqueId *id);

ncclResult_t bootstrap_init(const ncclUniqueId *id, int rank, int nranks, const volatile int *abort_flag,
                            struct bootstrap **out);
void bootstrap_close(struct bootstrap *b);

ncclResult_t bootstrap_send(struct bootstrap *b, int peer, uint64_t tag, const void *data, size_t len);
ncclResult_t bootstrap_recv(struct bootstrap *b, int peer, uint64_t tag, void *data, size_t len);

/* `data` has nranks slots of `size` bytes; this rank's slot is filled. */
ncclResult_t bootstrap_allgather(struct bootstrap *b, void *data, size_t size);
ncclResult_t bootstrap_barrier(struct bootstrap *b);

#endif
