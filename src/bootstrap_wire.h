/*
 * What the bootstrap puts on the wire and in the unique id, shared by the
 * ranks (bootstrap.c) and the root (bootstrap_root.c).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_BOOTSTRAP_WIRE_H
#define LOOM_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "misc/socket.h"
#include "nccl.h"

static const char id_magic[8] = "LOOMID1";
static const char hello_magic[8] = "LOOMHI1";
static const char reply_magic[8] = "LOOMRE1";
static const char msg_magic[8] = "LOOMMS1";

/* What ncclUniqueId holds. */
struct boot_id {
  char magic[8];
  uint64_t secret;
  uint32_t fixed; /* root address from NCCL_COMM_ID */
  uint32_t pad;
  union sock_addr root;
};
_Static_assert(sizeof(struct boot_id) <= NCCL_UNIQUE_ID_BYTES, "unique id too small");

struct root_hello {
  char magic[8];
  uint64_t secret;
  int32_t rank, nranks;
  int32_t pid, pad;
  union sock_addr addr;
  char host[64];
};

struct root_reply {
  char magic[8];
  int32_t status; /* ncclResult_t */
  int32_t nranks;
  char msg[512];
};

struct msg_hdr {
  char magic[8];
  uint64_t secret;
  int32_t from;
  uint32_t pad;
  uint64_t tag;
  uint64_t len;
};

/* A greeting must arrive this soon after a connection opens; a connection
 * that does not say who it is within this time is dropped. */
#define GREETING_NS 2000000000ull

/* The largest bootstrap message a rank accepts; the biggest Loom sends (a
 * topology all-gather slot) is far smaller. */
#define BOOT_MAX_MSG (1ull << 30)

/* Connections a listener reads greetings from at once; past that the
 * oldest silent one makes room, so a flood cannot lock ranks out. */
#define BOOT_MAX_PENDING 256

/*
 * What a listener makes of the first `len` bytes of a greeting, header or
 * reply: pure checks of bytes from the wire, shared with
 * tests/fuzz/fuzz_bootstrap.c. A prefix is judged as far as it goes, so a
 * stranger is dropped at its first wrong byte rather than after a full
 * record; BOOT_SHORT means nothing is wrong yet. On BOOT_OK `out` gets the
 * record with its strings ended.
 */
enum boot_verdict { BOOT_OK, BOOT_SHORT, BOOT_NOT_LOOM, BOOT_WRONG_SECRET, BOOT_BAD_FIELD };
const char *boot_verdict_str(enum boot_verdict v);
enum boot_verdict boot_hello_check(const void *buf, size_t len, uint64_t secret, struct root_hello *out);
enum boot_verdict boot_msg_check(const void *buf, size_t len, uint64_t secret, int nranks, struct msg_hdr *out);
/* A root's answer to a rank that asked for `nranks`. */
enum boot_verdict boot_reply_check(const void *buf, size_t len, int nranks, struct root_reply *out);
/* The address table that follows a successful reply. */
enum boot_verdict boot_peers_check(const union sock_addr *peers, int nranks);

/* The address of the first interface NCCL_SOCKET_IFNAME selects, port 0. */
ncclResult_t bootstrap_local_address(union sock_addr *addr, char *ifname, size_t len);

/* Starts a root thread listening on bind_addr; `bound` gets its address. */
ncclResult_t bootstrap_root_start(const union sock_addr *bind_addr, uint64_t secret, union sock_addr *bound);

#endif
