/*
 * For the bootstrap's unit tests: the bytes a rank sends on a new
 * connection to another rank's listener (its challenge and proof, then one
 * message), made by hand so a test can record, replay or dribble them;
 * and a barrier the bootstrap tests share.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_BOOT_GREETING_H
#define LOOM_TEST_BOOT_GREETING_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap/bootstrap_wire.h"

#define BOOT_GREETING_MAX \
  (sizeof(struct boot_chal) + sizeof(struct boot_proof) + sizeof(struct boot_msg_hdr) + sizeof(int) + BOOT_MAC)

/* Rank `chal->from`'s greeting under `secret` to a listener that proves
 * itself with `listener_nonce`, carrying `value` under `tag`, into rec
 * (BOOT_GREETING_MAX bytes): its length. */
size_t boot_greeting(const uint8_t secret[BOOT_KEY], const struct boot_chal *chal,
                     const uint8_t listener_nonce[BOOT_NONCE], uint64_t tag, int value, unsigned char *rec);

struct bootstrap;
/* A barrier over the bootstrap: an all-gather of one byte, which no rank
 * finishes before every rank has joined it. */
ncclResult_t boot_test_barrier(struct bootstrap *b);

#endif
