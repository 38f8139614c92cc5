/* src/tools/lm.c — the decoders behind tools/lm.h: one table of calls per
 * model, filled with designated initialisers, and the wrappers that go
 * through it. The only file of the tools that names both models' calls. */
#include <stdio.h>
#include <string.h>

#include "tools/lm.h"

struct lm_kind {
  void (*layout)(const void *c, lm_layout_t *out);
  void (*shape)(const void *c, char *buf, size_t n);
  int (*config_opts)(const void *c, cfg_file_t *cfg, fsdp_gpt2_opts_t *o,
                     fsdp_plan_opts_t *plan, char *ckpt, size_t len);
  fsdp_status_t (*create)(fsdp_engine_t eng, const void *c, const fsdp_gpt2_opts_t *o,
                          void **model);
  void (*destroy)(void *model);
  fsdp_status_t (*forward_backward)(void *model, const int *tok, const int *tgt, int B, int T,
                                    float scale, double *loss);
  fsdp_status_t (*forward)(void *model, const int *tok, const int *tgt, int B, int T,
                           double *loss, const float **logits);
  fsdp_status_t (*sample)(void *model, const int *prompt, int n_prompt, int n_new,
                          const fsdp_gpt2_sampling_t *how, int *out);
  size_t (*activation_bytes)(void *model, size_t *full);
  fsdp_status_t (*kernel_costs)(const void *c, int B, int T, int micro, fsdp_dtype_t act,
                                fsdp_kclass_cost_t *out, int n);
};

/* ---- GPT-2 ----------------------------------------------------------------- */

static void gpt2_layout(const void *c, lm_layout_t *out) {
  const fsdp_gpt2_config_t *g = c;
  *out = (lm_layout_t){.name = "gpt2", .layer_kind = "GPT2Block", .named_by_preset = 0,
                       .n_layer = g->n_layer, .n_embd = g->n_embd, .n_head = g->n_head,
                       .vocab_size = g->vocab_size, .params = fsdp_gpt2_num_params(g),
                       .lookup = (size_t)g->block_size * (size_t)g->n_embd};
}
static void gpt2_shape(const void *c, char *buf, size_t n) {
  const fsdp_gpt2_config_t *g = c;
  snprintf(buf, n, "%d layers x %d wide, %d heads", g->n_layer, g->n_embd, g->n_head);
}
static int gpt2_config_opts(const void *c, cfg_file_t *cfg, fsdp_gpt2_opts_t *o,
                            fsdp_plan_opts_t *plan, char *ckpt, size_t len) {
  (void)c;
  return cfg_gpt2_opts(cfg, o, plan, ckpt, len);
}
static fsdp_status_t gpt2_create(fsdp_engine_t eng, const void *c, const fsdp_gpt2_opts_t *o,
                                 void **model) {
  fsdp_gpt2_t g = NULL;
  fsdp_status_t st = fsdp_gpt2_create(eng, c, o, &g);
  *model = g;
  return st;
}
static void gpt2_destroy(void *model) { fsdp_gpt2_destroy(model); }
static fsdp_status_t gpt2_forward_backward(void *model, const int *tok, const int *tgt, int B,
                                           int T, float scale, double *loss) {
  return fsdp_gpt2_forward_backward(model, tok, tgt, B, T, scale, loss);
}
static fsdp_status_t gpt2_forward(void *model, const int *tok, const int *tgt, int B, int T,
                                  double *loss, const float **logits) {
  return fsdp_gpt2_forward(model, tok, tgt, B, T, loss, logits);
}
static fsdp_status_t gpt2_sample(void *model, const int *prompt, int n_prompt, int n_new,
                                 const fsdp_gpt2_sampling_t *how, int *out) {
  return fsdp_gpt2_sample(model, prompt, n_prompt, n_new, how, out);
}
static size_t gpt2_activation_bytes(void *model, size_t *full) {
  return fsdp_gpt2_activation_bytes(model, full);
}
static fsdp_status_t gpt2_kernel_costs(const void *c, int B, int T, int micro, fsdp_dtype_t act,
                                       fsdp_kclass_cost_t *out, int n) {
  return fsdp_gpt2_kernel_costs(c, B, T, micro, act, out, n);
}

static const lm_kind_t gpt2_kind = {
    .layout = gpt2_layout,
    .shape = gpt2_shape,
    .config_opts = gpt2_config_opts,
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .forward_backward = gpt2_forward_backward,
    .forward = gpt2_forward,
    .sample = gpt2_sample,
    .activation_bytes = gpt2_activation_bytes,
    .kernel_costs = gpt2_kernel_costs,
};

/* ---- the Llama family --------------------------------------------------------- */

static void llama_layout(const void *c, lm_layout_t *out) {
  const fsdp_llama_config_t *l = c;
  *out = (lm_layout_t){.name = "llama", .layer_kind = "LlamaDecoderLayer",
                       .named_by_preset = 1, .n_layer = l->n_layer, .n_embd = l->n_embd,
                       .n_head = l->n_head, .vocab_size = l->vocab_size,
                       .params = fsdp_llama_num_params(l),
                       .lookup = l->tie_embeddings ? 0 : (size_t)l->vocab_size * (size_t)l->n_embd};
}
static void llama_shape(const void *c, char *buf, size_t n) {
  const fsdp_llama_config_t *l = c;
  snprintf(buf, n, "%d layers x %d wide, %d heads / %d KV, FFN %d", l->n_layer, l->n_embd,
           l->n_head, l->n_kv_head, l->ffn_hidden);
}
static int llama_config_opts(const void *c, cfg_file_t *cfg, fsdp_gpt2_opts_t *o,
                             fsdp_plan_opts_t *plan, char *ckpt, size_t len) {
  return cfg_llama_opts(cfg, o, ((const fsdp_llama_config_t *)c)->tie_embeddings, plan, ckpt,
                        len);
}
static fsdp_status_t llama_create(fsdp_engine_t eng, const void *c, const fsdp_gpt2_opts_t *o,
                                  void **model) {
  fsdp_llama_t l = NULL;
  fsdp_status_t st = fsdp_llama_create(eng, c, o, &l);
  *model = l;
  return st;
}
static void llama_destroy(void *model) { fsdp_llama_destroy(model); }
static fsdp_status_t llama_forward_backward(void *model, const int *tok, const int *tgt, int B,
                                            int T, float scale, double *loss) {
  return fsdp_llama_forward_backward(model, tok, tgt, B, T, scale, loss);
}
static fsdp_status_t llama_forward(void *model, const int *tok, const int *tgt, int B, int T,
                                   double *loss, const float **logits) {
  return fsdp_llama_forward(model, tok, tgt, B, T, loss, logits);
}
static fsdp_status_t llama_sample(void *model, const int *prompt, int n_prompt, int n_new,
                                  const fsdp_gpt2_sampling_t *how, int *out) {
  return fsdp_llama_sample(model, prompt, n_prompt, n_new, how, out);
}
static size_t llama_activation_bytes(void *model, size_t *full) {
  return fsdp_llama_activation_bytes(model, full);
}
static fsdp_status_t llama_kernel_costs(const void *c, int B, int T, int micro,
                                        fsdp_dtype_t act, fsdp_kclass_cost_t *out, int n) {
  return fsdp_llama_kernel_costs(c, B, T, micro, act, out, n);
}

static const lm_kind_t llama_kind = {
    .layout = llama_layout,
    .shape = llama_shape,
    .config_opts = llama_config_opts,
    .create = llama_create,
    .destroy = llama_destroy,
    .forward_backward = llama_forward_backward,
    .forward = llama_forward,
    .sample = llama_sample,
    .activation_bytes = llama_activation_bytes,
    .kernel_costs = llama_kernel_costs,
};

/* ---- the calls -------------------------------------------------------------- */

lm_t lm_pick(const char *model, const fsdp_gpt2_config_t *gpt, const fsdp_llama_config_t *llama) {
  if (model && !strcmp(model, "gpt2")) return (lm_t){.k = &gpt2_kind, .c = gpt};
  if (model && !strcmp(model, "llama")) return (lm_t){.k = &llama_kind, .c = llama};
  return (lm_t){0};
}

void lm_layout(const lm_t *lm, lm_layout_t *out) { lm->k->layout(lm->c, out); }

void lm_shape(const lm_t *lm, char *buf, size_t n) { lm->k->shape(lm->c, buf, n); }

int lm_config_opts(const lm_t *lm, cfg_file_t *cfg, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan,
                   char *ckpt_names, size_t ckpt_len) {
  return lm->k->config_opts(lm->c, cfg, o, plan, ckpt_names, ckpt_len);
}

fsdp_status_t lm_create(lm_t *lm, fsdp_engine_t eng, const fsdp_gpt2_opts_t *o) {
  return lm->k->create(eng, lm->c, o, &lm->model);
}

void lm_destroy(lm_t *lm) {
  if (lm->k && lm->model) lm->k->destroy(lm->model);
  lm->model = NULL;
}

fsdp_status_t lm_forward_backward(const lm_t *lm, const int *tokens, const int *targets, int B,
                                  int T, float loss_scale, double *loss_sum) {
  return lm->k->forward_backward(lm->model, tokens, targets, B, T, loss_scale, loss_sum);
}

fsdp_status_t lm_forward(const lm_t *lm, const int *tokens, const int *targets, int B, int T,
                         double *loss_sum, const float **logits) {
  return lm->k->forward(lm->model, tokens, targets, B, T, loss_sum, logits);
}

fsdp_status_t lm_sample(const lm_t *lm, const int *prompt, int n_prompt, int n_new,
                        const fsdp_gpt2_sampling_t *how, int *out) {
  return lm->k->sample(lm->model, prompt, n_prompt, n_new, how, out);
}

size_t lm_activation_bytes(const lm_t *lm, size_t *without_checkpointing) {
  return lm->k->activation_bytes(lm->model, without_checkpointing);
}

fsdp_status_t lm_kernel_costs(const lm_t *lm, int B, int T, int micro_batches,
                              fsdp_dtype_t act_dtype, fsdp_kclass_cost_t *out, int n) {
  return lm->k->kernel_costs(lm->c, B, T, micro_batches, act_dtype, out, n);
}
