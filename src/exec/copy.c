/* SPDX-License-Identifier: Apache-2.0 */
#include "exec/copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

void copy_streaming(void *dst, const void *src, size_t bytes) {
  char *d = dst;
  const char *s = src;
  /* Streaming stores want 16-byte aligned destinations; the head and the
   * tail go through memcpy. Below a few lines the fence costs more than
   * the read-for-ownership saves. */
  size_t head = (size_t)(-(uintptr_t)d & 15);
  if (bytes < 1024) {
    memcpy(d, s, bytes);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
    __m128i x0 = _mm_loadu_si128((const __m128i *)s);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, x0);
    _mm_stream_si128((__m128i *)(d + 16), x1);
    _mm_stream_si128((__m128i *)(d + 32), x2);
    _mm_stream_si128((__m128i *)(d + 48), x3);
  }
  memcpy(d, s, bytes);
  /* Streaming stores are weakly ordered: without the fence a peer could
   * see the flag that follows before the data. */
  _mm_sfence();
}

#else

void copy_streaming(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

#endif
