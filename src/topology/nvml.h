/* NVML, loaded with dlopen so the library runs where the driver is absent:
 * just what discovery needs (GPUs, compute capability, NVLinks).
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_NVML_H
#define LOOM_NVML_H

#define NVML_MAX_LINKS 18

struct nvml_gpu {
  char busid[16];
  int sm;
  int nlinks;
  struct {
    char target[16];
    int count;
  } link[NVML_MAX_LINKS];
};

/* Fills up to `max` GPUs; returns how many, or -1 when NVML cannot be
 * loaded or initialised (no driver): discovery then reads sysfs. */
int nvml_gpus(struct nvml_gpu *out, int max);

#endif
