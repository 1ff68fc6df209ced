/*
 * The socket plugin on its own, both ends in this process over loopback:
 * messages of every size around the split threshold arrive whole and in
 * order with each shape of threads and sockets, also when many small ones
 * are queued before any is read; the descriptors a waiting caller blocks
 * on, and the congestion control of a loopback connection; a message
 * larger than the posted buffer is refused; a peer that closes fails what
 * it left unfinished with the usual sentence; the handshake files sockets
 * under the right connection whatever order they come in, and drops
 * strangers; a connector whose socket a listener closed unread dials
 * again; a reset after the last send is found by probe; both directions
 * share one socket where asked (duplex); closing joins the helper threads
 * and closes every descriptor.
 */
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/socket/net_socket.h"
#include "test.h"

static const struct net_plugin *P = &net_socket_plugin;

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  ASSERT(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void set_shape(int nthreads, int nspt, long min_task) {
  char v[32];
  snprintf(v, sizeof v, "%d", nthreads);
  setenv("NCCL_SOCKET_NTHREADS", v, 1);
  snprintf(v, sizeof v, "%d", nspt);
  setenv("NCCL_NSOCKS_PERTHREAD", v, 1);
  snprintf(v, sizeof v, "%ld", min_task);
  setenv("NCCL_SOCKET_MIN_TASKSIZE", v, 1);
}

/* Connects a send comm to a recv comm, driving both state machines. */
static void pair(void **s, void **r) {
  char handle[NET_HANDLE_MAXSIZE];
  void *l = NULL;
  ASSERT_OK(P->listen(0, handle, &l));
  *s = *r = NULL;
  int sdone = 0, rdone = 0;
  for (int spin = 0; !(sdone && rdone); spin++) {
    ASSERT_MSG(spin < 1000000, "connection never completed");
    if (!sdone) {
      ncclResult_t e = P->connect(0, handle, s);
      ASSERT_MSG(e == ncclSuccess || e == ncclInProgress, "connect: %s", err_thread_last());
      sdone = e == ncclSuccess;
    }
    if (!rdone) {
      ncclResult_t e = P->accept(l, r);
      ASSERT_MSG(e == ncclSuccess || e == ncclInProgress, "accept: %s", err_thread_last());
      rdone = e == ncclSuccess;
    }
  }
  ASSERT_OK(P->close_listen(l));
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)((i * 131 + seed * 7919 + (i >> 12)) & 255);
}

/* Waits for `req`; its result. */
static ncclResult_t wait_req(void *req, size_t *size) {
  for (;;) {
    int done = 0;
    ncclResult_t r = P->test(req, &done, size);
    if (r != ncclSuccess || done)
      return r;
  }
}

/* Waits for two requests at once (either may be NULL): a large send
 * finishes only when the receiver reads, which takes its test() calls. */
static void wait_two(void *a, size_t *asz, void *b, size_t *bsz) {
  int adone = a == NULL, bdone = b == NULL;
  while (!adone || !bdone) {
    if (!adone)
      ASSERT_MSG(P->test(a, &adone, asz) == ncclSuccess, "%s", err_thread_last());
    if (!bdone)
      ASSERT_MSG(P->test(b, &bdone, bsz) == ncclSuccess, "%s", err_thread_last());
  }
}

/* Sends `n` messages of the given sizes through a fresh pair, `depth` in
 * flight at once, into buffers `slack` bytes larger, and checks them. */
static void roundtrip(const size_t *sizes, int n, int depth, size_t slack) {
  void *s, *r;
  pair(&s, &r);
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += sizes[i] + slack;
  unsigned char *src = malloc(total ? total : 1), *dst = malloc(total ? total : 1);
  ASSERT(src && dst);
  memset(dst, 0xee, total);
  size_t *off = calloc((size_t)n, sizeof *off);
  void **sreq = calloc((size_t)n, sizeof *sreq), **rreq = calloc((size_t)n, sizeof *rreq);
  for (int i = 1; i < n; i++)
    off[i] = off[i - 1] + sizes[i - 1] + slack;
  for (int i = 0; i < n; i++)
    fill(src + off[i], sizes[i], (unsigned)i);
  int posted = 0, finished = 0;
  while (finished < n) {
    while (posted < n && posted - finished < depth) {
      ASSERT_OK(P->irecv(r, dst + off[posted], sizes[posted] + slack, NULL, &rreq[posted]));
      ASSERT_OK(P->isend(s, src + off[posted], sizes[posted], NULL, &sreq[posted]));
      ASSERT(rreq[posted] && sreq[posted]);
      posted++;
    }
    size_t got = 0, sent = 0;
    wait_two(sreq[finished], &sent, rreq[finished], &got);
    ASSERT_MSG(got == sizes[finished] && sent == sizes[finished], "message %d: %zu bytes sent, %zu received of %zu",
               finished, sent, got, sizes[finished]);
    ASSERT_MSG(memcmp(src + off[finished], dst + off[finished], sizes[finished]) == 0,
               "message %d of %zu bytes arrived changed", finished, sizes[finished]);
    for (size_t k = 0; k < slack; k++)
      ASSERT_MSG(dst[off[finished] + sizes[finished] + k] == 0xee, "message %d wrote past its end", finished);
    finished++;
  }
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
  free(src);
  free(dst);
  free(off);
  free(sreq);
  free(rreq);
}

static void shapes(void) {
  static const size_t sizes[] = {0,      1,      100,        4095,    4096,        4097,      65535,
                                 65536,  65537,  131072 + 5, 262144,  262144 + 64, 1000000,   (1 << 20) + 3,
                                 12345,  0,      (4 << 20) + 7, 77,   65536 * 3 + 1, 8 << 20, 3};
  int n = (int)(sizeof sizes / sizeof sizes[0]);
  struct {
    int nt, ns;
    long min;
  } shape[] = {{0, 1, 65536}, {1, 1, 65536}, {2, 2, 65536}, {3, 2, 4096}, {1, 4, 1000}, {16, 4, 65536}, {4, 1, 1}};
  for (size_t k = 0; k < sizeof shape / sizeof shape[0]; k++) {
    set_shape(shape[k].nt, shape[k].ns, shape[k].min);
    roundtrip(sizes, n, 1, 0);
    roundtrip(sizes, n, 8, 3);
    roundtrip(sizes, n, 16, 0);
  }
}

/* Small messages queued faster than they are read: the sender's
 * requests leave together in one sendmsg, and the receiver's reads take
 * in the next messages' lengths and payloads ahead of the requests that
 * want them, posted one at a time only after all were sent. Sizes around
 * every boundary of that path (0, a length word, the read-ahead buffer,
 * the split threshold), checked byte for byte with guard bytes behind
 * each buffer. */
static void burst(void) {
  static const size_t sizes[] = {0,     1,     7,     8,     9,     0,     63,    64,    65,    4095,
                                 4096,  16376, 16383, 16384, 16385, 16392, 65535, 65536, 65537, 3,
                                 0,     72,    80,    200,   1,     0,     32768, 5,     16384, 0};
  enum { N = sizeof sizes / sizeof sizes[0], SLACK = 16, BATCH = 2 * NCCL_STEPS };
  void *s, *r;
  pair(&s, &r);
  size_t off[N + 1];
  off[0] = 0;
  for (int i = 0; i < N; i++)
    off[i + 1] = off[i] + sizes[i] + SLACK;
  unsigned char *src = malloc(off[N]), *dst = malloc(off[N]);
  ASSERT(src && dst);
  memset(dst, 0xee, off[N]);
  for (int i = 0; i < N; i++)
    fill(src + off[i], sizes[i], 900u + (unsigned)i);
  for (int first = 0; first < N; first += BATCH) {
    int last = first + BATCH < N ? first + BATCH : N;
    void *sreq[BATCH];
    int sdone[BATCH] = {0};
    for (int i = first; i < last; i++) {
      ASSERT_OK(P->isend(s, src + off[i], sizes[i], NULL, &sreq[i - first]));
      ASSERT(sreq[i - first]);
    }
    /* Nothing is read yet: what the kernel takes piles up on the receiving socket. */
    for (int k = 0; k < 1000; k++)
      for (int i = first; i < last; i++)
        if (!sdone[i - first])
          ASSERT_OK(P->test(sreq[i - first], &sdone[i - first], NULL));
    for (int i = first; i < last; i++) {
      void *rreq;
      ASSERT_OK(P->irecv(r, dst + off[i], sizes[i] + SLACK, NULL, &rreq));
      ASSERT(rreq);
      int rdone = 0;
      size_t got = 0;
      while (!rdone) {
        ASSERT_MSG(P->test(rreq, &rdone, &got) == ncclSuccess, "%s", err_thread_last());
        for (int j = first; j < last; j++)
          if (!sdone[j - first])
            ASSERT_OK(P->test(sreq[j - first], &sdone[j - first], NULL));
      }
      ASSERT_MSG(got == sizes[i], "message %d: %zu bytes received of %zu", i, got, sizes[i]);
      ASSERT_MSG(memcmp(src + off[i], dst + off[i], sizes[i]) == 0, "message %d of %zu bytes arrived changed", i,
                 sizes[i]);
      for (size_t k = 0; k < SLACK; k++)
        ASSERT_MSG(dst[off[i] + sizes[i] + k] == 0xee, "message %d wrote past its end", i);
    }
    for (int i = first; i < last; i++)
      while (!sdone[i - first])
        ASSERT_OK(P->test(sreq[i - first], &sdone[i - first], NULL));
  }
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
  free(src);
  free(dst);
}

/* Drains a 64 MiB message that `s` could only partly send: the receiver
 * takes it while the sender keeps pushing. */
static void drain(void *s, void *sreq, void *r, size_t size) {
  char *dst = malloc(size);
  ASSERT(dst);
  void *rreq;
  ASSERT_OK(P->irecv(r, dst, size, NULL, &rreq));
  wait_two(sreq, NULL, rreq, NULL);
  free(dst);
}

/* What an executor with nothing else to do blocks on (poll_fds): nothing
 * while no request is in flight; the control socket, readable while a
 * receive waits, writable while the socket cannot take a send; never a
 * descriptor (-1) while a request is finished but not yet tested, or its
 * chunks are with a helper thread. Both ends of a loopback connection use
 * Reno, which does not pace. */
static void poll_fds(void) {
  set_shape(0, 1, 65536);
  void *s, *r;
  pair(&s, &r);
  struct pollfd fds[2];
  ASSERT(P->poll_fds(s, fds, 2) == 0 && P->poll_fds(r, fds, 2) == 0);
  char a[8] = "first", b[8] = "second", got[2][8];
  void *rr[2], *sr[2];
  ASSERT_OK(P->irecv(r, got[0], sizeof got[0], NULL, &rr[0]));
  ASSERT_OK(P->irecv(r, got[1], sizeof got[1], NULL, &rr[1]));
  ASSERT(P->poll_fds(r, fds, 2) == 1 && fds[0].events == POLLIN);
  struct pollfd rfd = fds[0];
  ASSERT_MSG(poll(&rfd, 1, 0) == 0, "the control socket is readable before anything was sent");
  /* A kernel without the option (some sandboxes) has nothing to check. */
  char cc[16] = "";
  socklen_t len = sizeof cc;
  int have_cc = getsockopt(rfd.fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) == 0;
  ASSERT_MSG(!have_cc || strcmp(cc, "reno") == 0, "the receiving socket uses %s", cc);
  ASSERT_OK(P->isend(s, a, sizeof a, NULL, &sr[0]));
  ASSERT_OK(P->isend(s, b, sizeof b, NULL, &sr[1]));
  ASSERT(P->poll_fds(s, fds, 2) == 1 && fds[0].events == POLLOUT); /* posted, not yet moved */
  len = sizeof cc;
  ASSERT_MSG(!have_cc || (getsockopt(fds[0].fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) == 0 && strcmp(cc, "reno") == 0),
             "the sending socket uses %s", cc);
  int done = 0;
  ASSERT_OK(P->test(sr[0], &done, NULL)); /* both leave in one sendmsg */
  ASSERT(done);
  ASSERT_MSG(P->poll_fds(s, fds, 2) == -1, "a finished send waiting for test() has a descriptor to wait on");
  ASSERT_OK(P->test(sr[1], &done, NULL));
  ASSERT(done && P->poll_fds(s, fds, 2) == 0);
  ASSERT_MSG(poll(&rfd, 1, 10000) == 1, "the control socket never became readable");
  for (done = 0; !done;)
    ASSERT_OK(P->test(rr[1], &done, NULL)); /* the first one is finished too, untested */
  ASSERT_MSG(P->poll_fds(r, fds, 2) == -1, "a finished receive waiting for test() has a descriptor to wait on");
  ASSERT_OK(P->test(rr[0], &done, NULL));
  ASSERT(done && P->poll_fds(r, fds, 2) == 0 && strcmp(got[0], a) == 0 && strcmp(got[1], b) == 0);
  /* A send larger than the kernel's buffers, with no reader: the socket
   * stays full, and the sender waits for it to take more. */
  size_t big = 64u << 20;
  char *src = calloc(1, big);
  ASSERT(src);
  void *bs;
  ASSERT_OK(P->isend(s, src, big, NULL, &bs));
  ASSERT_OK(P->test(bs, &done, NULL));
  ASSERT(!done && P->poll_fds(s, fds, 2) == 1 && fds[0].events == POLLOUT);
  ASSERT_MSG(poll(fds, 1, 0) == 0, "a full socket is writable");
  drain(s, bs, r, big);
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
  /* With a helper thread: once the length has gone, the chunks are the
   * thread's to move, and no descriptor of the caller's says when. */
  set_shape(1, 1, 4096);
  pair(&s, &r);
  ASSERT_OK(P->isend(s, src, big, NULL, &bs));
  ASSERT_OK(P->test(bs, &done, NULL));
  ASSERT(!done);
  ASSERT_MSG(P->poll_fds(s, fds, 2) == -1, "a send with the helper threads has a descriptor to wait on");
  drain(s, bs, r, big);
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
  free(src);
}

/* The ring of requests is full at 2 x NCCL_STEPS: further posts get no
 * request, and work again once one finishes. */
static void ring_full(void) {
  set_shape(2, 1, 65536);
  void *s, *r;
  pair(&s, &r);
  static char buf[64][4];
  void *req[64];
  int n = 0;
  for (; n < 64; n++) {
    ASSERT_OK(P->irecv(r, buf[n], sizeof buf[n], NULL, &req[n]));
    if (!req[n])
      break;
  }
  ASSERT_MSG(n == 2 * NCCL_STEPS, "%d receives posted", n);
  void *sr;
  ASSERT_OK(P->isend(s, "abc", 4, NULL, &sr));
  wait_two(sr, NULL, req[0], NULL);
  ASSERT(memcmp(buf[0], "abc", 4) == 0);
  void *again;
  ASSERT_OK(P->irecv(r, buf[0], 4, NULL, &again));
  ASSERT(again != NULL);
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
}

/* A message larger than the buffer posted for it is refused, small or
 * split. */
static void too_large(size_t posted, size_t sent) {
  void *s, *r;
  pair(&s, &r);
  char *src = calloc(1, sent), *dst = calloc(1, posted);
  void *sr, *rr;
  ASSERT_OK(P->irecv(r, dst, posted, NULL, &rr));
  ASSERT_OK(P->isend(s, src, sent, NULL, &sr));
  ncclResult_t e = ncclSuccess;
  int sdone = 0, rdone = 0;
  while (e == ncclSuccess && !rdone) {
    if (!sdone)
      ASSERT_OK(P->test(sr, &sdone, NULL)); /* the length goes out when the sender is tested */
    e = P->test(rr, &rdone, NULL);
  }
  char want[96];
  snprintf(want, sizeof want, "sent a message of %zu bytes into a %zu-byte buffer", sent, posted);
  ASSERT_MSG(e == ncclInvalidUsage && strstr(err_thread_last(), want), "got %d: %s", (int)e, err_thread_last());
  ASSERT_OK(P->close_recv(r));
  ASSERT_OK(P->close_send(s));
  free(src);
  free(dst);
}

/* One side goes away: what the other left unfinished fails with the
 * sentence every transport uses for it. A large message is cut off in
 * the middle: it is more than the kernel's buffers hold. */
static void peer_closes(int close_sender, size_t size) {
  void *s, *r;
  pair(&s, &r);
  /* Separate buffers: the helper threads send from one while they
   * receive into the other. */
  char *buf = calloc(1, size), *dst = calloc(1, size);
  ASSERT(buf && dst);
  void *req, *sr;
  ncclResult_t e;
  if (close_sender) {
    ASSERT_OK(P->irecv(r, dst, size, NULL, &req));
    ASSERT_OK(P->isend(s, buf, size / 2, NULL, &sr));
    wait_two(sr, NULL, req, NULL); /* a first message goes through */
    ASSERT_OK(P->irecv(r, dst, size, NULL, &req));
    if (size > (1 << 20)) {
      ASSERT_OK(P->isend(s, buf, size, NULL, &sr));
      int done = 0;
      ASSERT_OK(P->test(sr, &done, NULL)); /* it starts, then the sender is gone */
    }
    ASSERT_OK(P->close_send(s));
    e = wait_req(req, NULL);
  } else {
    ASSERT_OK(P->close_recv(r));
    /* The kernel may take a small message or two before the reset comes
     * back: keep sending until a send fails. */
    e = ncclSuccess;
    for (int k = 0; k < 10000 && e == ncclSuccess; k++) {
      ASSERT_OK(P->isend(s, buf, size, NULL, &req));
      e = wait_req(req, NULL);
    }
  }
  /* A receiver sees the sender's orderly end; a sender writing to a
   * closed socket gets the peer kernel's reset back, which it cannot tell
   * from a reset on the way, and must not call a close. */
  const char *want = close_sender ? "was closed by the peer (its process exited, aborted or closed the connection)"
                                  : "the other end reset or closed it";
  if (!close_sender && strstr(err_thread_last(), "was reset, by the peer's host or by something between"))
    want = "was reset";
  ASSERT_MSG(e == ncclRemoteError && strstr(err_thread_last(), want), "%s %zu: got %d: %s",
             close_sender ? "sender closed" : "receiver closed", size, (int)e, err_thread_last());
  ASSERT_OK(close_sender ? P->close_recv(r) : P->close_send(s));
  free(buf);
  free(dst);
}

/* probe: a send whose bytes all left is finished, so nothing would see a
 * reset that comes after it; the probe reads it off the socket. A
 * receiver that read everything and closed is an orderly end, no error. */
static void probe_after_send(int unread) {
  set_shape(0, 1, 65536);
  void *s, *r, *req;
  pair(&s, &r);
  char buf[1000] = {0}, dst[1000];
  ASSERT_OK(P->isend(s, buf, sizeof buf, NULL, &req));
  ASSERT_OK(wait_req(req, NULL));
  if (!unread) {
    ASSERT_OK(P->irecv(r, dst, sizeof dst, NULL, &req));
    ASSERT_OK(wait_req(req, NULL));
  }
  ASSERT_OK(P->close_recv(r)); /* with bytes unread, the kernel resets */
  ncclResult_t e = ncclSuccess;
  uint64_t until = time_ns() + 5000000000ull;
  while (unread && e == ncclSuccess && time_ns() < until)
    e = P->probe(s);
  if (unread)
    ASSERT_MSG(e == ncclRemoteError && strstr(err_thread_last(), "was reset"), "probe after a reset: %d: %s", (int)e,
               err_thread_last());
  else
    ASSERT_MSG(P->probe(s) == ncclSuccess, "probe after an orderly close: %s", err_thread_last());
  ASSERT_OK(P->close_send(s));
}

/* A stranger's connection to the listener (no cookie) is dropped; two
 * connections whose sockets arrive interleaved are told apart. */
static void handshake(void) {
  set_shape(2, 2, 4096);
  char handle[NET_HANDLE_MAXSIZE];
  void *l = NULL;
  ASSERT_OK(P->listen(0, handle, &l));
  union sock_addr addr;
  memcpy(&addr, handle + offsetof(struct sock_handle, addr), sizeof addr);
  int stranger = -1;
  ASSERT_OK(sock_connect(&addr, time_ns() + 5000000000ull, 0, "the listener", &stranger));
  char junk[24];
  memset(junk, 0x5a, sizeof junk);
  ASSERT(write(stranger, junk, sizeof junk) == (ssize_t)sizeof junk);
  void *s[2] = {NULL, NULL}, *r[2] = {NULL, NULL};
  int sdone[2] = {0, 0}, nr = 0;
  for (int spin = 0; !(sdone[0] && sdone[1] && nr == 2); spin++) {
    ASSERT_MSG(spin < 1000000, "connections never completed");
    for (int k = 0; k < 2; k++)
      if (!sdone[k]) {
        ncclResult_t e = P->connect(0, handle, &s[k]);
        ASSERT_MSG(e == ncclSuccess || e == ncclInProgress, "connect: %s", err_thread_last());
        sdone[k] = e == ncclSuccess;
      }
    if (nr < 2) {
      ncclResult_t e = P->accept(l, &r[nr]);
      ASSERT_MSG(e == ncclSuccess || e == ncclInProgress, "accept: %s", err_thread_last());
      nr += e == ncclSuccess;
    }
  }
  ASSERT_OK(P->close_listen(l));
  close(stranger);
  /* Each accepted comm carries exactly one connection's message, whole. */
  enum { N = 300000 };
  static unsigned char src[2][N], dst[2][N];
  void *sr[2], *rr[2];
  for (int k = 0; k < 2; k++) {
    fill(src[k], N, 40u + (unsigned)k);
    ASSERT_OK(P->isend(s[k], src[k], N, NULL, &sr[k]));
    ASSERT_OK(P->irecv(r[k], dst[k], N, NULL, &rr[k]));
  }
  int done[4] = {0};
  while (!(done[0] && done[1] && done[2] && done[3]))
    for (int k = 0; k < 2; k++) {
      if (!done[k])
        ASSERT_OK(P->test(sr[k], &done[k], NULL));
      if (!done[2 + k])
        ASSERT_OK(P->test(rr[k], &done[2 + k], NULL));
    }
  int from[2];
  for (int k = 0; k < 2; k++) {
    from[k] = memcmp(dst[k], src[0], N) == 0 ? 0 : memcmp(dst[k], src[1], N) == 0 ? 1 : -1;
    ASSERT_MSG(from[k] >= 0, "accepted comm %d received a mix of both connections", k);
  }
  ASSERT(from[0] != from[1]);
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(P->close_send(s[k]));
    ASSERT_OK(P->close_recv(r[k]));
  }
}

/* A stand-in listener reads each hello the connector sends and answers
 * it with `answer`, or with nothing but a close for the first `drops`. */
static ncclResult_t dial_fake(int drops, unsigned char answer, void **s) {
  set_shape(0, 1, 65536);
  char handle[NET_HANDLE_MAXSIZE];
  void *l = NULL;
  ASSERT_OK(P->listen(0, handle, &l));
  ASSERT_OK(P->close_listen(l));
  union sock_addr addr;
  memcpy(&addr, handle + offsetof(struct sock_handle, addr), sizeof addr);
  addr.sin.sin_port = 0;
  int lfd;
  ASSERT_OK(sock_listen(&addr, &lfd, &addr));
  memcpy(handle + offsetof(struct sock_handle, addr), &addr, sizeof addr);
  *s = NULL;
  uint64_t conn_id = 0;
  ncclResult_t e = ncclInProgress;
  for (int k = 0; k <= drops; k++) {
    ASSERT(P->connect(0, handle, s) == ncclInProgress);
    int fd = accept(lfd, NULL, NULL); /* the connect is under way: this returns */
    ASSERT(fd >= 0);
    struct sock_hello h;
    size_t got = 0;
    while (got < sizeof h) {
      ASSERT(P->connect(0, handle, s) == ncclInProgress);
      ssize_t n = recv(fd, (char *)&h + got, sizeof h - got, MSG_DONTWAIT);
      ASSERT(n != 0);
      got += n > 0 ? (size_t)n : 0;
    }
    ASSERT_MSG(k == 0 || h.conn_id == conn_id, "dial %d came from another connection", k);
    conn_id = h.conn_id;
    if (k < drops) {
      close(fd);
      continue;
    }
    ASSERT(write(fd, &answer, 1) == 1);
    for (int spin = 0; (e = P->connect(0, handle, s)) == ncclInProgress; spin++)
      ASSERT_MSG(spin < 10000000, "the connector never read the answer");
    close(fd);
  }
  close(lfd);
  return e;
}

static void dial_again(void) {
  void *s;
  ASSERT_OK(dial_fake(2, SOCK_ANSWER, &s));
  ASSERT_OK(P->close_send(s));
  ASSERT(dial_fake(0, 0x00, &s) == ncclRemoteError);
  ASSERT_MSG(strstr(err_thread_last(), "not a Loom socket listener's"), "%s", err_thread_last());
  ASSERT_OK(P->close_send(s));
}

/* The fd of a socket comm, for the checks of which socket it uses. */
static int comm_fd(void *comm) { return ((struct sock_comm *)comm)->fd; }

/* Both directions on one socket (duplex): the connector's receive comm
 * and the listener's send comm take the other direction of a connection.
 * Messages of every size cross both ways at once, the largest more than
 * the kernel's buffers hold, and arrive whole; a side's two comms use one
 * socket; closing a send comm ends its direction for the peer's receive,
 * with the usual sentence, while the other direction goes on; a
 * connection with data sockets is not shared. */
static void duplex(void) {
  set_shape(0, 1, 65536);
  void *s, *r, *back_r = NULL, *back_s = NULL;
  pair(&s, &r);
  ASSERT_OK(P->duplex(s, &back_r));
  ASSERT_OK(P->duplex(r, &back_s));
  ASSERT(back_r && back_s);
  struct stat a, b;
  ASSERT(fstat(comm_fd(s), &a) == 0 && fstat(comm_fd(back_r), &b) == 0);
  ASSERT_MSG(a.st_ino == b.st_ino && a.st_dev == b.st_dev, "the connector's two comms are on different sockets");
  ASSERT(fstat(comm_fd(r), &a) == 0 && fstat(comm_fd(back_s), &b) == 0);
  ASSERT_MSG(a.st_ino == b.st_ino && a.st_dev == b.st_dev, "the listener's two comms are on different sockets");

  static const size_t sizes[] = {0, 1, 8, 4095, 16384, 16385, 65537, 1 << 20, 24 << 20};
  enum { N = sizeof sizes / sizeof sizes[0], SLACK = 16 };
  for (int i = 0; i < N; i++) {
    size_t n = sizes[i];
    unsigned char *out = malloc(n + 1), *back = malloc(n + 1), *in = malloc(n + SLACK), *in_back = malloc(n + SLACK);
    ASSERT(out && back && in && in_back);
    fill(out, n, 11u + (unsigned)i);
    fill(back, n, 500u + (unsigned)i);
    memset(in, 0xee, n + SLACK);
    memset(in_back, 0xee, n + SLACK);
    void *req[4];
    ASSERT_OK(P->irecv(r, in, n + SLACK, NULL, &req[0]));
    ASSERT_OK(P->irecv(back_r, in_back, n + SLACK, NULL, &req[1]));
    ASSERT_OK(P->isend(s, out, n, NULL, &req[2]));
    ASSERT_OK(P->isend(back_s, back, n, NULL, &req[3]));
    int done[4] = {0}, left = 4;
    size_t got[4] = {0};
    for (uint64_t until = time_ns() + 30000000000ull; left > 0;) {
      ASSERT_MSG(time_ns() < until, "%zu bytes each way: %d of the 4 requests still unfinished after 30 s", n, left);
      for (int k = 0; k < 4; k++)
        if (!done[k]) {
          ASSERT_MSG(P->test(req[k], &done[k], &got[k]) == ncclSuccess, "%zu bytes each way: %s", n,
                     err_thread_last());
          left -= done[k];
        }
    }
    ASSERT_MSG(got[0] == n && got[1] == n, "%zu bytes each way: %zu and %zu received", n, got[0], got[1]);
    ASSERT_MSG(memcmp(in, out, n) == 0, "%zu bytes: the connector's message arrived changed", n);
    ASSERT_MSG(memcmp(in_back, back, n) == 0, "%zu bytes: the listener's message arrived changed", n);
    for (size_t k = n; k < n + SLACK; k++)
      ASSERT_MSG(in[k] == 0xee && in_back[k] == 0xee, "%zu bytes: a receive wrote past its end", n);
    free(out);
    free(back);
    free(in);
    free(in_back);
  }

  /* The connector's send ends; its receive still takes what comes back. */
  char buf[64] = {0}, dst[64];
  void *req, *breq;
  ASSERT_OK(P->irecv(r, dst, sizeof dst, NULL, &req));
  ASSERT_OK(P->close_send(s));
  ncclResult_t e = ncclSuccess;
  int done = 0;
  for (uint64_t until = time_ns() + 10000000000ull; e == ncclSuccess && !done && time_ns() < until;)
    e = P->test(req, &done, NULL);
  ASSERT_MSG(e == ncclRemoteError && strstr(err_thread_last(), "was closed by the peer"),
             "a receive after the peer closed its send comm: %d: %s", (int)e, err_thread_last());
  memcpy(buf, "still here", 11);
  ASSERT_OK(P->irecv(back_r, dst, sizeof dst, NULL, &req));
  ASSERT_OK(P->isend(back_s, buf, sizeof buf, NULL, &breq));
  wait_two(breq, NULL, req, NULL);
  ASSERT_MSG(strcmp(dst, "still here") == 0, "the other direction stopped with the first");
  ASSERT_OK(P->close_recv(r));
  ASSERT_OK(P->close_send(back_s));
  ASSERT_OK(P->close_recv(back_r));

  /* Data sockets: each direction connects on its own. */
  set_shape(1, 1, 16384);
  pair(&s, &r);
  void *other = s;
  ASSERT_OK(P->duplex(s, &other));
  ASSERT_MSG(other == NULL, "a connection with data sockets was shared");
  other = r;
  ASSERT_OK(P->duplex(r, &other));
  ASSERT_MSG(other == NULL, "a connection with data sockets was shared");
  ASSERT_OK(P->close_send(s));
  ASSERT_OK(P->close_recv(r));
}

TEST_IMPL(unit_net_socket) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  ASSERT_OK(P->init());
  int fds = count_entries("/proc/self/fd"), threads = count_entries("/proc/self/task");
  shapes();
  set_shape(0, 1, 65536);
  burst();
  set_shape(2, 2, 4096);
  burst();
  set_shape(1, 1, 16384);
  burst();
  ring_full();
  poll_fds();
  set_shape(0, 1, 65536);
  too_large(1000, 5000);
  set_shape(2, 2, 65536);
  too_large(1000, 5000);
  too_large(512 << 10, 1 << 20);
  for (int nt = 0; nt <= 2; nt++) {
    set_shape(nt, 2, 65536);
    peer_closes(1, 1000);
    peer_closes(1, 64 << 20);
    peer_closes(0, 1000);
    peer_closes(0, 64 << 20);
  }
  handshake();
  dial_again();
  probe_after_send(1);
  probe_after_send(0);
  duplex();
  ASSERT_MSG(count_entries("/proc/self/fd") == fds, "%d descriptors open, %d before",
             count_entries("/proc/self/fd"), fds);
  ASSERT_MSG(count_entries("/proc/self/task") == threads, "%d threads, %d before",
             count_entries("/proc/self/task"), threads);
  return 0;
}
