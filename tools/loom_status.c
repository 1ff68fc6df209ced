/*
 * loom-info --status: what every Loom communicator on this host is doing,
 * read from the processes' status pages (src/status.h), so it works on a
 * rank that is stopped or stuck as well as on a busy one. One line per
 * communicator rank, then, per communicator, the rank the waiting ones
 * wait on (following who waits for whom), which is the one to look at.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "loom_status.h"

#include "misc/utils.h"
#include "status.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct seen_rec {
  struct status_rec r;
  int pid;
  char proc_state;
  char host[64];
};

static int by_comm_rank(const void *a, const void *b) {
  const struct seen_rec *x = a, *y = b;
  if (x->r.comm_hash != y->r.comm_hash)
    return x->r.comm_hash < y->r.comm_hash ? -1 : 1;
  return x->r.rank - y->r.rank;
}

static int collect(int pid, struct seen_rec **recs, int *n, int *cap) {
  const struct status_page *pg = status_page_map(pid);
  if (!pg)
    return 0;
  char st = status_proc_state(pid);
  for (int i = 0; i < STATUS_RECS; i++) {
    struct status_rec r;
    if (!status_rec_read(&pg->rec[i], &r) || r.nranks <= 0 || r.rank < 0 || r.rank >= r.nranks)
      continue;
    if (*n == *cap) {
      *cap = *cap ? 2 * *cap : 16;
      struct seen_rec *m = realloc(*recs, sizeof **recs * (size_t)*cap);
      if (!m)
        break;
      *recs = m;
    }
    struct seen_rec *s = &(*recs)[(*n)++];
    s->r = r;
    s->pid = pid;
    s->proc_state = st;
    snprintf(s->host, sizeof s->host, "%.*s", (int)sizeof pg->host - 1, pg->host);
  }
  status_page_unmap(pg);
  return 1;
}

static const struct seen_rec *find(const struct seen_rec *g, int ng, int rank) {
  for (int i = 0; i < ng; i++)
    if (g[i].r.rank == rank)
      return &g[i];
  return NULL;
}

static int stopped(const struct seen_rec *s) { return s->proc_state == 'T' || s->proc_state == 't'; }

/* Says why rank `t` (the end of a wait chain) does not move. */
static void describe_end(const struct seen_rec *s, int rank, int cycle, uint64_t now, char *buf, size_t len) {
  char why[400];
  if (cycle)
    snprintf(buf, len, "the ranks wait on each other in a cycle through rank %d (calls in a different order?)", rank);
  else if (!s)
    snprintf(buf, len, "rank %d, which is not on this host or has exited: run loom-info --status where it runs",
             rank);
  else if (status_why(s->proc_state, &s->r, now, why, sizeof why))
    snprintf(buf, len, "rank %d (pid %d), which %s", rank, s->pid, why);
  else
    snprintf(buf, len, "rank %d (pid %d), which waits on rank %d", rank, s->pid, s->r.wait_peer);
}

/* For one communicator's records (sorted by rank): who the waiting ones
 * wait on in the end. */
static void verdict(const struct seen_rec *g, int ng, uint64_t now) {
  int nr = g[0].r.nranks;
  char *on_chain = calloc((size_t)nr, 1);
  int *end_of = malloc(sizeof(int) * (size_t)nr);
  int *cyc = calloc((size_t)nr, sizeof(int));
  if (!on_chain || !end_of || !cyc)
    goto out;
  for (int i = 0; i < nr; i++)
    end_of[i] = -1;
  int any = 0;
  for (int i = 0; i < ng; i++) {
    const struct seen_rec *s = &g[i];
    if (s->r.state != STATUS_RUNNING || s->r.wait_peer < 0 || stopped(s))
      continue;
    memset(on_chain, 0, (size_t)nr);
    int at = s->r.rank, cycle = 0;
    for (;;) {
      on_chain[at] = 1;
      const struct seen_rec *x = find(g, ng, at);
      if (!x || stopped(x) || x->r.state != STATUS_RUNNING || x->r.wait_peer < 0 || x->r.wait_peer >= nr)
        break;
      if (on_chain[x->r.wait_peer]) {
        cycle = 1;
        break;
      }
      at = x->r.wait_peer;
    }
    if (at == s->r.rank && !cycle)
      continue;
    end_of[s->r.rank] = at;
    cyc[s->r.rank] = cycle;
    any = 1;
  }
  if (!any)
    goto out;
  for (int t = 0; t < nr; t++) {
    char who[512] = "";
    int c = 0, cycle = 0;
    for (int i = 0; i < nr; i++)
      if (end_of[i] == t) {
        size_t n = strlen(who);
        snprintf(who + n, sizeof who - n, "%s%d", c ? ", " : "", i);
        c++;
        cycle |= cyc[i];
      }
    if (!c)
      continue;
    char why[600];
    describe_end(find(g, ng, t), t, cycle, now, why, sizeof why);
    printf("loom-status: comm %016llx: rank%s %s wait%s, directly or through others, on %s\n",
           (unsigned long long)g[0].r.comm_hash, c > 1 ? "s" : "", who, c > 1 ? "" : "s", why);
  }
out:
  free(on_chain);
  free(end_of);
  free(cyc);
}

int loom_status_main(int npids, const int *pids) {
  struct seen_rec *recs = NULL;
  int n = 0, cap = 0, procs = 0;
  uint64_t now = time_ns();
  if (npids > 0) {
    for (int i = 0; i < npids; i++)
      procs += collect(pids[i], &recs, &n, &cap);
  } else {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
      if (isdigit((unsigned char)e->d_name[0]))
        procs += collect(atoi(e->d_name), &recs, &n, &cap);
    if (d)
      closedir(d);
  }
  if (n == 0) {
    printf("loom-status: no Loom communicator in %s\n", npids > 0 ? "these processes" : "any process on this host");
    free(recs);
    return 1;
  }
  qsort(recs, (size_t)n, sizeof *recs, by_comm_rank);
  for (int i = 0; i < n; i++) {
    char line[1024];
    status_format(recs[i].pid, recs[i].host, &recs[i].r, now, line, sizeof line);
    printf("%s%s\n", line, stopped(&recs[i]) ? " [process stopped]" : "");
  }
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && recs[j].r.comm_hash == recs[i].r.comm_hash)
      j++;
    verdict(&recs[i], j - i, now);
    i = j;
  }
  printf("loom-status: %d communicator rank(s) in %d process(es)\n", n, procs);
  free(recs);
  return 0;
}
