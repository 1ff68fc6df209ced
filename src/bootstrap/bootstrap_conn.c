/*
 * One bootstrap connection: handshake, framing and MACs (bootstrap_conn.h).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap_conn.h"
#include "misc/utils.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

enum { ST_HDR, ST_BODY, ST_TRAILER };

static ncclResult_t push(struct boot_conn *c, int *failed);

static uint64_t next_id(void) {
  static uint64_t ids;
  return __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
}

static void conn_init(struct boot_conn *c, int fd, const uint8_t *key) {
  memset(c, 0, sizeof *c);
  c->fd = fd;
  c->key = key;
  c->peer = -1;
  c->id = next_id();
}

void boot_conn_accepted(struct boot_conn *c, int fd, const uint8_t *key, int me, int nranks, uint64_t until,
                        const uint8_t *nonce) {
  conn_init(c, fd, key);
  c->state = BC_CHAL;
  c->me = me;
  c->nranks = nranks;
  c->until = until;
  c->max_until = until > UINT64_MAX - GREETING_MAX_NS ? UINT64_MAX : until - GREETING_NS + GREETING_MAX_NS;
  c->last_rx = time_ns();
  if (nonce) {
    c->known = 1;
    memcpy(c->nonce, nonce, BOOT_NONCE);
  }
  sock_set_nodelay(fd);
}

int boot_conn_can_send(const struct boot_conn *c) {
  return c->state == BC_OPEN || (c->state == BC_ANSWER && c->known && c->has_keys);
}

/* A whole small record on a socket that has just been written to at most
 * a few hundred bytes: the kernel takes it at once, or the peer is gone. */
static int send_record(struct boot_conn *c, const void *rec, size_t len) {
  ssize_t n = send(c->fd, rec, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == (ssize_t)len) {
    c->bytes_out += len;
    return 0;
  }
  c->sys_err = n < 0 ? errno : EAGAIN;
  return -1;
}

static ncclResult_t derive(struct boot_conn *c) {
  CHECK(boot_keys_derive(c->key, &c->chal, c->nonce, &c->keys));
  c->k_tx = c->outgoing ? c->keys.c2l : c->keys.l2c;
  c->k_rx = c->outgoing ? c->keys.l2c : c->keys.c2l;
  c->has_keys = 1;
  return ncclSuccess;
}

/* The connector's first bytes: the challenge, and to a rank the proof
 * with it, so that messages can follow at once. On an error the caller
 * closes the connection. */
static ncclResult_t send_chal(struct boot_conn *c) {
  struct {
    struct boot_chal chal;
    struct boot_proof proof;
  } rec;
  rec.chal = c->chal;
  size_t len = sizeof rec.chal;
  if (c->known) {
    CHECK(boot_proof_make(c->key, &c->chal, c->nonce, &rec.proof));
    len += sizeof rec.proof;
  }
  c->state = send_record(c, &rec, len) == 0 ? BC_ANSWER : BC_DEAD;
  if (c->state == BC_ANSWER && c->known)
    CHECK(derive(c));
  return ncclSuccess;
}

ncclResult_t boot_conn_connect(struct boot_conn *c, const union sock_addr *addr, int fd, const uint8_t *key,
                               int from, int to, int nranks, const uint8_t *nonce) {
  /* The nonce first: a connection that fails to start is dead and holds
   * no fd, whichever step failed. */
  struct boot_chal chal;
  memset(&chal, 0, sizeof chal);
  ncclResult_t r = util_random(chal.nonce, sizeof chal.nonce);
  int connecting = fd < 0;
  if (r == ncclSuccess && connecting) {
    fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      r = err_set(ncclSystemError, "bootstrap: socket() failed: %s", strerror(errno));
  }
  conn_init(c, fd, key);
  if (r != ncclSuccess) {
    boot_conn_close(c);
    return r;
  }
  c->outgoing = 1;
  c->peer = to;
  if (nonce) {
    c->known = 1;
    memcpy(c->nonce, nonce, BOOT_NONCE);
  }
  c->chal = chal;
  memcpy(c->chal.magic, chal_magic, sizeof c->chal.magic);
  c->chal.from = from;
  c->chal.to = to;
  c->chal.nranks = nranks;
  sock_set_nodelay(fd);
  if (!connecting || connect(fd, &addr->sa, sock_addr_len(addr)) == 0) {
    r = send_chal(c);
    if (r != ncclSuccess)
      boot_conn_close(c);
    return r;
  }
  if (errno == EINPROGRESS || errno == EINTR) {
    c->state = BC_CONNECTING;
    return ncclSuccess;
  }
  c->sys_err = errno;
  c->state = BC_DEAD;
  return ncclSuccess;
}

short boot_conn_events(const struct boot_conn *c) {
  if (c->state == BC_CONNECTING)
    return POLLOUT;
  return (short)(POLLIN | (c->txq && boot_conn_can_send(c) ? POLLOUT : 0));
}

const char *boot_conn_peer_str(const struct boot_conn *c, char *buf, size_t len) {
  union sock_addr a;
  socklen_t alen = sizeof a;
  memset(&a, 0, sizeof a);
  if (getpeername(c->fd, &a.sa, &alen) != 0)
    snprintf(buf, len, "an unknown address");
  else
    sock_addr_str(&a, buf, len);
  return buf;
}

/* Bytes have arrived. A listener gives a greeting that is still coming
 * more time; bytes that are wrong end it as they are judged. */
static void received(struct boot_conn *c) {
  c->last_rx = time_ns();
  if (c->outgoing)
    return;
  uint64_t until = c->last_rx + GREETING_NS;
  until = LOOM_MIN(until, c->max_until);
  if (until > c->until)
    c->until = until;
}

/* Makes bytes available in buf: 1, or 0 when the socket has none yet, -1
 * at the end of the stream, -2 on an error (sys_err). */
static int fill(struct boot_conn *c) {
  if (c->off < c->len)
    return 1;
  ssize_t n = recv(c->fd, c->buf, sizeof c->buf, MSG_DONTWAIT);
  if (n > 0) {
    c->off = 0;
    c->len = (size_t)n;
    c->bytes_in += (uint64_t)n;
    received(c);
    return 1;
  }
  if (n == 0)
    return -1;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    return 0;
  c->sys_err = errno;
  return -2;
}

/* Moves buffered bytes into dst until it holds `want`. A record is judged
 * at whatever length it has reached, so a stranger is dropped at its
 * first wrong byte, not after a whole record. */
static size_t take(struct boot_conn *c, void *dst, size_t *have, size_t want) {
  size_t n = LOOM_MIN(want - *have, c->len - c->off);
  memcpy((char *)dst + *have, c->buf + c->off, n);
  c->off += n;
  *have += n;
  return n;
}

static enum boot_event say(char *why, size_t len, enum boot_event ev, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum boot_event say(char *why, size_t len, enum boot_event ev, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, len, fmt, ap);
  va_end(ap);
  return ev;
}

/* The stream ended or failed (f from fill) in the current state. */
static enum boot_event ended(struct boot_conn *c, int f, char *why, size_t len) {
  const char *how = f == -1 ? "closed the connection" : strerror(c->sys_err);
  switch (c->state) {
  case BC_CHAL:
    return say(why, len, BE_REFUSED, "%s before it sent a whole challenge", how);
  case BC_PROOF:
    /* A Loom process with another secret ends here too: it sends no
     * proof once the answer shows that the secrets differ. */
    return say(why, len, BE_REFUSED, "%s before it proved the job's secret (a process with another secret or "
               "another job's unique id does that)", how);
  case BC_ANSWER:
    return say(why, len, BE_BROKEN, "%s before it answered the challenge", f == -1 ? "it closed the connection" : how);
  default:
    break;
  }
  if (f == -1 && c->stage == ST_HDR && c->got == 0)
    return BE_CLOSED;
  return say(why, len, BE_BROKEN, "%s%s", f == -1 ? "the connection was closed" : "the connection failed: ",
             f == -1 ? " in the middle of a message" : how);
}

static ncclResult_t open_conn(struct boot_conn *c) {
  if (!c->has_keys)
    CHECK(derive(c));
  /* The listener has answered, so it reads on: what was written is
   * delivered unless the connection itself fails. */
  boot_out_free(c->held);
  c->held = NULL;
  c->state = BC_OPEN;
  c->stage = ST_HDR;
  c->got = 0;
  return ncclSuccess;
}

/* Listener: the challenge and the proof; the root answers in between
 * with a fresh nonce, a rank after them with the nonce it is known by. */
static ncclResult_t step_listener(struct boot_conn *c, enum boot_event *ev, char *why, size_t len) {
  struct boot_answer a;
  if (c->state == BC_CHAL) {
    take(c, c->rec, &c->got, sizeof c->chal);
    enum boot_verdict v = boot_chal_check(c->rec, c->got, c->me, c->nranks, &c->chal);
    if (v == BOOT_SHORT)
      return ncclSuccess;
    if (v != BOOT_OK) {
      *ev = say(why, len, BE_REFUSED, "sent %s instead of a challenge", boot_verdict_str(v));
      return ncclSuccess;
    }
    c->peer = c->chal.from;
    c->state = BC_PROOF;
    c->got = 0;
    if (c->known)
      return ncclSuccess;
    CHECK(util_random(c->nonce, sizeof c->nonce));
    CHECK(boot_answer_make(c->key, &c->chal, c->nonce, &a));
    if (send_record(c, &a, sizeof a) != 0) {
      *ev = say(why, len, BE_REFUSED, "could not be answered: %s", strerror(c->sys_err));
      return ncclSuccess;
    }
    c->until = time_ns() + GREETING_NS;
    return ncclSuccess;
  }
  take(c, c->rec, &c->got, sizeof(struct boot_proof));
  enum boot_verdict v = boot_proof_check(c->rec, c->got, c->key, &c->chal, c->nonce);
  if (v == BOOT_SHORT)
    return ncclSuccess;
  if (v == BOOT_WRONG_SECRET) {
    *ev = say(why, len, BE_REFUSED,
              "claimed to be rank %d of %d but did not prove the job's secret: it holds another job's unique id "
              "or a different LOOM_SECRET, or it replayed what it recorded of a rank",
              c->chal.from, c->chal.nranks);
    return ncclSuccess;
  }
  if (v != BOOT_OK) {
    *ev = say(why, len, BE_REFUSED, "sent %s instead of a proof", boot_verdict_str(v));
    return ncclSuccess;
  }
  if (c->known) {
    CHECK(boot_answer_make(c->key, &c->chal, c->nonce, &a));
    if (send_record(c, &a, sizeof a) != 0) {
      *ev = say(why, len, BE_REFUSED, "could not be answered: %s", strerror(c->sys_err));
      return ncclSuccess;
    }
  }
  CHECK(open_conn(c));
  *ev = BE_OPENED;
  return ncclSuccess;
}

/* Connector: the answer; to the root, its own proof then. */
static ncclResult_t step_connector(struct boot_conn *c, enum boot_event *ev, char *why, size_t len) {
  struct boot_answer a;
  take(c, c->rec, &c->got, sizeof a);
  enum boot_verdict v = boot_answer_check(c->rec, c->got, c->key, &c->chal, c->known ? c->nonce : NULL, &a);
  if (v == BOOT_SHORT)
    return ncclSuccess;
  if (v != BOOT_OK && v != BOOT_WRONG_SECRET) {
    *ev = say(why, len, BE_BROKEN, "it answered with %s", boot_verdict_str(v));
    return ncclSuccess;
  }
  /* A listener that cannot prove the secret gets no proof either: a MAC
   * made with the secret over its nonce would let it guess a weak
   * LOOM_SECRET offline. */
  if (v == BOOT_WRONG_SECRET) {
    *ev = BE_WRONG_SECRET;
    return ncclSuccess;
  }
  if (!c->known) {
    memcpy(c->nonce, a.nonce, sizeof c->nonce);
    struct boot_proof p;
    CHECK(boot_proof_make(c->key, &c->chal, c->nonce, &p));
    if (send_record(c, &p, sizeof p) != 0) {
      *ev = say(why, len, BE_BROKEN, "the proof could not be sent: %s", strerror(c->sys_err));
      return ncclSuccess;
    }
  }
  CHECK(open_conn(c));
  *ev = BE_OPENED;
  return ncclSuccess;
}

/* An open connection: header, body, trailer. */
static ncclResult_t step_open(struct boot_conn *c, enum boot_event *ev, struct boot_msg **msg, char *why, size_t len) {
  if (c->stage == ST_HDR) {
    take(c, c->rec, &c->got, sizeof c->hdr);
    enum boot_verdict v = boot_hdr_check(c->rec, c->got, c->k_rx, c->seq_rx, &c->hdr);
    if (v == BOOT_SHORT)
      return ncclSuccess;
    if (v != BOOT_OK) {
      c->tampered = 1;
      *ev = say(why, len, BE_BROKEN, "message %llu's header is %s: it was altered, injected or replayed",
                (unsigned long long)c->seq_rx, boot_verdict_str(v));
      return ncclSuccess;
    }
    c->msg = malloc(sizeof *c->msg + c->hdr.len);
    if (!c->msg)
      return err_set(ncclSystemError, "out of memory for a %llu-byte bootstrap message",
                     (unsigned long long)c->hdr.len);
    c->msg->next = NULL;
    c->msg->from = c->peer;
    c->msg->tag = c->hdr.tag;
    c->msg->len = c->hdr.len;
    c->body_got = 0;
    c->got = 0;
    c->stage = c->hdr.len > 0 ? ST_BODY : ST_TRAILER;
    return ncclSuccess;
  }
  if (c->stage == ST_BODY) {
    take(c, c->msg->data, &c->body_got, c->msg->len);
    if (c->body_got == c->msg->len)
      c->stage = ST_TRAILER;
    return ncclSuccess;
  }
  take(c, c->rec, &c->got, BOOT_MAC);
  if (c->got < BOOT_MAC)
    return ncclSuccess;
  enum boot_verdict v = boot_trailer_check(c->rec, c->k_rx, c->seq_rx, &c->hdr, c->msg->data);
  if (v != BOOT_OK) {
    c->tampered = 1;
    *ev = say(why, len, BE_BROKEN, "message %llu (tag %llx) carries %s: it was altered on the way",
              (unsigned long long)c->seq_rx, (unsigned long long)c->hdr.tag, boot_verdict_str(v));
    return ncclSuccess;
  }
  c->seq_rx++;
  c->stage = ST_HDR;
  c->got = 0;
  *msg = c->msg;
  c->msg = NULL;
  *ev = BE_MSG;
  return ncclSuccess;
}

/* A connect that was in progress has finished, one way or the other. */
static ncclResult_t connected(struct boot_conn *c, enum boot_event *ev, char *why, size_t len) {
  int e = 0;
  socklen_t elen = sizeof e;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
    e = errno;
  if (e != 0) {
    c->sys_err = e;
    c->state = BC_DEAD;
  } else {
    ncclResult_t r = send_chal(c);
    if (r != ncclSuccess) {
      boot_conn_close(c);
      return r;
    }
  }
  if (c->state == BC_DEAD)
    *ev = say(why, len, BE_BROKEN, "cannot connect: %s", strerror(c->sys_err));
  return ncclSuccess;
}

ncclResult_t boot_conn_step(struct boot_conn *c, short revents, enum boot_event *ev, struct boot_msg **msg, char *why,
                            size_t whylen) {
  *ev = BE_NONE;
  *msg = NULL;
  if (c->state == BC_DEAD) {
    *ev = say(why, whylen, BE_BROKEN, "cannot connect: %s", strerror(c->sys_err));
    return ncclSuccess;
  }
  if (c->state == BC_CONNECTING) {
    if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
      return ncclSuccess;
    CHECK(connected(c, ev, why, whylen));
    if (*ev != BE_NONE)
      return ncclSuccess;
  }
  if (c->txq && boot_conn_can_send(c)) {
    int failed;
    CHECK(push(c, &failed));
    if (failed) {
      *ev = say(why, whylen, BE_BROKEN, "sending failed: %s", strerror(c->sys_err));
      return ncclSuccess;
    }
  }
  while (*ev == BE_NONE) {
    /* A large body bypasses the buffer. */
    if (c->state == BC_OPEN && c->stage == ST_BODY && c->off == c->len && c->msg->len - c->body_got >= BOOT_RXBUF) {
      ssize_t n = recv(c->fd, c->msg->data + c->body_got, c->msg->len - c->body_got, MSG_DONTWAIT);
      if (n > 0) {
        c->body_got += (size_t)n;
        c->bytes_in += (uint64_t)n;
        received(c);
        if (c->body_got == c->msg->len)
          c->stage = ST_TRAILER;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ncclSuccess;
      if (n < 0)
        c->sys_err = errno;
      *ev = ended(c, n == 0 ? -1 : -2, why, whylen);
      return ncclSuccess;
    }
    int f = fill(c);
    if (f == 0)
      return ncclSuccess;
    if (f < 0) {
      *ev = ended(c, f, why, whylen);
      return ncclSuccess;
    }
    switch (c->state) {
    case BC_CHAL:
    case BC_PROOF:
      CHECK(step_listener(c, ev, why, whylen));
      break;
    case BC_ANSWER:
      CHECK(step_connector(c, ev, why, whylen));
      break;
    case BC_OPEN:
      CHECK(step_open(c, ev, msg, why, whylen));
      break;
    default:
      return ncclSuccess;
    }
  }
  return ncclSuccess;
}

ncclResult_t boot_out_new(uint64_t serial, uint64_t tag, const void *data, size_t len, struct boot_out **out) {
  struct boot_out *m = malloc(sizeof *m + len);
  if (!m)
    return err_set(ncclSystemError, "out of memory for a %zu-byte bootstrap message", len);
  m->next = NULL;
  m->serial = serial;
  m->tag = tag;
  m->len = len;
  if (len > 0)
    memcpy(m->data, data, len);
  *out = m;
  return ncclSuccess;
}

ncclResult_t boot_conn_queue(struct boot_conn *c, uint64_t serial, uint64_t tag, const void *data, size_t len) {
  struct boot_out *m;
  CHECK(boot_out_new(serial, tag, data, len, &m));
  boot_conn_requeue(c, m);
  return ncclSuccess;
}

static void append(struct boot_out **list, struct boot_out *more) {
  while (*list)
    list = &(*list)->next;
  *list = more;
}

void boot_out_append(struct boot_out **list, struct boot_out *more) { append(list, more); }

void boot_conn_requeue(struct boot_conn *c, struct boot_out *list) { append(&c->txq, list); }

struct boot_out *boot_conn_unsent(struct boot_conn *c) {
  struct boot_out *list = c->held;
  append(&list, c->txq);
  c->held = c->txq = NULL;
  /* Half a message is nothing to a new connection: it goes whole, framed
   * under that connection's keys. */
  c->tx_busy = 0;
  c->tx_done = 0;
  return list;
}

void boot_out_free(struct boot_out *list) {
  while (list) {
    struct boot_out *next = list->next;
    free(list);
    list = next;
  }
}

/* Writes what the socket takes of the queue; *failed when the socket
 * failed (sys_err says how). */
static ncclResult_t push(struct boot_conn *c, int *failed) {
  *failed = 0;
  while (c->txq) {
    struct boot_out *m = c->txq;
    if (!c->tx_busy) {
      CHECK(boot_hdr_make(c->k_tx, c->seq_tx, m->tag, m->len, &c->tx_hdr));
      CHECK(boot_trailer_make(c->k_tx, c->seq_tx, &c->tx_hdr, m->data, c->tx_mac));
      c->seq_tx++;
      c->tx_done = 0;
      c->tx_busy = 1;
    }
    size_t parts[3] = {sizeof c->tx_hdr, m->len, BOOT_MAC}, total = parts[0] + parts[1] + parts[2];
    const char *base[3] = {(const char *)&c->tx_hdr, m->data, (const char *)c->tx_mac};
    while (c->tx_done < total) {
      struct iovec iov[3];
      int n = 0;
      size_t at = 0;
      for (int i = 0; i < 3; i++) {
        if (c->tx_done < at + parts[i] && parts[i] > 0) {
          size_t skip = c->tx_done > at ? c->tx_done - at : 0;
          iov[n++] = (struct iovec){.iov_base = (void *)(base[i] + skip), .iov_len = parts[i] - skip};
        }
        at += parts[i];
      }
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
      ssize_t s = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (s > 0) {
        c->tx_done += (size_t)s;
        c->bytes_out += (uint64_t)s;
        continue;
      }
      if (s < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ncclSuccess;
      c->sys_err = s < 0 ? errno : EPIPE;
      *failed = 1;
      return ncclSuccess;
    }
    c->txq = m->next;
    m->next = NULL;
    c->tx_busy = 0;
    c->wrote = m->serial;
    if (c->state == BC_OPEN)
      free(m);
    else
      append(&c->held, m);
  }
  return ncclSuccess;
}

int boot_warn_take(struct boot_warn *w) {
  uint64_t now = time_ns();
  w->held++;
  if (w->said >= BOOT_WARN_FIRST && now - w->last < 1000000000ull)
    return 0;
  int n = w->held;
  w->held = 0;
  w->said++;
  w->last = now;
  return n;
}

const char *boot_warn_more(int n, char *buf, size_t len) {
  if (n <= 1)
    snprintf(buf, len, "%s", "");
  else
    snprintf(buf, len, " (and %d more refused or dropped since the last such line, not logged one by one)", n - 1);
  return buf;
}

/* Polls one connection for at most 100 ms (so that callers see an abort
 * promptly): its revents, 0 when none came. */
static short poll_one(int fd, short events, uint64_t deadline) {
  uint64_t now = time_ns();
  uint64_t ms = deadline > now ? (deadline - now) / 1000000 + 1 : 0;
  struct pollfd p = {.fd = fd, .events = events};
  return poll(&p, 1, ms > 100 ? 100 : (int)ms) > 0 ? p.revents : 0;
}

ncclResult_t boot_conn_wait(struct boot_conn *c, uint64_t deadline, uint64_t set_ns, const volatile int *abort_flag,
                            const char *what, enum boot_event *ev, struct boot_msg **msg, char *why, size_t whylen) {
  short rev = 0;
  for (;;) {
    CHECK(boot_conn_step(c, rev, ev, msg, why, whylen));
    if (*ev != BE_NONE)
      return ncclSuccess;
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE))
      return err_set(ncclInvalidUsage, "the communicator was aborted while waiting for %s", what);
    if (time_ns() >= deadline) {
      char bound[TIMEOUT_NAME_LEN];
      return err_set(ncclRemoteError, "waiting for %s timed out after %s", what,
                     timeout_name(set_ns, timeout_seconds(), bound, sizeof bound));
    }
    rev = poll_one(c->fd, boot_conn_events(c), deadline);
  }
}

ncclResult_t boot_conn_send_wait(struct boot_conn *c, uint64_t tag, const void *data, size_t len, uint64_t deadline,
                                 uint64_t set_ns, const char *what) {
  if (!boot_conn_can_send(c))
    return err_set(ncclInternalError, "bootstrap: sending to %s on a connection that is not open", what);
  CHECK(boot_conn_queue(c, 0, tag, data, len));
  for (;;) {
    int failed;
    CHECK(push(c, &failed));
    if (failed)
      return err_set(ncclRemoteError, "sending to %s over the bootstrap failed: %s", what, strerror(c->sys_err));
    if (!c->txq)
      return ncclSuccess;
    if (time_ns() >= deadline) {
      char bound[TIMEOUT_NAME_LEN];
      return err_set(ncclRemoteError, "sending to %s timed out after %s", what,
                     timeout_name(set_ns, timeout_seconds(), bound, sizeof bound));
    }
    poll_one(c->fd, POLLOUT, deadline);
  }
}

void boot_conn_close(struct boot_conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  free(c->msg);
  c->msg = NULL;
  boot_out_free(c->txq);
  boot_out_free(c->held);
  c->txq = c->held = NULL;
  c->tx_busy = 0;
  boot_cleanse(&c->keys, sizeof c->keys);
  c->has_keys = 0;
  c->k_tx = c->k_rx = NULL;
  c->state = BC_DEAD;
}
