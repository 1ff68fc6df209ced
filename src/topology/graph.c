/* The topology graph: nodes, links, bandwidths, and the best path between
 * every pair of nodes.
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/utils.h"
#include "topology/graph.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *type_names[TOPO_NTYPES] = {"GPU", "PCI", "NVS", "CPU", "NIC"};

const char *topo_type_name(int type) { return type >= 0 && type < TOPO_NTYPES ? type_names[type] : "?"; }

ncclResult_t topo_system_new(struct topo_system **out) {
  struct topo_system *s;
  CHECK(UTIL_CALLOC(&s, 1, "a topology"));
  *out = s;
  return ncclSuccess;
}

void topo_system_free(struct topo_system *s) {
  if (!s)
    return;
  free(s->nodes);
  free(s->paths);
  free(s);
}

ncclResult_t topo_add_node(struct topo_system *s, int type, int *index) {
  if (s->n == TOPO_MAX_NODES)
    return err_set(ncclInvalidArgument, "the topology has more than %d nodes", TOPO_MAX_NODES);
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 32;
    struct topo_node *nn = realloc(s->nodes, sizeof *nn * cap);
    if (!nn)
      return err_set(ncclSystemError, "out of memory for a topology of %d nodes", cap);
    s->nodes = nn;
    s->cap = cap;
  }
  struct topo_node *n = &s->nodes[s->n];
  memset(n, 0, sizeof *n);
  n->type = type;
  n->parent = -1;
  n->dev = -1;
  n->numa = -1;
  n->pci_class = -1;
  *index = s->n++;
  free(s->paths);
  s->paths = NULL;
  return ncclSuccess;
}

static ncclResult_t add_link(struct topo_system *s, int a, int b, int type, double bw) {
  struct topo_node *n = &s->nodes[a];
  for (int i = 0; i < n->nlinks; i++) {
    if (n->links[i].peer == b && n->links[i].type == type) {
      n->links[i].bw += bw; /* several NVLinks to one peer add up */
      return ncclSuccess;
    }
  }
  if (n->nlinks == TOPO_MAX_LINKS)
    return err_set(ncclInvalidArgument, "topology node %s %s has more than %d links", topo_type_name(n->type),
                   n->busid, TOPO_MAX_LINKS);
  n->links[n->nlinks++] = (struct topo_link){.type = type, .peer = b, .bw = bw};
  return ncclSuccess;
}

ncclResult_t topo_connect(struct topo_system *s, int a, int b, int type, double bw) {
  CHECK(add_link(s, a, b, type, bw));
  return a == b ? ncclSuccess : add_link(s, b, a, type, bw);
}

int topo_find_busid(const struct topo_system *s, const char *busid) {
  for (int i = 0; i < s->n; i++)
    if (s->nodes[i].busid[0] && strcasecmp(s->nodes[i].busid, busid) == 0)
      return i;
  return -1;
}

int topo_count(const struct topo_system *s, int type) {
  int c = 0;
  for (int i = 0; i < s->n; i++)
    c += s->nodes[i].type == type;
  return c;
}

int topo_nth(const struct topo_system *s, int type, int k) {
  for (int i = 0; i < s->n; i++)
    if (s->nodes[i].type == type && k-- == 0)
      return i;
  return -1;
}

/* GB/s per x16-equivalent lane as NCCL models them: about 3/4 of the raw
 * rate is what DMA gets (12 GB/s for a Gen3 x16 link). */
double topo_pci_bw(const char *link_speed, int width) {
  double gts = link_speed ? atof(link_speed) : 0;
  double lane = gts >= 64 ? 6.0 : gts >= 32 ? 3.0 : gts >= 16 ? 1.5 : gts >= 8 ? 0.75 : gts >= 5 ? 0.375
              : gts >= 2.5 ? 0.1875 : 0;
  if (lane == 0 || width <= 0)
    return 12.0; /* unknown: a Gen3 x16 */
  return lane * width;
}

double topo_nvlink_bw(int sm) {
  if (sm >= 100)
    return 40.1;
  if (sm >= 90)
    return 20.6;
  if (sm >= 70)
    return 20.0;
  return 18.0;
}

double topo_sys_bw(const char *vendor) {
  if (vendor && (strstr(vendor, "AMD") || strstr(vendor, "amd")))
    return 16.0;
  return 10.0;
}

int topo_local_cpu(const struct topo_system *s, int node) {
  if (s->nodes[node].type == TOPO_CPU)
    return node;
  int best = -1;
  for (int i = 0; i < s->n; i++) {
    if (s->nodes[i].type != TOPO_CPU)
      continue;
    if (best < 0 || (s->paths && topo_path(s, node, i)->hops < topo_path(s, node, best)->hops))
      best = i;
  }
  return best;
}

/* The search state of a path: what it went through so far. */
struct state {
  int type;
  double bw;
  int hops;
  int pci_mid; /* PCI bridges passed through, capped at 2 */
  int last;    /* the kind of link that led here */
  int done;
};

static int better(const struct state *a, const struct state *b) {
  if (a->type != b->type)
    return a->type < b->type;
  if (a->bw != b->bw)
    return a->bw > b->bw;
  return a->hops < b->hops;
}

/* What a path's kind becomes when it goes on from `u` over link `l`. */
static int extend(const struct topo_system *s, int src, int u, const struct topo_link *l, const struct state *from,
                  struct state *to) {
  const struct topo_node *un = &s->nodes[u], *vn = &s->nodes[l->peer];
  /* Only PCI bridges, CPUs and NVSwitches forward traffic; GPUs forward
   * over NVLink alone; NICs forward nothing. */
  if (u != src) {
    if (un->type == TOPO_NIC)
      return 0;
    if (un->type == TOPO_GPU && (l->type != LINK_NVL || from->last != LINK_NVL))
      return 0;
  }
  *to = *from;
  to->done = 0;
  to->hops++;
  to->bw = from->bw < l->bw ? from->bw : l->bw;
  int t = from->type;
  if (u != src && un->type == TOPO_PCI && to->pci_mid < 2)
    to->pci_mid++;
  if (l->type == LINK_NVL)
    t = LOOM_MAX(t, (u != src && un->type == TOPO_GPU) ? PATH_NVB : PATH_NVL);
  if (l->type == LINK_PCI)
    t = LOOM_MAX(t, to->pci_mid >= 2 ? PATH_PXB : PATH_PIX);
  if (u != src && un->type == TOPO_CPU)
    t = LOOM_MAX(t, PATH_PHB);
  if (l->type == LINK_SYS)
    t = LOOM_MAX(t, PATH_SYS);
  /* Between a CPU and a device the path goes through the host bridge. */
  if ((vn->type == TOPO_CPU) != (s->nodes[src].type == TOPO_CPU))
    t = LOOM_MAX(t, PATH_PHB);
  to->type = t;
  to->last = l->type;
  return 1;
}

ncclResult_t topo_compute_paths(struct topo_system *s) {
  /* CPUs are joined by the inter-socket link. */
  for (int a = 0; a < s->n; a++)
    for (int b = a + 1; b < s->n; b++)
      if (s->nodes[a].type == TOPO_CPU && s->nodes[b].type == TOPO_CPU) {
        int linked = 0;
        for (int k = 0; k < s->nodes[a].nlinks; k++)
          linked |= s->nodes[a].links[k].peer == b;
        if (!linked)
          CHECK(topo_connect(s, a, b, LINK_SYS, topo_sys_bw(s->nodes[a].vendor)));
      }
  free(s->paths);
  s->paths = calloc((size_t)s->n * s->n, sizeof *s->paths);
  struct state *st = calloc((size_t)s->n, sizeof *st);
  if (!s->paths || !st) {
    free(st);
    return err_set(ncclSystemError, "out of memory computing the paths of %d topology nodes", s->n);
  }
  for (int src = 0; src < s->n; src++) {
    for (int i = 0; i < s->n; i++)
      st[i] = (struct state){.type = PATH_DIS, .bw = 0, .hops = 0};
    st[src] = (struct state){.type = PATH_LOC, .bw = 1e9, .hops = 0};
    /* Dijkstra on (kind, -bandwidth, hops): a path's kind never improves
     * and its bandwidth never grows as it goes on, so the first time a
     * node is settled its path is the best. */
    for (;;) {
      int u = -1;
      for (int i = 0; i < s->n; i++)
        if (!st[i].done && st[i].type != PATH_DIS && (u < 0 || better(&st[i], &st[u])))
          u = i;
      if (u < 0)
        break;
      st[u].done = 1;
      for (int k = 0; k < s->nodes[u].nlinks; k++) {
        const struct topo_link *l = &s->nodes[u].links[k];
        struct state cand;
        if (st[l->peer].done || !extend(s, src, u, l, &st[u], &cand))
          continue;
        if (st[l->peer].type == PATH_DIS || better(&cand, &st[l->peer]))
          st[l->peer] = cand;
      }
    }
    for (int i = 0; i < s->n; i++) {
      struct topo_path *p = &s->paths[src * s->n + i];
      p->type = (uint8_t)st[i].type;
      p->hops = (uint8_t)LOOM_MIN(st[i].hops, 255);
      p->bw = i == src ? 0 : (float)st[i].bw;
    }
  }
  free(st);
  return ncclSuccess;
}
