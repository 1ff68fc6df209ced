/*
 * The Loom functions the backend calls, reached through dlopen of Loom's
 * library by path, never through the soname libnccl.so.2: torch's CUDA
 * wheels load NVIDIA's libnccl.so.2 when torch is imported, and a
 * dependency on that soname would bind the backend to NVIDIA's library
 * (whatever rpath says). RTLD_LOCAL keeps Loom out of torch's way, and
 * RTLD_DEEPBIND keeps Loom's own calls inside Loom. The library is
 * LOOM_NCCL_LIB when set, else the one the extension was built against
 * (LOOM_TORCH_LIB_PATH, given by CMake or setup.py). Call sites write
 * lm::ncclAllReduce(...): qualified, so no lookup finds nccl.h's own
 * declarations, which nothing here may link to.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_API_H
#define LOOM_API_H

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "loom.h"
#include "nccl.h"

#ifndef LOOM_TORCH_LIB_PATH
#error "LOOM_TORCH_LIB_PATH (the path of Loom's libnccl.so.2) must be defined by the build"
#endif

// name, return type, (parameters), (arguments)
#define LOOM_API_FUNCS(X)                                                                                              \
  X(ncclGetVersion, ncclResult_t, (int *v), (v))                                                                      \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId * id), (id))                                                         \
  X(ncclCommInitRank, ncclResult_t, (ncclComm_t * c, int n, ncclUniqueId id, int r), (c, n, id, r))                   \
  X(ncclCommSplit, ncclResult_t, (ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg),              \
    (c, color, key, out, cfg))                                                                                         \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t c), (c))                                                               \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t c), (c))                                                                 \
  X(ncclGetErrorString, const char *, (ncclResult_t r), (r))                                                          \
  X(ncclGetLastError, const char *, (ncclComm_t c), (c))                                                              \
  X(ncclGroupStart, ncclResult_t, (), ())                                                                             \
  X(ncclGroupEnd, ncclResult_t, (), ())                                                                               \
  X(ncclAllReduce, ncclResult_t,                                                                                      \
    (const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st),               \
    (s, d, n, t, o, c, st))                                                                                            \
  X(ncclBroadcast, ncclResult_t,                                                                                      \
    (const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st),                    \
    (s, d, n, t, root, c, st))                                                                                         \
  X(ncclReduce, ncclResult_t,                                                                                         \
    (const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t o, int root, ncclComm_t c, cudaStream_t st),     \
    (s, d, n, t, o, root, c, st))                                                                                      \
  X(ncclAllGather, ncclResult_t, (const void *s, void *d, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st), \
    (s, d, n, t, c, st))                                                                                               \
  X(ncclReduceScatter, ncclResult_t,                                                                                  \
    (const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st),               \
    (s, d, n, t, o, c, st))                                                                                            \
  X(ncclSend, ncclResult_t, (const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st),     \
    (s, n, t, peer, c, st))                                                                                            \
  X(ncclRecv, ncclResult_t, (void *d, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st),           \
    (d, n, t, peer, c, st))                                                                                            \
  X(loomTransports, const char *, (), ())                                                                             \
  X(loomCommIsHost, ncclResult_t, (ncclComm_t c, int *h), (c, h))                                                     \
  X(loomCommPeerTransport, ncclResult_t, (ncclComm_t c, int peer, const char **name), (c, peer, name))                \
  X(loomCommSetTimeout, ncclResult_t, (ncclComm_t c, double s), (c, s))

namespace lm {

struct Table {
#define LOOM_API_PTR(name, ret, params, args) ret(*name) params = nullptr;
  LOOM_API_FUNCS(LOOM_API_PTR)
#undef LOOM_API_PTR
  std::string path;
};

// Opens the library once (at import: the module's init calls it, so a
// missing or foreign library is an ImportError naming the path).
inline const Table &table() {
  static const Table t = [] {
    Table t;
    const char *env = std::getenv("LOOM_NCCL_LIB");
    t.path = env && env[0] ? env : LOOM_TORCH_LIB_PATH;
    void *h = dlopen(t.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr)
      throw std::runtime_error("loom backend: cannot load Loom's library " + t.path + ": " + dlerror() +
                               " (set LOOM_NCCL_LIB to the path of Loom's libnccl.so.2)");
#define LOOM_API_SYM(name, ret, params, args)                                                                         \
  t.name = reinterpret_cast<ret(*) params>(dlsym(h, #name));                                                          \
  if (t.name == nullptr)                                                                                               \
    throw std::runtime_error("loom backend: " + t.path + " has no " #name ": it is not Loom's libnccl.so.2 (or an "   \
                             "older Loom); set LOOM_NCCL_LIB to the path of Loom's library");
    LOOM_API_FUNCS(LOOM_API_SYM)
#undef LOOM_API_SYM
    return t;
  }();
  return t;
}

#define LOOM_API_CALL(name, ret, params, args)                                                                        \
  inline ret name params { return table().name args; }
LOOM_API_FUNCS(LOOM_API_CALL)
#undef LOOM_API_CALL

} // namespace lm

#endif
