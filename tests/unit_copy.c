/*
 * The streaming copy (src/exec/copy.c) against memcpy's contract: every
 * length and both alignments around its 16-byte stores and its short-copy
 * cut-off, and nothing written outside the destination.
 *
 * For tests/test_list.h (grep '^UNIT_TEST(' tests/unit_copy.c):
UNIT_TEST(unit_copy_streaming, 30)
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exec/copy.h"
#include "test.h"

#define GUARD 64

static uint8_t pattern(size_t i, unsigned salt) { return (uint8_t)(i * 131u + salt * 7u + (i >> 8)); }

/* Copies `len` bytes from src+soff to dst+doff and checks the copy, and
 * that the GUARD bytes either side of it kept their fill. */
static int one(uint8_t *src, uint8_t *dst, size_t soff, size_t doff, size_t len, unsigned salt) {
  size_t span = len + 2 * GUARD + 16;
  for (size_t i = 0; i < span; i++) {
    src[i] = pattern(i, salt);
    dst[i] = 0xA5;
  }
  copy_streaming(dst + GUARD + doff, src + GUARD + soff, len);
  for (size_t i = 0; i < GUARD + doff; i++)
    ASSERT_MSG(dst[i] == 0xA5, "copy of %zu bytes (src +%zu, dst +%zu) wrote byte %zu before its destination", len,
               soff, doff, GUARD + doff - i);
  for (size_t i = 0; i < len; i++)
    ASSERT_MSG(dst[GUARD + doff + i] == src[GUARD + soff + i],
               "copy of %zu bytes (src +%zu, dst +%zu): byte %zu is %u, not %u", len, soff, doff, i,
               dst[GUARD + doff + i], src[GUARD + soff + i]);
  for (size_t i = GUARD + doff + len; i < span; i++)
    ASSERT_MSG(dst[i] == 0xA5, "copy of %zu bytes (src +%zu, dst +%zu) wrote byte %zu past its destination", len,
               soff, doff, i - (GUARD + doff + len));
  return 0;
}

TEST_IMPL(unit_copy_streaming) {
  size_t max = (size_t)3 << 20;
  uint8_t *src = aligned_alloc(64, max + 2 * GUARD + 64), *dst = aligned_alloc(64, max + 2 * GUARD + 64);
  ASSERT(src && dst);
  static const size_t lens[] = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 1023, 1024, 1025, 1039, 1040, 1041, 4096, 4111,
                                65536 + 7, (size_t)1 << 20, ((size_t)3 << 20) - 5};
  unsigned salt = 0;
  int rc = 0;
  for (size_t l = 0; l < sizeof lens / sizeof lens[0] && rc == 0; l++)
    for (size_t so = 0; so < 16 && rc == 0; so += lens[l] > 100000 ? 5 : 1)
      for (size_t d = 0; d < 16 && rc == 0; d += lens[l] > 100000 ? 3 : 1)
        rc = one(src, dst, so, d, lens[l], ++salt);
  free(src);
  free(dst);
  return rc;
}
