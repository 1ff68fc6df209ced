/*
 * The floors of src/ (src/LAYERS): tools/check-layers passes on the tree
 * as it is (its includes, and the calls between the library's objects as
 * this build made them), and fails, naming the file, on a small tree with
 * each kind of fault planted, so that the check itself is known to bite.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "test.h"

#define PYTHON "/usr/bin/python3"
#define CHECK_LAYERS LOOM_SOURCE_DIR "/tools/check-layers"
#define OBJECTS LOOM_BUILD_DIR "/CMakeFiles/loom_objs.dir/src"

static char out[1 << 16];

static void put(const char *dir, const char *rel, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  char *slash = strrchr(path, '/');
  *slash = '\0';
  mkdir(path, 0755); /* one level is enough here */
  *slash = '/';
  FILE *f = fopen(path, "w");
  ASSERT_MSG(f != NULL, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

/* A tree of two floors, services below transports, that passes. */
static void clean_tree(const char *dir) {
  put(dir, "LAYERS", "services: misc/\ntransports: transport/\n");
  put(dir, "sources.cmake", "set(S src/misc/utils.c src/transport/transport.c)\n");
  put(dir, "misc/utils.h", "int utils_f(void);\n");
  put(dir, "misc/utils.c", "#include \"misc/utils.h\"\nint utils_f(void) { return 1; }\n");
  put(dir, "transport/transport.h", "#include \"misc/utils.h\"\nint transport_g(void);\n");
  put(dir, "transport/transport.c", "#include \"transport/transport.h\"\nint transport_g(void) { return utils_f(); }\n");
}

/* Runs the check on `dir` (with `objects`, if not NULL); its exit code. */
static int run_check(const char *dir, const char *objects) {
  char *argv[] = {PYTHON, CHECK_LAYERS, objects ? "--objects" : (char *)dir, (char *)objects, (char *)dir, NULL};
  if (!objects)
    argv[3] = NULL;
  int rc = harness_run_merged(argv, out, sizeof out);
  printf("%s", out);
  return rc;
}

static void expect_fault(const char *what, const char *dir, const char *objects, const char *says) {
  int rc = run_check(dir, objects);
  ASSERT_MSG(rc == 1 && strstr(out, says), "%s was not reported (exit %d; expected \"%s\")", what, rc, says);
}

static void fresh(char *dir) {
  strcpy(dir, "/tmp/loom-layers-XXXXXX");
  ASSERT(mkdtemp(dir));
  clean_tree(dir);
}

TEST_IMPL(layers_check) {
  if (access(PYTHON, X_OK) != 0)
    SKIP("no " PYTHON ": tools/check-layers cannot run here");
  int have_nm = access("/usr/bin/nm", X_OK) == 0, have_objects = access(OBJECTS, F_OK) == 0;
  int rc = run_check(LOOM_SOURCE_DIR "/src", have_nm && have_objects ? OBJECTS : NULL);
  ASSERT_MSG(rc == 0 && strstr(out, "nothing runs upward"), "tools/check-layers exited with %d", rc);

  char dir[64];
  fresh(dir);
  ASSERT_MSG(run_check(dir, NULL) == 0, "the clean tree failed the check");
  put(dir, "misc/utils.h", "#include \"transport/transport.h\"\nint utils_f(void);\n");
  expect_fault("an upward quoted include", dir, NULL, "src/misc/utils.h:1: includes src/transport/transport.h");
  put(dir, "misc/utils.h", "#include <transport/transport.h>\nint utils_f(void);\n");
  expect_fault("an upward include in angle brackets", dir, NULL, "src/misc/utils.h:1: includes src/transport");
  harness_remove_dir(dir);

  fresh(dir);
  put(dir, "transport/utils.h", "\n");
  expect_fault("two files of one name", dir, NULL, "2 files of src/ are named utils.h");
  harness_remove_dir(dir);

  fresh(dir);
  put(dir, "transport/extra.c", "\n");
  expect_fault("a source file the build does not list", dir, NULL, "src/transport/extra.c is not listed");
  put(dir, "sources.cmake", "set(S src/misc/utils.c src/transport/transport.c src/transport/extra.c)\n");
  put(dir, "odd.inc", "\n");
  expect_fault("a file on no floor", dir, NULL, "src/odd.inc is on no floor");
  harness_remove_dir(dir);

  /* A call upward with no include: a prototype written in place. */
  if (!have_nm || access("/usr/bin/cc", X_OK) != 0) {
    printf("no nm or cc here: the check of calls between objects was not tried\n");
    return 0;
  }
  fresh(dir);
  put(dir, "misc/utils.c", "int transport_g(void);\nint utils_f(void) { return transport_g(); }\n");
  char objs[] = "/tmp/loom-layers-objs-XXXXXX", o[256];
  ASSERT(mkdtemp(objs));
  const char *units[] = {"misc", "transport"};
  const char *srcs[] = {"misc/utils.c", "transport/transport.c"};
  for (int i = 0; i < 2; i++) {
    char sub[160], src[160];
    snprintf(sub, sizeof sub, "%s/%s", objs, units[i]);
    ASSERT(mkdir(sub, 0755) == 0);
    snprintf(o, sizeof o, "%s/%s.o", objs, srcs[i]);
    snprintf(src, sizeof src, "%s/%s", dir, srcs[i]);
    char *cc[] = {"/usr/bin/cc", "-c", "-I", dir, "-o", o, src, NULL};
    ASSERT_MSG(harness_run_merged(cc, out, sizeof out) == 0, "cc failed: %s", out);
  }
  expect_fault("a call upward", dir, objs, "src/misc/utils.c uses transport_g of src/transport/transport.c");
  harness_remove_dir(dir);
  harness_remove_dir(objs);
  return 0;
}
