/*
 * GPUDirect RDMA decisions (src/transport/net/net_gdr.c) without a GPU:
 * NCCL_NET_GDR_LEVEL's values, the decision on every input it depends on
 * (plugin, GPU, driver, distance, NCCL_NET_GDR_READ, flushes) with the
 * sentence it logs, and where nvidia-peermem is looked for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "test.h"
#include "topology/graph.h"
#include "transport/net/net.h"
#include "transport/net/net_gdr.h"

TEST_IMPL(unit_gdr_level) {
  static const struct {
    const char *v;
    int level;
  } ok[] = {{"LOC", PATH_LOC}, {"pix", PATH_PIX}, {"PXB", PATH_PXB}, {"Phb", PATH_PHB}, {"SYS", PATH_SYS},
            {"0", PATH_LOC},   {"1", PATH_PIX},   {"2", PATH_PXB},   {"3", PATH_PHB},   {"4", PATH_SYS},
            {"5", PATH_SYS},   {"17", PATH_SYS}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int level = -1;
    ASSERT_MSG(gdr_parse_level(ok[i].v, &level) == ncclSuccess && level == ok[i].level, "%s gave %d: %s", ok[i].v,
               level, err_thread_last());
  }
  static const char *const bad[] = {"NEAR", "-1", "", "PXB2", "1x", " 2", "NVL", "9999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int level = -1;
    ASSERT_MSG(gdr_parse_level(bad[i], &level) == ncclInvalidArgument, "\"%s\" was accepted", bad[i]);
    char want[64];
    snprintf(want, sizeof want, "NCCL_NET_GDR_LEVEL=%s:", bad[i]);
    ASSERT_MSG(strstr(err_thread_last(), want) && strstr(err_thread_last(), "LOC, PIX, PXB, PHB, SYS"), "%s",
               err_thread_last());
  }
  int level = -1;
  unsetenv("NCCL_NET_GDR_LEVEL");
  ASSERT(gdr_env_level(&level) == ncclSuccess && level == PATH_PXB);
  setenv("NCCL_NET_GDR_LEVEL", "phb", 1);
  ASSERT(gdr_env_level(&level) == ncclSuccess && level == PATH_PHB);
  setenv("NCCL_NET_GDR_LEVEL", "far", 1);
  ASSERT(gdr_env_level(&level) == ncclInvalidArgument);
  return 0;
}

/* An IB device one PCIe switch from an sm_80 GPU that exports dma-bufs. */
static struct gdr_query base_query(void) {
  return (struct gdr_query){.plugin = "IB",
                            .nic = "mlx5_0",
                            .ptr_support = NET_PTR_HOST | NET_PTR_DMABUF,
                            .has_reg_dmabuf = 1,
                            .gpu = 0,
                            .gpu_gdr = 1,
                            .cuda_dmabuf = 1,
                            .distance = PATH_PIX,
                            .level = PATH_PXB,
                            .read_param = -1,
                            .sm = 80};
}

/* Decides and checks the mode, the flush and every phrase. */
static void expect(const struct gdr_query *q, int mode, int flush, const char *const *phrases) {
  struct gdr_choice c;
  gdr_decide(q, &c);
  ASSERT_MSG(c.mode == mode && c.flush == flush, "mode %d flush %d, expected %d %d: %s", c.mode, c.flush, mode, flush,
             c.why);
  for (; *phrases; phrases++)
    ASSERT_MSG(strstr(c.why, *phrases), "\"%s\" lacks \"%s\"", c.why, *phrases);
}
#define EXPECT(q, mode, flush, ...) expect(&(q), mode, flush, (const char *const[]){__VA_ARGS__, NULL})

TEST_IMPL(unit_gdr_decide) {
  struct gdr_query q = base_query();
  EXPECT(q, GDR_DMABUF, 1, "GDR on for GPU 0 / mlx5_0 (dma-buf, PIX <= PXB (NCCL_NET_GDR_LEVEL's default))",
         "flushed", "compute capability 8.0 < 9.0");
  q.sm = 90;
  EXPECT(q, GDR_DMABUF, 0, "no flush needed", "9.0 >= 9.0");
  q.force_flush = 1;
  EXPECT(q, GDR_DMABUF, 1, "flushed", "NCCL_NET_FORCE_FLUSH");

  /* The plugin. */
  q = base_query();
  q.plugin = "Socket";
  q.nic = "lo";
  q.ptr_support = NET_PTR_HOST;
  EXPECT(q, GDR_OFF, 0, "GDR off for GPU 0 / lo: plugin Socket takes host memory only");
  q = base_query();
  q.has_reg_dmabuf = 0;
  EXPECT(q, GDR_OFF, 0, "GDR off", "has no dma-buf registration");

  /* The GPU and the driver: dma-buf first, the plugin's own way second. */
  q = base_query();
  q.gpu_gdr = 0;
  EXPECT(q, GDR_OFF, 0, "GDR off", "cudaDevAttrGPUDirectRDMASupported is 0");
  q = base_query();
  q.cuda_dmabuf = 0;
  q.no_dmabuf = "the CUDA driver does not export GPU 0's memory as dma-buf";
  EXPECT(q, GDR_OFF, 0, "GDR off for GPU 0 / mlx5_0: plugin IB takes device memory only as dma-buf, and the CUDA "
         "driver does not export", "receives land in host memory");
  q.ptr_support |= NET_PTR_CUDA;
  EXPECT(q, GDR_PEERMEM, 1, "GDR on", "(peermem, PIX <= PXB");
  q.cuda_dmabuf = 1;
  EXPECT(q, GDR_DMABUF, 1, "(dma-buf,");

  /* The distance against NCCL_NET_GDR_LEVEL. */
  q = base_query();
  q.distance = PATH_PHB;
  EXPECT(q, GDR_OFF, 0, "the distance PHB is beyond NCCL_NET_GDR_LEVEL PXB");
  q.level = PATH_PHB;
  q.level_set = 1;
  EXPECT(q, GDR_DMABUF, 1, "PHB <= PHB)");
  q.level = PATH_LOC;
  q.distance = PATH_PIX;
  EXPECT(q, GDR_OFF, 0, "beyond NCCL_NET_GDR_LEVEL LOC");
  q.distance = -1;
  q.level = PATH_SYS;
  EXPECT(q, GDR_DMABUF, 1, "(dma-buf, SYS, since the topology has no path to mlx5_0 <= SYS)");
  q.level = PATH_PHB;
  EXPECT(q, GDR_OFF, 0, "beyond NCCL_NET_GDR_LEVEL PHB");

  /* Sends: NCCL_NET_GDR_READ, and NCCL's default by architecture. */
  q = base_query();
  q.read = 1;
  EXPECT(q, GDR_DMABUF, 0, "GDR read on for GPU 0 / mlx5_0", "sends read device memory");
  q.read_param = 0;
  EXPECT(q, GDR_OFF, 0, "GDR read off for GPU 0 / mlx5_0: NCCL_NET_GDR_READ=0; sends stage through host memory");
  q.read_param = -1;
  q.sm = 70;
  EXPECT(q, GDR_OFF, 0, "GDR read off", "(this one is 7.0)", "NCCL_NET_GDR_READ=1");
  q.nvlink = 1;
  EXPECT(q, GDR_DMABUF, 0, "GDR read on");
  q.nvlink = 0;
  q.read_param = 1;
  EXPECT(q, GDR_DMABUF, 0, "GDR read on");
  q.distance = PATH_SYS;
  EXPECT(q, GDR_OFF, 0, "GDR read off", "the distance SYS is beyond");
  return 0;
}

static void touch(const char *root, const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s%s", root, rel);
  for (char *p = path + strlen(root) + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(path, 0700);
      *p = '/';
    }
  FILE *f = fopen(path, "w");
  ASSERT_MSG(f, "cannot create %s", path);
  fclose(f);
}

TEST_IMPL(unit_gdr_peermem) {
  char root[] = "/tmp/loom-peermem-XXXXXX";
  ASSERT(mkdtemp(root));
  ASSERT(!gdr_peermem_loaded(root));
  touch(root, "/sys/module/nvidia_peermem/version");
  ASSERT(gdr_peermem_loaded(root));
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  ASSERT(system(cmd) == 0);
  ASSERT(mkdtemp(strcpy(root, "/tmp/loom-peermem-XXXXXX")));
  touch(root, "/sys/kernel/mm/memory_peers/nv_mem/version");
  ASSERT(gdr_peermem_loaded(root));
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  ASSERT(system(cmd) == 0);
  return 0;
}
