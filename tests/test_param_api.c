/*
 * NCCL 2.30's parameter API over Loom's table (src/param_api.c): binding
 * keys, the typed getters and their refusals, the text and raw forms, the
 * key table, and the dump to the log. Each test runs in a process of its
 * own, so setenv here affects only that test.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl.h"
#include "test.h"

/* The table the library serves, read here from the same file, so that a
 * key the API forgets is noticed. */
static const char *const def_names[] = {
#define PARAM(id, name, type, def, min, max, help) name,
#include "misc/params.def"
#undef PARAM
};
#define DEF_COUNT ((int)(sizeof def_names / sizeof def_names[0]))

/* Expects `call` to return ncclInvalidArgument with a last error that
 * holds every string of the NULL-ended list. */
static void refused(const char *what, ncclResult_t r, const char *const *kw) {
  const char *msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == ncclInvalidArgument, "%s returned %d, not ncclInvalidArgument (last error: %s)", what, (int)r, msg);
  for (; *kw; kw++)
    ASSERT_MSG(strstr(msg, *kw) != NULL, "%s: the last error does not mention \"%s\": %s", what, *kw, msg);
}
#define REFUSED(call, ...) refused(#call, (call), (const char *const[]){__VA_ARGS__, NULL})

static ncclParamHandle_t bind(const char *key) {
  ncclParamHandle_t h = NULL;
  ncclResult_t r = ncclParamBind(&h, key);
  ASSERT_MSG(r == ncclSuccess && h != NULL, "ncclParamBind(%s) returned %d: %s", key, (int)r, ncclGetLastError(NULL));
  return h;
}

TEST_IMPL(param_api_bind) {
  ncclParamHandle_t a = bind("NCCL_BUFFSIZE"), b = bind("NCCL_BUFFSIZE"), c = bind("NCCL_DEBUG");
  ASSERT(a == b); /* one handle per parameter */
  ASSERT(a != c);
  bind("LOOM_TIMEOUT"); /* Loom's own variables are keys too */
  for (int i = 0; i < DEF_COUNT; i++)
    bind(def_names[i]);

  ncclParamHandle_t h = (ncclParamHandle_t)(uintptr_t)0x1234;
  REFUSED(ncclParamBind(&h, "NCCL_NO_SUCH_PARAMETER"), "ncclParamBind", "\"NCCL_NO_SUCH_PARAMETER\"");
  ASSERT(h == (ncclParamHandle_t)(uintptr_t)0x1234); /* left alone */
  /* As in NVIDIA's library, the prefix is part of the key; the sentence
   * gives the full one. */
  REFUSED(ncclParamBind(&h, "BUFFSIZE"), "ncclParamBind", "\"BUFFSIZE\"", "NCCL_BUFFSIZE");
  REFUSED(ncclParamBind(&h, "nccl_buffsize"), "ncclParamBind", "\"nccl_buffsize\"");
  REFUSED(ncclParamBind(&h, ""), "ncclParamBind", "\"\"");
  REFUSED(ncclParamBind(NULL, "NCCL_DEBUG"), "ncclParamBind", "out is NULL");
  REFUSED(ncclParamBind(&h, NULL), "ncclParamBind", "key is NULL");
  ASSERT(h == (ncclParamHandle_t)(uintptr_t)0x1234);
  return 0;
}

TEST_IMPL(param_api_typed) {
  setenv("NCCL_BUFFSIZE", "300000", 1);
  ncclParamHandle_t h = bind("NCCL_BUFFSIZE");
  int8_t i8 = 5;
  int16_t i16 = 5;
  int32_t i32 = 0;
  int64_t i64 = 0;
  uint8_t u8 = 5;
  uint16_t u16 = 5;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  REFUSED(ncclParamGetI8(h, &i8), "ncclParamGetI8", "NCCL_BUFFSIZE", "300000", "int8_t", "127");
  REFUSED(ncclParamGetI16(h, &i16), "ncclParamGetI16", "NCCL_BUFFSIZE", "300000", "int16_t");
  REFUSED(ncclParamGetU8(h, &u8), "ncclParamGetU8", "NCCL_BUFFSIZE", "300000", "uint8_t", "255");
  REFUSED(ncclParamGetU16(h, &u16), "ncclParamGetU16", "NCCL_BUFFSIZE", "300000", "uint16_t", "65535");
  ASSERT(i8 == 5 && i16 == 5 && u8 == 5 && u16 == 5); /* never truncated, never written */
  ASSERT_OK(ncclParamGetI32(h, &i32));
  ASSERT_OK(ncclParamGetI64(h, &i64));
  ASSERT_OK(ncclParamGetU32(h, &u32));
  ASSERT_OK(ncclParamGetU64(h, &u64));
  ASSERT(i32 == 300000 && i64 == 300000 && u32 == 300000 && u64 == 300000);

  /* The value the library uses: suffixes apply, a bad value gives the
   * default, and the environment is read at each call. */
  setenv("NCCL_BUFFSIZE", "4m", 1);
  ASSERT_OK(ncclParamGetI32(h, &i32));
  ASSERT(i32 == 4 << 20);
  setenv("NCCL_BUFFSIZE", "abc", 1);
  ASSERT_OK(ncclParamGetI64(h, &i64));
  ASSERT(i64 == 2097152);
  unsetenv("NCCL_BUFFSIZE");
  ASSERT_OK(ncclParamGetU32(h, &u32));
  ASSERT(u32 == 2097152);

  /* A negative value (NCCL_IB_GID_INDEX defaults to -1) fits the signed
   * types only. */
  unsetenv("NCCL_IB_GID_INDEX");
  ncclParamHandle_t g = bind("NCCL_IB_GID_INDEX");
  ASSERT_OK(ncclParamGetI8(g, &i8));
  ASSERT(i8 == -1);
  ASSERT_OK(ncclParamGetI64(g, &i64));
  ASSERT(i64 == -1);
  REFUSED(ncclParamGetU8(g, &u8), "ncclParamGetU8", "NCCL_IB_GID_INDEX", "-1", "uint8_t");
  REFUSED(ncclParamGetU32(g, &u32), "ncclParamGetU32", "NCCL_IB_GID_INDEX", "-1", "uint32_t");
  REFUSED(ncclParamGetU64(g, &u64), "ncclParamGetU64", "NCCL_IB_GID_INDEX", "-1", "uint64_t");

  /* The edges of a width. */
  setenv("NCCL_IB_TC", "255", 1);
  ncclParamHandle_t tc = bind("NCCL_IB_TC");
  ASSERT_OK(ncclParamGetU8(tc, &u8));
  ASSERT(u8 == 255);
  REFUSED(ncclParamGetI8(tc, &i8), "ncclParamGetI8", "NCCL_IB_TC", "255");
  setenv("NCCL_IB_TC", "127", 1);
  ASSERT_OK(ncclParamGetI8(tc, &i8));
  ASSERT(i8 == 127);

  /* A boolean reads as 0 or 1. */
  setenv("NCCL_SHM_DISABLE", "1", 1);
  ASSERT_OK(ncclParamGetU8(bind("NCCL_SHM_DISABLE"), &u8));
  ASSERT(u8 == 1);

  /* A string parameter has no integer value. */
  setenv("NCCL_DEBUG", "WARN", 1);
  ncclParamHandle_t d = bind("NCCL_DEBUG");
  REFUSED(ncclParamGetI32(d, &i32), "ncclParamGetI32", "NCCL_DEBUG", "string", "ncclParamGetStr");
  REFUSED(ncclParamGetU64(d, &u64), "ncclParamGetU64", "NCCL_DEBUG", "string");

  /* NULL outputs and handles that are not the library's. */
  REFUSED(ncclParamGetI32(h, NULL), "ncclParamGetI32", "out is NULL");
  REFUSED(ncclParamGetU16(NULL, &u16), "ncclParamGetU16", "handle", "NULL");
  int not_a_handle = 0;
  REFUSED(ncclParamGetI64((ncclParamHandle_t)(void *)&not_a_handle, &i64), "ncclParamGetI64",
          "not one that ncclParamBind returned");
  REFUSED(ncclParamGetI64((ncclParamHandle_t)(void *)((char *)h + 1), &i64), "ncclParamGetI64",
          "not one that ncclParamBind returned");
  const char *s = NULL;
  REFUSED(ncclParamGetStr((ncclParamHandle_t)(void *)&not_a_handle, &s), "ncclParamGetStr", "handle");
  return 0;
}

struct other_thread {
  ncclParamHandle_t h;
  const char *got;
  char copy[64];
};

static void *other_thread_get(void *arg) {
  struct other_thread *o = arg;
  if (ncclParamGetStr(o->h, &o->got) == ncclSuccess)
    snprintf(o->copy, sizeof o->copy, "%s", o->got);
  return NULL;
}

TEST_IMPL(param_api_text) {
  setenv("NCCL_BUFFSIZE", "4m", 1);
  setenv("NCCL_DEBUG", "VERSION", 1);
  unsetenv("NCCL_DEBUG_FILE");
  ncclParamHandle_t b = bind("NCCL_BUFFSIZE"), d = bind("NCCL_DEBUG"), f = bind("NCCL_DEBUG_FILE");
  const char *s = NULL;
  ASSERT_OK(ncclParamGetStr(b, &s));
  ASSERT_MSG(strcmp(s, "4194304") == 0, "NCCL_BUFFSIZE=4m as text: \"%s\"", s);
  ASSERT_OK(ncclParamGetStr(d, &s));
  ASSERT(strcmp(s, "VERSION") == 0);
  ASSERT_OK(ncclParamGetStr(f, &s));
  ASSERT(strcmp(s, "") == 0); /* unset, and its default is empty */
  unsetenv("NCCL_IB_GID_INDEX");
  ASSERT_OK(ncclParamGetStr(bind("NCCL_IB_GID_INDEX"), &s));
  ASSERT(strcmp(s, "-1") == 0);

  /* The buffer is the thread's: another thread's call leaves ours alone. */
  ASSERT_OK(ncclParamGetStr(d, &s));
  struct other_thread o = {.h = b};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, other_thread_get, &o) == 0);
  ASSERT(pthread_join(t, NULL) == 0);
  ASSERT(strcmp(o.copy, "4194304") == 0 && o.got != s);
  ASSERT(strcmp(s, "VERSION") == 0);

  /* By key, with the length (without the NUL), in a buffer of its own. */
  const char *v = NULL;
  int vl = -1;
  ASSERT_OK(ncclParamGetParameter("NCCL_BUFFSIZE", &v, &vl));
  ASSERT(strcmp(v, "4194304") == 0 && vl == 7);
  ASSERT(strcmp(s, "VERSION") == 0); /* GetStr's text still stands */
  ASSERT_OK(ncclParamGetParameter("NCCL_DEBUG", &v, &vl));
  ASSERT(strcmp(v, "VERSION") == 0 && vl == 7);

  /* A long value comes back whole. */
  static char longv[5000];
  memset(longv, 'x', sizeof longv - 1);
  setenv("NCCL_IB_HCA", longv, 1);
  ASSERT_OK(ncclParamGetParameter("NCCL_IB_HCA", &v, &vl));
  ASSERT(vl == (int)sizeof longv - 1 && strcmp(v, longv) == 0);
  ASSERT_OK(ncclParamGetStr(bind("NCCL_IB_HCA"), &s));
  ASSERT(strcmp(s, longv) == 0);

  /* Every key has a text, and its length. */
  for (int i = 0; i < DEF_COUNT; i++)
    ASSERT_MSG(ncclParamGetParameter(def_names[i], &v, &vl) == ncclSuccess && v != NULL && vl == (int)strlen(v),
               "%s: %s", def_names[i], ncclGetLastError(NULL));

  v = (const char *)"sentinel";
  vl = 9;
  REFUSED(ncclParamGetParameter("NCCL_NO_SUCH", &v, &vl), "ncclParamGetParameter", "\"NCCL_NO_SUCH\"");
  ASSERT(v == NULL && vl == 0);
  REFUSED(ncclParamGetParameter(NULL, &v, &vl), "ncclParamGetParameter", "key is NULL");
  REFUSED(ncclParamGetParameter("NCCL_DEBUG", NULL, &vl), "ncclParamGetParameter", "value is NULL");
  REFUSED(ncclParamGetParameter("NCCL_DEBUG", &v, NULL), "ncclParamGetParameter", "valueLen is NULL");
  REFUSED(ncclParamGetStr(d, NULL), "ncclParamGetStr", "out is NULL");
  REFUSED(ncclParamGetStr(NULL, &s), "ncclParamGetStr", "handle", "NULL");
  return 0;
}

TEST_IMPL(param_api_raw) {
  setenv("NCCL_BUFFSIZE", "300000", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  ncclParamHandle_t b = bind("NCCL_BUFFSIZE"), d = bind("NCCL_DEBUG");
  unsigned char buf[64];
  int len = -7;
  /* An integer: the int64's eight bytes. */
  ASSERT_OK(ncclParamGet(b, buf, sizeof buf, &len));
  int64_t v;
  memcpy(&v, buf, sizeof v);
  ASSERT(len == 8 && v == 300000);
  len = -7;
  ASSERT_OK(ncclParamGet(b, buf, 8, &len));
  ASSERT(len == 8);
  /* Too small: refused, *len 0 as in NVIDIA's library, the size needed in
   * the sentence. */
  len = -7;
  REFUSED(ncclParamGet(b, buf, 4, &len), "ncclParamGet", "NCCL_BUFFSIZE", "8 bytes", "maxLen is 4");
  ASSERT(len == 0);

  /* A string: its text and NUL. */
  memset(buf, 0xff, sizeof buf);
  len = -7;
  ASSERT_OK(ncclParamGet(d, buf, sizeof buf, &len));
  ASSERT(len == 5 && memcmp(buf, "INFO", 5) == 0);
  len = -7;
  REFUSED(ncclParamGet(d, buf, 4, &len), "ncclParamGet", "NCCL_DEBUG", "5 bytes", "maxLen is 4");
  ASSERT(len == 0);

  /* Arguments refused before anything is read leave *len alone. */
  len = -7;
  REFUSED(ncclParamGet(b, buf, 0, &len), "ncclParamGet", "maxLen is 0");
  REFUSED(ncclParamGet(b, buf, -3, &len), "ncclParamGet", "maxLen is -3");
  REFUSED(ncclParamGet(b, NULL, 8, &len), "ncclParamGet", "out is NULL");
  ASSERT(len == -7);
  REFUSED(ncclParamGet(b, buf, 8, NULL), "ncclParamGet", "len is NULL");
  REFUSED(ncclParamGet(NULL, buf, 8, &len), "ncclParamGet", "handle", "NULL");
  REFUSED(ncclParamGet((ncclParamHandle_t)(void *)buf, buf, 8, &len), "ncclParamGet", "not one that ncclParamBind");
  ASSERT(len == -7);
  return 0;
}

TEST_IMPL(param_api_keys) {
  const char **table = NULL;
  int n = -1;
  ASSERT_OK(ncclParamGetAllParameterKeys(&table, &n));
  ASSERT_MSG(n == DEF_COUNT, "%d keys, params.def has %d", n, DEF_COUNT);
  int buffsize = 0, debug = 0;
  for (int i = 0; i < n; i++) {
    ASSERT_MSG(strcmp(table[i], def_names[i]) == 0, "key %d is %s, params.def says %s", i, table[i], def_names[i]);
    buffsize += strcmp(table[i], "NCCL_BUFFSIZE") == 0;
    debug += strcmp(table[i], "NCCL_DEBUG") == 0;
    bind(table[i]);
  }
  ASSERT(buffsize == 1 && debug == 1);
  /* The table is the caller's thread's: overwriting an entry harms no
   * later call. */
  table[0] = "scribbled";
  const char **again = NULL;
  ASSERT_OK(ncclParamGetAllParameterKeys(&again, &n));
  ASSERT(strcmp(again[0], def_names[0]) == 0);
  REFUSED(ncclParamGetAllParameterKeys(NULL, &n), "ncclParamGetAllParameterKeys", "table is NULL");
  REFUSED(ncclParamGetAllParameterKeys(&table, NULL), "ncclParamGetAllParameterKeys", "tableLen is NULL");
  return 0;
}

TEST_IMPL(param_api_dump) {
  char path[128];
  snprintf(path, sizeof path, "/tmp/loom-param-dump-%d.log", (int)getpid());
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "ENV", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  setenv("NCCL_BUFFSIZE", "4m", 1);
  setenv("NCCL_IB_TC", "abc", 1);
  unsetenv("NCCL_SHM_DISABLE");
  unsetenv("NCCL_P2P_LEVEL");
  ncclParamDumpAll();
  FILE *f = fopen(path, "r");
  ASSERT_MSG(f != NULL, "no log at %s", path);
  static char text[1 << 16];
  size_t got = fread(text, 1, sizeof text - 1, f);
  text[got] = '\0';
  fclose(f);
  unlink(path);
  const char *want[] = {"NCCL_BUFFSIZE = 4194304 (set)", "NCCL_DEBUG = INFO (set)",
                        "NCCL_SHM_DISABLE = 0 (default)", "NCCL_IB_TC = 0 (default: the set value is not valid)",
                        "NCCL_DEBUG_FILE = /tmp/loom-param-dump-", "NCCL_P2P_LEVEL = \"\" (default)",
                        "LOOM_TIMEOUT = "};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ASSERT_MSG(strstr(text, want[i]) != NULL, "the dump lacks \"%s\":\n%s", want[i], text);
  /* One line per key. */
  for (int i = 0; i < DEF_COUNT; i++) {
    char line[128];
    snprintf(line, sizeof line, " %s = ", def_names[i]);
    ASSERT_MSG(strstr(text, line) != NULL, "the dump lacks %s:\n%s", def_names[i], text);
  }
  return 0;
}
