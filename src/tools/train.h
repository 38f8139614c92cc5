/* src/tools/train.h — what fsdp-train's pieces share: the options, the trainer
 * state, and the reporting that turns steps into lines (or JSON) on rank 0. */
#ifndef FSDP_TOOLS_TRAIN_H
#define FSDP_TOOLS_TRAIN_H

#include "fsdp/fsdp.h"
#include "tools/config.h"

enum { PRESET_GPT2 = 1, PRESET_LLAMA = 2 };

typedef struct {
  const char *model; /* "mlp", "gpt2" or "llama" */
  fsdp_config_t cfg;
  const char *data;
  int64_t global_batch;
  int steps, epochs, eval_every, log_every, json;
  uint64_t seed;
  /* mlp */
  int hidden[6], n_hidden;
  /* gpt2 and llama (train_gpt2.c) */
  fsdp_gpt2_config_t gpt;
  fsdp_gpt2_config_t gpt_preset; /* the last --preset's (or the default) shape: --layers
                                    and the other GPT-2 shape flags moved gpt off it */
  fsdp_llama_config_t llama;     /* --model llama: its --preset's */
  const char *preset;            /* the last --preset, or NULL */
  int preset_of;                 /* PRESET_GPT2 | PRESET_LLAMA: whose name it is */
  int seq_len, eval_batches, sample;
  float temperature;
  float loss_scale; /* --loss-scale; 0: the engine's default */
  fsdp_gpt2_opts_t wrap; /* wrap_kinds, wrap_min_params, checkpoint_kinds ("auto": budgeted) */
  float memory_budget;   /* --memory-budget GiB for --checkpoint auto; 0: the model's default */
  /* checkpoints (train_ckpt.c) */
  const char *save_dir, *resume; /* resume: "auto" (save_dir's latest, if any) or a path */
  int save_every, save_overwrite, stop_after;
  int replica_every; /* --replica-every: buddy snapshots (train_elastic.c); 0 off */
  cfg_file_t *config; /* --config FILE, or NULL: its sharding rules (config.h) */
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
  size_t act_bytes_full; /* ... and what they would be with no layer checkpointed */
  double t0;
  int tty;               /* rank 0 writes to a terminal: a progress bar */
  fsdp_ckpt_lock_t lock; /* --save-dir's run lock (train_ckpt.c), NULL without */
  char error[256];       /* why a tool-side step failed; "" means fsdp_last_error() */
  fsdp_replica_t replica; /* --replica-every, else NULL */
  int64_t resumed_from, lost_steps; /* after a shrink, until the first step is done; -1 */
  int saved_through; /* after a shrink: saves up to this step exist from the old world */
  int joining;       /* started by fsdp-run --respawn to join a running job */
  int resized;       /* the world changed size since the start (a shrink or a growth) */
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
/* The optimizer step after update `step` - 1's micro-batches (loss: the global
 * mean): 0 when applied, 1 when the engine skipped it for non-finite values
 * (reported; the caller retries the same step, so data and schedule stay a
 * function of the update count and a resume is exact), -1 on an error (after
 * max consecutive skips: FSDP_ERR_NONFINITE, the engine's message). */
int train_update(trainer_t *t, int step, double loss, fsdp_step_stats_t *st);
/* The factor of the loss the models' backward is asked for: the engine's loss
 * scale (1 without fp16 loss scaling). */
float train_loss_scale(const trainer_t *t);
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

/* Elastic training (train_elastic.c). train_replica_start makes the buddy
 * replica (--replica-every) once the model is materialised and prints its
 * memory; train_snapshot, after update `step`, takes a snapshot when due,
 * and after a shrink tells fsdp-run at the first step done. 0 or -1. */
int train_replica_start(trainer_t *t);
/* A joining worker (t->joining) takes t->start_step and its shard from the
 * survivors instead of a replica of its own making; 0 or -1. */
int train_snapshot(trainer_t *t, int step);
/* The task's model over the engine: unbuild destroys it (before the engine
 * goes), build makes and materialises it over t->eng (sized by t->micro). */
typedef struct {
  void (*unbuild)(void *task);
  int (*build)(trainer_t *t, void *task);
  void *task;
} train_model_t;
/* After update `step` (1-based) failed, or anything after update step - 1:
 * when the world is elastic, a replica exists and the world's communication
 * failed (fsdp_world_failed), rebuilds the world of the survivors, the engine and the
 * model, restores the newest complete snapshot and sets *resume to its step
 * (the loop goes on from there); 0, or -1 when the job must end (the error
 * said why). */
int train_recover(trainer_t *t, int step, const train_model_t *model, int *resume);
/* After update `step`'s snapshot: when fsdp-run announced a bigger world (a
 * worker joins), every rank moves into it and the state of that snapshot is
 * spread over it. 0, or -1 (the error said why). */
int train_grow(trainer_t *t, int step, const train_model_t *model);

/* Test-only fault injection (FSDP_FAULT, train_fault.c), called in the middle
 * of every step: kills, stalls or fails this rank when the variable says so;
 * -1 when FSDP_FAULT is malformed, else 0. */
int train_fault(trainer_t *t, int step);
/* The same variable's snapkill faults, called as a buddy snapshot begins. */
void train_fault_snapshot(trainer_t *t, int step);

/* Compares this rank's flags and data identity (path, size, content hash) with
 * every other rank's (train_check.c); -1 with fsdp_last_error naming the
 * first differing flag and each rank's value. Collective. */
int train_check_consistency(trainer_t *t, const char *data_path, size_t data_bytes,
                            uint64_t data_hash);
/* FNV-1a 64 of n bytes, continuing from h (0 starts afresh). */
uint64_t train_hash(uint64_t h, const void *data, size_t n);

int train_mlp(trainer_t *t);
/* GPT-2 or a Llama-family model (o->model) on text or token files. */
int train_gpt2(trainer_t *t);

#endif
