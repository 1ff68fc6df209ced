/*
 * Tests of the verbs test double (tests/verbs_double/): devices and GIDs,
 * writes with immediate, sends, RNR, retries, protection and injected
 * failures. The double is used as the IB plugin will use it: dlopen of the library, dlsym of the entry points,
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

#include "vd_client.h"

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

TEST_IMPL(verbs_double_devices) { return vd_run2(vd_devices_rank, NULL); }

TEST_IMPL(verbs_double_write_imm) { return vd_run2(vd_write_imm_rank, NULL); }

TEST_IMPL(verbs_double_send) { return vd_run2(vd_send_rank, NULL); }

TEST_IMPL(verbs_double_rnr) { return vd_run2(vd_rnr_rank, NULL); }

TEST_IMPL(verbs_double_not_ready) { return vd_run2(vd_not_ready_rank, NULL); }

TEST_IMPL(verbs_double_rem_access) { return vd_run2(vd_rem_access_rank, NULL); }

TEST_IMPL(verbs_double_fail_inject) { return vd_run2(vd_fail_rank, NULL); }

TEST_IMPL(verbs_double_bad_address) { return vd_run2(vd_bad_address_rank, NULL); }

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

#endif
