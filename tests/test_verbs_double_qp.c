/*
 * Tests of the verbs test double: QP state, RDMA read, threads, CQ
 * overflow, dead peers, cleanup of its shared objects, and ranks in
 * separate network namespaces (vd_client.h has the pieces).
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

#include "vd_client.h"

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
VD_NOT_BUILT(verbs_double_query_qp)
VD_NOT_BUILT(verbs_double_read)
VD_NOT_BUILT(verbs_double_threads)
VD_NOT_BUILT(verbs_double_cq_overflow)
VD_NOT_BUILT(verbs_double_dead_peer)
VD_NOT_BUILT(verbs_double_cleanup)
VD_NOT_BUILT(verbs_double_netns)

#endif
