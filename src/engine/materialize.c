/* src/engine/materialize.c — materialisation: each rank's shards and optimizer
 * state allocated and filled from (seed, name, index), and the gather and
 * gradient pools sized from the configuration, once, before the first step;
 * and the prediction of those bytes by the same sizing (fsdp_engine_memory_plan). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/shard.h"

void fsdp_unit_segments(const struct unit *u, size_t lo, size_t hi, fsdp_segment_fn fn,
                        void *ctx) {
  for (int i = 0; i < u->n_tensors; i++) {
    const struct tensor *t = &u->tensors[i];
    size_t a = t->offset > lo ? t->offset : lo;
    size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
    if (a < b) fn(t, a - t->offset, b - a, a, ctx);
  }
}

struct init_ctx { const struct fsdp_engine *e; const struct unit *u; float *dst; };
static void init_segment(const struct tensor *t, size_t first, size_t n, size_t flat, void *ctx) {
  const struct init_ctx *c = ctx;
  fsdp_init_fill(c->dst + (flat - c->u->shard_offset), n, c->e->plan.seed, t->name, first,
                 t->init, t->init_scale);
}

struct runs_ctx {
  const struct unit *u;
  unsigned long long *runs;
  int n;
};

static void add_run(const struct tensor *t, size_t first, size_t n, size_t flat, void *arg) {
  (void)first, (void)n;
  struct runs_ctx *c = arg;
  const unsigned long long decay = !t->no_decay;
  if (c->n && (c->runs[c->n - 1] & 1ull) == decay) return; /* the run goes on */
  c->runs[c->n++] = (unsigned long long)(flat - c->u->shard_offset) << 1 | decay;
}

/* AdamW updates a unit's shard in one call (one launch on CUDA): the runs of
 * its elements that share a decay flag, in the device's memory (at most one
 * per tensor). */
static fsdp_status_t decay_runs(struct fsdp_engine *e, struct unit *u) {
  if (!u->count) return FSDP_SUCCESS;
  struct runs_ctx c = {u, calloc((size_t)u->n_tensors, sizeof *c.runs), 0};
  if (!c.runs) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no host memory", u->name);
  fsdp_unit_segments(u, u->shard_offset, u->shard_offset + u->count, add_run, &c);
  const size_t bytes = (size_t)c.n * sizeof *c.runs;
  u->mem.decay_runs = fsdp_engine_alloc(e, bytes);
  fsdp_status_t st = u->mem.decay_runs ? fsdp_device_copy(u->mem.decay_runs, c.runs, bytes,
                                                      FSDP_HOST_STREAM)
                                   : fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                                                "unit '%s': cannot allocate its decay runs",
                                                u->name);
  u->mem.n_runs = c.n;
  free(c.runs);
  return st;
}

/* Fills u's master shard with its initial values (on CUDA through the host). */
static fsdp_status_t unit_init(struct fsdp_engine *e, struct unit *u) {
  size_t bytes = u->shard * sizeof(float);
  struct init_ctx ctx = {e, u, fsdp_engine_on_host(e) ? u->mem.master : fsdp_alloc(bytes)};
  if (!ctx.dst)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': %zu bytes to initialise it", u->name,
                      bytes);
  fsdp_unit_segments(u, u->shard_offset, u->shard_offset + u->count, init_segment, &ctx);
  fsdp_status_t st = FSDP_SUCCESS;
  if (ctx.dst != u->mem.master) {
    st = fsdp_device_copy(u->mem.master, ctx.dst, bytes, FSDP_HOST_STREAM);
    fsdp_free(ctx.dst);
  }
  return st != FSDP_SUCCESS ? st : fsdp_unit_refresh_params(e, u);
}

/* One unit's buffers on this rank, in bytes (0: none), from the shard
 * layout: what unit_materialize allocates and fsdp_engine_memory counts. */
struct unit_bytes {
  size_t padded, shard, begin, end;     /* elements (fsdp_shard_layout) */
  size_t master, grad, m, v, full_grad; /* f32 */
  size_t lp, rounded;                   /* the 16-bit copy, its f32 widening */
};

static fsdp_status_t unit_bytes(const struct fsdp_engine *e, const struct unit *u,
                                struct unit_bytes *b) {
  FSDP_TRY(fsdp_shard_layout(u->numel, e->conf.shard_world, e->conf.cfg.align, e->conf.shard_rank,
                             &b->padded, &b->shard, &b->begin, &b->end));
  const fsdp_config_t *c = &e->conf.cfg;
  const size_t bytes = b->shard * sizeof(float);
  const int moments = c->optim.kind == FSDP_OPTIM_ADAMW ? 2 : c->optim.momentum > 0.0f ? 1 : 0;
  b->master = b->grad = bytes;
  b->m = moments >= 1 ? bytes : 0;
  b->v = moments == 2 ? bytes : 0;
  b->full_grad = c->accumulate_full_grads && !e->conf.direct_grads ? b->padded * sizeof(float) : 0;
  b->lp = u->lowp ? b->shard * sizeof(uint16_t) : 0;
  /* One shard on the CPU: views read a widened copy (CUDA reads lp itself). */
  b->rounded = u->widen && e->conf.shard_world == 1 ? bytes : 0;
  return FSDP_SUCCESS;
}

/* The buffer of `bytes`, or NULL (and *ok 0) where it was wanted and failed. */
static void *alloc_if(struct fsdp_engine *e, size_t bytes, int *ok) {
  void *p = bytes ? fsdp_engine_alloc(e, bytes) : NULL;
  if (bytes && !p) *ok = 0;
  return p;
}

static fsdp_status_t unit_materialize(struct fsdp_engine *e, struct unit *u) {
  struct unit_bytes b;
  FSDP_TRY(unit_bytes(e, u, &b));
  u->padded = b.padded;
  u->shard = b.shard;
  u->shard_offset = (size_t)e->conf.shard_rank * u->shard;
  u->count = b.end - b.begin;
  int ok = 1;
  u->mem.master = alloc_if(e, b.master, &ok);
  u->mem.grad = alloc_if(e, b.grad, &ok);
  u->mem.m = alloc_if(e, b.m, &ok);
  u->mem.v = alloc_if(e, b.v, &ok);
  u->mem.full_grad = alloc_if(e, b.full_grad, &ok);
  if (!ok)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                      "unit '%s': cannot allocate its shard state (%zu bytes per buffer)",
                      u->name, b.master);
  u->mem.lp = alloc_if(e, b.lp, &ok);
  u->mem.rounded = alloc_if(e, b.rounded, &ok);
  if (!ok)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': cannot allocate its 16-bit copy",
                      u->name);
  FSDP_TRY(unit_init(e, u));
  if (e->conf.cfg.optim.kind == FSDP_OPTIM_ADAMW) FSDP_TRY(decay_runs(e, u));
  return FSDP_SUCCESS;
}

/* A gather slot's bytes: f32 (what views show) and/or 16-bit (what is
 * gathered), capacity elements each. */
static size_t slot_bytes(size_t capacity, int f32, int lp) {
  return capacity * ((f32 ? sizeof(float) : 0) + (lp ? sizeof(uint16_t) : 0));
}

/* Allocates slot i's buffers (slot_bytes). */
static fsdp_status_t slot_make(struct fsdp_engine *e, int i, size_t capacity, int f32, int lp) {
  struct pslot *p = &e->pools.pslots[i];
  p->capacity = capacity;
  p->owner = -1;
  if (f32) p->buf = fsdp_engine_alloc(e, capacity * sizeof(float));
  if (lp) p->lp = fsdp_engine_alloc(e, capacity * sizeof(uint16_t));
  const size_t bytes = slot_bytes(capacity, f32, lp);
  if ((f32 && !p->buf) || (lp && !p->lp))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate a %zu-byte gather "
                      "buffer (%s)", bytes, fsdp_last_error());
  FSDP_TRY(fsdp_event_create(&p->free_ev));
  e->pools.param_pool_bytes += bytes;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_add_shared_slot(struct fsdp_engine *e) {
  FSDP_TRY(
      slot_make(e, e->pools.n_pslots, e->pools.shared_capacity, e->plan.f32_views, e->plan.lowp));
  e->pools.n_pslots++;
  return FSDP_SUCCESS;
}

/* The pools' sizes: the one rule pools_create allocates by and
 * fsdp_engine_memory_plan predicts with.
 *
 * Param slots: a unit that keeps its parameters from forward to backward
 * (reshard_after_forward 0, ZeRO-2) gets a slot of its own size; the others
 * share max_live_units slots of the largest of them (unset: prefetch_depth + 1,
 * plus one per unit observed held across the others, added in the first step
 * that nests them: fsdp_engine_add_shared_slot; n_nested counts those); NO_SHARD
 * and shard groups of one rank read the master directly.
 *
 * Gradient slots: FSDP_GRAD_SLOTS of the largest unit, or with
 * accumulate_full_grads one full gradient per unit; none where backward adds
 * into the shards (conf.direct_grads). Staging: the reduction's
 * output shard in the reduce dtype (bf16 also casts the full gradient into a
 * bf16 buffer first), and the norm's sums (one per unit, then the sum of
 * squares' partials). */
struct pool_sizes {
  size_t max_padded, max_shard, shared_capacity; /* elements */
  int n_shared, lowp, f32_views;
  size_t own_bytes;                          /* the ZeRO-2 units' own slots */
  size_t param_pool, grad_pool;              /* bytes, n_nested shared slots included */
  size_t grad_lp, staging_elems, n_norm;     /* bf16 gradient (elements), reduce shard, norm sums */
  size_t staging;                            /* bytes */
};

static fsdp_status_t pool_sizes(const struct fsdp_engine *e, int n_nested,
                                struct pool_sizes *s) {
  const fsdp_config_t *c = &e->conf.cfg;
  memset(s, 0, sizeof *s);
  int any_reshard = 0;
  for (int i = 0; i < e->plan.n_units; i++) {
    const struct unit *u = &e->plan.units[i];
    struct unit_bytes b;
    FSDP_TRY(unit_bytes(e, u, &b));
    if (s->max_padded < b.padded) s->max_padded = b.padded;
    if (s->max_shard < b.shard) s->max_shard = b.shard;
    s->grad_pool += b.full_grad;
    if (e->conf.shard_world == 1) continue;
    if (!u->reshard) {
      s->own_bytes += slot_bytes(b.padded, !u->lowp || u->widen, u->lowp);
      continue;
    }
    any_reshard = 1;
    if (s->shared_capacity < b.padded) s->shared_capacity = b.padded;
    s->lowp |= u->lowp;
    s->f32_views |= !u->lowp || u->widen;
  }
  s->n_shared = !any_reshard ? 0 : c->max_live_units ? c->max_live_units : c->prefetch_depth + 1;
  const int nested = any_reshard && !c->max_live_units ? n_nested : 0;
  s->param_pool = s->own_bytes + (size_t)(s->n_shared + nested) *
                                     slot_bytes(s->shared_capacity, s->f32_views, s->lowp);
  if (!c->accumulate_full_grads && !e->conf.direct_grads)
    s->grad_pool = FSDP_GRAD_SLOTS * s->max_padded * sizeof(float);
  s->staging_elems = e->conf.shard_world == 1 ? 0 : s->max_shard;
  const int lp = e->conf.bf16_reduce && e->conf.nranks > 1;
  s->grad_lp = lp ? s->max_padded : 0;
  s->n_norm = (size_t)e->plan.n_units + e->dev.ops->sum_squares_partials;
  s->staging = (s->grad_lp + s->staging_elems) * (lp ? sizeof(uint16_t) : sizeof(float)) +
               s->n_norm * sizeof(double);
  return FSDP_SUCCESS;
}

static fsdp_status_t param_pool_create(struct fsdp_engine *e, const struct pool_sizes *s) {
  e->pools.shared_capacity = s->shared_capacity;
  e->plan.lowp = s->lowp;
  e->plan.f32_views = s->f32_views;
  for (int i = 0; i < e->plan.n_units && e->conf.shard_world > 1; i++)
    if (!e->plan.units[i].reshard) e->plan.units[i].own_slot = e->pools.n_own++;
  /* Room for the slots nesting may add (one per unit at most). */
  e->pools.pslots =
      calloc((size_t)(e->pools.n_own + s->n_shared + e->plan.n_units), sizeof *e->pools.pslots);
  if (!e->pools.pslots) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  for (int i = 0; i < e->plan.n_units && e->conf.shard_world > 1; i++) {
    const struct unit *u = &e->plan.units[i];
    if (!u->reshard) FSDP_TRY(slot_make(e, u->own_slot, u->padded, !u->lowp || u->widen, u->lowp));
  }
  e->pools.n_pslots = e->pools.n_own;
  for (int i = 0; i < s->n_shared; i++) FSDP_TRY(fsdp_engine_add_shared_slot(e));
  return FSDP_SUCCESS;
}

static fsdp_status_t pools_create(struct fsdp_engine *e) {
  const fsdp_config_t *c = &e->conf.cfg;
  struct pool_sizes s;
  FSDP_TRY(pool_sizes(e, 0, &s));
  e->plan.max_padded = s.max_padded;
  e->plan.max_shard = s.max_shard;
  FSDP_TRY(param_pool_create(e, &s));
  e->pools.n_gslots = c->accumulate_full_grads || e->conf.direct_grads ? 0 : FSDP_GRAD_SLOTS;
  for (int i = 0; i < e->pools.n_gslots; i++) {
    e->pools.gslots[i].owner = -1;
    if (!(e->pools.gslots[i].buf = fsdp_engine_alloc(e, s.max_padded * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                        "engine: cannot allocate a %zu-byte gradient buffer (%s)",
                        s.max_padded * sizeof(float), fsdp_last_error());
  }
  e->pools.grad_pool_bytes = s.grad_pool;
  if (s.grad_lp) {
    e->pools.grad_lp = fsdp_engine_alloc(e, s.grad_lp * sizeof(uint16_t));
    if (s.staging_elems)
      e->pools.staging_lp = fsdp_engine_alloc(e, s.staging_elems * sizeof(uint16_t));
    if (!e->pools.grad_lp || (s.staging_elems && !e->pools.staging_lp))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the bf16 reduce buffers");
  } else if (s.staging_elems) {
    if (!(e->pools.staging = fsdp_engine_alloc(e, s.staging_elems * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the reduce buffer");
  }
  e->pools.norm_dev = fsdp_engine_alloc(e, s.n_norm * sizeof(double));
  e->pools.norm_host = fsdp_alloc((size_t)e->plan.n_units * sizeof(double));
  if (!e->pools.norm_dev || !e->pools.norm_host)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the norm buffers");
  e->pools.staging_bytes = s.staging;
  return FSDP_SUCCESS;
}

void fsdp_engine_pools_free(struct fsdp_engine *e) {
  for (int i = 0; i < e->pools.n_pslots; i++) {
    fsdp_engine_free(e, e->pools.pslots[i].buf);
    fsdp_engine_free(e, e->pools.pslots[i].lp);
    fsdp_event_destroy(e->pools.pslots[i].free_ev);
  }
  free(e->pools.pslots);
  for (int i = 0; i < e->pools.n_gslots; i++) fsdp_engine_free(e, e->pools.gslots[i].buf);
  fsdp_engine_free(e, e->pools.staging);
  fsdp_engine_free(e, e->pools.piece_runs);
  fsdp_engine_free(e, e->pools.grad_lp);
  fsdp_engine_free(e, e->pools.staging_lp);
  fsdp_engine_free(e, e->pools.norm_dev);
  fsdp_free(e->pools.norm_host);
}

/* AdamW of a single tensor piece (units with parameter groups, step.c): the
 * two one-run lists, without and with decay. */
static fsdp_status_t piece_runs(struct fsdp_engine *e) {
  const unsigned long long runs[2] = {0ull, 1ull};
  if (!(e->pools.piece_runs = fsdp_engine_alloc(e, sizeof runs)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate %zu bytes", sizeof runs);
  return fsdp_device_copy(e->pools.piece_runs, runs, sizeof runs, FSDP_HOST_STREAM);
}

fsdp_status_t fsdp_engine_shards_create(struct fsdp_engine *e, uint64_t seed) {
  e->plan.seed = seed;
  for (int i = 0; i < e->plan.n_units; i++) FSDP_TRY(unit_materialize(e, &e->plan.units[i]));
  FSDP_TRY(pools_create(e));
  if (e->conf.cfg.optim.kind == FSDP_OPTIM_ADAMW) FSDP_TRY(piece_runs(e));
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_memory_plan(fsdp_engine_t e, const fsdp_unit_t *held, int n_held,
                                      fsdp_mem_stats_t *plan) {
  if (!e || !plan || n_held < 0 || (n_held > 0 && !held))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_memory_plan: engine and plan must "
                      "not be NULL, n_held >= 0 (got %d) with held holding them", n_held);
  int nested = 0;
  for (int i = 0; i < n_held; i++) {
    if (held[i] < 0 || held[i] >= e->plan.n_units)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_memory_plan: held[%d] = %d is "
                        "not a unit (the engine has %d)", i, held[i], e->plan.n_units);
    nested += e->plan.units[held[i]].reshard; /* a ZeRO-2 unit holds its own slot */
  }
  struct pool_sizes s;
  FSDP_TRY(pool_sizes(e, nested, &s));
  fsdp_mem_stats_t m = {0};
  for (int i = 0; i < e->plan.n_units; i++) {
    struct unit_bytes b;
    FSDP_TRY(unit_bytes(e, &e->plan.units[i], &b));
    m.master += b.master;
    m.grad_shard += b.grad;
    m.optim_state += b.m + b.v;
    m.param_copy += b.lp + b.rounded;
  }
  m.persistent = m.master + m.grad_shard + m.optim_state + m.param_copy;
  m.param_pool = s.param_pool;
  m.grad_pool = s.grad_pool;
  m.staging = s.staging;
  m.total_reserved = m.persistent + m.param_pool + m.grad_pool + m.staging;
  *plan = m;
  return FSDP_SUCCESS;
}
