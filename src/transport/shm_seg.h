/*
 * Shared-memory segments without a name, for the shm transport: a memfd
 * (or an O_TMPFILE inode in /dev/shm) that lives exactly as long as a
 * process holds it open or mapped, so a rank killed at any moment leaves
 * nothing behind in /dev/shm. The peer gets the owner's descriptor with
 * pidfd_getfd, or over a Unix socket (abstract name, SCM_RIGHTS) that the
 * owner serves while the peer connects; over that socket the peer also
 * tells the owner when it gave up, so the owner does not wait for it.
 * Also the sweep of named segments that older Loom versions left behind.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SHM_SEG_H
#define LOOM_SHM_SEG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

/* A new unnamed segment of `size` bytes, its pages reserved and its size
 * sealed (memfds), for the connection from rank `peer` (named in errors). */
ncclResult_t shm_seg_create(size_t size, int peer, int *fd);

/* Whether `fd` is a segment of `size` bytes whose size cannot change under
 * a mapping of it (a SIGBUS in the middle of a collective): sealed against
 * shrinking and growing, or `trusted`, that is from the peer's own process
 * (the O_TMPFILE fallback cannot be sealed). 0, or an errno and the reason
 * in `why`. */
int shm_seg_check(int fd, size_t size, int trusted, char *why, size_t len);

/* ---- the owner's socket ---- */

enum { SHM_SEG_CLIENTS = 4 };

struct shm_seg_server {
  int lsock;                       /* listening; -1: none */
  int client[SHM_SEG_CLIENTS];     /* accepted, their record not read yet; -1: free */
  uint64_t token;                  /* what a client's records must carry */
  pid_t peer_pid;                  /* the only process served; 0: any of this user */
};

void shm_seg_server_init(struct shm_seg_server *s);
/* Listens on a fresh abstract name (written to `name`, without the
 * leading NUL) for the peer process `peer_pid` (0 where its pid means
 * nothing here: another pid namespace) asking for segment `token`: 0, or
 * -1 with `name` empty where no socket can be made (the peer then has
 * pidfd_getfd only). */
int shm_seg_listen(struct shm_seg_server *s, uint64_t token, pid_t peer_pid, char *name, size_t len);
/* Hands `seg` to each client that asks for it; never blocks. 1 when the
 * peer said that it gave up (its sentence in `why`), else 0. */
int shm_seg_serve(struct shm_seg_server *s, int seg, char *why, size_t len);
/* This side failed: tells the clients that wait already why, and stops
 * listening, so that later ones are refused at once. */
void shm_seg_refuse(struct shm_seg_server *s, const char *why);
void shm_seg_server_close(struct shm_seg_server *s);

/* ---- the peer's side ---- */

/* The peer's descriptor `target`, taken with pidfd_getfd: 0, or errno. */
int shm_seg_pidfd_getfd(int pidfd, int target, int *fd);
/* Descriptor `target` of process `pid` as one of this process: with
 * pidfd_getfd on `pidfd` (where not -1), else by opening
 * /proc/<pid>/fd/<target>; either must pass `same` (the file the owner
 * described). 0 with *fd, else -1 with each way's errno in *e_pidfd and
 * *e_proc (ESTALE: another file). */
int shm_seg_take(int pidfd, pid_t pid, int target, int (*same)(int fd, const void *arg), const void *arg, int *fd,
                 int *e_pidfd, int *e_proc);
/* Connects to the owner's socket `name` and asks for segment `token`, if
 * the socket is served by this user and, where expect_pid is not 0, by
 * that process: 0 with *sock; EAGAIN when its backlog is full; else an
 * errno and the reason in `why`. */
int shm_seg_ask(const char *name, uint64_t token, pid_t expect_pid, int *sock, char *why, size_t len);
/* The owner's answer on `sock`: 0 with *fd; EAGAIN while it has not come;
 * ECANCELED when the owner failed (its sentence in `why`); another errno,
 * the reason in `why`. A malformed or truncated answer's descriptors are
 * closed. */
int shm_seg_recv(int sock, int *fd, char *why, size_t len);
/* Tells the owner of segment `token` that this side gave up and why, over
 * a new connection to `name` (checked as shm_seg_ask does: the sentence
 * goes to the rank only). Best effort; never blocks. */
void shm_seg_report(const char *name, uint64_t token, pid_t expect_pid, const char *why);

/* Removes /dev/shm/loom-<pid>-<n>-<8 hex digits> segments (the names Loom
 * used before its segments had none) whose owner is dead; once per
 * process. */
void shm_seg_sweep_stale(void);

/* Tests only: while not 0, shm_seg_check refuses every segment, so that
 * this process gives up on its peers' shared memory. */
extern int shm_seg_test_refuse;

#endif
