/*
 * Shared memory of the verbs test double: the objects peers need live in
 * /dev/shm/loomvd-<kind>-<number>, and creating one with O_EXCL is what
 * allocates its number machine-wide (QP numbers, LIDs, PD and CQ ids).
 * Creation and the removal of stale objects happen under an flock of
 * /dev/shm itself, so that a stale file is never removed after someone
 * else re-created its name; an flock dies with its holder, and locking the
 * directory leaves no lock file behind.
 *
 * The names must outlive the calls that make them (peers find QPs, PDs
 * and CQs by number), so a process that ends without running its
 * destructor (killed, or ended by _exit as the tests' forked ranks are)
 * would leave them behind. Each process that makes an object therefore
 * starts a janitor (vd_janitor.c) that waits on the process's pidfd and
 * then removes what it left: the suite leaves nothing in /dev/shm,
 * however its processes end.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vd_internal.h"

static const char *const vd_kind_name[] = {
    [VD_KIND_DEV] = "dev", [VD_KIND_PD] = "pd", [VD_KIND_CQ] = "cq", [VD_KIND_QP] = "qp"};

/* What this process made, to remove at exit. Entries of a parent survive in
 * a forked child, hence the pid. */
struct vd_owned {
  enum vd_kind kind;
  uint32_t num;
  pid_t pid;
  struct vd_hdr *map;
};

static pthread_mutex_t vd_owned_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vd_owned *vd_owned;
static size_t vd_owned_n, vd_owned_cap;
static pid_t vd_swept_pid;
static pid_t vd_janitor_for; /* the process whose janitor was started */

void vd_log(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fprintf(stderr, "loom-verbs-double: %s\n", buf);
}

double vd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void vd_shm_name(char *buf, size_t len, enum vd_kind kind, uint32_t num) {
  snprintf(buf, len, "/" VD_SHM_PREFIX "%s-%u", vd_kind_name[kind], num);
}

/* Field 22 of /proc/<pid>/stat; 0 when the process is gone. */
static uint64_t vd_proc_start(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  /* The command name may hold spaces and parentheses: fields count from
   * the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p)
    return 0;
  int field = 2;
  for (; *p && field < 22; p++)
    if (*p == ' ')
      field++;
  return strtoull(p, NULL, 10);
}

static uint64_t vd_self_start(void) {
  static pid_t pid;
  static uint64_t start;
  if (pid != getpid()) {
    start = vd_proc_start(getpid());
    pid = getpid();
  }
  return start;
}

int vd_hdr_alive(const struct vd_hdr *h) {
  if (h->magic != VD_MAGIC || atomic_load(&h->gone))
    return 0;
  if (kill(h->owner_pid, 0) != 0 && errno == ESRCH)
    return 0;
  return vd_proc_start(h->owner_pid) == h->owner_start;
}

int vd_mutex_init_shared(pthread_mutex_t *m) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
  return rc;
}

void vd_lock(pthread_mutex_t *m) {
  int rc = pthread_mutex_lock(m);
  /* The holder died mid-update: the object may be half-changed, which is
   * what a peer of a crashed process gets on hardware too. */
  if (rc == EOWNERDEAD)
    pthread_mutex_consistent(m);
}

void vd_unlock(pthread_mutex_t *m) { pthread_mutex_unlock(m); }

static int vd_dir_lock(void) {
  /* Opened afresh each time: an flock is per open file, and a descriptor
   * inherited across fork would let parent and child both hold it. */
  int fd = open(VD_SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  while (flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

static void vd_dir_unlock(int fd) {
  flock(fd, LOCK_UN);
  close(fd);
}

/* With the directory locked: removes `name` (without the leading '/') if
 * its owner is dead; 1 if removed. */
static int vd_reap_if_stale(const char *name) {
  char path[300];
  snprintf(path, sizeof(path), VD_SHM_DIR "/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return 0;
  struct vd_hdr h;
  ssize_t n = pread(fd, &h, sizeof(h), 0);
  close(fd);
  /* Objects are created whole under the directory lock, so a short or
   * foreign header is debris, not one being made. */
  if (n == (ssize_t)sizeof(h) && vd_hdr_alive(&h))
    return 0;
  return unlink(path) == 0;
}

static void vd_sweep(void) {
  DIR *d = opendir(VD_SHM_DIR);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, VD_SHM_PREFIX, strlen(VD_SHM_PREFIX)) == 0)
      vd_reap_if_stale(e->d_name);
  closedir(d);
}

static int vd_track(enum vd_kind kind, uint32_t num, struct vd_hdr *map) {
  pthread_mutex_lock(&vd_owned_lock);
  if (vd_owned_n == vd_owned_cap) {
    size_t cap = vd_owned_cap ? vd_owned_cap * 2 : 64;
    struct vd_owned *o = realloc(vd_owned, cap * sizeof(*o));
    if (!o) {
      pthread_mutex_unlock(&vd_owned_lock);
      return -1;
    }
    vd_owned = o;
    vd_owned_cap = cap;
  }
  vd_owned[vd_owned_n++] = (struct vd_owned){kind, num, getpid(), map};
  pthread_mutex_unlock(&vd_owned_lock);
  return 0;
}

static void vd_untrack(enum vd_kind kind, uint32_t num) {
  pthread_mutex_lock(&vd_owned_lock);
  for (size_t i = 0; i < vd_owned_n; i++) {
    if (vd_owned[i].kind == kind && vd_owned[i].num == num && vd_owned[i].pid == getpid()) {
      vd_owned[i] = vd_owned[--vd_owned_n];
      break;
    }
  }
  pthread_mutex_unlock(&vd_owned_lock);
}

/* Starts this process's janitor, once: loom-verbs-double-janitor, found
 * next to this library, with this process's pidfd as its descriptor 3.
 * posix_spawn (a vfork) copies nothing of this process and runs no fork
 * handlers. Where there is no janitor (no pidfds before Linux 5.3, the
 * program missing), the next allocation's sweep removes what is left. */
static void vd_janitor_start(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  int started = vd_janitor_for == getpid();
  vd_janitor_for = getpid();
  pthread_mutex_unlock(&lock);
  if (started)
    return;
  Dl_info info;
  char path[4096];
  if (!dladdr((void *)vd_janitor_start, &info) || !info.dli_fname || !strchr(info.dli_fname, '/'))
    return;
  snprintf(path, sizeof(path), "%.*s/loom-verbs-double-janitor",
           (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
  if (access(path, X_OK) != 0)
    return;
  int pidfd = -1, high = -1;
#ifdef SYS_pidfd_open
  pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
#endif
  /* Above 3, so that the dup2 to 3 clears its close-on-exec flag. */
  if (pidfd >= 0)
    high = fcntl(pidfd, F_DUPFD_CLOEXEC, 10);
  if (pidfd >= 0)
    close(pidfd);
  if (high < 0)
    return;
  char pid_s[16], start_s[24];
  snprintf(pid_s, sizeof(pid_s), "%d", (int)getpid());
  snprintf(start_s, sizeof(start_s), "%llu", (unsigned long long)vd_self_start());
  char *argv[] = {path, pid_s, start_s, NULL};
  char *envp[] = {NULL};
  posix_spawn_file_actions_t fa;
  pid_t c = -1;
  if (posix_spawn_file_actions_init(&fa) == 0) {
    if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDWR, 0) == 0 &&
        posix_spawn_file_actions_adddup2(&fa, 0, 1) == 0 && posix_spawn_file_actions_adddup2(&fa, 0, 2) == 0 &&
        posix_spawn_file_actions_adddup2(&fa, high, 3) == 0 && posix_spawn(&c, path, &fa, NULL, argv, envp) != 0)
      c = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  close(high);
  /* The first process forks the janitor and exits at once. */
  if (c > 0)
    while (waitpid(c, NULL, 0) < 0 && errno == EINTR)
      ;
}

void *vd_shm_create(enum vd_kind kind, uint32_t lo, uint32_t hi, size_t size, uint32_t *num) {
  vd_janitor_start();
  int dfd = vd_dir_lock();
  if (dfd < 0)
    return NULL;
  if (vd_swept_pid != getpid()) {
    vd_sweep();
    vd_swept_pid = getpid();
  }
  /* Start somewhere different in each process so that numbers are not
   * reused right away (a late packet to a reused QP number is the bug
   * this avoids on hardware too). */
  uint64_t span = (uint64_t)hi - lo + 1;
  uint64_t start = ((uint64_t)getpid() * 2654435761u + (uint64_t)(vd_now() * 1e6)) % span;
  void *map = NULL;
  int err = ENOSPC;
  for (uint64_t i = 0; i < span; i++) {
    uint32_t n = (uint32_t)(lo + (start + i) % span);
    char name[64];
    vd_shm_name(name, sizeof(name), kind, n);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST && vd_reap_if_stale(name + 1))
      fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST)
        continue;
      err = errno;
      break;
    }
    if (ftruncate(fd, (off_t)size) != 0 ||
        (map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
      err = errno;
      map = NULL;
      close(fd);
      shm_unlink(name);
      break;
    }
    close(fd);
    struct vd_hdr *h = map;
    h->kind = kind;
    h->owner_pid = getpid();
    h->owner_start = vd_self_start();
    h->magic = VD_MAGIC;
    if (vd_track(kind, n, h) != 0) {
      err = ENOMEM;
      munmap(map, size);
      shm_unlink(name);
      map = NULL;
      break;
    }
    *num = n;
    break;
  }
  vd_dir_unlock(dfd);
  if (!map)
    errno = err;
  return map;
}

void *vd_shm_map(enum vd_kind kind, uint32_t num, size_t *size) {
  char name[64];
  vd_shm_name(name, sizeof(name), kind, num);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return NULL;
  struct stat st;
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct vd_hdr))
    map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  else
    errno = ENOENT;
  int e = errno;
  close(fd);
  if (map == MAP_FAILED) {
    errno = e;
    return NULL;
  }
  struct vd_hdr *h = map;
  if (h->magic != VD_MAGIC || h->kind != (uint32_t)kind) {
    munmap(map, (size_t)st.st_size);
    errno = ENOENT;
    return NULL;
  }
  *size = (size_t)st.st_size;
  return map;
}

void vd_shm_destroy(enum vd_kind kind, uint32_t num, void *map, size_t size) {
  char name[64];
  vd_shm_name(name, sizeof(name), kind, num);
  atomic_store(&((struct vd_hdr *)map)->gone, 1);
  shm_unlink(name);
  vd_untrack(kind, num);
  munmap(map, size);
}

/* Runs at exit() and at dlclose: peers see the objects gone at once, and
 * /dev/shm is left clean. A process killed outright, or ended by _exit,
 * leaves its objects to its janitor. */
__attribute__((destructor)) static void vd_shm_cleanup(void) {
  pthread_mutex_lock(&vd_owned_lock);
  for (size_t i = 0; i < vd_owned_n; i++) {
    if (vd_owned[i].pid != getpid())
      continue;
    char name[64];
    vd_shm_name(name, sizeof(name), vd_owned[i].kind, vd_owned[i].num);
    atomic_store(&vd_owned[i].map->gone, 1);
    shm_unlink(name);
  }
  vd_owned_n = 0;
  pthread_mutex_unlock(&vd_owned_lock);
}
