/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "topology/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* The few NVML types the calls below use, as NVML's ABI defines them. */
typedef int nvml_ret;
typedef void *nvml_device;
struct nvml_pci {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

/* NVML writes an 8-digit domain ("00000000:05:00.0"); sysfs and the rest
 * of Loom use 4. */
static void normalise(const struct nvml_pci *p, char *busid) {
  unsigned dom, bus, dev, fn;
  if (sscanf(p->bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4)
    snprintf(busid, 16, "%04x:%02x:%02x.%x", dom & 0xffff, bus & 0xff, dev & 0x1f, fn & 7);
  else
    snprintf(busid, 16, "%04x:%02x:%02x.0", p->domain & 0xffff, p->bus & 0xff, p->device & 0x1f);
}

int nvml_gpus(struct nvml_gpu *out, int max) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return -1;
  nvml_ret (*init)(void) = (nvml_ret(*)(void))dlsym(lib, "nvmlInit_v2");
  nvml_ret (*count)(unsigned *) = (nvml_ret(*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
  nvml_ret (*handle)(unsigned, nvml_device *) =
      (nvml_ret(*)(unsigned, nvml_device *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  nvml_ret (*pci)(nvml_device, struct nvml_pci *) =
      (nvml_ret(*)(nvml_device, struct nvml_pci *))dlsym(lib, "nvmlDeviceGetPciInfo_v3");
  nvml_ret (*cc)(nvml_device, int *, int *) =
      (nvml_ret(*)(nvml_device, int *, int *))dlsym(lib, "nvmlDeviceGetCudaComputeCapability");
  nvml_ret (*link_state)(nvml_device, unsigned, int *) =
      (nvml_ret(*)(nvml_device, unsigned, int *))dlsym(lib, "nvmlDeviceGetNvLinkState");
  nvml_ret (*link_remote)(nvml_device, unsigned, struct nvml_pci *) =
      (nvml_ret(*)(nvml_device, unsigned, struct nvml_pci *))dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  nvml_ret (*shutdown)(void) = (nvml_ret(*)(void))dlsym(lib, "nvmlShutdown");
  unsigned n = 0;
  if (!init || !count || !handle || !pci || init() != 0 || count(&n) != 0) {
    dlclose(lib);
    return -1;
  }
  int got = 0;
  for (unsigned i = 0; i < n && got < max; i++) {
    nvml_device d;
    struct nvml_pci p;
    if (handle(i, &d) != 0 || pci(d, &p) != 0)
      continue;
    struct nvml_gpu *g = &out[got++];
    memset(g, 0, sizeof *g);
    normalise(&p, g->busid);
    int maj = 0, min = 0;
    if (cc && cc(d, &maj, &min) == 0)
      g->sm = maj * 10 + min;
    for (unsigned l = 0; link_state && link_remote && l < NVML_MAX_LINKS; l++) {
      int active = 0;
      struct nvml_pci r;
      if (link_state(d, l, &active) != 0 || !active || link_remote(d, l, &r) != 0)
        continue;
      char target[16];
      normalise(&r, target);
      int k = 0;
      while (k < g->nlinks && strcmp(g->link[k].target, target) != 0)
        k++;
      if (k == g->nlinks) {
        snprintf(g->link[k].target, sizeof g->link[k].target, "%s", target);
        g->nlinks++;
      }
      g->link[k].count++;
    }
  }
  if (shutdown)
    shutdown();
  dlclose(lib);
  return got;
}
