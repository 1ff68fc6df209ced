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
#include <stdint.h>

#include "nccl.h"

#define NET_HANDLE_MAXSIZE 128

/* What memory a plugin can send from and receive into (NCCL's values). */
#define NET_PTR_HOST 0x1
#define NET_PTR_CUDA 0x2
#define NET_PTR_DMABUF 0x4

struct pollfd;

struct net_props {
  char name[64];
  char pci_path[256]; /* the device's sysfs path, "" when unknown */
  int ptr_support;    /* NET_PTR_* */
  int speed_mbps;
  int port;
  int force_flush;    /* receives into device memory need iflush on every GPU */
};

struct net_plugin {
  const char *name;
  ncclResult_t (*init)(void);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*get_properties)(int dev, struct net_props *props);
  /* Writes at most NET_HANDLE_MAXSIZE bytes to `handle` for the peer. */
  ncclResult_t (*listen)(int dev, void *handle, void **listen_comm);
  ncclResult_t (*connect)(int dev, const void *handle, void **send_comm);
  ncclResult_t (*accept)(void *listen_comm, void **recv_comm);
  /* `type`: NET_PTR_HOST or NET_PTR_CUDA. */
  ncclResult_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
  /* Device memory exported as a dma-buf; net_no_reg_mr_dmabuf where
   * unsupported. */
  ncclResult_t (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle);
  ncclResult_t (*dereg_mr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *send_comm, void *data, size_t size, void *mhandle, void **request);
  ncclResult_t (*irecv)(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
  /* `size` gets the bytes received (or sent) once done. */
  ncclResult_t (*test)(void *request, int *done, size_t *size);
  /* After a receive into device memory that the NIC wrote directly: makes
   * the data visible to the GPU. *request NULL when not needed;
   * net_no_iflush where it never is. */
  ncclResult_t (*iflush)(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
  /* A count that grows whenever the comm moves bytes, whole messages or
   * not, for LOOM_TIMEOUT: a slow transfer in progress is not a stalled
   * one. net_no_activity where the plugin reports only completed messages
   * (NCCL's external ABI); the transport counts those anyway. */
  uint64_t (*activity)(void *comm);
  /* Optional (net_no_poll_fds where unknown): the descriptors whose readiness would
   * let the comm's requests in flight move, for a caller that would
   * otherwise spin. Fills at most `max` and returns how many (0: none in
   * flight), or -1 where they move otherwise (helper threads, bytes the
   * plugin holds already) and the caller must not block. */
  int (*poll_fds)(void *comm, struct pollfd *fds, int max);
  /* For a rank whose wait has stalled: looks for an error the comm's
   * connections have reported since their last call (a reset on a socket
   * whose sends all left, which nothing reads or writes any more), fails
   * the comm with it and returns it. net_no_probe where errors surface
   * through test() alone. */
  ncclResult_t (*probe)(void *comm);
  /* Optional (net_no_duplex where absent): a comm for the other direction
   * of `comm`'s connection, on the same wire (a receive comm from the
   * peer a send comm reaches, or the reverse), so that one connection
   * carries both directions between two ranks and each side's data
   * carries the acknowledgements of the other's. *other NULL where this
   * connection cannot be shared; both sides of a connection answer alike.
   * Each comm is closed on its own; the wire goes with the last. */
  ncclResult_t (*duplex)(void *comm, void **other);
  ncclResult_t (*close_send)(void *send_comm);
  ncclResult_t (*close_recv)(void *recv_comm);
  ncclResult_t (*close_listen)(void *listen_comm);
};

/* The stubs for the optional ops a plugin does not have (net.c). */
ncclResult_t net_no_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                  void **mhandle);
ncclResult_t net_no_iflush(void *recv_comm, void *data, size_t size, void *mhandle, void **request);
uint64_t net_no_activity(void *comm);
/* -1: the caller must not block on descriptors. */
int net_no_poll_fds(void *comm, struct pollfd *fds, int max);
ncclResult_t net_no_probe(void *comm);
/* *other NULL: each direction connects on its own. */
ncclResult_t net_no_duplex(void *comm, void **other);

extern const struct net_plugin net_socket_plugin;
extern const struct net_plugin net_ib_plugin;

/* Whether NCCL_NET can name a plugin, with the sentence if not; init
 * checks it before anything needs the network. */
ncclResult_t net_check_name(const char *name);

/* Whether a communicator's config.netName names the plugin this process
 * uses (case aside): a name NCCL_NET would take is accepted where it is
 * that plugin, and refused with a sentence that says so where the process
 * uses another; any other name is no plugin. */
ncclResult_t net_config_name(const char *name);

/* The plugin in use, chosen and initialised on first use: the one NCCL_NET
 * names, or by default the first with a device of: the external plugin
 * (NCCL_NET_PLUGIN), IB, Socket. */
ncclResult_t net_get_plugin(const struct net_plugin **out);

/* An external plugin (src/transport/net/ext/net_ext.c): loads the library that
 * NCCL_NET_PLUGIN names (`spec`) and adapts NCCL's versioned ncclNet_vN
 * table to a net_plugin. An error says why it cannot be used; the caller
 * warns and goes on with the built-in plugins. */
ncclResult_t net_ext_load(const char *spec, const struct net_plugin **out);

#endif
