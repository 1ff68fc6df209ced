/*
 * The benchmarks and the launcher, run as a user runs them: ranks as
 * threads (-t) and as processes (loomrun), with checking on, every
 * benchmark once. A benchmark that finds a wrong element exits non-zero.
 */
#include <glob.h>
#include <sched.h>
#include <limits.h>
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

/* -R as nccl-tests has it: buffers registered (1), or ncclMemAlloc's in
 * symmetric windows (2), where the flat AllReduce reads and writes every
 * rank's buffers in place; every op and type checked, in place and not,
 * ranks as processes and as threads. */
TEST_IMPL(perf_all_reduce_registered) {
  char *procs[] = {LOOMRUN, "-n", "3", "--timeout", "100", PERF("all_reduce_perf"), "-b", "8", "-e", "2M", "-f", "64",
                   "-n", "3", "-w", "1", "-R", "2", "-d", "all", "-o", "all", NULL};
  char *threads[] = {PERF("all_reduce_perf"), "-b", "1K", "-e", "1M", "-f", "32", "-t", "2", "-n", "2", "-w", "1",
                     "-R", "2", NULL};
  char *local[] = {LOOMRUN, "-n", "2", "--timeout", "100", PERF("all_reduce_perf"), "-b", "8", "-e", "1M", "-f", "64",
                   "-n", "2", "-w", "1", "-R", "1", NULL};
  if (bench_ok(procs) || bench_ok(threads) || bench_ok(local))
    return 1;
  char *bad[] = {PERF("all_reduce_perf"), "-R", "3", NULL};
  ASSERT(harness_run(bad, out, sizeof out) != 0);
  return 0;
}

TEST_IMPL(perf_every_benchmark) {
  static const char *benches[] = {"all_gather_perf", "reduce_scatter_perf", "broadcast_perf", "reduce_perf",
                                  "sendrecv_perf", "alltoall_perf", "gather_perf", "scatter_perf"};
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

/* The floor program (perf/baselines/shm_floor.c) checks its own output:
 * both modes, pieces that do not divide the buffer, one piece larger than
 * a half, and arguments it refuses. */
TEST_IMPL(perf_shm_floor) {
  static char *const runs[][8] = {
      {PERF("shm_floor"), "ring", "1000", "3", "1", "64", "4K", NULL},
      {PERF("shm_floor"), "ring", "65544", "3", "3", NULL},
      {PERF("shm_floor"), "ring", "3M", "2", "1", "192K", "1M", NULL},
      {PERF("shm_floor"), "exchange", "1000", "3", "1", "64", "4K", NULL},
      {PERF("shm_floor"), "exchange", "3M", "2", "2", "192K", "1M", NULL},
  };
  static const char *const lines[] = {"ring 1000 64", "ring 65544 262144", "ring 3145728 196608",
                                      "exchange 1000 64", "exchange 3145728 196608"};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    int rc = harness_run(runs[i], out, sizeof out);
    ASSERT_MSG(rc == 0, "shm_floor %s %s exited with %d:\n%s", runs[i][1], runs[i][2], rc, out);
    char want[64];
    snprintf(want, sizeof want, "shm_floor %s ", lines[i]);
    ASSERT_MSG(strstr(out, want) != NULL, "no closing line \"%s\" in:\n%s", want, out);
  }
  static char *const bad[][6] = {
      {PERF("shm_floor"), "ring", "1001", NULL},
      {PERF("shm_floor"), "ring", "1M", "0", NULL},
      {PERF("shm_floor"), "ring", "1M", "1", "102", NULL},
      {PERF("shm_floor"), "tree", "1M", NULL},
      {PERF("shm_floor"), NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ASSERT_MSG(harness_run(bad[i], out, sizeof out) == 2, "shm_floor %s %s was not refused",
               bad[i][1] ? bad[i][1] : "", bad[i][1] && bad[i][2] ? bad[i][2] : "");
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

/* The CPUs each rank got: "r<local rank> <Cpus_allowed_list>" per line;
 * bind NULL: no --bind option, loomrun's default. */
static int rank_cpus(const char *bind, int n, char lists[][64]) {
  char nstr[16];
  snprintf(nstr, sizeof nstr, "%d", n);
  char *argv[] = {LOOMRUN, "-n", nstr, "--timeout", "60", "--bind", (char *)bind, "/bin/sh", "-c",
                  "echo \"r$LOOM_LOCAL_RANK $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)\"",
                  NULL};
  if (!bind)
    memmove(&argv[5], &argv[7], sizeof argv - 7 * sizeof argv[0]);
  int rc = harness_run(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "loomrun --bind %s exited with %d:\n%s", bind, rc, out);
  for (int i = 0; i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "r%d ", i);
    const char *p = strstr(out, key);
    ASSERT_MSG(p && sscanf(p + strlen(key), "%63s", lists[i]) == 1, "no line for rank %d in:\n%s", i, out);
  }
  return 0;
}

/* loomrun --bind: cpu puts local rank i on the (i mod k)-th of the k CPUs
 * it may run on itself, none leaves them all, auto (the default) binds
 * only where the ranks outnumber those CPUs. */
TEST_IMPL(perf_loomrun_bind) {
  cpu_set_t have;
  ASSERT(sched_getaffinity(0, sizeof have, &have) == 0);
  int k = CPU_COUNT(&have), cpu[64], nc = 0;
  for (int c = 0; c < CPU_SETSIZE && nc < 64; c++)
    if (CPU_ISSET(c, &have))
      cpu[nc++] = c;
  if (k > 32)
    SKIP("this process may run on %d CPUs; the test starts k+1 ranks and checks each, up to 32", k);
  static char lists[40][64];
  int n = k + 1;
  /* k+1 ranks: cpu, auto and the default pin alike. */
  static const char *const pinning[] = {"cpu", "auto", NULL};
  for (int b = 0; b < 3; b++) {
    ASSERT(rank_cpus(pinning[b], n, lists) == 0);
    for (int i = 0; i < n; i++) {
      char want[16];
      snprintf(want, sizeof want, "%d", cpu[i % k]);
      ASSERT_MSG(strcmp(lists[i], want) == 0, "--bind %s, %d ranks on %d CPUs: rank %d runs on %s, not CPU %s",
                 pinning[b] ? pinning[b] : "(default)", n, k, i, lists[i], want);
    }
  }
  /* As many ranks as CPUs, and none: every rank keeps the launcher's set. */
  char all[64];
  ASSERT(rank_cpus("none", 1, lists) == 0);
  snprintf(all, sizeof all, "%s", lists[0]);
  for (int b = 1; b < 3; b++) {
    ASSERT(rank_cpus(pinning[b], k, lists) == 0);
    for (int i = 0; i < k; i++)
      ASSERT_MSG(strcmp(lists[i], all) == 0, "--bind %s, %d ranks on %d CPUs: rank %d runs on %s, not %s",
                 pinning[b] ? pinning[b] : "(default)", k, k, i, lists[i], all);
  }
  ASSERT(rank_cpus("none", n, lists) == 0);
  for (int i = 0; i < n; i++)
    ASSERT_MSG(strcmp(lists[i], all) == 0, "--bind none: rank %d runs on %s, not %s", i, lists[i], all);
  char *bad[] = {LOOMRUN, "-n", "2", "--bind", "core", "true", NULL};
  ASSERT(harness_run_merged(bad, out, sizeof out) == 1 && strstr(out, "--bind wants auto, cpu or none"));
  return 0;
}

static int occurrences(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)) != NULL; p++)
    n++;
  return n;
}

/* The library's side of pinning: ranks pinned one per CPU are not
 * crowded; one more makes the two that share a CPU crowded and the host
 * crowded for all (init.c's host census, from the affinities the ranks
 * exchange). Those two, pinned to one CPU with another rank, yield for
 * 10 ms before they sleep; every other rank for 50 us, and so do m+1
 * ranks that are crowded but free to move (init.c's yield_budget). On at
 * most two of this process's CPUs, so that the ranks stay few; with one,
 * m+1 = 2 ranks share it. */
TEST_IMPL(perf_pinned_not_crowded) {
  cpu_set_t have, use;
  ASSERT(sched_getaffinity(0, sizeof have, &have) == 0);
  CPU_ZERO(&use);
  int m = 0;
  for (int c = 0; c < CPU_SETSIZE && m < 2; c++)
    if (CPU_ISSET(c, &have)) {
      CPU_SET(c, &use);
      m++;
    }
  ASSERT(sched_setaffinity(0, sizeof use, &use) == 0);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
  for (int n = m; n <= m + 1; n++) {
    char nstr[16];
    snprintf(nstr, sizeof nstr, "%d", n);
    char *argv[] = {LOOMRUN, "-n", nstr, "--timeout", "60", "--bind", "cpu", PERF("all_reduce_perf"), "-b", "8", "-e",
                    "8", "-n", "2", "-w", "1", NULL};
    int rc = harness_run_merged(argv, out, sizeof out);
    ASSERT_MSG(rc == 0, "%d ranks pinned on %d CPUs: loomrun exited with %d:\n%s", n, m, rc, out);
    /* m+1 ranks: rank m shares the first CPU with rank 0; the others
     * still have a CPU each, but the host counts as crowded for all. */
    int crowded = n == m ? 0 : 2, seen = occurrences(out, ": crowded (");
    int host = occurrences(out, n == m ? "no host is crowded" : "a host of this communicator is crowded");
    ASSERT_MSG(seen == crowded && host == n,
               "%d ranks pinned on %d CPUs: %d crowded (want %d), %d of %d with the host's verdict:\n%s", n, m, seen,
               crowded, host, n, out);
    int longer = occurrences(out, "yields 10000 us before it sleeps"), shorter = occurrences(out, "yields 50 us before");
    ASSERT_MSG(longer == crowded && shorter == n - crowded,
               "%d ranks pinned on %d CPUs: %d yield 10 ms (want %d), %d yield 50 us (want %d):\n%s", n, m, longer,
               crowded, shorter, n - crowded, out);
  }
  /* Crowded but free to move (two CPUs or more): a sleeping rank leaves
   * its CPU to the ranks the scheduler moves there. */
  if (m < 2)
    return 0;
  char nstr[16];
  snprintf(nstr, sizeof nstr, "%d", m + 1);
  char *argv[] = {LOOMRUN, "-n", nstr, "--timeout", "60", "--bind", "none", PERF("all_reduce_perf"), "-b", "8", "-e",
                  "8", "-n", "2", "-w", "1", NULL};
  int rc = harness_run_merged(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "%d ranks unpinned on %d CPUs: loomrun exited with %d:\n%s", m + 1, m, rc, out);
  int crowded = occurrences(out, ": crowded ("), shorter = occurrences(out, "yields 50 us before");
  ASSERT_MSG(crowded == m + 1 && shorter == m + 1,
             "%d ranks unpinned on %d CPUs: %d crowded, %d yield 50 us (want %d each):\n%s", m + 1, m, crowded,
             shorter, m + 1, out);
  /* LOOM_YIELD_US decides for every rank. */
  setenv("LOOM_YIELD_US", "700", 1);
  rc = harness_run_merged(argv, out, sizeof out);
  unsetenv("LOOM_YIELD_US");
  ASSERT_MSG(rc == 0 && occurrences(out, "yields 700 us before") == m + 1,
             "LOOM_YIELD_US=700, %d ranks: loomrun exited with %d:\n%s", m + 1, rc, out);
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
  /* The channel count and why: NVLink's on the DGXs, the NICs' on a PCIe
   * box, as a communicator of their GPUs would take. */
  static const struct {
    const char *file, *count, *why;
  } fixtures[] = {
      {"dgx_h100.xml", "8 ranks on 1 host (8 per host, on GPUs), 24 channels:",
       "channels: 24 (NVLink: 18 links x 20.6 GB/s = 370.8 GB/s, at 15 GB/s per channel)"},
      {"dgx_a100.xml", "8 ranks on 1 host (8 per host, on GPUs), 16 channels:", "channels: 16 (NVLink: 12 links"},
      {"pcie_4gpu.xml", "8 ranks on 1 host (8 per host, on GPUs), 2 channels:", "channels: 2 (one per NIC"},
  };
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
    char file[512];
    snprintf(file, sizeof file, "%s/%s", LOOM_TOPO_FIXTURES, fixtures[i].file);
    char *argv[] = {LOOM_TOOLS_DIR "/loom-info", "--topo", file, "--ranks", "8", NULL};
    rc = harness_run(argv, out, sizeof out);
    ASSERT_MSG(rc == 0, "loom-info --topo %s exited with %d", fixtures[i].file, rc);
    ASSERT_MSG(strstr(out, fixtures[i].count) && strstr(out, fixtures[i].why), "%s: no \"%s\" and \"%s\" in:\n%s",
               fixtures[i].file, fixtures[i].count, fixtures[i].why, out);
  }
  ASSERT(strstr(out, "channel  1 ring") && !strstr(out, "channel  2 ring"));
  char *bad[] = {LOOM_TOOLS_DIR "/loom-info", "--topo", "/nonexistent.xml", NULL};
  ASSERT(harness_run(bad, out, sizeof out) != 0);
  return 0;
}

/* A text file of the source tree, whole, into buf (NUL-terminated). */
static void read_source_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  ASSERT_MSG(f, "cannot open %s", path);
  size_t n = fread(buf, 1, len, f);
  fclose(f);
  ASSERT_MSG(n < len, "%s is larger than the %zu bytes read", path, len - 1);
  buf[n] = 0;
}

/* The parameter table of docs/environment.md is what the library reads:
 * every row that loom-info --params prints appears in it word for word. */
TEST_IMPL(tools_params_documented) {
  char *argv[] = {LOOM_TOOLS_DIR "/loom-info", "--params", NULL};
  ASSERT(harness_run(argv, out, sizeof out) == 0);
  static char doc[1 << 18];
  read_source_file(LOOM_SOURCE_DIR "/docs/environment.md", doc, sizeof doc);
  int rows = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), rows++)
    ASSERT_MSG(strstr(doc, line), "docs/environment.md lacks the row %s (paste loom-info --params into it)", line);
  ASSERT(rows >= 20);
  return 0;
}

/* GitHub's anchor for a heading's text: lower case, letters, digits, '-'
 * and '_' kept, blanks made '-', the rest dropped. */
static void heading_anchor(const char *text, size_t len, char *anchor, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < len && k + 1 < cap; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c >= 'A' && c <= 'Z')
      anchor[k++] = (char)(c - 'A' + 'a');
    else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c >= 0x80)
      anchor[k++] = (char)c;
    else if (c == ' ')
      anchor[k++] = '-';
  }
  anchor[k] = 0;
}

/* Whether the Markdown text has a heading (outside fenced code) whose
 * anchor is `anchor`. */
static int has_anchor(const char *text, const char *anchor) {
  int fenced = 0;
  for (const char *line = text; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len >= 3 && strncmp(line, "```", 3) == 0)
      fenced = !fenced;
    else if (!fenced && line[0] == '#') {
      size_t h = strspn(line, "#");
      if (h < len && line[h] == ' ') {
        char a[256];
        heading_anchor(line + h + 1, len - h - 1, a, sizeof a);
        if (strcmp(a, anchor) == 0)
          return 1;
      }
    }
    line += len + (end != NULL);
  }
  return 0;
}

/* The README is the front page and docs/ holds the reference: every
 * relative link in them names a file of the source tree that exists (and
 * a heading of it that exists), the README links nothing outside the
 * tree, and the test command it gives is the one CI (.ci/run) runs. */
/* Paths of the tree named in code spans (`src/transport/net/`,
 * `tests/unit_*.c`): each must name what exists (a glob, at least one
 * thing). Counts the bad ones, each said on stderr. */
static int bad_code_paths(const char *page, const char *text) {
  static const char *const tops[] = {"src/", "tests/", "tools/", "perf/", ".ci/", "docs/", "include/",
                                     "bindings/", "examples/", "cmake/"};
  int bad = 0;
  for (const char *at = strchr(text, '`'); at; at = strchr(at + 1, '`')) {
    const char *start = at + 1, *end = strchr(start, '`');
    if (!end)
      break;
    size_t len = (size_t)(end - start);
    int top = 0;
    for (size_t i = 0; i < sizeof tops / sizeof tops[0] && !top; i++)
      top = strncmp(start, tops[i], strlen(tops[i])) == 0;
    if (top && len < 200 && !memchr(start, ' ', len) && !memchr(start, '\n', len)) {
      char rel[256], path[PATH_MAX];
      snprintf(rel, sizeof rel, "%.*s", (int)len, start);
      rel[strcspn(rel, ":")] = '\0'; /* file:line */
      snprintf(path, sizeof path, "%s/%s", LOOM_SOURCE_DIR, rel);
      glob_t g;
      int found = glob(path, GLOB_BRACE | GLOB_NOSORT, NULL, &g) == 0 && g.gl_pathc > 0;
      if (found)
        globfree(&g);
      else {
        fprintf(stderr, "%s: `%s` names nothing in the source tree\n", page, rel);
        bad++;
      }
    }
    at = end;
  }
  return bad;
}

TEST_IMPL(docs_links) {
  char root[PATH_MAX];
  ASSERT(realpath(LOOM_SOURCE_DIR, root));
  glob_t pages;
  ASSERT(glob(LOOM_SOURCE_DIR "/docs/*.md", 0, NULL, &pages) == 0);
  static char text[1 << 18], target_text[1 << 18];
  int bad = 0, links = 0;
  for (size_t p = 0; p <= pages.gl_pathc; p++) {
    const char *page = p < pages.gl_pathc ? pages.gl_pathv[p] : LOOM_SOURCE_DIR "/README.md";
    int readme = p == pages.gl_pathc;
    read_source_file(page, text, sizeof text);
    bad += bad_code_paths(page, text);
    if (readme && strstr(text, "://")) {
      fprintf(stderr, "README.md: a link outside the repository: ...%.60s\n", strstr(text, "://"));
      bad++;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", page);
    *strrchr(dir, '/') = 0;
    for (const char *at = strstr(text, "]("); at; at = strstr(at + 2, "](")) {
      const char *start = at + 2;
      size_t len = strcspn(start, ") \n");
      char link[PATH_MAX];
      snprintf(link, sizeof link, "%.*s", (int)len, start);
      if (strstr(link, "://") || strncmp(link, "mailto:", 7) == 0)
        continue; /* the README has none: checked above */
      links++;
      char *hash = strchr(link, '#');
      const char *anchor = hash ? hash + 1 : NULL;
      if (hash)
        *hash = 0;
      char path[2 * PATH_MAX], real[PATH_MAX];
      if (link[0] == 0)
        snprintf(path, sizeof path, "%s", page);
      else
        snprintf(path, sizeof path, "%s/%s", dir, link);
      if (link[0] == '/' || !realpath(path, real) ||
          strncmp(real, root, strlen(root)) != 0 || (real[strlen(root)] != '/' && real[strlen(root)] != 0)) {
        fprintf(stderr, "%s: the link (%.*s) names no file of the source tree\n", page, (int)len, start);
        bad++;
        continue;
      }
      size_t rl = strlen(real);
      if (anchor && rl > 3 && strcmp(real + rl - 3, ".md") == 0) {
        read_source_file(real, target_text, sizeof target_text);
        if (!has_anchor(target_text, anchor)) {
          fprintf(stderr, "%s: the link (%.*s) names no heading of %s\n", page, (int)len, start, real);
          bad++;
        }
      }
    }
  }
  globfree(&pages);
  static const char *const others[] = {LOOM_SOURCE_DIR "/perf/README.md", LOOM_SOURCE_DIR "/examples/README.md",
                                       LOOM_SOURCE_DIR "/tests/verbs_double/README.md"};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    read_source_file(others[i], text, sizeof text);
    bad += bad_code_paths(others[i], text);
  }
  /* .ci/run runs the line after its comment "# The README's test command.",
   * which the README gives as an indented code line of its own. */
  read_source_file(LOOM_SOURCE_DIR "/.ci/run", target_text, sizeof target_text);
  const char *mark = "# The README's test command.\n";
  char *cmd = strstr(target_text, mark);
  ASSERT_MSG(cmd, ".ci/run lacks the line %s", mark);
  cmd += strlen(mark);
  cmd[strcspn(cmd, "\n")] = 0;
  char line[1024];
  snprintf(line, sizeof line, "\n    %s\n", cmd);
  read_source_file(LOOM_SOURCE_DIR "/README.md", text, sizeof text);
  ASSERT_MSG(strstr(text, line), "README.md lacks .ci/run's test command: %s", cmd);
  ASSERT(links >= 20);
  ASSERT_MSG(bad == 0, "%d broken link(s) or path(s) in the README files and docs/ (listed above)", bad);
  return 0;
}

/* perf/compare_host.sh in its quick form, with Loom in windows and the
 * 2-rank floor alone (the peers need packages CI does not install) and
 * one round: its rows, parsing and tables keep working, and quick.csv
 * holds every row's figure. */
TEST_IMPL(perf_compare_host_quick) {
  if (access("/usr/bin/python3", X_OK) != 0)
    SKIP("no /usr/bin/python3: the comparison's tables cannot be made here");
  char outdir[] = "/tmp/loom-compare-XXXXXX";
  ASSERT(mkdtemp(outdir));
  char *argv[] = {"/bin/bash", LOOM_SOURCE_DIR "/perf/compare_host.sh", "--quick", "--rounds", "1",
                  "--peers", "loom_win floor_exchange", "--no-build", "--build", LOOM_BUILD_DIR, "--out", outdir,
                  NULL};
  int rc = harness_run(argv, out, sizeof out);
  char path[PATH_MAX], csv[8192] = "";
  snprintf(path, sizeof path, "%s/quick.csv", outdir);
  FILE *f = fopen(path, "r");
  if (f) {
    csv[fread(csv, 1, sizeof csv - 1, f)] = '\0';
    fclose(f);
  }
  harness_remove_dir(outdir);
  ASSERT_MSG(rc == 0, "compare_host.sh exited with %d:\n%s", rc, out);
  ASSERT_MSG(strstr(out, "== shm rows") && strstr(out, "8r 64 MiB") && strstr(out, "bound B/m") &&
                 !strstr(out, "== socket rows"),
             "unexpected output:\n%s", out);
  /* The first and last shm rows, out of place and in place, of Loom
   * with its buffers in windows (the plain buffers' runs differ only by
   * -R 2's absence, and would double the test's time). */
  ASSERT_MSG(strstr(csv, "row,lib,round,time_us\n") && strstr(csv, "shm-2r-8,loom_win,1,") &&
                 strstr(csv, "shm-8r-64M,loom_win_inplace,1,") && strstr(out, "Loom shm -R 2, in place:"),
             "unexpected quick.csv:\n%s", csv);
  /* The 2-rank rows' floor, on those rows alone, and its lines. */
  ASSERT_MSG(strstr(csv, "shm-2r-8,floor_exchange,1,") && strstr(csv, "shm-2r-64M,floor_exchange,1,") &&
                 !strstr(csv, "shm-4r-8,floor_exchange") && strstr(out, "2-rank floor, shm_floor exchange") &&
                 strstr(out, "  64 MiB: ") && strstr(out, "% of the memcpy bound B/m"),
             "no 2-rank floor in the quick table:\n%s\n%s", out, csv);
  return 0;
}

/* perf/crossover.py on a few small sizes: it runs each forced algorithm
 * and the tuner's choice, and reads back which algorithm ran. */
TEST_IMPL(perf_crossover_quick) {
  if (access("/usr/bin/python3", X_OK) != 0)
    SKIP("no /usr/bin/python3: the crossover table cannot be made here");
  char *argv[] = {"/usr/bin/python3", LOOM_SOURCE_DIR "/perf/crossover.py", "--ranks", "2", "--min", "8", "--max",
                  "64", "--rounds", "1", "--iters", "5", "--warmup", "1", "--build", LOOM_BUILD_DIR, NULL};
  int rc = harness_run(argv, out, sizeof out);
  ASSERT_MSG(rc == 0, "crossover.py exited with %d:\n%s", rc, out);
  /* Flat is the tuner's choice for 8 B on 2 ranks of one host, and it ran. */
  ASSERT_MSG(strstr(out, "== 2 ranks") && strstr(out, "tuner:    flat from 8"), "unexpected output:\n%s", out);
  return 0;
}
