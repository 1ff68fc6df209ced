/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A thread's error sentence and its copy of the process-wide one live on
 * the heap, found through one pointer: the library's few initial-exec TLS
 * variables make glibc place its whole TLS block in the static surplus
 * when it is dlopen()ed (Python's ctypes, a framework loading
 * libnccl.so.2), and kilobytes of buffers there do not fit. */
struct err_bufs {
  char last[LOOM_ERR_LEN];
  char global_copy[LOOM_ERR_LEN];
};
static LOOM_TLS_FAST struct err_bufs *tls_bufs;
static struct err_bufs no_memory; /* shared, as a last resort */
static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;

static void bufs_free(void *p) {
  tls_bufs = NULL;
  free(p);
}

static void bufs_key_make(void) { pthread_key_create(&bufs_key, bufs_free); }

static struct err_bufs *bufs(void) {
  struct err_bufs *b = tls_bufs;
  if (b)
    return b;
  pthread_once(&bufs_once, bufs_key_make);
  b = calloc(1, sizeof *b);
  if (!b)
    return &no_memory;
  pthread_setspecific(bufs_key, b);
  tls_bufs = b;
  return b;
}

static char global_err[LOOM_ERR_LEN];
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t err_set(ncclResult_t code, const char *fmt, ...) {
  char *thread_err = bufs()->last;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_err, LOOM_ERR_LEN, fmt, ap);
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
  char *thread_err = bufs()->last;
  memcpy(old, thread_err, sizeof old);
  int n = snprintf(thread_err, LOOM_ERR_LEN, "%.*s: ", (int)sizeof ctx / 2, ctx);
  snprintf(thread_err + n, LOOM_ERR_LEN - (size_t)n, "%.*s", (int)(LOOM_ERR_LEN - (size_t)n - 1), old);
}

const char *err_thread_last(void) { return bufs()->last; }

void err_clear(void) { bufs()->last[0] = '\0'; }

void err_set_global(const char *msg) {
  pthread_mutex_lock(&global_lock);
  snprintf(global_err, sizeof global_err, "%s", msg);
  pthread_mutex_unlock(&global_lock);
}

const char *err_global_last(void) {
  /* Copied per thread so the caller's pointer stays valid while another
   * thread records a newer error. */
  char *copy = bufs()->global_copy;
  pthread_mutex_lock(&global_lock);
  memcpy(copy, global_err, LOOM_ERR_LEN);
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
  case ncclTimeout: return "operation timed out";
  default: return "unknown result code";
  }
}
