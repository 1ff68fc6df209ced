/*
 * Bootstrap: the out-of-band network that ranks use to find each other and
 * exchange connection information during init and connection setup.
 *
 * ncclGetUniqueId starts a root (a thread) listening on this host; the id
 * holds its address and a random 32-byte secret (with NCCL_COMM_ID, the
 * address and a key from LOOM_SECRET). Each rank listens on a socket of
 * its own, proves the secret to the root and sends its address; the root
 * answers each with its ring neighbour's address only, and the ranks
 * all-gather the rest around the ring. From then on ranks send each other
 * tagged messages over connections that stay open: one per pair of ranks
 * that ever talk (ring neighbours, the partners of the barrier and of the
 * transports' setup), opened on first use, each authenticated both ways
 * (bootstrap_wire.h). All-gathers and barriers are rings and
 * dissemination rounds of such messages. A message written before the
 * listener answered a new connection is kept until it does, and sent
 * again on a new connection if the listener dropped that one unread.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_BOOTSTRAP_H
#define LOOM_BOOTSTRAP_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "misc/socket.h"
#include "nccl.h"

/* Tags of messages the bootstrap itself sends; other layers use tags below
 * BOOT_TAG_INTERNAL. */
#define BOOT_TAG_INTERNAL (1ull << 62)

struct boot_conn;
struct boot_msg;
struct boot_out;
struct boot_peer;

/* A stranger's connection is logged, but a flood of them is not: the
 * first BOOT_WARN_FIRST one by one, then at most one line a second
 * (boot_warn_take in bootstrap_conn.c). */
#define BOOT_WARN_FIRST 16
struct boot_warn {
  uint64_t last;
  int said, held;
};

/* Messages to one peer: numbered as queued, so a sender knows when its
 * own has been written whole (or lost with the peer), and those waiting
 * to go again after a listener dropped their connection unanswered. */
struct boot_tx {
  uint64_t serial;  /* the last one queued */
  uint64_t written; /* the last one written whole, at least once */
  uint64_t failed;  /* the last one lost: the peer is gone */
  uint64_t resend_at;
  struct boot_out *resend;
};

/* Asks whether `peer` is still alive; returns ncclSuccess or the error that
 * says it is gone. Lets a wait on a dead peer end before the timeout. */
typedef ncclResult_t (*boot_alive_fn)(void *ctx, int peer);

/* What a rank's bootstrap did, logged when it closes (NCCL_DEBUG=INFO,
 * NCCL_DEBUG_SUBSYS=BOOTSTRAP) for tests and perf/bootstrap_scale. */
struct boot_stats {
  int opened, accepted, refused;
  uint64_t msgs_sent, bytes_sent, msgs_recv, bytes_recv;
  uint64_t root_sent, root_recv; /* bytes on the connection to the root */
};

struct bootstrap {
  int rank, nranks;
  uint8_t key[32]; /* the job's secret */
  uint64_t id_hash; /* bootstrap_id_hash of its unique id */
  int listen_fd;
  union sock_addr addr;    /* where this rank listens */
  uint8_t nonce[32];       /* what its listener proves itself with */
  struct boot_peer *peers; /* every rank's address and nonce */
  uint8_t (*seen)[32];     /* connectors' nonces accepted: a replay is refused */
  int nseen, capseen;
  /* Connections: those still proving themselves and the open ones. */
  struct boot_conn **conns;
  int nconns, capconns, npend_in, max_pending;
  struct boot_conn **by_peer; /* the one messages to each peer go on */
  uint8_t *gone;              /* why a peer can no longer be reached (bootstrap.c) */
  char gone_why[256];         /* what broke the last connection that broke */
  int gone_why_peer;
  struct boot_msg *stash, **stash_tail; /* arrived, not asked for yet */
  struct boot_tx *tx;                   /* by peer */
  int nresend;                          /* peers with messages to send again */
  struct boot_warn warn;                /* strangers logged */
  struct pollfd *pfd;
  struct boot_conn **pconn;
  int cappoll;
  uint64_t seq; /* numbers the all-gathers and barriers, same on all ranks */
  pthread_mutex_t lock;
  const volatile int *abort_flag;
  /* The communicator's loomCommSetTimeout bound (ns, 0: none), which its
   * waits use in place of LOOM_TIMEOUT; NULL while it has none to give. */
  const _Atomic uint64_t *timeout_ns;
  boot_alive_fn alive;
  void *alive_ctx;
  struct boot_stats stats;
};

/* Fills `id` and, unless NCCL_COMM_ID fixes the root's address, starts the
 * root in this process. With NCCL_COMM_ID the secret comes from
 * LOOM_SECRET or LOOM_SECRET_FILE; without either, a warning (once) says
 * that anyone who reaches the port can join. */
ncclResult_t bootstrap_get_unique_id(ncclUniqueId *id);

/* Always starts a new root in this process (NCCL_COMM_ID is for the
 * first communicator of a job, not for those made from it). */
ncclResult_t bootstrap_create_root_id(ncclUniqueId *id);

/* With NCCL_COMM_ID rank 0 starts the root at that address. */
int bootstrap_id_is_fixed(const ncclUniqueId *id);
ncclResult_t bootstrap_start_root(const ncclUniqueId *id);
/* Tells communicators apart in status reports and logs: a hash of the
 * root's address and the id's non-secret tag, so it reveals nothing of
 * the secret. */
uint64_t bootstrap_id_hash(const ncclUniqueId *id);
/* Zeroes a unique id (it holds a secret) once it is no longer needed. */
void bootstrap_id_wipe(ncclUniqueId *id);
const char *bootstrap_id_root(const ncclUniqueId *id, char *buf, size_t len);
/* Whether `id` looks like one that ncclGetUniqueId made. */
int bootstrap_id_valid(const ncclUniqueId *id);
/* What a rank whose secret the root refused is told about its secret:
 * where it came from and what to check. */
void bootstrap_id_secret_hint(const ncclUniqueId *id, char *buf, size_t len);

/* A communicator made from another (ncclCommSplit, ncclCommShrink) gets
 * a unique id whose secret every member derives from the parent's, so
 * only the root's address crosses the wire. Its leader starts the root
 * and tells the others `at`; each member then makes the id. `kind`,
 * `seq` (numbering the parent's splits or shrinks) and `color` must be
 * the same on every member of one child. */
struct bootstrap_child {
  union sock_addr root;
  uint8_t tag[8]; /* the id's non-secret tag */
};
ncclResult_t bootstrap_child_root(const struct bootstrap *parent, const char *kind, uint64_t seq, int color,
                                  struct bootstrap_child *at);
ncclResult_t bootstrap_child_id(const struct bootstrap *parent, const char *kind, uint64_t seq, int color,
                                const struct bootstrap_child *at, ncclUniqueId *id);

/* A grow (ncclCommGetUniqueId, ncclCommGrow) is such a child too, but its
 * id also goes to new ranks, which have no parent: `grow_from` stamps the
 * parent's size into it, which they check their rank against, and
 * bootstrap_id_child_at takes back what the existing ranks are told. */
void bootstrap_id_set_grow_from(ncclUniqueId *id, int grow_from);
int bootstrap_id_grow_from(const ncclUniqueId *id); /* 0: not a grow's id */
void bootstrap_id_child_at(const ncclUniqueId *id, struct bootstrap_child *at);

/* Joins the job of `nids` unique ids (ncclCommInitRankScalable; one
 * otherwise): every rank passes the same ids in the same order. */
ncclResult_t bootstrap_init(const ncclUniqueId *ids, int nids, int rank, int nranks, const volatile int *abort_flag,
                            struct bootstrap **out);
void bootstrap_close(struct bootstrap *b);

ncclResult_t bootstrap_send(struct bootstrap *b, int peer, uint64_t tag, const void *data, size_t len);
ncclResult_t bootstrap_recv(struct bootstrap *b, int peer, uint64_t tag, void *data, size_t len);

/* `data` has nranks slots of `size` bytes; this rank's slot is filled. */
ncclResult_t bootstrap_allgather(struct bootstrap *b, void *data, size_t size);
/* Returns once every rank has called it (an all-gather of one word);
 * `what` names the call in an out-of-memory sentence. */
ncclResult_t bootstrap_barrier(struct bootstrap *b, const char *what);

#endif
