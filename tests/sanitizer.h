/*
 * What a sanitizer build (cmake/Sanitize.cmake) needs from the processes
 * the tests fork: the test runner's per-test processes and the harness's
 * ranks both use these. Without a sanitizer both do nothing.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TEST_SANITIZER_H
#define LOOM_TEST_SANITIZER_H

/* A process that passed (rc 0) is checked for leaks before it leaves: it
 * leaves with _exit, which LeakSanitizer's own check at exit never sees.
 * Returns rc, or 1 when it passed but leaked. */
int sanitizer_leak_check(int rc);

/* Call first in a forked child: a ThreadSanitizer runtime starts threads
 * of its own after a fork, one of them only at the process's first
 * pthread_create, and tests count /proc/self/task to check that Loom's
 * threads are gone. */
void sanitizer_settle(void);

#endif
