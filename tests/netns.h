/*
 * Hosts emulated with network namespaces: each host is a namespace with
 * one interface (NETNS_IFNAME) on a bridge in the root namespace, which
 * also has an address there, so programs in the root namespace (a
 * launcher) reach every host. Subnets derive from the test's pid, so tests
 * running side by side do not collide. Loom treats a network namespace as
 * a host of its own (topo_host_hash).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_NETNS_H
#define LOOM_TEST_NETNS_H

#define NETNS_MAX 8
/* The interface of every host; nothing else on the machine starts so. */
#define NETNS_IFNAME "lmeth0"

enum { NETNS_IPV6 = 1 }; /* also give every host an IPv6 address */

struct netns_hosts {
  int n;
  char ns[NETNS_MAX][32];
  char bridge[16];
  char root_if[NETNS_MAX][16]; /* the root namespace's end of host i's veth */
  char addr[NETNS_MAX][48];    /* host i's IPv4 address */
  char addr6[NETNS_MAX][48];   /* and IPv6 with NETNS_IPV6, else "" */
  char root_addr[48];          /* the bridge's IPv4 address */
};

/* Creates n hosts; 0, or TEST_SKIP with the reason printed (not root, no
 * iproute2, namespaces refused), or 1 when a step failed. */
int netns_hosts_up(struct netns_hosts *h, int n, int flags);
void netns_hosts_down(struct netns_hosts *h);

/* Moves the calling process into host i's namespace; 0 or -1. */
int netns_enter(const struct netns_hosts *h, int host);

/* Runs a shell command (without single quotes) inside host i, such as
 * "tc qdisc add dev lmeth0 ...": its exit status. */
int netns_exec(const struct netns_hosts *h, int host, const char *cmd);

#endif
