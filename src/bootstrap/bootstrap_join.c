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

/* One try at the root. *again is set when the root dropped the
 * connection before it answered, so that joining again is right. The
 * first try waits for a root that is not up yet (NCCL_COMM_ID's rank 0
 * may start last); a later one, when nothing listens, finds the root gone. */
static ncclResult_t join_once(struct bootstrap *b, const ncclUniqueId *uid, const union sock_addr *root,
                              const char *root_str, uint64_t deadline, int first, struct boot_peer *next,
                              int *again) {
  char what[96], why[256], text[BOOT_REPLY_MSG_MAX + 1];
  snprintf(what, sizeof what, "the bootstrap root at %s", root_str);
  *again = 0;
  int fd;
  CHECK(sock_connect(root, deadline, first, "the bootstrap root", &fd));
  struct boot_conn c;
  /* Takes fd, closing it if it fails. */
  CHECK(boot_conn_connect(&c, root, fd, b->key, b->rank, BOOT_TO_ROOT, b->nranks, NULL));
  ncclResult_t r;
  enum boot_event ev = BE_NONE;
  struct boot_msg *m = NULL;
  CHECK_GOTO(boot_conn_wait(&c, deadline, b->abort_flag, what, &ev, &m, why, sizeof why), r, out);
  if (ev == BE_WRONG_SECRET) {
    char hint[256];
    bootstrap_id_secret_hint(uid, hint, sizeof hint);
    r = err_set(ncclInvalidUsage, "the bootstrap root at %s refused rank %d: %s", root_str, b->rank, hint);
    goto out;
  }
  if (ev != BE_OPENED) {
    *again = ev == BE_BROKEN || ev == BE_CLOSED;
    r = err_set(ncclRemoteError, "rank %d cannot join the bootstrap root at %s: %s", b->rank, root_str, why);
    goto out;
  }
  struct root_hello h;
  memset(&h, 0, sizeof h);
  h.rank = b->rank;
  h.nranks = b->nranks;
  h.pid = (int)getpid();
  h.me.addr = b->addr;
  memcpy(h.me.nonce, b->nonce, sizeof h.me.nonce);
  gethostname(h.host, sizeof h.host - 1);
  r = boot_conn_send_wait(&c, BOOT_TAG_HELLO, &h, sizeof h, deadline, what);
  if (r != ncclSuccess) {
    /* The root may have dropped the connection before the hello. */
    *again = time_ns() < deadline;
    goto out;
  }
  /* The root enforces the join timeout itself and then says who is
   * missing; waiting a little longer than it lets that sentence arrive. */
  CHECK_GOTO(boot_conn_wait(&c, deadline + 5 * GREETING_NS, b->abort_flag, what, &ev, &m, why, sizeof why), r, out);
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
  b->stats.root_sent += c.bytes_out;
  b->stats.root_recv += c.bytes_in;
  free(m);
  boot_conn_close(&c); /* zeroes its keys too */
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

/* The root's answer for this rank: the next rank's address, or the
 * sentence that says why the job cannot form. */
static ncclResult_t join_root(struct bootstrap *b, const ncclUniqueId *uid, const union sock_addr *root,
                              const char *root_str, struct boot_peer *next) {
  uint64_t deadline = deadline_from_timeout();
  /* From 10 ms to 1 s, with jitter, so ranks that were dropped together
   * do not come back together. */
  uint64_t pause = 10000000ull;
  for (int tries = 1;; tries++) {
    int again = 0;
    ncclResult_t r = join_once(b, uid, root, root_str, deadline, tries == 1, next, &again);
    if (r == ncclSuccess || !again || time_ns() + pause >= deadline)
      return r;
    INFO(LOG_BOOTSTRAP, "bootstrap: rank %d joins the root at %s again (try %d): %s", b->rank, root_str, tries + 1,
         err_thread_last());
    uint8_t jitter = 0;
    (void)util_random(&jitter, 1);
    join_pause(b, pause / 2 + pause * jitter / 512);
    pause = LOOM_MIN(2 * pause, 1000000000ull);
  }
}

ncclResult_t bootstrap_init(const ncclUniqueId *uid, int rank, int nranks, const volatile int *abort_flag,
                            struct bootstrap **out) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  uint64_t t0 = time_ns();
  char ifname[IF_NAMESIZE], root_str[SOCK_ADDR_STRLEN], a[SOCK_ADDR_STRLEN];
  sock_addr_str(&id.root, root_str, sizeof root_str);
  union sock_addr root = id.root;
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
  CHECK_GOTO(join_root(b, uid, &root, root_str, &next), res, fail);
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
