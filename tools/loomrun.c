/*
 * loomrun: start N ranks of a program as processes on this host.
 *
 *   loomrun -n N [--timeout S] [--grace S] [--ranks LIST] [--id-out F | --id-in F]
 *           [--bind auto|cpu|none] [-v] [--] program args...
 *
 * For several hosts, each host's loomrun starts its own ranks with --ranks;
 * one of them makes the id and writes it with --id-out, the others read it
 * with --id-in (a shared file, a FIFO fed over ssh, or stdin).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "launch.h"

static const char *prog = "loomrun";

static void usage(FILE *f) {
  fprintf(f,
          "Usage: %s -n N [options] [--] program [args...]\n"
          "Starts N ranks of program as processes; each gets LOOM_RANK, LOOM_NRANKS,\n"
          "LOOM_LOCAL_RANK, LOOM_LOCAL_NRANKS and LOOM_UNIQUE_ID in its environment.\n"
          "\n"
          "  -n, --nranks N     total number of ranks (on all hosts)\n"
          "      --timeout S    stop all ranks after S seconds (exit status 124)\n"
          "      --grace S      seconds between SIGTERM and SIGKILL when stopping (3)\n"
          "  -r, --ranks LIST   start only these ranks here, e.g. 0,1 or 2-3\n"
          "      --id-out FILE  make the unique id and write it to FILE (a file, a FIFO,\n"
          "                     or - for stdout) for the other hosts' loomrun --id-in\n"
          "      --id-in FILE   take the unique id from FILE (- for stdin) instead of\n"
          "                     making one; waits for it up to --timeout (or 60 s)\n"
          "      --bind WHERE   auto (default): as cpu where the ranks outnumber the CPUs\n"
          "                     loomrun may run on, else as none; cpu: rank i here on the\n"
          "                     (i mod k)-th of those k CPUs; none: wherever loomrun may\n"
          "  -v, --verbose      say which pids were started and how each rank ended\n"
          "  -h, --help         this text\n"
          "\n"
          "Exits 0 when every rank exits 0; otherwise the first failing rank's status\n"
          "(128+signal when killed), 124 on timeout, 127 when program cannot run.\n"
          "\n"
          "Unless LOOM_SECRET or LOOM_SECRET_FILE is set, the ranks get a random\n"
          "LOOM_SECRET of their own, which a job started with NCCL_COMM_ID needs so that\n"
          "no stranger can join it. With --ranks on several hosts, set LOOM_SECRET to\n"
          "the same value on each.\n",
          prog);
}

__attribute__((format(printf, 1, 2))) static int bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(see %s --help)\n", prog);
  return 1;
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  enum { OPT_GRACE = 1000, OPT_ID_OUT, OPT_ID_IN, OPT_TIMEOUT, OPT_BIND };
  static const struct option longopts[] = {
      {"nranks", required_argument, NULL, 'n'},  {"np", required_argument, NULL, 'n'},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"grace", required_argument, NULL, OPT_GRACE},
      {"ranks", required_argument, NULL, 'r'},   {"id-out", required_argument, NULL, OPT_ID_OUT},
      {"id-in", required_argument, NULL, OPT_ID_IN}, {"verbose", no_argument, NULL, 'v'},
      {"bind", required_argument, NULL, OPT_BIND},
      {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
  loomLaunchOptions o;
  memset(&o, 0, sizeof(o));
  o.bind = LOOM_BIND_AUTO;
  const char *ranklist = NULL;
  opterr = 0;
  /* '+': stop at the program name, so its own options are left alone. */
  for (;;) {
    int c = getopt_long(argc, argv, "+n:r:vh", longopts, NULL);
    if (c == -1) break;
    switch (c) {
      case 'n': {
        char *end;
        errno = 0;
        long v = strtol(optarg, &end, 10);
        if (errno != 0 || end == optarg || *end != '\0' || v < 1 || v > INT_MAX)
          return bad("-n wants a rank count of at least 1, not \"%s\"", optarg);
        o.nranks = (int)v;
        break;
      }
      case OPT_TIMEOUT:
        if (parse_seconds(optarg, &o.timeout_s) != 0)
          return bad("--timeout wants seconds (a number >= 0), not \"%s\"", optarg);
        break;
      case OPT_GRACE:
        if (parse_seconds(optarg, &o.grace_s) != 0)
          return bad("--grace wants seconds (a number >= 0), not \"%s\"", optarg);
        break;
      case 'r':
        ranklist = optarg;
        break;
      case OPT_ID_OUT:
        o.id_out = optarg;
        break;
      case OPT_ID_IN:
        o.id_in = optarg;
        break;
      case OPT_BIND:
        if (strcmp(optarg, "auto") == 0) o.bind = LOOM_BIND_AUTO;
        else if (strcmp(optarg, "cpu") == 0) o.bind = LOOM_BIND_CPU;
        else if (strcmp(optarg, "none") == 0) o.bind = LOOM_BIND_NONE;
        else return bad("--bind wants auto, cpu or none, not \"%s\"", optarg);
        break;
      case 'v':
        o.verbose = 1;
        break;
      case 'h':
        usage(stdout);
        return 0;
      case ':':
        return bad("option %s needs a value", argv[optind - 1]);
      default:
        return bad("unknown option %s", argv[optind - 1]);
    }
  }
  if (o.nranks == 0) return bad("%s", "-n N (the number of ranks) is required");
  if (optind >= argc) return bad("%s", "no program to run");
  if (o.id_in && o.id_out) return bad("%s", "--id-in and --id-out cannot be used together");
  int *ranks = NULL;
  if (ranklist) {
    char err[256];
    if (loomParseRankList(ranklist, o.nranks, &ranks, &o.nlocal, err, (int)sizeof(err)) != 0)
      return bad("--ranks: %s", err);
    o.ranks = ranks;
  }
  o.argv = argv + optind;
  /* A job on this host alone gets a secret of its own; across hosts the
   * loomruns would each make another, so the user gives one to all. */
  const char *sec = getenv("LOOM_SECRET"), *secf = getenv("LOOM_SECRET_FILE");
  if ((!sec || !sec[0]) && (!secf || !secf[0]) && !ranklist && !o.id_in && !o.id_out) {
    unsigned char raw[32];
    char hex[2 * sizeof raw + 1];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
      fprintf(stderr, "%s: cannot draw a random LOOM_SECRET: %s\n", prog, strerror(errno));
      free(ranks);
      return 1;
    }
    for (size_t i = 0; i < sizeof raw; i++)
      snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    setenv("LOOM_SECRET", hex, 1);
  }
  int rc = loomLaunch(prog, &o);
  free(ranks);
  return rc;
}
