/*
 * The socket plugin's insides, shared by net_socket.c (devices, the
 * connection handshake, requests and test()), net_socket_stream.c (the
 * control stream's system calls) and net_socket_thread.c (the helper
 * threads that move large messages).
 *
 * A connection is one control socket plus nsocks = nthreads x
 * nsocks_per_thread data sockets. Every message starts on the control
 * socket with its 64-bit length. A message of at most min_task bytes (and
 * every message when nsocks is 0) follows its length on the control
 * socket, moved by whoever calls test(): no thread stands between a small
 * message and the wire. A larger one is cut into chunks of
 * chunk_bytes(len) (at least min_task, at most nsocks of them) that go to
 * consecutive data sockets, starting where the previous large message
 * stopped; helper thread t moves the chunks of sockets t, t + nthreads,
 * ... in the order they were queued. Both sides cut by the same rule in
 * the same message order, so each side knows which bytes a socket
 * carries: the receiver learns a message's length from the control socket
 * before it queues its chunks. The receiving side chooses nsocks,
 * nthreads and min_task and puts them in the handle. The control stream
 * moves in as few system calls as it can: one sendmsg carries the lengths
 * and inline payloads of all the requests queued, and one read takes in
 * what follows the bytes it wants, for the next requests. A connection
 * without data sockets may carry the other direction too (sock_duplex):
 * a second comm on a duplicate of the control socket, which reads or
 * writes only its own direction of the TCP stream.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_SOCKET_H
#define LOOM_NET_SOCKET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core.h" /* NCCL_STEPS */
#include "misc/socket.h"
#include "nccl.h"

#define SOCK_MAX_REQS (2 * NCCL_STEPS)
#define SOCK_MAX_SOCKS 64   /* NCCL's cap on nthreads x nsocks_per_thread */
#define SOCK_MAX_THREADS 16 /* NCCL's cap on NCCL_SOCKET_NTHREADS */
/* A receiver's read of the control stream also takes up to this many
 * bytes past what it needs, so that a small message, length and payload,
 * comes in one read, and messages that arrived together in one. */
#define SOCK_AHEAD 16384
/* Control-stream pieces (lengths and inline payloads) one sendmsg takes. */
#define SOCK_SEND_IOV 16
/* How often a receiver asks TCP again for delayed ACKs (net_socket.c). */
#define SOCK_ACK_REARM_NS 1000000ull

struct pollfd;
struct sock_comm;
struct sock_req;

/* What a listener publishes, over the bootstrap, for its connector. The
 * cookie is a fresh random number per listener: only ranks of the job see
 * it (the bootstrap admits only holders of the job's secret), so a
 * connection that does not present it comes from outside the job. */
struct sock_handle {
  char magic[8];
  union sock_addr addr;
  uint64_t cookie; /* the connector must present it */
  uint32_t nsocks, nthreads;
  uint64_t min_task;
};

/* The first bytes on every TCP connection of a net connection: which
 * connection (a random id the connector picks) and which of its sockets
 * (nsocks: the control socket) this is, since the accepts of several
 * sockets, or several connections, come in any order. */
struct sock_hello {
  uint64_t cookie;
  uint64_t conn_id;
  uint32_t index, nsocks;
};

/* The listener's one-byte answer to a hello it has filed; until it comes,
 * the connector's socket may still be closed unread. */
#define SOCK_ANSWER 0xa5

/*
 * Pure checks of what comes from peers, shared with
 * tests/fuzz/fuzz_socket_msg.c. A handle arrives from the peer rank over
 * the bootstrap; 0 when it is a socket handle with a shape this side can
 * build (else ncclInternalError with the sentence), its copy in `out`.
 */
ncclResult_t sock_handle_decode(const void *handle, size_t len, struct sock_handle *out);
/* Whether a complete hello is one of this listener's connections: the
 * listener's cookie, its number of data sockets, a socket index in range. */
int sock_hello_ok(const struct sock_hello *h, uint64_t cookie, int nsocks);
/* What a receiver makes of a message's length word: -1 when the message
 * does not fit the `posted` bytes, else the number of chunks it comes in
 * on the data sockets (0: inline on the control socket). */
int sock_msg_chunks(const struct sock_comm *c, uint64_t len, size_t posted);
/* Where chunk j of a large message of `len` bytes starts, and its size. */
void sock_chunk_span(const struct sock_comm *c, uint64_t len, int j, size_t *off, size_t *size);

/* One chunk of a large message on one data socket. */
struct sock_task {
  struct sock_req *req;
  char *data;
  size_t size, moved;
};

struct sock_req {
  struct sock_comm *comm;
  int used, is_send;
  int ctrl_done;   /* the length, and an inline payload, have moved */
  char *data;
  size_t size;     /* posted size (recv) or message size (send) */
  uint64_t len;    /* the length word on the wire */
  size_t hdr_done; /* bytes of the length word moved */
  size_t moved;    /* inline payload bytes moved */
  _Atomic int pending; /* chunks the helpers have not finished */
  struct sock_task tasks[SOCK_MAX_SOCKS];
};

/* A data socket and its queue of chunks, oldest first. The queue belongs
 * to the socket's helper and is guarded by its lock. */
struct sock_stream {
  int fd;
  struct sock_task *q[SOCK_MAX_REQS];
  unsigned head, tail;
};

struct sock_helper {
  struct sock_comm *comm;
  int index;
  int started;
  pthread_t thread;
  int efd; /* eventfd: new chunks on an idle socket, or stop */
  pthread_mutex_t lock;
  unsigned gen; /* counts queued chunks, so a sleeper misses none */
  int sleeping, kicked, stop;
};

struct sock_comm {
  int fd; /* control socket */
  int is_send;
  int shared; /* fd's socket also carries the other direction (sock_duplex) */
  int nsocks, nthreads;
  size_t min_task;
  unsigned next_sock; /* where the next large message's first chunk goes */
  struct sock_stream socks[SOCK_MAX_SOCKS];
  struct sock_helper helpers[SOCK_MAX_THREADS];
  /* The connector's progress: socket i (nsocks: the control socket) is
   * not started (0), connecting (1), greeting (2), waiting for the
   * listener's answer (3) or up (4). */
  uint8_t link_state[SOCK_MAX_SOCKS + 1];
  uint8_t link_sent[SOCK_MAX_SOCKS + 1];
  int nlinks_up;
  uint64_t cookie, conn_id;
  union sock_addr peer;
  char where[SOCK_ADDR_STRLEN];
  struct sock_req reqs[SOCK_MAX_REQS];
  unsigned head, tail; /* requests in flight: [head, tail) */
  /* The first failure, from the caller's thread or a helper's. */
  pthread_mutex_t fail_lock;
  _Atomic int failed; /* an ncclResult_t, ncclSuccess while none */
  _Atomic int helper_failed; /* a data socket broke, not just the control one */
  _Atomic uint64_t moved; /* bytes moved on every socket, for LOOM_TIMEOUT */
  char why[256];
  /* Receiving: control-stream bytes that a read took in past the end of
   * what it was reading (the next lengths and inline payloads), which the
   * next requests take before they read the socket again. */
  size_t ahead_off, ahead_len;
  uint64_t acks_asked; /* when a read last asked for delayed ACKs (net_socket.c) */
  char ahead[SOCK_AHEAD];
};

/* Records the comm's first failure and returns `code`. */
ncclResult_t sock_comm_fail(struct sock_comm *c, ncclResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Bytes per chunk of a large message of `len` bytes. */
/* Moves bytes of one stream of `c` on `fd` without blocking, from *done
 * to len: 1 all moved, 0 the socket would block, -1 the connection failed
 * (recorded on the comm). */
int sock_stream_move(struct sock_comm *c, int fd, int sending, char *p, size_t len, size_t *done);
size_t sock_chunk_bytes(const struct sock_comm *c, uint64_t len);

/* Whether a message of `len` bytes travels in chunks on the data sockets
 * (else whole on the control socket). */
static inline int sock_is_large(const struct sock_comm *c, uint64_t len) {
  return c->nsocks > 0 && len > c->min_task;
}

/* Moves as much of the control stream as the socket takes, oldest request
 * first, without blocking (net_socket_stream.c); a failure is recorded on
 * the comm. */
void sock_progress(struct sock_comm *c);

/* The plugin's poll_fds (net_socket_stream.c): the control socket while
 * its stream owes or awaits bytes; -1 while chunks are with the helper
 * threads, a request is finished but not yet tested, or the comm failed. */
int sock_poll_fds(void *comm, struct pollfd *fds, int max);

/* Cuts request `r` (len known) into chunks and queues them on the data
 * sockets, starting helpers as needed. */
ncclResult_t sock_dispatch(struct sock_comm *c, struct sock_req *r);

/* Stops and joins the comm's helpers and closes their eventfds. */
void sock_helpers_stop(struct sock_comm *c);

#endif
