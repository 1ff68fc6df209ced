/*
 * The bootstrap under abuse: garbage sent to the root and to a rank's
 * listener, an id from another job, ranks that disagree about nranks or
 * claim the same rank. test_bootstrap_timing.c has the tests about when
 * ranks start (late, never, rank 0 last with NCCL_COMM_ID, sixteen ranks)
 * and bad NCCL_COMM_ID values.
 *
 * Most tests here fork their ranks themselves instead of using harness.h:
 * the test process makes the unique id (so the root runs in a process that
 * is no rank, as under a launcher), and hands it to each rank through a pipe
 * only when the scenario says that rank may start. Ranks are forked before
 * the id exists, so no fork happens while the root thread runs.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "sock_wait.h"
#include "test.h"

/* A rank process and the two pipes that drive it: the test writes the
 * unique id and go bytes to `to`, the rank writes records to `from`. */
struct bt_kid {
  pid_t pid;
  int to, from;
};

/* What a rank reports. Smaller than PIPE_BUF, so one write is atomic. */
struct bt_rec {
  char kind;    /* 'L' listener address, 'R' result */
  int32_t code; /* ncclResult_t, or -1 for a wrong result */
  double secs;  /* how long ncclCommInitRank took */
  char msg[768];
};

typedef void (*bt_kid_fn)(int in, int out, void *arg);

struct bt_rank_opts {
  int rank, nranks;
};

/* Also used by test_bootstrap_timing.c. */
int bt_names_rank(const char *s, int r);
int bt_allreduce_check(ncclComm_t comm, int rank, int nranks, char *why, size_t len);

/* ---- kids: forked ranks driven through pipes ---- */

/* Parent-side pipe ends, closed in every kid so that a kid's pipes see EOF
 * when the test process dies, whatever kids were forked after it. */
static int parent_fds[128];
static int n_parent_fds;

static void bt_kid_start(struct bt_kid *k, bt_kid_fn fn, void *arg) {
  int to[2], from[2];
  ASSERT(pipe(to) == 0 && pipe(from) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    for (int i = 0; i < n_parent_fds; i++)
      close(parent_fds[i]);
    close(to[1]);
    close(from[0]);
    fn(to[0], from[1], arg);
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  close(to[0]);
  close(from[1]);
  k->pid = pid;
  k->to = to[1];
  k->from = from[0];
  ASSERT(n_parent_fds + 2 <= (int)(sizeof parent_fds / sizeof parent_fds[0]));
  parent_fds[n_parent_fds++] = to[1];
  parent_fds[n_parent_fds++] = from[0];
}

static void bt_kid_send_id(struct bt_kid *k, const ncclUniqueId *id) { ASSERT(harness_write_all(k->to, id, sizeof *id) == 0); }

static void bt_kid_go(struct bt_kid *k, char byte) { ASSERT(harness_write_all(k->to, &byte, 1) == 0); }

/* Says how a kid ended, for a message about a kid that sent no record. */
static const char *kid_status(struct bt_kid *k, char *buf, size_t len) {
  int st = 0;
  pid_t r;
  while ((r = waitpid(k->pid, &st, 0)) < 0 && errno == EINTR)
    ;
  if (r < 0)
    snprintf(buf, len, "pid %d: waitpid failed", (int)k->pid);
  else if (WIFSIGNALED(st))
    snprintf(buf, len, "pid %d was killed by signal %d (%s)", (int)k->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, len, "pid %d exited with status %d", (int)k->pid, WEXITSTATUS(st));
  k->pid = -1;
  return buf;
}

static void bt_kid_rec(struct bt_kid *k, const char *who, struct bt_rec *rec) {
  if (harness_read_all(k->from, rec, sizeof *rec) != 0) {
    char st[128];
    ASSERT_MSG(0, "%s sent no record: %s", who, kid_status(k, st, sizeof st));
  }
}

static void bt_kid_reap(struct bt_kid *k, const char *who) {
  if (k->pid < 0)
    return;
  int st = 0;
  while (waitpid(k->pid, &st, 0) < 0 && errno == EINTR)
    ;
  ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (pid %d) ended with wait status 0x%x", who, (int)k->pid, st);
  k->pid = -1;
}

static void bt_put(int out, char kind, int code, double secs, const char *fmt, ...) {
  struct bt_rec r;
  memset(&r, 0, sizeof r);
  r.kind = kind;
  r.code = code;
  r.secs = secs;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.msg, sizeof r.msg, fmt, ap);
  va_end(ap);
  if (harness_write_all(out, &r, sizeof r) != 0)
    _exit(4);
}

static void bt_expect_ok(struct bt_kid *k, const char *who) {
  struct bt_rec r;
  bt_kid_rec(k, who, &r);
  ASSERT_MSG(r.kind == 'R' && r.code == ncclSuccess, "%s failed (code %d, %s): %s", who, r.code,
             r.code > 0 ? ncclGetErrorString((ncclResult_t)r.code) : "wrong result", r.msg);
  bt_kid_reap(k, who);
}

int bt_allreduce_check(ncclComm_t comm, int rank, int nranks, char *why, size_t len) {
  enum { N = 4099 };
  static int32_t buf[N];
  for (int i = 0; i < N; i++)
    buf[i] = (rank + 1) * (i % 11);
  ncclResult_t r = ncclAllReduce(buf, buf, N, ncclInt32, ncclSum, comm, NULL);
  if (r != ncclSuccess) {
    snprintf(why, len, "ncclAllReduce: %s: %s", ncclGetErrorString(r), ncclGetLastError(comm));
    return -1;
  }
  int32_t scale = nranks * (nranks + 1) / 2;
  for (int i = 0; i < N; i++)
    if (buf[i] != scale * (i % 11)) {
      snprintf(why, len, "AllReduce element %d is %d, expected %d", i, buf[i], scale * (i % 11));
      return -1;
    }
  return 0;
}

static void bt_rank_kid(int in, int out, void *arg) {
  const struct bt_rank_opts *o = arg;
  ncclUniqueId id;
  if (harness_read_all(in, &id, sizeof id) != 0)
    _exit(3);
  ncclComm_t comm = NULL;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRank(&comm, o->nranks, id, o->rank);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    bt_put(out, 'R', r, took, "%s", ncclGetLastError(NULL));
    return;
  }
  char why[512];
  if (bt_allreduce_check(comm, o->rank, o->nranks, why, sizeof why) != 0) {
    bt_put(out, 'R', -1, took, "rank %d: %s", o->rank, why);
    return;
  }
  r = ncclCommDestroy(comm);
  bt_put(out, 'R', r, took, "%s", r == ncclSuccess ? "" : ncclGetLastError(NULL));
}

/* ---- reading messages ---- */

/* Whether `s` gives `v` as an nranks: the first number within a few
 * characters after "nranks" ("nranks=3", "nranks is 3"). */
static int names_nranks(const char *s, long v) {
  for (const char *p = strstr(s, "nranks"); p; p = strstr(p + 1, "nranks")) {
    const char *q = p + 6;
    while (*q && !isdigit((unsigned char)*q) && q - p < 22)
      q++;
    if (isdigit((unsigned char)*q) && strtol(q, NULL, 10) == v)
      return 1;
  }
  return 0;
}

/* Whether `s` names rank `r`: "rank 2", "ranks 1, 2", "rank(s) 0,2". */
int bt_names_rank(const char *s, int r) {
  for (const char *p = strstr(s, "rank"); p; p = strstr(p + 1, "rank")) {
    const char *q = p + 4;
    if (strncmp(q, "(s)", 3) == 0)
      q += 3;
    else if (*q == 's')
      q++;
    for (;;) {
      while (*q == ' ' || *q == ',')
        q++;
      if (strncmp(q, "and ", 4) == 0)
        q += 4;
      if (!isdigit((unsigned char)*q))
        break;
      char *end;
      long x = strtol(q, &end, 10);
      if (x == r)
        return 1;
      q = end;
    }
  }
  return 0;
}

/* ---- raw connections ---- */

static int bt_parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
  char host[128];
  const char *port;
  memset(ss, 0, sizeof *ss);
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return -1;
    snprintf(host, sizeof host, "%.*s", (int)(close - s - 1), s + 1);
    port = close + 2;
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)atoi(port));
    *len = sizeof *a;
    return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? 0 : -1;
  }
  const char *colon = strrchr(s, ':');
  if (!colon)
    return -1;
  snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
  struct sockaddr_in *a = (struct sockaddr_in *)ss;
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t)atoi(colon + 1));
  *len = sizeof *a;
  return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

static int bt_connect(const char *addr) {
  struct sockaddr_storage ss;
  socklen_t len;
  ASSERT_MSG(bt_parse_addr(addr, &ss, &len) == 0, "cannot parse address \"%s\"", addr);
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  ASSERT_MSG(connect(fd, (struct sockaddr *)&ss, len) == 0, "cannot connect to %s: %s", addr, strerror(errno));
  return fd;
}

static void send_quiet(int fd, const void *buf, size_t len) {
  /* The peer may reset the connection halfway: that is its right. */
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0)
      return;
    p += n;
    len -= (size_t)n;
  }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void fill_random(void *buf, size_t len) {
  unsigned char *p = buf;
  for (size_t i = 0; i < len; i++) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    p[i] = (unsigned char)rng_state;
  }
}

enum garbage { G_NOTHING, G_RANDOM, G_FEW, G_PREFIX, G_PREFIX_FULL, G_HTTP, G_COUNT };
static const char *garbage_name[] = {"nothing", "4 KiB of random bytes", "3 bytes", "a greeting prefix and garbage",
                                     "a greeting-sized record with garbage", "an HTTP request"};

/* Sends one kind of garbage to `addr`. `magic` is the protocol's own magic,
 * so that the prefix cases get past the first check. With `wait`, waits
 * for the peer to drop the connection (the root reads at once); without,
 * closes it (a rank reads it only when it next waits on the bootstrap). */
static void send_garbage(const char *addr, enum garbage g, const char magic[8], int wait) {
  int fd = bt_connect(addr);
  unsigned char buf[4096];
  fill_random(buf, sizeof buf);
  static const char http[] = "GET / HTTP/1.1\r\nHost: loom\r\nUser-Agent: curl/8.0\r\nAccept: */*\r\n\r\n";
  switch (g) {
  case G_NOTHING:
    close(fd);
    return;
  case G_RANDOM:
    send_quiet(fd, buf, sizeof buf);
    break;
  case G_FEW:
    send_quiet(fd, "LOO", 3);
    close(fd);
    return;
  case G_PREFIX:
    memcpy(buf, magic, 8);
    send_quiet(fd, buf, 8 + 13);
    close(fd);
    return;
  case G_PREFIX_FULL:
    memcpy(buf, magic, 8);
    send_quiet(fd, buf, 512);
    break;
  case G_HTTP:
    send_quiet(fd, http, sizeof http - 1);
    break;
  default:
    break;
  }
  if (wait) {
    double t = sock_wait_closed(fd, 10.0);
    ASSERT_MSG(t >= 0, "%s kept a connection that sent %s open for 10 s", addr, garbage_name[g]);
  }
  close(fd);
}

/* ---- the root's log ---- */

/* The root runs in the test process; its log, read back through a pipe,
 * shows what it made of each connection, and at TRACE when it has taken a
 * rank's greeting: the only way to order joins without sleeping. Must run
 * before the test's first NCCL call. */
static int root_log_open(const char *level) {
  int p[2];
  ASSERT(pipe(p) == 0);
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", p[1]);
  setenv("NCCL_DEBUG", level, 1);
  setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  return p[0];
}

static void root_log_wait(int fd, const char *needle) {
  static char buf[1 << 16];
  static size_t used;
  double t0 = now_s();
  for (;;) {
    buf[used] = '\0';
    char *hit = strstr(buf, needle);
    if (hit) {
      char *eol = strchr(hit, '\n');
      size_t keep = eol ? used - (size_t)(eol + 1 - buf) : 0;
      memmove(buf, buf + used - keep, keep);
      used = keep;
      return;
    }
    if (used > sizeof buf / 2) {
      memmove(buf, buf + used - 1024, 1024);
      used = 1024;
    }
    double left = 15.0 - (now_s() - t0);
    ASSERT_MSG(left > 0, "the root never logged \"%s\" (NCCL_DEBUG=TRACE) within 15 s", needle);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, (int)(left * 1000) + 1);
    ssize_t n = read(fd, buf + used, sizeof buf - 1 - used);
    if (n > 0)
      used += (size_t)n;
  }
}

/* The lines of `fd`'s log so far that contain both `a` and `b`. */
static int root_log_count(int fd, const char *a, const char *b) {
  static char buf[1 << 16];
  size_t used = 0;
  ssize_t n;
  while (used < sizeof buf - 1 && (n = read(fd, buf + used, sizeof buf - 1 - used)) > 0)
    used += (size_t)n;
  buf[used] = '\0';
  int count = 0;
  for (char *line = buf, *eol; *line; line = eol + 1) {
    eol = strchr(line, '\n');
    if (!eol)
      break;
    *eol = '\0';
    if (strstr(line, a) && strstr(line, b))
      count++;
  }
  return count;
}

/* ---- garbage to the root ---- */

TEST_IMPL(bootstrap_garbage_root) {
  enum { N = 3 };
  setenv("LOOM_TIMEOUT", "20", 1);
  struct bt_kid kids[N];
  struct bt_rank_opts o[N];
  for (int r = 0; r < N; r++) {
    o[r] = (struct bt_rank_opts){.rank = r, .nranks = N};
    bt_kid_start(&kids[r], bt_rank_kid, &o[r]);
  }
  int log = root_log_open("WARN");
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  char root[128];
  ASSERT_OK(loomUniqueIdRootAddress(&id, root, sizeof root));

  /* A silent connection may hold the root for its greeting time, no more:
   * everything below queues behind it. */
  double t0 = now_s();
  int silent = bt_connect(root);
  for (int g = 0; g < G_COUNT; g++)
    send_garbage(root, (enum garbage)g, "LOOMCH2", 1);
  double dropped = sock_wait_closed(silent, 10.0);
  ASSERT_MSG(dropped >= 0, "the root kept a silent connection open for 10 s");
  double held = now_s() - t0;
  close(silent);
  ASSERT_MSG(held < 8.0, "the root took %.1f s to drop a silent connection", held);
  /* Garbage once more after the silent one: the root must still read. */
  send_garbage(root, G_RANDOM, "LOOMCH2", 1);
  send_garbage(root, G_NOTHING, "LOOMCH2", 0);
  int garbage = 1 + G_COUNT + 2;

  for (int r = 0; r < N; r++)
    bt_kid_send_id(&kids[r], &id);
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    bt_expect_ok(&kids[r], who);
  }
  /* The ranks are through, so the root has seen every connection. */
  int warned = root_log_count(log, "WARN", root);
  ASSERT_MSG(warned >= garbage, "the root warned %d times about %d garbage connections (WARN lines naming %s)",
             warned, garbage, root);
  return 0;
}

/* ---- garbage to a rank's listener ---- */

struct listener_opts {
  int rank, nranks;
  const char *dir;
};

/* The rank's own log names the address it listens on; NCCL_DEBUG=INFO is
 * the only window onto it from outside the library. */
static int find_listen_addr(const char *path, int rank, char *addr, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  char line[2048];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "bootstrap: rank ");
    int r;
    char a[128];
    if (p && sscanf(p, "bootstrap: rank %d listens on %127s", &r, a) == 2 && r == rank) {
      snprintf(addr, len, "%s", a);
      found = 0;
    }
  }
  fclose(f);
  return found;
}

static void listener_kid(int in, int out, void *arg) {
  const struct listener_opts *o = arg;
  char path[512];
  snprintf(path, sizeof path, "%s/rank.%%p.log", o->dir);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  ncclUniqueId id;
  if (harness_read_all(in, &id, sizeof id) != 0)
    _exit(3);
  ncclComm_t comm, child;
  ncclResult_t r = ncclCommInitRank(&comm, o->nranks, id, o->rank);
  if (r != ncclSuccess) {
    bt_put(out, 'L', r, 0, "ncclCommInitRank: %s", ncclGetLastError(NULL));
    return;
  }
  char why[512], addr[128];
  if (bt_allreduce_check(comm, o->rank, o->nranks, why, sizeof why) != 0) {
    bt_put(out, 'L', -1, 0, "%s", why);
    return;
  }
  snprintf(path, sizeof path, "%s/rank.%d.log", o->dir, (int)getpid());
  if (find_listen_addr(path, o->rank, addr, sizeof addr) != 0) {
    bt_put(out, 'L', -1, 0, "%s has no line \"bootstrap: rank %d listens on ADDR\"", path, o->rank);
    return;
  }
  bt_put(out, 'L', 0, 0, "%s", addr);
  char go;
  if (harness_read_all(in, &go, 1) != 0)
    _exit(3);
  /* Collectives that need no bootstrap, while the garbage arrives. */
  for (int i = 0; i < 20; i++)
    if (bt_allreduce_check(comm, o->rank, o->nranks, why, sizeof why) != 0) {
      bt_put(out, 'R', -1, 0, "rank %d, AllReduce %d during the garbage: %s", o->rank, i, why);
      return;
    }
  if (harness_read_all(in, &go, 1) != 0)
    _exit(3);
  /* The split's all-gathers go over the listener the garbage queued on. */
  r = ncclCommSplit(comm, 0, o->nranks - 1 - o->rank, &child, NULL);
  if (r != ncclSuccess) {
    bt_put(out, 'R', r, 0, "rank %d: ncclCommSplit after garbage on its bootstrap listener: %s", o->rank,
           ncclGetLastError(comm));
    return;
  }
  int crank = -1;
  ncclCommUserRank(child, &crank);
  if (crank != o->nranks - 1 - o->rank) {
    bt_put(out, 'R', -1, 0, "rank %d became rank %d of the split, expected %d", o->rank, crank,
           o->nranks - 1 - o->rank);
    return;
  }
  if (bt_allreduce_check(child, crank, o->nranks, why, sizeof why) != 0) {
    bt_put(out, 'R', -1, 0, "rank %d, on the split communicator: %s", o->rank, why);
    return;
  }
  ncclCommDestroy(child);
  r = ncclCommDestroy(comm);
  bt_put(out, 'R', r, 0, "%s", r == ncclSuccess ? "" : ncclGetLastError(NULL));
}

TEST_IMPL(bootstrap_garbage_rank) {
  enum { N = 3 };
  setenv("LOOM_TIMEOUT", "20", 1);
  char dir[] = "/tmp/loom-bootstrap-XXXXXX";
  ASSERT(mkdtemp(dir) != NULL);
  struct bt_kid kids[N];
  struct listener_opts o[N];
  for (int r = 0; r < N; r++) {
    o[r] = (struct listener_opts){.rank = r, .nranks = N, .dir = dir};
    bt_kid_start(&kids[r], listener_kid, &o[r]);
  }
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++)
    bt_kid_send_id(&kids[r], &id);
  char addr[N][128];
  for (int r = 0; r < N; r++) {
    struct bt_rec rec;
    bt_kid_rec(&kids[r], "a rank", &rec);
    ASSERT_MSG(rec.kind == 'L' && rec.code == 0, "rank %d before the garbage: %s", r, rec.msg);
    snprintf(addr[r], sizeof addr[r], "%.127s", rec.msg);
  }
  for (int r = 0; r < N; r++)
    bt_kid_go(&kids[r], 'g');
  for (int r = 0; r < N; r++)
    for (int g = 0; g < G_COUNT; g++)
      send_garbage(addr[r], (enum garbage)g, "LOOMCH2", 0);
  for (int r = 0; r < N; r++)
    bt_kid_go(&kids[r], 's');
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    bt_expect_ok(&kids[r], who);
  }
  harness_remove_dir(dir);
  return 0;
}

/* ---- an id from another job ---- */

static void expect_foreign_refused(struct bt_kid *k, const char *who) {
  struct bt_rec rec;
  bt_kid_rec(k, who, &rec);
  ASSERT_MSG(rec.kind == 'R' && rec.code == ncclInvalidUsage,
             "%s presented an id with another secret: got code %d (%s), expected ncclInvalidUsage: %s", who,
             rec.code, rec.code > 0 ? ncclGetErrorString((ncclResult_t)rec.code) : "-", rec.msg);
  ASSERT_MSG(strstr(rec.msg, "another communicator") || strstr(rec.msg, "another job"),
             "%s: the message does not say the id belongs to another communicator or job: %s", who, rec.msg);
  ASSERT_MSG(rec.secs < 5.0, "%s waited %.1f s to be refused", who, rec.secs);
  bt_kid_reap(k, who);
}

TEST_IMPL(bootstrap_foreign_id) {
  enum { N = 3 };
  setenv("LOOM_TIMEOUT", "20", 1);
  struct bt_kid ranks[N], early, late;
  struct bt_rank_opts o[N];
  for (int r = 0; r < N; r++) {
    o[r] = (struct bt_rank_opts){.rank = r, .nranks = N};
    bt_kid_start(&ranks[r], bt_rank_kid, &o[r]);
  }
  /* One intruder with the real ranks' rank and nranks, one whose nranks
   * would be a mismatch: the secret must be what refuses both. */
  struct bt_rank_opts oe = {.rank = 0, .nranks = N}, ol = {.rank = 4, .nranks = N + 2};
  bt_kid_start(&early, bt_rank_kid, &oe);
  bt_kid_start(&late, bt_rank_kid, &ol);

  ncclUniqueId id, other;
  ASSERT_OK(ncclGetUniqueId(&id));
  other = id;
  for (int i = 8; i < 16; i++)
    other.internal[i] ^= (char)(0x5a + i);

  bt_kid_send_id(&early, &other);
  expect_foreign_refused(&early, "an intruder before any rank");
  /* Ranks 0 and 1 join while the second intruder arrives; rank 2 waits, so
   * the root is still gathering whichever comes first. */
  bt_kid_send_id(&ranks[0], &id);
  bt_kid_send_id(&ranks[1], &id);
  bt_kid_send_id(&late, &other);
  expect_foreign_refused(&late, "an intruder among the ranks");
  bt_kid_send_id(&ranks[2], &id);
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    bt_expect_ok(&ranks[r], who);
  }
  return 0;
}

/* ---- nranks mismatch ---- */

/* `any_code`: the rank was not refused itself but left waiting, so a
 * remote error is as right as a usage error; the message is what counts. */
static void expect_mismatch(struct bt_kid *k, const char *who, int a, int b, double max_secs, int any_code) {
  struct bt_rec rec;
  bt_kid_rec(k, who, &rec);
  ASSERT_MSG(rec.kind == 'R' && rec.code != ncclSuccess, "%s: made a communicator: %s", who, rec.msg);
  ASSERT_MSG(any_code || rec.code == ncclInvalidUsage || rec.code == ncclInvalidArgument,
             "%s: got code %d (%s), expected ncclInvalidUsage: %s", who, rec.code,
             rec.code > 0 ? ncclGetErrorString((ncclResult_t)rec.code) : "-", rec.msg);
  ASSERT_MSG(names_nranks(rec.msg, a) && names_nranks(rec.msg, b),
             "%s: the message should name nranks %d and %d: %s", who, a, b, rec.msg);
  ASSERT_MSG(rec.secs < max_secs, "%s waited %.1f s for its error", who, rec.secs);
  bt_kid_reap(k, who);
}

TEST_IMPL(bootstrap_nranks_mismatch) {
  enum { N = 3, WRONG = 5 };
  setenv("LOOM_TIMEOUT", "20", 1);
  struct bt_kid ranks[N], odd, first, later;
  struct bt_rank_opts o[N];
  for (int r = 0; r < N; r++) {
    o[r] = (struct bt_rank_opts){.rank = r, .nranks = N};
    bt_kid_start(&ranks[r], bt_rank_kid, &o[r]);
  }
  struct bt_rank_opts oodd = {.rank = 2, .nranks = WRONG};
  struct bt_rank_opts ofirst = {.rank = 4, .nranks = WRONG}, olater = {.rank = 0, .nranks = N};
  bt_kid_start(&odd, bt_rank_kid, &oodd);
  bt_kid_start(&first, bt_rank_kid, &ofirst);
  bt_kid_start(&later, bt_rank_kid, &olater);
  int log = root_log_open("TRACE");

  /* Ranks that disagree on nranks cannot make a communicator, whichever
   * of them is wrong: the root fails the job at once, and every rank, the
   * ones that joined before and the ones that join after, is told both
   * values instead of waiting for LOOM_TIMEOUT. */
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  bt_kid_send_id(&ranks[0], &id);
  char needle[64];
  snprintf(needle, sizeof needle, "rank 0 of %d joined", N);
  root_log_wait(log, needle);
  bt_kid_send_id(&odd, &id);
  expect_mismatch(&odd, "a rank with nranks=5 after rank 0 with nranks=3", WRONG, N, 5.0, 0);
  expect_mismatch(&ranks[0], "rank 0, which joined before the odd one", WRONG, N, 5.0, 0);
  bt_kid_send_id(&ranks[1], &id);
  bt_kid_send_id(&ranks[2], &id);
  expect_mismatch(&ranks[1], "rank 1, joining after the job failed", WRONG, N, 5.0, 0);
  expect_mismatch(&ranks[2], "rank 2, joining after the job failed", WRONG, N, 5.0, 0);

  /* The odd one joins first: the next rank is refused and told both
   * values, and so is the odd one, at once. */
  ncclUniqueId id2;
  ASSERT_OK(ncclGetUniqueId(&id2));
  bt_kid_send_id(&first, &id2);
  snprintf(needle, sizeof needle, "rank 4 of %d joined", WRONG);
  root_log_wait(log, needle);
  bt_kid_send_id(&later, &id2);
  expect_mismatch(&later, "a rank with nranks=3 after one with nranks=5", N, WRONG, 5.0, 0);
  expect_mismatch(&first, "the rank with nranks=5 that joined first", WRONG, N, 5.0, 0);
  return 0;
}

/* ---- duplicate rank ---- */

TEST_IMPL(bootstrap_duplicate_rank) {
  enum { N = 3 };
  setenv("LOOM_TIMEOUT", "20", 1);
  struct bt_kid ranks[N], dup;
  struct bt_rank_opts o[N], odup = {.rank = 1, .nranks = N};
  for (int r = 0; r < N; r++) {
    o[r] = (struct bt_rank_opts){.rank = r, .nranks = N};
    bt_kid_start(&ranks[r], bt_rank_kid, &o[r]);
  }
  bt_kid_start(&dup, bt_rank_kid, &odup);
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  /* Both rank 1s join while rank 2 is held back, so the root sees both
   * before it can finish; either may come first. */
  bt_kid_send_id(&ranks[0], &id);
  bt_kid_send_id(&ranks[1], &id);
  bt_kid_send_id(&dup, &id);
  struct pollfd p[2] = {{.fd = ranks[1].from, .events = POLLIN}, {.fd = dup.from, .events = POLLIN}};
  int n;
  while ((n = poll(p, 2, 15000)) < 0 && errno == EINTR)
    ;
  ASSERT_MSG(n > 0, "neither of two processes claiming rank 1 was refused within 15 s");
  struct bt_kid *loser = (p[0].revents & (POLLIN | POLLHUP)) ? &ranks[1] : &dup;
  struct bt_kid *winner = loser == &dup ? &ranks[1] : &dup;
  struct bt_rec rec;
  bt_kid_rec(loser, "the second rank 1", &rec);
  ASSERT_MSG(rec.kind == 'R' && rec.code != ncclSuccess, "the second rank 1 to join was accepted (code %d): %s",
             rec.code, rec.msg);
  ASSERT_MSG(rec.code == ncclInvalidUsage || rec.code == ncclInvalidArgument,
             "the second rank 1: code %d (%s), expected ncclInvalidUsage: %s", rec.code,
             rec.code > 0 ? ncclGetErrorString((ncclResult_t)rec.code) : "-", rec.msg);
  ASSERT_MSG(bt_names_rank(rec.msg, 1) &&
                 (strstr(rec.msg, "twice") || strstr(rec.msg, "duplicate") || strstr(rec.msg, "already")),
             "the second rank 1: the message should say rank 1 joined twice: %s", rec.msg);
  bt_kid_reap(loser, "the second rank 1");
  bt_kid_send_id(&ranks[2], &id);
  bt_expect_ok(&ranks[0], "rank 0");
  bt_expect_ok(winner, "the first rank 1");
  bt_expect_ok(&ranks[2], "rank 2");
  return 0;
}
