/*
 * The IB plugin: RDMA over InfiniBand or RoCE through libibverbs, loaded at
 * run time (net_ib_verbs.c). This file finds the devices (one per active
 * port that NCCL_IB_HCA selects), chooses each RoCE port's GID, and keeps a
 * registration cache per protection domain; connections and the data path
 * are in net_ib_conn.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/net_gdr.h"
#include "transport/net/ib/net_ib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if LOOM_HAVE_IBVERBS_HEADERS
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

#define IB_MAX_DEVS 16

const struct ib_verbs *ib_ibv;
struct ib_dev ib_devs[IB_MAX_DEVS];
int ib_ndevs = -1;
int ib_peermem;
static ncclResult_t init_status;
static char init_error[LOOM_ERR_LEN];
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

/* Per lane, from verbs' active_speed and active_width codes. */
static int port_speed_mbps(const struct ibv_port_attr *a) {
  int lane;
  switch (a->active_speed) {
  case 1: lane = 2500; break;
  case 2: lane = 5000; break;
  case 4: case 8: lane = 10000; break;
  case 16: lane = 14000; break;
  case 32: lane = 25000; break;
  case 64: lane = 50000; break;
  case 128: lane = 100000; break;
  default: lane = 10000; break;
  }
  int width;
  switch (a->active_width) {
  case 1: width = 1; break;
  case 2: width = 4; break;
  case 4: width = 8; break;
  case 8: width = 12; break;
  case 16: width = 2; break;
  default: width = 1; break;
  }
  return lane * width;
}

static int gid_is_ipv4(const union ibv_gid *g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g->raw, prefix, sizeof prefix) == 0;
}

static int gid_is_zero(const union ibv_gid *g) {
  static const uint8_t zero[16];
  return memcmp(g->raw, zero, sizeof zero) == 0;
}

static const char *gid_str(const union ibv_gid *g, char *buf, size_t len) {
  if (!inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len))
    snprintf(buf, len, "?");
  return buf;
}

/* The GID's RoCE version: 2, 1, or 0 where nothing says. */
static int gid_roce_version(struct ib_dev *d, int index) {
  if (ib_ibv->query_gid_ex) {
    struct ibv_gid_entry e;
    if (ib_ibv->query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)index, &e, 0, sizeof e) == 0)
      return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
  }
  char path[PATH_MAX], buf[32] = "";
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", d->name, d->port, index);
  FILE *f = fopen(path, "r");
  if (f) {
    if (!fgets(buf, sizeof buf, f))
      buf[0] = '\0';
    fclose(f);
  }
  if (strstr(buf, "v2"))
    return 2;
  return buf[0] ? 1 : 0;
}

/* NCCL_IB_GID_INDEX, or the best GID: RoCE of the wanted version carrying
 * an IPv4 address of the interface the sockets use, then any IPv4 one of
 * that version, then any of that version, then index 0. */
static ncclResult_t choose_gid(struct ib_dev *d, int tbl_len) {
  int want = (int)param_int(P_IB_GID_INDEX);
  char g[64];
  if (want >= 0) {
    if (want >= tbl_len)
      return err_set(ncclInvalidArgument, "NCCL_IB_GID_INDEX=%d: %s:%d has %d GIDs", want, d->name, d->port, tbl_len);
    d->gid_index = want;
    if (ib_ibv->query_gid(d->ctx, (uint8_t)d->port, want, &d->gid) != 0 || gid_is_zero(&d->gid))
      return err_set(ncclInvalidArgument, "NCCL_IB_GID_INDEX=%d: %s:%d has no GID at that index", want, d->name,
                     d->port);
    INFO(LOG_NET | LOG_INIT, "NET/IB: %s:%d uses GID index %d (%s), as NCCL_IB_GID_INDEX says", d->name, d->port, want,
         gid_str(&d->gid, g, sizeof g));
    return ncclSuccess;
  }
  struct sock_iface ifs[SOCK_MAX_IFACES];
  int nifs = 0;
  if (sock_find_interfaces(ifs, SOCK_MAX_IFACES, &nifs) != ncclSuccess)
    nifs = 0;
  int version = (int)param_int(P_IB_ROCE_VERSION_NUM);
  int best = -1, best_rank = 0;
  const char *best_if = NULL;
  for (int i = 0; i < tbl_len; i++) {
    union ibv_gid gid;
    if (ib_ibv->query_gid(d->ctx, (uint8_t)d->port, i, &gid) != 0 || gid_is_zero(&gid))
      continue;
    int v = gid_roce_version(d, i);
    int v_ok = v == version || (v == 0 && version == 2 && gid_is_ipv4(&gid));
    const char *ifname = NULL;
    if (gid_is_ipv4(&gid))
      for (int k = 0; k < nifs && !ifname; k++)
        if (ifs[k].addr.sa.sa_family == AF_INET && memcmp(&ifs[k].addr.sin.sin_addr, gid.raw + 12, 4) == 0)
          ifname = ifs[k].name;
    int rank = !v_ok ? 1 : ifname ? 4 : gid_is_ipv4(&gid) ? 3 : 2;
    if (rank > best_rank) {
      best = i;
      best_rank = rank;
      best_if = ifname;
      d->gid = gid;
    }
  }
  if (best < 0)
    return err_set(ncclSystemError, "%s:%d is a RoCE port without any GID", d->name, d->port);
  d->gid_index = best;
  INFO(LOG_NET | LOG_INIT, "NET/IB: %s:%d uses GID index %d (%s)%s%s%s", d->name, d->port, best,
       gid_str(&d->gid, g, sizeof g),
       best_rank == 4 ? ", the address of interface " : best_rank == 1 ? ", not of the wanted RoCE version" : "",
       best_if ? best_if : "", best_rank == 3 ? ", an IPv4 GID of no socket interface" : "");
  return ncclSuccess;
}

/* As NCCL probes it: a registration of no fd fails with EOPNOTSUPP (or
 * EPROTONOSUPPORT) where the kernel or the device's driver cannot take a
 * dma-buf, and otherwise for the bad fd. */
static int dmabuf_probe(struct ibv_pd *pd, const char **why) {
  if (!ib_ibv->reg_dmabuf_mr) {
    *why = "no dma-buf: the verbs library has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)";
    return 0;
  }
  errno = 0;
  struct ibv_mr *mr = ib_ibv->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
  if (mr) {
    ib_ibv->dereg_mr(mr);
    return 1;
  }
  if (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT) {
    *why = "no dma-buf: the kernel or the device's driver refuses it";
    return 0;
  }
  *why = "dma-buf";
  return 1;
}

static void find_pci_path(struct ib_dev *d) {
  char link[PATH_MAX];
  snprintf(link, sizeof link, "/sys/class/infiniband/%s/device", d->name);
  if (!realpath(link, d->pci_path))
    d->pci_path[0] = '\0';
}

/* Adds the usable ports of one HCA; its context stays open while any is. */
static ncclResult_t add_hca(struct ibv_device *dev, const struct ib_hca_filter *f) {
  const char *name = ib_ibv->get_device_name(dev);
  struct ibv_context *ctx = ib_ibv->open_device(dev);
  if (!ctx) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: cannot open %s; skipped", name);
    return ncclSuccess;
  }
  struct ibv_device_attr da;
  memset(&da, 0, sizeof da);
  if (ib_ibv->query_device(ctx, &da) != 0) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: cannot query %s; skipped", name);
    ib_ibv->close_device(ctx);
    return ncclSuccess;
  }
  struct ibv_pd *pd = NULL;
  int added = 0;
  for (int port = 1; port <= da.phys_port_cnt && ib_ndevs < IB_MAX_DEVS; port++) {
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    if (ib_ibv->query_port(ctx, (uint8_t)port, &pa) != 0)
      continue;
    if (!ib_hca_match(f, name, port)) {
      INFO(LOG_NET | LOG_INIT, "NET/IB: %s:%d not selected by NCCL_IB_HCA=%s", name, port, param_str(P_IB_HCA));
      continue;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
      INFO(LOG_NET | LOG_INIT, "NET/IB: %s:%d is not active; skipped", name, port);
      continue;
    }
    if (pa.link_layer != IBV_LINK_LAYER_INFINIBAND && pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
      INFO(LOG_NET | LOG_INIT, "NET/IB: %s:%d has an unknown link layer; skipped", name, port);
      continue;
    }
    if (!pd && !(pd = ib_ibv->alloc_pd(ctx)))
      break;
    struct ib_dev *d = &ib_devs[ib_ndevs];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->port = port;
    d->ctx = ctx;
    d->pd = pd;
    d->link_layer = pa.link_layer;
    d->lid = pa.lid;
    d->mtu = pa.active_mtu;
    d->speed_mbps = port_speed_mbps(&pa);
    d->max_qp_wr = da.max_qp_wr;
    d->gid_index = -1;
    if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
      ncclResult_t r = choose_gid(d, pa.gid_tbl_len);
      if (r == ncclInvalidArgument)
        return r;
      if (r != ncclSuccess) {
        INFO(LOG_NET | LOG_INIT, "NET/IB: %s; skipped", err_thread_last());
        continue;
      }
    }
    find_pci_path(d);
    pthread_mutex_init(&d->lock, NULL);
    const char *dmabuf = "";
    d->dmabuf = dmabuf_probe(pd, &dmabuf);
    INFO(LOG_NET | LOG_INIT, "NET/IB: [%d] %s:%d %s, %d Mb/s, %s%s", ib_ndevs, name, port,
         pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", d->speed_mbps, dmabuf,
         ib_peermem ? ", nvidia-peermem" : "");
    ib_ndevs++;
    added++;
  }
  if (!added) {
    if (pd)
      ib_ibv->dealloc_pd(pd);
    ib_ibv->close_device(ctx);
  }
  return ncclSuccess;
}

static ncclResult_t devices_scan(void) {
  ib_ndevs = 0;
  if (param_int(P_IB_DISABLE))
    return err_set(ncclSystemError, "NCCL_IB_DISABLE=1");
  struct ib_hca_filter f;
  CHECK(ib_hca_parse(param_str(P_IB_HCA), &f));
  CHECK(ib_verbs_load(&ib_ibv));
  ib_peermem = gdr_peermem_loaded("");
  int n = 0;
  struct ibv_device **list = ib_ibv->get_device_list(&n);
  if (!list)
    return err_set(ncclSystemError, "%s: ibv_get_device_list failed: %s", ib_ibv->path, strerror(errno));
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n && r == ncclSuccess; i++)
    r = add_hca(list[i], &f);
  ib_ibv->free_device_list(list);
  CHECK(r);
  if (ib_ndevs == 0)
    return err_set(ncclSystemError, "%s found %d HCA(s) and no active port%s%s", ib_ibv->path, n,
                   param_is_set(P_IB_HCA) ? " that NCCL_IB_HCA selects: " : "",
                   param_is_set(P_IB_HCA) ? param_str(P_IB_HCA) : "");
  return ncclSuccess;
}

/* The scan happens once; its result, failure included, is kept. */
ncclResult_t ib_devices_init(void) {
  pthread_mutex_lock(&init_lock);
  if (ib_ndevs < 0) {
    init_status = devices_scan();
    if (init_status != ncclSuccess)
      snprintf(init_error, sizeof init_error, "%s", err_thread_last());
  }
  pthread_mutex_unlock(&init_lock);
  if (init_status != ncclSuccess)
    return err_set(init_status, "%s", init_error);
  return ncclSuccess;
}

ncclResult_t ib_mr_get(struct ib_dev *d, void *data, size_t size, struct ib_mr_entry **out) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t start = (uintptr_t)data & ~(page - 1);
  uintptr_t end = ((uintptr_t)data + size + page - 1) & ~(page - 1);
  pthread_mutex_lock(&d->lock);
  struct ib_mr_entry *e;
  for (e = d->mrs; e; e = e->next)
    if (e->start <= start && end <= e->end)
      break;
  if (e) {
    e->refs++;
    pthread_mutex_unlock(&d->lock);
    *out = e;
    return ncclSuccess;
  }
  ncclResult_t r = UTIL_CALLOC(&e, 1, "an IB registration");
  if (r == ncclSuccess) {
    /* Whole pages, so that neighbouring buffers share one registration. */
    e->mr = ib_ibv->reg_mr(d->pd, (void *)start, end - start,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!e->mr) {
      r = err_set(ncclSystemError, "NET/IB %s:%d: ibv_reg_mr of %zu bytes failed: %s", d->name, d->port,
                  (size_t)(end - start), strerror(errno));
      free(e);
    } else {
      e->start = start;
      e->end = end;
      e->refs = 1;
      e->next = d->mrs;
      d->mrs = e;
      *out = e;
    }
  }
  pthread_mutex_unlock(&d->lock);
  return r;
}

void ib_mr_put(struct ib_dev *d, struct ib_mr_entry *e) {
  pthread_mutex_lock(&d->lock);
  if (--e->refs == 0) {
    for (struct ib_mr_entry **p = &d->mrs; *p; p = &(*p)->next)
      if (*p == e) {
        *p = e->next;
        break;
      }
    ib_ibv->dereg_mr(e->mr);
    free(e);
  }
  pthread_mutex_unlock(&d->lock);
}

static ncclResult_t ib_init(void) { return ib_devices_init(); }

static ncclResult_t ib_devices(int *ndev) {
  CHECK(ib_devices_init());
  *ndev = ib_ndevs;
  return ncclSuccess;
}

static ncclResult_t ib_get_properties(int dev, struct net_props *props) {
  CHECK(ib_devices_init());
  if (dev < 0 || dev >= ib_ndevs)
    return err_set(ncclInternalError, "IB plugin: no device %d (there are %d)", dev, ib_ndevs);
  struct ib_dev *d = &ib_devs[dev];
  memset(props, 0, sizeof *props);
  snprintf(props->name, sizeof props->name, "%s", d->name);
  snprintf(props->pci_path, sizeof props->pci_path, "%s", d->pci_path);
  /* Device memory as NCCL takes it: by pointer where nvidia-peermem lets
   * ibv_reg_mr pin it, as a dma-buf where the device takes one. */
  props->ptr_support = NET_PTR_HOST | (ib_peermem ? NET_PTR_CUDA : 0) | (d->dmabuf ? NET_PTR_DMABUF : 0);
  props->speed_mbps = d->speed_mbps;
  props->port = d->port;
  return ncclSuccess;
}

/* Host memory, or device memory by pointer (nvidia-peermem pins it). */
static ncclResult_t ib_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  if (type != NET_PTR_HOST && type != NET_PTR_CUDA)
    return err_set(ncclInternalError, "IB plugin: cannot register memory of type %d", type);
  struct ib_dev *d = ib_comm_dev(comm);
  struct ib_mr_entry *e;
  CHECK(ib_mr_get(d, data, size, &e));
  *mhandle = e;
  return ncclSuccess;
}

/* Device memory exported as a dma-buf, addressed by its device pointers
 * (the iova). Such registrations are not cached: each is one FIFO's. */
static ncclResult_t ib_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                     void **mhandle) {
  struct ib_dev *d = ib_comm_dev(comm);
  if (!ib_ibv->reg_dmabuf_mr)
    return err_set(ncclSystemError, "NET/IB: %s has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it): device "
                   "memory cannot be registered as a dma-buf", ib_ibv->path);
  struct ib_mr_entry *e;
  CHECK(UTIL_CALLOC(&e, 1, "an IB dma-buf registration"));
  e->mr = ib_ibv->reg_dmabuf_mr(d->pd, offset, size, (uint64_t)(uintptr_t)data, fd,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!e->mr) {
    int err = errno;
    free(e);
    return err_set(ncclSystemError, "NET/IB %s:%d: ibv_reg_dmabuf_mr of %zu bytes of device memory at %p (dma-buf fd "
                   "%d) failed: %s", d->name, d->port, size, data, fd, strerror(err));
  }
  e->start = (uintptr_t)data;
  e->end = (uintptr_t)data + size;
  e->refs = 1;
  *mhandle = e;
  return ncclSuccess;
}

static ncclResult_t ib_dereg_mr(void *comm, void *mhandle) {
  if (mhandle)
    ib_mr_put(ib_comm_dev(comm), mhandle);
  return ncclSuccess;
}

const struct net_plugin net_ib_plugin = {
    .name = "IB",
    .init = ib_init,
    .devices = ib_devices,
    .get_properties = ib_get_properties,
    .listen = ib_listen,
    .connect = ib_connect,
    .accept = ib_accept,
    .reg_mr = ib_reg_mr,
    .reg_mr_dmabuf = ib_reg_mr_dmabuf,
    .dereg_mr = ib_dereg_mr,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .test = ib_test,
    .activity = ib_activity,
    .poll_fds = net_no_poll_fds,
    .probe = net_no_probe,
    .duplex = net_no_duplex,
    .iflush = ib_iflush,
    .close_send = ib_close,
    .close_recv = ib_close,
    .close_listen = ib_close_listen,
};

#else /* no verbs.h at build time */

static ncclResult_t ib_unavailable(void) {
  return err_set(ncclSystemError, "this build of Loom has no IB plugin (infiniband/verbs.h was missing: install "
                                  "libibverbs-dev and rebuild)");
}

static ncclResult_t ib_no_devices(int *ndev) {
  *ndev = 0;
  return ib_unavailable();
}

/* A plugin whose init fails is never chosen, so these are not reached;
 * they are here so that the table, like every other, has all its ops. */
static ncclResult_t ib_no_properties(int dev, struct net_props *props) { return ib_unavailable(); }
static ncclResult_t ib_no_listen(int dev, void *handle, void **listen_comm) { return ib_unavailable(); }
static ncclResult_t ib_no_connect(int dev, const void *handle, void **send_comm) { return ib_unavailable(); }
static ncclResult_t ib_no_accept(void *listen_comm, void **recv_comm) { return ib_unavailable(); }
static ncclResult_t ib_no_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  return ib_unavailable();
}
static ncclResult_t ib_no_dereg_mr(void *comm, void *mhandle) { return ib_unavailable(); }
static ncclResult_t ib_no_post(void *comm, void *data, size_t size, void *mhandle, void **request) {
  return ib_unavailable();
}
static ncclResult_t ib_no_test(void *request, int *done, size_t *size) { return ib_unavailable(); }
static ncclResult_t ib_no_close(void *comm) { return ib_unavailable(); }

const struct net_plugin net_ib_plugin = {
    .name = "IB",
    .init = ib_unavailable,
    .devices = ib_no_devices,
    .get_properties = ib_no_properties,
    .listen = ib_no_listen,
    .connect = ib_no_connect,
    .accept = ib_no_accept,
    .reg_mr = ib_no_reg_mr,
    .reg_mr_dmabuf = net_no_reg_mr_dmabuf,
    .dereg_mr = ib_no_dereg_mr,
    .isend = ib_no_post,
    .irecv = ib_no_post,
    .test = ib_no_test,
    .iflush = net_no_iflush,
    .activity = net_no_activity,
    .poll_fds = net_no_poll_fds,
    .probe = net_no_probe,
    .duplex = net_no_duplex,
    .close_send = ib_no_close,
    .close_recv = ib_no_close,
    .close_listen = ib_no_close,
};
#endif
