/* src/tools/lm.h — the one place the tools (fsdp-train, fsdp-eval, fsdp-bench)
 * choose between the decoders, GPT-2 and the Llama family: lm_pick reads the
 * model's name once and every later call takes the picked model's (lm.c). A
 * handle is driven by one thread; errors as the model's calls (fsdp/nn.h). */
#ifndef FSDP_TOOLS_LM_H
#define FSDP_TOOLS_LM_H

#include "fsdp/fsdp.h"
#include "tools/config.h"

typedef enum { LM_NONE = 0, LM_GPT2, LM_LLAMA } lm_kind_t;

typedef struct {
  lm_kind_t kind;                   /* LM_NONE: not a decoder (the MLP) */
  const fsdp_gpt2_config_t *gpt;    /* LM_GPT2's configuration (the caller's, kept alive) */
  const fsdp_llama_config_t *llama; /* LM_LLAMA's */
  fsdp_gpt2_t g;                    /* the model after lm_create, else NULL */
  fsdp_llama_t l;
} lm_t;

/* What the tools print and size from. */
typedef struct {
  const char *name;       /* "gpt2", "llama" */
  const char *layer_kind; /* its layers' module kind: wrap and checkpoint ("GPT2Block") */
  int named_by_preset;    /* the shape is always its preset's (no per-field flags) */
  int n_layer, n_embd, n_head, n_kv_head, vocab_size; /* n_kv_head: GPT-2 n_head */
  size_t params;
  size_t lookup;          /* parameters looked up, not multiplied: GPT-2's wpe, an untied
                             Llama's embed_tokens (6 (P - lookup) + 12 L T C FLOPs a token) */
} lm_layout_t;

/* model "gpt2" or "llama" with its configuration (the other may be NULL);
 * any other name: kind LM_NONE. */
lm_t lm_pick(const char *model, const fsdp_gpt2_config_t *gpt, const fsdp_llama_config_t *llama);
void lm_layout(const lm_t *lm, lm_layout_t *out);
/* "<layers> layers x <width> wide, <heads> heads" and, for a Llama,
 * " / <kv> KV, FFN <F>". */
void lm_shape(const lm_t *lm, char *buf, size_t n);
/* cfg_gpt2_opts or cfg_llama_opts (tools/config.h) for the model. */
int lm_config_opts(const lm_t *lm, cfg_file_t *cfg, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan,
                   char *ckpt_names, size_t ckpt_len);

/* fsdp_gpt2_create / fsdp_llama_create and the calls on the model after it. */
fsdp_status_t lm_create(lm_t *lm, fsdp_engine_t eng, const fsdp_gpt2_opts_t *o);
void lm_destroy(lm_t *lm); /* the model, if any; lm may be picked again */
fsdp_status_t lm_forward_backward(const lm_t *lm, const int *tokens, const int *targets, int B,
                                  int T, float loss_scale, double *loss_sum);
fsdp_status_t lm_forward(const lm_t *lm, const int *tokens, const int *targets, int B, int T,
                         double *loss_sum, const float **logits);
fsdp_status_t lm_sample(const lm_t *lm, const int *prompt, int n_prompt, int n_new,
                        const fsdp_gpt2_sampling_t *how, int *out);
size_t lm_activation_bytes(const lm_t *lm, size_t *without_checkpointing);
/* An estimate of the model state per rank, for fsdp-bench --memory-plan's
 * table only, which builds no engine: the fp32 master and gradient shards,
 * the optimizer's state and the low-precision copy over S ranks (S:
 * --shard-size or the world; 1 unsharded), plus the gathered units in flight
 * (the root and prefetch + 1 layers, every layer under zero2; none when
 * S is 1) and their fp32 gradient buffers (none on one rank with one
 * micro-batch). A run's --checkpoint auto does not use it: it asks the
 * engine (fsdp_engine_memory_plan), whose gather and gradient slots are each
 * the size of the largest unit (the root), so this undercounts. */
size_t lm_model_state_bytes(const lm_t *lm, const fsdp_config_t *cfg, int nranks);
/* --memory-budget GIB as bytes: 0 for none (gib <= 0), else at least 1 and at
 * most SIZE_MAX, so that neither a tiny nor a huge budget reads as none. */
size_t lm_budget_bytes(double gib);
/* --checkpoint auto: when w->checkpoint_kinds is "auto", clears it and sets
 * checkpoint_auto and memory_budget (budget_gib, 0: the model's default; the
 * model state in it is the engine's, fsdp_engine_memory_plan); 1 when it
 * did, else 0. */
int lm_checkpoint_auto_opts(double budget_gib, fsdp_gpt2_opts_t *w);
/* After lm_create with checkpoint auto: what it chose, as the start-up line
 * ("checkpoint auto: 12 of 48 blocks (h.0-h.11), activations 14.20 GiB,
 * budget 70.00 GiB") or, json, as a JSON object's members
 * ("\"checkpoint_auto\":{...}"). */
void lm_checkpoint_auto_text(const lm_t *lm, int json, char *buf, size_t n);
/* Layers the model recomputes (fsdp_gpt2_checkpointed / fsdp_llama_checkpointed). */
int lm_checkpointed(const lm_t *lm, size_t *budget);
/* Whether layer l recomputes (fsdp_gpt2_layer_checkpointed / the Llama's). */
int lm_layer_checkpointed(const lm_t *lm, int l);

/* fsdp_gpt2_kernel_costs / fsdp_llama_kernel_costs for the configuration. */
fsdp_status_t lm_kernel_costs(const lm_t *lm, int B, int T, int micro_batches,
                              fsdp_dtype_t act_dtype, fsdp_kclass_cost_t *out, int n);

#endif
