/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/socket.h"
#include "misc/utils.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NCCL's syntax (socket.h has the grammar). The parser is strict where
 * NCCL is silent: a value NCCL would quietly match nothing with, or match
 * differently than written ("eth0 eth1", "eth0,^ib0", a name cut at 15
 * characters), is refused with what is wrong, so init can say so. */
static int ifname_char_ok(unsigned char ch) { return ch > 0x20 && ch != 0x7f && ch != '/' && ch != ','; }

ncclResult_t sock_ifname_parse(const char *expr, struct sock_ifname_spec *out) {
  memset(out, 0, sizeof *out);
  const char *p = expr;
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p == '^') {
    out->exclude = 1;
    p++;
  }
  if (*p == '=') {
    out->exact = 1;
    p++;
  }
  for (int item = 1;; item++) {
    while (*p == ' ' || *p == '\t')
      p++;
    const char *b = p;
    while (*p != '\0' && *p != ',')
      p++;
    const char *e = p; /* [b, e) is the item, leading blanks skipped */
    while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
      e--;
    size_t len = (size_t)(e - b);
    if (len > 0) {
      if (*b == '^' || *b == '=')
        return err_set(ncclInvalidArgument,
                       "item %d \"%.*s\" starts with '%c', which only means something at the start of the whole "
                       "list (^ excludes the list, = after it makes names exact)",
                       item, (int)len, b, *b);
      const char *colon = memchr(b, ':', len);
      size_t nlen = colon ? (size_t)(colon - b) : len;
      if (colon) {
        /* NCCL_IB_HCA's port suffix is accepted and means nothing here. */
        const char *d = colon + 1;
        size_t dl = (size_t)(e - d);
        int digits = dl > 0 && dl <= 5;
        for (size_t i = 0; i < dl && digits; i++)
          digits = d[i] >= '0' && d[i] <= '9';
        if (!digits || atoi(d) > 65535)
          return err_set(ncclInvalidArgument,
                         "item %d \"%.*s\": what follows ':' must be a port number (it is ignored), not \"%.*s\"",
                         item, (int)len, b, (int)dl, d);
      }
      if (nlen == 0)
        return err_set(ncclInvalidArgument, "item %d \"%.*s\" has a port but no interface name", item, (int)len,
                       b);
      for (size_t i = 0; i < nlen; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (ch == ' ' || ch == '\t')
          return err_set(ncclInvalidArgument,
                         "item %d \"%.*s\" has a blank inside an interface name; separate names with commas", item,
                         (int)len, b);
        if (!ifname_char_ok(ch))
          return err_set(ncclInvalidArgument,
                         "item %d \"%.*s\" has the character 0x%02x, which no interface name can contain", item,
                         (int)len, b, ch);
      }
      if (nlen >= IF_NAMESIZE)
        return err_set(ncclInvalidArgument,
                       "item %d \"%.*s\" is %zu characters long; interface names have at most %d", item,
                       (int)(nlen > 40 ? 40 : nlen), b, nlen, IF_NAMESIZE - 1);
      if (out->n == SOCK_IFNAME_MAX_ITEMS)
        return err_set(ncclInvalidArgument, "it lists more than %d interfaces", SOCK_IFNAME_MAX_ITEMS);
      memcpy(out->names[out->n], b, nlen);
      out->names[out->n][nlen] = '\0';
      out->n++;
    }
    if (*p == '\0')
      break;
    p++; /* the comma; empty items (",,", a trailing comma) are skipped */
  }
  if (out->n == 0)
    return err_set(ncclInvalidArgument, "it names no interface");
  return ncclSuccess;
}

int sock_ifname_spec_match(const struct sock_ifname_spec *spec, const char *name) {
  int found = 0;
  for (int i = 0; i < spec->n && !found; i++)
    found = spec->exact ? strcmp(name, spec->names[i]) == 0
                        : strncmp(name, spec->names[i], strlen(spec->names[i])) == 0;
  return spec->exclude ? !found : found;
}

int sock_ifname_match(const char *expr, const char *name) {
  struct sock_ifname_spec spec;
  if (sock_ifname_parse(expr, &spec) != ncclSuccess)
    return 0;
  return sock_ifname_spec_match(&spec, name);
}

static int family_wanted(int family) {
  const char *f = param_str(P_SOCKET_FAMILY);
  if (strcmp(f, "AF_INET") == 0)
    return family == AF_INET;
  if (strcmp(f, "AF_INET6") == 0)
    return family == AF_INET6;
  return family == AF_INET || family == AF_INET6;
}

static int usable_addr(const struct ifaddrs *ifa) {
  if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP))
    return 0;
  int fam = ifa->ifa_addr->sa_family;
  if (!family_wanted(fam))
    return 0;
  /* Link-local IPv6 addresses need a scope to be reached; skip them. */
  if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))
    return 0;
  return 1;
}

/* Adds the interfaces `spec` selects, one address each, IPv4 first. */
static int collect(struct ifaddrs *list, const char *expr, struct sock_iface *out, int n, int max) {
  struct sock_ifname_spec spec;
  if (sock_ifname_parse(expr, &spec) != ncclSuccess)
    return n;
  for (int pass = 0; pass < 2; pass++) {
    for (struct ifaddrs *ifa = list; ifa && n < max; ifa = ifa->ifa_next) {
      if (!usable_addr(ifa))
        continue;
      if ((pass == 0) != (ifa->ifa_addr->sa_family == AF_INET))
        continue;
      if (!sock_ifname_spec_match(&spec, ifa->ifa_name))
        continue;
      int dup = 0;
      for (int i = 0; i < n; i++)
        if (strcmp(out[i].name, ifa->ifa_name) == 0)
          dup = 1;
      if (dup)
        continue;
      snprintf(out[n].name, sizeof out[n].name, "%s", ifa->ifa_name);
      memset(&out[n].addr, 0, sizeof out[n].addr);
      memcpy(&out[n].addr, ifa->ifa_addr,
             ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
      n++;
    }
  }
  return n;
}

ncclResult_t sock_find_interfaces(struct sock_iface *out, int max, int *count) {
  return sock_find_interfaces_why(out, max, count, NULL, 0);
}

ncclResult_t sock_find_interfaces_why(struct sock_iface *out, int max, int *count, char *why, size_t whylen) {
  const char *fam = param_str(P_SOCKET_FAMILY);
  if (fam[0] != '\0' && strcmp(fam, "AF_INET") != 0 && strcmp(fam, "AF_INET6") != 0)
    return err_set(ncclInvalidArgument, "NCCL_SOCKET_FAMILY=%s is neither AF_INET nor AF_INET6", fam);
  int user = param_is_set(P_SOCKET_IFNAME);
  const char *expr = param_str(P_SOCKET_IFNAME);
  if (user) {
    struct sock_ifname_spec spec;
    if (sock_ifname_parse(expr, &spec) != ncclSuccess) {
      err_context("NCCL_SOCKET_IFNAME=\"%s\" is malformed", expr);
      return ncclInvalidArgument;
    }
  }
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) != 0)
    return err_set(ncclSystemError, "getifaddrs failed: %s", strerror(errno));
  int n = 0;
  const char *reason = "";
  if (user) {
    n = collect(list, expr, out, 0, max);
  } else if ((n = collect(list, "ib", out, 0, max)) > 0) {
    reason = "default: ib interfaces first";
  } else if ((n = collect(list, "^docker,lo,virbr", out, 0, max)) > 0) {
    reason = "default: first up non-loopback, non-docker interface";
  } else if ((n = collect(list, "docker", out, 0, max)) > 0) {
    reason = "default: no other interface is up, so docker";
  } else if ((n = collect(list, "lo", out, 0, max)) > 0) {
    reason = "default: no other interface is up, so loopback";
  }
  if (why && whylen) {
    if (user)
      snprintf(why, whylen, "NCCL_SOCKET_IFNAME=%s%s%s", expr, fam[0] ? ", NCCL_SOCKET_FAMILY=" : "", fam);
    else
      snprintf(why, whylen, "%s%s%s", reason, fam[0] ? ", NCCL_SOCKET_FAMILY=" : "", fam);
  }
  if (n == 0) {
    char have[512] = "";
    size_t o = 0;
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
      if (!usable_addr(ifa) || strstr(have, ifa->ifa_name))
        continue;
      char a[INET6_ADDRSTRLEN] = "?";
      int af = ifa->ifa_addr->sa_family;
      inet_ntop(af, af == AF_INET ? (void *)&((struct sockaddr_in *)ifa->ifa_addr)->sin_addr
                                    : (void *)&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr,
                a, sizeof a);
      o += snprintf(have + o, o < sizeof have ? sizeof have - o : 0, "%s%s (%s)", o ? ", " : "",
                    ifa->ifa_name, a);
      if (o >= sizeof have)
        break;
    }
    freeifaddrs(list);
    if (user)
      return err_set(ncclInvalidArgument,
                     "NCCL_SOCKET_IFNAME=%s matches no interface that is up with a usable address%s%s; "
                     "interfaces here: %s",
                     param_str(P_SOCKET_IFNAME), param_is_set(P_SOCKET_FAMILY) ? " of family " : "",
                     param_is_set(P_SOCKET_FAMILY) ? param_str(P_SOCKET_FAMILY) : "",
                     have[0] ? have : "none");
    return err_set(ncclSystemError, "no network interface is up with a usable address; interfaces here: %s",
                   have[0] ? have : "none");
  }
  freeifaddrs(list);
  *count = n;
  return ncclSuccess;
}

ncclResult_t sock_parse_addr(const char *s, union sock_addr *out) {
  char host[256];
  const char *port;
  memset(out, 0, sizeof *out);
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return err_set(ncclInvalidArgument, "\"%s\" is not an address of the form [ipv6]:port", s);
    snprintf(host, sizeof host, "%.*s", (int)(close - s - 1), s + 1);
    port = close + 2;
  } else {
    const char *colon = strrchr(s, ':');
    if (!colon)
      return err_set(ncclInvalidArgument, "\"%s\" is not an address of the form host:port", s);
    snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
    port = colon + 1;
  }
  char *end;
  long p = strtol(port, &end, 10);
  if (*port == '\0' || *end != '\0' || p < 0 || p > 65535)
    return err_set(ncclInvalidArgument, "\"%s\": port \"%s\" is not a number between 0 and 65535", s, port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || res == NULL)
    return err_set(ncclInvalidArgument, "\"%s\": cannot resolve host \"%s\": %s", s, host, gai_strerror(rc));
  memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (out->sa.sa_family == AF_INET)
    out->sin.sin_port = htons((uint16_t)p);
  else
    out->sin6.sin6_port = htons((uint16_t)p);
  return ncclSuccess;
}

const char *sock_addr_str(const union sock_addr *a, char *buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof ip);
    snprintf(buf, len, "%s:%d", ip, ntohs(a->sin.sin_port));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof ip);
    snprintf(buf, len, "[%s]:%d", ip, ntohs(a->sin6.sin6_port));
  } else {
    snprintf(buf, len, "(no address)");
  }
  return buf;
}

socklen_t sock_addr_len(const union sock_addr *a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int sock_addr_port(const union sock_addr *a) {
  return ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port);
}

void sock_set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void sock_set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

ncclResult_t sock_listen(const union sock_addr *bind_addr, int *fd, union sock_addr *bound) {
  char a[SOCK_ADDR_STRLEN];
  int s = socket(bind_addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
  if (sock_addr_port(bind_addr) != 0) {
    /* A fixed port (NCCL_COMM_ID) must be reusable right after a job. */
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (bind(s, &bind_addr->sa, sock_addr_len(bind_addr)) != 0) {
    int e = errno;
    close(s);
    return err_set(ncclSystemError, "cannot listen on %s: bind failed: %s",
                   sock_addr_str(bind_addr, a, sizeof a), strerror(e));
  }
  if (listen(s, 16384) != 0) {
    int e = errno;
    close(s);
    return err_set(ncclSystemError, "listen on %s failed: %s", sock_addr_str(bind_addr, a, sizeof a), strerror(e));
  }
  socklen_t len = sizeof *bound;
  /* The kernel fills only its family's length; the rest travels in ids. */
  memset(bound, 0, sizeof *bound);
  getsockname(s, &bound->sa, &len);
  *fd = s;
  return ncclSuccess;
}

/* Waits for `events` on fd until the deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, uint64_t deadline) {
  for (;;) {
    uint64_t now = time_ns();
    if (now >= deadline)
      return 0;
    uint64_t left_ms = (deadline - now) / 1000000 + 1;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    if (r > 0)
      return 1;
    if (r < 0 && errno != EINTR)
      return 1; /* let the following call report the error */
  }
}

ncclResult_t sock_connect(const union sock_addr *addr, uint64_t deadline, int retry_refused,
                          const char *what, int *fd) {
  char a[SOCK_ADDR_STRLEN];
  sock_addr_str(addr, a, sizeof a);
  uint64_t backoff_us = 1000;
  for (;;) {
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
      return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
    int rc = connect(s, &addr->sa, sock_addr_len(addr));
    int e = rc == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
      if (!wait_fd(s, POLLOUT, deadline)) {
        close(s);
        return err_set(ncclRemoteError, "connecting to %s at %s timed out after LOOM_TIMEOUT=%llds", what, a,
                       (long long)timeout_seconds());
      }
      socklen_t len = sizeof e;
      getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len);
    }
    if (e == 0) {
      fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
      sock_set_nodelay(s);
      *fd = s;
      return ncclSuccess;
    }
    close(s);
    int retryable = e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH;
    if (!retry_refused || !retryable || time_ns() >= deadline)
      return err_set(ncclRemoteError, "cannot connect to %s at %s: %s%s", what, a, strerror(e),
                     retry_refused && retryable ? " (timed out after LOOM_TIMEOUT)" : "");
    struct timespec ts = {0, (long)(backoff_us * 1000)};
    nanosleep(&ts, NULL);
    if (backoff_us < 100000)
      backoff_us *= 2;
  }
}

int sock_probe(const union sock_addr *addr, uint64_t deadline) {
  int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0)
    return -errno;
  int e = connect(s, &addr->sa, sock_addr_len(addr)) == 0 ? 0 : errno;
  if (e == EINPROGRESS) {
    if (!wait_fd(s, POLLOUT, deadline)) {
      close(s);
      return -ETIMEDOUT;
    }
    socklen_t len = sizeof e;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len);
  }
  if (e != 0) {
    close(s);
    return -e;
  }
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
  return s;
}

ncclResult_t sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline, const char *what) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_fd(fd, POLLOUT, deadline))
        return err_set(ncclRemoteError, "sending to %s timed out after LOOM_TIMEOUT=%llds", what,
                       (long long)timeout_seconds());
      continue;
    }
    return err_set(ncclRemoteError, "sending to %s failed: %s", what, strerror(errno));
  }
  return ncclSuccess;
}

ncclResult_t sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline, const char *what) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0)
      return err_set(ncclRemoteError, "%s closed the connection (the process exited or aborted)", what);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_fd(fd, POLLIN, deadline))
        return err_set(ncclRemoteError, "waiting for %s timed out after LOOM_TIMEOUT=%llds", what,
                       (long long)timeout_seconds());
      continue;
    }
    return err_set(ncclRemoteError, "receiving from %s failed: %s", what, strerror(errno));
  }
  return ncclSuccess;
}

const char *sock_broken_reason(ssize_t n, int err) {
  /* Only an orderly end is surely the peer's doing. A reset comes from the
   * peer's kernel (a process that died with data unread) or from anything
   * on the path (a firewall, a NAT or load balancer that forgot the
   * connection): the transport adds whether the peer is known to live. */
  if (n == 0)
    return "was closed by the peer (its process exited, aborted or closed the connection)";
  switch (err) {
  case ECONNRESET: return "was reset, by the peer's host or by something between (a firewall, NAT or load balancer)";
  case EPIPE: return "was broken: the other end reset or closed it";
  case ETIMEDOUT: return "timed out in TCP: the peer's host, or the path to it, stopped answering";
  case EHOSTUNREACH: case ENETUNREACH: return "lost its route to the peer's host";
  default: break;
  }
  static __thread char buf[96];
  snprintf(buf, sizeof buf, "failed: %s", strerror(err));
  return buf;
}
