/* Placement: threads on CPU lists, within the job's affinity; ranks crowding CPUs. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
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

static void cpus_of(struct place_cpus *c, int first, int last) {
  memset(c, 0, sizeof *c);
  for (int cpu = first; cpu <= last; cpu++)
    c->w[cpu / 64] |= (uint64_t)1 << (cpu % 64);
}

/* Crowding as the tuner and the spin budget see it (init.c's host
 * census): ranks free to run anywhere, pinned one per CPU as mpirun's
 * --bind-to core pins them, pinned several to a CPU, and mixes. */
TEST_IMPL(unit_place_crowded) {
  struct place_cpus c[8];
  const struct place_cpus *set[8];
  for (int i = 0; i < 8; i++)
    set[i] = &c[i];
  /* Free to run on CPUs 0-1: two ranks fit, three do not. */
  for (int i = 0; i < 3; i++)
    cpus_of(&c[i], 0, 1);
  ASSERT(!place_crowded(set, 2, 0) && !place_crowded(set, 2, 1));
  ASSERT(place_crowded(set, 3, 0) && place_crowded(set, 3, 2));
  /* Pinned one per CPU: each has one CPU, none is crowded. */
  for (int i = 0; i < 8; i++)
    cpus_of(&c[i], i, i);
  for (int i = 0; i < 8; i++)
    ASSERT(!place_crowded(set, 8, i));
  /* Eight pinned four to each of two CPUs (loomrun's --bind cpu on two). */
  for (int i = 0; i < 8; i++)
    cpus_of(&c[i], i % 2, i % 2);
  for (int i = 0; i < 8; i++)
    ASSERT(place_crowded(set, 8, i));
  /* Two ranks share CPU 0; one has CPUs 2-3 to itself. */
  cpus_of(&c[0], 0, 0);
  cpus_of(&c[1], 0, 0);
  cpus_of(&c[2], 2, 3);
  ASSERT(place_crowded(set, 3, 0) && place_crowded(set, 3, 1) && !place_crowded(set, 3, 2));
  /* Overlapping sets: 0-1 and 1-2 share three CPUs between two ranks. */
  cpus_of(&c[0], 0, 1);
  cpus_of(&c[1], 1, 2);
  ASSERT(!place_crowded(set, 2, 0) && !place_crowded(set, 2, 1));
  /* CPUs past the first word count too. */
  cpus_of(&c[0], 100, 100);
  cpus_of(&c[1], 100, 100);
  cpus_of(&c[2], 1000, 1001);
  ASSERT(place_crowded(set, 3, 0) && !place_crowded(set, 3, 2));
  /* The calling thread's own set holds the CPU it runs on. */
  struct place_cpus self;
  place_cpus_self(&self);
  int cpu = sched_getcpu();
  ASSERT(cpu >= 0 && cpu < 1024 && (self.w[cpu / 64] >> (cpu % 64) & 1));
  return 0;
}
