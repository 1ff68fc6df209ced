/*
 * The socket transport between emulated hosts (netns.h): three hosts on a
 * bridge, one rank each, so every connection is TCP over the hosts' veth
 * interfaces, through the whole collective matrix: over IPv4 and IPv6,
 * with NCCL's default helper threads and sockets and with several of each.
 * Each rank checks from its log that the plugin chose the interface it
 * should, said why, and said it once. Then a rate-limited link: a large
 * transfer's bandwidth follows the limit, with one socket or several.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "netns.h"
#include "test.h"

static struct netns_hosts net;

static int enter_host(int rank, void *arg) { return netns_enter(&net, rank % net.n); }

struct hosts_cfg {
  int v6;
  const char *ifname;            /* NULL: the default choice */
  const char *nthreads, *nspt;   /* NULL: NCCL's defaults */
  const char *min_task;
  const char *why;               /* the reason the log must give */
  const char *shape;             /* the threads x sockets line the log must have */
};

static char log_pattern[128];

/* What the log says of helper threads when nothing is set: none on a
 * process with fewer than 4 CPUs (net_socket.c), else NCCL's 1 x 1. */
static const char *default_shape(void) {
  cpu_set_t cpus;
  int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return n < 4 ? "no helper threads (default where the process may run on fewer than 4 CPUs)"
               : "1 helper thread(s) x 1 socket(s) per connection";
}

static void set_or_unset(const char *name, const char *v) {
  if (v)
    setenv(name, v, 1);
  else
    unsetenv(name);
}

/* This rank's log (NCCL_DEBUG_FILE with %p): one line naming the chosen
 * interface, its address family and the reason, and the shape. */
static int check_log(int rank, const struct hosts_cfg *cfg) {
  char path[160], line[1024];
  snprintf(path, sizeof path, log_pattern, (int)getpid());
  FILE *f = fopen(path, "r");
  RASSERT(f != NULL, "rank %d: no log at %s", rank, path);
  int using = 0, shape = 0;
  char want[160];
  snprintf(want, sizeof want, "NET/Socket: using [0]%s:%s", NETNS_IFNAME, cfg->v6 ? "[fd77:" : "10.");
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "NET/Socket: using")) {
      using++;
      RASSERT(strstr(line, want) && strstr(line, cfg->why), "rank %d: the log says \"%s\"; expected \"%s\" and (%s)",
              rank, line, want, cfg->why);
    }
    if (strstr(line, cfg->shape))
      shape++;
  }
  fclose(f);
  unlink(path);
  RASSERT(using == 1, "rank %d: the interface choice was logged %d times", rank, using);
  RASSERT(shape >= 1, "rank %d: the log never says \"%s\"", rank, cfg->shape);
  return 0;
}

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct hosts_cfg *cfg = arg;
  char root[96];
  RCHECK(NULL, loomUniqueIdRootAddress(&id, root, sizeof root));
  RASSERT(cfg->v6 ? strncmp(root, "[fd77:", 6) == 0 : strncmp(root, "10.", 3) == 0,
          "the bootstrap root is at %s", root);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  for (int p = 0; p < n; p++) {
    const char *tr;
    if (p == rank)
      continue;
    RCHECK(comm, loomCommPeerTransport(comm, p, &tr));
    RASSERT(strcmp(tr, "net/socket") == 0, "rank %d reaches rank %d over %s", rank, p, tr);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  if (rank == 0)
    printf("%d hosts over IPv%d, %s: %d calls checked, root at %s\n", n, cfg->v6 ? 6 : 4, cfg->shape, calls, root);
  return check_log(rank, cfg);
}

static int hosts_run(const struct hosts_cfg *cfg) {
  int rc = netns_hosts_up(&net, 3, cfg->v6 ? NETNS_IPV6 : 0);
  if (rc)
    return rc;
  set_or_unset("NCCL_SOCKET_IFNAME", cfg->ifname);
  set_or_unset("NCCL_SOCKET_FAMILY", cfg->v6 ? "AF_INET6" : NULL);
  set_or_unset("NCCL_SOCKET_NTHREADS", cfg->nthreads);
  set_or_unset("NCCL_NSOCKS_PERTHREAD", cfg->nspt);
  set_or_unset("NCCL_SOCKET_MIN_TASKSIZE", cfg->min_task);
  snprintf(log_pattern, sizeof log_pattern, "/tmp/loom-sockhosts-%d-%%d.log", (int)getpid());
  char file[160];
  snprintf(file, sizeof file, "/tmp/loom-sockhosts-%d-%%p.log", (int)getpid());
  setenv("NCCL_DEBUG_FILE", file, 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "NET", 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(3, matrix_rank, (void *)cfg);
  netns_hosts_down(&net);
  return rc;
}

/* Nothing set: the hosts' one non-loopback interface, and the default
 * helpers. */
TEST_IMPL(socket_hosts_ipv4) {
  struct hosts_cfg cfg = {.why = "(default: first up non-loopback, non-docker interface)", .shape = default_shape()};
  return hosts_run(&cfg);
}

/* Four sockets per connection, and a small split threshold so that the
 * matrix's odd sizes are cut in odd places. */
TEST_IMPL(socket_hosts_ipv4_threads) {
  struct hosts_cfg cfg = {.ifname = NETNS_IFNAME,
                          .nthreads = "2",
                          .nspt = "2",
                          .min_task = "1000",
                          .why = "(NCCL_SOCKET_IFNAME=" NETNS_IFNAME ")",
                          .shape = "2 helper thread(s) x 2 socket(s) per connection"};
  return hosts_run(&cfg);
}

TEST_IMPL(socket_hosts_ipv6) {
  struct hosts_cfg cfg = {.v6 = 1,
                          .why = "(default: first up non-loopback, non-docker interface, NCCL_SOCKET_FAMILY=AF_INET6)",
                          .shape = default_shape()};
  return hosts_run(&cfg);
}

TEST_IMPL(socket_hosts_ipv6_threads) {
  struct hosts_cfg cfg = {.v6 = 1,
                          .ifname = "=" NETNS_IFNAME,
                          .nthreads = "2",
                          .nspt = "2",
                          .why = "(NCCL_SOCKET_IFNAME==" NETNS_IFNAME ", NCCL_SOCKET_FAMILY=AF_INET6)",
                          .shape = "2 helper thread(s) x 2 socket(s) per connection"};
  return hosts_run(&cfg);
}

/* A link shaped to RATE_MBIT: rank 0 on the shaped host sends BYTES to
 * rank 1, which times the transfer from a barrier. The rate is a tenth of
 * what veth does on a small VM, so the limit, not the machine, sets it;
 * the band is loose because TCP's headers take ~4% and the start of a
 * transfer, slow start included, is inside the timing. */
enum { RATE_MBIT = 200, BYTES = 48 << 20 };

static int rate_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  char *buf = calloc(1, BYTES);
  RASSERT(buf, "out of memory");
  for (size_t i = 0; rank == 0 && i < BYTES; i += 4096)
    buf[i] = (char)(i >> 12);
  /* The connections first, so that the timing is the data's alone. */
  float one = 1;
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, rank == 0 ? ncclSend(buf, 1024, ncclChar, 1, comm, NULL) : ncclRecv(buf, 1024, ncclChar, 0, comm, NULL));
  RCHECK(comm, ncclGroupEnd());
  RCHECK(comm, ncclAllReduce(&one, &one, 1, ncclFloat, ncclSum, comm, NULL));
  double t0 = now_s();
  RCHECK(comm, rank == 0 ? ncclSend(buf, BYTES, ncclChar, 1, comm, NULL) : ncclRecv(buf, BYTES, ncclChar, 0, comm, NULL));
  double s = now_s() - t0;
  if (rank == 1) {
    for (size_t i = 0; i < BYTES; i += 4096)
      RASSERT(buf[i] == (char)(i >> 12), "byte %zu arrived wrong", i);
    double mbit = BYTES * 8.0 / s / 1e6;
    printf("%s: %d MiB in %.2f s through a %d Mbit/s link: %.0f Mbit/s (%.2f of the limit)\n",
           getenv("NCCL_SOCKET_NTHREADS") ? "2 threads x 2 sockets" : "defaults", BYTES >> 20, s, RATE_MBIT, mbit,
           mbit / RATE_MBIT);
    RASSERT(mbit >= 0.5 * RATE_MBIT && mbit <= 1.1 * RATE_MBIT,
            "%.0f Mbit/s through a link shaped to %d Mbit/s: the figure does not follow the limit", mbit, RATE_MBIT);
  }
  free(buf);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(socket_hosts_rate_limit) {
  int rc = netns_hosts_up(&net, 2, 0);
  if (rc)
    return rc;
  char cmd[160];
  snprintf(cmd, sizeof cmd, "tc qdisc add dev %s root tbf rate %dmbit burst 256kb latency 100ms", NETNS_IFNAME,
           RATE_MBIT);
  if (netns_exec(&net, 0, cmd) != 0) {
    netns_hosts_down(&net);
    SKIP("cannot shape the link here (tc qdisc add ... tbf failed)");
  }
  setenv("NCCL_SOCKET_IFNAME", NETNS_IFNAME, 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(2, rate_rank, NULL);
  if (rc == 0) {
    setenv("NCCL_SOCKET_NTHREADS", "2", 1);
    setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
    rc = run_ranks(2, rate_rank, NULL);
  }
  netns_hosts_down(&net);
  return rc;
}

/* A malformed NCCL_SOCKET_IFNAME stops init with the parser's sentence,
 * naming the variable, instead of matching something unexpected. */
TEST_IMPL(socket_ifname_malformed) {
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  setenv("NCCL_SOCKET_IFNAME", "lo eth0", 1);
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  const char *msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == ncclInvalidArgument && comm == NULL, "init returned %d: %s", (int)r, msg);
  ASSERT_MSG(strstr(msg, "NCCL_SOCKET_IFNAME=\"lo eth0\" is malformed") && strstr(msg, "separate names with commas"),
             "%s", msg);
  setenv("NCCL_SOCKET_IFNAME", "=lo,^docker", 1);
  r = ncclGetUniqueId(&id);
  msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == ncclInvalidArgument && strstr(msg, "NCCL_SOCKET_IFNAME=\"=lo,^docker\" is malformed: item 2"),
             "ncclGetUniqueId returned %d: %s", (int)r, msg);
  return 0;
}

/* Entries of a /proc/self directory, the directory's own descriptor
 * left out. */
static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return strcmp(dir, "/proc/self/fd") == 0 ? n - 1 : n;
}

/* Ranks on hosts of their own (NCCL_HOSTID) over loopback, 2 threads x 2
 * sockets. A communicator split from one that already moves data gets
 * connections, sockets and helpers of its own: destroying it joins every
 * helper and closes every socket, leaving the process as it was. When
 * the peer dies in the middle of large AllReduces, the survivor's call
 * fails within seconds, naming the rank, and its abort leaves nothing
 * behind either. */
static int threads_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int dies = arg != NULL;
  char host[32];
  snprintf(host, sizeof host, "sockhost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  enum { COUNT = 4 << 20 };
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  ncclComm_t parent, comm;
  RCHECK(NULL, ncclCommInitRank(&parent, n, id, rank));
  RCHECK(parent, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, parent, NULL));
  int fds = count_entries("/proc/self/fd"), tasks = count_entries("/proc/self/task");
  RCHECK(parent, ncclCommSplit(parent, 0, rank, &comm, NULL));
  ncclResult_t r = ncclSuccess;
  double t0 = 0;
  for (int it = 0; it < 8 && r == ncclSuccess; it++) {
    if (dies && rank == 1 && it == 3)
      _exit(0); /* gone in the middle, like a crash */
    t0 = now_s();
    r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  }
  if (dies) {
    const char *msg = ncclGetLastError(comm);
    fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, ncclGetErrorString(r), now_s() - t0, msg);
    RASSERT(r == ncclRemoteError || r == ncclSystemError, "rank 0 got %d after its peer died: %s", (int)r, msg);
    RASSERT(strstr(msg, "rank 1") != NULL, "the message should name rank 1: %s", msg);
    RASSERT(now_s() - t0 < 10, "took %.1f s", now_s() - t0);
    RCHECK(NULL, ncclCommAbort(comm));
  } else {
    RCHECK(comm, r);
    RCHECK(comm, ncclCommDestroy(comm));
  }
  free(buf);
  int fds_after = count_entries("/proc/self/fd"), tasks_after = count_entries("/proc/self/task");
  RASSERT(fds_after == fds, "rank %d: %d descriptors open after %s, %d before the split", rank, fds_after,
          dies ? "abort" : "destroy", fds);
  RASSERT(tasks_after == tasks, "rank %d: %d threads after %s, %d before the split", rank, tasks_after,
          dies ? "abort" : "destroy", tasks);
  if (dies)
    ncclCommAbort(parent);
  else
    RCHECK(parent, ncclCommDestroy(parent));
  return 0;
}

TEST_IMPL(socket_threads_teardown) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_SOCKET_NTHREADS", "2", 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
  if (run_ranks(2, threads_rank, NULL) != 0)
    return 1;
  return run_ranks(2, threads_rank, "dies");
}
