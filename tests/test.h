/*
 * Loom's tests, libuv style: every test is `int test_<name>(void)` listed
 * once in test_list.h, run by a runner in a process of its own with a time
 * limit. A test returns 0 on success, TEST_SKIP (77) when it cannot run
 * here (and prints why), anything else on failure.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_H
#define LOOM_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define TEST_SKIP 77

#define TEST_IMPL(name) int test_##name(void)

#define ASSERT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond); \
      fflush(stderr);                                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define ASSERT_MSG(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: assertion failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      fflush(stderr);                                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* For calls returning ncclResult_t. */
#define ASSERT_OK(call)                                                        \
  do {                                                                         \
    ncclResult_t assert_ok_r_ = (call);                                        \
    ASSERT_MSG(assert_ok_r_ == ncclSuccess, "%s returned %d", #call, (int)assert_ok_r_); \
  } while (0)

#define SKIP(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "SKIP: ");                                                 \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    return TEST_SKIP;                                                          \
  } while (0)

#endif
