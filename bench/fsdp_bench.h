/* bench/fsdp_bench.h — fsdp-bench's pieces: the options (fsdp_bench.c), one
 * measured configuration (bench_run.c), the timeline breakdown and Chrome trace
 * (bench_timeline.c) and the table / JSON output (bench_report.c). */
#ifndef FSDP_BENCH_FSDP_BENCH_H
#define FSDP_BENCH_FSDP_BENCH_H

#include "bench_util.h"
#include "tools/config.h"
#include "tools/lm.h"

#define BENCH_MAX_CONFIGS 32

typedef struct {
  const char *model; /* "gpt2", "llama" or "mlp" */
  lm_t lm;           /* gpt2, llama: the decoder over gpt or llama below, picked once
                        when the options are final (LM_NONE: the MLP) */
  const char *preset;
  fsdp_gpt2_config_t gpt;
  fsdp_llama_config_t llama; /* --model llama: --preset's */
  int preset_llama;          /* 1: --preset named a Llama shape */
  int seq_len;
  int hidden[6], n_hidden; /* mlp: 784 inputs, hidden widths, 10 classes */
  fsdp_gpt2_opts_t wrap;   /* wrap_kinds, wrap_min_params, checkpoint_kinds ("auto") */
  float memory_budget;     /* --memory-budget GiB for --checkpoint auto; 0: the default */
  int micro_batch;         /* sequences (gpt2) or samples (mlp) per rank per micro-batch */
  fsdp_config_t cfg;       /* strategy, prefetch_depth, grad_accum, param_dtype, ... */
  int64_t warmup, iters, rounds, check, peak_size;
  uint64_t seed;
  int json;
  const char *trace;
  const char *json_file; /* also write the JSON document here, table or not */
  int sweep;
  int memory_plan;       /* --memory-plan: print the computed activation memory and stop */
  fsdp_strategy_t strategies[3];
  int n_strategies;
  int depths[8], n_depths;
  int shard_sizes[4], n_shard_sizes; /* --sweep-shard-sizes (0: the world); else config's */
  cfg_file_t *config;      /* --config FILE, or NULL: its sharding rules (tools/config.h) */
  int kernel_profile;      /* --kernel-profile: time each kernel class (bench_kernels.c) */
  int replica_every;       /* --replica-every: buddy snapshots inside the timed steps; 0 off */
} bench_opts_t;

/* One configuration's numbers; statistics are over the timed steps of every
 * round. Per step, the step time is the slowest rank's and the split is the
 * mean over ranks. */
typedef struct {
  fsdp_strategy_t strategy;
  int prefetch, max_live;
  int shard_size, replicas;    /* HSDP: R replica groups x S ranks (S = N: plain FSDP) */
  size_t params, largest_unit; /* elements */
  int n_units;
  int root_held;               /* the model holds a root unit across the others */
  double tokens_per_step;      /* over all ranks */
  double flops_per_token;      /* model FLOPs (see --help) */
  double peak_flops;           /* measured sgemm FLOP/s, summed over ranks (0: not measured) */
  bench_stat_t step_s, compute_s, comm_s, gather_s, reduce_s, exposed_s;
  bench_stat_t tokens_per_s, tokens_per_s_rank, mfu;
  /* bytes, the largest over ranks */
  double persistent, gathered_peak, grads_peak, activations, model_peak, predicted, reserved;
  double rss_base, rss_peak;
  double device_used;           /* CUDA: device memory in use after the timed steps, the
                                   largest over ranks (cudaMemGetInfo); -1: not measured */
  double loss_first, loss_last; /* mean per-token loss over ranks */
  /* Bytes this rank contributed per step, by group (the timeline's, the mean
   * over timed steps): gathers and gradient reductions in the shard group, the
   * HSDP gradient-shard all-reduce in the replica group. */
  double gather_bytes, reduce_bytes, replica_bytes;
  /* --replica-every: buddy snapshots every replica_every steps (0: none in
   * this configuration); one snapshot's bytes and all the replica's host
   * memory per rank (fsdp_replica_info), rank 0's copy into a snapshot (the
   * part on the step's path), milliseconds per snapshot */
  int replica_every;
  double replica_snapshot_bytes, replica_host_bytes, replica_copy_ms;
  /* --checkpoint auto: what the model chose (lm_checkpoint_auto_text), as a
   * line and as JSON members; "" otherwise */
  char ckpt_auto[320], ckpt_auto_json[256];
  double wrong;                 /* see bench_check, summed over rounds */
  double skipped_steps;         /* steps the numerics guard skipped (NaN/Inf, fp16 overflow) */
  double loss_scale;            /* at the end (1: no loss scaling) */
  /* Load from outside: CPU seconds the machine was busy during the timed steps
   * less what the ranks used themselves, over wall seconds x cores (one node
   * only; negative when unknown). */
  double other_cpu, timed_wall, other_load;
  /* --kernel-profile, rank 0's: each class's scopes summed over kc_steps
   * timed steps, its declared cost per step, and the device's */
  fsdp_kclass_time_t kc[FSDP_KC_COUNT];
  fsdp_kclass_cost_t kc_cost[FSDP_KC_COUNT];
  int kc_steps;
  double hbm_bytes_per_s; /* datasheet, by device name (0: unknown) */
  char device_name[128];
  char attention[640]; /* what ran attention (fsdp_cuda_attention_impl); "" on the CPU */
  char products[1024]; /* what ran GPT-2's block products (bench_products); "" otherwise */
  double *samples;              /* 6 x cap_samples seconds: step, compute, comm, gather,
                                   reduce, exposed of every timed step of every round */
  int n_samples, cap_samples;
} bench_result_t;

/* Per step of one rank, from the engine's timeline (bench_timeline.c). */
typedef struct {
  double step_s;    /* wall time of the step on this rank */
  double gather_s;  /* sum of all-gather spans on the gather stream */
  double reduce_s;  /* sum of reduce-scatter / all-reduce spans on the reduce stream */
  double comm_s;    /* union of both: time some collective was in flight */
  double exposed_s; /* time compute waited for collectives (CPU: host calls; CUDA:
                       the compute stream) */
  double gather_bytes, reduce_bytes, replica_bytes; /* this rank's contributions */
} bench_split_t;

typedef struct {
  double t_begin, t_end; /* fsdp_time_now() around one timed step */
} bench_window_t;

/* Runs one round of one configuration on a fresh engine: build, warm up, time,
 * check, measure memory. Round 0 initialises r; the last round (rounds - 1)
 * computes the statistics over the timed steps of every round. */
int bench_run(fsdp_world_t world, const bench_opts_t *o, fsdp_strategy_t strategy, int depth,
              int shard_size, double peak_flops_rank, int round, bench_result_t *r);
void bench_result_free(bench_result_t *r);
/* sgemm FLOP/s of this rank while every rank runs the same sgemm (n x n x n). */
fsdp_status_t bench_peak_flops(fsdp_comm_t comm, int n, double *flops);
/* The same on this rank's GPU (bench_cuda.c): an n x n x n cuBLAS product in
 * dtype (bf16: bf16 in and out, fp32 accumulation; f32: no TF32), timed with
 * CUDA events. */
fsdp_status_t bench_cuda_peak_flops(fsdp_comm_t comm, int n, fsdp_dtype_t dtype, double *flops);
/* Bytes in use on the current GPU, every process's (total - free); -1 without CUDA. */
double bench_cuda_device_used(void);
/* The current GPU's name into name, and its HBM bandwidth in bytes/s from a
 * datasheet table by name (bench_cuda.c; 0 when the name is not in it). */
double bench_cuda_hbm(char *name, size_t len);

/* --kernel-profile (bench_kernels.c): the declared costs and the device's
 * bandwidth into r (once per configuration), then the classes' times of this
 * round's `steps` timed steps added; the table (after the row) and its JSON. */
int bench_kernels_collect(fsdp_engine_t eng, const lm_t *lm, int B, int T, int steps,
                          bench_result_t *r);
void bench_print_kernels(const bench_opts_t *o, const bench_result_t *r);
void bench_kernels_json(FILE *f, const bench_opts_t *o, const bench_result_t *r);

/* The split of each timed step; device_waits (CUDA): exposed time is the
 * compute stream's stalls (FSDP_TL_COMPUTE_WAIT), else the host calls' waits. */
void bench_split_steps(const fsdp_tl_event_t *tl, size_t n, const bench_window_t *w, int steps,
                       int device_waits, bench_split_t *out);
/* Writes the timeline of every rank as one Chrome trace (rank 0 writes the
 * file; collective over the engine's ranks). t0: this rank's time origin. */
fsdp_status_t bench_trace_write(fsdp_engine_t eng, const char *path, const fsdp_tl_event_t *tl,
                                size_t n, const bench_window_t *w, int steps, double t0);

/* What runs each of GPT-2's four block products (qkv, attention projection,
 * fc, fc projection) over rows x n_embd in dt on stream s: per layer
 * fsdp_cuda_product_impl's words (the cuBLASLt epilogue or the product and a
 * pass, with why), the choice the model's products make; "; "-separated into
 * buf. Empty for other models (s must be a CUDA stream); "unknown: <error>" on failure. */
void bench_products(const lm_t *lm, fsdp_stream_t s, fsdp_dtype_t dt, int rows, char *buf,
                    size_t n);
void bench_print_header(const bench_opts_t *o, int nranks, const char *backend,
                        const bench_machine_t *m, double peak_rank);
void bench_print_row(const bench_result_t *r);
/* --memory-plan: GPT-2 124M and 1558M (and --preset) at --micro-batch x
 * --seq-len in --dtype, before (attention's fp32 probabilities, two logits
 * buffers), now (this build) and after (log-sum-exp, one padded logits
 * buffer) issue 15; computed
 * by fsdp_gpt2_memory, nothing run. With --model llama: the Llama presets
 * by fsdp_llama_memory. 0, or 1 after printing why. */
int bench_print_memory_plan(const bench_opts_t *o);
/* The "Cost" line: tokens/s of one configuration with buddy
 * replicas and without, side by side. */
void bench_print_replica_cost(const bench_result_t *without, const bench_result_t *with);
/* The JSON document (--json on stdout, --json-file to a file). */
void bench_print_json(FILE *f, const bench_opts_t *o, int nranks, const char *backend,
                      const bench_machine_t *m, const bench_result_t *r, int n);

#endif
