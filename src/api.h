/*
 * How entry points are defined: pnccl* is the real function and nccl* a
 * weak alias of it, as NCCL does for profiling interposition.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_API_H
#define LOOM_API_H

#define LOOM_EXPORT __attribute__((visibility("default")))

#define NCCL_API(ret, func, ...)                                                      \
  LOOM_EXPORT ret func(__VA_ARGS__) __attribute__((weak, alias("p" #func)));          \
  LOOM_EXPORT ret p##func(__VA_ARGS__)

#endif
