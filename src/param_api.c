/*
 * NCCL 2.30's parameter API (ncclParamBind, the typed getters, the text
 * and raw forms, the key table, ncclParamDumpAll) over Loom's own table,
 * src/misc/params.def. What it decides, and why:
 *
 * - A key is the full name of the environment variable Loom reads,
 *   "NCCL_BUFFSIZE" or "LOOM_TIMEOUT", matched case-sensitively. NVIDIA's
 *   2.30.7 library refuses "DEBUG" for "NCCL_DEBUG" and "nccl_debug" too,
 *   and Loom's own LOOM_ names would make a stripped prefix ambiguous, so
 *   a short key is refused, with a sentence that gives the full key.
 * - A handle is a pointer into a read-only static array, one entry per
 *   P_* id: the library owns it, binding a key twice gives the same
 *   handle, and a handle passed back is checked to point at an entry.
 * - Values are what the library itself uses: param_int for INT and BOOL
 *   (the set value if it parses and lies in range, else the default),
 *   param_str for STR. They are read from the environment at each call,
 *   as the rest of Loom reads them, so nothing is cached.
 * - An integer getter refuses, never truncates, a value outside its
 *   width (a negative one into an unsigned type included), and refuses a
 *   STR parameter. A refused call writes nothing to *out.
 * - ncclParamGetStr and ncclParamGetParameter return text (integers in
 *   decimal) in two buffers of the calling thread, each valid until the
 *   same function's next call on that thread, as NVIDIA's header says.
 *   valueLen is the text's length without its NUL, as NVIDIA's.
 * - ncclParamGet copies the int64 value's 8 bytes (native byte order) for
 *   INT and BOOL parameters, and the text with its NUL for STR ones;
 *   *len is the number of bytes written. A buffer too small is refused
 *   and *len set to 0, as NVIDIA's library does; the sentence says how
 *   many bytes are needed. maxLen <= 0, out or len NULL: refused with
 *   *len left alone (NVIDIA leaves it alone for maxLen 0 too).
 * - An unknown key leaves ncclParamBind's *out alone, and makes
 *   ncclParamGetParameter set *value to NULL and *valueLen to 0 (NVIDIA's
 *   behaviour).
 * - ncclParamGetAllParameterKeys lists every entry of params.def: NVIDIA
 *   lists its documented parameters unless NCCL_PARAM_DUMP_ALL is set,
 *   and every entry of Loom's table is documented (docs/environment.md),
 *   so the variable changes nothing here. The table is the thread's own
 *   copy, so a caller writing into it harms no other thread.
 * - ncclParamDumpAll logs one INFO line (subsystem ENV) per parameter:
 *   key = value ("" when empty), and whether the value was set or is the
 *   default (and, for a set value the table refuses, that it is).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ncclParamHandle {
  enum param_id id;
};

/* Read-only: a caller that writes through a handle faults instead of
 * changing what another handle names. */
static const struct ncclParamHandle handles[P_COUNT] = {
#define PARAM(pid, pname, ptype, pdef, pmin, pmax, phelp) [P_##pid] = {.id = P_##pid},
#include "misc/params.def"
#undef PARAM
};

/* The thread's buffers live on the heap behind one pointer, for the
 * reason src/misc/errors.c gives (static TLS is small when the library is
 * dlopen()ed); a key's destructor frees them when the thread ends. */
struct param_tls {
  char *str;  /* ncclParamGetStr */
  size_t str_cap;
  char *text; /* ncclParamGetParameter */
  size_t text_cap;
  const char *keys[P_COUNT]; /* ncclParamGetAllParameterKeys */
};
static LOOM_TLS_FAST struct param_tls *tls_state;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p) {
  struct param_tls *t = p;
  tls_state = NULL;
  free(t->str);
  free(t->text);
  free(t);
}

static void tls_key_make(void) { pthread_key_create(&tls_key, tls_free); }

static ncclResult_t tls_get(const char *fn, struct param_tls **out) {
  if (tls_state == NULL) {
    pthread_once(&tls_once, tls_key_make);
    struct param_tls *t = calloc(1, sizeof *t);
    if (t == NULL)
      return err_set(ncclSystemError, "%s: out of memory for this thread's parameter buffers", fn);
    pthread_setspecific(tls_key, t);
    tls_state = t;
  }
  *out = tls_state;
  return ncclSuccess;
}

/* Copies `s` into a thread buffer, growing it: a value such as a list of
 * NICs or a path has no length limit. */
static ncclResult_t buf_copy(const char *fn, char **buf, size_t *cap, const char *s) {
  size_t need = strlen(s) + 1;
  if (need > *cap) {
    size_t want = need < 64 ? 64 : need;
    char *b = realloc(*buf, want);
    if (b == NULL)
      return err_set(ncclSystemError, "%s: out of memory for a %zu-byte parameter value", fn, need);
    *buf = b;
    *cap = want;
  }
  memcpy(*buf, s, need);
  return ncclSuccess;
}

/* Checks that `h` is one of `handles`, comparing addresses as integers
 * (relational operators on pointers into different objects are undefined). */
static ncclResult_t handle_id(const char *fn, ncclParamHandle_t h, enum param_id *id) {
  if (h == NULL)
    return err_set(ncclInvalidArgument, "%s: the handle h is NULL (ncclParamBind makes one)", fn);
  uintptr_t off = (uintptr_t)h - (uintptr_t)handles;
  if (off >= sizeof handles || off % sizeof handles[0] != 0)
    return err_set(ncclInvalidArgument, "%s: the handle h (%p) is not one that ncclParamBind returned", fn,
                   (void *)h);
  *id = handles[off / sizeof handles[0]].id;
  return ncclSuccess;
}

/* The parameter's value as text: integers in decimal, strings as they are.
 * `num` is scratch space for the decimal form. */
static const char *value_text(enum param_id id, char num[24]) {
  if (param_desc(id)->type == PARAM_STR)
    return param_str(id);
  snprintf(num, 24, "%" PRId64, param_int(id));
  return num;
}

/* The key's id; or -1 and a sentence naming the key (ncclInvalidArgument),
 * with the full name where the key lacks only the NCCL_ prefix. */
static int key_id(const char *fn, const char *key) {
  int i = param_find(key);
  if (i >= 0)
    return i;
  char full[256];
  snprintf(full, sizeof full, "NCCL_%s", key);
  if (strncmp(key, "NCCL_", 5) != 0 && param_find(full) >= 0)
    err_set(ncclInvalidArgument, "%s: no parameter is named \"%s\": keys are full variable names, here %s", fn, key,
            full);
  else
    err_set(ncclInvalidArgument,
            "%s: no parameter is named \"%s\" (keys are the environment variables' full names, such as "
            "NCCL_BUFFSIZE; ncclParamGetAllParameterKeys lists them)",
            fn, key);
  return -1;
}

NCCL_API(ncclResult_t, ncclParamBind, ncclParamHandle_t *out, const char *key) {
  if (out == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamBind: out is NULL"));
  if (key == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamBind: key is NULL"));
  int id = key_id("ncclParamBind", key);
  if (id < 0)
    return api_finish(NULL, ncclInvalidArgument);
  *out = (ncclParamHandle_t)&handles[id];
  return api_finish(NULL, ncclSuccess);
}

/* The value of `h` as an integer within [lo, hi], the values of the type
 * the getter `fn` writes that an int64 can hold; `type` and `hitext` (the
 * type's own maximum) name them in the sentence. */
static ncclResult_t get_int(const char *fn, ncclParamHandle_t h, const void *out, int64_t lo, int64_t hi,
                            const char *type, const char *hitext, int64_t *v) {
  enum param_id id;
  CHECK(handle_id(fn, h, &id));
  if (out == NULL)
    return err_set(ncclInvalidArgument, "%s: out is NULL", fn);
  const struct param_desc *p = param_desc(id);
  if (p->type == PARAM_STR)
    return err_set(ncclInvalidArgument,
                   "%s: %s is a string parameter (its value \"%s\" is read with ncclParamGetStr), not an integer", fn,
                   p->name, param_str(id));
  *v = param_int(id);
  if (*v < lo || *v > hi)
    return err_set(ncclInvalidArgument, "%s: %s is %" PRId64 ", which does not fit %s %s (%" PRId64 " to %s)", fn,
                   p->name, *v, type[0] == 'i' ? "an" : "a", type, lo, hitext);
  return ncclSuccess;
}

/* One getter per width. U64 takes every non-negative value: the table's
 * values are int64, so none exceeds INT64_MAX. */
#define PARAM_GETTER(suffix, ctype, lo, hi, hitext)                                                           \
  NCCL_API(ncclResult_t, ncclParamGet##suffix, ncclParamHandle_t h, ctype *out) {                             \
    int64_t v;                                                                                                \
    ncclResult_t r = get_int("ncclParamGet" #suffix, h, out, (lo), (hi), #ctype, hitext, &v);                 \
    if (r == ncclSuccess)                                                                                     \
      *out = (ctype)v;                                                                                        \
    return api_finish(NULL, r);                                                                               \
  }

PARAM_GETTER(I8, int8_t, INT8_MIN, INT8_MAX, "127")
PARAM_GETTER(I16, int16_t, INT16_MIN, INT16_MAX, "32767")
PARAM_GETTER(I32, int32_t, INT32_MIN, INT32_MAX, "2147483647")
PARAM_GETTER(I64, int64_t, INT64_MIN, INT64_MAX, "9223372036854775807")
PARAM_GETTER(U8, uint8_t, 0, UINT8_MAX, "255")
PARAM_GETTER(U16, uint16_t, 0, UINT16_MAX, "65535")
PARAM_GETTER(U32, uint32_t, 0, UINT32_MAX, "4294967295")
PARAM_GETTER(U64, uint64_t, 0, INT64_MAX, "18446744073709551615")

NCCL_API(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char **out) {
  enum param_id id;
  ncclResult_t r = handle_id("ncclParamGetStr", h, &id);
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  if (out == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGetStr: out is NULL"));
  struct param_tls *t;
  char num[24];
  r = tls_get("ncclParamGetStr", &t);
  if (r == ncclSuccess)
    r = buf_copy("ncclParamGetStr", &t->str, &t->str_cap, value_text(id, num));
  if (r == ncclSuccess)
    *out = t->str;
  return api_finish(NULL, r);
}

NCCL_API(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void *out, int maxLen, int *len) {
  enum param_id id;
  ncclResult_t r = handle_id("ncclParamGet", h, &id);
  if (r != ncclSuccess)
    return api_finish(NULL, r);
  if (out == NULL || len == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGet: %s is NULL", out == NULL ? "out" : "len"));
  if (maxLen <= 0)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGet: maxLen is %d; it must be positive", maxLen));
  const struct param_desc *p = param_desc(id);
  int64_t v = 0;
  const void *src = &v;
  size_t need = sizeof v;
  if (p->type == PARAM_STR) {
    src = param_str(id);
    need = strlen(src) + 1;
  } else {
    v = param_int(id);
  }
  if (need > (size_t)maxLen) {
    *len = 0;
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGet: %s needs %zu bytes (%s) but maxLen is %d",
                                    p->name, need, p->type == PARAM_STR ? "its text and a NUL" : "an int64_t",
                                    maxLen));
  }
  memcpy(out, src, need);
  *len = (int)need;
  return api_finish(NULL, ncclSuccess);
}

NCCL_API(ncclResult_t, ncclParamGetParameter, const char *key, const char **value, int *valueLen) {
  if (key == NULL || value == NULL || valueLen == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGetParameter: %s is NULL",
                                    key == NULL ? "key" : value == NULL ? "value" : "valueLen"));
  *value = NULL;
  *valueLen = 0;
  int id = key_id("ncclParamGetParameter", key);
  if (id < 0)
    return api_finish(NULL, ncclInvalidArgument);
  struct param_tls *t;
  char num[24];
  ncclResult_t r = tls_get("ncclParamGetParameter", &t);
  if (r == ncclSuccess)
    r = buf_copy("ncclParamGetParameter", &t->text, &t->text_cap, value_text(id, num));
  if (r == ncclSuccess) {
    *value = t->text;
    *valueLen = (int)strlen(t->text);
  }
  return api_finish(NULL, r);
}

NCCL_API(ncclResult_t, ncclParamGetAllParameterKeys, const char ***table, int *tableLen) {
  if (table == NULL || tableLen == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclParamGetAllParameterKeys: %s is NULL",
                                    table == NULL ? "table" : "tableLen"));
  struct param_tls *t = NULL;
  ncclResult_t r = tls_get("ncclParamGetAllParameterKeys", &t);
  if (r == ncclSuccess) {
    for (int i = 0; i < P_COUNT; i++)
      t->keys[i] = param_desc(i)->name;
    *table = t->keys;
    *tableLen = P_COUNT;
  }
  return api_finish(NULL, r);
}

NCCL_API(void, ncclParamDumpAll, void) {
  INFO(LOG_ENV, "ncclParamDumpAll: %d parameters", (int)P_COUNT);
  for (int i = 0; i < P_COUNT; i++) {
    char num[24];
    const char *how = param_set_valid(i) ? "set"
                      : param_is_set(i)  ? "default: the set value is not valid"
                                         : "default";
    const char *v = value_text(i, num);
    INFO(LOG_ENV, "%s = %s (%s)", param_desc(i)->name, v[0] != '\0' ? v : "\"\"", how);
  }
}
