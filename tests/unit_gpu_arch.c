/* Which AMD architectures read fp8 as FNUZ (cudamem.c): there a GPU
 * communicator refuses fp8 reductions rather than compute them in NCCL's
 * OCP encodings (collectives.c; the refusal itself needs an MI300). */
#include "core.h"
#include "misc/cudamem.h"
#include "test.h"

TEST_IMPL(unit_gpu_arch_fp8_fnuz) {
  static const char *fnuz[] = {"gfx940", "gfx941", "gfx942", "gfx942:sramecc+:xnack-", "gfx940:xnack+"};
  static const char *ocp[] = {"gfx90a", "gfx90a:sramecc+:xnack-", "gfx950", "gfx1200", "gfx9420", "gfx94", "",
                              "sm_90"};
  for (size_t i = 0; i < sizeof fnuz / sizeof fnuz[0]; i++)
    ASSERT_MSG(gpu_arch_fp8_fnuz(fnuz[i]) == 1, "%s reads fp8 as FNUZ", fnuz[i]);
  for (size_t i = 0; i < sizeof ocp / sizeof ocp[0]; i++)
    ASSERT_MSG(gpu_arch_fp8_fnuz(ocp[i]) == 0, "%s reads fp8 as OCP", ocp[i]);
  ASSERT(gpu_arch_fp8_fnuz(NULL) == 0);
  /* Builds without HIP, and devices that are not there, say OCP. */
#if !LOOM_HIP
  ASSERT(cuda_fp8_fnuz(0) == 0);
#endif
  ASSERT(cuda_fp8_fnuz(-1) == 0);
  return 0;
}
