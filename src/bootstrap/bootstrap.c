/*
 * The ranks' side of the bootstrap (bootstrap.h): joining through the
 * root, then tagged messages over connections that stay open.
 *
 * Every wait (a receive, a send whose connection is still proving itself
 * or whose socket is full) runs the same loop: it accepts and answers
 * connections on this rank's listener, reads every open connection into
 * the stash, and drops strangers, so two ranks that send to each other at
 * once, or a rank that sends while another connects to it, never wait on
 * each other. A rank serves its listener only while it is inside a
 * bootstrap call; the bytes that arrive meanwhile wait in the kernel.
 *
 * A send returns once the kernel has its message. On a new connection
 * that is before the listener has answered (a connector's messages follow
 * its proof at once), and the listener may still drop the connection
 * unread: its greeting came too slowly (a lossy link) or too many were
 * waiting. The connection keeps those messages until the answer comes,
 * and if it ends first they go again, whole and in order, on a new
 * connection (resend_due), at most one a slice per peer. Joining the
 * root is in bootstrap_join.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "misc/utils.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Why a peer can no longer be reached (bootstrap->gone). */
enum { GONE_NO, GONE_CLOSED, GONE_REFUSED, GONE_BROKEN, GONE_IMPOSTOR };

/* How often a wait asks the liveness callback, and how long it waits on a
 * peer it has no connection with before it connects to see whether the
 * peer still listens. */
#define ALIVE_NS 100000000ull
#define PROBE_NS 1000000000ull

/* ---- connections ---- */

static ncclResult_t conn_new(struct bootstrap *b, struct boot_conn **out) {
  if (b->nconns == b->capconns) {
    int cap = b->capconns ? 2 * b->capconns : 16;
    struct boot_conn **c = realloc(b->conns, sizeof *c * (size_t)cap);
    if (!c)
      return err_set(ncclSystemError, "out of memory for bootstrap connections");
    b->conns = c;
    b->capconns = cap;
  }
  struct boot_conn *c = calloc(1, sizeof *c);
  if (!c)
    return err_set(ncclSystemError, "out of memory for a bootstrap connection");
  c->fd = -1; /* closed and dead until it is made */
  c->peer = -1;
  c->state = BC_DEAD;
  b->conns[b->nconns++] = c;
  *out = c;
  return ncclSuccess;
}

static int conn_pending_in(const struct boot_conn *c) {
  return !c->outgoing && (c->state == BC_CHAL || c->state == BC_PROOF);
}

static void set_gone(struct bootstrap *b, int p, int why, const char *text);

/* Messages that can no longer reach p: their senders fail, and so does a
 * later wait on p unless another connection with it opens. */
static void lose(struct bootstrap *b, int p, struct boot_out *list) {
  if (p < 0 || p >= b->nranks) {
    boot_out_free(list);
    return;
  }
  for (struct boot_out *m = list; m; m = m->next)
    b->tx[p].failed = LOOM_MAX(b->tx[p].failed, m->serial);
  if (list && b->gone[p] == GONE_NO)
    set_gone(b, p, GONE_BROKEN, "the connection that carried a message to it ended before the message was out");
  boot_out_free(list);
}

/* Closes c; the memory goes at the next sweep. Messages to its peer go on
 * another open connection with it if there is one; those it still had
 * are lost (callers that can send them again take them first). */
static void conn_kill(struct bootstrap *b, struct boot_conn *c) {
  if (c->state == BC_DEAD && c->fd < 0)
    return;
  if (conn_pending_in(c))
    b->npend_in--;
  int p = c->peer;
  lose(b, p, boot_conn_unsent(c));
  boot_conn_close(c);
  if (p >= 0 && p < b->nranks && b->by_peer[p] == c) {
    b->by_peer[p] = NULL;
    for (int i = 0; i < b->nconns; i++)
      if (b->conns[i]->peer == p && b->conns[i]->state == BC_OPEN)
        b->by_peer[p] = b->conns[i];
  }
}

/* Whether any connection with peer p but `not` is still up. */
static int peer_has_conn_but(const struct bootstrap *b, int p, const struct boot_conn *not) {
  for (int i = 0; i < b->nconns; i++)
    if (b->conns[i]->peer == p && b->conns[i]->state != BC_DEAD && b->conns[i] != not)
      return 1;
  return 0;
}

static int peer_has_conn(const struct bootstrap *b, int p) { return peer_has_conn_but(b, p, NULL); }

static void sweep(struct bootstrap *b, const struct boot_conn *keep) {
  int k = 0;
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn *c = b->conns[i];
    if (c->state == BC_DEAD && c != keep)
      free(c);
    else
      b->conns[k++] = c;
  }
  b->nconns = k;
}

static void set_gone(struct bootstrap *b, int p, int why, const char *text) {
  if (p < 0 || p >= b->nranks)
    return;
  b->gone[p] = (uint8_t)why;
  if (text) {
    snprintf(b->gone_why, sizeof b->gone_why, "%s", text);
    b->gone_why_peer = p;
  }
}

static ncclResult_t gone_error(struct bootstrap *b, int p) {
  char a[SOCK_ADDR_STRLEN];
  sock_addr_str(&b->peers[p].addr, a, sizeof a);
  switch (b->gone[p]) {
  case GONE_CLOSED:
    return err_set(ncclRemoteError,
                   "rank %d closed its bootstrap connection to rank %d: it exited, or destroyed or aborted its "
                   "communicator",
                   p, b->rank);
  case GONE_REFUSED:
    return err_set(ncclRemoteError, "rank %d is gone: nothing listens on its bootstrap address %s any more", p, a);
  case GONE_IMPOSTOR:
    return err_set(ncclRemoteError,
                   "the process listening at rank %d's bootstrap address %s does not hold this job's secret: it is "
                   "not rank %d",
                   p, a, p);
  default:
    return err_set(ncclRemoteError, "rank %d's bootstrap connection with rank %d failed: %s", p, b->rank,
                   b->gone_why_peer == p ? b->gone_why : "it broke");
  }
}

/* Remembers the nonce of a connector that proved itself; *fresh is 0 if
 * it was seen before (a recorded connection, replayed). */
static ncclResult_t first_sight(struct bootstrap *b, const uint8_t nonce[32], int *fresh) {
  *fresh = 0;
  for (int i = 0; i < b->nseen; i++)
    if (memcmp(b->seen[i], nonce, 32) == 0)
      return ncclSuccess;
  if (b->nseen == b->capseen) {
    int cap = b->capseen ? 2 * b->capseen : 16;
    uint8_t(*n)[32] = realloc(b->seen, sizeof *n * (size_t)cap);
    if (!n)
      return err_set(ncclSystemError, "out of memory for the bootstrap's record of connections");
    b->seen = n;
    b->capseen = cap;
  }
  memcpy(b->seen[b->nseen++], nonce, 32);
  *fresh = 1;
  return ncclSuccess;
}

/* The connection messages to p go on: one that has carried nothing yet
 * (and holds nothing to send) may give way to one that is open. */
static void prefer(struct bootstrap *b, int p, struct boot_conn *c) {
  struct boot_conn *cur = b->by_peer[p];
  if (cur == NULL || (!boot_conn_can_send(cur) && cur->seq_tx == 0 && !cur->txq))
    b->by_peer[p] = c;
}

/* Messages a listener dropped unanswered, to go again on the next
 * connection to p (resend_due). */
static void resend_later(struct bootstrap *b, int p, struct boot_out *list) {
  if (!list)
    return;
  if (!b->tx[p].resend)
    b->nresend++;
  boot_out_append(&b->tx[p].resend, list);
}

/* One WARN about a stranger, as the flood limit allows (boot_warn_take). */
#define STRANGER_WARN(b, fmt, ...)                                                                                    \
  do {                                                                                                                \
    char more_[128];                                                                                                  \
    int n_ = boot_warn_take(&(b)->warn);                                                                              \
    if (n_ > 0)                                                                                                       \
      WARN(fmt "%s", __VA_ARGS__, boot_warn_more(n_, more_, sizeof more_));                                         \
  } while (0)

/* What one event on c means for the bootstrap. */
static ncclResult_t handle(struct bootstrap *b, struct boot_conn *c, enum boot_event ev, struct boot_msg *m,
                           const char *why) {
  char a[SOCK_ADDR_STRLEN];
  int p = c->peer, fresh;
  switch (ev) {
  case BE_OPENED:
    if (!c->outgoing) {
      b->npend_in--;
      CHECK(first_sight(b, c->chal.nonce, &fresh));
      if (!fresh) {
        STRANGER_WARN(b,
                      "bootstrap: rank %d refused a connection from %s that claimed to be rank %d: it replayed a "
                      "connection recorded earlier (its nonce was used before)",
                      b->rank, boot_conn_peer_str(c, a, sizeof a), p);
        b->stats.refused++;
        conn_kill(b, c);
        break;
      }
      b->stats.accepted++;
    }
    b->gone[p] = GONE_NO;
    prefer(b, p, c);
    TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d %s rank %d", b->rank, c->outgoing ? "connected to" : "accepted", p);
    break;
  case BE_MSG:
    *b->stash_tail = m;
    b->stash_tail = &m->next;
    b->stats.msgs_recv++;
    b->stats.bytes_recv += m->len;
    break;
  case BE_CLOSED: {
    int lost = c->txq != NULL;
    if (lost || !peer_has_conn_but(b, p, c))
      set_gone(b, p, GONE_CLOSED, NULL);
    conn_kill(b, c);
    break;
  }
  case BE_REFUSED:
    STRANGER_WARN(b, "bootstrap: rank %d refused a connection from %s: it %s", b->rank,
                  boot_conn_peer_str(c, a, sizeof a), why);
    b->stats.refused++;
    conn_kill(b, c);
    break;
  case BE_WRONG_SECRET:
    WARN("bootstrap: rank %d connected to rank %d's address %s, but the process there does not hold this job's secret",
         b->rank, p, sock_addr_str(&b->peers[p].addr, a, sizeof a));
    set_gone(b, p, GONE_IMPOSTOR, NULL);
    conn_kill(b, c);
    break;
  case BE_BROKEN: {
    int was_open = c->state == BC_OPEN;
    int refused = c->outgoing && !was_open && c->sys_err == ECONNREFUSED;
    /* Ended before its listener answered: the listener read none of its
     * messages (it reads them only after the proof, and answers first),
     * so they go again on a new connection, unless nothing listens. Only
     * a reset between the listener's answer and its arrival here could
     * deliver one twice. */
    struct boot_out *again = c->outgoing && !was_open && !refused ? boot_conn_unsent(c) : NULL;
    int lost = c->txq != NULL || c->held != NULL;
    if (c->tampered)
      WARN("bootstrap: rank %d dropped its connection with rank %d: %s", b->rank, p, why);
    /* Refused: nothing listens there, the rank is gone. A handshake cut
     * off is not that: its listener may have been busy, and the next wait
     * connects again. */
    if (refused)
      set_gone(b, p, GONE_REFUSED, NULL);
    else if (was_open && (lost || !peer_has_conn_but(b, p, c)))
      set_gone(b, p, GONE_BROKEN, why);
    conn_kill(b, c);
    resend_later(b, p, again);
    break;
  }
  default:
    break;
  }
  return ncclSuccess;
}

/* What c has written whole counts for the senders waiting on it. */
static void note_written(struct bootstrap *b, const struct boot_conn *c) {
  if (c->peer >= 0 && c->peer < b->nranks && c->wrote > b->tx[c->peer].written)
    b->tx[c->peer].written = c->wrote;
}

/* Runs c until it has nothing more to say. */
static ncclResult_t drain(struct bootstrap *b, struct boot_conn *c, short revents) {
  char why[256];
  while (c->state != BC_DEAD) {
    enum boot_event ev;
    struct boot_msg *m;
    CHECK(boot_conn_step(c, revents, &ev, &m, why, sizeof why));
    note_written(b, c);
    if (ev == BE_NONE)
      return ncclSuccess;
    CHECK(handle(b, c, ev, m, why));
    revents = 0;
  }
  if (c->fd >= 0) {
    /* Failed as it started (a connect refused at once). */
    enum boot_event ev;
    struct boot_msg *m;
    CHECK(boot_conn_step(c, 0, &ev, &m, why, sizeof why));
    CHECK(handle(b, c, ev, m, why));
  }
  return ncclSuccess;
}

/* A new connection to peer, carrying `list` (may be NULL) first. */
static ncclResult_t conn_open(struct bootstrap *b, int peer, struct boot_out *list) {
  struct boot_conn *c;
  ncclResult_t r = boot_peer_check(&b->peers[peer]) == BOOT_OK
                       ? ncclSuccess
                       : err_set(ncclRemoteError,
                                 "rank %d cannot reach rank %d: its bootstrap address never came round the ring of "
                                 "ranks (a rank before it failed to join)",
                                 b->rank, peer);
  if (r == ncclSuccess)
    r = conn_new(b, &c);
  if (r == ncclSuccess)
    r = boot_conn_connect(c, &b->peers[peer].addr, -1, b->key, b->rank, peer, b->nranks, b->peers[peer].nonce);
  if (r != ncclSuccess) {
    lose(b, peer, list);
    return r;
  }
  boot_conn_requeue(c, list);
  b->stats.opened++;
  prefer(b, peer, c);
  return drain(b, c, 0);
}

/* Sends again what listeners dropped unanswered: on the connection
 * messages to the peer go on, or a new one; at most once a slice per
 * peer, so that a listener that keeps dropping us is not hammered. */
static ncclResult_t resend_due(struct bootstrap *b) {
  uint64_t now = time_ns();
  for (int p = 0; p < b->nranks && b->nresend > 0; p++) {
    struct boot_tx *t = &b->tx[p];
    if (!t->resend || now < t->resend_at)
      continue;
    struct boot_out *list = t->resend;
    t->resend = NULL;
    b->nresend--;
    t->resend_at = now + ALIVE_NS;
    if (b->gone[p] == GONE_REFUSED || b->gone[p] == GONE_IMPOSTOR) {
      lose(b, p, list);
      continue;
    }
    TRACE(LOG_BOOTSTRAP, "bootstrap: rank %d sends again to rank %d what a connection it dropped unanswered held",
          b->rank, p);
    struct boot_conn *c = b->by_peer[p];
    if (c) {
      boot_conn_requeue(c, list);
      CHECK(drain(b, c, 0));
    } else {
      CHECK(conn_open(b, p, list));
    }
  }
  return ncclSuccess;
}

/* With the table of greetings full: the one silent longest, if it has
 * been silent for BOOT_IDLE_NS; NULL when every one is moving on. */
static struct boot_conn *idle_victim(const struct bootstrap *b, uint64_t now) {
  struct boot_conn *victim = NULL;
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn *c = b->conns[i];
    if (conn_pending_in(c) && now - c->last_rx >= BOOT_IDLE_NS && (!victim || c->last_rx < victim->last_rx))
      victim = c;
  }
  return victim;
}

/* Takes the connections waiting while there is room; a full table makes
 * room only by dropping a greeting that has gone silent, and otherwise
 * the rest wait in the kernel's queue. */
static ncclResult_t accept_new(struct bootstrap *b) {
  for (;;) {
    struct boot_conn *victim = NULL;
    if (b->npend_in >= b->max_pending && (victim = idle_victim(b, time_ns())) == NULL)
      return ncclSuccess;
    int fd = accept4(b->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        return ncclSuccess;
      return err_set(ncclSystemError, "rank %d: accept on its bootstrap listener failed: %s", b->rank,
                     strerror(errno));
    }
    if (victim) {
      char a[SOCK_ADDR_STRLEN];
      STRANGER_WARN(b,
                    "bootstrap: rank %d dropped a connection from %s that had been silent, in the middle of its "
                    "greeting, when too many were waiting",
                    b->rank, boot_conn_peer_str(victim, a, sizeof a));
      conn_kill(b, victim);
    }
    struct boot_conn *c;
    ncclResult_t r = conn_new(b, &c);
    if (r != ncclSuccess) {
      close(fd);
      return r;
    }
    /* A rank sends its challenge and proof together, as it connects. */
    boot_conn_accepted(c, fd, b->key, b->rank, b->nranks, time_ns() + GREETING_NS, b->nonce);
    b->npend_in++;
    CHECK(drain(b, c, 0));
  }
}

/* Waits until `until` (at most) for anything on the listener and the
 * connections, and handles all of it. `keep` (may be NULL) is a
 * connection the caller holds, freed by it and not here. */
static ncclResult_t progress(struct bootstrap *b, uint64_t until, struct boot_conn *keep) {
  if (b->nresend > 0)
    CHECK(resend_due(b));
  uint64_t now = time_ns(), wake = until;
  int full = b->npend_in >= b->max_pending;
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn *c = b->conns[i];
    if (!conn_pending_in(c))
      continue;
    if (c->until <= now) {
      char a[SOCK_ADDR_STRLEN];
      STRANGER_WARN(b,
                    "bootstrap: rank %d dropped a connection from %s that said nothing for 2 s in the middle of its "
                    "greeting (or took 10 s for all of it)",
                    b->rank, boot_conn_peer_str(c, a, sizeof a));
      conn_kill(b, c);
      continue;
    }
    wake = LOOM_MIN(wake, c->until);
    if (full)
      wake = LOOM_MIN(wake, c->last_rx + BOOT_IDLE_NS);
  }
  /* A full table with nothing to drop leaves new connections in the
   * kernel's queue, unpolled (they would wake every poll). */
  full = b->npend_in >= b->max_pending && idle_victim(b, now) == NULL;
  int need = b->nconns + 1;
  if (need > b->cappoll) {
    int cap = LOOM_MAX(need, 2 * b->cappoll);
    struct pollfd *p = realloc(b->pfd, sizeof *p * (size_t)cap);
    if (p)
      b->pfd = p;
    struct boot_conn **q = realloc(b->pconn, sizeof *q * (size_t)cap);
    if (q)
      b->pconn = q;
    if (!p || !q)
      return err_set(ncclSystemError, "out of memory polling %d bootstrap connections", need);
    b->cappoll = cap;
  }
  int n = 0;
  b->pfd[n++] = (struct pollfd){.fd = b->listen_fd, .events = full ? 0 : POLLIN};
  for (int i = 0; i < b->nconns; i++) {
    struct boot_conn *c = b->conns[i];
    if (c->state == BC_DEAD)
      continue;
    b->pconn[n] = c;
    b->pfd[n++] = (struct pollfd){.fd = c->fd, .events = boot_conn_events(c)};
  }
  uint64_t ms = wake > now ? (wake - now) / 1000000 + 1 : 0;
  int ready = poll(b->pfd, (nfds_t)n, ms > 100 ? 100 : (int)ms);
  for (int i = 1; ready > 0 && i < n; i++)
    if (b->pfd[i].revents)
      CHECK(drain(b, b->pconn[i], b->pfd[i].revents));
  if (ready > 0 && (b->pfd[0].revents & POLLIN))
    CHECK(accept_new(b));
  sweep(b, keep);
  return ncclSuccess;
}

/* ---- waits ---- */

struct wait {
  uint64_t deadline, next_alive;
  uint64_t set_ns; /* the communicator's bound when the wait began, 0: LOOM_TIMEOUT */
  int peer;
  const char *doing; /* "for bootstrap data from", "to send bootstrap data to" */
};

static void wait_start(struct bootstrap *b, struct wait *w, int peer, const char *doing) {
  uint64_t now = time_ns();
  w->set_ns = b->timeout_ns ? atomic_load_explicit(b->timeout_ns, memory_order_relaxed) : 0;
  w->deadline = deadline_after(w->set_ns);
  w->next_alive = now + ALIVE_NS;
  w->peer = peer;
  w->doing = doing;
}

/* What ends any wait early: an abort, the deadline, a dead peer. */
static ncclResult_t wait_check(struct bootstrap *b, struct wait *w) {
  /* Set by ncclCommAbort on another thread. */
  if (b->abort_flag && __atomic_load_n(b->abort_flag, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "the communicator was aborted while waiting for rank %d", w->peer);
  uint64_t now = time_ns();
  if (now >= w->deadline) {
    char bound[TIMEOUT_NAME_LEN];
    return err_set(ncclRemoteError, "rank %d timed out after %s waiting %s rank %d", b->rank,
                   timeout_name(w->set_ns, timeout_seconds(), bound, sizeof bound), w->doing, w->peer);
  }
  if (b->alive && now >= w->next_alive) {
    w->next_alive = now + ALIVE_NS;
    CHECK(b->alive(b->alive_ctx, w->peer));
  }
  return ncclSuccess;
}

static uint64_t slice(const struct wait *w) { return LOOM_MIN(w->deadline, time_ns() + ALIVE_NS); }

/* A connection to peer that takes messages, made if there is none. */
static ncclResult_t wait_open(struct bootstrap *b, struct wait *w, struct boot_conn **out) {
  uint64_t next_try = 0;
  for (;;) {
    struct boot_conn *c = b->by_peer[w->peer];
    if (c && boot_conn_can_send(c)) {
      *out = c;
      return ncclSuccess;
    }
    if (b->gone[w->peer] != GONE_NO && !c)
      return gone_error(b, w->peer);
    CHECK(wait_check(b, w));
    if (!c && time_ns() >= next_try) {
      /* Once per slice at most: a listener that cuts us off while full
       * of strangers is not hammered. */
      next_try = time_ns() + ALIVE_NS;
      CHECK(conn_open(b, w->peer, NULL));
      continue;
    }
    CHECK(progress(b, slice(w), NULL));
  }
}

/* ---- messages ---- */

static ncclResult_t stash_self(struct bootstrap *b, uint64_t tag, const void *data, size_t len) {
  struct boot_msg *m = malloc(sizeof *m + len);
  if (!m)
    return err_set(ncclSystemError, "out of memory for a %zu-byte bootstrap message", len);
  m->next = NULL;
  m->from = b->rank;
  m->tag = tag;
  m->len = len;
  if (len > 0)
    memcpy(m->data, data, len);
  *b->stash_tail = m;
  b->stash_tail = &m->next;
  return ncclSuccess;
}

static ncclResult_t send_locked(struct bootstrap *b, int peer, uint64_t tag, const void *data, size_t len) {
  if (peer == b->rank)
    return stash_self(b, tag, data, len);
  struct boot_tx *t = &b->tx[peer];
  struct wait w;
  wait_start(b, &w, peer, "to send bootstrap data to");
  uint64_t serial = t->serial + 1;
  if (t->resend) {
    /* Behind those that go again, in order. */
    struct boot_out *m;
    CHECK(boot_out_new(serial, tag, data, len, &m));
    boot_out_append(&t->resend, m);
    t->serial = serial;
  } else {
    struct boot_conn *c = NULL;
    CHECK(wait_open(b, &w, &c));
    CHECK(boot_conn_queue(c, serial, tag, data, len));
    t->serial = serial;
    CHECK(drain(b, c, 0));
  }
  /* Until the kernel has it all (the connection keeps a copy until the
   * listener answers): meanwhile this rank reads whatever comes, so two
   * ranks that fill each other's sockets both move on. A send that fails
   * here may still go out later with the rest of its connection's queue;
   * the bootstrap is failed by then anyway. */
  for (;;) {
    if (t->written >= serial) {
      b->stats.msgs_sent++;
      b->stats.bytes_sent += len;
      return ncclSuccess;
    }
    if (t->failed >= serial)
      return gone_error(b, peer);
    CHECK(wait_check(b, &w));
    CHECK(progress(b, slice(&w), NULL));
  }
}

ncclResult_t bootstrap_send(struct bootstrap *b, int peer, uint64_t tag, const void *data, size_t len) {
  pthread_mutex_lock(&b->lock);
  ncclResult_t r = send_locked(b, peer, tag, data, len);
  pthread_mutex_unlock(&b->lock);
  return r;
}

static struct boot_msg *stash_take(struct bootstrap *b, int from, uint64_t tag) {
  for (struct boot_msg **p = &b->stash; *p; p = &(*p)->next) {
    if ((*p)->from == from && (*p)->tag == tag) {
      struct boot_msg *m = *p;
      *p = m->next;
      if (b->stash_tail == &m->next)
        b->stash_tail = p;
      return m;
    }
  }
  return NULL;
}

static ncclResult_t deliver(struct boot_msg *m, int peer, uint64_t tag, void *data, size_t len) {
  ncclResult_t r = ncclSuccess;
  if (m->len != len)
    r = err_set(ncclInvalidUsage,
                "rank %d sent %zu bytes of bootstrap data (tag %llx) where %zu were expected: the ranks disagree "
                "about the operation",
                peer, m->len, (unsigned long long)tag, len);
  else if (len > 0)
    memcpy(data, m->data, len);
  free(m);
  return r;
}

static ncclResult_t recv_locked(struct bootstrap *b, int peer, uint64_t tag, void *data, size_t len) {
  struct wait w;
  wait_start(b, &w, peer, "for bootstrap data from");
  uint64_t probe_at = time_ns() + PROBE_NS;
  for (;;) {
    struct boot_msg *m = stash_take(b, peer, tag);
    if (m)
      return deliver(m, peer, tag, data, len);
    if (peer != b->rank && b->gone[peer] != GONE_NO && !peer_has_conn(b, peer))
      return gone_error(b, peer);
    CHECK(wait_check(b, &w));
    /* A peer this rank has no connection with could have died where no
     * liveness callback sees it (another host): a connection says, by
     * being refused, or by closing when it dies. */
    if (peer != b->rank && b->by_peer[peer] == NULL && time_ns() >= probe_at) {
      probe_at = time_ns() + PROBE_NS;
      CHECK(conn_open(b, peer, NULL));
      continue;
    }
    CHECK(progress(b, slice(&w), NULL));
  }
}

ncclResult_t bootstrap_recv(struct bootstrap *b, int peer, uint64_t tag, void *data, size_t len) {
  pthread_mutex_lock(&b->lock);
  ncclResult_t r = recv_locked(b, peer, tag, data, len);
  pthread_mutex_unlock(&b->lock);
  return r;
}

ncclResult_t bootstrap_allgather(struct bootstrap *b, void *data, size_t size) {
  int n = b->nranks, me = b->rank;
  uint64_t base = BOOT_TAG_INTERNAL | (b->seq++ << 20);
  char *d = data;
  int next = (me + 1) % n, prev = (me - 1 + n) % n;
  /* Ring: at step s send the slot received at step s-1 and receive the one
   * from s+1 ranks back. */
  for (int s = 0; s < n - 1; s++) {
    int send_slot = (me - s + n) % n, recv_slot = (me - s - 1 + n) % n;
    CHECK(bootstrap_send(b, next, base | (uint64_t)s, d + (size_t)send_slot * size, size));
    CHECK(bootstrap_recv(b, prev, base | (uint64_t)s, d + (size_t)recv_slot * size, size));
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_barrier(struct bootstrap *b, const char *what) {
  int32_t *words;
  CHECK(UTIL_CALLOC(&words, b->nranks, what));
  ncclResult_t r = bootstrap_allgather(b, words, sizeof *words);
  free(words);
  return r;
}

void bootstrap_close(struct bootstrap *b) {
  if (!b)
    return;
  if (b->peers)
    INFO(LOG_BOOTSTRAP,
         "bootstrap: rank %d closes: %d connection(s) opened, %d accepted, %d refused; %llu messages (%llu bytes) "
         "sent, %llu (%llu bytes) received",
         b->rank, b->stats.opened, b->stats.accepted, b->stats.refused, (unsigned long long)b->stats.msgs_sent,
         (unsigned long long)b->stats.bytes_sent, (unsigned long long)b->stats.msgs_recv,
         (unsigned long long)b->stats.bytes_recv);
  if (b->warn.held > 0)
    WARN("bootstrap: rank %d: %d more connection(s) refused or dropped, not logged one by one", b->rank,
         b->warn.held);
  if (b->listen_fd >= 0)
    close(b->listen_fd);
  for (int i = 0; i < b->nconns; i++) {
    boot_conn_close(b->conns[i]);
    free(b->conns[i]);
  }
  for (int p = 0; b->tx && p < b->nranks; p++)
    boot_out_free(b->tx[p].resend);
  free(b->tx);
  free(b->conns);
  free(b->pfd);
  free(b->pconn);
  for (struct boot_msg *m = b->stash, *n; m; m = n) {
    n = m->next;
    free(m);
  }
  free(b->peers);
  free(b->seen);
  free(b->by_peer);
  free(b->gone);
  pthread_mutex_destroy(&b->lock);
  boot_cleanse(b->key, sizeof b->key);
  free(b);
}
