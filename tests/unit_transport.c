/*
 * The transports' tables: every op is there (a stub where a transport has
 * nothing to do), since callers go through transport.h's wrappers and
 * never test for NULL.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stddef.h>
#include <stdio.h>

#include "core.h"
#include "transport/transport.h"
#include "test.h"

#define OPS(X) \
  X(can_connect) X(setup) X(connect) X(progress) X(flushed) X(check) X(failed) X(activity) X(conn_name) X(poison) X(free)

static int missing_ops(const struct transport *t) {
  int missing = 0;
#define CHECK_OP(op)                                                       \
  if (t->op == NULL) {                                                     \
    fprintf(stderr, "transport %s has no " #op "\n", t->name);            \
    missing++;                                                             \
  }
  OPS(CHECK_OP)
#undef CHECK_OP
  return missing;
}

TEST_IMPL(unit_transport_tables) {
  const struct transport *all[] = {&transport_p2p, &transport_shm, &transport_net};
  int missing = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    ASSERT(all[i]->name != NULL);
    missing += missing_ops(all[i]);
  }
  ASSERT_MSG(missing == 0, "%d ops missing: fill them with the named stubs of transport.h", missing);
  return 0;
}
