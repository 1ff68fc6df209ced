/*
 * The rank launcher (see launch.h).
 *
 * Once ncclGetUniqueId has run, this process has the library's bootstrap
 * thread, and after fork() only async-signal-safe calls are allowed in the
 * child. So every argv/envp array is built before the first fork and the
 * child does nothing but restore the signal mask, execve and _exit.
 *
 * Signals are not handled with handlers: SIGCHLD, SIGINT, SIGTERM and SIGHUP
 * are blocked before the library can start a thread (threads inherit the
 * mask, so none of them takes these signals away from us) and collected
 * with sigtimedwait in one loop that also watches the deadlines.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "nccl.h"

extern char **environ;

#define HEX_LEN (2 * NCCL_UNIQUE_ID_BYTES)
#define DEFAULT_GRACE_S 3.0
#define DEFAULT_ID_WAIT_S 60.0
/* The longest we sleep between looks at children and deadlines, so that a
 * SIGCHLD lost to another thread costs at most this much. */
#define POLL_SLICE_S 0.1

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct timespec to_timespec(double s) {
  if (s < 0) s = 0;
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  return ts;
}

static void stop_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
}

/* A stop request (SIGINT/SIGTERM/SIGHUP) that arrived while we were busy
 * with the id files; 0 if none. */
static int take_stop_signal(void) {
  sigset_t set;
  stop_signals(&set);
  struct timespec zero = {0, 0};
  int sig = sigtimedwait(&set, NULL, &zero);
  return sig > 0 ? sig : 0;
}

static void sleep_s(double s) {
  struct timespec ts = to_timespec(s);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---- rank lists ---------------------------------------------------------- */

static int parse_int(const char **p, long *out) {
  char *end;
  if (**p < '0' || **p > '9') return -1;
  errno = 0;
  long v = strtol(*p, &end, 10);
  if (errno != 0 || v > INT_MAX) return -1;
  *p = end;
  *out = v;
  return 0;
}

int loomParseRankList(const char *list, int nranks, int **ranks, int *nlocal, char *err,
                      int errlen) {
  *ranks = NULL;
  *nlocal = 0;
  if (nranks < 1) {
    snprintf(err, (size_t)errlen, "the number of ranks must be set before a rank list");
    return -1;
  }
  int *out = malloc(sizeof(int) * (size_t)nranks);
  char *seen = calloc((size_t)nranks, 1);
  if (out == NULL || seen == NULL) {
    free(out);
    free(seen);
    snprintf(err, (size_t)errlen, "out of memory");
    return -1;
  }
  int n = 0;
  const char *p = list;
  for (;;) {
    long lo, hi;
    if (parse_int(&p, &lo) != 0) goto malformed;
    hi = lo;
    if (*p == '-') {
      p++;
      if (parse_int(&p, &hi) != 0) goto malformed;
    }
    if (hi < lo) {
      snprintf(err, (size_t)errlen, "rank range %ld-%ld in \"%s\" goes backwards", lo, hi, list);
      goto fail;
    }
    if (hi >= nranks) {
      snprintf(err, (size_t)errlen, "rank %ld in \"%s\" is not below the number of ranks (%d)",
               hi, list, nranks);
      goto fail;
    }
    for (long r = lo; r <= hi; r++) {
      if (seen[r]) {
        snprintf(err, (size_t)errlen, "rank %ld appears twice in \"%s\"", r, list);
        goto fail;
      }
      seen[r] = 1;
      out[n++] = (int)r;
    }
    if (*p == '\0') break;
    if (*p != ',') goto malformed;
    p++;
  }
  free(seen);
  *ranks = out;
  *nlocal = n;
  return 0;
malformed:
  snprintf(err, (size_t)errlen,
           "malformed rank list \"%s\" (expected ranks and ranges such as 0,1 or 2-3)", list);
fail:
  free(out);
  free(seen);
  return -1;
}

/* ---- the program's path -------------------------------------------------- */

/* execvp would search PATH after fork, where it may allocate; search now. */
static char *resolve_program(const char *prog, const char *name) {
  if (strchr(name, '/') != NULL) {
    if (access(name, X_OK) != 0) {
      fprintf(stderr, "%s: cannot execute %s: %s\n", prog, name, strerror(errno));
      return NULL;
    }
    return strdup(name);
  }
  const char *path = getenv("PATH");
  if (path == NULL || *path == '\0') path = "/usr/local/bin:/usr/bin:/bin";
  size_t nlen = strlen(name);
  for (const char *dir = path;;) {
    const char *colon = strchr(dir, ':');
    size_t dlen = colon ? (size_t)(colon - dir) : strlen(dir);
    char *cand = malloc(dlen + nlen + 2);
    if (cand == NULL) return NULL;
    if (dlen == 0) {
      strcpy(cand, name); /* an empty PATH entry is the current directory */
    } else {
      memcpy(cand, dir, dlen);
      cand[dlen] = '/';
      memcpy(cand + dlen + 1, name, nlen + 1);
    }
    struct stat st;
    if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) return cand;
    free(cand);
    if (colon == NULL) break;
    dir = colon + 1;
  }
  fprintf(stderr, "%s: %s: not found in PATH\n", prog, name);
  return NULL;
}

/* ---- the unique id ------------------------------------------------------- */

static int is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Takes the id from text read so far: 1 when complete and valid, 0 when more
 * is needed, -1 when it cannot be an id. */
static int scan_id(const char *buf, size_t len, char *hex) {
  size_t i = 0;
  while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')) i++;
  size_t start = i;
  while (i < len && is_hex(buf[i]) && i - start < HEX_LEN) i++;
  size_t got = i - start;
  if (got < HEX_LEN) return (i < len) ? -1 : 0;
  if (i < len && !(buf[i] == '\n' || buf[i] == '\r' || buf[i] == ' ' || buf[i] == '\t'))
    return -1;
  for (size_t k = 0; k < HEX_LEN; k++) {
    char c = buf[start + k];
    hex[k] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
  }
  hex[HEX_LEN] = '\0';
  return 1;
}

static int read_id(const char *prog, const char *path, double wait_s, char *hex) {
  double deadline = now_s() + wait_s;
  int use_stdin = strcmp(path, "-") == 0;
  char buf[HEX_LEN + 64];
  size_t len = 0;
  int fd = use_stdin ? STDIN_FILENO : -1;
  int regular = 0, rc = LOOM_LAUNCH_ERROR;
  for (;;) {
    int sig = take_stop_signal();
    if (sig) {
      fprintf(stderr, "%s: interrupted (%s) while waiting for the id in %s\n", prog,
              strsignal(sig), path);
      rc = 128 + sig;
      break;
    }
    if (fd < 0) {
      fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0 && errno != ENOENT) {
        fprintf(stderr, "%s: cannot open %s: %s\n", prog, path, strerror(errno));
        break;
      }
      struct stat st;
      regular = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
      len = 0;
    }
    int eof = 0;
    if (fd >= 0) {
      /* A FIFO or pipe: wait a little for data; a regular file: just read. */
      struct pollfd pfd = {.fd = fd, .events = POLLIN};
      if (regular || poll(&pfd, 1, (int)(POLL_SLICE_S * 1000)) > 0) {
        ssize_t r = read(fd, buf + len, sizeof(buf) - len);
        if (r > 0) {
          len += (size_t)r;
        } else if (r == 0) {
          eof = 1;
        } else if (errno != EAGAIN && errno != EINTR) {
          fprintf(stderr, "%s: cannot read %s: %s\n", prog, path, strerror(errno));
          break;
        }
      }
      int s = scan_id(buf, len, hex);
      if (s == 1) {
        rc = 0;
        break;
      }
      if (s < 0 || len == sizeof(buf)) {
        fprintf(stderr, "%s: %s does not hold a unique id (256 hex digits)\n", prog, path);
        break;
      }
      /* A regular file not written completely yet: read it again later
       * from the start (writers that rename into place never show this). */
      if (eof && regular) {
        close(fd);
        fd = -1;
      }
    }
    if (now_s() > deadline) {
      fprintf(stderr, "%s: no unique id in %s after waiting %g s\n", prog, path, wait_s);
      break;
    }
    if (fd < 0 || eof) sleep_s(POLL_SLICE_S / 2);
  }
  if (fd >= 0 && !use_stdin) close(fd);
  return rc;
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += w;
    len -= (size_t)w;
  }
  return 0;
}

static int write_id(const char *prog, const char *path, double wait_s, const char *hex) {
  double deadline = now_s() + wait_s;
  char line[HEX_LEN + 2];
  memcpy(line, hex, HEX_LEN);
  line[HEX_LEN] = '\n';
  line[HEX_LEN + 1] = '\0';
  if (strcmp(path, "-") == 0) {
    fflush(stdout);
    if (write_all(STDOUT_FILENO, line, HEX_LEN + 1) != 0) {
      fprintf(stderr, "%s: cannot write the id to stdout: %s\n", prog, strerror(errno));
      return LOOM_LAUNCH_ERROR;
    }
    return 0;
  }
  struct stat st;
  if (stat(path, &st) == 0 && S_ISFIFO(st.st_mode)) {
    /* Opening a FIFO for writing blocks until a reader comes; open it
     * non-blocking (ENXIO until then) so deadlines and Ctrl-C still work. */
    for (;;) {
      int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        int flags = fcntl(fd, F_GETFL);
        if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        int rc = write_all(fd, line, HEX_LEN + 1);
        int e = errno;
        close(fd);
        if (rc != 0) {
          fprintf(stderr, "%s: cannot write the id to %s: %s\n", prog, path, strerror(e));
          return LOOM_LAUNCH_ERROR;
        }
        return 0;
      }
      if (errno != ENXIO && errno != EINTR) {
        fprintf(stderr, "%s: cannot open %s: %s\n", prog, path, strerror(errno));
        return LOOM_LAUNCH_ERROR;
      }
      int sig = take_stop_signal();
      if (sig) {
        fprintf(stderr, "%s: interrupted (%s) while waiting for a reader of %s\n", prog,
                strsignal(sig), path);
        return 128 + sig;
      }
      if (now_s() > deadline) {
        fprintf(stderr, "%s: nobody opened the FIFO %s to read the id\n", prog, path);
        return LOOM_LAUNCH_ERROR;
      }
      sleep_s(POLL_SLICE_S / 2);
    }
  }
  /* A regular file: write a temporary one next to it and rename it into
   * place, so a reader polling the path never sees half an id. */
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  if (tmp == NULL) return LOOM_LAUNCH_ERROR;
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write_all(fd, line, HEX_LEN + 1) != 0 || close(fd) != 0 ||
      rename(tmp, path) != 0) {
    fprintf(stderr, "%s: cannot write the id to %s: %s\n", prog, path, strerror(errno));
    unlink(tmp);
    free(tmp);
    return LOOM_LAUNCH_ERROR;
  }
  free(tmp);
  return 0;
}

static int make_id(const char *prog, const loomLaunchOptions *o, char *hex) {
  double wait_s = o->timeout_s > 0 ? o->timeout_s : DEFAULT_ID_WAIT_S;
  if (o->id_in != NULL) {
    int rc = read_id(prog, o->id_in, wait_s, hex);
    if (rc != 0) return rc;
    ncclUniqueId id;
    if (loomUniqueIdFromHex(hex, &id) != ncclSuccess) {
      fprintf(stderr, "%s: %s does not hold a valid unique id\n", prog, o->id_in);
      return LOOM_LAUNCH_ERROR;
    }
    return 0;
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    fprintf(stderr, "%s: ncclGetUniqueId failed: %s: %s\n", prog, ncclGetErrorString(r),
            ncclGetLastError(NULL));
    return LOOM_LAUNCH_ERROR;
  }
  r = loomUniqueIdToHex(&id, hex);
  if (r != ncclSuccess) {
    fprintf(stderr, "%s: loomUniqueIdToHex failed: %s\n", prog, ncclGetErrorString(r));
    return LOOM_LAUNCH_ERROR;
  }
  if (o->id_out != NULL) return write_id(prog, o->id_out, wait_s, hex);
  return 0;
}

/* ---- environments -------------------------------------------------------- */

static const char *const OWN_VARS[] = {"LOOM_RANK=", "LOOM_NRANKS=", "LOOM_LOCAL_RANK=",
                                       "LOOM_LOCAL_NRANKS=", "LOOM_UNIQUE_ID="};
#define N_OWN_VARS (sizeof(OWN_VARS) / sizeof(OWN_VARS[0]))

static int same_name(const char *a, const char *b) {
  size_t n = strcspn(b, "=");
  return strncmp(a, b, n) == 0 && a[n] == '=';
}

/* Whether an inherited entry gives way: to the rank's own variables and to
 * the caller's extras of the same name. */
static int replaced(const char *entry, char *const *extra) {
  for (size_t i = 0; i < N_OWN_VARS; i++)
    if (same_name(entry, OWN_VARS[i])) return 1;
  for (size_t i = 0; extra && extra[i]; i++)
    if (same_name(entry, extra[i])) return 1;
  return 0;
}

/* The environment of one rank: its own variables first (getenv takes the
 * first match, so a stale LOOM_RANK from an outer launcher or an extra of
 * that name cannot shadow them), then the launcher's environment less what
 * the extras replace, then the extras. */
static char **rank_env(int rank, int nranks, int local, int nlocal, const char *hex,
                       char *const *extra) {
  size_t n = 0, nextra = 0;
  while (environ[n]) n++;
  while (extra && extra[nextra]) nextra++;
  char **env = calloc(N_OWN_VARS + n + nextra + 1, sizeof(char *));
  if (env == NULL) return NULL;
  /* Each fits: the longest is LOOM_UNIQUE_ID= and 256 digits. */
  const size_t cap = 32 + HEX_LEN;
  for (size_t i = 0; i < N_OWN_VARS; i++) {
    env[i] = malloc(cap);
    if (env[i] == NULL) {
      for (size_t j = 0; j < i; j++) free(env[j]);
      free(env);
      return NULL;
    }
  }
  snprintf(env[0], cap, "LOOM_RANK=%d", rank);
  snprintf(env[1], cap, "LOOM_NRANKS=%d", nranks);
  snprintf(env[2], cap, "LOOM_LOCAL_RANK=%d", local);
  snprintf(env[3], cap, "LOOM_LOCAL_NRANKS=%d", nlocal);
  snprintf(env[4], cap, "LOOM_UNIQUE_ID=%s", hex);
  size_t k = N_OWN_VARS;
  for (size_t i = 0; i < n; i++)
    if (!replaced(environ[i], extra)) env[k++] = environ[i];
  for (size_t i = 0; i < nextra; i++) env[k++] = extra[i];
  env[k] = NULL;
  return env;
}

static void free_rank_env(char **env) {
  if (env == NULL) return;
  for (size_t i = 0; i < N_OWN_VARS; i++) free(env[i]); /* the only strings we own */
  free(env);
}

/* ---- children ------------------------------------------------------------ */

/* Async-signal-safe error report from the child: no stdio, no malloc. */
static void child_fail(const char *prog, const char *path, int err) {
  char num[16];
  int i = (int)sizeof(num);
  num[--i] = '\0';
  do {
    num[--i] = (char)('0' + err % 10);
    err /= 10;
  } while (err > 0 && i > 0);
  const char *parts[] = {prog, ": execve ", path, " failed: errno ", num + i, "\n"};
  for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++) {
    ssize_t unused = write(STDERR_FILENO, parts[p], strlen(parts[p]));
    (void)unused;
  }
}

typedef struct {
  int rank;
  pid_t pid;
  int running;
  int status;
  char **env;
  int cpu; /* the one CPU it runs on, or -1 */
} child_t;

/* Each child's CPU (LOOM_BIND_*), or -1 for all of the launcher's: taken
 * in order from the launcher's own affinity, which a job's cgroup or an
 * outer taskset has already narrowed. */
static void choose_cpus(const char *prog, int bind, child_t *c, int n) {
  cpu_set_t have;
  for (int i = 0; i < n; i++) c[i].cpu = -1;
  if (bind == LOOM_BIND_NONE) return;
  if (sched_getaffinity(0, sizeof have, &have) != 0) {
    fprintf(stderr, "%s: cannot read this process's CPUs (%s); the ranks are not bound\n", prog,
            strerror(errno));
    return;
  }
  int k = CPU_COUNT(&have);
  if (k == 0 || (bind == LOOM_BIND_AUTO && n <= k)) return;
  for (int i = 0; i < n; i++) {
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
      if (!CPU_ISSET(cpu, &have)) continue;
      if (seen++ == i % k) {
        c[i].cpu = cpu;
        break;
      }
    }
  }
}

static void describe_status(int status, char *buf, size_t len) {
  if (WIFEXITED(status)) {
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    snprintf(buf, len, "was killed by signal %d (%s)%s", WTERMSIG(status),
             strsignal(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
  } else {
    snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
  }
}

static int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return LOOM_LAUNCH_ERROR;
}

static int signal_running(child_t *c, int n, int sig) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (c[i].running && kill(c[i].pid, sig) == 0) k++;
  return k;
}

enum { PHASE_RUN, PHASE_TERM, PHASE_KILL };

/* Waits for the children, stopping them all when one fails, on timeout or
 * on a stop signal. Returns the launch's exit code. */
static int supervise(const char *prog, const loomLaunchOptions *o, child_t *c, int n,
                     double start, int result) {
  double grace = o->grace_s > 0 ? o->grace_s : DEFAULT_GRACE_S;
  double timeout_at = o->timeout_s > 0 ? start + o->timeout_s : 0;
  int phase = result ? PHASE_TERM : PHASE_RUN;
  double kill_at = now_s() + grace;
  int left = 0;
  for (int i = 0; i < n; i++) left += c[i].running;
  if (phase == PHASE_TERM) signal_running(c, n, SIGTERM);

  sigset_t waitset;
  stop_signals(&waitset);
  sigaddset(&waitset, SIGCHLD);
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      if (!c[i].running) continue;
      int st;
      pid_t p = waitpid(c[i].pid, &st, WNOHANG);
      if (p == 0 || (p < 0 && errno == EINTR)) continue;
      c[i].running = 0;
      left--;
      if (p < 0) {
        fprintf(stderr, "%s: lost rank %d (pid %ld): %s\n", prog, c[i].rank, (long)c[i].pid,
                strerror(errno));
        if (!result) result = LOOM_LAUNCH_ERROR;
        continue;
      }
      c[i].status = st;
      char how[128];
      describe_status(st, how, sizeof(how));
      int failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
      if (failed && phase == PHASE_RUN) {
        fprintf(stderr, "%s: rank %d (pid %ld) %s\n", prog, c[i].rank, (long)c[i].pid, how);
        result = status_code(st);
        if (left > 0) {
          fprintf(stderr, "%s: stopping the other %d rank%s\n", prog, left,
                  left == 1 ? "" : "s");
          signal_running(c, n, SIGTERM);
        }
        phase = PHASE_TERM;
        kill_at = now_s() + grace;
      } else if (o->verbose || (failed && !(WIFSIGNALED(st) && (WTERMSIG(st) == SIGTERM ||
                                                                  WTERMSIG(st) == SIGKILL)))) {
        /* Later failures are usually the first one seen by its peers, but a
         * rank that crashed on its own is still worth a line. */
        fprintf(stderr, "%s: rank %d (pid %ld) %s\n", prog, c[i].rank, (long)c[i].pid, how);
      }
    }
    if (left == 0) break;

    double now = now_s();
    if (phase == PHASE_RUN && timeout_at > 0 && now >= timeout_at) {
      fprintf(stderr, "%s: timeout: %d of %d rank%s still running after %g s:", prog, left, n,
              n == 1 ? "" : "s", o->timeout_s);
      for (int i = 0; i < n; i++)
        if (c[i].running) fprintf(stderr, " %d", c[i].rank);
      fprintf(stderr, "; stopping them\n");
      signal_running(c, n, SIGTERM);
      result = LOOM_LAUNCH_TIMEOUT;
      phase = PHASE_TERM;
      kill_at = now + grace;
    }
    if (phase == PHASE_TERM && now >= kill_at) {
      fprintf(stderr, "%s: %d rank%s still running %g s after SIGTERM; sending SIGKILL\n", prog,
              left, left == 1 ? "" : "s", grace);
      signal_running(c, n, SIGKILL);
      phase = PHASE_KILL;
    }

    double wake = now + POLL_SLICE_S;
    if (phase == PHASE_RUN && timeout_at > 0 && timeout_at < wake) wake = timeout_at;
    if (phase == PHASE_TERM && kill_at < wake) wake = kill_at;
    struct timespec ts = to_timespec(wake - now);
    siginfo_t info;
    int sig = sigtimedwait(&waitset, &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (phase == PHASE_RUN) {
        fprintf(stderr, "%s: got %s; stopping %d rank%s\n", prog, strsignal(sig), left,
                left == 1 ? "" : "s");
        signal_running(c, n, SIGTERM);
        result = 128 + sig;
        phase = PHASE_TERM;
        kill_at = now_s() + grace;
      } else if (phase == PHASE_TERM) {
        /* Asked again while waiting for the ranks to stop: don't wait. */
        fprintf(stderr, "%s: got %s again; sending SIGKILL\n", prog, strsignal(sig));
        signal_running(c, n, SIGKILL);
        phase = PHASE_KILL;
      }
    }
  }
  return result;
}

int loomLaunch(const char *prog, const loomLaunchOptions *o) {
  if (prog == NULL) prog = "loomlaunch";
  if (o == NULL || o->nranks < 1 || o->argv == NULL || o->argv[0] == NULL) {
    fprintf(stderr, "%s: nothing to launch (need a rank count >= 1 and a program)\n", prog);
    return LOOM_LAUNCH_ERROR;
  }
  if (o->id_in != NULL && o->id_out != NULL) {
    fprintf(stderr, "%s: the id is either read (--id-in) or written (--id-out), not both\n",
            prog);
    return LOOM_LAUNCH_ERROR;
  }
  int n = o->ranks ? o->nlocal : o->nranks;
  if (o->ranks) {
    for (int i = 0; i < n; i++) {
      if (o->ranks[i] < 0 || o->ranks[i] >= o->nranks) {
        fprintf(stderr, "%s: rank %d is outside [0, %d)\n", prog, o->ranks[i], o->nranks);
        return LOOM_LAUNCH_ERROR;
      }
    }
  }
  double start = now_s();

  /* Before anything can start a thread (ncclGetUniqueId does). */
  sigset_t block, oldmask;
  stop_signals(&block);
  sigaddset(&block, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &block, &oldmask);
  /* With SIGCHLD ignored the kernel would reap the ranks before we see how
   * they ended. */
  struct sigaction dfl, oldchld;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, &oldchld);

  int result = 0;
  char *path = NULL;
  child_t *c = calloc((size_t)(n > 0 ? n : 1), sizeof(child_t));
  char hex[HEX_LEN + 1];
  if (c == NULL) {
    result = LOOM_LAUNCH_ERROR;
    goto out;
  }
  path = resolve_program(prog, o->argv[0]);
  if (path == NULL) {
    result = LOOM_LAUNCH_NOEXEC;
    goto out;
  }
  result = make_id(prog, o, hex);
  if (result != 0) goto out;

  for (int i = 0; i < n; i++) {
    c[i].rank = o->ranks ? o->ranks[i] : i;
    c[i].env = rank_env(c[i].rank, o->nranks, i, n, hex, o->extra_env);
    if (c[i].env == NULL) {
      fprintf(stderr, "%s: out of memory\n", prog);
      result = LOOM_LAUNCH_ERROR;
      goto out;
    }
  }
  choose_cpus(prog, o->bind, c, n);
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < n; i++) {
    cpu_set_t one;
    CPU_ZERO(&one);
    if (c[i].cpu >= 0) CPU_SET(c[i].cpu, &one);
    pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &oldmask, NULL);
      /* A raw system call, safe after fork; the CPU is one the launcher
       * may run on, so this fails only if that changed meanwhile, and then
       * the rank runs unbound rather than not at all. */
      if (c[i].cpu >= 0) sched_setaffinity(0, sizeof one, &one);
      execve(path, o->argv, c[i].env);
      child_fail(prog, path, errno);
      _exit(LOOM_LAUNCH_NOEXEC);
    }
    if (pid < 0) {
      fprintf(stderr, "%s: fork for rank %d failed: %s\n", prog, c[i].rank, strerror(errno));
      result = LOOM_LAUNCH_ERROR;
      break;
    }
    c[i].pid = pid;
    c[i].running = 1;
  }
  if (o->verbose) {
    fprintf(stderr, "%s: started %s as", prog, path);
    for (int i = 0; i < n; i++)
      if (c[i].running) {
        fprintf(stderr, " rank %d (pid %ld", c[i].rank, (long)c[i].pid);
        if (c[i].cpu >= 0) fprintf(stderr, ", CPU %d", c[i].cpu);
        fprintf(stderr, ")%s", i + 1 < n ? "," : "");
      }
    fprintf(stderr, " of %d\n", o->nranks);
  }
  result = supervise(prog, o, c, n, start, result);

out:
  if (c != NULL)
    for (int i = 0; i < n; i++) free_rank_env(c[i].env);
  free(c);
  free(path);
  /* A SIGCHLD left pending means nothing once unblocked; a pending stop
   * signal is left to act as the caller's mask and handlers decide. */
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&chld, NULL, &zero) > 0) {
  }
  sigaction(SIGCHLD, &oldchld, NULL);
  pthread_sigmask(SIG_SETMASK, &oldmask, NULL);
  return result;
}
