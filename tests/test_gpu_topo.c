/*
 * Which pairs of GPUs of a host write into each other's memory (p2p),
 * decided from the topology as NCCL does rather than from what the
 * process sees: here each rank sees only its own GPU (CUDA_VISIBLE_DEVICES
 * per process, as Slurm sets it), and the peer's GPU is reached through
 * CUDA IPC where the topology puts the two close enough (NCCL_P2P_LEVEL,
 * default PXB on Intel hosts). The topology is a file made from the two
 * devices' real bus ids. Needs two CUDA devices (the emulation has two).
 * With NVLinks in that file, the communicator's channel count is the one
 * the topology's rule gives (topology/search.h), within its bounds.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA

enum { BUSID = 32 };

/* The bus ids of devices 0 and 1, lower case, asked in a child: CUDA
 * started here would not work in the ranks forked later. */
static int bus_ids(char ids[2][BUSID]) {
  char *shared = mmap(NULL, 2 * BUSID, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED)
    return 1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    for (int d = 0; d < 2; d++)
      if (cudaDeviceGetPCIBusId(shared + d * BUSID, BUSID, d) != cudaSuccess)
        _exit(1);
    _exit(0);
  }
  int st = 1;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    munmap(shared, 2 * BUSID);
    return 1;
  }
  for (int d = 0; d < 2; d++) {
    memcpy(ids[d], shared + d * BUSID, BUSID);
    ids[d][BUSID - 1] = '\0';
    for (char *c = ids[d]; *c; c++)
      *c = (char)tolower((unsigned char)*c);
  }
  munmap(shared, 2 * BUSID);
  return 0;
}

/* An Intel host with the two GPUs under one PCIe switch (PIX between
 * them) or one under each CPU socket (SYS); nvlink: H100s with 18
 * NVLinks each to the host's NVSwitches as well. */
static int write_topo(char ids[2][BUSID], int same_switch, int nvlink, char *path) {
  strcpy(path, "/tmp/loom-topo-XXXXXX");
  int fd = mkstemp(path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f)
    return 1;
  const char *cpu = "<cpu numaid=\"%d\" affinity=\"%d\" arch=\"x86_64\" vendor=\"GenuineIntel\" ncores=\"1\">\n";
  const char *gpu = nvlink ? "<pci busid=\"%s\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
                             "<gpu dev=\"%d\" sm=\"90\"><nvlink target=\"0000:05:00.0\" count=\"18\" "
                             "tclass=\"0x068000\"/></gpu></pci>\n"
                           : "<pci busid=\"%s\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
                             "<gpu dev=\"%d\" sm=\"90\"/></pci>\n";
  const char *sw = "<pci busid=\"0000:%02x:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n";
  fprintf(f, "<?xml version=\"1.0\"?>\n<system version=\"1\" host=\"p2p-test\">\n");
  for (int s = 0; s < (same_switch ? 1 : 2); s++) {
    fprintf(f, cpu, s, s);
    fprintf(f, sw, 0xf0 + s);
    for (int d = 0; d < 2; d++)
      if (same_switch || d == s)
        fprintf(f, gpu, ids[d], d);
    fprintf(f, "</pci>\n</cpu>\n");
  }
  fprintf(f, "</system>\n");
  return fclose(f) != 0;
}

struct topo_case {
  const char *want;    /* the transport between the two ranks, or NULL: init must fail */
  const char *refusal; /* then, what its sentence says */
};

/* The rank sees its own device only, as Slurm sets it. */
static int own_device(int rank) {
  char vis[16];
  snprintf(vis, sizeof vis, "%d", rank);
  setenv("CUDA_VISIBLE_DEVICES", vis, 1);
  CUDA_OK(cudaSetDevice(0));
  return 0;
}

/* An AllReduce of `count` floats on n ranks, its result checked. */
static int allreduce_checked(ncclComm_t comm, int rank, int n, size_t count) {
  float *h = malloc(count * sizeof *h), *d = tbuf_alloc(comm, count * sizeof *d);
  RASSERT(h && d, "out of memory");
  for (size_t i = 0; i < count; i++)
    h[i] = (float)(rank + i % 7);
  RASSERT(tbuf_put(comm, d, h, count * sizeof *h) == 0, "copy in");
  RCHECK(comm, tbuf_result(comm, ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, NULL)));
  RASSERT(tbuf_get(comm, h, d, count * sizeof *h) == 0, "copy out");
  for (size_t i = 0; i < count; i++)
    RASSERT(h[i] == (float)(n * (n - 1) / 2 + n * (int)(i % 7)), "rank %d element %zu is %g", rank, i, h[i]);
  tbuf_free(d);
  free(h);
  return 0;
}

static int topo_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct topo_case *tc = arg;
  if (own_device(rank))
    return 1;
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, n, id, rank);
  if (!tc->want) {
    RASSERT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), tc->refusal),
            "rank %d: init returned %d: %s", rank, (int)r, ncclGetLastError(NULL));
    return 0;
  }
  RCHECK(NULL, r);
  if (allreduce_checked(comm, rank, n, 300001))
    return 1;
  /* Connected by the first call. */
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, 1 - rank, &tr));
  RASSERT(strcmp(tr, tc->want) == 0, "rank %d reached rank %d over %s, expected %s", rank, 1 - rank, tr, tc->want);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int topo_run(int same_switch, const char *level, const struct topo_case *tc) {
  if (harness_cuda_devices() < 2)
    SKIP("needs two CUDA devices");
  char ids[2][BUSID], path[32];
  ASSERT_MSG(bus_ids(ids) == 0, "cannot read the devices' bus ids");
  ASSERT(write_topo(ids, same_switch, 0, path) == 0);
  setenv("NCCL_TOPO_FILE", path, 1);
  if (level)
    setenv("NCCL_P2P_LEVEL", level, 1);
  int rc = run_ranks(2, topo_rank, (void *)tc);
  unlink(path);
  return rc;
}

/* Under one switch: p2p, though neither rank sees the other's GPU. */
TEST_IMPL(gpu_p2p_invisible_switch) { return topo_run(1, NULL, &(struct topo_case){"p2p", NULL}); }
/* Across the CPU sockets of an Intel host: beyond the default PXB. */
TEST_IMPL(gpu_p2p_invisible_sockets) { return topo_run(0, NULL, &(struct topo_case){"shm", NULL}); }
/* NCCL_P2P_LEVEL=SYS allows the sockets' path; LOC refuses any other
 * GPU, even under one switch. */
TEST_IMPL(gpu_p2p_level) {
  int rc = topo_run(0, "SYS", &(struct topo_case){"p2p", NULL});
  return rc ? rc : topo_run(1, "LOC", &(struct topo_case){"shm", NULL});
}
TEST_IMPL(gpu_p2p_level_bad) {
  return topo_run(1, "NEAR", &(struct topo_case){NULL, "NCCL_P2P_LEVEL=NEAR: expected LOC, NVL, PIX"});
}

/* ---- how many channels the topology gives (topology/search.h) ---- */

struct chan_case {
  int want;      /* channels the communicator must have */
  int max_ctas;  /* config.maxCTAs, 0: no config */
  size_t count;  /* floats to all-reduce and check, 0: none */
};

static int chan_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct chan_case *cc = arg;
  if (own_device(rank))
    return 1;
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  if (cc->max_ctas)
    cfg.maxCTAs = cc->max_ctas;
  RCHECK(NULL, ncclCommInitRankConfig(&comm, n, id, rank, &cfg));
  int nch = 0;
  RCHECK(comm, loomCommChannels(comm, &nch));
  /* A device holding fewer blocks at once than twice the NVLink count
   * (none that has NVLink) keeps half of them for point-to-point. */
  RASSERT(nch == cc->want || (sms < 2 * cc->want && nch < cc->want && nch >= 1), "rank %d has %d channels, expected %d",
          rank, nch, cc->want);
  if (cc->count && allreduce_checked(comm, rank, n, cc->count))
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* nranks ranks on the two devices placed by a topology with or without
 * NVLink, the environment's variables set (name, value pairs, NULL
 * ended) and unset again after. */
static int chan_run(int nvlink, int nranks, const char *const *env, struct chan_case cc) {
  if (harness_cuda_devices() < 2)
    SKIP("needs two CUDA devices");
  char ids[2][BUSID], path[32];
  ASSERT_MSG(bus_ids(ids) == 0, "cannot read the devices' bus ids");
  ASSERT(write_topo(ids, 1, nvlink, path) == 0);
  setenv("NCCL_TOPO_FILE", path, 1);
  for (const char *const *e = env; e && *e; e += 2)
    setenv(e[0], e[1], 1);
  int rc = run_ranks(nranks, chan_rank, &cc);
  for (const char *const *e = env; e && *e; e += 2)
    unsetenv(e[0]);
  unlink(path);
  return rc;
}

/* Two GPUs on an NVSwitch (18 NVLinks of an H100 each): 24 channels,
 * and an AllReduce large enough to use them all is right. */
TEST_IMPL(gpu_channels_nvlink) {
  return chan_run(1, 2, NULL, (struct chan_case){24, 0, (size_t)24 * 131072});
}

/* What keeps the count lower: NCCL_MAX_NCHANNELS, config.maxCTAs, a rank
 * alone on its host, GPUs that do not write into each other's memory,
 * PCIe only. */
TEST_IMPL(gpu_channels_bounds) {
  static const char *const max6[] = {"NCCL_MAX_NCHANNELS", "6", NULL};
  static const char *const min28[] = {"NCCL_MIN_NCHANNELS", "28", NULL};
  static const char *const nop2p[] = {"NCCL_P2P_DISABLE", "1", NULL};
  int rc = chan_run(1, 2, max6, (struct chan_case){6, 0, 4096});
  rc = rc ? rc : chan_run(1, 2, NULL, (struct chan_case){5, 5, 0});
  rc = rc ? rc : chan_run(0, 2, min28, (struct chan_case){28, 0, 0});
  rc = rc ? rc : chan_run(1, 1, NULL, (struct chan_case){2, 0, 0});
  rc = rc ? rc : chan_run(1, 2, nop2p, (struct chan_case){2, 0, 4096});
  return rc ? rc : chan_run(0, 2, NULL, (struct chan_case){2, 0, 4096});
}

#else
NO_CUDA(gpu_channels_nvlink)
NO_CUDA(gpu_channels_bounds)
NO_CUDA(gpu_p2p_invisible_switch)
NO_CUDA(gpu_p2p_invisible_sockets)
NO_CUDA(gpu_p2p_level)
NO_CUDA(gpu_p2p_level_bad)
#endif
