/*
 * The NCCL 2.30 ABI as a program linked against NVIDIA's library sees it:
 * every function NVIDIA's libnccl.so.2 2.30.7 exports resolves in Loom's
 * (tests/abi/nccl-2.30.7.exports), and each of those 2.28-2.30 added does
 * what Loom says: the device API refuses with its sentence, the team and
 * property queries answer from the communicator, and the calls not built
 * yet say so and change nothing.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "test.h"

/* Every name of tests/abi/<fixture> resolves in Loom's libnccl.so.2,
 * opened by path as a framework's loader would find it. */
static int resolves(const char *fixture, int at_least) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/abi/%s", LOOM_SOURCE_DIR, fixture);
  FILE *f = fopen(path, "r");
  ASSERT_MSG(f != NULL, "cannot open %s", path);
  char lib[4096];
  snprintf(lib, sizeof lib, "%s/libnccl.so.2", LOOM_BUILD_DIR);
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  ASSERT_MSG(h != NULL, "dlopen %s: %s", lib, dlerror());
  ASSERT_MSG(dlsym(h, "loomTransports") != NULL, "%s is not Loom's library", lib);
  char line[256];
  int names = 0, missing = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '#' || line[0] == '\0')
      continue;
    names++;
    if (dlsym(h, line) == NULL) {
      fprintf(stderr, "missing: %s\n", line);
      missing++;
    }
  }
  fclose(f);
  dlclose(h);
  printf("%s: %d of %d functions resolve in %s\n", fixture, names - missing, names, lib);
  ASSERT_MSG(names >= at_least, "the fixture lists only %d names", names);
  ASSERT_MSG(missing == 0, "%d of the fixture's functions are missing", missing);
  return 0;
}

/* What NVIDIA's 2.30.7 library exports. */
TEST_IMPL(abi_exports_2_30) { return resolves("nccl-2.30.7.exports", 165); }
/* What torch 2.15's libtorch_cuda.so binds at import. */
TEST_IMPL(abi_torch_2_15) { return resolves("torch-2.15.0.imports", 51); }
/* What vLLM's pynccl loads with ctypes. */
TEST_IMPL(abi_vllm_pynccl) { return resolves("vllm-0.34.0-pynccl.functions", 21); }

/* nccl_device.h's host functions, as NVIDIA declares them (only pointers
 * and the team, passed by value, matter here). */
struct team {
  int nRanks, rank, stride;
};
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devComm);
ncclResult_t ncclLsaBarrierCreateRequirement(struct team team, int nBarriers, void *outHandle, void *outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct team team, int nBarriers, void *outHandle,
                                             void *outReq);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2, void *outHandle, void *outReq);
ncclResult_t ncclGinInboxA2ACreateRequirement(struct team peers, int nBlocks, int size_log2, void *outHandle,
                                              void *outReq);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, void *multimem, void **outPtr);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
struct team ncclTeamWorld(ncclComm_t comm);
struct team ncclTeamLsa(ncclComm_t comm);
struct team ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, struct team team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, struct team team, int rank);

static int says(ncclResult_t r, ncclResult_t want, const char *words, const char *call) {
  ASSERT_MSG(r == want, "%s returned %d, expected %d", call, (int)r, (int)want);
  const char *why = ncclGetLastError(NULL);
  ASSERT_MSG(strstr(why, words) != NULL, "%s: the sentence does not say \"%s\": %s", call, words, why);
  return 0;
}

#define REFUSED(call) says((call), ncclInvalidUsage, "device API", #call)

TEST_IMPL(abi_device_api_refused) {
  setenv("LOOM_DEVICE", "host", 1);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  char out[64];
  struct team t = ncclTeamWorld(comm);
  if (REFUSED(ncclDevCommCreate(comm, out, out)) || REFUSED(ncclDevCommDestroy(comm, out)) ||
      REFUSED(ncclLsaBarrierCreateRequirement(t, 1, out, out)) ||
      REFUSED(ncclGinBarrierCreateRequirement(comm, t, 1, out, out)) ||
      REFUSED(ncclGinOutboxCreateRequirement(1, 12, out, out)) ||
      REFUSED(ncclGinInboxA2ACreateRequirement(t, 1, 12, out, out)) ||
      REFUSED(ncclLLA2ACreateRequirement(1, 8, out, out)) ||
      REFUSED(ncclGetLsaMultimemDevicePointer(NULL, 0, (void **)out)) ||
      REFUSED(ncclGetMultimemDevicePointer(NULL, 0, NULL, (void **)out)))
    return 1;
  ASSERT(ncclLLA2ACalcSlots(1024, 8) == -1);
  ASSERT(strstr(ncclGetLastError(NULL), "device API") != NULL);
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* Three ranks of one process on one host: one LSA team of all three,
 * rails of one rank each; the properties say what Loom offers. */
TEST_IMPL(abi_teams_properties) {
  setenv("LOOM_DEVICE", "host", 1);
  ncclComm_t comms[3];
  ASSERT_OK(ncclCommInitAll(comms, 3, NULL));
  ncclComm_t c = comms[1];
  struct team w = ncclTeamWorld(c), l = ncclTeamLsa(c), r = ncclTeamRail(c);
  ASSERT_MSG(w.nRanks == 3 && w.rank == 1 && w.stride == 1, "world team %d %d %d", w.nRanks, w.rank, w.stride);
  ASSERT_MSG(l.nRanks == 3 && l.rank == 1 && l.stride == 1, "lsa team %d %d %d", l.nRanks, l.rank, l.stride);
  ASSERT_MSG(r.nRanks == 1 && r.rank == 0 && r.stride == 3, "rail team %d %d %d", r.nRanks, r.rank, r.stride);
  ASSERT(ncclTeamRankToWorld(c, w, 2) == 2 && ncclTeamRankToWorld(c, l, 0) == 0 && ncclTeamRankToLsa(c, w, 2) == 2);
  ASSERT(ncclTeamRankToWorld(c, w, 3) == -1);
  ASSERT(strstr(ncclGetLastError(NULL), "not in a team of 3") != NULL);
  ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
  ASSERT_OK(ncclCommQueryProperties(c, &p));
  ASSERT_MSG(p.rank == 1 && p.nRanks == 3 && p.cudaDev == -1 && p.nLsaTeams == 1 && !p.deviceApiSupport &&
                 !p.multimemSupport && p.ginType == NCCL_GIN_TYPE_NONE && p.hostRmaSupport,
             "rank %d nRanks %d cudaDev %d nLsaTeams %d", p.rank, p.nRanks, p.cudaDev, p.nLsaTeams);
  ncclCommProperties_t bad = {0};
  ASSERT(ncclCommQueryProperties(c, &bad) == ncclInvalidArgument);
  ASSERT(strstr(ncclGetLastError(c), "NCCL_COMM_PROPERTIES_INITIALIZER") != NULL);
  /* A window gives back the buffer it was registered with. Registration
   * is collective: one thread registers on a communicator of one rank. */
  static char buf[8192];
  ncclWindow_t win;
  void *ptr = NULL;
  ncclComm_t solo;
  ASSERT_OK(ncclCommInitAll(&solo, 1, NULL));
  ASSERT_OK(ncclCommWindowRegister(solo, buf, sizeof buf, &win, NCCL_WIN_DEFAULT));
  ASSERT_OK(ncclWinGetUserPtr(solo, win, &ptr));
  ASSERT(ptr == buf);
  ASSERT(ncclWinGetUserPtr(comms[0], win, &ptr) == ncclInvalidArgument);
  ASSERT(ncclWinGetUserPtr(solo, win, NULL) == ncclInvalidArgument);
  ASSERT_OK(ncclCommWindowDeregister(solo, win));
  ASSERT_OK(ncclCommDestroy(solo));
  for (int i = 0; i < 3; i++)
    ASSERT_OK(ncclCommDestroy(comms[i]));
  return 0;
}

