/* src/tools/run_nodes.h — the link between fsdp-run's agents of an elastic
 * job over several nodes (--nnodes > 1 with --min-nproc, or --nnodes
 * MIN:MAX): node 0's agent decides every world and tells the others their
 * part of it; run_group.c passes each part to its workers. Not thread-safe;
 * one per fsdp-run. */
#ifndef FSDP_TOOLS_RUN_NODES_H
#define FSDP_TOOLS_RUN_NODES_H

#include <poll.h>

#include "tools/run.h"

typedef enum {
  RUN_WORD_NONE = 0,
  RUN_WORD_START, /* the first world: spawn this node's workers as its ranks */
  RUN_WORD_JOIN,  /* a world that admits this node: spawn its workers as joiners */
  RUN_WORD_WORLD, /* a new world: tell this node's live workers their ranks in it */
  RUN_WORD_END,   /* the job cannot go on: why says so */
  RUN_WORD_BYE    /* node 0's workers are done (internal to run_nodes.c) */
} run_word_kind_t;

typedef struct run_word {
  run_word_kind_t kind;
  int generation, size, port; /* world G of size ranks meeting at MASTER_ADDR:port */
  int first, count;           /* this node's ranks: first..first+count-1 */
  char why[512];              /* RUN_WORD_END */
} run_word_t;

typedef struct run_nodes run_nodes_t;

/* Meets the other agents: node 0 serves them at --master-port and waits up
 * to --rdzv-timeout for --nnodes MAX of them (MIN suffice at the deadline);
 * another node connects and waits for its first word, START or (a node that
 * comes late) JOIN. Gives up (-1) when stop_fd becomes readable (a signal:
 * run_signals_fd). 0, or -1 with the reason on stderr; *out is set either
 * way and is freed by run_nodes_close. */
int run_nodes_open(const run_opts_t *o, int stop_fd, run_nodes_t **out, run_word_t *first);
/* The descriptors to poll for the link (at most max); returns how many. */
int run_nodes_fds(const run_nodes_t *n, struct pollfd *pf, int max);
/* The most run_nodes_fds can return: a pf of this many misses none. */
int run_nodes_max_fds(const run_nodes_t *n);
/* How long poll may wait before run_nodes_read is due (a connection's
 * hello deadline), in ms; -1 when only the descriptors matter. */
int run_nodes_timeout_ms(const run_nodes_t *n);
/* Reads what the link holds (never waits): 1 when *w is a new word for this
 * node (WORLD, END), else 0. */
int run_nodes_read(run_nodes_t *n, run_word_t *w);
/* This node has `alive` live workers after a loss (why: what was lost, for
 * node 0's log). Node 0 decides at once (1, *w its word); another node tells
 * node 0 (0; its word comes through run_nodes_read). */
int run_nodes_lost(run_nodes_t *n, int alive, const char *why, run_word_t *w);
/* Node 0: the ranks resumed in the latest world; nodes waiting to join are
 * admitted (1, *w node 0's word in the larger world). 0 elsewhere. */
int run_nodes_resumed(run_nodes_t *n, run_word_t *w);
/* Says "bye" when this node's workers succeeded, and closes the link. */
void run_nodes_close(run_nodes_t *n, int succeeded);

#endif
