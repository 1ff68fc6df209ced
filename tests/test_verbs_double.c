/*
 * Tests of the verbs test double (tests/verbs_double/), used as the IB
 * plugin will use it: dlopen of the library, dlsym of the entry points,
 * and verbs.h's inlines (ibv_post_send, ibv_poll_cq, ...) through the
 * context's ops. Each test forks two processes that exchange QP numbers,
 * addresses and keys over a socketpair made before the fork.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "test.h"

#ifdef LOOM_VERBS_DOUBLE_PATH

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "netns.h"
#include "verbs_double/vd_shm.h"

/* ---- the double, loaded as the plugin loads libibverbs ---- */

static struct {
  void *h;
  struct ibv_device **(*get_device_list)(int *);
  void (*free_device_list)(struct ibv_device **);
  const char *(*get_device_name)(struct ibv_device *);
  __be64 (*get_device_guid)(struct ibv_device *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
  int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
  int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
  int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t,
                      size_t);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  int (*dealloc_pd)(struct ibv_pd *);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
  int (*dereg_mr)(struct ibv_mr *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  int (*destroy_cq)(struct ibv_cq *);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  const char *(*wc_status_str)(enum ibv_wc_status);
  int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
  void (*ack_async_event)(struct ibv_async_event *);
} V;

#define VCHECK(cond, ...)                                                                     \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: [pid %d] check failed: %s: ", __FILE__, __LINE__, (int)getpid(), \
              #cond);                                                                         \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fprintf(stderr, "\n");                                                                  \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

static int vd_load(void) {
  V.h = dlopen(LOOM_VERBS_DOUBLE_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!V.h) {
    fprintf(stderr, "dlopen %s: %s\n", LOOM_VERBS_DOUBLE_PATH, dlerror());
    return -1;
  }
#define SYM(field, name)                                                                      \
  if (!(*(void **)&V.field = dlsym(V.h, name))) {                                             \
    fprintf(stderr, "dlsym %s: %s\n", name, dlerror());                                       \
    return -1;                                                                                \
  }
  SYM(get_device_list, "ibv_get_device_list");
  SYM(free_device_list, "ibv_free_device_list");
  SYM(get_device_name, "ibv_get_device_name");
  SYM(get_device_guid, "ibv_get_device_guid");
  SYM(open_device, "ibv_open_device");
  SYM(close_device, "ibv_close_device");
  SYM(query_device, "ibv_query_device");
  SYM(query_port, "ibv_query_port");
  SYM(query_gid, "ibv_query_gid");
  SYM(query_gid_ex, "_ibv_query_gid_ex");
  SYM(alloc_pd, "ibv_alloc_pd");
  SYM(dealloc_pd, "ibv_dealloc_pd");
  SYM(reg_mr, "ibv_reg_mr");
  SYM(reg_mr_iova2, "ibv_reg_mr_iova2");
  SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
  SYM(dereg_mr, "ibv_dereg_mr");
  SYM(create_cq, "ibv_create_cq");
  SYM(destroy_cq, "ibv_destroy_cq");
  SYM(create_qp, "ibv_create_qp");
  SYM(modify_qp, "ibv_modify_qp");
  SYM(query_qp, "ibv_query_qp");
  SYM(destroy_qp, "ibv_destroy_qp");
  SYM(wc_status_str, "ibv_wc_status_str");
  SYM(get_async_event, "ibv_get_async_event");
  SYM(ack_async_event, "ibv_ack_async_event");
#undef SYM
  if (dlsym(V.h, "ibv_fork_init") == NULL) {
    fprintf(stderr, "dlsym ibv_fork_init: %s\n", dlerror());
    return -1;
  }
  return 0;
}

static void vd_env(const char *devices, const char *netdev, const char *fail) {
  if (devices)
    setenv("LOOM_VERBS_DOUBLE_DEVICES", devices, 1);
  else
    unsetenv("LOOM_VERBS_DOUBLE_DEVICES");
  if (netdev)
    setenv("LOOM_VERBS_DOUBLE_NETDEV", netdev, 1);
  else
    unsetenv("LOOM_VERBS_DOUBLE_NETDEV");
  if (fail)
    setenv("LOOM_VERBS_DOUBLE_FAIL", fail, 1);
  else
    unsetenv("LOOM_VERBS_DOUBLE_FAIL");
}

/* Both ranks meet here. */
static int vd_sync(int sock) {
  char c = 's';
  return harness_write_all(sock, &c, 1) || harness_read_all(sock, &c, 1) ? -1 : 0;
}

/* Each side sends len bytes of mine and gets the peer's in theirs. */
static int vd_exchange(int sock, const void *mine, void *theirs, size_t len) {
  return harness_write_all(sock, mine, len) || harness_read_all(sock, theirs, len) ? -1 : 0;
}

/* ---- two processes ---- */

typedef int (*vd_rank_fn)(int rank, int sock, void *arg);

static int vd_start2(vd_rank_fn fn, void *arg, pid_t pids[2]) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return -1;
  }
  for (int r = 0; r < 2; r++) {
    fflush(stdout);
    fflush(stderr);
    pids[r] = fork();
    if (pids[r] < 0)
      return -1;
    if (pids[r] == 0) {
      close(sv[1 - r]);
      vd_env(NULL, NULL, NULL); /* the double's defaults, whatever the runner's environment says */
      int rc = fn(r, sv[r], arg);
      fflush(stderr);
      exit(rc); /* exit, not _exit: the double cleans up at exit */
    }
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}

/* The wait status of pid. */
static int vd_wait(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return st;
}

static int vd_run2(vd_rank_fn fn, void *arg) {
  pid_t pids[2];
  if (vd_start2(fn, arg, pids) != 0)
    return 1;
  int fail = 0;
  for (int r = 0; r < 2; r++) {
    int st = vd_wait(pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d (pid %d) failed: %s %d\n", r, (int)pids[r],
              WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      fail = 1;
    }
  }
  return fail;
}

/* The double's shared-memory objects owned by pid. */
static int vd_leftovers(pid_t pid) {
  DIR *d = opendir(VD_SHM_DIR);
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, VD_SHM_PREFIX, strlen(VD_SHM_PREFIX)) != 0)
      continue;
    char path[300];
    snprintf(path, sizeof(path), VD_SHM_DIR "/%s", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    struct vd_hdr h;
    if (pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) && h.magic == VD_MAGIC &&
        h.owner_pid == pid) {
      fprintf(stderr, "left over: %s (pid %d)\n", path, (int)pid);
      n++;
    }
    close(fd);
  }
  closedir(d);
  return n;
}

/* ---- a node (device, PD, CQ, one registered buffer) and its links ---- */

struct vd_node {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  unsigned char *buf;
  size_t len;
  struct ibv_port_attr pa;
  struct ibv_mr *mr2; /* a second buffer of the test's (vd_node_mr2), or NULL */
};

#define VD_ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* Loads the double on first use; buf is registered with every access. */
static int vd_node_open(struct vd_node *n, const char *dev, size_t len) {
  memset(n, 0, sizeof(*n));
  VCHECK(V.h != NULL || vd_load() == 0, "load");
  int num;
  struct ibv_device **l = V.get_device_list(&num);
  VCHECK(l != NULL, "ibv_get_device_list: %s", strerror(errno));
  for (int i = 0; i < num && !n->ctx; i++)
    if (strcmp(V.get_device_name(l[i]), dev) == 0)
      n->ctx = V.open_device(l[i]);
  V.free_device_list(l);
  VCHECK(n->ctx != NULL, "no device %s", dev);
  VCHECK(V.query_port(n->ctx, 1, &n->pa) == 0, "query_port");
  VCHECK((n->pd = V.alloc_pd(n->ctx)) != NULL, "alloc_pd: %s", strerror(errno));
  VCHECK((n->cq = V.create_cq(n->ctx, 1024, NULL, NULL, 0)) != NULL, "create_cq: %s", strerror(errno));
  n->len = len;
  VCHECK((n->buf = calloc(1, len)) != NULL, "calloc");
  VCHECK((n->mr = V.reg_mr(n->pd, n->buf, len, VD_ACCESS_ALL)) != NULL, "reg_mr: %s", strerror(errno));
  return 0;
}

/* A second buffer of the test's own, registered with access and told to
 * the peer: theirs gets the peer's {address, rkey}. */
static int vd_node_mr2(struct vd_node *n, int sock, void *buf, size_t len, int access, uint64_t theirs[2]) {
  VCHECK((n->mr2 = V.reg_mr(n->pd, buf, len, access)) != NULL, "reg_mr");
  uint64_t mine[2] = {(uintptr_t)buf, n->mr2->rkey};
  VCHECK(vd_exchange(sock, mine, theirs, sizeof(mine)) == 0, "exchange");
  return 0;
}

static int vd_node_close(struct vd_node *n) {
  if (n->mr2)
    VCHECK(V.dereg_mr(n->mr2) == 0, "dereg_mr");
  VCHECK(V.dereg_mr(n->mr) == 0, "dereg_mr");
  VCHECK(V.destroy_cq(n->cq) == 0, "destroy_cq");
  VCHECK(V.dealloc_pd(n->pd) == 0, "dealloc_pd");
  VCHECK(V.close_device(n->ctx) == 0, "close_device");
  free(n->buf);
  return 0;
}

/* What a side tells its peer. */
struct vd_end {
  uint32_t qpn, rkey, psn, lid;
  uint64_t addr, len;
  union ibv_gid gid;
  int32_t pid;
};

struct vd_conf {
  int gid_index;
  int rnr_retry, min_rnr_timer, timeout, retry_cnt, sl, tc, hop_limit;
  enum ibv_mtu mtu;
  int max_rd_atomic, max_dest_rd_atomic;
  uint32_t sq_psn;
  int access;
  /* Wrong addresses, to see what hardware would do with them. */
  int flip_dgid, bump_dlid, bump_psn, bump_qpn;
};

static const struct vd_conf vd_conf0 = {
    .gid_index = 3, .rnr_retry = 7, .min_rnr_timer = 12, .timeout = 20, .retry_cnt = 7,
    .hop_limit = 255, .mtu = IBV_MTU_1024, .max_rd_atomic = 1, .max_dest_rd_atomic = 1,
    .access = VD_ACCESS_ALL};

struct vd_link {
  struct ibv_qp *qp;
  struct vd_end self, peer;
};

static struct ibv_qp *vd_qp_new(struct vd_node *n) {
  struct ibv_qp_init_attr ia = {.send_cq = n->cq, .recv_cq = n->cq, .qp_type = IBV_QPT_RC};
  ia.cap = (struct ibv_qp_cap){.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 4,
                               .max_recv_sge = 4, .max_inline_data = 64};
  return V.create_qp(n->pd, &ia);
}

static int vd_qp_init(struct ibv_qp *qp, int access) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                          .qp_access_flags = (unsigned)access};
  return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int vd_qp_rtr(struct vd_node *n, struct ibv_qp *qp, const struct vd_conf *c,
                     const struct vd_end *peer) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = c->mtu,
                          .dest_qp_num = peer->qpn, .rq_psn = peer->psn,
                          .max_dest_rd_atomic = (uint8_t)c->max_dest_rd_atomic,
                          .min_rnr_timer = (uint8_t)c->min_rnr_timer};
  a.ah_attr.port_num = 1;
  a.ah_attr.sl = (uint8_t)c->sl;
  a.ah_attr.dlid = (uint16_t)peer->lid;
  if (n->pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = (uint8_t)c->gid_index;
    a.ah_attr.grh.hop_limit = (uint8_t)c->hop_limit;
    a.ah_attr.grh.traffic_class = (uint8_t)c->tc;
  }
  return V.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int vd_qp_rts(struct ibv_qp *qp, const struct vd_conf *c) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .sq_psn = c->sq_psn, .timeout = (uint8_t)c->timeout,
                          .retry_cnt = (uint8_t)c->retry_cnt, .rnr_retry = (uint8_t)c->rnr_retry,
                          .max_rd_atomic = (uint8_t)c->max_rd_atomic};
  return V.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* A new QP on n, in INIT, and the peer's end of the link (both sides call
 * this in turn). */
static int vd_link_begin(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l) {
  memset(l, 0, sizeof(*l));
  VCHECK((l->qp = vd_qp_new(n)) != NULL, "create_qp: %s", strerror(errno));
  VCHECK(vd_qp_init(l->qp, c->access) == 0, "modify_qp INIT");
  l->self.qpn = l->qp->qp_num;
  l->self.rkey = n->mr->rkey;
  l->self.addr = (uintptr_t)n->buf;
  l->self.len = n->len;
  l->self.psn = c->sq_psn;
  l->self.lid = n->pa.lid;
  l->self.pid = getpid();
  if (n->pa.link_layer == IBV_LINK_LAYER_ETHERNET)
    VCHECK(V.query_gid(n->ctx, 1, c->gid_index, &l->self.gid) == 0, "query_gid");
  VCHECK(vd_exchange(sock, &l->self, &l->peer, sizeof(l->self)) == 0, "exchange with the peer");
  return 0;
}

/* RTR and RTS towards the peer. */
static int vd_link_finish(struct vd_node *n, const struct vd_conf *c, struct vd_link *l) {
  struct vd_end to = l->peer;
  to.gid.raw[15] ^= (uint8_t)(c->flip_dgid ? 0x5a : 0);
  to.lid += (uint32_t)c->bump_dlid;
  to.psn += (uint32_t)c->bump_psn;
  to.qpn += (uint32_t)c->bump_qpn;
  VCHECK(vd_qp_rtr(n, l->qp, c, &to) == 0, "modify_qp RTR");
  VCHECK(vd_qp_rts(l->qp, c) == 0, "modify_qp RTS");
  return 0;
}

static int vd_link_up(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l) {
  return vd_link_begin(n, sock, c, l) || vd_link_finish(n, c, l);
}

/* The start of most ranks: a node on dev with a buffer of len bytes, and
 * the links listed up to a NULL, all up with conf c. */
__attribute__((sentinel)) static int vd_start(struct vd_node *n, const char *dev, size_t len, int sock,
                                              const struct vd_conf *c, ...) {
  if (vd_node_open(n, dev, len))
    return 1;
  va_list ap;
  va_start(ap, c);
  int failed = 0;
  for (struct vd_link *l = va_arg(ap, struct vd_link *); l && !failed; l = va_arg(ap, struct vd_link *))
    failed = vd_link_up(n, sock, c, l);
  va_end(ap);
  return failed;
}

/* The end of most ranks: both meet (unless sock < 0), then the links
 * listed up to a NULL are destroyed and n is closed. */
__attribute__((sentinel)) static int vd_finish(int sock, struct vd_node *n, ...) {
  if (sock >= 0)
    VCHECK(vd_sync(sock) == 0, "sync");
  va_list ap;
  va_start(ap, n);
  int failed = 0;
  for (struct vd_link *l = va_arg(ap, struct vd_link *); l && !failed; l = va_arg(ap, struct vd_link *))
    failed = V.destroy_qp(l->qp) != 0;
  va_end(ap);
  VCHECK(!failed, "destroy_qp");
  return vd_node_close(n);
}

static int vd_post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_sge *sg,
                   int nsge, uint64_t raddr, uint32_t rkey, uint32_t imm, unsigned flags) {
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = nsge, .opcode = op,
                           .send_flags = flags};
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  struct ibv_send_wr *bad = NULL;
  return ibv_post_send(qp, &wr, &bad);
}

static int vd_post_recv1(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sg, int nsge) {
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = nsge}, *bad = NULL;
  return ibv_post_recv(qp, &wr, &bad);
}

/* One completion, or -1 after 20 s (a guard; the runner's limit is the
 * real one). */
static int vd_poll1(struct ibv_cq *cq, struct ibv_wc *wc) {
  double end = now_s() + 20;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n == 1)
      return 0;
    if (n < 0 || now_s() > end) {
      fprintf(stderr, "[pid %d] poll_cq: %s\n", (int)getpid(), n < 0 ? "error" : "nothing in 20 s");
      return -1;
    }
    sched_yield();
  }
}

/* Polls one completion and checks its status and wr_id. */
#define VEXPECT(cq, id, st)                                                                   \
  do {                                                                                        \
    struct ibv_wc wc_;                                                                        \
    VCHECK(vd_poll1(cq, &wc_) == 0, "no completion for wr %llu", (unsigned long long)(id));   \
    VCHECK(wc_.wr_id == (id) && (int)wc_.status == (int)(st), "wr_id %llu status %s (%d), expected %llu %s", \
           (unsigned long long)wc_.wr_id, V.wc_status_str(wc_.status), wc_.status,            \
           (unsigned long long)(id), V.wc_status_str(st));                                    \
  } while (0)

static struct ibv_qp_attr vd_query(struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  memset(&a, 0, sizeof(a));
  if (V.query_qp(qp, &a, 0, &ia) != 0)
    a.qp_state = (enum ibv_qp_state)-1;
  return a;
}

/* ---- devices, ports and GIDs ---- */

static int vd_check_gid(struct ibv_context *ctx, int port, int index, const uint8_t *raw, int type) {
  struct ibv_gid_entry e;
  union ibv_gid g;
  VCHECK(V.query_gid_ex(ctx, (uint32_t)port, (uint32_t)index, &e, 0, sizeof(e)) == 0, "gid_ex %d", index);
  VCHECK(V.query_gid(ctx, (uint8_t)port, index, &g) == 0, "query_gid %d", index);
  VCHECK(memcmp(&e.gid, &g, 16) == 0 && (int)e.gid_type == type && e.gid_index == (uint32_t)index &&
             e.port_num == (uint32_t)port,
         "gid %d: type %u, expected %d", index, e.gid_type, type);
  if (raw)
    VCHECK(memcmp(g.raw, raw, 16) == 0, "gid %d has the wrong address", index);
  return 0;
}

static int vd_expected_ipv4(struct in_addr *a) {
  struct ifaddrs *ifs, *i;
  a->s_addr = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&ifs) != 0)
    return -1;
  for (i = ifs; i; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK)) {
      *a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
      break;
    }
  }
  freeifaddrs(ifs);
  return 0;
}

static int vd_devices_rank(int rank, int sock, void *arg) {
  vd_env("mlx5_0:e,mlx5_2:ed,ib_0:i", "lo", NULL);
  VCHECK(vd_load() == 0, "load");
  int n = -1;
  struct ibv_device **l = V.get_device_list(&n);
  VCHECK(l && n == 3 && l[3] == NULL, "device list: %d devices", n);
  static const char *const names[] = {"mlx5_0", "mlx5_2", "ib_0"};
  static const int nports[] = {1, 2, 1};
  uint64_t guids[3];
  uint32_t ib_lid = 0;
  for (int d = 0; d < 3; d++) {
    VCHECK(strcmp(V.get_device_name(l[d]), names[d]) == 0, "device %d is %s", d, V.get_device_name(l[d]));
    struct ibv_context *ctx = V.open_device(l[d]);
    VCHECK(ctx && ctx->device == l[d], "open_device %s", names[d]);
    struct ibv_device_attr da;
    VCHECK(V.query_device(ctx, &da) == 0, "query_device");
    VCHECK(da.phys_port_cnt == nports[d] && da.node_guid == V.get_device_guid(l[d]) && da.node_guid &&
               da.max_qp_wr >= 1024 && da.max_sge >= 4 && da.max_cqe >= 65536 &&
               da.max_qp_rd_atom > 0 && da.vendor_id == 0x02c9,
           "device attributes of %s", names[d]);
    guids[d] = da.node_guid;
    for (int e = 0; e < d; e++)
      VCHECK(guids[e] != guids[d], "devices %d and %d share a node GUID", e, d);
    struct ibv_port_attr pa;
    VCHECK(V.query_port(ctx, 0, &pa) == EINVAL && V.query_port(ctx, (uint8_t)(nports[d] + 1), &pa) == EINVAL,
           "query_port of a port that does not exist");
    for (int p = 1; p <= nports[d]; p++) {
      VCHECK(V.query_port(ctx, (uint8_t)p, &pa) == 0, "query_port %s/%d", names[d], p);
      int ib = d == 2, down = d == 1 && p == 2;
      VCHECK(pa.state == (down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE), "%s/%d state %d", names[d], p, pa.state);
      VCHECK(pa.link_layer == (ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET), "link layer");
      VCHECK(pa.active_mtu == (ib ? IBV_MTU_4096 : IBV_MTU_1024) && pa.max_mtu == IBV_MTU_4096, "mtu");
      VCHECK(pa.active_speed == 32 && pa.active_width == 2, "100 Gb/s: 4x EDR");
      VCHECK(ib ? pa.lid != 0 : pa.lid == 0, "lid %u", pa.lid);
      VCHECK(pa.gid_tbl_len >= 16 && pa.max_msg_sz >= (1u << 30), "gid table and message size");
      VCHECK(ib || (pa.port_cap_flags & IBV_PORT_IP_BASED_GIDS), "RoCE ports have IP-based GIDs");
      if (ib)
        ib_lid = pa.lid;
      union ibv_gid g;
      struct ibv_gid_entry ge;
      uint8_t ll[16] = {0xfe, 0x80};
      if (ib) {
        VCHECK(vd_check_gid(ctx, p, 0, NULL, IBV_GID_TYPE_IB) == 0, "IB GID 0");
        VCHECK(V.query_gid(ctx, (uint8_t)p, 0, &g) == 0 && memcmp(g.raw, ll, 8) == 0 &&
                   g.global.interface_id != 0,
               "IB GID 0 is fe80::<port guid>");
        VCHECK(V.query_gid_ex(ctx, (uint32_t)p, 1, &ge, 0, sizeof(ge)) == ENODATA, "IB GID 1 is empty");
        VCHECK(V.query_gid(ctx, (uint8_t)p, 1, &g) == 0 && g.global.subnet_prefix == 0 &&
                   g.global.interface_id == 0,
               "an empty GID reads as zeros");
      } else {
        VCHECK(V.query_gid(ctx, (uint8_t)p, 0, &g) == 0 && memcmp(g.raw, ll, 8) == 0, "fe80 prefix");
        memcpy(ll, g.raw, 16);
        uint8_t v4[16] = {[10] = 0xff, [11] = 0xff, [12] = 127, [13] = 0, [14] = 0, [15] = 1};
        VCHECK(vd_check_gid(ctx, p, 0, ll, IBV_GID_TYPE_ROCE_V1) == 0 &&
                   vd_check_gid(ctx, p, 1, ll, IBV_GID_TYPE_ROCE_V2) == 0 &&
                   vd_check_gid(ctx, p, 2, v4, IBV_GID_TYPE_ROCE_V1) == 0 &&
                   vd_check_gid(ctx, p, 3, v4, IBV_GID_TYPE_ROCE_V2) == 0,
               "RoCE GIDs 0-3 of %s/%d", names[d], p);
        int first_empty = 4;
        while (first_empty < 16 &&
               V.query_gid_ex(ctx, (uint32_t)p, (uint32_t)first_empty, &ge, 0, sizeof(ge)) == 0)
          first_empty++;
        VCHECK(first_empty < 16 && (first_empty % 2) == 0, "GIDs come in v1/v2 pairs");
        VCHECK(V.query_gid_ex(ctx, (uint32_t)p, (uint32_t)first_empty, &ge, 0, sizeof(ge)) == ENODATA &&
                   V.query_gid(ctx, (uint8_t)p, first_empty, &g) == 0 && g.global.interface_id == 0,
               "unused GID index");
      }
      VCHECK(V.query_gid(ctx, (uint8_t)p, pa.gid_tbl_len, &g) == -1 &&
                 V.query_gid_ex(ctx, (uint32_t)p, (uint32_t)pa.gid_tbl_len, &ge, 0, sizeof(ge)) == EINVAL,
             "GID index past the table");
    }
    VCHECK(V.close_device(ctx) == 0, "close_device");
  }
  V.free_device_list(l);

  /* The other process is another host: its LIDs and GUIDs differ. */
  uint64_t mine[4] = {guids[0], guids[1], guids[2], ib_lid}, theirs[4];
  VCHECK(vd_exchange(sock, mine, theirs, sizeof(mine)) == 0, "exchange");
  VCHECK(mine[3] != theirs[3], "IB LIDs must be unique across processes");
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      VCHECK(mine[i] != theirs[j], "node GUIDs must be unique across processes");
  if (rank == 1)
    return 0;

  static const char *const bad_devices[] = {"mlx5_0", "mlx5_0:x", "mlx5_0:e,", "a:e,a:i", "a b:e",
                                            ":e", "mlx5_0:", "x:eeeeeeeee"};
  for (size_t i = 0; i < sizeof(bad_devices) / sizeof(bad_devices[0]); i++) {
    vd_env(bad_devices[i], NULL, NULL);
    errno = 0;
    VCHECK(V.get_device_list(&n) == NULL && errno == EINVAL, "spec \"%s\" accepted", bad_devices[i]);
  }
  static const char *const bad_fail[] = {"abc", "0", "-1", "3:NOPE", "3:0", "3:", "3x"};
  for (size_t i = 0; i < sizeof(bad_fail) / sizeof(bad_fail[0]); i++) {
    vd_env(NULL, NULL, bad_fail[i]);
    errno = 0;
    VCHECK(V.get_device_list(&n) == NULL && errno == EINVAL, "FAIL=\"%s\" accepted", bad_fail[i]);
  }
  static const char *const good_fail[] = {"3:REM_ACCESS_ERR", "2:12", "5:ibv_wc_retry_exc_err", "7"};
  for (size_t i = 0; i < sizeof(good_fail) / sizeof(good_fail[0]); i++) {
    vd_env(NULL, NULL, good_fail[i]);
    VCHECK((l = V.get_device_list(&n)) != NULL, "FAIL=\"%s\" refused", good_fail[i]);
    V.free_device_list(l);
  }
  vd_env("", NULL, NULL);
  VCHECK((l = V.get_device_list(&n)) != NULL && n == 0 && l[0] == NULL, "an empty spec is no devices");
  V.free_device_list(l);

  /* Defaults: mlx5_0 RoCE and mlx5_1 IB, on the first up interface. */
  vd_env(NULL, NULL, NULL);
  VCHECK((l = V.get_device_list(&n)) != NULL && n == 2 && strcmp(V.get_device_name(l[0]), "mlx5_0") == 0 &&
             strcmp(V.get_device_name(l[1]), "mlx5_1") == 0,
         "default devices");
  struct ibv_context *c0 = V.open_device(l[0]), *c1 = V.open_device(l[1]);
  struct ibv_port_attr pa0, pa1;
  VCHECK(c0 && c1 && V.query_port(c0, 1, &pa0) == 0 && V.query_port(c1, 1, &pa1) == 0 &&
             pa0.link_layer == IBV_LINK_LAYER_ETHERNET && pa1.link_layer == IBV_LINK_LAYER_INFINIBAND,
         "default ports");
  struct in_addr want;
  VCHECK(vd_expected_ipv4(&want) == 0, "getifaddrs");
  uint8_t v4[16] = {[10] = 0xff, [11] = 0xff};
  memcpy(&v4[12], &want, 4);
  VCHECK(vd_check_gid(c0, 1, 3, v4, IBV_GID_TYPE_ROCE_V2) == 0, "GID 3 is the first up interface's IPv4");
  vd_env(NULL, "no-such-netdev0", NULL);
  struct ibv_gid_entry ge;
  VCHECK(V.query_gid_ex(c0, 1, 2, &ge, 0, sizeof(ge)) == ENODATA, "a missing netdev gives no IP GIDs");
  struct ibv_pd *pd = V.alloc_pd(c0);
  /* dma-buf as NCCL probes it: a bad fd is EBADF where dma-bufs are
   * taken, EOPNOTSUPP on a NIC without (unit_net_gdr.c moves data). */
  errno = 0;
  VCHECK(pd && V.reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EBADF, "dma-buf");
  setenv("LOOM_VERBS_DOUBLE_DMABUF", "0", 1);
  VCHECK(V.reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP, "no dma-buf");
  unsetenv("LOOM_VERBS_DOUBLE_DMABUF");
  VCHECK(V.dealloc_pd(pd) == 0, "dealloc_pd");
  V.close_device(c0);
  V.close_device(c1);
  V.free_device_list(l);
  return 0;
}

/* ---- RDMA write with immediate, many messages in order ---- */

#define WI_N 3000
#define WI_DEPTH 32
#define WI_SLOTS 64
#define WI_SLOT 256

static uint32_t wi_len(int i) { return 1 + (uint32_t)(i * 37) % WI_SLOT; }
static unsigned char wi_byte(int i, uint32_t k) { return (unsigned char)(i * 131 + k * 7 + 1); }

static int vd_write_imm_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l;
  if (vd_start(&n, "mlx5_0", WI_SLOTS * WI_SLOT, sock, &vd_conf0, &l, NULL))
    return 1;
  if (rank == 1) {
    for (int r = 0; r < WI_DEPTH; r++)
      VCHECK(vd_post_recv1(l.qp, (uint64_t)r, NULL, 0) == 0, "post_recv");
    int next_recv = WI_DEPTH;
    for (int i = 0; i < WI_N; i++) {
      struct ibv_wc wc;
      VCHECK(vd_poll1(n.cq, &wc) == 0, "message %d", i);
      VCHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
                 (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == (uint32_t)i &&
                 wc.byte_len == wi_len(i) && wc.wr_id == (uint64_t)i && wc.qp_num == l.qp->qp_num &&
                 wc.src_qp == l.peer.qpn,
             "message %d: status %d opcode %d imm %u len %u wr_id %llu", i, wc.status, wc.opcode,
             ntohl(wc.imm_data), wc.byte_len, (unsigned long long)wc.wr_id);
      unsigned char *slot = n.buf + (i % WI_SLOTS) * WI_SLOT;
      for (uint32_t k = 0; k < wi_len(i); k++)
        VCHECK(slot[k] == wi_byte(i, k), "message %d byte %u", i, k);
      VCHECK(vd_post_recv1(l.qp, (uint64_t)next_recv++, NULL, 0) == 0, "post_recv");
    }
  } else {
    /* Signal every WR for the first half, every 4th after: a completion
     * covers the unsignaled ones before it. */
    int done = 0; /* WRs known complete */
    for (int i = 0; i < WI_N; i++) {
      while (done <= i - WI_SLOTS + 4) {
        struct ibv_wc wc;
        VCHECK(vd_poll1(n.cq, &wc) == 0, "send completion");
        VCHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id >= (uint64_t)done,
               "send completion %llu status %d", (unsigned long long)wc.wr_id, wc.status);
        done = (int)wc.wr_id + 1;
      }
      unsigned char *slot = n.buf + (i % WI_SLOTS) * WI_SLOT;
      uint32_t len = wi_len(i);
      for (uint32_t k = 0; k < len; k++)
        slot[k] = wi_byte(i, k);
      uint32_t first = len / 3;
      struct ibv_sge sg[2] = {{(uintptr_t)slot, first, n.mr->lkey},
                              {(uintptr_t)slot + first, len - first, n.mr->lkey}};
      int signaled = i < WI_N / 2 || i % 4 == 3 || i == WI_N - 1;
      VCHECK(vd_post(l.qp, (uint64_t)i, IBV_WR_RDMA_WRITE_WITH_IMM, sg, 2,
                     l.peer.addr + (uint64_t)(i % WI_SLOTS) * WI_SLOT, l.peer.rkey, (uint32_t)i,
                     signaled ? IBV_SEND_SIGNALED : 0) == 0,
             "post_send %d", i);
    }
    while (done < WI_N) {
      struct ibv_wc wc;
      VCHECK(vd_poll1(n.cq, &wc) == 0 && wc.status == IBV_WC_SUCCESS, "last completions");
      done = (int)wc.wr_id + 1;
    }
  }
  return vd_finish(sock, &n, &l, NULL);
}

/* ---- SEND: scatter into the receive WR, inline data, short buffers ---- */

static int vd_send_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l;
  if (vd_start(&n, "mlx5_0", 8192, sock, &vd_conf0, &l, NULL))
    return 1;
  if (rank == 1) {
    struct ibv_sge sg[3] = {{(uintptr_t)n.buf, 10, n.mr->lkey},
                            {(uintptr_t)n.buf + 1000, 20, n.mr->lkey},
                            {(uintptr_t)n.buf + 2000, 1000, n.mr->lkey}};
    struct ibv_sge sg2 = {(uintptr_t)n.buf + 4096, 64, n.mr->lkey};
    struct ibv_sge sg3 = {(uintptr_t)n.buf + 5000, 16, n.mr->lkey};
    VCHECK(vd_post_recv1(l.qp, 1, sg, 3) == 0 && vd_post_recv1(l.qp, 2, &sg2, 1) == 0 &&
               vd_post_recv1(l.qp, 3, &sg3, 1) == 0 && vd_post_recv1(l.qp, 4, &sg3, 1) == 0,
           "post_recv");
    VCHECK(vd_sync(sock) == 0, "sync");
    struct ibv_wc wc;
    VCHECK(vd_poll1(n.cq, &wc) == 0 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS &&
               wc.opcode == IBV_WC_RECV && wc.byte_len == 500 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
               ntohl(wc.imm_data) == 77,
           "send with imm: wr %llu status %d len %u", (unsigned long long)wc.wr_id, wc.status, wc.byte_len);
    for (int k = 0; k < 500; k++) {
      unsigned char *at = k < 10 ? n.buf + k : k < 30 ? n.buf + 1000 + (k - 10) : n.buf + 2000 + (k - 30);
      VCHECK(*at == (unsigned char)(k ^ 0x33), "scattered byte %d", k);
    }
    VCHECK(n.buf[2000 + 470] == 0, "nothing past the message");
    VCHECK(vd_poll1(n.cq, &wc) == 0 && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS &&
               wc.byte_len == 40 && !(wc.wc_flags & IBV_WC_WITH_IMM),
           "inline send");
    for (int k = 0; k < 40; k++)
      VCHECK(n.buf[4096 + k] == (unsigned char)(200 + k), "inline byte %d", k);
    /* 100 bytes into 16: the receiver's WR fails, its QP goes to error. */
    VEXPECT(n.cq, 3, IBV_WC_LOC_LEN_ERR);
    VEXPECT(n.cq, 4, IBV_WC_WR_FLUSH_ERR);
    VCHECK(vd_query(l.qp).qp_state == IBV_QPS_ERR, "receiver QP in error");
  } else {
    for (int k = 0; k < 500; k++)
      n.buf[k] = (unsigned char)(k ^ 0x33);
    VCHECK(vd_sync(sock) == 0, "sync");
    struct ibv_sge sg[2] = {{(uintptr_t)n.buf, 123, n.mr->lkey}, {(uintptr_t)n.buf + 123, 377, n.mr->lkey}};
    VCHECK(vd_post(l.qp, 1, IBV_WR_SEND_WITH_IMM, sg, 2, 0, 0, 77, IBV_SEND_SIGNALED) == 0, "send");
    VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
    unsigned char stack[40];
    for (int k = 0; k < 40; k++)
      stack[k] = (unsigned char)(200 + k);
    struct ibv_sge in = {(uintptr_t)stack, 40, 0}; /* inline: no lkey */
    VCHECK(vd_post(l.qp, 2, IBV_WR_SEND, &in, 1, 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE) == 0,
           "inline send");
    memset(stack, 0, sizeof(stack)); /* inline data was taken at post time */
    VEXPECT(n.cq, 2, IBV_WC_SUCCESS);
    unsigned char big[65];
    struct ibv_sge in2 = {(uintptr_t)big, 65, 0};
    VCHECK(vd_post(l.qp, 9, IBV_WR_SEND, &in2, 1, 0, 0, 0, IBV_SEND_INLINE) == EINVAL,
           "inline data past max_inline_data");
    struct ibv_sge sg3 = {(uintptr_t)n.buf, 100, n.mr->lkey};
    VCHECK(vd_post(l.qp, 3, IBV_WR_SEND, &sg3, 1, 0, 0, 0, 0) == 0, "send");
    VEXPECT(n.cq, 3, IBV_WC_REM_INV_REQ_ERR); /* unsignaled, but errors complete */
  }
  return vd_finish(sock, &n, &l, NULL);
}

/* ---- RNR: the write waits for the receive WR ---- */

static int vd_rnr_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l, l2;
  struct vd_conf c = vd_conf0, c2 = vd_conf0;
  c.min_rnr_timer = 1; /* 10 us */
  c2.rnr_retry = 2;
  c2.min_rnr_timer = 1;
  if (vd_start(&n, "mlx5_1", 4096, sock, &c, &l, NULL) || vd_link_up(&n, sock, &c2, &l2))
    return 1;
  char token;
  if (rank == 1) {
    VCHECK(harness_read_all(sock, &token, 1) == 0, "wait for the sender's post");
    VCHECK(n.buf[0] == 0, "no data before a receive WR was posted");
    VCHECK(vd_post_recv1(l.qp, 42, NULL, 0) == 0, "post_recv");
    struct ibv_wc wc;
    VCHECK(vd_poll1(n.cq, &wc) == 0 && wc.wr_id == 42 && wc.status == IBV_WC_SUCCESS &&
               ntohl(wc.imm_data) == 5 && wc.byte_len == 8,
           "the write arrives once a receive is posted");
    VCHECK(memcmp(n.buf, "rnr-data", 8) == 0, "data");
    VCHECK(harness_write_all(sock, "d", 1) == 0, "done");
  } else {
    memcpy(n.buf, "rnr-data", 8);
    struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, l.peer.addr, l.peer.rkey, 5,
                   IBV_SEND_SIGNALED) == 0,
           "post_send");
    struct ibv_wc wc;
    VCHECK(ibv_poll_cq(n.cq, 1, &wc) == 0, "no completion while the receiver has no WR");
    VCHECK(harness_write_all(sock, "p", 1) == 0, "tell the receiver");
    VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
    VCHECK(harness_read_all(sock, &token, 1) == 0, "receiver done");
    /* rnr_retry 2: three tries, then the WR fails and the QP with it. */
    VCHECK(vd_post(l2.qp, 7, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, l2.peer.addr, l2.peer.rkey, 6, 0) == 0,
           "post_send");
    VCHECK(vd_post(l2.qp, 8, IBV_WR_RDMA_WRITE, &sg, 1, l2.peer.addr, l2.peer.rkey, 0, 0) == 0,
           "post_send");
    VEXPECT(n.cq, 7, IBV_WC_RNR_RETRY_EXC_ERR);
    VEXPECT(n.cq, 8, IBV_WC_WR_FLUSH_ERR);
    VCHECK(vd_query(l2.qp).qp_state == IBV_QPS_ERR, "QP in error after RNR retries ran out");
  }
  return vd_finish(sock, &n, &l, &l2, NULL);
}

/* ---- a responder not yet at RTR: retransmission, then RETRY_EXC_ERR ---- */

static int vd_not_ready_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l, l2;
  struct vd_conf c2 = vd_conf0;
  c2.timeout = 1; /* 8.192 us, twice: the responder never gets there */
  c2.retry_cnt = 1;
  if (vd_node_open(&n, "mlx5_0", 4096) || vd_link_begin(&n, sock, &vd_conf0, &l) ||
      vd_link_begin(&n, sock, &c2, &l2))
    return 1;
  char token;
  if (rank == 1) {
    VCHECK(harness_read_all(sock, &token, 1) == 0, "wait for the sender's post");
    VCHECK(vd_link_finish(&n, &vd_conf0, &l) == 0, "RTR late");
    VCHECK(harness_read_all(sock, &token, 1) == 0, "wait for the sender");
    VCHECK(memcmp(n.buf, "late", 4) == 0, "the write arrived once the responder was at RTR");
  } else {
    VCHECK(vd_link_finish(&n, &vd_conf0, &l) == 0 && vd_link_finish(&n, &c2, &l2) == 0, "RTS");
    memcpy(n.buf, "late", 4);
    struct ibv_sge sg = {(uintptr_t)n.buf, 4, n.mr->lkey};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_WRITE, &sg, 1, l.peer.addr, l.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post_send");
    struct ibv_wc wc;
    VCHECK(ibv_poll_cq(n.cq, 1, &wc) == 0, "no completion while the responder is in INIT");
    VCHECK(harness_write_all(sock, "p", 1) == 0, "tell the responder");
    VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
    VCHECK(vd_post(l2.qp, 2, IBV_WR_RDMA_WRITE, &sg, 1, l2.peer.addr, l2.peer.rkey, 0, 0) == 0, "post_send");
    VEXPECT(n.cq, 2, IBV_WC_RETRY_EXC_ERR);
    VCHECK(harness_write_all(sock, "d", 1) == 0, "done");
  }
  return vd_finish(sock, &n, &l, &l2, NULL);
}

/* ---- remote and local protection ---- */

static int vd_rem_access_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link a, b, c, d;
  if (vd_start(&n, "mlx5_0", 4096, sock, &vd_conf0, &a, &b, &c, &d, NULL))
    return 1;
  /* A second buffer without remote write. */
  static unsigned char ro[4096];
  uint64_t theirs[2];
  if (vd_node_mr2(&n, sock, ro, sizeof(ro), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, theirs))
    return 1;
  errno = 0;
  VCHECK(V.reg_mr(n.pd, ro, sizeof(ro), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
         "remote write needs local write");
  errno = 0;
  VCHECK(V.reg_mr(n.pd, (void *)(uintptr_t)4096, 4096, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT,
         "registering unmapped memory");
  if (rank == 1) {
    VCHECK(vd_post_recv1(a.qp, 100, NULL, 0) == 0, "post_recv");
    VCHECK(vd_sync(sock) == 0, "sync");
    VCHECK(vd_sync(sock) == 0, "sync"); /* the sender is done */
    /* The responder of a bad write goes to error too: its receive is
     * flushed and its owner gets the async event. */
    VEXPECT(n.cq, 100, IBV_WC_WR_FLUSH_ERR);
    VCHECK(vd_query(a.qp).qp_state == IBV_QPS_ERR, "responder QP in error");
    int fl = fcntl(n.ctx->async_fd, F_GETFL);
    VCHECK(fcntl(n.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "nonblocking async fd");
    /* a, b and c were hit (past the MR; no remote write on ro; a bad rkey). */
    struct ibv_async_event ev;
    int seen = 0;
    for (int i = 0; i < 3; i++) {
      VCHECK(V.get_async_event(n.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_QP_ACCESS_ERR, "async event %d", i);
      seen |= ev.element.qp == a.qp ? 1 : ev.element.qp == b.qp ? 2 : ev.element.qp == c.qp ? 4 : 8;
      V.ack_async_event(&ev);
    }
    VCHECK(seen == 7, "one access error event for each of a, b and c: %#x", seen);
    errno = 0;
    VCHECK(V.get_async_event(n.ctx, &ev) == -1 && errno == EAGAIN, "no more events");
    VCHECK(ro[0] == 0 && n.buf[4095] == 0, "nothing written");
  } else {
    VCHECK(vd_sync(sock) == 0, "sync");
    struct ibv_sge sg = {(uintptr_t)n.buf, 16, n.mr->lkey};
    /* Past the end of the peer's MR. */
    VCHECK(vd_post(a.qp, 1, IBV_WR_RDMA_WRITE, &sg, 1, a.peer.addr + 4090, a.peer.rkey, 0, 0) == 0 &&
               vd_post(a.qp, 2, IBV_WR_RDMA_WRITE, &sg, 1, a.peer.addr, a.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post_send");
    VEXPECT(n.cq, 1, IBV_WC_REM_ACCESS_ERR);
    VEXPECT(n.cq, 2, IBV_WC_WR_FLUSH_ERR);
    VCHECK(vd_query(a.qp).qp_state == IBV_QPS_ERR, "requester QP in error");
    /* An MR without remote write. */
    VCHECK(vd_post(b.qp, 3, IBV_WR_RDMA_WRITE, &sg, 1, theirs[0], (uint32_t)theirs[1], 0, 0) == 0, "post");
    VEXPECT(n.cq, 3, IBV_WC_REM_ACCESS_ERR);
    /* An rkey nobody has. */
    VCHECK(vd_post(c.qp, 4, IBV_WR_RDMA_WRITE, &sg, 1, c.peer.addr, c.peer.rkey ^ 0x5500, 0, 0) == 0, "post");
    VEXPECT(n.cq, 4, IBV_WC_REM_ACCESS_ERR);
    /* A local SGE outside its MR, and one with a bad lkey. */
    struct ibv_sge bad = {(uintptr_t)n.buf + 4000, 200, n.mr->lkey};
    VCHECK(vd_post(d.qp, 5, IBV_WR_RDMA_WRITE, &bad, 1, d.peer.addr, d.peer.rkey, 0, 0) == 0, "post");
    VEXPECT(n.cq, 5, IBV_WC_LOC_PROT_ERR);
    VCHECK(vd_sync(sock) == 0, "sync");
  }
  return vd_finish(sock, &n, &a, &b, &c, &d, NULL);
}

/* ---- LOOM_VERBS_DOUBLE_FAIL ---- */

static int vd_fail_rank(int rank, int sock, void *arg) {
  vd_env(NULL, NULL, rank == 0 ? "3:REM_OP_ERR" : "1");
  struct vd_node n;
  struct vd_link l;
  if (vd_start(&n, "mlx5_0", 4096, sock, &vd_conf0, &l, NULL))
    return 1;
  if (rank == 0) {
    for (int i = 0; i < 5; i++) {
      memset(n.buf + 64 * i, 'a' + i, 64);
      struct ibv_sge sg = {(uintptr_t)n.buf + 64 * i, 64, n.mr->lkey};
      VCHECK(vd_post(l.qp, (uint64_t)i, IBV_WR_RDMA_WRITE, &sg, 1, l.peer.addr + 64 * (uint64_t)i, l.peer.rkey,
                     0, IBV_SEND_SIGNALED) == 0,
             "post_send %d", i);
    }
    VEXPECT(n.cq, 0, IBV_WC_SUCCESS);
    VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
    VEXPECT(n.cq, 2, IBV_WC_REM_OP_ERR);
    VEXPECT(n.cq, 3, IBV_WC_WR_FLUSH_ERR);
    VEXPECT(n.cq, 4, IBV_WC_WR_FLUSH_ERR);
    VCHECK(vd_query(l.qp).qp_state == IBV_QPS_ERR, "QP in error after the injected failure");
    VCHECK(vd_sync(sock) == 0, "sync");
  } else {
    VCHECK(vd_sync(sock) == 0, "sync");
    for (int i = 0; i < 5; i++)
      for (int k = 0; k < 64; k++)
        VCHECK(n.buf[64 * i + k] == (i < 2 ? 'a' + i : 0), "slot %d byte %d: %d", i, k, n.buf[64 * i + k]);
    /* FAIL=1: this process's first send WR, with the default status. */
    struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
    VCHECK(vd_post(l.qp, 9, IBV_WR_RDMA_WRITE, &sg, 1, l.peer.addr, l.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post_send");
    VEXPECT(n.cq, 9, IBV_WC_RETRY_EXC_ERR);
  }
  return vd_finish(sock, &n, &l, NULL);
}

/* ---- wrong addresses: no error at modify time, RETRY_EXC_ERR at send ---- */

static int vd_bad_address_rank(int rank, int sock, void *arg) {
  struct vd_node e, i;
  struct vd_link good, dgid, psn, qpn, ibgood, dlid;
  struct vd_conf c_dgid = vd_conf0, c_psn = vd_conf0, c_qpn = vd_conf0, c_dlid = vd_conf0;
  /* Only rank 0 addresses its peer wrongly. */
  c_dgid.flip_dgid = rank == 0;
  c_psn.bump_psn = rank == 1; /* rank 1 expects a PSN rank 0 does not send */
  c_qpn.bump_qpn = rank == 0 ? 1 : 0;
  c_dlid.bump_dlid = rank == 0;
  if (vd_node_open(&e, "mlx5_0", 4096) || vd_node_open(&i, "mlx5_1", 4096) ||
      vd_link_up(&e, sock, &vd_conf0, &good) || vd_link_up(&e, sock, &c_dgid, &dgid) ||
      vd_link_up(&e, sock, &c_psn, &psn) || vd_link_up(&e, sock, &c_qpn, &qpn) ||
      vd_link_up(&i, sock, &vd_conf0, &ibgood) || vd_link_up(&i, sock, &c_dlid, &dlid))
    return 1;
  if (rank == 0) {
    struct ibv_sge sg = {(uintptr_t)e.buf, 8, e.mr->lkey}, sgi = {(uintptr_t)i.buf, 8, i.mr->lkey};
    struct {
      struct vd_link *l;
      struct vd_node *n;
      struct ibv_sge *sg;
      int status;
    } cases[] = {{&good, &e, &sg, IBV_WC_SUCCESS},        {&dgid, &e, &sg, IBV_WC_RETRY_EXC_ERR},
                 {&psn, &e, &sg, IBV_WC_RETRY_EXC_ERR},   {&qpn, &e, &sg, IBV_WC_RETRY_EXC_ERR},
                 {&ibgood, &i, &sgi, IBV_WC_SUCCESS},     {&dlid, &i, &sgi, IBV_WC_RETRY_EXC_ERR}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
      struct vd_link *l = cases[k].l;
      VCHECK(vd_post(l->qp, k, IBV_WR_RDMA_WRITE, cases[k].sg, 1, l->peer.addr, l->peer.rkey, 0,
                     IBV_SEND_SIGNALED) == 0 &&
                 vd_post(l->qp, 100 + k, IBV_WR_RDMA_WRITE, cases[k].sg, 1, l->peer.addr, l->peer.rkey, 0,
                         IBV_SEND_SIGNALED) == 0,
             "post_send case %zu", k);
      VEXPECT(cases[k].n->cq, k, cases[k].status);
      VEXPECT(cases[k].n->cq, 100 + k,
              cases[k].status == IBV_WC_SUCCESS ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR);
    }
  }
  return vd_finish(sock, &e, &good, &dgid, &psn, &qpn, NULL) || vd_finish(-1, &i, &ibgood, &dlid, NULL);
}

/* ---- ibv_query_qp returns what modify_qp set; transitions ---- */

static int vd_query_qp_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l;
  struct vd_conf c = vd_conf0;
  c.timeout = 14;
  c.retry_cnt = 5;
  c.rnr_retry = 6;
  c.sl = 3;
  c.tc = 106;
  c.hop_limit = 64;
  c.gid_index = 3;
  c.min_rnr_timer = 9;
  c.max_rd_atomic = 4;
  c.max_dest_rd_atomic = 2;
  c.sq_psn = rank == 0 ? 0x123456 : 0xabcdef;
  c.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (vd_start(&n, "mlx5_0", 4096, sock, &c, &l, NULL))
    return 1;
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  VCHECK(V.query_qp(l.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_TIMEOUT, &ia) == 0, "query_qp");
  VCHECK(a.qp_state == IBV_QPS_RTS && l.qp->state == IBV_QPS_RTS, "state %d", a.qp_state);
  VCHECK(a.timeout == 14 && a.retry_cnt == 5 && a.rnr_retry == 6 && a.min_rnr_timer == 9, "timers");
  VCHECK(a.ah_attr.sl == 3 && a.ah_attr.is_global == 1 && a.ah_attr.grh.traffic_class == 106 &&
             a.ah_attr.grh.hop_limit == 64 && a.ah_attr.grh.sgid_index == 3 &&
             memcmp(&a.ah_attr.grh.dgid, &l.peer.gid, 16) == 0 && a.ah_attr.port_num == 1,
         "address");
  VCHECK(a.path_mtu == IBV_MTU_1024 && a.dest_qp_num == l.peer.qpn && a.sq_psn == c.sq_psn &&
             a.rq_psn == l.peer.psn && a.max_rd_atomic == 4 && a.max_dest_rd_atomic == 2 &&
             a.qp_access_flags == (unsigned)c.access && a.port_num == 1 && a.pkey_index == 0,
         "path");
  VCHECK(ia.qp_type == IBV_QPT_RC && ia.cap.max_send_wr == 128 && ia.cap.max_inline_data == 64 &&
             ia.send_cq == n.cq,
         "init attributes");
  /* The PSNs agree: a write goes through. */
  if (rank == 0) {
    struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_WRITE, &sg, 1, l.peer.addr, l.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post");
    VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
  }

  /* Transitions and masks verbs refuses. */
  struct ibv_qp *q = vd_qp_new(&n);
  VCHECK(q != NULL && q->state == IBV_QPS_RESET, "create_qp");
  struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE}, *bad = NULL;
  VCHECK(ibv_post_send(q, &wr, &bad) == EINVAL && bad == &wr, "post_send before RTS");
  struct ibv_recv_wr rwr = {.wr_id = 1}, *rbad = NULL;
  VCHECK(ibv_post_recv(q, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv in RESET");
  VCHECK(vd_qp_rtr(&n, q, &c, &l.peer) == EINVAL, "RESET to RTR");
  struct ibv_qp_attr x = {.qp_state = IBV_QPS_INIT, .port_num = 1};
  VCHECK(V.modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX) == EINVAL, "INIT without access");
  x.port_num = 3;
  VCHECK(V.modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) == EINVAL,
         "a port that does not exist");
  VCHECK(vd_qp_init(q, IBV_ACCESS_REMOTE_WRITE) == 0, "RESET to INIT");
  VCHECK(ibv_post_recv(q, &rwr, &rbad) == 0, "post_recv in INIT");
  VCHECK(vd_qp_rts(q, &c) == EINVAL, "INIT to RTS");
  struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = l.peer.qpn};
  VCHECK(V.modify_qp(q, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL,
         "RTR without min_rnr_timer");
  struct vd_conf cc = c;
  cc.gid_index = 200;
  VCHECK(vd_qp_rtr(&n, q, &cc, &l.peer) == EINVAL, "an empty source GID index");
  r.ah_attr.is_global = 0;
  VCHECK(V.modify_qp(q, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == EINVAL,
         "RoCE without a GRH");
  VCHECK(vd_qp_rtr(&n, q, &c, &l.peer) == 0, "INIT to RTR");
  cc = c;
  cc.timeout = 32;
  VCHECK(vd_qp_rts(q, &cc) == EINVAL, "timeout 32");
  struct ibv_qp_attr t = {.qp_state = IBV_QPS_RTS, .dest_qp_num = 5};
  VCHECK(V.modify_qp(q, &t, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_DEST_QPN) == EINVAL,
         "RTS with a mask it does not take");
  struct ibv_qp_attr e = {.qp_state = IBV_QPS_ERR};
  VCHECK(V.modify_qp(q, &e, IBV_QP_STATE) == 0 && vd_query(q).qp_state == IBV_QPS_ERR, "to ERR");
  VEXPECT(n.cq, 1, IBV_WC_WR_FLUSH_ERR); /* the receive posted in INIT */
  VCHECK(ibv_post_send(q, &wr, &bad) == 0, "post_send in ERR is taken");
  VEXPECT(n.cq, 1, IBV_WC_WR_FLUSH_ERR);
  e.qp_state = IBV_QPS_RESET;
  VCHECK(V.modify_qp(q, &e, IBV_QP_STATE) == 0 && vd_qp_init(q, 0) == 0, "ERR to RESET to INIT");
  VCHECK(V.destroy_qp(q) == 0, "destroy_qp");
  struct ibv_qp_init_attr ud = {.send_cq = n.cq, .recv_cq = n.cq, .qp_type = IBV_QPT_UD, .cap = {1, 1, 1, 1, 0}};
  errno = 0;
  VCHECK(V.create_qp(n.pd, &ud) == NULL && errno == EOPNOTSUPP, "RC only");
  VCHECK(V.destroy_cq(n.cq) == EBUSY && V.dealloc_pd(n.pd) == EBUSY, "CQ and PD in use");

  return vd_finish(sock, &n, &l, NULL);
}

/* ---- RDMA read ---- */

static int vd_read_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l, l2;
  if (vd_start(&n, "mlx5_1", 8192, sock, &vd_conf0, &l, &l2, NULL))
    return 1;
  static unsigned char wo[4096];
  uint64_t theirs[2];
  if (vd_node_mr2(&n, sock, wo, sizeof(wo), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, theirs))
    return 1;
  if (rank == 1) {
    for (int k = 0; k < 8192; k++)
      n.buf[k] = (unsigned char)(k * 13 + 5);
    VCHECK(vd_sync(sock) == 0, "sync");
  } else {
    VCHECK(vd_sync(sock) == 0, "sync");
    struct ibv_sge sg[2] = {{(uintptr_t)n.buf + 16, 1000, n.mr->lkey}, {(uintptr_t)n.buf + 4096, 2000, n.mr->lkey}};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_READ, sg, 2, l.peer.addr + 100, l.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post read");
    struct ibv_wc wc;
    VCHECK(vd_poll1(n.cq, &wc) == 0 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS &&
               wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 3000,
           "read completion: status %d opcode %d len %u", wc.status, wc.opcode, wc.byte_len);
    for (int k = 0; k < 3000; k++) {
      unsigned char got = k < 1000 ? n.buf[16 + k] : n.buf[4096 + k - 1000];
      VCHECK(got == (unsigned char)((100 + k) * 13 + 5), "byte %d", k);
    }
    /* Reading an MR that allows remote write only. */
    VCHECK(vd_post(l2.qp, 2, IBV_WR_RDMA_READ, sg, 1, theirs[0], (uint32_t)theirs[1], 0, 0) == 0, "post read");
    VEXPECT(n.cq, 2, IBV_WC_REM_ACCESS_ERR);
  }
  return vd_finish(sock, &n, &l, &l2, NULL);
}

/* ---- several threads posting and polling at once ---- */

#define TH_QPS 2
#define TH_N 2000

struct th_ctx {
  struct vd_node *n;
  struct vd_link *l;
  int t;
  _Atomic int *done; /* completions seen, per QP */
  _Atomic int failed;
};

static int th_poll_some(struct th_ctx *c) {
  struct ibv_wc wc[8];
  int got = ibv_poll_cq(c->n->cq, 8, wc);
  if (got < 0)
    return -1;
  for (int k = 0; k < got; k++) {
    int q = -1;
    for (int j = 0; j < TH_QPS; j++)
      if (wc[k].qp_num == c->l[j].qp->qp_num)
        q = j;
    if (wc[k].status != IBV_WC_SUCCESS || q < 0) {
      fprintf(stderr, "completion status %d qp %u\n", wc[k].status, wc[k].qp_num);
      return -1;
    }
    atomic_fetch_add(&c->done[q], 1);
  }
  return got;
}

/* A sender thread: its own QP, the node's CQ and MR shared with the other. */
static void *th_sender(void *arg) {
  struct th_ctx *c = arg;
  struct vd_link *l = &c->l[c->t];
  for (int i = 0; i < TH_N && !atomic_load(&c->failed); i++) {
    uint64_t *src = (uint64_t *)(void *)c->n->buf + c->t * TH_N + i;
    *src = (uint64_t)c->t << 32 | (uint64_t)i;
    struct ibv_sge sg = {(uintptr_t)src, 8, c->n->mr->lkey};
    int rc;
    while ((rc = vd_post(l->qp, (uint64_t)i, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1,
                         l->peer.addr + ((uint64_t)c->t * TH_N + (uint64_t)i) * 8, l->peer.rkey,
                         (uint32_t)(c->t << 16 | i), IBV_SEND_SIGNALED)) == ENOMEM)
      if (th_poll_some(c) < 0)
        goto fail;
    if (rc != 0)
      goto fail;
    if (th_poll_some(c) < 0)
      goto fail;
  }
  while (atomic_load(&c->done[0]) + atomic_load(&c->done[1]) < TH_QPS * TH_N && !atomic_load(&c->failed))
    if (th_poll_some(c) < 0)
      goto fail;
  return NULL;
fail:
  atomic_store(&c->failed, 1);
  return NULL;
}

/* The receiver's poster: keeps receive WRs posted while the main thread
 * polls. */
static void *th_poster(void *arg) {
  struct th_ctx *c = arg;
  int posted[TH_QPS] = {0};
  while ((posted[0] < TH_N || posted[1] < TH_N) && !atomic_load(&c->failed)) {
    for (int q = 0; q < TH_QPS; q++) {
      if (posted[q] < TH_N && posted[q] - atomic_load(&c->done[q]) < 100) {
        if (vd_post_recv1(c->l[q].qp, (uint64_t)posted[q], NULL, 0) != 0) {
          atomic_store(&c->failed, 1);
          return NULL;
        }
        posted[q]++;
      }
    }
    sched_yield();
  }
  return NULL;
}

static int vd_threads_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l[TH_QPS];
  struct vd_conf c = vd_conf0;
  c.min_rnr_timer = 1;
  if (vd_start(&n, "mlx5_1", TH_QPS * TH_N * 8, sock, &c, &l[0], &l[1], NULL))
    return 1;
  _Atomic int done[TH_QPS] = {0};
  struct th_ctx ctx[TH_QPS];
  pthread_t th[TH_QPS];
  for (int t = 0; t < TH_QPS; t++)
    ctx[t] = (struct th_ctx){.n = &n, .l = l, .t = t, .done = done};
  if (rank == 0) {
    for (int t = 0; t < TH_QPS; t++)
      VCHECK(pthread_create(&th[t], NULL, th_sender, &ctx[t]) == 0, "pthread_create");
    int failed = 0;
    for (int t = 0; t < TH_QPS; t++) {
      pthread_join(th[t], NULL);
      failed |= atomic_load(&ctx[t].failed);
    }
    VCHECK(!failed, "a sender thread failed");
    VCHECK(done[0] == TH_N && done[1] == TH_N, "completions %d %d", done[0], done[1]);
  } else {
    VCHECK(pthread_create(&th[0], NULL, th_poster, &ctx[0]) == 0, "pthread_create");
    int next[TH_QPS] = {0};
    while ((next[0] < TH_N || next[1] < TH_N) && !atomic_load(&ctx[0].failed)) {
      struct ibv_wc wc;
      int got = ibv_poll_cq(n.cq, 1, &wc);
      VCHECK(got >= 0, "poll_cq");
      if (!got)
        continue;
      int q = wc.qp_num == l[0].qp->qp_num ? 0 : 1;
      uint32_t imm = ntohl(wc.imm_data);
      /* In order per QP, whatever the threads did. */
      VCHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == l[q].qp->qp_num && imm == (uint32_t)(q << 16 | next[q]) &&
                 wc.wr_id == (uint64_t)next[q],
             "qp %d message %d: status %d imm %#x wr_id %llu", q, next[q], wc.status, imm,
             (unsigned long long)wc.wr_id);
      uint64_t v = ((uint64_t *)(void *)n.buf)[q * TH_N + next[q]];
      VCHECK(v == ((uint64_t)q << 32 | (uint64_t)next[q]), "qp %d message %d data", q, next[q]);
      next[q]++;
      atomic_fetch_add(&done[q], 1);
    }
    pthread_join(th[0], NULL);
    VCHECK(!atomic_load(&ctx[0].failed), "the poster thread failed");
  }
  return vd_finish(sock, &n, &l[0], &l[1], NULL);
}

/* ---- CQ overflow is fatal ---- */

static int vd_cq_overflow_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l;
  if (vd_start(&n, "mlx5_0", 4096, sock, &vd_conf0, &l, NULL))
    return 1;
  if (rank == 0) {
    struct ibv_cq *small = V.create_cq(n.ctx, 2, NULL, NULL, 0);
    VCHECK(small && small->cqe >= 2, "create_cq");
    struct ibv_qp_init_attr ia = {.send_cq = small, .recv_cq = n.cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *q = V.create_qp(n.pd, &ia);
    VCHECK(q != NULL, "create_qp");
    /* q sends to a QP of this same process: loopback works too. */
    struct ibv_qp *q2 = vd_qp_new(&n);
    VCHECK(q2 && vd_qp_init(q, VD_ACCESS_ALL) == 0 && vd_qp_init(q2, VD_ACCESS_ALL) == 0, "INIT");
    struct vd_end e1 = {.qpn = q->qp_num}, e2 = {.qpn = q2->qp_num};
    VCHECK(V.query_gid(n.ctx, 1, 3, &e1.gid) == 0, "query_gid");
    e2.gid = e1.gid;
    VCHECK(vd_qp_rtr(&n, q, &vd_conf0, &e2) == 0 && vd_qp_rts(q, &vd_conf0) == 0 &&
               vd_qp_rtr(&n, q2, &vd_conf0, &e1) == 0 && vd_qp_rts(q2, &vd_conf0) == 0,
           "a loopback connection inside one process");
    struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
    for (int i = 0; i < 3; i++)
      VCHECK(vd_post(q, (uint64_t)i, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)n.buf + 64, n.mr->rkey, 0,
                     IBV_SEND_SIGNALED) == 0,
             "post %d", i);
    struct ibv_wc wc[4];
    errno = 0;
    VCHECK(ibv_poll_cq(small, 4, wc) == -1 && errno == EOVERFLOW, "an overrun CQ fails poll_cq");
    VCHECK(vd_query(q).qp_state == IBV_QPS_ERR, "the QP whose completion was lost is in error");
    int fl = fcntl(n.ctx->async_fd, F_GETFL);
    VCHECK(fcntl(n.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "nonblocking");
    struct ibv_async_event ev;
    VCHECK(V.get_async_event(n.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small,
           "CQ_ERR event");
    V.ack_async_event(&ev);
    VCHECK(small->async_events_completed == 1, "acked");
    VCHECK(V.destroy_qp(q) == 0 && V.destroy_qp(q2) == 0 && V.destroy_cq(small) == 0, "cleanup");
  }
  return vd_finish(sock, &n, &l, NULL);
}

/* ---- a peer whose QP is destroyed, or who dies ---- */

static int vd_dead_peer_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link a, b;
  if (vd_start(&n, "mlx5_0", 4096, sock, &vd_conf0, &a, &b, NULL))
    return 1;
  if (rank == 1) {
    VCHECK(V.destroy_qp(b.qp) == 0, "destroy_qp");
    VCHECK(vd_sync(sock) == 0, "sync");
    char c;
    harness_read_all(sock, &c, 1); /* killed in here */
    return 1;
  }
  struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
  VCHECK(vd_post(a.qp, 1, IBV_WR_RDMA_WRITE, &sg, 1, a.peer.addr, a.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
  VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
  VCHECK(vd_sync(sock) == 0, "sync");
  VCHECK(vd_post(b.qp, 2, IBV_WR_RDMA_WRITE, &sg, 1, b.peer.addr, b.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
  VEXPECT(n.cq, 2, IBV_WC_RETRY_EXC_ERR);
  /* Kill the peer outright (no exit handlers) and wait until it is gone. */
  int pfd = (int)syscall(SYS_pidfd_open, (pid_t)a.peer.pid, 0);
  VCHECK(pfd >= 0 && kill((pid_t)a.peer.pid, SIGKILL) == 0, "kill the peer");
  struct pollfd p = {.fd = pfd, .events = POLLIN};
  VCHECK(poll(&p, 1, 20000) == 1, "the peer exits");
  close(pfd);
  VCHECK(vd_post(a.qp, 3, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, a.peer.addr, a.peer.rkey, 0, 0) == 0 &&
             vd_post(a.qp, 4, IBV_WR_RDMA_WRITE, &sg, 1, a.peer.addr, a.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
         "post");
  VEXPECT(n.cq, 3, IBV_WC_RETRY_EXC_ERR);
  VEXPECT(n.cq, 4, IBV_WC_WR_FLUSH_ERR);
  return vd_finish(-1, &n, &a, &b, NULL); /* no meeting: the peer is dead */
}

/* ---- nothing left in /dev/shm ---- */

static int vd_cleanup_rank(int rank, int sock, void *arg) {
  struct vd_node n;
  struct vd_link l;
  if (vd_start(&n, "mlx5_0", 4096, sock, &vd_conf0, &l, NULL))
    return 1;
  if (rank == 1)
    VCHECK(vd_post_recv1(l.qp, 1, NULL, 0) == 0, "post_recv");
  VCHECK(vd_sync(sock) == 0, "sync");
  if (rank == 0) {
    struct ibv_sge sg = {(uintptr_t)n.buf, 8, n.mr->lkey};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, l.peer.addr, l.peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
           "post");
  }
  VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
  VCHECK(vd_sync(sock) == 0, "sync");
  if (rank == 1)
    return 0; /* exit without destroying anything: the double cleans up */
  return vd_finish(-1, &n, &l, NULL);
}

/* Makes some objects and leaves by _exit, which runs no exit handlers. */
static int vd_crash_child(void) {
  struct vd_node n;
  if (vd_node_open(&n, "mlx5_0", 4096) != 0 || !vd_qp_new(&n))
    _exit(1);
  _exit(0);
}

/* Opens a device, which allocates (and so sweeps stale objects). */
static int vd_sweep_child(void) {
  struct vd_node n;
  if (vd_node_open(&n, "mlx5_0", 4096) != 0 || vd_node_close(&n) != 0)
    return 1;
  return 0;
}

static int vd_run1(int (*fn)(void), pid_t *pid) {
  fflush(stderr);
  *pid = fork();
  if (*pid == 0) {
      exit(fn());
  }
  int st = vd_wait(*pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- ranks in separate network namespaces ---- */

static struct netns_hosts vd_hosts;

static int vd_netns_rank(int rank, int sock, void *arg) {
  if (netns_enter(&vd_hosts, rank) != 0)
    return 1;
  /* The double's default netdev: the namespace's lmeth0. */
  struct vd_node n;
  struct vd_link l;
  if (vd_node_open(&n, "mlx5_0", 4096))
    return 1;
  uint8_t v4[16] = {[10] = 0xff, [11] = 0xff}, v6[16];
  VCHECK(inet_pton(AF_INET, vd_hosts.addr[rank], &v4[12]) == 1 && inet_pton(AF_INET6, vd_hosts.addr6[rank], v6) == 1,
         "addresses");
  VCHECK(vd_check_gid(n.ctx, 1, 3, v4, IBV_GID_TYPE_ROCE_V2) == 0, "GID 3 is this namespace's IPv4");
  VCHECK(vd_check_gid(n.ctx, 1, 4, v6, IBV_GID_TYPE_ROCE_V1) == 0 && vd_check_gid(n.ctx, 1, 5, v6, IBV_GID_TYPE_ROCE_V2) == 0,
         "GIDs 4 and 5 are its IPv6 address");
  struct vd_conf c = vd_conf0;
  c.gid_index = rank == 0 ? 3 : 5;
  if (vd_link_up(&n, sock, &c, &l))
    return 1;
  if (rank == 1)
    VCHECK(vd_post_recv1(l.qp, 1, NULL, 0) == 0, "post_recv");
  VCHECK(vd_sync(sock) == 0, "sync");
  if (rank == 0) {
    memcpy(n.buf, "netns!", 6);
    struct ibv_sge sg = {(uintptr_t)n.buf, 6, n.mr->lkey};
    VCHECK(vd_post(l.qp, 1, IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, l.peer.addr, l.peer.rkey, 9, IBV_SEND_SIGNALED) == 0,
           "post");
  }
  VEXPECT(n.cq, 1, IBV_WC_SUCCESS);
  if (rank == 1)
    VCHECK(memcmp(n.buf, "netns!", 6) == 0, "data across namespaces");
  return vd_finish(sock, &n, &l, NULL);
}

TEST_IMPL(verbs_double_devices) { return vd_run2(vd_devices_rank, NULL); }
TEST_IMPL(verbs_double_write_imm) { return vd_run2(vd_write_imm_rank, NULL); }
TEST_IMPL(verbs_double_send) { return vd_run2(vd_send_rank, NULL); }
TEST_IMPL(verbs_double_rnr) { return vd_run2(vd_rnr_rank, NULL); }
TEST_IMPL(verbs_double_not_ready) { return vd_run2(vd_not_ready_rank, NULL); }
TEST_IMPL(verbs_double_rem_access) { return vd_run2(vd_rem_access_rank, NULL); }
TEST_IMPL(verbs_double_fail_inject) { return vd_run2(vd_fail_rank, NULL); }
TEST_IMPL(verbs_double_bad_address) { return vd_run2(vd_bad_address_rank, NULL); }
TEST_IMPL(verbs_double_query_qp) { return vd_run2(vd_query_qp_rank, NULL); }
TEST_IMPL(verbs_double_read) { return vd_run2(vd_read_rank, NULL); }
TEST_IMPL(verbs_double_threads) { return vd_run2(vd_threads_rank, NULL); }
TEST_IMPL(verbs_double_cq_overflow) { return vd_run2(vd_cq_overflow_rank, NULL); }

TEST_IMPL(verbs_double_dead_peer) {
  pid_t pids[2];
  ASSERT(vd_start2(vd_dead_peer_rank, NULL, pids) == 0);
  int st0 = vd_wait(pids[0]), st1 = vd_wait(pids[1]);
  ASSERT_MSG(WIFEXITED(st0) && WEXITSTATUS(st0) == 0, "the surviving rank failed");
  ASSERT_MSG(WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL, "the peer was not killed");
  /* The killed peer could not clean up; the next allocation anywhere (a
   * test running alongside, or this sweeper) removes what it left. */
  pid_t sweeper;
  ASSERT(vd_run1(vd_sweep_child, &sweeper) == 0);
  ASSERT_MSG(vd_leftovers(pids[1]) == 0, "stale objects of a dead process are swept");
  return 0;
}

TEST_IMPL(verbs_double_cleanup) {
  pid_t pids[2];
  ASSERT(vd_start2(vd_cleanup_rank, NULL, pids) == 0);
  int st0 = vd_wait(pids[0]), st1 = vd_wait(pids[1]);
  ASSERT_MSG(WIFEXITED(st0) && WEXITSTATUS(st0) == 0 && WIFEXITED(st1) && WEXITSTATUS(st1) == 0, "a rank failed");
  ASSERT_MSG(vd_leftovers(pids[0]) == 0, "objects left after destroying everything");
  ASSERT_MSG(vd_leftovers(pids[1]) == 0, "objects left after exit without destroying");
  pid_t crashed, sweeper;
  ASSERT(vd_run1(vd_crash_child, &crashed) == 0); /* its objects stay until a sweep */
  ASSERT(vd_run1(vd_sweep_child, &sweeper) == 0);
  ASSERT_MSG(vd_leftovers(crashed) == 0 && vd_leftovers(sweeper) == 0, "swept, and the sweeper left nothing");
  return 0;
}

TEST_IMPL(verbs_double_netns) {
  int rc = netns_hosts_up(&vd_hosts, 2, NETNS_IPV6);
  if (rc != 0)
    return rc;
  rc = vd_run2(vd_netns_rank, NULL);
  netns_hosts_down(&vd_hosts);
  return rc;
}

#else /* the double needs <infiniband/verbs.h> */

#define VD_NOT_BUILT(name)                                                                    \
  TEST_IMPL(name) { SKIP("the verbs test double was not built: no <infiniband/verbs.h>"); }
VD_NOT_BUILT(verbs_double_devices)
VD_NOT_BUILT(verbs_double_write_imm)
VD_NOT_BUILT(verbs_double_send)
VD_NOT_BUILT(verbs_double_rnr)
VD_NOT_BUILT(verbs_double_not_ready)
VD_NOT_BUILT(verbs_double_rem_access)
VD_NOT_BUILT(verbs_double_fail_inject)
VD_NOT_BUILT(verbs_double_bad_address)
VD_NOT_BUILT(verbs_double_query_qp)
VD_NOT_BUILT(verbs_double_read)
VD_NOT_BUILT(verbs_double_threads)
VD_NOT_BUILT(verbs_double_cq_overflow)
VD_NOT_BUILT(verbs_double_dead_peer)
VD_NOT_BUILT(verbs_double_cleanup)
VD_NOT_BUILT(verbs_double_netns)

#endif
