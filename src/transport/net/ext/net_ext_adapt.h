/*
 * Between the common part of the external net plugin support (net_ext.c)
 * and its per-ABI-version adapters (net_ext_vN.c): each adapter turns its
 * version's ncclNet_vN table into one net_ext_ops, shaped like v10's, so
 * that net_ext.c calls every version alike and never asks which it has.
 * Private to those files; plugins see only net_ext_abi.h.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_EXT_ADAPT_H
#define LOOM_NET_EXT_ADAPT_H

#include <stddef.h>

#include "transport/net/ext/net_ext_abi.h"

/* The most buffers net_ext.c posts in one irecv: a connection carries one
 * ordered stream, so one per receive. */
#define NET_EXT_MAX_RECVS 1

/* v10's signatures, whatever the plugin's version. net_ext.c keeps every
 * size within the version's max_bytes, so an adapter may narrow sizes to
 * its version's types without checking. */
struct net_ext_ops {
  ncclResult_t (*init)(ncclDebugLogger_t log, ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int *ndev);
  /* Gets a zeroed `props`; what the version cannot say stays zero unless
   * the adapter knows the value the version implies. */
  ncclResult_t (*get_properties)(int dev, ncclNetProperties_v10_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **send_comm,
                          ncclNetDeviceHandle_v10_t **dev_comm);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_v10_t **dev_comm);
  ncclResult_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
  /* NULL where the plugin has none. */
  ncclResult_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle);
  ncclResult_t (*dereg_mr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                        void **request);
  /* n is at most NET_EXT_MAX_RECVS. */
  ncclResult_t (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                        void **phandles, void **request);
  /* NULL where the plugin has none. */
  ncclResult_t (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*close_send)(void *send_comm);
  ncclResult_t (*close_recv)(void *recv_comm);
  ncclResult_t (*close_listen)(void *listen_comm);
};

/* One supported ABI version. */
struct net_ext_version {
  int version; /* N of the exported symbol ncclNetPlugin_vN */
  /* The largest message the version's types carry (test() reports sizes
   * as int in every version). */
  size_t max_bytes;
  /* Fills `ops` from the exported table `table`. Returns the ABI name of
   * the first entry Loom needs that the table leaves NULL, else NULL. */
  const char *(*bind)(const void *table, struct net_ext_ops *ops);
};

/* Every supported version, newest first: the first one a library exports
 * is used. A new version is a net_ext_vN.c defining net_ext_vN, and its
 * number here. */
#define NET_EXT_VERSIONS(X) X(10) X(9) X(8)

#define NET_EXT_DECLARE_VERSION(v) extern const struct net_ext_version net_ext_v##v;
NET_EXT_VERSIONS(NET_EXT_DECLARE_VERSION)
#undef NET_EXT_DECLARE_VERSION

/* The entries of an ncclNet_vN table that Loom needs, named alike in
 * every version; NET_EXT_MISSING(t) is the first `t` leaves NULL, as
 * bind() returns it. */
#define NET_EXT_NEEDED(X, t)                                                                       \
  X(t, init) X(t, devices) X(t, getProperties) X(t, listen) X(t, connect) X(t, accept) X(t, regMr) \
  X(t, deregMr) X(t, isend) X(t, irecv) X(t, test) X(t, closeSend) X(t, closeRecv) X(t, closeListen)
#define NET_EXT_IF_MISSING(t, f) !(t)->f ? #f :
#define NET_EXT_MISSING(t) (NET_EXT_NEEDED(NET_EXT_IF_MISSING, t)(const char *)NULL)

/* Designated initialisers for the net_ext_ops entries whose signature is
 * the same in every version: the plugin's own functions, unwrapped. */
#define NET_EXT_SAME_OPS(t)                                                                              \
  .devices = (t)->devices, .listen = (t)->listen, .accept = (t)->accept, .reg_mr = (t)->regMr,           \
  .reg_mr_dmabuf = (t)->regMrDmaBuf, .dereg_mr = (t)->deregMr, .iflush = (t)->iflush, .test = (t)->test, \
  .close_send = (t)->closeSend, .close_recv = (t)->closeRecv, .close_listen = (t)->closeListen

/* Designated initialisers for the ncclNetProperties_vN fields every
 * version has, from the properties `s` of any version. */
#define NET_EXT_SAME_PROPS(s)                                                                       \
  .name = (s)->name, .pciPath = (s)->pciPath, .guid = (s)->guid, .ptrSupport = (s)->ptrSupport,     \
  .regIsGlobal = (s)->regIsGlobal, .speed = (s)->speed, .port = (s)->port, .latency = (s)->latency, \
  .maxComms = (s)->maxComms, .maxRecvs = (s)->maxRecvs, .netDeviceType = (s)->netDeviceType,        \
  .netDeviceVersion = (s)->netDeviceVersion

#endif
