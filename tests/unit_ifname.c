/* NCCL_SOCKET_IFNAME's syntax, address parsing and interface choice. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "misc/socket.h"
#include "test.h"

TEST_IMPL(unit_ifname) {
  ASSERT(sock_ifname_match("eth", "eth0"));
  ASSERT(sock_ifname_match("eth", "eth10"));
  ASSERT(!sock_ifname_match("eth", "ib0"));
  ASSERT(sock_ifname_match("ib,eth", "eth1"));
  ASSERT(sock_ifname_match("^docker,lo", "eth0"));
  ASSERT(!sock_ifname_match("^docker,lo", "docker0"));
  ASSERT(!sock_ifname_match("^docker,lo", "lo"));
  ASSERT(sock_ifname_match("=eth0", "eth0"));
  ASSERT(!sock_ifname_match("=eth0", "eth01"));
  ASSERT(!sock_ifname_match("^=eth0", "eth0"));
  ASSERT(sock_ifname_match("^=eth0", "eth01"));
  ASSERT(sock_ifname_match("eth0:1234", "eth0"));

  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  ASSERT(sock_parse_addr("127.0.0.1:4567", &a) == ncclSuccess);
  ASSERT(strcmp(sock_addr_str(&a, buf, sizeof buf), "127.0.0.1:4567") == 0);
  ASSERT(sock_parse_addr("[::1]:80", &a) == ncclSuccess);
  ASSERT(strcmp(sock_addr_str(&a, buf, sizeof buf), "[::1]:80") == 0);
  ASSERT(sock_parse_addr("localhost:99999", &a) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "port") != NULL);
  ASSERT(sock_parse_addr("nocolon", &a) == ncclInvalidArgument);

  struct sock_iface ifs[SOCK_MAX_IFACES];
  int n = 0;
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclSuccess);
  ASSERT(n >= 1 && strcmp(ifs[0].name, "lo") == 0);
  setenv("NCCL_SOCKET_IFNAME", "=nosuchif0", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclInvalidArgument);
  /* The sentence names the expression and what there is instead. */
  ASSERT(strstr(err_thread_last(), "NCCL_SOCKET_IFNAME==nosuchif0 matches no interface") != NULL);
  ASSERT(strstr(err_thread_last(), "lo (127.0.0.1") != NULL);
  unsetenv("NCCL_SOCKET_IFNAME");
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclSuccess && n >= 1);
  return 0;
}
