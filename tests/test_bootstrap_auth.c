/*
 * Who may join a job: with NCCL_COMM_ID a process needs the job's
 * LOOM_SECRET (or LOOM_SECRET_FILE), not just the root's address. A
 * stranger, a rank with a wrong secret and a greeting recorded from a real
 * rank and replayed are all refused with a sentence while the real job
 * completes; a job without a secret says once that anyone can join it.
 *
 * Ranks are processes forked by the test (which starts no library thread
 * of its own, so none runs when it forks); each gets its own environment
 * and logs to a file of its own.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "bootstrap/bootstrap_wire.h"
#include "harness.h"
#include "loom.h"
#include "sock_wait.h"
#include "test.h"

int bt_allreduce_check(ncclComm_t comm, int rank, int nranks, char *why, size_t len); /* test_bootstrap.c */

struct ak_opts {
  int rank, nranks;
  const char *comm_id;     /* NCCL_COMM_ID */
  const char *secret;      /* LOOM_SECRET, NULL: unset */
  const char *secret_file; /* LOOM_SECRET_FILE, NULL: unset */
  char log[256];           /* NCCL_DEBUG_FILE */
  int drop_fd;             /* > 0: a listener of the test's that the rank closes, not to hold a copy */
};

struct ak_rec {
  int32_t code; /* ncclResult_t, -1 for a wrong result */
  double secs;  /* how long the failing or last call took */
  char msg[900];
};

struct ak_kid {
  pid_t pid;
  int from;
};

static void ak_put(int fd, int code, double secs, const char *fmt, ...) {
  struct ak_rec r;
  memset(&r, 0, sizeof r);
  r.code = code;
  r.secs = secs;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.msg, sizeof r.msg, fmt, ap);
  va_end(ap);
  if (harness_write_all(fd, &r, sizeof r) != 0)
    _exit(4);
}

static void set_or_unset(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* A rank: its own id from NCCL_COMM_ID, init, a checked AllReduce. */
static void ak_rank(const struct ak_opts *o, int out) {
  if (o->drop_fd > 0)
    close(o->drop_fd);
  setenv("NCCL_COMM_ID", o->comm_id, 1);
  set_or_unset("LOOM_SECRET", o->secret);
  set_or_unset("LOOM_SECRET_FILE", o->secret_file);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("NCCL_DEBUG_FILE", o->log, 1);
  double t0 = now_s();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    ak_put(out, r, now_s() - t0, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
    return;
  }
  ncclComm_t comm;
  r = ncclCommInitRank(&comm, o->nranks, id, o->rank);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    ak_put(out, r, took, "%s", ncclGetLastError(NULL));
    return;
  }
  char why[512];
  if (bt_allreduce_check(comm, o->rank, o->nranks, why, sizeof why) != 0) {
    ak_put(out, -1, took, "rank %d: %s", o->rank, why);
    return;
  }
  r = ncclCommDestroy(comm);
  ak_put(out, r, took, "%s", r == ncclSuccess ? "" : ncclGetLastError(NULL));
}

static void ak_start(struct ak_kid *k, const struct ak_opts *o) {
  int p[2];
  ASSERT(pipe(p) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    ak_rank(o, p[1]);
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  close(p[1]);
  k->pid = pid;
  k->from = p[0];
}

static void ak_result(struct ak_kid *k, const char *who, struct ak_rec *rec) {
  struct pollfd p = {.fd = k->from, .events = POLLIN};
  int n;
  while ((n = poll(&p, 1, 60000)) < 0 && errno == EINTR)
    ;
  ASSERT_MSG(n == 1, "%s sent no result within 60 s", who);
  ASSERT_MSG(harness_read_all(k->from, rec, sizeof *rec) == 0, "%s ended without a result", who);
  int st;
  while (waitpid(k->pid, &st, 0) < 0 && errno == EINTR)
    ;
  close(k->from);
  ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s ended with wait status 0x%x", who, st);
}

static void ak_expect_ok(struct ak_kid *k, const char *who) {
  struct ak_rec rec;
  ak_result(k, who, &rec);
  ASSERT_MSG(rec.code == ncclSuccess, "%s failed (code %d): %s", who, rec.code, rec.msg);
}

/* ---- the test's own sockets and files ---- */

/* A loopback port the kernel chose, free again for the root to take. */
static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  ASSERT(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0);
  close(s);
  return ntohs(a.sin_port);
}

/* Connects to 127.0.0.1:port, retrying while nothing listens there yet
 * (the root starts inside rank 0's init). */
static int connect_retry(int port, double limit) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  double t0 = now_s();
  for (;;) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(s >= 0);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
      return s;
    int e = errno;
    close(s);
    ASSERT_MSG(e == ECONNREFUSED && now_s() - t0 < limit, "cannot connect to 127.0.0.1:%d: %s", port, strerror(e));
    struct pollfd none;
    poll(&none, 0, 20); /* a retry interval, not a synchronisation */
  }
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return calloc(1, 1);
  static const size_t cap = 1 << 20;
  char *buf = calloc(1, cap);
  ASSERT(buf != NULL);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Lines of `text` that hold both needles. */
static int count_lines(const char *text, const char *a, const char *b) {
  int n = 0;
  for (const char *line = text; *line;) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    char *l = strndup(line, len);
    if (strstr(l, a) && (!b || strstr(l, b)))
      n++;
    free(l);
    line += len + (eol ? 1 : 0);
  }
  return n;
}

static void make_dir(char *dir) {
  strcpy(dir, "/tmp/loom-auth-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
}

/* ---- a stranger and a wrong secret ---- */

TEST_IMPL(bootstrap_auth_stranger) {
  enum { N = 3 };
  setenv("LOOM_TIMEOUT", "20", 1);
  char dir[64], comm_id[64];
  make_dir(dir);
  int port = free_port();
  snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", port);
  struct ak_opts o[N], so;
  for (int r = 0; r < N; r++) {
    o[r] = (struct ak_opts){.rank = r, .nranks = N, .comm_id = comm_id, .secret = "the job's secret"};
    snprintf(o[r].log, sizeof o[r].log, "%s/rank%d.log", dir, r);
  }
  so = (struct ak_opts){.rank = 1, .nranks = N, .comm_id = comm_id, .secret = "a guess"};
  snprintf(so.log, sizeof so.log, "%s/stranger.log", dir);
  struct ak_kid k[N], stranger;
  ak_start(&k[0], &o[0]);

  /* A Loom process with another secret, claiming rank 1 before the real
   * one: refused, and told why. */
  ak_start(&stranger, &so);
  struct ak_rec rec;
  ak_result(&stranger, "a process with a wrong LOOM_SECRET", &rec);
  printf("the process with a wrong LOOM_SECRET got: %s\n", rec.msg);
  ASSERT_MSG(rec.code == ncclInvalidUsage, "a process with a wrong LOOM_SECRET: code %d, expected ncclInvalidUsage: %s",
             rec.code, rec.msg);
  ASSERT_MSG(strstr(rec.msg, "refused") && strstr(rec.msg, "LOOM_SECRET") && strstr(rec.msg, "differs") &&
                 strstr(rec.msg, comm_id),
             "the message should say that the root at %s refused it because its LOOM_SECRET differs: %s", comm_id,
             rec.msg);
  ASSERT_MSG(rec.secs < 10.0, "the process with a wrong secret waited %.1f s to be refused", rec.secs);


  /* A stranger that knows the address and the protocol, not the secret:
   * it answers the root's challenge with a guess. */
  int fd = connect_retry(port, 20);
  struct boot_chal chal;
  memset(&chal, 0, sizeof chal);
  memcpy(chal.magic, chal_magic, sizeof chal.magic);
  chal.from = 2;
  chal.to = BOOT_TO_ROOT;
  chal.nranks = N;
  ASSERT(send(fd, &chal, sizeof chal, MSG_NOSIGNAL) == (ssize_t)sizeof chal);
  struct boot_answer ans;
  ASSERT_MSG(harness_read_all(fd, &ans, sizeof ans) == 0, "the root did not answer a challenge");
  struct boot_proof guess;
  memset(&guess, 0x5a, sizeof guess);
  memcpy(guess.magic, proof_magic, sizeof guess.magic);
  ASSERT(send(fd, &guess, sizeof guess, MSG_NOSIGNAL) == (ssize_t)sizeof guess);
  double t = sock_wait_closed(fd, 10);
  ASSERT_MSG(t >= 0, "the root kept a connection that failed to prove the secret open for 10 s");
  close(fd);

  for (int r = 1; r < N; r++)
    ak_start(&k[r], &o[r]);
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    ak_expect_ok(&k[r], who);
  }
  char *log = slurp(o[0].log);
  int refused = count_lines(log, "refused a connection", "did not prove the job's secret");
  ASSERT_MSG(refused == 1, "rank 0's root logged %d refusals of a connection that did not prove the secret, expected "
             "1 (the stranger)", refused);
  /* The process with a wrong secret sends no proof once the root's answer
   * shows the secrets differ (a proof would let whoever answered guess a
   * weak LOOM_SECRET offline): it ends the connection, and the root says
   * what that means. */
  int closed = count_lines(log, "refused a connection", "before it proved the job's secret (a process with another "
                           "secret");
  ASSERT_MSG(closed == 1, "rank 0's root logged %d refusals of a connection that closed before its proof, expected 1 "
             "(the wrong secret)", closed);
  free(log);
  harness_remove_dir(dir);
  return 0;
}

/* ---- LOOM_SECRET_FILE ---- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ASSERT(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

TEST_IMPL(bootstrap_auth_secret_file) {
  enum { N = 2 };
  setenv("LOOM_TIMEOUT", "20", 1);
  char dir[64], comm_id[64], good[128], bad[128], missing[128];
  make_dir(dir);
  snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", free_port());
  snprintf(good, sizeof good, "%s/secret", dir);
  snprintf(bad, sizeof bad, "%s/other", dir);
  snprintf(missing, sizeof missing, "%s/none", dir);
  write_file(good, "4f1c0e9a-job-secret\n");
  write_file(bad, "4f1c0e9a-job-secreT\n");
  struct ak_opts o[N], wrong, absent, both;
  for (int r = 0; r < N; r++) {
    o[r] = (struct ak_opts){.rank = r, .nranks = N, .comm_id = comm_id, .secret_file = good};
    snprintf(o[r].log, sizeof o[r].log, "%s/rank%d.log", dir, r);
  }
  wrong = o[1];
  wrong.secret_file = bad;
  absent = o[1];
  absent.secret_file = missing;
  both = o[1];
  both.secret = "x";
  struct ak_kid k[N], kw, ka, kb;
  struct ak_rec rec;
  ak_start(&ka, &absent);
  ak_result(&ka, "a rank whose LOOM_SECRET_FILE does not exist", &rec);
  ASSERT_MSG(rec.code == ncclInvalidArgument && strstr(rec.msg, "LOOM_SECRET_FILE") && strstr(rec.msg, missing),
             "a missing LOOM_SECRET_FILE: code %d, expected ncclInvalidArgument and a sentence naming the file: %s",
             rec.code, rec.msg);
  ak_start(&kb, &both);
  ak_result(&kb, "a rank with both LOOM_SECRET and LOOM_SECRET_FILE", &rec);
  ASSERT_MSG(rec.code == ncclInvalidArgument && strstr(rec.msg, "both"),
             "LOOM_SECRET and LOOM_SECRET_FILE together: code %d, expected ncclInvalidArgument: %s", rec.code, rec.msg);

  ak_start(&k[0], &o[0]);
  ak_start(&kw, &wrong);
  ak_result(&kw, "a rank with another LOOM_SECRET_FILE", &rec);
  printf("the rank with another secret file got: %s\n", rec.msg);
  ASSERT_MSG(rec.code == ncclInvalidUsage && strstr(rec.msg, "LOOM_SECRET_FILE") && strstr(rec.msg, bad) &&
                 strstr(rec.msg, "differs"),
             "a rank whose secret file differs: code %d, expected ncclInvalidUsage naming LOOM_SECRET_FILE=%s: %s",
             rec.code, bad, rec.msg);
  ak_start(&k[1], &o[1]);
  for (int r = 0; r < N; r++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", r);
    ak_expect_ok(&k[r], who);
  }
  harness_remove_dir(dir);
  return 0;
}

/* ---- a recorded greeting, replayed ---- */

/* Stands where the root would be and records what a rank sends it. To a
 * challenge it gives the answer the job's root would (it holds the key,
 * from the unique id that NCCL_COMM_ID and LOOM_SECRET make), so the rank
 * goes on to send its proof and its hello: a whole greeting, as one who
 * watched a real job's wire would have it. */
struct recorder {
  int listen_fd;
  uint8_t key[BOOT_KEY];
  unsigned char rec[1 << 16];
  size_t len;
};

static void record_until(struct recorder *r, int fd, size_t want, double limit) {
  double t0 = now_s();
  while (r->len < want && now_s() - t0 < limit) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    ssize_t n = recv(fd, r->rec + r->len, sizeof r->rec - r->len, 0);
    if (n <= 0)
      return;
    r->len += (size_t)n;
  }
}

static void *recorder_main(void *arg) {
  struct recorder *r = arg;
  int fd = accept(r->listen_fd, NULL, NULL);
  if (fd < 0)
    return NULL;
  record_until(r, fd, sizeof(struct boot_chal), 20);
  if (r->len >= sizeof(struct boot_chal) && memcmp(r->rec, chal_magic, sizeof chal_magic) == 0) {
    struct boot_answer a;
    memcpy(a.magic, answer_magic, sizeof a.magic);
    memset(a.nonce, 0x42, sizeof a.nonce);
    static const char label[] = "loom bootstrap answer";
    unsigned char in[sizeof label + sizeof(struct boot_chal) + BOOT_NONCE];
    memcpy(in, label, sizeof label);
    memcpy(in + sizeof label, r->rec, sizeof(struct boot_chal));
    memcpy(in + sizeof label + sizeof(struct boot_chal), a.nonce, BOOT_NONCE);
    unsigned maclen = 0;
    HMAC(EVP_sha256(), r->key, BOOT_KEY, in, sizeof in, a.mac, &maclen);
    if (send(fd, &a, sizeof a, MSG_NOSIGNAL) == (ssize_t)sizeof a) {
      /* Proof, then the hello: its header says how long it is. */
      size_t head = sizeof(struct boot_chal) + sizeof(struct boot_proof) + sizeof(struct boot_msg_hdr);
      record_until(r, fd, head, 20);
      struct boot_msg_hdr h;
      if (r->len >= head) {
        memcpy(&h, r->rec + head - sizeof h, sizeof h);
        if (h.len < 4096)
          record_until(r, fd, head + h.len + BOOT_MAC, 20);
      }
    }
  } else {
    record_until(r, fd, sizeof r->rec, 20); /* whatever else it says, until it gives up */
  }
  close(fd);
  return NULL;
}

TEST_IMPL(bootstrap_auth_replay) {
  setenv("LOOM_TIMEOUT", "20", 1);
  char dir[64], comm_id[64];
  make_dir(dir);
  static struct recorder rc;
  rc.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(rc.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  ASSERT(bind(rc.listen_fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(rc.listen_fd, 4) == 0 &&
         getsockname(rc.listen_fd, (struct sockaddr *)&a, &alen) == 0);
  int port = ntohs(a.sin_port);
  snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", port);
  /* The key every rank of this job computes (no root starts here). */
  setenv("NCCL_COMM_ID", comm_id, 1);
  setenv("LOOM_SECRET", "s3cret", 1);
  ncclUniqueId uid;
  ASSERT_OK(ncclGetUniqueId(&uid));
  unsetenv("NCCL_COMM_ID");
  unsetenv("LOOM_SECRET");
  struct boot_id bid;
  memcpy(&bid, uid.internal, sizeof bid);
  memcpy(rc.key, bid.secret, sizeof rc.key);

  /* Rank 1 greets the recorder, which then leaves it without a reply.
   * Rank 1 then tries again (a root may drop a greeting), so it must not
   * hold the recorder's listener itself: nothing listens any more. */
  struct ak_opts o1 = {.rank = 1, .nranks = 2, .comm_id = comm_id, .secret = "s3cret", .drop_fd = rc.listen_fd};
  snprintf(o1.log, sizeof o1.log, "%s/recorded-rank1.log", dir);
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, recorder_main, &rc) == 0);
  struct ak_kid k0, k1;
  ak_start(&k1, &o1);
  pthread_join(th, NULL);
  close(rc.listen_fd);
  struct ak_rec rec;
  ak_result(&k1, "the recorded rank 1", &rec);
  printf("recorded %zu bytes of rank 1's greeting\n", rc.len);
  ASSERT_MSG(rc.len >= 64, "the recorder got only %zu bytes of rank 1's greeting", rc.len);

  /* The job at that address with that secret: the recording, replayed to
   * its root before its rank 1 comes, must not make anyone rank 1. */
  struct ak_opts o0 = {.rank = 0, .nranks = 2, .comm_id = comm_id, .secret = "s3cret"};
  snprintf(o0.log, sizeof o0.log, "%s/rank0.log", dir);
  snprintf(o1.log, sizeof o1.log, "%s/rank1.log", dir);
  o1.drop_fd = 0; /* closed here: its number may be another fd's now */
  ak_start(&k0, &o0);
  int fd = connect_retry(port, 20);
  ASSERT(send(fd, rc.rec, rc.len, MSG_NOSIGNAL) == (ssize_t)rc.len);
  double t = sock_wait_closed(fd, 10);
  close(fd);
  ASSERT_MSG(t >= 0, "the root kept a replayed greeting's connection open for 10 s");
  ak_start(&k1, &o1);
  ak_expect_ok(&k0, "rank 0");
  ak_expect_ok(&k1, "rank 1, after the replay of its recorded greeting");
  char *log = slurp(o0.log);
  int refused = count_lines(log, "refused a connection", "did not prove the job's secret");
  ASSERT_MSG(refused == 1, "the root logged %d refusals of a connection that did not prove the secret, expected 1 "
             "(the replay)", refused);
  free(log);
  harness_remove_dir(dir);
  return 0;
}

/* ---- no secret ---- */

/* In a process of its own: NCCL_COMM_ID with or without LOOM_SECRET, two
 * ids and a one-rank job; the number of warnings that say anyone can join. */
static int warnings_in_process(const char *dir, const char *secret) {
  char log[128], comm_id[64];
  snprintf(log, sizeof log, "%s/%s.log", dir, secret ? "with" : "without");
  snprintf(comm_id, sizeof comm_id, "127.0.0.1:%d", free_port());
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    setenv("NCCL_COMM_ID", comm_id, 1);
    set_or_unset("LOOM_SECRET", secret);
    unsetenv("LOOM_SECRET_FILE");
    setenv("NCCL_DEBUG", "WARN", 1);
    setenv("NCCL_DEBUG_FILE", log, 1);
    ncclUniqueId id, again;
    ncclComm_t comm;
    int ok = ncclGetUniqueId(&id) == ncclSuccess && ncclGetUniqueId(&again) == ncclSuccess &&
             ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess;
    if (!ok)
      fprintf(stderr, "one-rank NCCL_COMM_ID job: %s\n", ncclGetLastError(NULL));
    _exit(ok ? 0 : 1);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the one-rank job %s LOOM_SECRET failed", secret ? "with" : "without");
  char *text = slurp(log);
  int n = count_lines(text, "LOOM_SECRET", "anyone");
  if (n > 0)
    printf("without a secret: %s", strstr(text, "NCCL WARN") ? strstr(text, "NCCL WARN") : text);
  free(text);
  return n;
}

TEST_IMPL(bootstrap_auth_no_secret_warns) {
  char dir[64];
  make_dir(dir);
  int without = warnings_in_process(dir, NULL), with = warnings_in_process(dir, "abc");
  ASSERT_MSG(without == 1, "NCCL_COMM_ID without LOOM_SECRET: %d warnings that anyone can join, expected one", without);
  ASSERT_MSG(with == 0, "NCCL_COMM_ID with LOOM_SECRET: %d warnings that anyone can join, expected none", with);
  harness_remove_dir(dir);
  return 0;
}
