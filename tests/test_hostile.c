/*
 * Hostile input on the listeners a job opens: the bootstrap root, each
 * rank's bootstrap listener and the socket plugin's listener. A stranger
 * floods each with hundreds of connections of every kind (silent, half a
 * greeting, a whole greeting with the wrong secret or cookie, garbage,
 * connect-and-close) while the real ranks use it; the ranks must finish
 * in a bounded time, refuse every stranger, crash nowhere, and close every
 * connection they took (no fd held after the job).
 *
 * Ranks are processes forked before the unique id exists, driven through
 * pipes as in test_bootstrap.c; each also sends its log through a pipe,
 * the window onto the addresses its listeners chose (NCCL_DEBUG=INFO).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap_wire.h"
#include "harness.h"
#include "loom.h"
#include "test.h"
#include "transport/net/socket/net_socket.h"

int bt_allreduce_check(ncclComm_t comm, int rank, int nranks, char *why, size_t len); /* test_bootstrap.c */

#define HX_MAX_KIDS 4

/* ---- kids: forked ranks driven through pipes ---- */

struct hx_kid {
  pid_t pid;
  int to, from, log; /* parent's ends */
  char *logbuf;
  size_t used, cap;
};

/* What a kid reports; smaller than PIPE_BUF, so one write is atomic. */
struct hx_rec {
  char kind;    /* 'I' initialised, 'R' result */
  int32_t code; /* ncclResult_t, or -1 for a failed check */
  double secs;
  char msg[512];
};

struct hx_args {
  int rank, nranks;
  int in, out; /* the kid's pipe ends */
};
typedef void (*hx_fn)(struct hx_args *a);

static struct hx_kid *kids[HX_MAX_KIDS];
static int nkids;

static void hx_put(const struct hx_args *a, char kind, int code, double secs, const char *fmt, ...) {
  struct hx_rec r;
  memset(&r, 0, sizeof r);
  r.kind = kind;
  r.code = code;
  r.secs = secs;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.msg, sizeof r.msg, fmt, ap);
  va_end(ap);
  if (harness_write_all(a->out, &r, sizeof r) != 0)
    _exit(4);
}

static void hx_wait_go(const struct hx_args *a) {
  char go;
  if (harness_read_all(a->in, &go, 1) != 0)
    _exit(3);
}

static void hx_start(struct hx_kid *k, hx_fn fn, int rank, int nranks, const char *subsys) {
  int to[2], from[2], log[2];
  ASSERT(pipe(to) == 0 && pipe(from) == 0 && pipe(log) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    for (int i = 0; i < nkids; i++) {
      close(kids[i]->to);
      close(kids[i]->from);
      close(kids[i]->log);
    }
    close(to[1]);
    close(from[0]);
    close(log[0]);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", log[1]);
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
    setenv("NCCL_DEBUG_FILE", path, 1);
    struct hx_args a = {.rank = rank, .nranks = nranks, .in = to[0], .out = from[1]};
    fn(&a);
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  close(to[0]);
  close(from[1]);
  close(log[1]);
  fcntl(log[0], F_SETFL, fcntl(log[0], F_GETFL) | O_NONBLOCK);
  *k = (struct hx_kid){.pid = pid, .to = to[1], .from = from[0], .log = log[0]};
  ASSERT(nkids < HX_MAX_KIDS);
  kids[nkids++] = k;
}

static void hx_send(struct hx_kid *k, const void *buf, size_t len) { ASSERT(harness_write_all(k->to, buf, len) == 0); }

/* Moves whatever the kids have logged into their buffers. */
static void hx_pump_logs(void) {
  for (int i = 0; i < nkids; i++) {
    struct hx_kid *k = kids[i];
    for (;;) {
      if (k->cap - k->used < 4096) {
        k->cap = k->cap ? 2 * k->cap : 1 << 16;
        k->logbuf = realloc(k->logbuf, k->cap);
        ASSERT(k->logbuf != NULL);
      }
      ssize_t n = read(k->log, k->logbuf + k->used, k->cap - k->used - 1);
      if (n <= 0)
        break;
      k->used += (size_t)n;
      k->logbuf[k->used] = '\0';
    }
  }
}

/* Waits, pumping every kid's log, until `fd` is readable or `secs` pass. */
static int hx_wait_fd(int fd, double secs) {
  double t0 = now_s();
  for (;;) {
    hx_pump_logs();
    double left = secs - (now_s() - t0);
    if (left <= 0)
      return 0;
    struct pollfd p[1 + HX_MAX_KIDS];
    p[0] = (struct pollfd){.fd = fd, .events = POLLIN};
    for (int i = 0; i < nkids; i++)
      p[1 + i] = (struct pollfd){.fd = kids[i]->log, .events = POLLIN};
    if (poll(p, (nfds_t)(1 + nkids), (int)(left * 1000) + 1) > 0 && p[0].revents)
      return 1;
  }
}

static void hx_rec(struct hx_kid *k, const char *who, struct hx_rec *rec, double secs) {
  ASSERT_MSG(hx_wait_fd(k->from, secs), "%s sent no record within %.0f s", who, secs);
  if (harness_read_all(k->from, rec, sizeof *rec) != 0) {
    int st = 0;
    waitpid(k->pid, &st, 0);
    k->pid = -1;
    ASSERT_MSG(0, "%s ended without a record (wait status 0x%x)", who, st);
  }
}

static void hx_expect(struct hx_kid *k, const char *who, char kind, double secs, struct hx_rec *out) {
  struct hx_rec r;
  hx_rec(k, who, &r, secs);
  ASSERT_MSG(r.kind == kind && r.code == ncclSuccess, "%s failed (record %c, code %d, %s): %s", who, r.kind, r.code,
             r.code > 0 ? ncclGetErrorString((ncclResult_t)r.code) : "check", r.msg);
  if (out)
    *out = r;
}

static void hx_reap(struct hx_kid *k, const char *who) {
  int st = 0;
  while (waitpid(k->pid, &st, 0) < 0 && errno == EINTR)
    ;
  ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (pid %d) ended with wait status 0x%x", who, (int)k->pid, st);
  k->pid = -1;
  hx_pump_logs();
}

/* Frees what the kids' logs and pipes hold, at the end of a test that
 * passed (its process is then checked for leaks in sanitizer builds). */
static void hx_release_all(void) {
  for (int i = 0; i < nkids; i++) {
    struct hx_kid *k = kids[i];
    close(k->to);
    close(k->from);
    close(k->log);
    free(k->logbuf);
    k->logbuf = NULL;
    k->used = k->cap = 0;
  }
  nkids = 0;
}

/* Waits for a line of k's log, after byte `from`, holding `needle`;
 * returns the text after the needle. */
static const char *hx_log_wait(struct hx_kid *k, size_t from, const char *needle, double secs) {
  double t0 = now_s();
  for (;;) {
    hx_pump_logs();
    const char *hit = k->used > from ? strstr(k->logbuf + from, needle) : NULL;
    if (hit && strchr(hit, '\n'))
      return hit + strlen(needle);
    double left = secs - (now_s() - t0);
    ASSERT_MSG(left > 0, "rank pid %d never logged \"%s\" within %.0f s", (int)k->pid, needle, secs);
    struct pollfd p = {.fd = k->log, .events = POLLIN};
    poll(&p, 1, (int)(left * 1000) + 1);
  }
}

static int hx_log_count(const struct hx_kid *k, const char *needle) {
  int n = 0;
  for (const char *p = k->logbuf ? strstr(k->logbuf, needle) : NULL; p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* ---- the stranger ---- */

/* Each connection of a flood: which kind, and its socket. */
enum hx_kind { K_SILENT, K_HALF, K_WRONG, K_GARBAGE, K_CLOSE, K_COUNT };
static const char *kind_name[] = {"silent", "half a greeting", "a greeting with the wrong secret", "4 KiB of garbage",
                                  "connect and close"};

#define HX_MAX_FLOOD 1024
struct hx_flood {
  int fd[HX_MAX_FLOOD];
  enum hx_kind kind[HX_MAX_FLOOD];
  int n;
  int count[K_COUNT];
};

static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 4096) {
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static void hx_parse(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
  char host[128];
  memset(ss, 0, sizeof *ss);
  const char *colon = strrchr(s, ':');
  ASSERT_MSG(colon != NULL, "cannot parse address \"%s\"", s);
  if (s[0] == '[') {
    snprintf(host, sizeof host, "%.*s", (int)(colon - s - 2), s + 1);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)atoi(colon + 1));
    *len = sizeof *a;
    ASSERT_MSG(inet_pton(AF_INET6, host, &a->sin6_addr) == 1, "cannot parse address \"%s\"", s);
    return;
  }
  snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
  struct sockaddr_in *a = (struct sockaddr_in *)ss;
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t)atoi(colon + 1));
  *len = sizeof *a;
  ASSERT_MSG(inet_pton(AF_INET, host, &a->sin_addr) == 1, "cannot parse address \"%s\"", s);
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static void fill_random(void *buf, size_t len) {
  unsigned char *p = buf;
  for (size_t i = 0; i < len; i++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    p[i] = (unsigned char)rng;
  }
}

/* Opens `n` connections to `addr`, cycling through the kinds. `wrong` is
 * a whole greeting of the listener's protocol that is not the job's
 * (another secret or cookie); `half` of its bytes make a half greeting.
 * Connects do not block: a listener that accepts nothing until its peer
 * comes must not stall the stranger, which sends what it can once the
 * connections are up. */
static void hx_flood(struct hx_flood *f, const char *addr, int n, const void *wrong, size_t wrong_len, size_t half) {
  struct sockaddr_storage ss;
  socklen_t alen;
  hx_parse(addr, &ss, &alen);
  int first = f->n;
  for (int i = 0; i < n && f->n < HX_MAX_FLOOD; i++) {
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_MSG(fd >= 0, "socket: %s", strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&ss, alen);
    ASSERT_MSG(rc == 0 || errno == EINPROGRESS, "connect to %s: %s", addr, strerror(errno));
    f->fd[f->n] = fd;
    f->kind[f->n] = (enum hx_kind)(i % K_COUNT);
    f->count[f->kind[f->n]]++;
    f->n++;
  }
  double t0 = now_s();
  for (int i = first; i < f->n; i++) {
    if (f->kind[i] == K_SILENT)
      continue;
    struct pollfd p = {.fd = f->fd[i], .events = POLLOUT};
    double left = 5.0 - (now_s() - t0);
    if (poll(&p, 1, left > 0 ? (int)(left * 1000) : 0) <= 0)
      continue; /* still connecting: it stays a silent one */
    unsigned char buf[4096];
    const void *what = buf;
    size_t len = 0;
    switch (f->kind[i]) {
    case K_HALF:
      what = wrong;
      len = half;
      break;
    case K_WRONG:
      what = wrong;
      len = wrong_len;
      break;
    case K_GARBAGE:
      fill_random(buf, sizeof buf);
      len = sizeof buf;
      break;
    case K_CLOSE:
      close(f->fd[i]);
      f->fd[i] = -1;
      continue;
    default:
      break;
    }
    /* The listener may reset the connection halfway: that is its right. */
    ssize_t sent = send(f->fd[i], what, len, MSG_NOSIGNAL);
    (void)sent;
  }
}

/* Waits until the listener has closed every flood connection; returns
 * how many it still holds after `secs`, naming one of them. */
static int hx_flood_closed(struct hx_flood *f, double secs, const char **kind) {
  double t0 = now_s();
  int open = 0;
  for (;;) {
    static struct pollfd p[HX_MAX_FLOOD];
    static int idx[HX_MAX_FLOOD];
    open = 0;
    for (int i = 0; i < f->n; i++)
      if (f->fd[i] >= 0) {
        p[open] = (struct pollfd){.fd = f->fd[i], .events = POLLIN};
        idx[open++] = i;
      }
    if (open == 0)
      return 0;
    *kind = kind_name[f->kind[idx[0]]];
    double left = secs - (now_s() - t0);
    if (left <= 0)
      return open;
    if (poll(p, (nfds_t)open, (int)(left * 1000) + 1) <= 0)
      continue;
    for (int j = 0; j < open; j++) {
      if (!p[j].revents)
        continue;
      char buf[4096];
      ssize_t got = recv(p[j].fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR)))
        continue; /* an answer (the root refusing a foreign id): keep reading */
      close(p[j].fd); /* end of stream or a reset: the listener let it go */
      f->fd[idx[j]] = -1;
    }
  }
}

static void hx_flood_report(const struct hx_flood *f, const char *where) {
  printf("flooded %s with %d connections:", where, f->n);
  for (int k = 0; k < K_COUNT; k++)
    printf(" %d %s%s", f->count[k], kind_name[k], k + 1 < K_COUNT ? "," : "\n");
}

/* A rank's fds before its first NCCL call and after its last: the log
 * file NCCL_DEBUG_FILE names is opened once and stays; nothing else may. */
static int fds_now(void) { return harness_count_entries("/proc/self/fd", NULL); }

/* The end every kid shares: one checked AllReduce on `check` (where this
 * kid is rank `check_rank`), `check` and then `comm` destroyed with no fd
 * left over from before init (`fds0`; the log's may stay), and the result
 * record. `where` prefixes a failed check ("" for none). */
static void hx_finish(struct hx_args *a, ncclComm_t comm, ncclComm_t check, int check_rank, int fds0, double took,
                      const char *where) {
  char why[512];
  if (bt_allreduce_check(check, check_rank, a->nranks, why, sizeof why) != 0) {
    hx_put(a, 'R', -1, took, "%s%s", where, why);
    return;
  }
  if (check != comm)
    ncclCommDestroy(check);
  ncclResult_t r = ncclCommDestroy(comm);
  int fds1 = fds_now();
  if (r == ncclSuccess && fds1 > fds0 + 1) {
    hx_put(a, 'R', -1, took, "rank %d has %d fds after ncclCommDestroy, %d before ncclCommInitRank", a->rank, fds1,
           fds0);
    return;
  }
  hx_put(a, 'R', r, took, "%s", r == ncclSuccess ? "" : ncclGetLastError(NULL));
}

/* The start of the kids that are flooded after init: the id from the
 * test, init, the 'I' record, then the test's go. 0 if init failed (and
 * was reported). */
static int hx_init(struct hx_args *a, ncclComm_t *comm) {
  ncclUniqueId id;
  if (harness_read_all(a->in, &id, sizeof id) != 0)
    _exit(3);
  ncclResult_t r = ncclCommInitRank(comm, a->nranks, id, a->rank);
  if (r != ncclSuccess) {
    hx_put(a, 'I', r, 0, "ncclCommInitRank: %s", ncclGetLastError(NULL));
    return 0;
  }
  hx_put(a, 'I', 0, 0, "");
  hx_wait_go(a);
  return 1;
}

/* ---- the bootstrap root ---- */

static void root_kid(struct hx_args *a) {
  int fds0 = fds_now();
  ncclUniqueId id;
  if (harness_read_all(a->in, &id, sizeof id) != 0)
    _exit(3);
  ncclComm_t comm;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRank(&comm, a->nranks, id, a->rank);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    hx_put(a, 'R', r, took, "ncclCommInitRank: %s", ncclGetLastError(NULL));
    return;
  }
  hx_finish(a, comm, comm, a->rank, fds0, took, "");
}

TEST_IMPL(hostile_root_flood) {
  enum { N = 3, FLOOD = 400, LATE = 100 };
  raise_fd_limit();
  setenv("LOOM_TIMEOUT", "30", 1);
  struct hx_kid k[N];
  for (int r = 0; r < N; r++)
    hx_start(&k[r], root_kid, r, N, "BOOTSTRAP");
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  char root[128];
  ASSERT_OK(loomUniqueIdRootAddress(&id, root, sizeof root));

  /* A whole greeting of the right shape: a challenge and a proof the
   * stranger could only guess, since the secret never crosses the wire. */
  struct {
    struct boot_chal chal;
    struct boot_proof proof;
  } wrong;
  memset(&wrong, 0, sizeof wrong);
  memcpy(wrong.chal.magic, chal_magic, sizeof wrong.chal.magic);
  wrong.chal.from = 0;
  wrong.chal.to = BOOT_TO_ROOT;
  wrong.chal.nranks = N;
  fill_random(wrong.chal.nonce, sizeof wrong.chal.nonce);
  memcpy(wrong.proof.magic, proof_magic, sizeof wrong.proof.magic);
  fill_random(wrong.proof.mac, sizeof wrong.proof.mac);
  static struct hx_flood f;
  /* More connections than the root reads at once, all before the first
   * rank, and more while the ranks join. */
  hx_flood(&f, root, FLOOD, &wrong, sizeof wrong, offsetof(struct boot_chal, to) + 3);
  for (int r = 0; r < N; r++)
    hx_send(&k[r], &id, sizeof id);
  hx_flood(&f, root, LATE, &wrong, sizeof wrong, 11);
  hx_flood_report(&f, root);
  for (int r = 0; r < N; r++) {
    char who[32];
    struct hx_rec rec;
    snprintf(who, sizeof who, "rank %d", r);
    hx_expect(&k[r], who, 'R', 60, &rec);
    printf("%s: ncclCommInitRank took %.2f s\n", who, rec.secs);
    ASSERT_MSG(rec.secs < 10.0, "%s took %.1f s to join past the flood", who, rec.secs);
    hx_reap(&k[r], who);
  }
  const char *kind = "";
  int held = hx_flood_closed(&f, 15.0, &kind);
  ASSERT_MSG(held == 0, "the root still holds %d flood connections (one: %s) 15 s after the job formed", held, kind);
  hx_release_all();
  return 0;
}

/* ---- a rank's bootstrap listener ---- */

static void rank_kid(struct hx_args *a) {
  int fds0 = fds_now();
  ncclComm_t comm, child;
  if (!hx_init(a, &comm))
    return;
  /* The split's all-gathers go through the flooded listener. */
  double t0 = now_s();
  ncclResult_t r = ncclCommSplit(comm, 0, a->nranks - 1 - a->rank, &child, NULL);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    hx_put(a, 'R', r, took, "rank %d: ncclCommSplit past the flood: %s", a->rank, ncclGetLastError(comm));
    return;
  }
  char where[64];
  snprintf(where, sizeof where, "rank %d on the split communicator: ", a->rank);
  hx_finish(a, comm, child, a->nranks - 1 - a->rank, fds0, took, where);
}

TEST_IMPL(hostile_rank_flood) {
  enum { N = 3, FLOOD = 300 };
  raise_fd_limit();
  setenv("LOOM_TIMEOUT", "30", 1);
  struct hx_kid k[N];
  for (int r = 0; r < N; r++)
    hx_start(&k[r], rank_kid, r, N, "BOOTSTRAP");
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++)
    hx_send(&k[r], &id, sizeof id);
  char addr[N][128];
  for (int r = 0; r < N; r++) {
    char who[32], needle[64];
    snprintf(who, sizeof who, "rank %d", r);
    hx_expect(&k[r], who, 'I', 60, NULL);
    snprintf(needle, sizeof needle, "bootstrap: rank %d listens on ", r);
    const char *a = hx_log_wait(&k[r], 0, needle, 10);
    ASSERT(sscanf(a, "%127s", addr[r]) == 1);
  }
  static struct hx_flood f[N];
  for (int r = 0; r < N; r++) {
    /* As a rank of the job would greet rank r, without the secret. */
    struct {
      struct boot_chal chal;
      struct boot_proof proof;
    } wrong;
    memset(&wrong, 0, sizeof wrong);
    memcpy(wrong.chal.magic, chal_magic, sizeof wrong.chal.magic);
    wrong.chal.from = (r + 1) % N;
    wrong.chal.to = r;
    wrong.chal.nranks = N;
    fill_random(wrong.chal.nonce, sizeof wrong.chal.nonce);
    memcpy(wrong.proof.magic, proof_magic, sizeof wrong.proof.magic);
    fill_random(wrong.proof.mac, sizeof wrong.proof.mac);
    hx_flood(&f[r], addr[r], FLOOD, &wrong, sizeof wrong, offsetof(struct boot_chal, nonce) + 3);
    hx_flood_report(&f[r], addr[r]);
  }
  for (int r = 0; r < N; r++)
    hx_send(&k[r], "g", 1);
  for (int r = 0; r < N; r++) {
    char who[32];
    struct hx_rec rec;
    snprintf(who, sizeof who, "rank %d", r);
    hx_expect(&k[r], who, 'R', 60, &rec);
    printf("%s: ncclCommSplit took %.2f s\n", who, rec.secs);
    /* Silent connections are read side by side: the flood costs the
     * greeting time once at most, not once per connection. */
    ASSERT_MSG(rec.secs < 10.0, "%s took %.1f s to split past the flood", who, rec.secs);
    hx_reap(&k[r], who);
  }
  for (int r = 0; r < N; r++) {
    const char *kind = "";
    int held = hx_flood_closed(&f[r], 15.0, &kind);
    ASSERT_MSG(held == 0, "rank %d's listener still holds %d flood connections (one: %s) after the job", r, held,
               kind);
    /* Strangers are logged, a flood of them not line by line: the first
     * 16 (BOOT_WARN_FIRST), then a line a second at most, then one that
     * counts the rest; each rank split in under 10 s. */
    char needle[64];
    snprintf(needle, sizeof needle, "NCCL WARN bootstrap: rank %d", r);
    int lines = hx_log_count(&k[r], needle);
    ASSERT_MSG(lines >= 1 && lines <= 16 + 10 + 2, "rank %d logged %d WARN lines about %d strangers", r, lines, FLOOD);
  }
  hx_release_all();
  return 0;
}

/* ---- the socket plugin's listener ---- */

enum { NET_BYTES = 1 << 20 };

static void net_kid(struct hx_args *a) {
  int fds0 = fds_now();
  ncclComm_t comm;
  if (!hx_init(a, &comm))
    return;
  static uint32_t buf[NET_BYTES / 4];
  for (size_t i = 0; i < NET_BYTES / 4; i++)
    buf[i] = a->rank == 1 ? (uint32_t)(i * 2654435761u) : 0;
  /* Rank 0 receives, so its connection to rank 1 is the one that listens:
   * from the group's end it waits on the bootstrap for rank 1, with the
   * listener open, until the test lets rank 1 send. */
  double t0 = now_s();
  ncclResult_t r = a->rank == 0 ? ncclRecv(buf, NET_BYTES / 4, ncclUint32, 1, comm, NULL)
                                : ncclSend(buf, NET_BYTES / 4, ncclUint32, 0, comm, NULL);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    hx_put(a, 'R', r, took, "rank %d: %s past the flood: %s", a->rank, a->rank ? "ncclSend" : "ncclRecv",
           ncclGetLastError(comm));
    return;
  }
  for (size_t i = 0; i < NET_BYTES / 4; i++)
    if (buf[i] != (uint32_t)(i * 2654435761u)) {
      hx_put(a, 'R', -1, took, "rank %d: word %zu is %u after the transfer, expected %u", a->rank, i, buf[i],
             (uint32_t)(i * 2654435761u));
      return;
    }
  char where[64];
  snprintf(where, sizeof where, "rank %d after the flood: ", a->rank);
  hx_finish(a, comm, comm, a->rank, fds0, took, where);
}

TEST_IMPL(hostile_net_socket_flood) {
  /* More silent and half connections than the listener reads at once. */
  enum { N = 2, FLOOD = 700, LATE = 100, NT = 2, NSPT = 2 };
  raise_fd_limit();
  setenv("LOOM_TIMEOUT", "30", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_NET", "Socket", 1);
  /* Data sockets too, so the real connector has several sockets to get
   * past the flood. */
  setenv("NCCL_SOCKET_NTHREADS", "2", 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
  struct hx_kid k[N];
  for (int r = 0; r < N; r++)
    hx_start(&k[r], net_kid, r, N, "NET");
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++)
    hx_send(&k[r], &id, sizeof id);
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    hx_expect(&k[r], who, 'I', 60, NULL);
  }
  /* Init's own listeners are in the log already: look past them. */
  hx_pump_logs();
  size_t mark = k[0].used;
  hx_send(&k[0], "r", 1);
  char addr[128];
  const char *a = hx_log_wait(&k[0], mark, "NET/Socket: listening on ", 20);
  ASSERT(sscanf(a, "%127s", addr) == 1);

  /* The stranger knows the protocol and the shape, not the cookie. */
  struct sock_hello wrong;
  fill_random(&wrong, sizeof wrong);
  wrong.index = NT * NSPT;
  wrong.nsocks = NT * NSPT;
  static struct hx_flood f;
  hx_flood(&f, addr, FLOOD, &wrong, sizeof wrong, 10);
  hx_send(&k[1], "s", 1);
  hx_flood(&f, addr, LATE, &wrong, sizeof wrong, 10);
  hx_flood_report(&f, addr);
  for (int r = 0; r < N; r++) {
    char who[32];
    struct hx_rec rec;
    snprintf(who, sizeof who, "rank %d", r);
    hx_expect(&k[r], who, 'R', 60, &rec);
    printf("%s: %s took %.2f s\n", who, r ? "ncclSend" : "ncclRecv", rec.secs);
    hx_reap(&k[r], who);
  }
  const char *kind = "";
  int held = hx_flood_closed(&f, 15.0, &kind);
  ASSERT_MSG(held == 0, "rank 0 still holds %d flood connections (one: %s) after the job", held, kind);
  /* Garbage long enough for a hello is a hello with a wrong cookie too;
   * what the listener closed unread when the real connection was in is
   * not counted. */
  int refused = hx_log_count(&k[0], "did not present the expected cookie");
  int sent = f.count[K_WRONG] + f.count[K_GARBAGE];
  ASSERT_MSG(refused >= 1 && refused <= sent,
             "rank 0 logged %d refusals of a wrong cookie; the stranger sent %d whole hellos with one", refused, sent);
  printf("rank 0 refused %d connections that presented a wrong cookie\n", refused);
  hx_release_all();
  return 0;
}
