/*
 * The IB plugin's parts (net_ib*.c): the NCCL_IB_HCA filter, the devices
 * (one per active HCA port) with their memory-registration cache, and the
 * connections in net_ib_conn.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_IB_H
#define LOOM_NET_IB_H

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

#define IB_HCA_MAX 32
#define IB_NAME_LEN 64

/* NCCL_IB_HCA: "mlx5_0:1,mlx5_1" selects by name prefix and optional port;
 * a leading ^ turns the list into exclusions, a leading = (after any ^)
 * makes names match exactly. */
struct ib_hca_filter {
  int exclude, exact, n;
  struct {
    char name[IB_NAME_LEN];
    int port; /* -1: every port */
  } item[IB_HCA_MAX];
};

/* An error names NCCL_IB_HCA, the expression and what is wrong in it. */
ncclResult_t ib_hca_parse(const char *spec, struct ib_hca_filter *f);
int ib_hca_match(const struct ib_hca_filter *f, const char *dev, int port);

#if LOOM_HAVE_IBVERBS_HEADERS
#include "transport/net/ib/net_ib_verbs.h"

struct ib_mr_entry {
  uintptr_t start, end; /* page-aligned range the MR covers */
  struct ibv_mr *mr;
  int refs;
  struct ib_mr_entry *next;
};

struct ib_dev {
  char name[IB_NAME_LEN];
  int port;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  int link_layer; /* IBV_LINK_LAYER_* */
  int gid_index;
  union ibv_gid gid;
  uint16_t lid;
  enum ibv_mtu mtu;
  int speed_mbps;
  int max_qp_wr;
  char pci_path[256];
  int dmabuf; /* ibv_reg_dmabuf_mr exists and this device's driver takes dma-bufs */
  pthread_mutex_t lock; /* the registration cache */
  struct ib_mr_entry *mrs;
};

extern const struct ib_verbs *ib_ibv;
/* The devices ib_devices_init found. */
extern struct ib_dev ib_devs[];
extern int ib_ndevs;
/* nvidia-peermem is loaded: ibv_reg_mr takes device pointers. */
extern int ib_peermem;

ncclResult_t ib_devices_init(void);
/* Registers [data, data+size) or finds a cached registration covering it. */
ncclResult_t ib_mr_get(struct ib_dev *d, void *data, size_t size, struct ib_mr_entry **out);
void ib_mr_put(struct ib_dev *d, struct ib_mr_entry *e);

/* net_ib_conn.c: the plugin's connection entry points (net.h). */
struct ib_dev *ib_comm_dev(void *comm);
/* A connection's i-th QP (tests check what it was configured with). */
struct ibv_qp *ib_comm_qp(void *comm, int i);
ncclResult_t ib_listen(int dev, void *handle, void **listen_comm);
ncclResult_t ib_connect(int dev, const void *handle, void **send_comm);
ncclResult_t ib_accept(void *listen_comm, void **recv_comm);
ncclResult_t ib_isend(void *send_comm, void *data, size_t size, void *mhandle, void **request);
ncclResult_t ib_irecv(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
ncclResult_t ib_test(void *request, int *done, size_t *size);
uint64_t ib_activity(void *comm);
/* A one-byte RDMA read of `data` over a QP connected to itself, which
 * makes the NIC's earlier writes to that device memory visible to the GPU
 * (as NCCL does); no request where NCCL_GDR_FLUSH_DISABLE or size 0. */
ncclResult_t ib_iflush(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
ncclResult_t ib_close(void *comm);
ncclResult_t ib_close_listen(void *listen_comm);
#endif

#endif
