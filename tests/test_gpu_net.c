/*
 * GPUDirect RDMA on a GPU machine: every collective on a CUDA communicator
 * of 2 ranks (processes sharing device 0) forced over NET/IB through the
 * verbs test double, which reaches device memory through CUDA as a NIC
 * would over PCIe. Once with GDR on (NCCL_NET_GDR_LEVEL=SYS, receives
 * flushed even on Hopper), once with sends staged through host memory
 * (NCCL_NET_GDR_READ=0, so each connection has one GPU side and one host
 * side), once with GDR off (LOC); the results are checked, and the log
 * must say what was decided. Where the driver offers no way (no dma-buf
 * export, no nvidia-peermem) the GDR cases skip and say why. Without a
 * device every test skips with "no CUDA device".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA && defined(LOOM_VERBS_DOUBLE_PATH)
#include "misc/gpurt.h"

/* A case: the settings, and the phrases the log must have. */
struct gdr_case {
  const char *level, *read;
  const char *must[3];
  int needs_driver; /* skip, naming the reason, where the driver has no GDR */
};

static char log_pattern[128];

/* The log's GDR decisions: 0 if every wanted phrase is there; 'D' if GDR
 * is off only because this machine's driver offers no way. */
static int check_log(int rank, const struct gdr_case *k) {
  char path[160], line[1024], all[8192] = "";
  snprintf(path, sizeof path, log_pattern, (int)getpid());
  FILE *f = fopen(path, "r");
  RASSERT(f, "rank %d: no log at %s", rank, path);
  while (fgets(line, sizeof line, f))
    if (strstr(line, " GDR ") && strlen(all) + strlen(line) < sizeof all)
      strcat(all, line);
  fclose(f);
  unlink(path);
  fprintf(stderr, "rank %d's GDR decisions:\n%s", rank, all);
  if (k->needs_driver && !strstr(all, "GDR on for GPU") &&
      (strstr(all, "CUDA driver") || strstr(all, "GPUDirectRDMASupported")))
    return 'D';
  for (int i = 0; i < 3 && k->must[i]; i++)
    RASSERT(strstr(all, k->must[i]), "rank %d: the log never says \"%s\"", rank, k->must[i]);
  return 0;
}

static int gdr_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct gdr_case *k = arg;
  RASSERT(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
  /* A CUDA communicator: the log's GDR lines are only a GPU rank's. */
  int calls = 0;
  if (coll_matrix_rank(rank, n, id, "net/ib", &calls))
    return 1;
  int r = check_log(rank, k);
  if (r == 'D') {
    rank_signal('D');
    return 0;
  }
  if (r == 0 && rank == 0)
    printf("2 GPU ranks over NET/IB (NCCL_NET_GDR_LEVEL=%s, NCCL_NET_GDR_READ=%s): %d calls checked\n", k->level,
           k->read, calls);
  return r;
}

static int gdr_run(const struct gdr_case *k) {
  if (harness_cuda_devices() == 0)
    SKIP("no CUDA device");
  setenv("LOOM_IB_VERBS_LIB", LOOM_VERBS_DOUBLE_PATH, 1);
  setenv("NCCL_NET", "IB", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_NET_GDR_LEVEL", k->level, 1);
  setenv("NCCL_NET_GDR_READ", k->read, 1);
  setenv("NCCL_NET_FORCE_FLUSH", "1", 1); /* Hopper needs no flush: run it anyway */
  harness_net_log("gpu-gdr", log_pattern, sizeof log_pattern);
  pid_t pids[2];
  int events = -1;
  if (start_ranks(2, gdr_rank, (void *)k, pids, &events) != 0)
    return 1;
  int rc = wait_ranks(2, pids);
  char c;
  int driver = 0;
  while (read(events, &c, 1) == 1)
    driver |= c == 'D';
  close(events);
  if (rc == 0 && driver)
    SKIP("the collectives ran, but with GDR off: this machine's driver offers no GPUDirect RDMA (no dma-buf export, "
         "no nvidia-peermem; the ranks' logs above say which)");
  return rc;
}

TEST_IMPL(gpu_net_gdr_on) {
  static const struct gdr_case k = {"SYS", "1", {"GDR on for GPU 0 / mlx5_0", "GDR read on for GPU 0 / mlx5_0",
                                                 "each flushed before kernels read it"}, 1};
  return gdr_run(&k);
}

TEST_IMPL(gpu_net_gdr_read_off) {
  static const struct gdr_case k = {"SYS", "0", {"GDR on for GPU 0 / mlx5_0", "GDR read off for GPU 0 / mlx5_0: "
                                                 "NCCL_NET_GDR_READ=0"}, 1};
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  return gdr_run(&k);
}

TEST_IMPL(gpu_net_gdr_off) {
  static const struct gdr_case k = {"LOC", "1", {"GDR off for GPU 0 / mlx5_0", "GDR read off for GPU 0 / mlx5_0",
                                                 "beyond NCCL_NET_GDR_LEVEL LOC"}, 0};
  return gdr_run(&k);
}

#else

#if LOOM_TEST_CUDA
#define NO_GDR_TEST(name) \
  TEST_IMPL(name) { SKIP("the verbs test double was not built (no infiniband/verbs.h)"); }
#else
#define NO_GDR_TEST(name) \
  TEST_IMPL(name) { SKIP("no CUDA device (this build has no CUDA toolkit)"); }
#endif
NO_GDR_TEST(gpu_net_gdr_on)
NO_GDR_TEST(gpu_net_gdr_read_off)
NO_GDR_TEST(gpu_net_gdr_off)

#endif
