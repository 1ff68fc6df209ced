/* The names of the collectives and the sentence fragment for a call
 * (common/coll.h). SPDX-License-Identifier: Apache-2.0 */
#include "common/coll.h"
#include "common/dtype.h"

#include <stdio.h>

static const char *coll_names[COLL_COUNT] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                             "AllReduce", "Send",   "Recv"};

const char *coll_name(enum coll_kind coll) {
  return (int)coll >= 0 && coll < COLL_COUNT ? coll_names[coll] : "?";
}

const char *coll_via_name(enum coll_via via) {
  static const char *names[] = {"", "AlltoAll", "Gather", "Scatter", "AllToAllv"};
  return (int)via >= 0 && via <= VIA_ALLTOALLV ? names[via] : "?";
}

void task_describe(const struct task *t, char *buf, size_t len) {
  const char *op = red_op_name(t->op);
  switch (t->coll) {
  case COLL_SEND:
  case COLL_RECV:
    snprintf(buf, len, "%s(count %zu, %s, %s rank %d)%s%s", coll_name(t->coll), t->count, dtype_name(t->dtype),
             t->coll == COLL_SEND ? "to" : "from", t->peer, t->via ? " of " : "", coll_via_name(t->via));
    break;
  case COLL_BROADCAST:
    snprintf(buf, len, "Broadcast(count %zu, %s, root %d)", t->count, dtype_name(t->dtype), t->root);
    break;
  case COLL_REDUCE:
    snprintf(buf, len, "Reduce(count %zu, %s, %s, root %d)", t->count, dtype_name(t->dtype), op, t->root);
    break;
  case COLL_ALLGATHER:
    snprintf(buf, len, "AllGather(count %zu, %s)", t->count, dtype_name(t->dtype));
    break;
  default:
    snprintf(buf, len, "%s(count %zu, %s, %s)", coll_name(t->coll), t->count, dtype_name(t->dtype), op);
  }
}
