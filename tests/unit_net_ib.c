/*
 * The IB plugin's pieces in one process, over the verbs test double
 * (tests/verbs_double/): device and port discovery with NCCL_IB_HCA, the
 * automatic RoCE GID choice, QP attributes from the environment, messages
 * split over QPs, the registration cache, and the sentences of failures.
 * Each test is a process of its own, since the plugin scans devices once.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"
#include "test.h"
#include "transport/net/net.h"
#include "transport/net/net_gdr.h"
#include "transport/net/ib/net_ib.h"

#if defined(LOOM_VERBS_DOUBLE_PATH) && LOOM_HAVE_IBVERBS_HEADERS
static const struct net_plugin *p = &net_ib_plugin;

static void use_double(const char *devices) {
  setenv("LOOM_IB_VERBS_LIB", LOOM_VERBS_DOUBLE_PATH, 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("LOOM_VERBS_DOUBLE_NETDEV", "lo", 1);
  if (devices)
    setenv("LOOM_VERBS_DOUBLE_DEVICES", devices, 1);
}

/* A connected sender and receiver on device `dev`. */
static void pair(int dev, void **s, void **r) {
  char handle[NET_HANDLE_MAXSIZE];
  void *l = NULL;
  ASSERT_MSG(p->listen(dev, handle, &l) == ncclSuccess, "%s", err_thread_last());
  *s = *r = NULL;
  ncclResult_t a = ncclInProgress, b = ncclInProgress;
  while (a == ncclInProgress || b == ncclInProgress) {
    if (a == ncclInProgress)
      a = p->connect(dev, handle, s);
    if (b == ncclInProgress)
      b = p->accept(l, r);
  }
  ASSERT_MSG(a == ncclSuccess && b == ncclSuccess, "connect %d accept %d: %s", (int)a, (int)b, err_thread_last());
  p->close_listen(l);
}

/* Posts a receive, then the send, and waits for both: the result of the
 * first failure, or success. */
static ncclResult_t transfer(void *s, void *r, void *smh, void *rmh, char *src, size_t n, char *dst, size_t cap,
                             size_t *got) {
  void *rreq = NULL, *sreq = NULL;
  ncclResult_t res = p->irecv(r, dst, cap, rmh, &rreq);
  if (res != ncclSuccess)
    return res;
  ASSERT(rreq != NULL);
  while (sreq == NULL)
    if ((res = p->isend(s, src, n, smh, &sreq)) != ncclSuccess)
      return res;
  int sd = 0, rd = 0;
  while (!sd || !rd) {
    if (!sd && (res = p->test(sreq, &sd, NULL)) != ncclSuccess)
      return res;
    if (!rd && (res = p->test(rreq, &rd, got)) != ncclSuccess)
      return res;
  }
  return ncclSuccess;
}

TEST_IMPL(unit_ib_devices) {
  use_double("mlx5_0:e,mlx5_1:i,mlx5_2:ed,mlx4_0:i");
  setenv("NCCL_IB_HCA", "^=mlx5_1", 1);
  int n = 0;
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  ASSERT_OK(p->devices(&n));
  ASSERT_MSG(n == 3, "%d devices", n);
  const char *names[] = {"mlx5_0", "mlx5_2", "mlx4_0"};
  for (int i = 0; i < n; i++) {
    struct net_props pr;
    ASSERT_OK(p->get_properties(i, &pr));
    ASSERT_MSG(strcmp(pr.name, names[i]) == 0 && pr.port == 1, "device %d is %s:%d", i, pr.name, pr.port);
    ASSERT_MSG(pr.speed_mbps == 100000, "%s: %d Mb/s", pr.name, pr.speed_mbps);
    /* Host memory, dma-bufs (the double takes them), device pointers only
     * where nvidia-peermem is loaded. */
    ASSERT_MSG(pr.ptr_support == (NET_PTR_HOST | NET_PTR_DMABUF | (gdr_peermem_loaded("") ? NET_PTR_CUDA : 0)),
               "ptr_support 0x%x", pr.ptr_support);
  }
  /* RoCE ports choose the RoCE v2 GID of the socket interface's IPv4
   * address (index 3 in the double's mlx5-like table); IB ports none. */
  ASSERT_MSG(ib_devs[0].gid_index == 3, "gid index %d", ib_devs[0].gid_index);
  ASSERT(ib_devs[0].gid.raw[10] == 0xff && ib_devs[0].gid.raw[12] == 127);
  ASSERT(ib_devs[2].gid_index == -1 && ib_devs[2].lid != 0);
  return 0;
}

TEST_IMPL(unit_ib_no_device) {
  use_double("mlx5_0:d");
  int n = -1;
  ASSERT(p->init() == ncclSystemError);
  ASSERT_MSG(strstr(err_thread_last(), "no active port"), "%s", err_thread_last());
  ASSERT(p->devices(&n) != ncclSuccess);
  return 0;
}

TEST_IMPL(unit_ib_hca_malformed) {
  use_double(NULL);
  setenv("NCCL_IB_HCA", "mlx5_0:x", 1);
  ASSERT(p->init() == ncclInvalidArgument);
  ASSERT_MSG(strstr(err_thread_last(), "NCCL_IB_HCA=mlx5_0:x"), "%s", err_thread_last());
  return 0;
}

TEST_IMPL(unit_ib_gid_env) {
  use_double("mlx5_0:e");
  setenv("NCCL_IB_GID_INDEX", "1", 1);
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  ASSERT(ib_devs[0].gid_index == 1);
  ASSERT(ib_devs[0].gid.raw[0] == 0xfe && ib_devs[0].gid.raw[1] == 0x80);
  return 0;
}

TEST_IMPL(unit_ib_gid_roce_v1) {
  use_double("mlx5_0:e");
  setenv("NCCL_IB_ROCE_VERSION_NUM", "1", 1);
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  ASSERT_MSG(ib_devs[0].gid_index == 2, "gid index %d", ib_devs[0].gid_index);
  return 0;
}

/* Messages of many sizes over three QPs per connection, on a RoCE and an
 * InfiniBand port; the QPs carry what the environment asked for. */
TEST_IMPL(unit_ib_transfer) {
  use_double("mlx5_0:e,mlx5_1:i");
  setenv("NCCL_IB_QPS_PER_CONNECTION", "3", 1);
  setenv("NCCL_IB_TIMEOUT", "14", 1);
  setenv("NCCL_IB_RETRY_CNT", "5", 1);
  setenv("NCCL_IB_SL", "3", 1);
  setenv("NCCL_IB_TC", "96", 1);
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  void *h = dlopen(LOOM_VERBS_DOUBLE_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(h);
  int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *) = (int (*)(
      struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *))dlsym(h, "ibv_query_qp");
  ASSERT(query_qp);
  size_t cap = 1 << 20;
  char *src = malloc(cap), *dst = malloc(cap);
  ASSERT(src && dst);
  for (int dev = 0; dev < 2; dev++) {
    void *s, *r, *smh, *rmh;
    pair(dev, &s, &r);
    ASSERT_OK(p->reg_mr(s, src, cap, NET_PTR_HOST, &smh));
    ASSERT_OK(p->reg_mr(r, dst, cap, NET_PTR_HOST, &rmh));
    size_t sizes[] = {0, 1, 2, 3, 7, 4096, 65537, 1 << 20};
    for (int rep = 0; rep < 40; rep++) {
      size_t n = sizes[rep % 8];
      for (size_t i = 0; i < n; i++)
        src[i] = (char)(i * 7 + (size_t)rep);
      memset(dst, 0x5a, cap);
      size_t got = 12345;
      ncclResult_t res = transfer(s, r, smh, rmh, src, n, dst, cap, &got);
      ASSERT_MSG(res == ncclSuccess, "%s", err_thread_last());
      ASSERT_MSG(got == n, "%zu bytes arrived of %zu", got, n);
      ASSERT_MSG(memcmp(src, dst, n) == 0, "%zu bytes differ", n);
      ASSERT(n == cap || dst[n] == 0x5a);
    }
    for (int i = 0; i < 3; i++) {
      struct ibv_qp_attr a;
      struct ibv_qp_init_attr ia;
      struct ibv_qp *qp = ib_comm_qp(s, i);
      ASSERT(qp != NULL);
      ASSERT(query_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_AV, &ia) == 0);
      ASSERT(a.qp_state == IBV_QPS_RTS);
      ASSERT_MSG(a.timeout == 14 && a.retry_cnt == 5 && a.ah_attr.sl == 3, "timeout %d retry %d sl %d", a.timeout,
                 a.retry_cnt, a.ah_attr.sl);
      if (dev == 0)
        ASSERT_MSG(a.ah_attr.is_global && a.ah_attr.grh.traffic_class == 96 && a.ah_attr.grh.sgid_index == 3,
                   "global %d tc %d sgid %d", a.ah_attr.is_global, a.ah_attr.grh.traffic_class,
                   a.ah_attr.grh.sgid_index);
      else
        ASSERT(!a.ah_attr.is_global && a.ah_attr.dlid == ib_devs[1].lid);
    }
    ASSERT(ib_comm_qp(s, 3) == NULL);
    ASSERT_OK(p->dereg_mr(s, smh));
    ASSERT_OK(p->dereg_mr(r, rmh));
    ASSERT_OK(p->close_send(s));
    ASSERT_OK(p->close_recv(r));
  }
  free(src);
  free(dst);
  return 0;
}

/* Registrations of one range, or of a range inside a registered one, share
 * the MR; it goes when the last user does. */
TEST_IMPL(unit_ib_mr_cache) {
  use_double("mlx5_0:e");
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  struct ib_dev *d = &ib_devs[0];
  char *buf = aligned_alloc(4096, 1 << 16);
  ASSERT(buf);
  struct ib_mr_entry *a, *b, *c, *e;
  ASSERT_OK(ib_mr_get(d, buf, 1 << 16, &a));
  ASSERT_OK(ib_mr_get(d, buf, 1 << 16, &b));
  ASSERT_OK(ib_mr_get(d, buf + 100, 5000, &c));
  ASSERT(a == b && b == c && a->refs == 3);
  char *other = aligned_alloc(4096, 8192);
  ASSERT(other);
  ASSERT_OK(ib_mr_get(d, other + 10, 10, &e));
  ASSERT(e != a && e->start == (uintptr_t)other && e->end == (uintptr_t)other + 4096);
  ib_mr_put(d, a);
  ib_mr_put(d, b);
  ASSERT(d->mrs != NULL && c->refs == 1);
  ib_mr_put(d, c);
  ib_mr_put(d, e);
  ASSERT(d->mrs == NULL);
  free(buf);
  free(other);
  return 0;
}

TEST_IMPL(unit_ib_oversize) {
  use_double("mlx5_0:e");
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  void *s, *r, *smh, *rmh;
  pair(0, &s, &r);
  static char src[8192], dst[8192];
  ASSERT_OK(p->reg_mr(s, src, sizeof src, NET_PTR_HOST, &smh));
  ASSERT_OK(p->reg_mr(r, dst, sizeof dst, NET_PTR_HOST, &rmh));
  ncclResult_t res = transfer(s, r, smh, rmh, src, 8192, dst, 100, NULL);
  ASSERT(res == ncclInvalidUsage);
  ASSERT_MSG(strstr(err_thread_last(), "8192 bytes for a 100-byte receive buffer"), "%s", err_thread_last());
  ASSERT_OK(p->dereg_mr(s, smh));
  ASSERT_OK(p->dereg_mr(r, rmh));
  ASSERT_OK(p->close_send(s));
  ASSERT_OK(p->close_recv(r));
  return 0;
}

/* The second send work request of this process (the first is the
 * receive's clear-to-send write) fails: the sentence names the device,
 * the peer and the verbs status. */
TEST_IMPL(unit_ib_completion_error) {
  use_double("mlx5_0:e");
  setenv("LOOM_VERBS_DOUBLE_FAIL", "2", 1);
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  void *s, *r, *smh, *rmh;
  pair(0, &s, &r);
  static char src[4096], dst[4096];
  ASSERT_OK(p->reg_mr(s, src, sizeof src, NET_PTR_HOST, &smh));
  ASSERT_OK(p->reg_mr(r, dst, sizeof dst, NET_PTR_HOST, &rmh));
  void *rreq = NULL, *sreq = NULL;
  ASSERT_OK(p->irecv(r, dst, sizeof dst, rmh, &rreq));
  while (!sreq)
    ASSERT_OK(p->isend(s, src, 100, smh, &sreq));
  int done = 0;
  ncclResult_t res;
  while ((res = p->test(sreq, &done, NULL)) == ncclSuccess && !done)
    ;
  ASSERT_MSG(res == ncclRemoteError, "test returned %d", (int)res);
  const char *msg = err_thread_last();
  ASSERT_MSG(strstr(msg, "NET/IB mlx5_0:1") && strstr(msg, "an RDMA write of data to 127.0.0.1") &&
                 strstr(msg, "transport retry counter exceeded") && strstr(msg, "status 12"),
             "%s", msg);
  /* The connection stays failed: later calls say the same. */
  void *again = NULL;
  ASSERT(p->isend(s, src, 1, smh, &again) == ncclRemoteError && again == NULL);
  ASSERT_OK(p->dereg_mr(s, smh));
  ASSERT_OK(p->dereg_mr(r, rmh));
  ASSERT_OK(p->close_send(s));
  ASSERT_OK(p->close_recv(r));
  return 0;
}
/* A dma-buf as the NIC sees it: the receiver registers a memfd (standing
 * in for device memory) at an iova that is no address of this process;
 * the sender's RDMA write with immediate lands in the memory behind the
 * fd, at the offset given, and reads back through the test's own mapping.
 * Then the receive is flushed with a one-byte RDMA read over the loopback
 * QP, unless NCCL_GDR_FLUSH_DISABLE or the receive was empty. */
TEST_IMPL(unit_ib_dmabuf) {
  use_double("mlx5_0:e,mlx5_1:i");
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  ASSERT(p->reg_mr_dmabuf != net_no_reg_mr_dmabuf && p->iflush != net_no_iflush);
  size_t cap = 1 << 20, off = 8192;
  int fd = memfd_create("loom-dmabuf", MFD_CLOEXEC);
  ASSERT(fd >= 0 && ftruncate(fd, (off_t)(cap + off)) == 0);
  unsigned char *mem = mmap(NULL, cap + off, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT(mem != MAP_FAILED);
  char *src = malloc(cap);
  ASSERT(src);
  char *iova = (char *)(uintptr_t)0x3ffe00000000ull;
  for (int dev = 0; dev < 2; dev++) {
    void *s, *r, *smh, *rmh;
    pair(dev, &s, &r);
    ASSERT_OK(p->reg_mr(s, src, cap, NET_PTR_HOST, &smh));
    ASSERT_MSG(p->reg_mr_dmabuf(r, iova, cap, NET_PTR_CUDA, off, fd, &rmh) == ncclSuccess, "%s", err_thread_last());
    size_t sizes[] = {1, 4096, 65537, 1 << 20};
    for (int k = 0; k < 4; k++) {
      size_t n = sizes[k], got = 0;
      for (size_t i = 0; i < n; i++)
        src[i] = (char)(i * 13 + (size_t)k + (size_t)dev);
      memset(mem, 0x5a, cap + off);
      ASSERT_MSG(transfer(s, r, smh, rmh, src, n, iova, cap, &got) == ncclSuccess, "%s", err_thread_last());
      ASSERT_MSG(got == n && memcmp(mem + off, src, n) == 0, "%zu of %zu bytes arrived, or they differ", got, n);
      ASSERT(mem[off - 1] == 0x5a && (n == cap || mem[off + n] == 0x5a));
      void *req = NULL;
      ASSERT_OK(p->iflush(r, iova, n, rmh, &req));
      ASSERT(req != NULL);
      int done = 0;
      while (!done)
        ASSERT_MSG(p->test(req, &done, NULL) == ncclSuccess, "%s", err_thread_last());
    }
    void *none = (void *)1;
    ASSERT_OK(p->iflush(r, iova, 0, rmh, &none));
    ASSERT(none == NULL);
    setenv("NCCL_GDR_FLUSH_DISABLE", "1", 1);
    none = (void *)1;
    ASSERT_OK(p->iflush(r, iova, 100, rmh, &none));
    ASSERT(none == NULL);
    unsetenv("NCCL_GDR_FLUSH_DISABLE");
    ASSERT_OK(p->dereg_mr(s, smh));
    ASSERT_OK(p->dereg_mr(r, rmh));
    ASSERT_OK(p->close_send(s));
    ASSERT_OK(p->close_recv(r));
  }
  /* A range past the dma-buf's end is refused with the verbs' reason. */
  void *s, *r, *mh = NULL;
  pair(0, &s, &r);
  ASSERT(p->reg_mr_dmabuf(r, iova, cap, NET_PTR_CUDA, off + 4096, fd, &mh) == ncclSystemError && mh == NULL);
  ASSERT_MSG(strstr(err_thread_last(), "ibv_reg_dmabuf_mr of 1048576 bytes") &&
                 strstr(err_thread_last(), "Invalid argument"), "%s", err_thread_last());
  ASSERT_OK(p->close_send(s));
  ASSERT_OK(p->close_recv(r));
  munmap(mem, cap + off);
  close(fd);
  free(src);
  return 0;
}

/* A NIC whose driver refuses dma-bufs: the plugin does not claim them. */
TEST_IMPL(unit_ib_no_dmabuf) {
  use_double("mlx5_0:e");
  setenv("LOOM_VERBS_DOUBLE_DMABUF", "0", 1);
  ASSERT_MSG(p->init() == ncclSuccess, "%s", err_thread_last());
  struct net_props pr;
  ASSERT_OK(p->get_properties(0, &pr));
  ASSERT_MSG(!(pr.ptr_support & NET_PTR_DMABUF) && ib_devs[0].dmabuf == 0, "ptr_support 0x%x", pr.ptr_support);
  return 0;
}
#else
#define NO_DOUBLE(name) \
  TEST_IMPL(name) { SKIP("the verbs test double was not built (no infiniband/verbs.h)"); }
NO_DOUBLE(unit_ib_devices)
NO_DOUBLE(unit_ib_no_device)
NO_DOUBLE(unit_ib_hca_malformed)
NO_DOUBLE(unit_ib_gid_env)
NO_DOUBLE(unit_ib_gid_roce_v1)
NO_DOUBLE(unit_ib_transfer)
NO_DOUBLE(unit_ib_mr_cache)
NO_DOUBLE(unit_ib_oversize)
NO_DOUBLE(unit_ib_completion_error)
NO_DOUBLE(unit_ib_dmabuf)
NO_DOUBLE(unit_ib_no_dmabuf)
#endif
