/* src/nn/gpt2.c — GPT-2 over the public engine API: its units from the tensor
 * table (ckpt/gpt2_layout.h, with the presets), configuration checks, its
 * modules for the library's wrap policy (fsdp/plan.h), forward/backward with
 * per-unit activation checkpointing, and sampling (nn/sample.c). Dims: B
 * batch, T time, C channels, NH heads, V vocabulary, L layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/compute.h"
#include "ckpt/gpt2_layout.h"
#include "core/internal.h"
#include "fsdp/nn.h"
#include "nn/gpt2_io.h"
#include "nn/sample.h"

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

struct gunit {
  fsdp_unit_t id;
  int first, count; /* blocks [first, first+count); root: unused (block_unit 0) */
  int checkpoint;
  fsdp_view_t view;
};

struct fsdp_gpt2 {
  fsdp_engine_t eng;
  fsdp_gpt2_config_t c;
  int maxB, maxT;
  struct gunit *units; /* units[0] is the root */
  int n_units;
  int *block_unit;     /* (L) index into units */
  int *block_base;     /* (L) index of the block's first tensor in its unit's view */
  char **names;        /* tensor names, owned */
  int n_names;

  const fsdp_compute_ops_t *ops; /* the kernels: the engine device's compute table */
  fsdp_dtype_t dt;       /* activations, and parameters in the views */
  fsdp_stream_t s;       /* the engine's compute stream, which the kernels run on */
  gpt2_io_t *io;         /* tokens in, losses and activations out */
  void *att_scratch;     /* the attention kernels' (ops->attention_scratch_bytes) */
  size_t align;          /* bytes each buffer in the arena is rounded up to */
  size_t esize;          /* bytes per activation element */
  int att_lse;           /* attention keeps the log-sum-exp, not probabilities */
  int one_head;          /* the logits' gradient is written over them, rows ldv apart */
  int gelu_grad;         /* before issue 15: GELU's gradient in a buffer of its own (a dry
                            run's layout only; the fused backward writes it over d4) */
  int ldv;               /* the logits' row stride: V, or V padded to a multiple of 128 */
  void *arena;           /* every buffer below, in the backend's memory */
  struct acts *acts;     /* (L) saved, or pointing into scratch for checkpointed units */
  struct acts *scratch;  /* (max blocks per checkpointed unit) */
  void *xs;              /* (L+1, B,T,C): the input of every block and the last output */
  void *lnf;             /* (B,T,C) */
  float *lnf_mean, *lnf_rstd;
  void *logits, *dlogits;              /* (B,T,V) */
  void *dres, *d1, *d3, *d4;          /* backward scratch */
  void *colsum;          /* the column sums' scratch (ops->colsum_scratch_bytes) */
  const int *tok, *tgt;  /* the micro-batch's tokens and targets as the kernels see them */
  float *row;            /* (V) host: the logits row sampling draws from */
  float *logits_host;    /* (B,T,V) host, CUDA only: fsdp_gpt2_forward's logits */
  size_t act_bytes, act_bytes_full;
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

/* ---- units ------------------------------------------------------------- */

/* The policy: the caller's plan, or one made of the three simple fields. */
static fsdp_plan_opts_t policy_of(const fsdp_gpt2_opts_t *o) {
  if (o->plan) return *o->plan;
  fsdp_plan_opts_t p = FSDP_PLAN_OPTS_INIT;
  p.wrap_kinds = o->wrap_kinds;
  p.wrap_min_params = o->wrap_min_params;
  p.checkpoint_kinds = o->checkpoint_kinds;
  return p;
}

/* Cuts the blocks into units with the library's wrap policy (fsdp/plan.h);
 * the blocks no unit takes stay in the root. Fills units and block_unit. */
static fsdp_status_t plan_units(struct fsdp_gpt2 *g, const fsdp_gpt2_opts_t *o) {
  int L = g->c.n_layer;
  g->units = calloc((size_t)L + 1, sizeof *g->units);
  g->block_unit = calloc((size_t)L, sizeof *g->block_unit);
  g->block_base = calloc((size_t)L, sizeof *g->block_base);
  fsdp_module_t *mods = calloc((size_t)L, sizeof *mods);
  char(*names)[24] = calloc((size_t)L, sizeof *names);
  fsdp_status_t st = FSDP_ERR_OUT_OF_MEMORY;
  if (!g->units || !g->block_unit || !g->block_base || !mods || !names) {
    fsdp_error(st, "GPT-2: out of host memory");
    goto out;
  }
  for (int l = 0; l < L; l++) {
    snprintf(names[l], sizeof names[l], "h.%d", l);
    mods[l] = (fsdp_module_t){names[l], "GPT2Block", block_params((size_t)g->c.n_embd)};
  }
  fsdp_plan_opts_t po = policy_of(o);
  fsdp_plan_t plan = NULL;
  FSDP_TRYG(st, fsdp_plan_create(mods, L, &po, &plan), out);
  g->n_units = 1 + fsdp_plan_num_units(plan);
  g->units[0] = (struct gunit){.id = -1};
  for (int u = 1; u < g->n_units; u++) {
    fsdp_plan_unit_t pu;
    fsdp_plan_unit(plan, u - 1, &pu);
    g->units[u] = (struct gunit){.id = -1, .first = pu.first, .count = pu.count,
                                 .checkpoint = pu.checkpoint};
  }
  for (int l = 0; l < L; l++) g->block_unit[l] = 1 + fsdp_plan_unit_of(plan, l);
  fsdp_plan_destroy(plan);
out:
  free(mods);
  free(names);
  return st;
}

static fsdp_status_t add_name(struct fsdp_gpt2 *g, const char *name, fsdp_tensor_desc_t *d) {
  char *copy = fsdp_strdup(name);
  if (!copy) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  g->names[g->n_names++] = copy;
  d->name = copy;
  return FSDP_SUCCESS;
}

static fsdp_status_t block_descs(struct fsdp_gpt2 *g, int l, fsdp_tensor_desc_t *d) {
  int64_t C = g->c.n_embd;
  float proj_std = 0.02f / sqrtf(2.0f * (float)g->c.n_layer);
  for (int j = 0; j < GPT2_BLOCK_TENSORS; j++) {
    char name[96];
    snprintf(name, sizeof name, "h.%d.%s", l, gpt2_block_tensors[j].name);
    FSDP_TRY(add_name(g, name, &d[j]));
    int matrix = gpt2_block_tensors[j].cols > 0;
    d[j].ndim = matrix ? 2 : 1;
    d[j].shape[0] = gpt2_block_tensors[j].rows * C;
    d[j].shape[1] = matrix ? gpt2_block_tensors[j].cols * C : 0;
    d[j].no_decay = !matrix;
    d[j].init = matrix ? FSDP_INIT_NORMAL : j == LN1W || j == LN2W ? FSDP_INIT_CONSTANT
                                                                   : FSDP_INIT_ZEROS;
    d[j].init_scale = j == ATTPROJW || j == FCPROJW ? proj_std : matrix ? 0.02f : 1.0f;
  }
  return FSDP_SUCCESS;
}

/* fsdp_unit_add_opts with the caller's per-unit options, if it gives any. */
static fsdp_status_t add_unit(struct fsdp_gpt2 *g, const fsdp_gpt2_opts_t *o, const char *name,
                              const char *kind, const fsdp_tensor_desc_t *d, int n,
                              fsdp_unit_t *id) {
  fsdp_unit_opts_t uo = FSDP_UNIT_OPTS_INIT;
  if (o->unit_opts) FSDP_TRY(o->unit_opts(o->unit_opts_user, name, kind, d, n, &uo));
  return fsdp_unit_add_opts(g->eng, name, kind, d, n, &uo, id);
}

static fsdp_status_t register_units(struct fsdp_gpt2 *g, const fsdp_gpt2_opts_t *o) {
  int L = g->c.n_layer;
  int64_t C = g->c.n_embd;
  fsdp_tensor_desc_t *d = calloc((size_t)L * GPT2_BLOCK_TENSORS + 4, sizeof *d);
  if (!d) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  fsdp_status_t st = FSDP_SUCCESS;
  /* root: wte, wpe, its blocks, ln_f */
  struct gunit *r = &g->units[0];
  int n = 0;
  FSDP_TRYG(st, add_name(g, "wte", &d[n]), out);
  d[n++] = (fsdp_tensor_desc_t){d[0].name, 2, {g->c.vocab_size, C}, FSDP_INIT_NORMAL, 0.02f, 0};
  FSDP_TRYG(st, add_name(g, "wpe", &d[n]), out);
  d[n] = (fsdp_tensor_desc_t){d[n].name, 2, {g->c.block_size, C}, FSDP_INIT_NORMAL, 0.01f, 0};
  n++;
  for (int l = 0; l < L; l++) {
    if (g->block_unit[l]) continue;
    g->block_base[l] = n;
    FSDP_TRYG(st, block_descs(g, l, &d[n]), out);
    n += GPT2_BLOCK_TENSORS;
  }
  FSDP_TRYG(st, add_name(g, "ln_f.weight", &d[n]), out);
  d[n] = (fsdp_tensor_desc_t){d[n].name, 1, {C}, FSDP_INIT_CONSTANT, 1.0f, 1};
  n++;
  FSDP_TRYG(st, add_name(g, "ln_f.bias", &d[n]), out);
  d[n] = (fsdp_tensor_desc_t){d[n].name, 1, {C}, FSDP_INIT_ZEROS, 0.0f, 1};
  n++;
  FSDP_TRYG(st, add_unit(g, o, "root", "GPT2Model", d, n, &r->id), out);
  for (int u = 1; u < g->n_units; u++) {
    struct gunit *gu = &g->units[u];
    for (int k = 0; k < gu->count; k++) {
      g->block_base[gu->first + k] = k * GPT2_BLOCK_TENSORS;
      FSDP_TRYG(st, block_descs(g, gu->first + k, &d[k * GPT2_BLOCK_TENSORS]), out);
    }
    char name[48];
    if (gu->count == 1) snprintf(name, sizeof name, "h.%d", gu->first);
    else snprintf(name, sizeof name, "h.%d-%d", gu->first, gu->first + gu->count - 1);
    FSDP_TRYG(st, add_unit(g, o, name, "GPT2Block", d, gu->count * GPT2_BLOCK_TENSORS, &gu->id),
              out);
  }
out:
  free(d);
  return st;
}

/* ---- activations -------------------------------------------------------- */

/* Bytes a buffer of n elements takes in the arena. */
static size_t span(const struct fsdp_gpt2 *g, size_t n, size_t esize) {
  return (n * esize + g->align - 1) / g->align * g->align;
}

/* The next buffer at byte offset *at of the arena `base`; a NULL base only
 * counts (a dry run sizes the arena with the code that carves it). */
static void *take(const struct fsdp_gpt2 *g, char *base, size_t *at, size_t n, size_t esize) {
  void *p = base ? base + *at : NULL;
  *at += span(g, n, esize);
  return p;
}

/* The vocabulary rounded up to a multiple of 128 (50257 -> 50304). */
static int padded_vocab(int V) { return (V + 127) / 128 * 128; }

/* What the kernels keep under a layout (g->esize set); FSDP_GPT2_LAYOUT_BUILT
 * is this build's: one padded logits buffer, and attention's log-sum-exp with
 * bf16 activations (the CUDA table's bf16 attention), its probabilities with
 * fp32 ones (CPU and CUDA fp32). pick_backend checks the table agrees. */
static void set_layout(struct fsdp_gpt2 *g, fsdp_gpt2_layout_t layout) {
  g->att_lse = layout == FSDP_GPT2_LAYOUT_FLASH ||
               (layout == FSDP_GPT2_LAYOUT_BUILT && g->esize == 2);
  g->one_head = layout != FSDP_GPT2_LAYOUT_PROBS;
  g->gelu_grad = layout == FSDP_GPT2_LAYOUT_PROBS;
  g->ldv = g->one_head ? padded_vocab(g->c.vocab_size) : g->c.vocab_size;
}

/* Attention's saved state: probabilities (B,NH,T,T) or the log-sum-exp (B,NH,T). */
static size_t att_elems(const struct fsdp_gpt2 *g) {
  size_t bnt = (size_t)g->maxB * (size_t)g->c.n_head * (size_t)g->maxT;
  return g->att_lse ? bnt : bnt * (size_t)g->maxT;
}

static void acts_carve(const struct fsdp_gpt2 *g, struct acts *a, char *base, size_t *at) {
  size_t BT = (size_t)g->maxB * (size_t)g->maxT, C = (size_t)g->c.n_embd;
  size_t e = g->esize, f = sizeof(float);
  a->ln1 = take(g, base, at, BT * C, e);
  a->ln1_mean = take(g, base, at, BT, f);
  a->ln1_rstd = take(g, base, at, BT, f);
  a->qkv = take(g, base, at, 3 * BT * C, e);
  a->atty = take(g, base, at, BT * C, e);
  a->res2 = take(g, base, at, BT * C, e);
  a->ln2 = take(g, base, at, BT * C, e);
  a->ln2_mean = take(g, base, at, BT, f);
  a->ln2_rstd = take(g, base, at, BT, f);
  a->fch = take(g, base, at, 4 * BT * C, e);
  a->fch_gelu = take(g, base, at, 4 * BT * C, e);
  a->att = take(g, base, at, att_elems(g), f);
}

/* ln_f, the logits (and their gradient, unless it is written over them) and
 * the backward scratch. */
static void common_carve(struct fsdp_gpt2 *g, char *base, size_t *at) {
  size_t BT = (size_t)g->maxB * (size_t)g->maxT, C = (size_t)g->c.n_embd;
  size_t ldv = (size_t)g->ldv, e = g->esize, f = sizeof(float);
  g->lnf = take(g, base, at, BT * C, e);
  g->lnf_mean = take(g, base, at, BT, f);
  g->lnf_rstd = take(g, base, at, BT, f);
  g->logits = take(g, base, at, BT * ldv, e);
  g->dlogits = g->one_head ? g->logits : take(g, base, at, BT * ldv, e);
  g->dres = take(g, base, at, BT * C, e);
  g->d1 = take(g, base, at, BT * C, e);
  g->d3 = take(g, base, at, 3 * BT * C, e);
  g->d4 = take(g, base, at, 4 * BT * C, e);
  if (g->gelu_grad) (void)take(g, base, at, 4 * BT * C, e);
}

/* Dry run of the carving for g's shape: one block's bytes (and its
 * attention's), the block inputs', the common buffers'. */
static void arena_parts(const struct fsdp_gpt2 *g, fsdp_gpt2_memory_t *m) {
  struct fsdp_gpt2 dry = *g; /* common_carve writes pointers: into a copy */
  struct acts a;
  *m = (fsdp_gpt2_memory_t){0};
  acts_carve(&dry, &a, NULL, &m->per_layer);
  m->attention = span(g, att_elems(g), sizeof(float));
  common_carve(&dry, NULL, &m->common);
  m->inputs = (size_t)(g->c.n_layer + 1) *
              span(g, (size_t)g->maxB * g->maxT * g->c.n_embd, g->esize);
  m->saved = m->inputs + (size_t)g->c.n_layer * m->per_layer + m->common;
  m->checkpointed = m->inputs + m->per_layer + m->common;
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
  struct fsdp_gpt2 g = {.c = *c, .maxB = B, .maxT = T, .align = 256,
                        .esize = fsdp_dtype_size(act_dtype)};
  set_layout(&g, layout);
  arena_parts(&g, out);
  return FSDP_SUCCESS;
}

/* One arena in the backend's memory: the block inputs, the saved (or
 * recompute scratch) activations of every block, ln_f, logits, backward
 * scratch; and a host row for sampling. backend: the kernels' own bytes. */
/* Blocks whose activations the arena holds at once: the saved ones, plus
 * the largest checkpointed unit's recompute scratch. *maxk: that unit's. */
static int arena_blocks(const struct fsdp_gpt2 *g, int *maxk) {
  int saved = 0;
  *maxk = 0;
  for (int u = 0; u < g->n_units; u++)
    if (g->units[u].checkpoint) *maxk = g->units[u].count > *maxk ? g->units[u].count : *maxk;
  /* per block: a plan may leave blocks in the root, which no unit counts */
  for (int l = 0; l < g->c.n_layer; l++) saved += !g->units[g->block_unit[l]].checkpoint;
  return saved + *maxk;
}

/* The arena's bytes for g's units at micro-batch B x T. */
static size_t arena_bytes_at(const struct fsdp_gpt2 *g, int B, int T) {
  struct fsdp_gpt2 t = *g;
  t.maxB = B, t.maxT = T;
  fsdp_gpt2_memory_t m;
  arena_parts(&t, &m);
  int maxk;
  return m.inputs + (size_t)arena_blocks(g, &maxk) * m.per_layer + m.common;
}

static fsdp_status_t alloc_acts(struct fsdp_gpt2 *g, size_t backend) {
  int L = g->c.n_layer, maxk;
  const int blocks = arena_blocks(g, &maxk);
  fsdp_gpt2_memory_t m;
  arena_parts(g, &m);
  size_t V = (size_t)g->c.vocab_size, xs = m.inputs;
  size_t arena = xs + (size_t)blocks * m.per_layer + m.common;
  g->act_bytes = arena + V * sizeof(float) + backend;
  g->act_bytes_full = m.saved + V * sizeof(float) + backend;
  g->acts = calloc((size_t)L, sizeof *g->acts);
  g->scratch = calloc((size_t)(maxk ? maxk : 1), sizeof *g->scratch);
  g->row = calloc(V, sizeof *g->row);
  if (!g->acts || !g->scratch || !g->row)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  fsdp_status_t st = fsdp_device_alloc(g->ops->device, arena, &g->arena);
  /* zeroed on the host stream, which returns when the zeros have landed: at
   * create, never in a step */
  if (st == FSDP_SUCCESS) st = fsdp_device_zero(g->arena, arena, FSDP_HOST_STREAM);
  if (st != FSDP_SUCCESS) {
    char why[256];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(st, "GPT-2: activations for batch %d x %d (%s kernels, %s): %s", g->maxB,
                      g->maxT, g->ops->name, fsdp_dtype_name(g->dt), why);
  }
  char *base = g->arena;
  size_t at = 0;
  g->xs = take(g, base, &at, xs, 1);
  for (int k = 0; k < maxk; k++) acts_carve(g, &g->scratch[k], base, &at);
  for (int l = 0; l < L; l++) {
    const struct gunit *u = &g->units[g->block_unit[l]];
    if (u->checkpoint) g->acts[l] = g->scratch[l - u->first];
    else acts_carve(g, &g->acts[l], base, &at);
  }
  common_carve(g, base, &at);
  return FSDP_SUCCESS;
}

static double gib(size_t b) { return (double)b / (1u << 30); }

/* Bytes of the kernels' memory the model holds besides its arena at B x T:
 * the staged tokens and losses, attention's scratch and the column sums'
 * (the widest is fc's bias, 4C). */
static size_t kernel_bytes(const struct fsdp_gpt2 *g, int B, int T) {
  return gpt2_io_bytes((size_t)B * (size_t)T) +
         g->ops->attention_scratch_bytes(
             &(fsdp_attention_forward_args_t){.dt = g->dt, .B = B, .T = T, .NH = g->c.n_head}) +
         g->ops->colsum_scratch_bytes(4 * g->c.n_embd);
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
  const size_t need = device_need(g, g->maxB, g->maxT);
  if (need <= free_b) return FSDP_SUCCESS;
  fsdp_gpt2_memory_t m;
  arena_parts(g, &m);
  int b = g->maxB - 1, t = g->maxT - 1, maxk;
  while (b >= 1 && device_need(g, b, g->maxT) > free_b) b--;
  while (t >= 1 && device_need(g, g->maxB, t) > free_b) t--;
  const size_t ckpt = m.checkpointed + kernel_bytes(g, g->maxB, g->maxT);
  const int blocks = arena_blocks(g, &maxk);
  char fix[512];
  int n = snprintf(fix, sizeof fix, "to fit, ");
  if (b >= 1) n += snprintf(fix + n, sizeof fix - (size_t)n, "a micro-batch of %d (max_batch), ", b);
  else n += snprintf(fix + n, sizeof fix - (size_t)n, "no micro-batch of sequence %d fits; ", g->maxT);
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
                    g->maxB, g->maxT, gib(need), blocks, gib(m.per_layer),
                    (double)m.attention / (1u << 20),
                    gib(m.inputs), gib(m.common), gib(need - arena_bytes_at(g, g->maxB, g->maxT)),
                    gib(free_b), gib(total_b), fix);
}

/* The compute table of the engine's device, in the dtype its views hand out
 * (the table refuses one it has no kernels for at the first call; creating
 * refuses it first, naming it). *bytes: the kernels' memory held besides the
 * arena. */
static fsdp_status_t pick_backend(struct fsdp_gpt2 *g, size_t *bytes) {
  const fsdp_config_t *cfg = fsdp_engine_config(g->eng);
  g->ops = fsdp_compute_ops(cfg->device);
  if (!g->ops)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "GPT-2: no kernels for config.device %d in this "
                      "build (reconfigure with nvcc on PATH for CUDA: meson setup "
                      "-Dcuda=enabled)", (int)cfg->device);
  g->dt = cfg->device == FSDP_DEVICE_CUDA ? cfg->param_dtype : FSDP_F32;
  if (g->dt != FSDP_F32 && g->dt != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2 on %s computes in f32 or bf16, not %s",
                      g->ops->name, fsdp_dtype_name(g->dt));
  g->s = fsdp_engine_stream(g->eng);
  g->align = cfg->device == FSDP_DEVICE_CUDA ? 256 : 1; /* where cuBLAS and the kernels like it */
  g->esize = fsdp_dtype_size(g->dt);
  set_layout(g, FSDP_GPT2_LAYOUT_BUILT);
  const fsdp_attention_forward_args_t att_max = {
      .dt = g->dt, .B = g->maxB, .T = g->maxT, .NH = g->c.n_head};
  if (g->ops->attention_state_floats(&att_max) != att_elems(g))
    return fsdp_error(FSDP_ERR_INTERNAL, "GPT-2: the %s %s attention keeps another state than "
                      "the layout sized for it", g->ops->name, fsdp_dtype_name(g->dt));
  if (cfg->device == FSDP_DEVICE_CUDA) FSDP_TRY(check_fits(g));
  size_t scratch = g->ops->attention_scratch_bytes(&att_max);
  FSDP_TRY(gpt2_io_create(g->ops->device, (size_t)g->maxB * (size_t)g->maxT, &g->io));
  if (scratch) FSDP_TRY(fsdp_device_alloc(g->ops->device, scratch, &g->att_scratch));
  size_t colsum = g->ops->colsum_scratch_bytes(4 * g->c.n_embd);
  if (colsum) FSDP_TRY(fsdp_device_alloc(g->ops->device, colsum, &g->colsum));
  *bytes = kernel_bytes(g, g->maxB, g->maxT);
  return FSDP_SUCCESS;
}

void fsdp_gpt2_destroy(fsdp_gpt2_t g) {
  if (!g) return;
  for (int i = 0; i < g->n_names; i++) free(g->names[i]);
  free(g->names);
  free(g->units);
  free(g->block_unit);
  free(g->block_base);
  free(g->acts);
  free(g->scratch);
  free(g->row);
  free(g->logits_host);
  if (g->ops) { /* device frees wait for the device: no queued kernel still reads these */
    fsdp_device_free(g->ops->device, g->arena);
    fsdp_device_free(g->ops->device, g->att_scratch);
    fsdp_device_free(g->ops->device, g->colsum);
  }
  gpt2_io_destroy(g->io);
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
  *g = (struct fsdp_gpt2){.eng = eng, .c = *c, .maxB = o->max_batch, .maxT = maxT};
  fsdp_status_t st;
  size_t backend = 0;
  g->names = calloc((size_t)c->n_layer * GPT2_BLOCK_TENSORS + 4, sizeof *g->names);
  if (!g->names) {
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
    goto fail;
  }
  FSDP_TRYG(st, plan_units(g, o), fail);
  FSDP_TRYG(st, register_units(g, o), fail);
  FSDP_TRYG(st, pick_backend(g, &backend), fail);
  FSDP_TRYG(st, alloc_acts(g, backend), fail);
  *out = g;
  return FSDP_SUCCESS;
fail:
  fsdp_gpt2_destroy(g);
  return st;
}

size_t fsdp_gpt2_activation_bytes(fsdp_gpt2_t g, size_t *without_checkpointing) {
  if (without_checkpointing) *without_checkpointing = g ? g->act_bytes_full : 0;
  return g ? g->act_bytes : 0;
}

/* ---- per-kernel accounting ----------------------------------------------- */

/* A kernel-table call inside the scope of its class (fsdp/profile.h), so that
 * fsdp-bench --kernel-profile times each class; with profiling off a scope is
 * one branch in the engine. The scope ends whether or not the call failed. */
static fsdp_status_t kc_end(fsdp_engine_t e, fsdp_kclass_t k, fsdp_status_t st) {
  fsdp_status_t end = fsdp_engine_kclass_end(e, k);
  return st != FSDP_SUCCESS ? st : end;
}
#define KC(g, cls, call)                                         \
  do {                                                           \
    FSDP_TRY(fsdp_engine_kclass_begin((g)->eng, FSDP_KC_##cls)); \
    FSDP_TRY(kc_end((g)->eng, FSDP_KC_##cls, (call)));           \
  } while (0)

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
static fsdp_status_t block_forward(const struct fsdp_gpt2 *g, float *const *p,
                                   const struct acts *a, const void *prev_res2, void *x,
                                   void *out, int B, int T) {
  const fsdp_compute_ops_t *k = g->ops;
  const fsdp_dtype_t dt = g->dt;
  const fsdp_stream_t s = g->s;
  int C = g->c.n_embd, BT = B * T;
  KC(g, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = dt, .res = x, .out = a->ln1, .mean = a->ln1_mean, .rstd = a->ln1_rstd,
         .inp = prev_res2 ? prev_res2 : x, .branch = prev_res2 ? x : NULL, .weight = p[LN1W],
         .bias = p[LN1B], .N = BT, .C = C}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->qkv, .inp = a->ln1, .weight = p[QKVW], .bias = p[QKVB], .B = BT,
         .C = C, .OC = 3 * C}, s));
  KC(g, ATTN_FWD,
     k->attention_forward(&(fsdp_attention_forward_args_t){
         .dt = dt, .out = a->atty, .att = a->att, .scratch = g->att_scratch, .qkv = a->qkv, .B = B,
         .T = T, .C = C, .NH = g->c.n_head}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->res2, .inp = a->atty, .weight = p[ATTPROJW], .bias = p[ATTPROJB],
         .B = BT, .C = C, .OC = C}, s));
  KC(g, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = dt, .res = a->res2, .out = a->ln2, .mean = a->ln2_mean, .rstd = a->ln2_rstd,
         .inp = x, .branch = a->res2, .weight = p[LN2W], .bias = p[LN2B], .N = BT, .C = C}, s));
  /* fc's GELU is its product's bias pass: timed with the products */
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = a->fch_gelu, .pre = a->fch, .inp = a->ln2, .weight = p[FCW],
         .bias = p[FCB], .B = BT, .C = C, .OC = 4 * C}, s));
  KC(g, BLOCK_FWD,
     k->matmul_forward(&(fsdp_matmul_forward_args_t){
         .dt = dt, .out = out, .inp = a->fch_gelu, .weight = p[FCPROJW], .bias = p[FCPROJB],
         .B = BT, .C = 4 * C, .OC = C}, s));
  return FSDP_SUCCESS;
}

/* On entry g->dres holds d(out); on return d(x). Every d(input) is written
 * by its product (no zeroing pass); GELU's backward is fc-proj's, in the same
 * pass; the LayerNorms add into d(residual). */
static fsdp_status_t block_backward(struct fsdp_gpt2 *g, float *const *p, float *const *dp,
                                    const struct acts *a, const void *x, int B, int T) {
  const fsdp_compute_ops_t *k = g->ops;
  const fsdp_dtype_t dt = g->dt;
  const fsdp_stream_t s = g->s;
  int C = g->c.n_embd, BT = B * T;
  void *cs = g->colsum;
  /* fc-proj's d(input) times gelu'(fch): GELU's backward, in the same pass */
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d4, .dweight = dp[FCPROJW], .dbias = dp[FCPROJB], .scratch = cs,
         .dout = g->dres, .inp = a->fch_gelu, .weight = p[FCPROJW], .gelu_pre = a->fch, .B = BT,
         .C = 4 * C, .OC = C}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[FCW], .dbias = dp[FCB], .scratch = cs,
         .dout = g->d4, .inp = a->ln2, .weight = p[FCW], .B = BT, .C = C, .OC = 4 * C}, s));
  /* the residual carries d(out) straight to d(res2), to which LN2 adds */
  KC(g, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LN2W], .dbias = dp[LN2B], .scratch = cs,
         .dout = g->d1, .inp = a->res2, .weight = p[LN2W], .mean = a->ln2_mean,
         .rstd = a->ln2_rstd, .N = BT, .C = C}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[ATTPROJW], .dbias = dp[ATTPROJB], .scratch = cs,
         .dout = g->dres, .inp = a->atty, .weight = p[ATTPROJW], .B = BT, .C = C, .OC = C}, s));
  KC(g, ATTN_BWD, fsdp_device_zero(g->d3, 3 * (size_t)BT * C * g->esize, s)); /* attention adds */
  KC(g, ATTN_BWD,
     k->attention_backward(&(fsdp_attention_backward_args_t){
         .dt = dt, .dqkv = g->d3, .scratch = g->att_scratch, .dout = g->d1, .qkv = a->qkv,
         .out = a->atty, .att = a->att, .B = B, .T = T, .C = C, .NH = g->c.n_head}, s));
  KC(g, BLOCK_BWD,
     k->matmul_backward(&(fsdp_matmul_backward_args_t){
         .dt = dt, .dinp = g->d1, .dweight = dp[QKVW], .dbias = dp[QKVB], .scratch = cs,
         .dout = g->d3, .inp = a->ln1, .weight = p[QKVW], .B = BT, .C = C, .OC = 3 * C}, s));
  KC(g, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = dt, .dinp = g->dres, .dweight = dp[LN1W], .dbias = dp[LN1B], .scratch = cs,
         .dout = g->d1, .inp = x, .weight = p[LN1W], .mean = a->ln1_mean, .rstd = a->ln1_rstd,
         .N = BT, .C = C}, s));
  return FSDP_SUCCESS;
}

/* ---- forward / backward ------------------------------------------------- */

static void *x_at(const struct fsdp_gpt2 *g, int l, int B, int T) {
  size_t n = (size_t)B * (size_t)T * (size_t)g->c.n_embd;
  return (char *)g->xs + (size_t)l * span(g, n, g->esize);
}

static fsdp_status_t check_batch(const struct fsdp_gpt2 *g, const int *tokens,
                                 const int *targets, int B, int T) {
  if (!tokens || B < 1 || B > g->maxB || T < 1 || T > g->maxT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "GPT-2: batch %d x %d outside the %d x %d the model was created for", B,
                      T, g->maxB, g->maxT);
  for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
    if (tokens[i] < 0 || tokens[i] >= g->c.vocab_size)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "GPT-2: token %d at position %zu is not in the vocabulary [0, %d)",
                        tokens[i], i, g->c.vocab_size);
    if (targets && (targets[i] < 0 || targets[i] >= g->c.vocab_size))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "GPT-2: target %d at position %zu is not in the vocabulary [0, %d)",
                        targets[i], i, g->c.vocab_size);
  }
  return FSDP_SUCCESS;
}

/* Acquires a unit and checks that its view holds what the kernels compute in. */
static fsdp_status_t acquire(struct fsdp_gpt2 *g, struct gunit *u, fsdp_pass_t pass) {
  FSDP_TRY(fsdp_unit_acquire(g->eng, u->id, pass, &u->view));
  if (u->view.dtype != g->dt)
    return fsdp_error(FSDP_ERR_INTERNAL, "GPT-2: the engine hands out %s parameters, the %s "
                      "kernels were picked for %s", fsdp_dtype_name(u->view.dtype), g->ops->name,
                      fsdp_dtype_name(g->dt));
  return FSDP_SUCCESS;
}

static float *const *block_params_of(const struct fsdp_gpt2 *g, int l) {
  return g->units[g->block_unit[l]].view.param + g->block_base[l];
}

/* Every block of the forward; acquires and releases the wrapped units. */
static fsdp_status_t blocks_forward(struct fsdp_gpt2 *g, int B, int T) {
  for (int l = 0; l < g->c.n_layer; l++) {
    struct gunit *u = &g->units[g->block_unit[l]];
    int wrapped = u != &g->units[0];
    if (wrapped && l == u->first) FSDP_TRY(acquire(g, u, FSDP_FORWARD));
    FSDP_TRY(block_forward(g, block_params_of(g, l), &g->acts[l],
                           l ? g->acts[l - 1].res2 : NULL, x_at(g, l, B, T),
                           x_at(g, l + 1, B, T), B, T));
    if (wrapped && l == u->first + u->count - 1) FSDP_TRY(fsdp_unit_release(g->eng, u->id, FSDP_FORWARD));
  }
  return FSDP_SUCCESS;
}

/* Tokens (and targets) to the kernels, embedding, blocks, ln_f and logits;
 * the root stays acquired for the caller. */
static fsdp_status_t forward(struct fsdp_gpt2 *g, const int *tokens, const int *targets, int B,
                             int T) {
  struct gunit *r = &g->units[0];
  const fsdp_compute_ops_t *k = g->ops;
  int C = g->c.n_embd, BT = B * T;
  FSDP_TRY(gpt2_io_stage(g->io, tokens, targets, (size_t)BT, g->s, &g->tok, &g->tgt));
  FSDP_TRY(acquire(g, r, FSDP_FORWARD));
  const int lnf = r->view.n - 2;
  KC(g, EMBED,
     k->embedding_forward(&(fsdp_embedding_forward_args_t){
         .dt = g->dt, .out = x_at(g, 0, B, T), .tokens = g->tok, .wte = r->view.param[0],
         .wpe = r->view.param[1], .B = B, .T = T, .C = C}, g->s));
  FSDP_TRY(blocks_forward(g, B, T));
  /* the last block's residual, completed beside ln_f */
  void *xl = x_at(g, g->c.n_layer, B, T);
  const void *res2 = g->c.n_layer ? g->acts[g->c.n_layer - 1].res2 : NULL;
  KC(g, RESID_LN_FWD,
     k->layernorm_fused_forward(&(fsdp_layernorm_forward_args_t){
         .dt = g->dt, .res = xl, .out = g->lnf, .mean = g->lnf_mean, .rstd = g->lnf_rstd,
         .inp = res2 ? res2 : xl, .branch = res2 ? xl : NULL, .weight = r->view.param[lnf],
         .bias = r->view.param[lnf + 1], .N = BT, .C = C}, g->s));
  KC(g, HEAD_FWD,
     k->head_forward(&(fsdp_head_forward_args_t){
         .dt = g->dt, .logits = g->logits, .ld = g->ldv, .inp = g->lnf, .wte = r->view.param[0],
         .B = BT, .C = C, .V = g->c.vocab_size}, g->s));
  return FSDP_SUCCESS;
}

static fsdp_status_t blocks_backward(struct fsdp_gpt2 *g, int B, int T) {
  for (int l = g->c.n_layer - 1; l >= 0; l--) {
    struct gunit *u = &g->units[g->block_unit[l]];
    int wrapped = u != &g->units[0];
    if (wrapped && l == u->first + u->count - 1) {
      FSDP_TRY(acquire(g, u, FSDP_BACKWARD));
      for (int k = u->first; u->checkpoint && k <= l; k++) /* recompute from the unit's input */
        FSDP_TRY(block_forward(g, block_params_of(g, k), &g->acts[k],
                               k > u->first ? g->acts[k - 1].res2 : NULL, x_at(g, k, B, T),
                               x_at(g, k + 1, B, T), B, T));
    }
    FSDP_TRY(block_backward(g, block_params_of(g, l), u->view.grad + g->block_base[l], &g->acts[l],
                            x_at(g, l, B, T), B, T));
    if (wrapped && l == u->first) FSDP_TRY(fsdp_unit_release(g->eng, u->id, FSDP_BACKWARD));
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t backward(struct fsdp_gpt2 *g, int B, int T) {
  struct gunit *r = &g->units[0];
  const fsdp_compute_ops_t *k = g->ops;
  int C = g->c.n_embd, BT = B * T;
  size_t n = (size_t)BT * C * g->esize;
  FSDP_TRY(acquire(g, r, FSDP_BACKWARD));
  float *const *p = r->view.param, *const *dp = r->view.grad;
  const int lnf = r->view.n - 2;
  KC(g, HEAD_BWD, fsdp_device_zero(g->d1, n, g->s));
  KC(g, HEAD_BWD,
     k->head_backward(&(fsdp_head_backward_args_t){
         .dt = g->dt, .dinp = g->d1, .dwte = dp[0], .dlogits = g->dlogits, .ld = g->ldv,
         .inp = g->lnf, .wte = p[0], .B = BT, .C = C, .V = g->c.vocab_size}, g->s));
  KC(g, LN_BWD, fsdp_device_zero(g->dres, n, g->s));
  KC(g, LN_BWD,
     k->layernorm_fused_backward(&(fsdp_layernorm_backward_args_t){
         .dt = g->dt, .dinp = g->dres, .dweight = dp[lnf], .dbias = dp[lnf + 1],
         .scratch = g->colsum, .dout = g->d1, .inp = x_at(g, g->c.n_layer, B, T),
         .weight = p[lnf], .mean = g->lnf_mean, .rstd = g->lnf_rstd, .N = BT, .C = C}, g->s));
  FSDP_TRY(blocks_backward(g, B, T));
  KC(g, EMBED,
     k->embedding_backward(&(fsdp_embedding_backward_args_t){
         .dt = g->dt, .dwte = dp[0], .dwpe = dp[1], .dout = g->dres, .tokens = g->tok, .B = B,
         .T = T, .C = C}, g->s));
  return fsdp_unit_release(g->eng, r->id, FSDP_BACKWARD);
}

/* Cross-entropy of the BT rows of logits against the staged targets, fused
 * with its gradient (grad: written over the logits); the per-row losses head
 * for the host behind it. */
static fsdp_status_t xent(struct fsdp_gpt2 *g, void *logits, int BT, float scale, int grad) {
  KC(g, XENT,
     g->ops->xent(&(fsdp_xent_args_t){
         .dt = g->dt, .logits = logits, .ld = g->ldv, .losses = gpt2_io_losses(g->io),
         .targets = g->tgt, .B = BT, .V = g->c.vocab_size, .scale = scale, .grad = grad}, g->s));
  return gpt2_io_loss_start(g->io, BT, g->s);
}

fsdp_status_t fsdp_gpt2_forward_backward(fsdp_gpt2_t g, const int *tokens, const int *targets,
                                         int B, int T, float loss_scale, double *loss_sum) {
  if (!g || !targets) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2: NULL argument");
  FSDP_TRY(check_batch(g, tokens, targets, B, T));
  FSDP_TRY(forward(g, tokens, targets, B, T));
  FSDP_TRY(xent(g, g->dlogits, B * T, loss_scale, 1));
  FSDP_TRY(fsdp_unit_release(g->eng, g->units[0].id, FSDP_FORWARD));
  FSDP_TRY(backward(g, B, T));
  double loss;
  FSDP_TRY(gpt2_io_loss(g->io, &loss)); /* CUDA: the micro-batch's one wait */
  if (loss_sum) *loss_sum = loss;
  return FSDP_SUCCESS;
}

/* Forward and the summed loss against targets (when both are given). */
static fsdp_status_t forward_loss(struct fsdp_gpt2 *g, const int *tokens, const int *targets,
                                  int B, int T, double *loss_sum) {
  FSDP_TRY(check_batch(g, tokens, targets, B, T));
  FSDP_TRY(forward(g, tokens, targets, B, T));
  FSDP_TRY(fsdp_unit_release(g->eng, g->units[0].id, FSDP_FORWARD));
  if (!loss_sum || !targets) return FSDP_SUCCESS;
  FSDP_TRY(xent(g, g->logits, B * T, 1.0f, 0));
  return gpt2_io_loss(g->io, loss_sum);
}

fsdp_status_t fsdp_gpt2_forward(fsdp_gpt2_t g, const int *tokens, const int *targets, int B,
                                int T, double *loss_sum, const float **logits) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2: NULL model");
  FSDP_TRY(forward_loss(g, tokens, targets, B, T, loss_sum));
  if (!logits) return FSDP_SUCCESS;
  size_t rows = (size_t)B * (size_t)T, V = (size_t)g->c.vocab_size, ld = (size_t)g->ldv;
  if (!g->logits_host) /* once, on the first call that asks */
    g->logits_host = malloc((size_t)g->maxB * g->maxT * ld * sizeof(float));
  if (!g->logits_host)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: no host memory to copy the logits to");
  /* rows ld apart, then packed V apart in place (each row moves to a lower
   * or the same address, in order) */
  FSDP_TRY(gpt2_io_read(g->io, g->logits_host, g->logits, g->dt, rows * ld, g->s));
  for (size_t r = 1; r < rows && ld != V; r++)
    memmove(g->logits_host + r * V, g->logits_host + r * ld, V * sizeof(float));
  *logits = g->logits_host;
  return FSDP_SUCCESS;
}

/* ---- sampling (nn/sample.c) ---------------------------------------------- */

/* The logits of the last of T tokens, into row. */
static fsdp_status_t next_logits(void *model, const int *ctx, int T, float *row) {
  struct fsdp_gpt2 *g = model;
  FSDP_TRY(forward_loss(g, ctx, NULL, 1, T, NULL));
  const char *last = (const char *)g->logits + (size_t)(T - 1) * (size_t)g->ldv * g->esize;
  return gpt2_io_read(g->io, row, last, g->dt, (size_t)g->c.vocab_size, g->s);
}

fsdp_status_t fsdp_gpt2_sample(fsdp_gpt2_t g, const int *prompt, int n_prompt, int n_new,
                               const fsdp_gpt2_sampling_t *how, int *out) {
  if (!g) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_sample: NULL model");
  return nn_sample("fsdp_gpt2_sample", g->eng, g, next_logits, g->row, g->c.vocab_size, g->maxT,
                   prompt, n_prompt, n_new, how, out);
}

fsdp_status_t fsdp_gpt2_generate(fsdp_gpt2_t g, const int *prompt, int n_prompt, int n_new,
                                 float temperature, uint64_t seed, int *out) {
  fsdp_gpt2_sampling_t how = {temperature, 0, seed};
  return fsdp_gpt2_sample(g, prompt, n_prompt, n_new, &how, out);
}
