/* The names of the path kinds (common/path_type.h). SPDX-License-Identifier: Apache-2.0 */
#include "common/path_type.h"

static const char *path_names[PATH_NTYPES] = {"LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS", "NET", "DIS"};

const char *path_type_name(int type) { return type >= 0 && type < PATH_NTYPES ? path_names[type] : "?"; }
