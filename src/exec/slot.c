/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "common/dtype.h"
#include "exec/slot.h"

#include <stdio.h>
#include <string.h>

/* A Send's or Recv's op field carries the collective it is part of
 * (enum coll_via), for sentences only: slot_matches does not compare it,
 * since the pairing of sends and receives is all that must agree. */
static uint8_t op_code(const struct task *t) {
  if (t->coll == COLL_SEND || t->coll == COLL_RECV)
    return (uint8_t)t->via;
  if (t->coll == COLL_BROADCAST || t->coll == COLL_ALLGATHER)
    return 0;
  return (uint8_t)red_op_code(t->op);
}

static const char *op_label(int code) { return red_code_name(code); }

void slot_describe(const struct slot_hdr *h, char *buf, size_t len) {
  int coll = h->coll;
  int n = snprintf(buf, len, "%s(count %llu, %s", coll_name(coll), (unsigned long long)h->count,
                   dtype_name(h->dtype));
  if (coll == COLL_REDUCE || coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER)
    n += snprintf(buf + n, len > (size_t)n ? len - n : 0, ", %s", op_label(h->op));
  if (coll == COLL_REDUCE || coll == COLL_BROADCAST)
    n += snprintf(buf + n, len > (size_t)n ? len - n : 0, ", root %d", h->root);
  n += snprintf(buf + n, len > (size_t)n ? len - n : 0, ")");
  if ((coll == COLL_SEND || coll == COLL_RECV) && h->op != VIA_NONE)
    snprintf(buf + n, len > (size_t)n ? len - n : 0, " of %s", coll_via_name(h->op));
}

static void common(const struct task *t, uint64_t seq, struct slot_hdr *h) {
  memset(h, 0, sizeof *h);
  h->count = t->count;
  h->dtype = (uint8_t)t->dtype;
  h->op = op_code(t);
  h->root = (t->coll == COLL_BROADCAST || t->coll == COLL_REDUCE) ? t->root : -1;
  h->seq = seq;
}

void slot_mine(const struct task *t, uint64_t seq, int rank, struct slot_hdr *h) {
  common(t, seq, h);
  h->coll = (uint8_t)t->coll;
  h->sender = (uint32_t)rank;
}

void slot_expect(const struct task *t, uint64_t seq, struct slot_hdr *h) {
  common(t, seq, h);
  h->coll = (uint8_t)(t->coll == COLL_RECV ? COLL_SEND : t->coll);
}

int slot_matches(const struct slot_hdr *want, const struct slot_hdr *got, int check_seq) {
  return got->coll == want->coll && got->dtype == want->dtype && got->count == want->count &&
         (got->op == want->op || got->coll == COLL_SEND) &&
         got->root == want->root && (!check_seq || got->seq == want->seq) && got->bytes == want->bytes;
}

ncclResult_t slot_mismatch(const struct slot_hdr *want, const struct slot_hdr *got, int me, int peer, int check_seq) {
  char theirs[160], ours[160];
  slot_describe(got, theirs, sizeof theirs);
  struct slot_hdr mine = *want;
  if (!check_seq) {
    mine.coll = COLL_RECV;
    slot_describe(&mine, ours, sizeof ours);
    return err_set(ncclInvalidUsage,
                   "rank %d posted %s from rank %d, but rank %d's matching call is %s: send and receive must "
                   "have the same count and datatype",
                   me, ours, peer, (int)got->sender, theirs);
  }
  slot_describe(&mine, ours, sizeof ours);
  if (got->seq != want->seq && got->coll == mine.coll && got->count == mine.count && got->dtype == mine.dtype)
    return err_set(ncclInvalidUsage,
                   "rank %d is in collective #%llu %s but rank %d sent data for its collective #%llu: the ranks "
                   "called a different number of collectives",
                   me, (unsigned long long)want->seq, ours, (int)got->sender, (unsigned long long)got->seq);
  return err_set(ncclInvalidUsage,
                 "rank %d called %s as collective #%llu but rank %d called %s: every rank must make the same "
                 "collective calls with the same arguments",
                 me, ours, (unsigned long long)want->seq, (int)got->sender, theirs);
}

ncclResult_t slot_check_crossed(const struct slot_hdr *want, const struct slot_hdr *got, int me, int peer) {
  struct slot_hdr w = *want;
  w.bytes = got->bytes;
  return slot_matches(&w, got, 1) ? ncclSuccess : slot_mismatch(&w, got, me, peer, 1);
}
