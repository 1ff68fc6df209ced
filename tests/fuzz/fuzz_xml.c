/*
 * libFuzzer target: the topology XML reader (src/topology/xml.c), as
 * NCCL_TOPO_FILE feeds it. Whatever it accepts must also be writable, and
 * what it writes must read back to the same document.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "topology/xml.h"

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c))          \
      abort();         \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct xml_node *root = NULL;
  if (xml_parse((const char *)data, size, "fuzz", &root) != ncclSuccess)
    return 0;
  FUZZ_ASSERT(root != NULL);
  char *text = NULL, *again = NULL;
  size_t len = 0, len2 = 0;
  FUZZ_ASSERT(xml_write(root, &text, &len) == ncclSuccess);
  struct xml_node *root2 = NULL;
  FUZZ_ASSERT(xml_parse(text, len, "fuzz round trip", &root2) == ncclSuccess);
  FUZZ_ASSERT(xml_write(root2, &again, &len2) == ncclSuccess);
  FUZZ_ASSERT(len == len2 && memcmp(text, again, len) == 0);
  free(text);
  free(again);
  xml_free(root);
  xml_free(root2);
  return 0;
}
