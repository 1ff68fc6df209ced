/*
 * NCCL's net plugin ABI v8: v9 with int message sizes, and without
 * forceFlush, virtual NICs or size limits in its properties. That is all
 * that differs, so this adapter presents the plugin as a v9 one and
 * hands it to v9's adapter, which holds what the two share.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "transport/net/ext/net_ext_adapt.h"

#include <string.h>

/* One plugin per process (net_ext.c), so one table, and one v9 view of
 * it that must outlive bind(): v9's adapter keeps pointing at it. */
static const ncclNet_v8_t *ext_v8;
static ncclNet_v9_t ext_v8_as_v9;

/* What v8 cannot say is what NCCL assumes of a v8 plugin: each device its
 * own NIC, no flush forced, its int-sized messages kept to 1 GiB. */
static ncclResult_t ext_v8_get_properties(int dev, ncclNetProperties_v9_t *q) {
  ncclNetProperties_v8_t p;
  memset(&p, 0, sizeof p);
  ncclResult_t r = ext_v8->getProperties(dev, &p);
  *q = (ncclNetProperties_v9_t){NET_EXT_SAME_PROPS(&p), .vProps = {.ndevs = 1, .devs = {dev}},
                                .maxP2pBytes = NCCL_NET_V8_MAX_BYTES, .maxCollBytes = NCCL_NET_V8_MAX_BYTES};
  return r;
}

/* Sizes are within max_bytes (1 GiB), so they fit in an int. */
static ncclResult_t ext_v8_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request) {
  return ext_v8->isend(send_comm, data, (int)size, tag, mhandle, request);
}

static ncclResult_t ext_v8_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                                 void **request) {
  int isizes[NET_EXT_MAX_RECVS];
  if (n < 1 || n > NET_EXT_MAX_RECVS)
    return err_set(ncclInternalError, "Loom asked a ncclNetPlugin_v8 for %d receives at once (at most %d)", n,
                   NET_EXT_MAX_RECVS);
  for (int i = 0; i < n; i++)
    isizes[i] = (int)sizes[i];
  return ext_v8->irecv(recv_comm, n, data, isizes, tags, mhandles, request);
}

static const char *ext_v8_bind(const void *table, struct net_ext_ops *ops) {
  const ncclNet_v8_t *t = table;
  /* Checked here: the v9 view's wrappers would hide a NULL entry. */
  const char *missing = NET_EXT_MISSING(t);
  if (missing)
    return missing;
  ext_v8 = t;
  ext_v8_as_v9 = (ncclNet_v9_t){
      .name = t->name, .init = t->init, .devices = t->devices, .getProperties = ext_v8_get_properties,
      .listen = t->listen, .connect = t->connect, .accept = t->accept, .regMr = t->regMr,
      .regMrDmaBuf = t->regMrDmaBuf, .deregMr = t->deregMr, .isend = ext_v8_isend, .irecv = ext_v8_irecv,
      .iflush = t->iflush, .test = t->test, .closeSend = t->closeSend, .closeRecv = t->closeRecv,
      .closeListen = t->closeListen};
  return net_ext_v9.bind(&ext_v8_as_v9, ops);
}

const struct net_ext_version net_ext_v8 = {
    .version = 8, .max_bytes = (size_t)NCCL_NET_V8_MAX_BYTES, .bind = ext_v8_bind};
