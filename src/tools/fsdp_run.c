/* src/tools/fsdp_run.c — fsdp-run, a torchrun-style launcher: starts
 * --nproc-per-node workers with the env:// variables fsdp_world_init reads,
 * supervises them (run_group.c), and restarts the whole group up to
 * --max-restarts times after a failure; workers learn which attempt they are
 * in from FSDP_RESTART_COUNT (fsdp-train --resume auto then continues from
 * the latest checkpoint). Every job has an id (--rdzv-id, else a random one),
 * so that the store of one job turns away the workers of another that meets
 * it on the same port. An elastic job over several nodes (--min-nproc or
 * --nnodes MIN:MAX) has its agents meet first (run_nodes.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "tools/run.h"
#include "tools/run_nodes.h"

static const char usage_text[] =
    "usage: fsdp-run [options] [--] program [args...]\n"
    "  --nproc-per-node N   workers on this node (default 1)\n"
    "  --nnodes N|MIN:MAX   nodes in the job (default 1). MIN:MAX (elastic, like\n"
    "                       torchrun's): node 0 waits up to --rdzv-timeout for MAX nodes\n"
    "                       and starts with those there when at least MIN are; a node that\n"
    "                       comes later (a replacement) is admitted at the ranks' next\n"
    "                       snapshot (fsdp-train --replica-every): the world grows\n"
    "  --rdzv-timeout S     how long node 0 waits for the nodes of an elastic job, and\n"
    "                       another node for node 0's fsdp-run to answer (default 30)\n"
    "  --node-rank K        this node, 0..N-1 (default 0)\n"
    "  --master-addr A      where rank 0 (on node 0) serves the rendezvous store\n"
    "                       (default 127.0.0.1)\n"
    "  --master-port P      its port (default 29500; 0: a free port, one node only).\n"
    "                       Elastic over several nodes, node 0's fsdp-run serves the\n"
    "                       other nodes' fsdp-run there, and each world's store gets a\n"
    "                       free port of node 0\n"
    "  --max-restarts R     restart the whole group up to R times after a failure\n"
    "                       (default 0); workers see FSDP_RESTART_COUNT\n"
    "  --min-nproc M        elastic: when a worker dies on its own (or, over several\n"
    "                       nodes, a whole node or its fsdp-run) and at least M ranks of\n"
    "                       the job live, go on without it: the survivors make a world of\n"
    "                       their own (fsdp_world_rejoin; fsdp-train --replica-every\n"
    "                       restores the lost shards from memory) instead of the group\n"
    "                       stopping (default 0: off; MIN x N with --nnodes MIN:MAX).\n"
    "                       Over several nodes node 0's fsdp-run decides every world and\n"
    "                       node 0 serves every world's store: losing node 0 (or all of\n"
    "                       its ranks) ends the job\n"
    "  --respawn 1          with --min-nproc, one node: once the survivors resumed,\n"
    "                       start a new worker for each lost one; it joins them at\n"
    "                       their next snapshot (FSDP_RUN_JOIN=1, fsdp_world_joining)\n"
    "                       and the world grows back (default 0)\n"
    "  --grace S            seconds between SIGTERM and SIGKILL when stopping (default 10)\n"
    "  --rdzv-id ID         the job's id, 1-255 of A-Z a-z 0-9 . _ : - (default: a random\n"
    "                       one; needed, the same on every node, with --nnodes > 1): the\n"
    "                       store turns away workers of another job that reach its port\n"
    "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR, MASTER_PORT, FSDP_RUN_ID, FSDP_RESTART_COUNT and FSDP_MAX_RESTARTS.\n"
    "Its stderr is echoed prefixed \"[rank N] \"; stdout is passed through. When a\n"
    "worker fails the others are stopped and a root-cause report names it.\n"
    "A worker that exits with status 0 while its peers still need it has failed too,\n"
    "at once: one whose rank joined its env:// world (fsdp_world_init) and has not\n"
    "left it through fsdp_world_destroy, or one that never joined while another\n"
    "worker on this node did (that one would wait for it). Workers that never join a\n"
    "world may end in any order. A worker killed by SIGKILL is reported out of memory\n"
    "when the oom_kill counter of fsdp-run's memory cgroup rose meanwhile.\n"
    "Exit status: 0 when every worker succeeded, 1 after a failure, 128+signal when\n"
    "interrupted.\n";

typedef struct {
  const char *name;
  int *i;
  double *d;
  const char **s;
} flag_t;

static int set_flag(const flag_t *f, const char *v) {
  char *end;
  errno = 0;
  if (f->s) {
    *f->s = v;
    return 0;
  }
  if (f->d) {
    *f->d = strtod(v, &end);
    if (*v && !*end && !errno && *f->d >= 0) return 0;
  } else {
    long x = strtol(v, &end, 10);
    if (*v && !*end && !errno && x >= 0 && x <= 1 << 24) return *f->i = (int)x, 0;
  }
  fprintf(stderr, "fsdp-run: %s '%s' is not a non-negative number\n", f->name, v);
  return -1;
}

/* Flags up to the program; "--flag value" and "--flag=value". Returns the
 * index of the program's name, 0 for --help, -1 on error. */
static int parse(int argc, char **argv, run_opts_t *o) {
  const flag_t flags[] = {
      {"--nproc-per-node", &o->nproc, NULL, NULL},
      {"--nnodes", NULL, NULL, &o->nnodes_text},
      {"--rdzv-timeout", NULL, &o->rdzv_timeout_s, NULL},
      {"--node-rank", &o->node_rank, NULL, NULL},  {"--master-addr", NULL, NULL, &o->master_addr},
      {"--master-port", &o->master_port, NULL, NULL},
      {"--max-restarts", &o->max_restarts, NULL, NULL}, {"--grace", NULL, &o->grace_s, NULL},
      {"--rdzv-id", NULL, NULL, &o->rdzv_id}, {"--min-nproc", &o->min_nproc, NULL, NULL},
      {"--respawn", &o->respawn, NULL, NULL},
  };
  int i = 1;
  for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
    if (!strcmp(argv[i], "--")) return i + 1 < argc ? i + 1 : -1;
    if (!strcmp(argv[i], "--help")) return fputs(usage_text, stdout), 0;
    const char *eq = strchr(argv[i], '='), *v = eq ? eq + 1 : argv[i + 1];
    size_t len = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
    const flag_t *f = NULL;
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
      if (strlen(flags[k].name) == len && !strncmp(argv[i], flags[k].name, len)) f = &flags[k];
    if (!f) return fprintf(stderr, "fsdp-run: unknown option %s (see --help)\n", argv[i]), -1;
    if (!v) return fprintf(stderr, "fsdp-run: %s needs a value\n", argv[i]), -1;
    if (set_flag(f, v)) return -1;
    i += !eq;
  }
  if (i >= argc) fprintf(stderr, "fsdp-run: no program to run (see --help)\n");
  return i < argc ? i : -1;
}

static int valid_id(const char *id) {
  size_t n = strlen(id);
  return n >= 1 && n < sizeof ((run_opts_t *)0)->run_id &&
         strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") == n;
}

/* --nnodes N or MIN:MAX; MIN < MAX makes the job elastic (--min-nproc,
 * unless given, is MIN nodes' ranks). */
static int parse_nnodes(run_opts_t *o) {
  const char *v = o->nnodes_text;
  int a = 1, b = 1, end = 0;
  if (v && !(sscanf(v, "%d%n", &a, &end) == 1 && (!v[end] || (sscanf(v, "%d:%d%n", &a, &b,
      &end) == 2 && !v[end])))) {
    fprintf(stderr, "fsdp-run: --nnodes '%s' is neither N nor MIN:MAX\n", v);
    return -1;
  }
  if (v && !strchr(v, ':')) b = a;
  o->nnodes_min = a;
  o->nnodes = b;
  if (a < b && !o->min_nproc) o->min_nproc = a * (o->nproc > 0 ? o->nproc : 1);
  return 0;
}

static int check(const run_opts_t *o) {
  const char *why = o->nproc < 1              ? "--nproc-per-node must be at least 1"
                    : o->nnodes < 1           ? "--nnodes must be at least 1"
                    : o->node_rank >= o->nnodes ? "--node-rank must be below --nnodes"
                    : o->master_port > 65535  ? "--master-port must be at most 65535"
                    : o->master_port == 0 && o->nnodes > 1
                        ? "--master-port 0 (any free port) works on one node only"
                    : !o->rdzv_id && o->nnodes > 1
                        ? "--nnodes > 1 needs --rdzv-id ID, the same on every node (a job id "
                          "lets the store turn away another job's workers)"
                    : o->nnodes_min < 1 || o->nnodes_min > o->nnodes
                        ? "--nnodes MIN:MAX needs 1 <= MIN <= MAX"
                    : o->respawn && o->nnodes > 1
                        ? "--respawn works on one node; over several, start a replacement "
                          "fsdp-run with --nnodes MIN:MAX"
                    : o->max_restarts && run_nodes_elastic(o)
                        ? "--max-restarts cannot be combined with an elastic job over several "
                          "nodes (the survivors go on instead)"
                    : o->respawn && !o->min_nproc ? "--respawn needs --min-nproc"
                    : o->min_nproc > (long long)o->nproc * o->nnodes
                        ? "--min-nproc must be at most --nproc-per-node x --nnodes"
                    : !(o->rdzv_timeout_s > 0 && o->rdzv_timeout_s <= 86400)
                        ? "--rdzv-timeout must be above 0 and at most 86400 seconds"
                    : o->rdzv_id && !valid_id(o->rdzv_id)
                        ? "--rdzv-id must be 1-255 characters of A-Z a-z 0-9 . _ : -"
                        : NULL;
  if (why) fprintf(stderr, "fsdp-run: %s\n", why);
  return why ? -1 : 0;
}

/* A random job id: 64 bits in hex, from getrandom, else mixed from the clock
 * and the pid (two jobs started together still differ in their pids). */
static void random_id(char *buf, size_t n) {
  unsigned long long r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = (unsigned long long)ts.tv_sec * 1000000007ull ^ (unsigned long long)ts.tv_nsec << 20 ^
        (unsigned long long)getpid();
  }
  snprintf(buf, n, "%016llx", r);
}

int main(int argc, char **argv) {
  run_opts_t o = {.nproc = 1, .nnodes = 1, .master_addr = "127.0.0.1", .master_port = 29500,
                  .grace_s = 10.0, .rdzv_timeout_s = 30.0};
  int first = parse(argc, argv, &o);
  if (first <= 0) return first == 0 ? 0 : 2;
  if (parse_nnodes(&o) || check(&o)) return 2;
  o.argv = argv + first;
  if (o.rdzv_id)
    snprintf(o.run_id, sizeof o.run_id, "%s", o.rdzv_id);
  else
    random_id(o.run_id, sizeof o.run_id);
  if (gethostname(o.host, sizeof o.host - 1)) snprintf(o.host, sizeof o.host, "?");
  if (o.master_port == 0 && (o.master_port = run_free_port()) < 0) {
    fprintf(stderr, "fsdp-run: cannot find a free port: %s\n", strerror(errno));
    return 1;
  }
  if (run_signals_install()) {
    fprintf(stderr, "fsdp-run: cannot install signal handlers: %s\n", strerror(errno));
    return 1;
  }
  if (run_nodes_elastic(&o)) {
    run_nodes_t *nodes;
    run_word_t word;
    int sig = 0;
    if (run_nodes_open(&o, run_signals_fd(), &nodes, &word)) {
      unsigned char got = 0; /* the signal that stopped the meeting, if one did */
      run_nodes_close(nodes, 0);
      return read(run_signals_fd(), &got, 1) == 1 && got != SIGCHLD ? 128 + got : 1;
    }
    group_result_t r = run_group_nodes(&o, nodes, &word, &sig);
    run_nodes_close(nodes, r == GROUP_SUCCEEDED);
    return r == GROUP_SUCCEEDED ? 0 : r == GROUP_INTERRUPTED ? 128 + sig : 1;
  }
  for (int attempt = 0;; attempt++) {
    int sig = 0;
    group_result_t r = run_group(&o, attempt, &sig);
    if (r == GROUP_SUCCEEDED) return 0;
    if (r == GROUP_INTERRUPTED) return 128 + sig;
    if (attempt >= o.max_restarts) return 1;
    fprintf(stderr, "fsdp-run: restarting the worker group (restart %d of %d, "
            "FSDP_RESTART_COUNT=%d)\n", attempt + 1, o.max_restarts, attempt + 1);
  }
}
