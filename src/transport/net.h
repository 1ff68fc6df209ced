/*
 * The network plugin interface of the net transport, shaped like NCCL's
 * ncclNet_t: devices, listen/connect/accept, memory registration and
 * asynchronous isend/irecv/test. Calls never block: connect and accept
 * return ncclInProgress, keeping their state in *comm, until the connection
 * is up (call again with the same pointer); isend/irecv hand back a NULL
 * request when they cannot take more yet.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_H
#define LOOM_NET_H

#include <stddef.h>

#include "nccl.h"

#define NET_HANDLE_MAXSIZE 128

struct net_props {
  char name[64];
  int speed_mbps;
  int port;
  int max_comms;
};

struct net_plugin {
  size_t size;
  int version;
  const char *name;
  ncclResult_t (*init)(void);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*get_properties)(int dev, struct net_props *props);
  /* Writes at most NET_HANDLE_MAXSIZE bytes to `handle` for the peer. */
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, const void *handle, void **send_comm);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm);
  ncclResult_t (*reg_mr)(void *comm, void *data, size_t size, void **mhandle);
  ncclResult_t (*dereg_mr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
  /* `size` gets the bytes received (or sent) once done. */
  ncclResult_t (*test)(void *request, int *done, size_t *size);
  ncclResult_t (*close_send)(void *send_comm);
  ncclResult_t (*close_recv)(void *recv_comm);
  ncclResult_t (*close_listen)(void *listen_comm);
};

#define NET_PLUGIN_VERSION 1

extern const struct net_plugin net_socket_plugin;

/* Whether a plugin of this name exists (NCCL_NET), with the sentence if
 * not; init checks it before anything needs the network. */
ncclResult_t net_check_name(const char *name);

/* The plugin NCCL_NET names, initialised on first use. */
ncclResult_t net_get_plugin(const struct net_plugin **out);

#endif
