/*
 * The socket plugin: TCP between hosts. One socket per connection; each
 * message is a 64-bit length followed by the payload, so the receiver can
 * refuse a message larger than the buffer it posted.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SOCK_MAX_REQS (2 * NCCL_STEPS)

static const char handle_magic[8] = "LOOMSK1";

struct sock_handle {
  char magic[8];
  union sock_addr addr;
  uint64_t cookie; /* the connector must present it */
};
_Static_assert(sizeof(struct sock_handle) <= NET_HANDLE_MAXSIZE, "socket handle too large");

struct sock_listen {
  int fd;
  uint64_t cookie;
  char where[SOCK_ADDR_STRLEN];
};

struct sock_comm;

struct sock_req {
  struct sock_comm *comm;
  int used, done, is_send;
  char *data;
  size_t size;     /* posted size (recv) or message size (send) */
  uint64_t len;    /* the length word on the wire */
  size_t hdr_done; /* bytes of the length word moved */
  size_t moved;    /* payload bytes moved */
};

struct sock_comm {
  int fd;
  int state; /* connecting: 0 socket, 1 in progress, 2 greeting, 3 ready */
  uint64_t cookie;
  size_t hello_done;
  union sock_addr peer;
  char where[SOCK_ADDR_STRLEN];
  struct sock_listen *listen; /* accepting side: where it came from */
  struct sock_req reqs[SOCK_MAX_REQS];
  unsigned head, tail; /* requests in flight: [head, tail) */
  ncclResult_t failed;
  char why[256];
};

static struct sock_iface ifaces[SOCK_MAX_IFACES];
static int nifaces = -1;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t sock_init(void) {
  pthread_mutex_lock(&init_lock);
  ncclResult_t r = ncclSuccess;
  if (nifaces < 0) {
    int n = 0;
    r = sock_find_interfaces(ifaces, SOCK_MAX_IFACES, &n);
    if (r == ncclSuccess) {
      nifaces = n;
      char list[512];
      size_t o = 0;
      for (int i = 0; i < n && o < sizeof list - 80; i++) {
        char a[SOCK_ADDR_STRLEN];
        o += snprintf(list + o, sizeof list - o, "%s[%d]%s:%s", i ? " " : "", i, ifaces[i].name,
                      sock_addr_str(&ifaces[i].addr, a, sizeof a));
      }
      INFO(LOG_NET | LOG_INIT, "NET/Socket: using %s", list);
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
  props->port = 1;
  props->max_comms = 65536;
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
  sock_addr_str(&bound, l->where, sizeof l->where);
  struct sock_handle h = {0};
  memcpy(h.magic, handle_magic, sizeof h.magic);
  h.addr = bound;
  h.cookie = l->cookie;
  memcpy(handle, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

static ncclResult_t comm_fail(struct sock_comm *c, ncclResult_t r) {
  c->failed = r;
  snprintf(c->why, sizeof c->why, "%s", err_thread_last());
  return r;
}

/* Moves bytes of the greeting; 1 when all of it has gone or come. */
static ncclResult_t move_hello(struct sock_comm *c, int sending, int *complete) {
  char *p = (char *)&c->cookie;
  while (c->hello_done < sizeof c->cookie) {
    ssize_t n = sending ? send(c->fd, p + c->hello_done, sizeof c->cookie - c->hello_done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->fd, p + c->hello_done, sizeof c->cookie - c->hello_done, MSG_DONTWAIT);
    if (n > 0) {
      c->hello_done += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      *complete = 0;
      return ncclSuccess;
    }
    return err_set(ncclRemoteError, "the connection with %s broke while greeting: %s", c->where,
                   n == 0 ? "closed by the peer" : strerror(errno));
  }
  *complete = 1;
  return ncclSuccess;
}

static ncclResult_t sock_connect_dev(int dev, const void *handle, void **send_comm) {
  struct sock_handle h;
  memcpy(&h, handle, sizeof h);
  struct sock_comm *c = *send_comm;
  if (c == NULL) {
    if (memcmp(h.magic, handle_magic, sizeof h.magic) != 0)
      return err_set(ncclInternalError, "socket plugin: the connection handle is not a socket handle");
    CHECK(UTIL_CALLOC(&c, 1, "socket connection"));
    c->fd = -1;
    c->peer = h.addr;
    c->cookie = h.cookie;
    sock_addr_str(&h.addr, c->where, sizeof c->where);
    *send_comm = c;
  }
  if (c->state == 0) {
    c->fd = socket(c->peer.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
      return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
    sock_set_nodelay(c->fd);
    if (connect(c->fd, &c->peer.sa, sock_addr_len(&c->peer)) == 0)
      c->state = 2;
    else if (errno == EINPROGRESS)
      c->state = 1;
    else
      return err_set(ncclRemoteError, "cannot connect to %s: %s", c->where, strerror(errno));
  }
  if (c->state == 1) {
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0)
      return ncclInProgress;
    int e = 0;
    socklen_t len = sizeof e;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len);
    if (e != 0)
      return err_set(ncclRemoteError, "cannot connect to %s: %s", c->where, strerror(e));
    c->state = 2;
  }
  if (c->state == 2) {
    int complete;
    CHECK(move_hello(c, 1, &complete));
    if (!complete)
      return ncclInProgress;
    c->state = 3;
  }
  return ncclSuccess;
}

static ncclResult_t sock_accept_conn(void *listen_comm, void **recv_comm) {
  struct sock_listen *l = listen_comm;
  struct sock_comm *c = *recv_comm;
  for (;;) {
    if (c == NULL) {
      int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
          return ncclInProgress;
        return err_set(ncclSystemError, "accept on %s failed: %s", l->where, strerror(errno));
      }
      CHECK(UTIL_CALLOC(&c, 1, "socket connection"));
      c->fd = fd;
      c->listen = l;
      socklen_t alen = sizeof c->peer;
      getpeername(fd, &c->peer.sa, &alen);
      sock_addr_str(&c->peer, c->where, sizeof c->where);
      sock_set_nodelay(fd);
      *recv_comm = c;
    }
    int complete;
    ncclResult_t r = move_hello(c, 0, &complete);
    if (r == ncclSuccess && !complete)
      return ncclInProgress;
    if (r == ncclSuccess && c->cookie == l->cookie) {
      c->state = 3;
      return ncclSuccess;
    }
    /* Somebody else's connection: drop it and keep waiting for ours. */
    WARN("NET/Socket: dropped a connection to %s from %s that did not present the expected cookie", l->where,
         c->where);
    close(c->fd);
    free(c);
    c = NULL;
    *recv_comm = NULL;
  }
}

static ncclResult_t sock_reg_mr(void *comm, void *data, size_t size, void **mhandle) {
  *mhandle = NULL; /* sockets need no registration */
  return ncclSuccess;
}

static ncclResult_t sock_dereg_mr(void *comm, void *mhandle) { return ncclSuccess; }

static ncclResult_t post(struct sock_comm *c, int is_send, void *data, size_t size, void **request) {
  if (c->failed) {
    err_set(c->failed, "%s", c->why);
    return c->failed;
  }
  if (c->tail - c->head >= SOCK_MAX_REQS) {
    *request = NULL;
    return ncclSuccess;
  }
  struct sock_req *r = &c->reqs[c->tail % SOCK_MAX_REQS];
  memset(r, 0, sizeof *r);
  r->comm = c;
  r->used = 1;
  r->is_send = is_send;
  r->data = data;
  r->size = size;
  r->len = is_send ? (uint64_t)size : 0;
  c->tail++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t sock_isend(void *send_comm, void *data, size_t size, void *mhandle, void **request) {
  return post(send_comm, 1, data, size, request);
}

static ncclResult_t sock_irecv(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  return post(recv_comm, 0, data, size, request);
}

/* Moves as much as the socket takes, oldest request first: TCP keeps the
 * order, so requests finish in the order they were posted. */
static ncclResult_t progress(struct sock_comm *c) {
  for (unsigned i = c->head; i != c->tail; i++) {
    struct sock_req *r = &c->reqs[i % SOCK_MAX_REQS];
    if (r->done)
      continue;
    while (r->hdr_done < sizeof r->len) {
      char *p = (char *)&r->len + r->hdr_done;
      ssize_t n = r->is_send ? send(c->fd, p, sizeof r->len - r->hdr_done, MSG_NOSIGNAL | MSG_DONTWAIT)
                             : recv(c->fd, p, sizeof r->len - r->hdr_done, MSG_DONTWAIT);
      if (n > 0) {
        r->hdr_done += (size_t)n;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ncclSuccess;
      return comm_fail(c, err_set(ncclRemoteError, "the connection with %s %s", c->where,
                                  n == 0 ? "was closed by the peer (it exited or aborted)" : strerror(errno)));
    }
    if (!r->is_send && r->len > r->size)
      return comm_fail(c, err_set(ncclInvalidUsage, "%s sent a message of %llu bytes into a %zu-byte buffer",
                                  c->where, (unsigned long long)r->len, r->size));
    while (r->moved < r->len) {
      size_t left = r->len - r->moved;
      ssize_t n = r->is_send ? send(c->fd, r->data + r->moved, left, MSG_NOSIGNAL | MSG_DONTWAIT)
                             : recv(c->fd, r->data + r->moved, left, MSG_DONTWAIT);
      if (n > 0) {
        r->moved += (size_t)n;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ncclSuccess;
      return comm_fail(c, err_set(ncclRemoteError, "the connection with %s %s", c->where,
                                  n == 0 ? "was closed by the peer (it exited or aborted)" : strerror(errno)));
    }
    r->done = 1;
  }
  return ncclSuccess;
}

static ncclResult_t sock_test(void *request, int *done, size_t *size) {
  struct sock_req *r = request;
  struct sock_comm *c = r->comm;
  *done = 0;
  /* A failure (typically the peer closing after its last message) only
   * matters to requests it left unfinished: receives are posted ahead of
   * the data, and the end of the stream may follow the last one. */
  if (!r->done && !c->failed)
    progress(c);
  if (!r->done) {
    if (c->failed) {
      err_set(c->failed, "%s", c->why);
      return c->failed;
    }
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

static ncclResult_t sock_close(void *comm) {
  struct sock_comm *c = comm;
  if (c) {
    if (c->fd >= 0)
      close(c->fd);
    free(c);
  }
  return ncclSuccess;
}

static ncclResult_t sock_close_listen(void *listen_comm) {
  struct sock_listen *l = listen_comm;
  if (l) {
    close(l->fd);
    free(l);
  }
  return ncclSuccess;
}

const struct net_plugin net_socket_plugin = {
    .size = sizeof(struct net_plugin),
    .version = NET_PLUGIN_VERSION,
    .name = "Socket",
    .init = sock_init,
    .devices = sock_devices,
    .get_properties = sock_get_properties,
    .listen = sock_listen_dev,
    .connect = sock_connect_dev,
    .accept = sock_accept_conn,
    .reg_mr = sock_reg_mr,
    .dereg_mr = sock_dereg_mr,
    .isend = sock_isend,
    .irecv = sock_irecv,
    .test = sock_test,
    .close_send = sock_close,
    .close_recv = sock_close,
    .close_listen = sock_close_listen,
};
