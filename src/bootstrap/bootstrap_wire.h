/*
 * What the bootstrap puts on the wire and in the unique id, shared by the
 * ranks (bootstrap.c), the root (bootstrap_root.c) and the connections
 * both use (bootstrap_conn.c).
 *
 * Every bootstrap connection starts with a mutual challenge and response
 * over HMAC-SHA256 keyed with the job's 32-byte secret, which never
 * crosses the wire. With the root, whose connections are answered by a
 * thread of their own:
 *
 *   connector -> listener  boot_chal    who it is and whom it wants, nonce C
 *   listener -> connector  boot_answer  nonce L, HMAC(secret, "answer", chal, L)
 *   connector -> listener  boot_proof   HMAC(secret, "proof", chal, L)
 *
 * Between ranks the connector already knows L: each rank draws one when it
 * starts listening, and it travels with its address (through the root and
 * around the ring, under MACs). The connector then sends the challenge and
 * the proof at once, and its messages right behind them, so a send never
 * waits for the receiving rank's thread (one thread may drive several
 * ranks); the listener answers once it has checked the proof, and refuses
 * a nonce C that it has seen before, so a recorded connection cannot be
 * replayed into it. The connector keeps its messages until that answer:
 * a listener that drops the connection first has read none of them, and
 * they go again on a new one. A connector to the root whose answer is
 * wrong sends no proof. Each side checks the other's MAC: both prove the
 * secret, over nonces from both.
 *
 * The connection's two directions then have keys of their own, derived
 * from the secret, the challenge and both nonces, and every message is a
 * boot_msg_hdr (tag and length under a MAC), the payload and a trailing
 * MAC over the header and the payload; both MACs cover the direction's
 * message sequence number. A message recorded on one connection is thus
 * refused on any other (other keys), and on its own one at any later step
 * (another sequence number).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_BOOTSTRAP_WIRE_H
#define LOOM_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "misc/socket.h"
#include "nccl.h"

#define BOOT_KEY 32
#define BOOT_NONCE 32
#define BOOT_MAC 32

static const char id_magic[8] = "LOOMID2";
static const char chal_magic[8] = "LOOMCH2";
static const char answer_magic[8] = "LOOMAN2";
static const char proof_magic[8] = "LOOMPR2";

/* What ncclUniqueId holds: the root's address and the job's secret. */
struct boot_id {
  char magic[8];
  uint8_t secret[BOOT_KEY];
  uint32_t fixed; /* root address from NCCL_COMM_ID */
  /* An id of ncclCommGetUniqueId: the size of the communicator it grows,
   * which a new rank checks its own against; 0 in any other id. */
  uint32_t grow_from;
  union sock_addr root;
  /* Random, not secret (zero with NCCL_COMM_ID): with the root's address
   * it tells communicators apart in status reports (bootstrap_id_hash),
   * even when a later root got an earlier one's port. */
  uint8_t tag[8];
};
_Static_assert(sizeof(struct boot_id) <= NCCL_UNIQUE_ID_BYTES, "unique id too small");

/* `to` of a connection meant for the root rather than a rank. */
#define BOOT_TO_ROOT (-1)
/* The most ranks a job may have. */
#define BOOT_MAX_RANKS (1 << 20)

struct boot_chal {
  char magic[8];
  int32_t from; /* the connecting rank */
  int32_t to;   /* the rank it wants, or BOOT_TO_ROOT */
  int32_t nranks;
  uint32_t pad;
  uint8_t nonce[BOOT_NONCE];
};

struct boot_answer {
  char magic[8];
  uint8_t nonce[BOOT_NONCE];
  uint8_t mac[BOOT_MAC];
};

struct boot_proof {
  char magic[8];
  uint8_t mac[BOOT_MAC];
};

/* Each message on an open connection: this, `len` payload bytes, then a
 * BOOT_MAC over the sequence number, this header and the payload. */
struct boot_msg_hdr {
  uint64_t tag;
  uint64_t len;
  uint8_t mac[BOOT_MAC]; /* over the sequence number, tag and len */
};

/* The messages between a rank and the root. */
#define BOOT_TAG_HELLO 0x4c4f4f4d48454c4full /* rank -> root */
#define BOOT_TAG_REPLY 0x4c4f4f4d5245504cull /* root -> rank */

/* Where a rank listens, and the nonce its listener proves itself with. */
struct boot_peer {
  union sock_addr addr;
  uint8_t nonce[BOOT_NONCE];
};

/* With several unique ids (ncclCommInitRankScalable) root `root` of
 * `nroots` serves one block of ranks (boot_block), and the first rank of
 * the next block also greets it as ROOT_NEIGHBOUR, so that the block's
 * last rank learns where that one listens. */
enum { ROOT_MEMBER = 0, ROOT_NEIGHBOUR = 1 };
struct root_hello {
  int32_t rank, nranks;
  int32_t pid, nroots;
  int32_t root, role;
  struct boot_peer me;
  char host[64];
};

/* The root's answer: on success only the next rank's address, so the
 * root sends O(1) bytes per rank; the ranks all-gather the rest over the
 * ring. On failure, a sentence follows the fixed part. */
struct root_reply {
  int32_t status; /* ncclResult_t */
  int32_t nranks;
  struct boot_peer next;
};
#define BOOT_REPLY_MSG_MAX 512

/* Keys of one connection, as its connector sees them. */
struct boot_keys {
  uint8_t c2l[BOOT_KEY], l2c[BOOT_KEY];
};

/* A greeting must arrive this soon after a connection opens; a connection
 * that does not say who it is within this time is dropped. Each part of
 * it that arrives (and is right so far) gives this much time again, so a
 * slow or lossy link is not cut off while it delivers, up to
 * GREETING_MAX_NS for the whole greeting, so a stranger that dribbles
 * bytes cannot hold a place for long. */
#define GREETING_NS 2000000000ull
#define GREETING_MAX_NS (5 * GREETING_NS)
/* A listener whose table of greetings is full makes room only by
 * dropping one that has been silent this long; while none has, the
 * connections queue in the kernel. */
#define BOOT_IDLE_NS (GREETING_NS / 4)

/* The largest bootstrap message a rank accepts; the biggest Loom sends (a
 * topology all-gather slot) is far smaller. */
#define BOOT_MAX_MSG (1ull << 30)

/* Connections a listener reads greetings from at once (its default;
 * LOOM_BOOTSTRAP_PENDING sets it): past that the one silent longest
 * makes room, so a flood cannot lock ranks out. */
#define BOOT_MAX_PENDING 256

/*
 * What a listener makes of the first `len` bytes of a record: pure checks
 * of bytes from the wire, shared with tests/fuzz/fuzz_bootstrap.c. A
 * prefix is judged as far as it goes, so a stranger is dropped at its
 * first wrong byte rather than after a full record; BOOT_SHORT means
 * nothing is wrong yet. On BOOT_OK `out` (where there is one) gets the
 * record. BOOT_WRONG_SECRET: a MAC that the job's secret did not make.
 */
enum boot_verdict { BOOT_OK, BOOT_SHORT, BOOT_NOT_LOOM, BOOT_WRONG_SECRET, BOOT_BAD_FIELD, BOOT_CRYPTO_FAILED };
const char *boot_verdict_str(enum boot_verdict v);

/* A challenge as a listener sees it: `me` is its rank (BOOT_TO_ROOT for the
 * root) and `nranks` its job's size (0 for the root, which learns it). */
enum boot_verdict boot_chal_check(const void *buf, size_t len, int me, int nranks, struct boot_chal *out);
/* The listener's answer to `chal`, as the connector checks it; `nonce`
 * (NULL: any) is the one the connector knew the listener by. */
enum boot_verdict boot_answer_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY],
                                    const struct boot_chal *chal, const uint8_t *nonce, struct boot_answer *out);
/* The connector's proof, as the listener that answered with `nonce` checks it. */
enum boot_verdict boot_proof_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY],
                                   const struct boot_chal *chal, const uint8_t nonce[BOOT_NONCE]);
/* A message header under the receiving direction's key and sequence number. */
enum boot_verdict boot_hdr_check(const void *buf, size_t len, const uint8_t key[BOOT_KEY], uint64_t seq,
                                 struct boot_msg_hdr *out);
/* The trailing MAC of the message `h` with `payload`. */
enum boot_verdict boot_trailer_check(const uint8_t mac[BOOT_MAC], const uint8_t key[BOOT_KEY], uint64_t seq,
                                     const struct boot_msg_hdr *h, const void *payload);
/* Payloads of the root's messages. */
enum boot_verdict boot_hello_check(const void *buf, size_t len, struct root_hello *out);
/* The ranks root k of `nroots` serves: [*lo, *lo + *count), the first
 * nranks % nroots roots one more than the others. */
void boot_block(int nranks, int nroots, int k, int *lo, int *count);
int boot_root_of(int rank, int nranks, int nroots);
/* A root's answer to a rank that asked for `nranks`; `msg` gets the
 * sentence of a failure (or ""). */
enum boot_verdict boot_reply_check(const void *buf, size_t len, int nranks, struct root_reply *out, char *msg,
                                   size_t msglen);
/* An address a rank listens at, as another rank or the root sent it. */
enum boot_verdict boot_addr_check(const union sock_addr *a);
/* An entry of the table of listeners the ranks pass round the ring. */
enum boot_verdict boot_peer_check(const struct boot_peer *p);

/* The records' makers, with the same inputs as the checks. */
ncclResult_t boot_answer_make(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                              const uint8_t nonce[BOOT_NONCE], struct boot_answer *out);
ncclResult_t boot_proof_make(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                             const uint8_t nonce[BOOT_NONCE], struct boot_proof *out);
ncclResult_t boot_keys_derive(const uint8_t key[BOOT_KEY], const struct boot_chal *chal,
                              const uint8_t nonce[BOOT_NONCE], struct boot_keys *out);
ncclResult_t boot_hdr_make(const uint8_t key[BOOT_KEY], uint64_t seq, uint64_t tag, uint64_t len,
                           struct boot_msg_hdr *out);
ncclResult_t boot_trailer_make(const uint8_t key[BOOT_KEY], uint64_t seq, const struct boot_msg_hdr *h,
                               const void *payload, uint8_t mac[BOOT_MAC]);

/* SHA-256 of `len` bytes: a LOOM_SECRET of any length becomes a key. */
ncclResult_t boot_sha256(const void *data, size_t len, uint8_t out[BOOT_KEY]);

/* The secret of a communicator that ncclCommSplit or ncclCommShrink
 * (`kind`) makes from the one whose secret is `parent` and whose id hashes
 * to `parent_hash`: every member computes it, so it never crosses the
 * wire. `seq` numbers the parent's splits or shrinks, `color` tells apart
 * the children of one split, `tag` is the child id's. */
ncclResult_t boot_child_secret(const uint8_t parent[BOOT_KEY], const char *kind, uint64_t parent_hash, uint64_t seq,
                               int32_t color, const uint8_t tag[8], uint8_t out[BOOT_KEY]);

/* Makes fork wait while a Loom thread is inside libcrypto, whose locks a
 * child would otherwise inherit held. Idempotent; the first MAC calls it,
 * and a module with fork handlers of its own calls it before registering
 * them, so that fork takes its locks before this one. */
void boot_crypto_fork_init(void);

/* Zeroes memory that held a secret or a key, in a way the compiler keeps. */
void boot_cleanse(void *p, size_t len);

/* The address of the first interface NCCL_SOCKET_IFNAME selects, port 0. */
ncclResult_t bootstrap_local_address(union sock_addr *addr, char *ifname, size_t len);

/* Starts a root thread listening on bind_addr, admitting ranks that hold
 * `key`; `bound` gets its address. The root reads greetings from
 * LOOM_BOOTSTRAP_PENDING connections at once. */
ncclResult_t bootstrap_root_start(const union sock_addr *bind_addr, const uint8_t key[BOOT_KEY],
                                  union sock_addr *bound);

#endif
