/*
 * The transports' and the built-in network plugins' tables: every op is
 * there (a named stub where one has nothing to do), since callers go
 * through the wrappers and never test for NULL; and the table an external
 * plugin is adapted into, for a sample plugin of each ABI version.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stddef.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "comm_api.h"
#include "topology/topo.h"
#include "transport/net/net.h"
#include "transport/transport.h"
#include "test.h"

#define OPS(X) \
  X(can_connect) X(setup) X(connect) X(progress) X(flushed) X(check) X(failed) X(activity) X(wait_fds) X(conn_name) X(poison) X(free)

/* 1 (and a line saying so) where a table's op is NULL. */
static int absent(const void *fn, const char *kind, const char *name, const char *op) {
  if (fn == NULL)
    fprintf(stderr, "%s %s has no %s\n", kind, name, op);
  return fn == NULL;
}
#define CHECK_OP(op) missing += absent((const void *)t->op, kind, t->name, #op);

static int missing_ops(const struct transport *t) {
  int missing = 0;
  const char *kind = "transport";
  OPS(CHECK_OP)
  return missing;
}

#define PLUGIN_OPS(X)                                                                                        \
  X(init) X(devices) X(get_properties) X(listen) X(connect) X(accept) X(reg_mr) X(reg_mr_dmabuf) X(dereg_mr) \
  X(isend) X(irecv) X(test) X(iflush) X(activity) X(poll_fds) X(probe) X(duplex) X(close_send) X(close_recv) X(close_listen)

static int missing_plugin_ops(const struct net_plugin *t) {
  int missing = 0;
  const char *kind = "network plugin";
  PLUGIN_OPS(CHECK_OP)
  return missing;
}

TEST_IMPL(unit_transport_tables) {
  const struct transport *all[] = {&transport_p2p, &transport_shm, &transport_net};
  int missing = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ASSERT(all[i]->name != NULL);
    missing += missing_ops(all[i]);
  }
  const struct net_plugin *plugins[] = {&net_socket_plugin, &net_ib_plugin};
  for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; i++) {
    ASSERT(plugins[i]->name != NULL);
    missing += missing_plugin_ops(plugins[i]);
  }
  ASSERT_MSG(missing == 0, "%d ops missing: fill them with the named stubs of transport.h and net.h", missing);
  return 0;
}

/* One process loads one external plugin: each version in a child. */
static int ext_table_missing(const char *path) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    const struct net_plugin *p = NULL;
    if (net_ext_load(path, &p) != ncclSuccess) {
      fprintf(stderr, "%s: %s\n", path, err_thread_last());
      _exit(100);
    }
    _exit(missing_plugin_ops(p));
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
  ASSERT_MSG(WEXITSTATUS(st) != 100, "the sample plugin %s did not load", path);
  return WEXITSTATUS(st);
}

TEST_IMPL(unit_transport_ext_table) {
  const char *samples[] = {LOOM_NET_SAMPLE, LOOM_NET_SAMPLE9, LOOM_NET_SAMPLE8};
  int missing = 0;
  for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
    missing += ext_table_missing(samples[i]);
  ASSERT_MSG(missing == 0, "the external plugin's table lacks %d ops", missing);
  return 0;
}

/* What the lower floors may not call up for, init hooks in: a
 * communicator made without them would fail without telling its peers
 * and decide GPUDirect without the topology. */
TEST_IMPL(unit_comm_hooks) {
  struct ncclComm *c = NULL;
  ASSERT_OK(comm_alloc(&c));
  ASSERT(c->poison_conns == transport_poison_conns);
  ASSERT(c->gpu_nic_facts == topo_gpu_nic_facts);
  comm_destroy_all(c);
  return 0;
}
