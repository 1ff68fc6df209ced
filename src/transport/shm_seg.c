/*
 * Unnamed shared-memory segments and how a peer gets hold of one (see
 * shm_seg.h). A name in /dev/shm outlives a process that is killed before
 * it can unlink it; a descriptor does not, so a segment here never has a
 * name. Its owner keeps the descriptor open until the peer has mapped the
 * segment, and the peer takes it either straight from the owner's
 * descriptor table (pidfd_getfd: same pid namespace, and the ptrace right
 * over the owner, which Yama or a container's seccomp profile may refuse)
 * or from a Unix socket the owner serves meanwhile (works across pid
 * namespaces; abstract names belong to the network namespace, which ranks
 * of one host share: the host identity includes it). Either side checks
 * who is on the other end of that socket (SO_PEERCRED), and the peer maps
 * only a segment whose size is sealed, or one from the verified owner.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/utils.h"
#include "transport/shm_seg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438 /* the same number on every architecture */
#endif

int shm_seg_test_refuse;

ncclResult_t shm_seg_create(size_t size, int peer, int *out) {
  int fd = memfd_create("loom-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int e_memfd = fd < 0 ? errno : 0, e_tmp = 0, sealable = fd >= 0;
  if (fd < 0) {
    /* Kernels or filters without memfd_create: an inode of /dev/shm that
     * never had a name is as good, only counted against /dev/shm's size,
     * and it cannot be sealed (a peer takes it only from this process). */
    fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    e_tmp = fd < 0 ? errno : 0;
  }
  if (fd < 0)
    return err_set(ncclSystemError,
                   "cannot create shared memory for the connection from rank %d: memfd_create: %s; an unnamed "
                   "file in /dev/shm: %s",
                   peer, strerror(e_memfd), strerror(e_tmp));
  /* Reserving the pages now turns a shortage into an error here instead
   * of a SIGBUS in the middle of a collective. */
  int e = posix_fallocate(fd, 0, (off_t)size);
  if (e != 0) {
    close(fd);
    return err_set(ncclSystemError, "cannot allocate %zu bytes of shared memory for the connection from rank %d: %s%s",
                   size, peer, strerror(e),
                   e == ENOSPC || e == ENOMEM ? " (the host's or the container's memory, or /dev/shm, is full)" : "");
  }
  /* Sealed, its size is a fact the peer can check before it maps it:
   * whoever handed it over cannot shrink it under the mapping. */
  if (sealable && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    e = errno;
    close(fd);
    return err_set(ncclSystemError, "cannot seal the shared memory for the connection from rank %d: %s", peer,
                   strerror(e));
  }
  *out = fd;
  return ncclSuccess;
}

int shm_seg_check(int fd, size_t size, int trusted, char *why, size_t len) {
  const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  int seals = fcntl(fd, F_GET_SEALS);
  if (shm_seg_test_refuse) {
    snprintf(why, len, "refused by the test (shm_seg_test_refuse)");
    return EPERM;
  }
  if ((seals < 0 || (seals & want) != want) && !trusted) {
    snprintf(why, len,
             "its size is not sealed, and it came from a process this rank cannot verify as the rank (another pid "
             "namespace)");
    return EPERM;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != (uint64_t)size) {
    snprintf(why, len, "it is not a segment of %zu bytes", size);
    return EINVAL;
  }
  return 0;
}

/* ---- what the two sides say ---- */

/* One record per message (SOCK_SEQPACKET): the client asks for the
 * segment or says it gave up; the owner answers with the descriptor
 * (SCM_RIGHTS) or says it failed. The token, which only the job's ranks
 * got (over the bootstrap), names the segment. */
enum { SEG_ASK = 1, SEG_GIVE = 2, SEG_FAILED = 3 };
#define SEG_MAGIC 0x316765736d6f6f6cull /* "loomseg1" */

struct seg_msg {
  uint64_t magic;
  uint64_t token;
  uint32_t kind;
  uint32_t pad;
  char why[LOOM_ERR_LEN]; /* SEG_FAILED: the sentence, NUL-terminated */
};

#define SEG_HDR offsetof(struct seg_msg, why)

/* Sends a record, with `fd` attached where it is not -1: 0, or errno. */
static int send_record(int sock, uint64_t token, int kind, const char *why, int fd) {
  struct seg_msg m;
  memset(&m, 0, SEG_HDR);
  m.magic = SEG_MAGIC;
  m.token = token;
  m.kind = (uint32_t)kind;
  size_t n = SEG_HDR;
  if (why) {
    size_t w = strnlen(why, sizeof m.why - 1);
    memcpy(m.why, why, w);
    m.why[w] = '\0';
    n += w + 1;
  }
  struct iovec iov = {&m, n};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    h.msg_control = u.buf;
    h.msg_controllen = sizeof u.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  /* The descriptor in flight keeps the segment alive, whatever becomes of
   * this process before the peer reads it. */
  return sendmsg(sock, &h, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n ? 0 : errno ? errno : EIO;
}

/* Reads a record: 0 with *m and *fd (-1 if none came); EAGAIN; ECONNRESET
 * when the other side closed; EPROTO (why says) for anything malformed,
 * whose descriptors are closed then, as any beyond the first always are. */
static int recv_record(int sock, struct seg_msg *m, int *fd, char *why, size_t len) {
  *fd = -1;
  memset(m, 0, sizeof *m);
  struct iovec iov = {m, sizeof *m};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t r = recvmsg(sock, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r < 0)
    return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ? EAGAIN : errno;
  int nfds = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&h); cm; cm = CMSG_NXTHDR(&h, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0))
      continue;
    for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++, nfds++) {
      int f;
      memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
      if (*fd < 0)
        *fd = f;
      else
        close(f);
    }
  }
  const char *bad = NULL;
  if (r == 0)
    bad = "";
  else if (h.msg_flags & MSG_CTRUNC)
    bad = "the descriptor did not arrive whole (MSG_CTRUNC: this process may be out of file descriptors)";
  else if ((h.msg_flags & MSG_TRUNC) || (size_t)r < SEG_HDR || m->magic != SEG_MAGIC)
    bad = "it sent something that is not Loom's record";
  else if (nfds > 1)
    bad = "it sent more than one descriptor";
  if (bad) {
    if (*fd >= 0)
      close(*fd);
    *fd = -1;
    snprintf(why, len, "%s", bad);
    return r == 0 ? ECONNRESET : EPROTO;
  }
  m->why[sizeof m->why - 1] = '\0';
  return 0;
}

/* Who is on the other end of `sock`: 0 if it is this user and, where
 * `pid` is not 0, that process; else EACCES and why. */
static int check_cred(int sock, pid_t pid, const char *role, char *why, size_t len) {
  struct ucred cr;
  socklen_t l = sizeof cr;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0) {
    snprintf(why, len, "cannot tell who %s it: SO_PEERCRED: %s", role, strerror(errno));
    return EACCES;
  }
  /* Abstract names have no permissions: the user check is what the 0600
   * mode of a file in /dev/shm did. */
  if (cr.uid != geteuid()) {
    snprintf(why, len, "pid %d of user %d %s it, not this user (%d)", (int)cr.pid, (int)cr.uid, role,
             (int)geteuid());
    return EACCES;
  }
  if (pid != 0 && cr.pid != pid) {
    snprintf(why, len, "pid %d %s it, not the rank's pid %d", (int)cr.pid, role, (int)pid);
    return EACCES;
  }
  return 0;
}

/* ---- the owner's socket ---- */

static socklen_t abstract_addr(struct sockaddr_un *a, const char *name) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t n = strnlen(name, sizeof a->sun_path - 2);
  memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: the abstract namespace */
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

void shm_seg_server_init(struct shm_seg_server *s) {
  s->lsock = -1;
  for (int i = 0; i < SHM_SEG_CLIENTS; i++)
    s->client[i] = -1;
  s->token = 0;
  s->peer_pid = 0;
}

int shm_seg_listen(struct shm_seg_server *s, uint64_t token, pid_t peer_pid, char *name, size_t len) {
  name[0] = '\0';
  uint64_t rnd;
  if (util_random(&rnd, sizeof rnd) != ncclSuccess)
    return -1;
  char want[64];
  snprintf(want, sizeof want, "loom-shm-%d-%016llx", (int)getpid(), (unsigned long long)rnd);
  struct sockaddr_un a;
  socklen_t alen = abstract_addr(&a, want);
  int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&a, alen) != 0 || listen(l, 8) != 0) {
    INFO(LOG_SHM, "no socket to hand a segment over (%s): the peer must take it with pidfd_getfd", strerror(errno));
    if (l >= 0)
      close(l);
    return -1;
  }
  s->lsock = l;
  s->token = token;
  s->peer_pid = peer_pid;
  snprintf(name, len, "%s", want);
  return 0;
}

static void drop_client(struct shm_seg_server *s, int i) {
  close(s->client[i]);
  s->client[i] = -1;
}

/* Accepts whoever waits, then reads each client's record and answers it:
 * with `seg` where refusal is NULL, else with that sentence. */
static int serve(struct shm_seg_server *s, int seg, const char *refusal, char *why, size_t len) {
  char note[200];
  for (int c; s->lsock >= 0 && (c = accept4(s->lsock, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
    int i = 0;
    while (i < SHM_SEG_CLIENTS && s->client[i] >= 0)
      i++;
    if (check_cred(c, s->peer_pid, "asked for", note, sizeof note) != 0 || i == SHM_SEG_CLIENTS) {
      INFO(LOG_SHM, "refused a shared-memory segment: %s", i == SHM_SEG_CLIENTS ? "too many clients" : note);
      close(c);
      continue;
    }
    s->client[i] = c;
  }
  int failed = 0;
  for (int i = 0; i < SHM_SEG_CLIENTS; i++) {
    if (s->client[i] < 0)
      continue;
    struct seg_msg m;
    int fd, e = recv_record(s->client[i], &m, &fd, note, sizeof note);
    if (fd >= 0)
      close(fd); /* clients hand nothing over */
    if (e == EAGAIN)
      continue;
    if (e == 0 && m.token != s->token)
      INFO(LOG_SHM, "a client asked for another segment than this socket serves");
    else if (e == 0 && m.kind == SEG_ASK && (e = send_record(s->client[i], s->token, refusal ? SEG_FAILED : SEG_GIVE,
                                                             refusal, refusal ? -1 : seg)) != 0)
      INFO(LOG_SHM, "handing a segment over failed: %s", strerror(e));
    else if (e == 0 && m.kind == SEG_FAILED && !failed) {
      snprintf(why, len, "%s", m.why);
      failed = 1;
    }
    drop_client(s, i);
  }
  return failed;
}

int shm_seg_serve(struct shm_seg_server *s, int seg, char *why, size_t len) { return serve(s, seg, NULL, why, len); }

void shm_seg_refuse(struct shm_seg_server *s, const char *why) {
  char ignored[8];
  serve(s, -1, why[0] ? why : "it failed", ignored, sizeof ignored);
  shm_seg_server_close(s);
}

void shm_seg_server_close(struct shm_seg_server *s) {
  for (int i = 0; i < SHM_SEG_CLIENTS; i++)
    if (s->client[i] >= 0)
      drop_client(s, i);
  if (s->lsock >= 0)
    close(s->lsock);
  s->lsock = -1;
}

/* ---- the peer's side ---- */

int shm_seg_pidfd_getfd(int pidfd, int target, int *fd) {
  int r = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0); /* the new descriptor is close-on-exec */
  if (r < 0)
    return errno;
  *fd = r;
  return 0;
}

int shm_seg_take(int pidfd, pid_t pid, int target, int (*same)(int fd, const void *arg), const void *arg, int *out,
                 int *e_pidfd, int *e_proc) {
  int fd = -1;
  *e_pidfd = EBADF;
  *e_proc = 0;
  if (pidfd >= 0 && (*e_pidfd = shm_seg_pidfd_getfd(pidfd, target, &fd)) == 0 && !same(fd, arg)) {
    close(fd);
    fd = -1;
    *e_pidfd = ESTALE;
  }
  if (fd < 0) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, target);
    fd = open(path, O_RDWR | O_CLOEXEC);
    *e_proc = fd < 0 ? errno : 0;
    if (fd >= 0 && !same(fd, arg)) {
      close(fd);
      fd = -1;
      *e_proc = ESTALE;
    }
  }
  if (fd < 0)
    return -1;
  *out = fd;
  return 0;
}

/* A connection to the owner's socket, checked: 0 with *sock, or errno. */
static int connect_owner(const char *name, pid_t expect_pid, int *sock, char *why, size_t len) {
  struct sockaddr_un a;
  socklen_t alen = abstract_addr(&a, name);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    snprintf(why, len, "socket: %s", strerror(errno));
    return errno;
  }
  /* A Unix socket connects at once or, with a full backlog, says EAGAIN:
   * the caller tries again later. */
  if (connect(s, (struct sockaddr *)&a, alen) != 0) {
    int e = errno;
    snprintf(why, len, "%s", strerror(e));
    close(s);
    return e;
  }
  /* Abstract names are listed in /proc/net/unix: a stranger could have
   * taken this one once its owner let go of it. */
  int e = check_cred(s, expect_pid, "serves", why, len);
  if (e != 0) {
    close(s);
    return e;
  }
  *sock = s;
  return 0;
}

int shm_seg_ask(const char *name, uint64_t token, pid_t expect_pid, int *sock, char *why, size_t len) {
  int s, e = connect_owner(name, expect_pid, &s, why, len);
  if (e != 0)
    return e;
  e = send_record(s, token, SEG_ASK, NULL, -1);
  if (e != 0) {
    snprintf(why, len, "asking: %s", strerror(e));
    close(s);
    return e;
  }
  *sock = s;
  return 0;
}

int shm_seg_recv(int sock, int *fd, char *why, size_t len) {
  struct seg_msg m;
  int e = recv_record(sock, &m, fd, why, len);
  if (e != 0)
    return e;
  if (m.kind == SEG_FAILED) {
    if (*fd >= 0)
      close(*fd);
    *fd = -1;
    snprintf(why, len, "%s", m.why);
    return ECANCELED;
  }
  if (m.kind != SEG_GIVE || *fd < 0) {
    if (*fd >= 0)
      close(*fd);
    *fd = -1;
    snprintf(why, len, "it answered without a descriptor");
    return EPROTO;
  }
  return 0;
}

void shm_seg_report(const char *name, uint64_t token, pid_t expect_pid, const char *why) {
  char note[200];
  int s;
  if (name[0] == '\0' || connect_owner(name, expect_pid, &s, note, sizeof note) != 0)
    return;
  int e = send_record(s, token, SEG_FAILED, why, -1);
  if (e != 0)
    INFO(LOG_SHM, "telling the owner of a segment that this rank gave up failed: %s", strerror(e));
  close(s);
}

/* ---- named segments of dead processes ---- */

/* Whether `s` is exactly loom-<pid>-<counter>-<8 lower-case hex digits>,
 * the names of Loom before its segments had none; the pid in *pid. */
static int old_name(const char *s, pid_t *pid) {
  if (strncmp(s, "loom-", 5) != 0)
    return 0;
  s += 5;
  long p = 0;
  int n = 0;
  for (; *s >= '0' && *s <= '9' && n < 10; s++, n++)
    p = p * 10 + (*s - '0');
  if (n == 0 || p <= 0 || p > 0x7fffffff || *s++ != '-')
    return 0;
  for (n = 0; *s >= '0' && *s <= '9' && n < 11; s++)
    n++;
  if (n == 0 || *s++ != '-')
    return 0;
  for (n = 0; (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'); s++)
    n++;
  if (n != 8 || *s != '\0')
    return 0;
  *pid = (pid_t)p;
  return 1;
}

/* A segment is removed only when all of these hold: its name is one Loom
 * made; this user owns it; its pid does not exist in this pid namespace;
 * and it was untouched for longer than LOOM_TIMEOUT and an hour. The last
 * because a container with its own pid namespace may share /dev/shm (an
 * IPC namespace shared with the host, or the containers of one Kubernetes
 * pod): its pids mean nothing here, but such a name only lived while its
 * job connected, which fails or ends within that job's timeout, which this
 * process does not know. */
#define SWEEP_GRACE_MIN_S 3600
static void sweep(void) {
  int dfd = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  time_t now = time(NULL);
  /* Not this process's LOOM_TIMEOUT alone: the job of another pid
   * namespace may wait far longer than one with LOOM_TIMEOUT=3. */
  int64_t grace = LOOM_MAX(timeout_seconds(), SWEEP_GRACE_MIN_S);
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    pid_t pid;
    struct stat st;
    if (!old_name(e->d_name, &pid) || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (int64_t)(now - st.st_mtime) <= grace)
      continue;
    if (kill(pid, 0) == 0 || errno != ESRCH)
      continue;
    if (unlinkat(dfd, e->d_name, 0) == 0)
      removed++;
  }
  closedir(d);
  if (removed)
    INFO(LOG_SHM | LOG_INIT, "removed %d segment(s) of dead processes (loom-<pid>-*) from /dev/shm", removed);
}

void shm_seg_sweep_stale(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, sweep);
}
