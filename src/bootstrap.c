/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "bootstrap.h"
#include "misc/utils.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap_wire.h"

struct boot_stash {
  struct boot_stash *next;
  int from;
  uint64_t tag;
  size_t len;
  char data[];
};

struct boot_pending {
  int fd;
  uint64_t until;
  size_t got;
  struct msg_hdr h;
};

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

ncclResult_t bootstrap_create_root_id(ncclUniqueId *out) {
  struct boot_id id;
  memset(&id, 0, sizeof id); /* padding too: the id travels as bytes */
  memcpy(id.magic, id_magic, sizeof id.magic);
  char ifname[IF_NAMESIZE], a[SOCK_ADDR_STRLEN];
  union sock_addr bind_addr;
  CHECK(bootstrap_local_address(&bind_addr, ifname, sizeof ifname));
  CHECK(util_random(&id.secret, sizeof id.secret));
  CHECK(bootstrap_root_start(&bind_addr, id.secret, &id.root));
  INFO(LOG_BOOTSTRAP, "bootstrap root listening on %s (%s)", sock_addr_str(&id.root, a, sizeof a), ifname);
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t bootstrap_get_unique_id(ncclUniqueId *out) {
  if (!param_is_set(P_COMM_ID))
    return bootstrap_create_root_id(out);
  struct boot_id id;
  memset(&id, 0, sizeof id); /* padding too: the id travels as bytes */
  memcpy(id.magic, id_magic, sizeof id.magic);
  const char *s = param_str(P_COMM_ID);
  if (sock_parse_addr(s, &id.root) != ncclSuccess) {
    err_context("NCCL_COMM_ID=%s", s);
    return ncclInvalidArgument;
  }
  /* Every process computes the same id on its own, so the secret can only
   * come from the address itself. */
  id.secret = util_hash_str(s, 0x6c6f6f6d);
  id.fixed = 1;
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

int bootstrap_id_is_fixed(const ncclUniqueId *uid) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  return id.fixed != 0;
}

int bootstrap_id_valid(const ncclUniqueId *uid) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  return memcmp(id.magic, id_magic, sizeof id.magic) == 0 &&
         (id.root.sa.sa_family == AF_INET || id.root.sa.sa_family == AF_INET6);
}

const char *bootstrap_id_root(const ncclUniqueId *uid, char *buf, size_t len) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  return sock_addr_str(&id.root, buf, len);
}

uint64_t bootstrap_id_hash(const ncclUniqueId *uid) { return util_hash(uid->internal, sizeof uid->internal, 0); }

ncclResult_t bootstrap_start_root(const ncclUniqueId *uid) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  char a[SOCK_ADDR_STRLEN];
  if (bootstrap_root_start(&id.root, id.secret, NULL) != ncclSuccess) {
    err_context("NCCL_COMM_ID=%s: rank 0 cannot start the bootstrap root there", sock_addr_str(&id.root, a, sizeof a));
    return ncclSystemError;
  }
  INFO(LOG_BOOTSTRAP, "bootstrap root listening on NCCL_COMM_ID %s", a);
  return ncclSuccess;
}

/* ---- ranks ---- */

ncclResult_t bootstrap_init(const ncclUniqueId *uid, int rank, int nranks, const volatile int *abort_flag,
                            struct bootstrap **out) {
  struct boot_id id;
  memcpy(&id, uid->internal, sizeof id);
  char ifname[IF_NAMESIZE], root_str[SOCK_ADDR_STRLEN], a[SOCK_ADDR_STRLEN];
  sock_addr_str(&id.root, root_str, sizeof root_str);
  char root_what[96];
  snprintf(root_what, sizeof root_what, "the bootstrap root at %s", root_str);
  struct bootstrap *b = calloc(1, sizeof *b);
  if (!b)
    return err_set(ncclSystemError, "out of memory for the bootstrap");
  b->rank = rank;
  b->nranks = nranks;
  b->secret = id.secret;
  b->listen_fd = -1;
  b->abort_flag = abort_flag;
  pthread_mutex_init(&b->lock, NULL);
  ncclResult_t res;
  int fd = -1;
  union sock_addr bind_addr;
  CHECK_GOTO(bootstrap_local_address(&bind_addr, ifname, sizeof ifname), res, fail);
  CHECK_GOTO(UTIL_CALLOC(&b->pend, BOOT_MAX_PENDING, "bootstrap connections"), res, fail);
  CHECK_GOTO(sock_listen(&bind_addr, &b->listen_fd, &b->addr), res, fail);
  sock_set_nonblocking(b->listen_fd);
  INFO(LOG_BOOTSTRAP, "bootstrap: rank %d listens on %s (%s), root is %s", rank,
       sock_addr_str(&b->addr, a, sizeof a), ifname, root_str);

  uint64_t deadline = deadline_from_timeout();
  CHECK_GOTO(sock_connect(&id.root, deadline, 1, "the bootstrap root", &fd), res, fail);
  struct root_hello h = {0};
  memcpy(h.magic, hello_magic, sizeof h.magic);
  h.secret = id.secret;
  h.rank = rank;
  h.nranks = nranks;
  h.pid = (int)getpid();
  h.addr = b->addr;
  gethostname(h.host, sizeof h.host - 1);
  CHECK_GOTO(sock_send_all(fd, &h, sizeof h, deadline, root_what), res, fail);
  char raw[sizeof(struct root_reply)];
  struct root_reply rep;
  /* The root enforces the join timeout itself and then says who is
   * missing; waiting a little longer than it lets that sentence arrive. */
  CHECK_GOTO(sock_recv_all(fd, raw, sizeof raw, deadline + 5 * GREETING_NS, root_what), res, fail);
  enum boot_verdict v = boot_reply_check(raw, sizeof raw, nranks, &rep);
  if (v != BOOT_OK) {
    res = err_set(ncclRemoteError, "the bootstrap root at %s answered with %s", root_str, boot_verdict_str(v));
    goto fail;
  }
  if (rep.status != ncclSuccess) {
    res = err_set((ncclResult_t)rep.status, "rank %d: the bootstrap root at %s says: %s", rank, root_str, rep.msg);
    goto fail;
  }
  CHECK_GOTO(UTIL_CALLOC(&b->peers, nranks, "bootstrap addresses"), res, fail);
  CHECK_GOTO(sock_recv_all(fd, b->peers, sizeof *b->peers * nranks, deadline, root_what), res, fail);
  if (boot_peers_check(b->peers, nranks) != BOOT_OK) {
    res = err_set(ncclRemoteError, "the bootstrap root at %s sent a rank address that is neither IPv4 nor IPv6",
                  root_str);
    goto fail;
  }
  close(fd);
  *out = b;
  return ncclSuccess;
fail:
  if (res != ncclSuccess && strstr(err_thread_last(), "bootstrap") == NULL)
    err_context("bootstrap of rank %d (root %s)", rank, root_str);
  if (fd >= 0)
    close(fd);
  bootstrap_close(b);
  return res;
}

void bootstrap_close(struct bootstrap *b) {
  if (!b)
    return;
  if (b->listen_fd >= 0)
    close(b->listen_fd);
  for (int i = 0; i < b->npend; i++)
    close(b->pend[i].fd);
  free(b->pend);
  for (struct boot_stash *s = b->stash, *n; s; s = n) {
    n = s->next;
    free(s);
  }
  free(b->peers);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

ncclResult_t bootstrap_send(struct bootstrap *b, int peer, uint64_t tag, const void *data, size_t len) {
  char what[64];
  snprintf(what, sizeof what, "rank %d's bootstrap listener", peer);
  uint64_t deadline = deadline_from_timeout();
  int fd;
  CHECK(sock_connect(&b->peers[peer], deadline, 0, what, &fd));
  struct msg_hdr h = {0};
  memcpy(h.magic, msg_magic, sizeof h.magic);
  h.secret = b->secret;
  h.from = b->rank;
  h.tag = tag;
  h.len = len;
  ncclResult_t r = sock_send_all(fd, &h, sizeof h, deadline, what);
  if (r == ncclSuccess && len > 0)
    r = sock_send_all(fd, data, len, deadline, what);
  close(fd);
  return r;
}

static struct boot_stash *stash_take(struct bootstrap *b, int from, uint64_t tag) {
  for (struct boot_stash **p = &b->stash; *p; p = &(*p)->next) {
    if ((*p)->from == from && (*p)->tag == tag) {
      struct boot_stash *s = *p;
      *p = s->next;
      return s;
    }
  }
  return NULL;
}

static ncclResult_t deliver(struct boot_stash *s, int peer, uint64_t tag, void *data, size_t len) {
  ncclResult_t r = ncclSuccess;
  if (s->len != len)
    r = err_set(ncclInvalidUsage,
                "rank %d sent %zu bytes of bootstrap data (tag %llx) where %zu were expected: the ranks disagree "
                "about the operation",
                peer, s->len, (unsigned long long)tag, len);
  else
    memcpy(data, s->data, len);
  free(s);
  return r;
}

static void pend_drop(struct bootstrap *b, int i, const char *why) {
  WARN("bootstrap: rank %d dropped a connection that %s", b->rank, why);
  close(b->pend[i].fd);
  b->pend[i] = b->pend[--b->npend];
}

/* The rest of a message whose header has passed: it comes from a rank of
 * this job, so it is read to the end, bounded by LOOM_TIMEOUT. */
static ncclResult_t read_body(struct bootstrap *b, int fd, const struct msg_hdr *h, struct boot_stash **out) {
  struct boot_stash *s = malloc(sizeof *s + h->len);
  if (!s)
    return err_set(ncclSystemError, "out of memory for a %llu-byte bootstrap message", (unsigned long long)h->len);
  s->from = h->from;
  s->tag = h->tag;
  s->len = h->len;
  s->next = NULL;
  char what[48];
  snprintf(what, sizeof what, "rank %d", h->from);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  ncclResult_t r = sock_recv_all(fd, s->data, h->len, deadline_from_timeout(), what);
  if (r != ncclSuccess) {
    free(s);
    return r;
  }
  *out = s;
  return ncclSuccess;
}

/* Reads what pending connection i has sent; a complete message goes to
 * *out. Garbage, another job's secret and pings end the connection. */
static ncclResult_t pend_read(struct bootstrap *b, int i, struct boot_stash **out) {
  struct boot_pending *p = &b->pend[i];
  ssize_t n = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return ncclSuccess;
  if (n <= 0) {
    pend_drop(b, i, "closed before it sent a whole message header");
    return ncclSuccess;
  }
  p->got += (size_t)n;
  struct msg_hdr h;
  enum boot_verdict v = boot_msg_check(&p->h, p->got, b->secret, b->nranks, &h);
  if (v == BOOT_SHORT)
    return ncclSuccess;
  if (v != BOOT_OK) {
    char why[96];
    snprintf(why, sizeof why, "sent %s: it is not from a rank of this communicator", boot_verdict_str(v));
    pend_drop(b, i, why);
    return ncclSuccess;
  }
  int fd = p->fd;
  b->pend[i] = b->pend[--b->npend];
  ncclResult_t r = h.tag == BOOT_TAG_PING ? ncclSuccess /* a peer checking that this process is alive */
                                          : read_body(b, fd, &h, out);
  close(fd);
  return r;
}

/* Takes every connection waiting on the listener. A full table makes
 * room by dropping the connection that has said least for longest; each
 * new one is read at once, since a rank sends as soon as it connects. */
static ncclResult_t accept_new(struct bootstrap *b, struct boot_stash **out) {
  while (*out == NULL) {
    int fd = accept4(b->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        return ncclSuccess;
      return err_set(ncclSystemError, "rank %d: accept on its bootstrap listener failed: %s", b->rank,
                     strerror(errno));
    }
    if (b->npend == BOOT_MAX_PENDING) {
      int victim = 0;
      for (int i = 1; i < b->npend; i++)
        if (b->pend[i].got < b->pend[victim].got ||
            (b->pend[i].got == b->pend[victim].got && b->pend[i].until < b->pend[victim].until))
          victim = i;
      pend_drop(b, victim, "was still incomplete when too many connections were waiting");
    }
    b->pend[b->npend++] = (struct boot_pending){.fd = fd, .until = time_ns() + GREETING_NS};
    CHECK(pend_read(b, b->npend - 1, out));
  }
  return ncclSuccess;
}

/* Waits until `until` for connections and reads all of them at once; the
 * first complete message goes to *out (NULL when none came). */
static ncclResult_t listen_step(struct bootstrap *b, uint64_t until, struct boot_stash **out) {
  *out = NULL;
  uint64_t now = time_ns(), wake = until;
  for (int i = 0; i < b->npend; i++) {
    if (b->pend[i].until <= now) {
      pend_drop(b, i--, "said nothing whole for 2 s");
      continue;
    }
    wake = LOOM_MIN(wake, b->pend[i].until);
  }
  struct pollfd pfd[BOOT_MAX_PENDING + 1];
  pfd[0] = (struct pollfd){.fd = b->listen_fd, .events = POLLIN};
  for (int i = 0; i < b->npend; i++)
    pfd[i + 1] = (struct pollfd){.fd = b->pend[i].fd, .events = POLLIN};
  int nfds = b->npend + 1;
  int ms = wake > now ? (int)((wake - now) / 1000000) + 1 : 0;
  if (poll(pfd, (nfds_t)nfds, ms) <= 0)
    return ncclSuccess;
  /* Reading reorders pend[] (the last entry fills a hole), so walk
   * backwards over the entries that were polled. */
  for (int i = nfds - 2; i >= 0 && *out == NULL; i--)
    if (pfd[i + 1].revents)
      CHECK(pend_read(b, i, out));
  if (*out == NULL && (pfd[0].revents & POLLIN))
    CHECK(accept_new(b, out));
  return ncclSuccess;
}

/* A process that has exited leaves nothing listening on its bootstrap
 * address, whatever host it was on; a probe that gets through says hello
 * and goes, and one that cannot tell (a silent host) proves nothing. */
static ncclResult_t probe(struct bootstrap *b, int peer) {
  int fd = sock_probe(&b->peers[peer], time_ns() + GREETING_NS);
  if (fd == -ECONNREFUSED) {
    char a[SOCK_ADDR_STRLEN];
    return err_set(ncclRemoteError, "rank %d is gone: nothing listens on its bootstrap address %s any more", peer,
                   sock_addr_str(&b->peers[peer], a, sizeof a));
  }
  if (fd >= 0) {
    struct msg_hdr h = {0};
    memcpy(h.magic, msg_magic, sizeof h.magic);
    h.secret = b->secret;
    h.from = b->rank;
    h.tag = BOOT_TAG_PING;
    sock_send_all(fd, &h, sizeof h, time_ns() + GREETING_NS, "a probed rank");
    close(fd);
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_recv(struct bootstrap *b, int peer, uint64_t tag, void *data, size_t len) {
  pthread_mutex_lock(&b->lock);
  ncclResult_t r = ncclSuccess;
  struct boot_stash *s = stash_take(b, peer, tag);
  uint64_t deadline = deadline_from_timeout();
  uint64_t next_check = time_ns() + 100000000ull, next_probe = time_ns() + 1000000000ull;
  while (s == NULL) {
    /* Set by ncclCommAbort on another thread. */
    if (b->abort_flag && __atomic_load_n(b->abort_flag, __ATOMIC_ACQUIRE)) {
      r = err_set(ncclInvalidUsage, "the communicator was aborted while waiting for rank %d", peer);
      goto out;
    }
    uint64_t now = time_ns();
    if (now >= deadline) {
      r = err_set(ncclRemoteError, "rank %d waited LOOM_TIMEOUT=%llds for bootstrap data from rank %d", b->rank,
                  (long long)timeout_seconds(), peer);
      goto out;
    }
    if (b->alive && now >= next_check) {
      next_check = now + 100000000ull;
      CHECK_GOTO(b->alive(b->alive_ctx, peer), r, out);
    }
    if (now >= next_probe) {
      next_probe = now + 1000000000ull;
      CHECK_GOTO(probe(b, peer), r, out);
    }
    struct boot_stash *m = NULL;
    CHECK_GOTO(listen_step(b, LOOM_MIN(deadline, now + 100000000ull), &m), r, out);
    if (m == NULL)
      continue;
    if (m->from == peer && m->tag == tag) {
      s = m;
    } else {
      m->next = b->stash;
      b->stash = m;
    }
  }
  r = deliver(s, peer, tag, data, len);
out:
  pthread_mutex_unlock(&b->lock);
  return r;
}

ncclResult_t bootstrap_allgather(struct bootstrap *b, void *data, size_t size) {
  int n = b->nranks, me = b->rank;
  uint64_t base = BOOT_TAG_INTERNAL | (b->seq++ << 20);
  char *d = data;
  int next = (me + 1) % n, prev = (me - 1 + n) % n;
  /* Ring: at step s send the slot received at step s-1 and receive the one
   * from s+1 ranks back. */
  for (int s = 0; s < n - 1; s++) {
    int send_slot = (me - s + n) % n, recv_slot = (me - s - 1 + n) % n;
    CHECK(bootstrap_send(b, next, base | (uint64_t)s, d + (size_t)send_slot * size, size));
    CHECK(bootstrap_recv(b, prev, base | (uint64_t)s, d + (size_t)recv_slot * size, size));
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_barrier(struct bootstrap *b) {
  int n = b->nranks, me = b->rank;
  uint64_t base = BOOT_TAG_INTERNAL | (b->seq++ << 20);
  char token = 0;
  /* Dissemination: log2(n) rounds. */
  for (int k = 1, round = 0; k < n; k <<= 1, round++) {
    CHECK(bootstrap_send(b, (me + k) % n, base | (uint64_t)round, &token, 1));
    CHECK(bootstrap_recv(b, (me - k + n) % n, base | (uint64_t)round, &token, 1));
  }
  return ncclSuccess;
}
