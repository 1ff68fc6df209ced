/*
 * Windows (ncclCommWindowRegister). In a process that makes host
 * communicators, ncclMemAlloc's memory (mem_alloc.c) is an unnamed
 * shared segment (a memfd), so that a window registered on it can be
 * mapped by the peers of this host: registration is collective, every
 * rank all-gathers its window's description and maps those of the peers
 * it can reach. Also the communicator's signals, set up at its init
 * (rma.h).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "bootstrap/bootstrap.h"
#include "comm_api.h"
#include "group.h"
#include "misc/cudamem.h"
#include "misc/param.h"
#include "misc/utils.h"
#include "rma.h"
#include "transport/shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- reaching a peer's segment ---- */

/* What each rank tells the others of a segment it shares: its window or
 * its signals. */
struct seg_desc {
  uint64_t addr;     /* as the owner sees it: threads of its process use it as it is */
  uint64_t size;     /* the window's (or the counters') size */
  uint64_t seg_size; /* of the memfd it lies in; 0: none */
  uint64_t offset;   /* of addr in the memfd */
  uint64_t dev, ino; /* the memfd's identity, checked by whoever takes it */
  int32_t fd;        /* the owner's descriptor */
  int32_t flags;     /* a window's registration flags */
  /* CUDA communicators: the window's allocation (from ncclMemAlloc) as
   * CUDA IPC hands it over, `offset` into it; ipc_ok 0 where none. */
  int32_t ipc_ok;
  int32_t cuda_dev;
  uint8_t ipc[CUDA_IPC_HANDLE_BYTES];
  /* Host communicators with peers on other hosts: where this rank's
   * one-sided service listens (comm_rma_net.c); rma_listen 0: none. */
  int32_t rma_listen;
  union sock_addr rma_addr;
};


static void seg_describe(struct seg_desc *d, const void *addr, size_t size, int fd, size_t offset, size_t seg_size) {
  memset(d, 0, sizeof *d);
  d->addr = (uint64_t)(uintptr_t)addr;
  d->size = size;
  d->fd = fd;
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0) {
    d->seg_size = seg_size;
    d->offset = offset;
    d->dev = st.st_dev;
    d->ino = st.st_ino;
  }
}

static int same_file(int fd, const void *arg) {
  const struct seg_desc *d = arg;
  struct stat st;
  return fstat(fd, &st) == 0 && (uint64_t)st.st_dev == d->dev && (uint64_t)st.st_ino == d->ino &&
         (uint64_t)st.st_size == d->seg_size;
}

/* Rank `peer`'s segment `d`, mapped here: *ptr (and the mapping to undo,
 * if any), or *why, the sentence saying why it cannot be (allocated;
 * NULL where even that fails). `what` names the segment. */
static void seg_reach(struct ncclComm *comm, int peer, const struct seg_desc *d, const char *what, char **ptr,
                      void **map, char **why) {
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  char buf[600];
  *ptr = NULL;
  *map = NULL;
  *why = NULL;
  if (peer == comm->rank || p->proc_id == me->proc_id) {
    *ptr = (char *)(uintptr_t)d->addr;
    return;
  }
  if (p->host_hash != me->host_hash && comm->is_host) {
    /* Puts and signals go to its one-sided service instead
     * (comm_rma_net.c); this sentence is for the pointers. */
    snprintf(buf, sizeof buf,
             "rank %d is on another host (%s), whose memory this process cannot load and store; ncclPutSignal and "
             "ncclSignal reach it",
             peer, p->hostname);
  } else if (p->host_hash != me->host_hash) {
    snprintf(buf, sizeof buf,
             "rank %d is on another host (%s): one-sided operations to a peer on another host are not implemented "
             "yet in Loom on CUDA communicators (host communicators have them); use ncclSend and ncclRecv",
             peer, p->hostname);
  } else if (d->seg_size == 0) {
    snprintf(buf, sizeof buf,
             "rank %d's %s is not memory from ncclMemAlloc, which another process cannot map; allocate it with "
             "ncclMemAlloc (on a host communicator that is memory the ranks of one host share)",
             peer, what);
  } else if (p->pid_ns != me->pid_ns) {
    snprintf(buf, sizeof buf,
             "rank %d runs in another pid namespace, from which Loom cannot take its %s yet; run the ranks of a host "
             "in one pid namespace",
             peer, what);
  } else {
    /* The owner's descriptor: pidfd_getfd needs the right to ptrace it
     * (Yama may refuse; LOOM_SHM_PIDFD_GETFD=0 turns it off), its /proc
     * entry only the right to read it. Either is checked to be the file
     * the owner described. */
    int fd = -1, e1, e2;
    int pidfd = comm->peer_pidfd && param_int(P_SHM_PIDFD_GETFD) ? comm->peer_pidfd[peer] : -1;
    shm_seg_take(pidfd, p->pid, d->fd, same_file, d, &fd, &e1, &e2);
    if (fd >= 0) {
      void *m = mmap(NULL, d->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      int e = errno;
      close(fd);
      if (m != MAP_FAILED) {
        INFO(LOG_SHM, "rank %d: mapped rank %d's %s (%s)", comm->rank, peer, what,
             e1 == 0 ? "pidfd_getfd" : "its /proc entry");
        *map = m;
        *ptr = (char *)m + d->offset;
        return;
      }
      snprintf(buf, sizeof buf, "cannot map rank %d's %s (%llu bytes): %s", peer, what,
               (unsigned long long)d->seg_size, strerror(e));
    } else {
      snprintf(buf, sizeof buf,
               "cannot take rank %d's %s from its process (pid %d): pidfd_getfd: %s; /proc/%d/fd/%d: %s", peer,
               what, p->pid, e1 == ESTALE ? "another file" : strerror(e1), p->pid, d->fd,
               e2 == ESTALE ? "another file" : strerror(e2));
    }
  }
  *why = strdup(buf);
}

/* ---- the communicator's signals ---- */

static ncclResult_t rma_state_get(struct ncclComm *comm, const char *func) {
  if (comm->rma)
    return ncclSuccess;
  struct rma_state *st = calloc(1, sizeof *st);
  int n = comm->nranks;
  if (st) {
    st->sig_fd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->win_cond, NULL);
    st->sig_peer = calloc((size_t)n, sizeof *st->sig_peer);
    st->sig_map = calloc((size_t)n, sizeof *st->sig_map);
    st->sig_why = calloc((size_t)n, sizeof *st->sig_why);
    st->consumed = calloc((size_t)RMA_CTXS * RMA_SIGNALS * (size_t)n, sizeof *st->consumed);
  }
  if (!st || !st->sig_peer || !st->sig_map || !st->sig_why || !st->consumed) {
    if (st) {
      free(st->sig_peer);
      free(st->sig_map);
      free(st->sig_why);
      free(st->consumed);
    }
    free(st);
    return err_set(ncclSystemError, "%s: out of memory", func);
  }
  comm->rma = st;
  return ncclSuccess;
}

/* This rank's counters, in a segment of their own: or plain memory,
 * which only its own process's ranks can then signal. */
ncclResult_t rma_signals_create(struct ncclComm *comm) {
  CHECK(rma_state_get(comm, "ncclCommInitRank"));
  struct rma_state *st = comm->rma;
  struct peer_info *me = &comm->peers[comm->rank];
  size_t len = mem_page_round((size_t)RMA_CTXS * RMA_SIGNALS * (size_t)comm->nranks * sizeof(uint64_t));
  int fd = mem_shared_segment(len);
  void *p = MAP_FAILED;
  if (fd >= 0)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    INFO(LOG_INIT, "rank %d: no shared memory for one-sided signals (%s): only ranks of this process can signal it",
         comm->rank, strerror(errno));
    if (fd >= 0)
      close(fd);
    fd = -1;
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return err_set(ncclSystemError, "cannot allocate %zu bytes for the one-sided signals: %s", len,
                     strerror(errno));
  }
  st->sig_own = p;
  st->sig_len = len;
  st->sig_fd = fd;
  struct seg_desc d;
  seg_describe(&d, p, len, fd, 0, len);
  me->sig_addr = d.addr;
  me->sig_size = d.seg_size;
  me->sig_dev = d.dev;
  me->sig_ino = d.ino;
  me->sig_fd = d.fd;
  return ncclSuccess;
}

void rma_signals_connect(struct ncclComm *comm) {
  struct rma_state *st = comm->rma;
  if (st == NULL || st->sig_own == NULL)
    return;
  for (int r = 0; r < comm->nranks; r++) {
    const struct peer_info *p = &comm->peers[r];
    struct seg_desc d = {.addr = p->sig_addr, .size = p->sig_size, .seg_size = p->sig_size, .dev = p->sig_dev,
                         .ino = p->sig_ino, .fd = p->sig_fd};
    char *ptr;
    seg_reach(comm, r, &d, "signals", &ptr, &st->sig_map[r], &st->sig_why[r]);
    st->sig_peer[r] = (_Atomic uint64_t *)ptr;
  }
  st->sig_ready = 1;
}

/* ---- windows ---- */

/* Every window of the process, so that a call naming only a window
 * (ncclGetPeerDevicePointer) can tell one from any other pointer. */
static pthread_mutex_t wins_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rma_win *wins_all;

static void win_global(struct rma_win *w, int add) {
  pthread_mutex_lock(&wins_lock);
  if (add) {
    w->next_all = wins_all;
    wins_all = w;
  } else {
    for (struct rma_win **p = &wins_all; *p; p = &(*p)->next_all)
      if (*p == w) {
        *p = w->next_all;
        break;
      }
  }
  pthread_mutex_unlock(&wins_lock);
}

struct ncclComm *rma_win_owner(ncclWindow_t win) {
  struct ncclComm *comm = NULL;
  pthread_mutex_lock(&wins_lock);
  for (struct rma_win *w = wins_all; w && !comm; w = w->next_all)
    if ((void *)w == (void *)win)
      comm = w->comm;
  pthread_mutex_unlock(&wins_lock);
  return comm;
}

static void win_free(struct ncclComm *comm, struct rma_win *w) {
  win_global(w, 0);
  for (struct comm_win **p = &comm->direct_wins; *p; p = &(*p)->next)
    if (*p == &w->direct) {
      *p = w->direct.next;
      break;
    }
  free(w->direct.peer);
  free(w->direct.peer_size);
  int saved = -2;
  for (int r = 0; w->peer && r < comm->nranks; r++) {
    if (w->peer[r].map)
      munmap(w->peer[r].map, w->peer[r].map_len);
    if (w->peer[r].ipc_base) {
      if (saved == -2) {
        saved = cuda_current_device();
        cuda_set_device(comm->cuda_dev);
      }
      cuda_ipc_close(w->peer[r].ipc_base);
    }
    free(w->peer[r].why);
  }
  if (saved != -2)
    cuda_restore_device(saved);
  free(w->peer);
  w->magic = 0;
  free(w);
}

void rma_destroy(struct ncclComm *comm) {
  struct rma_state *st = comm->rma;
  if (!st)
    return;
  /* The service first: it writes into the windows freed below. */
  rma_net_stop(comm);
  /* Signals still queued on streams write through this state: they are
   * waited for, for the communicator's timeout at most (a second after an
   * abort); past that the state is left (a leak, not a write into freed
   * memory). */
  uint64_t deadline = comm_aborted(comm) ? time_ns() + 1000000000ull : comm_deadline(comm);
  while (atomic_load(&st->pending) > 0 && time_ns() < deadline) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load(&st->pending) > 0) {
    char bound[TIMEOUT_NAME_LEN];
    WARN("rank %d: %d one-sided signal(s) still queued on streams timed out after %s: their memory is left mapped",
         comm->rank, atomic_load(&st->pending),
         comm_aborted(comm) ? "1 s (an abort)" : comm_timeout_name(comm, bound, sizeof bound));
    comm->rma = NULL;
    return;
  }
  for (struct rma_win *w = st->wins, *n; w; w = n) {
    n = w->next;
    win_free(comm, w);
  }
  for (int r = 0; r < comm->nranks; r++) {
    if (st->sig_map[r])
      munmap(st->sig_map[r], st->sig_len);
    free(st->sig_why[r]);
  }
  if (st->sig_own)
    munmap((void *)st->sig_own, st->sig_len);
  if (st->sig_fd >= 0)
    close(st->sig_fd);
  free(st->sig_peer);
  free(st->sig_map);
  free(st->sig_why);
  free(st->consumed);
  pthread_mutex_destroy(&st->lock);
  pthread_cond_destroy(&st->win_cond);
  free(st);
  comm->rma = NULL;
}

ncclResult_t rma_win_lookup(struct ncclComm *comm, ncclWindow_t win, const char *func, struct rma_win **out) {
  for (struct rma_win *w = comm->rma ? comm->rma->wins : NULL; w; w = w->next)
    if ((void *)w == (void *)win) {
      *out = w;
      return ncclSuccess;
    }
  return err_set(ncclInvalidArgument, "%s: the window %p was not registered on this communicator (or was deregistered)",
                 func, (void *)win);
}

/* A CUDA communicator's peer window: the pointer itself in this process
 * (with peer access to its device, where that is another), else the
 * allocation opened by CUDA IPC on this rank's device. */
static void win_reach_cuda(struct ncclComm *comm, int peer, const struct seg_desc *d, struct rma_peer_win *pw) {
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  char buf[LOOM_ERR_LEN];
  if (peer == comm->rank || p->proc_id == me->proc_id) {
    if (d->cuda_dev != comm->cuda_dev && cuda_enable_peer(d->cuda_dev) != ncclSuccess) {
      snprintf(buf, sizeof buf, "rank %d's window is on device %d, which this rank's device %d cannot reach: %s",
               peer, d->cuda_dev, comm->cuda_dev, err_thread_last());
      pw->why = strdup(buf);
      return;
    }
    pw->ptr = (char *)(uintptr_t)d->addr;
    return;
  }
  if (p->host_hash != me->host_hash) {
    snprintf(buf, sizeof buf,
             "rank %d is on another host (%s): one-sided operations to a peer on another host are not implemented "
             "yet in Loom on CUDA communicators (host communicators have them); use ncclSend and ncclRecv",
             peer, p->hostname);
  } else if (!d->ipc_ok) {
    snprintf(buf, sizeof buf,
             "rank %d's window is not memory from ncclMemAlloc, whose allocation Loom hands to other processes by "
             "CUDA IPC; allocate it with ncclMemAlloc",
             peer);
  } else {
    int saved = cuda_current_device();
    ncclResult_t r = cuda_set_device(comm->cuda_dev);
    void *base = NULL;
    if (r == ncclSuccess)
      r = cuda_ipc_open(d->ipc, &base, "a peer's window");
    cuda_restore_device(saved);
    if (r == ncclSuccess) {
      pw->ipc_base = base;
      pw->ptr = (char *)base + d->offset;
      return;
    }
    snprintf(buf, sizeof buf, "cannot open rank %d's window: %s", peer, err_thread_last());
  }
  pw->why = strdup(buf);
}

/* The window's peers, reached (or why not) from what they told. */
static ncclResult_t win_connect(struct ncclComm *comm, struct rma_win *w, const struct seg_desc *all) {
  w->peer = calloc((size_t)comm->nranks, sizeof *w->peer);
  if (!w->peer)
    return err_set(ncclSystemError, "ncclCommWindowRegister: out of memory");
  for (int r = 0; r < comm->nranks; r++) {
    struct rma_peer_win *pw = &w->peer[r];
    pw->size = all[r].size;
    if (!comm->is_host) {
      win_reach_cuda(comm, r, &all[r], pw);
      continue;
    }
    seg_reach(comm, r, &all[r], "window", &pw->ptr, &pw->map, &pw->why);
    if (pw->map)
      pw->map_len = all[r].seg_size;
    const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[r];
    if (pw->ptr == NULL && all[r].seg_size == 0 && p->host_hash == me->host_hash && p->pid_ns == me->pid_ns &&
        p->proc_id != me->proc_id) {
      pw->vm_pid = p->pid;
      pw->vm_addr = all[r].addr;
    }
  }
  return ncclSuccess;
}

/* On a communicator with an arena, the flat collectives read and write
 * the ranks' buffers in a window in place where every rank maps every
 * other's (exec/flat.c): a rank then skips copying its data into the
 * arena, so it must know that all can reach it, which only the others
 * know. They all-gather what each reached (`mine`: all of them). */
static ncclResult_t win_direct(struct ncclComm *comm, struct rma_win *w, int mine, int symmetric) {
  int n = comm->nranks;
  int32_t *ok;
  CHECK(UTIL_CALLOC(&ok, (size_t)n, "ncclCommWindowRegister"));
  ok[comm->rank] = mine;
  ncclResult_t r = bootstrap_allgather(comm->boot, ok, sizeof *ok);
  int all = r == ncclSuccess;
  for (int k = 0; k < n && all; k++)
    all = ok[k];
  free(ok);
  if (r != ncclSuccess) {
    err_context("ncclCommWindowRegister: agreeing whether every rank maps the window");
    return r;
  }
  if (!all) {
    INFO(LOG_SHM, "rank %d: window %llu is not mapped by every rank: flat collectives copy through the arena",
         comm->rank, (unsigned long long)w->id);
    return ncclSuccess;
  }
  struct comm_win *d = &w->direct;
  d->peer = calloc((size_t)n, sizeof *d->peer);
  d->peer_size = calloc((size_t)n, sizeof *d->peer_size);
  if (!d->peer || !d->peer_size) {
    free(d->peer);
    free(d->peer_size);
    d->peer = NULL;
    d->peer_size = NULL;
    /* The others take the window as direct: a later flat call with a
     * buffer in it fails on this rank, which does not know its id,
     * naming it (flat.c), instead of reading nothing. */
    return err_set(ncclSystemError, "ncclCommWindowRegister: out of memory");
  }
  for (int k = 0; k < n; k++) {
    d->peer[k] = w->peer[k].ptr;
    d->peer_size[k] = w->peer[k].size;
  }
  d->id = w->id;
  d->symmetric = symmetric;
  d->buff = w->buff;
  d->size = w->size;
  d->next = comm->direct_wins;
  comm->direct_wins = d;
  return ncclSuccess;
}

static ncclResult_t win_register(struct ncclComm *comm, void *buff, size_t size, ncclWindow_t *win, int flags) {
  const char *func = "ncclCommWindowRegister";
  CHECK(comm_check(comm, func));
  if (buff == NULL || win == NULL)
    return err_set(ncclInvalidArgument, "%s: %s is NULL", func, buff == NULL ? "buff" : "win");
  if (size == 0)
    return err_set(ncclInvalidArgument, "%s: size is 0", func);
  if (flags & ~(NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING))
    return err_set(ncclInvalidArgument, "%s: unknown flags 0x%x", func, flags);
  if (group_depth() > 0)
    return err_set(ncclInvalidUsage,
                   "%s inside ncclGroupStart/ncclGroupEnd is not implemented yet in Loom; register the window "
                   "outside a group, from one thread per rank",
                   func);
  CHECK(rma_state_get(comm, func));
  struct rma_state *st = comm->rma;
  struct seg_desc *all = calloc((size_t)comm->nranks, sizeof *all);
  struct rma_win *w = calloc(1, sizeof *w);
  if (!all || !w) {
    free(all);
    free(w);
    return err_set(ncclSystemError, "%s: out of memory", func);
  }
  int fd = -1;
  size_t offset = 0, seg_size = 0;
  if (!comm->is_host || !mem_find_shared(buff, size, &fd, &offset, &seg_size))
    fd = -1;
  seg_describe(&all[comm->rank], buff, size, fd, offset, seg_size);
  all[comm->rank].flags = flags;
  all[comm->rank].cuda_dev = comm->cuda_dev;
  void *base;
  if (!comm->is_host && mem_find_device(buff, size, &base, &offset) &&
      cuda_ipc_get(base, all[comm->rank].ipc) == ncclSuccess) {
    all[comm->rank].ipc_ok = 1;
    all[comm->rank].offset = offset;
  }
  ncclResult_t r = ncclSuccess;
  int remote = 0;
  for (int k = 0; k < comm->nranks; k++)
    remote |= rma_net_remote(comm, k);
  /* Every rank with a peer on another host serves them; each knows
   * before the all-gather which of its peers listen. */
  if (remote && (r = rma_net_start(comm, &all[comm->rank].rma_addr)) == ncclSuccess)
    all[comm->rank].rma_listen = 1;
  uint64_t id = ++st->win_seq;
  /* A rank whose service did not start still takes part in the
   * all-gather, which the others wait in, and fails after it. */
  ncclResult_t ra = bootstrap_allgather(comm->boot, all, sizeof *all);
  if (r == ncclSuccess)
    r = ra;
  if (ra != ncclSuccess) {
    err_context("%s: exchanging the windows' descriptions", func);
    comm_set_error(comm, ra);
  }
  for (int k = 0; r == ncclSuccess && k < comm->nranks; k++)
    if (all[k].rma_listen && rma_net_remote(comm, k))
      rma_net_peer(comm, k, &all[k].rma_addr);
  /* A symmetric window is one size everywhere: every rank sees every
   * size, so all refuse it together, whichever rank asked for it. */
  int sym = -1;
  for (int k = 0; r == ncclSuccess && k < comm->nranks; k++)
    if (all[k].flags & NCCL_WIN_COLL_SYMMETRIC)
      sym = k;
  for (int k = 0; r == ncclSuccess && sym >= 0 && k < comm->nranks; k++)
    if (all[k].size != all[sym].size)
      r = err_set(ncclInvalidUsage,
                  "%s: rank %d registers its window with NCCL_WIN_COLL_SYMMETRIC, but rank %d's window is %llu bytes "
                  "and rank %d's %llu: a symmetric window has one size on every rank. Nothing was registered",
                  func, sym, k, (unsigned long long)all[k].size, sym, (unsigned long long)all[sym].size);
  *w = (struct rma_win){.magic = RMA_WIN_MAGIC, .id = id, .comm = comm, .buff = buff, .size = size};
  if (r == ncclSuccess)
    r = win_connect(comm, w, all);
  if (ra == ncclSuccess && comm->arena && comm->is_host) {
    int mine = r == ncclSuccess;
    for (int k = 0; mine && k < comm->nranks; k++)
      mine = w->peer[k].ptr != NULL;
    ncclResult_t rd = win_direct(comm, w, mine, sym >= 0);
    if (r == ncclSuccess)
      r = rd;
  }
  free(all);
  pthread_mutex_lock(&st->lock);
  if (r == ncclSuccess) {
    w->next = st->wins;
    st->wins = w;
  }
  st->win_done = id;
  pthread_cond_broadcast(&st->win_cond);
  pthread_mutex_unlock(&st->lock);
  if (r != ncclSuccess) {
    win_free(comm, w);
    return r;
  }
  win_global(w, 1);
  *win = (ncclWindow_t)(void *)w;
  return ncclSuccess;
}

static ncclResult_t win_deregister(struct ncclComm *comm, ncclWindow_t win) {
  const char *func = "ncclCommWindowDeregister";
  CHECK(comm_check(comm, func));
  struct rma_win *w = NULL;
  CHECK(rma_win_lookup(comm, win, func, &w));
  if (group_depth() > 0)
    return err_set(ncclInvalidUsage,
                   "%s inside ncclGroupStart/ncclGroupEnd is not implemented yet in Loom; deregister the window "
                   "outside a group",
                   func);
  /* A CUDA communicator's puts are queued on streams, each followed by
   * its signal: once none of this rank's signals is pending, its puts
   * into any window are done. */
  uint64_t deadline = comm_deadline(comm);
  while (atomic_load(&comm->rma->pending) > 0) {
    if (comm_aborted(comm))
      return err_set(ncclInvalidUsage, "%s: the communicator was aborted", func);
    if (time_ns() > deadline) {
      char bound[TIMEOUT_NAME_LEN];
      return err_set(ncclRemoteError,
                     "%s: rank %d timed out after %s waiting for its one-sided operations queued on streams (is a "
                     "stream stuck?); the window stays registered",
                     func, comm->rank, comm_timeout_name(comm, bound, sizeof bound));
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  /* Collective, as its registration: no peer puts into the window once
   * any rank has returned from here. */
  ncclResult_t r = bootstrap_barrier(comm->boot, func);
  if (r != ncclSuccess) {
    err_context("%s: waiting for the other ranks", func);
    comm_set_error(comm, r);
  }
  /* Once out of the list, the service writes no more into it. */
  pthread_mutex_lock(&comm->rma->lock);
  for (struct rma_win **p = &comm->rma->wins; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  pthread_mutex_unlock(&comm->rma->lock);
  win_free(comm, w);
  return r;
}

/* Registration and deregistration run between comm_enter and
 * comm_leave: ncclCommAbort from another thread waits for them. The
 * sentence is written before leaving, while no other thread may enter. */
NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
         int winFlags) {
  ncclResult_t r = comm_enter(comm, "ncclCommWindowRegister");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  r = api_finish(comm, win_register(comm, buff, size, win, winFlags));
  comm_leave(comm);
  return r;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win) {
  ncclResult_t r = comm_enter(comm, "ncclCommWindowDeregister");
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  r = api_finish(comm, win_deregister(comm, win));
  comm_leave(comm);
  return r;
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  ncclResult_t r = comm_check(comm, "ncclWinGetUserPtr");
  struct rma_win *w = NULL;
  if (r == ncclSuccess && outUserPtr == NULL)
    r = err_set(ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL");
  if (r == ncclSuccess)
    r = rma_win_lookup(comm, win, "ncclWinGetUserPtr", &w);
  if (r == ncclSuccess)
    *outUserPtr = w->buff;
  return api_finish(comm, r);
}
