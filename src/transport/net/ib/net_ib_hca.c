/*
 * NCCL_IB_HCA (net_ib.h): parsed once into a filter, so that a malformed
 * expression is refused with the reason instead of silently selecting
 * nothing.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "transport/net/ib/net_ib.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static ncclResult_t bad(const char *spec, const char *why) {
  return err_set(ncclInvalidArgument, "NCCL_IB_HCA=%s: %s (the syntax: mlx5_0:1,mlx5_1 to select, ^ to exclude, = for "
                                      "exact names)", spec, why);
}

ncclResult_t ib_hca_parse(const char *spec, struct ib_hca_filter *f) {
  memset(f, 0, sizeof *f);
  const char *p = spec;
  while (isspace((unsigned char)*p))
    p++;
  if (*p == '\0')
    return ncclSuccess;
  if (*p == '^') {
    f->exclude = 1;
    p++;
  }
  if (*p == '=') {
    f->exact = 1;
    p++;
  }
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len && isspace((unsigned char)*p)) {
      p++;
      len--;
    }
    while (len && isspace((unsigned char)p[len - 1]))
      len--;
    if (len == 0)
      return bad(spec, end || f->n ? "an empty item" : "no device after ^ or =");
    if (f->n == IB_HCA_MAX)
      return bad(spec, "more than 32 items");
    const char *colon = memchr(p, ':', len);
    size_t nlen = colon ? (size_t)(colon - p) : len;
    if (nlen == 0)
      return bad(spec, "a port without a device name");
    if (nlen >= IB_NAME_LEN)
      return bad(spec, "a device name longer than 63 characters");
    for (size_t i = 0; i < nlen; i++)
      if (isspace((unsigned char)p[i]) || p[i] == '^' || p[i] == '=')
        return bad(spec, "a device name with a space, ^ or = inside (^ and = may only lead the list)");
    memcpy(f->item[f->n].name, p, nlen);
    f->item[f->n].port = -1;
    if (colon) {
      char num[16] = "";
      size_t plen = len - nlen - 1;
      if (plen == 0 || plen >= sizeof num)
        return bad(spec, "a port that is not a number from 1 to 255");
      memcpy(num, colon + 1, plen);
      char *e;
      long port = strtol(num, &e, 10);
      if (*e != '\0' || !isdigit((unsigned char)num[0]) || port < 1 || port > 255)
        return bad(spec, "a port that is not a number from 1 to 255");
      f->item[f->n].port = (int)port;
    }
    f->n++;
    if (!end)
      break;
    p = end + 1;
  }
  return ncclSuccess;
}

int ib_hca_match(const struct ib_hca_filter *f, const char *dev, int port) {
  if (f->n == 0)
    return 1;
  int hit = 0;
  for (int i = 0; i < f->n && !hit; i++) {
    const char *name = f->item[i].name;
    int named = f->exact ? strcmp(dev, name) == 0 : strncmp(dev, name, strlen(name)) == 0;
    hit = named && (f->item[i].port < 0 || f->item[i].port == port);
  }
  return f->exclude ? !hit : hit;
}
