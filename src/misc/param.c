/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { INT = PARAM_INT, BOOL = PARAM_BOOL, STR = PARAM_STR };

static const struct param_desc params[P_COUNT] = {
#define PARAM(id, pname, ptype, pdef, pmin, pmax, phelp) \
  [P_##id] = {.name = pname, .type = ptype, .def = pdef, .min = pmin, .max = pmax, .help = phelp},
#include "misc/params.def"
#undef PARAM
};

const struct param_desc *param_desc(enum param_id id) {
  return (id >= 0 && id < P_COUNT) ? &params[id] : NULL;
}

int param_is_set(enum param_id id) {
  const char *v = getenv(params[id].name);
  return v != NULL && v[0] != '\0';
}

const char *param_str(enum param_id id) {
  const char *v = getenv(params[id].name);
  return (v != NULL && v[0] != '\0') ? v : params[id].def;
}

/* Strict parse: the whole string must be a number in range; k/m/g suffixes
 * are accepted for sizes because users write NCCL_BUFFSIZE=4m. */
static int parse_int(const struct param_desc *p, const char *s, int64_t *out) {
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 0);
  if (end == s || errno == ERANGE)
    return -1;
  if (p->type == PARAM_INT && *end != '\0') {
    int64_t mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1 << 10; break;
    case 'm': case 'M': mult = 1 << 20; break;
    case 'g': case 'G': mult = 1 << 30; break;
    default: return -1;
    }
    if (end[1] != '\0')
      return -1;
    v *= mult;
  }
  if (*end != '\0' && p->type != PARAM_INT)
    return -1;
  if (v < p->min || v > p->max)
    return -2;
  *out = v;
  return 0;
}

int64_t param_int(enum param_id id) {
  const struct param_desc *p = &params[id];
  int64_t v = 0;
  const char *s = getenv(p->name);
  if (s != NULL && s[0] != '\0' && parse_int(p, s, &v) == 0)
    return v;
  parse_int(p, p->def, &v);
  return v;
}

int param_set_valid(enum param_id id) {
  const struct param_desc *p = &params[id];
  const char *s = getenv(p->name);
  if (s == NULL || s[0] == '\0')
    return 0;
  int64_t v;
  return p->type == PARAM_STR || parse_int(p, s, &v) == 0;
}

/* A linear scan: the table has a few dozen entries and lookups by name
 * come from the parameter API, never from a hot path. */
int param_find(const char *name) {
  for (int i = 0; name != NULL && i < P_COUNT; i++)
    if (strcmp(params[i].name, name) == 0)
      return i;
  return -1;
}

ncclResult_t param_check_all(void) {
  for (int i = 0; i < P_COUNT; i++) {
    const struct param_desc *p = &params[i];
    const char *s = getenv(p->name);
    if (p->type == PARAM_STR || s == NULL || s[0] == '\0')
      continue;
    int64_t v;
    int rc = parse_int(p, s, &v);
    if (rc == -1)
      return err_set(ncclInvalidArgument, "%s=%s is not %s (%s)", p->name, s,
                     p->type == PARAM_BOOL ? "0 or 1" : "an integer", p->help);
    if (rc == -2)
      return err_set(ncclInvalidArgument, "%s=%s is out of range: it must be between %lld and %lld (%s)",
                     p->name, s, (long long)p->min, (long long)p->max, p->help);
  }
  const char *fam = getenv("NCCL_SOCKET_FAMILY");
  if (fam != NULL && fam[0] != '\0' && strcmp(fam, "AF_INET") != 0 && strcmp(fam, "AF_INET6") != 0)
    return err_set(ncclInvalidArgument, "NCCL_SOCKET_FAMILY=%s is neither AF_INET nor AF_INET6", fam);
  const char *dev = getenv("LOOM_DEVICE");
  if (dev != NULL && dev[0] != '\0' && strcmp(dev, "host") != 0)
    return err_set(ncclInvalidArgument, "LOOM_DEVICE=%s is not understood: the only value is \"host\"", dev);
  if (param_int(P_MIN_NCHANNELS) > param_int(P_MAX_NCHANNELS) && param_is_set(P_MIN_NCHANNELS) &&
      param_is_set(P_MAX_NCHANNELS))
    return err_set(ncclInvalidArgument, "NCCL_MIN_NCHANNELS=%lld is larger than NCCL_MAX_NCHANNELS=%lld",
                   (long long)param_int(P_MIN_NCHANNELS), (long long)param_int(P_MAX_NCHANNELS));
  char why[256];
  if (!log_env_valid(why, sizeof why))
    return err_set(ncclInvalidArgument, "%s", why);
  return ncclSuccess;
}

extern char **environ;

size_t param_rccl_unread(char *buf, size_t len) {
  size_t n = 0, at = 0;
  if (len)
    buf[0] = '\0';
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "RCCL_", 5) != 0)
      continue;
    size_t name = strcspn(*e, "=");
    if (len && at + name + 3 < len) {
      at += (size_t)snprintf(buf + at, len - at, "%s%.*s", n ? ", " : "", (int)name, *e);
    } else if (len && at + 4 < len && !strstr(buf, "...")) {
      at += (size_t)snprintf(buf + at, len - at, "...");
    }
    n++;
  }
  return n;
}
