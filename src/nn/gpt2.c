/* src/nn/gpt2.c — GPT-2 over the public engine API: its tensors from the
 * table (ckpt/gpt2_layout.h, with the presets), configuration checks, its
 * activations, and its math (embedding, blocks, ln_f and the tied head, and
 * their backward) for the decoder skeleton (nn/decoder.c), which cuts the
 * blocks into units by the library's wrap policy (fsdp/plan.h), runs them
 * with per-unit activation checkpointing and samples (nn/sample.c). Dims: B
 * batch, T time, C channels, NH heads, V vocabulary, L layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt/gpt2_layout.h"
#include "nn/decoder.h"

/* A block's tensors are the one table in ckpt/gpt2_layout.h, which
 * checkpoints and Hugging Face interop read too; short names for its slots. */
enum {
  LN1W = GPT2_LN1W, LN1B = GPT2_LN1B, QKVW = GPT2_QKVW, QKVB = GPT2_QKVB,
  ATTPROJW = GPT2_ATTPROJW, ATTPROJB = GPT2_ATTPROJB, LN2W = GPT2_LN2W, LN2B = GPT2_LN2B,
  FCW = GPT2_FCW, FCB = GPT2_FCB, FCPROJW = GPT2_FCPROJW, FCPROJB = GPT2_FCPROJB
};

/* One block's saved activations, sized for max_batch x max_T. void *: in the
 * backend's activation dtype (fp32, or bf16 on a bf16 CUDA engine); float *:
 * always fp32. */
struct acts {
  void *ln1; float *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
  void *qkv;                             /* (B,T,3C) */
  float *att;                            /* (B,NH,T,T) */
  void *atty;                            /* (B,T,C) attention output before c_proj */
  void *res2;                            /* (B,T,C) x + attention */
  void *ln2; float *ln2_mean, *ln2_rstd; /* (B,T,C) (B,T) (B,T) */
  void *fch, *fch_gelu;                  /* (B,T,4C) */
};

struct fsdp_gpt2 {
  decoder_t d;           /* the skeleton: units, kernels, arena, I/O (first) */
  fsdp_gpt2_config_t c;
  int att_lse;           /* attention keeps the log-sum-exp, not probabilities */
  int one_head;          /* the logits' gradient is written over them, rows ldv apart */
  int gelu_grad;         /* before issue 15: GELU's gradient in a buffer of its own (a dry
                            run's layout only; the fused backward writes it over d4) */
  void *lnf;             /* (B,T,C) */
  float *lnf_mean, *lnf_rstd;
  void *dres, *d1, *d3, *d4;          /* backward scratch */
};

/* ---- configuration ------------------------------------------------------ */

fsdp_status_t fsdp_gpt2_config_check(const fsdp_gpt2_config_t *c) {
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2 config is NULL");
  if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->block_size < 1 || c->vocab_size < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "GPT-2 config: layers %d, heads %d, width %d, context %d and vocabulary "
                      "%d must all be positive", c->n_layer, c->n_head, c->n_embd,
                      c->block_size, c->vocab_size);
  if (c->n_embd % c->n_head != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "GPT-2 config: width %d is not divisible by %d heads", c->n_embd,
                      c->n_head);
  if (c->block_size > FSDP_ATTENTION_MAX_T)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2 config: context %d exceeds %d",
                      c->block_size, FSDP_ATTENTION_MAX_T);
  return FSDP_SUCCESS;
}

static size_t block_params(size_t C) { return 12 * C * C + 13 * C; }

size_t fsdp_gpt2_num_params(const fsdp_gpt2_config_t *c) {
  size_t C = (size_t)c->n_embd;
  return (size_t)c->vocab_size * C + (size_t)c->block_size * C +
         (size_t)c->n_layer * block_params(C) + 2 * C;
}

/* ---- tensors ------------------------------------------------------------ */

static size_t layer_params(const decoder_t *d) { return block_params((size_t)d->C); }

static fsdp_status_t block_descs(decoder_t *d, int l, fsdp_tensor_desc_t *t) {
  const struct fsdp_gpt2 *g = (const struct fsdp_gpt2 *)d;
  int64_t C = g->c.n_embd;
  float proj_std = 0.02f / sqrtf(2.0f * (float)g->c.n_layer);
  for (int j = 0; j < GPT2_BLOCK_TENSORS; j++) {
    char name[96];
    snprintf(name, sizeof name, "h.%d.%s", l, gpt2_block_tensors[j].name);
    FSDP_TRY(decoder_add_name(d, name, &t[j]));
    int matrix = gpt2_block_tensors[j].cols > 0;
    t[j].ndim = matrix ? 2 : 1;
    t[j].shape[0] = gpt2_block_tensors[j].rows * C;
    t[j].shape[1] = matrix ? gpt2_block_tensors[j].cols * C : 0;
    t[j].no_decay = !matrix;
    t[j].init = matrix ? FSDP_INIT_NORMAL : j == LN1W || j == LN2W ? FSDP_INIT_CONSTANT
                                                                   : FSDP_INIT_ZEROS;
    t[j].init_scale = j == ATTPROJW || j == FCPROJW ? proj_std : matrix ? 0.02f : 1.0f;
  }
  return FSDP_SUCCESS;
}

/* The root's own: wte and wpe before its blocks, ln_f after them. */
static fsdp_status_t root_descs(decoder_t *d, int tail, fsdp_tensor_desc_t *t, int *n) {
  const struct fsdp_gpt2 *g = (const struct fsdp_gpt2 *)d;
  int64_t C = g->c.n_embd;
  if (!tail) {
    FSDP_TRY(decoder_add_name(d, "wte", &t[*n]));
    t[*n] = (fsdp_tensor_desc_t){t[*n].name, 2, {g->c.vocab_size, C}, FSDP_INIT_NORMAL, 0.02f, 0};
    ++*n;
    FSDP_TRY(decoder_add_name(d, "wpe", &t[*n]));
    t[*n] = (fsdp_tensor_desc_t){t[*n].name, 2, {g->c.block_size, C}, FSDP_INIT_NORMAL, 0.01f, 0};
    ++*n;
    return FSDP_SUCCESS;
  }
  FSDP_TRY(decoder_add_name(d, "ln_f.weight", &t[*n]));
  t[*n] = (fsdp_tensor_desc_t){t[*n].name, 1, {C}, FSDP_INIT_CONSTANT, 1.0f, 1};
  ++*n;
  FSDP_TRY(decoder_add_name(d, "ln_f.bias", &t[*n]));
  t[*n] = (fsdp_tensor_desc_t){t[*n].name, 1, {C}, FSDP_INIT_ZEROS, 0.0f, 1};
  ++*n;
  return FSDP_SUCCESS;
}

/* ---- activations -------------------------------------------------------- */

/* The vocabulary rounded up to a multiple of 128 (50257 -> 50304). */
static int padded_vocab(int V) { return (V + 127) / 128 * 128; }

/* What the kernels keep under a layout (d.esize set); FSDP_GPT2_LAYOUT_BUILT
 * is this build's: one padded logits buffer, and attention's log-sum-exp with
 * bf16 activations (the CUDA table's bf16 attention), its probabilities with
 * fp32 ones (CPU and CUDA fp32). prepare checks the table agrees. */
static void set_layout(struct fsdp_gpt2 *g, fsdp_gpt2_layout_t layout) {
  g->att_lse = layout == FSDP_GPT2_LAYOUT_FLASH ||
               (layout == FSDP_GPT2_LAYOUT_BUILT && g->d.esize == 2);
  g->one_head = layout != FSDP_GPT2_LAYOUT_PROBS;
  g->gelu_grad = layout == FSDP_GPT2_LAYOUT_PROBS;
  g->d.ldv = g->one_head ? padded_vocab(g->c.vocab_size) : g->c.vocab_size;
}

/* Attention's saved state: probabilities (B,NH,T,T) or the log-sum-exp (B,NH,T). */
static size_t att_elems(const struct fsdp_gpt2 *g) {
  size_t bnt = (size_t)g->d.maxB * (size_t)g->c.n_head * (size_t)g->d.maxT;
  return g->att_lse ? bnt : bnt * (size_t)g->d.maxT;
}

static void acts_carve(const decoder_t *d, void *acts, char *base, size_t *at) {
  const struct fsdp_gpt2 *g = (const struct fsdp_gpt2 *)d;
  struct acts *a = acts;
  size_t BT = (size_t)d->maxB * (size_t)d->maxT, C = (size_t)g->c.n_embd;
  size_t e = d->esize, f = sizeof(float);
  a->ln1 = decoder_take(d, base, at, BT * C, e);
  a->ln1_mean = decoder_take(d, base, at, BT, f);
  a->ln1_rstd = decoder_take(d, base, at, BT, f);
  a->qkv = decoder_take(d, base, at, 3 * BT * C, e);
  a->atty = decoder_take(d, base, at, BT * C, e);
  a->res2 = decoder_take(d, base, at, BT * C, e);
  a->ln2 = decoder_take(d, base, at, BT * C, e);
  a->ln2_mean = decoder_take(d, base, at, BT, f);
  a->ln2_rstd = decoder_take(d, base, at, BT, f);
  a->fch = decoder_take(d, base, at, 4 * BT * C, e);
  a->fch_gelu = decoder_take(d, base, at, 4 * BT * C, e);
  a->att = decoder_take(d, base, at, att_elems(g), f);
}

/* ln_f, the logits (and their gradient, unless it is written over them) and
 * the backward scratch. */
static void common_carve(decoder_t *d, char *base, size_t *at) {
  struct fsdp_gpt2 *g = (struct fsdp_gpt2 *)d;
  size_t BT = (size_t)d->maxB * (size_t)d->maxT, C = (size_t)g->c.n_embd;
  size_t ldv = (size_t)d->ldv, e = d->esize, f = sizeof(float);
  g->lnf = decoder_take(d, base, at, BT * C, e);
  g->lnf_mean = decoder_take(d, base, at, BT, f);
  g->lnf_rstd = decoder_take(d, base, at, BT, f);
  d->logits = decoder_take(d, base, at, BT * ldv, e);
  d->dlogits = g->one_head ? d->logits : decoder_take(d, base, at, BT * ldv, e);
  g->dres = decoder_take(d, base, at, BT * C, e);
  g->d1 = decoder_take(d, base, at, BT * C, e);
  g->d3 = decoder_take(d, base, at, 3 * BT * C, e);
  g->d4 = decoder_take(d, base, at, 4 * BT * C, e);
  if (g->gelu_grad) (void)decoder_take(d, base, at, 4 * BT * C, e);
}

/* Dry run of the carving for g's shape: one block's bytes (and its
 * attention's), the block inputs', the common buffers'. */
static void arena_parts(const decoder_t *d, fsdp_gpt2_memory_t *m) {
  struct fsdp_gpt2 dry = *(const struct fsdp_gpt2 *)d; /* common_carve writes pointers: a copy */
  struct acts a;
  *m = (fsdp_gpt2_memory_t){0};
  acts_carve(&dry.d, &a, NULL, &m->per_layer);
  m->attention = decoder_span(d, att_elems(&dry), sizeof(float));
  common_carve(&dry.d, NULL, &m->common);
  m->inputs = decoder_inputs_bytes(d);
  m->saved = fsdp_activation_arena_bytes(m, d->L, 0);
  m->checkpointed = fsdp_activation_arena_bytes(m, 0, 1);
}

fsdp_status_t fsdp_gpt2_memory(const fsdp_gpt2_config_t *c, int B, int T, fsdp_dtype_t act_dtype,
                               fsdp_gpt2_layout_t layout, fsdp_gpt2_memory_t *out) {
  if (!out) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_memory: NULL output");
  FSDP_TRY(fsdp_gpt2_config_check(c));
  if (B < 1 || T < 1 || T > c->block_size)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_gpt2_memory: batch %d must be >= 1 and T %d in [1, %d]", B, T,
                      c->block_size);
  if (act_dtype != FSDP_F32 && act_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_gpt2_memory: activations are f32 or bf16, not %s",
                      fsdp_dtype_name(act_dtype));
  if (layout < FSDP_GPT2_LAYOUT_BUILT || layout > FSDP_GPT2_LAYOUT_FLASH)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_memory: unknown layout %d",
                      (int)layout);
  struct fsdp_gpt2 g = {.d = {.L = c->n_layer, .C = c->n_embd, .maxB = B, .maxT = T,
                              .align = 256, .esize = fsdp_dtype_size(act_dtype)},
                        .c = *c};
  set_layout(&g, layout);
  arena_parts(&g.d, out);
  return FSDP_SUCCESS;
}

/* The arena's bytes for g's units at micro-batch B x T. */
static size_t arena_bytes_at(const struct fsdp_gpt2 *g, int B, int T) {
  struct fsdp_gpt2 t = *g;
  t.d.maxB = B, t.d.maxT = T;
  fsdp_gpt2_memory_t m;
  arena_parts(&t.d, &m);
  int maxk;
  const int layers = decoder_arena_layers(&g->d, &maxk);
  return fsdp_activation_arena_bytes(&m, layers - maxk, maxk);
}

static double gib(size_t b) { return (double)b / (1u << 30); }

/* Bytes of the kernels' memory the model holds besides its arena at B x T:
 * the staged tokens and losses, attention's scratch and the column sums'
 * (the widest is fc's bias, 4C). */
static size_t kernel_bytes(const struct fsdp_gpt2 *g, int B, int T) {
  return gpt2_io_bytes((size_t)B * (size_t)T) +
         g->d.ops->attention_scratch_bytes(
             &(fsdp_attention_forward_args_t){.dt = g->d.dt, .B = B, .T = T, .NH = g->c.n_head}) +
         g->d.ops->colsum_scratch_bytes(4 * g->c.n_embd);
}

/* Besides the arena: the kernels' memory and the host row sampling draws from. */
static size_t extra_bytes(const decoder_t *d) {
  return (size_t)d->V * sizeof(float) +
         kernel_bytes((const struct fsdp_gpt2 *)d, d->maxB, d->maxT);
}

/* Device bytes the model allocates at B x T: its arena and the kernels'. */
static size_t device_need(const struct fsdp_gpt2 *g, int B, int T) {
  return arena_bytes_at(g, B, T) + kernel_bytes(g, B, T);
}

/* Before anything is allocated on the device: the activations for max_batch
 * x max_T fit in what is free, or an error saying by how much they do not and
 * what would fit instead (a smaller micro-batch, checkpointing every block, a
 * shorter sequence), each by the same arithmetic. */
static fsdp_status_t check_fits(const struct fsdp_gpt2 *g) {
  size_t free_b = 0, total_b = 0;
  FSDP_TRY(fsdp_cuda_mem_info(&free_b, &total_b));
  const int maxB = g->d.maxB, maxT = g->d.maxT;
  const size_t need = device_need(g, maxB, maxT);
  if (need <= free_b) return FSDP_SUCCESS;
  fsdp_gpt2_memory_t m;
  arena_parts(&g->d, &m);
  int b = maxB - 1, t = maxT - 1, maxk;
  while (b >= 1 && device_need(g, b, maxT) > free_b) b--;
  while (t >= 1 && device_need(g, maxB, t) > free_b) t--;
  const size_t ckpt = m.checkpointed + kernel_bytes(g, maxB, maxT);
  const int blocks = decoder_arena_layers(&g->d, &maxk);
  char fix[512];
  int n = snprintf(fix, sizeof fix, "to fit, ");
  if (b >= 1) n += snprintf(fix + n, sizeof fix - (size_t)n, "a micro-batch of %d (max_batch), ", b);
  else n += snprintf(fix + n, sizeof fix - (size_t)n, "no micro-batch of sequence %d fits; ", maxT);
  if (blocks > 1)
    n += snprintf(fix + n, sizeof fix - (size_t)n,
                  "activation checkpointing of every block (wrap_kinds and checkpoint_kinds "
                  "\"GPT2Block\": %.2f GiB%s), ", gib(ckpt), ckpt <= free_b ? "" : ", still too much");
  if (t >= 1) snprintf(fix + n, sizeof fix - (size_t)n, "or a sequence length of %d (max_T)", t);
  else snprintf(fix + n, sizeof fix - (size_t)n, "or a smaller model");
  return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                    "GPT-2 on CUDA: micro-batch %d x %d needs %.2f GiB of device memory (%d "
                    "blocks' activations of %.2f GiB each, %.1f MiB of it attention's; block "
                    "inputs %.2f GiB; logits and backward scratch %.2f GiB; kernel scratch "
                    "%.2f GiB) but the device has %.2f GiB free of %.2f GiB, and the parameters "
                    "come later at materialize; %s",
                    maxB, maxT, gib(need), blocks, gib(m.per_layer),
                    (double)m.attention / (1u << 20),
                    gib(m.inputs), gib(m.common), gib(need - arena_bytes_at(g, maxB, maxT)),
                    gib(free_b), gib(total_b), fix);
}

/* This build's layout, checked against what the table's attention keeps,
 * and on CUDA the room for the activations. */
static fsdp_status_t prepare(decoder_t *d) {
  struct fsdp_gpt2 *g = (struct fsdp_gpt2 *)d;
  set_layout(g, FSDP_GPT2_LAYOUT_BUILT);
  const fsdp_attention_forward_args_t att_max = {
      .dt = d->dt, .B = d->maxB, .T = d->maxT, .NH = g->c.n_head};
  if (d->ops->attention_state_floats(&att_max) != att_elems(g))
    return fsdp_error(FSDP_ERR_INTERNAL, "GPT-2: the %s %s attention keeps another state than "
                      "the layout sized for it", d->ops->name, fsdp_dtype_name(d->dt));
  FSDP_TRY(decoder_checkpoint_auto(d));
  if (d->ops->device == FSDP_DEVICE_CUDA) FSDP_TRY(check_fits(g));
  return FSDP_SUCCESS;
}

/* ---- blocks -------------------------------------------------------------
 * The residual stream is added where the next LayerNorm reads it, in one
 * kernel (layernorm_fused_forward): attn-proj writes its output into res2,
 * which becomes res2 = x + it beside ln2; fc-proj writes its output into the
 * next block's input x_at(l + 1), which that block's ln1 (ln_f after the last
 * block) completes in place, x_{l+1} = res2 + it, beside its LayerNorm. So a
 * block's `out` holds only the branch until the next LayerNorm reads it; a
 * checkpointed recompute rewrites it the same way (its last block leaves the
 * branch in an input whose gradient is done). */

/* prev_res2: the previous block's res2 when x holds only that block's fc-proj
 * output (completed here), NULL when x is whole (the embedding's output, or
 * a stored input a recompute starts from). */
static fsdp_status_t block_forward(const decoder_t *d, float *const *p, void *acts,
                                   const void *prev, void *x, void *out, int B, int T) {
  const struct fsdp_gpt2 *g = (const struct fsdp_gpt2 *)d;
  const struct acts *a = acts;
  const void *prev_res2 = prev ? ((const struct acts *)prev)->res2 : NULL;
  const fsdp_compute_ops_t *k = d->ops;
  const fsdp_dtype_t dt = d->dt;
  const fsdp_stream_t s = d->s;
  int C = d->C, BT = B * T;
  KC(d, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = dt, .res = x, .out = a->ln1, .mean = a->ln1_mean, .rstd = a->ln1_rstd,
         .inp = prev_res2 ? prev_res2 : x, .branch = prev_res2 ? x : NULL, .weight = p[LN1W],
         .bias = p[LN1B], .N = BT, .C = C}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->qkv, .inp = a->ln1, .weight = p[QKVW], .bias = p[QKVB], .B = BT,
         .C = C, .OC = 3 * C}, s));
  KC(d, ATTN_FWD,
     k->attention_forward(&(fsdp_attention_forward_args_t){
         .dt = dt, .out = a->atty, .att = a->att, .scratch = d->att_scratch, .qkv = a->qkv, .B = B,
         .T = T, .C = C, .NH = g->c.n_head}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->res2, .inp = a->atty, .weight = p[ATTPROJW], .bias = p[ATTPROJB],
         .B = BT, .C = C, .OC = C}, s));
  KC(d, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = dt, .res = a->res2, .out = a->ln2, .mean = a->ln2_mean, .rstd = a->ln2_rstd,
         .inp = x, .branch = a->res2, .weight = p[LN2W], .bias = p[LN2B], .N = BT, .C = C}, s));
  /* fc's GELU is its product's bias pass: timed with the products */
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->fch_gelu, .pre = a->fch, .inp = a->ln2, .weight = p[FCW],
         .bias = p[FCB], .B = BT, .C = C, .OC = 4 * C}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = out, .inp = a->fch_gelu, .weight = p[FCPROJW], .bias = p[FCPROJB],
         .B = BT, .C = 4 * C, .OC = C}, s));
  return FSDP_SUCCESS;
}

/* On entry g->dres holds d(out); on return d(x). Every d(input) is written
 * by its product (no zeroing pass); GELU's backward is fc-proj's, in the same
 * pass; the LayerNorms add into d(residual). */
static fsdp_status_t block_backward(decoder_t *d, float *const *p, float *const *dp,
                                    const void *acts, const void *x, int B, int T) {
  struct fsdp_gpt2 *g = (struct fsdp_gpt2 *)d;
  const struct acts *a = acts;
  const fsdp_compute_ops_t *k = d->ops;
  const fsdp_dtype_t dt = d->dt;
  const fsdp_stream_t s = d->s;
  int C = d->C, BT = B * T;
  void *cs = d->colsum;
  /* fc-proj's d(input) times gelu'(fch): GELU's backward, in the same pass */
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d4, .dweight = dp[FCPROJW], .dbias = dp[FCPROJB], .scratch = cs,
         .dout = g->dres, .inp = a->fch_gelu, .weight = p[FCPROJW], .gelu_pre = a->fch, .B = BT,
         .C = 4 * C, .OC = C}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[FCW], .dbias = dp[FCB], .scratch = cs,
         .dout = g->d4, .inp = a->ln2, .weight = p[FCW], .B = BT, .C = C, .OC = 4 * C}, s));
  /* the residual carries d(out) straight to d(res2), to which LN2 adds */
  KC(d, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LN2W], .dbias = dp[LN2B], .scratch = cs,
         .dout = g->d1, .inp = a->res2, .weight = p[LN2W], .mean = a->ln2_mean,
         .rstd = a->ln2_rstd, .N = BT, .C = C}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[ATTPROJW], .dbias = dp[ATTPROJB], .scratch = cs,
         .dout = g->dres, .inp = a->atty, .weight = p[ATTPROJW], .B = BT, .C = C, .OC = C}, s));
  KC(d, ATTN_BWD,
     k->attention_backward(&(fsdp_attention_backward_args_t){
         .dt = dt, .dqkv = g->d3, .scratch = d->att_scratch, .dout = g->d1, .qkv = a->qkv,
         .out = a->atty, .att = a->att, .B = B, .T = T, .C = C, .NH = g->c.n_head}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[QKVW], .dbias = dp[QKVB], .scratch = cs,
         .dout = g->d3, .inp = a->ln1, .weight = p[QKVW], .B = BT, .C = C, .OC = 3 * C}, s));
  KC(d, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LN1W], .dbias = dp[LN1B], .scratch = cs,
         .dout = g->d1, .inp = x, .weight = p[LN1W], .mean = a->ln1_mean, .rstd = a->ln1_rstd,
         .N = BT, .C = C}, s));
  return FSDP_SUCCESS;
}

/* ---- embedding and head --------------------------------------------------- */

static fsdp_status_t embed_forward(decoder_t *d, float *const *p, int B, int T) {
  KC(d, EMBED,
     d->ops->embedding_forward(&(fsdp_embedding_forward_args_t){
         .dt = d->dt, .out = decoder_x(d, 0, B, T), .tokens = d->tok, .wte = p[0], .wpe = p[1],
         .B = B, .T = T, .C = d->C}, d->s));
  return FSDP_SUCCESS;
}

/* ln_f (the root's last two tensors) and the logits through the tied wte. */
static fsdp_status_t head_forward(decoder_t *d, float *const *p, int B, int T) {
  struct fsdp_gpt2 *g = (struct fsdp_gpt2 *)d;
  const fsdp_compute_ops_t *k = d->ops;
  int C = d->C, BT = B * T;
  const int lnf = d->units[0].view.n - 2;
  /* the last block's residual, completed beside ln_f */
  void *xl = decoder_x(d, d->L, B, T);
  const void *res2 = d->L ? ((const struct acts *)decoder_acts(d, d->L - 1))->res2 : NULL;
  KC(d, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = d->dt, .res = xl, .out = g->lnf, .mean = g->lnf_mean, .rstd = g->lnf_rstd,
         .inp = res2 ? res2 : xl, .branch = res2 ? xl : NULL, .weight = p[lnf],
         .bias = p[lnf + 1], .N = BT, .C = C}, d->s));
  KC(d, HEAD_FWD,
     k->head_forward(&(fsdp_head_forward_args_t){
         .dt = d->dt, .logits = d->logits, .ld = d->ldv, .inp = g->lnf, .wte = p[0],
         .B = BT, .C = C, .V = d->V}, d->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t head_backward(decoder_t *d, float *const *p, float *const *dp, int B,
                                   int T) {
  struct fsdp_gpt2 *g = (struct fsdp_gpt2 *)d;
  const fsdp_compute_ops_t *k = d->ops;
  int C = d->C, BT = B * T;
  size_t n = (size_t)BT * C * d->esize;
  const int lnf = d->units[0].view.n - 2;
  KC(d, HEAD_BWD, fsdp_device_zero(g->d1, n, d->s));
  KC(d, HEAD_BWD,
     k->head_backward(&(fsdp_head_backward_args_t){
         .dt = d->dt, .dinp = g->d1, .dwte = dp[0], .dlogits = d->dlogits, .ld = d->ldv,
         .inp = g->lnf, .wte = p[0], .B = BT, .C = C, .V = d->V}, d->s));
  KC(d, LN_BWD, fsdp_device_zero(g->dres, n, d->s));
  KC(d, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = d->dt, .dinp = g->dres, .dweight = dp[lnf], .dbias = dp[lnf + 1],
         .scratch = d->colsum, .dout = g->d1, .inp = decoder_x(d, d->L, B, T),
         .weight = p[lnf], .mean = g->lnf_mean, .rstd = g->lnf_rstd, .N = BT, .C = C}, d->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t embed_backward(decoder_t *d, float *const *dp, int B, int T) {
  const struct fsdp_gpt2 *g = (const struct fsdp_gpt2 *)d;
  KC(d, EMBED,
     d->ops->embedding_backward(&(fsdp_embedding_backward_args_t){
         .dt = d->dt, .dwte = dp[0], .dwpe = dp[1], .dout = g->dres, .tokens = d->tok, .B = B,
         .T = T, .C = d->C}, d->s));
  return FSDP_SUCCESS;
}

/* ---- the model ------------------------------------------------------------ */

static const decoder_model_t gpt2_model = {
    .name = "GPT-2",
    .root_kind = "GPT2Model",
    .layer_kind = "GPT2Block",
    .layer_prefix = "h.",
    .layer_tensors = GPT2_BLOCK_TENSORS,
    .root_tensors = 4,
    .check_complete = 0,
    .acts_size = sizeof(struct acts),
    .layer_params = layer_params,
    .layer_descs = block_descs,
    .root_descs = root_descs,
    .prepare = prepare,
    .buffers = NULL,
    .fini = NULL,
    .arena_parts = arena_parts,
    .acts_carve = acts_carve,
    .common_carve = common_carve,
    .extra_bytes = extra_bytes,
    .check_arena = NULL,
    .check_view = NULL,
    .embed_forward = embed_forward,
    .layer_forward = block_forward,
    .head_forward = head_forward,
    .head_backward = head_backward,
    .layer_backward = block_backward,
    .embed_backward = embed_backward,
};

void fsdp_gpt2_destroy(fsdp_gpt2_t g) {
  if (!g) return;
  decoder_fini(&g->d);
  free(g);
}

fsdp_status_t fsdp_gpt2_create(fsdp_engine_t eng, const fsdp_gpt2_config_t *c,
                               const fsdp_gpt2_opts_t *o, fsdp_gpt2_t *out) {
  if (!eng || !o || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_create: NULL argument");
  FSDP_TRY(fsdp_gpt2_config_check(c));
  int maxT = o->max_T ? o->max_T : c->block_size;
  if (o->max_batch < 1 || maxT < 1 || maxT > c->block_size)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_gpt2_create: max_batch %d must be >= 1 and max_T %d in [1, %d]",
                      o->max_batch, maxT, c->block_size);
  struct fsdp_gpt2 *g = calloc(1, sizeof *g);
  if (!g) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  g->d = (decoder_t){.m = &gpt2_model, .eng = eng, .L = c->n_layer, .C = c->n_embd,
                     .NH = c->n_head, .V = c->vocab_size, .maxB = o->max_batch, .maxT = maxT,
                     .wide = 4 * c->n_embd};
  g->c = *c;
  fsdp_status_t st = decoder_init(&g->d, o);
  if (st != FSDP_SUCCESS) {
    fsdp_gpt2_destroy(g);
    return st;
  }
  *out = g;
  return FSDP_SUCCESS;
}

size_t fsdp_gpt2_activation_bytes(fsdp_gpt2_t g, size_t *without_checkpointing) {
  if (without_checkpointing) *without_checkpointing = g ? g->d.act_bytes_full : 0;
  return g ? g->d.act_bytes : 0;
}

int fsdp_gpt2_checkpointed(fsdp_gpt2_t g, size_t *budget) {
  if (budget) *budget = g ? g->d.budget : 0;
  return g ? decoder_checkpointed(&g->d) : 0;
}

int fsdp_gpt2_layer_checkpointed(fsdp_gpt2_t g, int l) {
  return g ? decoder_layer_checkpointed(&g->d, l) : -1;
}

fsdp_status_t fsdp_gpt2_forward_backward(fsdp_gpt2_t g, const int *tokens, const int *targets,
                                         int B, int T, float loss_scale, double *loss_sum) {
  if (!g || !targets) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2: NULL argument");
  return decoder_forward_backward(&g->d, tokens, targets, B, T, loss_scale, loss_sum);
}

fsdp_status_t fsdp_gpt2_forward(fsdp_gpt2_t g, const int *tokens, const int *targets, int B,
                                int T, double *loss_sum, const float **logits) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2: NULL model");
  return decoder_forward(&g->d, tokens, targets, B, T, loss_sum, logits);
}

fsdp_status_t fsdp_gpt2_sample(fsdp_gpt2_t g, const int *prompt, int n_prompt, int n_new,
                               const fsdp_gpt2_sampling_t *how, int *out) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_sample: NULL model");
  return decoder_sample(&g->d, "fsdp_gpt2_sample", prompt, n_prompt, n_new, how, out);
}

fsdp_status_t fsdp_gpt2_generate(fsdp_gpt2_t g, const int *prompt, int n_prompt, int n_new,
                                 float temperature, uint64_t seed, int *out) {
  fsdp_gpt2_sampling_t how = {temperature, 0, seed};
  return fsdp_gpt2_sample(g, prompt, n_prompt, n_new, &how, out);
}
