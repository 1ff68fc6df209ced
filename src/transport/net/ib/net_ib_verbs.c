/*
 * Loading libibverbs (net_ib_verbs.h). The path comes from
 * LOOM_IB_VERBS_LIB, which is how the tests point the plugin at their
 * verbs test double through this same code.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "transport/net/ib/net_ib_verbs.h"

#if LOOM_HAVE_IBVERBS_HEADERS
#include "core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct ib_verbs verbs;
static ncclResult_t load_status;
static char load_error[LOOM_ERR_LEN];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void) {
  const char *path = param_str(P_IB_VERBS_LIB);
  snprintf(verbs.path, sizeof verbs.path, "%s", path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    load_status = err_set(ncclSystemError, "cannot load %s (rdma-core's libibverbs; LOOM_IB_VERBS_LIB names another): %s",
                          path, dlerror());
    goto out;
  }
  /* Symbols that must be there, then those that may be missing. */
  struct {
    const char *name;
    void **slot;
    int optional;
  } syms[] = {
      {"ibv_get_device_list", (void **)&verbs.get_device_list, 0},
      {"ibv_free_device_list", (void **)&verbs.free_device_list, 0},
      {"ibv_get_device_name", (void **)&verbs.get_device_name, 0},
      {"ibv_open_device", (void **)&verbs.open_device, 0},
      {"ibv_close_device", (void **)&verbs.close_device, 0},
      {"ibv_query_device", (void **)&verbs.query_device, 0},
      {"ibv_query_port", (void **)&verbs.query_port, 0},
      {"ibv_query_gid", (void **)&verbs.query_gid, 0},
      {"_ibv_query_gid_ex", (void **)&verbs.query_gid_ex, 1},
      {"ibv_alloc_pd", (void **)&verbs.alloc_pd, 0},
      {"ibv_dealloc_pd", (void **)&verbs.dealloc_pd, 0},
      {"ibv_reg_mr", (void **)&verbs.reg_mr, 0},
      {"ibv_reg_dmabuf_mr", (void **)&verbs.reg_dmabuf_mr, 1},
      {"ibv_dereg_mr", (void **)&verbs.dereg_mr, 0},
      {"ibv_create_cq", (void **)&verbs.create_cq, 0},
      {"ibv_destroy_cq", (void **)&verbs.destroy_cq, 0},
      {"ibv_create_qp", (void **)&verbs.create_qp, 0},
      {"ibv_modify_qp", (void **)&verbs.modify_qp, 0},
      {"ibv_destroy_qp", (void **)&verbs.destroy_qp, 0},
      {"ibv_wc_status_str", (void **)&verbs.wc_status_str, 0},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot && !syms[i].optional) {
      load_status = err_set(ncclSystemError, "%s has no %s: it is not a usable libibverbs", path, syms[i].name);
      dlclose(h);
      goto out;
    }
  }
  INFO(LOG_NET | LOG_INIT, "NET/IB: loaded %s", path);
out:
  if (load_status != ncclSuccess)
    snprintf(load_error, sizeof load_error, "%s", err_thread_last());
}

ncclResult_t ib_verbs_load(const struct ib_verbs **out) {
  pthread_once(&load_once, load);
  if (load_status != ncclSuccess)
    return err_set(load_status, "%s", load_error);
  *out = &verbs;
  return ncclSuccess;
}
#endif
