/*
 * libFuzzer target: the bootstrap's wire records as the root and the
 * ranks judge them (bootstrap_wire.c), a whole connection's byte stream as
 * a listener reads it (bootstrap_conn.c), and the unique id as ranks read
 * it. The first byte picks the record and a job size; the rest arrives as
 * from the wire, judged at every length it could have reached (a listener
 * judges each prefix as bytes come in), in a buffer of exactly that length
 * so that AddressSanitizer sees any read past it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_conn.h"
#include "bootstrap/bootstrap_wire.h"

/* The job's secret and the listener's nonce in the seed corpus
 * (tests/fuzz/corpus/fuzz_bootstrap, made by tests/fuzz/make_bootstrap_seeds.c). */
static const uint8_t fuzz_key[BOOT_KEY] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
static const uint8_t fuzz_nonce[BOOT_NONCE] = {0xa5, 0x5a};

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c))          \
      abort();         \
  } while (0)

/* Once a prefix is refused, no longer one may pass. */
static void check_verdicts(const enum boot_verdict *v, size_t n) {
  for (size_t i = 1; i < n; i++)
    if (v[i - 1] != BOOT_OK && v[i - 1] != BOOT_SHORT)
      FUZZ_ASSERT(v[i] == v[i - 1]);
}

static uint8_t *copy(const uint8_t *data, size_t len) {
  uint8_t *buf = malloc(len ? len : 1);
  memcpy(buf, data, len);
  return buf;
}

static void fuzz_chal(const uint8_t *data, size_t size, int me, int nranks) {
  enum boot_verdict v[sizeof(struct boot_chal) + 1];
  size_t top = size < sizeof(struct boot_chal) ? size : sizeof(struct boot_chal);
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = copy(data, len);
    struct boot_chal c;
    v[len] = boot_chal_check(buf, len, me, nranks, &c);
    if (v[len] == BOOT_OK) {
      FUZZ_ASSERT(len == sizeof c && c.to == me);
      FUZZ_ASSERT(c.from >= 0 && c.from < c.nranks && c.nranks <= BOOT_MAX_RANKS);
      FUZZ_ASSERT(me == BOOT_TO_ROOT || (c.nranks == nranks && c.from != me));
    }
    FUZZ_ASSERT(v[len] != BOOT_SHORT || len < sizeof c);
    free(buf);
  }
  check_verdicts(v, top + 1);
}

/* The challenge the answers and proofs of the corpus respond to. */
static void fuzz_chal_fixed(struct boot_chal *c) {
  memset(c, 0, sizeof *c);
  memcpy(c->magic, chal_magic, sizeof c->magic);
  c->from = 1;
  c->to = 0;
  c->nranks = 2;
}

static void fuzz_answer(const uint8_t *data, size_t size, int known) {
  struct boot_chal chal;
  fuzz_chal_fixed(&chal);
  enum boot_verdict v[sizeof(struct boot_answer) + 1];
  size_t top = size < sizeof(struct boot_answer) ? size : sizeof(struct boot_answer);
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = copy(data, len);
    struct boot_answer a;
    v[len] = boot_answer_check(buf, len, fuzz_key, &chal, known ? fuzz_nonce : NULL, &a);
    if (v[len] == BOOT_OK) {
      /* Only the secret makes a valid answer: the corpus has it. */
      struct boot_answer want;
      FUZZ_ASSERT(boot_answer_make(fuzz_key, &chal, a.nonce, &want) == ncclSuccess);
      FUZZ_ASSERT(memcmp(&want, &a, sizeof a) == 0);
      FUZZ_ASSERT(!known || memcmp(a.nonce, fuzz_nonce, BOOT_NONCE) == 0);
    }
    free(buf);
  }
  check_verdicts(v, top + 1);
}

static void fuzz_proof(const uint8_t *data, size_t size) {
  struct boot_chal chal;
  fuzz_chal_fixed(&chal);
  enum boot_verdict v[sizeof(struct boot_proof) + 1];
  size_t top = size < sizeof(struct boot_proof) ? size : sizeof(struct boot_proof);
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = copy(data, len);
    v[len] = boot_proof_check(buf, len, fuzz_key, &chal, fuzz_nonce);
    free(buf);
  }
  check_verdicts(v, top + 1);
}

/* A message on an open connection: header at every length, then the
 * trailer over whatever payload follows. */
static void fuzz_msg(const uint8_t *data, size_t size, uint64_t seq) {
  size_t top = size < sizeof(struct boot_msg_hdr) ? size : sizeof(struct boot_msg_hdr);
  struct boot_msg_hdr h;
  enum boot_verdict v = BOOT_SHORT;
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = copy(data, len);
    v = boot_hdr_check(buf, len, fuzz_key, seq, &h);
    FUZZ_ASSERT(v == BOOT_SHORT || len == sizeof h);
    free(buf);
  }
  if (v != BOOT_OK)
    return;
  FUZZ_ASSERT(h.len <= BOOT_MAX_MSG);
  size_t rest = size - sizeof h;
  if (rest < BOOT_MAC || h.len > rest - BOOT_MAC)
    return;
  uint8_t *payload = copy(data + sizeof h, (size_t)h.len);
  (void)boot_trailer_check(data + sizeof h + h.len, fuzz_key, seq, &h, payload);
  free(payload);
}

static void fuzz_hello(const uint8_t *data, size_t size) {
  uint8_t *buf = copy(data, size);
  struct root_hello h;
  if (boot_hello_check(buf, size, &h) == BOOT_OK) {
    FUZZ_ASSERT(h.rank >= 0 && h.rank < h.nranks && h.nranks <= BOOT_MAX_RANKS);
    FUZZ_ASSERT(strlen(h.host) < sizeof h.host);
    char a[SOCK_ADDR_STRLEN];
    FUZZ_ASSERT(strlen(sock_addr_str(&h.me.addr, a, sizeof a)) < sizeof a);
  }
  free(buf);
}

static void fuzz_reply(const uint8_t *data, size_t size, int nranks) {
  uint8_t *buf = copy(data, size);
  struct root_reply r;
  char msg[BOOT_REPLY_MSG_MAX + 1];
  if (boot_reply_check(buf, size, nranks, &r, msg, sizeof msg) == BOOT_OK) {
    FUZZ_ASSERT(r.status >= ncclSuccess && r.status < ncclInProgress);
    FUZZ_ASSERT(r.status != ncclSuccess || (r.nranks == nranks && boot_peer_check(&r.next) == BOOT_OK));
    FUZZ_ASSERT(strlen(msg) < sizeof msg);
  }
  free(buf);
  /* A table of listeners as the ring passes it. */
  size_t n = size / sizeof(struct boot_peer);
  if (n > 0) {
    struct boot_peer *peers = malloc(n * sizeof *peers);
    memcpy(peers, data, n * sizeof *peers);
    for (size_t i = 0; i < n; i++)
      if (boot_peer_check(&peers[i]) == BOOT_OK) {
        char a[SOCK_ADDR_STRLEN];
        FUZZ_ASSERT(strlen(sock_addr_str(&peers[i].addr, a, sizeof a)) < sizeof a);
      }
    free(peers);
  }
}

static void fuzz_id(const uint8_t *data, size_t size) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  memcpy(id.internal, data, size < sizeof id.internal ? size : sizeof id.internal);
  char a[SOCK_ADDR_STRLEN];
  if (bootstrap_id_valid(&id))
    FUZZ_ASSERT(strlen(bootstrap_id_root(&id, a, sizeof a)) < sizeof a);
  (void)bootstrap_id_is_fixed(&id);
  (void)bootstrap_id_hash(&id);
}

/* The bytes as rank 0 of `nranks` reads them from a connection (or the
 * root, me = BOOT_TO_ROOT): the real reader, through a socket pair. */
static void fuzz_stream(const uint8_t *data, size_t size, int me, int nranks) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
    return;
  size_t off = 0;
  struct boot_conn *c = malloc(sizeof *c);
  boot_conn_accepted(c, sv[0], fuzz_key, me, nranks, UINT64_MAX, me == BOOT_TO_ROOT ? NULL : fuzz_nonce);
  int events = 0;
  for (int round = 0; round < 64 && c->state != BC_DEAD; round++) {
    if (off < size) {
      ssize_t w = send(sv[1], data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0)
        off += (size_t)w;
    } else if (sv[1] >= 0) {
      shutdown(sv[1], SHUT_WR);
    }
    char rest[4096];
    while (recv(sv[1], rest, sizeof rest, MSG_DONTWAIT) > 0) /* what the listener answers */
      ;
    for (;;) {
      enum boot_event ev;
      struct boot_msg *m = NULL;
      char why[256];
      if (boot_conn_step(c, POLLIN, &ev, &m, why, sizeof why) != ncclSuccess)
        break;
      if (ev == BE_NONE)
        break;
      events++;
      if (ev == BE_MSG) {
        FUZZ_ASSERT(m->len <= BOOT_MAX_MSG && m->from == c->chal.from);
        free(m);
        continue;
      }
      if (ev != BE_OPENED) {
        boot_conn_close(c);
        break;
      }
      FUZZ_ASSERT(c->state == BC_OPEN);
    }
  }
  boot_conn_close(c);
  free(c);
  close(sv[1]);
  (void)events;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t sel = data[0];
  int nranks = 1 + (sel >> 4); /* 1..16 */
  data++;
  size--;
  switch (sel & 15) {
  case 0:
    fuzz_chal(data, size, BOOT_TO_ROOT, 0);
    break;
  case 1:
    fuzz_chal(data, size, 0, nranks);
    break;
  case 2:
    fuzz_answer(data, size, 0);
    break;
  case 3:
    fuzz_answer(data, size, 1);
    break;
  case 4:
    fuzz_proof(data, size);
    break;
  case 5:
    fuzz_msg(data, size, (uint64_t)(sel >> 4));
    break;
  case 6:
    fuzz_hello(data, size);
    break;
  case 7:
    fuzz_reply(data, size, nranks);
    break;
  case 8:
    fuzz_stream(data, size, 0, nranks < 2 ? 2 : nranks);
    break;
  case 9:
    fuzz_stream(data, size, BOOT_TO_ROOT, 0);
    break;
  default:
    fuzz_id(data, size);
    break;
  }
  return 0;
}
