/*
 * Emulated hosts for tests (netns.h). Every step is an `ip` command, so a
 * failure prints iproute2's own message.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "netns.h"

#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

static int sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  if (rc != 0)
    fprintf(stderr, "netns: `%s` failed (%d)\n", cmd, rc);
  return rc;
}

void netns_hosts_down(struct netns_hosts *h) {
  char c[96];
  for (int i = 0; i < h->n; i++)
    if (h->ns[i][0]) {
      snprintf(c, sizeof c, "ip netns del %s 2>/dev/null", h->ns[i]);
      (void)!system(c);
    }
  if (h->bridge[0]) {
    snprintf(c, sizeof c, "ip link del %s 2>/dev/null", h->bridge);
    (void)!system(c);
  }
  memset(h, 0, sizeof *h);
}

int netns_hosts_up(struct netns_hosts *h, int n, int flags) {
  memset(h, 0, sizeof *h);
  if (n < 1 || n > NETNS_MAX) {
    fprintf(stderr, "netns: %d hosts asked, at most %d\n", n, NETNS_MAX);
    return 1;
  }
  if (geteuid() != 0) {
    fprintf(stderr, "SKIP: network namespaces need root\n");
    return TEST_SKIP;
  }
  if (system("ip -V >/dev/null 2>&1") != 0) {
    fprintf(stderr, "SKIP: the ip command (iproute2) is not installed\n");
    return TEST_SKIP;
  }
  int pid = (int)getpid();
  int a = (pid >> 8) & 255, b = pid & 255;
  snprintf(h->bridge, sizeof h->bridge, "lmbr%d", pid % 100000000);
  if (sh("ip link add %s type bridge 2>/dev/null", h->bridge) != 0) {
    h->bridge[0] = '\0';
    fprintf(stderr, "SKIP: cannot create a bridge here (ip link add type bridge failed)\n");
    return TEST_SKIP;
  }
  snprintf(h->root_addr, sizeof h->root_addr, "10.%d.%d.254", a, b);
  if (sh("ip addr add %s/24 dev %s && ip link set %s up", h->root_addr, h->bridge, h->bridge) != 0)
    goto fail;
  for (int i = 0; i < n; i++) {
    h->n = i + 1;
    snprintf(h->ns[i], sizeof h->ns[i], "loomhost%c%d", 'a' + i, pid);
    snprintf(h->root_if[i], sizeof h->root_if[i], "lr%d_%d", pid % 1000000, i);
    snprintf(h->addr[i], sizeof h->addr[i], "10.%d.%d.%d", a, b, i + 1);
    if (sh("ip netns add %s", h->ns[i]) != 0) {
      h->ns[i][0] = '\0';
      netns_hosts_down(h);
      fprintf(stderr, "SKIP: cannot create network namespaces here (ip netns add failed)\n");
      return TEST_SKIP;
    }
    if (sh("ip link add %s type veth peer name %s netns %s", h->root_if[i], NETNS_IFNAME, h->ns[i]) != 0 ||
        sh("ip link set %s master %s && ip link set %s up", h->root_if[i], h->bridge, h->root_if[i]) != 0 ||
        sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && ip -n %s link set lo up", h->ns[i],
           h->addr[i], NETNS_IFNAME, h->ns[i], NETNS_IFNAME, h->ns[i]) != 0)
      goto fail;
    if (flags & NETNS_IPV6) {
      /* nodad: the address is usable at once instead of after duplicate
       * address detection, which would make binding to it racy. */
      snprintf(h->addr6[i], sizeof h->addr6[i], "fd77:%x:%x::%d", a, b, i + 1);
      if (sh("ip -n %s addr add %s/64 dev %s nodad", h->ns[i], h->addr6[i], NETNS_IFNAME) != 0)
        goto fail;
    }
  }
  return 0;
fail:
  netns_hosts_down(h);
  return 1;
}

int netns_enter(const struct netns_hosts *h, int host) {
  char path[64];
  snprintf(path, sizeof path, "/var/run/netns/%s", h->ns[host]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    perror(path);
    if (fd >= 0)
      close(fd);
    return -1;
  }
  close(fd);
  return 0;
}

int netns_exec(const struct netns_hosts *h, int host, const char *cmd) {
  return sh("ip netns exec %s sh -c '%s'", h->ns[host], cmd);
}
