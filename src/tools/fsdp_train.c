/* src/tools/fsdp_train.c — fsdp-train: flags, world and engine set-up, then the
 * chosen task (train_mlp.c, train_gpt2.c: GPT-2 and the Llama family). Launch with mpirun -np N, or run it
 * alone for one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/flags.h"
#include "tools/train.h"

static const char usage_text[] =
    "usage: fsdp-train [options]   on several ranks: under fsdp-run or mpirun (docs/launching.md)\n"
    "model and data\n"
    "  --model gpt2|llama|mlp    (default gpt2)\n"
    "  --data PATH               gpt2, llama: text (file or directory; default the fortunes), or\n"
    "                            llm.c token file(s): FILE.bin or a directory of *.bin\n"
    "                            Fashion-MNIST directory (mlp)\n"
    "  --preset NAME             gpt2: tiny, small (default), 124M, 350M, 774M, 1558M;\n"
    "                            llama: tiny (default), SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n"
    "  --layers N --heads N --embd N --context N --vocab N   override the gpt2 preset\n"
    "  --seq-len T               tokens per sequence (default: the context; llama: up to 1024)\n"
    "  --hidden a,b,...          mlp hidden widths (default 512,256)\n"
    "sharding\n"
    "  --strategy zero3|zero2|noshard   (default zero3)\n"
    "  --prefetch D              units gathered ahead (default 1)\n"
    "  --shard-size S            HSDP: shard within groups of S consecutive ranks (e.g. the\n"
    "                            ranks per node), replicate across them (default: the world)\n"
    "  --dtype f32|bf16|f16      parameters as gathered and computed on (master stays f32);\n"
    "                            on cuda, bf16 also makes activations bf16; f16 scales\n"
    "                            the loss dynamically (GradScaler's rule)\n"
    "  --loss-scale X            initial loss scale (f16 default 65536; 1 = none)\n"
    "  --loss-scale-interval N   good steps before the scale doubles (default 2000)\n"
    "  --max-skips K             stop after K steps in a row skipped for NaN/Inf loss or\n"
    "                            gradients (default 20; a skipped step is retried)\n"
    "  --reduce-dtype f32|bf16   what gradients are reduced in (default f32)\n"
    "device\n"
    "  --device cpu|cuda         where shards, gradients and compute live (default cpu;\n"
    "                            cuda: GPU = local rank % visible GPUs; the mlp in f32)\n"
    "  --comm-backend nccl|mpi   collectives of a cuda engine (default: the world's)\n"
    "  --max-live N              cap on gathered units (default: depth + 1, +1 for gpt2's root)\n"
    "  --wrap KINDS              unit per module kind: GPT2Block (gpt2 default),\n"
    "                            LlamaDecoderLayer (llama default), Linear (mlp)\n"
    "  --wrap-min-params N       or: group blocks (layers) into units of at least N parameters\n"
    "  --no-wrap                 one unit for the whole model\n"
    "  --checkpoint KINDS|auto   recompute these units' activations in backward (GPT2Block,\n"
    "                            LlamaDecoderLayer); auto: the fewest leading blocks (layers)\n"
    "                            so that model state + activations + kernel memory fit the\n"
    "                            budget (cuda: free memory at start less 2 GiB; cpu: none,\n"
    "                            nothing checkpointed); a unit per block required\n"
    "  --memory-budget GIB       the budget of --checkpoint auto, per rank (cpu and cuda)\n"
    "optimisation\n"
    "  --global-batch B          sequences or samples per step over all ranks\n"
    "  --micro-batches M         gradient accumulation (default 1)\n"
    "  --accumulate-full         keep full gradients over micro-batches, reduce once\n"
    "  --optim adamw|sgd  --lr X (gpt2, llama 2e-3; mlp 1e-3)  --momentum X  --wd X  --clip X (0 = off)\n"
    "  --schedule cosine|constant  --warmup N  --min-lr-ratio X\n"
    "  --steps N (gpt2, llama 1000)  --epochs N (mlp, 5)  --eval-every N (250)  --eval-batches N  --seed N\n"
    "output\n"
    "  --sample N  --temperature X   gpt2, llama: generate N bytes (tokens) at the end\n"
    "  --log-every N             a step line every N steps (default 1; mlp 100)\n"
    "  --json                    one JSON object per line\n"
    "configuration\n"
    "  --config FILE             YAML: every flag above as a key (its name without --), and\n"
    "                            sharding rules; flags on the command line override it\n"
    "  --print-config            print the effective configuration as such a file, and exit\n"
    "checkpoints (fsdp-ckpt inspects, verifies, converts them)\n"
    "  --save-dir DIR            save into DIR/step-K (and DIR/latest) after the last step;\n"
    "                            DIR is locked for this run and checked for writability and\n"
    "                            space for a checkpoint before the first step\n"
    "  --save-every N            ... and after every N steps\n"
    "  --save-overwrite          start afresh in a DIR that holds checkpoints, replacing\n"
    "                            the steps this run saves (else both are refused)\n"
    "  --resume auto|PATH        continue from DIR's latest checkpoint (auto: if there is one),\n"
    "                            or from PATH (a step or save directory), at any rank count\n"
    "  --stop-after N            stop after update N as if preempted (the schedule still\n"
    "                            spans --steps); resume later with --resume\n"
    "  --replica-every K         snapshot every K updates into the buddy rank's memory\n"
    "                            (fsdp/replica.h; 0 off, the default); under an elastic\n"
    "                            fsdp-run a lost rank's shard is then restored from it and\n"
    "                            the survivors go on (docs/launching.md)\n";

static int parse_list(const char *v, train_opts_t *o) {
  o->n_hidden = 0;
  for (const char *p = v; *p && o->n_hidden < 6;) {
    char *end;
    long w = strtol(p, &end, 10);
    if (end == p || w <= 0 || (*end && *end != ',')) return -1;
    o->hidden[o->n_hidden++] = (int)w;
    p = *end ? end + 1 : end;
  }
  return o->n_hidden ? 0 : -1;
}

/* --preset: a GPT-2 or a Llama shape ("tiny" names both); which one the
 * model takes is finish_options' to check, once --model is known. */
static int parse_preset(const char *tool, const char *v, train_opts_t *o) {
  fsdp_gpt2_config_t g;
  const int gpt = fsdp_gpt2_preset(v, &g) == FSDP_SUCCESS;
  const int llama = fsdp_llama_preset(v, &o->llama) == FSDP_SUCCESS;
  if (gpt) o->gpt = o->gpt_preset = g;
  o->preset = v;
  o->preset_of = (gpt ? PRESET_GPT2 : 0) | (llama ? PRESET_LLAMA : 0);
  if (gpt || llama) return 0;
  return fprintf(stderr, "%s: unknown --preset '%s': gpt2's are tiny, small, 124M, 350M, 774M, "
                 "1558M; llama's tiny, SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n", tool, v), -1;
}

/* Flags whose values are words or lists, not numbers. */
static int parse_word(void *ctx, const char *tool, const char *a, const char *v) {
  train_opts_t *o = ctx;
  static const char *const known[] = {"--strategy", "--preset", "--optim", "--schedule",
                                      "--hidden", "--device", "--dtype", "--reduce-dtype"};
  if (!v) return flags_known(a, known, sizeof known / sizeof known[0]);
  if (!strcmp(a, "--strategy")) {
    if (fsdp_strategy_parse(v, &o->cfg.strategy) == FSDP_SUCCESS) return 0;
    return fprintf(stderr, "%s: %s\n", tool, fsdp_last_error()), -1;
  }
  if (!strcmp(a, "--preset")) return parse_preset(tool, v, o);
  if (!strcmp(a, "--optim") && (!strcmp(v, "adamw") || !strcmp(v, "sgd")))
    return o->cfg.optim.kind = !strcmp(v, "sgd") ? FSDP_OPTIM_SGD : FSDP_OPTIM_ADAMW, 0;
  if (!strcmp(a, "--schedule") && (!strcmp(v, "cosine") || !strcmp(v, "constant")))
    return o->cfg.schedule.kind = !strcmp(v, "cosine") ? FSDP_SCHED_WARMUP_COSINE
                                                       : FSDP_SCHED_CONSTANT, 0;
  int taken = flags_config_word(tool, a, v, &o->cfg);
  if (taken <= 0) return taken;
  if (!strcmp(a, "--hidden") && parse_list(v, o) == 0) return 0;
  static const char *const words[] = {"--optim", "--schedule", "--hidden"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (!strcmp(a, words[i]))
      return fprintf(stderr, "%s: %s '%s' is not a valid value (see --help)\n", tool, a, v), -1;
  return fprintf(stderr, "%s: unknown %s '%s' (see --help)\n", tool,
                 strcmp(tool, "fsdp-train") ? "key" : "option", strcmp(tool, "fsdp-train") ? a + 2 : a),
         -1;
}

/* The flags with a value of their own type; the rest are parse_word's. */
#define TRAIN_FLAGS 44
static void flag_table(train_opts_t *o, flag_t *t) {
  const flag_t table[] = {
      {"--model", NULL, FLAG_STR, &o->model}, {"--data", NULL, FLAG_STR, &o->data},
      /* the model's shape: positive, refused here where the file's line is known */
      {"--layers", NULL, FLAG_POS, &o->gpt.n_layer},
      {"--heads", NULL, FLAG_POS, &o->gpt.n_head},
      {"--embd", NULL, FLAG_POS, &o->gpt.n_embd},
      {"--context", NULL, FLAG_POS, &o->gpt.block_size},
      {"--vocab", NULL, FLAG_POS, &o->gpt.vocab_size},
      {"--seq-len", NULL, FLAG_INT, &o->seq_len},
      {"--prefetch", NULL, FLAG_INT, &o->cfg.prefetch_depth},
      {"--max-live", NULL, FLAG_INT, &o->cfg.max_live_units},
      {"--wrap", NULL, FLAG_STR, &o->wrap.wrap_kinds},
      {"--no-wrap", NULL, FLAG_CLEAR, &o->wrap.wrap_kinds},
      {"--wrap-min-params", NULL, FLAG_SIZE, &o->wrap.wrap_min_params},
      {"--checkpoint", NULL, FLAG_STR, &o->wrap.checkpoint_kinds},
      {"--memory-budget", NULL, FLAG_F32, &o->memory_budget},
      /* sequences per rank are an int */
      {"--global-batch", NULL, FLAG_I64_32, &o->global_batch},
      {"--micro-batches", NULL, FLAG_INT, &o->cfg.grad_accum},
      {"--accumulate-full", NULL, FLAG_SET, &o->cfg.accumulate_full_grads},
      {"--lr", NULL, FLAG_F32, &o->cfg.optim.lr},
      {"--momentum", NULL, FLAG_F32, &o->cfg.optim.momentum},
      {"--wd", NULL, FLAG_F32, &o->cfg.optim.weight_decay},
      {"--clip", NULL, FLAG_F32, &o->cfg.optim.max_grad_norm},
      {"--loss-scale", NULL, FLAG_F32, &o->loss_scale},
      {"--loss-scale-interval", NULL, FLAG_INT, &o->cfg.loss_scale_interval},
      {"--max-skips", NULL, FLAG_INT, &o->cfg.max_consecutive_skips},
      {"--warmup", NULL, FLAG_I64, &o->cfg.schedule.warmup_steps},
      {"--min-lr-ratio", NULL, FLAG_F32, &o->cfg.schedule.min_lr_ratio},
      {"--steps", NULL, FLAG_INT, &o->steps}, {"--epochs", NULL, FLAG_INT, &o->epochs},
      {"--eval-every", NULL, FLAG_INT, &o->eval_every},
      {"--log-every", NULL, FLAG_INT, &o->log_every},
      {"--eval-batches", NULL, FLAG_INT, &o->eval_batches},
      {"--seed", NULL, FLAG_I64, &o->seed}, {"--sample", NULL, FLAG_INT, &o->sample},
      {"--temperature", NULL, FLAG_F32, &o->temperature}, {"--json", NULL, FLAG_SET, &o->json},
      {"--save-dir", NULL, FLAG_STR, &o->save_dir},
      {"--save-every", NULL, FLAG_INT, &o->save_every},
      {"--save-overwrite", NULL, FLAG_SET, &o->save_overwrite},
      {"--resume", NULL, FLAG_STR, &o->resume}, {"--stop-after", NULL, FLAG_INT, &o->stop_after},
      {"--replica-every", NULL, FLAG_INT, &o->replica_every},
      {"--comm-backend", "--comm", FLAG_STR, &o->cfg.comm_backend},
      {"--shard-size", NULL, FLAG_INT, &o->cfg.shard_size},
  };
  _Static_assert(sizeof table / sizeof table[0] == TRAIN_FLAGS, "TRAIN_FLAGS counts the table");
  memcpy(t, table, sizeof table);
}

/* --config FILE's keys, then the command line over them. */
static int parse(int argc, char **argv, train_opts_t *o, cfg_file_t *file) {
  flag_t table[TRAIN_FLAGS];
  flag_table(o, table);
  cfg_keys_t keys = {table, TRAIN_FLAGS, parse_word, o, cfg_bench_only, "fsdp-bench"};
  return cfg_parse_args("fsdp-train", usage_text, argc, argv, &keys, file, &o->config);
}

/* --print-config: every key with its effective value, in the file's format. */
static void print_config(train_opts_t *o) {
  flag_t table[TRAIN_FLAGS];
  flag_table(o, table);
  printf("# fsdp-train configuration (fsdp-train --config FILE repeats this run)\n");
  flags_print(stdout, table, TRAIN_FLAGS);
  if (!o->wrap.wrap_kinds) printf("no-wrap: true\n");
  if (!strcmp(o->model, "llama")) printf("preset: %s\n", o->preset); /* its shape */
  printf("strategy: %s\noptim: %s\nschedule: %s\ndevice: %s\ndtype: %s\nreduce-dtype: %s\n",
         fsdp_strategy_name(o->cfg.strategy), o->cfg.optim.kind == FSDP_OPTIM_SGD ? "sgd" : "adamw",
         o->cfg.schedule.kind == FSDP_SCHED_WARMUP_COSINE ? "cosine" : "constant",
         o->cfg.device == FSDP_DEVICE_CUDA ? "cuda" : "cpu", fsdp_dtype_name(o->cfg.param_dtype),
         fsdp_dtype_name(o->cfg.reduce_dtype)); /* the words --dtype takes */
  printf("hidden: \"");
  for (int i = 0; i < o->n_hidden; i++) printf("%s%d", i ? "," : "", o->hidden[i]);
  printf("\"\n");
  if (o->config) cfg_print_rules(stdout, o->config);
}

/* The default wrap policy, told apart from a --wrap given on the command line
 * by its address. */
static const char default_wrap[] = "GPT2Block";

/* --model llama: its preset's shape (default tiny), no GPT-2 shape flag; T up
 * to 1024 by default. */
static int finish_llama(train_opts_t *o) {
  if (memcmp(&o->gpt, &o->gpt_preset, sizeof o->gpt))
    return fprintf(stderr, "fsdp-train: --layers, --heads, --embd, --context and --vocab shape "
                   "gpt2; a llama's shape is its --preset's\n"), -1;
  if (o->preset && !(o->preset_of & PRESET_LLAMA))
    return fprintf(stderr, "fsdp-train: --model llama: --preset %s is a gpt2 shape; llama's are "
                   "tiny, SmolLM-135M, TinyLlama-1.1B, Llama-3.2-1B\n", o->preset), -1;
  if (!o->preset) fsdp_llama_preset(o->preset = "tiny", &o->llama);
  if (o->seq_len < 0) o->seq_len = o->llama.max_seq_len < 1024 ? o->llama.max_seq_len : 1024;
  const int top = o->llama.max_seq_len < FSDP_ATTENTION_MAX_T ? o->llama.max_seq_len
                                                              : FSDP_ATTENTION_MAX_T;
  if (o->seq_len > top)
    return fprintf(stderr, "fsdp-train: --seq-len %d exceeds %d (%s's %d positions, attention's "
                   "limit %d)\n", o->seq_len, top, o->preset, o->llama.max_seq_len,
                   FSDP_ATTENTION_MAX_T), -1;
  return 0;
}

static int finish_options(train_opts_t *o) {
  const int llama = !strcmp(o->model, "llama"), gpt = llama || !strcmp(o->model, "gpt2");
  if (!gpt && cfg_sharding_count(o->config))
    return fprintf(stderr, "fsdp-train: %s: sharding rules and partition specs shape gpt2's and "
                   "llama's units; the mlp has a unit per layer\n", o->config->path), -1;
  if (!gpt && strcmp(o->model, "mlp"))
    return fprintf(stderr, "fsdp-train: --model '%s': use gpt2, llama or mlp\n", o->model), -1;
  if (gpt && !llama && o->preset && !(o->preset_of & PRESET_GPT2))
    return fprintf(stderr, "fsdp-train: --preset %s is a llama shape: add --model llama\n",
                   o->preset), -1;
  if (llama && finish_llama(o)) return -1;
  if (!o->seq_len || !o->global_batch)
    return fprintf(stderr, "fsdp-train: --%s 0: use a positive number (leave the flag out "
                   "for the default)\n", !o->seq_len ? "seq-len" : "global-batch"), -1;
  if (o->seq_len < 0) o->seq_len = o->gpt.block_size;
  if (o->global_batch < 0) o->global_batch = gpt ? 32 : 128;
  if (!o->log_every) o->log_every = gpt ? 1 : 100;
  if (o->cfg.optim.lr == 0.0f) o->cfg.optim.lr = gpt ? 2e-3f : 1e-3f;
  o->cfg.loss_scale_init = o->loss_scale; /* 0: the engine's default for the dtype */
  /* --wrap-min-params replaces the default per-block policy; with an explicit
   * --wrap too, the two policies would contradict each other. */
  if (o->wrap.wrap_min_params && o->wrap.wrap_kinds == default_wrap) o->wrap.wrap_kinds = NULL;
  if (!gpt && o->wrap.wrap_kinds == default_wrap) o->wrap.wrap_kinds = "Linear";
  if (llama && o->wrap.wrap_kinds == default_wrap) o->wrap.wrap_kinds = "LlamaDecoderLayer";
  if (o->wrap.wrap_min_params && o->wrap.wrap_kinds)
    return fprintf(stderr, "fsdp-train: --wrap %s and --wrap-min-params %zu are two wrap "
                   "policies: give one\n", o->wrap.wrap_kinds, o->wrap.wrap_min_params), -1;
  const int ck_auto = o->wrap.checkpoint_kinds && !strcmp(o->wrap.checkpoint_kinds, "auto");
  if (ck_auto && !gpt)
    return fprintf(stderr, "fsdp-train: --checkpoint auto: gpt2 and llama recompute blocks; "
                   "the mlp recomputes nothing\n"), -1;
  if (o->memory_budget < 0.0f || (o->memory_budget > 0.0f && !ck_auto))
    return fprintf(stderr, "fsdp-train: --memory-budget %g: a positive number of GiB, the "
                   "budget of --checkpoint auto\n", (double)o->memory_budget), -1;
  if ((o->save_every || (o->resume && !strcmp(o->resume, "auto"))) && !o->save_dir)
    return fprintf(stderr, "fsdp-train: --save-every and --resume auto need --save-dir\n"), -1;
  if (o->replica_every < 0 || (o->replica_every && !gpt))
    return fprintf(stderr, "fsdp-train: --replica-every %d: use a number of updates >= 1 (0: "
                   "off), with --model gpt2 or llama\n", o->replica_every), -1;
  if ((gpt ? o->steps : o->epochs) <= 0)
    return fprintf(stderr, "fsdp-train: --%s must be positive\n", gpt ? "steps" : "epochs"), -1;
  return 0;
}

int main(int argc, char **argv) {
  train_opts_t o = {.model = "gpt2", .cfg = FSDP_CONFIG_INIT, .hidden = {512, 256},
                    .n_hidden = 2, .steps = 1000, .epochs = 5, .eval_every = 250,
                    .seed = 1, .eval_batches = 4, .temperature = 0.8f,
                    .seq_len = -1, .global_batch = -1, /* -1: not given */
                    .wrap = {.wrap_kinds = default_wrap}};
  fsdp_gpt2_preset("small", &o.gpt);
  o.gpt_preset = o.gpt;
  o.cfg.optim.lr = 0.0f; /* per model, below */
  o.cfg.optim.momentum = 0.9f;
  o.cfg.optim.weight_decay = 0.0f;
  o.cfg.optim.max_grad_norm = 1.0f;
  o.cfg.schedule.kind = FSDP_SCHED_WARMUP_COSINE;
  o.cfg.schedule.warmup_steps = -1;
  o.cfg.schedule.min_lr_ratio = 0.1f;
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

  trainer_t t = {.o = &o, .t0 = fsdp_time_now()};
  int rc = 1;
  t.joining = fsdp_world_joining();
  if (t.joining ? fsdp_world_rejoin(&t.world, NULL, NULL) : fsdp_world_init(&t.world, NULL))
    goto fail;
  t.rank = fsdp_world_rank(t.world);
  t.nranks = fsdp_world_size(t.world);
  if (flags_select_device("fsdp-train", t.world, &o.cfg)) {
    if (t.nranks > 1) fsdp_world_abort(t.world, FSDP_SUCCESS, "fsdp-train: no CUDA device");
    goto done;
  }
  /* Open MPI hands rank 0 a pseudo-terminal even when mpirun's output is piped. */
  t.tty = t.rank == 0 && isatty(STDOUT_FILENO) && !o.json && !getenv("OMPI_COMM_WORLD_SIZE");
  rc = strcmp(o.model, "mlp") ? train_gpt2(&t) : train_mlp(&t);
  if (rc == -2) rc = 1; /* the task said why */
  else if (rc) goto fail;
  goto done;
fail:
  /* This rank's failure may be its own (a file only it cannot read): with
   * peers, end the job now instead of leaving them waiting for us. */
  if (t.world && fsdp_world_size(t.world) > 1) {
    char line[1200];
    snprintf(line, sizeof line, "fsdp-train: rank %d: %s", fsdp_world_rank(t.world),
             t.error[0] ? t.error : fsdp_last_error());
    fsdp_ckpt_unlock(t.lock); /* the process ends in there */
    fsdp_world_abort(t.world, FSDP_SUCCESS, line);
  }
  fprintf(stderr, "fsdp-train: rank %d: %s\n", t.world ? fsdp_world_rank(t.world) : 0,
          t.error[0] ? t.error : fsdp_last_error());
  rc = 1;
done:
  fsdp_ckpt_unlock(t.lock);
  fsdp_replica_destroy(t.replica);
  fsdp_engine_destroy(t.eng);
  fsdp_world_destroy(t.world);
  cfg_free(&file);
  return rc;
}
