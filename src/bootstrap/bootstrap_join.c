/*
 * A rank joins the bootstrap (bootstrap.h): it listens, proves the secret
 * to the root, says where it listens and hears where the next rank does;
 * the ranks then pass the rest of the table around the ring.
 *
 * The root reads a bounded number of greetings at once, and may drop a
 * connection that stalls in the middle of its greeting (bootstrap_root.c).
 * A rank whose connection ends before the root has answered it has not
 * been admitted (the root keeps every admitted rank's connection until it
 * answers), so it joins again, until LOOM_TIMEOUT.
 *
 * With several unique ids (ncclCommInitRankScalable) a rank joins the
 * root of its block (boot_block), and the first rank of a block also
 * greets the root of the block before, which tells that block's last
 * rank where it listens. It sends that greeting before it waits for its
 * own root and takes the answer after: a root answers only once all of
 * its block and that neighbour have greeted it, so waiting for either
 * answer first could wait around the whole ring of roots.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "misc/utils.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One root of the job, as a rank greets it. */
struct root_link {
  const ncclUniqueId *uid;
  uint8_t key[BOOT_KEY];
  union sock_addr addr;
  char str[SOCK_ADDR_STRLEN], what[96];
  int index, nroots, role;
  struct boot_conn c; /* open between join_start and join_finish */
};

static void root_link_init(struct root_link *jr, const ncclUniqueId *uid, int index, int nroots, int role) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  jr->uid = uid;
  memcpy(jr->key, id.secret, sizeof jr->key);
  jr->addr = id.root;
  boot_cleanse(&id, sizeof id);
  sock_addr_str(&jr->addr, jr->str, sizeof jr->str);
  snprintf(jr->what, sizeof jr->what, "the bootstrap root at %s", jr->str);
  jr->index = index;
  jr->nroots = nroots;
  jr->role = role;
}

static void join_close(struct bootstrap *b, struct root_link *jr) {
  b->stats.root_sent += jr->c.bytes_out;
  b->stats.root_recv += jr->c.bytes_in;
  boot_conn_close(&jr->c); /* zeroes its keys too */
}

/* Connects to the root, proves the secret and says hello; on success
 * jr->c stays open for join_finish. *again is set when the root dropped
 * the connection, so that greeting again is right. The first try waits
 * for a root that is not up yet (NCCL_COMM_ID's rank 0 may start last);
 * a later one, when nothing listens, finds the root gone. */
static ncclResult_t join_start(struct bootstrap *b, struct root_link *jr, uint64_t deadline, int first,
                               int *again) {
  char why[256];
  *again = 0;
  int fd;
  CHECK(sock_connect(&jr->addr, deadline, first, "the bootstrap root", &fd));
  /* Takes fd, closing it if it fails. */
  CHECK(boot_conn_connect(&jr->c, &jr->addr, fd, jr->key, b->rank, BOOT_TO_ROOT, b->nranks, NULL));
  ncclResult_t r;
  enum boot_event ev = BE_NONE;
  struct boot_msg *m = NULL;
  CHECK_GOTO(boot_conn_wait(&jr->c, deadline, 0, b->abort_flag, jr->what, &ev, &m, why, sizeof why), r, fail);
  free(m);
  if (ev == BE_WRONG_SECRET) {
    char hint[256];
    bootstrap_id_secret_hint(jr->uid, hint, sizeof hint);
    r = err_set(ncclInvalidUsage, "the bootstrap root at %s refused rank %d: %s", jr->str, b->rank, hint);
    goto fail;
  }
  if (ev != BE_OPENED) {
    *again = ev == BE_BROKEN || ev == BE_CLOSED;
    r = err_set(ncclRemoteError, "rank %d cannot join the bootstrap root at %s: %s", b->rank, jr->str, why);
    goto fail;
  }
  struct root_hello h;
  memset(&h, 0, sizeof h);
  h.rank = b->rank;
  h.nranks = b->nranks;
  h.pid = (int)getpid();
  h.nroots = jr->nroots;
  h.root = jr->index;
  h.role = jr->role;
  h.me.addr = b->addr;
  memcpy(h.me.nonce, b->nonce, sizeof h.me.nonce);
  gethostname(h.host, sizeof h.host - 1);
  r = boot_conn_send_wait(&jr->c, BOOT_TAG_HELLO, &h, sizeof h, deadline, 0, jr->what);
  if (r != ncclSuccess) {
    /* The root may have dropped the connection before the hello. */
    *again = time_ns() < deadline;
    goto fail;
  }
  return ncclSuccess;
fail:
  join_close(b, jr);
  return r;
}

/* The root's answer to the hello join_start sent; closes the connection. */
static ncclResult_t join_finish(struct bootstrap *b, struct root_link *jr, uint64_t deadline, struct boot_peer *next,
                                int *again) {
  char why[256], text[BOOT_REPLY_MSG_MAX + 1];
  const char *root_str = jr->str;
  *again = 0;
  ncclResult_t r;
  enum boot_event ev = BE_NONE;
  struct boot_msg *m = NULL;
  /* The root enforces the join timeout itself and then says who is
   * missing; waiting a little longer than it lets that sentence arrive. */
  CHECK_GOTO(
      boot_conn_wait(&jr->c, deadline + 5 * GREETING_NS, 0, b->abort_flag, jr->what, &ev, &m, why, sizeof why), r,
      out);
  if (ev != BE_MSG) {
    /* Not admitted: the root answers every rank it admitted before it
     * lets its connection go. */
    *again = ev == BE_BROKEN || ev == BE_CLOSED;
    r = err_set(ncclRemoteError, "the bootstrap root at %s did not answer rank %d: %s", root_str, b->rank,
                ev == BE_CLOSED ? "it closed the connection" : why);
    goto out;
  }
  struct root_reply rep;
  enum boot_verdict v = m->tag == BOOT_TAG_REPLY ? boot_reply_check(m->data, m->len, b->nranks, &rep, text, sizeof text)
                                                 : BOOT_BAD_FIELD;
  if (v != BOOT_OK) {
    r = err_set(ncclRemoteError, "the bootstrap root at %s answered with %s", root_str, boot_verdict_str(v));
    goto out;
  }
  if (rep.status != ncclSuccess) {
    r = err_set((ncclResult_t)rep.status, "rank %d: the bootstrap root at %s says: %s", b->rank, root_str, text);
    goto out;
  }
  *next = rep.next;
  r = ncclSuccess;
out:
  free(m);
  join_close(b, jr);
  return r;
}

/* Waits `ns` before joining again, or less if the communicator is
 * aborted meanwhile (the next try then says so). */
static void join_pause(const struct bootstrap *b, uint64_t ns) {
  uint64_t end = time_ns() + ns;
  for (uint64_t now = time_ns(); now < end; now = time_ns()) {
    if (b->abort_flag && __atomic_load_n(b->abort_flag, __ATOMIC_ACQUIRE))
      return;
    uint64_t ms = (end - now) / 1000000 + 1;
    poll(NULL, 0, ms > 100 ? 100 : (int)ms);
  }
}

/* Greets the root until it takes the hello (and, with `answer`, until it
 * answers: the next rank's address, or the sentence that says why the job
 * cannot form). Without `answer` the connection stays open for
 * join_finish. */
static ncclResult_t join_retry(struct bootstrap *b, struct root_link *jr, uint64_t deadline, int answer,
                               struct boot_peer *next) {
  /* From 10 ms to 1 s, with jitter, so ranks that were dropped together
   * do not come back together. */
  uint64_t pause = 10000000ull;
  for (int tries = 1;; tries++) {
    int again = 0;
    ncclResult_t r = join_start(b, jr, deadline, tries == 1, &again);
    if (r == ncclSuccess && answer)
      r = join_finish(b, jr, deadline, next, &again);
    if (r == ncclSuccess || !again || time_ns() + pause >= deadline)
      return r;
    INFO(LOG_BOOTSTRAP, "bootstrap: rank %d joins the root at %s again (try %d): %s", b->rank, jr->str, tries + 1,
         err_thread_last());
    uint8_t jitter = 0;
    (void)util_random(&jitter, 1);
    join_pause(b, pause / 2 + pause * jitter / 512);
    pause = LOOM_MIN(2 * pause, 1000000000ull);
  }
}

/* This rank's place among the roots: the root of its block gives the next
 * rank's address; the first rank of a block also tells the root before. */
static ncclResult_t join_roots(struct bootstrap *b, const ncclUniqueId *uids, int nids, struct boot_peer *next) {
  uint64_t deadline = deadline_from_timeout();
  int k = boot_root_of(b->rank, b->nranks, nids), lo, count;
  boot_block(b->nranks, nids, k, &lo, &count);
  struct root_link own, prev;
  root_link_init(&own, &uids[k], k, nids, ROOT_MEMBER);
  if (nids == 1 || b->rank != lo)
    return join_retry(b, &own, deadline, 1, next);
  int p = (k + nids - 1) % nids;
  root_link_init(&prev, &uids[p], p, nids, ROOT_NEIGHBOUR);
  CHECK(join_retry(b, &prev, deadline, 0, NULL));
  ncclResult_t r = join_retry(b, &own, deadline, 1, next);
  if (r != ncclSuccess) {
    join_close(b, &prev);
    return r;
  }
  struct boot_peer mine;
  int again = 0;
  r = join_finish(b, &prev, deadline, &mine, &again);
  /* Dropped before the answer: this rank's own join is done, so greeting
   * again and waiting for the answer holds nobody up. */
  if (r != ncclSuccess && again)
    r = join_retry(b, &prev, deadline, 1, &mine);
  return r;
}

ncclResult_t bootstrap_init(const ncclUniqueId *uids, int nids, int rank, int nranks, const volatile int *abort_flag,
                            struct bootstrap **out) {
  /* The first id's secret is the job's: every rank has it, whichever root
   * it joins. */
  const ncclUniqueId *uid = &uids[0];
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  uint64_t t0 = time_ns();
  char ifname[IF_NAMESIZE], root_str[SOCK_ADDR_STRLEN + 32], a[SOCK_ADDR_STRLEN];
  sock_addr_str(&id.root, root_str, SOCK_ADDR_STRLEN);
  if (nids > 1)
    snprintf(root_str + strlen(root_str), sizeof root_str - strlen(root_str), " and %d more", nids - 1);
  struct bootstrap *b = calloc(1, sizeof *b);
  if (!b) {
    boot_cleanse(&id, sizeof id);
    return err_set(ncclSystemError, "out of memory for the bootstrap");
  }
  b->rank = rank;
  b->nranks = nranks;
  memcpy(b->key, id.secret, sizeof b->key);
  boot_cleanse(&id, sizeof id);
  b->id_hash = bootstrap_id_hash(uid);
  b->max_pending = (int)param_int(P_BOOTSTRAP_PENDING);
  b->listen_fd = -1;
  b->abort_flag = abort_flag;
  b->stash_tail = &b->stash;
  b->gone_why_peer = -1;
  pthread_mutex_init(&b->lock, NULL);
  ncclResult_t res;
  union sock_addr bind_addr;
  struct boot_peer next;
  CHECK_GOTO(bootstrap_local_address(&bind_addr, ifname, sizeof ifname), res, fail);
  CHECK_GOTO(UTIL_CALLOC(&b->peers, nranks, "bootstrap addresses"), res, fail);
  CHECK_GOTO(UTIL_CALLOC(&b->by_peer, nranks, "bootstrap connections"), res, fail);
  CHECK_GOTO(UTIL_CALLOC(&b->gone, nranks, "bootstrap peers"), res, fail);
  CHECK_GOTO(UTIL_CALLOC(&b->tx, nranks, "bootstrap messages"), res, fail);
  CHECK_GOTO(sock_listen(&bind_addr, &b->listen_fd, &b->addr), res, fail);
  sock_set_nonblocking(b->listen_fd);
  CHECK_GOTO(util_random(b->nonce, sizeof b->nonce), res, fail);
  INFO(LOG_BOOTSTRAP, "bootstrap: rank %d listens on %s (%s), root is %s", rank,
       sock_addr_str(&b->addr, a, sizeof a), ifname, root_str);
  CHECK_GOTO(join_roots(b, uids, nids, &next), res, fail);
  b->peers[rank].addr = b->addr;
  memcpy(b->peers[rank].nonce, b->nonce, sizeof b->nonce);
  b->peers[(rank + 1) % nranks] = next;
  /* The rest of the table goes around the ring. */
  if (nranks > 1)
    CHECK_GOTO(bootstrap_allgather(b, b->peers, sizeof *b->peers), res, fail);
  for (int r = 0; r < nranks; r++)
    if (boot_peer_check(&b->peers[r]) != BOOT_OK) {
      res = err_set(ncclRemoteError, "rank %d's bootstrap address, as the ring passed it on, is neither IPv4 nor IPv6",
                    r);
      goto fail;
    }
  INFO(LOG_BOOTSTRAP,
       "bootstrap: rank %d of %d joined in %.1f ms: %d connection(s) opened, %d accepted; %llu bytes to the root, "
       "%llu from it",
       rank, nranks, (double)(time_ns() - t0) / 1e6, b->stats.opened, b->stats.accepted,
       (unsigned long long)b->stats.root_sent, (unsigned long long)b->stats.root_recv);
  *out = b;
  return ncclSuccess;
fail:
  if (strstr(err_thread_last(), "bootstrap") == NULL)
    err_context("bootstrap of rank %d (root %s)", rank, root_str);
  bootstrap_close(b);
  return res;
}
