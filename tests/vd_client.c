/*
 * The tests' side of the verbs test double: see vd_client.h.
 * SPDX-License-Identifier: Apache-2.0
 */
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
#include "verbs_double/vd_shm.h"

#include "test.h"
#include "vd_client.h"

struct vd_syms vd_syms;

int vd_load(void) {
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

void vd_env(const char *devices, const char *netdev, const char *fail) {
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
int vd_sync(int sock) {
  char c = 's';
  return harness_write_all(sock, &c, 1) || harness_read_all(sock, &c, 1) ? -1 : 0;
}

/* Each side sends len bytes of mine and gets the peer's in theirs. */
int vd_exchange(int sock, const void *mine, void *theirs, size_t len) {
  return harness_write_all(sock, mine, len) || harness_read_all(sock, theirs, len) ? -1 : 0;
}

/* ---- two processes ---- */

int vd_start2(vd_rank_fn fn, void *arg, pid_t pids[2]) {
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
int vd_wait(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return st;
}

int vd_run2(vd_rank_fn fn, void *arg) {
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
int vd_leftovers(pid_t pid) {
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

/* Loads the double on first use; buf is registered with every access. */
int vd_node_open(struct vd_node *n, const char *dev, size_t len) {
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
int vd_node_mr2(struct vd_node *n, int sock, void *buf, size_t len, int access, uint64_t theirs[2]) {
  VCHECK((n->mr2 = V.reg_mr(n->pd, buf, len, access)) != NULL, "reg_mr");
  uint64_t mine[2] = {(uintptr_t)buf, n->mr2->rkey};
  VCHECK(vd_exchange(sock, mine, theirs, sizeof(mine)) == 0, "exchange");
  return 0;
}

int vd_node_close(struct vd_node *n) {
  if (n->mr2)
    VCHECK(V.dereg_mr(n->mr2) == 0, "dereg_mr");
  VCHECK(V.dereg_mr(n->mr) == 0, "dereg_mr");
  VCHECK(V.destroy_cq(n->cq) == 0, "destroy_cq");
  VCHECK(V.dealloc_pd(n->pd) == 0, "dealloc_pd");
  VCHECK(V.close_device(n->ctx) == 0, "close_device");
  free(n->buf);
  return 0;
}

const struct vd_conf vd_conf0 = {
    .gid_index = 3, .rnr_retry = 7, .min_rnr_timer = 12, .timeout = 20, .retry_cnt = 7,
    .hop_limit = 255, .mtu = IBV_MTU_1024, .max_rd_atomic = 1, .max_dest_rd_atomic = 1,
    .access = VD_ACCESS_ALL};

struct ibv_qp *vd_qp_new(struct vd_node *n) {
  struct ibv_qp_init_attr ia = {.send_cq = n->cq, .recv_cq = n->cq, .qp_type = IBV_QPT_RC};
  ia.cap = (struct ibv_qp_cap){.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 4,
                               .max_recv_sge = 4, .max_inline_data = 64};
  return V.create_qp(n->pd, &ia);
}

int vd_qp_init(struct ibv_qp *qp, int access) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                          .qp_access_flags = (unsigned)access};
  return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int vd_qp_rtr(struct vd_node *n, struct ibv_qp *qp, const struct vd_conf *c,
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

int vd_qp_rts(struct ibv_qp *qp, const struct vd_conf *c) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .sq_psn = c->sq_psn, .timeout = (uint8_t)c->timeout,
                          .retry_cnt = (uint8_t)c->retry_cnt, .rnr_retry = (uint8_t)c->rnr_retry,
                          .max_rd_atomic = (uint8_t)c->max_rd_atomic};
  return V.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* A new QP on n, in INIT, and the peer's end of the link (both sides call
 * this in turn). */
int vd_link_begin(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l) {
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
int vd_link_finish(struct vd_node *n, const struct vd_conf *c, struct vd_link *l) {
  struct vd_end to = l->peer;
  to.gid.raw[15] ^= (uint8_t)(c->flip_dgid ? 0x5a : 0);
  to.lid += (uint32_t)c->bump_dlid;
  to.psn += (uint32_t)c->bump_psn;
  to.qpn += (uint32_t)c->bump_qpn;
  VCHECK(vd_qp_rtr(n, l->qp, c, &to) == 0, "modify_qp RTR");
  VCHECK(vd_qp_rts(l->qp, c) == 0, "modify_qp RTS");
  return 0;
}

int vd_link_up(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l) {
  return vd_link_begin(n, sock, c, l) || vd_link_finish(n, c, l);
}

/* The start of most ranks: a node on dev with a buffer of len bytes, and
 * the links listed up to a NULL, all up with conf c. */
int vd_start(struct vd_node *n, const char *dev, size_t len, int sock,
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
int vd_finish(int sock, struct vd_node *n, ...) {
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

int vd_post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_sge *sg,
                   int nsge, uint64_t raddr, uint32_t rkey, uint32_t imm, unsigned flags) {
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = nsge, .opcode = op,
                           .send_flags = flags};
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  struct ibv_send_wr *bad = NULL;
  return ibv_post_send(qp, &wr, &bad);
}

int vd_post_recv1(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sg, int nsge) {
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = nsge}, *bad = NULL;
  return ibv_post_recv(qp, &wr, &bad);
}

/* One completion, or -1 after 20 s (a guard; the runner's limit is the
 * real one). */
int vd_poll1(struct ibv_cq *cq, struct ibv_wc *wc) {
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

struct ibv_qp_attr vd_query(struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  memset(&a, 0, sizeof(a));
  if (V.query_qp(qp, &a, 0, &ia) != 0)
    a.qp_state = (enum ibv_qp_state)-1;
  return a;
}

/* ---- devices, ports and GIDs ---- */

int vd_check_gid(struct ibv_context *ctx, int port, int index, const uint8_t *raw, int type) {
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

int vd_expected_ipv4(struct in_addr *a) {
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

#endif
