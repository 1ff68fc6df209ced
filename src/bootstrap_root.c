/*
 * The bootstrap root: a thread of the process that called ncclGetUniqueId
 * (or of rank 0 with NCCL_COMM_ID). It collects every rank's greeting and
 * answers them all with the table of addresses once the last has joined.
 *
 * Greetings are read from all open connections at once, so a connection
 * that says nothing (or garbage) costs nobody else any time. A job whose
 * ranks disagree on nranks is failed at once, for every rank that joined
 * and every one that joins later, with the sentence that says so.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap_wire.h"
#include "misc/utils.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PENDING BOOT_MAX_PENDING

struct greeting {
  int fd;
  uint64_t until;
  size_t got;
  struct root_hello h;
};

struct root {
  int listen_fd;
  uint64_t secret;
  char where[SOCK_ADDR_STRLEN];
  int nranks, joined, first_rank;
  int *fds;
  union sock_addr *addrs;
  struct root_hello *hellos;
  /* Once set, the job cannot form: everyone is told this. */
  ncclResult_t failed;
  char failed_msg[512];
  struct greeting pend[MAX_PENDING];
  int npend;
  /* LOOM_TIMEOUT, read by the thread that starts the root: the root's own
   * thread never reads the environment, which the program may be changing
   * meanwhile (setenv beside getenv can crash). */
  int64_t timeout_s;
};

static void reply_error(int fd, ncclResult_t status, const char *msg) {
  struct root_reply r = {0};
  memcpy(r.magic, reply_magic, sizeof r.magic);
  r.status = status;
  snprintf(r.msg, sizeof r.msg, "%s", msg);
  sock_send_all(fd, &r, sizeof r, time_ns() + GREETING_NS, "a joining rank");
  close(fd);
}

/* Tells every rank that joined, and all that come later, that the job
 * cannot form. */
/* The root may live in a rank's process: a rank there that has its answer
 * may return and exit, taking the root with it, so ranks elsewhere are
 * answered first. */
static int answer_order(const struct root *rt, int k) {
  int pid = (int)getpid(), n = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < rt->nranks; i++)
      if ((rt->hellos[i].pid == pid) == (pass == 1) && n++ == k)
        return i;
  return -1;
}

static void fail_job(struct root *rt, ncclResult_t code, const char *msg) {
  WARN("bootstrap root at %s: %s", rt->where, msg);
  rt->failed = code;
  snprintf(rt->failed_msg, sizeof rt->failed_msg, "%s", msg);
  for (int k = 0; k < rt->nranks; k++) {
    int i = answer_order(rt, k);
    if (rt->fds[i] >= 0)
      reply_error(rt->fds[i], code, msg);
    rt->fds[i] = -1;
  }
  rt->joined = 0;
}

static int first_join(struct root *rt, const struct root_hello *h, int fd) {
  if (h->nranks < 1 || h->nranks > (1 << 20)) {
    reply_error(fd, ncclInvalidArgument, "nranks out of range");
    return 0;
  }
  rt->nranks = h->nranks;
  rt->first_rank = h->rank;
  rt->fds = malloc(sizeof *rt->fds * rt->nranks);
  rt->addrs = calloc(rt->nranks, sizeof *rt->addrs);
  rt->hellos = calloc(rt->nranks, sizeof *rt->hellos);
  if (!rt->fds || !rt->addrs || !rt->hellos) {
    WARN("bootstrap root: out of memory for %d ranks", rt->nranks);
    close(fd);
    return -1;
  }
  for (int i = 0; i < rt->nranks; i++)
    rt->fds[i] = -1;
  return 1;
}

/* A complete greeting: admit the rank or say why not. -1: give up. */
static int admit(struct root *rt, struct root_hello *h, int fd) {
  char msg[512];
  if (h->secret != rt->secret) {
    WARN("bootstrap root at %s: refused rank %d from %s pid %d: its unique id is another job's", rt->where, h->rank,
         h->host, h->pid);
    reply_error(fd, ncclInvalidUsage, "the unique id does not match this root's: it belongs to another communicator or job");
    return 0;
  }
  if (rt->failed != ncclSuccess) {
    reply_error(fd, rt->failed, rt->failed_msg);
    return 0;
  }
  if (rt->nranks < 0) {
    int r = first_join(rt, h, fd);
    if (r <= 0)
      return r;
  }
  if (h->nranks != rt->nranks) {
    const struct root_hello *f = &rt->hellos[rt->first_rank];
    snprintf(msg, sizeof msg,
             "rank %d (%s pid %d) says nranks=%d but rank %d (%s pid %d), the first to join, says nranks=%d: "
             "every rank must pass the same nranks",
             h->rank, h->host, h->pid, h->nranks, rt->first_rank, f->host, f->pid, rt->nranks);
    reply_error(fd, ncclInvalidUsage, msg);
    fail_job(rt, ncclInvalidUsage, msg);
    return 0;
  }
  if (h->rank < 0 || h->rank >= rt->nranks || rt->fds[h->rank] >= 0) {
    if (h->rank >= 0 && h->rank < rt->nranks)
      snprintf(msg, sizeof msg, "rank %d joined twice: first from %s pid %d, then from %s pid %d", h->rank,
               rt->hellos[h->rank].host, rt->hellos[h->rank].pid, h->host, h->pid);
    else
      snprintf(msg, sizeof msg, "rank %d is out of range for nranks=%d", h->rank, rt->nranks);
    WARN("bootstrap root at %s: %s", rt->where, msg);
    reply_error(fd, ncclInvalidUsage, msg);
    return 0;
  }
  rt->fds[h->rank] = fd;
  rt->addrs[h->rank] = h->addr;
  rt->hellos[h->rank] = *h;
  rt->joined++;
  TRACE(LOG_BOOTSTRAP, "bootstrap root: rank %d of %d joined from %s pid %d", h->rank, rt->nranks, h->host, h->pid);
  return 1;
}

static void drop(struct root *rt, int i, const char *why) {
  WARN("bootstrap root at %s: dropped a connection that %s", rt->where, why);
  close(rt->pend[i].fd);
  rt->pend[i] = rt->pend[--rt->npend];
}

/* Reads what greeting i has sent; returns -1 when the root must stop. */
static int read_greeting(struct root *rt, int i) {
  struct greeting *g = &rt->pend[i];
  ssize_t n = recv(g->fd, (char *)&g->h + g->got, sizeof g->h - g->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return 0;
  if (n <= 0) {
    drop(rt, i, "closed before it greeted like a Loom rank");
    return 0;
  }
  g->got += (size_t)n;
  struct root_hello h;
  enum boot_verdict v = boot_hello_check(&g->h, g->got, rt->secret, &h);
  if (v == BOOT_SHORT)
    return 0;
  /* Another job's secret is answered, below: that rank's user needs to
   * hear why. Anything else that is not a greeting just goes. */
  if (v != BOOT_OK && !(v == BOOT_WRONG_SECRET && g->got == sizeof g->h)) {
    if (v != BOOT_WRONG_SECRET)
      drop(rt, i, "did not greet like a Loom rank");
    return 0;
  }
  if (v == BOOT_WRONG_SECRET) {
    h = g->h;
    h.host[sizeof h.host - 1] = '\0';
  }
  int fd = g->fd;
  rt->pend[i] = rt->pend[--rt->npend];
  /* Answers go out on a blocking socket. */
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return admit(rt, &h, fd) < 0 ? -1 : 0;
}

/* Takes every connection waiting. A full table makes room by dropping the
 * connection that has said least for longest; each new one is read at
 * once, since a rank greets as soon as it connects. -1: stop. */
static int accept_all(struct root *rt) {
  for (;;) {
    int fd = accept4(rt->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return 0;
    if (rt->npend == MAX_PENDING) {
      int victim = 0;
      for (int i = 1; i < rt->npend; i++)
        if (rt->pend[i].got < rt->pend[victim].got ||
            (rt->pend[i].got == rt->pend[victim].got && rt->pend[i].until < rt->pend[victim].until))
          victim = i;
      drop(rt, victim, "was still incomplete when the root had too many connections waiting");
    }
    rt->pend[rt->npend++] = (struct greeting){.fd = fd, .until = time_ns() + GREETING_NS};
    if (read_greeting(rt, rt->npend - 1) < 0)
      return -1;
  }
}

static void timed_out(struct root *rt) {
  if (rt->failed != ncclSuccess || rt->nranks < 0)
    return;
  char missing[200] = "", msg[256];
  size_t o = 0;
  for (int i = 0; i < rt->nranks && o < sizeof missing - 8; i++)
    if (rt->fds[i] < 0)
      o += snprintf(missing + o, sizeof missing - o, "%s%d", o ? "," : "", i);
  snprintf(msg, sizeof msg, "rank(s) %s of %d did not join the bootstrap root at %s within LOOM_TIMEOUT=%llds",
           missing, rt->nranks, rt->where, (long long)rt->timeout_s);
  fail_job(rt, ncclRemoteError, msg);
}

static void answer_all(struct root *rt) {
  INFO(LOG_BOOTSTRAP, "bootstrap root at %s: all %d ranks joined", rt->where, rt->nranks);
  struct root_reply ok = {0};
  memcpy(ok.magic, reply_magic, sizeof ok.magic);
  ok.nranks = rt->nranks;
  for (int k = 0; k < rt->nranks; k++) {
    int i = answer_order(rt, k);
    uint64_t dl = time_ns() + GREETING_NS * 5;
    if (sock_send_all(rt->fds[i], &ok, sizeof ok, dl, "a joining rank") != ncclSuccess ||
        sock_send_all(rt->fds[i], rt->addrs, sizeof *rt->addrs * rt->nranks, dl, "a joining rank") != ncclSuccess)
      WARN("bootstrap root at %s: could not answer rank %d: %s", rt->where, i, err_thread_last());
    close(rt->fds[i]);
  }
}

static void *root_main(void *arg) {
  struct root *rt = arg;
  uint64_t deadline = time_ns() + (uint64_t)rt->timeout_s * 1000000000ull;
  struct pollfd pfd[MAX_PENDING + 1];
  for (;;) {
    if (rt->failed == ncclSuccess && rt->nranks > 0 && rt->joined == rt->nranks) {
      answer_all(rt);
      break;
    }
    uint64_t now = time_ns();
    if (now >= deadline) {
      timed_out(rt);
      break;
    }
    uint64_t wake = deadline;
    for (int i = 0; i < rt->npend; i++) {
      if (rt->pend[i].until <= now) {
        drop(rt, i--, "said nothing for 2 s");
        continue;
      }
      wake = LOOM_MIN(wake, rt->pend[i].until);
    }
    pfd[0] = (struct pollfd){.fd = rt->listen_fd, .events = POLLIN};
    for (int i = 0; i < rt->npend; i++)
      pfd[i + 1] = (struct pollfd){.fd = rt->pend[i].fd, .events = POLLIN};
    int nfds = rt->npend + 1;
    uint64_t ms = (wake - now) / 1000000 + 1;
    if (poll(pfd, (nfds_t)nfds, ms > 1000 ? 1000 : (int)ms) <= 0)
      continue;
    /* Greetings first: reading them reorders pend[], so walk backwards
     * over the entries that were polled. */
    int stop = 0;
    for (int i = nfds - 2; i >= 0 && !stop; i--)
      if (pfd[i + 1].revents)
        stop = read_greeting(rt, i) < 0;
    if (stop)
      break;
    if ((pfd[0].revents & POLLIN) && accept_all(rt) < 0)
      break;
  }
  for (int i = 0; i < rt->npend; i++)
    close(rt->pend[i].fd);
  close(rt->listen_fd);
  free(rt->fds);
  free(rt->addrs);
  free(rt->hellos);
  free(rt);
  return NULL;
}

ncclResult_t bootstrap_root_start(const union sock_addr *bind_addr, uint64_t secret, union sock_addr *bound) {
  struct root *rt = calloc(1, sizeof *rt);
  if (!rt)
    return err_set(ncclSystemError, "out of memory starting the bootstrap root");
  union sock_addr addr;
  ncclResult_t r = sock_listen(bind_addr, &rt->listen_fd, &addr);
  if (r != ncclSuccess) {
    free(rt);
    return r;
  }
  sock_set_nonblocking(rt->listen_fd);
  rt->secret = secret;
  rt->nranks = -1;
  rt->timeout_s = timeout_seconds();
  sock_addr_str(&addr, rt->where, sizeof rt->where);
  if (bound)
    *bound = addr;
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, root_main, rt);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    close(rt->listen_fd);
    free(rt);
    return err_set(ncclSystemError, "cannot start the bootstrap root thread: %s", strerror(rc));
  }
  return ncclSuccess;
}
