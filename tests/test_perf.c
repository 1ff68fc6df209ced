/*
 * The benchmarks and the launcher, run as a user runs them: ranks as
 * threads (-t) and as processes (loomrun), with checking on, every
 * benchmark once. A benchmark that finds a wrong element exits non-zero.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test.h"

static char out[1 << 20];

static int bench_ok(char *const argv[]) {
  int rc = harness_run(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "%s exited with %d", argv[0], rc);
  ASSERT_MSG(strstr(out, "# Out of bounds values : 0 OK") != NULL, "no clean check line");
  ASSERT_MSG(strstr(out, "# Avg bus bandwidth") != NULL, "no closing bandwidth line");
  return 0;
}

#define PERF(name) LOOM_PERF_DIR "/" name
#define LOOMRUN LOOM_TOOLS_DIR "/loomrun"

TEST_IMPL(perf_all_reduce_threads) {
  char *argv[] = {PERF("all_reduce_perf"), "-b", "8", "-e", "1M", "-f", "16", "-t", "3", "-n", "3", "-w", "1",
                  "-d", "all", "-o", "all", NULL};
  return bench_ok(argv);
}

TEST_IMPL(perf_all_reduce_processes) {
  char *argv[] = {LOOMRUN, "-n", "2", "--timeout", "100", PERF("all_reduce_perf"), "-b", "8", "-e", "4M", "-f", "8",
                  "-t", "2", "-n", "3", "-w", "1", NULL};
  if (bench_ok(argv))
    return 1;
  ASSERT(strstr(out, "#  Rank  3 Group") != NULL); /* 2 processes x 2 threads */
  return 0;
}

TEST_IMPL(perf_every_benchmark) {
  static const char *benches[] = {"all_gather_perf", "reduce_scatter_perf", "broadcast_perf", "reduce_perf",
                                  "sendrecv_perf", "alltoall_perf"};
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", LOOM_PERF_DIR, benches[i]);
    char *argv[] = {LOOMRUN, "-n", "3", "--timeout", "100", path, "-b", "8", "-e", "2M", "-f", "32", "-n", "2",
                    "-w", "1", NULL};
    if (bench_ok(argv))
      return 1;
  }
  return 0;
}

/* A rank that dies takes the launcher down with a non-zero status and a
 * sentence saying which rank, instead of leaving the others waiting. */
TEST_IMPL(perf_loomrun_failing_rank) {
  char *argv[] = {LOOMRUN, "-n", "2", "--timeout", "60", "/bin/sh", "-c", "test \"$LOOM_RANK\" = 0 || exit 3", NULL};
  int rc = harness_run(argv, out, sizeof out);
  ASSERT_MSG(rc == 3, "loomrun exited with %d, expected the failing rank's 3", rc);
  return 0;
}

/* loom-info on this host and on a fixture: what it prints is what a
 * communicator computes. */
TEST_IMPL(tools_loom_info) {
  char *here[] = {LOOM_TOOLS_DIR "/loom-info", NULL};
  int rc = harness_run(here, out, sizeof out);
  ASSERT_MSG(rc == 0, "loom-info exited with %d", rc);
  ASSERT(strstr(out, "Transports built in:") && strstr(out, "NCCL_BUFFSIZE") && strstr(out, "Topology of"));
  char *dgx[] = {LOOM_TOOLS_DIR "/loom-info", "--topo", LOOM_TOPO_FIXTURES "/dgx_h100.xml", "--ranks", "16",
                 "--hosts", "2", NULL};
  rc = harness_run(dgx, out, sizeof out);
  ASSERT_MSG(rc == 0, "loom-info --topo exited with %d", rc);
  ASSERT(strstr(out, "16 ranks on 2 hosts") && strstr(out, "channel  7 ring") && strstr(out, "mlx5_7"));
  char *bad[] = {LOOM_TOOLS_DIR "/loom-info", "--topo", "/nonexistent.xml", NULL};
  ASSERT(harness_run(bad, out, sizeof out) != 0);
  return 0;
}

/* The README's parameter table is what the library reads: every row that
 * loom-info --params prints appears in it word for word. */
TEST_IMPL(tools_params_documented) {
  char *argv[] = {LOOM_TOOLS_DIR "/loom-info", "--params", NULL};
  ASSERT(harness_run(argv, out, sizeof out) == 0);
  FILE *f = fopen(LOOM_README, "r");
  ASSERT_MSG(f, "cannot open %s", LOOM_README);
  static char readme[1 << 18];
  size_t n = fread(readme, 1, sizeof readme - 1, f);
  fclose(f);
  readme[n] = 0;
  int rows = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), rows++)
    ASSERT_MSG(strstr(readme, line), "README.md lacks the row %s (paste loom-info --params into it)", line);
  ASSERT(rows >= 20);
  return 0;
}

/* perf/compare_host.sh in its quick form, with Loom alone (the peers need
 * packages CI does not install): its parsing and tables keep working. */
TEST_IMPL(perf_compare_host_quick) {
  if (access("/usr/bin/python3", X_OK) != 0) {
    printf("no /usr/bin/python3: the comparison's tables cannot be made here\n");
    return 0;
  }
  char outdir[] = "/tmp/loom-compare-XXXXXX";
  ASSERT(mkdtemp(outdir));
  char *argv[] = {"/bin/bash", LOOM_SOURCE_DIR "/perf/compare_host.sh", "--quick", "--peers", "loom", "--no-build",
                  "--build", LOOM_BUILD_DIR, "--out", outdir, NULL};
  int rc = harness_run(argv, out, sizeof out);
  harness_remove_dir(outdir);
  ASSERT_MSG(rc == 0, "compare_host.sh exited with %d", rc);
  ASSERT(strstr(out, "== allreduce, 2 ranks") && strstr(out, "== reducescatter, 2 ranks"));
  return 0;
}

/* perf/crossover.py on a few small sizes: it runs each forced algorithm
 * and the tuner's choice, and reads back which algorithm ran. */
TEST_IMPL(perf_crossover_quick) {
  if (access("/usr/bin/python3", X_OK) != 0) {
    printf("no /usr/bin/python3: the crossover table cannot be made here\n");
    return 0;
  }
  char *argv[] = {"/usr/bin/python3", LOOM_SOURCE_DIR "/perf/crossover.py", "--ranks", "2", "--min", "8", "--max",
                  "64", "--rounds", "1", "--iters", "5", "--warmup", "1", "--build", LOOM_BUILD_DIR, NULL};
  int rc = harness_run(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "crossover.py exited with %d:\n%s", rc, out);
  /* Recursive doubling is the tuner's choice for 8 B on 2 ranks, and it ran. */
  ASSERT_MSG(strstr(out, "== 2 ranks") && strstr(out, "tuner:    rd from 8"), "unexpected output:\n%s", out);
  return 0;
}
