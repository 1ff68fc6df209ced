/*
 * One-sided operations between host communicator ranks on different
 * hosts. Each rank with a peer on another host runs a service: a thread
 * listening on a TCP socket of its own, whose address every rank learns
 * when windows are registered (comm_mem.c). A put or a signal to such a
 * peer is one frame on a connection to the peer's service, opened on
 * first use and kept; the service writes the data into its window and
 * raises the sender's counter (release), so the target need not be in
 * any call. Connections prove the communicator's secret both ways with
 * the bootstrap's handshake, each under a fresh nonce of the listener's
 * (as the bootstrap root does), so a recorded connection cannot be
 * replayed; a stranger is refused and logged.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "bootstrap/bootstrap_wire.h"
#include "misc/utils.h"
#include "rma.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RMA_NET_TAG 0x4c4f4f4d524d4131ull
/* A put larger than this goes as several frames, the signal on the last:
 * a bootstrap message is at most BOOT_MAX_MSG. */
#define RMA_NET_CHUNK ((size_t)64 << 20)
/* Connections the service holds at once; past that a new one is closed
 * unread (a flood of strangers cannot exhaust its descriptors). */
#define RMA_NET_MAX_CONNS 256

struct rma_frame {
  uint64_t win_id; /* 0: a signal alone */
  uint64_t offset;
  uint64_t bytes;
  int32_t ctx, sig;
  int32_t raise; /* raise the counter after the data (the last frame of a put) */
  int32_t pad;
};

struct rma_net {
  struct ncclComm *comm;
  /* The communicator's secret, kept here: destroy closes the bootstrap
   * before it stops this service. */
  uint8_t key[32];
  int listen_fd;
  union sock_addr addr;
  int wake[2];
  pthread_t thread;
  int running;
  struct boot_conn **in;
  int nin;
  struct boot_warn warn;
  /* The sending side, by peer: its service's address (known once a
   * window is registered), the connection, and why it broke. */
  union sock_addr *peer_addr;
  uint8_t *peer_known;
  struct boot_conn **out;
  char **broken;
  pthread_mutex_t tx_lock;
};

static void drop_in(struct rma_net *n, int i) {
  boot_conn_close(n->in[i]);
  free(n->in[i]);
  n->in[i] = n->in[--n->nin];
}

/* A frame from rank `from`, checked against this rank's own windows:
 * a frame that does not fit is logged and nothing is written. */
static void serve_frame(struct rma_net *n, int from, const struct boot_msg *m) {
  struct ncclComm *comm = n->comm;
  struct rma_state *st = comm->rma;
  struct rma_frame f;
  const char *bad = NULL;
  if (m->tag != RMA_NET_TAG || m->len < sizeof f) {
    bad = "not a one-sided frame";
  } else {
    memcpy(&f, m->data, sizeof f);
    if (f.bytes != m->len - sizeof f)
      bad = "a byte count that is not the data's";
    else if (f.ctx < 0 || f.ctx >= RMA_CTXS || f.sig < 0 || f.sig >= RMA_SIGNALS)
      bad = "a context or signal index out of range";
    else if (f.win_id == 0 && f.bytes != 0)
      bad = "data but no window";
  }
  if (bad) {
    WARN("rank %d: refused a one-sided frame from rank %d: %s", comm->rank, from, bad);
    return;
  }
  pthread_mutex_lock(&st->lock);
  if (f.bytes > 0) {
    struct rma_win *w = NULL;
    for (;;) {
      for (w = st->wins; w && w->id != f.win_id; w = w->next)
        ;
      if (w || f.win_id <= st->win_done || st->net_stopping)
        break;
      /* The sender's registration returned before this rank's: this
       * rank's is on its way (or the sender lies, and stop ends it). */
      pthread_cond_wait(&st->win_cond, &st->lock);
    }
    if (w == NULL || f.offset > w->size || f.bytes > w->size - f.offset) {
      int stopping = st->net_stopping;
      pthread_mutex_unlock(&st->lock);
      if (w == NULL && stopping)
        return; /* the communicator goes: the frame with it */
      if (w == NULL)
        WARN("rank %d: refused a put of %llu bytes from rank %d: its window (id %llu) is not registered here (any "
             "more)",
             comm->rank, (unsigned long long)f.bytes, from, (unsigned long long)f.win_id);
      else
        WARN("rank %d: refused a put of %llu bytes at offset %llu from rank %d: this rank's window is %zu bytes",
             comm->rank, (unsigned long long)f.bytes, (unsigned long long)f.offset, from, w->size);
      return;
    }
    memcpy((char *)w->buff + f.offset, m->data + sizeof f, f.bytes);
  }
  if (f.raise)
    atomic_fetch_add_explicit(&st->sig_own[rma_sig_index(comm, f.ctx, f.sig, from)], 1, memory_order_release);
  pthread_mutex_unlock(&st->lock);
}

/* Moves connection i on; 0 when it was dropped. */
static int serve_conn(struct rma_net *n, int i, short revents) {
  struct boot_conn *c = n->in[i];
  char why[256], addr[SOCK_ADDR_STRLEN];
  for (;;) {
    enum boot_event ev;
    struct boot_msg *m = NULL;
    why[0] = '\0';
    if (boot_conn_step(c, revents, &ev, &m, why, sizeof why) != ncclSuccess) {
      WARN("rank %d: one-sided service: %s", n->comm->rank, err_thread_last());
      drop_in(n, i);
      return 0;
    }
    revents = 0;
    switch (ev) {
    case BE_NONE:
      return 1;
    case BE_OPENED:
      if (c->chal.nranks != n->comm->nranks || c->peer < 0 || c->peer >= n->comm->nranks) {
        WARN("rank %d: one-sided service: refused %s, which proved the secret but claims to be rank %d of %d",
             n->comm->rank, boot_conn_peer_str(c, addr, sizeof addr), c->peer, c->chal.nranks);
        drop_in(n, i);
        return 0;
      }
      break;
    case BE_MSG:
      serve_frame(n, c->peer, m);
      free(m);
      break;
    case BE_REFUSED: {
      int k = boot_warn_take(&n->warn);
      char more[64];
      if (k)
        WARN("rank %d: one-sided service: refused a connection from %s: it %s%s", n->comm->rank,
             boot_conn_peer_str(c, addr, sizeof addr), why, boot_warn_more(k, more, sizeof more));
      drop_in(n, i);
      return 0;
    }
    default:
      INFO(LOG_NET, "rank %d: one-sided service: the connection from rank %d ended: %s", n->comm->rank, c->peer,
           why[0] ? why : "closed");
      drop_in(n, i);
      return 0;
    }
  }
}

static void *serve(void *arg) {
  struct rma_net *n = arg;
  struct pollfd *p = calloc(RMA_NET_MAX_CONNS + 2, sizeof *p);
  if (!p) {
    WARN("rank %d: the one-sided service is out of memory: puts from other hosts go unserved", n->comm->rank);
    return NULL;
  }
  for (;;) {
    int np = 0, nin = n->nin;
    p[np++] = (struct pollfd){.fd = n->wake[0], .events = POLLIN};
    p[np++] = (struct pollfd){.fd = n->listen_fd, .events = POLLIN};
    for (int i = 0; i < nin; i++)
      p[np++] = (struct pollfd){.fd = n->in[i]->fd, .events = boot_conn_events(n->in[i])};
    if (poll(p, (nfds_t)np, 500) < 0 && errno != EINTR)
      break;
    if (p[0].revents)
      break;
    uint64_t now = time_ns();
    /* Backwards, so that dropping one (the last moves into its place)
     * leaves those still to visit where they were. */
    for (int i = nin - 1; i >= 0; i--) {
      if (!serve_conn(n, i, p[2 + i].revents))
        continue;
      struct boot_conn *c = n->in[i];
      if (c->state != BC_OPEN && now > c->until) {
        char addr[SOCK_ADDR_STRLEN], more[64];
        int k = boot_warn_take(&n->warn);
        if (k)
          WARN("rank %d: one-sided service: dropped %s, which did not prove itself in time%s", n->comm->rank,
               boot_conn_peer_str(c, addr, sizeof addr), boot_warn_more(k, more, sizeof more));
        drop_in(n, i);
      }
    }
    if (p[1].revents & POLLIN) {
      int fd = accept4(n->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      /* Full: the greeting that has waited longest makes room, so a
       * flood of silent strangers cannot lock the ranks out. */
      int oldest = -1;
      for (int i = 0; fd >= 0 && n->nin >= RMA_NET_MAX_CONNS && i < n->nin; i++)
        if (n->in[i]->state != BC_OPEN && (oldest < 0 || n->in[i]->last_rx < n->in[oldest]->last_rx))
          oldest = i;
      if (oldest >= 0)
        drop_in(n, oldest);
      if (fd >= 0 && n->nin >= RMA_NET_MAX_CONNS) {
        close(fd);
      } else if (fd >= 0) {
        struct boot_conn *c = calloc(1, sizeof *c);
        if (!c) {
          close(fd);
        } else {
          boot_conn_accepted(c, fd, n->key, BOOT_TO_ROOT, 0, time_ns() + GREETING_NS, NULL);
          n->in[n->nin++] = c;
        }
      }
    }
  }
  free(p);
  return NULL;
}

static void net_free(struct rma_net *n) {
  int nranks = n->comm->nranks;
  for (int i = n->nin - 1; i >= 0; i--)
    drop_in(n, i);
  for (int r = 0; n->out && r < nranks; r++) {
    if (n->out[r]) {
      boot_conn_close(n->out[r]);
      free(n->out[r]);
    }
    free(n->broken[r]);
  }
  if (n->listen_fd >= 0)
    close(n->listen_fd);
  for (int k = 0; k < 2; k++)
    if (n->wake[k] >= 0)
      close(n->wake[k]);
  pthread_mutex_destroy(&n->tx_lock);
  boot_cleanse(n->key, sizeof n->key);
  free(n->in);
  free(n->peer_addr);
  free(n->peer_known);
  free(n->out);
  free(n->broken);
  free(n);
}

ncclResult_t rma_net_start(struct ncclComm *comm, union sock_addr *addr) {
  struct rma_state *st = comm->rma;
  if (st->net) {
    *addr = st->net->addr;
    return ncclSuccess;
  }
  struct rma_net *n = calloc(1, sizeof *n);
  if (!n)
    return err_set(ncclSystemError, "ncclCommWindowRegister: out of memory");
  n->comm = comm;
  _Static_assert(sizeof n->key == sizeof comm->boot->key, "the bootstrap's key");
  memcpy(n->key, comm->boot->key, sizeof n->key);
  n->listen_fd = -1;
  n->wake[0] = n->wake[1] = -1;
  pthread_mutex_init(&n->tx_lock, NULL);
  size_t nr = (size_t)comm->nranks;
  n->in = calloc(RMA_NET_MAX_CONNS, sizeof *n->in);
  n->peer_addr = calloc(nr, sizeof *n->peer_addr);
  n->peer_known = calloc(nr, 1);
  n->out = calloc(nr, sizeof *n->out);
  n->broken = calloc(nr, sizeof *n->broken);
  ncclResult_t r = ncclSuccess;
  if (!n->in || !n->peer_addr || !n->peer_known || !n->out || !n->broken)
    r = err_set(ncclSystemError, "ncclCommWindowRegister: out of memory");
  union sock_addr bind_addr;
  char ifname[IF_NAMESIZE];
  if (r == ncclSuccess)
    r = bootstrap_local_address(&bind_addr, ifname, sizeof ifname);
  if (r == ncclSuccess)
    r = sock_listen(&bind_addr, &n->listen_fd, &n->addr);
  if (r == ncclSuccess && pipe2(n->wake, O_CLOEXEC) != 0)
    r = err_set(ncclSystemError, "ncclCommWindowRegister: pipe: %s", strerror(errno));
  if (r == ncclSuccess) {
    sock_set_nonblocking(n->listen_fd);
    int e = pthread_create(&n->thread, NULL, serve, n);
    if (e != 0)
      r = err_set(ncclSystemError, "ncclCommWindowRegister: cannot start the one-sided service thread: %s",
                  strerror(e));
  }
  if (r != ncclSuccess) {
    err_context("rank %d: starting the one-sided service for peers on other hosts", comm->rank);
    net_free(n);
    return r;
  }
  n->running = 1;
  char buf[SOCK_ADDR_STRLEN];
  INFO(LOG_NET, "rank %d: one-sided service listens on %s (%s)", comm->rank, sock_addr_str(&n->addr, buf, sizeof buf),
       ifname);
  st->net = n;
  *addr = n->addr;
  return ncclSuccess;
}

void rma_net_peer(struct ncclComm *comm, int peer, const union sock_addr *addr) {
  struct rma_net *n = comm->rma ? comm->rma->net : NULL;
  if (n == NULL || n->peer_known[peer])
    return;
  pthread_mutex_lock(&n->tx_lock);
  n->peer_addr[peer] = *addr;
  n->peer_known[peer] = 1;
  pthread_mutex_unlock(&n->tx_lock);
}

int rma_net_remote(const struct ncclComm *comm, int peer) {
  return comm->is_host && comm->peers[peer].host_hash != comm->peers[comm->rank].host_hash;
}

void rma_net_stop(struct ncclComm *comm) {
  struct rma_net *n = comm->rma ? comm->rma->net : NULL;
  if (n == NULL)
    return;
  if (n->running) {
    pthread_mutex_lock(&comm->rma->lock);
    comm->rma->net_stopping = 1;
    pthread_cond_broadcast(&comm->rma->win_cond);
    pthread_mutex_unlock(&comm->rma->lock);
    ssize_t w = write(n->wake[1], "x", 1);
    (void)w;
    pthread_join(n->thread, NULL);
  }
  net_free(n);
  comm->rma->net = NULL;
}

/* The connection to `peer` broke (or never opened) for `why`: closed,
 * and every later put to it fails, since frames lost with it would leave
 * the counts short without a word. `note` gets what the peer's pidfd
 * says, where it says it exited. */
static void mark_broken(struct rma_net *n, int peer, struct boot_conn *c, const char *why, char *note, size_t len) {
  boot_conn_close(c);
  free(c);
  n->out[peer] = NULL;
  n->broken[peer] = strdup(why);
  note[0] = '\0';
  if (comm_peer_alive(n->comm, peer) != ncclSuccess)
    snprintf(note, len, " (%s)", err_thread_last());
}

/* The connection to `peer`'s service, opened and proved; NULL with the
 * sentence where it cannot be. Under tx_lock. */
static struct boot_conn *conn_to(struct rma_net *n, int peer, const char *func) {
  struct ncclComm *comm = n->comm;
  struct boot_conn *c = n->out[peer];
  char why[256] = "", addr[SOCK_ADDR_STRLEN];
  sock_addr_str(&n->peer_addr[peer], addr, sizeof addr);
  if (c) {
    /* The service never writes after its answer: anything to read is the
     * end of the connection, seen here before data goes into the void. */
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
      return c;
    enum boot_event ev;
    struct boot_msg *m = NULL;
    if (boot_conn_step(c, p.revents, &ev, &m, why, sizeof why) != ncclSuccess)
      snprintf(why, sizeof why, "%s", err_thread_last());
    free(m);
    if (ev == BE_NONE)
      return c;
  } else {
    c = calloc(1, sizeof *c);
    if (!c) {
      err_set(ncclSystemError, "%s: out of memory", func);
      return NULL;
    }
    ncclResult_t r = boot_conn_connect(c, &n->peer_addr[peer], -1, n->key, comm->rank, BOOT_TO_ROOT,
                                       comm->nranks, NULL);
    enum boot_event ev = BE_NONE;
    struct boot_msg *m = NULL;
    if (r == ncclSuccess && c->state == BC_DEAD)
      snprintf(why, sizeof why, "connecting: %s", strerror(c->sys_err));
    else if (r == ncclSuccess)
      r = boot_conn_wait(c, comm_deadline(comm), atomic_load(&comm->timeout_ns), NULL,
                         "the one-sided service's answer", &ev, &m, why, sizeof why);
    free(m);
    if (r != ncclSuccess)
      snprintf(why, sizeof why, "%s", err_thread_last());
    else if (ev == BE_WRONG_SECRET)
      snprintf(why, sizeof why, "what listens there does not hold this communicator's secret");
    else if (ev == BE_OPENED) {
      n->out[peer] = c;
      return c;
    } else if (why[0] == '\0')
      snprintf(why, sizeof why, "the connection ended before the service answered");
  }
  char note[300];
  mark_broken(n, peer, c, why, note, sizeof note);
  err_set(ncclRemoteError, "%s to rank %d on %s: its one-sided service at %s cannot be reached: %s%s", func, peer,
          comm->peers[peer].hostname, addr, why, note);
  return NULL;
}

ncclResult_t rma_net_send(struct ncclComm *comm, int peer, uint64_t win_id, size_t offset, const void *data,
                          size_t bytes, int ctx, int sig, const char *func) {
  struct rma_net *n = comm->rma->net;
  if (n)
    pthread_mutex_lock(&n->tx_lock);
  if (n == NULL || !n->peer_known[peer]) {
    if (n)
      pthread_mutex_unlock(&n->tx_lock);
    return err_set(ncclInvalidUsage,
                   "%s to rank %d: it is on another host (%s), reached through its one-sided service, whose address "
                   "the ranks exchange when they register a window: register one (ncclCommWindowRegister) first. "
                   "Nothing was done",
                   func, peer, comm->peers[peer].hostname);
  }
  ncclResult_t r = ncclSuccess;
  struct boot_conn *c = NULL;
  if (n->broken[peer])
    r = err_set(ncclRemoteError, "%s to rank %d on %s: the connection to its one-sided service broke earlier (%s)",
                func, peer, comm->peers[peer].hostname, n->broken[peer]);
  else if ((c = conn_to(n, peer, func)) == NULL)
    r = ncclRemoteError;
  size_t chunk = bytes < RMA_NET_CHUNK ? bytes : RMA_NET_CHUNK;
  char *buf = r == ncclSuccess ? malloc(sizeof(struct rma_frame) + chunk) : NULL;
  if (r == ncclSuccess && !buf)
    r = err_set(ncclSystemError, "%s: out of memory", func);
  size_t done = 0;
  while (r == ncclSuccess) {
    size_t len = bytes - done < chunk ? bytes - done : chunk;
    struct rma_frame f = {.win_id = win_id, .offset = offset + done, .bytes = len, .ctx = ctx, .sig = sig,
                          .raise = done + len == bytes};
    memcpy(buf, &f, sizeof f);
    if (len)
      memcpy(buf + sizeof f, (const char *)data + done, len);
    r = boot_conn_send_wait(c, RMA_NET_TAG, buf, sizeof f + len, comm_deadline(comm), atomic_load(&comm->timeout_ns),
                            "a one-sided service");
    if (r != ncclSuccess) {
      char why[256];
      char note[300];
      snprintf(why, sizeof why, "%s", err_thread_last());
      mark_broken(n, peer, c, why, note, sizeof note);
      r = err_set(ncclRemoteError, "%s to rank %d on %s: %s, after %zu of %zu bytes%s", func, peer,
                  comm->peers[peer].hostname, why, done, bytes, note);
      break;
    }
    done += len;
    if (done == bytes)
      break;
  }
  free(buf);
  pthread_mutex_unlock(&n->tx_lock);
  return r;
}
