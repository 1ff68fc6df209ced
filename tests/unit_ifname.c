/* NCCL_SOCKET_IFNAME's syntax, address parsing and interface choice. */
#include <net/if.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "misc/socket.h"
#include "test.h"

/* Parses `expr`, which must be well formed, and checks every name. */
static void match_all(const char *expr, const char *const *yes, const char *const *no) {
  struct sock_ifname_spec spec;
  ASSERT_MSG(sock_ifname_parse(expr, &spec) == ncclSuccess, "\"%s\" refused: %s", expr, err_thread_last());
  for (; *yes; yes++)
    ASSERT_MSG(sock_ifname_match(expr, *yes) && sock_ifname_spec_match(&spec, *yes), "\"%s\" should select %s",
               expr, *yes);
  for (; *no; no++)
    ASSERT_MSG(!sock_ifname_match(expr, *no) && !sock_ifname_spec_match(&spec, *no),
               "\"%s\" should not select %s", expr, *no);
}
#define MATCH(expr, ...) match_all(expr, (const char *const[]){__VA_ARGS__}, NULL)
#define YES(...) (const char *const[]){__VA_ARGS__, NULL}
#define NO(...) (const char *const[]){__VA_ARGS__, NULL}
#define NONE (const char *const[]){NULL}

/* `expr` is malformed: refused with a sentence containing `why`, and it
 * matches nothing, not even what it seems to name. */
static void malformed(const char *expr, const char *why) {
  struct sock_ifname_spec spec;
  err_clear();
  ASSERT_MSG(sock_ifname_parse(expr, &spec) == ncclInvalidArgument, "\"%s\" should be refused", expr);
  ASSERT_MSG(strstr(err_thread_last(), why) != NULL, "\"%s\": the sentence \"%s\" should say \"%s\"", expr,
             err_thread_last(), why);
  ASSERT_MSG(!sock_ifname_match(expr, "eth0") && !sock_ifname_match(expr, "lo"), "malformed \"%s\" matched",
             expr);
}

static void ifname_syntax(void) {
  /* Prefixes. */
  match_all("eth", YES("eth0", "eth10", "eth", "ethernet"), NO("ib0", "veth0", "et", ""));
  match_all("ib,eth", YES("eth1", "ib0", "ibp3s0"), NO("enp1s0", "lo"));
  match_all("lo", YES("lo", "loop0"), NO("eth0"));
  /* Exclusion. */
  match_all("^docker,lo", YES("eth0", "enp1s0", "l"), NO("docker0", "docker_gwbridge", "lo", "lo1"));
  match_all("^eth", YES("ib0", "lo"), NO("eth0", "eth"));
  /* Exact names. */
  match_all("=eth0", YES("eth0"), NO("eth01", "eth", "eth1"));
  match_all("=eth0,eth1", YES("eth0", "eth1"), NO("eth10", "eth2"));
  match_all("^=eth0", YES("eth01", "eth1", "lo"), NO("eth0"));
  match_all("^=docker0,lo", YES("docker1", "lo0", "eth0"), NO("docker0", "lo"));
  /* Port suffixes (NCCL_IB_HCA's syntax) are accepted and ignored. */
  match_all("eth0:1234", YES("eth0", "eth01"), NO("eth1"));
  match_all("=eth0:1,ib0:2", YES("eth0", "ib0"), NO("ib01"));
  match_all("eth0:65535", YES("eth0"), NONE);
  /* Empty items and trailing or leading commas are skipped. */
  match_all("eth0,", YES("eth0"), NO("ib0"));
  match_all(",eth0", YES("eth0"), NO("ib0"));
  match_all("eth0,,,ib0", YES("eth0", "ib0"), NO("lo"));
  match_all("^,lo,", YES("eth0"), NO("lo"));
  /* Blanks around items and around the whole value. */
  match_all(" eth0 , ib0 ", YES("eth0", "ib0"), NO("lo"));
  match_all("\teth0,\tib0\t", YES("eth0", "ib0"), NO("lo"));
  match_all("  ^=eth0", YES("eth1"), NO("eth0"));
  /* Names of IF_NAMESIZE - 1 characters, the longest there are. */
  match_all("=abcdefghijklmno", YES("abcdefghijklmno"), NO("abcdefghijklmn"));
  match_all("abcdefghijklmno", YES("abcdefghijklmno"), NO("abcdefghijklmn"));
  match_all("abcdefghijklmn", YES("abcdefghijklmn", "abcdefghijklmno"), NO("abcdefghijklm"));
  /* Characters other than the separators are part of a name. */
  match_all("=eth0.100,br-lan,wl_x", YES("eth0.100", "br-lan", "wl_x"), NO("eth0", "br"));
  match_all("=a^b,c=d", YES("a^b", "c=d"), NO("a"));
  /* The parsed form. */
  struct sock_ifname_spec spec;
  ASSERT(sock_ifname_parse(" ^= eth0 , ib1:3 ,", &spec) == ncclSuccess);
  ASSERT(spec.exclude && spec.exact && spec.n == 2);
  ASSERT(strcmp(spec.names[0], "eth0") == 0 && strcmp(spec.names[1], "ib1") == 0);
  ASSERT(sock_ifname_parse("eth", &spec) == ncclSuccess && !spec.exclude && !spec.exact && spec.n == 1);
  /* As many names as there can be. */
  char many[SOCK_IFNAME_MAX_ITEMS * 8 + 1] = "";
  for (int i = 0; i < SOCK_IFNAME_MAX_ITEMS; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%sif%d", i ? "," : "", i);
  ASSERT(sock_ifname_parse(many, &spec) == ncclSuccess && spec.n == SOCK_IFNAME_MAX_ITEMS);
  ASSERT(sock_ifname_match(many, "if31") && !sock_ifname_match(many, "eth0"));

  /* Malformed: nothing named. */
  malformed("^", "names no interface");
  malformed("=", "names no interface");
  malformed("^=", "names no interface");
  malformed(",", "names no interface");
  malformed(" , ,, ", "names no interface");
  malformed("   ", "names no interface");
  malformed("", "names no interface");
  /* A blank inside a name: a list written with spaces. */
  malformed("eth0 eth1", "blank inside an interface name");
  malformed("=eth0,ib 0", "item 2 \"ib 0\"");
  /* Markers that only mean something at the start. */
  malformed("eth0,^ib0", "starts with '^'");
  malformed("=eth0,=eth1", "starts with '='");
  malformed("=^eth0", "starts with '^'");
  malformed("^^eth0", "starts with '^'");
  malformed("^==eth0", "starts with '='");
  /* Names longer than an interface name can be (IF_NAMESIZE - 1). */
  malformed("abcdefghijklmnop", "16 characters long; interface names have at most 15");
  malformed("eth0,=abcdefghijklmnopqrstuvwxyz", "item 2");
  /* Characters no interface name has. */
  malformed("eth/0", "0x2f");
  malformed("eth\x01", "0x01");
  malformed("eth0,\x7f", "0x7f");
  /* What follows ':' must be a port number. */
  malformed("eth0:", "must be a port number");
  malformed("eth0:abc", "must be a port number");
  malformed("eth0:1:2", "must be a port number");
  malformed("eth0:123456", "must be a port number");
  malformed("eth0:65536", "must be a port number");
  malformed(":1234", "port but no interface name");
  /* Too many names. */
  char toomany[sizeof many + 16];
  snprintf(toomany, sizeof toomany, "%s,extra", many);
  malformed(toomany, "more than 32 interfaces");
  /* Very long input: refused as a whole, never cut and half applied. */
  size_t big = 1 << 16;
  char *huge = malloc(big + 1);
  ASSERT(huge);
  memset(huge, 'e', big);
  huge[big] = '\0';
  malformed(huge, "65536 characters long");
  for (size_t i = 0; i + 2 < big; i += 2) {
    huge[i] = 'a';
    huge[i + 1] = ',';
  }
  malformed(huge, "more than 32 interfaces");
  /* Many empty items are no names at all, however long. */
  memset(huge, ',', big);
  malformed(huge, "names no interface");
  free(huge);
}

/* The expression reaches the user through init: sock_find_interfaces
 * names the variable and the value, then what is wrong. */
static void ifname_choice(void) {
  struct sock_iface ifs[SOCK_MAX_IFACES];
  int n = 0;
  char why[300];
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  ASSERT(sock_find_interfaces_why(ifs, SOCK_MAX_IFACES, &n, why, sizeof why) == ncclSuccess);
  ASSERT(n >= 1 && strcmp(ifs[0].name, "lo") == 0);
  ASSERT_MSG(strcmp(why, "NCCL_SOCKET_IFNAME=lo") == 0, "why: %s", why);
  setenv("NCCL_SOCKET_IFNAME", "=lo,", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclSuccess && n == 1 && strcmp(ifs[0].name, "lo") == 0);
  setenv("NCCL_SOCKET_IFNAME", "=nosuchif0", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclInvalidArgument);
  /* The sentence names the expression and what there is instead. */
  ASSERT(strstr(err_thread_last(), "NCCL_SOCKET_IFNAME==nosuchif0 matches no interface") != NULL);
  ASSERT(strstr(err_thread_last(), "lo (127.0.0.1") != NULL);
  setenv("NCCL_SOCKET_IFNAME", "lo eth0", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclInvalidArgument);
  ASSERT_MSG(strstr(err_thread_last(), "NCCL_SOCKET_IFNAME=\"lo eth0\" is malformed: item 1 \"lo eth0\" has a "
                                       "blank inside an interface name") != NULL,
             "%s", err_thread_last());
  setenv("NCCL_SOCKET_IFNAME", "^", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "NCCL_SOCKET_IFNAME=\"^\" is malformed: it names no interface") != NULL);
  /* NCCL_SOCKET_FAMILY narrows the choice and must be one of two names. */
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_SOCKET_FAMILY", "AF_INET", 1);
  ASSERT(sock_find_interfaces_why(ifs, SOCK_MAX_IFACES, &n, why, sizeof why) == ncclSuccess);
  ASSERT(ifs[0].addr.sa.sa_family == AF_INET);
  ASSERT_MSG(strstr(why, "NCCL_SOCKET_FAMILY=AF_INET") != NULL, "why: %s", why);
  setenv("NCCL_SOCKET_FAMILY", "AF_INET6", 1);
  ncclResult_t r = sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n);
  ASSERT(r == ncclSuccess ? ifs[0].addr.sa.sa_family == AF_INET6 : r == ncclInvalidArgument);
  setenv("NCCL_SOCKET_FAMILY", "AF_INET7", 1);
  ASSERT(sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "NCCL_SOCKET_FAMILY=AF_INET7 is neither AF_INET nor AF_INET6") != NULL);
  unsetenv("NCCL_SOCKET_FAMILY");
  /* Unset (or empty): the default choice, which says it is the default. */
  unsetenv("NCCL_SOCKET_IFNAME");
  ASSERT(sock_find_interfaces_why(ifs, SOCK_MAX_IFACES, &n, why, sizeof why) == ncclSuccess && n >= 1);
  ASSERT_MSG(strncmp(why, "default: ", 9) == 0, "why: %s", why);
  ASSERT_MSG(strcmp(ifs[0].name, "lo") != 0 || strstr(why, "loopback"), "lo chosen, why: %s", why);
  setenv("NCCL_SOCKET_IFNAME", "", 1);
  ASSERT(sock_find_interfaces_why(ifs, SOCK_MAX_IFACES, &n, why, sizeof why) == ncclSuccess && n >= 1);
  ASSERT_MSG(strncmp(why, "default: ", 9) == 0, "why: %s", why);
  unsetenv("NCCL_SOCKET_IFNAME");
}

TEST_IMPL(unit_ifname) {
  ifname_syntax();
  ifname_choice();

  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  ASSERT(sock_parse_addr("127.0.0.1:4567", &a) == ncclSuccess);
  ASSERT(strcmp(sock_addr_str(&a, buf, sizeof buf), "127.0.0.1:4567") == 0);
  ASSERT(sock_parse_addr("[::1]:80", &a) == ncclSuccess);
  ASSERT(strcmp(sock_addr_str(&a, buf, sizeof buf), "[::1]:80") == 0);
  ASSERT(sock_parse_addr("localhost:99999", &a) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "port") != NULL);
  ASSERT(sock_parse_addr("nocolon", &a) == ncclInvalidArgument);
  return 0;
}
