/*
 * The bootstrap's wire records (bootstrap_wire.h): their checks, kept
 * apart from the sockets so that the listeners and the fuzzer run the same
 * code, and their MACs, from OpenSSL's libcrypto.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap_wire.h"

#include <pthread.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#include <openssl/core_names.h>
#else
#include <openssl/hmac.h>
#endif

const char *boot_verdict_str(enum boot_verdict v) {
  switch (v) {
  case BOOT_OK:
    return "a valid record";
  case BOOT_SHORT:
    return "too short a record";
  case BOOT_NOT_LOOM:
    return "bytes that are not Loom's bootstrap protocol";
  case BOOT_WRONG_SECRET:
    return "a MAC that the job's secret did not make";
  case BOOT_BAD_FIELD:
    return "a record with a field out of range";
  case BOOT_CRYPTO_FAILED:
    return "a record that libcrypto failed to check";
  }
  return "?";
}

/* ---- HMAC-SHA256 ---- */

/* Loom's threads (the bootstrap root, an asynchronous init) call libcrypto
 * while the program may fork: Python's multiprocessing forks ranks from
 * the process whose root is greeting the first ones. libcrypto's locks are
 * not fork-safe, and a child forked while another thread held one of them
 * (EVP_MAC_fetch takes the method store's) waits on it forever in its
 * first MAC. So every call goes through crypto_mu, and fork takes it
 * first (boot_crypto_fork_init): no Loom thread is inside libcrypto at a
 * fork. */
static pthread_mutex_t crypto_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t crypto_fork_once = PTHREAD_ONCE_INIT;

static void crypto_lock(void) { pthread_mutex_lock(&crypto_mu); }
static void crypto_unlock(void) { pthread_mutex_unlock(&crypto_mu); }
static void crypto_fork_register(void) { pthread_atfork(crypto_lock, crypto_unlock, crypto_unlock); }

void boot_crypto_fork_init(void) { pthread_once(&crypto_fork_once, crypto_fork_register); }

struct part {
  const void *p;
  size_t n;
};

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
static EVP_MAC *hmac_alg;
static void hmac_fetch(void) { hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL); }

static int hmac_locked(const uint8_t key[BOOT_KEY], const struct part *parts, int n, uint8_t out[BOOT_MAC]) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, hmac_fetch);
  if (hmac_alg == NULL)
    return -1;
  EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(hmac_alg);
  if (ctx == NULL)
    return -1;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  int ok = EVP_MAC_init(ctx, key, BOOT_KEY, params);
  for (int i = 0; ok && i < n; i++)
    ok = parts[i].n == 0 || EVP_MAC_update(ctx, parts[i].p, parts[i].n);
  size_t len = 0;
  ok = ok && EVP_MAC_final(ctx, out, &len, BOOT_MAC) && len == BOOT_MAC;
  EVP_MAC_CTX_free(ctx);
  return ok ? 0 : -1;
}
#else
static int hmac_locked(const uint8_t key[BOOT_KEY], const struct part *parts, int n, uint8_t out[BOOT_MAC]) {
  HMAC_CTX *ctx = HMAC_CTX_new();
  if (ctx == NULL)
    return -1;
  int ok = HMAC_Init_ex(ctx, key, BOOT_KEY, EVP_sha256(), NULL);
  for (int i = 0; ok && i < n; i++)
    ok = parts[i].n == 0 || HMAC_Update(ctx, parts[i].p, parts[i].n);
  unsigned len = 0;
  ok = ok && HMAC_Final(ctx, out, &len) && len == BOOT_MAC;
  HMAC_CTX_free(ctx);
  return ok ? 0 : -1;
}
#endif

static int hmac(const uint8_t key[BOOT_KEY], const struct part *parts, int n, uint8_t out[BOOT_MAC]) {
  boot_crypto_fork_init();
  crypto_lock();
  int r = hmac_locked(key, parts, n, out);
  crypto_unlock();
  return r;
}

static ncclResult_t crypto_failed(const char *what) {
  return err_set(ncclSystemError, "libcrypto failed to compute the bootstrap's %s (HMAC-SHA256)", what);
}

ncclResult_t boot_sha256(const void *data, size_t len, uint8_t out[BOOT_KEY]) {
  unsigned n = 0;
  boot_crypto_fork_init();
  crypto_lock();
  int ok = EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
  crypto_unlock();
  if (!ok || n != BOOT_KEY)
    return crypto_failed("key from LOOM_SECRET (SHA-256)");
  return ncclSuccess;
}

ncclResult_t boot_child_secret(const uint8_t parent[BOOT_KEY], const char *kind, uint64_t parent_hash, uint64_t seq,
                               int32_t color, const uint8_t tag[8], uint8_t out[BOOT_KEY]) {
  static const char label[] = "loom child";
  struct part p[] = {{label, sizeof label}, {kind, strlen(kind) + 1}, {&parent_hash, sizeof parent_hash},
                     {&seq, sizeof seq},     {&color, sizeof color},    {tag, 8}};
  return hmac(parent, p, 6, out) == 0 ? ncclSuccess : crypto_failed("secret of a new communicator");
}

void boot_cleanse(void *p, size_t len) { OPENSSL_cleanse(p, len); }

/* Each MAC starts with a label of its own, so that none can stand in for
 * another: an answer is no proof, a header no trailer. */
static int chal_mac(const uint8_t key[BOOT_KEY], const char *label, const struct boot_chal *chal,
                    const uint8_t nonce[BOOT_NONCE], uint8_t out[BOOT_MAC]) {
  struct part p[] = {{label, strlen(label) + 1}, {chal, sizeof *chal}, {nonce, BOOT_NONCE}};
  return hmac(key, p, 3, out);
}

ncclResult_t boot_answer_make(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                              const uint8_t nonce[BOOT_NONCE], struct boot_answer *out) {
  memcpy(out->magic, answer_magic, sizeof out->magic);
  memcpy(out->nonce, nonce, BOOT_NONCE);
  return chal_mac(key, "loom bootstrap answer", chal, nonce, out->mac) == 0 ? ncclSuccess : crypto_failed("answer");
}

ncclResult_t boot_proof_make(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                             const uint8_t nonce[BOOT_NONCE], struct boot_proof *out) {
  memcpy(out->magic, proof_magic, sizeof out->magic);
  return chal_mac(key, "loom bootstrap proof", chal, nonce, out->mac) == 0 ? ncclSuccess : crypto_failed("proof");
}

ncclResult_t boot_keys_derive(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                              const uint8_t nonce[BOOT_NONCE], struct boot_keys *out) {
  if (chal_mac(key, "loom bootstrap connector to listener", chal, nonce, out->c2l) != 0 ||
      chal_mac(key, "loom bootstrap listener to connector", chal, nonce, out->l2c) != 0)
    return crypto_failed("connection keys");
  return ncclSuccess;
}

static int hdr_mac(const uint8_t key[BOOT_KEY], uint64_t seq, uint64_t tag, uint64_t len, uint8_t out[BOOT_MAC]) {
  static const char label[] = "loom bootstrap header";
  struct part p[] = {{label, sizeof label}, {&seq, sizeof seq}, {&tag, sizeof tag}, {&len, sizeof len}};
  return hmac(key, p, 4, out);
}

static int trailer_mac(const uint8_t key[BOOT_KEY], uint64_t seq, const struct boot_msg_hdr *h, const void *payload,
                       uint8_t out[BOOT_MAC]) {
  static const char label[] = "loom bootstrap message";
  struct part p[] = {{label, sizeof label}, {&seq, sizeof seq}, {h, sizeof *h}, {payload, (size_t)h->len}};
  return hmac(key, p, 4, out);
}

ncclResult_t boot_hdr_make(const uint8_t key[BOOT_KEY], uint64_t seq, uint64_t tag, uint64_t len,
                           struct boot_msg_hdr *out) {
  memset(out, 0, sizeof *out);
  out->tag = tag;
  out->len = len;
  return hdr_mac(key, seq, tag, len, out->mac) == 0 ? ncclSuccess : crypto_failed("message header MAC");
}

ncclResult_t boot_trailer_make(const uint8_t key[BOOT_KEY], uint64_t seq, const struct boot_msg_hdr *h,
                               const void *payload, uint8_t mac[BOOT_MAC]) {
  return trailer_mac(key, seq, h, payload, mac) == 0 ? ncclSuccess : crypto_failed("message MAC");
}

/* ---- checks ---- */

/* The magic, as far as `len` bytes go. */
static enum boot_verdict check_magic(const void *buf, size_t len, const char magic[8]) {
  return memcmp(buf, magic, len < 8 ? len : 8) == 0 ? BOOT_OK : BOOT_NOT_LOOM;
}

/* In constant time, so that no timing says how much of a MAC was right. */
static enum boot_verdict check_mac(int rc, const uint8_t *want, const uint8_t *got) {
  if (rc != 0)
    return BOOT_CRYPTO_FAILED;
  return CRYPTO_memcmp(want, got, BOOT_MAC) == 0 ? BOOT_OK : BOOT_WRONG_SECRET;
}

enum boot_verdict boot_chal_check(const void *buf, size_t len, int me, int nranks, struct boot_chal *out) {
  if (check_magic(buf, len, chal_magic) != BOOT_OK)
    return BOOT_NOT_LOOM;
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  if (out->to != me || out->nranks < 1 || out->nranks > BOOT_MAX_RANKS || out->from < 0 ||
      out->from >= out->nranks || out->pad != 0)
    return BOOT_BAD_FIELD;
  /* A rank's listener takes only ranks of its own job, never itself. */
  if (me != BOOT_TO_ROOT && (out->nranks != nranks || out->from == me))
    return BOOT_BAD_FIELD;
  return BOOT_OK;
}

enum boot_verdict boot_answer_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY],
                                    const struct boot_chal *chal, const uint8_t *nonce, struct boot_answer *out) {
  if (check_magic(buf, len, answer_magic) != BOOT_OK)
    return BOOT_NOT_LOOM;
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  if (nonce && memcmp(nonce, out->nonce, BOOT_NONCE) != 0)
    return BOOT_WRONG_SECRET; /* another listener than the one its address names */
  uint8_t want[BOOT_MAC];
  return check_mac(chal_mac(key, "loom bootstrap answer", chal, out->nonce, want), want, out->mac);
}

enum boot_verdict boot_proof_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY],
                                   const struct boot_chal *chal, const uint8_t nonce[BOOT_NONCE]) {
  if (check_magic(buf, len, proof_magic) != BOOT_OK)
    return BOOT_NOT_LOOM;
  struct boot_proof p;
  if (len < sizeof p)
    return BOOT_SHORT;
  memcpy(&p, buf, sizeof p);
  uint8_t want[BOOT_MAC];
  return check_mac(chal_mac(key, "loom bootstrap proof", chal, nonce, want), want, p.mac);
}

enum boot_verdict boot_hdr_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY], uint64_t seq,
                                 struct boot_msg_hdr *out) {
  if (len < sizeof *out)
    return BOOT_SHORT;
  memcpy(out, buf, sizeof *out);
  uint8_t want[BOOT_MAC];
  enum boot_verdict v = check_mac(hdr_mac(key, seq, out->tag, out->len, want), want, out->mac);
  if (v != BOOT_OK)
    return v;
  /* Only after the MAC: a length from the job, not from the wire. */
  return out->len > BOOT_MAX_MSG ? BOOT_BAD_FIELD : BOOT_OK;
}

enum boot_verdict boot_trailer_check(const uint8_t mac[BOOT_MAC], const uint8_t key[BOOT_KEY], uint64_t seq,
                                     const struct boot_msg_hdr *h, const void *payload) {
  uint8_t want[BOOT_MAC];
  return check_mac(trailer_mac(key, seq, h, payload, want), want, mac);
}

enum boot_verdict boot_addr_check(const union sock_addr *a) {
  return a->sa.sa_family == AF_INET || a->sa.sa_family == AF_INET6 ? BOOT_OK : BOOT_BAD_FIELD;
}

enum boot_verdict boot_peer_check(const struct boot_peer *p) { return boot_addr_check(&p->addr); }

enum boot_verdict boot_hello_check(const void *buf, size_t len, struct root_hello *out) {
  if (len != sizeof *out)
    return BOOT_BAD_FIELD;
  memcpy(out, buf, sizeof *out);
  out->host[sizeof out->host - 1] = '\0';
  if (out->nranks < 1 || out->nranks > BOOT_MAX_RANKS || out->rank < 0 || out->rank >= out->nranks ||
      out->nroots < 1 || out->nroots > out->nranks || out->root < 0 || out->root >= out->nroots ||
      (out->role != ROOT_MEMBER && out->role != ROOT_NEIGHBOUR) || boot_peer_check(&out->me) != BOOT_OK)
    return BOOT_BAD_FIELD;
  /* A rank greets only the root of its block, and the first rank of a
   * block also the root before. */
  int lo, count;
  boot_block(out->nranks, out->nroots, out->root, &lo, &count);
  if (out->role == ROOT_MEMBER ? out->rank < lo || out->rank >= lo + count
                               : out->nroots < 2 || out->rank != (lo + count) % out->nranks)
    return BOOT_BAD_FIELD;
  return BOOT_OK;
}

void boot_block(int nranks, int nroots, int k, int *lo, int *count) {
  int per = nranks / nroots, more = nranks % nroots;
  *count = per + (k < more);
  *lo = k * per + LOOM_MIN(k, more);
}

int boot_root_of(int rank, int nranks, int nroots) {
  int per = nranks / nroots, more = nranks % nroots, big = more * (per + 1);
  return rank < big ? rank / (per + 1) : more + (rank - big) / per;
}

enum boot_verdict boot_reply_check(const void *buf, size_t len, int nranks, struct root_reply *out, char *msg,
                                   size_t msglen) {
  if (msglen > 0)
    msg[0] = '\0';
  if (len < sizeof *out || len > sizeof *out + BOOT_REPLY_MSG_MAX)
    return BOOT_BAD_FIELD;
  memcpy(out, buf, sizeof *out);
  /* The status becomes the rank's ncclResult_t: only a real error code
   * may, and success only with the rank's own nranks and a neighbour. */
  if (out->status < ncclSuccess || out->status > ncclRemoteError)
    return BOOT_BAD_FIELD;
  if (out->status == ncclSuccess && (out->nranks != nranks || boot_peer_check(&out->next) != BOOT_OK))
    return BOOT_BAD_FIELD;
  if (msglen > 0) {
    size_t n = LOOM_MIN(len - sizeof *out, msglen - 1);
    memcpy(msg, (const char *)buf + sizeof *out, n);
    msg[n] = '\0';
  }
  return BOOT_OK;
}
