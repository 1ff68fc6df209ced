/*
 * The topology and tuning environment seen from communicators: the XML a
 * job dumps is one it can load, a bad file stops init with its name and
 * line, the tuner logs each choice once per size class, and ranks that
 * disagree on NCCL_ALGO are refused. Each test sets the environment before
 * its first Loom call (the forked ranks inherit it; logging and the
 * topology are read once per process).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

static char dir[] = "/tmp/loom-topo-env-XXXXXX";

static void remove_dir(void) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  for (struct dirent *e; (e = readdir(d));) {
    char p[512];
    if (e->d_name[0] == '.')
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

static int allreduce_checked(int rank, int nranks, ncclComm_t comm, size_t cnt) {
  float *b = malloc(cnt * sizeof *b);
  RASSERT(b, "out of memory");
  for (size_t i = 0; i < cnt; i++)
    b[i] = (float)(rank + 1);
  RCHECK(comm, ncclAllReduce(b, b, cnt, ncclFloat, ncclSum, comm, NULL));
  float want = (float)(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < cnt; i++)
    RASSERT(b[i] == want, "element %zu is %g, expected %g", i, b[i], want);
  free(b);
  return 0;
}

static int rank_two_sizes(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  for (int k = 0; k < 3; k++) {
    if (allreduce_checked(rank, nranks, comm, 8) || allreduce_checked(rank, nranks, comm, 1 << 18))
      return 1;
  }
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* What NCCL_TOPO_DUMP_FILE writes, NCCL_TOPO_FILE reads back, and a job
 * runs on it. */
TEST_IMPL(topo_env_dump_then_load) {
  ASSERT(mkdtemp(dir));
  atexit(remove_dir);
  char dump[600], log[600];
  snprintf(dump, sizeof dump, "%s/this_host.xml", dir);
  snprintf(log, sizeof log, "%s/log.%%p", dir);
  setenv("NCCL_TOPO_DUMP_FILE", dump, 1);
  ASSERT(run_ranks(1, rank_two_sizes, NULL) == 0);
  char *xml = slurp(dump);
  ASSERT_MSG(xml && strstr(xml, "<system") && strstr(xml, "<cpu"), "no topology in %s", dump);
  unsetenv("NCCL_TOPO_DUMP_FILE");
  setenv("NCCL_TOPO_FILE", dump, 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "GRAPH", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  ASSERT(run_ranks(3, rank_two_sizes, NULL) == 0);
  int loaded = 0;
  DIR *d = opendir(dir);
  ASSERT(d);
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, "log.", 4) != 0)
      continue;
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    char *text = slurp(p);
    loaded += text && strstr(text, "topology loaded from NCCL_TOPO_FILE=") != NULL;
  }
  closedir(d);
  ASSERT_MSG(loaded == 3, "%d of 3 ranks logged that they loaded %s", loaded, dump);
  return 0;
}

static int rank_init_fails(int rank, int nranks, ncclUniqueId id, void *arg) {
  const char *const *kw = arg;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  RASSERT(r != ncclSuccess && comm == NULL, "init succeeded");
  const char *msg = ncclGetLastError(NULL);
  for (; *kw; kw++)
    RASSERT(strstr(msg, *kw), "the error does not mention \"%s\": %s", *kw, msg);
  return 0;
}

/* A file that is not a topology stops init with its name and the line. */
TEST_IMPL(topo_env_bad_file) {
  ASSERT(mkdtemp(dir));
  atexit(remove_dir);
  char bad[600];
  snprintf(bad, sizeof bad, "%s/bad.xml", dir);
  FILE *f = fopen(bad, "w");
  ASSERT(f);
  fputs("<?xml version=\"1.0\"?>\n<system version=\"1\">\n  <cpu numaid=\"zero\"/>\n</system>\n", f);
  fclose(f);
  setenv("NCCL_TOPO_FILE", bad, 1);
  const char *kw[] = {"NCCL_TOPO_FILE", "bad.xml", "3", "numaid", NULL};
  ASSERT(run_ranks(2, rank_init_fails, (void *)kw) == 0);
  setenv("NCCL_TOPO_FILE", "/nonexistent/topo.xml", 1);
  const char *kw2[] = {"/nonexistent/topo.xml", NULL};
  ASSERT(run_ranks(2, rank_init_fails, (void *)kw2) == 0);
  return 0;
}

/* NCCL_DEBUG=INFO with TUNING: one line per collective and size class
 * per rank, however often the size is called, naming the choice. */
TEST_IMPL(topo_env_tuning_log) {
  ASSERT(mkdtemp(dir));
  atexit(remove_dir);
  char log[600];
  snprintf(log, sizeof log, "%s/log.%%p", dir);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  setenv("NCCL_ALGO", "allreduce:ring,recursivedoubling", 1);
  ASSERT(run_ranks(2, rank_two_sizes, NULL) == 0);
  int files = 0;
  DIR *d = opendir(dir);
  ASSERT(d);
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, "log.", 4) != 0)
      continue;
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    char *text = slurp(p);
    ASSERT(text);
    files++;
    /* 8 floats are 32 bytes, 2^18 floats 1 MiB. */
    ASSERT_MSG(count(text, "AllReduce of 32 bytes (size class 2^5): RecursiveDoubling") == 1, "%s:\n%s", p, text);
    ASSERT_MSG(count(text, "(size class 2^5)") == 1 && count(text, "(size class 2^20)") == 1, "%s:\n%s", p, text);
    ASSERT_MSG(count(text, "AllReduce of 1048576 bytes (size class 2^20): Ring") == 1, "%s:\n%s", p, text);
    ASSERT_MSG(!strstr(text, ": Tree,"), "%s: Tree chosen although NCCL_ALGO excludes it:\n%s", p, text);
  }
  closedir(d);
  ASSERT_MSG(files == 2, "%d log files for 2 ranks", files);
  return 0;
}

static int rank_algo_differs(int rank, int nranks, ncclUniqueId id, void *arg) {
  setenv("NCCL_ALGO", rank == 0 ? "Ring" : "Tree", 1);
  const char *kw[] = {"NCCL_ALGO", "rank 0", "rank 1", NULL};
  return rank_init_fails(rank, nranks, id, (void *)kw);
}

/* Ranks that would tune differently could call different algorithms and
 * wait on each other forever: init refuses them, on every rank. */
TEST_IMPL(topo_env_algo_differs) {
  ASSERT(run_ranks(2, rank_algo_differs, NULL) == 0);
  return 0;
}
