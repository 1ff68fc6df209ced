/*
 * LoomSample: a small external network plugin for NCCL's net plugin ABI,
 * built as its own shared library the way third-party plugins are (it
 * links nothing of Loom; net_ext_abi.h is declarations only). It proves
 * Loom's adapter: real bytes over TCP sockets of its own, never blocking.
 *
 * One device: the IPv4 interface LOOMSAMPLE_IFNAME names, else the first
 * up non-loopback IPv4 interface, else the loopback. Each connection is
 * one socket; each message is a 64-bit length and the payload, so that a
 * message larger than the posted receive is refused, not truncated.
 * Requests complete in the order they were posted (TCP keeps the order),
 * so one receive per irecv (maxRecvs 1) and tags are not needed.
 *
 * Which ABI tables it exports is a build choice (LOOMSAMPLE_V10, _V9,
 * _V8), so that each of the library's adapter paths can be tested.
 * loomsample_stats() lets a test see that the plugin moved the bytes and
 * which version's init() the library called.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net_ext_abi.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define LS_EXPORT __attribute__((visibility("default")))
#define LS_MAX_REQS NCCL_NET_MAX_REQUESTS
#define LS_MAX_BYTES (1u << 30) /* test() reports sizes as int */

static const uint64_t ls_magic = 0x314d41534d4f4f4cull; /* "LOOMSAM1" */

static ncclDebugLogger_t ls_logger;
#define LS_WARN(...)                                                       \
  do {                                                                     \
    if (ls_logger)                                                         \
      ls_logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define LS_INFO(...)                                                                   \
  do {                                                                                 \
    if (ls_logger)                                                                     \
      ls_logger(NCCL_LOG_INFO, NCCL_NET | NCCL_INIT, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static pthread_mutex_t ls_lock = PTHREAD_MUTEX_INITIALIZER;
static int ls_inited;
static ncclResult_t ls_init_result;
static char ls_ifname[IF_NAMESIZE];
static struct sockaddr_in ls_addr;
static _Atomic int ls_abi;
static _Atomic uint64_t ls_sent, ls_received;

/* What a test reads: payload bytes sent and received by this process, and
 * the ABI version (10, 9, 8) whose init() was called, 0 if none. */
LS_EXPORT int loomsample_stats(uint64_t *sent, uint64_t *received) {
  if (sent)
    *sent = atomic_load(&ls_sent);
  if (received)
    *received = atomic_load(&ls_received);
  return atomic_load(&ls_abi);
}

/* The handle carries the listener's address and cookie, then the
 * connector's progress: the library hands the same handle to every call
 * of connect, as NCCL's own socket plugin relies on. */
struct ls_handle {
  uint64_t magic;
  struct sockaddr_in addr;
  uint64_t cookie;
  int state; /* 0 no socket, 1 connecting, 2 sending the cookie */
  int fd;
  uint32_t sent;
};
_Static_assert(sizeof(struct ls_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");

struct ls_comm;

struct ls_req {
  struct ls_comm *comm;
  int used, done, is_send;
  char *data;
  size_t size;     /* send: message size; receive: posted capacity */
  uint64_t len;    /* the length word on the wire */
  size_t hdr_done; /* length-word bytes moved */
  size_t moved;    /* payload bytes moved */
};

struct ls_comm {
  int fd;
  struct ls_req reqs[LS_MAX_REQS];
  unsigned head, tail; /* requests in flight: [head, tail) */
  ncclResult_t failed;
};

struct ls_listen {
  int fd;
  uint64_t cookie;
  int pending;     /* accepted socket still greeting, or -1 */
  uint64_t got;    /* its cookie */
  uint32_t got_n;
};

static int ls_again(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

static ncclResult_t ls_find_interface(void) {
  const char *want = getenv("LOOMSAMPLE_IFNAME");
  struct ifaddrs *list = NULL, *lo = NULL, *pick = NULL;
  if (getifaddrs(&list) != 0) {
    LS_WARN("NET/LoomSample: getifaddrs failed: %s", strerror(errno));
    return ncclSystemError;
  }
  for (struct ifaddrs *i = list; i && !pick; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
      continue;
    if (want && want[0])
      pick = strcmp(i->ifa_name, want) == 0 ? i : NULL;
    else if (i->ifa_flags & IFF_LOOPBACK)
      lo = lo ? lo : i;
    else
      pick = i;
  }
  if (!pick && !(want && want[0]))
    pick = lo;
  if (!pick) {
    if (want && want[0])
      LS_WARN("NET/LoomSample: LOOMSAMPLE_IFNAME=%s names no up IPv4 interface", want);
    else
      LS_WARN("NET/LoomSample: no up IPv4 interface, not even a loopback");
    freeifaddrs(list);
    return ncclSystemError;
  }
  snprintf(ls_ifname, sizeof ls_ifname, "%s", pick->ifa_name);
  memcpy(&ls_addr, pick->ifa_addr, sizeof ls_addr);
  freeifaddrs(list);
  char a[INET_ADDRSTRLEN];
  LS_INFO("NET/LoomSample: using %s (%s)", ls_ifname, inet_ntop(AF_INET, &ls_addr.sin_addr, a, sizeof a));
  return ncclSuccess;
}

static ncclResult_t ls_init_common(ncclDebugLogger_t logger, int abi) {
  pthread_mutex_lock(&ls_lock);
  if (!ls_inited) {
    ls_logger = logger;
    ls_init_result = ls_find_interface();
    ls_inited = 1;
    atomic_store(&ls_abi, abi);
  }
  ncclResult_t r = ls_init_result;
  pthread_mutex_unlock(&ls_lock);
  return r;
}

static ncclResult_t ls_devices(int *ndev) {
  *ndev = ls_inited && ls_init_result == ncclSuccess ? 1 : 0;
  return ncclSuccess;
}

static ncclResult_t ls_check_dev(int dev) {
  if (dev == 0 && ls_inited && ls_init_result == ncclSuccess)
    return ncclSuccess;
  LS_WARN("NET/LoomSample: no device %d", dev);
  return ncclInvalidArgument;
}

static ncclResult_t ls_get_properties(int dev, ncclNetProperties_v10_t *p) {
  if (ls_check_dev(dev) != ncclSuccess)
    return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  p->name = ls_ifname;
  p->pciPath = NULL;
  p->guid = 0x4c53; /* one device: any constant identifies it */
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 10000;
  char path[64], buf[32];
  snprintf(path, sizeof path, "/sys/class/net/%s/speed", ls_ifname);
  FILE *f = fopen(path, "r");
  if (f) {
    if (fgets(buf, sizeof buf, f) && atoi(buf) > 0)
      p->speed = atoi(buf);
    fclose(f);
  }
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = 0;
  p->maxP2pBytes = LS_MAX_BYTES;
  p->maxCollBytes = LS_MAX_BYTES;
  return ncclSuccess;
}

static void ls_set_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static ncclResult_t ls_listen(int dev, void *opaque, void **listen_comm) {
  if (ls_check_dev(dev) != ncclSuccess)
    return ncclInvalidArgument;
  struct ls_listen *l = calloc(1, sizeof *l);
  if (!l)
    return ncclSystemError;
  struct sockaddr_in a = ls_addr;
  a.sin_port = 0;
  socklen_t alen = sizeof a;
  l->pending = -1;
  l->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(l->fd, 128) != 0 ||
      getsockname(l->fd, (struct sockaddr *)&a, &alen) != 0 ||
      getrandom(&l->cookie, sizeof l->cookie, 0) != (ssize_t)sizeof l->cookie) {
    LS_WARN("NET/LoomSample: cannot listen on %s: %s", ls_ifname, strerror(errno));
    if (l->fd >= 0)
      close(l->fd);
    free(l);
    return ncclSystemError;
  }
  struct ls_handle h = {.magic = ls_magic, .addr = a, .cookie = l->cookie, .state = 0, .fd = -1};
  memset(opaque, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(opaque, &h, sizeof h);
  *listen_comm = l;
  return ncclSuccess;
}

static struct ls_comm *ls_comm_new(int fd) {
  struct ls_comm *c = calloc(1, sizeof *c);
  if (c)
    c->fd = fd;
  return c;
}

/* Returns ncclSuccess with *send_comm NULL until the cookie has gone. */
static ncclResult_t ls_connect_v9(int dev, void *opaque, void **send_comm, ncclNetDeviceHandle_v10_t **dev_comm) {
  struct ls_handle *h = opaque;
  *send_comm = NULL;
  if (h->magic != ls_magic) {
    LS_WARN("NET/LoomSample: the connection handle is not a LoomSample handle");
    return ncclInternalError;
  }
  if (dev_comm && *dev_comm) {
    LS_WARN("NET/LoomSample: device offload was requested, which this plugin does not offer");
    return ncclInternalError;
  }
  char where[INET_ADDRSTRLEN + 8];
  inet_ntop(AF_INET, &h->addr.sin_addr, where, INET_ADDRSTRLEN);
  snprintf(where + strlen(where), 8, ":%u", ntohs(h->addr.sin_port));
  if (h->state == 0) {
    h->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (h->fd < 0) {
      LS_WARN("NET/LoomSample: socket() failed: %s", strerror(errno));
      return ncclSystemError;
    }
    ls_set_options(h->fd);
    if (connect(h->fd, (struct sockaddr *)&h->addr, sizeof h->addr) == 0)
      h->state = 2;
    else if (errno == EINPROGRESS)
      h->state = 1;
    else
      goto fail;
  }
  if (h->state == 1) {
    struct pollfd p = {.fd = h->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0)
      return ncclSuccess;
    int e = 0;
    socklen_t len = sizeof e;
    getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &len);
    if (e != 0) {
      errno = e;
      goto fail;
    }
    h->state = 2;
  }
  while (h->sent < sizeof h->cookie) {
    ssize_t n = send(h->fd, (char *)&h->cookie + h->sent, sizeof h->cookie - h->sent, MSG_NOSIGNAL);
    if (n < 0 && ls_again())
      return ncclSuccess;
    if (n <= 0)
      goto fail;
    h->sent += (uint32_t)n;
  }
  struct ls_comm *c = ls_comm_new(h->fd);
  if (!c)
    return ncclSystemError;
  *send_comm = c;
  return ncclSuccess;
fail:
  LS_WARN("NET/LoomSample: cannot connect to %s: %s", where, strerror(errno));
  close(h->fd);
  h->fd = -1;
  h->state = 0;
  return ncclRemoteError;
}

/* Returns ncclSuccess with *recv_comm NULL until a connector presented
 * this listener's cookie; others are dropped. */
static ncclResult_t ls_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_v10_t **dev_comm) {
  struct ls_listen *l = listen_comm;
  *recv_comm = NULL;
  for (;;) {
    if (l->pending < 0) {
      l->pending = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (l->pending < 0) {
        if (ls_again() || errno == ECONNABORTED)
          return ncclSuccess;
        LS_WARN("NET/LoomSample: accept failed: %s", strerror(errno));
        return ncclSystemError;
      }
      ls_set_options(l->pending);
      l->got_n = 0;
    }
    while (l->got_n < sizeof l->got) {
      ssize_t n = recv(l->pending, (char *)&l->got + l->got_n, sizeof l->got - l->got_n, 0);
      if (n < 0 && ls_again())
        return ncclSuccess;
      if (n <= 0)
        break;
      l->got_n += (uint32_t)n;
    }
    if (l->got_n == sizeof l->got && l->got == l->cookie) {
      struct ls_comm *c = ls_comm_new(l->pending);
      if (!c)
        return ncclSystemError;
      l->pending = -1;
      *recv_comm = c;
      return ncclSuccess;
    }
    LS_WARN("NET/LoomSample: dropped a connection that did not present the listener's cookie");
    close(l->pending);
    l->pending = -1;
  }
}

/* Registration: sockets need none, but the type must be memory the CPU
 * can read, which is all this plugin claims (ptrSupport). */
static char ls_mr_token;
static ncclResult_t ls_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  if (type != NCCL_PTR_HOST) {
    LS_WARN("NET/LoomSample: cannot register memory of type %d: only host memory (NCCL_PTR_HOST)", type);
    return ncclInternalError;
  }
  *mhandle = &ls_mr_token;
  return ncclSuccess;
}

static ncclResult_t ls_dereg_mr(void *comm, void *mhandle) {
  if (mhandle != &ls_mr_token) {
    LS_WARN("NET/LoomSample: deregMr of a handle regMr did not give");
    return ncclInternalError;
  }
  return ncclSuccess;
}

static ncclResult_t ls_post(struct ls_comm *c, int is_send, void *data, size_t size, void **request) {
  *request = NULL;
  if (c->failed)
    return c->failed;
  if (c->tail - c->head >= LS_MAX_REQS)
    return ncclSuccess; /* full: the caller tries again later */
  struct ls_req *r = &c->reqs[c->tail % LS_MAX_REQS];
  /* A receive's length word is read into len. */
  *r = (struct ls_req){.comm = c, .used = 1, .is_send = is_send, .data = data, .size = size, .len = is_send ? size : 0};
  c->tail++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t ls_isend_v9(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request) {
  if (size > LS_MAX_BYTES) {
    LS_WARN("NET/LoomSample: a %zu-byte send is over the %u-byte limit", size, LS_MAX_BYTES);
    return ncclInternalError;
  }
  return ls_post(send_comm, 1, data, size, request);
}

static ncclResult_t ls_irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                                void **request) {
  if (n != 1) {
    LS_WARN("NET/LoomSample: irecv of %d buffers; it takes one (maxRecvs 1)", n);
    return ncclInternalError;
  }
  return ls_post(recv_comm, 0, data[0], sizes[0], request);
}

static ncclResult_t ls_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request) {
  *request = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

/* Moves one piece; 1 moved, 0 would block, -1 failed (errno, or 0 at EOF). */
static int ls_move(int fd, int is_send, char *p, size_t n, size_t *done) {
  ssize_t got = is_send ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
  if (got > 0) {
    *done += (size_t)got;
    return 1;
  }
  if (got < 0 && ls_again())
    return 0;
  if (got == 0)
    errno = 0;
  return -1;
}

static ncclResult_t ls_fail(struct ls_comm *c, int is_send) {
  /* The end of the stream is how a peer that finished says goodbye, and
   * receives are posted ahead: only the library knows whether it matters. */
  if (!is_send && errno == 0)
    LS_INFO("NET/LoomSample: the peer closed the connection");
  else
    LS_WARN("NET/LoomSample: the connection broke while %s: %s", is_send ? "sending" : "receiving",
            errno ? strerror(errno) : "closed by the peer");
  c->failed = ncclRemoteError;
  return c->failed;
}

/* Moves as much as the socket takes, oldest request first. */
static ncclResult_t ls_progress(struct ls_comm *c) {
  for (unsigned i = c->head; i != c->tail && !c->failed; i++) {
    struct ls_req *r = &c->reqs[i % LS_MAX_REQS];
    if (r->done)
      continue;
    int m;
    while (r->hdr_done < sizeof r->len) {
      if ((m = ls_move(c->fd, r->is_send, (char *)&r->len + r->hdr_done, sizeof r->len - r->hdr_done,
                       &r->hdr_done)) <= 0)
        return m == 0 ? ncclSuccess : ls_fail(c, r->is_send);
    }
    if (!r->is_send && r->len > r->size) {
      LS_WARN("NET/LoomSample: a %llu-byte message arrived for a %zu-byte receive", (unsigned long long)r->len,
              r->size);
      c->failed = ncclInvalidUsage;
      return c->failed;
    }
    while (r->moved < r->len) {
      if ((m = ls_move(c->fd, r->is_send, r->data + r->moved, r->len - r->moved, &r->moved)) <= 0)
        return m == 0 ? ncclSuccess : ls_fail(c, r->is_send);
    }
    r->done = 1;
    atomic_fetch_add(r->is_send ? &ls_sent : &ls_received, r->len);
  }
  return ncclSuccess;
}

static ncclResult_t ls_test(void *request, int *done, int *sizes) {
  struct ls_req *r = request;
  struct ls_comm *c = r->comm;
  *done = 0;
  if (!r->done && !c->failed)
    ls_progress(c);
  if (!r->done)
    return c->failed; /* a request the failure left unfinished fails */
  *done = 1;
  if (sizes)
    sizes[0] = (int)r->len;
  r->used = 0;
  while (c->head != c->tail && !c->reqs[c->head % LS_MAX_REQS].used)
    c->head++;
  return ncclSuccess;
}

static ncclResult_t ls_close(void *comm) {
  struct ls_comm *c = comm;
  if (c) {
    close(c->fd);
    free(c);
  }
  return ncclSuccess;
}

static ncclResult_t ls_close_listen(void *listen_comm) {
  struct ls_listen *l = listen_comm;
  if (l) {
    if (l->pending >= 0)
      close(l->pending);
    close(l->fd);
    free(l);
  }
  return ncclSuccess;
}

/* ---- the exported tables ---- */

#if LOOMSAMPLE_V10
static ncclResult_t ls_init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return ls_init_common(logger, 10);
}

static ncclResult_t ls_connect_v10(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **send_comm,
                                   ncclNetDeviceHandle_v10_t **dev_comm) {
  return ls_connect_v9(dev, handle, send_comm, dev_comm);
}

static ncclResult_t ls_isend_v10(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                                 void **request) {
  return ls_isend_v9(send_comm, data, size, tag, mhandle, request);
}

static ncclResult_t ls_irecv_v10(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                                 void **phandles, void **request) {
  return ls_irecv_v9(recv_comm, n, data, sizes, tags, mhandles, request);
}

LS_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = "LoomSample",
    .init = ls_init_v10,
    .devices = ls_devices,
    .getProperties = ls_get_properties,
    .listen = ls_listen,
    .connect = ls_connect_v10,
    .accept = ls_accept,
    .regMr = ls_reg_mr,
    .regMrDmaBuf = NULL, /* no NCCL_PTR_DMABUF */
    .deregMr = ls_dereg_mr,
    .isend = ls_isend_v10,
    .irecv = ls_irecv_v10,
    .iflush = ls_iflush,
    .test = ls_test,
    .closeSend = ls_close,
    .closeRecv = ls_close,
    .closeListen = ls_close_listen,
    .getDeviceMr = NULL, /* no device offload */
    .irecvConsumed = NULL,
    .makeVDevice = NULL, /* one device, nothing to fuse */
};
#endif

#if LOOMSAMPLE_V9
static ncclResult_t ls_init_v9(ncclDebugLogger_t logger) { return ls_init_common(logger, 9); }

/* v9's properties have v10's layout under another name. */
static ncclResult_t ls_get_properties_v9(int dev, ncclNetProperties_v9_t *p) {
  ncclNetProperties_v10_t q;
  ncclResult_t r = ls_get_properties(dev, &q);
  if (r == ncclSuccess) {
    _Static_assert(sizeof q == sizeof *p, "v9 and v10 properties differ");
    memcpy(p, &q, sizeof q);
  }
  return r;
}

LS_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = "LoomSample",
    .init = ls_init_v9,
    .devices = ls_devices,
    .getProperties = ls_get_properties_v9,
    .listen = ls_listen,
    .connect = ls_connect_v9,
    .accept = ls_accept,
    .regMr = ls_reg_mr,
    .deregMr = ls_dereg_mr,
    .isend = ls_isend_v9,
    .irecv = ls_irecv_v9,
    .iflush = ls_iflush,
    .test = ls_test,
    .closeSend = ls_close,
    .closeRecv = ls_close,
    .closeListen = ls_close_listen,
};
#endif

#if LOOMSAMPLE_V8
static ncclResult_t ls_init_v8(ncclDebugLogger_t logger) { return ls_init_common(logger, 8); }

static ncclResult_t ls_get_properties_v8(int dev, ncclNetProperties_v8_t *p) {
  ncclNetProperties_v10_t q;
  ncclResult_t r = ls_get_properties(dev, &q);
  if (r != ncclSuccess)
    return r;
  *p = (ncclNetProperties_v8_t){.name = q.name, .pciPath = q.pciPath, .guid = q.guid, .ptrSupport = q.ptrSupport,
                                .regIsGlobal = q.regIsGlobal, .speed = q.speed, .port = q.port,
                                .latency = q.latency, .maxComms = q.maxComms, .maxRecvs = q.maxRecvs,
                                .netDeviceType = q.netDeviceType, .netDeviceVersion = q.netDeviceVersion};
  return ncclSuccess;
}

static ncclResult_t ls_isend_v8(void *send_comm, void *data, int size, int tag, void *mhandle, void **request) {
  if (size < 0) {
    LS_WARN("NET/LoomSample: a send of %d bytes", size);
    return ncclInternalError;
  }
  return ls_isend_v9(send_comm, data, (size_t)size, tag, mhandle, request);
}

static ncclResult_t ls_irecv_v8(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                                void **request) {
  if (n != 1 || sizes[0] < 0) {
    LS_WARN("NET/LoomSample: irecv of %d buffers (it takes one) or of a negative size", n);
    return ncclInternalError;
  }
  size_t size = (size_t)sizes[0];
  return ls_irecv_v9(recv_comm, n, data, &size, tags, mhandles, request);
}

LS_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "LoomSample",
    .init = ls_init_v8,
    .devices = ls_devices,
    .getProperties = ls_get_properties_v8,
    .listen = ls_listen,
    .connect = ls_connect_v9,
    .accept = ls_accept,
    .regMr = ls_reg_mr,
    .deregMr = ls_dereg_mr,
    .isend = ls_isend_v8,
    .irecv = ls_irecv_v8,
    .iflush = ls_iflush,
    .test = ls_test,
    .closeSend = ls_close,
    .closeRecv = ls_close,
    .closeListen = ls_close_listen,
};
#endif
