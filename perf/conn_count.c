/* SPDX-License-Identifier: Apache-2.0 */
#include "conn_count.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A connection to listener port L shows as (local L, remote e) on the
 * accepting side and (local e, remote L) on the connecting side, either
 * or both still in the table: (L, e) is counted once. */
struct pair {
  unsigned l, e;
};

static struct pair *before;
static size_t nbefore;

static void push(struct pair **a, size_t *n, size_t *cap, struct pair p) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 4096;
    *a = realloc(*a, *cap * sizeof **a);
    if (!*a) {
      fprintf(stderr, "conn_count: out of memory\n");
      exit(1);
    }
  }
  (*a)[(*n)++] = p;
}

/* The ports of one table line; 0 for the header, a listening socket or
 * anything unreadable. */
static int tcp_entry(const char *line, unsigned *lp, unsigned *rp) {
  char local[128], remote[128];
  if (sscanf(line, "%*s %127s %127s", local, remote) != 2 || !strchr(local, ':') || !strchr(remote, ':'))
    return 0;
  *lp = (unsigned)strtoul(strrchr(local, ':') + 1, NULL, 16);
  *rp = (unsigned)strtoul(strrchr(remote, ':') + 1, NULL, 16);
  return *rp != 0;
}

static int cmp_pair(const void *a, const void *b) {
  const struct pair *x = a, *y = b;
  return x->l != y->l ? (x->l < y->l ? -1 : 1) : (x->e < y->e ? -1 : x->e > y->e);
}

/* Calls fn on every (local, remote) entry of both tables. */
static void each_entry(void (*fn)(unsigned lp, unsigned rp, void *arg), void *arg) {
  static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int t = 0; t < 2; t++) {
    FILE *f = fopen(tables[t], "r");
    char line[512];
    unsigned lp, rp;
    while (f && fgets(line, sizeof line, f))
      if (tcp_entry(line, &lp, &rp))
        fn(lp, rp, arg);
    if (f)
      fclose(f);
  }
}

static size_t cap_before;

static void remember(unsigned lp, unsigned rp, void *unused) {
  (void)unused;
  push(&before, &nbefore, &cap_before, (struct pair){lp, rp});
}

void conn_count_snapshot(void) {
  nbefore = 0;
  each_entry(remember, NULL);
  qsort(before, nbefore, sizeof *before, cmp_pair);
}

struct tally {
  const unsigned *ports;
  int n;
  unsigned *conns;
  struct pair *seen;
  size_t nseen, cap;
};

static int port_index(const struct tally *t, unsigned port) {
  for (int i = 0; i < t->n; i++)
    if (t->ports[i] == port)
      return i;
  return -1;
}

static void count(unsigned lp, unsigned rp, void *arg) {
  struct tally *t = arg;
  struct pair key = {lp, rp};
  if (bsearch(&key, before, nbefore, sizeof key, cmp_pair))
    return;
  int i = port_index(t, lp);
  struct pair p = {lp, rp};
  if (i < 0) {
    i = port_index(t, rp);
    p = (struct pair){rp, lp};
  }
  if (i < 0)
    return;
  for (size_t k = t->nseen; k-- > 0;)
    if (t->seen[k].l == p.l && t->seen[k].e == p.e)
      return;
  push(&t->seen, &t->nseen, &t->cap, p);
  t->conns[i]++;
}

unsigned long conn_count_tally(const unsigned *ports, int n, unsigned *conns) {
  struct tally t = {.ports = ports, .n = n, .conns = conns};
  each_entry(count, &t);
  free(t.seen);
  return (unsigned long)t.nseen;
}
