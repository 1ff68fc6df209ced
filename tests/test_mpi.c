/*
 * The MPI benchmarks (*_perf_mpi) under Open MPI's mpirun, as on a
 * cluster: on this host, across hosts emulated with network namespaces
 * (netns.h) that mpirun reaches through tools/netns-rsh instead of ssh,
 * and against a library that lies about its results.
 *
 * mpirun runs in the root namespace; its orted daemons run in the hosts'
 * namespaces and call back over the bridge, whose subnet the oob and btl
 * settings name. Host names are the hosts' addresses, which the agent maps
 * to their namespaces.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netns.h"
#include "test.h"

#ifdef LOOM_TEST_MPI
#define PERF(name) LOOM_PERF_DIR "/" name
#define AGENT LOOM_NETNS_RSH

static char out[1 << 20];

/* A growing argv. */
struct args {
  char *v[96];
  char store[4096];
  int n;
  size_t used;
};

static void add(struct args *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = a->store + a->used;
  int len = vsnprintf(s, sizeof a->store - a->used, fmt, ap);
  va_end(ap);
  ASSERT(len >= 0 && a->used + (size_t)len + 1 <= sizeof a->store && a->n + 2 <= (int)(sizeof a->v / sizeof a->v[0]));
  a->used += (size_t)len + 1;
  a->v[a->n++] = s;
  a->v[a->n] = NULL;
}

/* Adds each space-separated word of words (for options, not paths). */
static void add_words(struct args *a, const char *words) {
  for (const char *w = words + strspn(words, " "); *w; w += strspn(w, " ")) {
    size_t len = strcspn(w, " ");
    add(a, "%.*s", (int)len, w);
    w += len;
  }
}

/* Runs a: its exit status, its stdout and stderr in out[] and on our
 * stdout. */
static int mpirun(struct args *a) { return harness_run_merged(a->v, out, sizeof out); }

/* mpirun and the options every run here takes: a bound on the whole job,
 * no core binding (a rank's threads and Loom's spinning follow the
 * affinity it is given), MPI's own traffic over TCP. */
static void mpirun_args(struct args *a) {
  add(a, "%s", LOOM_MPIEXEC);
  add_words(a, "--timeout 60 --bind-to none --mca btl tcp,self");
  /* A stuck collective fails within the job's bound, not after 600 s. */
  add_words(a, "-x LOOM_TIMEOUT=30");
}

/* Starts a with mpirun and the options above: 0, or a skip where Open
 * MPI's mpirun cannot run. */
static int mpi_start(struct args *a) {
  if (access(LOOM_MPIEXEC, X_OK) != 0)
    SKIP("%s (found at configure time) is not there any more", LOOM_MPIEXEC);
  char *argv[] = {LOOM_MPIEXEC, "--version", NULL};
  if (harness_run_merged(argv, out, sizeof out) != 0 || (!strstr(out, "Open MPI") && !strstr(out, "OpenRTE")))
    SKIP("%s is not Open MPI's mpirun; these tests pass Open MPI's options", LOOM_MPIEXEC);
  /* mpirun refuses root without them; CI runs as root. */
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  *a = (struct args){0};
  mpirun_args(a);
  return 0;
}

/* Ranks on this host only. */
static void localhost_args(struct args *a) { add_words(a, "--oversubscribe --mca btl_tcp_if_include lo"); }

/* The benchmark's closing lines say it ran nranks ranks, checked, clean. */
static int clean_run(int rc, const char *shape) {
  if (rc != 0) {
    fprintf(stderr, "mpirun exited with %d\n", rc);
    return 1;
  }
  if (!strstr(out, shape)) {
    fprintf(stderr, "no \"%s\" in the output\n", shape);
    return 1;
  }
  if (!strstr(out, "# Out of bounds values : 0 OK") || !strstr(out, "# Avg bus bandwidth")) {
    fprintf(stderr, "no clean check line or no closing bandwidth line\n");
    return 1;
  }
  return 0;
}

/* Every "[rank] NCCL INFO NET/Socket: using [i]lmeth0:ADDR ..." log line (one
 * per process) names the address of the host its rank was meant to be on,
 * rank r on host r / ranks_per_host, and every host has one. That ranks
 * reach other hosts' over net and their neighbours over shm shows Loom
 * saw them as separate hosts. */
static int ranks_on_hosts(const struct netns_hosts *h, int nranks, int ranks_per_host) {
  int seen[NETNS_MAX] = {0};
  for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[512];
    if (len >= sizeof buf)
      continue;
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *tag = strstr(buf, "] NCCL INFO NET/Socket: using ");
    if (!tag)
      continue;
    char *open = tag;
    while (open > buf && *open != '[')
      open--;
    int rank = atoi(open + 1);
    if (rank < 0 || rank >= nranks) {
      fprintf(stderr, "a log line of rank %d: %s\n", rank, buf);
      return 1;
    }
    char want[80];
    snprintf(want, sizeof want, "%s:%s", NETNS_IFNAME, h->addr[rank / ranks_per_host]);
    /* The address must end there: 10.0.0.1 is not 10.0.0.12. */
    const char *at = strstr(tag, want);
    char after = at ? at[strlen(want)] : '\0';
    if (!at || (after >= '0' && after <= '9') || after == '.') {
      fprintf(stderr, "rank %d should be on host %d (%s), but logs: %s\n", rank, rank / ranks_per_host,
              h->addr[rank / ranks_per_host], buf);
      return 1;
    }
    seen[rank / ranks_per_host] = 1;
  }
  for (int i = 0; i < h->n; i++)
    if (!seen[i]) {
      fprintf(stderr, "no NET/Socket log line from a rank on host %d, %s (NCCL_DEBUG=INFO)\n", i, h->addr[i]);
      return 1;
    }
  /* netns-rsh names each host's UTS namespace after its network
   * namespace, so the benchmark's own rank lines say where each rank is. */
  for (int r = 0; r < nranks; r++) {
    char head[32], want[64];
    snprintf(head, sizeof head, "#  Rank %2d Group", r);
    snprintf(want, sizeof want, " on %s device", h->ns[r / ranks_per_host]);
    char *line = strstr(out, head), *end = line ? strchr(line, '\n') : NULL;
    char *at = line ? strstr(line, want) : NULL;
    if (!line || !at || (end && at > end)) {
      fprintf(stderr, "no line \"%s ... %s\" in the output\n", head, want);
      return 1;
    }
  }
  if (!strstr(out, " via net") || !strstr(out, " via shm")) {
    fprintf(stderr, "expected connections via net (between hosts) and via shm (within one)\n");
    return 1;
  }
  return 0;
}

/* mpirun's options for the emulated hosts, on the bridge's subnet. */
static void netns_args(struct args *a, const struct netns_hosts *h) {
  char subnet[48];
  snprintf(subnet, sizeof subnet, "%s", h->root_addr);
  *strrchr(subnet, '.') = '\0';
  add_words(a, "--mca plm_rsh_agent");
  add(a, "%s", AGENT);
  add_words(a, "--mca plm_rsh_no_tree_spawn 1");
  add_words(a, "--mca oob_tcp_if_include");
  add(a, "%s.0/24", subnet);
  add_words(a, "--mca btl_tcp_if_include");
  add(a, "%s.0/24", subnet);
  add_words(a, "-x NCCL_SOCKET_IFNAME=" NETNS_IFNAME " -x NCCL_DEBUG=INFO");
}
#endif /* LOOM_TEST_MPI */

#ifndef LOOM_TEST_MPI
#define NO_MPI_SKIP()                                                                                          \
  SKIP("built without the MPI benchmarks (LOOM_WITH_MPI=OFF, or no MPI found at configure time: Debian's "    \
       "openmpi-bin libopenmpi-dev)")
TEST_IMPL(mpi_perf_localhost) { NO_MPI_SKIP(); }
TEST_IMPL(mpi_perf_verdict) { NO_MPI_SKIP(); }
TEST_IMPL(mpi_perf_two_hosts) { NO_MPI_SKIP(); }
TEST_IMPL(mpi_perf_three_hosts) { NO_MPI_SKIP(); }
#else

/* 2 processes x 2 threads on this host: the id from MPI_Bcast, the table
 * printed once. */
TEST_IMPL(mpi_perf_localhost) {
  struct args a;
  int rc = mpi_start(&a);
  if (rc)
    return rc;
  localhost_args(&a);
  add_words(&a, "-np 2");
  add(&a, "%s", PERF("all_reduce_perf_mpi"));
  add_words(&a, "-b 8 -e 1M -f 4 -c 1 -t 2");
  if (clean_run(mpirun(&a), "4 ranks as 2 processes x 2 threads"))
    return 1;
  ASSERT(strstr(out, "#  Rank  3 Group"));
  /* Once: rank 0 alone prints the table. */
  char *first = strstr(out, "# Collective test starting");
  ASSERT(first && !strstr(first + 1, "# Collective test starting"));
  return 0;
}

/* A library that gets rank 1's results wrong and reports 0 wrong elements
 * everywhere: the count each rank found itself reaches rank 0 through MPI,
 * which prints FAILED, and the job exits non-zero. */
TEST_IMPL(mpi_perf_verdict) {
  struct args a;
  int rc = mpi_start(&a);
  if (rc)
    return rc;
  localhost_args(&a);
  add(&a, "-x");
  add(&a, "LD_PRELOAD=%s", LOOM_MPI_LIAR);
  add_words(&a, "-np 2");
  add(&a, "%s", PERF("all_reduce_perf_mpi"));
  add_words(&a, "-b 1K -e 4K -f 2 -c 1 -n 2 -w 1");
  rc = mpirun(&a);
  ASSERT_MSG(rc != 0, "mpirun exited 0 although rank 1's results were wrong");
  ASSERT_MSG(strstr(out, "# Out of bounds values : ") && strstr(out, " FAILED"),
             "rank 0 did not report the failure");
  ASSERT_MSG(!strstr(out, "# Out of bounds values : 0 OK"), "rank 0 reported a clean run");
  /* Rank 1 saw it itself, so the shim did what it should. */
  ASSERT(strstr(out, "# rank 1: "));
  return 0;
}

/* 4 processes on 2 emulated hosts, 2 on each, named by address. */
TEST_IMPL(mpi_perf_two_hosts) {
  struct args a;
  int rc = mpi_start(&a);
  if (rc)
    return rc;
  struct netns_hosts h;
  if ((rc = netns_hosts_up(&h, 2, 0)) != 0)
    return rc;
  netns_args(&a, &h);
  add_words(&a, "-np 4 --host");
  add(&a, "%s:2,%s:2", h.addr[0], h.addr[1]);
  add(&a, "%s", PERF("all_reduce_perf_mpi"));
  add_words(&a, "-b 8 -e 1M -f 4 -c 1");
  rc = clean_run(mpirun(&a), "4 ranks as 4 processes x 1 thread") || ranks_on_hosts(&h, 4, 2);
  netns_hosts_down(&h);
  return rc;
}

/* 3 emulated hosts from a hostfile, one process of 2 threads on each, and
 * another collective. */
TEST_IMPL(mpi_perf_three_hosts) {
  struct args a;
  int rc = mpi_start(&a);
  if (rc)
    return rc;
  struct netns_hosts h;
  if ((rc = netns_hosts_up(&h, 3, 0)) != 0)
    return rc;
  char hostfile[] = "/tmp/loom-mpi-hosts-XXXXXX";
  int fd = mkstemp(hostfile);
  if (fd < 0) {
    perror(hostfile);
    netns_hosts_down(&h);
    return 1;
  }
  FILE *f = fdopen(fd, "w");
  for (int i = 0; i < 3; i++)
    fprintf(f, "%s slots=1\n", h.addr[i]);
  fclose(f);
  netns_args(&a, &h);
  add_words(&a, "-np 3 --hostfile");
  add(&a, "%s", hostfile);
  add(&a, "%s", PERF("all_gather_perf_mpi"));
  add_words(&a, "-b 48 -e 768K -f 8 -c 1 -t 2");
  rc = clean_run(mpirun(&a), "6 ranks as 3 processes x 2 threads") || ranks_on_hosts(&h, 6, 2);
  unlink(hostfile);
  netns_hosts_down(&h);
  return rc;
}
#endif
