/*
 * Checks of the bootstrap's wire records (bootstrap_wire.h), kept apart
 * from the sockets so that the listeners and the fuzzer run the same code.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "bootstrap_wire.h"

#include <string.h>

const char *boot_verdict_str(enum boot_verdict v) {
  switch (v) {
  case BOOT_OK:
    return "a valid record";
  case BOOT_SHORT:
    return "too short a record";
  case BOOT_NOT_LOOM:
    return "bytes that are not Loom's bootstrap protocol";
  case BOOT_WRONG_SECRET:
    return "another job's secret";
  case BOOT_BAD_FIELD:
    return "a record with a field out of range";
  }
  return "?";
}

/* The magic, then the secret (where the record has one: secret_at > 0),
 * as far as `len` bytes go. */
static enum boot_verdict check_prefix(const char *buf, size_t len, const char magic[8], size_t secret_at,
                                      uint64_t secret) {
  size_t m = len < 8 ? len : 8;
  if (memcmp(buf, magic, m) != 0)
    return BOOT_NOT_LOOM;
  if (secret_at > 0 && len >= secret_at + sizeof secret) {
    uint64_t s;
    memcpy(&s, buf + secret_at, sizeof s);
    if (s != secret)
      return BOOT_WRONG_SECRET;
  }
  return BOOT_OK;
}

enum boot_verdict boot_hello_check(const void *buf, size_t len, uint64_t secret, struct root_hello *out) {
  enum boot_verdict v = check_prefix(buf, len, hello_magic, offsetof(struct root_hello, secret), secret);
  if (v != BOOT_OK)
    return v;
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  out->host[sizeof out->host - 1] = '\0';
  return BOOT_OK;
}

enum boot_verdict boot_msg_check(const void *buf, size_t len, uint64_t secret, int nranks, struct msg_hdr *out) {
  enum boot_verdict v = check_prefix(buf, len, msg_magic, offsetof(struct msg_hdr, secret), secret);
  if (v != BOOT_OK)
    return v;
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  if (out->from < 0 || out->from >= nranks || out->len > BOOT_MAX_MSG)
    return BOOT_BAD_FIELD;
  return BOOT_OK;
}

enum boot_verdict boot_reply_check(const void *buf, size_t len, int nranks, struct root_reply *out) {
  enum boot_verdict v = check_prefix(buf, len, reply_magic, 0, 0);
  if (v != BOOT_OK)
    return v;
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  out->msg[sizeof out->msg - 1] = '\0';
  /* The status becomes the rank's ncclResult_t: only a real error code
   * may, and success only with the rank's own nranks. */
  if (out->status < ncclSuccess || out->status > ncclRemoteError)
    return BOOT_BAD_FIELD;
  if (out->status == ncclSuccess && out->nranks != nranks)
    return BOOT_BAD_FIELD;
  return BOOT_OK;
}

enum boot_verdict boot_peers_check(const union sock_addr *peers, int nranks) {
  for (int i = 0; i < nranks; i++)
    if (peers[i].sa.sa_family != AF_INET && peers[i].sa.sa_family != AF_INET6)
      return BOOT_BAD_FIELD;
  return BOOT_OK;
}
