/*
 * RCCL's own names and header, which ROCm builds of PyTorch use where
 * RCCL is the library: ncclAllToAll (NCCL's ncclAlltoAll spelled RCCL's
 * way) and ncclAllToAllv (a count and a displacement per peer), checked
 * element by element on host communicators in every build; what AllToAllv
 * refuses; <rccl/rccl.h> compiled as a program would; and, in the HIP
 * build, librccl.so.1 itself.
 *
 * For tests/test_list.h (grep '^TEST(' tests/test_rccl.c):
TEST(rccl_alltoall_shm_3, 120)
TEST(rccl_alltoallv_1, 60)
TEST(rccl_alltoallv_shm_3, 120)
TEST(rccl_alltoallv_socket_4, 120)
TEST(rccl_alltoallv_refused, 60)
TEST(rccl_alltoallv_mismatch, 60)
TEST(rccl_msccl_refused, 30)
TEST(rccl_header, 120)
TEST(rccl_library, 60)
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

/* rccl/rccl.h declares these; it brings in HIP's runtime, which builds
 * other than the HIP one may not have, so the tests declare them as that
 * header does (rccl_header checks the header itself). */
ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllToAllv(const void *sendbuff, const size_t sendcounts[], const size_t sdispls[], void *recvbuff,
                           const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t mscclLoadAlgo(const char *mscclAlgoFilePath, int *mscclAlgoHandle, int rank);
ncclResult_t mscclRunAlgo(const void *sendBuff, const size_t sendCounts[], const size_t sDisPls[], void *recvBuff,
                          const size_t recvCounts[], const size_t rDisPls[], size_t count, ncclDataType_t dataType,
                          int root, int peer, ncclRedOp_t op, int mscclAlgoHandle, ncclComm_t comm,
                          cudaStream_t stream);
ncclResult_t mscclUnloadAlgo(int mscclAlgoHandle);

/* Element i of what rank `from` sends rank `to`. */
static int32_t value(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 7919 + (int)(i % 65521)); }

/* How many elements rank `from` sends rank `to` in round k: zero for some
 * pairs, a few FIFOs' worth for others, never the same for both ways. */
static size_t pair_count(int from, int to, int k) {
  static const size_t sizes[] = {0, 1, 7, 1031, 65536 + 3, 300007};
  return sizes[(size_t)(from * 5 + to * 3 + k) % (sizeof sizes / sizeof sizes[0])];
}

/* Blocks laid out in reverse rank order with a 3-element gap after each,
 * so that a displacement taken for another peer's, or a block written
 * one element long, is seen. */
static size_t layout(int n, const size_t *counts, size_t *displs) {
  size_t at = 0;
  for (int p = n - 1; p >= 0; p--) {
    displs[p] = at;
    at += counts[p] + 3;
  }
  return at;
}

static int alltoallv_round(ncclComm_t comm, int rank, int n, int k) {
  size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
  size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
  RASSERT(sc && sd && rc && rd, "out of memory");
  for (int p = 0; p < n; p++) {
    sc[p] = pair_count(rank, p, k);
    rc[p] = pair_count(p, rank, k);
  }
  size_t stotal = layout(n, sc, sd), rtotal = layout(n, rc, rd);
  int32_t *s = malloc(stotal * 4), *r = malloc(rtotal * 4);
  void *ds = tbuf_alloc(comm, stotal * 4), *dr = tbuf_alloc(comm, rtotal * 4);
  RASSERT(s && r && ds && dr, "out of memory");
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < sc[p]; i++)
      s[sd[p] + i] = value(rank, p, i);
  RASSERT(tbuf_put(comm, ds, s, stotal * 4) == 0 && tbuf_set(comm, dr, 0xee, rtotal * 4) == 0, "copy in");
  RCHECK(comm, tbuf_result(comm, ncclAllToAllv(ds, sc, sd, dr, rc, rd, ncclInt32, comm, NULL)));
  RASSERT(tbuf_get(comm, r, dr, rtotal * 4) == 0, "copy out");
  for (int p = 0; p < n; p++) {
    for (size_t i = 0; i < rc[p]; i++)
      RASSERT(r[rd[p] + i] == value(p, rank, i), "round %d: element %zu from rank %d on rank %d is %d, expected %d",
              k, i, p, rank, r[rd[p] + i], value(p, rank, i));
    const unsigned char *gap = (const unsigned char *)(r + rd[p] + rc[p]);
    for (size_t b = 0; b < 12; b++)
      RASSERT(gap[b] == 0xee, "round %d: byte %zu after rank %d's block on rank %d was written", k, b, p, rank);
  }
  free(s);
  free(r);
  free(sc);
  free(sd);
  free(rc);
  free(rd);
  tbuf_free(ds);
  tbuf_free(dr);
  return 0;
}

static int alltoallv_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  for (int k = 0; k < 6; k++)
    if (alltoallv_round(comm, rank, n, k))
      return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int run(int n, int socket, rank_fn fn) {
  if (socket) {
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return run_ranks(n, fn, NULL);
}

TEST_IMPL(rccl_alltoallv_1) { return run(1, 0, alltoallv_rank); }
TEST_IMPL(rccl_alltoallv_shm_3) { return run(3, 0, alltoallv_rank); }
TEST_IMPL(rccl_alltoallv_socket_4) { return run(4, 1, alltoallv_rank); }

/* ncclAllToAll is ncclAlltoAll: every block lands where NCCL's would. */
static int alltoall_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  static const size_t counts[] = {0, 1, 1031, 300007};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    size_t c = counts[k], all = c * (size_t)n;
    int32_t *s = malloc(all * 4 + 4), *r = malloc(all * 4 + 4);
    void *ds = tbuf_alloc(comm, all * 4 + 4), *dr = tbuf_alloc(comm, all * 4 + 4);
    RASSERT(s && r && ds && dr, "out of memory");
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        s[(size_t)p * c + i] = value(rank, p, i);
    RASSERT(tbuf_put(comm, ds, s, all * 4) == 0 && tbuf_set(comm, dr, 0xee, all * 4 + 4) == 0, "copy in");
    RCHECK(comm, tbuf_result(comm, ncclAllToAll(ds, dr, c, ncclInt32, comm, NULL)));
    RASSERT(tbuf_get(comm, r, dr, all * 4 + 4) == 0, "copy out");
    for (size_t j = 0; j < all; j++)
      RASSERT(r[j] == value((int)(j / c), rank, j % c), "count %zu: element %zu on rank %d is %d", c, j, rank, r[j]);
    RASSERT(r[all] == (int32_t)0xeeeeeeee, "count %zu: the element past the end was written", c);
    free(s);
    free(r);
    tbuf_free(ds);
    tbuf_free(dr);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rccl_alltoall_shm_3) { return run(3, 0, alltoall_rank); }

/* ---- what AllToAllv refuses ---- */

static int refused(ncclComm_t comm, ncclResult_t r, const char *words) {
  RASSERT(r == ncclInvalidArgument, "result %d, expected ncclInvalidArgument (%s)", (int)r, words);
  const char *why = ncclGetLastError(comm);
  RASSERT(strstr(why, words) != NULL, "the sentence does not say \"%s\": %s", words, why);
  return 0;
}

static int refusals_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { C = 64 };
  char *b = tbuf_alloc(comm, (size_t)C * 4 * (size_t)n * 2);
  RASSERT(b, "out of memory");
  size_t counts[2] = {C, C}, sd[2] = {0, C}, rd[2] = {0, C}, big[2] = {SIZE_MAX / 2, C};
  char *rb = b + (size_t)C * 4 * (size_t)n;
  if (refused(comm, ncclAllToAllv(b, NULL, sd, rb, counts, rd, ncclInt32, comm, NULL), "sendcounts is NULL") ||
      refused(comm, ncclAllToAllv(b, counts, sd, rb, counts, NULL, ncclInt32, comm, NULL), "rdispls is NULL") ||
      refused(comm, ncclAllToAllv(b, counts, sd, b, counts, rd, ncclInt32, comm, NULL), "no in-place form") ||
      refused(comm, ncclAllToAllv(b, counts, sd, b + C * 4, counts, rd, ncclInt32, comm, NULL), "overlap") ||
      refused(comm, ncclAllToAllv(b, counts, sd, rb, counts, rd, (ncclDataType_t)99, comm, NULL), "datatype") ||
      refused(comm, ncclAllToAllv(b, big, sd, rb, counts, rd, ncclInt32, comm, NULL), "overflows") ||
      refused(comm, ncclAllToAllv(NULL, counts, sd, rb, counts, rd, ncclInt32, comm, NULL), "sendbuff is NULL"))
    return 1;
  /* Refusals moved nothing: the communicator still works. */
  RCHECK(comm, tbuf_result(comm, ncclAllToAllv(b, counts, sd, rb, counts, rd, ncclInt32, comm, NULL)));
  (void)rank;
  tbuf_free(b);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rccl_alltoallv_refused) { return run_ranks(2, refusals_rank, NULL); }

/* Rank 0 sends rank 1 more than rank 1 expects: the sentence names the
 * AllToAllv, not a bare Send. */
static int mismatch_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  setenv("LOOM_TIMEOUT", "20", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t sc[2] = {4, rank == 0 ? 101 : 100}, rc[2] = {4, 100}, d[2] = {0, 128};
  void *s = tbuf_alloc(comm, 256 * 4), *r = tbuf_alloc(comm, 256 * 4);
  ncclResult_t res = tbuf_result(comm, ncclAllToAllv(s, sc, d, r, rank == 0 ? rc : sc, d, ncclFloat, comm, NULL));
  RASSERT(res == ncclInvalidUsage || res == ncclRemoteError, "result %d", (int)res);
  const char *why = ncclGetLastError(comm);
  RASSERT(strstr(why, "AllToAllv") != NULL, "the sentence does not name the AllToAllv: %s", why);
  ncclCommAbort(comm);
  tbuf_free(s);
  tbuf_free(r);
  return 0;
}

TEST_IMPL(rccl_alltoallv_mismatch) { return run_ranks(2, mismatch_rank, NULL); }

/* RCCL's MSCCL entry points: there for programs that link them, each
 * refusing with a sentence rather than doing nothing and succeeding. */
TEST_IMPL(rccl_msccl_refused) {
  int h = 7;
  float x = 1, y = 0;
  size_t one = 1, zero = 0;
  ASSERT(mscclLoadAlgo("/tmp/allreduce.xml", &h, 0) == ncclInvalidUsage);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "no MSCCL") != NULL, "%s", ncclGetLastError(NULL));
  ASSERT(mscclRunAlgo(&x, &one, &zero, &y, &one, &zero, 1, ncclFloat, 0, 0, ncclSum, h, NULL, NULL) ==
         ncclInvalidUsage);
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "nothing was run") != NULL, "%s", ncclGetLastError(NULL));
  ASSERT(y == 0);
  ASSERT(mscclUnloadAlgo(h) == ncclInvalidUsage);
  return 0;
}

/* ---- the header and the library ---- */

static char out[1 << 16];

/* Where HIP's headers are: the HIP build's, else ROCm's or Debian's. */
static const char *hip_include_dir(void) {
#ifdef LOOM_HIP_INCLUDE_DIR
  return LOOM_HIP_INCLUDE_DIR;
#else
  static const char *dirs[] = {"/opt/rocm/include", "/usr/include"};
  char path[256];
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    snprintf(path, sizeof path, "%s/hip/hip_runtime_api.h", dirs[i]);
    if (access(path, R_OK) == 0)
      return dirs[i];
  }
  return NULL;
#endif
}

/* A C program and a C++ one that include <rccl/rccl.h> and call RCCL's
 * names with HIP's stream type, compiled as a ROCm program is. */
TEST_IMPL(rccl_header) {
  const char *hip = hip_include_dir();
  if (!hip)
    SKIP("no HIP headers (Debian: apt-get install libamdhip64-dev)");
  char src[128], inc[512];
  snprintf(src, sizeof src, "/tmp/loom-rccl-header-%d.c", (int)getpid());
  snprintf(inc, sizeof inc, "-I%s", hip);
  FILE *f = fopen(src, "w");
  ASSERT(f != NULL);
  fputs("#include <rccl/rccl.h>\n"
        "#if !RCCL_ALLTOALLV || !defined(NCCL_STREAM_IS_HIP)\n#error not the RCCL header with HIP streams\n#endif\n"
        "#ifdef RCCL_FLOAT8\n#error RCCL fp8 types are FNUZ on MI300, which Loom does not reduce\n#endif\n"
        "int use(ncclComm_t c, hipStream_t s, const size_t *n) {\n"
        "  ncclResult_t (*a)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, hipStream_t) = ncclAllToAll;\n"
        "  mscclAlgoHandle_t h = 0;\n"
        "  (void)a;\n"
        "  (void)mscclUnloadAlgo(h);\n"
        "  return (int)ncclAllToAllv(0, n, n, 0, n, n, ncclFloat, c, s) + (int)ncclAllReduce(0, 0, 0, ncclFloat,\n"
        "      ncclSum, c, s);\n}\n",
        f);
  fclose(f);
  char *cc[] = {"/usr/bin/cc", "-std=c11", "-fsyntax-only", "-Werror", inc, "-I", LOOM_SOURCE_DIR "/include", src, NULL};
  int rc = harness_run_merged(cc, out, sizeof out);
  if (rc == 0) {
    char *cxx[] = {"/usr/bin/c++", "-x", "c++", "-std=c++17", "-fsyntax-only", "-Werror", inc, "-I", LOOM_SOURCE_DIR "/include",
                   src, NULL};
    rc = harness_run_merged(cxx, out, sizeof out);
  }
  unlink(src);
  ASSERT_MSG(rc == 0, "a program including <rccl/rccl.h> did not compile (exit %d):\n%s", rc, out);
  return 0;
}

/* The HIP build's librccl.so.1: its soname, RCCL's names and NCCL's among
 * its exports, and a host communicator made through it. */
TEST_IMPL(rccl_library) {
#if LOOM_TEST_HIP
  void *lib = dlopen(LOOM_BUILD_DIR "/librccl.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_MSG(lib != NULL, "dlopen: %s", dlerror());
  static const char *names[] = {"ncclAllToAll", "ncclAllToAllv", "mscclRunAlgo", "ncclAlltoAll", "ncclGather", "ncclScatter",
                                "ncclAllReduce", "ncclCommInitRankConfig", "ncclGetLastError", "pncclAllToAllv"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ASSERT_MSG(dlsym(lib, names[i]) != NULL, "librccl.so.1 does not export %s", names[i]);
  ncclResult_t (*get_version)(int *) = (ncclResult_t(*)(int *))dlsym(lib, "ncclGetVersion");
  ncclResult_t (*init_all)(ncclComm_t *, int, const int *) =
      (ncclResult_t(*)(ncclComm_t *, int, const int *))dlsym(lib, "ncclCommInitAll");
  ncclResult_t (*destroy)(ncclComm_t) = (ncclResult_t(*)(ncclComm_t))dlsym(lib, "ncclCommDestroy");
  ASSERT(get_version && init_all && destroy);
  int v = 0;
  ASSERT_OK(get_version(&v));
  ASSERT_MSG(v >= 22700, "ncclGetVersion through librccl.so.1: %d", v);
  setenv("LOOM_DEVICE", "host", 1);
  ncclComm_t comm;
  ASSERT_OK(init_all(&comm, 1, NULL));
  ASSERT_OK(destroy(comm));
  char *readelf[] = {"/usr/bin/readelf", "-d", LOOM_BUILD_DIR "/librccl.so.1", NULL};
  int rc = harness_run_merged(readelf, out, sizeof out);
  ASSERT_MSG(rc == 0 && strstr(out, "Library soname: [librccl.so.1]"), "readelf -d librccl.so.1:\n%s", out);
  dlclose(lib);
  return 0;
#else
  SKIP("not the HIP build (-DLOOM_WITH_HIP=ON makes librccl.so.1)");
#endif
}
