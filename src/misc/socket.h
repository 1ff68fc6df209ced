/*
 * TCP sockets for the bootstrap and the socket net plugin: addresses,
 * interface choice (NCCL_SOCKET_IFNAME with NCCL's ^ and = syntax,
 * NCCL_SOCKET_FAMILY), and blocking calls bounded by a deadline.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SOCKET_H
#define LOOM_SOCKET_H

#include <net/if.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

union sock_addr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
};

struct sock_iface {
  char name[IF_NAMESIZE];
  union sock_addr addr;
};

#define SOCK_MAX_IFACES 16
#define SOCK_ADDR_STRLEN 64

/*
 * NCCL_SOCKET_IFNAME expressions, NCCL's syntax:
 *   [^][=]item[,item...]   ^: use every interface except those listed;
 *                          =: names are exact (else prefixes)
 *   item: an interface name of 1 to IF_NAMESIZE-1 (15) characters, with an
 *   optional ":port" (NCCL_IB_HCA's syntax; ignored here).
 * Blanks around items and empty items (",,", a trailing comma) are
 * skipped. Malformed, with a sentence saying why (ncclInvalidArgument):
 * no name at all ("^", "=", ","), a blank or a character no interface name
 * has (control characters, '/') inside a name, a name longer than 15, a
 * later item starting with ^ or = (they apply to the whole list only), a
 * ':' not followed by a port number, more than SOCK_IFNAME_MAX_ITEMS names.
 */
#define SOCK_IFNAME_MAX_ITEMS 32
struct sock_ifname_spec {
  int exclude, exact, n;
  char names[SOCK_IFNAME_MAX_ITEMS][IF_NAMESIZE];
};
ncclResult_t sock_ifname_parse(const char *expr, struct sock_ifname_spec *out);
int sock_ifname_spec_match(const struct sock_ifname_spec *spec, const char *name);
/* Parse and match in one; a malformed expression matches nothing. */
int sock_ifname_match(const char *expr, const char *name);

/* The interfaces to use, best first: those NCCL_SOCKET_IFNAME selects, or
 * by default (as NCCL) ib interfaces, else the up interfaces that are
 * neither loopback nor docker, else docker, else loopback. A malformed
 * expression, or one that selects nothing, is an error naming
 * NCCL_SOCKET_IFNAME (the latter lists the interfaces there are). `why`
 * (may be NULL) gets the reason for the choice, for the log. */
ncclResult_t sock_find_interfaces(struct sock_iface *out, int max, int *count);
ncclResult_t sock_find_interfaces_why(struct sock_iface *out, int max, int *count, char *why, size_t whylen);

/* "a.b.c.d:port", "[v6]:port" or "hostname:port". */
ncclResult_t sock_parse_addr(const char *s, union sock_addr *out);
const char *sock_addr_str(const union sock_addr *a, char *buf, size_t len);
socklen_t sock_addr_len(const union sock_addr *a);
int sock_addr_port(const union sock_addr *a);

/* Listens on `bind_addr` (port 0: the kernel chooses); `bound` gets the
 * address peers should connect to. */
ncclResult_t sock_listen(const union sock_addr *bind_addr, int *fd, union sock_addr *bound);

/* Connects, retrying refused connections until `deadline` when
 * `retry_refused` (the listener may not be up yet). `what` names the peer
 * in error messages ("bootstrap root", "rank 3"). */
ncclResult_t sock_connect(const union sock_addr *addr, uint64_t deadline, int retry_refused,
                          const char *what, int *fd);

/* Whether anything listens at `addr`: a connected socket (>= 0), or
 * -ECONNREFUSED when nothing does, or another -errno when it cannot tell
 * by `deadline` (an unreachable or silent host). */
int sock_probe(const union sock_addr *addr, uint64_t deadline);

ncclResult_t sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline, const char *what);
ncclResult_t sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline, const char *what);

void sock_set_nonblocking(int fd);
void sock_set_nodelay(int fd);

/* How a stream ended, as "<the connection> ...": a send() or recv() that
 * returned 0 (n == 0) or failed with `err`. */
const char *sock_broken_reason(ssize_t n, int err);

#endif
