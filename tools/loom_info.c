/*
 * loom-info: what Loom sees and would do on this host.
 *
 *   loom-info                       version, transports, parameters, topology
 *   loom-info --ranks N [--hosts H] [--channels C] [--topo FILE]
 *                                   the rings and trees of N ranks on H hosts
 *                                   like this one (or like FILE)
 *   loom-info --dump FILE           writes the topology as XML
 *   loom-info --params              the parameter table as Markdown rows,
 *                                   which docs/environment.md carries verbatim
 *   loom-info --status [PID...]     what each communicator of the Loom
 *                                   processes on this host is doing, and
 *                                   which rank the waiting ones wait on
 *
 * It links the library's internals, so what it prints is what a
 * communicator would compute, not a re-implementation.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/tuner.h"
#include "common/path_type.h"
#include "core.h"
#include "enqueue.h"
#include "loom.h"
#include "loom_status.h"
#include "misc/cudamem.h"
#include "topology/discover.h"
#include "topology/graph.h"
#include "topology/search.h"
#include "topology/topo.h"
#include "topology/topo_xml.h"

static void usage(FILE *f) {
  fprintf(f, "usage: loom-info [--ranks N [--hosts H] [--channels C]] [--topo FILE] [--dump FILE] | --params | "
             "--status [PID...]\n");
}

static void print_params(void) {
  printf("\nEnvironment parameters:\n");
  for (int i = 0; i < P_COUNT; i++) {
    const struct param_desc *p = param_desc(i);
    const char *v = getenv(p->name);
    if (v && v[0] && i == P_SECRET)
      v = "(set, not shown)"; /* a secret is not for the terminal or a pasted report */
    printf("  %-22s = %-14s (default %s)\n      %s\n", p->name, v && v[0] ? v : "(unset)", p->def[0] ? p->def : "none",
           p->help);
  }
}

static void print_params_markdown(void) {
  for (int i = 0; i < P_COUNT; i++) {
    const struct param_desc *p = param_desc(i);
    printf("| `%s` | `%s` | %s |\n", p->name, p->def[0] ? p->def : "(unset)", p->help);
  }
}

/* The node label of a matrix row: GPU0, NIC1 mlx5_1, CPU0. */
static void label(const struct topo_system *t, int node, char *buf, size_t len) {
  const struct topo_node *n = &t->nodes[node];
  int k = 0;
  for (int i = 0; i < node; i++)
    k += t->nodes[i].type == n->type;
  snprintf(buf, len, "%s%d", topo_type_name(n->type), k);
}

/* Like nvidia-smi topo -m: the path kind between GPUs, NICs and CPUs. */
static void print_matrix(const struct topo_system *t) {
  int rows[TOPO_MAX_NODES], n = 0;
  int types[] = {TOPO_GPU, TOPO_NIC, TOPO_CPU};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < t->n; i++)
      if (t->nodes[i].type == types[k])
        rows[n++] = i;
  printf("\nTopology of %s (%d CPU, %d GPU, %d NIC, %d PCI bridge, %d NVSwitch nodes):\n%8s", t->host[0] ? t->host : "?",
         topo_count(t, TOPO_CPU), topo_count(t, TOPO_GPU), topo_count(t, TOPO_NIC), topo_count(t, TOPO_PCI),
         topo_count(t, TOPO_NVS), "");
  for (int j = 0; j < n; j++) {
    char l[16];
    label(t, rows[j], l, sizeof l);
    printf(" %6s", l);
  }
  printf("  %s\n", "details");
  for (int i = 0; i < n; i++) {
    char l[16];
    label(t, rows[i], l, sizeof l);
    printf("%8s", l);
    for (int j = 0; j < n; j++)
      printf(" %6s", i == j ? "X" : path_type_name(topo_path(t, rows[i], rows[j])->type));
    const struct topo_node *x = &t->nodes[rows[i]];
    if (x->type == TOPO_GPU)
      printf("  %s sm_%d numa %d", x->busid, x->sm, x->numa);
    else if (x->type == TOPO_NIC)
      printf("  %s %s %d Mb/s numa %d", x->name, x->busid[0] ? x->busid : "(virtual)", x->speed_mbps, x->numa);
    else
      printf("  numa %d cpus %s %s", x->numa, x->affinity, x->vendor);
    printf("\n");
  }
  printf("Paths: NVL NVLink (or NVSwitch), NVB NVLink through a GPU, PIX one PCIe switch, PXB several,\n"
         "       PHB through the CPU's host bridge, SYS across CPUs.\n");
}

/* The count a communicator of `per` ranks per host on devices dev[]
 * would take (init.c): each rank's wish by the topology's rule, bounded
 * by NCCL_MIN/MAX_NCHANNELS, the fewest of them; why gets the first
 * fewest's reason. The devices' resident blocks are not known here. */
static int default_channels(const struct topo_system *t, const int *dev, int per, int gpu, char *why, size_t len) {
  int level = PATH_SYS;
  if (param_is_set(P_P2P_LEVEL) && path_parse_level("NCCL_P2P_LEVEL", param_str(P_P2P_LEVEL), 1, &level) != ncclSuccess)
    level = PATH_SYS; /* param_check_all has refused a bad value already */
  int nvlink_ok = per > 1 && topo_p2p_uses_nvlink((int)param_int(P_P2P_DISABLE), level), nch = LOOM_MAX_CHANNELS + 1;
  for (int i = 0; i < per; i++) {
    struct topo_channel_rule rule;
    topo_channel_rule(t, gpu, gpu ? dev[i] : -1, 0, &rule);
    int topo = nvlink_ok ? rule.shared : rule.alone, n = topo_bound_channels(topo, NCCL_CONFIG_UNDEF_INT,
                                                                             NCCL_CONFIG_UNDEF_INT);
    if (n >= nch)
      continue;
    nch = n;
    char topo_why[200];
    topo_channel_why(&rule, nvlink_ok, topo_why, sizeof topo_why);
    if (n != topo)
      snprintf(why, len, "%d (NCCL_MIN/MAX_NCHANNELS bound the topology's %s)", n, topo_why);
    else
      snprintf(why, len, "%s", topo_why);
  }
  return nch;
}

/* The channels of nranks ranks spread over nhosts hosts like `t`: each
 * host's ranks go round robin over its GPUs (its CPUs without GPUs).
 * nch 0: as many as a communicator would take. */
static int print_channels(const struct topo_system *t, int nranks, int nhosts, int nch) {
  if (nranks < 1 || nhosts < 1 || nranks % nhosts != 0 || nranks / nhosts > 256 || nhosts > 4096) {
    fprintf(stderr, "loom-info: --ranks must be a positive multiple of --hosts (at most 256 ranks per host)\n");
    return 1;
  }
  int per = nranks / nhosts, ndev = topo_count(t, TOPO_GPU), type = ndev ? TOPO_GPU : TOPO_CPU;
  if (!ndev)
    ndev = topo_count(t, TOPO_CPU);
  int *dev = malloc(sizeof *dev * per);
  struct host_plan *plans = calloc(nhosts, sizeof *plans);
  int **ranks = calloc(nhosts, sizeof *ranks);
  if (!dev || !plans || !ranks)
    return 1;
  for (int i = 0; i < per; i++)
    dev[i] = topo_nth(t, type, i % ndev);
  char why[320];
  if (nch > 0)
    snprintf(why, sizeof why, "%d (--channels)", nch);
  else
    nch = default_channels(t, dev, per, type == TOPO_GPU, why, sizeof why);
  if (nch > TOPO_MAX_CHANNELS) {
    fprintf(stderr, "loom-info: --channels must be 1 to %d\n", TOPO_MAX_CHANNELS);
    return 1;
  }
  for (int h = 0; h < nhosts; h++) {
    if (topo_plan_host(t, per, dev, nch, nhosts > 1, &plans[h]) != ncclSuccess) {
      fprintf(stderr, "loom-info: %s\n", err_thread_last());
      return 1;
    }
    ranks[h] = malloc(sizeof(int) * per);
    for (int i = 0; i < per; i++)
      ranks[h][i] = h * per + i;
  }
  struct channels ch;
  if (topo_build_channels(nhosts, plans, ranks, nranks, &ch) != ncclSuccess) {
    fprintf(stderr, "loom-info: %s\n", err_thread_last());
    return 1;
  }
  printf("\n%d ranks on %d host%s (%d per host, on %s), %d channel%s:\n", nranks, nhosts, nhosts > 1 ? "s" : "", per,
         type == TOPO_GPU ? "GPUs" : "CPUs", ch.nchannels, ch.nchannels > 1 ? "s" : "");
  printf("  channels: %s\n", why);
  for (int c = 0; c < ch.nchannels; c++) {
    printf("  channel %2d ring:", c);
    for (int i = 0; i < nranks && i < 64; i++)
      printf(" %d", ch.ring[c * nranks + i]);
    if (nranks > 64)
      printf(" ...");
    if (plans[0].nic[c] >= 0)
      printf("   (host 0 enters and leaves through %s)", t->nodes[plans[0].nic[c]].name);
    printf("\n  channel %2d tree %d:", c, c % 2);
    for (int r = 0; r < nranks && r < 32; r++) {
      printf(" %d<-%d", r, ch.tree_up[c * nranks + r]);
    }
    if (nranks > 32)
      printf(" ...");
    printf("  (rank<-parent)\n");
  }
  /* Every host is like this one, so its plan's bandwidths are the
   * minimum a communicator would take. */
  double chain_gbs, nic_gbs;
  topo_plan_bw(t, &plans[0], dev, nhosts > 1, &chain_gbs, &nic_gbs);
  printf("\nTuner inputs: narrowest chain link %.1f GB/s, NICs together %.1f GB/s (0: none)\n", chain_gbs, nic_gbs);
  struct tune_input in;
  tuner_shape(&in, nranks, nhosts, per, ch.nchannels, type == TOPO_GPU, param_int(P_SHM_DISABLE),
              (size_t)param_int(P_BUFFSIZE), chain_gbs, nic_gbs);
  struct tuner tu;
  if (tuner_init(&tu, &in) != ncclSuccess) {
    fprintf(stderr, "loom-info: %s\n", err_thread_last());
    return 1;
  }
  printf("\nAllReduce algorithm and protocol per size (the model's estimate, Simple's):\n");
  for (size_t bytes = 8; bytes <= ((size_t)1 << 30); bytes *= 8) {
    int algo, nc;
    double est;
    if (tuner_pick(&tu, COLL_ALLREDUCE, bytes, &algo, &nc, &est) != ncclSuccess) {
      printf("  %12zu B  %s\n", bytes, err_thread_last());
      continue;
    }
    printf("  %12zu B  %-18s %-6s %2d channel(s)  %10.1f us\n", bytes, algo_name(algo),
           proto_name(tuner_proto(&tu, COLL_ALLREDUCE, algo, bytes)), nc, est * 1e6);
  }
  topo_channels_free(&ch);
  for (int h = 0; h < nhosts; h++) {
    topo_plan_free(&plans[h]);
    free(ranks[h]);
  }
  free(plans);
  free(ranks);
  free(dev);
  return 0;
}

int main(int argc, char **argv) {
  int nranks = 0, nhosts = 1, nch = 0;
  const char *topo = NULL, *dump = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc)
      nranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--hosts") == 0 && i + 1 < argc)
      nhosts = atoi(argv[++i]);
    else if (strcmp(argv[i], "--channels") == 0 && i + 1 < argc)
      nch = atoi(argv[++i]);
    else if (strcmp(argv[i], "--topo") == 0 && i + 1 < argc)
      topo = argv[++i];
    else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
      dump = argv[++i];
    else if (strcmp(argv[i], "--status") == 0) {
      int n = argc - i - 1, *pids = calloc((size_t)n + 1, sizeof *pids);
      for (int k = 0; k < n; k++) {
        char *end;
        long v = strtol(argv[i + 1 + k], &end, 10);
        if (*end != '\0' || v <= 0 || v > 1 << 30) {
          fprintf(stderr, "loom-info: --status takes process ids; \"%s\" is not one\n", argv[i + 1 + k]);
          return 2;
        }
        pids[k] = (int)v;
      }
      int rc = loom_status_main(n, pids);
      free(pids);
      return rc;
    } else if (strcmp(argv[i], "--params") == 0) {
      print_params_markdown();
      return 0;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (param_check_all() != ncclSuccess) {
    fprintf(stderr, "loom-info: %s\n", err_thread_last());
    return 1;
  }
  int version = 0;
  ncclGetVersion(&version);
  printf("Loom %s, NCCL API %d (NCCL_VERSION_CODE %d)\n", LOOM_VERSION_STRING, version, NCCL_VERSION_CODE);
  int gpus = cuda_device_count();
  printf("Transports built in: %s\n", loomTransports());
  printf("CUDA devices here: %d (%s communicators would be made)\n", gpus,
         cuda_pick_device() >= 0 ? "CUDA" : "host");
  struct topo_system *t = NULL;
  ncclResult_t r = topo ? topo_load(topo, &t) : topo_discover(&t);
  if (r != ncclSuccess) {
    fprintf(stderr, "loom-info: %s\n", err_thread_last());
    return 1;
  }
  if (dump) {
    if (topo_dump(t, dump) != ncclSuccess) {
      fprintf(stderr, "loom-info: %s\n", err_thread_last());
      return 1;
    }
    printf("Topology written to %s\n", dump);
  }
  if (nranks == 0)
    print_params();
  print_matrix(t);
  int rc = 0;
  if (nranks > 0)
    rc = print_channels(t, nranks, nhosts, nch);
  topo_system_free(t);
  return rc;
}
