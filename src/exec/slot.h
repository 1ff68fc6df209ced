/*
 * Slot headers, for both executors: what a rank writes into the slots it
 * sends, what it expects in those it receives, and the sentence that says
 * how two ranks' calls differ when they do.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_EXEC_SLOT_H
#define LOOM_EXEC_SLOT_H

#include "common/coll.h"
#include "transport/slot_hdr.h"

/* The header of the slots `t` sends (bytes left 0). */
void slot_mine(const struct task *t, uint64_t seq, int rank, struct slot_hdr *h);
/* The header a sender matching `t` writes (bytes and sender left 0). */
void slot_expect(const struct task *t, uint64_t seq, struct slot_hdr *h);
/* "AllReduce(count 100, float, sum)": the call a header describes. */
void slot_describe(const struct slot_hdr *h, char *buf, size_t len);
int slot_matches(const struct slot_hdr *want, const struct slot_hdr *got, int check_seq);
/* Records the sentence for a mismatch between this rank (`me`, receiving
 * from `peer`) and the sender, and returns ncclInvalidUsage. */
ncclResult_t slot_mismatch(const struct slot_hdr *want, const struct slot_hdr *got, int me, int peer, int check_seq);
/* A slot found on a collective connection no call of this rank reads,
 * against `want`, what this rank's collective of the same number expects:
 * ncclSuccess where they agree (the payload's size aside), the mismatch
 * (the ranks' calls crossed) otherwise. */
ncclResult_t slot_check_crossed(const struct slot_hdr *want, const struct slot_hdr *got, int me, int peer);

#endif
