/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static __thread char thread_err[LOOM_ERR_LEN];
static char global_err[LOOM_ERR_LEN];
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t err_set(ncclResult_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_err, sizeof thread_err, fmt, ap);
  va_end(ap);
  TRACE(LOG_ALL, "error recorded (%s): %s", err_string(code), thread_err);
  return code;
}

void err_context(const char *fmt, ...) {
  char ctx[LOOM_ERR_LEN], old[LOOM_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  memcpy(old, thread_err, sizeof old);
  int n = snprintf(thread_err, sizeof thread_err, "%.*s: ", (int)sizeof ctx / 2, ctx);
  snprintf(thread_err + n, sizeof thread_err - (size_t)n, "%.*s", (int)(sizeof thread_err - (size_t)n - 1), old);
}

const char *err_thread_last(void) { return thread_err; }

void err_clear(void) { thread_err[0] = '\0'; }

void err_set_global(const char *msg) {
  pthread_mutex_lock(&global_lock);
  snprintf(global_err, sizeof global_err, "%s", msg);
  pthread_mutex_unlock(&global_lock);
}

const char *err_global_last(void) {
  /* Copied per thread so the caller's pointer stays valid while another
   * thread records a newer error. */
  static __thread char copy[LOOM_ERR_LEN];
  pthread_mutex_lock(&global_lock);
  memcpy(copy, global_err, sizeof copy);
  pthread_mutex_unlock(&global_lock);
  return copy;
}

const char *err_string(ncclResult_t code) {
  switch (code) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the Loom developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}
