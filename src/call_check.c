/*
 * The call agreement check: what each rank describes, and the sentence
 * that says which ranks called what when the descriptions differ.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "call_check.h"

#include "comm/comm.h"
#include "common/coll.h"
#include "misc/param.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define CALL_CHECK_MAGIC 0x4b43434cu /* "LCCK" */

/* Communicators start on several threads at once (groups,
 * ncclCommInitAll): the cached answer is computed whole, then published. */
int call_check_enabled(void) {
  static _Atomic int enabled = -1;
  int e = atomic_load_explicit(&enabled, memory_order_relaxed);
  if (e < 0) {
    e = (int)param_int(P_CHECK_CALLS);
#ifdef NDEBUG
    e = e == 1;
#else
    e = e != 0;
#endif
    atomic_store_explicit(&enabled, e, memory_order_relaxed);
  }
  return e;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

static void item_of(const struct task *t, struct call_item *it) {
  memset(it, 0, sizeof *it);
  it->count = t->count;
  it->root = t->root;
  it->coll = (uint8_t)t->coll;
  it->dtype = (uint8_t)t->dtype;
  /* Operators made by ncclRedOpCreatePreMulSum have per-rank handles and
   * scalars: only their being one must agree. Loom's bitwise operators
   * have codes of their own. */
  it->op = (uint8_t)red_op_code(t->op);
}

static int is_coll(const struct task *t) { return t->coll != COLL_SEND && t->coll != COLL_RECV; }

uint32_t call_check_describe(const struct task *tasks, uint64_t seq, int rank, struct call_desc *d) {
  memset(d, 0, sizeof *d);
  d->magic = CALL_CHECK_MAGIC;
  d->seq = seq;
  d->rank = (uint32_t)rank;
  uint64_t h = 14695981039346656037ull;
  for (const struct task *t = tasks; t; t = t->next) {
    if (!is_coll(t))
      continue;
    struct call_item it;
    item_of(t, &it);
    if (d->ncolls < CALL_CHECK_ITEMS)
      d->item[d->ncolls] = it;
    h = mix(mix(mix(h, it.count), (uint64_t)(uint32_t)it.root), (uint64_t)it.coll | (uint64_t)it.dtype << 8 | (uint64_t)it.op << 16);
    d->ncolls++;
  }
  d->hash = h;
  return d->ncolls;
}

/* Equal as calls: everything but who sent it. */
static int same_call(const struct call_desc *a, const struct call_desc *b) {
  return a->ncolls == b->ncolls && a->seq == b->seq && a->hash == b->hash &&
         memcmp(a->item, b->item, sizeof a->item) == 0;
}

static void item_describe(const struct call_item *it, char *buf, size_t len) {
  struct task t = {.coll = it->coll, .count = it->count, .dtype = it->dtype, .op = red_code_op(it->op), .root = it->root, .peer = -1};
  task_describe(&t, buf, len);
}

/* Appenders that stop at the end of `buf`: a string, and a number. */
static size_t put(char *buf, size_t len, size_t at, const char *s) {
  int n = at < len ? snprintf(buf + at, len - at, "%s", s) : 0;
  return at + (size_t)(n > 0 ? n : 0);
}

static size_t put_n(char *buf, size_t len, size_t at, unsigned long long v) {
  int n = at < len ? snprintf(buf + at, len - at, "%llu", v) : 0;
  return at + (size_t)(n > 0 ? n : 0);
}

static size_t call_describe(const struct call_desc *d, int with_seq, char *buf, size_t len, size_t at) {
  char one[160];
  if (d->ncolls > 1)
    at = put(buf, len, put_n(buf, len, put(buf, len, at, "a group of "), d->ncolls), " collectives: ");
  for (uint32_t i = 0; i < d->ncolls && i < CALL_CHECK_ITEMS; i++) {
    item_describe(&d->item[i], one, sizeof one);
    at = put(buf, len, i ? put(buf, len, at, ", ") : at, one);
  }
  if (d->ncolls > CALL_CHECK_ITEMS)
    at = put(buf, len, at, ", ...");
  if (with_seq)
    at = put_n(buf, len, put(buf, len, at, " as its collective #"), d->seq);
  return at;
}

void call_check_what(const struct ncclComm *comm, char *buf, size_t len) {
  size_t at = 0;
  if (len > 0)
    buf[0] = '\0';
  if (comm->check_buf) {
    at = call_describe(&comm->check_buf[0], 0, buf, len, 0);
    put_n(buf, len, put(buf, len, at, " #"), comm->check_buf[0].seq);
  }
}

/* "rank 3" or "ranks 0-2, 5": the ranks whose call is class `k`. */
static size_t ranks_describe(const int *class_of, int nranks, int k, char *buf, size_t len, size_t at) {
  int n = 0;
  for (int r = 0; r < nranks; r++)
    n += class_of[r] == k;
  at = put(buf, len, at, n == 1 ? "rank " : "ranks ");
  int first = 1;
  for (int r = 0; r < nranks; r++) {
    if (class_of[r] != k)
      continue;
    int e = r;
    while (e + 1 < nranks && class_of[e + 1] == k)
      e++;
    at = put_n(buf, len, first ? at : put(buf, len, at, ", "), (unsigned)r);
    if (e > r)
      at = put_n(buf, len, put(buf, len, at, e == r + 1 ? ", " : "-"), (unsigned)e);
    first = 0;
    r = e;
  }
  return at;
}

/* What makes two calls differ, as the user named the arguments. */
static size_t difference(const struct call_desc *a, const struct call_desc *b, char *buf, size_t len, size_t at) {
  const char *what[8];
  int n = 0;
  if (a->seq != b->seq)
    what[n++] = "the number of collectives called before (a rank skipped one or called one more)";
  if (a->ncolls != b->ncolls)
    what[n++] = "the number of collectives in the group";
  for (int i = 0; n == 0 && i < CALL_CHECK_ITEMS && i < (int)a->ncolls; i++) {
    const struct call_item *x = &a->item[i], *y = &b->item[i];
    if (x->coll != y->coll)
      what[n++] = "the collective";
    if (x->coll == y->coll && x->count != y->count)
      what[n++] = "the count";
    if (x->coll == y->coll && x->dtype != y->dtype)
      what[n++] = "the datatype";
    if (x->coll == y->coll && x->op != y->op)
      what[n++] = "the reduction op";
    if (x->coll == y->coll && x->root != y->root)
      what[n++] = "the root";
  }
  if (n == 0)
    what[n++] = "a collective after the second of the group";
  for (int i = 0; i < n; i++)
    at = put(buf, len, i == 0 ? at : put(buf, len, at, i == n - 1 ? " and " : ", "), what[i]);
  return at;
}

ncclResult_t call_check_compare(const struct ncclComm *comm, const struct call_desc *all) {
  int nranks = comm->nranks, nclass = 0;
  int class_of[nranks], rep[nranks];
  for (int r = 0; r < nranks; r++) {
    if (all[r].magic != CALL_CHECK_MAGIC || all[r].rank != (uint32_t)r)
      return err_set(ncclInternalError,
                     "rank %d: the call check received a malformed description from rank %d", comm->rank, r);
    int k = 0;
    while (k < nclass && !same_call(&all[rep[k]], &all[r]))
      k++;
    if (k == nclass)
      rep[nclass++] = r;
    class_of[r] = k;
  }
  if (nclass == 1)
    return ncclSuccess;
  int with_seq = 0;
  for (int k = 1; k < nclass; k++)
    with_seq |= all[rep[k]].seq != all[rep[0]].seq;
  char msg[LOOM_ERR_LEN - 64];
  size_t at = put_n(msg, sizeof msg, put(msg, sizeof msg, 0, "rank "), (unsigned)comm->rank);
  at = put(msg, sizeof msg, at, ": the ranks' calls on this communicator differ in ");
  at = difference(&all[rep[0]], &all[rep[1]], msg, sizeof msg, at);
  at = put(msg, sizeof msg, at, ", so no rank ran it (LOOM_CHECK_CALLS): ");
  for (int k = 0; k < nclass && k < 4; k++) {
    if (k)
      at = put(msg, sizeof msg, at, "; ");
    at = ranks_describe(class_of, nranks, k, msg, sizeof msg, at);
    at = put(msg, sizeof msg, at, " called ");
    at = call_describe(&all[rep[k]], with_seq, msg, sizeof msg, at);
  }
  if (nclass > 4)
    put(msg, sizeof msg, put_n(msg, sizeof msg, put(msg, sizeof msg, at, "; and "), (unsigned)(nclass - 4)), " other calls");
  return err_set(ncclInvalidUsage, "%s", msg);
}
