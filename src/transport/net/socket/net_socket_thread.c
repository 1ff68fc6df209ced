/*
 * The socket plugin's helper threads (net_socket.h has the wire rules):
 * each owns some of a connection's data sockets and moves the chunks
 * queued on them, blocking in poll() whenever none can move, so the
 * thread that calls test() reduces while the bytes travel and only reads
 * a counter. Threads belong to one connection, as NCCL's do (a shared
 * pool would let one slow peer hold up the others' chunks), and start with
 * the connection's first large message: connections that only ever carry
 * small messages, the latency-bound ones, have none.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "transport/net/socket/net_socket.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

ncclResult_t sock_comm_fail(struct sock_comm *c, ncclResult_t code, const char *fmt, ...) {
  pthread_mutex_lock(&c->fail_lock);
  if (atomic_load(&c->failed) == ncclSuccess) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    atomic_store(&c->failed, (int)code); /* after `why`: readers test `failed` first */
  }
  pthread_mutex_unlock(&c->fail_lock);
  return code;
}

size_t sock_chunk_bytes(const struct sock_comm *c, uint64_t len) {
  /* Written not to overflow for any len: the receiver cuts by the length
   * word from the wire, and a chunk count above nsocks would overrun the
   * request's tasks. */
  uint64_t n = (uint64_t)c->nsocks;
  uint64_t per = len / n + (len % n != 0);
  if (per <= UINT64_MAX - 4095)
    per = (per + 4095) & ~(uint64_t)4095; /* page-aligned spans for the kernel's copies */
  return per > c->min_task ? (size_t)per : c->min_task;
}

int sock_msg_chunks(const struct sock_comm *c, uint64_t len, size_t posted) {
  if (len > posted)
    return -1;
  if (c->nsocks == 0 || len <= c->min_task)
    return 0;
  uint64_t chunk = sock_chunk_bytes(c, len);
  return (int)(len / chunk + (len % chunk != 0));
}

void sock_chunk_span(const struct sock_comm *c, uint64_t len, int j, size_t *off, size_t *size) {
  size_t chunk = sock_chunk_bytes(c, len);
  *off = (size_t)j * chunk;
  *size = len - *off < chunk ? (size_t)(len - *off) : chunk;
}

/* 1: the chunk has moved; 0: the socket would block; -1: the connection
 * failed (recorded on the comm). */
static int move_task(struct sock_comm *c, int fd, struct sock_task *t) {
  int r = sock_stream_move(c, fd, c->is_send, t->data, t->size, &t->moved);
  if (r < 0)
    atomic_store(&c->helper_failed, 1);
  return r;
}

static struct sock_task *queue_head(struct sock_helper *h, struct sock_stream *st) {
  pthread_mutex_lock(&h->lock);
  struct sock_task *t = st->head != st->tail ? st->q[st->head % SOCK_MAX_REQS] : NULL;
  pthread_mutex_unlock(&h->lock);
  return t;
}

static void *helper_main(void *arg) {
  struct sock_helper *h = arg;
  struct sock_comm *c = h->comm;
  struct pollfd pfd[1 + SOCK_MAX_SOCKS];
  int broken = 0;
  for (;;) {
    pthread_mutex_lock(&h->lock);
    unsigned gen = h->gen;
    int stop = h->stop;
    pthread_mutex_unlock(&h->lock);
    if (stop)
      break;
    pfd[0] = (struct pollfd){.fd = h->efd, .events = POLLIN};
    int np = 1, finished = 0;
    for (int s = h->index; s < c->nsocks && !broken; s += c->nthreads) {
      struct sock_stream *st = &c->socks[s];
      struct sock_task *t;
      while ((t = queue_head(h, st)) != NULL) {
        int rc = move_task(c, st->fd, t);
        if (rc < 0) {
          broken = 1; /* the comm reports it; this thread only waits to stop */
          break;
        }
        if (rc == 0) {
          pfd[np++] = (struct pollfd){.fd = st->fd, .events = c->is_send ? POLLOUT : POLLIN};
          break;
        }
        /* Off the queue before the count drops: once it reaches 0 the
         * request, and this task within it, may be reused. */
        struct sock_req *r = t->req;
        pthread_mutex_lock(&h->lock);
        st->head++;
        pthread_mutex_unlock(&h->lock);
        atomic_fetch_sub_explicit(&r->pending, 1, memory_order_release);
        finished = 1;
      }
    }
    if (finished)
      continue;
    if (broken)
      np = 1;
    pthread_mutex_lock(&h->lock);
    if (h->stop || h->gen != gen) { /* stopping, or chunks came while we looked */
      pthread_mutex_unlock(&h->lock);
      continue;
    }
    h->sleeping = 1;
    h->kicked = 0;
    pthread_mutex_unlock(&h->lock);
    int rc = poll(pfd, (nfds_t)np, 1000);
    pthread_mutex_lock(&h->lock);
    h->sleeping = 0;
    pthread_mutex_unlock(&h->lock);
    if (rc > 0 && (pfd[0].revents & POLLIN)) {
      uint64_t v;
      (void)!read(h->efd, &v, sizeof v);
    }
  }
  return NULL;
}

static ncclResult_t helper_start(struct sock_comm *c, struct sock_helper *h) {
  h->comm = c;
  h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (h->efd < 0)
    return sock_comm_fail(c, ncclSystemError, "cannot make an eventfd for a socket helper thread: %s",
                          strerror(errno));
  pthread_mutex_init(&h->lock, NULL);
  /* Signals are the application's business: they go to its threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&h->thread, NULL, helper_main, h);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) {
    close(h->efd);
    h->efd = -1;
    pthread_mutex_destroy(&h->lock);
    return sock_comm_fail(c, ncclSystemError, "cannot start a socket helper thread: %s", strerror(e));
  }
  h->started = 1;
  return ncclSuccess;
}

static ncclResult_t push(struct sock_comm *c, int s, struct sock_task *t) {
  struct sock_helper *h = &c->helpers[s % c->nthreads];
  if (!h->started) {
    ncclResult_t r = helper_start(c, h);
    if (r != ncclSuccess)
      return r;
  }
  struct sock_stream *st = &c->socks[s];
  pthread_mutex_lock(&h->lock);
  /* A socket with queued chunks is already in the sleeper's poll set;
   * only an idle one needs the thread woken. */
  int was_idle = st->head == st->tail;
  st->q[st->tail++ % SOCK_MAX_REQS] = t;
  h->gen++;
  int kick = was_idle && h->sleeping && !h->kicked;
  if (kick)
    h->kicked = 1;
  pthread_mutex_unlock(&h->lock);
  if (kick) {
    uint64_t one = 1;
    (void)!write(h->efd, &one, sizeof one);
  }
  return ncclSuccess;
}

ncclResult_t sock_dispatch(struct sock_comm *c, struct sock_req *r) {
  int n = sock_msg_chunks(c, r->len, r->size);
  atomic_store_explicit(&r->pending, n, memory_order_relaxed);
  for (int j = 0; j < n; j++) {
    struct sock_task *t = &r->tasks[j];
    size_t off;
    t->req = r;
    sock_chunk_span(c, r->len, j, &off, &t->size);
    t->data = r->data + off;
    t->moved = 0;
    ncclResult_t e = push(c, (int)((c->next_sock + (unsigned)j) % (unsigned)c->nsocks), t);
    if (e != ncclSuccess)
      return e;
  }
  c->next_sock = (c->next_sock + (unsigned)n) % (unsigned)c->nsocks;
  return ncclSuccess;
}

void sock_helpers_stop(struct sock_comm *c) {
  for (int i = 0; i < SOCK_MAX_THREADS; i++) {
    struct sock_helper *h = &c->helpers[i];
    if (!h->started)
      continue;
    pthread_mutex_lock(&h->lock);
    h->stop = 1;
    pthread_mutex_unlock(&h->lock);
    uint64_t one = 1;
    (void)!write(h->efd, &one, sizeof one);
    pthread_join(h->thread, NULL);
    close(h->efd);
    h->efd = -1;
    pthread_mutex_destroy(&h->lock);
    h->started = 0;
  }
}
