/*
 * The net transport: a connection's FIFO lives in local memory on each
 * side, and the network plugin moves posted slots between them (isend of
 * each slot the executor posts, irecv into each slot it frees). On host
 * communicators the executor thread drives this progress itself between
 * steps, so no proxy thread stands between the reduction and the wire.
 *
 * GPUDirect RDMA (net_gdr.c decides): on a CUDA communicator whose plugin
 * and driver allow it, a side keeps its slots' payloads in device memory,
 * which the NIC writes (receive) or reads (send, NCCL_NET_GDR_READ)
 * directly, while the slot headers stay in host memory next to the
 * counters: the proxy reads a header's byte count to send the slot and
 * checks each received payload's size against its header, without
 * touching device memory. Such a connection carries every slot as two
 * messages, header then payload, whichever side is the GPU one; the sides
 * tell each other in their connection info. Receives the NIC wrote into
 * device memory are flushed (the plugin's iflush) before the tail tells
 * the kernel.
 *
 * A send and a receive connection with the same peer set up together may
 * share one plugin connection (duplex_join): each side's data then
 * carries the acknowledgements of the other's.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/net_gdr.h"
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

/* What each side publishes: the receiver its plugin's listen handle, and
 * both whether they want every slot to travel as two messages (their slots
 * are in device memory, or LOOM_NET_SPLIT_SLOTS): then it does. */
struct net_info {
  char handle[NET_HANDLE_MAXSIZE];
  uint32_t split;
  uint32_t duplex; /* this side would share the wire with its sibling (net_sibling) */
};
_Static_assert(sizeof(struct net_info) <= CONN_INFO_BYTES, "net connection info too large");

/* One slot's messages on the wire. */
struct net_io {
  void *req[2];   /* the whole slot, or its header then its payload */
  void *flush;    /* receive: the flush of its payload, in flight */
  int posted, done;
  int checked;    /* receive: sizes checked, flush started */
  size_t got[2];
};

struct net_priv {
  const struct net_plugin *p;
  int dev;
  void *listen_comm, *comm;
  char *mem; /* net_ctrl, then at NET_DATA_OFFSET the slots, or with GDR the headers */
  size_t mem_size;
  void *dev_mem;
  void *mhandle;  /* mem's registration */
  int gdr;        /* enum gdr_mode: the slots are in device memory */
  int flush;      /* receive with GDR: flush each payload before the kernel reads it */
  int split;      /* header and payload travel apart (either side asked) */
  int duplex;     /* this side's wish to share its sibling's wire; the peer's joins it at connect */
  int joined;     /* comm is the other direction of the sibling's (duplex_join) */
  char *slots;    /* slot 0: in mem, or in dmem */
  char *hdrs;     /* with GDR: the headers, in mem; else NULL (headers open each slot) */
  struct gdr_mem dmem;
  void *dmhandle; /* dmem's registration */
  uint64_t posted; /* send: slots handed to isend; recv: slots given to irecv */
  uint64_t completed; /* messages test() reported done, for LOOM_TIMEOUT */
  struct net_io io[NCCL_STEPS];
  /* A failed connection is reported only when the executor waits on it:
   * receives are posted ahead of need, and a peer that finished and left
   * ends the stream after its last message. */
  ncclResult_t error;
  char why[LOOM_ERR_LEN];
};

static const struct net_plugin *plugin;
static const struct net_plugin *plugin_ext; /* the external plugin, if one loaded */
static ncclResult_t plugin_status = ncclSuccess;
static char plugin_error[LOOM_ERR_LEN];
static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;

static const struct net_plugin *const builtin[] = {&net_ib_plugin, &net_socket_plugin};
#define NBUILTIN (sizeof builtin / sizeof builtin[0])

/* "Ext, IB, Socket": the external plugin's name, if one loaded, then the
 * built-in ones. */
static const char *plugin_names(const struct net_plugin *ext, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "%s", ext ? ext->name : "");
  for (size_t i = 0; i < NBUILTIN && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", builtin[i]->name);
  return buf;
}

/* A plugin asked for by name is loaded at init, so that a wrong name or a
 * plugin without devices fails there, naming NCCL_NET. */
ncclResult_t net_check_name(const char *want) {
  if (want[0] == '\0')
    return ncclSuccess;
  const struct net_plugin *p;
  return net_get_plugin(&p);
}

/* ---- the stubs for a plugin's optional ops ---- */

ncclResult_t net_no_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                  void **mhandle) {
  return err_set(ncclInternalError, "the network plugin cannot register dma-bufs, yet one was asked to");
}

ncclResult_t net_no_iflush(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  *request = NULL;
  return ncclSuccess;
}

uint64_t net_no_activity(void *comm) { return 0; }
int net_no_poll_fds(void *comm, struct pollfd *fds, int max) { return -1; }
ncclResult_t net_no_probe(void *comm) { return ncclSuccess; }
ncclResult_t net_no_duplex(void *comm, void **other) {
  *other = NULL;
  return ncclSuccess;
}

ncclResult_t net_config_name(const char *name) {
  if (name[0] == '\0')
    return ncclSuccess;
  const struct net_plugin *p = NULL;
  CHECK(net_get_plugin(&p));
  if (strcasecmp(name, p->name) == 0)
    return ncclSuccess;
  int known = plugin_ext && strcasecmp(name, plugin_ext->name) == 0;
  for (size_t i = 0; i < NBUILTIN && !known; i++)
    known = strcasecmp(name, builtin[i]->name) == 0;
  if (known)
    return err_set(ncclInvalidUsage,
                   "config.netName \"%s\": this process uses NET/%s, and all its communicators share one network "
                   "plugin; NCCL_NET=%s chooses that one for the process",
                   name, p->name, name);
  char names[128];
  return err_set(ncclInvalidArgument, "config.netName \"%s\" names no network plugin; there are: %s", name,
                 plugin_names(plugin_ext, names, sizeof names));
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

static void plugin_load(void) {
  const char *want = param_str(P_NET);
  /* A level that does not parse is refused before any plugin is used. */
  int level;
  if ((plugin_status = gdr_env_level(&level)) != ncclSuccess) {
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
  plugin_ext = ext;
  char why[LOOM_ERR_LEN] = "";
  const struct net_plugin *found = NULL;
  plugin_status = ncclSuccess;
  if (want[0] != '\0') {
    for (int i = 0; i < ncand && !found; i++)
      if (strcasecmp(want, cand[i]->name) == 0)
        found = cand[i];
    if (!found) {
      char names[128];
      plugin_status = err_set(ncclInvalidArgument, "NCCL_NET=%s names no network plugin; there are: %s", want,
                              plugin_names(ext, names, sizeof names));
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

static const char *net_conn_name(const struct conn *c) {
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
  const struct channel *ch = c->channel < c->comm->nchannels ? &c->comm->channels[c->channel] : NULL;
  if (!ch || !ch->nic_name[0])
    return ncclSuccess;
  for (int d = 0; d < ndev; d++) {
    struct net_props pr;
    if (p->get_properties(d, &pr) == ncclSuccess && strcmp(pr.name, ch->nic_name) == 0 &&
        (ch->nic_port <= 0 || pr.port == ch->nic_port)) {
      *dev = d;
      break;
    }
  }
  return ncclSuccess;
}

/* The connection of the other direction with the same peer, kind and
 * channel, when it is being set up in the same batch: the two may share
 * one wire. A sibling set up in another batch is not looked for, so both
 * sides see the same answer: a peer's batch holds the mirror of this one.
 * Whether each side found one travels in net_info, and the pair shares
 * only if both did.
 *
 * Recursive doubling's connections only: the tuner gives it small
 * messages, whose ACKs then ride on the reply (2 ranks over loopback
 * sockets, AllReduce 8 B: 4.6-5.1 us against 5.5-6.7; 4 KiB: 6.6-6.9
 * against 6.8-8.2). The rings' and Send/Recv's carry bulk too, where one
 * socket for both directions measured no faster (docs/decisions.md). */
static struct conn *net_sibling(struct conn *c) {
  if (c->peer == c->comm->rank || c->kind != CONN_RD)
    return NULL;
  for (struct conn *o = c->comm->pending; o; o = o->next_pending)
    if (o != c && o->tr == c->tr && o->peer == c->peer && o->kind == c->kind && o->channel == c->channel &&
        o->dir != c->dir)
      return o;
  return NULL;
}

static ncclResult_t net_setup(struct conn *c, void *info, size_t *len) {
  struct net_priv *np;
  CHECK(UTIL_CALLOC(&np, 1, "net connection"));
  c->priv = np;
  CHECK(net_get_plugin(&np->p));
  CHECK(device_for(c, np->p, &np->dev));
  struct gdr_choice gdr;
  CHECK(gdr_choose(c, np->p, np->dev, &gdr));
  np->gdr = gdr.mode;
  np->flush = gdr.flush;
  size_t capacity = (c->comm->buffsize / NCCL_STEPS) & ~(size_t)63;
  size_t stride = SLOT_HDR_BYTES + capacity;
  np->mem_size = NET_DATA_OFFSET + NCCL_STEPS * (np->gdr ? SLOT_HDR_BYTES : stride);
  if (posix_memalign((void **)&np->mem, 4096, np->mem_size) != 0)
    return err_set(ncclSystemError, "out of memory for a %zu-byte network FIFO", np->mem_size);
  memset(np->mem, 0, NET_DATA_OFFSET);
  c->mem_host = np->mem_size;
  if (np->gdr) {
    /* The payloads in device memory keep their place after a header's
     * worth of unused bytes, so that kernels address slots as always. */
    CHECK(gdr_mem_alloc(NCCL_STEPS * stride, &np->dmem));
    c->mem_dev = np->dmem.alloc_size;
    np->slots = np->dmem.base;
    np->hdrs = np->mem + NET_DATA_OFFSET;
    c->fifo.hdrs = np->hdrs;
  } else {
    np->slots = np->mem + NET_DATA_OFFSET;
  }
  struct net_ctrl *ctrl = (struct net_ctrl *)np->mem;
  /* With GDR, base is device memory: only the kernels and the NIC touch
   * it (host communicators, which read fifo slots, never use GDR). */
  c->fifo.base = np->slots;
  c->fifo.capacity = capacity;
  c->fifo.stride = stride;
  c->fifo.tail = &ctrl->tail;
  c->fifo.head = &ctrl->head;
  if (!c->comm->is_host) {
    /* Kernels reach the counters, and the slots or headers, in this
     * pinned host memory. */
    CHECK(cuda_host_register(np->mem, np->mem_size, &np->dev_mem, "a network FIFO"));
    char *d = np->dev_mem;
    c->dev.base = np->gdr ? np->slots : d + NET_DATA_OFFSET;
    c->dev.hdrs = np->gdr ? d + NET_DATA_OFFSET : NULL;
    c->dev.tail = (uint64_t *)(d + offsetof(struct net_ctrl, tail));
    c->dev.head = (uint64_t *)(d + offsetof(struct net_ctrl, head));
    c->dev.step = c->dir == CONN_SEND ? c->dev.tail : c->dev.head;
  }
  /* This side's wishes; the peer's join them at connect. */
  np->split = np->gdr != GDR_OFF || param_int(P_NET_SPLIT_SLOTS);
  np->duplex = param_int(P_NET_DUPLEX) && np->p->duplex != net_no_duplex && net_sibling(c) != NULL;
  struct net_info *ni = info;
  memset(ni, 0, sizeof *ni);
  ni->split = (uint32_t)np->split;
  ni->duplex = (uint32_t)np->duplex;
  *len = sizeof *ni;
  if (c->dir == CONN_SEND)
    return ncclSuccess;
  ncclResult_t r = np->p->listen(np->dev, ni->handle, &np->listen_comm);
  if (r != ncclSuccess)
    context(c);
  return r;
}

/* One wire for both directions between two ranks: the lower rank's send
 * connects and the higher rank's receive accepts, as for any connection;
 * the other two wait for their sibling and take the other direction of its
 * comm. ncclInProgress while the sibling connects; then np->joined, or
 * np->duplex cleared where the plugin cannot share that comm, and the two
 * connect on their own as usual: both ends of the sibling's connection
 * refuse alike, and the listener of the lower rank's receive is still
 * open. */
static ncclResult_t duplex_join(struct conn *c, struct net_priv *np) {
  int leads = (c->dir == CONN_SEND) == (c->comm->rank < c->peer);
  if (leads || np->joined)
    return ncclSuccess;
  struct conn *sib = net_sibling(c);
  struct net_priv *sp = sib ? sib->priv : NULL;
  if (!sp)
    return err_set(ncclInternalError, "the %s connection with rank %d lost the connection it shares a wire with",
                   c->dir == CONN_SEND ? "send" : "receive", c->peer);
  if (!sib->connected)
    return ncclInProgress;
  CHECK(np->p->duplex(sp->comm, &np->comm));
  np->joined = np->comm != NULL;
  if (np->joined)
    INFO(LOG_NET, "channel %d: %s rank %d shares the wire of the %s", c->channel,
         c->dir == CONN_SEND ? "send to" : "receive from", c->peer, c->dir == CONN_SEND ? "receive" : "send");
  else
    np->duplex = 0;
  return ncclSuccess;
}

static ncclResult_t net_connect(struct conn *c, const void *peer_info, size_t len) {
  struct net_priv *np = c->priv;
  const struct net_info *peer = peer_info;
  if (len != sizeof *peer)
    return err_set(ncclInternalError, "net connection info from rank %d has %zu bytes", c->peer, len);
  np->split = np->split || peer->split != 0;
  ncclResult_t r = np->duplex && peer->duplex ? duplex_join(c, np) : ncclSuccess;
  if (r == ncclSuccess && !np->joined)
    r = c->dir == CONN_SEND ? np->p->connect(np->dev, peer->handle, &np->comm)
                            : np->p->accept(np->listen_comm, &np->comm);
  if (r == ncclSuccess && np->listen_comm) {
    np->p->close_listen(np->listen_comm);
    np->listen_comm = NULL;
  }
  if (r == ncclSuccess)
    r = np->p->reg_mr(np->comm, np->mem, np->mem_size, NET_PTR_HOST, &np->mhandle);
  if (r == ncclSuccess && np->gdr)
    r = gdr_mem_register(np->p, np->comm, np->gdr, &np->dmem, &np->dmhandle);
  if (r != ncclSuccess && r != ncclInProgress)
    context(c);
  return r;
}

static struct slot_hdr *hdr_of(const struct conn *c, const struct net_priv *np, uint64_t step) {
  return (struct slot_hdr *)(np->hdrs ? np->hdrs + (step % NCCL_STEPS) * SLOT_HDR_BYTES
                                      : np->slots + (step % NCCL_STEPS) * c->fifo.stride);
}

/* Message k of a slot on the wire: the whole slot, or (split) its header
 * and then its payload; a send moves what the header announces, a receive
 * offers room for the most a slot holds. */
struct part {
  void *data;
  size_t size;
  void *mhandle;
};

static struct part part_of(const struct conn *c, const struct net_priv *np, uint64_t step, int k) {
  char *slot = np->slots + (step % NCCL_STEPS) * c->fifo.stride;
  int send = c->dir == CONN_SEND;
  uint32_t bytes = send ? hdr_of(c, np, step)->bytes : 0;
  if (!np->split)
    return (struct part){slot, send ? SLOT_HDR_BYTES + bytes : c->fifo.stride, np->mhandle};
  if (k == 0)
    return (struct part){hdr_of(c, np, step), SLOT_HDR_BYTES, np->mhandle};
  return (struct part){slot + SLOT_HDR_BYTES, send ? bytes : c->fifo.capacity, np->gdr ? np->dmhandle : np->mhandle};
}

/* Hands the slot's messages to the plugin; 0 once all of them are. */
static ncclResult_t post_slot(struct conn *c, struct net_priv *np, int *pending) {
  struct net_io *io = &np->io[np->posted % NCCL_STEPS];
  int nparts = np->split ? 2 : 1;
  while (io->posted < nparts) {
    struct part pt = part_of(c, np, np->posted, io->posted);
    void *req = NULL;
    if (c->dir == CONN_SEND)
      CHECK(np->p->isend(np->comm, pt.data, pt.size, pt.mhandle, &req));
    else
      CHECK(np->p->irecv(np->comm, pt.data, pt.size, pt.mhandle, &req));
    if (req == NULL)
      break;
    io->req[io->posted++] = req;
  }
  *pending = io->posted < nparts;
  return ncclSuccess;
}

/* Tests the slot's messages in order; *done once all completed. */
static ncclResult_t test_slot(struct net_priv *np, struct net_io *io, int *done) {
  int nparts = np->split ? 2 : 1;
  *done = 0;
  while (io->done < nparts) {
    int d = 0;
    CHECK(np->p->test(io->req[io->done], &d, &io->got[io->done]));
    if (!d)
      return ncclSuccess;
    io->done++;
    np->completed++;
  }
  *done = 1;
  return ncclSuccess;
}

static ncclResult_t send_progress(struct conn *c, struct net_priv *np) {
  uint64_t tail = atomic_load_explicit(c->fifo.tail, memory_order_acquire);
  int pending = 0;
  while (np->posted < tail && !pending) {
    CHECK(post_slot(c, np, &pending));
    if (!pending)
      np->posted++;
  }
  uint64_t head = atomic_load_explicit(c->fifo.head, memory_order_relaxed);
  while (head < np->posted) {
    struct net_io *io = &np->io[head % NCCL_STEPS];
    int done = 0;
    CHECK(test_slot(np, io, &done));
    if (!done)
      break;
    memset(io, 0, sizeof *io);
    atomic_store_explicit(c->fifo.head, ++head, memory_order_release);
  }
  return ncclSuccess;
}

/* A received slot's sizes against what its header says, then its flush. */
static ncclResult_t check_received(struct conn *c, struct net_priv *np, uint64_t step, struct net_io *io) {
  const struct slot_hdr *h = hdr_of(c, np, step);
  if (!np->split) {
    size_t size = io->got[0];
    if (size < SLOT_HDR_BYTES || size != SLOT_HDR_BYTES + h->bytes)
      return err_set(ncclRemoteError, "received a malformed %zu-byte slot", size);
  } else if (io->got[0] != SLOT_HDR_BYTES || io->got[1] != h->bytes || h->bytes > c->fifo.capacity) {
    return err_set(ncclRemoteError, "received a malformed slot: a %zu-byte header and %zu bytes of payload where the "
                   "header announces %u", io->got[0], io->got[1], h->bytes);
  }
  io->checked = 1;
  if (np->flush && h->bytes > 0)
    CHECK(np->p->iflush(np->comm, part_of(c, np, step, 1).data, h->bytes, np->dmhandle, &io->flush));
  return ncclSuccess;
}

static ncclResult_t recv_progress(struct conn *c, struct net_priv *np) {
  uint64_t head = atomic_load_explicit(c->fifo.head, memory_order_acquire);
  int pending = 0;
  while (np->posted < head + NCCL_STEPS && !pending) {
    CHECK(post_slot(c, np, &pending));
    if (!pending)
      np->posted++;
  }
  uint64_t tail = atomic_load_explicit(c->fifo.tail, memory_order_relaxed);
  while (tail < np->posted) {
    struct net_io *io = &np->io[tail % NCCL_STEPS];
    int done = 0;
    CHECK(test_slot(np, io, &done));
    if (!done)
      break;
    if (!io->checked)
      CHECK(check_received(c, np, tail, io));
    if (io->flush) {
      CHECK(np->p->test(io->flush, &done, NULL));
      if (!done)
        break;
    }
    memset(io, 0, sizeof *io);
    atomic_store_explicit(c->fifo.tail, ++tail, memory_order_release);
  }
  return ncclSuccess;
}

/* Keeps the connection's first failure, `r` with the thread's sentence. */
static void net_broke(struct conn *c, struct net_priv *np, ncclResult_t r) {
  context(c);
  np->error = r;
  /* A broken connection does not say whether the peer lives: on this
   * host its pidfd does, and the others' say who has exited by now (a
   * peer may have given up because another rank died), when the
   * failure is first seen. */
  char peer[160], note[512];
  comm_note_peer(c->comm, c->peer, peer, sizeof peer);
  comm_note_exited(c->comm, -1, note, sizeof note);
  if (strstr(note, peer + 2)) /* "; " off: the exited list names it already */
    peer[0] = '\0';
  snprintf(np->why, sizeof np->why, "%s%s%s", err_thread_last(), peer, note);
}

static ncclResult_t net_progress(struct conn *c) {
  struct net_priv *np = c->priv;
  if (np->error != ncclSuccess)
    return ncclSuccess;
  if (np->comm == NULL) {
    /* Poisoned here: this rank's own failure, whose sentence it has; the
     * peer is not to blame (nor waited for to say whether it lives). */
    np->error = ncclRemoteError;
    snprintf(np->why, sizeof np->why, "the connection with rank %d was closed after this rank failed or was aborted",
             c->peer);
    return ncclSuccess;
  }
  ncclResult_t r = c->dir == CONN_SEND ? send_progress(c, np) : recv_progress(c, np);
  if (r != ncclSuccess)
    net_broke(c, np, r);
  return ncclSuccess;
}

static int net_flushed(struct conn *c) { return atomic_load(c->fifo.head) == atomic_load(c->fifo.tail); }

/* Asked while a wait stalls: a connection whose sends have all left has
 * no call that would see TCP report a reset, so its plugin looks. */
static ncclResult_t net_failed(struct conn *c) {
  struct net_priv *np = c->priv;
  if (np && np->error == ncclSuccess && np->comm) {
    ncclResult_t r = np->p->probe(np->comm);
    if (r != ncclSuccess)
      net_broke(c, np, r);
  }
  return np && np->error != ncclSuccess ? err_set(np->error, "%s", np->why) : ncclSuccess;
}

/* Bytes that moved on the plugin's comm, a message at a time if that is
 * all it tells: LOOM_TIMEOUT counts from the last of either. */
static uint64_t net_activity(struct conn *c) {
  struct net_priv *np = c->priv;
  if (!np)
    return 0;
  uint64_t a = np->completed;
  if (np->comm)
    a += np->p->activity(np->comm);
  return a;
}

/* The executor blocks on these only when every connection it waits on
 * has some: slots the plugin has not taken yet, a flush, or a failure
 * (which check reports) keep it polling. */
static int net_wait_fds(struct conn *c, struct pollfd *fds, int max) {
  struct net_priv *np = c->priv;
  if (!np || !np->comm || np->error != ncclSuccess || np->flush)
    return -1;
  if (c->dir == CONN_SEND ? np->posted < atomic_load(c->fifo.tail)
                          : np->posted < atomic_load(c->fifo.head) + NCCL_STEPS)
    return -1;
  return np->p->poll_fds(np->comm, fds, max);
}

static ncclResult_t net_check(struct conn *c) {
  CHECK(net_failed(c));
  return comm_peer_alive(c->comm, c->peer);
}

/* Closing the socket is how the peer learns: its next read sees the end. */
static void net_poison(struct conn *c, const char *why) {
  struct net_priv *np = c->priv;
  if (!np || !np->comm)
    return;
  if (np->mhandle)
    np->p->dereg_mr(np->comm, np->mhandle);
  if (np->dmhandle)
    np->p->dereg_mr(np->comm, np->dmhandle);
  (c->dir == CONN_SEND ? np->p->close_send : np->p->close_recv)(np->comm);
  np->comm = NULL;
  np->mhandle = np->dmhandle = NULL;
}

static void net_free(struct conn *c) {
  struct net_priv *np = c->priv;
  if (!np)
    return;
  net_poison(c, NULL);
  if (np->listen_comm)
    np->p->close_listen(np->listen_comm);
  if (np->dev_mem)
    cuda_host_unregister(np->mem);
  if (np->dmem.alloc)
    gdr_mem_free(&np->dmem);
  free(np->mem);
  free(np);
  c->priv = NULL;
}

const struct transport transport_net = {
    .name = "net",
    .can_connect = net_can_connect,
    .setup = net_setup,
    .connect = net_connect,
    .progress = net_progress,
    .flushed = net_flushed,
    .check = net_check,
    .activity = net_activity,
    .next_hdr = transport_fifo_next_hdr,
    .failed = net_failed,
    .wait_fds = net_wait_fds,
    .conn_name = net_conn_name,
    .poison = net_poison,
    .free = net_free,
};
