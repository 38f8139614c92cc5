/* src/tools/lm.c — the decoders behind tools/lm.h: each call is the picked
 * model's. The only file of the tools that names both models' calls. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tools/lm.h"

lm_t lm_pick(const char *model, const fsdp_gpt2_config_t *gpt, const fsdp_llama_config_t *llama) {
  if (model && !strcmp(model, "gpt2")) return (lm_t){.kind = LM_GPT2, .gpt = gpt};
  if (model && !strcmp(model, "llama")) return (lm_t){.kind = LM_LLAMA, .llama = llama};
  return (lm_t){.kind = LM_NONE};
}

void lm_layout(const lm_t *lm, lm_layout_t *out) {
  const fsdp_gpt2_config_t *g = lm->gpt;
  const fsdp_llama_config_t *l = lm->llama;
  if (lm->kind == LM_LLAMA)
    *out = (lm_layout_t){.name = "llama", .layer_kind = "LlamaDecoderLayer",
                         .named_by_preset = 1, .n_layer = l->n_layer, .n_embd = l->n_embd,
                         .n_head = l->n_head, .n_kv_head = l->n_kv_head,
                         .vocab_size = l->vocab_size,
                         .params = fsdp_llama_num_params(l),
                         .lookup = l->tie_embeddings ? 0
                                                     : (size_t)l->vocab_size * (size_t)l->n_embd};
  else
    *out = (lm_layout_t){.name = "gpt2", .layer_kind = "GPT2Block", .named_by_preset = 0,
                         .n_layer = g->n_layer, .n_embd = g->n_embd, .n_head = g->n_head,
                         .n_kv_head = g->n_head,
                         .vocab_size = g->vocab_size, .params = fsdp_gpt2_num_params(g),
                         .lookup = (size_t)g->block_size * (size_t)g->n_embd};
}

void lm_shape(const lm_t *lm, char *buf, size_t n) {
  const fsdp_llama_config_t *l = lm->llama;
  if (lm->kind == LM_LLAMA)
    snprintf(buf, n, "%d layers x %d wide, %d heads / %d KV, FFN %d", l->n_layer, l->n_embd,
             l->n_head, l->n_kv_head, l->ffn_hidden);
  else
    snprintf(buf, n, "%d layers x %d wide, %d heads", lm->gpt->n_layer, lm->gpt->n_embd,
             lm->gpt->n_head);
}

int lm_config_opts(const lm_t *lm, cfg_file_t *cfg, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan,
                   char *ckpt_names, size_t ckpt_len) {
  return lm->kind == LM_LLAMA
             ? cfg_llama_opts(cfg, o, lm->llama->tie_embeddings, plan, ckpt_names, ckpt_len)
             : cfg_gpt2_opts(cfg, o, plan, ckpt_names, ckpt_len);
}

fsdp_status_t lm_create(lm_t *lm, fsdp_engine_t eng, const fsdp_gpt2_opts_t *o) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_create(eng, lm->llama, o, &lm->l)
             : fsdp_gpt2_create(eng, lm->gpt, o, &lm->g);
}

void lm_destroy(lm_t *lm) {
  fsdp_gpt2_destroy(lm->g);
  fsdp_llama_destroy(lm->l);
  lm->g = NULL;
  lm->l = NULL;
}

fsdp_status_t lm_forward_backward(const lm_t *lm, const int *tokens, const int *targets, int B,
                                  int T, float loss_scale, double *loss_sum) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_forward_backward(lm->l, tokens, targets, B, T, loss_scale, loss_sum)
             : fsdp_gpt2_forward_backward(lm->g, tokens, targets, B, T, loss_scale, loss_sum);
}

fsdp_status_t lm_forward(const lm_t *lm, const int *tokens, const int *targets, int B, int T,
                         double *loss_sum, const float **logits) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_forward(lm->l, tokens, targets, B, T, loss_sum, logits)
             : fsdp_gpt2_forward(lm->g, tokens, targets, B, T, loss_sum, logits);
}

fsdp_status_t lm_sample(const lm_t *lm, const int *prompt, int n_prompt, int n_new,
                        const fsdp_gpt2_sampling_t *how, int *out) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_sample(lm->l, prompt, n_prompt, n_new, how, out)
             : fsdp_gpt2_sample(lm->g, prompt, n_prompt, n_new, how, out);
}

size_t lm_activation_bytes(const lm_t *lm, size_t *without_checkpointing) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_activation_bytes(lm->l, without_checkpointing)
             : fsdp_gpt2_activation_bytes(lm->g, without_checkpointing);
}

fsdp_status_t lm_kernel_costs(const lm_t *lm, int B, int T, int micro_batches,
                              fsdp_dtype_t act_dtype, fsdp_kclass_cost_t *out, int n) {
  return lm->kind == LM_LLAMA
             ? fsdp_llama_kernel_costs(lm->llama, B, T, micro_batches, act_dtype, out, n)
             : fsdp_gpt2_kernel_costs(lm->gpt, B, T, micro_batches, act_dtype, out, n);
}

int lm_checkpointed(const lm_t *lm, size_t *budget) {
  return lm->kind == LM_LLAMA ? fsdp_llama_checkpointed(lm->l, budget)
                              : fsdp_gpt2_checkpointed(lm->g, budget);
}

int lm_layer_checkpointed(const lm_t *lm, int l) {
  return lm->kind == LM_LLAMA ? fsdp_llama_layer_checkpointed(lm->l, l)
                              : fsdp_gpt2_layer_checkpointed(lm->g, l);
}

/* Parameters of the model with one layer less: a layer's, by difference. */
static size_t layer_params(const lm_t *lm) {
  if (lm->kind == LM_LLAMA) {
    fsdp_llama_config_t c = *lm->llama;
    c.n_layer--;
    return fsdp_llama_num_params(lm->llama) - fsdp_llama_num_params(&c);
  }
  fsdp_gpt2_config_t c = *lm->gpt;
  c.n_layer--;
  return fsdp_gpt2_num_params(lm->gpt) - fsdp_gpt2_num_params(&c);
}

size_t lm_model_state_bytes(const lm_t *lm, const fsdp_config_t *cfg, int nranks) {
  lm_layout_t y;
  lm_layout(lm, &y);
  const int S = cfg->strategy == FSDP_NO_SHARD ? 1 : cfg->shard_size > 0 ? cfg->shard_size
                                                                         : nranks;
  const size_t shard = (y.params + (size_t)S - 1) / (size_t)S;
  const size_t low = cfg->param_dtype == FSDP_F32 ? 0 : fsdp_dtype_size(cfg->param_dtype);
  const size_t optim = cfg->optim.kind == FSDP_OPTIM_ADAMW ? 8
                       : cfg->optim.momentum != 0.0f      ? 4
                                                          : 0;
  const size_t layer = layer_params(lm), root = y.params - (size_t)y.n_layer * layer;
  const int live = cfg->strategy == FSDP_SHARD_GRAD_OP ? y.n_layer : cfg->prefetch_depth + 1;
  const size_t gathered = root + (size_t)(live < y.n_layer ? live : y.n_layer) * layer;
  /* Whole shards are not gathered (views read them); one rank with one
   * micro-batch has no gradient buffers (backward adds into the shards). */
  const size_t params = S == 1 ? 0 : fsdp_dtype_size(cfg->param_dtype);
  const size_t grads = nranks == 1 && cfg->grad_accum <= 1 ? 0 : 4;
  return shard * (4 + 4 + optim + low) + gathered * (params + grads);
}

size_t lm_budget_bytes(double gib) {
  if (!(gib > 0.0)) return 0;
  const double bytes = gib * 1073741824.0;
  /* a cast past SIZE_MAX is undefined (x86-64 gives 0: "no budget") */
  return bytes >= (double)SIZE_MAX ? SIZE_MAX : bytes < 1.0 ? 1 : (size_t)bytes;
}

int lm_checkpoint_auto_opts(double budget_gib, fsdp_gpt2_opts_t *w) {
  if (!w->checkpoint_kinds || strcmp(w->checkpoint_kinds, "auto")) return 0;
  w->checkpoint_kinds = NULL;
  w->checkpoint_auto = 1;
  w->memory_budget = lm_budget_bytes(budget_gib);
  return 1;
}

/* Bytes as GiB, or MiB below one GiB (the tiny presets'). */
static const char *bytes_text(size_t b, char *buf, size_t n) {
  if (b >= (1u << 30)) snprintf(buf, n, "%.2f GiB", (double)b / 1073741824.0);
  else snprintf(buf, n, "%.2f MiB", (double)b / 1048576.0);
  return buf;
}

void lm_checkpoint_auto_text(const lm_t *lm, int json, char *buf, size_t n) {
  lm_layout_t y;
  lm_layout(lm, &y);
  size_t budget, acts = lm_activation_bytes(lm, NULL);
  const int k = lm_checkpointed(lm, &budget);
  const char *what = lm->kind == LM_LLAMA ? "layers" : "blocks";
  const char *prefix = lm->kind == LM_LLAMA ? "model.layers." : "h.";
  char a[32], b[32];
  int first = -1, last = -1; /* the model's own answer (auto: the first k) */
  for (int l = 0; l < y.n_layer; l++)
    if (lm_layer_checkpointed(lm, l) == 1) last = l, first = first < 0 ? l : first;
  if (json) {
    snprintf(buf, n, "\"checkpoint_auto\":{\"checkpointed\":%d,\"layers\":%d,\"first\":%d,"
             "\"last\":%d,\"activation_bytes\":%zu,\"budget_bytes\":%zu}", k, y.n_layer,
             first, last, acts, budget);
    return;
  }
  int at = snprintf(buf, n, "checkpoint auto: %d of %d %s", k, y.n_layer, what);
  if (k == 1) at += snprintf(buf + at, n - (size_t)at, " (%s%d)", prefix, first);
  else if (k > 1)
    at += snprintf(buf + at, n - (size_t)at, " (%s%d-%s%d)", prefix, first, prefix, last);
  if (budget)
    snprintf(buf + at, n - (size_t)at, ", activations %s, budget %s",
             bytes_text(acts, a, sizeof a), bytes_text(budget, b, sizeof b));
  else
    snprintf(buf + at, n - (size_t)at, ", activations %s (no --memory-budget on the CPU: "
             "nothing checkpointed)", bytes_text(acts, a, sizeof a));
}
