/*
 * Topology on XML descriptions of real machine types (tests/topo/): paths
 * as NCCL classifies them, the rings and trees the search builds for 1, 2
 * and 16 hosts of each, and XML round trips. Fixture paths come from
 * LOOM_TOPO_FIXTURES, set by CMake.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "algorithms/tuner.h"
#include "enqueue.h"
#include "topology/discover.h"
#include "topology/graph.h"
#include "topology/search.h"
#include "topology/topo.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"
#include "test.h"

static struct topo_system *load(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", LOOM_TOPO_FIXTURES, name);
  struct topo_system *t = NULL;
  ncclResult_t r = topo_load(path, &t);
  ASSERT_MSG(r == ncclSuccess, "loading %s: %s", path, err_thread_last());
  return t;
}

static int gpu(const struct topo_system *t, int i) { return topo_nth(t, TOPO_GPU, i); }
static int nic(const struct topo_system *t, int i) { return topo_nth(t, TOPO_NIC, i); }
static int ptype(const struct topo_system *t, int a, int b) { return topo_path(t, a, b)->type; }

TEST_IMPL(unit_topo_paths) {
  struct topo_system *t = load("dgx_h100.xml");
  ASSERT(topo_count(t, TOPO_GPU) == 8 && topo_count(t, TOPO_NIC) == 8 && topo_count(t, TOPO_CPU) == 2);
  ASSERT(topo_count(t, TOPO_NVS) == 1);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++)
      if (i != j)
        ASSERT_MSG(ptype(t, gpu(t, i), gpu(t, j)) == PATH_NVL, "GPU %d-%d is %s", i, j,
                   path_type_name(ptype(t, gpu(t, i), gpu(t, j))));
  /* Each GPU shares a PCIe switch with its NIC; the socket's other NICs
   * are behind the host bridge, the other socket's across it. */
  ASSERT(ptype(t, gpu(t, 0), nic(t, 0)) == PATH_PIX);
  ASSERT(ptype(t, gpu(t, 0), nic(t, 1)) == PATH_PHB);
  ASSERT(ptype(t, gpu(t, 0), nic(t, 5)) == PATH_SYS);
  /* GPUs forward over NVLink only: a NIC does not reach the far GPUs
   * through its neighbour GPU's NVLinks. */
  ASSERT(ptype(t, nic(t, 2), gpu(t, 5)) == PATH_SYS);
  ASSERT(ptype(t, nic(t, 2), gpu(t, 3)) == PATH_PHB);
  int cpu0 = topo_nth(t, TOPO_CPU, 0);
  ASSERT(ptype(t, cpu0, gpu(t, 0)) == PATH_PHB && ptype(t, gpu(t, 0), cpu0) == PATH_PHB);
  ASSERT(ptype(t, cpu0, gpu(t, 4)) == PATH_SYS);
  ASSERT(topo_path(t, gpu(t, 0), gpu(t, 1))->bw > 300); /* 18 NVLink4 links */
  topo_system_free(t);

  t = load("pcie_4gpu.xml");
  ASSERT(ptype(t, gpu(t, 0), gpu(t, 1)) == PATH_PIX);
  ASSERT(ptype(t, gpu(t, 0), gpu(t, 2)) == PATH_PHB);
  ASSERT(ptype(t, gpu(t, 2), nic(t, 0)) == PATH_PHB);
  ASSERT(ptype(t, gpu(t, 1), nic(t, 0)) == PATH_PIX);
  topo_system_free(t);

  t = load("cpu_2socket.xml");
  ASSERT(topo_count(t, TOPO_CPU) == 2 && topo_count(t, TOPO_NIC) == 1);
  ASSERT(ptype(t, topo_nth(t, TOPO_CPU, 0), topo_nth(t, TOPO_CPU, 1)) == PATH_SYS);
  topo_system_free(t);
  return 0;
}

/* Structures of the same file read twice compare equal node by node. */
static void same_system(const struct topo_system *a, const struct topo_system *b) {
  ASSERT(a->n == b->n);
  for (int i = 0; i < a->n; i++) {
    const struct topo_node *x = &a->nodes[i], *y = &b->nodes[i];
    ASSERT_MSG(x->type == y->type && strcmp(x->busid, y->busid) == 0 && x->numa == y->numa && x->sm == y->sm &&
                   x->speed_mbps == y->speed_mbps && x->nlinks == y->nlinks && x->parent == y->parent,
               "node %d differs (%s %s / %s %s)", i, topo_type_name(x->type), x->busid, topo_type_name(y->type),
               y->busid);
    for (int k = 0; k < x->nlinks; k++)
      ASSERT(x->links[k].peer == y->links[k].peer && x->links[k].type == y->links[k].type &&
             (int)(x->links[k].bw * 100) == (int)(y->links[k].bw * 100));
  }
}

static void round_trip(const struct topo_system *t) {
  struct xml_node *root;
  ASSERT_OK(topo_to_xml(t, &root));
  char *text;
  size_t len;
  ASSERT_OK(xml_write(root, &text, &len));
  xml_free(root);
  ASSERT_OK(xml_parse(text, len, "round trip", &root));
  struct topo_system *u;
  ncclResult_t r = topo_from_xml(root, "round trip", &u);
  ASSERT_MSG(r == ncclSuccess, "%s\n%s", err_thread_last(), text);
  same_system(t, u);
  xml_free(root);
  free(text);
  topo_system_free(u);
}

TEST_IMPL(unit_topo_xml_round_trip) {
  static const char *files[] = {"dgx_h100.xml", "dgx_a100.xml", "pcie_4gpu.xml", "cpu_2socket.xml", "this_host.xml"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    struct topo_system *t = load(files[i]);
    round_trip(t);
    topo_system_free(t);
  }
  return 0;
}

/* This host, discovered: a correct CPU/NUMA topology at least, and one
 * that survives being written and read back. */
TEST_IMPL(unit_topo_discover) {
  struct topo_system *t;
  ASSERT_MSG(topo_discover(&t) == ncclSuccess, "%s", err_thread_last());
  ASSERT(topo_count(t, TOPO_CPU) >= 1);
  int cores = 0;
  for (int i = 0; i < t->n; i++)
    cores += t->nodes[i].type == TOPO_CPU ? t->nodes[i].ncores : 0;
  ASSERT(cores >= 1);
  round_trip(t);
  topo_system_free(t);
  return 0;
}

/* ---- search ---- */

struct built {
  int nhosts, per, nranks, nch;
  struct host_plan plans[16];
  int *ranks[16];
  struct channels ch;
};

/* nhosts copies of `t`, one rank per device in `devs` order on each. */
static void build(const struct topo_system *t, const int *devs, int per, int nhosts, int nch, struct built *b) {
  memset(b, 0, sizeof *b);
  b->nhosts = nhosts;
  b->per = per;
  b->nranks = per * nhosts;
  b->nch = nch;
  for (int h = 0; h < nhosts; h++) {
    ASSERT_OK(topo_plan_host(t, per, devs, nch, nhosts > 1, &b->plans[h]));
    b->ranks[h] = malloc(sizeof(int) * per);
    for (int i = 0; i < per; i++)
      b->ranks[h][i] = h * per + i;
  }
  ASSERT_OK(topo_build_channels(nhosts, b->plans, b->ranks, b->nranks, &b->ch));
}

static void unbuild(struct built *b) {
  for (int h = 0; h < b->nhosts; h++) {
    topo_plan_free(&b->plans[h]);
    free(b->ranks[h]);
  }
  topo_channels_free(&b->ch);
}

/* Every ring visits every rank once, each host's ranks together. */
static void check_rings(const struct built *b) {
  for (int c = 0; c < b->ch.nchannels; c++) {
    const int *ring = &b->ch.ring[c * b->nranks];
    char seen[4096] = {0};
    for (int i = 0; i < b->nranks; i++) {
      ASSERT(ring[i] >= 0 && ring[i] < b->nranks && !seen[ring[i]]);
      seen[ring[i]] = 1;
      ASSERT_MSG(ring[i] / b->per == i / b->per, "channel %d: host %d's ranks are not together", c, i / b->per);
    }
  }
}

/* One root; everyone else has a parent that lists it as a child; every
 * rank reaches the root. */
static void check_tree(const struct built *b, int c) {
  int n = b->nranks, roots = 0;
  for (int r = 0; r < n; r++) {
    int up = b->ch.tree_up[c * n + r];
    if (up < 0) {
      roots++;
      continue;
    }
    int found = 0;
    for (int k = 0; k < TREE_MAX_CHILDREN; k++)
      found |= b->ch.tree_down[(c * n + up) * TREE_MAX_CHILDREN + k] == r;
    ASSERT_MSG(found, "channel %d: rank %d's parent %d does not list it", c, r, up);
    int x = r, steps = 0;
    while (b->ch.tree_up[c * n + x] >= 0 && steps++ <= n)
      x = b->ch.tree_up[c * n + x];
    ASSERT_MSG(steps <= n, "channel %d: rank %d is in a cycle", c, r);
  }
  ASSERT_MSG(roots == 1, "channel %d has %d roots", c, roots);
}

/* Is rank r an inner node (has a child on another host) in channel c? */
static int inner_across(const struct built *b, int c, int r) {
  for (int k = 0; k < TREE_MAX_CHILDREN; k++) {
    int d = b->ch.tree_down[(c * b->nranks + r) * TREE_MAX_CHILDREN + k];
    if (d >= 0 && d / b->per != r / b->per)
      return 1;
  }
  return 0;
}

static void check_double_tree(const struct built *b) {
  if (b->ch.nchannels < 2)
    return;
  for (int h = 0; h < b->nhosts; h++) {
    int in0 = 0, in1 = 0;
    for (int i = 0; i < b->per; i++) {
      in0 |= inner_across(b, 0, h * b->per + i);
      in1 |= inner_across(b, 1, h * b->per + i);
    }
    ASSERT_MSG(!(in0 && in1), "host %d of %d is an inner node of both trees", h, b->nhosts);
  }
}

static int cpu_of(const struct topo_system *t, int node) { return t->nodes[node].numa; }

/* Socket crossings of host 0's chain in channel c (and around, alone). */
static int crossings(const struct topo_system *t, const struct built *b, const int *devs, int c, int cycle) {
  int x = 0;
  const int *chain = &b->plans[0].chain[c * b->per];
  for (int i = 0; i + 1 < b->per; i++)
    x += cpu_of(t, devs[chain[i]]) != cpu_of(t, devs[chain[i + 1]]);
  if (cycle)
    x += cpu_of(t, devs[chain[b->per - 1]]) != cpu_of(t, devs[chain[0]]);
  return x;
}

static void search_gpu_box(const char *file, int nvlink) {
  struct topo_system *t = load(file);
  int ng = topo_count(t, TOPO_GPU), devs[16];
  for (int i = 0; i < ng; i++)
    devs[i] = gpu(t, i);
  int nnics = topo_count(t, TOPO_NIC);
  /* As many channels as a communicator of these GPUs takes: with NVLink
   * more than NICs, so that NICs serve several channels each. */
  struct topo_channel_rule rule;
  topo_channel_rule(t, 1, devs[0], 0, &rule);
  ASSERT(nvlink ? rule.shared > nnics : rule.shared == LOOM_MAX(2, nnics));
  static const int hosts[] = {1, 2, 16};
  for (size_t hi = 0; hi < 3; hi++) {
    int nh = hosts[hi], nch = rule.shared;
    struct built b;
    build(t, devs, ng, nh, nch, &b);
    check_rings(&b);
    for (int c = 0; c < b.ch.nchannels; c++) {
      check_tree(&b, c);
      const int *chain = &b.plans[0].chain[c * ng];
      /* Neighbours on the fastest links. */
      for (int i = 0; i + 1 < ng; i++) {
        int p = ptype(t, devs[chain[i]], devs[chain[i + 1]]);
        ASSERT_MSG(nvlink ? p == PATH_NVL : p <= PATH_PHB, "%s %d hosts ch %d: hop %d is %s", file, nh, c, i,
                   path_type_name(p));
      }
      ASSERT_MSG(crossings(t, &b, devs, c, nh == 1) <= 2, "%s: channel %d crosses sockets %d times", file, c,
                 crossings(t, &b, devs, c, nh == 1));
      if (nh > 1) {
        /* The chain enters at a GPU nearest the channel's NIC. */
        int n = b.plans[0].nic[c], best = PATH_DIS;
        ASSERT(n >= 0);
        for (int g = 0; g < ng; g++)
          best = LOOM_MIN(best, ptype(t, devs[g], n));
        ASSERT_MSG(ptype(t, devs[chain[0]], n) == best, "%s ch %d: enters at GPU %d, %s from its NIC", file, c,
                   chain[0], path_type_name(ptype(t, devs[chain[0]], n)));
        ASSERT(cpu_of(t, devs[chain[ng - 1]]) == cpu_of(t, n)); /* and leaves on the NIC's socket */
      }
    }
    if (nh > 1) {
      /* Channels spread over the NICs, each NIC used once per round:
       * channels share one exactly when they are a whole number of
       * rounds apart. */
      for (int c = 0; c < b.ch.nchannels; c++)
        for (int d = 0; d < c; d++)
          ASSERT_MSG((b.plans[0].nic[c] == b.plans[0].nic[d]) == (c % nnics == d % nnics),
                     "%s: channels %d and %d %s a NIC", file, c, d,
                     b.plans[0].nic[c] == b.plans[0].nic[d] ? "share" : "do not share");
      check_double_tree(&b);
    }
    unbuild(&b);
  }
  topo_system_free(t);
}

TEST_IMPL(unit_topo_search_h100) {
  search_gpu_box("dgx_h100.xml", 1);
  return 0;
}

TEST_IMPL(unit_topo_search_a100) {
  search_gpu_box("dgx_a100.xml", 1);
  return 0;
}

/* Without NVLink: GPUs of one switch are neighbours, the ring crosses
 * between the switches only twice. */
TEST_IMPL(unit_topo_search_pcie) {
  search_gpu_box("pcie_4gpu.xml", 0);
  struct topo_system *t = load("pcie_4gpu.xml");
  int devs[4];
  for (int i = 0; i < 4; i++)
    devs[i] = gpu(t, i);
  struct built b;
  build(t, devs, 4, 1, 1, &b);
  int phb = 0;
  const int *ring = b.ch.ring;
  for (int i = 0; i < 4; i++)
    phb += ptype(t, devs[ring[i]], devs[ring[(i + 1) % 4]]) == PATH_PHB;
  ASSERT_MSG(phb == 2, "the ring crosses between switches %d times", phb);
  unbuild(&b);
  topo_system_free(t);
  return 0;
}

/* CPU ranks: two per socket; the ring keeps each socket's ranks together. */
TEST_IMPL(unit_topo_search_cpu) {
  struct topo_system *t = load("cpu_2socket.xml");
  int c0 = topo_nth(t, TOPO_CPU, 0), c1 = topo_nth(t, TOPO_CPU, 1);
  int devs[4] = {c0, c1, c0, c1};
  static const int hosts[] = {1, 2, 16};
  for (int hi = 0; hi < 3; hi++) {
    struct built b;
    build(t, devs, 4, hosts[hi], 2, &b);
    check_rings(&b);
    for (int c = 0; c < 2; c++) {
      check_tree(&b, c);
      ASSERT_MSG(crossings(t, &b, devs, c, hosts[hi] == 1) <= 2, "channel %d crosses sockets %d times", c,
                 crossings(t, &b, devs, c, hosts[hi] == 1));
    }
    if (hosts[hi] > 1)
      check_double_tree(&b);
    unbuild(&b);
  }
  topo_system_free(t);
  /* This host's own dump: one NUMA node, so any order is as good, but the
   * rings and trees must still be whole. */
  t = load("this_host.xml");
  int here[3] = {topo_nth(t, TOPO_CPU, 0), topo_nth(t, TOPO_CPU, 0), topo_nth(t, TOPO_CPU, 0)};
  ASSERT(here[0] >= 0);
  for (int hi = 0; hi < 3; hi++) {
    struct built b;
    build(t, here, 3, hosts[hi], 2, &b);
    check_rings(&b);
    for (int c = 0; c < 2; c++)
      check_tree(&b, c);
    if (hosts[hi] > 1)
      check_double_tree(&b);
    unbuild(&b);
  }
  topo_system_free(t);
  return 0;
}

/* The double binary tree alone, for every size up to 64. */
TEST_IMPL(unit_topo_dtree) {
  for (int n = 1; n <= 64; n++) {
    int inner[2][64] = {{0}}, roots[2] = {0};
    for (int w = 0; w < 2; w++)
      for (int i = 0; i < n; i++) {
        int p, a, c;
        topo_dtree(n, i, w, &p, &a, &c);
        roots[w] += p < 0;
        inner[w][i] = a >= 0 || c >= 0;
        if (p >= 0) {
          int pp, pa, pc;
          topo_dtree(n, p, w, &pp, &pa, &pc);
          ASSERT_MSG(pa == i || pc == i, "n %d tree %d: %d's parent %d does not list it", n, w, i, p);
        }
      }
    ASSERT_MSG(roots[0] == 1 && roots[1] == 1, "n %d: roots %d and %d", n, roots[0], roots[1]);
    for (int i = 0; i < n; i++)
      ASSERT_MSG(!(inner[0][i] && inner[1][i]), "n %d: node %d is inner in both trees", n, i);
  }
  return 0;
}

/* Topology files with mistakes in them name the line and the mistake. */
TEST_IMPL(unit_topo_bad_files) {
  static const struct {
    const char *xml, *words;
  } cases[] = {
      {"<system><gpu/></system>", "line 1: unknown element <gpu> inside <system>"},
      {"<system>\n<cpu/>\n</system>", "line 2: <cpu> needs the attribute numaid"},
      {"<system><cpu numaid=\"x\"/></system>", "not a number"},
      {"<system><cpu numaid=\"0\"/><cpu numaid=\"0\"/></system>", "same numaid"},
      {"<system><cpu numaid=\"0\"><pci busid=\"zz\"/></cpu></system>", "busid must look like"},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"><gpu sm=\"90\"/><nic/></pci></cpu></system>",
       "holds one <gpu> or <nic>"},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"><gpu sm=\"90\"><nvlink target=\"0000:02:00.0\" "
       "count=\"900\"/></gpu></pci></cpu></system>",
       "count=\"900\""},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"><gpu/></pci><pci busid=\"0000:01:00.0\"><gpu/></pci>"
       "</cpu></system>",
       "appears twice"},
      {"<machine/>", "not <system>"},
      {"<system/>", "has no <cpu>"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct xml_node *root = NULL;
    struct topo_system *t = NULL;
    ncclResult_t r = xml_parse(cases[i].xml, strlen(cases[i].xml), "NCCL_TOPO_FILE=test.xml", &root);
    if (r == ncclSuccess) {
      r = topo_from_xml(root, "NCCL_TOPO_FILE=test.xml", &t);
      xml_free(root);
    }
    ASSERT_MSG(r == ncclInvalidArgument, "case %zu: result %d", i, (int)r);
    ASSERT_MSG(strstr(err_thread_last(), cases[i].words) != NULL, "case %zu: \"%s\" not in: %s", i, cases[i].words,
               err_thread_last());
    topo_system_free(t);
  }
  return 0;
}

/* The tuner's bandwidths come from the links the chains use: NVLink on a
 * DGX, PCIe on a PCIe box, and the NICs' line rate between hosts; a
 * faster chain moves the ring/tree crossover. */
TEST_IMPL(unit_topo_plan_bw) {
  struct topo_system *t = load("dgx_h100.xml");
  int devs[8];
  for (int i = 0; i < 8; i++)
    devs[i] = gpu(t, i);
  struct built b;
  build(t, devs, 8, 2, 8, &b);
  double chain, nicbw;
  topo_plan_bw(t, &b.plans[0], devs, 1, &chain, &nicbw);
  ASSERT_MSG(chain >= 100, "H100 chains over NVLink at %.1f GB/s", chain);
  ASSERT_MSG(nicbw > 399 && nicbw < 401, "eight 400 Gb/s NICs seen as %.1f GB/s", nicbw);
  unbuild(&b);
  build(t, devs, 8, 2, 2, &b);
  double two;
  topo_plan_bw(t, &b.plans[0], devs, 1, &chain, &two);
  ASSERT_MSG(two > 99 && two < 101, "two channels on two NICs: %.1f GB/s", two);
  unbuild(&b);
  topo_system_free(t);

  t = load("pcie_4gpu.xml");
  for (int i = 0; i < 4; i++)
    devs[i] = gpu(t, i);
  build(t, devs, 4, 1, 1, &b);
  double pcie;
  topo_plan_bw(t, &b.plans[0], devs, 0, &pcie, &nicbw);
  ASSERT_MSG(pcie > 0 && pcie < 40 && pcie < chain, "PCIe chain at %.1f GB/s", pcie);
  unbuild(&b);
  topo_system_free(t);

  struct tune_input fast, slow;
  tuner_shape(&fast, 16, 2, 8, 8, 1, 0, 4u << 20, chain, 50);
  tuner_shape(&slow, 16, 2, 8, 8, 1, 0, 4u << 20, pcie, 50);
  ASSERT(fast.bw_local > slow.bw_local && fast.bw_net == slow.bw_net);
  ASSERT(tuner_estimate(&fast, COLL_ALLGATHER, ALGO_RING, 1u << 30) <
         tuner_estimate(&slow, COLL_ALLGATHER, ALGO_RING, 1u << 30));
  return 0;
}

/* The channel rule of one rank on a fixture's first GPU. */
static struct topo_channel_rule rule_of(const char *file, int gpu_rank, int lanes) {
  struct topo_system *t = load(file);
  struct topo_channel_rule r;
  topo_channel_rule(t, gpu_rank, gpu_rank ? gpu(t, 0) : -1, lanes, &r);
  topo_system_free(t);
  return r;
}

/* How many channels a rank asks for: enough to fill its GPU's NVLinks
 * where other ranks share its host (24 on an H100, 16 on an A100), one
 * per NIC alone or without NVLink, 1 on a host rank; the device's
 * resident blocks, NCCL_MIN/MAX_NCHANNELS and the config bound it. */
TEST_IMPL(unit_topo_channels) {
  setenv("NCCL_MIN_NCHANNELS", "1", 1);
  setenv("NCCL_MAX_NCHANNELS", "32", 1);
  struct topo_channel_rule r = rule_of("dgx_h100.xml", 1, 0);
  ASSERT_MSG(r.nvlinks == 18 && r.link_gbs > 20 && r.link_gbs < 21, "%d links of %.1f GB/s", r.nvlinks, r.link_gbs);
  ASSERT_MSG(r.shared == 24 && r.alone == 8, "DGX H100: %d channels shared, %d alone", r.shared, r.alone);
  char why[256];
  topo_channel_why(&r, 1, why, sizeof why);
  ASSERT_MSG(strstr(why, "24 (NVLink: 18 links x 20.6 GB/s"), "%s", why);
  topo_channel_why(&r, 0, why, sizeof why);
  ASSERT_MSG(strstr(why, "8 (one per NIC") && strstr(why, "NVLink unused"), "%s", why);
  /* A device holding 40 blocks at once keeps 20 for point-to-point. */
  r = rule_of("dgx_h100.xml", 1, 40);
  ASSERT_MSG(r.shared == 20 && r.alone == 8, "40 lanes: %d shared, %d alone", r.shared, r.alone);
  topo_channel_why(&r, 1, why, sizeof why);
  ASSERT_MSG(strstr(why, "20 (NVLink") && strstr(why, "half the 40 blocks"), "%s", why);
  r = rule_of("dgx_a100.xml", 1, 0);
  ASSERT_MSG(r.nvlinks == 12 && r.shared == 16 && r.alone == 8, "DGX A100: %d links, %d shared, %d alone", r.nvlinks,
             r.shared, r.alone);
  /* PCIe only: today's count, one NIC there so the floor of 2. */
  r = rule_of("pcie_4gpu.xml", 1, 0);
  ASSERT_MSG(r.nvlinks == 0 && r.shared == 2 && r.alone == 2, "PCIe: %d links, %d shared, %d alone", r.nvlinks,
             r.shared, r.alone);
  topo_channel_why(&r, 1, why, sizeof why);
  ASSERT_MSG(strstr(why, "2 (one per NIC, at least 2: 1 NIC)"), "%s", why);
  /* A host rank asks for 1, NVLink or not. */
  r = rule_of("dgx_h100.xml", 0, 0);
  ASSERT(r.shared == 1 && r.alone == 1);
  /* A GPU the topology does not place: NICs only. */
  struct topo_system *t = load("dgx_h100.xml");
  topo_channel_rule(t, 1, -1, 0, &r);
  ASSERT(r.nvlinks == 0 && r.shared == 8 && r.alone == 8);
  topo_system_free(t);
  /* Bounds: the environment, then the config's minCTAs and maxCTAs. */
  ASSERT(topo_bound_channels(24, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT) == 24);
  setenv("NCCL_MAX_NCHANNELS", "12", 1);
  ASSERT(topo_bound_channels(24, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT) == 12);
  ASSERT(topo_bound_channels(2, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT) == 2);
  setenv("NCCL_MIN_NCHANNELS", "4", 1);
  ASSERT(topo_bound_channels(2, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT) == 4);
  ASSERT(topo_bound_channels(24, NCCL_CONFIG_UNDEF_INT, 6) == 6);
  ASSERT(topo_bound_channels(24, 30, NCCL_CONFIG_UNDEF_INT) == 30);
  ASSERT(topo_bound_channels(24, 64, NCCL_CONFIG_UNDEF_INT) == LOOM_MAX_CHANNELS);
  unsetenv("NCCL_MIN_NCHANNELS");
  unsetenv("NCCL_MAX_NCHANNELS");
  return 0;
}

/* hwloc's view of the PCI tree matches the kernel's: for every PCI
 * function here, the bridges hwloc puts above it are the ones its sysfs
 * path names, root first. (Where the build has no hwloc, there is nothing
 * to compare and discovery reads sysfs alone.) */
TEST_IMPL(unit_topo_pci_chain) {
  DIR *d = opendir("/sys/bus/pci/devices");
  if (!d)
    SKIP("no /sys/bus/pci here: nothing to compare");
  int known = 0, total = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    total++;
    char want[TOPO_MAX_PCI_DEPTH][TOPO_BUSID_LEN], got[TOPO_MAX_PCI_DEPTH][TOPO_BUSID_LEN];
    int nwant = 0, numa;
    char link[512], real[PATH_MAX];
    snprintf(link, sizeof link, "/sys/bus/pci/devices/%s", e->d_name);
    ASSERT(realpath(link, real));
    char *save = NULL;
    for (char *c = strtok_r(real, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
      unsigned a, b, x, f;
      char tail;
      if (sscanf(c, "%4x:%2x:%2x.%1x%c", &a, &b, &x, &f, &tail) == 4 && strcmp(c, e->d_name) != 0 &&
          nwant < TOPO_MAX_PCI_DEPTH)
        snprintf(want[nwant++], TOPO_BUSID_LEN, "%s", c);
    }
    int n = discover_pci_chain_probe(e->d_name, got, TOPO_MAX_PCI_DEPTH, &numa);
    if (n < 0)
      continue;
    known++;
    ASSERT_MSG(n == nwant, "%s: hwloc sees %d bridges above it, sysfs %d", e->d_name, n, nwant);
    for (int i = 0; i < n; i++)
      ASSERT_MSG(strcmp(got[i], want[i]) == 0, "%s: bridge %d is %s for hwloc, %s in sysfs", e->d_name, i, got[i],
                 want[i]);
  }
  closedir(d);
  printf("%d of %d PCI functions compared\n", known, total);
#if LOOM_HAVE_HWLOC
  ASSERT_MSG(total == 0 || known > 0, "hwloc knows none of the %d PCI functions", total);
#endif
  if (known == 0)
    SKIP("no PCI function here that the discovery knows: nothing was compared");
  return 0;
}
