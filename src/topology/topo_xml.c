/*
 * Topology files, in NCCL's schema so that NCCL's own dumps load here:
 *
 *   <system version="1">
 *     <cpu numaid="0" affinity="0-55" arch="x86_64" vendor="GenuineIntel">
 *       <pci busid="0000:15:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
 *         <pci busid="0000:18:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
 *           <gpu dev="0" sm="90"><nvlink target="0000:05:00.0" count="18" tclass="0x068000"/></gpu>
 *         </pci>
 *         <pci busid="0000:19:00.0" class="0x020700" ...><nic><net name="mlx5_0" speed="400000" port="1"/></nic></pci>
 *       </pci>
 *     </cpu>
 *   </system>
 *
 * A <pci> holding a <gpu> or <nic> is that device's own function; one
 * holding <pci>s is a bridge or switch. NVLinks to anything that is not a
 * GPU of the file lead to NVSwitches, which count as one node, as in NCCL.
 * docs/topology.md describes every element and attribute.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "topology/graph.h"
#include "topology/topo_xml.h"
#include "topology/xml.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct pending_nvlink {
  int gpu;
  char target[16];
  int count;
  int line;
};

struct reader {
  const char *source;
  struct topo_system *s;
  struct pending_nvlink *nvl;
  int nnvl, capnvl;
};

static ncclResult_t bad(const struct reader *rd, const struct xml_node *n, const char *what) {
  return err_set(ncclInvalidArgument, "%s line %d: <%s>: %s", rd->source, n->line, n->name, what);
}

/* An integer attribute in [lo, hi]; `def` when absent and not required. */
static ncclResult_t get_int(const struct reader *rd, const struct xml_node *n, const char *attr, int required,
                            long lo, long hi, long def, long *out) {
  const char *v = xml_get(n, attr);
  if (!v) {
    if (required)
      return err_set(ncclInvalidArgument, "%s line %d: <%s> needs the attribute %s", rd->source, n->line, n->name,
                     attr);
    *out = def;
    return ncclSuccess;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 0);
  if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    return err_set(ncclInvalidArgument, "%s line %d: <%s %s=\"%s\">: not a number between %ld and %ld", rd->source,
                   n->line, n->name, attr, v, lo, hi);
  *out = x;
  return ncclSuccess;
}

static void copy_attr(const struct xml_node *n, const char *attr, char *dst, size_t len) {
  const char *v = xml_get(n, attr);
  snprintf(dst, len, "%s", v ? v : "");
}

static ncclResult_t busid_of(const struct reader *rd, const struct xml_node *n, char *busid) {
  const char *v = xml_get(n, "busid");
  unsigned dom, bus, devn, fn;
  char extra;
  if (!v || sscanf(v, "%x:%x:%x.%x%c", &dom, &bus, &devn, &fn, &extra) != 4 || dom > 0xffff || bus > 0xff ||
      devn > 0x1f || fn > 7)
    return bad(rd, n, "busid must look like 0000:19:00.0");
  snprintf(busid, 16, "%04x:%02x:%02x.%x", dom, bus, devn, fn);
  if (topo_find_busid(rd->s, busid) >= 0)
    return err_set(ncclInvalidArgument, "%s line %d: busid %s appears twice", rd->source, n->line, busid);
  return ncclSuccess;
}

static ncclResult_t read_gpu(struct reader *rd, const struct xml_node *pci, const struct xml_node *g, int parent,
                             const char *busid, double bw) {
  int idx;
  CHECK(topo_add_node(rd->s, TOPO_GPU, &idx));
  struct topo_node *n = &rd->s->nodes[idx];
  snprintf(n->busid, sizeof n->busid, "%s", busid);
  n->parent = parent;
  n->numa = rd->s->nodes[parent].numa;
  long v;
  CHECK(get_int(rd, g, "dev", 0, 0, 1024, -1, &v));
  n->dev = (int)v;
  CHECK(get_int(rd, g, "sm", 0, 0, 1000, 0, &v));
  n->sm = (int)v;
  CHECK(topo_connect(rd->s, idx, parent, LINK_PCI, bw));
  for (int i = 0; i < g->nchildren; i++) {
    const struct xml_node *c = g->children[i];
    if (strcmp(c->name, "nvlink") != 0)
      return bad(rd, c, "only <nvlink> may be inside <gpu>");
    if (rd->nnvl == rd->capnvl) {
      int cap = rd->capnvl ? rd->capnvl * 2 : 16;
      struct pending_nvlink *p = realloc(rd->nvl, sizeof *p * cap);
      if (!p)
        return err_set(ncclSystemError, "out of memory reading %s", rd->source);
      rd->nvl = p;
      rd->capnvl = cap;
    }
    struct pending_nvlink *p = &rd->nvl[rd->nnvl++];
    p->gpu = idx;
    p->line = c->line;
    const char *t = xml_get(c, "target");
    unsigned a, b, d, f;
    if (!t || sscanf(t, "%x:%x:%x.%x", &a, &b, &d, &f) != 4)
      return bad(rd, c, "target must be a busid like 0000:05:00.0");
    snprintf(p->target, sizeof p->target, "%04x:%02x:%02x.%x", a, b, d, f);
    CHECK(get_int(rd, c, "count", 1, 1, 64, 1, &v));
    p->count = (int)v;
  }
  (void)pci;
  return ncclSuccess;
}

static ncclResult_t read_nic(struct reader *rd, const struct xml_node *e, int parent, const char *busid, double bw) {
  int idx;
  CHECK(topo_add_node(rd->s, TOPO_NIC, &idx));
  struct topo_node *n = &rd->s->nodes[idx];
  snprintf(n->busid, sizeof n->busid, "%s", busid ? busid : "");
  n->parent = parent;
  n->numa = rd->s->nodes[parent].numa;
  copy_attr(e, "name", n->name, sizeof n->name);
  long v;
  CHECK(get_int(rd, e, "speed", 0, 0, 100000000, 10000, &v));
  n->speed_mbps = (int)v;
  CHECK(get_int(rd, e, "port", 0, 0, 255, 1, &v));
  n->port = (int)v;
  double net_bw = n->speed_mbps / 8000.0;
  return topo_connect(rd->s, idx, parent, LINK_PCI, busid ? LOOM_MIN(bw, net_bw) : net_bw);
}

/* <nic name=...> or NCCL's <nic><net name=.../></nic>, one NIC per <net>. */
static ncclResult_t read_nics(struct reader *rd, const struct xml_node *nic, int parent, const char *busid,
                              double bw) {
  if (nic->nchildren == 0)
    return read_nic(rd, nic, parent, busid, bw);
  for (int i = 0; i < nic->nchildren; i++) {
    const struct xml_node *c = nic->children[i];
    if (strcmp(c->name, "net") != 0)
      return bad(rd, c, "only <net> may be inside <nic>");
    CHECK(read_nic(rd, c, parent, busid, bw));
    busid = NULL; /* several ports share the function: only one node owns the busid */
  }
  return ncclSuccess;
}

static ncclResult_t read_pci(struct reader *rd, const struct xml_node *e, int parent, int depth) {
  if (depth > 32)
    return bad(rd, e, "PCI tree deeper than 32 levels");
  char busid[16];
  CHECK(busid_of(rd, e, busid));
  long width, cls;
  CHECK(get_int(rd, e, "link_width", 0, 0, 64, 0, &width));
  CHECK(get_int(rd, e, "class", 0, 0, 0xffffff, -1, &cls));
  char speed[32];
  copy_attr(e, "link_speed", speed, sizeof speed);
  double bw = topo_pci_bw(speed, (int)width);
  const struct xml_node *dev = NULL;
  for (int i = 0; i < e->nchildren; i++) {
    const char *nm = e->children[i]->name;
    if (strcmp(nm, "gpu") == 0 || strcmp(nm, "nic") == 0) {
      if (dev || e->nchildren != 1)
        return bad(rd, e, "a <pci> holds one <gpu> or <nic>, or only <pci> bridges");
      dev = e->children[i];
    } else if (strcmp(nm, "pci") != 0) {
      char what[160];
      snprintf(what, sizeof what, "unknown element <%s> inside (expected <pci>, <gpu> or <nic>)", nm);
      return bad(rd, e->children[i], what);
    }
  }
  int before = rd->s->n;
  if (dev && strcmp(dev->name, "gpu") == 0)
    CHECK(read_gpu(rd, e, dev, parent, busid, bw));
  else if (dev)
    CHECK(read_nics(rd, dev, parent, busid, bw));
  if (dev) {
    struct topo_node *n = &rd->s->nodes[before];
    snprintf(n->link_speed, sizeof n->link_speed, "%s", speed);
    n->link_width = (int)width;
    n->pci_class = (int)cls;
    return ncclSuccess;
  }
  int idx;
  CHECK(topo_add_node(rd->s, TOPO_PCI, &idx));
  struct topo_node *n = &rd->s->nodes[idx];
  snprintf(n->busid, sizeof n->busid, "%s", busid);
  snprintf(n->link_speed, sizeof n->link_speed, "%s", speed);
  n->link_width = (int)width;
  n->pci_class = (int)cls;
  n->parent = parent;
  n->numa = rd->s->nodes[parent].numa;
  CHECK(topo_connect(rd->s, idx, parent, LINK_PCI, bw));
  for (int i = 0; i < e->nchildren; i++)
    CHECK(read_pci(rd, e->children[i], idx, depth + 1));
  return ncclSuccess;
}

static ncclResult_t read_cpu(struct reader *rd, const struct xml_node *e) {
  int idx;
  CHECK(topo_add_node(rd->s, TOPO_CPU, &idx));
  struct topo_node *n = &rd->s->nodes[idx];
  long v;
  CHECK(get_int(rd, e, "numaid", 1, 0, 4096, 0, &v));
  for (int i = 0; i < rd->s->n - 1; i++)
    if (rd->s->nodes[i].type == TOPO_CPU && rd->s->nodes[i].numa == (int)v)
      return bad(rd, e, "two <cpu> elements have the same numaid");
  n->numa = (int)v;
  copy_attr(e, "affinity", n->affinity, sizeof n->affinity);
  copy_attr(e, "arch", n->arch, sizeof n->arch);
  copy_attr(e, "vendor", n->vendor, sizeof n->vendor);
  CHECK(get_int(rd, e, "ncores", 0, 0, 1 << 20, 0, &v));
  n->ncores = (int)v;
  for (int i = 0; i < e->nchildren; i++) {
    const struct xml_node *c = e->children[i];
    if (strcmp(c->name, "pci") == 0)
      CHECK(read_pci(rd, c, idx, 0));
    else if (strcmp(c->name, "nic") == 0)
      CHECK(read_nics(rd, c, idx, NULL, 0)); /* a NIC with no PCI function, like a virtual one */
    else {
      char what[160];
      snprintf(what, sizeof what, "unknown element <%s> inside <cpu> (expected <pci> or <nic>)", c->name);
      return bad(rd, c, what);
    }
  }
  return ncclSuccess;
}

static ncclResult_t link_nvlinks(struct reader *rd) {
  int nvs = -1;
  for (int i = 0; i < rd->nnvl; i++) {
    struct pending_nvlink *p = &rd->nvl[i];
    int peer = topo_find_busid(rd->s, p->target);
    double bw = p->count * topo_nvlink_bw(rd->s->nodes[p->gpu].sm);
    if (peer >= 0 && rd->s->nodes[peer].type != TOPO_GPU && rd->s->nodes[peer].type != TOPO_NVS)
      return err_set(ncclInvalidArgument, "%s line %d: nvlink target %s is a %s, not a GPU or an NVSwitch",
                     rd->source, p->line, p->target, topo_type_name(rd->s->nodes[peer].type));
    if (peer < 0) {
      if (nvs < 0) {
        CHECK(topo_add_node(rd->s, TOPO_NVS, &nvs));
        snprintf(rd->s->nodes[nvs].busid, sizeof rd->s->nodes[nvs].busid, "%s", p->target);
      }
      peer = nvs;
    } else if (rd->s->nodes[peer].type == TOPO_GPU && peer < p->gpu) {
      continue; /* both GPUs list the link; it is made once, from the lower */
    }
    CHECK(topo_connect(rd->s, p->gpu, peer, LINK_NVL, bw));
  }
  return ncclSuccess;
}

ncclResult_t topo_from_xml(const struct xml_node *root, const char *source, struct topo_system **out) {
  if (strcmp(root->name, "system") != 0)
    return err_set(ncclInvalidArgument, "%s line %d: the root element is <%s>, not <system>", source, root->line,
                   root->name);
  struct reader rd = {.source = source};
  CHECK(topo_system_new(&rd.s));
  ncclResult_t r = ncclSuccess;
  copy_attr(root, "host", rd.s->host, sizeof rd.s->host);
  for (int i = 0; i < root->nchildren && r == ncclSuccess; i++) {
    const struct xml_node *c = root->children[i];
    if (strcmp(c->name, "cpu") == 0)
      r = read_cpu(&rd, c);
    else
      r = err_set(ncclInvalidArgument, "%s line %d: unknown element <%s> inside <system> (expected <cpu>)", source,
                  c->line, c->name);
  }
  if (r == ncclSuccess && topo_count(rd.s, TOPO_CPU) == 0)
    r = err_set(ncclInvalidArgument, "%s: the topology has no <cpu>", source);
  if (r == ncclSuccess)
    r = link_nvlinks(&rd);
  if (r == ncclSuccess)
    r = topo_compute_paths(rd.s);
  free(rd.nvl);
  if (r != ncclSuccess) {
    topo_system_free(rd.s);
    return r;
  }
  *out = rd.s;
  return ncclSuccess;
}

ncclResult_t topo_load(const char *path, struct topo_system **out) {
  char source[512];
  snprintf(source, sizeof source, "NCCL_TOPO_FILE=%s", path);
  struct xml_node *root;
  CHECK(xml_parse_file(path, source, &root));
  ncclResult_t r = topo_from_xml(root, source, out);
  xml_free(root);
  return r;
}

/* ---- writing ------------------------------------------------------------ */

static ncclResult_t set_int(struct xml_node *e, const char *attr, long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", v);
  return xml_set(e, attr, buf);
}

static ncclResult_t pci_attrs(struct xml_node *e, const struct topo_node *n) {
  CHECK(xml_set(e, "busid", n->busid));
  if (n->pci_class >= 0) {
    char cls[16];
    snprintf(cls, sizeof cls, "0x%06x", n->pci_class);
    CHECK(xml_set(e, "class", cls));
  }
  if (n->link_speed[0])
    CHECK(xml_set(e, "link_speed", n->link_speed));
  if (n->link_width)
    CHECK(set_int(e, "link_width", n->link_width));
  return ncclSuccess;
}

static ncclResult_t write_device(const struct topo_system *s, int i, struct xml_node *parent) {
  const struct topo_node *n = &s->nodes[i];
  struct xml_node *e, *d;
  if (n->type == TOPO_NIC && !n->busid[0]) {
    CHECK(xml_new(parent, "nic", &d));
  } else {
    CHECK(xml_new(parent, "pci", &e));
    CHECK(pci_attrs(e, n));
    if (n->type == TOPO_PCI) {
      for (int j = 0; j < s->n; j++)
        if (s->nodes[j].parent == i && s->nodes[j].type != TOPO_NVS)
          CHECK(write_device(s, j, e));
      return ncclSuccess;
    }
    CHECK(xml_new(e, n->type == TOPO_GPU ? "gpu" : "nic", &d));
  }
  if (n->type == TOPO_GPU) {
    if (n->dev >= 0)
      CHECK(set_int(d, "dev", n->dev));
    CHECK(set_int(d, "sm", n->sm));
    for (int k = 0; k < n->nlinks; k++) {
      const struct topo_link *l = &n->links[k];
      if (l->type != LINK_NVL)
        continue;
      struct xml_node *nv;
      CHECK(xml_new(d, "nvlink", &nv));
      CHECK(xml_set(nv, "target", s->nodes[l->peer].busid));
      CHECK(set_int(nv, "count", (long)(l->bw / topo_nvlink_bw(n->sm) + 0.5)));
      if (s->nodes[l->peer].type == TOPO_NVS)
        CHECK(xml_set(nv, "tclass", "0x068000"));
    }
  } else {
    struct xml_node *net;
    CHECK(xml_new(d, "net", &net));
    CHECK(xml_set(net, "name", n->name));
    CHECK(set_int(net, "speed", n->speed_mbps));
    CHECK(set_int(net, "port", n->port));
  }
  return ncclSuccess;
}

ncclResult_t topo_to_xml(const struct topo_system *s, struct xml_node **out) {
  struct xml_node *root;
  CHECK(xml_new(NULL, "system", &root));
  ncclResult_t r = xml_set(root, "version", "1");
  if (r == ncclSuccess && s->host[0])
    r = xml_set(root, "host", s->host);
  for (int i = 0; i < s->n && r == ncclSuccess; i++) {
    const struct topo_node *n = &s->nodes[i];
    if (n->type != TOPO_CPU)
      continue;
    struct xml_node *cpu;
    r = xml_new(root, "cpu", &cpu);
    if (r == ncclSuccess)
      r = set_int(cpu, "numaid", n->numa);
    if (r == ncclSuccess && n->affinity[0])
      r = xml_set(cpu, "affinity", n->affinity);
    if (r == ncclSuccess && n->arch[0])
      r = xml_set(cpu, "arch", n->arch);
    if (r == ncclSuccess && n->vendor[0])
      r = xml_set(cpu, "vendor", n->vendor);
    if (r == ncclSuccess && n->ncores)
      r = set_int(cpu, "ncores", n->ncores);
    for (int j = 0; j < s->n && r == ncclSuccess; j++)
      if (s->nodes[j].parent == i && s->nodes[j].type != TOPO_NVS)
        r = write_device(s, j, cpu);
  }
  if (r != ncclSuccess) {
    xml_free(root);
    return r;
  }
  *out = root;
  return ncclSuccess;
}

ncclResult_t topo_dump(const struct topo_system *s, const char *path) {
  struct xml_node *root;
  CHECK(topo_to_xml(s, &root));
  ncclResult_t r = xml_write_file(root, path);
  xml_free(root);
  if (r != ncclSuccess)
    err_context("NCCL_TOPO_DUMP_FILE=%s", path);
  return r;
}
