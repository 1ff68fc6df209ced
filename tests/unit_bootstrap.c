/*
 * The bootstrap from inside: its records' MACs refuse whatever the secret
 * did not make (another job, another connection, a later step, a changed
 * byte), a connection recorded and replayed into a rank's listener is
 * refused, and the ranks' operations (all-gathers, barriers, tagged
 * messages out of order, messages to themselves, messages larger than a
 * socket holds, sent by every rank at once) run over a few connections
 * that stay open.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "bootstrap/bootstrap_wire.h"
#include "core.h"
#include "test.h"
#include "boot_greeting.h"

ncclResult_t boot_test_barrier(struct bootstrap *b) {
  char *d = calloc((size_t)b->nranks, 1);
  if (!d)
    return ncclSystemError;
  ncclResult_t r = bootstrap_allgather(b, d, 1);
  free(d);
  return r;
}

static const uint8_t key[BOOT_KEY] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
static const uint8_t other_key[BOOT_KEY] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11};

static void make_chal(struct boot_chal *c, int from, int to, int nranks, uint8_t seed) {
  memset(c, 0, sizeof *c);
  memcpy(c->magic, chal_magic, sizeof c->magic);
  c->from = from;
  c->to = to;
  c->nranks = nranks;
  memset(c->nonce, seed, sizeof c->nonce);
}

TEST_IMPL(bootstrap_wire_auth) {
  struct boot_chal chal, chal2;
  make_chal(&chal, 1, 0, 4, 0x11);
  make_chal(&chal2, 1, 0, 4, 0x12);
  uint8_t nonce[BOOT_NONCE];
  memset(nonce, 0x77, sizeof nonce);

  /* A challenge is judged as its bytes come: the first wrong one ends it. */
  struct boot_chal out;
  ASSERT(boot_chal_check("LOOX", 4, 0, 4, &out) == BOOT_NOT_LOOM);
  ASSERT(boot_chal_check(&chal, 5, 0, 4, &out) == BOOT_SHORT);
  ASSERT(boot_chal_check(&chal, sizeof chal, 0, 4, &out) == BOOT_OK);
  ASSERT(boot_chal_check(&chal, sizeof chal, 2, 4, &out) == BOOT_BAD_FIELD);  /* meant for another rank */
  ASSERT(boot_chal_check(&chal, sizeof chal, 0, 5, &out) == BOOT_BAD_FIELD);  /* another job's size */
  ASSERT(boot_chal_check(&chal, sizeof chal, BOOT_TO_ROOT, 0, &out) == BOOT_BAD_FIELD);

  /* Proofs and answers: only the secret makes them, for this challenge
   * and these nonces. */
  struct boot_proof proof;
  ASSERT_OK(boot_proof_make(key, &chal, nonce, &proof));
  ASSERT(boot_proof_check(&proof, sizeof proof, key, &chal, nonce) == BOOT_OK);
  ASSERT(boot_proof_check(&proof, sizeof proof, other_key, &chal, nonce) == BOOT_WRONG_SECRET);
  ASSERT(boot_proof_check(&proof, sizeof proof, key, &chal2, nonce) == BOOT_WRONG_SECRET);
  uint8_t nonce2[BOOT_NONCE];
  memset(nonce2, 0x78, sizeof nonce2);
  ASSERT(boot_proof_check(&proof, sizeof proof, key, &chal, nonce2) == BOOT_WRONG_SECRET);
  struct boot_answer ans, got;
  ASSERT_OK(boot_answer_make(key, &chal, nonce, &ans));
  ASSERT(boot_answer_check(&ans, sizeof ans, key, &chal, NULL, &got) == BOOT_OK);
  ASSERT(boot_answer_check(&ans, sizeof ans, key, &chal, nonce, &got) == BOOT_OK);
  ASSERT(boot_answer_check(&ans, sizeof ans, key, &chal, nonce2, &got) == BOOT_WRONG_SECRET);
  ASSERT(boot_answer_check(&ans, sizeof ans, other_key, &chal, NULL, &got) == BOOT_WRONG_SECRET);
  /* An answer is no proof and a proof no answer. */
  struct boot_proof as_proof;
  memcpy(as_proof.magic, proof_magic, sizeof as_proof.magic);
  memcpy(as_proof.mac, ans.mac, sizeof as_proof.mac);
  ASSERT(boot_proof_check(&as_proof, sizeof as_proof, key, &chal, nonce) == BOOT_WRONG_SECRET);

  /* Messages: a header or trailer from one connection, or from an earlier
   * step of this one, or with a byte changed, fails its MAC. */
  struct boot_keys k1, k2;
  ASSERT_OK(boot_keys_derive(key, &chal, nonce, &k1));
  ASSERT_OK(boot_keys_derive(key, &chal2, nonce, &k2));
  ASSERT(memcmp(k1.c2l, k1.l2c, BOOT_KEY) != 0 && memcmp(k1.c2l, k2.c2l, BOOT_KEY) != 0);
  const char payload[] = "connection information";
  struct boot_msg_hdr h, hc;
  uint8_t mac[BOOT_MAC];
  ASSERT_OK(boot_hdr_make(k1.c2l, 5, 0x42, sizeof payload, &h));
  ASSERT_OK(boot_trailer_make(k1.c2l, 5, &h, payload, mac));
  ASSERT(boot_hdr_check(&h, sizeof h, k1.c2l, 5, &hc) == BOOT_OK && hc.tag == 0x42 && hc.len == sizeof payload);
  ASSERT(boot_trailer_check(mac, k1.c2l, 5, &h, payload) == BOOT_OK);
  ASSERT(boot_hdr_check(&h, sizeof h, k1.c2l, 6, &hc) == BOOT_WRONG_SECRET); /* replayed at a later step */
  ASSERT(boot_trailer_check(mac, k1.c2l, 6, &h, payload) == BOOT_WRONG_SECRET);
  ASSERT(boot_hdr_check(&h, sizeof h, k2.c2l, 5, &hc) == BOOT_WRONG_SECRET); /* into another connection */
  ASSERT(boot_hdr_check(&h, sizeof h, k1.l2c, 5, &hc) == BOOT_WRONG_SECRET); /* reflected back */
  char changed[sizeof payload];
  memcpy(changed, payload, sizeof payload);
  changed[3] ^= 1;
  ASSERT(boot_trailer_check(mac, k1.c2l, 5, &h, changed) == BOOT_WRONG_SECRET);
  struct boot_msg_hdr longer = h;
  longer.len++;
  ASSERT(boot_hdr_check(&longer, sizeof longer, k1.c2l, 5, &hc) == BOOT_WRONG_SECRET);
  /* A length past the bound is refused only once the MAC says the job sent it. */
  struct boot_msg_hdr huge;
  ASSERT_OK(boot_hdr_make(k1.c2l, 0, 1, BOOT_MAX_MSG + 1, &huge));
  ASSERT(boot_hdr_check(&huge, sizeof huge, k1.c2l, 0, &hc) == BOOT_BAD_FIELD);
  return 0;
}

/* ---- ranks over the internal API ---- */

enum { NR = 8, BIG = 1 << 20 };

/* A rank process: every operation, then its counts on the pipe. */
static int ops_rank(int rank, const ncclUniqueId *id, int out) {
  struct bootstrap *b;
  if (bootstrap_init(id, 1, rank, NR, NULL, &b) != ncclSuccess) {
    fprintf(stderr, "rank %d: bootstrap_init: %s\n", rank, err_thread_last());
    return 1;
  }
  int bad = 0;
  /* All-gathers, small and larger than a socket holds. */
  static const size_t sizes[] = {8, 4096, BIG};
  for (int k = 0; k < 3 && !bad; k++) {
    size_t size = sizes[k];
    unsigned char *d = calloc(NR, size);
    memset(d + rank * size, rank + 1, size);
    bad |= bootstrap_allgather(b, d, size) != ncclSuccess;
    for (int r = 0; r < NR && !bad; r++)
      bad |= d[r * size] != r + 1 || d[r * size + size - 1] != r + 1;
    free(d);
  }
  for (int i = 0; i < 3 && !bad; i++)
    bad |= boot_test_barrier(b) != ncclSuccess;
  /* Every rank to every rank, tags sent in reverse: the stash sorts them. */
  for (int p = 0; p < NR && !bad; p++)
    for (int t = 3; t >= 1 && !bad; t--) {
      int v = rank * 100 + p * 10 + t;
      bad |= bootstrap_send(b, p, (uint64_t)t, &v, sizeof v) != ncclSuccess;
    }
  for (int p = 0; p < NR && !bad; p++)
    for (int t = 1; t <= 3 && !bad; t++) {
      int v = -1;
      bad |= bootstrap_recv(b, p, (uint64_t)t, &v, sizeof v) != ncclSuccess || v != p * 100 + rank * 10 + t;
    }
  if (bad)
    fprintf(stderr, "rank %d: %s\n", rank, err_thread_last());
  bad |= boot_test_barrier(b) != ncclSuccess;
  int counts[3] = {b->stats.opened, b->stats.accepted, (int)b->stats.msgs_sent};
  bootstrap_close(b);
  if (write(out, counts, sizeof counts) != (ssize_t)sizeof counts)
    return 1;
  return bad;
}

TEST_IMPL(bootstrap_ops_persistent) {
  setenv("LOOM_TIMEOUT", "60", 1);
  int to[NR][2], from[NR][2];
  pid_t pids[NR];
  /* Forked before the id (and its root thread) exists. */
  for (int r = 0; r < NR; r++) {
    ASSERT(pipe(to[r]) == 0 && pipe(from[r]) == 0);
    pids[r] = fork();
    ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      ncclUniqueId id;
      if (read(to[r][0], &id, sizeof id) != (ssize_t)sizeof id)
        _exit(3);
      _exit(ops_rank(r, &id, from[r][1]));
    }
    close(to[r][0]);
    close(from[r][1]);
  }
  ncclUniqueId id;
  ASSERT_OK(bootstrap_create_root_id(&id));
  for (int r = 0; r < NR; r++)
    ASSERT(write(to[r][1], &id, sizeof id) == (ssize_t)sizeof id);
  int failed = 0, opened = 0, accepted = 0, sent = 0;
  for (int r = 0; r < NR; r++) {
    int counts[3] = {0}, st;
    ssize_t n = read(from[r][0], counts, sizeof counts);
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
      ;
    if (n != (ssize_t)sizeof counts || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (wait status 0x%x)\n", r, st);
      failed = 1;
    }
    opened = counts[0] > opened ? counts[0] : opened;
    accepted = counts[1] > accepted ? counts[1] : accepted;
    sent = counts[2] > sent ? counts[2] : sent;
  }
  ASSERT(!failed);
  printf("%d ranks: each sent up to %d messages over at most %d connections it opened and %d it accepted\n", NR, sent,
         opened, accepted);
  /* Each rank talks to every other here, so up to NR - 1 of each (and a
   * few more where two ranks reached for each other at once), never one
   * per message. */
  ASSERT_MSG(opened <= NR + 2 && accepted <= NR + 2 && sent > 3 * NR,
             "a rank opened %d and accepted %d connections for %d messages", opened, accepted, sent);
  return 0;
}

/* ---- a connection replayed into a rank's listener ---- */

struct init_arg {
  ncclUniqueId id;
  int rank;
  struct bootstrap *b;
  ncclResult_t r;
};

static void *init_thread(void *p) {
  struct init_arg *a = p;
  a->r = bootstrap_init(&a->id, 1, a->rank, 2, NULL, &a->b);
  return NULL;
}

size_t boot_greeting(const uint8_t secret[BOOT_KEY], const struct boot_chal *chal,
                     const uint8_t listener_nonce[BOOT_NONCE], uint64_t tag, int value, unsigned char *rec) {
  struct boot_proof proof;
  struct boot_keys keys;
  ASSERT_OK(boot_proof_make(secret, chal, listener_nonce, &proof));
  ASSERT_OK(boot_keys_derive(secret, chal, listener_nonce, &keys));
  size_t at = 0;
  memcpy(rec + at, chal, sizeof *chal);
  at += sizeof *chal;
  memcpy(rec + at, &proof, sizeof proof);
  at += sizeof proof;
  struct boot_msg_hdr h;
  ASSERT_OK(boot_hdr_make(keys.c2l, 0, tag, sizeof value, &h));
  memcpy(rec + at, &h, sizeof h);
  at += sizeof h;
  memcpy(rec + at, &value, sizeof value);
  at += sizeof value;
  ASSERT_OK(boot_trailer_make(keys.c2l, 0, &h, &value, rec + at));
  return at + BOOT_MAC;
}

static int raw_connect(const union sock_addr *addr) {
  int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(s >= 0 && connect(s, &addr->sa, sock_addr_len(addr)) == 0);
  return s;
}

TEST_IMPL(bootstrap_replay_rank) {
  setenv("LOOM_TIMEOUT", "2", 1);
  struct init_arg a[2];
  ASSERT_OK(bootstrap_create_root_id(&a[0].id));
  a[1].id = a[0].id;
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    a[r].rank = r;
    ASSERT(pthread_create(&th[r], NULL, init_thread, &a[r]) == 0);
  }
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
    ASSERT_OK(a[r].r);
  }
  struct bootstrap *b0 = a[0].b;
  /* What rank 1 would send on a new connection to rank 0: its challenge,
   * proof and one message; one who recorded those bytes sends them again. */
  struct boot_id id;
  memcpy(&id, a[0].id.internal, sizeof id);
  struct boot_chal chal;
  make_chal(&chal, 1, 0, 2, 0x3c);
  const int value = 1234;
  unsigned char rec[BOOT_GREETING_MAX];
  size_t at = boot_greeting(id.secret, &chal, b0->nonce, 77, value, rec);

  int s1 = raw_connect(&b0->addr);
  ASSERT(send(s1, rec, at, MSG_NOSIGNAL) == (ssize_t)at);
  int got = 0;
  ASSERT_OK(bootstrap_recv(b0, 1, 77, &got, sizeof got));
  ASSERT(got == value);
  int refused = b0->stats.refused;
  int s2 = raw_connect(&b0->addr);
  ASSERT(send(s2, rec, at, MSG_NOSIGNAL) == (ssize_t)at);
  /* Nothing more may arrive for tag 77: the wait runs into LOOM_TIMEOUT. */
  ncclResult_t r = bootstrap_recv(b0, 1, 77, &got, sizeof got);
  ASSERT_MSG(r == ncclRemoteError, "a replayed message was delivered (recv returned %d)", (int)r);
  ASSERT_MSG(b0->stats.refused == refused + 1, "rank 0 refused %d connections after the replay, %d before",
             b0->stats.refused, refused);
  close(s1);
  close(s2);
  for (int i = 0; i < 2; i++)
    bootstrap_close(a[i].b);
  return 0;
}
