/*
 * Errors: the place that detects a failure records one sentence for the
 * user with err_set; callers propagate the code with CHECK; the API layer
 * copies the sentence into the communicator's last-error buffer and logs it
 * once (api_finish in comm_api.h).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_ERRORS_H
#define LOOM_ERRORS_H

#include "nccl.h"

#define LOOM_ERR_LEN 1024

/* Records `fmt` as this thread's last error and returns `code`. */
ncclResult_t err_set(ncclResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Puts "<context>: " in front of this thread's last error, for a caller
 * that knows what the failing call was for (which rank, which step). */
void err_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *err_thread_last(void);
void err_clear(void);

/* The process-wide last error, for ncclGetLastError(NULL). */
void err_set_global(const char *msg);
const char *err_global_last(void);

const char *err_string(ncclResult_t code);

#endif
