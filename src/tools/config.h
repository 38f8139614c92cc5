/* src/tools/config.h — the configuration file of fsdp-train and fsdp-bench:
 * YAML, read with libyaml (Debian's libyaml-dev: well kept, and every node
 * carries its line, so each error names the file and the line).
 *
 * The file is one mapping. Every command-line flag is a key: its name without
 * "--" (`global-batch: 32`; flags that take no value take true or false), and
 * the command line overrides the file. `sharding:` holds a list of rules, each
 * a mapping with `match:` (a wildcard pattern, fsdp/plan.h) and settings:
 *   over modules (GPT-2's blocks "h.<i>", a Llama's layers "model.layers.<i>"):
 *     wrap: true|false           a unit of its own per matching module
 *     wrap_min_params: N         matching consecutive modules grouped into
 *                                units of at least N parameters (the last
 *                                group may hold fewer: it stays a unit)
 *     checkpoint: true|false     recompute the unit's activations in backward
 *   over units (their names as the plan prints them: "root", "h.3", "h.0-1",
 *   "model.layers.0-1"):
 *     reshard_after_forward: true|false   ZeRO-3 (true) or ZeRO-2 for the unit
 *     param_dtype: f32|bf16
 *   over tensors ("h.3.attn.c_attn.weight"): parameter groups
 *     lr_mult: X, wd_mult: X     factors on the learning rate and weight decay
 * A rule that matches nothing, a key that does not exist, a value of the wrong
 * type and two rules that give one module, unit or tensor different values are
 * errors naming the rule, the file and the line. Modules no wrap rule
 * matches follow --wrap's kinds. The rules shape GPT-2 and Llama (fsdp-train
 * refuses them with --model mlp).
 *
 * torchprime's sharding file is read as is: a top-level key that is no flag
 * (or a flag's key whose list reads as a spec), its value a list, is NAME:
 * PARTITION_SPEC. NAME is a tensor or a module, '.' between parts, '*' a part
 * that is a whole number (torchprime's rule: "model.layers.*" is
 * model.layers.0, model.layers.1, ... and nothing below them), "" the whole
 * model, and a "[i]" suffix picks a module's i-th output. The spec gives each
 * dimension null, a mesh axis (data, fsdp, tensor, expert, context) or a list
 * of axes. What fsdp does is what torchprime's FSDP files say:
 *   a tensor with fsdp on one dimension (null elsewhere, one entry per
 *     dimension): sharded, as every parameter is (flat shards);
 *   a module output with fsdp and/or data on the batch dimension (0): data
 *     parallelism, as every rank already runs; a model's wrappable module
 *     (GPT-2's h.<i>) so named becomes a unit of its own, as "wrap: true".
 * Any other axis, two sharded dimensions, no sharded dimension, data on a
 * tensor, a non-batch dimension of an output, a rank other than the tensor's
 * or the output's, and an output index past 0 are refused naming the file and
 * the line (2-D sharding is not supported). A name that matches nothing is an
 * error, as a rule's is; a tied head answers to "lm_head.weight" too
 * (cfg_model_t's aliases). */
#ifndef FSDP_TOOLS_CONFIG_H
#define FSDP_TOOLS_CONFIG_H

#include <stdio.h>

#include "fsdp/fsdp.h"
#include "tools/flags.h"

typedef enum {
  RULE_WRAP = 0, RULE_MIN_PARAMS, RULE_CHECKPOINT, /* modules */
  RULE_RESHARD, RULE_DTYPE,                        /* units */
  RULE_LR, RULE_WD,                                /* tensors */
  RULE_NKEYS
} rule_key_t;

typedef struct {
  char *match;
  int line;               /* of the rule's first key */
  int set[RULE_NKEYS];    /* 1 where the rule gives the key */
  double val[RULE_NKEYS]; /* booleans 0/1, a dtype as fsdp_dtype_t, numbers */
  char text[RULE_NKEYS][32]; /* the values as the file wrote them, to print back */
  int hits[3];            /* modules, units, tensors matched */
  char first[3][64], last[3][64]; /* the first and last of them, for the plan */
} cfg_rule_t;

/* torchprime's mesh axes, a bit each. */
enum { CFG_AXIS_DATA = 1, CFG_AXIS_FSDP = 2, CFG_AXIS_TENSOR = 4, CFG_AXIS_EXPERT = 8,
       CFG_AXIS_CONTEXT = 16, CFG_AXES = 5 };
#define CFG_MAX_SPEC_DIMS 8

typedef struct {
  char *name;   /* as the file wrote it, "[i]" included */
  size_t len;   /* the tensor or module pattern: name's first len bytes */
  int ntok;     /* its dot-separated parts (0 for "", the whole model) */
  int index;    /* the "[i]" suffix, -1 without */
  int line;
  int ndim;
  int dim;      /* the one sharded dimension */
  unsigned char axes[CFG_MAX_SPEC_DIMS]; /* CFG_AXIS_* bits per dimension, 0 for null */
  int hits[2];  /* tensors, modules matched */
  int units;    /* of those modules, the ones it made units */
  char first[2][64], last[2][64];
} cfg_spec_t;

typedef struct {
  char *key, *value; /* a flag without "--", its scalar text */
  int line;
  int skipped; /* the other tool's key: kept to catch it given twice, never applied */
} cfg_entry_t;

/* What a tool takes from a file: the keys of its flag table, those its word
 * callback knows (asked with value NULL), and the keys it skips with a note
 * (NULL-terminated: the other tool's, cfg_train_only or cfg_bench_only, so
 * that one file serves both tools). */
typedef struct {
  const flag_t *table;
  size_t n;
  flag_word_fn word;
  void *ctx;
  const char *const *skip;
  const char *skip_owner; /* the tool the skipped keys belong to */
} cfg_keys_t;

/* The keys only fsdp-train takes, and only fsdp-bench (NULL-terminated). */
extern const char *const cfg_train_only[], *const cfg_bench_only[];

/* Limits (docs/limits.md says why): file bytes, nesting, a value's bytes, rules. */
#define CFG_MAX_BYTES (1 << 20)
#define CFG_MAX_DEPTH 16
#define CFG_MAX_VALUE 4096
#define CFG_MAX_RULES 1024

typedef struct {
  char *path;
  const cfg_keys_t *keys; /* during cfg_load only */
  cfg_entry_t *entries;
  int n_entries;
  cfg_rule_t *rules;
  int n_rules;
  cfg_spec_t *specs; /* torchprime's NAME: [spec] keys, in file order */
  int n_specs;
  int out_ndim;      /* the dimensions of a module's output (B, T, C: 3) */
  const char *const *aliases; /* the model's (cfg_model_t), during planning */
  int unnamed;       /* tensors no spec named (fsdp shards them all the same) */
  char unnamed_first[64], unnamed_last[64];
  const char *wrap_kinds; /* the --wrap policy for modules no wrap rule matches */
  float *mults;           /* unit_opts' lr/wd arrays, reused unit after unit */
  int n_mults;
  int prev_rule;          /* the size rule that decided the previous module, or -1 */
  char err[640];          /* the first rule error planning met ("" when none) */
} cfg_file_t;

/* The --config FILE in argv (NULL when none) and whether --print-config is. */
const char *cfg_path(int argc, char **argv, int *print);

/* Reads path into cfg, refusing at once a key the tool does not take (and
 * skipping, with a note on rank 0, the other tool's). 0, or -1 after printing
 * "<tool>: FILE:LINE: why". */
int cfg_load(const char *tool, const char *path, const cfg_keys_t *keys, cfg_file_t *cfg);
void cfg_free(cfg_file_t *cfg);

/* Applies the file's keys through the flag table (in file order, before the
 * command line). 0, or -1 after printing why with the file and line. */
int cfg_apply(const char *tool, const cfg_file_t *cfg, const flag_t *table, size_t n,
              flag_word_fn word, void *ctx);

/* A tool's command line: --config FILE's keys (into file; *loaded = file
 * when there is one), then argv over them (flags_parse). What flags_parse
 * returns, or -1 after printing why the file was refused. */
int cfg_parse_args(const char *tool, const char *usage, int argc, char **argv,
                   const cfg_keys_t *keys, cfg_file_t *file, cfg_file_t **loaded);

/* This process's rank as a launcher gave it (mpirun's OMPI_COMM_WORLD_RANK,
 * PMI_RANK, torchrun's RANK), 0 without one: what prints once per job before
 * the world exists (--print-config, notes on the file) prints on rank 0. */
int cfg_launch_rank(void);

/* A model's policy fields the rules and specs replace (those of
 * fsdp_gpt2_opts_t and the Llama model's, of the same names), and the
 * dimensions of its modules' outputs. */
typedef struct {
  const char *wrap_kinds;
  size_t wrap_min_params;
  const char *checkpoint_kinds;
  int out_ndim;                 /* 3 for a transformer's (B, T, C) */
  /* NULL, or pairs (NAME, TENSOR) ending in NULL: a spec naming NAME (and the
   * modules above it) meets TENSOR, as Hugging Face's state dict names a tied
   * head "lm_head.weight" beside the embedding */
  const char *const *aliases;
  const fsdp_plan_opts_t *plan; /* out: the rules' plan, where they make one */
  fsdp_unit_opts_fn unit_opts;  /* out */
  void *unit_opts_user;         /* out */
} cfg_model_t;

/* The rules and specs as a model's plan (cfg_gpt2_opts below, for any model):
 * wrap/checkpoint rules and module specs become the plan's callback (with
 * wrap_kinds for the modules none takes; checkpoint_kinds too beside specs
 * alone), unit and tensor rules and the specs the unit_opts callback. 0, or
 * -1 with cfg->err saying why, as cfg_gpt2_opts. */
int cfg_model_opts(cfg_file_t *cfg, cfg_model_t *m, fsdp_plan_opts_t *plan, char *ckpt_names,
                   size_t ckpt_len);

/* The rules as a GPT-2 plan: wrap/checkpoint rules become the plan's callback
 * and checkpoint patterns (with wrap_kinds for the modules no wrap rule
 * takes), unit and tensor rules the unit_opts callback; the rules' match
 * counts start again from zero (one model per call). 0, or -1 with cfg->err
 * saying why (wrap rules beside --wrap-min-params or --checkpoint, or checkpoint
 * patterns past ckpt_len bytes joined); the caller prints it, once per job. */
int cfg_gpt2_opts(cfg_file_t *cfg, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan, char *ckpt_names,
                  size_t ckpt_len);
/* The same for a Llama (fsdp_llama_opts_t): its modules the decoder layers
 * "model.layers.<i>", a tied head also named "lm_head.weight" (tied: 1). */
int cfg_llama_opts(cfg_file_t *cfg, fsdp_llama_opts_t *o, int tied, fsdp_plan_opts_t *plan,
                   char *ckpt_names, size_t ckpt_len);

/* The rule that matched nothing in a domain (0 modules, 1 units, 2 tensors)
 * where it gives settings, and with 2 the partition spec that matched no
 * tensor and no module: 0, or -1 with cfg->err set. Modules are checked while
 * planning; units, tensors and specs once the model is made. */
int cfg_check_matched(cfg_file_t *cfg, int domain);

/* The rules and partition specs a file holds (0 for NULL). */
int cfg_sharding_count(const cfg_file_t *cfg);

/* The specs and the sharding section as YAML, and what each spec and rule
 * matched as plan lines. */
void cfg_print_rules(FILE *out, const cfg_file_t *cfg);
void cfg_print_matches(FILE *out, const cfg_file_t *cfg);

#endif
