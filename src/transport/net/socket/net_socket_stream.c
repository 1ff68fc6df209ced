/*
 * The socket plugin's byte movers (net_socket.h has the wire rules): a
 * stream of one socket without blocking (also the helper threads'), and
 * the control stream, which the caller of test() drives: lengths and
 * inline payloads leave in as few sendmsg calls as the socket takes and
 * arrive through a read-ahead buffer, so that a small message costs one
 * system call on each side.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net/socket/net_socket.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

int sock_stream_move(struct sock_comm *c, int fd, int sending, char *p, size_t len, size_t *done) {
  while (*done < len) {
    ssize_t n = sending ? send(fd, p + *done, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p + *done, len - *done, MSG_DONTWAIT);
    int e = errno;
    if (n > 0) {
      *done += (size_t)n;
      atomic_fetch_add_explicit(&c->moved, (uint64_t)n, memory_order_relaxed);
      continue;
    }
    if (n < 0 && (e == EAGAIN || e == EWOULDBLOCK))
      return 0;
    if (n < 0 && e == EINTR)
      continue;
    sock_comm_fail(c, ncclRemoteError, "the connection with %s %s", c->where, sock_broken_reason(n, e));
    return -1;
  }
  return 1;
}

/* Sends what the control stream owes, oldest request first, in one
 * sendmsg of up to SOCK_SEND_IOV pieces: a small message's length and
 * payload leave in one system call (one segment, with TCP_NODELAY), and
 * requests queued together leave together. TCP keeps the order, so
 * lengths and inline payloads arrive in the order they were posted. */
static void progress_send(struct sock_comm *c) {
  for (;;) {
    struct iovec iov[SOCK_SEND_IOV];
    int n = 0;
    size_t total = 0;
    for (unsigned i = c->head; i != c->tail && n + 2 <= SOCK_SEND_IOV; i++) {
      struct sock_req *r = &c->reqs[i % SOCK_MAX_REQS];
      if (r->ctrl_done)
        continue;
      if (r->hdr_done < sizeof r->len)
        iov[n++] = (struct iovec){(char *)&r->len + r->hdr_done, sizeof r->len - r->hdr_done};
      if (!sock_is_large(c, r->len) && r->moved < r->len)
        iov[n++] = (struct iovec){r->data + r->moved, (size_t)r->len - r->moved};
    }
    if (n == 0)
      return;
    for (int k = 0; k < n; k++)
      total += iov[k].iov_len;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t sent = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    int e = errno;
    if (sent <= 0) {
      if (sent < 0 && (e == EAGAIN || e == EWOULDBLOCK))
        return;
      if (sent < 0 && e == EINTR)
        continue;
      sock_comm_fail(c, ncclRemoteError, "the connection with %s %s", c->where, sock_broken_reason(sent, e));
      return;
    }
    atomic_fetch_add_explicit(&c->moved, (uint64_t)sent, memory_order_relaxed);
    /* The bytes went out in the order of the pieces: spread them over the
     * same requests. */
    size_t left = (size_t)sent;
    for (unsigned i = c->head; i != c->tail; i++) {
      struct sock_req *r = &c->reqs[i % SOCK_MAX_REQS];
      if (r->ctrl_done)
        continue;
      size_t h = LOOM_MIN(left, sizeof r->len - r->hdr_done);
      r->hdr_done += h;
      left -= h;
      if (!sock_is_large(c, r->len)) {
        size_t p = LOOM_MIN(left, (size_t)r->len - r->moved);
        r->moved += p;
        left -= p;
      }
      if (r->hdr_done < sizeof r->len || (!sock_is_large(c, r->len) && r->moved < r->len))
        break;
      r->ctrl_done = 1;
    }
    if ((size_t)sent < total)
      return; /* the socket is full */
  }
}

/* A receiving socket carries data one way only, so TCP never sees the
 * reply that would put it in its interactive (delayed-ACK) mode, and every
 * read of a small message sends an ACK of its own: on loopback that is a
 * trip through the peer's socket inside the read, on the critical path of
 * every small collective (8 B AllReduce on 2 ranks, loopback: 7.1 us with,
 * 5.1 us without). TCP_QUICKACK = 0 asks for delayed ACKs; they still go every
 * two full segments and whenever a read frees a segment's worth of
 * window, so bulk transfers and the sender's window keep moving. The
 * kernel drops the mode whenever its delayed-ACK timer fires, so a read
 * asks again once SOCK_ACK_REARM_NS have passed. */
static void acks_delayed(struct sock_comm *c) {
  uint64_t now = time_ns();
  if (now - c->acks_asked < SOCK_ACK_REARM_NS)
    return;
  int zero = 0;
  setsockopt(c->fd, IPPROTO_TCP, TCP_QUICKACK, &zero, sizeof zero);
  c->acks_asked = now;
}

/* Reads the control stream into p[*done, len): first what an earlier
 * read took in ahead, then the socket, with the read-ahead buffer behind
 * p, so that one read also takes what follows (a small message's payload
 * after its length, the next messages). The read-ahead buffer is empty
 * whenever the socket is read. 1: all there, 0: the socket would block,
 * -1: the connection failed (recorded on the comm). */
static int ctrl_read(struct sock_comm *c, char *p, size_t len, size_t *done) {
  if (*done < len && c->ahead_len > 0) {
    size_t k = LOOM_MIN(c->ahead_len, len - *done);
    memcpy(p + *done, c->ahead + c->ahead_off, k);
    *done += k;
    c->ahead_off += k;
    c->ahead_len -= k;
  }
  while (*done < len) {
    struct iovec iov[2] = {{p + *done, len - *done}, {c->ahead, sizeof c->ahead}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT);
    int e = errno;
    if (n > 0) {
      acks_delayed(c);
      atomic_fetch_add_explicit(&c->moved, (uint64_t)n, memory_order_relaxed);
      size_t want = len - *done;
      if ((size_t)n > want) {
        c->ahead_off = 0;
        c->ahead_len = (size_t)n - want;
        *done = len;
      } else {
        *done += (size_t)n;
      }
      continue;
    }
    if (n < 0 && (e == EAGAIN || e == EWOULDBLOCK))
      return 0;
    if (n < 0 && e == EINTR)
      continue;
    sock_comm_fail(c, ncclRemoteError, "the connection with %s %s", c->where, sock_broken_reason(n, e));
    return -1;
  }
  return 1;
}

/* Reads as much of the control stream as has arrived, oldest request
 * first. A request reads the socket only once the ones before it have
 * their bytes, so the end of the stream fails only requests it left
 * unfinished. */
static void progress_recv(struct sock_comm *c) {
  for (unsigned i = c->head; i != c->tail; i++) {
    struct sock_req *r = &c->reqs[i % SOCK_MAX_REQS];
    if (r->ctrl_done)
      continue;
    if (ctrl_read(c, (char *)&r->len, sizeof r->len, &r->hdr_done) <= 0)
      return;
    if (sock_msg_chunks(c, r->len, r->size) < 0) {
      sock_comm_fail(c, ncclInvalidUsage, "%s sent a message of %llu bytes into a %zu-byte buffer", c->where,
                     (unsigned long long)r->len, r->size);
      return;
    }
    if (sock_is_large(c, r->len)) {
      if (sock_dispatch(c, r) != ncclSuccess)
        return;
      r->ctrl_done = 1;
      continue;
    }
    if (ctrl_read(c, r->data, (size_t)r->len, &r->moved) <= 0)
      return;
    r->ctrl_done = 1;
  }
}

void sock_progress(struct sock_comm *c) {
  if (c->is_send)
    progress_send(c);
  else
    progress_recv(c);
}

int sock_poll_fds(void *comm, struct pollfd *fds, int max) {
  struct sock_comm *c = comm;
  if (atomic_load(&c->failed) != ncclSuccess || max < 1)
    return -1;
  int waiting = 0;
  for (unsigned i = c->head; i != c->tail; i++) {
    struct sock_req *r = &c->reqs[i % SOCK_MAX_REQS];
    if (!r->used)
      continue;
    if (!r->ctrl_done)
      waiting = 1;
    else
      return -1; /* with the helpers, or done and waiting for test() */
  }
  /* A receiver's read-ahead holds no bytes a posted request wants once
   * the stream has been progressed; if it does, there is work to do. */
  if (!waiting || (!c->is_send && c->ahead_len > 0))
    return waiting ? -1 : 0;
  fds[0] = (struct pollfd){.fd = c->fd, .events = c->is_send ? POLLOUT : POLLIN};
  return 1;
}
