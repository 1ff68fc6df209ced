/*
 * libibverbs, loaded with dlopen so that the library loads and runs where
 * rdma-core is absent. Only the entry points the IB plugin uses; the data
 * path (post_send, post_recv, poll_cq) goes through the context's ops table
 * as verbs.h's inline functions do, so it needs no symbol.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_IB_VERBS_H
#define LOOM_NET_IB_VERBS_H

#include "nccl.h"

#if LOOM_HAVE_IBVERBS_HEADERS
#include <infiniband/verbs.h>

struct ib_verbs {
  struct ibv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *dev);
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  int (*close_device)(struct ibv_context *ctx);
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
  /* Optional (rdma-core 32 and later): tells a GID's type. */
  int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
                      uint32_t flags, size_t entry_size);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
  /* Optional (rdma-core 34 and later): device memory as a dma-buf. */
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                                  int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch,
                              int vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  int (*destroy_qp)(struct ibv_qp *qp);
  const char *(*wc_status_str)(enum ibv_wc_status status);
  char path[512]; /* the library that was loaded */
};

/* Loads the library LOOM_IB_VERBS_LIB names (default libibverbs.so.1)
 * once per process; the error says what is missing. */
ncclResult_t ib_verbs_load(const struct ib_verbs **out);
#endif

#endif
