/*
 * The owner's side of the status page (status.h): one page per process,
 * a record per communicator, the SIGUSR1 report, and the explanation a
 * timed-out rank gives of the peers it waited on.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "status.h"

#include "comm/comm.h"
#include "core.h"
#include "common/coll.h"
#include "exec/host_exec.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t page_lock = PTHREAD_MUTEX_INITIALIZER;
static struct status_page *page;
static int page_fd = -1;

/* One writer per record (the communicator's thread; add and remove hold
 * page_lock), so the sequence needs stores, not read-modify-writes. */
static void rec_begin(struct status_rec *r) {
  uint32_t g = atomic_load_explicit(&r->gen, memory_order_relaxed);
  atomic_store_explicit(&r->gen, g + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static void rec_end(struct status_rec *r) {
  uint32_t g = atomic_load_explicit(&r->gen, memory_order_relaxed);
  atomic_store_explicit(&r->gen, g + 1, memory_order_release);
}

/* Seconds are what the report shows; the coarse clock costs a few ns. */
static uint64_t coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes every record's line to stderr. Only async-signal-safe calls. */
static void on_signal(int sig) {
  (void)sig;
  int saved = errno;
  struct status_page *pg = page;
  if (pg) {
    uint64_t now = time_ns();
    for (int i = 0; i < STATUS_RECS; i++) {
      struct status_rec r;
      if (!status_rec_read(&pg->rec[i], &r)) {
        /* The interrupted thread may be this record's writer: a torn
         * line beats none. */
        if (pg->rec[i].state == STATUS_FREE)
          continue;
        memcpy(&r, (const void *)&pg->rec[i], sizeof r);
      }
      char line[768];
      size_t n = status_format(pg->pid, pg->host, &r, now, line, sizeof line - 1);
      line[n++] = '\n';
      ssize_t w = write(STDERR_FILENO, line, n);
      (void)w;
    }
  }
  errno = saved;
}

static void install_signal(void) {
  int sig = (int)param_int(P_STATUS_SIGNAL);
  if (sig <= 0)
    return;
  struct sigaction old;
  if (sigaction(sig, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
    INFO(LOG_INIT, "signal %d already has a handler: no status report on it (LOOM_STATUS_SIGNAL)", sig);
    return;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, NULL) == 0)
    INFO(LOG_INIT, "signal %d writes what each communicator does to stderr (LOOM_STATUS_SIGNAL)", sig);
}

/* A forked child shares its parent's page (MAP_SHARED): the records of
 * the communicators it inherited (unusable, but it may destroy them) are
 * put on private zeroed memory at the same address, so that its writes
 * never reach the parent's report, and its own communicators get a page
 * of their own. */
static void on_fork_child(void) {
  if (!page)
    return;
  mmap(page, sizeof *page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  close(page_fd);
  page_fd = -1;
  page = NULL;
}

/* Called with page_lock held. */
static struct status_page *page_get(void) {
  static int atfork_done;
  if (page)
    return page;
  if (!atfork_done && pthread_atfork(NULL, NULL, on_fork_child) == 0)
    atfork_done = 1;
  int fd = memfd_create(STATUS_MEMFD_NAME, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, sizeof(struct status_page)) != 0) {
    INFO(LOG_INIT, "no status page (memfd_create: %s): loom-info --status will not see this process",
         strerror(errno));
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  void *p = mmap(NULL, sizeof(struct status_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  struct status_page *pg = p;
  pg->version = 1;
  pg->nrecs = STATUS_RECS;
  pg->pid = (int32_t)getpid();
  gethostname(pg->host, sizeof pg->host - 1);
  atomic_thread_fence(memory_order_release);
  pg->magic = STATUS_MAGIC;
  page_fd = fd;
  page = pg;
  static int signal_done; /* a forked child keeps its parent's handler */
  if (!signal_done) {
    install_signal();
    signal_done = 1;
  }
  return pg;
}

static void op_none(struct status_op *o) {
  memset(o, 0, sizeof *o);
  o->coll = -1;
}

void status_comm_add(struct ncclComm *comm) {
  pthread_mutex_lock(&page_lock);
  struct status_page *pg = page_get();
  struct status_rec *r = NULL;
  for (int i = 0; pg && i < STATUS_RECS && !r; i++)
    if (pg->rec[i].state == STATUS_FREE)
      r = &pg->rec[i];
  if (r) {
    rec_begin(r);
    r->comm_hash = comm->comm_hash;
    r->rank = comm->rank;
    r->nranks = comm->nranks;
    r->cuda_dev = comm->is_host ? -1 : comm->cuda_dev;
    r->wait_peer = -1;
    r->since_ns = coarse_ns();
    r->ops = 0;
    op_none(&r->cur);
    r->wait[0] = '\0';
    snprintf(r->name, sizeof r->name, "%s", comm->name);
    r->state = STATUS_IDLE;
    rec_end(r);
  } else if (pg) {
    INFO(LOG_INIT, "rank %d: all %d status records are taken: this communicator has no status line", comm->rank,
         STATUS_RECS);
  }
  comm->status = r;
  pthread_mutex_unlock(&page_lock);
}

void status_comm_remove(struct ncclComm *comm) {
  struct status_rec *r = comm->status;
  if (!r)
    return;
  pthread_mutex_lock(&page_lock);
  rec_begin(r);
  r->state = STATUS_FREE;
  rec_end(r);
  comm->status = NULL;
  pthread_mutex_unlock(&page_lock);
}

void status_op_start(struct ncclComm *comm, const struct task *t, uint64_t seq, int ntasks) {
  struct status_rec *r = comm->status;
  if (!r || !t)
    return;
  rec_begin(r);
  r->cur.coll = t->coll;
  r->cur.dtype = t->dtype;
  r->cur.op = t->op;
  r->cur.root = t->root;
  r->cur.peer = t->peer;
  r->cur.count = t->count;
  r->cur.seq = (t->coll == COLL_SEND || t->coll == COLL_RECV) ? ~0ull : seq;
  r->cur.ntasks = ntasks;
  r->cur.result = ncclSuccess;
  r->wait_peer = -1;
  r->ops += (uint64_t)ntasks;
  r->since_ns = coarse_ns();
  r->state = comm->is_host ? STATUS_RUNNING : STATUS_IDLE; /* CUDA: the stream runs it */
  rec_end(r);
}

void status_op_end(struct ncclComm *comm, ncclResult_t res) {
  struct status_rec *r = comm->status;
  if (!r || (comm->is_host && r->state != STATUS_RUNNING))
    return;
  rec_begin(r);
  r->cur.result = res;
  r->wait_peer = -1;
  r->state = res == ncclSuccess ? STATUS_IDLE : STATUS_FAILED;
  r->since_ns = coarse_ns();
  rec_end(r);
}

void status_waiting(struct ncclComm *comm, const struct work *w, uint64_t since_ns) {
  struct status_rec *r = comm->status;
  if (!r || !w)
    return;
  struct conn *blocked[WORK_MAX_PEERS];
  int nb = exec_waiting_on(w, blocked);
  char what[sizeof r->wait];
  exec_describe_wait(w, what, sizeof what);
  rec_begin(r);
  r->wait_peer = nb > 0 ? blocked[0]->peer : exec_waiting_rank(w);
  r->wait_since_ns = since_ns;
  memcpy(r->wait, what, sizeof what);
  rec_end(r);
}

void status_moving(struct ncclComm *comm) {
  struct status_rec *r = comm->status;
  if (!r || r->wait_peer < 0)
    return;
  rec_begin(r);
  r->wait_peer = -1;
  rec_end(r);
}

void status_log(struct ncclComm *comm) {
  struct status_rec r;
  if (!comm->status || !page || !status_rec_read(comm->status, &r))
    return;
  char line[768];
  status_format(page->pid, page->host, &r, time_ns(), line, sizeof line);
  WARN("%s", line);
}

/* Appends formatted text to buf (of total size len). */
static void add(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 1 >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, len - n, fmt, ap);
  va_end(ap);
}

/* Finds the record of `rank` of this communicator in process `pid`. */
static int peer_record(const struct ncclComm *comm, int rank, int pid, struct status_rec *out) {
  const struct status_page *pg = status_page_map(pid);
  int found = 0;
  for (int i = 0; pg && i < STATUS_RECS && !found; i++)
    found = pg->rec[i].comm_hash == comm->comm_hash && pg->rec[i].rank == rank && status_rec_read(&pg->rec[i], out);
  status_page_unmap(pg);
  return found;
}

void status_explain_peer(struct ncclComm *comm, int peer, char *buf, size_t len) {
  uint64_t my_host = comm->peers[comm->rank].host_hash;
  uint64_t now = time_ns();
  char *seen = calloc((size_t)comm->nranks, 1);
  if (!seen)
    return;
  seen[comm->rank] = 1;
  for (int hop = 0; hop < 16 && peer >= 0 && peer < comm->nranks; hop++) {
    const struct peer_info *pi = &comm->peers[peer];
    seen[peer] = 1;
    if (pi->host_hash != my_host) {
      add(buf, len, "; rank %d is on %s: loom-info --status there says what it does", peer, pi->hostname);
      break;
    }
    char st = status_proc_state(pi->pid);
    struct status_rec r;
    int have = st != 0 && peer_record(comm, peer, pi->pid, &r);
    char why[400];
    if (status_why(st, have ? &r : NULL, now, why, sizeof why)) {
      add(buf, len, "; rank %d (pid %d on %s) %s", peer, pi->pid, pi->hostname, why);
      break;
    }
    char op[200];
    status_format_op(&r.cur, op, sizeof op);
    add(buf, len, "; rank %d, in %s, waits for %s", peer, op, r.wait);
    if (r.wait_peer < comm->nranks && seen[r.wait_peer]) {
      add(buf, len, "; so the ranks wait on each other in a cycle (calls in a different order?)");
      break;
    }
    peer = r.wait_peer;
  }
  free(seen);
}
