/*
 * libFuzzer target: what the socket plugin takes from its peers
 * (net_socket.c): the connection handle a listener publishes, the hello
 * on each accepted TCP connection, and the length words of the control
 * stream, with the chunks a receiver cuts a large message into. The
 * first byte picks which; the chunks must cover the message exactly, in
 * at most nsocks pieces, or a hostile length would overrun a request.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/net/net.h"
#include "transport/net/socket/net_socket.h"

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c))          \
      abort();         \
  } while (0)

static struct sock_comm comm; /* only the shape fields are used */

static uint64_t take64(const uint8_t **p, size_t *n) {
  uint64_t v = 0;
  size_t k = *n < 8 ? *n : 8;
  memcpy(&v, *p, k);
  *p += k;
  *n -= k;
  return v;
}

/* The length words that follow, each with the size the receiver posted. */
static void fuzz_lengths(const uint8_t *p, size_t n) {
  while (n > 0) {
    uint64_t len = take64(&p, &n), posted = take64(&p, &n);
    int chunks = sock_msg_chunks(&comm, len, (size_t)posted);
    if (chunks < 0) {
      FUZZ_ASSERT(len > posted);
      continue;
    }
    FUZZ_ASSERT(len <= posted);
    if (chunks == 0) {
      FUZZ_ASSERT(comm.nsocks == 0 || len <= comm.min_task);
      continue;
    }
    FUZZ_ASSERT(chunks <= comm.nsocks && chunks <= SOCK_MAX_SOCKS);
    uint64_t next = 0;
    for (int j = 0; j < chunks; j++) {
      size_t off, size;
      sock_chunk_span(&comm, len, j, &off, &size);
      FUZZ_ASSERT(off == next && size > 0 && size <= len - off);
      next = off + size;
    }
    FUZZ_ASSERT(next == len);
  }
}

static void fuzz_handle(const uint8_t *data, size_t size) {
  size_t len = size < NET_HANDLE_MAXSIZE ? size : NET_HANDLE_MAXSIZE;
  uint8_t *buf = malloc(len ? len : 1);
  memcpy(buf, data, len);
  struct sock_handle h;
  ncclResult_t r = sock_handle_decode(buf, len, &h);
  free(buf);
  if (r != ncclSuccess)
    return;
  FUZZ_ASSERT(h.nsocks <= SOCK_MAX_SOCKS && h.nthreads <= SOCK_MAX_THREADS && h.min_task > 0);
  FUZZ_ASSERT(h.nsocks == 0 || h.nthreads > 0);
  /* The connector cuts its sends by the handle's shape. */
  comm.nsocks = (int)h.nsocks;
  comm.nthreads = (int)h.nthreads;
  comm.min_task = (size_t)h.min_task;
  fuzz_lengths(data + len, size - len);
}

static void fuzz_hello(const uint8_t *data, size_t size) {
  if (size < 9 + sizeof(struct sock_hello))
    return;
  uint64_t cookie;
  memcpy(&cookie, data, sizeof cookie);
  int nsocks = data[8] % (SOCK_MAX_SOCKS + 1);
  struct sock_hello h;
  memcpy(&h, data + 9, sizeof h);
  if (sock_hello_ok(&h, cookie, nsocks))
    FUZZ_ASSERT(h.cookie == cookie && h.index <= (uint32_t)nsocks);
  /* The receiver's own shape, and lengths from the wire. */
  const uint8_t *p = data + 9 + sizeof h;
  size_t n = size - 9 - sizeof h;
  comm.nsocks = nsocks;
  comm.nthreads = nsocks ? 1 : 0;
  comm.min_task = 1 + (size_t)(take64(&p, &n) % (1ull << 40));
  fuzz_lengths(p, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  if (data[0] & 1)
    fuzz_hello(data + 1, size - 1);
  else
    fuzz_handle(data + 1, size - 1);
  return 0;
}
