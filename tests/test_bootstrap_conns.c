/*
 * The bootstrap keeps its connections: each rank opens and accepts a
 * number of them that grows with log2 of the ranks (ring neighbours, the
 * barrier's and the transports' partners), not one per message, and the
 * root sends each rank a fixed number of bytes.
 *
 * Sixteen ranks do what a job does over the bootstrap (init's
 * all-gathers, connection setup for collectives and for point-to-point
 * with a far rank, a split whose child makes a bootstrap of its own);
 * then the kernel's socket tables are read: every connection made to a
 * bootstrap listener leaves an entry there (established, or TIME-WAIT for
 * 60 s), so they count connections whatever the library says of itself.
 * The ranks' own counts (their closing INFO lines) must agree.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conn_count.h"
#include "harness.h"
#include "loom.h"
#include "test.h"

enum { NR = 16, LOG2_NR = 4 };

/* Connections one rank may open, and accept, in a job of n ranks: the ring
 * (1), the barrier (log2 n), the transports' trees and recursive doubling
 * (log2 n + 3), a point-to-point partner (1), and a few made when two
 * ranks reach for each other at once. Per message it would be hundreds. */
#define BOUND(log2n) (3 * (log2n) + 6)

static int job_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm, child;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { COUNT = 1024 };
  static float a[COUNT], b[COUNT * NR];
  for (int i = 0; i < COUNT; i++)
    a[i] = (float)(rank + i);
  RCHECK(comm, ncclAllReduce(a, a, COUNT, ncclFloat, ncclSum, comm, NULL));
  float want = (float)(n * (n - 1) / 2);
  RASSERT(a[0] == want, "rank %d: AllReduce gave %g, expected %g", rank, a[0], want);
  RCHECK(comm, ncclAllGather(a, b, COUNT, ncclFloat, comm, NULL));
  /* Point to point with the rank half way round: a peer of no algorithm. */
  int far = (rank + n / 2) % n;
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclSend(a, COUNT, ncclFloat, far, comm, NULL));
  RCHECK(comm, ncclRecv(b, COUNT, ncclFloat, far, comm, NULL));
  RCHECK(comm, ncclGroupEnd());
  RASSERT(b[0] == a[0], "rank %d: received %g from rank %d, expected %g", rank, b[0], far, a[0]);
  RCHECK(comm, ncclCommSplit(comm, rank % 2, rank, &child, NULL));
  float x = 1;
  RCHECK(child, ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, child, NULL));
  RASSERT(x == (float)(n / 2), "rank %d: the split's AllReduce gave %g", rank, x);
  RCHECK(child, ncclCommDestroy(child));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* ---- reading what the ranks logged ---- */

#define MAX_PORTS 256

struct listener {
  unsigned port;
  int root;   /* a root's, else a rank's */
  int nranks; /* of the root's job */
  unsigned conns;
};

static struct listener ls[MAX_PORTS];
static int nls;

static unsigned addr_port(const char *a) {
  const char *c = strrchr(a, ':');
  return c ? (unsigned)strtoul(c + 1, NULL, 10) : 0;
}

static struct listener *find(unsigned port) {
  for (int i = 0; i < nls; i++)
    if (ls[i].port == port)
      return &ls[i];
  return NULL;
}

static void add_listener(unsigned port, int root) {
  if (port && !find(port) && nls < MAX_PORTS)
    ls[nls++] = (struct listener){.port = port, .root = root};
}

struct counts {
  int closes, opened_max, accepted_max, roots;
  long long root_sent_max_per_rank;
};

static void read_line(const char *line, struct counts *c) {
  const char *p;
  char a[128];
  int r, o, acc, n;
  long long sent;
  if ((p = strstr(line, "bootstrap: rank ")) && sscanf(p, "bootstrap: rank %d listens on %127s", &r, a) == 2)
    add_listener(addr_port(a), 0);
  if ((p = strstr(line, "bootstrap root listening on ")) && sscanf(p, "bootstrap root listening on %127s", a) == 1)
    add_listener(addr_port(a), 1);
  if ((p = strstr(line, "bootstrap: rank ")) &&
      sscanf(p, "bootstrap: rank %d closes: %d connection(s) opened, %d accepted", &r, &o, &acc) == 3) {
    c->closes++;
    c->opened_max = o > c->opened_max ? o : c->opened_max;
    c->accepted_max = acc > c->accepted_max ? acc : c->accepted_max;
  }
  if (strstr(line, "bootstrap root at ") && (p = strstr(line, ": all ")) &&
      sscanf(p, ": all %d ranks joined; it sent %lld bytes", &n, &sent) == 2) {
    c->roots++;
    if (n > 0 && sent / n > c->root_sent_max_per_rank)
      c->root_sent_max_per_rank = sent / n;
  }
}

static void read_logs(const char *dir, struct counts *c) {
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    while (fgets(line, sizeof line, f))
      read_line(line, c);
    fclose(f);
  }
  closedir(d);
}

/* ---- the kernel's count ---- */

static void count_conns(void) {
  unsigned ports[MAX_PORTS], conns[MAX_PORTS] = {0};
  for (int i = 0; i < nls; i++)
    ports[i] = ls[i].port;
  conn_count_tally(ports, nls, conns);
  for (int i = 0; i < nls; i++)
    ls[i].conns = conns[i];
}

TEST_IMPL(bootstrap_conns_bounded) {
  setenv("LOOM_TIMEOUT", "60", 1);
  char dir[] = "/tmp/loom-conns-XXXXXX", path[128];
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/rank.%%p.log", dir);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
  setenv("NCCL_DEBUG_FILE", path, 1);
  conn_count_snapshot();
  ASSERT_MSG(run_ranks(NR, job_rank, NULL) == 0, "a rank failed");
  struct counts c = {0};
  read_logs(dir, &c);
  count_conns();
  int rank_listeners = 0, roots = 0;
  unsigned busiest = 0, total = 0;
  for (int i = 0; i < nls; i++) {
    if (ls[i].root) {
      roots++;
      continue;
    }
    rank_listeners++;
    total += ls[i].conns;
    busiest = ls[i].conns > busiest ? ls[i].conns : busiest;
  }
  printf("%d rank listeners (the job's and its split's), %d roots: %u connections to rank listeners in all, %.1f per "
         "rank, %u to the busiest; each rank opened at most %d and accepted at most %d; the roots sent at most %lld "
         "bytes per rank\n",
         rank_listeners, roots, total, rank_listeners ? (double)total / rank_listeners : 0.0, busiest, c.opened_max,
         c.accepted_max, c.root_sent_max_per_rank);
  ASSERT_MSG(rank_listeners == 2 * NR, "found %d rank listeners in the logs, expected %d (the job and its split)",
             rank_listeners, 2 * NR);
  ASSERT_MSG(busiest <= BOUND(LOG2_NR),
             "the busiest rank listener took %u connections (%u in all for %d listeners); with connections kept open, "
             "%d ranks need at most %d", busiest, total, rank_listeners, NR, BOUND(LOG2_NR));
  ASSERT_MSG(c.closes == 2 * NR, "%d ranks logged their closing counts, expected %d", c.closes, 2 * NR);
  ASSERT_MSG(c.opened_max <= BOUND(LOG2_NR) && c.accepted_max <= BOUND(LOG2_NR),
             "a rank opened %d and one accepted %d bootstrap connections; at most %d expected", c.opened_max,
             c.accepted_max, BOUND(LOG2_NR));
  /* The root tells each rank one address: a fixed number of bytes. */
  ASSERT_MSG(c.roots == 3, "%d roots logged what they sent, expected 3 (the job's and two for the split)", c.roots);
  ASSERT_MSG(c.root_sent_max_per_rank > 0 && c.root_sent_max_per_rank <= 256,
             "a root sent %lld bytes per rank; at most 256 expected, whatever the number of ranks",
             c.root_sent_max_per_rank);
  harness_remove_dir(dir);
  return 0;
}
