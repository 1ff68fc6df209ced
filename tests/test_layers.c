/*
 * The floors of src/ (src/LAYERS): tools/check-layers passes on the tree
 * as it is, and fails, naming the file, on a tree with one include that
 * runs upward, so that the check itself is known to bite.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "test.h"

static char out[1 << 16];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ASSERT_MSG(f != NULL, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

TEST_IMPL(layers_check) {
  if (access("/usr/bin/python3", X_OK) != 0)
    SKIP("no /usr/bin/python3: tools/check-layers cannot run here");
  char *argv[] = {"/usr/bin/python3", LOOM_SOURCE_DIR "/tools/check-layers", LOOM_SOURCE_DIR "/src", NULL};
  int rc = harness_run_merged(argv, out, sizeof out);
  printf("%s", out);
  ASSERT_MSG(rc == 0 && strstr(out, "no include runs upward"), "tools/check-layers exited with %d", rc);

  /* The same floors over a small tree where the ground includes a floor
   * above it: the check must fail and name the include. */
  char dir[] = "/tmp/loom-layers-XXXXXX";
  ASSERT(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/misc", dir);
  ASSERT(mkdir(path, 0755) == 0);
  snprintf(path, sizeof path, "%s/transport", dir);
  ASSERT(mkdir(path, 0755) == 0);
  snprintf(path, sizeof path, "%s/LAYERS", dir);
  write_file(path, "services: misc/\ntransports: transport/\n");
  snprintf(path, sizeof path, "%s/transport/transport.h", dir);
  write_file(path, "#include \"misc/utils.h\"\n");
  snprintf(path, sizeof path, "%s/misc/utils.h", dir);
  write_file(path, "#include <stdio.h>\n#include \"transport/transport.h\"\n");
  char *planted[] = {"/usr/bin/python3", LOOM_SOURCE_DIR "/tools/check-layers", dir, NULL};
  rc = harness_run_merged(planted, out, sizeof out);
  harness_remove_dir(dir);
  printf("%s", out);
  ASSERT_MSG(rc == 1 && strstr(out, "src/misc/utils.h:2: includes src/transport/transport.h"),
             "a planted upward include was not reported (exit %d)", rc);
  return 0;
}
