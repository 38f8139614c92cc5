/* src/nn/llama.c — the Llama family (fsdp/nn.h) over the public engine API:
 * its units from the tensor table (ckpt/llama_layout.h) cut by the library's
 * wrap policy, the activation arena, and forward/backward through the compute
 * table with per-unit activation checkpointing, and sampling (nn/sample.c).
 * Dims: B batch, T time, C channels, NH query heads, NKV key/value heads,
 * D = C / NH, QKV = (NH + 2 NKV) D, F SwiGLU's width, V vocabulary, L layers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/compute.h"
#include "ckpt/llama_layout.h"
#include "core/internal.h"
#include "fsdp/nn.h"
#include "nn/gpt2_io.h"
#include "nn/sample.h"

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

struct lunit {
  fsdp_unit_t id;
  int first, count; /* layers [first, first+count); root: unused */
  int checkpoint;
  fsdp_view_t view;
};

struct fsdp_llama {
  fsdp_engine_t eng;
  fsdp_llama_config_t c;
  int maxB, maxT;
  int D, QKV;          /* head dim; q, k and v's rows together */
  struct lunit *units; /* units[0] is the root */
  int n_units;
  int *layer_unit;     /* (L) index into units */
  int *layer_base;     /* (L) the layer's first tensor in its unit's view */
  int norm_at, head_at; /* model.norm's and the head's tensor in the root's view */
  char **names;        /* tensor names, owned */
  int n_names;

  const fsdp_compute_ops_t *ops; /* the engine device's compute table */
  fsdp_dtype_t dt;     /* activations, and parameters in the views */
  fsdp_stream_t s;     /* the engine's compute stream */
  gpt2_io_t *io;       /* tokens in, losses and logits out */
  float *inv_freq;     /* (D/2) RoPE's frequencies, the backend's memory */
  void *att_scratch;   /* ops->attention_scratch_bytes */
  void *colsum;        /* ops->colsum_scratch_bytes */
  size_t align, esize; /* arena alignment; bytes per activation */
  size_t att_floats;   /* attention's state per layer */
  int ldv;             /* the logits' row stride: V rounded up to 128 */
  void *arena;
  struct lacts *acts;    /* (L) saved, or pointing into scratch for checkpointed units */
  struct lacts *scratch; /* (the largest checkpointed unit's layers) */
  void *xs;              /* (L+1, B,T,C): every layer's input and the last output */
  void *lnf; float *lnf_rstd;
  void *logits;          /* (B,T,ldv); the gradient is written over it */
  void *dres, *d1, *dwide, *dh; /* backward: (B,T,C) x2, (B,T,max(QKV,2F)), (B,T,F) */
  const int *tok, *tgt;
  float *logits_host;
  size_t act_bytes, act_bytes_full;
};

/* ---- units ---------------------------------------------------------------- */

static size_t layer_params(const fsdp_llama_config_t *c) {
  size_t n = 0;
  for (int t = 0; t < LLAMA_LAYER_TENSORS; t++) {
    int rows, cols;
    llama_layer_tensor_shape(c, t, &rows, &cols);
    n += (size_t)rows * (size_t)(cols ? cols : 1);
  }
  return n;
}

static fsdp_status_t plan_units(struct fsdp_llama *g, const fsdp_llama_opts_t *o) {
  int L = g->c.n_layer;
  g->units = calloc((size_t)L + 1, sizeof *g->units);
  g->layer_unit = calloc((size_t)L, sizeof *g->layer_unit);
  g->layer_base = calloc((size_t)L, sizeof *g->layer_base);
  fsdp_module_t *mods = calloc((size_t)L, sizeof *mods);
  char(*names)[32] = calloc((size_t)L, sizeof *names);
  fsdp_status_t st = FSDP_ERR_OUT_OF_MEMORY;
  if (!g->units || !g->layer_unit || !g->layer_base || !mods || !names) {
    fsdp_error(st, "Llama: out of host memory");
    goto out;
  }
  for (int l = 0; l < L; l++) {
    snprintf(names[l], sizeof names[l], LLAMA_LAYER_PREFIX "%d", l);
    mods[l] = (fsdp_module_t){names[l], LAYER_KIND, layer_params(&g->c)};
  }
  fsdp_plan_opts_t po = FSDP_PLAN_OPTS_INIT;
  if (o->plan) po = *o->plan;
  else {
    po.wrap_kinds = o->wrap_kinds;
    po.wrap_min_params = o->wrap_min_params;
    po.checkpoint_kinds = o->checkpoint_kinds;
  }
  fsdp_plan_t plan = NULL;
  FSDP_TRYG(st, fsdp_plan_create(mods, L, &po, &plan), out);
  g->n_units = 1 + fsdp_plan_num_units(plan);
  g->units[0] = (struct lunit){.id = -1};
  for (int u = 1; u < g->n_units; u++) {
    fsdp_plan_unit_t pu;
    fsdp_plan_unit(plan, u - 1, &pu);
    g->units[u] = (struct lunit){.id = -1, .first = pu.first, .count = pu.count,
                                 .checkpoint = pu.checkpoint};
  }
  for (int l = 0; l < L; l++) g->layer_unit[l] = 1 + fsdp_plan_unit_of(plan, l);
  fsdp_plan_destroy(plan);
out:
  free(mods);
  free(names);
  return st;
}

static fsdp_status_t add_name(struct fsdp_llama *g, const char *name, fsdp_tensor_desc_t *d) {
  char *copy = fsdp_strdup(name);
  if (!copy) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  g->names[g->n_names++] = copy;
  d->name = copy;
  return FSDP_SUCCESS;
}

/* HF's LlamaForCausalLM init: every matrix N(0, 0.02), the norms' weights 1
 * (and out of weight decay). */
static fsdp_status_t matrix(struct fsdp_llama *g, const char *name, int64_t rows, int64_t cols,
                            fsdp_tensor_desc_t *d) {
  FSDP_TRY(add_name(g, name, d));
  *d = (fsdp_tensor_desc_t){d->name, 2, {rows, cols}, FSDP_INIT_NORMAL, 0.02f, 0};
  return FSDP_SUCCESS;
}

static fsdp_status_t norm(struct fsdp_llama *g, const char *name, fsdp_tensor_desc_t *d) {
  FSDP_TRY(add_name(g, name, d));
  *d = (fsdp_tensor_desc_t){d->name, 1, {g->c.n_embd}, FSDP_INIT_CONSTANT, 1.0f, 1};
  return FSDP_SUCCESS;
}

static fsdp_status_t layer_descs(struct fsdp_llama *g, int l, fsdp_tensor_desc_t *d) {
  for (int j = 0; j < LLAMA_LAYER_TENSORS; j++) {
    char name[128];
    if (llama_layer_tensor_name(l, j, name, sizeof name))
      return fsdp_error(FSDP_ERR_INTERNAL, "Llama: layer %d's tensor name too long", l);
    int rows, cols;
    llama_layer_tensor_shape(&g->c, j, &rows, &cols);
    FSDP_TRY(cols ? matrix(g, name, rows, cols, &d[j]) : norm(g, name, &d[j]));
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t add_unit(struct fsdp_llama *g, const fsdp_llama_opts_t *o, const char *name,
                              const char *kind, const fsdp_tensor_desc_t *d, int n,
                              fsdp_unit_t *id) {
  fsdp_unit_opts_t uo = FSDP_UNIT_OPTS_INIT;
  if (o->unit_opts) FSDP_TRY(o->unit_opts(o->unit_opts_user, name, kind, d, n, &uo));
  return fsdp_unit_add_opts(g->eng, name, kind, d, n, &uo, id);
}

/* The root, "root" (kind "LlamaForCausalLM"): model.embed_tokens, the layers
 * no unit takes, model.norm, lm_head when untied (HF's order); then the
 * plan's units, named "model.layers.<i>" or "model.layers.<i>-<j>". */
static fsdp_status_t register_units(struct fsdp_llama *g, const fsdp_llama_opts_t *o) {
  int L = g->c.n_layer;
  const int64_t C = g->c.n_embd, V = g->c.vocab_size;
  fsdp_tensor_desc_t *d = calloc((size_t)L * LLAMA_LAYER_TENSORS + 3, sizeof *d);
  if (!d) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  fsdp_status_t st = FSDP_SUCCESS;
  int n = 0;
  FSDP_TRYG(st, matrix(g, LLAMA_EMBED, V, C, &d[n++]), out);
  for (int l = 0; l < L; l++) {
    if (g->layer_unit[l]) continue;
    g->layer_base[l] = n;
    FSDP_TRYG(st, layer_descs(g, l, &d[n]), out);
    n += LLAMA_LAYER_TENSORS;
  }
  g->norm_at = n;
  FSDP_TRYG(st, norm(g, LLAMA_NORM, &d[n++]), out);
  g->head_at = 0;
  if (!g->c.tie_embeddings) {
    g->head_at = n;
    FSDP_TRYG(st, matrix(g, LLAMA_HEAD, V, C, &d[n++]), out);
  }
  FSDP_TRYG(st, add_unit(g, o, "root", "LlamaForCausalLM", d, n, &g->units[0].id), out);
  for (int u = 1; u < g->n_units; u++) {
    struct lunit *lu = &g->units[u];
    for (int k = 0; k < lu->count; k++) {
      g->layer_base[lu->first + k] = k * LLAMA_LAYER_TENSORS;
      FSDP_TRYG(st, layer_descs(g, lu->first + k, &d[k * LLAMA_LAYER_TENSORS]), out);
    }
    char name[64];
    if (lu->count == 1) snprintf(name, sizeof name, LLAMA_LAYER_PREFIX "%d", lu->first);
    else
      snprintf(name, sizeof name, LLAMA_LAYER_PREFIX "%d-%d", lu->first,
               lu->first + lu->count - 1);
    FSDP_TRYG(st, add_unit(g, o, name, LAYER_KIND, d, lu->count * LLAMA_LAYER_TENSORS, &lu->id),
              out);
  }
out:
  free(d);
  return st;
}

/* ---- activations ---------------------------------------------------------- */

static size_t span(const struct fsdp_llama *g, size_t n, size_t esize) {
  return (n * esize + g->align - 1) / g->align * g->align;
}

/* The next buffer of the arena at *at; a NULL base only counts. */
static void *take(const struct fsdp_llama *g, char *base, size_t *at, size_t n, size_t esize) {
  void *p = base ? base + *at : NULL;
  *at += span(g, n, esize);
  return p;
}

static void acts_carve(const struct fsdp_llama *g, struct lacts *a, char *base, size_t *at) {
  const size_t BT = (size_t)g->maxB * (size_t)g->maxT, C = (size_t)g->c.n_embd;
  const size_t F = (size_t)g->c.ffn_hidden, e = g->esize, f = sizeof(float);
  a->ln1 = take(g, base, at, BT * C, e);
  a->ln1_rstd = take(g, base, at, BT, f);
  a->qkv = take(g, base, at, BT * (size_t)g->QKV, e);
  a->att = take(g, base, at, g->att_floats, f);
  a->atty = take(g, base, at, BT * C, e);
  a->res2 = take(g, base, at, BT * C, e);
  a->ln2 = take(g, base, at, BT * C, e);
  a->ln2_rstd = take(g, base, at, BT, f);
  a->gu = take(g, base, at, BT * 2 * F, e);
  a->h = take(g, base, at, BT * F, e);
}

/* The final norm, the logits (their gradient written over them) and the
 * backward scratch. */
static void common_carve(struct fsdp_llama *g, char *base, size_t *at) {
  const size_t BT = (size_t)g->maxB * (size_t)g->maxT, C = (size_t)g->c.n_embd;
  const size_t F = (size_t)g->c.ffn_hidden, e = g->esize;
  const size_t wide = (size_t)g->QKV > 2 * F ? (size_t)g->QKV : 2 * F;
  g->lnf = take(g, base, at, BT * C, e);
  g->lnf_rstd = take(g, base, at, BT, sizeof(float));
  g->logits = take(g, base, at, BT * (size_t)g->ldv, e);
  g->dres = take(g, base, at, BT * C, e);
  g->d1 = take(g, base, at, BT * C, e);
  g->dwide = take(g, base, at, BT * wide, e);
  g->dh = take(g, base, at, BT * F, e);
}

/* Layers whose activations the arena holds at once: the saved ones and the
 * largest checkpointed unit's recompute scratch (*maxk layers). */
static int arena_layers(const struct fsdp_llama *g, int *maxk) {
  int saved = 0;
  *maxk = 0;
  for (int u = 0; u < g->n_units; u++)
    if (g->units[u].checkpoint && g->units[u].count > *maxk) *maxk = g->units[u].count;
  for (int l = 0; l < g->c.n_layer; l++) saved += !g->units[g->layer_unit[l]].checkpoint;
  return saved + *maxk;
}

/* Bytes of one layer's activations, of the L + 1 layer inputs, of the common
 * buffers (a dry run of the carving). */
static void arena_parts(const struct fsdp_llama *g, size_t *per_layer, size_t *inputs,
                        size_t *common) {
  struct fsdp_llama dry = *g;
  struct lacts a;
  *per_layer = *common = 0;
  acts_carve(&dry, &a, NULL, per_layer);
  common_carve(&dry, NULL, common);
  *inputs = (size_t)(g->c.n_layer + 1) *
            span(g, (size_t)g->maxB * g->maxT * g->c.n_embd, g->esize);
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
  struct fsdp_llama g = {.c = *c, .maxB = B, .maxT = T, .align = 256,
                         .esize = fsdp_dtype_size(act_dtype), .D = c->n_embd / c->n_head};
  g.QKV = (c->n_head + 2 * c->n_kv_head) * g.D;
  g.ldv = (c->vocab_size + 127) / 128 * 128;
  const size_t bnt = (size_t)B * (size_t)c->n_head * (size_t)T;
  g.att_floats = act_dtype == FSDP_BF16 ? bnt : bnt * (size_t)T;
  *out = (fsdp_llama_memory_t){0};
  arena_parts(&g, &out->per_layer, &out->inputs, &out->common);
  out->attention = span(&g, g.att_floats, sizeof(float));
  out->saved = out->inputs + (size_t)c->n_layer * out->per_layer + out->common;
  out->checkpointed = out->inputs + out->per_layer + out->common;
  return FSDP_SUCCESS;
}

/* The kernels' memory besides the arena: staged tokens and losses, the
 * attention and column-sum scratch, the frequencies. */
static size_t kernel_bytes(const struct fsdp_llama *g) {
  const fsdp_attention_forward_args_t att = {.dt = g->dt, .B = g->maxB, .T = g->maxT,
                                             .NH = g->c.n_head};
  const int wide = g->QKV > 2 * g->c.ffn_hidden ? g->QKV : 2 * g->c.ffn_hidden;
  return gpt2_io_bytes((size_t)g->maxB * (size_t)g->maxT) +
         g->ops->attention_scratch_bytes(&att) + g->ops->colsum_scratch_bytes(wide) +
         (size_t)g->D / 2 * sizeof(float);
}

static double gib(size_t b) { return (double)b / (1u << 30); }

static fsdp_status_t alloc_acts(struct fsdp_llama *g) {
  int L = g->c.n_layer, maxk;
  const int layers = arena_layers(g, &maxk);
  size_t per_layer, inputs, common;
  arena_parts(g, &per_layer, &inputs, &common);
  const size_t arena = inputs + (size_t)layers * per_layer + common, kb = kernel_bytes(g);
  g->act_bytes = arena + kb;
  g->act_bytes_full = inputs + (size_t)L * per_layer + common + kb;
  g->acts = calloc((size_t)L, sizeof *g->acts);
  g->scratch = calloc((size_t)(maxk ? maxk : 1), sizeof *g->scratch);
  if (!g->acts || !g->scratch)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  if (g->ops->device == FSDP_DEVICE_CUDA) {
    size_t free_b = 0, total_b = 0;
    FSDP_TRY(fsdp_cuda_mem_info(&free_b, &total_b));
    if (g->act_bytes > free_b)
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                        "Llama on CUDA: micro-batch %d x %d needs %.2f GiB of activations (%d "
                        "layers of %.2f GiB, logits and scratch %.2f GiB) but %.2f GiB of %.2f "
                        "are free; to fit, a smaller max_batch or max_T, or checkpointing (wrap "
                        "and checkpoint kinds \"" LAYER_KIND "\")",
                        g->maxB, g->maxT, gib(g->act_bytes), layers, gib(per_layer),
                        gib(common), gib(free_b), gib(total_b));
  }
  fsdp_status_t st = fsdp_device_alloc(g->ops->device, arena, &g->arena);
  if (st == FSDP_SUCCESS) st = fsdp_device_zero(g->arena, arena, FSDP_HOST_STREAM);
  if (st != FSDP_SUCCESS) {
    char why[256];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(st, "Llama: activations for batch %d x %d (%s kernels, %s): %s", g->maxB,
                      g->maxT, g->ops->name, fsdp_dtype_name(g->dt), why);
  }
  char *base = g->arena;
  size_t at = 0;
  g->xs = take(g, base, &at, inputs, 1);
  for (int k = 0; k < maxk; k++) acts_carve(g, &g->scratch[k], base, &at);
  for (int l = 0; l < L; l++) {
    const struct lunit *u = &g->units[g->layer_unit[l]];
    if (u->checkpoint) g->acts[l] = g->scratch[l - u->first];
    else acts_carve(g, &g->acts[l], base, &at);
  }
  common_carve(g, base, &at);
  return FSDP_SUCCESS;
}

/* The compute table of the engine's device and its dtype, its scratch and
 * the RoPE frequencies copied to its memory once. */
static fsdp_status_t pick_backend(struct fsdp_llama *g) {
  const fsdp_config_t *cfg = fsdp_engine_config(g->eng);
  g->ops = fsdp_compute_ops(cfg->device);
  if (!g->ops)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "Llama: no kernels for config.device %d in this "
                      "build (reconfigure with nvcc on PATH for CUDA: meson setup "
                      "-Dcuda=enabled)", (int)cfg->device);
  const char *missing = NULL;
  if (!fsdp_compute_ops_complete(g->ops, &missing))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "Llama: the %s kernels have no %s yet",
                      g->ops->name, missing);
  g->dt = cfg->device == FSDP_DEVICE_CUDA ? cfg->param_dtype : FSDP_F32;
  if (g->dt != FSDP_F32 && g->dt != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama on %s computes in f32 or bf16, not %s",
                      g->ops->name, fsdp_dtype_name(g->dt));
  g->s = fsdp_engine_stream(g->eng);
  g->align = cfg->device == FSDP_DEVICE_CUDA ? 256 : 1;
  g->esize = fsdp_dtype_size(g->dt);
  g->ldv = (g->c.vocab_size + 127) / 128 * 128;
  const fsdp_attention_forward_args_t att = {.dt = g->dt, .B = g->maxB, .T = g->maxT,
                                             .NH = g->c.n_head};
  g->att_floats = g->ops->attention_state_floats(&att);
  FSDP_TRY(gpt2_io_create(g->ops->device, (size_t)g->maxB * (size_t)g->maxT, &g->io));
  size_t scratch = g->ops->attention_scratch_bytes(&att);
  if (scratch) FSDP_TRY(fsdp_device_alloc(g->ops->device, scratch, &g->att_scratch));
  const int wide = g->QKV > 2 * g->c.ffn_hidden ? g->QKV : 2 * g->c.ffn_hidden;
  size_t colsum = g->ops->colsum_scratch_bytes(wide);
  if (colsum) FSDP_TRY(fsdp_device_alloc(g->ops->device, colsum, &g->colsum));
  float *host = malloc((size_t)g->D / 2 * sizeof(float));
  if (!host) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
  fsdp_llama_inv_freq(&g->c, host);
  fsdp_status_t st = fsdp_device_alloc(g->ops->device, (size_t)g->D / 2 * sizeof(float),
                                       (void **)&g->inv_freq);
  if (st == FSDP_SUCCESS)
    st = fsdp_device_copy(g->inv_freq, host, (size_t)g->D / 2 * sizeof(float), FSDP_HOST_STREAM);
  free(host);
  return st;
}

void fsdp_llama_destroy(fsdp_llama_t g) {
  if (!g) return;
  for (int i = 0; i < g->n_names; i++) free(g->names[i]);
  free(g->names);
  free(g->units);
  free(g->layer_unit);
  free(g->layer_base);
  free(g->acts);
  free(g->scratch);
  free(g->logits_host);
  if (g->ops) {
    fsdp_device_free(g->ops->device, g->arena);
    fsdp_device_free(g->ops->device, g->att_scratch);
    fsdp_device_free(g->ops->device, g->colsum);
    fsdp_device_free(g->ops->device, g->inv_freq);
  }
  gpt2_io_destroy(g->io);
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
  *g = (struct fsdp_llama){.eng = eng, .c = *c, .maxB = o->max_batch, .maxT = maxT};
  g->D = c->n_embd / c->n_head;
  g->QKV = (c->n_head + 2 * c->n_kv_head) * g->D;
  fsdp_status_t st;
  g->names = calloc((size_t)c->n_layer * LLAMA_LAYER_TENSORS + 3, sizeof *g->names);
  if (!g->names) {
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: out of host memory");
    goto fail;
  }
  FSDP_TRYG(st, plan_units(g, o), fail);
  FSDP_TRYG(st, register_units(g, o), fail);
  FSDP_TRYG(st, pick_backend(g), fail);
  FSDP_TRYG(st, alloc_acts(g), fail);
  *out = g;
  return FSDP_SUCCESS;
fail:
  fsdp_llama_destroy(g);
  return st;
}

size_t fsdp_llama_activation_bytes(fsdp_llama_t g, size_t *without_checkpointing) {
  if (without_checkpointing) *without_checkpointing = g ? g->act_bytes_full : 0;
  return g ? g->act_bytes : 0;
}

/* ---- per-kernel accounting (fsdp/profile.h), as GPT-2's ------------------- */

static fsdp_status_t kc_end(fsdp_engine_t e, fsdp_kclass_t k, fsdp_status_t st) {
  fsdp_status_t end = fsdp_engine_kclass_end(e, k);
  return st != FSDP_SUCCESS ? st : end;
}
#define KC(g, cls, call)                                         \
  do {                                                           \
    FSDP_TRY(fsdp_engine_kclass_begin((g)->eng, FSDP_KC_##cls)); \
    FSDP_TRY(kc_end((g)->eng, FSDP_KC_##cls, (call)));           \
  } while (0)

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
static fsdp_status_t layer_forward(const struct fsdp_llama *g, float *const *p,
                                   const struct lacts *a, const void *prev_res2, void *x,
                                   void *out, int B, int T) {
  const fsdp_compute_ops_t *k = g->ops;
  const fsdp_dtype_t dt = g->dt;
  const fsdp_stream_t s = g->s;
  const int C = g->c.n_embd, F = g->c.ffn_hidden, BT = B * T;
  const float eps = g->c.rms_eps;
  KC(g, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = dt, .res = x, .out = a->ln1, .rstd = a->ln1_rstd,
         .inp = prev_res2 ? prev_res2 : x, .branch = prev_res2 ? x : NULL,
         .weight = p[LLAMA_ATTN_NORM], .N = BT, .C = C, .eps = eps}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->qkv, .inp = a->ln1, .weight = p[LLAMA_Q], .B = BT, .C = C,
         .OC = g->QKV, .weight_out_in = 1}, s));
  KC(g, ROPE,
     k->rope_forward(&(fsdp_rope_args_t){
         .dt = dt, .qkv = a->qkv, .inv_freq = g->inv_freq, .B = B, .T = T,
         .NH = g->c.n_head, .NKV = g->c.n_kv_head, .D = g->D}, s));
  KC(g, ATTN_FWD,
     k->attention_forward(&(fsdp_attention_forward_args_t){
         .dt = dt, .out = a->atty, .att = a->att, .scratch = g->att_scratch, .qkv = a->qkv,
         .B = B, .T = T, .C = C, .NH = g->c.n_head, .NKV = g->c.n_kv_head}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->res2, .inp = a->atty, .weight = p[LLAMA_O], .B = BT, .C = C,
         .OC = C, .weight_out_in = 1}, s));
  KC(g, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = dt, .res = a->res2, .out = a->ln2, .rstd = a->ln2_rstd, .inp = x,
         .branch = a->res2, .weight = p[LLAMA_MLP_NORM], .N = BT, .C = C, .eps = eps}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->gu, .inp = a->ln2, .weight = p[LLAMA_GATE], .B = BT, .C = C,
         .OC = 2 * F, .weight_out_in = 1}, s));
  KC(g, SWIGLU,
     k->swiglu_forward(&(fsdp_swiglu_forward_args_t){
         .dt = dt, .out = a->h, .inp = a->gu, .N = BT, .F = F}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = out, .inp = a->h, .weight = p[LLAMA_DOWN], .B = BT, .C = F, .OC = C,
         .weight_out_in = 1}, s));
  return FSDP_SUCCESS;
}

/* On entry g->dres holds d(out); on return d(x). The products write their
 * d(input); the RMSNorms add into d(residual). */
static fsdp_status_t layer_backward(struct fsdp_llama *g, float *const *p, float *const *dp,
                                    const struct lacts *a, const void *x, int B, int T) {
  const fsdp_compute_ops_t *k = g->ops;
  const fsdp_dtype_t dt = g->dt;
  const fsdp_stream_t s = g->s;
  const int C = g->c.n_embd, F = g->c.ffn_hidden, BT = B * T;
  void *cs = g->colsum;
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->dh, .dweight = dp[LLAMA_DOWN], .scratch = cs, .dout = g->dres,
         .inp = a->h, .weight = p[LLAMA_DOWN], .B = BT, .C = F, .OC = C, .weight_out_in = 1},
         s));
  KC(g, SWIGLU,
     k->swiglu_backward(&(fsdp_swiglu_backward_args_t){
         .dt = dt, .dinp = g->dwide, .dout = g->dh, .inp = a->gu, .N = BT, .F = F}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_GATE], .scratch = cs, .dout = g->dwide,
         .inp = a->ln2, .weight = p[LLAMA_GATE], .B = BT, .C = C, .OC = 2 * F,
         .weight_out_in = 1}, s));
  /* the residual carries d(out) straight to d(res2), to which the norm adds */
  KC(g, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LLAMA_MLP_NORM], .scratch = cs,
         .dout = g->d1, .inp = a->res2, .weight = p[LLAMA_MLP_NORM], .rstd = a->ln2_rstd,
         .N = BT, .C = C}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_O], .scratch = cs, .dout = g->dres,
         .inp = a->atty, .weight = p[LLAMA_O], .B = BT, .C = C, .OC = C, .weight_out_in = 1},
         s));
  KC(g, ATTN_BWD, fsdp_device_zero(g->dwide, (size_t)BT * g->QKV * g->esize, s));
  KC(g, ATTN_BWD,
     k->attention_backward(&(fsdp_attention_backward_args_t){
         .dt = dt, .dqkv = g->dwide, .scratch = g->att_scratch, .dout = g->d1, .qkv = a->qkv,
         .out = a->atty, .att = a->att, .B = B, .T = T, .C = C, .NH = g->c.n_head,
         .NKV = g->c.n_kv_head}, s));
  KC(g, ROPE,
     k->rope_backward(&(fsdp_rope_args_t){
         .dt = dt, .qkv = g->dwide, .inv_freq = g->inv_freq, .B = B, .T = T,
         .NH = g->c.n_head, .NKV = g->c.n_kv_head, .D = g->D}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[LLAMA_Q], .scratch = cs, .dout = g->dwide,
         .inp = a->ln1, .weight = p[LLAMA_Q], .B = BT, .C = C, .OC = g->QKV,
         .weight_out_in = 1}, s));
  KC(g, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LLAMA_ATTN_NORM], .scratch = cs,
         .dout = g->d1, .inp = x, .weight = p[LLAMA_ATTN_NORM], .rstd = a->ln1_rstd, .N = BT,
         .C = C}, s));
  return FSDP_SUCCESS;
}

/* ---- forward / backward --------------------------------------------------- */

static void *x_at(const struct fsdp_llama *g, int l, int B, int T) {
  size_t n = (size_t)B * (size_t)T * (size_t)g->c.n_embd;
  return (char *)g->xs + (size_t)l * span(g, n, g->esize);
}

static fsdp_status_t check_batch(const struct fsdp_llama *g, const int *tokens,
                                 const int *targets, int B, int T) {
  if (!tokens || B < 1 || B > g->maxB || T < 1 || T > g->maxT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "Llama: batch %d x %d outside the %d x %d the model was created for", B,
                      T, g->maxB, g->maxT);
  for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
    if (tokens[i] < 0 || tokens[i] >= g->c.vocab_size)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "Llama: token %d at position %zu is not in the vocabulary [0, %d)",
                        tokens[i], i, g->c.vocab_size);
    if (targets && (targets[i] < 0 || targets[i] >= g->c.vocab_size))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "Llama: target %d at position %zu is not in the vocabulary [0, %d)",
                        targets[i], i, g->c.vocab_size);
  }
  return FSDP_SUCCESS;
}

/* p[j] + rows(j) x cols(j) elements == p[j + 1]: the fused products' premise. */
static int adjacent(const struct fsdp_llama *g, float *const *p, size_t esize, int j) {
  int rows, cols;
  llama_layer_tensor_shape(&g->c, j, &rows, &cols);
  return (const char *)p[j] + (size_t)rows * (size_t)cols * esize == (const char *)p[j + 1];
}

/* Acquires a unit; checks that its view holds the kernels' dtype and each
 * layer's q, k, v and gate, up adjacent. */
static fsdp_status_t acquire(struct fsdp_llama *g, struct lunit *u, fsdp_pass_t pass) {
  FSDP_TRY(fsdp_unit_acquire(g->eng, u->id, pass, &u->view));
  if (u->view.dtype != g->dt)
    return fsdp_error(FSDP_ERR_INTERNAL, "Llama: the engine hands out %s parameters, the %s "
                      "kernels were picked for %s", fsdp_dtype_name(u->view.dtype), g->ops->name,
                      fsdp_dtype_name(g->dt));
  for (int l = 0; l < g->c.n_layer; l++) {
    if (&g->units[g->layer_unit[l]] != u) continue;
    float *const *p = u->view.param + g->layer_base[l];
    float *const *dp = u->view.grad ? u->view.grad + g->layer_base[l] : NULL;
    static const int firsts[] = {LLAMA_Q, LLAMA_K, LLAMA_GATE}; /* q|k, k|v, gate|up */
    for (int j = 0; j < 3; j++) {
      const int i = firsts[j];
      if (!adjacent(g, p, g->esize, i) || (dp && !adjacent(g, dp, sizeof(float), i)))
        return fsdp_error(FSDP_ERR_INTERNAL, "Llama: layer %d's %s and %s are not adjacent "
                          "in unit %d's view", l, llama_layer_tensor_names[i],
                          llama_layer_tensor_names[i + 1], u->id);
    }
  }
  return FSDP_SUCCESS;
}

static float *const *layer_params_of(const struct fsdp_llama *g, int l) {
  return g->units[g->layer_unit[l]].view.param + g->layer_base[l];
}

static fsdp_status_t layers_forward(struct fsdp_llama *g, int B, int T) {
  for (int l = 0; l < g->c.n_layer; l++) {
    struct lunit *u = &g->units[g->layer_unit[l]];
    int wrapped = u != &g->units[0];
    if (wrapped && l == u->first) FSDP_TRY(acquire(g, u, FSDP_FORWARD));
    FSDP_TRY(layer_forward(g, layer_params_of(g, l), &g->acts[l],
                           l ? g->acts[l - 1].res2 : NULL, x_at(g, l, B, T),
                           x_at(g, l + 1, B, T), B, T));
    if (wrapped && l == u->first + u->count - 1)
      FSDP_TRY(fsdp_unit_release(g->eng, u->id, FSDP_FORWARD));
  }
  return FSDP_SUCCESS;
}

/* Tokens in, embedding, layers, final norm, logits; the root stays acquired
 * for the caller. */
static fsdp_status_t forward(struct fsdp_llama *g, const int *tokens, const int *targets, int B,
                             int T) {
  struct lunit *r = &g->units[0];
  const fsdp_compute_ops_t *k = g->ops;
  const int C = g->c.n_embd, BT = B * T, L = g->c.n_layer;
  FSDP_TRY(gpt2_io_stage(g->io, tokens, targets, (size_t)BT, g->s, &g->tok, &g->tgt));
  FSDP_TRY(acquire(g, r, FSDP_FORWARD));
  float *const *p = r->view.param;
  KC(g, EMBED,
     k->embedding_forward(&(fsdp_embedding_forward_args_t){
         .dt = g->dt, .out = x_at(g, 0, B, T), .tokens = g->tok, .wte = p[0], .B = B, .T = T,
         .C = C}, g->s));
  FSDP_TRY(layers_forward(g, B, T));
  void *xl = x_at(g, L, B, T);
  const void *res2 = g->acts[L - 1].res2;
  KC(g, RMSNORM_FWD,
     k->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){
         .dt = g->dt, .res = xl, .out = g->lnf, .rstd = g->lnf_rstd, .inp = res2, .branch = xl,
         .weight = p[g->norm_at], .N = BT, .C = C, .eps = g->c.rms_eps}, g->s));
  KC(g, HEAD_FWD,
     k->head_forward(&(fsdp_head_forward_args_t){
         .dt = g->dt, .logits = g->logits, .ld = g->ldv, .inp = g->lnf, .wte = p[g->head_at],
         .B = BT, .C = C, .V = g->c.vocab_size}, g->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t layers_backward(struct fsdp_llama *g, int B, int T) {
  for (int l = g->c.n_layer - 1; l >= 0; l--) {
    struct lunit *u = &g->units[g->layer_unit[l]];
    int wrapped = u != &g->units[0];
    if (wrapped && l == u->first + u->count - 1) {
      FSDP_TRY(acquire(g, u, FSDP_BACKWARD));
      for (int k = u->first; u->checkpoint && k <= l; k++) /* recompute from the unit's input */
        FSDP_TRY(layer_forward(g, layer_params_of(g, k), &g->acts[k],
                               k > u->first ? g->acts[k - 1].res2 : NULL, x_at(g, k, B, T),
                               x_at(g, k + 1, B, T), B, T));
    }
    FSDP_TRY(layer_backward(g, layer_params_of(g, l), u->view.grad + g->layer_base[l],
                            &g->acts[l], x_at(g, l, B, T), B, T));
    if (wrapped && l == u->first) FSDP_TRY(fsdp_unit_release(g->eng, u->id, FSDP_BACKWARD));
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t backward(struct fsdp_llama *g, int B, int T) {
  struct lunit *r = &g->units[0];
  const fsdp_compute_ops_t *k = g->ops;
  const int C = g->c.n_embd, BT = B * T;
  const size_t n = (size_t)BT * C * g->esize;
  FSDP_TRY(acquire(g, r, FSDP_BACKWARD));
  float *const *p = r->view.param, *const *dp = r->view.grad;
  KC(g, HEAD_BWD, fsdp_device_zero(g->d1, n, g->s));
  KC(g, HEAD_BWD,
     k->head_backward(&(fsdp_head_backward_args_t){
         .dt = g->dt, .dinp = g->d1, .dwte = dp[g->head_at], .dlogits = g->logits,
         .ld = g->ldv, .inp = g->lnf, .wte = p[g->head_at], .B = BT, .C = C,
         .V = g->c.vocab_size}, g->s));
  KC(g, RMSNORM_BWD, fsdp_device_zero(g->dres, n, g->s));
  KC(g, RMSNORM_BWD,
     k->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){
         .dt = g->dt, .dinp = g->dres, .dweight = dp[g->norm_at], .scratch = g->colsum,
         .dout = g->d1, .inp = x_at(g, g->c.n_layer, B, T), .weight = p[g->norm_at],
         .rstd = g->lnf_rstd, .N = BT, .C = C}, g->s));
  FSDP_TRY(layers_backward(g, B, T));
  KC(g, EMBED,
     k->embedding_backward(&(fsdp_embedding_backward_args_t){
         .dt = g->dt, .dwte = dp[0], .dout = g->dres, .tokens = g->tok, .B = B, .T = T,
         .C = C}, g->s));
  return fsdp_unit_release(g->eng, r->id, FSDP_BACKWARD);
}

/* Cross-entropy of the BT rows against the staged targets, fused with its
 * gradient (grad: written over the logits). */
static fsdp_status_t xent(struct fsdp_llama *g, int BT, float scale, int grad) {
  KC(g, XENT,
     g->ops->xent(&(fsdp_xent_args_t){
         .dt = g->dt, .logits = g->logits, .ld = g->ldv, .losses = gpt2_io_losses(g->io),
         .targets = g->tgt, .B = BT, .V = g->c.vocab_size, .scale = scale, .grad = grad}, g->s));
  return gpt2_io_loss_start(g->io, BT, g->s);
}

fsdp_status_t fsdp_llama_forward_backward(fsdp_llama_t g, const int *tokens, const int *targets,
                                          int B, int T, float loss_scale, double *loss_sum) {
  if (!g || !targets) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama: NULL argument");
  FSDP_TRY(check_batch(g, tokens, targets, B, T));
  FSDP_TRY(forward(g, tokens, targets, B, T));
  FSDP_TRY(xent(g, B * T, loss_scale, 1));
  FSDP_TRY(fsdp_unit_release(g->eng, g->units[0].id, FSDP_FORWARD));
  FSDP_TRY(backward(g, B, T));
  double loss;
  FSDP_TRY(gpt2_io_loss(g->io, &loss));
  if (loss_sum) *loss_sum = loss;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_llama_forward(fsdp_llama_t g, const int *tokens, const int *targets, int B,
                                 int T, double *loss_sum, const float **logits) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama: NULL model");
  FSDP_TRY(check_batch(g, tokens, targets, B, T));
  FSDP_TRY(forward(g, tokens, targets, B, T));
  FSDP_TRY(fsdp_unit_release(g->eng, g->units[0].id, FSDP_FORWARD));
  if (loss_sum && targets) {
    FSDP_TRY(xent(g, B * T, 1.0f, 0));
    FSDP_TRY(gpt2_io_loss(g->io, loss_sum));
  }
  if (!logits) return FSDP_SUCCESS;
  const size_t rows = (size_t)B * (size_t)T, V = (size_t)g->c.vocab_size, ld = (size_t)g->ldv;
  if (!g->logits_host) g->logits_host = malloc((size_t)g->maxB * g->maxT * ld * sizeof(float));
  if (!g->logits_host)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "Llama: no host memory to copy the logits to");
  /* rows ld apart, then packed V apart in place, in order */
  FSDP_TRY(gpt2_io_read(g->io, g->logits_host, g->logits, g->dt, rows * ld, g->s));
  for (size_t r = 1; r < rows && ld != V; r++)
    memmove(g->logits_host + r * V, g->logits_host + r * ld, V * sizeof(float));
  *logits = g->logits_host;
  return FSDP_SUCCESS;
}

/* ---- sampling (nn/sample.c) ---------------------------------------------- */

/* The logits of the last of T tokens, into row. */
static fsdp_status_t next_logits(void *model, const int *ctx, int T, float *row) {
  struct fsdp_llama *g = model;
  FSDP_TRY(check_batch(g, ctx, NULL, 1, T));
  FSDP_TRY(forward(g, ctx, NULL, 1, T));
  FSDP_TRY(fsdp_unit_release(g->eng, g->units[0].id, FSDP_FORWARD));
  const char *last = (const char *)g->logits + (size_t)(T - 1) * (size_t)g->ldv * g->esize;
  return gpt2_io_read(g->io, row, last, g->dt, (size_t)g->c.vocab_size, g->s);
}

fsdp_status_t fsdp_llama_sample(fsdp_llama_t g, const int *prompt, int n_prompt, int n_new,
                                const fsdp_llama_sampling_t *how, int *out) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_sample: NULL model");
  float *row = malloc((size_t)g->c.vocab_size * sizeof *row);
  if (!row) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_llama_sample: out of memory");
  fsdp_status_t st = nn_sample("fsdp_llama_sample", g->eng, g, next_logits, row,
                               g->c.vocab_size, g->maxT, prompt, n_prompt, n_new, how, out);
  free(row);
  return st;
}

fsdp_status_t fsdp_llama_generate(fsdp_llama_t g, const int *prompt, int n_prompt, int n_new,
                                  float temperature, uint64_t seed, int *out) {
  fsdp_llama_sampling_t how = {temperature, 0, seed};
  return fsdp_llama_sample(g, prompt, n_prompt, n_new, &how, out);
}
