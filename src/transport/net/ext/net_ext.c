/*
 * External network plugins (NCCL_NET_PLUGIN): loads a library built for
 * NCCL's net plugin ABI (net_ext_abi.h) and adapts its ncclNet_vN table
 * to Loom's net_plugin. What differs between ABI versions is the
 * business of one adapter each (net_ext_vN.c, listed in net_ext_adapt.h);
 * this file calls them all through the same net_ext_ops.
 *
 * Where it looks, as NCCL does: the value as given (a path, or a library
 * name dlopen searches for, "libnccl-net-foo.so"), then, unless it is a
 * path or already a full "lib*.so" name, libnccl-net-<value>.so. The
 * newest supported symbol wins.
 *
 * What the adapter does for Loom's net transport: one buffer per receive
 * (n = 1), tag 0 (a connection carries one ordered stream), connect and
 * accept return ncclInProgress while the plugin hands back a NULL comm,
 * sizes checked against what the version's types can carry. Device
 * memory (GPUDirect RDMA, net_gdr.c) goes through the plugin's own
 * regMr(NCCL_PTR_CUDA), regMrDmaBuf and iflush, which every supported
 * version has, as its ptrSupport and forceFlush say. Loom never asks for
 * device offload (netDeviceType UNPACK, getDeviceMr, irecvConsumed) or
 * virtual NICs (makeVDevice): a proxy or executor thread posts every
 * buffer.
 *
 * Only one external plugin is loaded per process (net.c chooses once), so
 * the adapter's state is static.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/utils.h"
#include "transport/net/net.h"
#include "transport/net/ext/net_ext_adapt.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(NET_HANDLE_MAXSIZE == NCCL_NET_HANDLE_MAXSIZE, "handle sizes differ");
_Static_assert(NET_PTR_HOST == NCCL_PTR_HOST && NET_PTR_CUDA == NCCL_PTR_CUDA && NET_PTR_DMABUF == NCCL_PTR_DMABUF,
               "pointer types differ");
_Static_assert((int)NCCL_LOG_WARN == (int)LOG_WARN && (int)NCCL_LOG_INFO == (int)LOG_INFO &&
                   (int)NCCL_LOG_TRACE == (int)LOG_TRACE && (int)NCCL_NET == (int)LOG_NET,
               "log levels or subsystems differ");

#define EXT_VERSION_ENTRY(v) &net_ext_v##v,
static const struct net_ext_version *const ext_versions[] = {NET_EXT_VERSIONS(EXT_VERSION_ENTRY)};
#undef EXT_VERSION_ENTRY
#define EXT_NVERSIONS (sizeof ext_versions / sizeof ext_versions[0])

static void *ext_lib;
static const struct net_ext_version *ext_ver; /* the one the library exports, once bound */
static struct net_ext_ops ext_ops;
static char ext_name[64];
static char ext_path[512];
/* The largest message: the version's limit, lowered to what device 0
 * says it takes. */
static size_t ext_max_bytes;
static struct net_plugin ext_plugin;

/* What Loom holds as a send or receive comm: the plugin's comm once
 * connected, and what connect/accept must see again on every retry. */
struct ext_comm {
  void *comm; /* the plugin's; NULL while connecting */
  /* Stays NULL: pointing at NULL tells the plugin no device offload is
   * wanted (some plugins store through the pointer unconditionally). */
  ncclNetDeviceHandle_v10_t *dev_comm;
  /* The peer's handle: plugins may keep their connect state in it, so
   * every retry passes the same, writable, copy. */
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  ncclNetCommConfig_v10_t config;
};

static const char *ext_code_name(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "ncclSuccess";
  case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
  case ncclSystemError: return "ncclSystemError";
  case ncclInternalError: return "ncclInternalError";
  case ncclInvalidArgument: return "ncclInvalidArgument";
  case ncclInvalidUsage: return "ncclInvalidUsage";
  case ncclRemoteError: return "ncclRemoteError";
  case ncclInProgress: return "ncclInProgress";
  default: return "an unknown result code";
  }
}

/* A plugin's failure as a sentence; codes outside NCCL's range become
 * internal errors so callers still see a valid ncclResult_t. */
static ncclResult_t ext_fail(ncclResult_t r, const char *call) {
  ncclResult_t code = (r > ncclSuccess && r < ncclNumResults) ? r : ncclInternalError;
  return err_set(code, "NET/%s (external plugin, ncclNetPlugin_v%d): %s returned %s (%d)", ext_name, ext_ver->version,
                 call, ext_code_name(r), (int)r);
}

#define EXT_CALL(call, expr)           \
  do {                                 \
    ncclResult_t ext_r_ = (expr);      \
    if (ext_r_ != ncclSuccess)         \
      return ext_fail(ext_r_, (call)); \
  } while (0)

/* The logger plugins get: their lines go to Loom's log, filtered by
 * NCCL_DEBUG and NCCL_DEBUG_SUBSYS like Loom's own. */
static void ext_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt,
                    ...) {
  int lvl = level == NCCL_LOG_ABORT ? LOG_WARN : (int)level;
  if (lvl <= LOG_NONE || lvl > LOG_TRACE || fmt == NULL)
    return;
  unsigned sub = lvl == LOG_WARN ? (unsigned)LOG_ALL : (unsigned)flags;
  if (lvl != LOG_VERSION && !log_enabled(lvl, sub))
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (lvl == LOG_TRACE)
    log_msg(lvl, sub, "%s:%d %s", file ? file : "?", line, msg);
  else
    log_msg(lvl, sub, "%s", msg);
}

/* v10 plugins may report network events to a profiler; Loom has no
 * profiler plugin, so there is no event to hand back. */
static ncclResult_t ext_profiler(void **event, int type, void *phandle, int64_t plugin_id, void *ext_data) {
  if (event)
    *event = NULL;
  return ncclSuccess;
}

/* Initialised by net_ext_load, before net.c sees the plugin. */
static ncclResult_t ext_init(void) { return ncclSuccess; }

static ncclResult_t ext_devices(int *ndev) {
  EXT_CALL("devices()", ext_ops.devices(ndev));
  return ncclSuccess;
}

static ncclResult_t ext_props(int dev, ncclNetProperties_v10_t *q) {
  memset(q, 0, sizeof *q);
  EXT_CALL("getProperties()", ext_ops.get_properties(dev, q));
  return ncclSuccess;
}

static ncclResult_t ext_get_properties(int dev, struct net_props *props) {
  ncclNetProperties_v10_t q;
  CHECK(ext_props(dev, &q));
  memset(props, 0, sizeof *props);
  snprintf(props->name, sizeof props->name, "%s", q.name ? q.name : ext_name);
  snprintf(props->pci_path, sizeof props->pci_path, "%s", q.pciPath ? q.pciPath : "");
  props->ptr_support = q.ptrSupport;
  props->speed_mbps = q.speed;
  props->port = q.port;
  props->force_flush = q.forceFlush; /* 0 from versions that predate it */
  return ncclSuccess;
}

static ncclResult_t ext_listen(int dev, void *handle, void **listen_comm) {
  *listen_comm = NULL;
  EXT_CALL("listen()", ext_ops.listen(dev, handle, listen_comm));
  if (*listen_comm == NULL)
    return err_set(ncclInternalError, "NET/%s: listen() succeeded but gave no listening comm", ext_name);
  return ncclSuccess;
}

static ncclResult_t ext_comm_new(struct ext_comm **out, void **slot) {
  struct ext_comm *c;
  CHECK(UTIL_CALLOC(&c, 1, "an external plugin connection"));
  c->config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF; /* Loom has no traffic-class setting */
  *out = c;
  *slot = c;
  return ncclSuccess;
}

static ncclResult_t ext_connect(int dev, const void *handle, void **send_comm) {
  struct ext_comm *c = *send_comm;
  if (c == NULL) {
    CHECK(ext_comm_new(&c, send_comm));
    memcpy(c->handle, handle, sizeof c->handle);
  }
  if (c->comm)
    return ncclSuccess;
  ncclResult_t r = ext_ops.connect(dev, &c->config, c->handle, &c->comm, &c->dev_comm);
  /* The ABI says "success with a NULL comm" for not yet; a plugin that
   * says ncclInProgress means the same. */
  if (r != ncclSuccess && r != ncclInProgress)
    return ext_fail(r, "connect()");
  return c->comm ? ncclSuccess : ncclInProgress;
}

static ncclResult_t ext_accept(void *listen_comm, void **recv_comm) {
  struct ext_comm *c = *recv_comm;
  if (c == NULL)
    CHECK(ext_comm_new(&c, recv_comm));
  if (c->comm)
    return ncclSuccess;
  ncclResult_t r = ext_ops.accept(listen_comm, &c->comm, &c->dev_comm);
  if (r != ncclSuccess && r != ncclInProgress)
    return ext_fail(r, "accept()");
  return c->comm ? ncclSuccess : ncclInProgress;
}

static ncclResult_t ext_connected(struct ext_comm *c, const char *what) {
  if (c == NULL || c->comm == NULL)
    return err_set(ncclInternalError, "NET/%s: %s on a connection that is not established", ext_name, what);
  return ncclSuccess;
}

static ncclResult_t ext_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  CHECK(ext_connected(comm, "regMr"));
  *mhandle = NULL;
  EXT_CALL("regMr()", ext_ops.reg_mr(((struct ext_comm *)comm)->comm, data, size, type, mhandle));
  return ncclSuccess;
}

static ncclResult_t ext_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                      void **mhandle) {
  CHECK(ext_connected(comm, "regMrDmaBuf"));
  *mhandle = NULL;
  EXT_CALL("regMrDmaBuf()",
           ext_ops.reg_mr_dmabuf(((struct ext_comm *)comm)->comm, data, size, type, offset, fd, mhandle));
  return ncclSuccess;
}

static ncclResult_t ext_dereg_mr(void *comm, void *mhandle) {
  CHECK(ext_connected(comm, "deregMr"));
  EXT_CALL("deregMr()", ext_ops.dereg_mr(((struct ext_comm *)comm)->comm, mhandle));
  return ncclSuccess;
}

static ncclResult_t ext_isend(void *send_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ext_comm *c = send_comm;
  CHECK(ext_connected(c, "isend"));
  if (size > ext_max_bytes)
    return err_set(ncclInvalidUsage, "NET/%s: a %zu-byte message is larger than the %zu bytes one send can carry "
                   "in ncclNetPlugin_v%d", ext_name, size, ext_max_bytes, ext_ver->version);
  *request = NULL;
  EXT_CALL("isend()", ext_ops.isend(c->comm, data, size, 0, mhandle, NULL, request));
  return ncclSuccess;
}

static ncclResult_t ext_irecv(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ext_comm *c = recv_comm;
  CHECK(ext_connected(c, "irecv"));
  /* A posted size is a capacity: no message can exceed what a send can
   * carry, so clamping it loses nothing. */
  size_t cap = size < ext_max_bytes ? size : ext_max_bytes;
  void *bufs[NET_EXT_MAX_RECVS] = {data};
  size_t sizes[NET_EXT_MAX_RECVS] = {cap};
  int tags[NET_EXT_MAX_RECVS] = {0};
  void *mhandles[NET_EXT_MAX_RECVS] = {mhandle};
  void *phandles[NET_EXT_MAX_RECVS] = {NULL};
  *request = NULL; /* not NCCL_NET_OPTIONAL_RECV_COMPLETION: Loom tests every receive */
  EXT_CALL("irecv()", ext_ops.irecv(c->comm, 1, bufs, sizes, tags, mhandles, phandles, request));
  return ncclSuccess;
}

static ncclResult_t ext_test(void *request, int *done, size_t *size) {
  int got = 0;
  *done = 0;
  EXT_CALL("test()", ext_ops.test(request, done, &got));
  if (*done && size) {
    if (got < 0)
      return err_set(ncclInternalError, "NET/%s: test() reported a negative size (%d)", ext_name, got);
    *size = (size_t)got;
  }
  return ncclSuccess;
}

static ncclResult_t ext_iflush(void *recv_comm, void *data, size_t size, void *mhandle, void **request) {
  struct ext_comm *c = recv_comm;
  CHECK(ext_connected(c, "iflush"));
  *request = NULL;
  void *bufs[1] = {data};
  int sizes[1] = {size > INT_MAX ? INT_MAX : (int)size};
  void *mhandles[1] = {mhandle};
  EXT_CALL("iflush()", ext_ops.iflush(c->comm, 1, bufs, sizes, mhandles, request));
  return ncclSuccess;
}

/* Frees Loom's wrapper whether or not the plugin's close succeeds: the
 * connection is gone for Loom either way. */
static ncclResult_t ext_close(void *comm, int send) {
  struct ext_comm *c = comm;
  if (c == NULL)
    return ncclSuccess;
  ncclResult_t r = ncclSuccess;
  if (c->comm)
    r = (send ? ext_ops.close_send : ext_ops.close_recv)(c->comm);
  free(c);
  if (r != ncclSuccess)
    return ext_fail(r, send ? "closeSend()" : "closeRecv()");
  return ncclSuccess;
}

static ncclResult_t ext_close_send(void *send_comm) { return ext_close(send_comm, 1); }
static ncclResult_t ext_close_recv(void *recv_comm) { return ext_close(recv_comm, 0); }

static ncclResult_t ext_close_listen(void *listen_comm) {
  if (listen_comm)
    EXT_CALL("closeListen()", ext_ops.close_listen(listen_comm));
  return ncclSuccess;
}

/* ---- loading ---- */

/* dlopen of one candidate name; on failure appends dlerror's sentence
 * (which names the file) to `why`. */
static void *ext_open(const char *name, char *why, size_t whylen) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    size_t o = strlen(why);
    snprintf(why + o, whylen - o, "%s%s%s%s", o ? "; " : "", e && strstr(e, name) ? "" : name,
             e && strstr(e, name) ? "" : ": ", e ? e : "cannot be opened");
  }
  return h;
}

/* Like NCCL: a value with a '/' is a path and a "lib*.so" value a full
 * library name; anything else is also tried as the suffix of
 * libnccl-net-<value>.so. */
static int ext_is_full_name(const char *spec) {
  size_t n = strlen(spec);
  return strchr(spec, '/') != NULL || (strncmp(spec, "lib", 3) == 0 && n > 3 && strcmp(spec + n - 3, ".so") == 0);
}

#define EXT_SYMBOL "ncclNetPlugin_v%d"

/* Says whether the library is an older NCCL plugin or no plugin at all. */
static ncclResult_t ext_none_exported(void) {
  char wanted[128] = "";
  for (size_t i = 0; i < EXT_NVERSIONS; i++) {
    size_t o = strlen(wanted);
    snprintf(wanted + o, sizeof wanted - o, "%s" EXT_SYMBOL, i ? ", " : "", ext_versions[i]->version);
  }
  char older[32] = "";
  /* Down to v2, NCCL's first net plugin ABI. */
  for (int v = ext_versions[EXT_NVERSIONS - 1]->version - 1; v >= 2 && !older[0]; v--) {
    char name[32];
    snprintf(name, sizeof name, EXT_SYMBOL, v);
    if (dlsym(ext_lib, name))
      snprintf(older, sizeof older, "%s", name);
  }
  return err_set(ncclInvalidUsage, "%s exports none of %s%s%s%s", ext_path, wanted,
                 older[0] ? " (only " : ": it is not an NCCL network plugin", older,
                 older[0] ? ", an ABI version too old for Loom)" : "");
}

/* Finds the newest supported table in the opened library. */
static ncclResult_t ext_bind(void) {
  const void *sym = NULL;
  for (size_t i = 0; i < EXT_NVERSIONS && !sym; i++) {
    char name[32];
    snprintf(name, sizeof name, EXT_SYMBOL, ext_versions[i]->version);
    if ((sym = dlsym(ext_lib, name)) != NULL)
      ext_ver = ext_versions[i];
  }
  if (sym == NULL)
    return ext_none_exported();
  /* name comes first in every version's table. */
  const char *name = *(const char *const *)sym;
  snprintf(ext_name, sizeof ext_name, "%s", name ? name : "");
  if (ext_name[0] == '\0')
    return err_set(ncclInvalidUsage, "%s: ncclNetPlugin_v%d has no name", ext_path, ext_ver->version);
  const char *missing = ext_ver->bind(sym, &ext_ops);
  if (missing)
    return err_set(ncclInvalidUsage, "%s: ncclNetPlugin_v%d \"%s\" has no %s function, which Loom needs", ext_path,
                   ext_ver->version, ext_name, missing);
  ext_max_bytes = ext_ver->max_bytes;
  return ncclSuccess;
}

/* init(), then what Loom's net transport relies on: device 0 takes host
 * memory (the FIFOs it registers are host memory). */
static ncclResult_t ext_start(void) {
  ncclResult_t r = ext_ops.init(ext_log, ext_profiler);
  if (r != ncclSuccess)
    return ext_fail(r, "init()");
  int ndev = 0;
  CHECK(ext_devices(&ndev));
  if (ndev > 0) {
    ncclNetProperties_v10_t q;
    CHECK(ext_props(0, &q));
    if (!(q.ptrSupport & NCCL_PTR_HOST))
      return err_set(ncclInvalidUsage,
                     "NET/%s: device 0 (%s) does not take host memory (ptrSupport 0x%x), and Loom's net transport "
                     "sends from host buffers",
                     ext_name, q.name ? q.name : "?", q.ptrSupport);
    if (q.maxP2pBytes > 0 && q.maxP2pBytes < ext_max_bytes)
      ext_max_bytes = q.maxP2pBytes;
  }
  return ncclSuccess;
}

ncclResult_t net_ext_load(const char *spec, const struct net_plugin **out) {
  if (ext_lib) {
    *out = &ext_plugin;
    return ncclSuccess;
  }
  char why[1024] = "";
  void *h = ext_open(spec, why, sizeof why);
  if (h == NULL && !ext_is_full_name(spec)) {
    char lib[300];
    snprintf(lib, sizeof lib, "libnccl-net-%s.so", spec);
    h = ext_open(lib, why, sizeof why);
  }
  if (h == NULL)
    return err_set(ncclSystemError, "cannot open the plugin library (%s)%s", why,
                   strchr(spec, '/') ? "" : "; put its folder on LD_LIBRARY_PATH or give its path");
  struct link_map *lm = NULL;
  int have_path = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0];
  snprintf(ext_path, sizeof ext_path, "%s", have_path ? lm->l_name : spec);
  ext_lib = h;
  ncclResult_t r = ext_bind();
  if (r != ncclSuccess) {
    /* Loom called nothing in it: it can go. */
    dlclose(h);
    ext_lib = NULL;
    return r;
  }
  r = ext_start();
  if (r != ncclSuccess) {
    /* Kept loaded: init may have started threads or installed handlers
     * that would run in unmapped code. */
    ext_lib = NULL;
    return r;
  }
  ext_plugin = (struct net_plugin){
      .name = ext_name,
      .init = ext_init,
      .devices = ext_devices,
      .get_properties = ext_get_properties,
      .listen = ext_listen,
      .connect = ext_connect,
      .accept = ext_accept,
      .reg_mr = ext_reg_mr,
      .reg_mr_dmabuf = ext_ops.reg_mr_dmabuf ? ext_reg_mr_dmabuf : net_no_reg_mr_dmabuf,
      .dereg_mr = ext_dereg_mr,
      .isend = ext_isend,
      .irecv = ext_irecv,
      .test = ext_test,
      .iflush = ext_ops.iflush ? ext_iflush : net_no_iflush,
      .activity = net_no_activity,
      .poll_fds = net_no_poll_fds,
      .probe = net_no_probe,
      .duplex = net_no_duplex,
      .close_send = ext_close_send,
      .close_recv = ext_close_recv,
      .close_listen = ext_close_listen,
  };
  INFO(LOG_NET | LOG_INIT, "NET/Plugin: loaded %s (ncclNetPlugin_v%d) from %s", ext_name, ext_ver->version, ext_path);
  *out = &ext_plugin;
  return ncclSuccess;
}
