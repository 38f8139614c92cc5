/* src/nn/decoder.c — the decoder skeleton (nn/decoder.h) under GPT-2 and the
 * Llama family: units from the library's wrap policy, tensor registration,
 * the backend and its buffers, the activation arena, the forward and
 * backward loops over units with activation checkpointing, cross-entropy,
 * logits to the host and sampling. The models' math is behind their tables. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/decoder.h"
#include "nn/sample.h"

/* ---- units ---------------------------------------------------------------- */

/* The policy: the caller's plan, or one made of the three simple fields. */
static fsdp_plan_opts_t policy_of(const fsdp_gpt2_opts_t *o) {
  if (o->plan) return *o->plan;
  fsdp_plan_opts_t p = FSDP_PLAN_OPTS_INIT;
  p.wrap_kinds = o->wrap_kinds;
  p.wrap_min_params = o->wrap_min_params;
  p.checkpoint_kinds = o->checkpoint_kinds;
  return p;
}

/* Cuts the layers into units with the library's wrap policy (fsdp/plan.h);
 * the layers no unit takes stay in the root. Fills units and layer_unit. */
static fsdp_status_t plan_units(decoder_t *d, const fsdp_gpt2_opts_t *o) {
  const int L = d->L;
  d->units = calloc((size_t)L + 1, sizeof *d->units);
  d->layer_unit = calloc((size_t)L, sizeof *d->layer_unit);
  d->layer_base = calloc((size_t)L, sizeof *d->layer_base);
  fsdp_module_t *mods = calloc((size_t)L, sizeof *mods);
  char(*names)[64] = calloc((size_t)L, sizeof *names);
  fsdp_status_t st = FSDP_ERR_OUT_OF_MEMORY;
  if (!d->units || !d->layer_unit || !d->layer_base || !mods || !names) {
    fsdp_error(st, "%s: out of host memory", d->m->name);
    goto out;
  }
  const size_t params = d->m->layer_params(d);
  for (int l = 0; l < L; l++) {
    snprintf(names[l], sizeof names[l], "%s%d", d->m->layer_prefix, l);
    mods[l] = (fsdp_module_t){names[l], d->m->layer_kind, params};
  }
  fsdp_plan_opts_t po = policy_of(o);
  fsdp_plan_t plan = NULL;
  FSDP_TRYG(st, fsdp_plan_create(mods, L, &po, &plan), out);
  d->n_units = 1 + fsdp_plan_num_units(plan);
  d->units[0] = (struct decoder_unit){.id = -1};
  for (int u = 1; u < d->n_units; u++) {
    fsdp_plan_unit_t pu;
    fsdp_plan_unit(plan, u - 1, &pu);
    d->units[u] = (struct decoder_unit){.id = -1, .first = pu.first, .count = pu.count,
                                        .checkpoint = pu.checkpoint};
  }
  for (int l = 0; l < L; l++) d->layer_unit[l] = 1 + fsdp_plan_unit_of(plan, l);
  fsdp_plan_destroy(plan);
out:
  free(mods);
  free(names);
  return st;
}

fsdp_status_t decoder_add_name(decoder_t *d, const char *name, fsdp_tensor_desc_t *desc) {
  char *copy = fsdp_strdup(name);
  if (!copy) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of host memory", d->m->name);
  d->names[d->n_names++] = copy;
  desc->name = copy;
  return FSDP_SUCCESS;
}

/* fsdp_unit_add_opts with the caller's per-unit options, if it gives any. */
static fsdp_status_t add_unit(decoder_t *d, const fsdp_gpt2_opts_t *o, const char *name,
                              const char *kind, const fsdp_tensor_desc_t *t, int n,
                              fsdp_unit_t *id) {
  fsdp_unit_opts_t uo = FSDP_UNIT_OPTS_INIT;
  if (o->unit_opts) FSDP_TRY(o->unit_opts(o->unit_opts_user, name, kind, t, n, &uo));
  return fsdp_unit_add_opts(d->eng, name, kind, t, n, &uo, id);
}

/* The root, "root": the model's leading tensors, the layers no unit takes,
 * its trailing tensors; then the plan's units, named "<prefix><i>" or
 * "<prefix><i>-<j>". */
static fsdp_status_t register_units(decoder_t *d, const fsdp_gpt2_opts_t *o) {
  const decoder_model_t *m = d->m;
  const int L = d->L, per = m->layer_tensors;
  fsdp_tensor_desc_t *t = calloc((size_t)L * per + m->root_tensors, sizeof *t);
  if (!t) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of host memory", m->name);
  fsdp_status_t st = FSDP_SUCCESS;
  int n = 0;
  FSDP_TRYG(st, m->root_descs(d, 0, t, &n), out);
  for (int l = 0; l < L; l++) {
    if (d->layer_unit[l]) continue;
    d->layer_base[l] = n;
    FSDP_TRYG(st, m->layer_descs(d, l, &t[n]), out);
    n += per;
  }
  FSDP_TRYG(st, m->root_descs(d, 1, t, &n), out);
  FSDP_TRYG(st, add_unit(d, o, "root", m->root_kind, t, n, &d->units[0].id), out);
  for (int u = 1; u < d->n_units; u++) {
    struct decoder_unit *du = &d->units[u];
    for (int k = 0; k < du->count; k++) {
      d->layer_base[du->first + k] = k * per;
      FSDP_TRYG(st, m->layer_descs(d, du->first + k, &t[k * per]), out);
    }
    char name[96];
    if (du->count == 1) snprintf(name, sizeof name, "%s%d", m->layer_prefix, du->first);
    else
      snprintf(name, sizeof name, "%s%d-%d", m->layer_prefix, du->first,
               du->first + du->count - 1);
    FSDP_TRYG(st, add_unit(d, o, name, m->layer_kind, t, du->count * per, &du->id), out);
  }
out:
  free(t);
  return st;
}

/* ---- backend and arena ---------------------------------------------------- */

/* The compute table of the engine's device, in the dtype its views hand out
 * (the table refuses one it has no kernels for at the first call; creating
 * refuses it first, naming it), the model's checks and layout, then the
 * staging, attention and column-sum buffers and the model's own. */
static fsdp_status_t pick_backend(decoder_t *d) {
  const decoder_model_t *m = d->m;
  const fsdp_config_t *cfg = fsdp_engine_config(d->eng);
  d->ops = fsdp_compute_ops(cfg->device);
  if (!d->ops)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: no kernels for config.device %d in this "
                      "build (reconfigure with nvcc on PATH for CUDA: meson setup "
                      "-Dcuda=enabled)", m->name, (int)cfg->device);
  const char *missing = NULL;
  if (m->check_complete && !fsdp_compute_ops_complete(d->ops, &missing))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: the %s kernels have no %s yet", m->name,
                      d->ops->name, missing);
  d->dt = cfg->device == FSDP_DEVICE_CUDA ? cfg->param_dtype : FSDP_F32;
  if (d->dt != FSDP_F32 && d->dt != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s on %s computes in f32 or bf16, not %s",
                      m->name, d->ops->name, fsdp_dtype_name(d->dt));
  d->s = fsdp_engine_stream(d->eng);
  d->align = cfg->device == FSDP_DEVICE_CUDA ? 256 : 1; /* where cuBLAS and the kernels like it */
  d->esize = fsdp_dtype_size(d->dt);
  FSDP_TRY(m->prepare(d));
  const fsdp_attention_forward_args_t att = {.dt = d->dt, .B = d->maxB, .T = d->maxT,
                                             .NH = d->NH};
  FSDP_TRY(gpt2_io_create(d->ops->device, (size_t)d->maxB * (size_t)d->maxT, &d->io));
  size_t scratch = d->ops->attention_scratch_bytes(&att);
  if (scratch) FSDP_TRY(fsdp_device_alloc(d->ops->device, scratch, &d->att_scratch));
  size_t colsum = d->ops->colsum_scratch_bytes(d->wide);
  if (colsum) FSDP_TRY(fsdp_device_alloc(d->ops->device, colsum, &d->colsum));
  return m->buffers ? m->buffers(d) : FSDP_SUCCESS;
}

size_t fsdp_activation_arena_bytes(const fsdp_gpt2_memory_t *m, int saved, int scratch) {
  if (!m || saved < 0 || scratch < 0) return 0;
  return m->inputs + (size_t)(saved + scratch) * m->per_layer + m->common;
}

/* Bytes as GiB, or MiB below one GiB, for messages. */
static const char *size_text(size_t b, char *buf, size_t n) {
  if (b >= (1u << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (1u << 30));
  else snprintf(buf, n, "%.2f MiB", (double)b / (1u << 20));
  return buf;
}

/* a + b, or SIZE_MAX where the sum would wrap: a budget's parts are the caller's */
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

fsdp_status_t fsdp_checkpoint_auto(const fsdp_gpt2_memory_t *m, int n_layer, size_t fixed,
                                   size_t budget, fsdp_checkpoint_choice_t *out) {
  if (!m || !out || n_layer < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_checkpoint_auto: %s",
                      n_layer < 1 ? "n_layer must be >= 1" : "NULL argument");
  /* k = 0 saves every layer; each k > 0 saves L - k and one layer of scratch:
   * k = 1 costs as much as k = 0, so it is never the answer */
  for (int k = 0; k <= n_layer; k++) {
    const size_t acts = fsdp_activation_arena_bytes(m, n_layer - k, k > 0);
    if (fixed <= budget && acts <= budget - fixed) {
      *out = (fsdp_checkpoint_choice_t){k, acts, fixed + acts};
      return FSDP_SUCCESS;
    }
  }
  const size_t all = fsdp_activation_arena_bytes(m, 0, 1);
  char b[32], f[32], a[32], sum[32], none[32];
  return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                    "checkpoint auto: a budget of %s (%zu bytes) holds no plan: model state "
                    "and kernel memory %s + activations with all %d layers checkpointed %s = "
                    "%s (%zu bytes; with nothing checkpointed %s); give a larger budget, a "
                    "smaller micro-batch or sequence, or more ranks",
                    size_text(budget, b, sizeof b), budget, size_text(fixed, f, sizeof f),
                    n_layer, size_text(all, a, sizeof a),
                    size_text(add_sat(fixed, all), sum, sizeof sum), add_sat(fixed, all),
                    size_text(add_sat(fixed, fsdp_activation_arena_bytes(m, n_layer, 0)), none,
                              sizeof none));
}

/* checkpoint_auto (fsdp_gpt2_opts_t): marks the first k layers' units
 * checkpointed, k from fsdp_checkpoint_auto over the model's dry-run sizes. */
fsdp_status_t decoder_checkpoint_auto(decoder_t *d) {
  if (!d->ckpt_auto) return FSDP_SUCCESS;
  const char *who = d->m->name;
  int own = d->n_units == d->L + 1;
  for (int u = 1; u < d->n_units; u++) {
    own = own && d->units[u].count == 1;
    if (d->units[u].checkpoint)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: checkpoint auto chooses which layers "
                        "recompute, and so does the plan (unit %s%d is checkpointed): give "
                        "one policy", who, d->m->layer_prefix, d->units[u].first);
  }
  if (!own)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: checkpoint auto checkpoints whole "
                      "layers: wrap each layer in a unit of its own (wrap_kinds \"%s\"); "
                      "this plan makes %d units of %d layers", who, d->m->layer_kind,
                      d->n_units - 1, d->L);
  size_t budget = d->budget;
  if (!budget && d->ops->device == FSDP_DEVICE_CUDA) {
    size_t free_b = 0, total_b = 0;
    FSDP_TRY(fsdp_cuda_mem_info(&free_b, &total_b));
    if (free_b <= FSDP_CHECKPOINT_AUTO_MARGIN) {
      char f[32], m[32];
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: checkpoint auto without a memory budget "
                        "takes the device's free memory less a margin, but %s (%zu bytes) "
                        "free is no more than the %s margin: free the device or give a "
                        "budget (memory_budget, --memory-budget)", who,
                        size_text(free_b, f, sizeof f), free_b,
                        size_text(FSDP_CHECKPOINT_AUTO_MARGIN, m, sizeof m));
    }
    budget = free_b - FSDP_CHECKPOINT_AUTO_MARGIN;
  }
  d->budget = budget;
  if (!budget) return FSDP_SUCCESS; /* the CPU without a budget: nothing checkpointed */
  fsdp_gpt2_memory_t mem;
  d->m->arena_parts(d, &mem);
  /* the model state as the engine will allocate it, the root held across the layers */
  fsdp_mem_stats_t state;
  FSDP_TRY(fsdp_engine_memory_plan(d->eng, &d->units[0].id, 1, &state));
  fsdp_checkpoint_choice_t ch;
  const size_t fixed = add_sat(add_sat(state.total_reserved, d->reserved), d->m->extra_bytes(d));
  fsdp_status_t st = fsdp_checkpoint_auto(&mem, d->L, fixed, budget, &ch);
  if (st != FSDP_SUCCESS) {
    char why[512];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(st, "%s, micro-batch %d x %d (%s): %s", who, d->maxB, d->maxT,
                      fsdp_dtype_name(d->dt), why);
  }
  for (int l = 0; l < ch.k; l++) /* the first k: see fsdp/nn.h */
    d->units[d->layer_unit[l]].checkpoint = 1;
  return FSDP_SUCCESS;
}

int decoder_checkpointed(const decoder_t *d) {
  int n = 0;
  for (int l = 0; l < d->L; l++) n += d->units[d->layer_unit[l]].checkpoint;
  return n;
}

int decoder_layer_checkpointed(const decoder_t *d, int l) {
  return l < 0 || l >= d->L ? -1 : d->units[d->layer_unit[l]].checkpoint;
}

int decoder_arena_layers(const decoder_t *d, int *maxk) {
  int saved = 0;
  *maxk = 0;
  for (int u = 0; u < d->n_units; u++)
    if (d->units[u].checkpoint && d->units[u].count > *maxk) *maxk = d->units[u].count;
  /* per layer: a plan may leave layers in the root, which no unit counts */
  for (int l = 0; l < d->L; l++) saved += !d->units[d->layer_unit[l]].checkpoint;
  return saved + *maxk;
}

/* One arena in the backend's memory: the layer inputs, the saved (or
 * recompute scratch) activations of every layer, the model's common buffers;
 * and a host row for sampling. */
static fsdp_status_t alloc_acts(decoder_t *d) {
  const decoder_model_t *m = d->m;
  int maxk;
  const int layers = decoder_arena_layers(d, &maxk);
  fsdp_gpt2_memory_t mem;
  m->arena_parts(d, &mem);
  const size_t arena = fsdp_activation_arena_bytes(&mem, layers - maxk, maxk);
  const size_t extra = m->extra_bytes(d);
  d->act_bytes = arena + extra;
  d->act_bytes_full = mem.saved + extra;
  d->acts = calloc((size_t)d->L, m->acts_size);
  d->scratch = calloc((size_t)(maxk ? maxk : 1), m->acts_size);
  d->row = calloc((size_t)d->V, sizeof *d->row);
  if (!d->acts || !d->scratch || !d->row)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of host memory", m->name);
  if (m->check_arena) FSDP_TRY(m->check_arena(d, layers, &mem));
  fsdp_status_t st = fsdp_device_alloc(d->ops->device, arena, &d->arena);
  /* zeroed on the host stream, which returns when the zeros have landed: at
   * create, never in a step */
  if (st == FSDP_SUCCESS) st = fsdp_device_zero(d->arena, arena, FSDP_HOST_STREAM);
  if (st != FSDP_SUCCESS) {
    char why[256];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(st, "%s: activations for batch %d x %d (%s kernels, %s): %s", m->name,
                      d->maxB, d->maxT, d->ops->name, fsdp_dtype_name(d->dt), why);
  }
  char *base = d->arena;
  size_t at = 0;
  d->xs = decoder_take(d, base, &at, mem.inputs, 1);
  for (int k = 0; k < maxk; k++)
    m->acts_carve(d, d->scratch + (size_t)k * m->acts_size, base, &at);
  for (int l = 0; l < d->L; l++) {
    const struct decoder_unit *u = &d->units[d->layer_unit[l]];
    if (u->checkpoint)
      memcpy(decoder_acts(d, l), d->scratch + (size_t)(l - u->first) * m->acts_size,
             m->acts_size);
    else m->acts_carve(d, decoder_acts(d, l), base, &at);
  }
  m->common_carve(d, base, &at);
  if (at != arena) /* the carving and the size function it is allocated by agree */
    return fsdp_error(FSDP_ERR_INTERNAL, "%s: the activation arena carves %zu bytes, "
                      "fsdp_activation_arena_bytes allocated %zu", m->name, at, arena);
  return FSDP_SUCCESS;
}

fsdp_status_t decoder_init(decoder_t *d, const fsdp_gpt2_opts_t *o) {
  d->ckpt_auto = o->checkpoint_auto;
  d->budget = o->checkpoint_auto ? o->memory_budget : 0;
  d->reserved = o->memory_reserved;
  d->names = calloc((size_t)d->L * d->m->layer_tensors + d->m->root_tensors, sizeof *d->names);
  if (!d->names) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of host memory", d->m->name);
  FSDP_TRY(plan_units(d, o));
  FSDP_TRY(register_units(d, o));
  FSDP_TRY(pick_backend(d));
  return alloc_acts(d);
}

void decoder_fini(decoder_t *d) {
  for (int i = 0; i < d->n_names; i++) free(d->names[i]);
  free(d->names);
  free(d->units);
  free(d->layer_unit);
  free(d->layer_base);
  free(d->acts);
  free(d->scratch);
  free(d->row);
  free(d->logits_host);
  if (d->ops) { /* device frees wait for the device: no queued kernel still reads these */
    fsdp_device_free(d->ops->device, d->arena);
    fsdp_device_free(d->ops->device, d->att_scratch);
    fsdp_device_free(d->ops->device, d->colsum);
    if (d->m->fini) d->m->fini(d);
  }
  gpt2_io_destroy(d->io);
}

/* ---- forward / backward --------------------------------------------------- */

static fsdp_status_t check_batch(const decoder_t *d, const int *tokens, const int *targets,
                                 int B, int T) {
  const char *who = d->m->name;
  if (!tokens || B < 1 || B > d->maxB || T < 1 || T > d->maxT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s: batch %d x %d outside the %d x %d the model was created for", who, B,
                      T, d->maxB, d->maxT);
  for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
    if (tokens[i] < 0 || tokens[i] >= d->V)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "%s: token %d at position %zu is not in the vocabulary [0, %d)", who,
                        tokens[i], i, d->V);
    if (targets && (targets[i] < 0 || targets[i] >= d->V))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "%s: target %d at position %zu is not in the vocabulary [0, %d)", who,
                        targets[i], i, d->V);
  }
  return FSDP_SUCCESS;
}

/* Acquires a unit and checks that its view holds what the kernels compute in
 * (and whatever else the model's kernels assume of it). */
static fsdp_status_t acquire(decoder_t *d, struct decoder_unit *u, fsdp_pass_t pass) {
  FSDP_TRY(fsdp_unit_acquire(d->eng, u->id, pass, &u->view));
  if (u->view.dtype != d->dt)
    return fsdp_error(FSDP_ERR_INTERNAL, "%s: the engine hands out %s parameters, the %s "
                      "kernels were picked for %s", d->m->name, fsdp_dtype_name(u->view.dtype),
                      d->ops->name, fsdp_dtype_name(d->dt));
  return d->m->check_view ? d->m->check_view(d, u) : FSDP_SUCCESS;
}

static float *const *layer_params_of(const decoder_t *d, int l) {
  return d->units[d->layer_unit[l]].view.param + d->layer_base[l];
}

/* Layer k's forward; prev: layer k-1's activations unless k starts from a
 * whole input (the embedding's output, or a stored unit input). */
static fsdp_status_t layer_forward(decoder_t *d, int k, int whole, int B, int T) {
  return d->m->layer_forward(d, layer_params_of(d, k), decoder_acts(d, k),
                             whole ? NULL : decoder_acts(d, k - 1), decoder_x(d, k, B, T),
                             decoder_x(d, k + 1, B, T), B, T);
}

/* Every layer of the forward; acquires and releases the wrapped units. */
static fsdp_status_t layers_forward(decoder_t *d, int B, int T) {
  for (int l = 0; l < d->L; l++) {
    struct decoder_unit *u = &d->units[d->layer_unit[l]];
    int wrapped = u != &d->units[0];
    if (wrapped && l == u->first) FSDP_TRY(acquire(d, u, FSDP_FORWARD));
    FSDP_TRY(layer_forward(d, l, l == 0, B, T));
    if (wrapped && l == u->first + u->count - 1)
      FSDP_TRY(fsdp_unit_release(d->eng, u->id, FSDP_FORWARD));
  }
  return FSDP_SUCCESS;
}

/* Tokens (and targets) to the kernels, embedding, layers, head; the root
 * stays acquired for the caller. */
static fsdp_status_t forward(decoder_t *d, const int *tokens, const int *targets, int B, int T) {
  struct decoder_unit *r = &d->units[0];
  FSDP_TRY(gpt2_io_stage(d->io, tokens, targets, (size_t)B * (size_t)T, d->s, &d->tok, &d->tgt));
  FSDP_TRY(acquire(d, r, FSDP_FORWARD));
  FSDP_TRY(d->m->embed_forward(d, r->view.param, B, T));
  FSDP_TRY(layers_forward(d, B, T));
  return d->m->head_forward(d, r->view.param, B, T);
}

static fsdp_status_t layers_backward(decoder_t *d, int B, int T) {
  for (int l = d->L - 1; l >= 0; l--) {
    struct decoder_unit *u = &d->units[d->layer_unit[l]];
    int wrapped = u != &d->units[0];
    if (wrapped && l == u->first + u->count - 1) {
      FSDP_TRY(acquire(d, u, FSDP_BACKWARD));
      for (int k = u->first; u->checkpoint && k <= l; k++) /* recompute from the unit's input */
        FSDP_TRY(layer_forward(d, k, k == u->first, B, T));
    }
    FSDP_TRY(d->m->layer_backward(d, layer_params_of(d, l), u->view.grad + d->layer_base[l],
                                  decoder_acts(d, l), decoder_x(d, l, B, T), B, T));
    if (wrapped && l == u->first) FSDP_TRY(fsdp_unit_release(d->eng, u->id, FSDP_BACKWARD));
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t backward(decoder_t *d, int B, int T) {
  struct decoder_unit *r = &d->units[0];
  FSDP_TRY(acquire(d, r, FSDP_BACKWARD));
  FSDP_TRY(d->m->head_backward(d, r->view.param, r->view.grad, B, T));
  FSDP_TRY(layers_backward(d, B, T));
  FSDP_TRY(d->m->embed_backward(d, r->view.grad, B, T));
  return fsdp_unit_release(d->eng, r->id, FSDP_BACKWARD);
}

/* Cross-entropy of the BT rows of logits against the staged targets, fused
 * with its gradient (grad: written over the logits); the per-row losses head
 * for the host behind it. */
static fsdp_status_t xent(decoder_t *d, void *logits, int BT, float scale, int grad) {
  KC(d, XENT,
     d->ops->xent(&(fsdp_xent_args_t){
         .dt = d->dt, .logits = logits, .ld = d->ldv, .losses = gpt2_io_losses(d->io),
         .targets = d->tgt, .B = BT, .V = d->V, .scale = scale, .grad = grad}, d->s));
  return gpt2_io_loss_start(d->io, BT, d->s);
}

fsdp_status_t decoder_forward_backward(decoder_t *d, const int *tokens, const int *targets,
                                       int B, int T, float loss_scale, double *loss_sum) {
  FSDP_TRY(check_batch(d, tokens, targets, B, T));
  FSDP_TRY(forward(d, tokens, targets, B, T));
  FSDP_TRY(xent(d, d->dlogits, B * T, loss_scale, 1));
  FSDP_TRY(fsdp_unit_release(d->eng, d->units[0].id, FSDP_FORWARD));
  FSDP_TRY(backward(d, B, T));
  double loss;
  FSDP_TRY(gpt2_io_loss(d->io, &loss)); /* CUDA: the micro-batch's one wait */
  if (loss_sum) *loss_sum = loss;
  return FSDP_SUCCESS;
}

/* Forward and the summed loss against targets (when both are given). */
static fsdp_status_t forward_loss(decoder_t *d, const int *tokens, const int *targets, int B,
                                  int T, double *loss_sum) {
  FSDP_TRY(check_batch(d, tokens, targets, B, T));
  FSDP_TRY(forward(d, tokens, targets, B, T));
  FSDP_TRY(fsdp_unit_release(d->eng, d->units[0].id, FSDP_FORWARD));
  if (!loss_sum || !targets) return FSDP_SUCCESS;
  FSDP_TRY(xent(d, d->logits, B * T, 1.0f, 0));
  return gpt2_io_loss(d->io, loss_sum);
}

fsdp_status_t decoder_forward(decoder_t *d, const int *tokens, const int *targets, int B, int T,
                              double *loss_sum, const float **logits) {
  FSDP_TRY(forward_loss(d, tokens, targets, B, T, loss_sum));
  if (!logits) return FSDP_SUCCESS;
  size_t rows = (size_t)B * (size_t)T, V = (size_t)d->V, ld = (size_t)d->ldv;
  if (!d->logits_host) /* once, on the first call that asks */
    d->logits_host = malloc((size_t)d->maxB * d->maxT * ld * sizeof(float));
  if (!d->logits_host)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: no host memory to copy the logits to",
                      d->m->name);
  /* rows ld apart, then packed V apart in place (each row moves to a lower
   * or the same address, in order) */
  FSDP_TRY(gpt2_io_read(d->io, d->logits_host, d->logits, d->dt, rows * ld, d->s));
  for (size_t r = 1; r < rows && ld != V; r++)
    memmove(d->logits_host + r * V, d->logits_host + r * ld, V * sizeof(float));
  *logits = d->logits_host;
  return FSDP_SUCCESS;
}

/* ---- sampling (nn/sample.c) ----------------------------------------------- */

/* The logits of the last of T tokens, into row. */
static fsdp_status_t next_logits(void *model, const int *ctx, int T, float *row) {
  decoder_t *d = model;
  FSDP_TRY(forward_loss(d, ctx, NULL, 1, T, NULL));
  const char *last = (const char *)d->logits + (size_t)(T - 1) * (size_t)d->ldv * d->esize;
  return gpt2_io_read(d->io, row, last, d->dt, (size_t)d->V, d->s);
}

fsdp_status_t decoder_sample(decoder_t *d, const char *who, const int *prompt, int n_prompt,
                             int n_new, const fsdp_gpt2_sampling_t *how, int *out) {
  return nn_sample(who, d->eng, d, next_logits, d->row, d->V, d->maxT, prompt, n_prompt, n_new,
                   how, out);
}
