/*
 * The GPU kernel's one source built for AMD GPUs: kernel.cu, with
 * port.cuh taking the AMD side, must compile with hipcc wherever hipcc is
 * installed (Debian: apt-get install hipcc), so that a change made for
 * NVIDIA or the emulation cannot break the AMD build unseen.
 *
 * For tests/test_list.h (grep '^TEST(' tests/test_hip.c):
TEST(hip_kernel_source, 300)
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
