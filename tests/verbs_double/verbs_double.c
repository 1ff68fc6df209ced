/*
 * The verbs test double (README.md): libibverbs' entry points with real
 * semantics between processes of one machine, for testing the IB plugin
 * without RDMA hardware. This file: devices, ports and GIDs, contexts and
 * async events, and the environment that describes them:
 *   LOOM_VERBS_DOUBLE_DEVICES  name:ports[,name:ports...], ports one letter
 *                              each: e (active RoCE), i (active IB), d (down)
 *   LOOM_VERBS_DOUBLE_NETDEV   the netdev whose addresses the RoCE GIDs carry
 *   LOOM_VERBS_DOUBLE_FAIL     n[:status]: the n-th send WR fails
 *   LOOM_VERBS_DOUBLE_DMABUF   0: no dma-buf registration (read by vd_mem.c)
 * vd_mem.c has PDs and MRs, vd_cq.c CQs, vd_qp.c QPs and receives, vd_send.c
 * the send side, vd_cuda.c device memory, vd_shm.c the shared memory under
 * them all.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "vd_internal.h"

#define VD_DEFAULT_DEVICES "mlx5_0:e,mlx5_1:i"

static pthread_mutex_t vd_dev_lock = PTHREAD_MUTEX_INITIALIZER;
/* Devices live as long as the process: pointers from old device lists and
 * open contexts stay valid when the environment changes. */
static struct vd_device *vd_devs[VD_MAX_DEVICES * 4];
static int vd_ndevs;

static long vd_fail_nth;
static int vd_fail_status;

static const char *const vd_status_names[] = {
    "SUCCESS",       "LOC_LEN_ERR",      "LOC_QP_OP_ERR",      "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",  "WR_FLUSH_ERR",     "MW_BIND_ERR",        "BAD_RESP_ERR",
    "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",     "REM_OP_ERR",
    "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",  "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR", "INV_EECN_ERR",     "INV_EEC_STATE_ERR",  "FATAL_ERR",
    "RESP_TIMEOUT_ERR", "GENERAL_ERR",   "TM_ERR",             "TM_RNDV_INCOMPLETE"};
#define VD_NSTATUS ((int)(sizeof(vd_status_names) / sizeof(vd_status_names[0])))

struct vd_dev_spec {
  char name[IBV_SYSFS_NAME_MAX];
  int nports;
  struct vd_port_spec port[VD_MAX_PORTS];
};

static int vd_parse_devices(const char *s, struct vd_dev_spec *out, int *n) {
  *n = 0;
  const char *p = s;
  while (*p) {
    if (*n == VD_MAX_DEVICES) {
      vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": more than %d devices", s, VD_MAX_DEVICES);
      return -1;
    }
    struct vd_dev_spec *d = &out[*n];
    memset(d, 0, sizeof(*d));
    size_t len = 0;
    while (p[len] && p[len] != ':' && p[len] != ',') {
      char ch = p[len];
      if (!isalnum((unsigned char)ch) && ch != '_' && ch != '-' && ch != '.') {
        vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": '%c' in a device name (letters, digits, _ - .)",
               s, ch);
        return -1;
      }
      len++;
    }
    if (len == 0 || len >= sizeof(d->name) || p[len] != ':') {
      vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": expected name:ports, e.g. mlx5_0:e,mlx5_1:id "
             "(name up to %zu characters; ports e = RoCE, i = InfiniBand, d = down)",
             s, sizeof(d->name) - 1);
      return -1;
    }
    memcpy(d->name, p, len);
    for (int i = 0; i < *n; i++) {
      if (strcmp(out[i].name, d->name) == 0) {
        vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": device %s named twice", s, d->name);
        return -1;
      }
    }
    p += len + 1;
    while (*p && *p != ',') {
      if (d->nports == VD_MAX_PORTS) {
        vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": %s has more than %d ports", s, d->name,
               VD_MAX_PORTS);
        return -1;
      }
      struct vd_port_spec *pt = &d->port[d->nports++];
      switch (*p) {
      case 'e': *pt = (struct vd_port_spec){IBV_LINK_LAYER_ETHERNET, 1}; break;
      case 'i': *pt = (struct vd_port_spec){IBV_LINK_LAYER_INFINIBAND, 1}; break;
      case 'd': *pt = (struct vd_port_spec){IBV_LINK_LAYER_ETHERNET, 0}; break;
      default:
        vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": port '%c' of %s is not e (RoCE), i "
               "(InfiniBand) or d (down)",
               s, *p, d->name);
        return -1;
      }
      p++;
    }
    if (d->nports == 0) {
      vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": %s has no ports", s, d->name);
      return -1;
    }
    (*n)++;
    if (*p == ',') {
      p++;
      if (!*p) {
        vd_log("LOOM_VERBS_DOUBLE_DEVICES=\"%s\": ends with ','", s);
        return -1;
      }
    }
  }
  return 0;
}

static int vd_parse_status(const char *s, int *status) {
  char *end;
  if (isdigit((unsigned char)*s)) {
    long v = strtol(s, &end, 10);
    if (*end == '\0' && v > 0 && v < VD_NSTATUS) {
      *status = (int)v;
      return 0;
    }
    return -1;
  }
  if (strncasecmp(s, "IBV_WC_", 7) == 0)
    s += 7;
  for (int i = 1; i < VD_NSTATUS; i++) {
    if (strcasecmp(s, vd_status_names[i]) == 0) {
      *status = i;
      return 0;
    }
  }
  return -1;
}

static int vd_parse_fail(void) {
  const char *s = getenv("LOOM_VERBS_DOUBLE_FAIL");
  long nth = 0;
  int status = IBV_WC_RETRY_EXC_ERR;
  if (s && *s) {
    char *end;
    errno = 0;
    nth = strtol(s, &end, 10);
    if (!isdigit((unsigned char)*s) || errno || nth < 1 || (*end && *end != ':') ||
        (*end == ':' && vd_parse_status(end + 1, &status) != 0)) {
      vd_log("LOOM_VERBS_DOUBLE_FAIL=\"%s\": expected n[:status], n >= 1 counting this "
             "process's send WRs, status a number 1-%d or a name such as RETRY_EXC_ERR",
             s, VD_NSTATUS - 1);
      return -1;
    }
  }
  vd_fail_nth = nth;
  vd_fail_status = status;
  return 0;
}

void vd_fail_config(long *nth, int *status) {
  pthread_mutex_lock(&vd_dev_lock);
  *nth = vd_fail_nth;
  *status = vd_fail_status;
  pthread_mutex_unlock(&vd_dev_lock);
}

static struct vd_device *vd_device_get(const struct vd_dev_spec *sp) {
  for (int i = vd_ndevs - 1; i >= 0; i--) {
    struct vd_device *d = vd_devs[i];
    if (strcmp(d->dev.name, sp->name) == 0 && d->nports == sp->nports &&
        memcmp(d->port, sp->port, sizeof(sp->port[0]) * sp->nports) == 0)
      return d;
  }
  if (vd_ndevs == (int)(sizeof(vd_devs) / sizeof(vd_devs[0]))) {
    errno = ENOMEM;
    return NULL;
  }
  struct vd_device *d = calloc(1, sizeof(*d));
  if (!d)
    return NULL;
  d->dev.node_type = IBV_NODE_CA;
  d->dev.transport_type = IBV_TRANSPORT_IB;
  snprintf(d->dev.name, sizeof(d->dev.name), "%s", sp->name);
  snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", vd_ndevs);
  snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/uverbs%d",
           vd_ndevs);
  snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", sp->name);
  d->nports = sp->nports;
  memcpy(d->port, sp->port, sizeof(d->port));
  vd_devs[vd_ndevs++] = d;
  return d;
}

VD_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices) {
  const char *env = getenv("LOOM_VERBS_DOUBLE_DEVICES");
  const char *s = env ? env : VD_DEFAULT_DEVICES;
  struct vd_dev_spec specs[VD_MAX_DEVICES];
  int n;
  pthread_mutex_lock(&vd_dev_lock);
  if (vd_parse_devices(s, specs, &n) != 0 || vd_parse_fail() != 0) {
    pthread_mutex_unlock(&vd_dev_lock);
    errno = EINVAL;
    return NULL;
  }
  struct ibv_device **list = calloc((size_t)n + 1, sizeof(*list));
  for (int i = 0; list && i < n; i++) {
    struct vd_device *d = vd_device_get(&specs[i]);
    if (!d) {
      free(list);
      list = NULL;
      break;
    }
    list[i] = &d->dev;
  }
  pthread_mutex_unlock(&vd_dev_lock);
  if (!list) {
    errno = ENOMEM;
    return NULL;
  }
  if (num_devices)
    *num_devices = n;
  return list;
}

VD_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

VD_EXPORT const char *ibv_get_device_name(struct ibv_device *device) {
  return device ? device->name : NULL;
}

int vd_device_identity(struct vd_device *d) {
  pthread_mutex_lock(&vd_dev_lock);
  int rc = 0;
  if (d->id_pid != getpid()) {
    /* uid 1..0x17ff keeps every LID (uid << 3 | port - 1) a unicast LID. */
    uint32_t uid;
    void *map = vd_shm_create(VD_KIND_DEV, 1, 0x17ff, sizeof(struct vd_hdr), &uid);
    if (map) {
      d->uid = uid;
      d->id_map = map;
      d->id_pid = getpid();
    } else {
      rc = errno;
    }
  }
  pthread_mutex_unlock(&vd_dev_lock);
  return rc;
}

static uint64_t vd_node_guid(const struct vd_device *d) {
  /* A Mellanox OUI (0c:42:a1) and the uid: unique per device and process. */
  return 0x0c42a10300000000ull | ((uint64_t)d->uid << 8);
}

uint64_t vd_port_guid(const struct vd_device *d, int port) { return vd_node_guid(d) + (uint64_t)port; }

uint16_t vd_port_lid(const struct vd_device *d, int port) {
  if (d->port[port - 1].link_layer != IBV_LINK_LAYER_INFINIBAND || !d->port[port - 1].active)
    return 0;
  return (uint16_t)((d->uid << 3) | (uint32_t)(port - 1));
}

VD_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device) {
  struct vd_device *d = (struct vd_device *)device;
  if (!d || vd_device_identity(d) != 0)
    return 0;
  return htobe64(vd_node_guid(d));
}

/* The netdev a RoCE port is attached to, in this process's namespace. */
static int vd_netdev(char *name, size_t len, struct ifaddrs *ifs) {
  const char *env = getenv("LOOM_VERBS_DOUBLE_NETDEV");
  if (env && *env) {
    snprintf(name, len, "%s", env);
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
      if (strcmp(i->ifa_name, env) == 0)
        return 0;
    static int warned;
    if (!warned) {
      warned = 1;
      vd_log("LOOM_VERBS_DOUBLE_NETDEV=%s: no such interface here; the RoCE GID tables have "
             "their link-local entries only",
             env);
    }
    return -1;
  }
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK)) {
      snprintf(name, len, "%s", i->ifa_name);
      return 0;
    }
  }
  snprintf(name, len, "lo");
  return 0;
}

static void vd_gid_add(struct vd_gid_tab *t, const union ibv_gid *g) {
  for (int type = IBV_GID_TYPE_ROCE_V1; type <= IBV_GID_TYPE_ROCE_V2 && t->n < VD_MAX_GIDS; type++) {
    t->gid[t->n] = *g;
    t->type[t->n] = (uint8_t)type;
    t->n++;
  }
}

void vd_port_gids(struct vd_device *d, int port, struct vd_gid_tab *t) {
  memset(t, 0, sizeof(*t));
  union ibv_gid g = {0};
  g.global.subnet_prefix = htobe64(0xfe80000000000000ull);
  g.global.interface_id = htobe64(vd_port_guid(d, port));
  if (d->port[port - 1].link_layer == IBV_LINK_LAYER_INFINIBAND) {
    t->gid[0] = g;
    t->type[0] = IBV_GID_TYPE_IB;
    t->n = 1;
    return;
  }
  /* mlx5's RoCE table: link-local, then each IPv4 and IPv6 address of the
   * netdev, every one as RoCE v1 and v2. */
  vd_gid_add(t, &g);
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs) != 0)
    return;
  char name[IF_NAMESIZE + 1];
  if (vd_netdev(name, sizeof(name), ifs) == 0) {
    t->ifindex = if_nametoindex(name);
    for (int fam = 0; fam < 2; fam++) {
      for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || strcmp(i->ifa_name, name) != 0)
          continue;
        memset(&g, 0, sizeof(g));
        if (fam == 0 && i->ifa_addr->sa_family == AF_INET) {
          g.raw[10] = 0xff;
          g.raw[11] = 0xff;
          memcpy(&g.raw[12], &((struct sockaddr_in *)i->ifa_addr)->sin_addr, 4);
          vd_gid_add(t, &g);
        } else if (fam == 1 && i->ifa_addr->sa_family == AF_INET6) {
          const struct in6_addr *a = &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
          if (IN6_IS_ADDR_LINKLOCAL(a))
            continue;
          memcpy(g.raw, a, 16);
          vd_gid_add(t, &g);
        }
      }
    }
  }
  freeifaddrs(ifs);
}

VD_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
  struct vd_device *d = (struct vd_device *)device;
  if (!d) {
    errno = EINVAL;
    return NULL;
  }
  int rc = vd_device_identity(d);
  if (rc) {
    errno = rc;
    return NULL;
  }
  /* Peers write into this process with process_vm_writev. Under Yama's
   * ptrace_scope 1 (Ubuntu's default) only an ancestor may, unless the
   * process lets others in: a test double may; a real HCA needs nothing. */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  struct vd_context *c = calloc(1, sizeof(*c));
  if (!c)
    return NULL;
  /* async_fd is a semaphore eventfd: one read per event, and O_NONBLOCK on
   * it makes ibv_get_async_event fail with EAGAIN, as in verbs. */
  c->ctx.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c->ctx.async_fd < 0) {
    free(c);
    return NULL;
  }
  c->dev = d;
  c->ctx.device = device;
  c->ctx.cmd_fd = -1;
  c->ctx.num_comp_vectors = 1;
  pthread_mutex_init(&c->ctx.mutex, NULL);
  pthread_mutex_init(&c->ev_lock, NULL);
  /* Not an extended verbs_context: abi_compat stays NULL, so verbs.h's
   * inlines for extended verbs report them unsupported, and the legacy
   * ones call through ops. */
  c->ctx.abi_compat = NULL;
  c->ctx.ops.post_send = vd_post_send;
  c->ctx.ops.post_recv = vd_post_recv;
  c->ctx.ops.poll_cq = vd_poll_cq;
  c->ctx.ops.req_notify_cq = vd_req_notify_cq;
  return &c->ctx;
}

VD_EXPORT int ibv_close_device(struct ibv_context *context) {
  struct vd_context *c = (struct vd_context *)context;
  if (!c)
    return EINVAL;
  close(c->ctx.async_fd);
  pthread_mutex_destroy(&c->ev_lock);
  pthread_mutex_destroy(&c->ctx.mutex);
  free(c);
  return 0;
}

int vd_port_valid(const struct vd_context *c, unsigned port) {
  return port >= 1 && port <= (unsigned)c->dev->nports;
}

VD_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a) {
  struct vd_context *c = (struct vd_context *)context;
  if (!c || !a)
    return EINVAL;
  memset(a, 0, sizeof(*a));
  snprintf(a->fw_ver, sizeof(a->fw_ver), "16.35.2000");
  a->node_guid = htobe64(vd_node_guid(c->dev));
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = UINT64_MAX;
  a->page_size_cap = 0xfffffffffffff000ull;
  a->vendor_id = 0x02c9;
  a->vendor_part_id = 4119; /* ConnectX-5 */
  a->max_qp = 262144;
  a->max_qp_wr = VD_MAX_QP_WR;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = VD_MAX_SGE;
  a->max_sge_rd = VD_MAX_SGE;
  a->max_cq = 16777216;
  a->max_cqe = VD_MAX_CQE;
  a->max_mr = VD_MR_SLOTS - 1;
  a->max_pd = 16777216;
  a->max_qp_rd_atom = VD_MAX_RD_ATOM;
  a->max_res_rd_atom = VD_MAX_RD_ATOM * a->max_qp;
  a->max_qp_init_rd_atom = VD_MAX_RD_ATOM;
  a->atomic_cap = IBV_ATOMIC_NONE; /* no atomics in this double */
  a->max_pkeys = VD_IB_PKEY_TBL_LEN;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = (uint8_t)c->dev->nports;
  return 0;
}

#undef ibv_query_port
VD_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                             struct _compat_ibv_port_attr *port_attr) {
  struct vd_context *c = (struct vd_context *)context;
  struct ibv_port_attr *a = (struct ibv_port_attr *)port_attr;
  if (!c || !a || !vd_port_valid(c, port_num))
    return EINVAL;
  const struct vd_port_spec *p = &c->dev->port[port_num - 1];
  int ib = p->link_layer == IBV_LINK_LAYER_INFINIBAND;
  memset(a, 0, sizeof(*a));
  a->state = p->active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->phys_state = p->active ? 5 /* LinkUp */ : 3 /* Disabled */;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = ib ? IBV_MTU_4096 : IBV_MTU_1024;
  a->gid_tbl_len = ib ? VD_IB_GID_TBL_LEN : VD_ETH_GID_TBL_LEN;
  a->port_cap_flags = ib ? IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP | IBV_PORT_VENDOR_CLASS_SUP |
                               IBV_PORT_SYS_IMAGE_GUID_SUP | IBV_PORT_TRAP_SUP
                         : IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  a->max_msg_sz = VD_MAX_MSG;
  a->pkey_tbl_len = ib ? VD_IB_PKEY_TBL_LEN : 1;
  a->lid = vd_port_lid(c->dev, port_num);
  a->sm_lid = ib && p->active ? 1 : 0;
  a->max_vl_num = ib ? 4 : 0; /* VL0-7 */
  a->subnet_timeout = ib ? 18 : 0;
  a->active_width = 2;  /* 4x */
  a->active_speed = 32; /* EDR: 4 x 25 Gb/s = 100 Gb/s */
  a->link_layer = p->link_layer;
  return 0;
}

static int vd_gid_entry(struct vd_context *c, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *e) {
  if (!c || !vd_port_valid(c, port))
    return EINVAL;
  const struct vd_port_spec *p = &c->dev->port[port - 1];
  uint32_t len = p->link_layer == IBV_LINK_LAYER_INFINIBAND ? VD_IB_GID_TBL_LEN : VD_ETH_GID_TBL_LEN;
  if (index >= len)
    return EINVAL;
  struct vd_gid_tab t;
  vd_port_gids(c->dev, (int)port, &t);
  if ((int)index >= t.n)
    return ENODATA;
  memset(e, 0, sizeof(*e));
  e->gid = t.gid[index];
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = t.type[index];
  e->ndev_ifindex = t.ifindex;
  return 0;
}

VD_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
                            union ibv_gid *gid) {
  struct ibv_gid_entry e;
  if (index < 0 || !gid) {
    errno = EINVAL;
    return -1;
  }
  int rc = vd_gid_entry((struct vd_context *)context, port_num, (uint32_t)index, &e);
  if (rc == ENODATA) {
    memset(gid, 0, sizeof(*gid)); /* an empty entry reads as zeros, as in libibverbs */
    return 0;
  }
  if (rc) {
    errno = rc;
    return -1;
  }
  *gid = e.gid;
  return 0;
}

VD_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                                struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size) {
  if (flags)
    return EOPNOTSUPP;
  if (!entry || entry_size < sizeof(*entry))
    return EINVAL;
  return vd_gid_entry((struct vd_context *)context, port_num, gid_index, entry);
}

VD_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                                       size_t max_entries, uint32_t flags, size_t entry_size) {
  struct vd_context *c = (struct vd_context *)context;
  if (flags)
    return -EOPNOTSUPP;
  if (!c || !entries || entry_size < sizeof(*entries))
    return -EINVAL;
  size_t n = 0;
  for (int port = 1; port <= c->dev->nports; port++) {
    struct vd_gid_tab t;
    vd_port_gids(c->dev, port, &t);
    for (int i = 0; i < t.n; i++) {
      if (n == max_entries)
        return -EINVAL;
      struct ibv_gid_entry *e = (struct ibv_gid_entry *)((char *)entries + n * entry_size);
      memset(e, 0, entry_size);
      e->gid = t.gid[i];
      e->gid_index = (uint32_t)i;
      e->port_num = (uint32_t)port;
      e->gid_type = t.type[i];
      e->ndev_ifindex = t.ifindex;
      n++;
    }
  }
  return (ssize_t)n;
}

void vd_event_raise(struct vd_context *c, enum ibv_event_type type, void *obj) {
  pthread_mutex_lock(&c->ev_lock);
  if (c->ev_count < sizeof(c->ev) / sizeof(c->ev[0])) {
    c->ev[(c->ev_head + c->ev_count) % (sizeof(c->ev) / sizeof(c->ev[0]))] =
        (struct vd_event){type, obj};
    c->ev_count++;
    uint64_t one = 1;
    if (write(c->ctx.async_fd, &one, sizeof(one)) != sizeof(one))
      c->ev_count--;
  }
  pthread_mutex_unlock(&c->ev_lock);
}

VD_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event) {
  struct vd_context *c = (struct vd_context *)context;
  uint64_t v;
  if (!c || !event) {
    errno = EINVAL;
    return -1;
  }
  if (read(c->ctx.async_fd, &v, sizeof(v)) != sizeof(v))
    return -1; /* errno from read: EAGAIN with O_NONBLOCK, EINTR */
  pthread_mutex_lock(&c->ev_lock);
  struct vd_event e = c->ev[c->ev_head];
  c->ev_head = (c->ev_head + 1) % (sizeof(c->ev) / sizeof(c->ev[0]));
  c->ev_count--;
  pthread_mutex_unlock(&c->ev_lock);
  memset(event, 0, sizeof(*event));
  event->event_type = e.type;
  if (e.type == IBV_EVENT_CQ_ERR)
    event->element.cq = e.obj;
  else
    event->element.qp = e.obj;
  return 0;
}

VD_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) {
  if (!event)
    return;
  if (event->event_type == IBV_EVENT_CQ_ERR) {
    struct ibv_cq *cq = event->element.cq;
    pthread_mutex_lock(&cq->mutex);
    cq->async_events_completed++;
    pthread_mutex_unlock(&cq->mutex);
  } else {
    struct ibv_qp *qp = event->element.qp;
    pthread_mutex_lock(&qp->mutex);
    qp->events_completed++;
    pthread_mutex_unlock(&qp->mutex);
  }
}

/* Registered memory is not pinned here (peers reach it with
 * process_vm_writev), so fork is always safe and there is nothing to set. */
VD_EXPORT int ibv_fork_init(void) { return 0; }

VD_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
  static const char *const str[] = {
      [IBV_WC_SUCCESS] = "success",
      [IBV_WC_LOC_LEN_ERR] = "local length error",
      [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
      [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
      [IBV_WC_LOC_PROT_ERR] = "local protection error",
      [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
      [IBV_WC_MW_BIND_ERR] = "memory management operation error",
      [IBV_WC_BAD_RESP_ERR] = "bad response error",
      [IBV_WC_LOC_ACCESS_ERR] = "local access error",
      [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
      [IBV_WC_REM_ACCESS_ERR] = "remote access error",
      [IBV_WC_REM_OP_ERR] = "remote operation error",
      [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
      [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
      [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
      [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
      [IBV_WC_REM_ABORT_ERR] = "aborted error",
      [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
      [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
      [IBV_WC_FATAL_ERR] = "fatal error",
      [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
      [IBV_WC_GENERAL_ERR] = "general error",
      [IBV_WC_TM_ERR] = "TM error",
      [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
  };
  if ((int)status < 0 || status > IBV_WC_TM_RNDV_INCOMPLETE)
    return "unknown";
  return str[status];
}

VD_EXPORT const char *ibv_event_type_str(enum ibv_event_type event) {
  static const char *const str[] = {
      [IBV_EVENT_CQ_ERR] = "CQ error",
      [IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
      [IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
      [IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
      [IBV_EVENT_COMM_EST] = "communication established",
      [IBV_EVENT_SQ_DRAINED] = "send queue drained",
      [IBV_EVENT_PATH_MIG] = "path migrated",
      [IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
      [IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
      [IBV_EVENT_PORT_ACTIVE] = "port active",
      [IBV_EVENT_PORT_ERR] = "port error",
      [IBV_EVENT_LID_CHANGE] = "LID change",
      [IBV_EVENT_PKEY_CHANGE] = "P_Key change",
      [IBV_EVENT_SM_CHANGE] = "SM change",
      [IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
      [IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
      [IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
      [IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
      [IBV_EVENT_GID_CHANGE] = "GID table change",
      [IBV_EVENT_WQ_FATAL] = "WQ fatal",
  };
  if ((int)event < 0 || event > IBV_EVENT_WQ_FATAL)
    return "unknown";
  return str[event];
}

VD_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state) {
  static const char *const str[] = {
      [IBV_PORT_NOP] = "PORT_NOP",       [IBV_PORT_DOWN] = "PORT_DOWN",
      [IBV_PORT_INIT] = "PORT_INIT",     [IBV_PORT_ARMED] = "PORT_ARMED",
      [IBV_PORT_ACTIVE] = "PORT_ACTIVE", [IBV_PORT_ACTIVE_DEFER] = "PORT_ACTIVE_DEFER",
  };
  if ((int)port_state < 0 || port_state > IBV_PORT_ACTIVE_DEFER)
    return "unknown";
  return str[port_state];
}
