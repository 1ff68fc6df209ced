/*
 * NCCL's net plugin ABI v9: v10 less the comm config in connect, the
 * profiler callback in init and the profiler handles in isend/irecv.
 * Loom passes none of them (the default traffic class, NULL handles), so
 * dropping them loses nothing.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "transport/net/ext/net_ext_adapt.h"

#include <limits.h>
#include <string.h>

/* One plugin per process (net_ext.c), so one table. */
static const ncclNet_v9_t *ext_v9;

static ncclResult_t ext_v9_init(ncclDebugLogger_t log, ncclProfilerCallback_t profiler) {
  return ext_v9->init(log);
}

static ncclResult_t ext_v9_get_properties(int dev, ncclNetProperties_v10_t *q) {
  ncclNetProperties_v9_t p;
  memset(&p, 0, sizeof p);
  ncclResult_t r = ext_v9->getProperties(dev, &p);
  *q = (ncclNetProperties_v10_t){NET_EXT_SAME_PROPS(&p), .forceFlush = p.forceFlush, .vProps = p.vProps,
                                 .maxP2pBytes = p.maxP2pBytes, .maxCollBytes = p.maxCollBytes};
  return r;
}

static ncclResult_t ext_v9_connect(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **send_comm,
                                   ncclNetDeviceHandle_v10_t **dev_comm) {
  return ext_v9->connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t ext_v9_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                                 void **request) {
  return ext_v9->isend(send_comm, data, size, tag, mhandle, request);
}

static ncclResult_t ext_v9_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                                 void **phandles, void **request) {
  return ext_v9->irecv(recv_comm, n, data, sizes, tags, mhandles, request);
}

static const char *ext_v9_bind(const void *table, struct net_ext_ops *ops) {
  ext_v9 = table;
  *ops = (struct net_ext_ops){
      NET_EXT_SAME_OPS(ext_v9),
      .init = ext_v9_init,
      .get_properties = ext_v9_get_properties,
      .connect = ext_v9_connect,
      .isend = ext_v9_isend,
      .irecv = ext_v9_irecv,
  };
  return NET_EXT_MISSING(ext_v9);
}

const struct net_ext_version net_ext_v9 = {.version = 9, .max_bytes = INT_MAX, .bind = ext_v9_bind};
