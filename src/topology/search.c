/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/utils.h"
#include "topology/search.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How good an order of devices is, compared lexicographically: its worst
 * hop first (a ring is as slow as its slowest link), then that hop's
 * bandwidth, then all hops together, then how often it changes socket
 * (which decides among NVSwitch peers, all equally near). */
struct score {
  int worst;
  double bw;
  int sum;
  int cross;
};

static int score_better(const struct score *a, const struct score *b) {
  if (a->worst != b->worst)
    return a->worst < b->worst;
  if (a->bw != b->bw)
    return a->bw > b->bw;
  if (a->sum != b->sum)
    return a->sum < b->sum;
  return a->cross < b->cross;
}

static void score_add(const struct topo_system *t, struct score *s, int a, int b) {
  const struct topo_path *p = topo_path(t, a, b);
  s->worst = LOOM_MAX(s->worst, p->type);
  s->bw = LOOM_MIN(s->bw, (double)p->bw);
  s->sum += p->type;
  s->cross += t->nodes[a].numa != t->nodes[b].numa;
}

static struct score score_order(const struct topo_system *t, const int *d, int k, int cycle) {
  struct score s = {.worst = PATH_LOC, .bw = 1e9, .sum = 0, .cross = 0};
  for (int i = 0; i + 1 < k; i++)
    score_add(t, &s, d[i], d[i + 1]);
  if (cycle && k > 2)
    score_add(t, &s, d[k - 1], d[0]);
  return s;
}

/* Best order of d[lo..hi) (d[0..lo) and d[hi..k) fixed) by trying all
 * permutations, for the few devices a host has. */
static void permute(const struct topo_system *t, int *d, int k, int lo, int hi, int cycle, int *best,
                    struct score *best_score, int at) {
  if (at == hi) {
    struct score s = score_order(t, d, k, cycle);
    if (best_score->worst < 0 || score_better(&s, best_score)) {
      *best_score = s;
      memcpy(best, d, sizeof *d * (size_t)k);
    }
    return;
  }
  for (int i = at; i < hi; i++) {
    int tmp = d[at];
    d[at] = d[i];
    d[i] = tmp;
    permute(t, d, k, lo, hi, cycle, best, best_score, at + 1);
    d[i] = d[at];
    d[at] = tmp;
  }
}

/* Beyond a handful of devices, nearest neighbour from the fixed start. */
static void greedy(const struct topo_system *t, int *d, int k, int lo, int hi) {
  for (int at = lo; at < hi; at++) {
    int from = at > 0 ? d[at - 1] : d[at], pick = at;
    for (int i = at; i < hi; i++) {
      const struct topo_path *a = topo_path(t, from, d[i]), *b = topo_path(t, from, d[pick]);
      if (a->type < b->type || (a->type == b->type && a->bw > b->bw))
        pick = i;
    }
    int tmp = d[at];
    d[at] = d[pick];
    d[pick] = tmp;
  }
}

static void order_range(const struct topo_system *t, int *d, int k, int lo, int hi, int cycle) {
  if (hi - lo <= 1)
    return;
  if (hi - lo > 8) {
    greedy(t, d, k, lo, hi);
    return;
  }
  int *best = malloc(sizeof *best * (size_t)k);
  if (!best) {
    greedy(t, d, k, lo, hi);
    return;
  }
  struct score bs = {.worst = -1};
  permute(t, d, k, lo, hi, cycle, best, &bs, lo);
  memcpy(d, best, sizeof *d * (size_t)k);
  free(best);
}

/* The device nearest `nic` among d[from..k): best path kind, then
 * bandwidth, then the one `rot` places after the first of equals, so that
 * channels sharing a NIC start at different devices. */
static int nearest(const struct topo_system *t, const int *d, int k, int from, int nic, int rot) {
  int best = from;
  for (int i = from + 1; i < k; i++) {
    const struct topo_path *p = topo_path(t, d[i], nic), *q = topo_path(t, d[best], nic);
    if (p->type < q->type || (p->type == q->type && p->bw > q->bw))
      best = i;
  }
  const struct topo_path *q = topo_path(t, d[best], nic);
  int nties = 0;
  for (int i = from; i < k; i++) {
    const struct topo_path *p = topo_path(t, d[i], nic);
    nties += p->type == q->type && p->bw == q->bw;
  }
  /* rot counts among the equally near, wrapping. */
  int want = rot % nties, seen = 0;
  for (int i = from; i < k; i++) {
    const struct topo_path *p = topo_path(t, d[i], nic);
    if (p->type == q->type && p->bw == q->bw && seen++ == want)
      return i;
  }
  return best;
}

ncclResult_t topo_plan_host(const struct topo_system *t, int n, const int *dev, int nchannels, int multihost,
                            struct host_plan *out) {
  memset(out, 0, sizeof *out);
  if (nchannels < 1 || nchannels > TOPO_MAX_CHANNELS)
    return err_set(ncclInternalError, "topology search asked for %d channels", nchannels);
  if (!t->paths)
    return err_set(ncclInternalError, "topology search before the paths were computed");
  out->n = n;
  out->nchannels = nchannels;
  CHECK(UTIL_CALLOC(&out->chain, (size_t)n * nchannels, "a host's chains"));
  /* The distinct devices, in topology order for a result that does not
   * depend on how ranks were numbered. */
  int *uniq;
  CHECK(UTIL_CALLOC(&uniq, n, "devices"));
  int k = 0;
  for (int node = 0; node < t->n; node++)
    for (int i = 0; i < n; i++)
      if (dev[i] == node) {
        uniq[k++] = node;
        break;
      }
  int nnics = topo_count(t, TOPO_NIC);
  int *d;
  ncclResult_t r = UTIL_CALLOC(&d, k ? k : 1, "an order of devices");
  if (r != ncclSuccess) {
    free(uniq);
    return r;
  }
  for (int c = 0; c < nchannels; c++) {
    memcpy(d, uniq, sizeof *d * (size_t)k);
    out->nic[c] = -1;
    if (multihost && nnics > 0 && k > 0) {
      int nic = topo_nth(t, TOPO_NIC, c % nnics);
      out->nic[c] = nic;
      int rot = c / nnics;
      int e = nearest(t, d, k, 0, nic, rot);
      int tmp = d[0];
      d[0] = d[e];
      d[e] = tmp;
      if (k > 1) {
        int x = nearest(t, d, k, 1, nic, 0);
        tmp = d[k - 1];
        d[k - 1] = d[x];
        d[x] = tmp;
      }
      order_range(t, d, k, 1, k - 1, 0);
    } else {
      order_range(t, d, k, 1, k, !multihost);
      /* One host: every channel the same cycle, from another start. */
      if (!multihost && k > 1) {
        int shift = c % k, tmp[TOPO_MAX_NODES];
        for (int i = 0; i < k; i++)
          tmp[i] = d[(i + shift) % k];
        memcpy(d, tmp, sizeof *d * (size_t)k);
      }
    }
    int at = 0;
    for (int j = 0; j < k; j++)
      for (int i = 0; i < n; i++)
        if (dev[i] == d[j])
          out->chain[c * n + at++] = i;
  }
  free(d);
  free(uniq);
  return ncclSuccess;
}

void topo_plan_bw(const struct topo_system *t, const struct host_plan *p, const int *dev, int multihost,
                  double *chain_gbs, double *nic_gbs) {
  double chain = 0, nic = 0;
  int n = p->n;
  for (int c = 0; c < p->nchannels; c++) {
    /* A chain that other hosts continue does not close on itself. */
    for (int k = 0; k + (multihost ? 1 : 0) < n; k++) {
      int a = dev[p->chain[c * n + k]], b = dev[p->chain[c * n + (k + 1) % n]];
      if (a < 0 || b < 0 || a == b)
        continue;
      double bw = topo_path(t, a, b)->bw;
      if (bw > 0 && (chain == 0 || bw < chain))
        chain = bw;
    }
    /* Channels on different NICs add up; on one NIC they share it. */
    int first = 1;
    for (int d = 0; d < c; d++)
      first &= p->nic[d] != p->nic[c];
    if (first && p->nic[c] >= 0 && t->nodes[p->nic[c]].speed_mbps > 0)
      nic += t->nodes[p->nic[c]].speed_mbps / 8000.0;
  }
  *chain_gbs = chain;
  *nic_gbs = nic;
}

void topo_channel_rule(const struct topo_system *t, int gpu, int node, int lanes, struct topo_channel_rule *out) {
  memset(out, 0, sizeof *out);
  out->gpu = gpu;
  out->lanes = lanes;
  if (!gpu) {
    out->alone = out->shared = 1;
    return;
  }
  int cap = LOOM_MIN(TOPO_MAX_CHANNELS, LOOM_MAX_CHANNELS);
  if (lanes > 0)
    cap = LOOM_MIN(cap, LOOM_MAX(1, lanes / 2));
  out->nics = topo_count(t, TOPO_NIC);
  out->alone = LOOM_MIN(LOOM_MAX(2, out->nics), cap);
  out->shared = out->alone;
  if (node < 0 || node >= t->n || t->nodes[node].type != TOPO_GPU)
    return;
  /* A ring sends to one neighbour: through an NVSwitch that is all the
   * GPU's links, between GPUs wired directly only the links to one. */
  const struct topo_node *g = &t->nodes[node];
  double widest = 0;
  for (int i = 0; i < g->nlinks; i++)
    if (g->links[i].type == LINK_NVL && g->links[i].peer != node && g->links[i].bw > widest)
      widest = g->links[i].bw;
  if (widest <= 0)
    return;
  out->link_gbs = topo_nvlink_bw(g->sm);
  out->nvlinks = (int)(widest / out->link_gbs + 0.5);
  out->nvlink_channels = (int)(widest / TOPO_CHANNEL_NVLINK_GBS + 1e-9);
  out->shared = LOOM_MIN(LOOM_MAX(out->alone, out->nvlink_channels), cap);
}

void topo_channel_why(const struct topo_channel_rule *r, int shared, char *buf, size_t len) {
  if (!r->gpu) {
    snprintf(buf, len, "1 (a host rank: one thread drives all of a call's channels)");
    return;
  }
  int n = shared ? r->shared : r->alone;
  size_t o;
  if (shared && r->nvlink_channels > r->alone)
    o = (size_t)snprintf(buf, len, "%d (NVLink: %d link%s x %.1f GB/s = %.1f GB/s, at %.0f GB/s per channel", n,
                         r->nvlinks, r->nvlinks == 1 ? "" : "s", r->link_gbs, r->nvlinks * r->link_gbs,
                         TOPO_CHANNEL_NVLINK_GBS);
  else
    o = (size_t)snprintf(buf, len, "%d (one per NIC, at least 2: %d NIC%s", n, r->nics, r->nics == 1 ? "" : "s");
  int raw = shared && r->nvlink_channels > r->alone ? r->nvlink_channels : LOOM_MAX(2, r->nics);
  if (o < len && n < raw) {
    if (r->lanes > 0 && n == LOOM_MAX(1, r->lanes / 2))
      o += (size_t)snprintf(buf + o, len - o, " gives %d; at most half the %d blocks the device holds at once", raw,
                            r->lanes);
    else
      o += (size_t)snprintf(buf + o, len - o, " gives %d; at most %d", raw, n);
  }
  if (o < len && r->nvlinks > 0 && !shared)
    o += (size_t)snprintf(buf + o, len - o, "; NVLink unused: no other rank on the host, or p2p off");
  else if (o < len && r->nvlinks > 0 && r->nvlink_channels <= r->alone)
    o += (size_t)snprintf(buf + o, len - o, "; NVLink's %d links would fill %d", r->nvlinks, r->nvlink_channels);
  if (o < len)
    snprintf(buf + o, len - o, ")");
}

void topo_plan_free(struct host_plan *p) {
  free(p->chain);
  p->chain = NULL;
}

/* Tree 0 is the in-order binary tree on labels 1..n where label x with
 * lowest set bit b has children x -/+ b/2; its inner nodes all have even
 * labels. Tree 1 relabels the nodes (mirrored for even n, shifted by one
 * for odd n) so that they get odd labels there, that is, become leaves. */
static int label_of(int n, int i, int which) {
  if (which == 0)
    return i + 1;
  return n % 2 == 0 ? n - i : (i + 1) % n + 1;
}

static int node_of(int n, int x, int which) {
  if (which == 0)
    return x - 1;
  return n % 2 == 0 ? n - x : (x - 2 + n) % n;
}

static int label_parent(int n, int x) {
  int root = 1;
  while (root * 2 <= n)
    root *= 2;
  while (x != root) {
    int b = x & -x;
    int p = ((x / b) >> 1) & 1 ? x - b : x + b;
    if (p <= n)
      return p;
    x = p; /* a node above n: its parent takes the orphan */
  }
  return 0;
}

void topo_dtree(int n, int i, int which, int *parent, int *child0, int *child1) {
  *parent = *child0 = *child1 = -1;
  if (n <= 1)
    return;
  int x = label_of(n, i, which);
  int p = label_parent(n, x);
  if (p)
    *parent = node_of(n, p, which);
  for (int y = 1; y <= n; y++) {
    if (y == x || label_parent(n, y) != x)
      continue;
    if (*child0 < 0)
      *child0 = node_of(n, y, which);
    else
      *child1 = node_of(n, y, which);
  }
}

ncclResult_t topo_build_channels(int nhosts, const struct host_plan *hosts, int *const *host_ranks, int nranks,
                                 struct channels *out) {
  memset(out, 0, sizeof *out);
  int nch = hosts[0].nchannels;
  for (int h = 1; h < nhosts; h++)
    nch = LOOM_MIN(nch, hosts[h].nchannels);
  out->nranks = nranks;
  out->nchannels = nch;
  CHECK(UTIL_CALLOC(&out->ring, (size_t)nch * nranks, "rings"));
  CHECK(UTIL_CALLOC(&out->tree_up, (size_t)nch * nranks, "trees"));
  CHECK(UTIL_CALLOC(&out->tree_down, (size_t)nch * nranks * TREE_MAX_CHILDREN, "trees"));
  for (size_t i = 0; i < (size_t)nch * nranks * TREE_MAX_CHILDREN; i++)
    out->tree_down[i] = -1;
  for (int c = 0; c < nch; c++) {
    int at = 0;
    for (int h = 0; h < nhosts; h++)
      for (int k = 0; k < hosts[h].n; k++)
        out->ring[c * nranks + at++] = host_ranks[h][hosts[h].chain[c * hosts[h].n + k]];
    if (at != nranks)
      return err_set(ncclInternalError, "the hosts' chains hold %d ranks, the communicator %d", at, nranks);
    int which = c % 2;
    for (int h = 0; h < nhosts; h++) {
      const struct host_plan *hp = &hosts[h];
      const int *chain = &hp->chain[c * hp->n];
      int leader = host_ranks[h][chain[0]];
      int p, c0, c1;
      topo_dtree(nhosts, h, which, &p, &c0, &c1);
      int *down = &out->tree_down[(c * nranks + leader) * TREE_MAX_CHILDREN];
      int nd = 0;
      out->tree_up[c * nranks + leader] = p < 0 ? -1 : host_ranks[p][hosts[p].chain[c * hosts[p].n]];
      if (c0 >= 0)
        down[nd++] = host_ranks[c0][hosts[c0].chain[c * hosts[c0].n]];
      if (c1 >= 0)
        down[nd++] = host_ranks[c1][hosts[c1].chain[c * hosts[c1].n]];
      /* The rest of the host hangs below its leader as a chain. */
      for (int k = 1; k < hp->n; k++) {
        int r = host_ranks[h][chain[k]], up = host_ranks[h][chain[k - 1]];
        out->tree_up[c * nranks + r] = up;
        int *ud = &out->tree_down[(c * nranks + up) * TREE_MAX_CHILDREN];
        int j = 0;
        while (j < TREE_MAX_CHILDREN && ud[j] >= 0)
          j++;
        if (j < TREE_MAX_CHILDREN)
          ud[j] = r;
      }
    }
  }
  return ncclSuccess;
}

void topo_channels_free(struct channels *c) {
  free(c->ring);
  free(c->tree_up);
  free(c->tree_down);
  memset(c, 0, sizeof *c);
}
