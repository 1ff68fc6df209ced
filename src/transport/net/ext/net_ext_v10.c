/*
 * NCCL's net plugin ABI v10 (NCCL 2.27): net_ext_ops is shaped like this
 * version's table, so every entry is the plugin's own function.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "transport/net/ext/net_ext_adapt.h"

#include <limits.h>

static const char *ext_v10_bind(const void *table, struct net_ext_ops *ops) {
  const ncclNet_v10_t *t = table;
  *ops = (struct net_ext_ops){
      NET_EXT_SAME_OPS(t),
      .init = t->init,
      .get_properties = t->getProperties,
      .connect = t->connect,
      .isend = t->isend,
      .irecv = t->irecv,
  };
  return NET_EXT_MISSING(t);
}

const struct net_ext_version net_ext_v10 = {.version = 10, .max_bytes = INT_MAX, .bind = ext_v10_bind};
