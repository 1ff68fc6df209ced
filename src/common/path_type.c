/* The names of the path kinds (common/path_type.h). SPDX-License-Identifier: Apache-2.0 */
#include "common/path_type.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *path_names[PATH_NTYPES] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS", "NET", "DIS"};

const char *path_type_name(int type) { return type >= 0 && type < PATH_NTYPES ? path_names[type] : "?"; }

ncclResult_t path_parse_level(const char *var, const char *value, int with_nvl, int *level) {
  /* By path name, or by NCCL's legacy number (its index here; as NCCL,
   * anything above 4 is SYS). */
  static const int levels[] = {PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS};
  const size_t nlevels = sizeof levels / sizeof levels[0];
  for (size_t i = 0; i < nlevels; i++)
    if (strcasecmp(value, path_type_name(levels[i])) == 0) {
      *level = levels[i];
      return ncclSuccess;
    }
  if (with_nvl && strcasecmp(value, path_type_name(PATH_NVL)) == 0) {
    *level = PATH_NVL;
    return ncclSuccess;
  }
  size_t n = strlen(value);
  if (n > 0 && n <= 9 && strspn(value, "0123456789") == n) {
    long k = strtol(value, NULL, 10);
    *level = levels[k >= (long)nlevels ? nlevels - 1 : (size_t)k];
    return ncclSuccess;
  }
  return err_set(ncclInvalidArgument,
                 "%s=%s: expected LOC, %sPIX, PXB, PHB, SYS or NCCL's legacy numbers 0-4 (larger numbers are SYS)",
                 var, value, with_nvl ? "NVL, " : "");
}
