/*
 * Writes the seed corpus of fuzz_bootstrap (valid records under the
 * fuzzer's key and nonce) into the folder named on the command line:
 *   build-fuzz/tests/fuzz/make_bootstrap_seeds tests/fuzz/corpus/fuzz_bootstrap
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_wire.h"

static const uint8_t key[BOOT_KEY] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
static const uint8_t nonce[BOOT_NONCE] = {0xa5, 0x5a};

static void put(const char *dir, const char *name, uint8_t sel, const void *a, size_t alen, const void *b,
                size_t blen) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(&sel, 1, 1, f) != 1 || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen)) {
    perror(path);
    exit(1);
  }
  fclose(f);
}

/* One message as a connector sends it: header, payload, trailer. */
static size_t frame(uint8_t *out, const uint8_t *k, uint64_t seq, uint64_t tag, const void *payload, size_t len) {
  struct boot_msg_hdr h;
  if (boot_hdr_make(k, seq, tag, len, &h) != ncclSuccess)
    exit(1);
  memcpy(out, &h, sizeof h);
  memcpy(out + sizeof h, payload, len);
  if (boot_trailer_make(k, seq, &h, payload, out + sizeof h + len) != ncclSuccess)
    exit(1);
  return sizeof h + len + BOOT_MAC;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_bootstrap_seeds DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  struct boot_chal root_chal = {.from = 1, .to = BOOT_TO_ROOT, .nranks = 2};
  memcpy(root_chal.magic, chal_magic, 8);
  put(dir, "chal_root", 0x10, &root_chal, sizeof root_chal, NULL, 0);
  struct boot_chal chal = {.from = 1, .to = 0, .nranks = 2};
  memcpy(chal.magic, chal_magic, 8);
  put(dir, "chal_rank", 0x11, &chal, sizeof chal, NULL, 0);
  struct boot_answer ans;
  boot_answer_make(key, &chal, nonce, &ans);
  put(dir, "answer", 0x02, &ans, sizeof ans, NULL, 0);
  put(dir, "answer_known", 0x03, &ans, sizeof ans, NULL, 0);
  struct boot_proof proof;
  boot_proof_make(key, &chal, nonce, &proof);
  put(dir, "proof", 0x04, &proof, sizeof proof, NULL, 0);
  static uint8_t buf[1 << 16];
  const char hello_text[] = "bootstrap data";
  size_t n = frame(buf, key, 0, 42, hello_text, sizeof hello_text);
  put(dir, "msg", 0x05, buf, n, NULL, 0);
  struct root_hello h;
  memset(&h, 0, sizeof h);
  h.rank = 1;
  h.nranks = 2;
  h.pid = 4242;
  h.nroots = 1;
  h.me.addr.sin.sin_family = AF_INET;
  h.me.addr.sin.sin_port = 0x3412;
  snprintf(h.host, sizeof h.host, "vm");
  put(dir, "hello", 0x06, &h, sizeof h, NULL, 0);
  struct root_reply r;
  memset(&r, 0, sizeof r);
  r.nranks = 2;
  r.next = h.me;
  put(dir, "reply_ok", 0x17, &r, sizeof r, NULL, 0);
  r.status = ncclInvalidUsage;
  const char why[] = "rank 1 joined twice";
  put(dir, "reply_error", 0x17, &r, sizeof r, why, sizeof why - 1);
  /* A rank's whole connection to rank 0: challenge, proof, two messages. */
  struct boot_keys keys;
  boot_keys_derive(key, &chal, nonce, &keys);
  size_t at = 0;
  memcpy(buf, &chal, sizeof chal);
  at += sizeof chal;
  memcpy(buf + at, &proof, sizeof proof);
  at += sizeof proof;
  at += frame(buf + at, keys.c2l, 0, 7, hello_text, sizeof hello_text);
  at += frame(buf + at, keys.c2l, 1, 8, "", 0);
  put(dir, "stream_rank", 0x18, buf, at, NULL, 0);
  put(dir, "stream_root", 0x19, &root_chal, sizeof root_chal, NULL, 0);
  ncclUniqueId id;
  struct boot_id bid;
  memset(&bid, 0, sizeof bid);
  memcpy(bid.magic, id_magic, 8);
  bid.root.sin.sin_family = AF_INET;
  memset(&id, 0, sizeof id);
  memcpy(id.internal, &bid, sizeof bid);
  put(dir, "unique_id", 0x0a, &id, sizeof id, NULL, 0);
  return 0;
}
