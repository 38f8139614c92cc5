/* src/tools/train.h — what fsdp-train's pieces share: the options, the trainer
 * state, and the reporting that turns steps into lines (or JSON) on rank 0. */
#ifndef FSDP_TOOLS_TRAIN_H
#define FSDP_TOOLS_TRAIN_H

#include "fsdp/fsdp.h"

typedef struct {
  const char *model; /* "mlp" or "gpt2" */
  fsdp_config_t cfg;
  const char *data;
  int64_t global_batch;
  int steps, epochs, eval_every, log_every, json;
  uint64_t seed;
  /* mlp */
  int hidden[6], n_hidden;
  /* gpt2 */
  fsdp_gpt2_config_t gpt;
  int seq_len, eval_batches, sample;
  float temperature;
  fsdp_gpt2_opts_t wrap; /* wrap_kinds, wrap_min_params, checkpoint_kinds */
  /* checkpoints (train_ckpt.c) */
  const char *save_dir, *resume; /* resume: "auto" (save_dir's latest, if any) or a path */
  int save_every, save_overwrite, stop_after;
} train_opts_t;

typedef struct {
  const train_opts_t *o;
  fsdp_world_t world;
  fsdp_engine_t eng;
  int rank, nranks;
  int64_t micro, offset; /* this rank's share of each global micro-batch */
  int total_steps;
  int start_step;        /* updates already done when this process began (resume) */
  size_t act_bytes;      /* the model's activation buffers */
  double t0;
  int tty;               /* rank 0 writes to a terminal: a progress bar */
  fsdp_ckpt_lock_t lock; /* --save-dir's run lock (train_ckpt.c), NULL without */
} trainer_t;

/* Creates the engine once the task knows how many steps it will take (the
 * schedule's length; warm-up defaults to a tenth of a short run, else 20
 * steps) and splits the global batch across ranks. */
fsdp_status_t train_engine(trainer_t *t, int total_steps);

/* One line per step (or a progress bar on a terminal, or JSON). unit is
 * "samples" or "tokens"; per_step how many of them a step processes. */
void train_report_step(trainer_t *t, int step, double loss, const fsdp_step_stats_t *st,
                       double secs, const char *unit, double per_step);
void train_report_eval(trainer_t *t, int step, const char *metric, double loss, double value);
/* Prints the units: name, kind, parameters, bytes per rank. */
void train_print_plan(const trainer_t *t, const char *what);
/* Peak bytes per rank: persistent + gathered + gradients in flight + activations. */
size_t train_peak_bytes(const trainer_t *t);
/* Sum of a double over ranks. */
fsdp_status_t train_sum(const trainer_t *t, double *values, int n);

/* Opens --save-dir (locks it into t->lock, probes writability and space) and
 * --resume: repairs the save directory's `latest` when resuming from it, loads
 * the checkpoint into the materialised engine and sets start_step (a fresh
 * start when auto finds no checkpoint). Without --resume, a --save-dir that
 * already holds checkpoints is refused unless --save-overwrite. 0 or -1. */
int train_resume(trainer_t *t);
/* After update `step` (1-based): saves when --save-every divides it or it is
 * the schedule's last, if --save-dir is set. 0 or -1. */
int train_save(trainer_t *t, int step);
/* One past the last update this process runs: --stop-after or the schedule's end. */
int train_end_step(const trainer_t *t);

/* Test-only fault injection (FSDP_FAULT, train_fault.c), called in the middle
 * of every step: kills, stalls or fails this rank when the variable says so;
 * -1 when FSDP_FAULT is malformed, else 0. */
int train_fault(const trainer_t *t, int step);

int train_mlp(trainer_t *t);
int train_gpt2(trainer_t *t);

#endif
