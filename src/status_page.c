/*
 * Reading status pages and turning a record into its one-line report.
 * The formatter is used from a signal handler, so it builds the line by
 * hand (no printf, no allocation).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "common/coll.h"
#include "common/dtype.h"
#include "status.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Opens /proc/<pid>/fd/N for the fd whose link names our memfd. */
static int open_page_fd(int pid) {
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int fd = -1;
  struct dirent *e;
  while (fd < 0 && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[320], link[128];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
      continue;
    link[n] = '\0';
    if (strncmp(link, "/memfd:" STATUS_MEMFD_NAME " ", sizeof("/memfd:" STATUS_MEMFD_NAME)) == 0)
      fd = open(path, O_RDONLY | O_CLOEXEC);
  }
  closedir(d);
  return fd;
}

const struct status_page *status_page_map(int pid) {
  int fd = open_page_fd(pid);
  if (fd < 0)
    return NULL;
  void *p = mmap(NULL, sizeof(struct status_page), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return NULL;
  const struct status_page *pg = p;
  if (pg->magic != STATUS_MAGIC || pg->nrecs != STATUS_RECS) {
    munmap(p, sizeof(struct status_page));
    return NULL;
  }
  return pg;
}

void status_page_unmap(const struct status_page *p) {
  if (p)
    munmap((void *)p, sizeof *p);
}

int status_rec_read(const struct status_rec *src, struct status_rec *out) {
  for (int tries = 0; tries < 100; tries++) {
    uint32_t g = atomic_load_explicit(&src->gen, memory_order_acquire);
    if (g & 1)
      continue;
    memcpy(out, (const void *)src, sizeof *out);
    atomic_thread_fence(memory_order_acquire);
    /* Another process's page is input like any other: its strings are
     * cut to their fields before anyone prints them. */
    out->wait[sizeof out->wait - 1] = '\0';
    out->name[sizeof out->name - 1] = '\0';
    if (atomic_load_explicit(&src->gen, memory_order_relaxed) == g)
      return out->state != STATUS_FREE;
  }
  return 0;
}

char status_proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  /* "pid (comm) S ...": the name may hold spaces and parentheses. */
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

/* ---- a line built by hand ---- */

struct line {
  char *buf;
  size_t len, cap;
};

static void put(struct line *l, const char *s) {
  while (*s && l->len + 1 < l->cap)
    l->buf[l->len++] = *s++;
  l->buf[l->len] = '\0';
}

static void put_u(struct line *l, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  char out[24];
  for (int i = 0; i < n; i++)
    out[i] = tmp[n - 1 - i];
  out[n] = '\0';
  put(l, out);
}

static void put_i(struct line *l, int64_t v) {
  if (v < 0) {
    put(l, "-");
    put_u(l, (uint64_t)(-v));
  } else {
    put_u(l, (uint64_t)v);
  }
}

static void put_hex(struct line *l, uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char out[17];
  for (int i = 15; i >= 0; i--, v >>= 4)
    out[i] = digits[v & 15];
  out[16] = '\0';
  put(l, out);
}

/* Seconds with one decimal. */
static void put_secs(struct line *l, uint64_t ns) {
  uint64_t tenths = ns / 100000000ull;
  put_u(l, tenths / 10);
  put(l, ".");
  put_u(l, tenths % 10);
  put(l, " s");
}

static void put_op(struct line *l, const struct status_op *o) {
  if (o->coll < 0) {
    put(l, "no operation");
    return;
  }
  put(l, coll_name(o->coll));
  if (o->seq != ~0ull) {
    put(l, " #");
    put_u(l, o->seq);
  }
  put(l, " (count ");
  put_u(l, o->count);
  put(l, ", ");
  put(l, dtype_name(o->dtype));
  if (o->coll == COLL_REDUCE || o->coll == COLL_ALLREDUCE || o->coll == COLL_REDUCESCATTER) {
    put(l, ", ");
    put(l, red_op_name(o->op));
  }
  if (o->coll == COLL_REDUCE || o->coll == COLL_BROADCAST) {
    put(l, ", root ");
    put_i(l, o->root);
  }
  if (o->coll == COLL_SEND || o->coll == COLL_RECV) {
    put(l, o->coll == COLL_SEND ? ", to rank " : ", from rank ");
    put_i(l, o->peer);
  }
  put(l, ")");
  if (o->ntasks > 1) {
    put(l, " and ");
    put_i(l, o->ntasks - 1);
    put(l, " more in its group");
  }
}

size_t status_format_op(const struct status_op *o, char *buf, size_t len) {
  struct line l = {.buf = buf, .len = 0, .cap = len};
  if (len == 0)
    return 0;
  buf[0] = '\0';
  put_op(&l, o);
  return l.len;
}

size_t status_format(int pid, const char *host, const struct status_rec *r, uint64_t now_ns, char *buf, size_t len) {
  struct line l = {.buf = buf, .len = 0, .cap = len};
  if (len == 0)
    return 0;
  buf[0] = '\0';
  put(&l, "loom-status: rank ");
  put_i(&l, r->rank);
  put(&l, "/");
  put_i(&l, r->nranks);
  put(&l, " pid ");
  put_i(&l, pid);
  put(&l, " on ");
  put(&l, host);
  put(&l, ", comm ");
  put_hex(&l, r->comm_hash);
  if (r->name[0]) {
    put(&l, " \"");
    put(&l, r->name);
    put(&l, "\"");
  }
  if (r->cuda_dev >= 0) {
    put(&l, ", GPU ");
    put_i(&l, r->cuda_dev);
  }
  put(&l, ": ");
  uint64_t since = now_ns > r->since_ns ? now_ns - r->since_ns : 0;
  switch (r->state) {
  case STATUS_RUNNING:
    put(&l, "in ");
    put_op(&l, &r->cur);
    put(&l, " for ");
    put_secs(&l, since);
    if (r->wait_peer >= 0) {
      put(&l, ", waiting ");
      put_secs(&l, now_ns > r->wait_since_ns ? now_ns - r->wait_since_ns : 0);
      put(&l, " for ");
      put(&l, r->wait);
    }
    break;
  case STATUS_FAILED:
    put(&l, "failed ");
    put_secs(&l, since);
    put(&l, " ago in ");
    put_op(&l, &r->cur);
    put(&l, " (");
    put(&l, err_string((ncclResult_t)r->cur.result));
    put(&l, ")");
    break;
  default:
    put(&l, r->cuda_dev >= 0 && r->ops > 0 ? "no host thread inside Loom for " : "not in an operation for ");
    put_secs(&l, since);
    break;
  }
  if (r->state == STATUS_IDLE) {
    put(&l, r->cuda_dev >= 0 ? "; last enqueued " : "; last done ");
    put_op(&l, &r->cur);
  }
  put(&l, "; ");
  put_u(&l, r->ops);
  put(&l, r->ops == 1 ? " operation" : " operations");
  return l.len;
}

int status_why(char proc_state, const struct status_rec *r, uint64_t now_ns, char *buf, size_t len) {
  char op[200] = "";
  if (r)
    status_format_op(&r->cur, op, sizeof op);
  if (proc_state == 0) {
    snprintf(buf, len, "has exited");
  } else if (proc_state == 'T' || proc_state == 't') {
    snprintf(buf, len, "is stopped (a signal such as SIGSTOP, or a debugger)%s%s",
             r && r->state == STATUS_RUNNING ? ", in " : "", r && r->state == STATUS_RUNNING ? op : "");
  } else if (!r) {
    snprintf(buf, len, "shows no status for this communicator");
  } else if (r->state == STATUS_IDLE) {
    snprintf(buf, len, "has not called it: it has been outside Loom for %.1f s, after %s",
             (double)(now_ns > r->since_ns ? now_ns - r->since_ns : 0) / 1e9, op);
  } else if (r->state == STATUS_FAILED) {
    snprintf(buf, len, "failed in %s", op);
  } else if (r->wait_peer < 0) {
    snprintf(buf, len, "is in %s and waits on nobody (busy, or it just moved)", op);
  } else {
    return 0;
  }
  return 1;
}
