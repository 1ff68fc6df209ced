/*
 * The GPU kernel's one source built for AMD GPUs: kernel.cu, with
 * port.cuh taking the AMD side, must compile with hipcc wherever hipcc is
 * installed (Debian: apt-get install hipcc), so that a change made for
 * NVIDIA or the emulation cannot break the AMD build unseen. In the HIP
 * build, the kernel's code for each architecture must be in both of its
 * libraries.
 *
 * For tests/test_list.h (grep '^TEST(' tests/test_hip.c):
TEST(hip_kernel_source, 300)
TEST(hip_library_kernels, 120)
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test.h"

static char out[1 << 16];

/* hipcc's path from PATH, or NULL. */
static const char *find_hipcc(char *buf, size_t len) {
  const char *path = getenv("PATH");
  while (path && *path) {
    size_t n = strcspn(path, ":");
    if (n > 0 && snprintf(buf, len, "%.*s/hipcc", (int)n, path) < (int)len && access(buf, X_OK) == 0)
      return buf;
    path += n + (path[n] == ':');
  }
  return NULL;
}

/* Syntax and semantics of both of hipcc's passes (the GPU's and the
 * host's), not code generation: the full build is CI's HIP job. */
TEST_IMPL(hip_kernel_source) {
  char hipcc[4096];
  if (!find_hipcc(hipcc, sizeof hipcc))
    SKIP("no hipcc on PATH (Debian: apt-get install hipcc)");
  char *argv[] = {hipcc, "--offload-arch=gfx90a", "-std=c++17", "-ffp-contract=off", "-fsyntax-only", "-x", "hip",
                  "-Werror=return-type", "-I", LOOM_SOURCE_DIR "/src", "-I", LOOM_SOURCE_DIR "/include",
                  LOOM_SOURCE_DIR "/src/exec/cuda/kernel.cu", NULL};
  int rc = harness_run_merged(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "hipcc could not compile kernel.cu (exit %d):\n%s", rc, out);
  ASSERT_MSG(!strstr(out, " error"), "hipcc said:\n%s", out);
  return 0;
}

/* Each library of the HIP build carries a code object for every
 * architecture it was built for, holding the kernel: the offload bundle
 * in its .hip_fatbin section is listed and unbundled with clang's
 * bundler, and each object must be an AMDGPU ELF that names loom_kernel. */
#if LOOM_TEST_HIP
/* The whole of a file, malloc'd; NULL if it cannot be read. */
static char *read_whole(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *buf = NULL;
  long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len)) != NULL &&
      fread(buf, 1, (size_t)len, f) != (size_t)len) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *n = len > 0 ? (size_t)len : 0;
  return buf;
}

static int kernels_in(const char *lib) {
  char bundle[128], obj[128], target[128];
  snprintf(bundle, sizeof bundle, "/tmp/loom-hip-bundle-%d", (int)getpid());
  snprintf(obj, sizeof obj, "/tmp/loom-hip-object-%d", (int)getpid());
  char dump[200];
  snprintf(dump, sizeof dump, ".hip_fatbin=%s", bundle);
  char *objcopy[] = {"/usr/bin/objcopy", "-O", "binary", "--dump-section", dump, (char *)lib, "/dev/null", NULL};
  int rc = harness_run_merged(objcopy, out, sizeof out);
  ASSERT_MSG(rc == 0, "%s has no .hip_fatbin section (objcopy exit %d):\n%s", lib, rc, out);
  char input[160];
  snprintf(input, sizeof input, "--input=%s", bundle);
  char *list[] = {LOOM_HIP_BUNDLER, "--list", "--type=o", input, NULL};
  rc = harness_run_merged(list, out, sizeof out);
  ASSERT_MSG(rc == 0, "clang-offload-bundler --list (exit %d):\n%s", rc, out);
  char archs[] = LOOM_HIP_ARCHS_BUILT, *save = NULL;
  for (char *arch = strtok_r(archs, ",", &save); arch; arch = strtok_r(NULL, ",", &save)) {
    snprintf(target, sizeof target, "hipv4-amdgcn-amd-amdhsa--%s", arch);
    ASSERT_MSG(strstr(out, target), "%s has no code object for %s; its bundle lists:\n%s", lib, arch, out);
  }
  strcpy(archs, LOOM_HIP_ARCHS_BUILT);
  for (char *arch = strtok_r(archs, ",", &save); arch; arch = strtok_r(NULL, ",", &save)) {
    snprintf(target, sizeof target, "--targets=hipv4-amdgcn-amd-amdhsa--%s", arch);
    char output[160];
    snprintf(output, sizeof output, "--output=%s", obj);
    char *unbundle[] = {LOOM_HIP_BUNDLER, "--unbundle", "--type=o", input, output, target, NULL};
    rc = harness_run_merged(unbundle, out, sizeof out);
    ASSERT_MSG(rc == 0, "unbundling %s's code object for %s (exit %d):\n%s", lib, arch, rc, out);
    size_t n = 0;
    char *code = read_whole(obj, &n);
    ASSERT_MSG(code && n > 64, "%s's code object for %s is empty", lib, arch);
    /* ELF, machine EM_AMDGPU (224), and the kernel's symbol. */
    ASSERT_MSG(memcmp(code, "\177ELF", 4) == 0 && (unsigned char)code[18] == 224,
               "%s's code object for %s is not an AMDGPU ELF", lib, arch);
    ASSERT_MSG(memmem(code, n, "loom_kernel", 11) != NULL, "%s's code object for %s has no loom_kernel", lib, arch);
    free(code);
  }
  unlink(bundle);
  unlink(obj);
  return 0;
}
#endif

TEST_IMPL(hip_library_kernels) {
#if LOOM_TEST_HIP
  if (kernels_in(LOOM_BUILD_DIR "/libnccl.so.2") || kernels_in(LOOM_BUILD_DIR "/librccl.so.1"))
    return 1;
  return 0;
#else
  SKIP("not the HIP build (-DLOOM_WITH_HIP=ON)");
#endif
}
