/*
 * The environment parameter table (params.def): typed accessors, and one
 * check that init runs so that a bad value is refused with a sentence.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PARAM_H
#define LOOM_PARAM_H

#include <stdint.h>

#include "nccl.h"

enum param_id {
#define PARAM(id, name, type, def, min, max, help) P_##id,
#include "misc/params.def"
#undef PARAM
  P_COUNT
};

struct param_desc {
  const char *name;
  int type; /* PARAM_INT, PARAM_BOOL, PARAM_STR */
  const char *def;
  int64_t min, max;
  const char *help;
};

enum { PARAM_INT, PARAM_BOOL, PARAM_STR };

const struct param_desc *param_desc(enum param_id id);

/* The value if it is set and valid, else the default. */
int64_t param_int(enum param_id id);
/* The value if set and not empty, else the default (never NULL). */
const char *param_str(enum param_id id);
/* Whether the variable is set to a non-empty value. */
int param_is_set(enum param_id id);
/* Whether the variable is set to a value param_int or param_str uses
 * (for numbers: one that parses and lies within the range), so that a
 * report can tell a set value from a default that stands in for a bad one. */
int param_set_valid(enum param_id id);
/* The id whose variable is named exactly `name` (case-sensitive), or -1. */
int param_find(const char *name);

/* Validates every numeric parameter that is set; returns
 * ncclInvalidArgument with a sentence naming the first bad one. */
ncclResult_t param_check_all(void);

/* RCCL's own variables (RCCL_*) that are set: a ROCm job swapping Loom in
 * for RCCL may carry them, and Loom reads none of them (the NCCL_* ones
 * RCCL shares with NCCL it reads as NCCL does). Their names, comma
 * separated, go into buf; returns how many are set. */
size_t param_rccl_unread(char *buf, size_t len);

#endif
