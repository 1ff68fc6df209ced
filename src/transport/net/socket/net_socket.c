/*
 * The socket plugin: TCP between hosts, NCCL's socket transport in shape.
 * Each connection is a control socket plus NCCL_SOCKET_NTHREADS x
 * NCCL_NSOCKS_PERTHREAD data sockets; small messages travel whole on the
 * control socket, moved by the caller of test(), and large ones are split
 * across the data sockets and moved by helper threads (net_socket.h has
 * the rules, net_socket_stream.c the control stream, net_socket_thread.c
 * the threads). Every message starts with its 64-bit length, so the
 * receiver refuses one larger than the buffer it posted, and knows how
 * the sender cut it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/socket/net_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* tcpi_bytes_acked, which glibc's struct tcp_info lacks */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char handle_magic[8] = "LOOMSK2";

_Static_assert(sizeof(struct sock_handle) <= NET_HANDLE_MAXSIZE, "socket handle too large");

/* An accepted TCP connection whose hello is still arriving. */
struct sock_greet {
  int fd;
  uint64_t until;
  size_t got;
  struct sock_hello h;
  char from[SOCK_ADDR_STRLEN];
};

/* Connections a listener reads hellos from at once; past that the oldest
 * silent one makes room, so a flood cannot lock the real peer out. */
#define SOCK_MAX_GREET 256
/* A connector sends its hello the moment its connect completes; one that
 * has not within this time is not a connector of this job. */
#define SOCK_GREET_NS 5000000000ull

struct sock_listen {
  int fd;
  uint64_t cookie;
  char where[SOCK_ADDR_STRLEN];
  int nsocks, nthreads;
  size_t min_task;
  struct sock_greet greet[SOCK_MAX_GREET];
  int ngreet;
  struct sock_comm **partial; /* connections with some of their sockets in */
  int npartial, partial_cap;
};

static struct sock_iface ifaces[SOCK_MAX_IFACES];
static int nifaces = -1;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

/* NCCL's documented defaults for NCCL_SOCKET_NTHREADS x
 * NCCL_NSOCKS_PERTHREAD: 2 x 8 on AWS's ENA (PCI vendor 0x1d0f), 4 x 1 on
 * Google's gVNIC (0x1ae0), else 1 x 1; the product is capped at 64, as
 * NCCL does. Loom's one change: with neither variable set, off those
 * clouds, a process that may run on fewer than 4 CPUs gets no helpers.
 * There the helpers only take turns with the callers for the same cores,
 * and each handoff costs two wakeups: on a 2-CPU VM over loopback a
 * 64 MiB AllReduce ran at 3.2 GB/s with none and 1.2-1.7 GB/s with 1 to
 * 4 (perf/README.md). NCCL's own code has no helpers off the clouds. */
static void socket_shape(const char *ifname, int *nthreads, int *nspt) {
  int nt = (int)param_int(P_SOCKET_NTHREADS), ns = (int)param_int(P_NSOCKS_PERTHREAD);
  if (nt < 0 || ns < 0) {
    int auto_nt = 1, auto_ns = 1, cloud = 1;
    char path[128], vendor[16] = "";
    snprintf(path, sizeof path, "/sys/class/net/%.32s/device/vendor", ifname);
    FILE *f = fopen(path, "r");
    if (f) {
      if (!fgets(vendor, sizeof vendor, f))
        vendor[0] = '\0';
      fclose(f);
    }
    if (strncmp(vendor, "0x1d0f", 6) == 0) {
      auto_nt = 2;
      auto_ns = 8;
    } else if (strncmp(vendor, "0x1ae0", 6) == 0) {
      auto_nt = 4;
    } else {
      cloud = 0;
    }
    cpu_set_t cpus;
    int ncpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    if (!cloud && nt < 0 && ns < 0 && ncpus < 4)
      auto_nt = 0;
    nt = nt < 0 ? auto_nt : nt;
    ns = ns < 0 ? auto_ns : ns;
  }
  if (nt > 0 && nt * ns > SOCK_MAX_SOCKS) {
    static _Atomic int warned;
    if (!atomic_exchange(&warned, 1))
      WARN("NET/Socket: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = %d x %d is more than the %d sockets a "
           "connection can have; using %d sockets per thread",
           nt, ns, SOCK_MAX_SOCKS, SOCK_MAX_SOCKS / nt);
    ns = SOCK_MAX_SOCKS / nt;
  }
  if (nt == 0 || ns == 0)
    nt = ns = 0;
  *nthreads = nt;
  *nspt = ns;
}

static ncclResult_t sock_init(void) {
  pthread_mutex_lock(&init_lock);
  ncclResult_t r = ncclSuccess;
  if (nifaces < 0) {
    int n = 0;
    char why[300] = "";
    r = sock_find_interfaces_why(ifaces, SOCK_MAX_IFACES, &n, why, sizeof why);
    if (r == ncclSuccess) {
      nifaces = n;
      char list[512];
      size_t o = 0;
      for (int i = 0; i < n && o < sizeof list - 80; i++) {
        char a[SOCK_ADDR_STRLEN];
        sock_addr_str(&ifaces[i].addr, a, sizeof a);
        char *port = strrchr(a, ':'); /* an interface's address has none */
        if (port)
          *port = '\0';
        o += snprintf(list + o, sizeof list - o, "%s[%d]%s:%s", i ? " " : "", i, ifaces[i].name, a);
      }
      INFO(LOG_NET | LOG_INIT, "NET/Socket: using %s (%s)", list, why);
      int nt, ns;
      socket_shape(ifaces[0].name, &nt, &ns);
      if (nt > 0)
        INFO(LOG_NET | LOG_INIT,
             "NET/Socket: %d helper thread(s) x %d socket(s) per connection; messages above %lld bytes are "
             "split across them (NCCL_SOCKET_MIN_TASKSIZE)",
             nt, ns, (long long)param_int(P_SOCKET_MIN_TASKSIZE));
      else
        INFO(LOG_NET | LOG_INIT,
             "NET/Socket: no helper threads (%s); every message travels on one socket per connection, moved "
             "by the caller",
             param_is_set(P_SOCKET_NTHREADS) || param_is_set(P_NSOCKS_PERTHREAD)
                 ? "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD is 0"
                 : "default where the process may run on fewer than 4 CPUs");
    }
  }
  pthread_mutex_unlock(&init_lock);
  return r;
}

static ncclResult_t sock_devices(int *ndev) {
  CHECK(sock_init());
  *ndev = nifaces;
  return ncclSuccess;
}

static ncclResult_t sock_get_properties(int dev, struct net_props *props) {
  CHECK(sock_init());
  if (dev < 0 || dev >= nifaces)
    return err_set(ncclInternalError, "socket plugin: no device %d (there are %d)", dev, nifaces);
  memset(props, 0, sizeof *props);
  snprintf(props->name, sizeof props->name, "%s", ifaces[dev].name);
  char path[128], buf[32] = "";
  snprintf(path, sizeof path, "/sys/class/net/%s/speed", ifaces[dev].name);
  FILE *f = fopen(path, "r");
  if (f) {
    if (fgets(buf, sizeof buf, f))
      props->speed_mbps = atoi(buf);
    fclose(f);
  }
  if (props->speed_mbps <= 0)
    props->speed_mbps = 10000; /* loopback and virtual links report nothing useful */
  snprintf(path, sizeof path, "/sys/class/net/%s/device", ifaces[dev].name);
  char real[PATH_MAX];
  if (realpath(path, real) && strlen(real) < sizeof props->pci_path) /* virtual interfaces have none */
    memcpy(props->pci_path, real, strlen(real) + 1);
  props->ptr_support = NET_PTR_HOST;
  props->port = 1;
  return ncclSuccess;
}

static ncclResult_t report(struct sock_comm *c) {
  return err_set((ncclResult_t)atomic_load(&c->failed), "%s", c->why);
}

static ncclResult_t comm_new(struct sock_comm **out, int nsocks, int nthreads, size_t min_task) {
  struct sock_comm *c;
  CHECK(UTIL_CALLOC(&c, 1, "socket connection"));
  c->fd = -1;
  c->nsocks = nsocks;
  c->nthreads = nthreads;
  c->min_task = min_task;
  for (int i = 0; i < SOCK_MAX_SOCKS; i++)
    c->socks[i].fd = -1;
  for (int i = 0; i < SOCK_MAX_THREADS; i++) {
    c->helpers[i].index = i;
    c->helpers[i].efd = -1;
  }
  pthread_mutex_init(&c->fail_lock, NULL);
  *out = c;
  return ncclSuccess;
}

static int *link_fd(struct sock_comm *c, int i) { return i == c->nsocks ? &c->fd : &c->socks[i].fd; }

static ncclResult_t sock_close(void *comm) {
  struct sock_comm *c = comm;
  if (!c)
    return ncclSuccess;
  sock_helpers_stop(c); /* before the fds: the helpers use them */
  /* A shared socket stays open while the other direction's comm has it:
   * the end of this direction is what the peer's receive comm must see,
   * as it would see the close of a socket of its own. */
  if (c->fd >= 0 && c->shared && c->is_send)
    shutdown(c->fd, SHUT_WR);
  if (c->fd >= 0)
    close(c->fd);
  for (int i = 0; i < c->nsocks; i++)
    if (c->socks[i].fd >= 0)
      close(c->socks[i].fd);
  pthread_mutex_destroy(&c->fail_lock);
  free(c);
  return ncclSuccess;
}

static ncclResult_t sock_listen_dev(int dev, void *handle, void **listen_comm) {
  CHECK(sock_init());
  if (dev < 0 || dev >= nifaces)
    return err_set(ncclInternalError, "socket plugin: no device %d", dev);
  struct sock_listen *l;
  CHECK(UTIL_CALLOC(&l, 1, "socket listener"));
  union sock_addr bind_addr = ifaces[dev].addr, bound;
  if (bind_addr.sa.sa_family == AF_INET)
    bind_addr.sin.sin_port = 0;
  else
    bind_addr.sin6.sin6_port = 0;
  ncclResult_t r = sock_listen(&bind_addr, &l->fd, &bound);
  if (r != ncclSuccess) {
    free(l);
    return r;
  }
  sock_set_nonblocking(l->fd);
  r = util_random(&l->cookie, sizeof l->cookie);
  if (r != ncclSuccess) {
    close(l->fd);
    free(l);
    return r;
  }
  /* Read at each listen, as NCCL does: the receiving side decides. */
  int nspt;
  socket_shape(ifaces[dev].name, &l->nthreads, &nspt);
  l->nsocks = l->nthreads * nspt;
  l->min_task = (size_t)param_int(P_SOCKET_MIN_TASKSIZE);
  sock_addr_str(&bound, l->where, sizeof l->where);
  INFO(LOG_NET, "NET/Socket: listening on %s for a connection of %d data socket(s)", l->where, l->nsocks);
  struct sock_handle h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, handle_magic, sizeof h.magic);
  h.addr = bound;
  h.cookie = l->cookie;
  h.nsocks = (uint32_t)l->nsocks;
  h.nthreads = (uint32_t)l->nthreads;
  h.min_task = l->min_task;
  memcpy(handle, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

/* Whether both ends of a connected socket are this host: the same
 * address, or a loopback one. */
static int same_host(int fd) {
  union sock_addr me, peer;
  socklen_t lm = sizeof me, lp = sizeof peer;
  if (getsockname(fd, &me.sa, &lm) != 0 || getpeername(fd, &peer.sa, &lp) != 0 ||
      me.sa.sa_family != peer.sa.sa_family)
    return 0;
  if (peer.sa.sa_family == AF_INET)
    return me.sin.sin_addr.s_addr == peer.sin.sin_addr.s_addr || (ntohl(peer.sin.sin_addr.s_addr) >> 24) == 127;
  if (peer.sa.sa_family == AF_INET6)
    return memcmp(&me.sin6.sin6_addr, &peer.sin6.sin6_addr, sizeof me.sin6.sin6_addr) == 0 ||
           IN6_IS_ADDR_LOOPBACK(&peer.sin6.sin6_addr);
  return 0;
}

/* A connection within this host has no link to share or probe: the
 * kernel hands each segment to the receiving socket as it is sent. A
 * pacing congestion control (BBR, many distributions' default) still
 * spaces the segments out by its bandwidth estimate, with a timer: 2
 * processes over loopback, AllReduce 64 MiB took 40 ms with BBR and 28 ms
 * with Reno, 1 MiB on 4 ranks 2.1 ms against 1.0 ms. Such connections use
 * Reno, which every kernel has and lets any process choose; on failure
 * they keep the default. Connections to other hosts keep the system's
 * choice. */
static void same_host_cc(int fd) {
  static _Atomic int said;
  if (!same_host(fd))
    return;
  static const char cc[] = "reno";
  int ok = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, sizeof cc - 1) == 0;
  int e = errno;
  if (!atomic_exchange(&said, 1)) {
    if (ok)
      INFO(LOG_NET, "NET/Socket: connections within this host use TCP congestion control %s (no pacing)", cc);
    else
      INFO(LOG_NET, "NET/Socket: connections within this host keep the default congestion control: %s", strerror(e));
  }
}

/* Advances TCP connection i of a connecting comm; 1 once it is up. A
 * socket closed before the listener's answer is back in state 0. */
static ncclResult_t dial_step(struct sock_comm *c, int i, int *up) {
  int *fd = link_fd(c, i);
  ssize_t n = 0; /* the last send or recv, for the reason of a redial */
  *up = 0;
  switch (c->link_state[i]) {
  case 0:
    *fd = socket(c->peer.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (*fd < 0)
      return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
    sock_set_nodelay(*fd);
    if (connect(*fd, &c->peer.sa, sock_addr_len(&c->peer)) == 0)
      c->link_state[i] = 2;
    else if (errno == EINPROGRESS)
      c->link_state[i] = 1;
    else
      return err_set(ncclRemoteError, "cannot connect to %s: %s", c->where, strerror(errno));
    return ncclSuccess;
  case 1: {
    struct pollfd p = {.fd = *fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0)
      return ncclSuccess;
    int e = 0;
    socklen_t len = sizeof e;
    getsockopt(*fd, SOL_SOCKET, SO_ERROR, &e, &len);
    if (e != 0)
      return err_set(ncclRemoteError, "cannot connect to %s: %s", c->where, strerror(e));
    c->link_state[i] = 2;
  }
    /* fall through */
  case 2: {
    if (c->link_sent[i] == 0)
      same_host_cc(*fd);
    struct sock_hello h = {.cookie = c->cookie, .conn_id = c->conn_id, .index = (uint32_t)i,
                           .nsocks = (uint32_t)c->nsocks};
    while (c->link_sent[i] < sizeof h) {
      n = send(*fd, (char *)&h + c->link_sent[i], sizeof h - c->link_sent[i], MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c->link_sent[i] += (uint8_t)n;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ncclSuccess;
      goto redial; /* closed unread by a listener that had too many */
    }
    c->link_state[i] = 3;
  }
    /* fall through */
  case 3: {
    /* Sent is not received: a listener flooded by strangers may close
     * this socket unread. Only its answer says the hello was filed; an
     * end instead of one means dial again. */
    unsigned char a;
    n = recv(*fd, &a, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return ncclSuccess;
    if (n == 1 && a != SOCK_ANSWER)
      return err_set(ncclRemoteError, "%s answered socket %d's hello with byte 0x%02x, not a Loom socket listener's",
                     c->where, i, a);
    if (n != 1)
      goto redial;
    c->link_state[i] = 4;
    *up = 1;
  }
  }
  return ncclSuccess;
redial:
  INFO(LOG_NET, "NET/Socket: socket %d to %s %s before the listener answered its hello; dialing again", i, c->where,
       sock_broken_reason(n, errno));
  close(*fd);
  *fd = -1;
  c->link_sent[i] = 0;
  c->link_state[i] = 0;
  return ncclSuccess;
}

/* A socket the listener closed unread is dialed again at once, once per
 * call, so that a listener that closes everything cannot keep the caller
 * here. */
static ncclResult_t dial_link(struct sock_comm *c, int i, int *up) {
  CHECK(dial_step(c, i, up));
  return c->link_state[i] == 0 ? dial_step(c, i, up) : ncclSuccess;
}

ncclResult_t sock_handle_decode(const void *handle, size_t len, struct sock_handle *out) {
  if (len < sizeof *out)
    return err_set(ncclInternalError, "socket plugin: the connection handle has %zu bytes, not %zu", len,
                   sizeof *out);
  memcpy(out, handle, sizeof *out);
  if (memcmp(out->magic, handle_magic, sizeof out->magic) != 0)
    return err_set(ncclInternalError, "socket plugin: the connection handle is not a socket handle");
  if (out->nsocks > SOCK_MAX_SOCKS || out->nthreads > SOCK_MAX_THREADS || (out->nsocks && !out->nthreads) ||
      !out->min_task)
    return err_set(ncclInternalError,
                   "socket plugin: the connection handle asks for %u sockets, %u threads and %llu-byte tasks",
                   out->nsocks, out->nthreads, (unsigned long long)out->min_task);
  if (out->addr.sa.sa_family != AF_INET && out->addr.sa.sa_family != AF_INET6)
    return err_set(ncclInternalError, "socket plugin: the connection handle's address is of family %d",
                   out->addr.sa.sa_family);
  return ncclSuccess;
}

int sock_hello_ok(const struct sock_hello *h, uint64_t cookie, int nsocks) {
  return h->cookie == cookie && h->nsocks == (uint32_t)nsocks && h->index <= (uint32_t)nsocks;
}

static ncclResult_t sock_connect_dev(int dev, const void *handle, void **send_comm) {
  struct sock_comm *c = *send_comm;
  if (c == NULL) {
    struct sock_handle h;
    CHECK(sock_handle_decode(handle, NET_HANDLE_MAXSIZE, &h));
    CHECK(comm_new(&c, (int)h.nsocks, (int)h.nthreads, (size_t)h.min_task));
    c->is_send = 1;
    c->peer = h.addr;
    c->cookie = h.cookie;
    sock_addr_str(&h.addr, c->where, sizeof c->where);
    ncclResult_t r = util_random(&c->conn_id, sizeof c->conn_id);
    if (r != ncclSuccess) {
      sock_close(c);
      return r;
    }
    *send_comm = c;
  }
  for (int i = 0; i <= c->nsocks; i++) {
    if (c->link_state[i] == 4)
      continue;
    int up;
    CHECK(dial_link(c, i, &up));
    c->nlinks_up += up;
  }
  return c->nlinks_up == c->nsocks + 1 ? ncclSuccess : ncclInProgress;
}

static void greet_drop(struct sock_listen *l, int k) {
  close(l->greet[k].fd);
  l->greet[k] = l->greet[--l->ngreet];
}

/* Files a complete hello's socket under its connection; the connection,
 * once all its sockets are in, goes to *done. */
static ncclResult_t greet_file(struct sock_listen *l, int k, struct sock_comm **done) {
  struct sock_greet *g = &l->greet[k];
  if (!sock_hello_ok(&g->h, l->cookie, l->nsocks)) {
    /* Somebody else's connection: drop it and keep waiting for ours. */
    WARN("NET/Socket: dropped a connection to %s from %s that did not present the expected cookie", l->where,
         g->from);
    greet_drop(l, k);
    return ncclSuccess;
  }
  struct sock_comm *c = NULL;
  int p = 0;
  for (; p < l->npartial; p++)
    if (l->partial[p]->conn_id == g->h.conn_id) {
      c = l->partial[p];
      break;
    }
  if (!c) {
    if (l->npartial == l->partial_cap) {
      int cap = l->partial_cap ? 2 * l->partial_cap : 4;
      struct sock_comm **np = realloc(l->partial, (size_t)cap * sizeof *np);
      if (!np)
        return err_set(ncclSystemError, "out of memory for socket connections being accepted");
      l->partial = np;
      l->partial_cap = cap;
    }
    CHECK(comm_new(&c, l->nsocks, l->nthreads, l->min_task));
    c->conn_id = g->h.conn_id;
    c->cookie = l->cookie;
    l->partial[l->npartial++] = c;
  }
  int *fd = link_fd(c, (int)g->h.index);
  if (*fd >= 0) {
    WARN("NET/Socket: dropped a second socket %u of one connection to %s from %s", g->h.index, l->where, g->from);
    greet_drop(l, k);
    return ncclSuccess;
  }
  /* The answer tells the connector its socket is filed; a fresh
   * socket's buffer has room for the byte, so a failed send means the
   * connection is gone and its connector dials again. */
  static const unsigned char answer = SOCK_ANSWER;
  if (send(g->fd, &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
    INFO(LOG_NET, "NET/Socket: could not answer the hello of socket %u from %s: %s", g->h.index, g->from,
         strerror(errno));
    greet_drop(l, k);
    return ncclSuccess;
  }
  *fd = g->fd;
  if ((int)g->h.index == l->nsocks)
    snprintf(c->where, sizeof c->where, "%s", g->from);
  l->greet[k] = l->greet[--l->ngreet];
  if (++c->nlinks_up == l->nsocks + 1) {
    l->partial[p] = l->partial[--l->npartial];
    *done = c;
  }
  return ncclSuccess;
}

/* Reads what greeting k has sent and files it once whole; a connection
 * that ends or falls silent goes. */
static ncclResult_t greet_read(struct sock_listen *l, int k, uint64_t now, struct sock_comm **done) {
  struct sock_greet *g = &l->greet[k];
  ssize_t n = recv(g->fd, (char *)&g->h + g->got, sizeof g->h - g->got, MSG_DONTWAIT);
  if (n > 0) {
    g->got += (size_t)n;
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    greet_drop(l, k); /* a connector that gave up, or a stranger */
    return ncclSuccess;
  }
  if (g->got < sizeof g->h) {
    if (now >= g->until) {
      WARN("NET/Socket: dropped a connection to %s from %s that sent %zu of the %zu bytes of a hello in %llu s",
           l->where, g->from, g->got, sizeof g->h, (unsigned long long)(SOCK_GREET_NS / 1000000000ull));
      greet_drop(l, k);
    }
    return ncclSuccess;
  }
  return greet_file(l, k, done);
}

static ncclResult_t sock_accept_conn(void *listen_comm, void **recv_comm) {
  struct sock_listen *l = listen_comm;
  *recv_comm = NULL;
  struct sock_comm *done = NULL;
  uint64_t now = time_ns();
  /* Hellos already here first: reading one may remove it (the last entry
   * fills its place), so walk backwards. */
  for (int k = l->ngreet - 1; k >= 0 && !done; k--)
    CHECK(greet_read(l, k, now, &done));
  while (!done) {
    union sock_addr from;
    socklen_t alen = sizeof from;
    int fd = accept4(l->fd, &from.sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        break;
      return err_set(ncclSystemError, "accept on %s failed: %s", l->where, strerror(errno));
    }
    if (l->ngreet == SOCK_MAX_GREET) {
      int victim = 0;
      for (int k = 1; k < l->ngreet; k++)
        if (l->greet[k].got < l->greet[victim].got ||
            (l->greet[k].got == l->greet[victim].got && l->greet[k].until < l->greet[victim].until))
          victim = k;
      WARN("NET/Socket: dropped a connection to %s from %s that had sent %zu bytes of a hello when %d more "
           "were waiting",
           l->where, l->greet[victim].from, l->greet[victim].got, SOCK_MAX_GREET);
      greet_drop(l, victim);
    }
    sock_set_nodelay(fd);
    same_host_cc(fd);
    struct sock_greet *g = &l->greet[l->ngreet++];
    memset(g, 0, sizeof *g);
    g->fd = fd;
    /* Read afresh, so that of the silent ones the victim is the first
     * accepted, not whichever came first in the table. */
    g->until = time_ns() + SOCK_GREET_NS;
    sock_addr_str(&from, g->from, sizeof g->from);
    /* A connector sends its hello as soon as it is connected. */
    CHECK(greet_read(l, l->ngreet - 1, now, &done));
  }
  if (done) {
    *recv_comm = done;
    return ncclSuccess;
  }
  return ncclInProgress;
}

static ncclResult_t sock_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  *mhandle = NULL; /* sockets need no registration */
  if (type != NET_PTR_HOST)
    return err_set(ncclInternalError, "NET/Socket moves host memory only");
  return ncclSuccess;
}

static ncclResult_t sock_dereg_mr(void *comm, void *mhandle) { return ncclSuccess; }

/* Posting works on a failed comm too: test() fails what the failure left
 * unfinished, which is only known there. */
static ncclResult_t post(struct sock_comm *c, int is_send, void *data, size_t size, void **request) {
  if (c->tail - c->head >= SOCK_MAX_REQS) {
    *request = NULL;
    return ncclSuccess;
  }
  struct sock_req *r = &c->reqs[c->tail % SOCK_MAX_REQS];
  r->comm = c;
  r->used = 1;
  r->is_send = is_send;
  r->ctrl_done = 0;
  r->data = data;
  r->size = size;
  r->len = is_send ? (uint64_t)size : 0;
  r->hdr_done = 0;
  r->moved = 0;
  atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
  c->tail++;
  /* The helpers can start on a large send at once; its length follows on
   * the control socket in order. */
  if (is_send && sock_is_large(c, size) && atomic_load(&c->failed) == ncclSuccess && sock_dispatch(c, r) != ncclSuccess)
    return report(c);
  *request = r;
  return ncclSuccess;
}

static ncclResult_t sock_isend(void *send_comm, void *data, size_t size, void *mhandle, void **request) {
  return post(send_comm, 1, data, size, request);
}

static ncclResult_t sock_irecv(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  return post(recv_comm, 0, data, size, request);
}

/* What the kernel moved counts too: a sender whose last bytes sit in
 * its socket buffer sees them acknowledged, a receiver sees them arrive
 * before it reads, both as TCP's retransmissions get through a lossy
 * link. Only this comm's direction: on a shared socket (sock_duplex) the
 * other direction moving says nothing of a peer stalled on this one. */
static uint64_t tcp_moved(int fd, int is_send) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
    return 0;
  return is_send ? ti.tcpi_bytes_acked : ti.tcpi_bytes_received; /* 0 on kernels before 4.1 */
}

static uint64_t sock_activity(void *comm) {
  struct sock_comm *c = comm;
  uint64_t a = atomic_load_explicit(&c->moved, memory_order_relaxed) + tcp_moved(c->fd, c->is_send);
  for (int s = 0; s < c->nsocks; s++)
    a += tcp_moved(c->socks[s].fd, c->is_send);
  return a;
}

/* A socket's pending error (SO_ERROR, which reading it clears: the comm
 * keeps it). An orderly end sets none, so a peer that read everything
 * and closed is not reported. */
static ncclResult_t sock_probe_errors(void *comm) {
  struct sock_comm *c = comm;
  for (int s = -1; s < c->nsocks && atomic_load(&c->failed) == ncclSuccess; s++) {
    int fd = s < 0 ? c->fd : c->socks[s].fd, e = 0;
    socklen_t len = sizeof e;
    if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e != 0) {
      sock_comm_fail(c, ncclRemoteError, "the connection with %s %s", c->where, sock_broken_reason(-1, e));
      return report(c);
    }
  }
  return ncclSuccess;
}

static int req_finished(struct sock_req *r) {
  return r->ctrl_done && atomic_load_explicit(&r->pending, memory_order_acquire) == 0;
}

static ncclResult_t sock_test(void *request, int *done, size_t *size) {
  struct sock_req *r = request;
  struct sock_comm *c = r->comm;
  *done = 0;
  /* A failure (typically the peer closing after its last message) only
   * matters to requests it left unfinished: receives are posted ahead of
   * the data, and the end of the stream may follow the last one. The end
   * of the control stream may even come while the last chunks are still
   * arriving on the data sockets: those requests fail only if a data
   * socket breaks. */
  int finished = req_finished(r);
  if (!finished && atomic_load(&c->failed) == ncclSuccess) {
    sock_progress(c);
    finished = req_finished(r);
  }
  if (!finished) {
    if (atomic_load(&c->failed) != ncclSuccess && (!r->ctrl_done || atomic_load(&c->helper_failed)))
      return report(c);
    return ncclSuccess;
  }
  *done = 1;
  if (size)
    *size = (size_t)r->len;
  r->used = 0;
  while (c->head != c->tail && !c->reqs[c->head % SOCK_MAX_REQS].used)
    c->head++;
  return ncclSuccess;
}

/* The other direction of a connection that has no data sockets, on a
 * duplicate of its descriptor: TCP moves the two directions of a socket
 * apart, and each comm reads or writes only its own. A connection with
 * data sockets is not shared (the helpers' queues are per direction);
 * both its sides have the shape the listener chose, so both refuse. */
static ncclResult_t sock_duplex(void *comm, void **other) {
  struct sock_comm *c = comm;
  *other = NULL;
  if (c->nsocks > 0 || c->fd < 0)
    return ncclSuccess;
  int fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return err_set(ncclSystemError, "could not share the socket of the connection with %s: %s", c->where,
                   strerror(errno));
  struct sock_comm *d;
  ncclResult_t r = comm_new(&d, 0, 0, c->min_task);
  if (r != ncclSuccess) {
    close(fd);
    return r;
  }
  d->fd = fd;
  d->is_send = !c->is_send;
  d->peer = c->peer;
  d->cookie = c->cookie;
  d->conn_id = c->conn_id;
  d->link_state[0] = 4;
  d->nlinks_up = 1;
  memcpy(d->where, c->where, sizeof d->where);
  c->shared = d->shared = 1;
  *other = d;
  return ncclSuccess;
}

static ncclResult_t sock_close_listen(void *listen_comm) {
  struct sock_listen *l = listen_comm;
  if (l) {
    close(l->fd);
    while (l->ngreet > 0)
      greet_drop(l, 0);
    for (int p = 0; p < l->npartial; p++)
      sock_close(l->partial[p]);
    free(l->partial);
    free(l);
  }
  return ncclSuccess;
}

const struct net_plugin net_socket_plugin = {
    .name = "Socket",
    .init = sock_init,
    .devices = sock_devices,
    .get_properties = sock_get_properties,
    .listen = sock_listen_dev,
    .connect = sock_connect_dev,
    .accept = sock_accept_conn,
    .reg_mr = sock_reg_mr,
    .reg_mr_dmabuf = net_no_reg_mr_dmabuf,
    .dereg_mr = sock_dereg_mr,
    .isend = sock_isend,
    .irecv = sock_irecv,
    .test = sock_test,
    .iflush = net_no_iflush,
    .activity = sock_activity,
    .probe = sock_probe_errors,
    .duplex = sock_duplex,
    .poll_fds = sock_poll_fds,
    .close_send = sock_close,
    .close_recv = sock_close,
    .close_listen = sock_close_listen,
};
