/*
 * libFuzzer target: the bootstrap's wire records as the root and the
 * ranks judge them (bootstrap_wire.c), and the unique id as ranks read it.
 * The first byte picks the record; the rest arrives as from the wire,
 * judged at every length it could have reached (a listener judges each
 * prefix as bytes come in), in a buffer of exactly that length so that
 * AddressSanitizer sees any read past it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "bootstrap_wire.h"

/* The job's secret in the seed corpus (tests/fuzz/corpus/fuzz_bootstrap). */
#define FUZZ_SECRET 0x1122334455667788ull

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

static void fuzz_hello(const uint8_t *data, size_t size) {
  enum boot_verdict v[sizeof(struct root_hello) + 1];
  size_t top = size < sizeof(struct root_hello) ? size : sizeof(struct root_hello);
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = malloc(len ? len : 1);
    memcpy(buf, data, len);
    struct root_hello h;
    v[len] = boot_hello_check(buf, len, FUZZ_SECRET, &h);
    if (v[len] == BOOT_OK) {
      FUZZ_ASSERT(len == sizeof h);
      FUZZ_ASSERT(h.secret == FUZZ_SECRET && strlen(h.host) < sizeof h.host);
    }
    FUZZ_ASSERT(v[len] != BOOT_SHORT || len < sizeof h);
    free(buf);
  }
  check_verdicts(v, top + 1);
}

static void fuzz_msg(const uint8_t *data, size_t size, int nranks) {
  enum boot_verdict v[sizeof(struct msg_hdr) + 1];
  size_t top = size < sizeof(struct msg_hdr) ? size : sizeof(struct msg_hdr);
  for (size_t len = 0; len <= top; len++) {
    uint8_t *buf = malloc(len ? len : 1);
    memcpy(buf, data, len);
    struct msg_hdr h;
    v[len] = boot_msg_check(buf, len, FUZZ_SECRET, nranks, &h);
    if (v[len] == BOOT_OK) {
      FUZZ_ASSERT(len == sizeof h && h.secret == FUZZ_SECRET);
      FUZZ_ASSERT(h.from >= 0 && h.from < nranks && h.len <= BOOT_MAX_MSG);
    }
    free(buf);
  }
  check_verdicts(v, top + 1);
}

static void fuzz_reply(const uint8_t *data, size_t size, int nranks) {
  size_t len = size < sizeof(struct root_reply) ? size : sizeof(struct root_reply);
  uint8_t *buf = malloc(len ? len : 1);
  memcpy(buf, data, len);
  struct root_reply r;
  enum boot_verdict v = boot_reply_check(buf, len, nranks, &r);
  if (v == BOOT_OK) {
    FUZZ_ASSERT(r.status >= ncclSuccess && r.status < ncclInProgress);
    FUZZ_ASSERT(r.status != ncclSuccess || r.nranks == nranks);
    FUZZ_ASSERT(strlen(r.msg) < sizeof r.msg);
  }
  free(buf);
  /* The address table that follows a successful reply. */
  size_t rest = size - len, n = rest / sizeof(union sock_addr);
  if (n > 0) {
    union sock_addr *peers = malloc(n * sizeof *peers);
    memcpy(peers, data + len, n * sizeof *peers);
    if (boot_peers_check(peers, (int)n) == BOOT_OK) {
      char a[SOCK_ADDR_STRLEN];
      for (size_t i = 0; i < n; i++)
        FUZZ_ASSERT(strlen(sock_addr_str(&peers[i], a, sizeof a)) < sizeof a);
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t sel = data[0];
  int nranks = 1 + (sel >> 2); /* 1..64 */
  data++;
  size--;
  switch (sel & 3) {
  case 0:
    fuzz_hello(data, size);
    break;
  case 1:
    fuzz_msg(data, size, nranks);
    break;
  case 2:
    fuzz_reply(data, size, nranks);
    break;
  default:
    fuzz_id(data, size);
    break;
  }
  return 0;
}
