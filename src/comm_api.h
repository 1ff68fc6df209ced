/*
 * The communicator as the API floor handles it: creation (init.c), the
 * end of its life (comm_api.c), the works enqueue.c keeps for reuse, and
 * the API's exit. Only files of the API floor include this; comm.h is
 * what every floor reads.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_COMM_API_H
#define LOOM_COMM_API_H

#include "comm/comm.h"

/* Creation (init.c): a communicator struct with no rank yet; a config
 * read by its `size` and `version` as NCCL reads it, checked, with `func`
 * (the API call) in its sentences (NULL: the defaults); and the whole of
 * a rank's init into such a struct. */
ncclResult_t comm_alloc(struct ncclComm **out);
ncclResult_t comm_read_config(const ncclConfig_t *in, ncclConfig_t *out, const char *func);
ncclResult_t comm_init(struct ncclComm *comm, int nranks, const ncclUniqueId *id, int rank,
                       const ncclConfig_t *config);
/* What ncclCommInitRankConfig does after its name: checks the arguments
 * and the config, then creates the communicator now, at the group's end,
 * or on its worker (nonblocking, ncclInProgress); `device` >= 0 makes it
 * on that CUDA device rather than the caller's current one. */
ncclResult_t comm_init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                            const ncclConfig_t *config_in, const char *func, int device);

/* Frees everything the communicator holds, whatever state it is in. */
void comm_destroy_all(struct ncclComm *comm);
/* The host's arena for flat collectives (transport/shm_arena.h) and the
 * tuner's view of it: at init, and again at ncclCommResume. Collective. */
ncclResult_t comm_arena_setup(struct ncclComm *comm);
/* Frees what ncclCommSuspend kept for ncclCommResume (comm_suspend.c). */
void comm_suspend_free(struct ncclComm *comm);
/* Releases the works a communicator keeps for reuse (enqueue.c). */
void comm_free_works(struct ncclComm *comm);

/* The API layer's exit: on failure copy this thread's sentence into the
 * communicator (and the process-wide last error), and log it once. */
ncclResult_t api_finish(struct ncclComm *comm, ncclResult_t res);

#endif
