/*
 * External network plugins (NCCL_NET_PLUGIN) with the sample plugin of
 * tests/net_plugin_sample: every collective over it through the v10
 * adapter, the v9 and v8 adapters once each, selection by name and by
 * NCCL_NET, and the fallbacks to the built-in plugins (missing library,
 * library without a plugin symbol, plugin whose init fails).
 *
 * That the plugin served is checked in the plugin itself: each rank finds
 * the library already loaded in its process (dlopen RTLD_NOLOAD) and asks
 * it how many bytes it moved and which version's init() Loom called. The
 * messages are checked in each rank's NCCL_DEBUG_FILE.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

struct np_case {
  const char *lib; /* the sample library that must serve (its dlopen name); NULL: it must not */
  int abi;         /* the version whose init() must have run */
  int full;        /* the whole collective matrix, else AllReduce only */
  const char *must[4]; /* substrings every rank's log must have */
};

static char log_dir[256];

static int log_has(const char *want, int rank) {
  char path[400];
  snprintf(path, sizeof path, "%s/rank.%d", log_dir, (int)getpid());
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "rank %d: no log at %s\n", rank, path);
    return 0;
  }
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, want) != NULL;
  fclose(f);
  if (!found)
    fprintf(stderr, "rank %d: the log %s has no line with \"%s\"\n", rank, path, want);
  return found;
}

static int np_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct np_case *k = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (!k->full)
    setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  for (int q = 0; q < n; q++) {
    const char *t = NULL;
    RCHECK(comm, loomCommPeerTransport(comm, q, &t));
    RASSERT(q == rank || strcmp(t, "none") == 0 || strncmp(t, "net", 3) == 0,
            "rank %d reached rank %d over %s, not the network", rank, q, t);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  const char *lib = k->lib ? k->lib : LOOM_NET_SAMPLE;
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  RASSERT(h != NULL || !k->lib, "rank %d: %s was never loaded: Loom did not use the external plugin", rank, lib);
  if (h) {
    int (*stats)(uint64_t *, uint64_t *) = (int (*)(uint64_t *, uint64_t *))dlsym(h, "loomsample_stats");
    RASSERT(stats != NULL, "rank %d: %s has no loomsample_stats", rank, lib);
    uint64_t sent = 0, received = 0;
    int abi = stats(&sent, &received);
    dlclose(h);
    if (k->lib) {
      RASSERT(abi == k->abi, "rank %d: Loom called the v%d init of the plugin, expected v%d", rank, abi, k->abi);
      /* AllReduce of about 1M+3 elements alone crosses the wire several
       * megabytes each way per rank. */
      RASSERT(sent > (1u << 20) && received > (1u << 20),
              "rank %d: the plugin sent %llu and received %llu bytes: it did not carry the collectives", rank,
              (unsigned long long)sent, (unsigned long long)received);
    } else {
      RASSERT(sent == 0 && received == 0, "rank %d: the plugin moved %llu/%llu bytes but should not have served",
              rank, (unsigned long long)sent, (unsigned long long)received);
    }
  }
  for (int i = 0; i < 4 && k->must[i]; i++)
    if (!log_has(k->must[i], rank))
      return 1;
  if (rank == 0)
    printf("%d ranks over %s: %d calls checked\n", n, k->lib ? "the external plugin" : "the built-in plugins", calls);
  return 0;
}

/* The ranks talk over the network only, and log at INFO to a file each. */
static int np_run(int n, const char *plugin, const struct np_case *k) {
  snprintf(log_dir, sizeof log_dir, "/tmp/loom-netplugin-XXXXXX");
  ASSERT_MSG(mkdtemp(log_dir) != NULL, "mkdtemp failed");
  char file[300];
  snprintf(file, sizeof file, "%s/rank.%%p", log_dir);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("LOOMSAMPLE_IFNAME", getenv("LOOMSAMPLE_IFNAME") ? getenv("LOOMSAMPLE_IFNAME") : "lo", 1);
  setenv("NCCL_NET_PLUGIN", plugin, 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  setenv("NCCL_DEBUG_FILE", file, 1);
  int rc = run_ranks(n, np_rank, (void *)k);
  if (rc != 0 || getenv("LOOM_TEST_KEEP_LOGS"))
    fprintf(stderr, "the ranks' logs are in %s\n", log_dir);
  else
    harness_remove_dir(log_dir);
  return rc;
}

#define LOADED(v) "NET/Plugin: loaded LoomSample (ncclNetPlugin_v" #v ")"

TEST_IMPL(net_plugin_coll_2) {
  struct np_case k = {LOOM_NET_SAMPLE, 10, 1, {LOADED(10), "using network plugin LoomSample"}};
  return np_run(2, LOOM_NET_SAMPLE, &k);
}

TEST_IMPL(net_plugin_coll_3) {
  struct np_case k = {LOOM_NET_SAMPLE, 10, 1, {LOADED(10), "using network plugin LoomSample"}};
  return np_run(3, LOOM_NET_SAMPLE, &k);
}

/* A library exporting only ncclNetPlugin_v9 goes through the v9 adapter
 * (and one exporting v10 and v9, as above, through v10). */
TEST_IMPL(net_plugin_v9) {
  struct np_case k = {LOOM_NET_SAMPLE9, 9, 0, {LOADED(9), "using network plugin LoomSample"}};
  return np_run(2, LOOM_NET_SAMPLE9, &k);
}

TEST_IMPL(net_plugin_v8) {
  struct np_case k = {LOOM_NET_SAMPLE8, 8, 0, {LOADED(8), "using network plugin LoomSample"}};
  return np_run(2, LOOM_NET_SAMPLE8, &k);
}

/* NCCL_NET_PLUGIN=loomsample finds libnccl-net-loomsample.so on the
 * library path (ctest sets LD_LIBRARY_PATH for this test; the loader
 * reads it only at process start). */
TEST_IMPL(net_plugin_by_name) {
  const char *path = getenv("LD_LIBRARY_PATH");
  if (!path || !strstr(path, LOOM_NET_SAMPLE_DIR))
    SKIP("LD_LIBRARY_PATH does not hold %s (run it through ctest, or set it)", LOOM_NET_SAMPLE_DIR);
  struct np_case k = {"libnccl-net-loomsample.so", 10, 0, {LOADED(10), "libnccl-net-loomsample.so"}};
  return np_run(2, "loomsample", &k);
}

/* NCCL_NET names the external plugin by its name. */
TEST_IMPL(net_plugin_select) {
  setenv("NCCL_NET", "LoomSample", 1);
  struct np_case k = {LOOM_NET_SAMPLE, 10, 0, {LOADED(10), "using network plugin LoomSample"}};
  return np_run(2, LOOM_NET_SAMPLE, &k);
}

/* Each fallback warns why and goes on over the built-in Socket plugin. */
TEST_IMPL(net_plugin_missing) {
  struct np_case k = {NULL, 0, 0,
                      {"NCCL_NET_PLUGIN=nosuch", "libnccl-net-nosuch.so", "using the built-in network plugins",
                       "using network plugin Socket"}};
  return np_run(2, "nosuch", &k);
}

/* libnccl.so itself: a library, but no plugin. */
TEST_IMPL(net_plugin_incompatible) {
  struct np_case k = {NULL, 0, 0,
                      {"exports none of ncclNetPlugin_v10, ncclNetPlugin_v9, ncclNetPlugin_v8",
                       "using the built-in network plugins", "using network plugin Socket"}};
  return np_run(2, LOOM_NCCL_LIB, &k);
}

/* The plugin's own warning reaches Loom's log through the logger, then
 * Loom's names the failed init(). The library stays loaded (init ran), so
 * the check that it did not serve is the log's. */
TEST_IMPL(net_plugin_init_fails) {
  setenv("LOOMSAMPLE_IFNAME", "nosuch0", 1);
  struct np_case k = {NULL, 0, 0,
                      {"LOOMSAMPLE_IFNAME=nosuch0 names no up IPv4 interface", "init() returned ncclSystemError",
                       "using network plugin Socket"}};
  return np_run(2, LOOM_NET_SAMPLE, &k);
}
