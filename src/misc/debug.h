/*
 * Logging: NCCL_DEBUG (VERSION, WARN, INFO, ABORT, TRACE), NCCL_DEBUG_SUBSYS
 * and NCCL_DEBUG_FILE. Every line starts with host, pid, thread and rank.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_DEBUG_H
#define LOOM_DEBUG_H

enum log_level {
  LOG_NONE = 0,
  LOG_VERSION = 1,
  LOG_WARN = 2,
  LOG_INFO = 3,
  LOG_ABORT = 4,
  LOG_TRACE = 5,
};

/* The subsystems of NCCL_DEBUG_SUBSYS, with NCCL's names. */
enum log_subsys {
  LOG_INIT = 0x1,
  LOG_COLL = 0x2,
  LOG_P2P = 0x4,
  LOG_SHM = 0x8,
  LOG_NET = 0x10,
  LOG_GRAPH = 0x20,
  LOG_TUNING = 0x40,
  LOG_ENV = 0x80,
  LOG_ALLOC = 0x100,
  LOG_CALL = 0x200,
  LOG_PROXY = 0x400,
  LOG_NVLS = 0x800,
  LOG_BOOTSTRAP = 0x1000,
  LOG_REG = 0x2000,
  LOG_PROFILE = 0x4000,
  LOG_RAS = 0x8000,
  LOG_ALL = ~0,
};

/* Read once, on first use; ncclResetDebugInit reads them again. */
extern int log_level_now;
extern unsigned log_subsys_now;
void log_init(void);
void log_reset(void);
/* Makes fork wait while a thread writes a log line, so that a child never
 * inherits the log's lock held. Idempotent; log_init calls it, and a
 * module whose threads log under a lock of their own that fork also takes
 * calls it before registering its handlers (bootstrap_root.c). */
void log_fork_init(void);

/* Checks NCCL_DEBUG and NCCL_DEBUG_SUBSYS, so that init can refuse a bad
 * value with a sentence instead of logging at the wrong level. */
int log_env_valid(char *why, int whylen);

/* The rank shown in this thread's log prefix (-1: none). */
void log_set_rank(int rank);
int log_get_rank(void);

void log_msg(int level, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int log_enabled(int level, unsigned subsys) {
  if (log_level_now < 0)
    log_init();
  return log_level_now >= level && (subsys & log_subsys_now);
}

#define WARN(...) log_msg(LOG_WARN, LOG_ALL, __VA_ARGS__)
#define INFO(sub, ...)                    \
  do {                                    \
    if (log_enabled(LOG_INFO, (sub)))     \
      log_msg(LOG_INFO, (sub), __VA_ARGS__); \
  } while (0)
#define TRACE(sub, ...)                   \
  do {                                    \
    if (log_enabled(LOG_TRACE, (sub)))    \
      log_msg(LOG_TRACE, (sub), __VA_ARGS__); \
  } while (0)

#endif
