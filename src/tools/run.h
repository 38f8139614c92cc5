/* src/tools/run.h — what fsdp-run's pieces share: the options (fsdp_run.c
 * parses them) and one attempt of the worker group (run_group.c spawns,
 * supervises, stops and reports). fsdp-run uses no part of the library: it
 * only starts processes with the env:// variables set. */
#ifndef FSDP_TOOLS_RUN_H
#define FSDP_TOOLS_RUN_H

typedef struct {
  int nproc;          /* workers on this node */
  int nnodes, node_rank;
  const char *nnodes_text; /* --nnodes as given: N or MIN:MAX */
  int nnodes_min;     /* --nnodes MIN:MAX: the job starts with MIN nodes (nnodes is MAX) */
  double rdzv_timeout_s; /* --rdzv-timeout: how long node 0 waits for the nodes */
  const char *master_addr;
  int master_port;
  int max_restarts;
  int min_nproc;      /* --min-nproc: shrink down to this many ranks after a loss; 0 off */
  int respawn;        /* --respawn: replace a lost worker once the survivors resumed */
  double grace_s;     /* SIGTERM, then SIGKILL after this long */
  const char *rdzv_id; /* --rdzv-id, NULL when not given */
  char **argv;        /* the worker command, NULL-terminated */
  char host[256];     /* this node's name, for reports */
  char run_id[256];   /* the job id (--rdzv-id, else generated): FSDP_RUN_ID */
} run_opts_t;

typedef enum {
  GROUP_SUCCEEDED = 0, /* every worker exited with status 0 when no peer needed it */
  GROUP_FAILED,        /* a worker failed (or exited early); the others were stopped */
  GROUP_INTERRUPTED    /* fsdp-run got SIGINT/SIGTERM and passed it on */
} group_result_t;

/* Installs the signal handlers the supervisor relies on (SIGCHLD, SIGINT,
 * SIGTERM through a self-pipe; SIGPIPE ignored). 0, or -1 with errno. */
int run_signals_install(void);
/* The read end of that self-pipe: readable once a signal came. */
int run_signals_fd(void);

/* Runs the worker group once (attempt 0, 1, ...: FSDP_RESTART_COUNT): each
 * worker's stderr is echoed prefixed "[rank N] "; when one fails the others
 * get SIGTERM, then SIGKILL after grace_s, and a root-cause report (rank,
 * host, exit code or signal, last stderr line) goes to stderr. A worker that
 * exits with status 0 while its peers still need it has failed (the rule is
 * at the top of run_group.c). Returns when
 * every worker has been reaped. *signal_out is the signal that interrupted
 * fsdp-run (GROUP_INTERRUPTED).
 *
 * With min_nproc (one node; several: run_group_nodes): a worker that dies while at least min_nproc
 * others live is lost, not a failure: the survivors are told, through their
 * control pipes (FSDP_RUN_CONTROL), their rank in a new world of the
 * survivors and a new port to meet at (fsdp_world_rejoin), and go on. */
group_result_t run_group(const run_opts_t *o, int attempt, int *signal_out);

struct run_nodes;
struct run_word;
/* run_group for an elastic job over several nodes: the world comes from
 * node 0's agent (first: this node's part of it, run_nodes.h), and every
 * loss or admission is decided there. */
group_result_t run_group_nodes(const run_opts_t *o, struct run_nodes *nodes,
                               const struct run_word *first, int *signal_out);

/* A TCP port on the loopback free right now (run_nodes.c, beside the worlds' ports
 * node 0 hands out); -1 with errno. */
int run_free_port(void);

/* 1 when the job is elastic over several nodes: fsdp-run's agents then talk
 * to each other (run_nodes.c) and node 0's agent decides every world. */
int run_nodes_elastic(const run_opts_t *o);

#endif
