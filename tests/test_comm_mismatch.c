/*
 * Ranks that disagree about a call must be told so, quickly, with a
 * sentence that says which rank called what, instead of hanging or
 * corrupting data. And the debug log: NCCL_DEBUG_FILE and
 * NCCL_DEBUG_SUBSYS, read once per process, so each setting gets fresh
 * rank processes.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

/* ---- mismatched calls ---- */

enum { C_ALLREDUCE, C_BROADCAST, C_SEND, C_RECV };

struct call {
  int coll;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
};

struct mismatch {
  struct call c[2];
  /* Each rank's message must contain these (NULL-terminated). */
  const char *want[2][4];
  /* Results accepted besides ncclInvalidUsage, as bits (1 << result):
   * a rank that received nothing from its peer can only learn that the
   * peer gave up, and a send that fits the FIFO may complete before
   * the receiver looks at it. */
  unsigned also_ok[2];
};

#define OK_BIT(r) (1u << (r))

/* Detection is immediate: anything near LOOM_TIMEOUT means it hung. */
#define BOUND_S 5.0

static ncclResult_t do_call(const struct call *c, void *buf, int rank, ncclComm_t comm) {
  switch (c->coll) {
  case C_ALLREDUCE: return ncclAllReduce(buf, buf, c->count, c->dtype, c->op, comm, NULL);
  case C_BROADCAST: return ncclBroadcast(buf, buf, c->count, c->dtype, 0, comm, NULL);
  case C_SEND: return ncclSend(buf, c->count, c->dtype, 1 - rank, comm, NULL);
  default: return ncclRecv(buf, c->count, c->dtype, 1 - rank, comm, NULL);
  }
}

static int mismatch_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  const struct mismatch *m = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  size_t most = m->c[0].count > m->c[1].count ? m->c[0].count : m->c[1].count;
  void *buf = tbuf_alloc(comm, most * sizeof(double));
  RASSERT(buf && tbuf_set(comm, buf, 0, most * sizeof(double)) == 0, "no buffer");
  double t0 = now_s();
  /* A CUDA communicator's call queues a kernel, which finds the mismatch:
   * it comes as the asynchronous error, its sentence as ncclGetLastError
   * (tbuf_result waits for either); a host one's call returns it. */
  ncclResult_t r = tbuf_result(comm, do_call(&m->c[rank], buf, rank, comm));
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(comm);
  RASSERT(took < BOUND_S, "rank %d took %.1f s to return %d: %s", rank, took, (int)r, msg);
  RASSERT(r == ncclInvalidUsage || (m->also_ok[rank] & OK_BIT(r)), "rank %d: the mismatched call returned %d (%s)%s: %s",
          rank, (int)r, ncclGetErrorString(r),
          tbuf_is_cuda(comm) ? " (a CUDA communicator: its result, or the asynchronous error once the stream was done)"
                             : "",
          msg);
  for (const char *const *kw = m->want[rank]; r != ncclSuccess && *kw; kw++)
    RASSERT(strstr(msg, *kw) != NULL, "rank %d: the error does not mention \"%s\": %s", rank, *kw, msg);
  /* The communicator is broken now; tearing it down must still work (and
   * comes first: cudaFree would wait for a kernel that still waits). */
  RCHECK(NULL, ncclCommDestroy(comm));
  tbuf_free(buf);
  return 0;
}

static int run_mismatch(const struct mismatch *m) {
  /* Should detection fail, the ranks still give up instead of hanging
   * until the runner kills them. */
  setenv("LOOM_TIMEOUT", "15", 1);
  return run_ranks(2, mismatch_rank, (void *)m);
}

TEST_IMPL(comm_mismatch_count) {
  static const struct mismatch m = {
      .c = {{C_ALLREDUCE, 100, ncclFloat, ncclSum}, {C_ALLREDUCE, 101, ncclFloat, ncclSum}},
      .want = {{"rank 0", "AllReduce(count 100, float, sum)", "rank 1 called AllReduce(count 101, float, sum)"},
               {"rank 1", "AllReduce(count 101, float, sum)", "rank 0 called AllReduce(count 100, float, sum)"}},
  };
  return run_mismatch(&m);
}

TEST_IMPL(comm_mismatch_dtype) {
  static const struct mismatch m = {
      .c = {{C_ALLREDUCE, 100, ncclFloat, ncclSum}, {C_ALLREDUCE, 100, ncclInt32, ncclSum}},
      .want = {{"AllReduce(count 100, float, sum)", "rank 1 called AllReduce(count 100, int32, sum)"},
               {"AllReduce(count 100, int32, sum)", "rank 0 called AllReduce(count 100, float, sum)"}},
  };
  return run_mismatch(&m);
}

TEST_IMPL(comm_mismatch_op) {
  static const struct mismatch m = {
      .c = {{C_ALLREDUCE, 100, ncclFloat, ncclSum}, {C_ALLREDUCE, 100, ncclFloat, ncclMax}},
      .want = {{"AllReduce(count 100, float, sum)", "rank 1 called AllReduce(count 100, float, max)"},
               {"AllReduce(count 100, float, max)", "rank 0 called AllReduce(count 100, float, sum)"}},
  };
  return run_mismatch(&m);
}

static const struct mismatch crossed = {
  .c = {{C_ALLREDUCE, 100, ncclFloat, ncclSum}, {C_BROADCAST, 100, ncclFloat, ncclSum}},
  .want = {{"AllReduce(count 100, float, sum)", "rank 1"},
           {"Broadcast(count 100, float, root 0)", "rank 0 called AllReduce(count 100, float, sum)"}},
  /* Rank 1 is the end of the broadcast chain: it sends nothing that
   * rank 0 could check. */
  .also_ok = {OK_BIT(ncclRemoteError), 0},
};

TEST_IMPL(comm_mismatch_coll) { return run_mismatch(&crossed); }

/* The crossed calls use different connections; over sockets the slot
 * that shows it waits in the network until moved. */
TEST_IMPL(comm_mismatch_coll_socket) {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  return run_mismatch(&crossed);
}

TEST_IMPL(comm_mismatch_sendrecv) {
  static const struct mismatch m = {
      .c = {{C_SEND, 100, ncclFloat, ncclSum}, {C_RECV, 50, ncclFloat, ncclSum}},
      .want = {{"Send(count 100, float", "rank 1"},
               {"Recv(count 50, float", "from rank 0", "Send(count 100, float"}},
      .also_ok = {OK_BIT(ncclSuccess) | OK_BIT(ncclRemoteError), 0},
  };
  return run_mismatch(&m);
}

/* A send larger than the FIFO (4 MiB on a CUDA communicator) needs the
 * receiver to drain it: once the receiver refuses, the sender must not
 * wait for it forever, nor report success for data nobody took. */
TEST_IMPL(comm_mismatch_sendrecv_large) {
  static const struct mismatch m = {
      .c = {{C_SEND, 1 << 21, ncclFloat, ncclSum}, {C_RECV, 50, ncclFloat, ncclSum}},
      .want = {{"Send(count 2097152, float", "rank 1"},
               {"Recv(count 50, float", "from rank 0", "Send(count 2097152, float"}},
      .also_ok = {OK_BIT(ncclRemoteError), 0},
  };
  return run_mismatch(&m);
}

/* ---- the debug log ---- */

static int log_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  float *b = tbuf_alloc(comm, 64 * sizeof *b);
  RASSERT(b && tbuf_set(comm, b, 0, 64 * sizeof *b) == 0, "no buffer");
  RCHECK(comm, tbuf_result(comm, ncclAllReduce(b, b, 64, ncclFloat, ncclSum, comm, NULL)));
  RCHECK(comm, ncclCommDestroy(comm));
  tbuf_free(b);
  return 0;
}

struct log_check {
  int lines, info, init_complete;
};

/* Every line must carry "host:pid:tid [rank] NCCL LEVEL "; the rank is
 * "-" on threads that belong to no rank (the bootstrap root). */
static int check_log(const char *path, const char *host, pid_t pid, int rank, struct log_check *out) {
  FILE *f = fopen(path, "r");
  ASSERT_MSG(f != NULL, "cannot open %s", path);
  char line[4096], prefix[128], rank_info[64];
  snprintf(prefix, sizeof prefix, "%s:%d:", host, (int)pid);
  snprintf(rank_info, sizeof rank_info, "[%d] NCCL INFO ", rank);
  memset(out, 0, sizeof *out);
  while (fgets(line, sizeof line, f)) {
    out->lines++;
    ASSERT_MSG(strncmp(line, prefix, strlen(prefix)) == 0, "%s: line without \"%s\": %s", path, prefix, line);
    char *p = line + strlen(prefix);
    char *end;
    long tid = strtol(p, &end, 10);
    ASSERT_MSG(end != p && tid > 0 && end[0] == ' ' && end[1] == '[', "%s: no thread id in: %s", path, line);
    char *close = strstr(end, "] NCCL ");
    ASSERT_MSG(close != NULL, "%s: no \"] NCCL \" in: %s", path, line);
    if (strstr(line, rank_info) == end + 1)
      out->info++;
    if (strstr(line, "Init COMPLETE")) {
      ASSERT_MSG(strstr(line, rank_info) == end + 1, "%s: Init COMPLETE is not an INFO line of rank %d: %s", path,
                 rank, line);
      out->init_complete++;
    }
  }
  fclose(f);
  return 0;
}

/* Runs two ranks with the log going to a fresh folder and checks one file
 * per rank process, named by host and pid. */
static int run_logged(const char *subsys, struct log_check res[2]) {
  char dir[] = "/tmp/loom-log-XXXXXX";
  ASSERT(mkdtemp(dir) != NULL);
  char pattern[256];
  snprintf(pattern, sizeof pattern, "%s/loom.%%h.%%p.log", dir);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_FILE", pattern, 1);
  if (subsys)
    setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
  pid_t pids[2];
  ASSERT(start_ranks(2, log_rank, NULL, pids, NULL) == 0);
  ASSERT(wait_ranks(2, pids) == 0);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char *dot = strchr(host, '.');
  if (dot)
    *dot = '\0';
  int nfiles = 0;
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.')
      nfiles++;
  closedir(d);
  int rc = 0;
  for (int r = 0; r < 2 && rc == 0; r++) {
    char path[512];
    snprintf(path, sizeof path, "%s/loom.%s.%d.log", dir, host, (int)pids[r]);
    rc = access(path, R_OK) == 0 ? check_log(path, host, pids[r], r, &res[r]) : 1;
    if (rc)
      fprintf(stderr, "no log %s for rank %d (pid %d)\n", path, r, (int)pids[r]);
  }
  /* Leave nothing behind. */
  d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d)
    closedir(d);
  rmdir(dir);
  ASSERT_MSG(nfiles == 2, "%d log files for 2 rank processes", nfiles);
  return rc;
}

TEST_IMPL(comm_debug_file) {
  struct log_check res[2];
  if (run_logged(NULL, res) != 0)
    return 1;
  for (int r = 0; r < 2; r++) {
    ASSERT_MSG(res[r].info > 0, "rank %d logged no INFO line of its own", r);
    ASSERT_MSG(res[r].init_complete == 1, "rank %d logged Init COMPLETE %d times", r, res[r].init_complete);
  }
  return 0;
}

TEST_IMPL(comm_debug_subsys) {
  struct log_check res[2];
  if (run_logged("^INIT", res) != 0)
    return 1;
  for (int r = 0; r < 2; r++) {
    /* The other default subsystems (BOOTSTRAP) still speak. */
    ASSERT_MSG(res[r].info > 0, "rank %d logged no INFO line at all", r);
    ASSERT_MSG(res[r].init_complete == 0, "rank %d logged Init COMPLETE with NCCL_DEBUG_SUBSYS=^INIT", r);
  }
  return 0;
}
