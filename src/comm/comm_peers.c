/*
 * Whether a peer rank still lives, as far as this rank can tell: a
 * same-host peer's pidfd (init opens them) says when its process has
 * exited. The transports' waits and failures ask, to say "rank 3 has
 * exited" rather than only "the connection broke".
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"

#include <poll.h>
#include <stdio.h>

/* Whether rank `peer` of this host has exited (its pidfd is readable);
 * 0 where there is no pidfd (another host, or an old kernel). */
static int peer_exited_within(const struct ncclComm *comm, int peer, int ms) {
  if (comm->peer_pidfd == NULL || comm->peer_pidfd[peer] < 0)
    return 0;
  struct pollfd p = {.fd = comm->peer_pidfd[peer], .events = POLLIN};
  return poll(&p, 1, ms) > 0;
}

static int peer_exited(const struct ncclComm *comm, int peer) { return peer_exited_within(comm, peer, 0); }

ncclResult_t comm_peer_alive(struct ncclComm *comm, int peer) {
  if (!peer_exited(comm, peer))
    return ncclSuccess;
  /* The peer may have given up because another rank died, and exited
   * before this rank could hear why: the others gone are named too. */
  char others[512];
  comm_note_exited(comm, peer, others, sizeof others);
  return err_set(ncclRemoteError, "rank %d (pid %d on %s) has exited%s", peer, comm->peers[peer].pid,
                 comm->peers[peer].hostname, others);
}

void comm_note_peer(struct ncclComm *comm, int peer, char *buf, size_t len) {
  const struct peer_info *p = &comm->peers[peer];
  if (comm->peer_pidfd == NULL || comm->peer_pidfd[peer] < 0)
    snprintf(buf, len, "; rank %d runs on %s, whose processes this rank cannot see", peer, p->hostname);
  /* A killed process closes its sockets before its exit shows on the
   * pidfd: it is given a moment (this is a failure's path) before being
   * called alive. */
  else if (peer_exited_within(comm, peer, 200))
    snprintf(buf, len, "; rank %d (pid %d on %s) has exited", peer, p->pid, p->hostname);
  else
    snprintf(buf, len, "; rank %d (pid %d on %s) is still running", peer, p->pid, p->hostname);
}

void comm_note_exited(struct ncclComm *comm, int skip, char *buf, size_t len) {
  size_t used = 0;
  if (len > 0)
    buf[0] = '\0';
  for (int r = 0; r < comm->nranks && used < len; r++) {
    if (r == comm->rank || r == skip || !peer_exited(comm, r))
      continue;
    int k = snprintf(buf + used, len - used, "; rank %d (pid %d on %s) has exited", r, comm->peers[r].pid,
                     comm->peers[r].hostname);
    if (k < 0)
      break;
    used += (size_t)k;
  }
}
