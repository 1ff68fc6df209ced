/*
 * A process that forks while the bootstrap works: Python's multiprocessing
 * starts ranks one by one from the process that made the unique id, whose
 * root thread is meanwhile greeting the first ones. A child must neither
 * inherit a lock libcrypto held in the root's thread (its first MAC would
 * wait forever) nor keep a copy of a connection the root drops (its rank
 * would never hear of the drop).
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_wire.h"
#include "core.h"
#include "sock_wait.h"
#include "test.h"

static const uint8_t key[BOOT_KEY] = {7, 7, 7, 1};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits up to `limit` s for a child; -1 if it is still running then (it
 * is killed). */
static int wait_child(pid_t pid, double limit) {
  double t0 = now_s();
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    ASSERT(r == 0);
    if (now_s() - t0 > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    struct pollfd none;
    poll(&none, 0, 5); /* a polling interval for waitpid, not a synchronisation */
  }
}

/* libcrypto takes its write locks through CRYPTO_THREAD_write_lock, which
 * this program interposes: in the thread `slow_thread`, the first time it
 * takes each lock, it holds it until the test has forked (or 50 ms have
 * passed, after which it stops waiting: with Loom's lock, fork waits for
 * the thread instead). */
static pthread_t slow_thread;
static atomic_int slow_on, held_seq, forked_seq;
static void *locks_seen[256];
static int nlocks_seen;

static void pause_ms(int ms) {
  struct pollfd none;
  poll(&none, 0, ms);
}

static int first_take(void *lock) {
  for (int i = 0; i < nlocks_seen; i++)
    if (locks_seen[i] == lock)
      return 0;
  if (nlocks_seen == 256)
    return 0;
  locks_seen[nlocks_seen++] = lock;
  return 1;
}

int CRYPTO_THREAD_write_lock(void *lock) {
  static int (*real)(void *);
  if (!real)
    real = (int (*)(void *))dlsym(RTLD_NEXT, "CRYPTO_THREAD_write_lock");
  int r = real(lock);
  if (atomic_load(&slow_on) && pthread_equal(pthread_self(), slow_thread) && first_take(lock)) {
    int seq = atomic_fetch_add(&held_seq, 1) + 1;
    int i = 0;
    while (i < 50 && atomic_load(&forked_seq) < seq) {
      pause_ms(1);
      i++;
    }
    if (i == 50)
      atomic_store(&slow_on, 0);
  }
  return r;
}

static atomic_int macs_done, forks_done;

static void *first_macs(void *arg) {
  slow_thread = pthread_self();
  atomic_store(&slow_on, 1);
  struct boot_msg_hdr h;
  void *r = boot_hdr_make(key, 0, 1, 8, &h) == ncclSuccess ? arg : (void *)1;
  atomic_store(&macs_done, 1);
  /* Parked until the forks are over: a thread that exits while the
   * process forks may hold the C library's or a sanitizer's own locks,
   * which is no fault of Loom's and not what this test is about. */
  while (!atomic_load(&forks_done))
    pause_ms(1);
  return r;
}

/* A thread computes the process's first MAC (libcrypto then loads its
 * provider and fills its caches under write locks) and the program forks
 * while each of those locks is held; each child computes a MAC. Without
 * Loom's lock around libcrypto, which fork takes, a child waits on a
 * copied lock forever. */
TEST_IMPL(bootstrap_fork_crypto) {
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, first_macs, NULL) == 0);
  pid_t kids[256];
  int nkids = 0, seen = 0;
  while (nkids < 256) {
    while (atomic_load(&held_seq) == seen && !atomic_load(&macs_done))
      pause_ms(1);
    if (atomic_load(&macs_done))
      break;
    seen = atomic_load(&held_seq);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      struct boot_msg_hdr h;
      _exit(boot_hdr_make(key, 1, 2, 3, &h) == ncclSuccess ? 0 : 1);
    }
    kids[nkids++] = pid;
    atomic_store(&forked_seq, seen);
  }
  atomic_store(&forks_done, 1);
  void *ret;
  pthread_join(t, &ret);
  atomic_store(&slow_on, 0);
  ASSERT(ret == NULL);
  int hung = 0, failed = 0;
  double t0 = now_s();
  for (int i = 0; i < nkids; i++) {
    double left = 5 - (now_s() - t0); /* 5 s for them all */
    int rc = wait_child(kids[i], left > 0.1 ? left : 0.1);
    hung += rc < 0;
    failed += rc > 0;
  }
  printf("forked %d children, each as the thread took a write lock for the first time (%d in all)\n", nkids,
         atomic_load(&held_seq));
  ASSERT_MSG(atomic_load(&held_seq) > 0, "CRYPTO_THREAD_write_lock was never called: the test cannot tell");
  ASSERT_MSG(hung == 0 && failed == 0, "of %d children forked while a thread was in libcrypto, %d hung and %d failed",
             nkids, hung, failed);
  return 0;
}

static int read_full(int fd, void *p, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)p + got, len - got);
    if (n <= 0 && !(n < 0 && errno == EINTR))
      return -1;
    if (n > 0)
      got += (size_t)n;
  }
  return 0;
}

/* A greeter that stalls: it sends its challenge, reads the root's answer
 * (so the root has accepted it), tells the test, then says nothing more;
 * it reports how long the root took to drop it. */
static void stalled_greeter(const union sock_addr *root, int out) {
  double secs = -2;
  int s = socket(root->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s >= 0 && connect(s, &root->sa, sock_addr_len(root)) == 0) {
    struct boot_chal chal;
    memset(&chal, 0, sizeof chal);
    memcpy(chal.magic, chal_magic, sizeof chal.magic);
    chal.from = 0;
    chal.to = BOOT_TO_ROOT;
    chal.nranks = 2;
    memset(chal.nonce, 0x5a, sizeof chal.nonce);
    struct boot_answer ans;
    if (send(s, &chal, sizeof chal, MSG_NOSIGNAL) == (ssize_t)sizeof chal && read_full(s, &ans, sizeof ans) == 0) {
      char ready = 'a';
      if (write(out, &ready, 1) == 1)
        secs = sock_wait_closed(s, 10);
    }
  }
  if (write(out, &secs, sizeof secs) != (ssize_t)sizeof secs)
    _exit(2);
  _exit(0);
}

/* The root drops a greeting that stalls (GREETING_NS); a sibling forked
 * from the root's process after the root accepted it must not hold the
 * connection open past that. */
TEST_IMPL(bootstrap_fork_sibling) {
  setenv("LOOM_TIMEOUT", "30", 1);
  ncclUniqueId uid;
  ASSERT_OK(bootstrap_create_root_id(&uid));
  struct boot_id id;
  memcpy(&id, uid.internal, sizeof id);
  int a_out[2], b_in[2];
  ASSERT(pipe(a_out) == 0 && pipe(b_in) == 0);
  pid_t a = fork();
  ASSERT(a >= 0);
  if (a == 0) {
    close(a_out[0]);
    stalled_greeter(&id.root, a_out[1]);
  }
  close(a_out[1]);
  char ready = 0;
  ASSERT_MSG(read(a_out[0], &ready, 1) == 1 && ready == 'a', "the greeter got no answer from the root");
  /* Now the root holds the greeter's connection: a sibling forked here
   * gets a copy of it, and lives until the test ends. */
  pid_t b = fork();
  ASSERT(b >= 0);
  if (b == 0) {
    close(b_in[1]);
    char c;
    _exit(read(b_in[0], &c, 1) < 0 ? 1 : 0);
  }
  close(b_in[0]);
  double secs = -3;
  ASSERT(read_full(a_out[0], &secs, sizeof secs) == 0);
  close(b_in[1]);
  ASSERT(wait_child(a, 10) == 0);
  ASSERT(wait_child(b, 10) == 0);
  printf("the root dropped the stalled greeting after %.2f s (a sibling forked meanwhile)\n", secs);
  ASSERT_MSG(secs >= 0, "the stalled greeter never saw its connection end: a process forked from the root's "
                        "held it open (%.0f)", secs);
  return 0;
}
