/*
 * One bootstrap connection (bootstrap_wire.h has the protocol): the
 * challenge and response that proves both ends hold the job's secret, then
 * messages framed and authenticated under the connection's own keys. The
 * ranks (bootstrap.c) and the root (bootstrap_root.c) drive many of these
 * at once from one poll loop, so nothing here blocks except the helpers
 * named _wait, which bound themselves by a deadline.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_BOOTSTRAP_CONN_H
#define LOOM_BOOTSTRAP_CONN_H

#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_wire.h"

/* A message that has arrived; the ranks keep those nobody asked for yet. */
struct boot_msg {
  struct boot_msg *next;
  int from;
  uint64_t tag;
  size_t len;
  char data[];
};

/* A message this side sends, owned by the connection that carries it
 * (bootstrap.c moves those a listener dropped unanswered to the next). */
struct boot_out {
  struct boot_out *next;
  uint64_t serial; /* numbers the messages to one peer, from 1 */
  uint64_t tag;
  size_t len;
  char data[];
};

enum boot_conn_state {
  BC_CONNECTING, /* connector: the TCP connection is being made */
  BC_ANSWER,     /* connector: challenge (and proof, to a rank) sent, waiting for the answer */
  BC_CHAL,       /* listener: waiting for the challenge */
  BC_PROOF,      /* listener: waiting for the proof (the root: after its answer) */
  BC_OPEN,       /* both proved the secret: messages */
  BC_DEAD
};

/* What boot_conn_step found. */
enum boot_event {
  BE_NONE,         /* nothing more for now */
  BE_OPENED,       /* the handshake has just completed */
  BE_MSG,          /* a whole message, authenticated */
  BE_CLOSED,       /* an open connection ended cleanly between messages */
  BE_REFUSED,      /* listener: the connector is no rank of this job (why says how) */
  BE_WRONG_SECRET, /* connector: the listener does not hold this job's secret */
  BE_BROKEN        /* anything else that ends the connection (why says what) */
};

#define BOOT_RXBUF 4096

struct boot_conn {
  int fd;
  enum boot_conn_state state;
  int peer; /* the rank at the other end (BOOT_TO_ROOT: the root); -1 until the challenge */
  int outgoing;
  int sys_err;    /* errno of a failed connect or socket call */
  int tampered;   /* a message failed its MAC */
  uint64_t id;    /* unique in the process, for callers that hold one across waits */
  /* A listener's deadline for the greeting: GREETING_NS after the last
   * bytes of it, never past max_until (bootstrap_wire.h). */
  uint64_t until, max_until;
  uint64_t last_rx; /* when bytes last arrived (a listener: or it accepted) */
  int known;      /* the listener's nonce was known beforehand: no round trip (between ranks) */
  const uint8_t *key;
  int me, nranks; /* the listener's rank (BOOT_TO_ROOT for the root) and job size (0: any) */
  struct boot_chal chal;
  uint8_t nonce[BOOT_NONCE]; /* the listener's */
  int has_keys;
  struct boot_keys keys;
  const uint8_t *k_tx, *k_rx;
  uint64_t seq_tx, seq_rx;
  /* Receiving: the record being assembled, then a message's header, body
   * and trailer, out of `buf` or straight from the socket. */
  uint8_t rec[80];
  size_t got;
  int stage;
  struct boot_msg_hdr hdr;
  struct boot_msg *msg;
  size_t body_got;
  uint8_t buf[BOOT_RXBUF];
  size_t off, len;
  /* Sending: the messages in order (txq), the head framed by tx_hdr and
   * tx_mac once it starts. A connector that writes messages before the
   * listener has answered keeps them (held) until it does: the listener
   * may still drop the connection unread (too slow a greeting, too many
   * waiting), and then they go again on another (boot_conn_unsent). */
  struct boot_out *txq, *held;
  struct boot_msg_hdr tx_hdr;
  uint8_t tx_mac[BOOT_MAC];
  size_t tx_done;
  int tx_busy;
  uint64_t wrote; /* the serial of the last message written whole */
  uint64_t bytes_in, bytes_out;
};

/* Counts one more connection refused or dropped: 0 when it goes unsaid,
 * else how many the line about it stands for (1: itself alone). */
int boot_warn_take(struct boot_warn *w);
/* ", and N more since the last such line" for a count from boot_warn_take. */
const char *boot_warn_more(int n, char *buf, size_t len);

/* A connection accepted by a listener that is rank `me` of `nranks` and
 * proves itself with `nonce`, or by the root (BOOT_TO_ROOT, nranks 0,
 * nonce NULL: a fresh one per connection, sent in an answer). Its
 * greeting is due by `until`, later as its bytes come (GREETING_NS). */
void boot_conn_accepted(struct boot_conn *c, int fd, const uint8_t *key, int me, int nranks, uint64_t until,
                        const uint8_t *nonce);
/* Starts connecting to `addr` as rank `from` of `nranks`, for rank `to`
 * whose listener's nonce is `nonce`, or for the root (BOOT_TO_ROOT, nonce
 * NULL); or takes `fd` (>= 0) that is connected there already, and closes
 * it if this fails. A connection refused at once leaves state BC_DEAD
 * with sys_err set; the caller decides what that means. On an error the
 * connection is BC_DEAD with no fd. */
ncclResult_t boot_conn_connect(struct boot_conn *c, const union sock_addr *addr, int fd, const uint8_t *key, int from,
                               int to, int nranks, const uint8_t *nonce);
/* Whether messages may be queued: the connection is open, or it is a
 * rank's to a rank whose proof is on its way. */
int boot_conn_can_send(const struct boot_conn *c);
/* The poll events the connection waits for. */
short boot_conn_events(const struct boot_conn *c);
/* Moves the connection on after poll said `revents` (0: just try): sends
 * what the socket takes of the queue, then reads. Call until it reports
 * BE_NONE: bytes read ahead stay in the connection and poll would not
 * report them again. Returns an error only for a local failure (memory,
 * randomness, libcrypto); a peer's misbehaviour, or a socket that fails,
 * is an event, with `why` saying what happened. */
ncclResult_t boot_conn_step(struct boot_conn *c, short revents, enum boot_event *ev, struct boot_msg **msg, char *why,
                            size_t whylen);
/* Queues a copy of one message (`serial` as the caller numbers them; it
 * comes back in c->wrote once the message is written whole); the steps
 * send it as soon as the connection may. */
ncclResult_t boot_conn_queue(struct boot_conn *c, uint64_t serial, uint64_t tag, const void *data, size_t len);
/* Appends messages that another connection did not deliver. */
void boot_conn_requeue(struct boot_conn *c, struct boot_out *list);
/* A connection that ended before the listener answered: the messages it
 * held and those it had not written, in order, now the caller's. */
struct boot_out *boot_conn_unsent(struct boot_conn *c);
/* A message as a connection would own it, for a list that waits for one. */
ncclResult_t boot_out_new(uint64_t serial, uint64_t tag, const void *data, size_t len, struct boot_out **out);
void boot_out_append(struct boot_out **list, struct boot_out *more);
void boot_out_free(struct boot_out *list);
/* Blocking forms for a single connection (the root, and a rank's
 * connection to it): wait for the next event, or send a whole message,
 * by `deadline`, or until *abort_flag (may be NULL) is raised. `set_ns`
 * names the bound in the timeout's sentence (timeout_name): a
 * communicator's loomCommSetTimeout value, 0 for LOOM_TIMEOUT. */
ncclResult_t boot_conn_wait(struct boot_conn *c, uint64_t deadline, uint64_t set_ns, const volatile int *abort_flag,
                            const char *what, enum boot_event *ev, struct boot_msg **msg, char *why, size_t whylen);
ncclResult_t boot_conn_send_wait(struct boot_conn *c, uint64_t tag, const void *data, size_t len, uint64_t deadline,
                                 uint64_t set_ns, const char *what);
/* The connection's peer address, for log lines about strangers. */
const char *boot_conn_peer_str(const struct boot_conn *c, char *buf, size_t len);
void boot_conn_close(struct boot_conn *c);

#endif
