/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

int log_level_now = -1;
unsigned log_subsys_now = LOG_INIT | LOG_BOOTSTRAP | LOG_ENV;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;
static char log_host[64];
static LOOM_TLS_FAST int log_rank = -1;

static const struct {
  const char *name;
  unsigned bit;
} subsys_names[] = {
    {"INIT", LOG_INIT},   {"COLL", LOG_COLL},     {"P2P", LOG_P2P},         {"SHM", LOG_SHM},
    {"NET", LOG_NET},     {"GRAPH", LOG_GRAPH},   {"TUNING", LOG_TUNING},   {"ENV", LOG_ENV},
    {"ALLOC", LOG_ALLOC}, {"CALL", LOG_CALL},     {"PROXY", LOG_PROXY},     {"NVLS", LOG_NVLS},
    {"BOOTSTRAP", LOG_BOOTSTRAP}, {"REG", LOG_REG}, {"PROFILE", LOG_PROFILE}, {"RAS", LOG_RAS},
    {"ALL", LOG_ALL},
};

static const char *level_names[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};

static int parse_level(const char *s) {
  for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
    if (strcasecmp(s, level_names[i]) == 0)
      return i;
  return -1;
}

/* Returns 0 and the mask, or -1 and the offending name in `bad`. */
static int parse_subsys(const char *s, unsigned *mask, char *bad, int badlen) {
  int invert = s[0] == '^';
  if (invert)
    s++;
  unsigned m = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0)
        bit = subsys_names[i].bit;
    if (bit == 0) {
      snprintf(bad, badlen, "%s", tok);
      return -1;
    }
    m |= bit;
  }
  *mask = invert ? ~m : m;
  return 0;
}

int log_env_valid(char *why, int whylen) {
  const char *lvl = getenv("NCCL_DEBUG");
  if (lvl && lvl[0] && parse_level(lvl) < 0) {
    snprintf(why, whylen, "NCCL_DEBUG=%s is not one of VERSION, WARN, INFO, ABORT, TRACE", lvl);
    return 0;
  }
  const char *sub = getenv("NCCL_DEBUG_SUBSYS");
  unsigned mask;
  char bad[64];
  if (sub && sub[0] && parse_subsys(sub, &mask, bad, sizeof bad) < 0) {
    snprintf(why, whylen, "NCCL_DEBUG_SUBSYS=%s names an unknown subsystem \"%s\"", sub, bad);
    return 0;
  }
  return 1;
}

/* Expands %h (host) and %p (pid) in NCCL_DEBUG_FILE. */
static void expand_file_name(const char *pattern, char *out, size_t len) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < len; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      char tmp[64];
      if (p[1] == 'h')
        snprintf(tmp, sizeof tmp, "%s", log_host);
      else
        snprintf(tmp, sizeof tmp, "%d", (int)getpid());
      o += snprintf(out + o, len - o, "%s", tmp);
      if (o >= len)
        o = len - 1;
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

static void log_init_locked(void) {
  gethostname(log_host, sizeof log_host - 1);
  char *dot = strchr(log_host, '.');
  if (dot)
    *dot = '\0';
  const char *lvl = getenv("NCCL_DEBUG");
  int level = LOG_WARN;
  if (lvl && lvl[0]) {
    int l = parse_level(lvl);
    if (l >= 0)
      level = l;
  }
  unsigned mask = LOG_INIT | LOG_BOOTSTRAP | LOG_ENV;
  const char *sub = getenv("NCCL_DEBUG_SUBSYS");
  char bad[64];
  if (sub && sub[0])
    parse_subsys(sub, &mask, bad, sizeof bad);
  /* WARN is always shown, whatever the subsystem mask says. */
  log_subsys_now = mask;
  if (log_file && log_file != stderr)
    fclose(log_file);
  log_file = stderr;
  const char *fname = getenv("NCCL_DEBUG_FILE");
  if (fname && fname[0] && level > LOG_NONE) {
    char path[4096];
    expand_file_name(fname, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (f) {
      setvbuf(f, NULL, _IOLBF, 0);
      log_file = f;
    } else {
      fprintf(stderr, "%s:%d Loom WARN NCCL_DEBUG_FILE=%s: cannot open %s, logging to stderr\n",
              log_host, (int)getpid(), fname, path);
    }
  }
  __atomic_store_n(&log_level_now, level, __ATOMIC_RELEASE);
}

static void log_lock_take(void) { pthread_mutex_lock(&log_lock); }
static void log_lock_give(void) { pthread_mutex_unlock(&log_lock); }
static void log_fork_register(void) { pthread_atfork(log_lock_take, log_lock_give, log_lock_give); }

void log_fork_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, log_fork_register);
}

void log_init(void) {
  log_fork_init();
  pthread_mutex_lock(&log_lock);
  if (log_level_now < 0)
    log_init_locked();
  pthread_mutex_unlock(&log_lock);
}

void log_reset(void) {
  pthread_mutex_lock(&log_lock);
  log_init_locked();
  pthread_mutex_unlock(&log_lock);
}

void log_set_rank(int rank) { log_rank = rank; }
int log_get_rank(void) { return log_rank; }

void log_msg(int level, unsigned subsys, const char *fmt, ...) {
  if (log_level_now < 0)
    log_init();
  if (log_level_now < level)
    return;
  /* The banner is for NCCL_DEBUG=VERSION and the chattier levels, not for
   * the default WARN. */
  if (level == LOG_VERSION && log_level_now == LOG_WARN)
    return;
  if (level != LOG_WARN && level != LOG_VERSION && !(subsys & log_subsys_now))
    return;
  char line[2048];
  int n;
  if (log_rank >= 0)
    n = snprintf(line, sizeof line, "%s:%d:%ld [%d] NCCL %s ", log_host, (int)getpid(),
                 (long)syscall(SYS_gettid), log_rank, level_names[level]);
  else
    n = snprintf(line, sizeof line, "%s:%d:%ld [-] NCCL %s ", log_host, (int)getpid(),
                 (long)syscall(SYS_gettid), level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  if (n < (int)sizeof line)
    n += vsnprintf(line + n, sizeof line - n, fmt, ap);
  va_end(ap);
  if (n >= (int)sizeof line - 1)
    n = sizeof line - 2;
  line[n++] = '\n';
  line[n] = '\0';
  pthread_mutex_lock(&log_lock);
  fputs(line, log_file ? log_file : stderr);
  fflush(log_file ? log_file : stderr);
  pthread_mutex_unlock(&log_lock);
}
