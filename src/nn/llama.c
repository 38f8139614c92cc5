/* src/nn/llama.c — the Llama family (fsdp/nn.h) over the public engine API:
 * its tensors from the table (ckpt/llama_layout.h), its activations, the RoPE
 * frequencies, and its math (embedding, decoder layers, final norm and head,
 * and their backward) through the compute table, for the decoder skeleton
 * (nn/decoder.c), which cuts the layers into units by the library's wrap
 * policy, runs them with per-unit activation checkpointing and samples
 * (nn/sample.c). Dims: B batch, T time, C channels, NH query heads, NKV
 * key/value heads, D = C / NH, QKV = (NH + 2 NKV) D, F SwiGLU's width, V
 * vocabulary, L layers. */
#include <stdlib.h>

#include "ckpt/llama_layout.h"
#include "nn/decoder.h"

#define LAYER_KIND "LlamaDecoderLayer"

/* One layer's saved activations, sized for max_batch x max_T. void *: in the
 * activation dtype (fp32, or bf16 on a bf16 CUDA engine); float *: fp32. */
struct lacts {
  void *ln1; float *ln1_rstd; /* (B,T,C) (B,T) input_layernorm's output */
  void *qkv;                  /* (B,T,QKV) q, k (rotated) and v */
  float *att;                 /* attention's state */
  void *atty;                 /* (B,T,C) attention's output, o_proj's input */
  void *res2;                 /* (B,T,C) x + attention */
  void *ln2; float *ln2_rstd; /* (B,T,C) (B,T) post_attention_layernorm's output */
  void *gu;                   /* (B,T,2F) gate_proj's then up_proj's output */
  void *h;                    /* (B,T,F) silu(gate) * up, down_proj's input */
};

struct fsdp_llama {
  decoder_t d;         /* the skeleton: units, kernels, arena, I/O (first) */
  fsdp_llama_config_t c;
  int D, QKV;          /* head dim; q, k and v's rows together */
  int norm_at, head_at; /* model.norm's and the head's tensor in the root's view */
  float *inv_freq;     /* (D/2) RoPE's frequencies, the backend's memory */
  size_t att_floats;   /* attention's state per layer */
  void *lnf; float *lnf_rstd;
  void *dres, *d1, *dwide, *dh; /* backward: (B,T,C) x2, (B,T,max(QKV,2F)), (B,T,F) */
};

/* ---- tensors -------------------------------------------------------------- */

static size_t layer_params(const fsdp_llama_config_t *c) {
  size_t n = 0;
  for (int t = 0; t < LLAMA_LAYER_TENSORS; t++) {
    int rows, cols;
    llama_layer_tensor_shape(c, t, &rows, &cols);
    n += (size_t)rows * (size_t)(cols ? cols : 1);
  }
  return n;
}

static size_t layer_params_of_model(const decoder_t *d) {
  return layer_params(&((const struct fsdp_llama *)d)->c);
}

/* HF's LlamaForCausalLM init: every matrix N(0, 0.02), the norms' weights 1
 * (and out of weight decay). */
static fsdp_status_t matrix(decoder_t *d, const char *name, int64_t rows, int64_t cols,
                            fsdp_tensor_desc_t *t) {
  FSDP_TRY(decoder_add_name(d, name, t));
  *t = (fsdp_tensor_desc_t){t->name, 2, {rows, cols}, FSDP_INIT_NORMAL, 0.02f, 0};
  return FSDP_SUCCESS;
}

static fsdp_status_t norm(decoder_t *d, const char *name, fsdp_tensor_desc_t *t) {
  FSDP_TRY(decoder_add_name(d, name, t));
  *t = (fsdp_tensor_desc_t){t->name, 1, {d->C}, FSDP_INIT_CONSTANT, 1.0f, 1};
  return FSDP_SUCCESS;
}

static fsdp_status_t layer_descs(decoder_t *d, int l, fsdp_tensor_desc_t *t) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  for (int j = 0; j < LLAMA_LAYER_TENSORS; j++) {
    char name[128];
    if (llama_layer_tensor_name(l, j, name, sizeof name))
      return fsdp_error(FSDP_ERR_INTERNAL, "Llama: layer %d's tensor name too long", l);
    int rows, cols;
    llama_layer_tensor_shape(&g->c, j, &rows, &cols);
    FSDP_TRY(cols ? matrix(d, name, rows, cols, &t[j]) : norm(d, name, &t[j]));
  }
  return FSDP_SUCCESS;
}

/* The root's own (HF's order): model.embed_tokens before its layers;
 * model.norm, then lm_head when untied, after them. */
static fsdp_status_t root_descs(decoder_t *d, int tail, fsdp_tensor_desc_t *t, int *n) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  if (!tail) return matrix(d, LLAMA_EMBED, d->V, d->C, &t[(*n)++]);
  g->norm_at = *n;
  FSDP_TRY(norm(d, LLAMA_NORM, &t[(*n)++]));
  g->head_at = 0;
  if (!g->c.tie_embeddings) {
    g->head_at = *n;
    FSDP_TRY(matrix(d, LLAMA_HEAD, d->V, d->C, &t[(*n)++]));
  }
  return FSDP_SUCCESS;
}

/* ---- activations ---------------------------------------------------------- */

static void acts_carve(const decoder_t *d, void *acts, char *base, size_t *at) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  struct lacts *a = acts;
  const size_t BT = (size_t)d->maxB * (size_t)d->maxT, C = (size_t)d->C;
  const size_t F = (size_t)g->c.ffn_hidden, e = d->esize, f = sizeof(float);
  a->ln1 = decoder_take(d, base, at, BT * C, e);
  a->ln1_rstd = decoder_take(d, base, at, BT, f);
  a->qkv = decoder_take(d, base, at, BT * (size_t)g->QKV, e);
  a->att = decoder_take(d, base, at, g->att_floats, f);
  a->atty = decoder_take(d, base, at, BT * C, e);
  a->res2 = decoder_take(d, base, at, BT * C, e);
  a->ln2 = decoder_take(d, base, at, BT * C, e);
  a->ln2_rstd = decoder_take(d, base, at, BT, f);
  a->gu = decoder_take(d, base, at, BT * 2 * F, e);
  a->h = decoder_take(d, base, at, BT * F, e);
}

/* The final norm, the logits (their gradient written over them) and the
 * backward scratch. */
static void common_carve(decoder_t *d, char *base, size_t *at) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  const size_t BT = (size_t)d->maxB * (size_t)d->maxT, C = (size_t)d->C;
  const size_t F = (size_t)g->c.ffn_hidden, e = d->esize;
  g->lnf = decoder_take(d, base, at, BT * C, e);
  g->lnf_rstd = decoder_take(d, base, at, BT, sizeof(float));
  d->logits = d->dlogits = decoder_take(d, base, at, BT * (size_t)d->ldv, e);
  g->dres = decoder_take(d, base, at, BT * C, e);
  g->d1 = decoder_take(d, base, at, BT * C, e);
  g->dwide = decoder_take(d, base, at, BT * (size_t)d->wide, e);
  g->dh = decoder_take(d, base, at, BT * F, e);
}

/* Bytes of one layer's activations (attention's of it), of the L + 1 layer
 * inputs, of the common buffers (a dry run of the carving). */
static void arena_parts(const decoder_t *d, fsdp_llama_memory_t *m) {
  struct fsdp_llama dry = *(const struct fsdp_llama *)d;
  struct lacts a;
  *m = (fsdp_llama_memory_t){0};
  acts_carve(&dry.d, &a, NULL, &m->per_layer);
  common_carve(&dry.d, NULL, &m->common);
  m->inputs = decoder_inputs_bytes(d);
  m->attention = decoder_span(d, dry.att_floats, sizeof(float));
  m->saved = fsdp_activation_arena_bytes(m, d->L, 0);
  m->checkpointed = fsdp_activation_arena_bytes(m, 0, 1);
}

/* The widest product output: q|k|v or gate|up. */
static int widest(const fsdp_llama_config_t *c, int QKV) {
  return QKV > 2 * c->ffn_hidden ? QKV : 2 * c->ffn_hidden;
}

fsdp_status_t fsdp_llama_memory(const fsdp_llama_config_t *c, int B, int T,
                                fsdp_dtype_t act_dtype, fsdp_llama_memory_t *out) {
  if (!out) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_memory: NULL output");
  FSDP_TRY(fsdp_llama_config_check(c));
  if (B < 1 || T < 1 || T > c->max_seq_len)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_llama_memory: batch %d must be >= 1 and T %d in [1, %d]", B, T,
                      c->max_seq_len);
  if (act_dtype != FSDP_F32 && act_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_llama_memory: activations are f32 or bf16, not %s",
                      fsdp_dtype_name(act_dtype));
  struct fsdp_llama g = {.d = {.L = c->n_layer, .C = c->n_embd, .V = c->vocab_size, .maxB = B,
                               .maxT = T, .align = 256, .esize = fsdp_dtype_size(act_dtype)},
                         .c = *c, .D = c->n_embd / c->n_head};
  g.QKV = (c->n_head + 2 * c->n_kv_head) * g.D;
  g.d.wide = widest(c, g.QKV);
  g.d.ldv = (c->vocab_size + 127) / 128 * 128;
  const size_t bnt = (size_t)B * (size_t)c->n_head * (size_t)T;
  g.att_floats = act_dtype == FSDP_BF16 ? bnt : bnt * (size_t)T;
  arena_parts(&g.d, out);
  return FSDP_SUCCESS;
}

/* The kernels' memory besides the arena: staged tokens and losses, the
 * attention and column-sum scratch, the frequencies. */
static size_t kernel_bytes(const decoder_t *d) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  const fsdp_attention_forward_args_t att = {.dt = d->dt, .B = d->maxB, .T = d->maxT,
                                             .NH = d->NH};
  return gpt2_io_bytes((size_t)d->maxB * (size_t)d->maxT) +
         d->ops->attention_scratch_bytes(&att) + d->ops->colsum_scratch_bytes(d->wide) +
         (size_t)g->D / 2 * sizeof(float);
}

static double gib(size_t b) { return (double)b / (1u << 30); }

/* On CUDA: the arena and the kernels' memory (act_bytes) fit in what is free. */
static fsdp_status_t check_arena(const decoder_t *d, int layers, const fsdp_llama_memory_t *m) {
  if (d->ops->device != FSDP_DEVICE_CUDA) return FSDP_SUCCESS;
  size_t free_b = 0, total_b = 0;
  FSDP_TRY(fsdp_cuda_mem_info(&free_b, &total_b));
  if (d->act_bytes > free_b)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                      "Llama on CUDA: micro-batch %d x %d needs %.2f GiB of activations (%d "
                      "layers of %.2f GiB, logits and scratch %.2f GiB) but %.2f GiB of %.2f "
                      "are free; to fit, a smaller max_batch or max_T, or checkpointing (wrap "
                      "and checkpoint kinds \"" LAYER_KIND "\")",
                      d->maxB, d->maxT, gib(d->act_bytes), layers, gib(m->per_layer),
                      gib(m->common), gib(free_b), gib(total_b));
  return FSDP_SUCCESS;
}

/* The padded logits and what this table's attention keeps per layer. */
static fsdp_status_t prepare(decoder_t *d) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  d->ldv = (d->V + 127) / 128 * 128;
  const fsdp_attention_forward_args_t att = {.dt = d->dt, .B = d->maxB, .T = d->maxT,
                                             .NH = d->NH};
  g->att_floats = d->ops->attention_state_floats(&att);
  return decoder_checkpoint_auto(d);
}

/* The RoPE frequencies, copied to the backend's memory once. */
static fsdp_status_t buffers(decoder_t *d) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  float *host = malloc((size_t)g->D / 2 * sizeof(float));
  if (!host) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  fsdp_llama_inv_freq(&g->c, host);
  fsdp_status_t st = fsdp_device_alloc(d->ops->device, (size_t)g->D / 2 * sizeof(float),
                                       (void **)&g->inv_freq);
  if (st == FSDP_SUCCESS)
    st = fsdp_device_copy(g->inv_freq, host, (size_t)g->D / 2 * sizeof(float), FSDP_HOST_STREAM);
  free(host);
  return st;
}

static void fini(decoder_t *d) {
  fsdp_device_free(d->ops->device, ((struct fsdp_llama *)d)->inv_freq);
}

/* ---- decoder layers --------------------------------------------------------
 * The residual stream is added where the next RMSNorm reads it, in one kernel,
 * as in GPT-2: o_proj writes its output into res2, which
 * post_attention_layernorm completes to res2 = x + it; down_proj writes into
 * the next layer's input x_{l+1}, which that layer's input_layernorm (the
 * final norm after the last layer) completes in place to res2 + it.
 * q, k and v are adjacent in the unit's flat buffer (the engine lays a
 * unit's tensors end to end, gradients too), so one (QKV, C) product writes
 * attention's packed layout; gate and up likewise one (2F, C) product, whose
 * output is SwiGLU's input. */

/* prev_res2: the previous layer's res2 when x holds only its down_proj output
 * (completed here); NULL when x is whole. */
static fsdp_status_t layer_forward(const decoder_t *d, float *const *p, void *acts,
                                   const void *prev, void *x, void *out, int B, int T) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  const struct lacts *a = acts;
  const void *prev_res2 = prev ? ((const struct lacts *)prev)->res2 : NULL;
  const fsdp_compute_ops_t *k = d->ops;
  const fsdp_dtype_t dt = d->dt;
  const fsdp_stream_t s = d->s;
  const int C = g->c.n_embd, F = g->c.ffn_hidden, BT = B * T;
  const float eps = g->c.rms_eps;
  KC(d, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = dt, .res = x, .out = a->ln1, .rstd = a->ln1_rstd,
         .inp = prev_res2 ? prev_res2 : x, .branch = prev_res2 ? x : NULL,
         .weight = p[LLAMA_ATTN_NORM], .N = BT, .C = C, .eps = eps}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->qkv, .inp = a->ln1, .weight = p[LLAMA_Q], .B = BT, .C = C,
         .OC = g->QKV, .weight_out_in = 1}, s));
  KC(d, ROPE,
     k->rope_forward(&(fsdp_rope_args_t){
         .dt = dt, .qkv = a->qkv, .inv_freq = g->inv_freq, .B = B, .T = T,
         .NH = g->c.n_head, .NKV = g->c.n_kv_head, .D = g->D}, s));
  KC(d, ATTN_FWD,
     k->attention_forward(&(fsdp_attention_forward_args_t){
         .dt = dt, .out = a->atty, .att = a->att, .scratch = d->att_scratch, .qkv = a->qkv,
         .B = B, .T = T, .C = C, .NH = g->c.n_head, .NKV = g->c.n_kv_head}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->res2, .inp = a->atty, .weight = p[LLAMA_O], .B = BT, .C = C,
         .OC = C, .weight_out_in = 1}, s));
  KC(d, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = dt, .res = a->res2, .out = a->ln2, .rstd = a->ln2_rstd, .inp = x,
         .branch = a->res2, .weight = p[LLAMA_MLP_NORM], .N = BT, .C = C, .eps = eps}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->gu, .inp = a->ln2, .weight = p[LLAMA_GATE], .B = BT, .C = C,
         .OC = 2 * F, .weight_out_in = 1}, s));
  KC(d, SWIGLU,
     k->swiglu_forward(&(fsdp_swiglu_forward_args_t){
         .dt = dt, .out = a->h, .inp = a->gu, .N = BT, .F = F}, s));
  KC(d, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = out, .inp = a->h, .weight = p[LLAMA_DOWN], .B = BT, .C = F, .OC = C,
         .weight_out_in = 1}, s));
  return FSDP_SUCCESS;
}

/* On entry g->dres holds d(out); on return d(x). The products write their
 * d(input); the RMSNorms add into d(residual). */
static fsdp_status_t layer_backward(decoder_t *d, float *const *p, float *const *dp,
                                    const void *acts, const void *x, int B, int T) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  const struct lacts *a = acts;
  const fsdp_compute_ops_t *k = d->ops;
  const fsdp_dtype_t dt = d->dt;
  const fsdp_stream_t s = d->s;
  const int C = g->c.n_embd, F = g->c.ffn_hidden, BT = B * T;
  void *cs = d->colsum;
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->dh, .dweight = dp[LLAMA_DOWN], .scratch = cs, .dout = g->dres,
         .inp = a->h, .weight = p[LLAMA_DOWN], .B = BT, .C = F, .OC = C, .weight_out_in = 1},
         s));
  KC(d, SWIGLU,
     k->swiglu_backward(&(fsdp_swiglu_backward_args_t){
         .dt = dt, .dinp = g->dwide, .dout = g->dh, .inp = a->gu, .N = BT, .F = F}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_GATE], .scratch = cs, .dout = g->dwide,
         .inp = a->ln2, .weight = p[LLAMA_GATE], .B = BT, .C = C, .OC = 2 * F,
         .weight_out_in = 1}, s));
  /* the residual carries d(out) straight to d(res2), to which the norm adds */
  KC(d, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LLAMA_MLP_NORM], .scratch = cs,
         .dout = g->d1, .inp = a->res2, .weight = p[LLAMA_MLP_NORM], .rstd = a->ln2_rstd,
         .N = BT, .C = C}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_O], .scratch = cs, .dout = g->dres,
         .inp = a->atty, .weight = p[LLAMA_O], .B = BT, .C = C, .OC = C, .weight_out_in = 1},
         s));
  KC(d, ATTN_BWD,
     k->attention_backward(&(fsdp_attention_backward_args_t){
         .dt = dt, .dqkv = g->dwide, .scratch = d->att_scratch, .dout = g->d1, .qkv = a->qkv,
         .out = a->atty, .att = a->att, .B = B, .T = T, .C = C, .NH = g->c.n_head,
         .NKV = g->c.n_kv_head}, s));
  KC(d, ROPE,
     k->rope_backward(&(fsdp_rope_args_t){
         .dt = dt, .qkv = g->dwide, .inv_freq = g->inv_freq, .B = B, .T = T,
         .NH = g->c.n_head, .NKV = g->c.n_kv_head, .D = g->D}, s));
  KC(d, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_Q], .scratch = cs, .dout = g->dwide,
         .inp = a->ln1, .weight = p[LLAMA_Q], .B = BT, .C = C, .OC = g->QKV,
         .weight_out_in = 1}, s));
  KC(d, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LLAMA_ATTN_NORM], .scratch = cs,
         .dout = g->d1, .inp = x, .weight = p[LLAMA_ATTN_NORM], .rstd = a->ln1_rstd, .N = BT,
         .C = C}, s));
  return FSDP_SUCCESS;
}

/* ---- views, embedding and head ---------------------------------------------- */

/* p[j] + rows(j) x cols(j) elements == p[j + 1]: the fused products' premise. */
static int adjacent(const struct fsdp_llama *g, float *const *p, size_t esize, int j) {
  int rows, cols;
  llama_layer_tensor_shape(&g->c, j, &rows, &cols);
  return (const char *)p[j] + (size_t)rows * (size_t)cols * esize == (const char *)p[j + 1];
}

/* Each layer of a just-acquired unit has q, k, v and gate, up adjacent. */
static fsdp_status_t check_view(const decoder_t *d, const struct decoder_unit *u) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  for (int l = 0; l < d->L; l++) {
    if (&d->units[d->layer_unit[l]] != u) continue;
    float *const *p = u->view.param + d->layer_base[l];
    float *const *dp = u->view.grad ? u->view.grad + d->layer_base[l] : NULL;
    static const int firsts[] = {LLAMA_Q, LLAMA_K, LLAMA_GATE}; /* q|k, k|v, gate|up */
    for (int j = 0; j < 3; j++) {
      const int i = firsts[j];
      if (!adjacent(g, p, d->esize, i) || (dp && !adjacent(g, dp, sizeof(float), i)))
        return fsdp_error(FSDP_ERR_INTERNAL, "Llama: layer %d's %s and %s are not adjacent "
                          "in unit %d's view", l, llama_layer_tensor_names[i],
                          llama_layer_tensor_names[i + 1], u->id);
    }
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t embed_forward(decoder_t *d, float *const *p, int B, int T) {
  KC(d, EMBED,
     d->ops->embedding_forward(&(fsdp_embedding_forward_args_t){
         .dt = d->dt, .out = decoder_x(d, 0, B, T), .tokens = d->tok, .wte = p[0], .B = B,
         .T = T, .C = d->C}, d->s));
  return FSDP_SUCCESS;
}

/* The final norm completes the last layer's residual; the head's logits. */
static fsdp_status_t head_forward(decoder_t *d, float *const *p, int B, int T) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  const fsdp_compute_ops_t *k = d->ops;
  const int C = d->C, BT = B * T, L = d->L;
  void *xl = decoder_x(d, L, B, T);
  const void *res2 = ((const struct lacts *)decoder_acts(d, L - 1))->res2;
  KC(d, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = d->dt, .res = xl, .out = g->lnf, .rstd = g->lnf_rstd, .inp = res2, .branch = xl,
         .weight = p[g->norm_at], .N = BT, .C = C, .eps = g->c.rms_eps}, d->s));
  KC(d, HEAD_FWD,
     k->head_forward(&(fsdp_head_forward_args_t){
         .dt = d->dt, .logits = d->logits, .ld = d->ldv, .inp = g->lnf, .wte = p[g->head_at],
         .B = BT, .C = C, .V = d->V}, d->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t head_backward(decoder_t *d, float *const *p, float *const *dp, int B,
                                   int T) {
  struct fsdp_llama *g = (struct fsdp_llama *)d;
  const fsdp_compute_ops_t *k = d->ops;
  const int C = d->C, BT = B * T;
  const size_t n = (size_t)BT * C * d->esize;
  KC(d, HEAD_BWD, fsdp_device_zero(g->d1, n, d->s));
  KC(d, HEAD_BWD,
     k->head_backward(&(fsdp_head_backward_args_t){
         .dt = d->dt, .dinp = g->d1, .dwte = dp[g->head_at], .dlogits = d->logits,
         .ld = d->ldv, .inp = g->lnf, .wte = p[g->head_at], .B = BT, .C = C,
         .V = d->V}, d->s));
  KC(d, RMSNORM_BWD, fsdp_device_zero(g->dres, n, d->s));
  KC(d, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = d->dt, .dinp = g->dres, .dweight = dp[g->norm_at], .scratch = d->colsum,
         .dout = g->d1, .inp = decoder_x(d, d->L, B, T), .weight = p[g->norm_at],
         .rstd = g->lnf_rstd, .N = BT, .C = C}, d->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t embed_backward(decoder_t *d, float *const *dp, int B, int T) {
  const struct fsdp_llama *g = (const struct fsdp_llama *)d;
  KC(d, EMBED,
     d->ops->embedding_backward(&(fsdp_embedding_backward_args_t){
         .dt = d->dt, .dwte = dp[0], .dout = g->dres, .tokens = d->tok, .B = B, .T = T,
         .C = d->C}, d->s));
  return FSDP_SUCCESS;
}

/* ---- the model ------------------------------------------------------------ */

static const decoder_model_t llama_model = {
    .name = "Llama",
    .root_kind = "LlamaForCausalLM",
    .layer_kind = LAYER_KIND,
    .layer_prefix = LLAMA_LAYER_PREFIX,
    .layer_tensors = LLAMA_LAYER_TENSORS,
    .root_tensors = 3,
    .check_complete = 1,
    .acts_size = sizeof(struct lacts),
    .layer_params = layer_params_of_model,
    .layer_descs = layer_descs,
    .root_descs = root_descs,
    .prepare = prepare,
    .buffers = buffers,
    .fini = fini,
    .arena_parts = arena_parts,
    .acts_carve = acts_carve,
    .common_carve = common_carve,
    .extra_bytes = kernel_bytes,
    .check_arena = check_arena,
    .check_view = check_view,
    .embed_forward = embed_forward,
    .layer_forward = layer_forward,
    .head_forward = head_forward,
    .head_backward = head_backward,
    .layer_backward = layer_backward,
    .embed_backward = embed_backward,
};

void fsdp_llama_destroy(fsdp_llama_t g) {
  if (!g) return;
  decoder_fini(&g->d);
  free(g);
}

fsdp_status_t fsdp_llama_create(fsdp_engine_t eng, const fsdp_llama_config_t *c,
                                const fsdp_llama_opts_t *o, fsdp_llama_t *out) {
  if (!eng || !o || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_create: NULL argument");
  FSDP_TRY(fsdp_llama_config_check(c));
  const int top = c->max_seq_len < FSDP_ATTENTION_MAX_T ? c->max_seq_len : FSDP_ATTENTION_MAX_T;
  const int maxT = o->max_T ? o->max_T : c->max_seq_len;
  if (o->max_batch < 1 || maxT < 1 || maxT > top)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_llama_create: max_batch %d must be >= 1 and max_T %d in [1, %d] "
                      "(max_seq_len %d, attention's limit %d; set max_T)",
                      o->max_batch, maxT, top, c->max_seq_len, FSDP_ATTENTION_MAX_T);
  struct fsdp_llama *g = calloc(1, sizeof *g);
  if (!g) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  g->c = *c;
  g->D = c->n_embd / c->n_head;
  g->QKV = (c->n_head + 2 * c->n_kv_head) * g->D;
  g->d = (decoder_t){.m = &llama_model, .eng = eng, .L = c->n_layer, .C = c->n_embd,
                     .NH = c->n_head, .V = c->vocab_size, .maxB = o->max_batch, .maxT = maxT,
                     .wide = widest(c, g->QKV)};
  fsdp_status_t st = decoder_init(&g->d, o);
  if (st != FSDP_SUCCESS) {
    fsdp_llama_destroy(g);
    return st;
  }
  *out = g;
  return FSDP_SUCCESS;
}

size_t fsdp_llama_activation_bytes(fsdp_llama_t g, size_t *without_checkpointing) {
  if (without_checkpointing) *without_checkpointing = g ? g->d.act_bytes_full : 0;
  return g ? g->d.act_bytes : 0;
}

int fsdp_llama_checkpointed(fsdp_llama_t g, size_t *budget) {
  if (budget) *budget = g ? g->d.budget : 0;
  return g ? decoder_checkpointed(&g->d) : 0;
}

int fsdp_llama_layer_checkpointed(fsdp_llama_t g, int l) {
  return g ? decoder_layer_checkpointed(&g->d, l) : -1;
}

fsdp_status_t fsdp_llama_forward_backward(fsdp_llama_t g, const int *tokens, const int *targets,
                                          int B, int T, float loss_scale, double *loss_sum) {
  if (!g || !targets) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama: NULL argument");
  return decoder_forward_backward(&g->d, tokens, targets, B, T, loss_scale, loss_sum);
}

fsdp_status_t fsdp_llama_forward(fsdp_llama_t g, const int *tokens, const int *targets, int B,
                                 int T, double *loss_sum, const float **logits) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama: NULL model");
  return decoder_forward(&g->d, tokens, targets, B, T, loss_sum, logits);
}

fsdp_status_t fsdp_llama_sample(fsdp_llama_t g, const int *prompt, int n_prompt, int n_new,
                                const fsdp_llama_sampling_t *how, int *out) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_sample: NULL model");
  return decoder_sample(&g->d, "fsdp_llama_sample", prompt, n_prompt, n_new, how, out);
}

fsdp_status_t fsdp_llama_generate(fsdp_llama_t g, const int *prompt, int n_prompt, int n_new,
                                  float temperature, uint64_t seed, int *out) {
  fsdp_llama_sampling_t how = {temperature, 0, seed};
  return fsdp_llama_sample(g, prompt, n_prompt, n_new, &how, out);
}
