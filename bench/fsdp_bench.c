/* bench/fsdp_bench.c — fsdp-bench: flags, the world, the measured peak, and
 * the configurations to run (one, or a sweep of strategies x prefetch depths);
 * bench_run.c measures each. Launch with mpirun -np N fsdp-bench ... */
#include <stdlib.h>
#include <string.h>

#include "fsdp_bench.h"
#include "tools/flags.h"

static const char usage_text[] =
    "usage: fsdp-bench [options]   on several ranks: under fsdp-run or mpirun (docs/launching.md)\n"
    "model (synthetic data: random tokens / inputs, different on every rank)\n"
    "  --model gpt2|llama|mlp     (default gpt2)\n"
    "  --preset NAME              gpt2: tiny, small (default), 124M, 350M, 774M, 1558M;\n"
    "                             llama: tiny (default), SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n"
    "  --seq-len T                tokens per sequence (default: the preset's context; llama:\n"
    "                             up to 1024)\n"
    "  --hidden a,b,...           mlp hidden widths (default 512,256; 784 in, 10 out)\n"
    "  --wrap KINDS | --wrap-min-params N | --no-wrap   units, as fsdp-train (GPT2Block)\n"
    "  --checkpoint KINDS|auto    recompute these units' activations in backward; auto:\n"
    "                             the fewest leading blocks (layers) so that model state +\n"
    "                             activations + kernel memory fit the budget (cuda: free\n"
    "                             memory at start less 2 GiB; cpu: none, nothing checkpointed)\n"
    "  --memory-budget GIB        the budget of --checkpoint auto, per rank; with\n"
    "                             --memory-plan: the k auto would choose at it\n"
    "sharding\n"
    "  --strategy zero3|zero2|noshard   (default zero3)\n"
    "  --prefetch D               units gathered ahead (default 1)\n"
    "  --max-live N               cap on gathered units (default depth + 1, + 1 for gpt2's root)\n"
    "  --micro-batch B            sequences (gpt2) or samples (mlp) per rank per micro-batch\n"
    "                             (default 8 for gpt2, 64 for mlp)\n"
    "  --micro-batches M          micro-batches per step (gradient accumulation, default 1)\n"
    "  --dtype f32|bf16|f16       parameters as gathered (default f32); bf16: fp32 master and\n"
    "                             optimizer, gathers move bf16, the CPU computes in fp32, a\n"
    "                             GPU in bf16 (activations too; fp32 gradients and statistics)\n"
    "                             f16: gathers move fp16, the loss is scaled dynamically\n"
    "  --reduce-dtype f32|bf16    what gradients are reduced in (default f32)\n"
    "  --device cpu|cuda          where shards, gradients and compute live (default cpu;\n"
    "                             cuda: GPU = local rank % visible GPUs; the mlp in f32)\n"
    "  --comm-backend nccl|mpi    (or --comm) collectives of a cuda engine (default: the\n"
    "                             world's)\n"
    "  --shard-size S             HSDP: ranks per shard group, a divisor of the world\n"
    "                             (default 0: the world); rows say R x S and the bytes\n"
    "                             each rank moves per step in each group\n"
    "run\n"
    "  -w, --warmup N             untimed steps first (default 3)\n"
    "  -n, --iters N              timed steps (default 20)\n"
    "  --rounds R                 run every configuration R times, round-robin, each on a\n"
    "                             fresh engine, pooling the timed steps (default 1)\n"
    "  -c, --check 0|1            correctness check after the timed steps (default 1)\n"
    "  --peak-size N              n of the n x n x n product that measures the peak (default\n"
    "                             2048 on cpu, 8192 on cuda; 0: no MFU)\n"
    "  --seed N                   model and data seed (default 1)\n"
    "  --sweep                    every strategy x prefetch depth (world sizes: bench/sweep.sh)\n"
    "  --sweep-strategies LIST    (default zero3,zero2,noshard)\n"
    "  --sweep-prefetch LIST      (default 0,1,2; noshard gathers nothing and runs once)\n"
    "  --sweep-shard-sizes LIST   HSDP shard sizes to sweep, 0 = the world (default: only\n"
    "                             --shard-size)\n"
    "output\n"
    "  --memory-plan              print GPT-2's activation memory per layer (124M, 1558M,\n"
    "                             --preset) before and after issue 15 (--model llama: its\n"
    "                             presets), and the host memory buddy replicas take per rank\n"
    "                             at shard sizes 1, 8, 64 and --shard-size, computed; run nothing\n"
    "  --config FILE              YAML: every flag as a key (its name without --) and sharding\n"
    "                             rules, as fsdp-train; the command line overrides it\n"
    "  --print-config             print the effective configuration as such a file, and exit\n"
    "  --json                     one JSON document on stdout (rank 0) instead of the table\n"
    "  --json-file PATH           also write that document to PATH (the table still prints)\n"
    "  --trace FILE               the timed steps of every rank as one Chrome trace (Perfetto,\n"
    "                             chrome://tracing): pid = rank, tracks compute/gather/reduce\n"
    "  --replica-every K          snapshot every K steps to the buddy rank (fsdp/replica.h),\n"
    "                             inside the timed steps: each configuration runs without\n"
    "                             and with replicas, tokens/s side by side (0 off)\n"
    "  --kernel-profile           gpt2, llama: time each kernel class (fsdp/profile.h) in the timed\n"
    "                             steps (CUDA events on the compute stream; host clock on the\n"
    "                             CPU) and print per class calls, ms, share of the step,\n"
    "                             TF/s and GB/s of its declared FLOPs and bytes, and the\n"
    "                             fraction of the bounding peak (off: no cost)\n"
    "\n"
    "What is measured (median and spread over the timed steps)\n"
    "  step time    wall time of forward + backward + optimizer step; per step the slowest\n"
    "               rank's. tokens/s = ranks x micro-batch x micro-batches x T / step time;\n"
    "               per rank = that / ranks (the MLP counts samples)\n"
    "  comm         time at least one collective (all-gather or reduce-scatter) was in flight\n"
    "               on this rank's communication streams, from the engine's timeline\n"
    "  exposed      time compute waited for communication: for each acquire, release and\n"
    "               step call, the time from its start to the last end inside it of a\n"
    "               collective it can wait for (acquire: its unit's gather or a reduction\n"
    "               still holding a gradient buffer; release, step: reductions). Collectives\n"
    "               that ended before the call began were hidden and count nothing; it\n"
    "               includes a stream's wake-up latency, so it can exceed comm slightly.\n"
    "               On cuda: the time the compute stream stalled waiting for a gather or a\n"
    "               reduction (CUDA events recorded around each of its waits; the host\n"
    "               calls only queue work)\n"
    "  compute      step time - exposed (everything else the host did); hidden = 1 -\n"
    "               exposed/comm. The split is the mean over ranks\n"
    "  MFU          model FLOPs/token x tokens/s / peak, where FLOPs/token = 6 (P - wpe) +\n"
    "               12 L T C for GPT-2 (PaLM, nanoGPT; recomputation not counted), for a\n"
    "               Llama 6 (P - embed_tokens when untied, a lookup; tied, the embedding is\n"
    "               the head and counts) + 12 L T C (GQA shares k, v: the scores still\n"
    "               span NH x D = C), 6P per sample for the MLP, and peak = the sum over ranks of each rank's sgemm\n"
    "               rate while every rank runs sgemms at once (same BLAS, same threads; best\n"
    "               of three windows of 0.5 s)\n"
    "  memory       per rank, the largest rank: model = persistent + gathered-parameter peak\n"
    "               + gradient-buffer peak as the engine accounts them; ZeRO = 16P/N (NO_SHARD\n"
    "               16P; bf16 adds 2P/N, and 4P on one rank) + gathered (ZeRO-3: live units x\n"
    "               4U, live = --max-live; ZeRO-2: 4P; N = 1 or NO_SHARD: 0; bf16: 6 bytes\n"
    "               an element) + (2 + held root) x 4U of gradients, U = the largest unit;\n"
    "               act = the model's activation buffers; RSS = the process's\n"
    "               resident high-water mark (VmHWM) during the configuration; on cuda\n"
    "               also device = GPU memory in use after the timed steps (cudaMemGetInfo:\n"
    "               total - free, with the CUDA context and every process on that GPU)\n"
    "  load         CPU the machine spent on other processes (and the hypervisor's steal)\n"
    "               during the timed steps, as a share of all cores: /proc/stat busy time\n"
    "               less the ranks' own; above a few per cent, the timings are disturbed\n"
    "  #wrong       parameter elements, assembled from every rank's shards, that are not\n"
    "               finite or differ between ranks, plus non-finite losses; exit status 1 if\n"
    "               any\n";


static int parse_list(const char *flag, const char *v, int *out, int max, int *n, int lo) {
  char items[8][32];
  *n = bench_split(v, items, max < 8 ? max : 8);
  for (int i = 0; i < *n; i++) {
    int64_t x;
    if (bench_parse_i64("fsdp-bench", flag, items[i], 0, &x)) return -1;
    if (x < lo) return fprintf(stderr, "fsdp-bench: %s: %lld is below %d\n", flag, (long long)x, lo), -1;
    out[i] = (int)x;
  }
  if (*n <= 0) return fprintf(stderr, "fsdp-bench: %s '%s' is not a list\n", flag, v), -1;
  return 0;
}

static int parse_strategies(const char *tool, const char *v, bench_opts_t *o) {
  char items[3][32];
  o->n_strategies = bench_split(v, items, 3);
  if (o->n_strategies <= 0) return fprintf(stderr, "%s: bad --sweep-strategies\n", tool), -1;
  for (int i = 0; i < o->n_strategies; i++)
    if (fsdp_strategy_parse(items[i], &o->strategies[i]))
      return fprintf(stderr, "%s: %s\n", tool, fsdp_last_error()), -1;
  return 0;
}

/* Flags whose values are words or lists. */
static int parse_word(void *ctx, const char *tool, const char *a, const char *v) {
  bench_opts_t *o = ctx;
  static const char *const known[] = {"--strategy", "--preset", "--device", "--dtype",
                                      "--reduce-dtype", "--hidden", "--sweep-prefetch",
                                      "--sweep-strategies", "--sweep-shard-sizes"};
  if (!v) return flags_known(a, known, sizeof known / sizeof known[0]);
  if (!strcmp(a, "--strategy")) {
    if (fsdp_strategy_parse(v, &o->cfg.strategy) == FSDP_SUCCESS) return 0;
    return fprintf(stderr, "%s: %s\n", tool, fsdp_last_error()), -1;
  }
  if (!strcmp(a, "--preset")) { /* which family's is finish_options' to check */
    o->preset = v;
    o->preset_llama = fsdp_llama_preset(v, &o->llama) == FSDP_SUCCESS;
    if (fsdp_gpt2_preset(v, &o->gpt) == FSDP_SUCCESS || o->preset_llama) return 0;
    return fprintf(stderr, "%s: unknown --preset '%s': gpt2's are tiny, small, 124M, 350M, "
                   "774M, 1558M; llama's tiny, SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n",
                   tool, v), -1;
  }
  int taken = flags_config_word(tool, a, v, &o->cfg);
  if (taken <= 0) return taken;
  if (!strcmp(a, "--hidden")) return parse_list(a, v, o->hidden, 6, &o->n_hidden, 1);
  if (!strcmp(a, "--sweep-prefetch")) return parse_list(a, v, o->depths, 8, &o->n_depths, 0);
  if (!strcmp(a, "--sweep-strategies")) return parse_strategies(tool, v, o);
  if (!strcmp(a, "--sweep-shard-sizes"))
    return parse_list(a, v, o->shard_sizes, 4, &o->n_shard_sizes, 0);
  return fprintf(stderr, "%s: unknown %s '%s' (see --help)\n", tool,
                 strcmp(tool, "fsdp-bench") ? "key" : "option", strcmp(tool, "fsdp-bench") ? a + 2 : a),
         -1;
}

/* The flags with a value of their own type; the rest are parse_word's. */
#define BENCH_FLAGS 26
static void flag_table(bench_opts_t *o, flag_t *t) {
  const flag_t table[] = {
      {"--model", NULL, FLAG_STR, &o->model},         {"--seq-len", NULL, FLAG_INT, &o->seq_len},
      {"--wrap", NULL, FLAG_STR, &o->wrap.wrap_kinds},
      {"--wrap-min-params", NULL, FLAG_SIZE, &o->wrap.wrap_min_params},
      {"--checkpoint", NULL, FLAG_STR, &o->wrap.checkpoint_kinds},
      {"--memory-budget", NULL, FLAG_F32, &o->memory_budget},
      {"--prefetch", NULL, FLAG_INT, &o->cfg.prefetch_depth},
      {"--max-live", NULL, FLAG_INT, &o->cfg.max_live_units},
      {"--micro-batch", NULL, FLAG_INT, &o->micro_batch},
      {"--micro-batches", NULL, FLAG_INT, &o->cfg.grad_accum},
      {"--warmup", "-w", FLAG_I64, &o->warmup},       {"--iters", "-n", FLAG_I64, &o->iters},
      {"--rounds", NULL, FLAG_I64, &o->rounds},
      {"--check", "-c", FLAG_I64, &o->check},         {"--peak-size", NULL, FLAG_I64, &o->peak_size},
      {"--seed", NULL, FLAG_I64, &o->seed},           {"--trace", NULL, FLAG_STR, &o->trace},
      {"--json-file", NULL, FLAG_STR, &o->json_file},
      {"--no-wrap", NULL, FLAG_CLEAR, &o->wrap.wrap_kinds},
      {"--json", NULL, FLAG_SET, &o->json},          {"--sweep", NULL, FLAG_SET, &o->sweep},
      {"--memory-plan", NULL, FLAG_SET, &o->memory_plan},
      {"--comm-backend", "--comm", FLAG_STR, &o->cfg.comm_backend},
      {"--shard-size", NULL, FLAG_INT, &o->cfg.shard_size},
      {"--kernel-profile", NULL, FLAG_SET, &o->kernel_profile},
      {"--replica-every", NULL, FLAG_INT, &o->replica_every},
  };
  _Static_assert(sizeof table / sizeof table[0] == BENCH_FLAGS, "BENCH_FLAGS counts the table");
  memcpy(t, table, sizeof table);
}

/* --config FILE's keys, then the command line over them. */
static int parse(int argc, char **argv, bench_opts_t *o, cfg_file_t *file) {
  flag_t table[BENCH_FLAGS];
  flag_table(o, table);
  cfg_keys_t keys = {table, BENCH_FLAGS, parse_word, o, cfg_train_only, "fsdp-train"};
  return cfg_parse_args("fsdp-bench", usage_text, argc, argv, &keys, file, &o->config);
}

static void print_list(const char *key, const int *v, int n) {
  printf("%s: \"", key);
  for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", v[i]);
  printf("\"\n");
}

/* --print-config: every key with its effective value, in the file's format. */
static void print_config(bench_opts_t *o) {
  flag_t table[BENCH_FLAGS];
  flag_table(o, table);
  printf("# fsdp-bench configuration (fsdp-bench --config FILE repeats this run)\n");
  flags_print(stdout, table, BENCH_FLAGS);
  if (!o->wrap.wrap_kinds) printf("no-wrap: true\n");
  printf("preset: %s\nstrategy: %s\ndevice: %s\ndtype: %s\nreduce-dtype: %s\n", o->preset,
         fsdp_strategy_name(o->cfg.strategy), o->cfg.device == FSDP_DEVICE_CUDA ? "cuda" : "cpu",
         fsdp_dtype_name(o->cfg.param_dtype), fsdp_dtype_name(o->cfg.reduce_dtype));
  print_list("hidden", o->hidden, o->n_hidden);
  print_list("sweep-prefetch", o->depths, o->n_depths);
  if (o->n_shard_sizes) print_list("sweep-shard-sizes", o->shard_sizes, o->n_shard_sizes);
  printf("sweep-strategies: \"");
  for (int i = 0; i < o->n_strategies; i++)
    printf("%s%s", i ? "," : "", fsdp_strategy_name(o->strategies[i]));
  printf("\"\n");
  if (o->config) cfg_print_rules(stdout, o->config);
}

/* --model llama: the preset's shape (default tiny), a unit per decoder layer
 * by default, T up to 1024 by default. */
static int finish_llama(bench_opts_t *o) {
  if (!strcmp(o->preset, "small")) { /* the default, GPT-2's */
    o->preset = "tiny";
    o->preset_llama = fsdp_llama_preset("tiny", &o->llama) == FSDP_SUCCESS;
  }
  if (!o->preset_llama)
    return fprintf(stderr, "fsdp-bench: --model llama: --preset %s is a gpt2 shape; llama's "
                   "are tiny, SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n", o->preset), -1;
  if (o->wrap.wrap_kinds && !strcmp(o->wrap.wrap_kinds, "GPT2Block"))
    o->wrap.wrap_kinds = "LlamaDecoderLayer";
  const int top = o->llama.max_seq_len < FSDP_ATTENTION_MAX_T ? o->llama.max_seq_len
                                                              : FSDP_ATTENTION_MAX_T;
  if (o->seq_len < 0) o->seq_len = top < 1024 ? top : 1024;
  if (o->seq_len > top && !o->memory_plan) /* the plan says which presets it fits */
    return fprintf(stderr, "fsdp-bench: --seq-len %d exceeds %d (%s's %d positions, "
                   "attention's limit %d)\n", o->seq_len, top, o->preset, o->llama.max_seq_len,
                   FSDP_ATTENTION_MAX_T), -1;
  return 0;
}

static int finish_options(bench_opts_t *o) {
  o->lm = lm_pick(o->model, &o->gpt, &o->llama);
  const int llama = !strcmp(o->model, "llama"), gpt = o->lm.kind != LM_NONE;
  if (!gpt && strcmp(o->model, "mlp"))
    return fprintf(stderr, "fsdp-bench: --model '%s': use gpt2, llama or mlp\n", o->model), -1;
  if (!gpt && cfg_sharding_count(o->config))
    return fprintf(stderr, "fsdp-bench: %s: sharding rules and partition specs shape gpt2's and "
                   "llama's units; the mlp has a unit per layer\n", o->config->path), -1;
  if (!o->seq_len)
    return fprintf(stderr, "fsdp-bench: --seq-len 0: use a positive number (leave the flag "
                   "out for the model's context)\n"), -1;
  if (llama && finish_llama(o)) return -1;
  fsdp_gpt2_config_t named;
  if (gpt && !llama && fsdp_gpt2_preset(o->preset, &named) != FSDP_SUCCESS)
    return fprintf(stderr, "fsdp-bench: --preset %s is a llama shape: add --model llama\n",
                   o->preset), -1;
  if (o->seq_len < 0) o->seq_len = o->gpt.block_size;
  if (!o->micro_batch) o->micro_batch = gpt ? 8 : 64;
  if (o->peak_size < 0) o->peak_size = o->cfg.device == FSDP_DEVICE_CUDA ? 8192 : 2048;
  if (o->iters < 1 || o->rounds < 1)
    return fprintf(stderr, "fsdp-bench: --iters and --rounds must be at least 1\n"), -1;
  if (o->trace && o->sweep)
    return fprintf(stderr, "fsdp-bench: --trace records one configuration: drop --sweep\n"), -1;
  if (o->kernel_profile && !gpt)
    return fprintf(stderr, "fsdp-bench: --kernel-profile times gpt2's and llama's kernel "
                   "classes: use --model gpt2 or llama\n"), -1;
  const int ck_auto = o->wrap.checkpoint_kinds && !strcmp(o->wrap.checkpoint_kinds, "auto");
  if (ck_auto && !gpt)
    return fprintf(stderr, "fsdp-bench: --checkpoint auto: gpt2 and llama recompute blocks; "
                   "the mlp recomputes nothing\n"), -1;
  if (o->memory_budget < 0.0f || (o->memory_budget > 0.0f && !ck_auto && !o->memory_plan))
    return fprintf(stderr, "fsdp-bench: --memory-budget %g: a positive number of GiB, the "
                   "budget of --checkpoint auto (or of --memory-plan's choice)\n",
                   (double)o->memory_budget), -1;
  if (o->peak_size > 16384)
    return fprintf(stderr, "fsdp-bench: --peak-size must be in [0, 16384]\n"), -1;
  return 0;
}

static int write_json_file(const bench_opts_t *o, int nranks, const char *backend,
                           const bench_machine_t *m, const bench_result_t *res, int n) {
  FILE *f = fopen(o->json_file, "w");
  if (f) bench_print_json(f, o, nranks, backend, m, res, n);
  if (!f || fclose(f) != 0)
    return fprintf(stderr, "fsdp-bench: cannot write %s\n", o->json_file), 1;
  return 0;
}

/* The configurations to run: one, or the sweep (noshard gathers nothing and
 * runs at the first depth only, over the whole world); shard sizes innermost. */
static int configs(const bench_opts_t *o, fsdp_strategy_t *st, int *depth, int *shard) {
  if (!o->sweep)
    return st[0] = o->cfg.strategy, depth[0] = o->cfg.prefetch_depth,
           shard[0] = o->cfg.shard_size, 1;
  int n = 0, n_sizes = o->n_shard_sizes ? o->n_shard_sizes : 1;
  for (int i = 0; i < o->n_strategies; i++)
    for (int j = 0; j < o->n_depths; j++)
      for (int k = 0; k < n_sizes && n < BENCH_MAX_CONFIGS; k++) {
        int size = o->n_shard_sizes ? o->shard_sizes[k] : o->cfg.shard_size;
        if (o->strategies[i] == FSDP_NO_SHARD && (j > 0 || k > 0)) continue;
        st[n] = o->strategies[i], depth[n] = o->depths[j];
        shard[n++] = o->strategies[i] == FSDP_NO_SHARD ? 0 : size;
      }
  return n;
}

/* Rounds outermost: each round runs every configuration once, so load from
 * elsewhere on the machine spreads over all of them instead of one. */
static int run_all(fsdp_world_t world, const bench_opts_t *o, double peak_rank) {
  bench_result_t *res = calloc(BENCH_MAX_CONFIGS, sizeof *res);
  fsdp_strategy_t st[BENCH_MAX_CONFIGS];
  int depth[BENCH_MAX_CONFIGS], shard[BENCH_MAX_CONFIGS], n = configs(o, st, depth, shard), rc = 0;
  int rank = fsdp_world_rank(world), nranks = fsdp_world_size(world);
  const char *backend = fsdp_world_backend(world);
  bench_machine_t m;
  if (!res) return fprintf(stderr, "fsdp-bench: out of memory\n"), 1;
  bench_machine(&m);
  if (rank == 0 && !o->json) bench_print_header(o, nranks, backend, &m, peak_rank);
  /* --replica-every K: each configuration without replicas, then with them */
  const int per = o->replica_every ? 2 : 1;
  if (n * per > BENCH_MAX_CONFIGS) n = BENCH_MAX_CONFIGS / per;
  for (int round = 0; round < (int)o->rounds && rc == 0; round++)
    for (int i = 0; i < n * per && rc == 0; i++) {
      bench_opts_t oc = *o;
      int k = i / per;
      oc.replica_every = per == 2 && i % 2 == 0 ? 0 : o->replica_every;
      rc = bench_run(world, &oc, st[k], depth[k], shard[k], peak_rank, round, &res[i]) ? 1 : 0;
      if (rc == 0 && rank == 0 && !o->json && round == (int)o->rounds - 1) {
        bench_print_row(&res[i]);
        bench_print_kernels(o, &res[i]);
      }
    }
  n *= per;
  for (int i = 1; rc == 0 && rank == 0 && !o->json && per == 2 && i < n; i += 2)
    bench_print_replica_cost(&res[i - 1], &res[i]);
  if (rc == 0 && rank == 0 && !o->json && cfg_sharding_count(o->config)) {
    printf("\nsharding rules (the last model's matches):\n");
    cfg_print_matches(stdout, o->config);
  }
  double wrong = 0;
  for (int i = 0; i < n; i++) wrong += res[i].wrong;
  if (rc == 0 && rank == 0 && o->json) bench_print_json(stdout, o, nranks, backend, &m, res, n);
  else if (rc == 0 && rank == 0 && o->trace) printf("\ntrace: %s\n", o->trace);
  if (rc == 0 && rank == 0 && o->json_file) rc = write_json_file(o, nranks, backend, &m, res, n);
  for (int i = 0; i < n; i++) bench_result_free(&res[i]);
  free(res);
  return rc ? rc : wrong > 0 ? 1 : 0;
}

int main(int argc, char **argv) {
  bench_opts_t o = {.model = "gpt2", .preset = "small", .wrap = {.wrap_kinds = "GPT2Block"},
                    .hidden = {512, 256}, .n_hidden = 2, .cfg = FSDP_CONFIG_INIT, .warmup = 3,
                    .iters = 20, .rounds = 1, .check = 1, .peak_size = -1, .seed = 1,
                    .seq_len = -1, /* -1: the context */
                    .strategies = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD},
                    .n_strategies = 3, .depths = {0, 1, 2}, .n_depths = 3};
  fsdp_gpt2_preset("small", &o.gpt);
  cfg_file_t file = {0};
  int p = parse(argc, argv, &o, &file), print;
  if (p || finish_options(&o)) {
    cfg_free(&file);
    return p > 0 ? 0 : 2;
  }
  if (cfg_path(argc, argv, &print), print) { /* once per job, also under a launcher */
    if (cfg_launch_rank() == 0) print_config(&o);
    cfg_free(&file);
    return 0;
  }
  if (o.memory_plan) {
    int mp = bench_print_memory_plan(&o);
    cfg_free(&file);
    return mp;
  }

  fsdp_world_t world = NULL;
  fsdp_comm_t comm = NULL;
  double peak = 0.0;
  int rc = 1;
  if (fsdp_world_init(&world, NULL) || fsdp_comm_create(world, &comm)) goto fail;
  if (flags_select_device("fsdp-bench", world, &o.cfg)) goto done;
  if (o.peak_size > 0) {
    fsdp_status_t st = o.cfg.device == FSDP_DEVICE_CUDA
                           ? bench_cuda_peak_flops(comm, (int)o.peak_size, o.cfg.param_dtype, &peak)
                           : bench_peak_flops(comm, (int)o.peak_size, &peak);
    if (st || bench_reduce(comm, &peak, 1, FSDP_SUM)) goto fail;
    peak /= fsdp_world_size(world); /* the mean rank's */
  }
  rc = run_all(world, &o, peak);
  goto done;
fail:
  fprintf(stderr, "fsdp-bench: %s\n", fsdp_last_error());
done:
  fsdp_comm_destroy(comm);
  fsdp_world_destroy(world);
  cfg_free(&file);
  return rc;
}
