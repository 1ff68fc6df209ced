/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/utils.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

uint64_t time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t timeout_seconds(void) { return param_int(P_TIMEOUT); }

uint64_t deadline_from_timeout(void) { return time_ns() + (uint64_t)timeout_seconds() * 1000000000ull; }

uint64_t timeout_ns(uint64_t set_ns) { return set_ns ? set_ns : (uint64_t)timeout_seconds() * 1000000000ull; }

uint64_t deadline_after(uint64_t set_ns) { return time_ns() + timeout_ns(set_ns); }

const char *timeout_name(uint64_t set_ns, int64_t loom_s, char *buf, size_t len) {
  if (set_ns)
    snprintf(buf, len, "%.9g s (loomCommSetTimeout)", (double)set_ns / 1e9);
  else
    snprintf(buf, len, "LOOM_TIMEOUT=%llds", (long long)loom_s);
  return buf;
}

ncclResult_t util_random(void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = getrandom((char *)buf + got, len - got, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return err_set(ncclSystemError, "getrandom failed: %s", strerror(errno));
    }
    got += (size_t)r;
  }
  return ncclSuccess;
}

static _Atomic uint64_t process_id;

/* A forked child is another process: it draws its own. */
static void process_id_forget(void) { atomic_store(&process_id, 0); }
static void process_id_register(void) { pthread_atfork(NULL, NULL, process_id_forget); }

uint64_t util_process_id(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, process_id_register);
  uint64_t id = atomic_load(&process_id);
  if (id != 0)
    return id;
  /* getrandom cannot fail for 8 bytes once the pool is ready; should it,
   * the clock and the pid still tell this process from its siblings. */
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    id = util_hash(&(uint64_t[2]){time_ns(), (uint64_t)getpid()}, 2 * sizeof(uint64_t), 0);
  id |= 1; /* never 0, the unset value */
  uint64_t unset = 0;
  /* Two threads drawing at once agree on the first. */
  if (!atomic_compare_exchange_strong(&process_id, &unset, id))
    id = unset;
  return id;
}

uint64_t util_pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* FNV-1a: stable across processes and hosts, which is all it needs. */
uint64_t util_hash(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t util_hash_str(const char *s, uint64_t seed) { return util_hash(s, strlen(s), seed); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void wait_init(struct waiter *w, uint64_t spin_ns, uint64_t yield_ns) {
  w->spin_ns = spin_ns;
  w->yield_ns = yield_ns;
  wait_reset(w);
}

void wait_reset(struct waiter *w) {
  w->spins = 0;
  w->since_ns = 0;
}

#define WAIT_SPUN (1u << 30) /* in spins: the spinning phase is over */

/* Whether the wait is still in its spinning phase: a few pauses without
 * the clock, then pauses for up to spin_ns. A rank with a core of its own
 * answers fastest by spinning; one sched_yield already costs more than a
 * small collective. With spin_ns 0 (more ranks than CPUs) not even the
 * first pauses: the rank waited for may be the one this core should run
 * (4 ranks on 2 CPUs, AllReduce 8 B: 1.7-1.8 us against 3.7-5.7 with 64
 * pauses first). since_ns is when the wait first read the clock. */
static int wait_spin(struct waiter *w) {
  if (w->spin_ns != 0 && w->spins < WAIT_FIRST_PAUSES)
    return 1;
  if (w->since_ns == 0)
    w->since_ns = time_ns();
  if (w->spin_ns == 0 || (w->spins & WAIT_SPUN))
    return 0;
  if ((w->spins & 15) != 0 || time_ns() - w->since_ns < w->spin_ns)
    return 1;
  w->spins |= WAIT_SPUN; /* later calls skip the clock here */
  return 0;
}

/* More ranks than cores is normal on CPU hosts: after spinning the
 * waiter gives the core away, and after a while it sleeps so that the
 * rank it waits for can run. */
void wait_pause(struct waiter *w) {
  w->spins++;
  if (wait_spin(w)) {
    cpu_relax();
    return;
  }
  if ((w->spins & (WAIT_SPUN - 1)) < 2048 || time_ns() - w->since_ns < w->spin_ns + LOOM_MAX(w->yield_ns, 2000000ull)) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50000};
  nanosleep(&ts, NULL);
}

/* Yielding a while before blocking matters where ranks outnumber CPUs:
 * the peer the rank waits for is often the one a yield runs, and a rank
 * woken from poll() waits for a CPU that its peers keep busy. 4 processes
 * on 2 CPUs, AllReduce 1 MiB over loopback sockets: 1.8 ms blocking at
 * once, 1.7 ms only yielding, 0.9 ms yielding 100 us then blocking (50 us:
 * 1.0 ms, 200 us: 1.1 ms). A rank pinned to a CPU with others yields
 * for its longer yield_ns: the same with 2 ranks pinned to each CPU,
 * 1.12-1.17 ms against 1.31-1.36 ms. */
#define WAIT_POLL_YIELD_NS 100000ull

void wait_poll(struct waiter *w, struct pollfd *fds, int nfds) {
  w->spins++;
  uint64_t now = time_ns();
  if (w->since_ns == 0)
    w->since_ns = now;
  if (now - w->since_ns < w->spin_ns) {
    cpu_relax();
    return;
  }
  if (now - w->since_ns < w->spin_ns + LOOM_MAX(WAIT_POLL_YIELD_NS, w->yield_ns)) {
    sched_yield();
    return;
  }
  poll(fds, (nfds_t)nfds, 1);
}

/* Shared (not private) futexes: the words live in memory mapped by
 * several processes. */
void util_futex_wake_all(_Atomic uint32_t *word) { syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

void wait_sleep_on(struct waiter *w, _Atomic uint64_t *counter, uint64_t seen, _Atomic uint32_t *sleepers) {
  w->spins++;
  if (wait_spin(w)) {
    cpu_relax();
    return;
  }
  /* A short wait is cheaper to yield through than to sleep and be woken;
   * past it, a sleeping rank leaves its core to the ranks that have work,
   * which is what keeps oversubscribed hosts going where ranks may move
   * between CPUs. A rank pinned to a CPU with others yields for longer
   * (yield_ns, init.c says why). */
  if (time_ns() - w->since_ns < w->spin_ns + w->yield_ns) {
    sched_yield();
    return;
  }
  /* The sleeper count goes up before the counter is read again, and the
   * peer moves the counter before it reads the count: one of the two sees
   * the other (both sequentially consistent). */
  atomic_fetch_add(sleepers, 1);
  if (atomic_load(counter) == seen) {
    struct timespec ts = {0, 1000000};
    syscall(SYS_futex, (uint32_t *)util_low_word(counter), FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
  }
  atomic_fetch_sub(sleepers, 1);
}

ncclResult_t util_calloc(void **ptr, size_t n, size_t size, const char *what) {
  *ptr = calloc(n ? n : 1, size ? size : 1);
  if (*ptr == NULL)
    return err_set(ncclSystemError, "out of memory allocating %zu bytes for %s", n * size, what);
  return ncclSuccess;
}
