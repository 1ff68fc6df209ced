/* SPDX-License-Identifier: Apache-2.0 */
#include "sanitizer.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
int sanitizer_leak_check(int rc) { return rc == 0 && __lsan_do_recoverable_leak_check() ? 1 : rc; }
#else
int sanitizer_leak_check(int rc) { return rc; }
#endif

#if defined(__SANITIZE_THREAD__)
#include <pthread.h>
static void *settle_main(void *arg) { return arg; }
void sanitizer_settle(void) {
  pthread_t t;
  /* Started and joined: the runtime's own threads are then in place. */
  if (pthread_create(&t, NULL, settle_main, NULL) == 0)
    pthread_join(t, NULL);
}
#else
void sanitizer_settle(void) {}
#endif
