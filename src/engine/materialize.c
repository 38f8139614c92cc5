/* src/engine/materialize.c — materialisation: each rank's shards and optimizer
 * state allocated and filled from (seed, name, index), and the gather and
 * gradient pools sized from the configuration, once, before the first step. */
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

static fsdp_status_t unit_materialize(struct fsdp_engine *e, struct unit *u) {
  size_t begin, end;
  FSDP_TRY(fsdp_shard_layout(u->numel, e->conf.shard_world, e->conf.cfg.align, e->conf.shard_rank,
                             &u->padded, &u->shard, &begin, &end));
  u->shard_offset = (size_t)e->conf.shard_rank * u->shard;
  u->count = end - begin;
  size_t bytes = u->shard * sizeof(float);
  u->mem.master = fsdp_engine_alloc(e, bytes);
  u->mem.grad = fsdp_engine_alloc(e, bytes);
  int moments = e->conf.cfg.optim.kind == FSDP_OPTIM_ADAMW ? 2
                : e->conf.cfg.optim.momentum > 0.0f        ? 1 : 0;
  if (moments >= 1) u->mem.m = fsdp_engine_alloc(e, bytes);
  if (moments == 2) u->mem.v = fsdp_engine_alloc(e, bytes);
  if (e->conf.cfg.accumulate_full_grads)
    u->mem.full_grad = fsdp_engine_alloc(e, u->padded * sizeof(float));
  if (!u->mem.master || !u->mem.grad || (moments >= 1 && !u->mem.m) ||
      (moments == 2 && !u->mem.v) || (e->conf.cfg.accumulate_full_grads && !u->mem.full_grad))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                      "unit '%s': cannot allocate its shard state (%zu bytes per buffer)",
                      u->name, bytes);
  if (u->lowp) u->mem.lp = fsdp_engine_alloc(e, u->shard * sizeof(uint16_t));
  /* One shard on the CPU: views read a widened copy (CUDA reads lp itself). */
  if (u->widen && e->conf.shard_world == 1) u->mem.rounded = fsdp_engine_alloc(e, bytes);
  if (u->lowp && (!u->mem.lp || (u->widen && e->conf.shard_world == 1 && !u->mem.rounded)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': cannot allocate its 16-bit copy",
                      u->name);
  FSDP_TRY(unit_init(e, u));
  if (e->conf.cfg.optim.kind == FSDP_OPTIM_ADAMW) FSDP_TRY(decay_runs(e, u));
  if (e->plan.max_padded < u->padded) e->plan.max_padded = u->padded;
  if (e->plan.max_shard < u->shard) e->plan.max_shard = u->shard;
  return FSDP_SUCCESS;
}

/* Allocates slot i's buffers: f32 (what views show) and/or 16-bit (what is
 * gathered), capacity elements each. */
static fsdp_status_t slot_make(struct fsdp_engine *e, int i, size_t capacity, int f32, int lp) {
  struct pslot *p = &e->pools.pslots[i];
  p->capacity = capacity;
  p->owner = -1;
  if (f32) p->buf = fsdp_engine_alloc(e, capacity * sizeof(float));
  if (lp) p->lp = fsdp_engine_alloc(e, capacity * sizeof(uint16_t));
  size_t bytes = capacity * ((f32 ? sizeof(float) : 0) + (lp ? sizeof(uint16_t) : 0));
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

/* Param slots: a unit that keeps its parameters from forward to backward
 * (reshard_after_forward 0, ZeRO-2) gets a slot of its own size; the others
 * share max_live_units slots of the largest of them (unset: prefetch_depth + 1,
 * plus one per unit observed held across the others, added in the first step
 * that nests them: fsdp_engine_add_shared_slot); NO_SHARD and shard groups of
 * one rank read the master directly. */
static fsdp_status_t param_pool_create(struct fsdp_engine *e) {
  const fsdp_config_t *c = &e->conf.cfg;
  int any_reshard = 0;
  for (int i = 0; i < e->plan.n_units && e->conf.shard_world > 1; i++) {
    struct unit *u = &e->plan.units[i];
    if (!u->reshard) {
      u->own_slot = e->pools.n_own++;
      continue;
    }
    any_reshard = 1;
    if (e->pools.shared_capacity < u->padded) e->pools.shared_capacity = u->padded;
    e->plan.lowp |= u->lowp;
    e->plan.f32_views |= !u->lowp || u->widen;
  }
  int n_shared = !any_reshard ? 0 : c->max_live_units ? c->max_live_units : c->prefetch_depth + 1;
  /* Room for the slots nesting may add (one per unit at most). */
  e->pools.pslots =
      calloc((size_t)(e->pools.n_own + n_shared + e->plan.n_units), sizeof *e->pools.pslots);
  if (!e->pools.pslots) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  for (int i = 0; i < e->plan.n_units && e->conf.shard_world > 1; i++) {
    const struct unit *u = &e->plan.units[i];
    if (!u->reshard) FSDP_TRY(slot_make(e, u->own_slot, u->padded, !u->lowp || u->widen, u->lowp));
  }
  e->pools.n_pslots = e->pools.n_own;
  for (int i = 0; i < n_shared; i++) FSDP_TRY(fsdp_engine_add_shared_slot(e));
  return FSDP_SUCCESS;
}

static fsdp_status_t pools_create(struct fsdp_engine *e) {
  const fsdp_config_t *c = &e->conf.cfg;
  FSDP_TRY(param_pool_create(e));
  /* accumulate_full_grads keeps one full gradient per unit instead. */
  e->pools.n_gslots = c->accumulate_full_grads ? 0 : FSDP_GRAD_SLOTS;
  for (int i = 0; i < e->pools.n_gslots; i++) {
    e->pools.gslots[i].owner = -1;
    if (!(e->pools.gslots[i].buf = fsdp_engine_alloc(e, e->plan.max_padded * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                        "engine: cannot allocate a %zu-byte gradient buffer (%s)",
                        e->plan.max_padded * sizeof(float), fsdp_last_error());
    e->pools.grad_pool_bytes += e->plan.max_padded * sizeof(float);
  }
  if (c->accumulate_full_grads)
    for (int i = 0; i < e->plan.n_units; i++)
      e->pools.grad_pool_bytes += e->plan.units[i].padded * sizeof(float);
  /* The reduction's output shard, in the reduce dtype; bf16 also casts the
   * full gradient into a bf16 buffer first. */
  size_t staging = e->conf.shard_world == 1 ? 0 : e->plan.max_shard;
  if (e->conf.bf16_reduce && e->conf.nranks > 1) {
    e->pools.grad_lp = fsdp_engine_alloc(e, e->plan.max_padded * sizeof(uint16_t));
    if (staging) e->pools.staging_lp = fsdp_engine_alloc(e, staging * sizeof(uint16_t));
    if (!e->pools.grad_lp || (staging && !e->pools.staging_lp))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the bf16 reduce buffers");
    e->pools.staging_bytes = (e->plan.max_padded + staging) * sizeof(uint16_t);
  } else if (staging) {
    if (!(e->pools.staging = fsdp_engine_alloc(e, staging * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the reduce buffer");
    e->pools.staging_bytes = staging * sizeof(float);
  }
  /* The norm: one sum per unit, then the sum of squares' partials. */
  size_t n = (size_t)e->plan.n_units + e->dev.ops->sum_squares_partials;
  e->pools.norm_dev = fsdp_engine_alloc(e, n * sizeof(double));
  e->pools.norm_host = fsdp_alloc((size_t)e->plan.n_units * sizeof(double));
  if (!e->pools.norm_dev || !e->pools.norm_host)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the norm buffers");
  e->pools.staging_bytes += n * sizeof(double);
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
