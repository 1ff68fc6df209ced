/*
 * Reading a caller's ncclConfig_t (comm_api.h: comm_read_config), for
 * every layout NCCL's headers have had.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm_api.h"
#include "transport/net/net.h"

#include <limits.h>
#include <stddef.h>
#include <string.h>

#define CONFIG_MAGIC 0xcafebeefu

/* ---- reading a caller's ncclConfig_t ----
 *
 * As NVIDIA's NCCL 2.30 parseCommConfig does: the bytes `size` covers (a
 * larger size, from a newer header, is read as far as Loom's struct goes),
 * each field only from the NCCL version that added it on (older layouts
 * had padding, or nothing, where later fields now lie), and the same
 * refusals, with a sentence naming the field. Unlike NVIDIA, a field
 * `size` covers only in part is left at its default: no header makes such
 * a size, and half a pointer is no pointer. */

/* NVIDIA's MAXCHANNELS in 2.30: its bound on nChannelsPerNetPeer, kept so
 * that every config NVIDIA takes is taken here. */
#define NVIDIA_MAXCHANNELS 64
/* Far longer than any plugin's name: a netName this long is no name
 * (more likely a pointer to something that is not a string). */
#define CONFIG_NAME_MAX 256

struct config_field {
  const char *name;
  size_t offset, size;
  unsigned since; /* NCCL_VERSION that added it; 0: `size` alone decides */
  int is_ptr;     /* a string, checked on its own */
  int lo, hi;     /* int fields: the values NVIDIA takes (unset aside) */
};

#define CONFIG_INT(f, since, lo, hi) {#f, offsetof(ncclConfig_t, f), sizeof(int), since, 0, lo, hi}
#define CONFIG_PTR(f, since) {#f, offsetof(ncclConfig_t, f), sizeof(void *), since, 1, 0, 0}

static const struct config_field config_fields[] = {
    CONFIG_INT(blocking, NCCL_VERSION(2, 14, 0), 0, 1),
    /* Validation only: Loom's kernels launch no thread-block clusters. */
    CONFIG_INT(cgaClusterSize, NCCL_VERSION(2, 17, 0), 0, INT_MAX),
    /* Bounds on the channel count (comm_init). */
    CONFIG_INT(minCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    CONFIG_INT(maxCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    CONFIG_PTR(netName, NCCL_VERSION(2, 17, 0)),
    /* Validation only, as shrinkShare: a child never shares its parent's
     * connections or buffers in Loom. */
    CONFIG_INT(splitShare, 0, 0, 1),
    /* Any value, as NVIDIA takes; Loom's plugins have no traffic classes
     * to give it (net_ext passes NCCL_NET_TRAFFIC_CLASS_UNDEF). */
    CONFIG_INT(trafficClass, NCCL_VERSION(2, 25, 0), INT_MIN, INT_MAX),
    CONFIG_PTR(commName, 0),
    /* Validation only from here on, for what Loom lacks: CollNet, CTA
     * policies, NVLS, channel counts per network peer (its count is per
     * communicator), NVLink-centric scheduling, CUDA-graph modes and RMA
     * contexts; and it connects p2p peers as they are used, so it has no
     * cap on them to apply. */
    CONFIG_INT(collnetEnable, NCCL_VERSION(2, 27, 0), 0, 1),
    CONFIG_INT(CTAPolicy, NCCL_VERSION(2, 27, 0), 0, NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO),
    CONFIG_INT(shrinkShare, NCCL_VERSION(2, 27, 0), 0, 1),
    CONFIG_INT(nvlsCTAs, NCCL_VERSION(2, 27, 0), 1, INT_MAX),
    CONFIG_INT(nChannelsPerNetPeer, NCCL_VERSION(2, 28, 0), 1, NVIDIA_MAXCHANNELS),
    CONFIG_INT(nvlinkCentricSched, NCCL_VERSION(2, 28, 0), 0, 1),
    CONFIG_INT(graphUsageMode, NCCL_VERSION(2, 29, 0), 0, 2),
    CONFIG_INT(numRmaCtx, NCCL_VERSION(2, 29, 0), 0, INT_MAX),
    CONFIG_INT(maxP2pPeers, NCCL_VERSION(2, 30, 0), 1, INT_MAX),
    CONFIG_INT(graphStreamOrdering, NCCL_VERSION(2, 30, 5), 0, 1),
};

static ncclResult_t config_bad_int(const char *func, const struct config_field *f, int v) {
  if (f->hi == INT_MAX)
    return err_set(ncclInvalidArgument, "%s: config.%s is %d; it must be at least %d", func, f->name, v, f->lo);
  if (f->hi == f->lo + 1)
    return err_set(ncclInvalidArgument, "%s: config.%s is %d; it must be %d or %d", func, f->name, v, f->lo,
                   f->hi);
  return err_set(ncclInvalidArgument, "%s: config.%s is %d; it must be from %d to %d", func, f->name, v, f->lo,
                 f->hi);
}

/* Any plugin's name goes to the net layer, which knows the plugins; only
 * what no plugin could be called is refused here. NVIDIA refuses an empty
 * name too (no plugin matches it), later, at init. */
static ncclResult_t config_net_name(const char *func, const char *name) {
  size_t len = strnlen(name, CONFIG_NAME_MAX);
  if (len == 0)
    return err_set(ncclInvalidArgument,
                   "%s: config.netName is an empty string, which names no network plugin; leave it NULL for the "
                   "default plugin",
                   func);
  if (len == CONFIG_NAME_MAX)
    return err_set(ncclInvalidArgument,
                   "%s: config.netName is %d bytes or longer, so it names no network plugin (is it a string?)", func,
                   CONFIG_NAME_MAX);
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
      return err_set(ncclInvalidArgument,
                     "%s: config.netName holds control character 0x%02x at byte %zu, so it names no network plugin",
                     func, (unsigned char)name[i], i);
  ncclResult_t r = net_config_name(name);
  if (r != ncclSuccess)
    err_context("%s", func);
  return r;
}

/* Reads a caller's config into `out` (NULL: the defaults); fields left
 * unset stay NCCL_CONFIG_UNDEF_*, for comm_init to choose. `func` is the
 * API call, for the sentences. */
ncclResult_t comm_read_config(const ncclConfig_t *in, ncclConfig_t *out, const char *func) {
  ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  *out = def;
  if (in == NULL)
    return ncclSuccess;
  /* The size first: below the magic, nothing else of the caller's may be
   * read (NVIDIA then finds no magic and refuses too). */
  size_t size = in->size;
  const size_t head = offsetof(ncclConfig_t, magic) + sizeof in->magic;
  if (size < head)
    return err_set(ncclInvalidArgument,
                   "%s: config.size %zu is too small to hold the config's magic number (%zu bytes), so it cannot "
                   "come from NCCL_CONFIG_INITIALIZER",
                   func, size, head);
  if (in->magic != CONFIG_MAGIC)
    return err_set(ncclInvalidArgument,
                   "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x instead of 0x%x)", func,
                   in->magic, CONFIG_MAGIC);
  unsigned version = size >= offsetof(ncclConfig_t, version) + sizeof in->version ? in->version : 0;
  if (size > sizeof *out)
    INFO(LOG_INIT | LOG_ENV,
         "%s: config.size %zu (version %u) is larger than this library's %zu: the fields of a newer NCCL header "
         "are ignored",
         func, size, version, sizeof *out);
  for (size_t i = 0; i < sizeof config_fields / sizeof config_fields[0]; i++) {
    const struct config_field *f = &config_fields[i];
    if (f->offset + f->size <= size && version >= f->since)
      memcpy((char *)out + f->offset, (const char *)in + f->offset, f->size);
  }
  for (size_t i = 0; i < sizeof config_fields / sizeof config_fields[0]; i++) {
    const struct config_field *f = &config_fields[i];
    int v;
    if (f->is_ptr)
      continue;
    memcpy(&v, (const char *)out + f->offset, sizeof v);
    if (v != NCCL_CONFIG_UNDEF_INT && (v < f->lo || v > f->hi))
      return config_bad_int(func, f, v);
  }
  /* NVIDIA compares the two even when maxCTAs is unset (INT_MIN), which
   * refuses any minCTAs alone; Loom takes minCTAs alone, as before. */
  if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      out->minCTAs > out->maxCTAs)
    return err_set(ncclInvalidArgument, "%s: config.minCTAs (%d) is larger than config.maxCTAs (%d)", func,
                   out->minCTAs, out->maxCTAs);
  if (out->netName != NULL)
    CHECK(config_net_name(func, out->netName));

  /* What NVIDIA takes but adjusts, adjusted alike, with its log line. */
  if (out->minCTAs > LOOM_MAX_CHANNELS) {
    INFO(LOG_INIT | LOG_ENV, "%s: config.minCTAs %d is more than Loom's %d channels; capped to %d", func,
         out->minCTAs, LOOM_MAX_CHANNELS, LOOM_MAX_CHANNELS);
    out->minCTAs = LOOM_MAX_CHANNELS;
  }
  if (out->maxCTAs > LOOM_MAX_CHANNELS) {
    INFO(LOG_INIT | LOG_ENV, "%s: config.maxCTAs %d is more than Loom's %d channels; capped to %d", func,
         out->maxCTAs, LOOM_MAX_CHANNELS, LOOM_MAX_CHANNELS);
    out->maxCTAs = LOOM_MAX_CHANNELS;
  }
  if (out->collnetEnable == 1)
    INFO(LOG_INIT | LOG_ENV, "%s: config.collnetEnable 1 is ignored: Loom has no CollNet (NCCL falls back alike)",
         func);
  if (out->CTAPolicy != NCCL_CONFIG_UNDEF_INT && (out->CTAPolicy & NCCL_CTA_POLICY_ZERO) &&
      (out->CTAPolicy & NCCL_CTA_POLICY_EFFICIENCY)) {
    WARN("%s: config.CTAPolicy %d sets both NCCL_CTA_POLICY_ZERO and NCCL_CTA_POLICY_EFFICIENCY; "
         "NCCL_CTA_POLICY_EFFICIENCY is dropped, as NCCL does",
         func, out->CTAPolicy);
    out->CTAPolicy &= ~NCCL_CTA_POLICY_EFFICIENCY;
  }
  /* graphUsageMode's default is 2 (graph mixing). */
  if (out->graphStreamOrdering == 0 && (out->graphUsageMode == 2 || out->graphUsageMode == NCCL_CONFIG_UNDEF_INT)) {
    WARN("%s: config.graphStreamOrdering 0 with graph mixing (config.graphUsageMode 2, the default) is not "
         "supported; using 1, as NCCL does",
         func);
    out->graphStreamOrdering = 1;
  }
  return ncclSuccess;
}
