/*
 * The unique id: the root's address and the job's 32-byte secret. A plain
 * ncclGetUniqueId draws the secret from the kernel; with NCCL_COMM_ID every
 * process computes the id on its own, so the secret is the SHA-256 of
 * LOOM_SECRET (or of LOOM_SECRET_FILE's contents), which the launcher hands
 * out. Without either the job still runs, with a warning: its key is then
 * the same as every other such job's, so anyone who reaches the port joins.
 * The communicators that ncclCommSplit, ncclCommShrink and ncclCommGrow
 * make get ids whose secret each member derives from the parent's
 * (bootstrap_child_id); a grow's id also reaches new ranks, whole.
 * Copies of a secret are zeroed once used.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_wire.h"
#include "misc/utils.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The longest LOOM_SECRET_FILE read. */
#define SECRET_FILE_MAX 4096

ncclResult_t bootstrap_local_address(union sock_addr *addr, char *ifname, size_t len) {
  struct sock_iface ifs[SOCK_MAX_IFACES];
  int n = 0;
  CHECK(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n));
  *addr = ifs[0].addr;
  if (addr->sa.sa_family == AF_INET)
    addr->sin.sin_port = 0;
  else
    addr->sin6.sin6_port = 0;
  snprintf(ifname, len, "%s", ifs[0].name);
  return ncclSuccess;
}

static void id_start(struct boot_id *id) {
  memset(id, 0, sizeof *id); /* padding too: the id travels as bytes */
  memcpy(id->magic, id_magic, sizeof id->magic);
}

static void id_store(const struct boot_id *id, ncclUniqueId *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->internal, id, sizeof *id);
}

/* The id's public part: the secret is not copied. */
static void id_load(const ncclUniqueId *uid, struct boot_id *id) {
  memcpy(id, uid->internal, sizeof *id);
  boot_cleanse(id->secret, sizeof id->secret);
}

void bootstrap_id_wipe(ncclUniqueId *id) { boot_cleanse(id, sizeof *id); }

/* A new root on this host for `key`; the id gets its address. */
static ncclResult_t start_root(const uint8_t key[BOOT_KEY], struct boot_id *id) {
  char ifname[IF_NAMESIZE], a[SOCK_ADDR_STRLEN];
  union sock_addr bind_addr;
  CHECK(bootstrap_local_address(&bind_addr, ifname, sizeof ifname));
  CHECK(bootstrap_root_start(&bind_addr, key, &id->root));
  INFO(LOG_BOOTSTRAP, "bootstrap root listening on %s (%s)", sock_addr_str(&id->root, a, sizeof a), ifname);
  return ncclSuccess;
}

ncclResult_t bootstrap_create_root_id(ncclUniqueId *out) {
  struct boot_id id;
  id_start(&id);
  ncclResult_t r = util_random(id.secret, sizeof id.secret);
  if (r == ncclSuccess)
    r = util_random(id.tag, sizeof id.tag);
  if (r == ncclSuccess)
    r = start_root(id.secret, &id);
  if (r == ncclSuccess)
    id_store(&id, out);
  boot_cleanse(&id, sizeof id);
  return r;
}

ncclResult_t bootstrap_child_root(const struct bootstrap *parent, const char *kind, uint64_t seq, int color,
                                  struct bootstrap_child *at) {
  struct boot_id id;
  id_start(&id);
  memset(at, 0, sizeof *at);
  /* The tag first: it goes into the secret, which the root needs. */
  ncclResult_t r = util_random(id.tag, sizeof id.tag);
  if (r == ncclSuccess)
    r = boot_child_secret(parent->key, kind, parent->id_hash, seq, color, id.tag, id.secret);
  if (r == ncclSuccess)
    r = start_root(id.secret, &id);
  if (r == ncclSuccess) {
    at->root = id.root;
    memcpy(at->tag, id.tag, sizeof at->tag);
  }
  boot_cleanse(&id, sizeof id);
  return r;
}

ncclResult_t bootstrap_child_id(const struct bootstrap *parent, const char *kind, uint64_t seq, int color,
                                const struct bootstrap_child *at, ncclUniqueId *out) {
  if (boot_addr_check(&at->root) != BOOT_OK)
    return err_set(ncclRemoteError, "the leader of the new communicator (%s) sent no valid root address", kind);
  struct boot_id id;
  id_start(&id);
  id.root = at->root;
  memcpy(id.tag, at->tag, sizeof id.tag);
  ncclResult_t r = boot_child_secret(parent->key, kind, parent->id_hash, seq, color, id.tag, id.secret);
  if (r == ncclSuccess)
    id_store(&id, out);
  boot_cleanse(&id, sizeof id);
  return r;
}

void bootstrap_id_set_grow_from(ncclUniqueId *uid, int grow_from) {
  uint32_t v = (uint32_t)grow_from;
  memcpy(uid->internal + offsetof(struct boot_id, grow_from), &v, sizeof v);
}

int bootstrap_id_grow_from(const ncclUniqueId *uid) {
  struct boot_id id;
  id_load(uid, &id);
  return id.grow_from > BOOT_MAX_RANKS ? 0 : (int)id.grow_from;
}

void bootstrap_id_child_at(const ncclUniqueId *uid, struct bootstrap_child *at) {
  struct boot_id id;
  id_load(uid, &id);
  memset(at, 0, sizeof *at);
  at->root = id.root;
  memcpy(at->tag, id.tag, sizeof at->tag);
}

static ncclResult_t read_secret_file(const char *path, char *buf, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_set(ncclInvalidArgument, "LOOM_SECRET_FILE=%s cannot be opened: %s", path, strerror(errno));
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fd, buf + got, SECRET_FILE_MAX + 1 - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      return err_set(ncclInvalidArgument, "LOOM_SECRET_FILE=%s cannot be read: %s", path, strerror(e));
    }
    got += (size_t)n;
    if (n == 0 || got > SECRET_FILE_MAX)
      break;
  }
  close(fd);
  if (got > SECRET_FILE_MAX)
    return err_set(ncclInvalidArgument, "LOOM_SECRET_FILE=%s holds more than %d bytes; a secret is expected", path,
                   SECRET_FILE_MAX);
  while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r'))
    got--;
  if (got == 0)
    return err_set(ncclInvalidArgument, "LOOM_SECRET_FILE=%s is empty; it must hold the job's secret", path);
  *len = got;
  return ncclSuccess;
}

/* Said once per process, not per communicator: the user needs to hear it
 * once, and each rank of a job would say it. */
static void warn_no_secret(const char *comm_id) {
  static int warned;
  if (__atomic_exchange_n(&warned, 1, __ATOMIC_ACQ_REL))
    return;
  WARN("NCCL_COMM_ID=%s is set but neither LOOM_SECRET nor LOOM_SECRET_FILE is: anyone who can reach %s can join "
       "this job as a rank. Give every rank the same secret: export LOOM_SECRET=$(head -c 32 /dev/urandom | "
       "od -An -tx1 | tr -d ' \\n') before starting them (loomrun does this for its ranks)",
       comm_id, comm_id);
}

/* The key of an NCCL_COMM_ID job: SHA-256 over a label and the SHA-256 of
 * the secret (none: of the label alone, the same key for every such job). */
static ncclResult_t comm_id_key(const char *comm_id, uint8_t key[BOOT_KEY]) {
  static const char label[] = "loom bootstrap secret\n";
  uint8_t material[sizeof label - 1 + BOOT_KEY];
  size_t n = sizeof label - 1;
  memcpy(material, label, n);
  if (param_is_set(P_SECRET) && param_is_set(P_SECRET_FILE))
    return err_set(ncclInvalidArgument, "LOOM_SECRET and LOOM_SECRET_FILE are both set; set only one of them");
  if (param_is_set(P_SECRET)) {
    const char *s = param_str(P_SECRET);
    CHECK(boot_sha256(s, strlen(s), material + n));
    n += BOOT_KEY;
  } else if (param_is_set(P_SECRET_FILE)) {
    char file[SECRET_FILE_MAX + 1];
    size_t len = 0;
    ncclResult_t r = read_secret_file(param_str(P_SECRET_FILE), file, &len);
    if (r == ncclSuccess)
      r = boot_sha256(file, len, material + n);
    boot_cleanse(file, sizeof file);
    CHECK(r);
    n += BOOT_KEY;
  } else {
    warn_no_secret(comm_id);
  }
  ncclResult_t r = boot_sha256(material, n, key);
  boot_cleanse(material, sizeof material);
  return r;
}

ncclResult_t bootstrap_get_unique_id(ncclUniqueId *out) {
  if (!param_is_set(P_COMM_ID))
    return bootstrap_create_root_id(out);
  struct boot_id id;
  id_start(&id);
  const char *s = param_str(P_COMM_ID);
  if (sock_parse_addr(s, &id.root) != ncclSuccess) {
    err_context("NCCL_COMM_ID=%s", s);
    return ncclInvalidArgument;
  }
  ncclResult_t r = comm_id_key(s, id.secret);
  id.fixed = 1;
  if (r == ncclSuccess)
    id_store(&id, out);
  boot_cleanse(&id, sizeof id);
  return r;
}

void bootstrap_id_secret_hint(const ncclUniqueId *uid, char *buf, size_t len) {
  struct boot_id id;
  id_load(uid, &id);
  if (!id.fixed)
    snprintf(buf, len, "its secret (from the unique id) differs from the job's: the unique id belongs to another "
             "communicator or job");
  else if (param_is_set(P_SECRET))
    snprintf(buf, len, "its secret (LOOM_SECRET) differs from the job's: every rank must have the same LOOM_SECRET");
  else if (param_is_set(P_SECRET_FILE))
    snprintf(buf, len, "its secret (LOOM_SECRET_FILE=%s) differs from the job's: every rank must have the same secret",
             param_str(P_SECRET_FILE));
  else
    snprintf(buf, len, "its secret (LOOM_SECRET) differs from the job's: this rank has none (neither LOOM_SECRET nor "
             "LOOM_SECRET_FILE is set) and the job has one");
}

int bootstrap_id_is_fixed(const ncclUniqueId *uid) {
  struct boot_id id;
  id_load(uid, &id);
  return id.fixed != 0;
}

int bootstrap_id_valid(const ncclUniqueId *uid) {
  struct boot_id id;
  id_load(uid, &id);
  return memcmp(id.magic, id_magic, sizeof id.magic) == 0 && boot_addr_check(&id.root) == BOOT_OK;
}

const char *bootstrap_id_root(const ncclUniqueId *uid, char *buf, size_t len) {
  struct boot_id id;
  id_load(uid, &id);
  return sock_addr_str(&id.root, buf, len);
}

uint64_t bootstrap_id_hash(const ncclUniqueId *uid) {
  /* Only the public part: the hash is in logs and status pages, and one
   * of a secret would let a weak LOOM_SECRET be guessed offline. */
  struct boot_id id;
  id_load(uid, &id);
  uint64_t h = util_hash(id.magic, sizeof id.magic, id.fixed);
  h = util_hash(&id.root, sizeof id.root, h);
  return util_hash(id.tag, sizeof id.tag, h);
}

ncclResult_t bootstrap_start_root(const ncclUniqueId *uid) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  char a[SOCK_ADDR_STRLEN];
  ncclResult_t r = bootstrap_root_start(&id.root, id.secret, NULL);
  boot_cleanse(id.secret, sizeof id.secret);
  if (r != ncclSuccess) {
    err_context("NCCL_COMM_ID=%s: rank 0 cannot start the bootstrap root there", sock_addr_str(&id.root, a, sizeof a));
    return ncclSystemError;
  }
  INFO(LOG_BOOTSTRAP, "bootstrap root listening on NCCL_COMM_ID %s", a);
  return ncclSuccess;
}
