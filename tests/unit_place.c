/* Placement: threads on CPU lists, within the job's affinity. */
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"
#include "misc/place.h"
#include "test.h"

TEST_IMPL(unit_place_thread) {
  cpu_set_t s;
  ASSERT(place_thread("", 0) == 0 && place_thread(NULL, 0) == 0 && place_thread("junk", 0) == 0);
  ASSERT(place_thread("0", 0) == 1);
  ASSERT(sched_getaffinity(0, sizeof s, &s) == 0 && CPU_COUNT(&s) == 1 && CPU_ISSET(0, &s));
  /* Outside the job's affinity (now CPU 0 alone) there is nothing left. */
  ASSERT(place_thread("1", 0) == 0);
  /* The flag as the CUDA executor reads it at init. */
  setenv("NCCL_IGNORE_CPU_AFFINITY", "1", 1);
  if (sysconf(_SC_NPROCESSORS_ONLN) > 1) {
    ASSERT(place_thread("1", (int)param_int(P_IGNORE_CPU_AFFINITY)) == 1);
    ASSERT(sched_getaffinity(0, sizeof s, &s) == 0 && CPU_ISSET(1, &s) && !CPU_ISSET(0, &s));
  }
  /* Memory placement is a hint: it must be harmless everywhere. */
  char *p = malloc(1 << 20);
  place_memory(p, 1 << 20, 0);
  p[0] = 1;
  free(p);
  return 0;
}
