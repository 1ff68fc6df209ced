/*
 * The net transport: a connection's FIFO lives in local memory on each
 * side, and the network plugin moves posted slots between them (isend of
 * each slot the executor posts, irecv into each slot it frees). On host
 * communicators the executor thread drives this progress itself between
 * steps, so no proxy thread stands between the reduction and the wire.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "topology/discover.h"
#include "topology/graph.h"
#include "transport/net.h"
#include "transport/transport.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The FIFO's counters share the FIFO's allocation, so that on a CUDA
 * communicator one registration makes both visible to kernels. */
struct net_ctrl {
  _Atomic uint64_t tail;
  char pad0[LOOM_CACHE_LINE - sizeof(uint64_t)];
  _Atomic uint64_t head;
};
#define NET_DATA_OFFSET 4096

struct net_priv {
  const struct net_plugin *p;
  int dev;
  void *listen_comm, *comm;
  char *mem; /* net_ctrl, then the slots at NET_DATA_OFFSET */
  size_t mem_size;
  void *dev_mem;
  void *mhandle;
  uint64_t posted; /* send: slots handed to isend; recv: slots given to irecv */
  void *reqs[NCCL_STEPS];
  /* A failed connection is reported only when the executor waits on it:
   * receives are posted ahead of need, and a peer that finished and left
   * ends the stream after its last message. */
  ncclResult_t error;
  char why[LOOM_ERR_LEN];
};

static const struct net_plugin *plugin;
static ncclResult_t plugin_status = ncclSuccess;
static char plugin_error[LOOM_ERR_LEN];
static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;

static const struct net_plugin *const builtin[] = {&net_ib_plugin, &net_socket_plugin};
#define NBUILTIN (sizeof builtin / sizeof builtin[0])

/* A plugin asked for by name is loaded at init, so that a wrong name or a
 * plugin without devices fails there, naming NCCL_NET. */
ncclResult_t net_check_name(const char *want) {
  if (want[0] == '\0')
    return ncclSuccess;
  const struct net_plugin *p;
  return net_get_plugin(&p);
}

/* Initialises `p` and counts its devices; the reason it cannot serve, if
 * not, stays in the thread's last error. */
static ncclResult_t plugin_usable(const struct net_plugin *p) {
  int n = 0;
  CHECK(p->init());
  CHECK(p->devices(&n));
  if (n <= 0)
    return err_set(ncclSystemError, "NET/%s: no device", p->name);
  return ncclSuccess;
}

/* Scripts written for NCCL set it; refusing it would break them, obeying
 * it is not possible yet, so it is checked and the user told. */
static ncclResult_t gdr_level_check(void) {
  const char *v = param_str(P_NET_GDR_LEVEL);
  if (v[0] == '\0')
    return ncclSuccess;
  static const char *const ok[] = {"LOC", "PIX", "PXB", "PHB", "SYS", "0", "1", "2", "3", "4", "5"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (strcasecmp(v, ok[i]) == 0) {
      WARN("NCCL_NET_GDR_LEVEL=%s: Loom has no GPUDirect RDMA yet; device buffers cross the network through "
           "pinned host memory",
           v);
      return ncclSuccess;
    }
  return err_set(ncclInvalidArgument, "NCCL_NET_GDR_LEVEL=%s: expected LOC, PIX, PXB, PHB, SYS or 0-5", v);
}

static void plugin_load(void) {
  const char *want = param_str(P_NET);
  if ((plugin_status = gdr_level_check()) != ncclSuccess) {
    snprintf(plugin_error, sizeof plugin_error, "%s", err_thread_last());
    return;
  }
  const struct net_plugin *cand[NBUILTIN + 1];
  int ncand = 0;
  const struct net_plugin *ext = NULL;
  const char *spec = param_str(P_NET_PLUGIN);
  if (spec[0] == '\0') {
    /* As NCCL does: a libnccl-net.so on the library path is the external
     * plugin; its absence is the usual case and no warning. */
    if (net_ext_load("libnccl-net.so", &ext) == ncclSuccess)
      cand[ncand++] = ext;
    else
      INFO(LOG_NET | LOG_INIT, "no external network plugin: %s", err_thread_last());
  } else if (strcasecmp(spec, "none") != 0) {
    if (net_ext_load(spec, &ext) == ncclSuccess)
      cand[ncand++] = ext;
    else
      WARN("NCCL_NET_PLUGIN=%s: %s; using the built-in network plugins", spec, err_thread_last());
  }
  for (size_t i = 0; i < NBUILTIN; i++)
    cand[ncand++] = builtin[i];
  char why[LOOM_ERR_LEN] = "";
  const struct net_plugin *found = NULL;
  plugin_status = ncclSuccess;
  if (want[0] != '\0') {
    for (int i = 0; i < ncand && !found; i++)
      if (strcasecmp(want, cand[i]->name) == 0)
        found = cand[i];
    if (!found) {
      plugin_status = err_set(ncclInvalidArgument, "NCCL_NET=%s names no network plugin; there are: %s%s%s", want,
                              ext ? ext->name : "", ext ? ", " : "", "IB, Socket");
    } else if ((plugin_status = plugin_usable(found)) != ncclSuccess) {
      snprintf(why, sizeof why, "%s", err_thread_last());
      plugin_status = err_set(plugin_status == ncclInvalidArgument ? ncclInvalidArgument : ncclSystemError,
                              "NCCL_NET=%s cannot be used: %s", want, why);
    }
  } else {
    /* The first plugin with a device (Socket always has one: loopback);
     * a plugin that is absent is passed over, a wrong setting of it is
     * not (NCCL_IB_HCA=mlx5_0:x). */
    for (int i = 0; i < ncand && !found && plugin_status == ncclSuccess; i++) {
      ncclResult_t r = plugin_usable(cand[i]);
      if (r == ncclSuccess)
        found = cand[i];
      else if (r == ncclInvalidArgument)
        plugin_status = r;
      else
        INFO(LOG_NET | LOG_INIT, "NET/%s not used: %s", cand[i]->name, err_thread_last());
      snprintf(why, sizeof why, "%s", err_thread_last());
    }
    if (!found && plugin_status == ncclSuccess)
      plugin_status = err_set(ncclSystemError, "no network plugin can be used: %s", why);
  }
  if (plugin_status == ncclSuccess)
    plugin = found;
  if (plugin_status == ncclSuccess)
    INFO(LOG_NET | LOG_INIT, "using network plugin %s", plugin->name);
  else
    snprintf(plugin_error, sizeof plugin_error, "%s", err_thread_last());
}

ncclResult_t net_get_plugin(const struct net_plugin **out) {
  pthread_once(&plugin_once, plugin_load);
  if (plugin_status != ncclSuccess)
    return err_set(plugin_status, "%s", plugin_error);
  *out = plugin;
  return ncclSuccess;
}

/* One plugin serves the whole process, so one name does. */
static char conn_name[80];
static pthread_once_t conn_name_once = PTHREAD_ONCE_INIT;

static void conn_name_fill(void) {
  int n = snprintf(conn_name, sizeof conn_name, "net/%s", plugin ? plugin->name : "?");
  for (int i = 4; i < n && i < (int)sizeof conn_name; i++)
    conn_name[i] = (char)tolower((unsigned char)conn_name[i]);
}

const char *net_conn_name(const struct conn *c) {
  pthread_once(&conn_name_once, conn_name_fill);
  return conn_name;
}

static int net_can_connect(struct ncclComm *comm, int peer) { return 1; }

static void context(struct conn *c) {
  err_context("rank %d (%s) over NET/%s", c->peer, c->comm->peers[c->peer].hostname,
              ((struct net_priv *)c->priv)->p->name);
}

/* The plugin device of the NIC the topology search gave the channel, by
 * name and port; where the plugin has no such device (a topology file,
 * a plugin that names its devices otherwise), channels spread over the
 * devices by index. */
static ncclResult_t device_for(struct conn *c, const struct net_plugin *p, int *dev) {
  int ndev = 0;
  CHECK(p->devices(&ndev));
  *dev = ndev > 1 ? c->channel % ndev : 0;
  int nic = c->channel < c->comm->nchannels ? c->comm->channels[c->channel].nic : -1;
  const struct topo_system *t;
  if (nic < 0 || topo_get_system(&t) != ncclSuccess || nic >= t->n)
    return ncclSuccess;
  const struct topo_node *n = &t->nodes[nic];
  for (int d = 0; d < ndev; d++) {
    struct net_props pr;
    if (p->get_properties(d, &pr) == ncclSuccess && strcmp(pr.name, n->name) == 0 &&
        (n->port <= 0 || pr.port == n->port)) {
      *dev = d;
      break;
    }
  }
  return ncclSuccess;
}

static ncclResult_t net_setup(struct conn *c, void *info, size_t *len) {
  struct net_priv *np;
  CHECK(UTIL_CALLOC(&np, 1, "net connection"));
  c->priv = np;
  CHECK(net_get_plugin(&np->p));
  CHECK(device_for(c, np->p, &np->dev));
  size_t capacity = (c->comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  size_t stride = SLOT_HDR_BYTES + capacity;
  np->mem_size = NET_DATA_OFFSET + NCCL_STEPS * stride;
  if (posix_memalign((void **)&np->mem, 4096, np->mem_size) != 0)
    return err_set(ncclSystemError, "out of memory for a %zu-byte network FIFO", np->mem_size);
  memset(np->mem, 0, sizeof(struct net_ctrl));
  struct net_ctrl *ctrl = (struct net_ctrl *)np->mem;
  c->fifo.base = np->mem + NET_DATA_OFFSET;
  c->fifo.capacity = capacity;
  c->fifo.stride = stride;
  c->fifo.tail = &ctrl->tail;
  c->fifo.head = &ctrl->head;
  if (!c->comm->is_host) {
    /* Kernels write the slots the proxy thread sends, and read those it
     * receives, in this pinned host memory. */
    CHECK(cuda_host_register(np->mem, np->mem_size, &np->dev_mem, "a network FIFO"));
    char *d = np->dev_mem;
    c->dev.base = d + NET_DATA_OFFSET;
    c->dev.tail = (uint64_t *)(d + offsetof(struct net_ctrl, tail));
    c->dev.head = (uint64_t *)(d + offsetof(struct net_ctrl, head));
  }
  if (c->dir == CONN_SEND) {
    *len = 0;
    return ncclSuccess;
  }
  ncclResult_t r = np->p->listen(np->dev, info, &np->listen_comm);
  if (r != ncclSuccess) {
    context(c);
    return r;
  }
  *len = NET_HANDLE_MAXSIZE;
  return ncclSuccess;
}

static ncclResult_t net_connect(struct conn *c, const void *peer_info, size_t len) {
  struct net_priv *np = c->priv;
  ncclResult_t r;
  if (c->dir == CONN_SEND) {
    if (len != NET_HANDLE_MAXSIZE)
      return err_set(ncclInternalError, "net connection info from rank %d has %zu bytes", c->peer, len);
    r = np->p->connect(np->dev, peer_info, &np->comm);
  } else {
    r = np->p->accept(np->listen_comm, &np->comm);
    if (r == ncclSuccess) {
      np->p->close_listen(np->listen_comm);
      np->listen_comm = NULL;
    }
  }
  if (r == ncclSuccess)
    r = np->p->reg_mr(np->comm, np->mem, np->mem_size, NET_PTR_HOST, &np->mhandle);
  if (r != ncclSuccess && r != ncclInProgress)
    context(c);
  return r;
}

static ncclResult_t send_progress(struct conn *c, struct net_priv *np) {
  uint64_t tail = atomic_load_explicit(c->fifo.tail, memory_order_acquire);
  while (np->posted < tail) {
    struct slot_hdr *h = fifo_hdr(&c->fifo, np->posted);
    void *req = NULL;
    CHECK(np->p->isend(np->comm, h, SLOT_HDR_BYTES + h->bytes, np->mhandle, &req));
    if (req == NULL)
      break;
    np->reqs[np->posted % NCCL_STEPS] = req;
    np->posted++;
  }
  uint64_t head = atomic_load_explicit(c->fifo.head, memory_order_relaxed);
  while (head < np->posted) {
    int done = 0;
    CHECK(np->p->test(np->reqs[head % NCCL_STEPS], &done, NULL));
    if (!done)
      break;
    atomic_store_explicit(c->fifo.head, ++head, memory_order_release);
  }
  return ncclSuccess;
}

static ncclResult_t recv_progress(struct conn *c, struct net_priv *np) {
  uint64_t head = atomic_load_explicit(c->fifo.head, memory_order_acquire);
  while (np->posted < head + NCCL_STEPS) {
    void *req = NULL;
    CHECK(np->p->irecv(np->comm, fifo_hdr(&c->fifo, np->posted), c->fifo.stride, np->mhandle, &req));
    if (req == NULL)
      break;
    np->reqs[np->posted % NCCL_STEPS] = req;
    np->posted++;
  }
  uint64_t tail = atomic_load_explicit(c->fifo.tail, memory_order_relaxed);
  while (tail < np->posted) {
    int done = 0;
    size_t size = 0;
    CHECK(np->p->test(np->reqs[tail % NCCL_STEPS], &done, &size));
    if (!done)
      break;
    if (size < SLOT_HDR_BYTES || size != SLOT_HDR_BYTES + fifo_hdr(&c->fifo, tail)->bytes)
      return err_set(ncclRemoteError, "received a malformed %zu-byte slot", size);
    atomic_store_explicit(c->fifo.tail, ++tail, memory_order_release);
  }
  return ncclSuccess;
}

static ncclResult_t net_progress(struct conn *c) {
  struct net_priv *np = c->priv;
  if (np->error != ncclSuccess)
    return ncclSuccess;
  ncclResult_t r = np->comm == NULL ? err_set(ncclRemoteError, "the connection is closed")
                   : c->dir == CONN_SEND ? send_progress(c, np)
                                         : recv_progress(c, np);
  if (r != ncclSuccess) {
    context(c);
    np->error = r;
    /* A peer that closed its connection may have exited, or given up
     * because another rank did: on this host the pidfds say who has
     * exited by now, when the failure is first seen. */
    char note[512];
    transport_note_exited(c->comm, note, sizeof note);
    snprintf(np->why, sizeof np->why, "%s%s", err_thread_last(), note);
  }
  return ncclSuccess;
}

static int net_flushed(struct conn *c) { return atomic_load(c->fifo.head) == atomic_load(c->fifo.tail); }

static ncclResult_t net_failed(struct conn *c) {
  struct net_priv *np = c->priv;
  return np && np->error != ncclSuccess ? err_set(np->error, "%s", np->why) : ncclSuccess;
}

static ncclResult_t net_check(struct conn *c) {
  CHECK(net_failed(c));
  return transport_peer_alive(c->comm, c->peer);
}

/* Closing the socket is how the peer learns: its next read sees the end. */
static void net_poison(struct conn *c) {
  struct net_priv *np = c->priv;
  if (!np || !np->comm)
    return;
  if (np->mhandle)
    np->p->dereg_mr(np->comm, np->mhandle);
  (c->dir == CONN_SEND ? np->p->close_send : np->p->close_recv)(np->comm);
  np->comm = NULL;
  np->mhandle = NULL;
}

static void net_free(struct conn *c) {
  struct net_priv *np = c->priv;
  if (!np)
    return;
  net_poison(c);
  if (np->listen_comm)
    np->p->close_listen(np->listen_comm);
  if (np->dev_mem)
    cuda_host_unregister(np->mem);
  free(np->mem);
  free(np);
  c->priv = NULL;
}

const struct transport transport_net = {
    .size = sizeof(struct transport),
    .version = TRANSPORT_VERSION,
    .name = "net",
    .can_connect = net_can_connect,
    .setup = net_setup,
    .connect = net_connect,
    .progress = net_progress,
    .flushed = net_flushed,
    .check = net_check,
    .failed = net_failed,
    .poison = net_poison,
    .free = net_free,
};
