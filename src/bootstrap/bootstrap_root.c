/*
 * The bootstrap root: a thread of the process that called ncclGetUniqueId
 * (or of rank 0 with NCCL_COMM_ID). Each rank proves the job's secret
 * (bootstrap_conn.c) and says hello; once the last has, the root tells each
 * rank where the next one listens, and ends.
 *
 * Greetings are read from all open connections at once, so a connection
 * that says nothing (or garbage) costs nobody else any time; one that
 * cannot prove the secret is refused with a WARN that says so. At most
 * max_pending greetings are read at once: past that, the root takes a
 * new connection only in place of one that has been silent for
 * BOOT_IDLE_NS, and otherwise leaves the rest in the kernel's listen
 * queue until a greeting completes, so ranks that join all at once wait
 * their turn rather than push each other out (a rank that is dropped
 * anyway joins again: bootstrap_join.c). A job whose ranks disagree on
 * nranks is failed at once, for every rank that joined and every one that
 * joins later, with the sentence that says so.
 *
 * The process may fork while its root runs (Python's multiprocessing
 * starts ranks so). A child gets copies of the root's sockets but not its
 * thread; a copy would keep a connection the root drops or refuses open,
 * and its rank would never hear that. So the root works under its own
 * lock, which fork takes, and the child closes its copies (root_fork_*).
 *
 * With several unique ids (ncclCommInitRankScalable) each root serves a
 * block of ranks, learned from the first hello, plus the first rank of
 * the next block, whose address it gives to its block's last rank: each
 * root's work is O(nranks / nroots). Its tables are indexed by slot: the
 * block's ranks in order, then that neighbour.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap_conn.h"
#include "misc/utils.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct root {
  struct root *next; /* in `roots` */
  /* Held by the root's thread except while it polls, so that a fork sees
   * whole state: every socket it holds, none half-closed. */
  pthread_mutex_t mu;
  int listen_fd;
  uint8_t key[BOOT_KEY];
  char where[SOCK_ADDR_STRLEN];
  int nranks, joined, first_rank, first_slot;
  int nroots, index;    /* which root of the job this is */
  int lo, count, nslots; /* the block it serves; slot count is the neighbour */
  struct boot_conn **conns; /* the joined ranks', by slot */
  struct boot_peer *peers;
  struct root_hello *hellos;
  int *order; /* the order ranks are answered in (answer_order) */
  /* Once set, the job cannot form: everyone is told this. */
  ncclResult_t failed;
  char failed_msg[BOOT_REPLY_MSG_MAX];
  struct boot_conn **pend; /* still greeting */
  int npend, max_pending;
  struct pollfd *pfd;
  /* LOOM_TIMEOUT, read by the thread that starts the root: the root's own
   * thread never reads the environment, which the program may be changing
   * meanwhile (setenv beside getenv can crash). */
  int64_t timeout_s;
  uint64_t sent, received;
  int refused;
  struct boot_warn warn; /* strangers logged */
};

static void conn_done(struct root *rt, struct boot_conn *c) {
  rt->sent += c->bytes_out;
  rt->received += c->bytes_in;
  boot_conn_close(c);
  free(c);
}

/* A failure, said over the rank's authenticated connection, which then
 * closes. */
static void reply_error(struct root *rt, struct boot_conn *c, ncclResult_t status, const char *msg) {
  struct {
    struct root_reply r;
    char msg[BOOT_REPLY_MSG_MAX];
  } rep;
  memset(&rep, 0, sizeof rep);
  rep.r.status = status;
  rep.r.nranks = rt->nranks;
  snprintf(rep.msg, sizeof rep.msg, "%s", msg);
  size_t len = sizeof rep.r + strlen(rep.msg);
  if (boot_conn_send_wait(c, BOOT_TAG_REPLY, &rep, len, time_ns() + GREETING_NS, 0, "a joining rank") != ncclSuccess)
    WARN("bootstrap root at %s: could not tell rank %d why it was refused: %s", rt->where, c->peer, err_thread_last());
  conn_done(rt, c);
}

/* The root may live in a rank's process: a rank there that has its answer
 * may return and exit, taking the root with it, so ranks elsewhere are
 * answered first. Made once, when the answers start: O(nranks). */
static int answer_order(struct root *rt, int k) {
  if (!rt->order) {
    rt->order = malloc(sizeof *rt->order * (size_t)rt->nslots);
    if (!rt->order)
      return k; /* out of memory: slot order still answers everyone */
    int pid = (int)getpid(), n = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < rt->nslots; i++)
        if ((rt->hellos[i].pid == pid) == (pass == 1))
          rt->order[n++] = i;
  }
  return rt->order[k];
}

/* Tells every rank that joined, and all that come later, that the job
 * cannot form. */
static void fail_job(struct root *rt, ncclResult_t code, const char *msg) {
  WARN("bootstrap root at %s: %s", rt->where, msg);
  rt->failed = code;
  snprintf(rt->failed_msg, sizeof rt->failed_msg, "%s", msg);
  for (int k = 0; k < rt->nslots; k++) {
    int i = answer_order(rt, k);
    if (rt->conns[i])
      reply_error(rt, rt->conns[i], code, msg);
    rt->conns[i] = NULL;
  }
  rt->joined = 0;
}

static int first_join(struct root *rt, const struct root_hello *h) {
  rt->nranks = h->nranks;
  rt->first_rank = h->rank;
  rt->nroots = h->nroots;
  rt->index = h->root;
  boot_block(rt->nranks, rt->nroots, rt->index, &rt->lo, &rt->count);
  int nslots = rt->count + (rt->nroots > 1);
  rt->conns = calloc(nslots, sizeof *rt->conns);
  rt->peers = calloc(nslots, sizeof *rt->peers);
  rt->hellos = calloc(nslots, sizeof *rt->hellos);
  if (!rt->conns || !rt->peers || !rt->hellos) {
    WARN("bootstrap root: out of memory for %d ranks", nslots);
    return -1;
  }
  rt->nslots = nslots;
  rt->first_slot = h->role == ROOT_NEIGHBOUR ? rt->count : h->rank - rt->lo;
  return 1;
}

static int slot_rank(const struct root *rt, int slot) {
  return slot < rt->count ? rt->lo + slot : (rt->lo + rt->count) % rt->nranks;
}

/* Ranks' hellos agree on the ids when they agree on this root's place
 * among them (boot_hello_check has placed the rank in the block). */
static int hello_slot(const struct root *rt, const struct root_hello *h) {
  return h->role == ROOT_NEIGHBOUR ? rt->count : h->rank - rt->lo;
}

/* A rank that proved the secret and said hello: admit it or say why not.
 * -1: give up. */
static int admit(struct root *rt, struct root_hello *h, struct boot_conn *c) {
  char msg[BOOT_REPLY_MSG_MAX];
  if (rt->failed != ncclSuccess) {
    reply_error(rt, c, rt->failed, rt->failed_msg);
    return 0;
  }
  if (rt->nranks < 0 && first_join(rt, h) < 0) {
    conn_done(rt, c);
    return -1;
  }
  const struct root_hello *f = &rt->hellos[rt->first_slot];
  if (h->nranks != rt->nranks) {
    snprintf(msg, sizeof msg,
             "rank %d (%s pid %d) says nranks=%d but rank %d (%s pid %d), the first to join, says nranks=%d: "
             "every rank must pass the same nranks",
             h->rank, h->host, h->pid, h->nranks, rt->first_rank, f->host, f->pid, rt->nranks);
    reply_error(rt, c, ncclInvalidUsage, msg);
    fail_job(rt, ncclInvalidUsage, msg);
    return 0;
  }
  if (h->nroots != rt->nroots || h->root != rt->index) {
    snprintf(msg, sizeof msg,
             "rank %d (%s pid %d) has this root's id as id %d of %d, but rank %d (%s pid %d), the first to join, "
             "as id %d of %d: every rank must pass the same unique ids in the same order",
             h->rank, h->host, h->pid, h->root, h->nroots, rt->first_rank, f->host, f->pid, rt->index, rt->nroots);
    reply_error(rt, c, ncclInvalidUsage, msg);
    fail_job(rt, ncclInvalidUsage, msg);
    return 0;
  }
  int slot = hello_slot(rt, h);
  if (rt->conns[slot] != NULL) {
    snprintf(msg, sizeof msg, "rank %d joined twice: first from %s pid %d, then from %s pid %d", h->rank,
             rt->hellos[slot].host, rt->hellos[slot].pid, h->host, h->pid);
    WARN("bootstrap root at %s: %s", rt->where, msg);
    reply_error(rt, c, ncclInvalidUsage, msg);
    return 0;
  }
  rt->conns[slot] = c;
  rt->peers[slot] = h->me;
  rt->hellos[slot] = *h;
  rt->joined++;
  TRACE(LOG_BOOTSTRAP, "bootstrap root: rank %d of %d joined from %s pid %d", h->rank, rt->nranks, h->host, h->pid);
  return 1;
}

static void drop(struct root *rt, int i, const char *why) {
  char a[SOCK_ADDR_STRLEN], more[128];
  int n = boot_warn_take(&rt->warn);
  if (n > 0)
    WARN("bootstrap root at %s: dropped a connection from %s that %s%s", rt->where,
         boot_conn_peer_str(rt->pend[i], a, sizeof a), why, boot_warn_more(n, more, sizeof more));
  conn_done(rt, rt->pend[i]);
  rt->pend[i] = rt->pend[--rt->npend];
}

/* Moves greeting i on; returns -1 when the root must stop. */
static int read_greeting(struct root *rt, int i, short revents) {
  struct boot_conn *c = rt->pend[i];
  char why[256], line[320], a[SOCK_ADDR_STRLEN], more[128];
  int n;
  for (;;) {
    enum boot_event ev;
    struct boot_msg *m;
    if (boot_conn_step(c, revents, &ev, &m, why, sizeof why) != ncclSuccess) {
      WARN("bootstrap root at %s: %s", rt->where, err_thread_last());
      drop(rt, i, "could not be served");
      return 0;
    }
    revents = 0;
    switch (ev) {
    case BE_NONE:
      return 0;
    case BE_OPENED:
      /* Its hello follows at once. */
      c->until = LOOM_MAX(c->until, LOOM_MIN(c->max_until, time_ns() + GREETING_NS));
      continue;
    case BE_REFUSED:
      /* A stranger, or a rank with another job's secret: the sentence
       * that names it is here; a rank of ours hears its own. */
      n = boot_warn_take(&rt->warn);
      if (n > 0)
        WARN("bootstrap root at %s: refused a connection from %s: it %s%s", rt->where,
             boot_conn_peer_str(c, a, sizeof a), why, boot_warn_more(n, more, sizeof more));
      rt->refused++;
      conn_done(rt, c);
      rt->pend[i] = rt->pend[--rt->npend];
      return 0;
    case BE_MSG: {
      struct root_hello h;
      int ok = m->tag == BOOT_TAG_HELLO && boot_hello_check(m->data, m->len, &h) == BOOT_OK &&
               h.rank == c->chal.from && h.nranks == c->chal.nranks;
      free(m);
      if (!ok) {
        drop(rt, i, "proved the job's secret but sent no valid hello");
        return 0;
      }
      rt->pend[i] = rt->pend[--rt->npend];
      return admit(rt, &h, c) < 0 ? -1 : 0;
    }
    default:
      snprintf(line, sizeof line, "ended before its hello: %s", ev == BE_CLOSED ? "it closed the connection" : why);
      drop(rt, i, line);
      return 0;
    }
  }
}

/* With the table full: the greeting silent longest, if it has been
 * silent for BOOT_IDLE_NS; -1 when none has (every one is moving on). */
static int idle_victim(const struct root *rt, uint64_t now) {
  int victim = -1;
  for (int i = 0; i < rt->npend; i++)
    if (now - rt->pend[i]->last_rx >= BOOT_IDLE_NS && (victim < 0 || rt->pend[i]->last_rx < rt->pend[victim]->last_rx))
      victim = i;
  return victim;
}

/* Takes the connections waiting while there is room; a full table makes
 * room only by dropping a greeting that has gone silent, else the rest
 * wait in the kernel's queue. Each new one is read at once, since a rank
 * greets as soon as it connects. -1: stop. */
static int accept_all(struct root *rt) {
  for (;;) {
    int victim = -1;
    if (rt->npend == rt->max_pending && (victim = idle_victim(rt, time_ns())) < 0)
      return 0;
    int fd = accept4(rt->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return 0;
    if (victim >= 0)
      drop(rt, victim, "had been silent, in the middle of its greeting, when the root had too many waiting");
    struct boot_conn *c = malloc(sizeof *c);
    if (!c) {
      close(fd);
      return 0;
    }
    boot_conn_accepted(c, fd, rt->key, BOOT_TO_ROOT, 0, time_ns() + GREETING_NS, NULL);
    rt->pend[rt->npend++] = c;
    if (read_greeting(rt, rt->npend - 1, 0) < 0)
      return -1;
  }
}

static void timed_out(struct root *rt) {
  if (rt->failed != ncclSuccess || rt->nranks < 0)
    return;
  char missing[200] = "", msg[400], part[160] = "";
  size_t o = 0;
  for (int i = 0; i < rt->nslots && o < sizeof missing - 8; i++)
    if (rt->conns[i] == NULL)
      o += snprintf(missing + o, sizeof missing - o, "%s%d", o ? "," : "", slot_rank(rt, i));
  if (rt->nroots > 1)
    snprintf(part, sizeof part, " (root %d of %d: it serves ranks %d to %d and hears from rank %d)", rt->index,
             rt->nroots, rt->lo, rt->lo + rt->count - 1, slot_rank(rt, rt->count));
  snprintf(msg, sizeof msg, "rank(s) %s of %d did not join the bootstrap root at %s%s within LOOM_TIMEOUT=%llds",
           missing, rt->nranks, rt->where, part, (long long)rt->timeout_s);
  fail_job(rt, ncclRemoteError, msg);
}

/* Each rank learns only where the next one listens: O(1) bytes per rank,
 * O(nranks) in all; the ranks pass the rest around the ring. */
static void answer_all(struct root *rt) {
  for (int k = 0; k < rt->nslots; k++) {
    int i = answer_order(rt, k);
    struct root_reply ok;
    memset(&ok, 0, sizeof ok);
    ok.nranks = rt->nranks;
    /* The block's last rank gets the neighbour (or, with one root, rank
     * 0); the neighbour its own address, which it does not use. */
    ok.next = rt->peers[i + 1 < rt->nslots ? i + 1 : i == rt->count ? i : 0];
    if (boot_conn_send_wait(rt->conns[i], BOOT_TAG_REPLY, &ok, sizeof ok, time_ns() + GREETING_NS * 5, 0,
                            "a joining rank") != ncclSuccess)
      WARN("bootstrap root at %s: could not answer rank %d: %s", rt->where, i, err_thread_last());
    conn_done(rt, rt->conns[i]);
    rt->conns[i] = NULL;
  }
}

/* ---- fork ---- */

static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct root *roots; /* the running roots of this process */
static pthread_once_t root_fork_once = PTHREAD_ONCE_INIT;

static void root_fork_prepare(void) {
  pthread_mutex_lock(&roots_mu);
  for (struct root *rt = roots; rt; rt = rt->next)
    pthread_mutex_lock(&rt->mu);
}

static void root_fork_parent(void) {
  for (struct root *rt = roots; rt; rt = rt->next)
    pthread_mutex_unlock(&rt->mu);
  pthread_mutex_unlock(&roots_mu);
}

/* The child has no root thread: it closes the root's sockets and forgets
 * the roots (their memory is the parent's threads' to free). */
static void root_fork_child(void) {
  for (struct root *rt = roots; rt; rt = rt->next) {
    if (rt->listen_fd >= 0)
      close(rt->listen_fd);
    for (int i = 0; i < rt->npend; i++)
      close(rt->pend[i]->fd);
    for (int i = 0; rt->conns && i < rt->nslots; i++)
      if (rt->conns[i])
        close(rt->conns[i]->fd);
    pthread_mutex_unlock(&rt->mu);
  }
  roots = NULL;
  pthread_mutex_unlock(&roots_mu);
}

/* The log's and libcrypto's handlers first: fork runs prepare handlers
 * last registered first, so it takes the roots' locks before theirs (a
 * root holds its own while it logs and computes MACs). */
static void root_fork_register(void) {
  log_fork_init();
  boot_crypto_fork_init();
  pthread_atfork(root_fork_prepare, root_fork_parent, root_fork_child);
}

static void roots_add(struct root *rt) {
  pthread_once(&root_fork_once, root_fork_register);
  pthread_mutex_lock(&roots_mu);
  rt->next = roots;
  roots = rt;
  pthread_mutex_unlock(&roots_mu);
}

static void roots_remove(struct root *rt) {
  pthread_mutex_lock(&roots_mu);
  for (struct root **p = &roots; *p; p = &(*p)->next)
    if (*p == rt) {
      *p = rt->next;
      break;
    }
  pthread_mutex_unlock(&roots_mu);
}

/* Closes every socket the root holds (under its lock). */
static void root_close_all(struct root *rt) {
  for (int i = 0; i < rt->npend; i++)
    conn_done(rt, rt->pend[i]);
  rt->npend = 0;
  for (int i = 0; rt->conns && i < rt->nslots; i++)
    if (rt->conns[i]) {
      conn_done(rt, rt->conns[i]);
      rt->conns[i] = NULL;
    }
  if (rt->listen_fd >= 0)
    close(rt->listen_fd);
  rt->listen_fd = -1;
}

/* Takes a root whose sockets are closed out of `roots` and frees it. */
static void root_free(struct root *rt) {
  roots_remove(rt);
  pthread_mutex_destroy(&rt->mu);
  free(rt->conns);
  free(rt->peers);
  free(rt->hellos);
  free(rt->order);
  free(rt->pend);
  free(rt->pfd);
  boot_cleanse(rt->key, sizeof rt->key);
  free(rt);
}

static void *root_main(void *arg) {
  struct root *rt = arg;
  pthread_mutex_lock(&rt->mu);
  uint64_t deadline = time_ns() + (uint64_t)rt->timeout_s * 1000000000ull;
  struct pollfd *pfd = rt->pfd;
  int all = 0;
  for (;;) {
    if (rt->failed == ncclSuccess && rt->nslots > 0 && rt->joined == rt->nslots) {
      answer_all(rt);
      all = 1;
      break;
    }
    uint64_t now = time_ns();
    if (now >= deadline) {
      timed_out(rt);
      break;
    }
    uint64_t wake = deadline;
    int full = rt->npend == rt->max_pending;
    for (int i = 0; i < rt->npend; i++) {
      if (rt->pend[i]->until <= now) {
        drop(rt, i--, "said nothing for 2 s in the middle of its greeting (or took 10 s for all of it)");
        continue;
      }
      wake = LOOM_MIN(wake, rt->pend[i]->until);
      if (full)
        wake = LOOM_MIN(wake, rt->pend[i]->last_rx + BOOT_IDLE_NS);
    }
    /* A full table with nothing to drop leaves new connections in the
     * kernel's queue, unpolled (they would wake every poll). */
    full = rt->npend == rt->max_pending && idle_victim(rt, now) < 0;
    pfd[0] = (struct pollfd){.fd = rt->listen_fd, .events = full ? 0 : POLLIN};
    for (int i = 0; i < rt->npend; i++)
      pfd[i + 1] = (struct pollfd){.fd = rt->pend[i]->fd, .events = boot_conn_events(rt->pend[i])};
    int nfds = rt->npend + 1;
    uint64_t ms = (wake - now) / 1000000 + 1;
    pthread_mutex_unlock(&rt->mu);
    int n = poll(pfd, (nfds_t)nfds, ms > 1000 ? 1000 : (int)ms);
    pthread_mutex_lock(&rt->mu);
    if (n <= 0)
      continue;
    /* Greetings first: reading them reorders pend[], so walk backwards
     * over the entries that were polled. */
    int stop = 0;
    for (int i = nfds - 2; i >= 0 && !stop; i--)
      if (pfd[i + 1].revents)
        stop = read_greeting(rt, i, pfd[i + 1].revents) < 0;
    if (stop)
      break;
    if ((pfd[0].revents & POLLIN) && accept_all(rt) < 0)
      break;
  }
  root_close_all(rt);
  pthread_mutex_unlock(&rt->mu);
  if (rt->warn.held > 0)
    WARN("bootstrap root at %s: %d more connection(s) refused or dropped, not logged one by one", rt->where,
         rt->warn.held);
  if (all)
    INFO(LOG_BOOTSTRAP, "bootstrap root at %s: all %d ranks joined; it sent %llu bytes and received %llu (%d "
         "connection(s) refused)", rt->where, rt->nslots, (unsigned long long)rt->sent,
         (unsigned long long)rt->received, rt->refused);
  root_free(rt);
  return NULL;
}

ncclResult_t bootstrap_root_start(const union sock_addr *bind_addr, const uint8_t key[BOOT_KEY],
                                  union sock_addr *bound) {
  struct root *rt = calloc(1, sizeof *rt);
  if (!rt)
    return err_set(ncclSystemError, "out of memory starting the bootstrap root");
  rt->listen_fd = -1;
  pthread_mutex_init(&rt->mu, NULL);
  /* Listed before its socket exists, so that no fork misses that. */
  roots_add(rt);
  pthread_mutex_lock(&rt->mu);
  /* Read here: the root's own thread never reads the environment. */
  rt->max_pending = (int)param_int(P_BOOTSTRAP_PENDING);
  rt->pend = calloc((size_t)rt->max_pending, sizeof *rt->pend);
  rt->pfd = calloc((size_t)rt->max_pending + 1, sizeof *rt->pfd);
  if (!rt->pend || !rt->pfd) {
    int max = rt->max_pending;
    pthread_mutex_unlock(&rt->mu);
    root_free(rt);
    return err_set(ncclSystemError, "out of memory starting the bootstrap root (LOOM_BOOTSTRAP_PENDING=%d)", max);
  }
  union sock_addr addr;
  ncclResult_t r = sock_listen(bind_addr, &rt->listen_fd, &addr);
  if (r != ncclSuccess) {
    pthread_mutex_unlock(&rt->mu);
    root_free(rt);
    return r;
  }
  sock_set_nonblocking(rt->listen_fd);
  memcpy(rt->key, key, sizeof rt->key);
  rt->nranks = -1;
  rt->timeout_s = timeout_seconds();
  sock_addr_str(&addr, rt->where, sizeof rt->where);
  if (bound)
    *bound = addr;
  pthread_mutex_unlock(&rt->mu);
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, root_main, rt);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_mutex_lock(&rt->mu);
    root_close_all(rt);
    pthread_mutex_unlock(&rt->mu);
    root_free(rt);
    return err_set(ncclSystemError, "cannot start the bootstrap root thread: %s", strerror(rc));
  }
  return ncclSuccess;
}
