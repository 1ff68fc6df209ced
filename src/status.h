/*
 * What each communicator of this process is doing, kept where anyone on the
 * host can read it: a memfd named "loom-status" that another process opens
 * through /proc/<pid>/fd. Readers are loom-info --status, the SIGUSR1
 * report, and a rank that timed out and asks its local peers why: a
 * stopped or stuck process cannot answer a question, but its page still
 * tells what it was doing. The memfd vanishes with the process, so a
 * killed rank leaves nothing behind in /dev/shm.
 *
 * Writers update their record with a sequence lock (odd while writing);
 * updates happen at an operation's start and end and every 100 ms while it
 * waits. On the latency path that is a few plain stores and a coarse clock
 * read (CLOCK_MONOTONIC_COARSE): the report counts seconds.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct task;
struct work;

#define STATUS_MAGIC 0x324154534d4f4f4cull /* "LOOMSTA2" */
#define STATUS_RECS 64
#define STATUS_MEMFD_NAME "loom-status"

enum status_state {
  STATUS_FREE = 0,
  STATUS_IDLE = 1,    /* between operations, in the caller's code: cur is the last one done */
  STATUS_RUNNING = 2, /* a host thread runs cur */
  STATUS_FAILED = 3,  /* cur failed; cur.result says how */
};

/* An operation as the report names it. */
struct status_op {
  int32_t coll; /* enum coll_kind; -1: none yet */
  int32_t dtype, op, root, peer;
  int32_t ntasks; /* operations in its group */
  int32_t result; /* ncclResult_t, once done */
  int32_t pad;
  uint64_t count;
  uint64_t seq; /* the collective's number; ~0: a send or receive */
};

struct status_rec {
  _Atomic uint32_t gen; /* odd while the owner writes */
  int32_t state;        /* enum status_state */
  uint64_t comm_hash;
  int32_t rank, nranks, cuda_dev;
  int32_t wait_peer; /* -1: not known to wait on anyone */
  uint64_t since_ns; /* CLOCK_MONOTONIC of the last state change */
  uint64_t ops;      /* operations started */
  struct status_op cur; /* the operation now or last (CUDA: last enqueued) */
  uint64_t wait_since_ns; /* last progress before the current wait */
  char wait[200];         /* what it waits for, as a sentence fragment */
  char name[64];          /* ncclConfig_t.commName */
};

struct status_page {
  uint64_t magic;
  uint32_t version, nrecs;
  int32_t pid;
  int32_t pad;
  char host[64];
  struct status_rec rec[STATUS_RECS];
};

/* ---- the owner's side (status.c) ---- */

/* Claims a record for a communicator that finished init. Never fails the
 * caller: without a page (no memfd) the communicator just has no report. */
void status_comm_add(struct ncclComm *comm);
void status_comm_remove(struct ncclComm *comm);
/* An operation (or a group of `ntasks`, the first being `t`) starts. */
void status_op_start(struct ncclComm *comm, const struct task *t, uint64_t seq, int ntasks);
void status_op_end(struct ncclComm *comm, ncclResult_t res);
/* The operation has made no progress since `since_ns` and waits on `w`. */
void status_waiting(struct ncclComm *comm, const struct work *w, uint64_t since_ns);
/* It moved again. */
void status_moving(struct ncclComm *comm);
/* Logs this communicator's line (WARN), as a timeout does. */
void status_log(struct ncclComm *comm);
/* Appends to buf why `peer` does not move, following on this host from
 * rank to rank along what each waits on until one that does not wait:
 * "; rank 2 waits for data from rank 1; rank 1 (pid 77 on vm) is stopped". */
void status_explain_peer(struct ncclComm *comm, int peer, char *buf, size_t len);

/* ---- reading, for anyone (status_page.c) ---- */

/* Maps the status page of process `pid`, if it has one; NULL otherwise.
 * Unmap with status_page_unmap. */
const struct status_page *status_page_map(int pid);
void status_page_unmap(const struct status_page *p);
/* A consistent copy of a record; 0 if it kept changing (or is free). */
int status_rec_read(const struct status_rec *src, struct status_rec *out);
/* The process's state letter from /proc/<pid>/stat ('R', 'S', 'T' for
 * stopped...), 0 if there is no such process. */
char status_proc_state(int pid);
/* One line (no newline) saying what the record's communicator does, at
 * time_ns() now_ns. Async-signal-safe: the SIGUSR1 handler uses it. */
size_t status_format(int pid, const char *host, const struct status_rec *r, uint64_t now_ns, char *buf, size_t len);
/* "AllReduce #41 (count 8, float, sum)", likewise safe in a handler. */
size_t status_format_op(const struct status_op *o, char *buf, size_t len);
/* Why a rank does not move, as the clause that follows its name ("has
 * exited", "is stopped (...), in AllReduce #1 (...)", "has not called it:
 * ..."), from its process's state letter (status_proc_state) and its
 * record (NULL if it has none). 0, and nothing written, where it waits on
 * another rank (r->wait_peer) who is then the one to ask. The one wording
 * for a timeout's error and for loom-info --status. */
int status_why(char proc_state, const struct status_rec *r, uint64_t now_ns, char *buf, size_t len);

#endif
