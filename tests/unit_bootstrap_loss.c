/*
 * The bootstrap loses nothing to a listener that drops a connection or a
 * root that has many ranks at once, and keeps its secrets:
 * - a connection that the listener drops before it answers (as it does to
 *   a greeting that came too slowly or when too many wait) takes the
 *   messages already written with it: they arrive anyway, in order, on a
 *   new connection;
 * - a greeting that arrives a byte at a time, slower than GREETING_NS in
 *   all but moving on, is not cut off, nor pushed out by silent strangers;
 * - more ranks join at once than the root reads greetings from
 *   (LOOM_BOOTSTRAP_PENDING), and all get in;
 * - a split's or a shrink's child secret is derived on every member from
 *   the parent's, and what crosses the wire (the root's address and a
 *   tag) holds none of it; the comm hash does not depend on the secret;
 * - a flood of strangers is logged in a bounded number of lines.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "bootstrap/bootstrap_wire.h"
#include "core.h"
#include "test.h"
#include "boot_greeting.h"

/* ---- ranks as threads over the internal API ---- */

struct lrank {
  ncclUniqueId id;
  int rank, nranks;
  pthread_barrier_t *start; /* NULL: none */
  int barrier;              /* pass a bootstrap barrier after init */
  struct bootstrap *b;
  ncclResult_t r;
  char err[512];
};

static void *lrank_init(void *p) {
  struct lrank *a = p;
  if (a->start)
    pthread_barrier_wait(a->start);
  a->r = bootstrap_init(&a->id, 1, a->rank, a->nranks, NULL, &a->b);
  if (a->r == ncclSuccess && a->barrier)
    a->r = boot_test_barrier(a->b);
  if (a->r != ncclSuccess)
    snprintf(a->err, sizeof a->err, "%s", err_thread_last());
  return NULL;
}

/* `n` ranks of the job `id` join at once (and pass a barrier); 0 when
 * all did, else the number that failed (each says why on stderr). */
static int lranks_init_b(struct lrank *a, int n, const ncclUniqueId *id, int barrier) {
  pthread_t *th = calloc((size_t)n, sizeof *th);
  pthread_barrier_t start;
  ASSERT(th && pthread_barrier_init(&start, NULL, (unsigned)n) == 0);
  for (int r = 0; r < n; r++) {
    a[r] = (struct lrank){.id = *id, .rank = r, .nranks = n, .start = &start, .barrier = barrier};
    ASSERT(pthread_create(&th[r], NULL, lrank_init, &a[r]) == 0);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    if (a[r].r != ncclSuccess) {
      fprintf(stderr, "rank %d of %d: %s\n", r, n, a[r].err);
      failed++;
    }
  }
  pthread_barrier_destroy(&start);
  free(th);
  return failed;
}

static int lranks_init(struct lrank *a, int n, const ncclUniqueId *id) { return lranks_init_b(a, n, id, 1); }

static void lranks_close(struct lrank *a, int n) {
  for (int r = 0; r < n; r++)
    bootstrap_close(a[r].b);
}

static int tcp_listener(union sock_addr *addr) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof in;
  ASSERT(s >= 0 && bind(s, (struct sockaddr *)&in, sizeof in) == 0 && listen(s, 16) == 0 &&
         getsockname(s, (struct sockaddr *)&in, &len) == 0);
  memset(addr, 0, sizeof *addr);
  memcpy(&addr->sin, &in, sizeof in);
  return s;
}

static int tcp_connect(const union sock_addr *addr) {
  int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(s >= 0 && connect(s, &addr->sa, sock_addr_len(addr)) == 0);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

/* ---- a listener that drops the first connection unanswered ---- */

/* Stands at rank 2's address as rank 0 knows it. The first connection it
 * reads until `want` bytes (the greeting and the messages) are in, then
 * closes without a word, as a listener does to a greeting that came too
 * slowly or when too many were waiting; every later one it passes on to
 * the real rank 2, both ways. */
struct dropper {
  int listen_fd;
  union sock_addr real;
  size_t want, got;
  int conns;
};

static void pipe_both(int a, int b) {
  char buf[8192];
  for (;;) {
    struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR)
      return;
    for (int i = 0; i < 2; i++) {
      if (!p[i].revents)
        continue;
      ssize_t n = recv(p[i].fd, buf, sizeof buf, 0);
      if (n <= 0)
        return;
      if (send(p[1 - i].fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
        return;
    }
  }
}

static void *dropper_main(void *arg) {
  struct dropper *d = arg;
  int fd = accept(d->listen_fd, NULL, NULL);
  ASSERT(fd >= 0);
  d->conns++;
  char buf[4096];
  while (d->got < d->want) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    d->got += (size_t)n;
  }
  close(fd);
  /* Rank 0 may send again on a connection rank 2 opened to it meanwhile
   * (rank 2 checks on a peer it waits for): then none comes here, and
   * the test ends this wait with shutdown(). */
  fd = accept(d->listen_fd, NULL, NULL);
  if (fd < 0)
    return NULL;
  d->conns++;
  int real = tcp_connect(&d->real);
  pipe_both(fd, real);
  close(fd);
  close(real);
  return NULL;
}

struct sender {
  struct bootstrap *b;
  int peer;
  ncclResult_t r;
  int got[3];
  char err[512];
};

static void *send_three(void *p) {
  struct sender *s = p;
  /* Two with one tag: they must arrive in the order sent. */
  int v[3] = {11, 22, 33};
  s->r = bootstrap_send(s->b, s->peer, 5, &v[0], sizeof v[0]);
  if (s->r == ncclSuccess)
    s->r = bootstrap_send(s->b, s->peer, 5, &v[1], sizeof v[1]);
  if (s->r == ncclSuccess)
    s->r = bootstrap_send(s->b, s->peer, 6, &v[2], sizeof v[2]);
  /* The answer keeps this rank in the bootstrap, where it notices the
   * dropped connection. */
  if (s->r == ncclSuccess)
    s->r = bootstrap_recv(s->b, s->peer, 7, &s->got[0], sizeof s->got[0]);
  snprintf(s->err, sizeof s->err, "%s", s->r == ncclSuccess ? "" : err_thread_last());
  return NULL;
}

static void *recv_three(void *p) {
  struct sender *s = p;
  s->r = ncclSuccess;
  for (int i = 0; i < 3 && s->r == ncclSuccess; i++)
    s->r = bootstrap_recv(s->b, s->peer, i < 2 ? 5 : 6, &s->got[i], sizeof s->got[i]);
  int ack = 1;
  if (s->r == ncclSuccess)
    s->r = bootstrap_send(s->b, s->peer, 7, &ack, sizeof ack);
  snprintf(s->err, sizeof s->err, "%s", s->r == ncclSuccess ? "" : err_thread_last());
  return NULL;
}

TEST_IMPL(bootstrap_resend_dropped) {
  setenv("LOOM_TIMEOUT", "5", 1);
  enum { N = 4 };
  struct lrank a[N];
  ncclUniqueId id;
  ASSERT_OK(bootstrap_create_root_id(&id));
  ASSERT(lranks_init_b(a, N, &id, 0) == 0);
  /* Around the ring 0 talks to 1 and 3 only: its first message to 2
   * opens a connection, which goes to the dropper. */
  struct bootstrap *b0 = a[0].b, *b2 = a[2].b;
  ASSERT(b0->by_peer[2] == NULL);
  static struct dropper d;
  d.listen_fd = tcp_listener(&b0->peers[2].addr);
  d.real = b2->addr;
  d.want = sizeof(struct boot_chal) + sizeof(struct boot_proof) +
           3 * (sizeof(struct boot_msg_hdr) + sizeof(int) + BOOT_MAC);
  pthread_t dt, st, rt;
  ASSERT(pthread_create(&dt, NULL, dropper_main, &d) == 0);
  struct sender s = {.b = b0, .peer = 2}, r = {.b = b2, .peer = 0};
  ASSERT(pthread_create(&st, NULL, send_three, &s) == 0);
  ASSERT(pthread_create(&rt, NULL, recv_three, &r) == 0);
  pthread_join(st, NULL);
  pthread_join(rt, NULL);
  ASSERT_MSG(d.got >= d.want, "the dropper got %zu bytes of the first connection, expected %zu", d.got, d.want);
  ASSERT_MSG(r.r == ncclSuccess,
             "rank 2 never got what rank 0 wrote on a connection its listener dropped unanswered: %s", r.err);
  ASSERT_MSG(s.r == ncclSuccess, "rank 0: %s", s.err);
  ASSERT_MSG(r.got[0] == 11 && r.got[1] == 22 && r.got[2] == 33, "rank 2 got %d, %d, %d; expected 11, 22, 33",
             r.got[0], r.got[1], r.got[2]);
  printf("rank 0's three messages went again after their connection was dropped (%d connection(s) through the "
         "dropper)\n", d.conns);
  lranks_close(a, N);
  shutdown(d.listen_fd, SHUT_RDWR);
  pthread_join(dt, NULL);
  close(d.listen_fd);
  return 0;
}

/* ---- a greeting a byte at a time ---- */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

struct dribble {
  union sock_addr to;
  const unsigned char *bytes;
  size_t len, slow; /* the first `slow` bytes one at a time */
  int ms;
  union sock_addr strangers_to;
  int strangers[4];
};

static void *dribble_main(void *p) {
  struct dribble *d = p;
  int fd = tcp_connect(&d->to);
  for (size_t i = 0; i < d->slow; i++) {
    /* A listener that cuts the greeting off ends the dribble; the test
     * then finds the message missing. */
    if (send(fd, d->bytes + i, 1, MSG_NOSIGNAL) != 1) {
      close(fd);
      return NULL;
    }
    /* The link's pace is the scenario: slower than GREETING_NS in all. */
    sleep_ms(d->ms);
    /* Silent strangers come meanwhile, more than the table holds. */
    if (i < 4)
      d->strangers[i] = tcp_connect(&d->strangers_to);
  }
  (void)send(fd, d->bytes + d->slow, d->len - d->slow, MSG_NOSIGNAL);
  /* Held open until the test is done: the listener reads at its pace. */
  char c;
  (void)recv(fd, &c, 1, 0);
  close(fd);
  return NULL;
}

TEST_IMPL(bootstrap_greeting_slow) {
  setenv("LOOM_TIMEOUT", "8", 1);
  setenv("LOOM_BOOTSTRAP_PENDING", "2", 1);
  enum { N = 2 };
  struct lrank a[N];
  ncclUniqueId id;
  ASSERT_OK(bootstrap_create_root_id(&id));
  ASSERT(lranks_init(a, N, &id) == 0);
  unsetenv("LOOM_BOOTSTRAP_PENDING");
  struct bootstrap *b0 = a[0].b;
  /* What rank 1 would send on a new connection to rank 0. */
  struct boot_id bid;
  memcpy(&bid, id.internal, sizeof bid);
  struct boot_chal chal;
  memset(&chal, 0, sizeof chal);
  memcpy(chal.magic, chal_magic, sizeof chal.magic);
  chal.from = 1;
  chal.to = 0;
  chal.nranks = N;
  memset(chal.nonce, 0x5d, sizeof chal.nonce);
  const int value = 4321;
  static unsigned char rec[BOOT_GREETING_MAX];
  size_t at = boot_greeting(bid.secret, &chal, b0->nonce, 99, value, rec);
  /* 96 bytes at 30 ms: 2.9 s for the greeting, GREETING_NS is 2 s. */
  struct dribble d = {.to = b0->addr, .bytes = rec, .len = at, .slow = sizeof chal + sizeof(struct boot_proof), .ms = 30,
                      .strangers_to = b0->addr};
  for (int i = 0; i < 4; i++)
    d.strangers[i] = -1;
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, dribble_main, &d) == 0);
  int got = 0;
  ncclResult_t r = bootstrap_recv(b0, 1, 99, &got, sizeof got);
  ASSERT_MSG(r == ncclSuccess, "the message behind a slow greeting never arrived: %s", err_thread_last());
  ASSERT(got == value);
  lranks_close(a, N);
  pthread_join(th, NULL);
  for (int i = 0; i < 4; i++)
    if (d.strangers[i] >= 0)
      close(d.strangers[i]);
  return 0;
}

/* ---- more ranks join at once than the root reads ---- */

TEST_IMPL(bootstrap_root_crowd) {
  enum { N = 32 };
  setenv("LOOM_TIMEOUT", "30", 1);
  /* The root and every rank read 4 greetings at once: 32 ranks joining
   * together are 8 times that. */
  setenv("LOOM_BOOTSTRAP_PENDING", "4", 1);
  static struct lrank a[N];
  ncclUniqueId id;
  ASSERT_OK(bootstrap_create_root_id(&id));
  int failed = lranks_init(a, N, &id);
  unsetenv("LOOM_BOOTSTRAP_PENDING");
  ASSERT_MSG(failed == 0, "%d of %d ranks did not get past a root that reads 4 greetings at once", failed, N);
  lranks_close(a, N);
  return 0;
}

/* ---- the secrets of split and shrink children ---- */

static int contains(const void *hay, size_t n, const void *needle, size_t m) {
  for (size_t i = 0; i + m <= n; i++)
    if (memcmp((const char *)hay + i, needle, m) == 0)
      return 1;
  return 0;
}

TEST_IMPL(bootstrap_child_secret) {
  setenv("LOOM_TIMEOUT", "20", 1);
  enum { N = 3 };
  struct lrank a[N], c[N];
  ncclUniqueId id;
  ASSERT_OK(bootstrap_create_root_id(&id));
  ASSERT(lranks_init(a, N, &id) == 0);
  struct boot_id parent;
  memcpy(&parent, id.internal, sizeof parent);

  /* The leader starts the child's root; the others hear only `at`. */
  struct bootstrap_child at;
  ASSERT_OK(bootstrap_child_root(a[0].b, "split", 7, 2, &at));
  ncclUniqueId child[N];
  for (int r = 0; r < N; r++)
    ASSERT_OK(bootstrap_child_id(a[r].b, "split", 7, 2, &at, &child[r]));
  for (int r = 1; r < N; r++)
    ASSERT_MSG(memcmp(&child[r], &child[0], sizeof child[0]) == 0, "rank %d derived another child id than rank 0", r);
  struct boot_id cid;
  memcpy(&cid, child[0].internal, sizeof cid);
  ASSERT_MSG(memcmp(cid.secret, parent.secret, BOOT_KEY) != 0, "the child has its parent's secret");
  ASSERT_MSG(!contains(&at, sizeof at, cid.secret, 8), "what the leader sends holds the child's secret");
  ASSERT(memcmp(&cid.root, &at.root, sizeof at.root) == 0);
  /* Another colour, another split, another kind: another secret. */
  const struct {
    const char *kind;
    uint64_t seq;
    int color;
  } other[] = {{"split", 7, 3}, {"split", 8, 2}, {"shrink", 7, 2}};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    ncclUniqueId o;
    ASSERT_OK(bootstrap_child_id(a[1].b, other[i].kind, other[i].seq, other[i].color, &at, &o));
    struct boot_id oid;
    memcpy(&oid, o.internal, sizeof oid);
    ASSERT_MSG(memcmp(oid.secret, cid.secret, BOOT_KEY) != 0, "%s %llu colour %d derived the same secret",
               other[i].kind, (unsigned long long)other[i].seq, other[i].color);
  }
  /* And the child forms on it. */
  ASSERT(lranks_init(c, N, &child[0]) == 0);
  for (int r = 0; r < N; r++)
    ASSERT_MSG(memcmp(c[r].b->key, cid.secret, BOOT_KEY) == 0, "child rank %d runs on another key", r);
  lranks_close(c, N);
  lranks_close(a, N);
  return 0;
}

/* The comm hash, in logs and status pages, says nothing of the secret. */
TEST_IMPL(bootstrap_id_hash_public) {
  ncclUniqueId id, other;
  /* An id as NCCL_COMM_ID makes it: no root is started. */
  setenv("NCCL_COMM_ID", "127.0.0.1:9", 1);
  setenv("LOOM_SECRET", "a secret", 1);
  ASSERT_OK(bootstrap_get_unique_id(&id));
  unsetenv("NCCL_COMM_ID");
  unsetenv("LOOM_SECRET");
  other = id;
  struct boot_id bid;
  memcpy(&bid, other.internal, sizeof bid);
  for (int i = 0; i < BOOT_KEY; i++)
    bid.secret[i] ^= 0xa5;
  memcpy(other.internal, &bid, sizeof bid);
  ASSERT_MSG(bootstrap_id_hash(&id) == bootstrap_id_hash(&other), "the comm hash depends on the secret");
  /* It still tells communicators apart: another tag, another hash. */
  bid.tag[0] ^= 1;
  memcpy(other.internal, &bid, sizeof bid);
  ASSERT(bootstrap_id_hash(&id) != bootstrap_id_hash(&other));
  bootstrap_id_wipe(&other);
  for (size_t i = 0; i < sizeof other.internal; i++)
    ASSERT(other.internal[i] == 0);
  return 0;
}

/* ---- strangers logged, a flood of them not line by line ---- */

TEST_IMPL(bootstrap_warn_limit) {
  struct boot_warn w = {0};
  int lines = 0, counted = 0;
  for (int i = 0; i < 1000; i++) {
    int n = boot_warn_take(&w);
    lines += n > 0;
    counted += n;
  }
  /* All within a second: the first ones, one by one, then none. */
  ASSERT_MSG(lines == BOOT_WARN_FIRST, "%d lines for 1000 strangers within a second, expected %d", lines,
             BOOT_WARN_FIRST);
  ASSERT(counted + w.held == 1000);
  /* A second later the next one says how many went unsaid. */
  w.last -= 1000000000ull;
  int n = boot_warn_take(&w);
  ASSERT_MSG(n == 1000 - BOOT_WARN_FIRST + 1, "the line after a second stands for %d, expected %d", n,
             1000 - BOOT_WARN_FIRST + 1);
  char more[128];
  ASSERT(strstr(boot_warn_more(n, more, sizeof more), "984 more"));
  ASSERT(boot_warn_more(1, more, sizeof more)[0] == '\0');
  return 0;
}

/* A connection's keys do not outlive it. */
TEST_IMPL(bootstrap_conn_keys_wiped) {
  static const uint8_t key[BOOT_KEY] = {7};
  int sv[2];
  ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  uint8_t nonce[BOOT_NONCE];
  memset(nonce, 3, sizeof nonce);
  struct boot_conn c;
  union sock_addr unused;
  memset(&unused, 0, sizeof unused);
  ASSERT_OK(boot_conn_connect(&c, &unused, sv[0], key, 1, 0, 2, nonce));
  ASSERT(c.has_keys && c.state == BC_ANSWER);
  ASSERT_OK(boot_conn_queue(&c, 1, 5, "abc", 3));
  boot_conn_close(&c);
  static const struct boot_keys zero;
  ASSERT(memcmp(&c.keys, &zero, sizeof zero) == 0 && c.txq == NULL && c.held == NULL && c.fd == -1);
  close(sv[1]);
  return 0;
}
