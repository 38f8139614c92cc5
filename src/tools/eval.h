/* src/tools/eval.h — what fsdp-eval's pieces share: options, the evaluator's
 * state, and its three jobs (eval_run.c): score data, write logits, sample. */
#ifndef FSDP_TOOLS_EVAL_H
#define FSDP_TOOLS_EVAL_H

#include "fsdp/fsdp.h"
#include "tools/lm.h"

typedef struct {
  const char *ckpt, *data, *tokenizer, *split, *logits_out, *prompt, *prompt_tokens, *preset;
  fsdp_config_t cfg;
  fsdp_gpt2_config_t gpt; /* from the checkpoint; --preset/--heads where it is silent.
                           * A Llama's vocab_size and context (block_size) too */
  int is_llama;            /* the checkpoint records a Llama: the model is llama */
  fsdp_llama_config_t llama;
  int seq_len, match_train, logits_k, sample, top_k, json, no_score;
  int64_t global_batch, max_windows;
  float temperature;
  uint64_t seed;
} eval_opts_t;

typedef struct {
  const eval_opts_t *o;
  fsdp_world_t world;
  fsdp_engine_t eng;
  lm_t lm;                    /* GPT-2 or Llama, as o->is_llama says (setup) */
  fsdp_ckpt_meta_t meta;      /* the checkpoint's trainer state */
  int64_t step;               /* the checkpoint's */
  int rank, nranks;
  int64_t global_batch, micro, offset;
  int T;
  fsdp_tokenizer_t tok;       /* --tokenizer, or NULL */
  fsdp_text_t text;
  fsdp_tokens_t toks;
  int is_tokens, have_data;
  int *ids, *tgt;             /* (micro, T) */
} evaluator_t;

/* 1 and *v when the checkpoint recorded key, else 0. */
static inline int eval_meta(const evaluator_t *e, const char *key, int64_t *v) {
  return fsdp_ckpt_meta_get(&e->meta, key, v) == FSDP_SUCCESS;
}

/* One forward of the model (GPT-2 or Llama), as fsdp_gpt2_forward. */
static inline fsdp_status_t eval_forward(evaluator_t *e, int B, int T, double *loss_sum,
                                         const float **logits) {
  return lm_forward(&e->lm, e->ids, loss_sum ? e->tgt : NULL, B, T, loss_sum, logits);
}

/* Mean loss (and perplexity, bits per byte) over the split: every position
 * in windows of T, or with --match-train fsdp-train's validation windows. */
int eval_score(evaluator_t *e);
/* --logits K --logits-out FILE: the logits of the split's first K positions
 * as a float32 .npy of shape (K, V). */
int eval_logits(evaluator_t *e);
/* --sample N: N tokens after the prompt (temperature, top-k, seed). */
int eval_sample(evaluator_t *e);

#endif
