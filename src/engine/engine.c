/* src/engine/engine.c — engine life cycle: configuration, units and their flat
 * layout, materialisation of shards and pools, whole-tensor load/read, queries,
 * memory accounting and the timeline. The per-step schedule lives in
 * schedule.c, the optimizer step in step.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/shard.h"
#include "fsdp_config.h"
#if FSDP_HAVE_CUDA
#include "cuda/kernels.h"
#endif

static const char *const strategy_names[] = {"zero3", "zero2", "noshard"};

const char *fsdp_strategy_name(fsdp_strategy_t s) {
  return (unsigned)s < 3 ? strategy_names[s] : "unknown";
}

fsdp_status_t fsdp_strategy_parse(const char *text, fsdp_strategy_t *out) {
  static const struct { const char *name; fsdp_strategy_t s; } table[] = {
      {"zero3", FSDP_FULL_SHARD},        {"full_shard", FSDP_FULL_SHARD},
      {"zero2", FSDP_SHARD_GRAD_OP},     {"shard_grad_op", FSDP_SHARD_GRAD_OP},
      {"noshard", FSDP_NO_SHARD},        {"no_shard", FSDP_NO_SHARD},
  };
  for (size_t i = 0; text && i < sizeof table / sizeof table[0]; i++)
    if (strcmp(text, table[i].name) == 0) {
      *out = table[i].s;
      return FSDP_SUCCESS;
    }
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                    "unknown strategy '%s': use zero3 (full_shard), zero2 (shard_grad_op) "
                    "or noshard (no_shard)", text ? text : "(null)");
}

static fsdp_status_t config_check(const fsdp_config_t *c) {
  if ((unsigned)c->strategy > FSDP_NO_SHARD)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.strategy %d is not a strategy",
                      (int)c->strategy);
  if (c->prefetch_depth < 0 || c->prefetch_depth > 64)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.prefetch_depth %d is out of range [0, 64]", c->prefetch_depth);
  if (c->max_live_units < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.max_live_units %d is negative",
                      c->max_live_units);
  if (c->grad_accum < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.grad_accum %d must be at least 1",
                      c->grad_accum);
  if (c->grad_reduce != FSDP_SUM && c->grad_reduce != FSDP_AVG)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.grad_reduce must be FSDP_SUM or FSDP_AVG, not %d",
                      (int)c->grad_reduce);
  if (c->param_dtype != FSDP_F32 && c->param_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.param_dtype %s: parameters are stored in f32 or bf16",
                      fsdp_dtype_name(c->param_dtype));
  if (c->reduce_dtype != FSDP_F32 && c->reduce_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.reduce_dtype %s: gradients are reduced in f32 or bf16",
                      fsdp_dtype_name(c->reduce_dtype));
  if (c->device != FSDP_DEVICE_CPU && c->device != FSDP_DEVICE_CUDA)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.device %d is neither CPU nor CUDA",
                      (int)c->device);
  if (c->device == FSDP_DEVICE_CUDA && fsdp_cuda_device_count() == 0)
    return fsdp_error(FSDP_ERR_UNSUPPORTED,
                      "config.device is CUDA but %s", FSDP_HAVE_CUDA
                          ? "no CUDA device is usable by this process (driver, "
                            "CUDA_VISIBLE_DEVICES?)"
                          : "this fsdp was built without CUDA (configure with nvcc on PATH)");
  if (c->device == FSDP_DEVICE_CPU && c->comm_backend && strcmp(c->comm_backend, "nccl") == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.comm_backend 'nccl' needs config.device CUDA");
  if (c->align == 0 || (c->align & (c->align - 1)) != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.align %zu must be a power of two", c->align);
  FSDP_TRY(fsdp_optim_check(&c->optim));
  return fsdp_schedule_check(&c->schedule);
}

static fsdp_status_t worker_set_device(void *arg) {
  return fsdp_cuda_set_device(((struct fsdp_engine *)arg)->device);
}

fsdp_status_t fsdp_config_resolve(const fsdp_config_t *cfg, fsdp_config_t *out) {
  if (!cfg || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_config_resolve: cfg and out must not "
                      "be NULL");
  fsdp_config_t c = FSDP_CONFIG_INIT;
  FSDP_TRY(fsdp_opts_import(&c, cfg, sizeof c, FSDP_CONFIG_MAGIC, "fsdp_config_t",
                            "FSDP_CONFIG_INIT"));
  FSDP_TRY(config_check(&c));
  *out = c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_create(fsdp_world_t world, const fsdp_config_t *cfg,
                                 fsdp_engine_t *engine) {
  if (!world || !engine)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_create: world and engine "
                      "must not be NULL");
  fsdp_config_t resolved = FSDP_CONFIG_INIT;
  if (cfg) FSDP_TRY(fsdp_config_resolve(cfg, &resolved));
  const fsdp_config_t *c = &resolved;

  struct fsdp_engine *e = calloc(1, sizeof *e);
  if (!e) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  e->world = world;
  e->cfg = *c;
  e->rank = fsdp_world_rank(world);
  e->nranks = fsdp_world_size(world);
  e->shard_world = c->strategy == FSDP_NO_SHARD ? 1 : e->nranks;
  e->bf16 = c->param_dtype == FSDP_BF16;
  e->cuda = c->device == FSDP_DEVICE_CUDA;
  e->widen = e->bf16 && !e->cuda;
  e->bf16_reduce = c->reduce_dtype == FSDP_BF16;
  pthread_mutex_init(&e->tl_lock, NULL);

  fsdp_status_t st;
  if (c->comm_backend && !(e->comm_backend = fsdp_strdup(c->comm_backend))) {
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
    goto fail;
  }
  e->cfg.comm_backend = e->comm_backend;
  /* The host communicator (gradient norm, the caller's metrics) is always the
   * world's; gathers and reductions use the configured backend. */
  FSDP_TRYG(st, fsdp_comm_create(world, &e->comm_host), fail);
  if (e->comm_backend) {
    FSDP_TRYG(st, fsdp_comm_create_backend(world, e->comm_backend, &e->comm_gather), fail);
    FSDP_TRYG(st, fsdp_comm_dup(e->comm_gather, &e->comm_reduce), fail);
  } else {
    FSDP_TRYG(st, fsdp_comm_dup(e->comm_host, &e->comm_gather), fail);
    FSDP_TRYG(st, fsdp_comm_dup(e->comm_host, &e->comm_reduce), fail);
  }
  if (e->cuda && strcmp(fsdp_comm_backend(e->comm_gather), "nccl") == 0) {
    /* NCCL queues on CUDA streams: communication never waits for the host. */
    FSDP_TRYG(st, fsdp_stream_create_cuda("fsdp-gather", 1, &e->s_gather), fail);
    FSDP_TRYG(st, fsdp_stream_create_cuda("fsdp-reduce", 1, &e->s_reduce), fail);
  } else {
    /* Host backends (on CUDA: staged through pinned memory) run on workers. */
    FSDP_TRYG(st, fsdp_stream_create("fsdp-gather", &e->s_gather), fail);
    FSDP_TRYG(st, fsdp_stream_create("fsdp-reduce", &e->s_reduce), fail);
    if (e->cuda) {
      FSDP_TRYG(st, fsdp_stream_create_cuda("fsdp-aux", 1, &e->s_aux), fail);
      /* The current device is per thread: the workers take the caller's. */
      FSDP_TRYG(st, fsdp_cuda_get_device(&e->device), fail);
      FSDP_TRYG(st, fsdp_stream_launch(e->s_gather, worker_set_device, e), fail);
      FSDP_TRYG(st, fsdp_stream_launch(e->s_reduce, worker_set_device, e), fail);
    }
  }
  if (e->cuda) FSDP_TRYG(st, fsdp_stream_create_cuda("fsdp-compute", 0, &e->s_compute), fail);
  FSDP_TRYG(st, fsdp_event_create(&e->compute_done), fail);
  *engine = e;
  return FSDP_SUCCESS;
fail:
  fsdp_engine_destroy(e);
  return st;
}

void *fsdp_engine_alloc(const struct fsdp_engine *e, size_t bytes) {
  void *p = NULL;
  fsdp_device_kind_t kind = e->cuda ? FSDP_DEVICE_CUDA : FSDP_DEVICE_CPU;
  if (fsdp_device_alloc(kind, bytes, &p) != FSDP_SUCCESS) return NULL;
  if (e->cuda && fsdp_device_zero(p, bytes, FSDP_HOST_STREAM) != FSDP_SUCCESS) {
    fsdp_device_free(kind, p);
    return NULL;
  }
  return p; /* fsdp_alloc zeroes host memory */
}

void fsdp_engine_free(const struct fsdp_engine *e, void *p) {
  fsdp_device_free(e->cuda ? FSDP_DEVICE_CUDA : FSDP_DEVICE_CPU, p);
}

fsdp_status_t fsdp_engine_zero(const struct fsdp_engine *e, void *p, size_t bytes) {
  if (!e->cuda) return memset(p, 0, bytes), FSDP_SUCCESS;
  return fsdp_device_zero(p, bytes, e->s_compute);
}

static void unit_free(const struct fsdp_engine *e, struct unit *u) {
  for (int t = 0; t < u->n_tensors; t++) free(u->tensors[t].name);
  free(u->tensors);
  free(u->name);
  free(u->kind);
  free(u->param_ptrs);
  free(u->grad_ptrs);
  fsdp_engine_free(e, u->master);
  fsdp_engine_free(e, u->grad);
  fsdp_engine_free(e, u->m);
  fsdp_engine_free(e, u->v);
  fsdp_engine_free(e, u->full_grad);
  fsdp_engine_free(e, u->lp);
  fsdp_engine_free(e, u->rounded);
  for (int i = 0; i < 4; i++) fsdp_free(u->mirror[i]);
  fsdp_event_destroy(u->ready);
  fsdp_event_destroy(u->reduced);
}

void fsdp_engine_destroy(fsdp_engine_t e) {
  if (!e) return;
  /* Streams first: their queued work may still touch buffers freed below.
   * cuBLAS handles are cached per stream: released while these still exist. */
#if FSDP_HAVE_CUDA
  if (e->cuda) {
    fsdp_stream_synchronize(e->s_compute);
    fsdp_cuda_blas_release();
  }
#endif
  fsdp_stream_destroy(e->s_gather);
  fsdp_stream_destroy(e->s_reduce);
  fsdp_stream_destroy(e->s_compute);
  fsdp_stream_destroy(e->s_aux);
  for (int i = 0; i < e->n_units; i++) unit_free(e, &e->units[i]);
  free(e->units);
  for (int i = 0; i < e->n_pslots; i++) {
    fsdp_engine_free(e, e->pslots[i].buf);
    fsdp_engine_free(e, e->pslots[i].lp);
    fsdp_event_destroy(e->pslots[i].free_ev);
  }
  free(e->pslots);
  for (int i = 0; i < e->n_gslots; i++) fsdp_engine_free(e, e->gslots[i].buf);
  fsdp_engine_free(e, e->staging);
  fsdp_engine_free(e, e->grad_lp);
  fsdp_engine_free(e, e->staging_lp);
  fsdp_engine_free(e, e->norm_dev);
  fsdp_free(e->norm_host);
  free(e->comm_backend);
  fsdp_event_destroy(e->compute_done);
  free(e->fwd_release);
  free(e->tl);
  fsdp_comm_destroy(e->comm_gather);
  fsdp_comm_destroy(e->comm_reduce);
  fsdp_comm_destroy(e->comm_host);
  pthread_mutex_destroy(&e->tl_lock);
  free(e);
}

fsdp_status_t fsdp_engine_poison(struct fsdp_engine *e, fsdp_status_t st) {
  if (e->poisoned == FSDP_SUCCESS) {
    e->poisoned = st;
    snprintf(e->poison_msg, sizeof e->poison_msg, "%s", fsdp_last_error());
  }
  return st;
}

fsdp_status_t fsdp_engine_check_live(struct fsdp_engine *e) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "engine is NULL");
  if (e->poisoned)
    return fsdp_error(e->poisoned, "engine stopped by an earlier failure: %s", e->poison_msg);
  return FSDP_SUCCESS;
}

/* ---- units ------------------------------------------------------------- */

static const struct tensor *tensor_find(const struct fsdp_engine *e, const char *name,
                                        int *unit, int *index) {
  for (int u = 0; u < e->n_units; u++)
    for (int t = 0; t < e->units[u].n_tensors; t++)
      if (strcmp(e->units[u].tensors[t].name, name) == 0) {
        if (unit) *unit = u;
        if (index) *index = t;
        return &e->units[u].tensors[t];
      }
  return NULL;
}

static fsdp_status_t tensor_check(const struct fsdp_engine *e, const char *unit_name,
                                  const fsdp_tensor_desc_t *descs, int i, size_t *numel) {
  const fsdp_tensor_desc_t *d = &descs[i];
  if (!d->name || !d->name[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s': tensor %d has no name",
                      unit_name, i);
  if (tensor_find(e, d->name, NULL, NULL))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "unit '%s': tensor '%s' is already registered (names must be unique)",
                      unit_name, d->name);
  for (int j = 0; j < i; j++)
    if (strcmp(descs[j].name, d->name) == 0)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "unit '%s': tensor '%s' appears twice", unit_name, d->name);
  if (d->ndim < 1 || d->ndim > FSDP_MAX_DIMS)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tensor '%s': ndim %d is not in [1, %d]",
                      d->name, d->ndim, FSDP_MAX_DIMS);
  if ((unsigned)d->init > FSDP_INIT_UNIFORM)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tensor '%s': unknown init kind %d",
                      d->name, (int)d->init);
  size_t n = 1;
  for (int k = 0; k < d->ndim; k++) {
    if (d->shape[k] <= 0)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "tensor '%s': dimension %d is %lld; every dimension must be > 0",
                        d->name, k, (long long)d->shape[k]);
    if ((uint64_t)d->shape[k] > (SIZE_MAX >> 4) / n)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tensor '%s': element count overflows",
                        d->name);
    n *= (size_t)d->shape[k];
  }
  *numel = n;
  return FSDP_SUCCESS;
}

static fsdp_status_t unit_fill(struct fsdp_engine *e, struct unit *u, const char *name,
                               const char *kind, const fsdp_tensor_desc_t *descs, int n) {
  u->name = fsdp_strdup(name);
  u->kind = fsdp_strdup(kind ? kind : "");
  u->tensors = calloc((size_t)n, sizeof *u->tensors);
  u->param_ptrs = calloc((size_t)n, sizeof *u->param_ptrs);
  u->grad_ptrs = calloc((size_t)n, sizeof *u->grad_ptrs);
  if (!u->name || !u->kind || !u->tensors || !u->param_ptrs || !u->grad_ptrs)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': out of host memory", name);
  u->n_tensors = n;
  for (int i = 0; i < n; i++) {
    size_t numel = 0;
    FSDP_TRY(tensor_check(e, name, descs, i, &numel));
    struct tensor *t = &u->tensors[i];
    if (!(t->name = fsdp_strdup(descs[i].name)))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': out of host memory", name);
    t->ndim = descs[i].ndim;
    memcpy(t->shape, descs[i].shape, sizeof t->shape);
    t->numel = numel;
    t->offset = u->numel;
    t->init = descs[i].init;
    t->init_scale = descs[i].init_scale;
    t->no_decay = descs[i].no_decay;
    u->numel += numel;
  }
  u->slot = u->held = u->gslot = -1;
  FSDP_TRY(fsdp_event_create(&u->ready));
  return fsdp_event_create(&u->reduced);
}

fsdp_status_t fsdp_unit_add(fsdp_engine_t e, const char *name, const char *kind,
                            const fsdp_tensor_desc_t *tensors, int n_tensors,
                            fsdp_unit_t *unit) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (e->materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "unit '%s' added after fsdp_engine_materialize: add every unit first",
                      name ? name : "(null)");
  if (!name || !name[0] || !tensors || n_tensors < 1 || !unit)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_unit_add: a unit needs a name, at least one tensor (got %d) and "
                      "an output handle", n_tensors);
  for (int i = 0; i < e->n_units; i++)
    if (strcmp(e->units[i].name, name) == 0)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s' is already registered", name);
  if (e->n_units == e->cap_units) {
    int cap = e->cap_units ? 2 * e->cap_units : 16;
    struct unit *grown = realloc(e->units, (size_t)cap * sizeof *grown);
    if (!grown) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': out of host memory", name);
    e->units = grown;
    e->cap_units = cap;
  }
  struct unit *u = &e->units[e->n_units];
  memset(u, 0, sizeof *u);
  fsdp_status_t st = unit_fill(e, u, name, kind, tensors, n_tensors);
  if (st != FSDP_SUCCESS) {
    unit_free(e, u);
    return st;
  }
  *unit = e->n_units++;
  return FSDP_SUCCESS;
}

/* ---- materialise ------------------------------------------------------- */

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
  fsdp_init_fill(c->dst + (flat - c->u->shard_offset), n, c->e->seed, t->name, first,
                 t->init, t->init_scale);
}

/* Fills u's master shard with its initial values (on CUDA through the host). */
static fsdp_status_t unit_init(struct fsdp_engine *e, struct unit *u) {
  size_t bytes = u->shard * sizeof(float);
  struct init_ctx ctx = {e, u, e->cuda ? fsdp_alloc(bytes) : u->master};
  if (!ctx.dst)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': %zu bytes to initialise it", u->name,
                      bytes);
  fsdp_unit_segments(u, u->shard_offset, u->shard_offset + u->count, init_segment, &ctx);
  fsdp_status_t st = FSDP_SUCCESS;
  if (e->cuda) {
    st = fsdp_device_copy(u->master, ctx.dst, bytes, FSDP_HOST_STREAM);
    fsdp_free(ctx.dst);
  }
  return st != FSDP_SUCCESS ? st : fsdp_unit_refresh_params(e, u);
}

static fsdp_status_t unit_materialize(struct fsdp_engine *e, struct unit *u) {
  size_t begin, end;
  FSDP_TRY(fsdp_shard_layout(u->numel, e->shard_world, e->cfg.align,
                             e->shard_world == 1 ? 0 : e->rank, &u->padded, &u->shard, &begin,
                             &end));
  u->shard_offset = e->shard_world == 1 ? 0 : (size_t)e->rank * u->shard;
  u->count = end - begin;
  size_t bytes = u->shard * sizeof(float);
  u->master = fsdp_engine_alloc(e, bytes);
  u->grad = fsdp_engine_alloc(e, bytes);
  int moments = e->cfg.optim.kind == FSDP_OPTIM_ADAMW ? 2
                : e->cfg.optim.momentum > 0.0f        ? 1 : 0;
  if (moments >= 1) u->m = fsdp_engine_alloc(e, bytes);
  if (moments == 2) u->v = fsdp_engine_alloc(e, bytes);
  if (e->cfg.accumulate_full_grads) u->full_grad = fsdp_engine_alloc(e, u->padded * sizeof(float));
  if (!u->master || !u->grad || (moments >= 1 && !u->m) || (moments == 2 && !u->v) ||
      (e->cfg.accumulate_full_grads && !u->full_grad))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                      "unit '%s': cannot allocate its shard state (%zu bytes per buffer)",
                      u->name, bytes);
  if (e->bf16) u->lp = fsdp_engine_alloc(e, u->shard * sizeof(uint16_t));
  /* One shard on the CPU: views read a widened copy (CUDA reads lp itself). */
  if (e->widen && e->shard_world == 1) u->rounded = fsdp_engine_alloc(e, bytes);
  if (e->bf16 && (!u->lp || (e->widen && e->shard_world == 1 && !u->rounded)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': cannot allocate its bf16 copy",
                      u->name);
  FSDP_TRY(unit_init(e, u));
  if (e->max_padded < u->padded) e->max_padded = u->padded;
  if (e->max_shard < u->shard) e->max_shard = u->shard;
  return FSDP_SUCCESS;
}

/* Param slots: ZeRO-3 shares max_live_units slots of the largest unit's size;
 * ZeRO-2 keeps every unit gathered from forward to backward, so each unit gets a
 * slot of its own size; NO_SHARD reads the replicated master directly. */
static fsdp_status_t pools_create(struct fsdp_engine *e) {
  const fsdp_config_t *c = &e->cfg;
  if (c->strategy == FSDP_FULL_SHARD)
    e->n_pslots = c->max_live_units ? c->max_live_units : c->prefetch_depth + 1;
  else if (c->strategy == FSDP_SHARD_GRAD_OP)
    e->n_pslots = e->n_units;
  e->pslots = calloc((size_t)(e->n_pslots ? e->n_pslots : 1), sizeof *e->pslots);
  if (!e->pslots) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  for (int i = 0; i < e->n_pslots; i++) {
    struct pslot *p = &e->pslots[i];
    p->capacity = c->strategy == FSDP_SHARD_GRAD_OP ? e->units[i].padded : e->max_padded;
    p->owner = -1;
    int f32 = !e->bf16 || e->widen;
    if (f32) p->buf = fsdp_engine_alloc(e, p->capacity * sizeof(float));
    if (e->bf16) p->lp = fsdp_engine_alloc(e, p->capacity * sizeof(uint16_t));
    if ((f32 && !p->buf) || (e->bf16 && !p->lp))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                        "engine: cannot allocate a %zu-byte gather buffer (%s)",
                        p->capacity * fsdp_gather_elem_bytes(e), fsdp_last_error());
    FSDP_TRY(fsdp_event_create(&p->free_ev));
    e->param_pool_bytes += p->capacity * fsdp_gather_elem_bytes(e);
  }
  /* accumulate_full_grads keeps one full gradient per unit instead. */
  e->n_gslots = c->accumulate_full_grads ? 0 : FSDP_GRAD_SLOTS;
  for (int i = 0; i < e->n_gslots; i++) {
    e->gslots[i].owner = -1;
    if (!(e->gslots[i].buf = fsdp_engine_alloc(e, e->max_padded * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                        "engine: cannot allocate a %zu-byte gradient buffer (%s)",
                        e->max_padded * sizeof(float), fsdp_last_error());
    e->grad_pool_bytes += e->max_padded * sizeof(float);
  }
  if (c->accumulate_full_grads)
    for (int i = 0; i < e->n_units; i++) e->grad_pool_bytes += e->units[i].padded * sizeof(float);
  /* The reduction's output shard, in the reduce dtype; bf16 also casts the
   * full gradient into a bf16 buffer first. */
  size_t staging = e->shard_world == 1 ? 0 : e->max_shard;
  if (e->bf16_reduce && e->nranks > 1) {
    e->grad_lp = fsdp_engine_alloc(e, e->max_padded * sizeof(uint16_t));
    if (staging) e->staging_lp = fsdp_engine_alloc(e, staging * sizeof(uint16_t));
    if (!e->grad_lp || (staging && !e->staging_lp))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the bf16 reduce buffers");
    e->staging_bytes = (e->max_padded + staging) * sizeof(uint16_t);
  } else if (staging) {
    if (!(e->staging = fsdp_engine_alloc(e, staging * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the reduce buffer");
    e->staging_bytes = staging * sizeof(float);
  }
  if (e->cuda) {
#if FSDP_HAVE_CUDA
    size_t n = (size_t)e->n_units + FSDP_CUDA_SUMSQ_PARTIALS;
    e->norm_dev = fsdp_engine_alloc(e, n * sizeof(double));
    e->norm_host = fsdp_alloc((size_t)e->n_units * sizeof(double));
    if (!e->norm_dev || !e->norm_host)
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: cannot allocate the norm buffers");
    e->staging_bytes += n * sizeof(double);
#endif
  }
  e->fwd_release = calloc((size_t)e->n_units, sizeof *e->fwd_release);
  if (!e->fwd_release) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_materialize(fsdp_engine_t e, uint64_t seed) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (e->materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_materialize called twice");
  if (e->n_units == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "fsdp_engine_materialize: no units were added");
  e->seed = seed;
  for (int i = 0; i < e->n_units; i++) FSDP_TRY(unit_materialize(e, &e->units[i]));
  FSDP_TRY(pools_create(e));
  FSDP_TRY(fsdp_stream_synchronize(e->s_compute)); /* CUDA: the bf16 casts, before gathers */
  e->materialized = 1;
  return FSDP_SUCCESS;
}

/* ---- whole tensors ------------------------------------------------------ */

static fsdp_status_t tensor_lookup(struct fsdp_engine *e, const char *what, const char *name,
                                   struct unit **u, const struct tensor **t) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s('%s') before fsdp_engine_materialize",
                      what, name ? name : "(null)");
  for (int i = 0; i < e->n_units; i++)
    if (e->units[i].held >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "%s('%s') while unit '%s' is acquired: release every unit first",
                        what, name ? name : "(null)", e->units[i].name);
  int ui;
  if (!name || !(*t = tensor_find(e, name, &ui, NULL)))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: no tensor named '%s'", what,
                      name ? name : "(null)");
  *u = &e->units[ui];
  return FSDP_SUCCESS;
}

void fsdp_engine_drop_gathers(struct fsdp_engine *e) {
  for (int i = 0; i < e->n_units; i++) {
    struct unit *u = &e->units[i];
    if (u->slot >= 0 && u->held < 0) {
      fsdp_event_synchronize(u->ready);
      /* The next gather into it waits until compute has passed its last use. */
      fsdp_event_record(e->pslots[u->slot].free_ev, e->s_compute);
      e->pslots[u->slot].owner = -1;
      fsdp_mem_track(&e->gathered, &e->gathered_peak, 0, fsdp_unit_gathered_bytes(e, u));
      u->slot = -1;
    }
  }
}

fsdp_status_t fsdp_engine_load_tensor(fsdp_engine_t e, const char *name, const float *full,
                                      int root) {
  struct unit *u = NULL;
  const struct tensor *t = NULL;
  FSDP_TRY(tensor_lookup(e, "fsdp_engine_load_tensor", name, &u, &t));
  if (root < 0 || root >= e->nranks)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_load_tensor('%s'): root %d is not a rank of %d", name, root,
                      e->nranks);
  if (e->rank == root && !full)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_load_tensor('%s'): root rank %d passed no data", name, root);
  float *buf = fsdp_alloc(t->numel * sizeof(float));
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_engine_load_tensor('%s'): %zu bytes", name,
                      t->numel * sizeof(float));
  if (e->rank == root) memcpy(buf, full, t->numel * sizeof(float));
  fsdp_status_t st = fsdp_broadcast(e->comm_host, buf, t->numel, FSDP_F32, root,
                                    FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS) st = fsdp_stream_synchronize(e->s_compute); /* the last update */
  if (st == FSDP_SUCCESS) {
    fsdp_engine_drop_gathers(e);
    u->mirror_dirty = 0;
    size_t lo = u->shard_offset, hi = u->shard_offset + u->count;
    size_t a = t->offset > lo ? t->offset : lo;
    size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
    if (a < b)
      st = fsdp_device_copy(u->master + (a - lo), buf + (a - t->offset), (b - a) * sizeof(float),
                            FSDP_HOST_STREAM);
    if (st == FSDP_SUCCESS) st = fsdp_unit_refresh_params(e, u);
    if (st == FSDP_SUCCESS) st = fsdp_stream_synchronize(e->s_compute);
  }
  if (st != FSDP_SUCCESS) {
    fsdp_engine_poison(e, st);
  }
  fsdp_free(buf);
  return st;
}

fsdp_status_t fsdp_engine_read_tensor(fsdp_engine_t e, const char *name, float *full,
                                      int root) {
  struct unit *u = NULL;
  const struct tensor *t = NULL;
  FSDP_TRY(tensor_lookup(e, "fsdp_engine_read_tensor", name, &u, &t));
  if (root < -1 || root >= e->nranks)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_read_tensor('%s'): root %d is not -1 or a rank of %d", name,
                      root, e->nranks);
  if ((root == -1 || root == e->rank) && !full)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_read_tensor('%s'): no output buffer on rank %d", name, e->rank);
  FSDP_TRY(fsdp_stream_synchronize(e->s_compute)); /* the last step's update */
  if (e->shard_world == 1)
    return full ? fsdp_device_copy(full, u->master + t->offset, t->numel * sizeof(float),
                                   FSDP_HOST_STREAM)
                : FSDP_SUCCESS;
  float *buf = fsdp_alloc(u->padded * sizeof(float));
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_engine_read_tensor('%s'): %zu bytes", name,
                      u->padded * sizeof(float));
  /* The host communicator moves host memory: this rank's shard goes in place. */
  float *mine = buf + (size_t)e->rank * u->shard;
  fsdp_status_t st = fsdp_device_copy(mine, u->master, u->shard * sizeof(float),
                                      FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS)
    st = fsdp_all_gather(e->comm_host, mine, buf, u->shard, FSDP_F32, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && (root == -1 || root == e->rank))
    memcpy(full, buf + t->offset, t->numel * sizeof(float));
  if (st != FSDP_SUCCESS) fsdp_engine_poison(e, st);
  fsdp_free(buf);
  return st;
}

/* ---- queries ------------------------------------------------------------ */

fsdp_status_t fsdp_engine_shard_batch(fsdp_engine_t e, int64_t global_batch,
                                      int64_t *micro_batch, int64_t *offset) {
  FSDP_TRY(fsdp_engine_check_live(e));
  int64_t parts = (int64_t)e->nranks * e->cfg.grad_accum;
  if (global_batch <= 0 || global_batch % parts != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "global batch %lld is not divisible by world size %d x grad_accum %d = "
                      "%lld: choose a multiple of %lld", (long long)global_batch, e->nranks,
                      e->cfg.grad_accum, (long long)parts, (long long)parts);
  int64_t mb = global_batch / parts;
  if (micro_batch) *micro_batch = mb;
  if (offset) *offset = mb * e->rank;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_set_step(fsdp_engine_t e, int64_t step) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (step < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_set_step: step %lld is negative",
                      (long long)step);
  for (int i = 0; i < e->n_units; i++)
    if (e->units[i].held >= 0 || e->units[i].bwd_count > 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "fsdp_engine_set_step while unit '%s' is %s: finish the step first",
                        e->units[i].name, e->units[i].held >= 0 ? "acquired" : "holding gradients");
  fsdp_engine_drop_gathers(e);
  for (int i = 0; i < e->n_units; i++) {
    struct unit *u = &e->units[i];
    if (u->mirror_dirty) { /* what a loader wrote into fsdp_unit_shard's host copies */
      float *dev[4] = {u->master, u->grad, u->m, u->v};
      for (int k = 0; k < 4; k++)
        if (dev[k])
          FSDP_TRY(fsdp_device_copy(dev[k], u->mirror[k], u->shard * sizeof(float),
                                    FSDP_HOST_STREAM));
      u->mirror_dirty = 0;
    }
    FSDP_TRY(fsdp_unit_refresh_params(e, u));
  }
  FSDP_TRY(fsdp_stream_synchronize(e->s_compute));
  e->step = step;
  return FSDP_SUCCESS;
}

int fsdp_engine_num_units(fsdp_engine_t e) { return e ? e->n_units : -1; }
int64_t fsdp_engine_step_count(fsdp_engine_t e) { return e ? e->step : -1; }
const fsdp_config_t *fsdp_engine_config(fsdp_engine_t e) { return e ? &e->cfg : NULL; }
fsdp_world_t fsdp_engine_world(fsdp_engine_t e) { return e ? e->world : NULL; }
fsdp_comm_t fsdp_engine_comm(fsdp_engine_t e) { return e ? e->comm_host : NULL; }
fsdp_stream_t fsdp_engine_stream(fsdp_engine_t e) { return e ? e->s_compute : FSDP_HOST_STREAM; }

static fsdp_status_t unit_get(fsdp_engine_t e, fsdp_unit_t unit, const char *what,
                              struct unit **u) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: engine is NULL", what);
  if (unit < 0 || unit >= e->n_units)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: unit %d does not exist (%d units)", what,
                      unit, e->n_units);
  *u = &e->units[unit];
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_info(fsdp_engine_t e, fsdp_unit_t unit, fsdp_unit_info_t *info) {
  struct unit *u = NULL;
  FSDP_TRY(unit_get(e, unit, "fsdp_unit_info", &u));
  if (!info) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_unit_info: info is NULL");
  *info = (fsdp_unit_info_t){u->name, u->kind, u->n_tensors, u->numel, u->padded, u->shard,
                             u->shard_offset};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_shard(fsdp_engine_t e, fsdp_unit_t unit, fsdp_shard_t *shard) {
  struct unit *u = NULL;
  FSDP_TRY(unit_get(e, unit, "fsdp_unit_shard", &u));
  if (!e->materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_unit_shard('%s') before materialize",
                      u->name);
  if (!shard) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_unit_shard: shard is NULL");
  if (!e->cuda) {
    *shard = (fsdp_shard_t){u->shard_offset, u->count, u->shard, u->master, u->grad, u->m, u->v};
    return FSDP_SUCCESS;
  }
  /* CUDA: host copies, refreshed now; see fsdp_unit_shard in engine.h. */
  FSDP_TRY(fsdp_stream_synchronize(e->s_compute));
  FSDP_TRY(fsdp_stream_synchronize(e->s_reduce));
  float *dev[4] = {u->master, u->grad, u->m, u->v};
  for (int k = 0; k < 4; k++) {
    if (!dev[k]) continue;
    if (!u->mirror[k] && !(u->mirror[k] = fsdp_alloc(u->shard * sizeof(float))))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_unit_shard('%s'): %zu bytes of host memory",
                        u->name, u->shard * sizeof(float));
    FSDP_TRY(fsdp_device_copy(u->mirror[k], dev[k], u->shard * sizeof(float), FSDP_HOST_STREAM));
  }
  u->mirror_dirty = 1;
  *shard = (fsdp_shard_t){u->shard_offset, u->count,     u->shard,   u->mirror[0],
                          u->mirror[1],    u->mirror[2], u->mirror[3]};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_find_tensor(fsdp_engine_t e, const char *name, fsdp_unit_t *unit,
                                      int *index) {
  if (!e || !name)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_find_tensor: NULL argument");
  if (!tensor_find(e, name, unit, index))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "no tensor named '%s'", name);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_tensor(fsdp_engine_t e, fsdp_unit_t unit, int index,
                               fsdp_tensor_info_t *info) {
  struct unit *u = NULL;
  FSDP_TRY(unit_get(e, unit, "fsdp_unit_tensor", &u));
  if (index < 0 || index >= u->n_tensors || !info)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_unit_tensor('%s'): tensor %d does not exist (%d tensors) or info is "
                      "NULL", u->name, index, u->n_tensors);
  const struct tensor *t = &u->tensors[index];
  *info = (fsdp_tensor_info_t){t->name, t->ndim, {0}, t->numel, t->offset, t->no_decay};
  memcpy(info->shape, t->shape, sizeof info->shape);
  return FSDP_SUCCESS;
}

/* ---- memory and timeline ------------------------------------------------ */

fsdp_status_t fsdp_unit_refresh_params(const struct fsdp_engine *e, struct unit *u) {
  if (!e->bf16) return FSDP_SUCCESS;
#if FSDP_HAVE_CUDA
  if (e->cuda)
    return fsdp_cuda_f32_to_bf16(u->lp, u->master, u->shard,
                                 (fsdp_cuda_stream_t)fsdp_stream_cuda_handle(e->s_compute));
#endif
  for (size_t i = 0; i < u->shard; i++) u->lp[i] = fsdp_f32_to_bf16(u->master[i]);
  for (size_t i = 0; u->rounded && i < u->shard; i++) u->rounded[i] = fsdp_bf16_to_f32(u->lp[i]);
  return FSDP_SUCCESS;
}

void fsdp_mem_track(size_t *live, size_t *peak, size_t add, size_t sub) {
  *live = *live + add - sub;
  if (*live > *peak) *peak = *live;
}

fsdp_status_t fsdp_engine_memory(fsdp_engine_t e, fsdp_mem_stats_t *mem) {
  if (!e || !mem)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_memory: engine and mem must "
                      "not be NULL");
  memset(mem, 0, sizeof *mem);
  for (int i = 0; i < e->n_units && e->materialized; i++) {
    const struct unit *u = &e->units[i];
    size_t b = u->shard * sizeof(float);
    mem->master += b;
    mem->grad_shard += b;
    mem->optim_state += (u->m ? b : 0) + (u->v ? b : 0);
    mem->param_copy += (u->lp ? u->shard * sizeof(uint16_t) : 0) + (u->rounded ? b : 0);
  }
  mem->persistent = mem->master + mem->grad_shard + mem->optim_state + mem->param_copy;
  mem->gathered_params = e->gathered;
  mem->gathered_params_peak = e->gathered_peak;
  mem->grads_in_flight = e->grads_live;
  mem->grads_in_flight_peak = e->grads_peak;
  mem->param_pool = e->param_pool_bytes;
  mem->grad_pool = e->grad_pool_bytes;
  mem->staging = e->staging_bytes;
  mem->total_reserved = mem->persistent + mem->param_pool + mem->grad_pool + mem->staging;
  return FSDP_SUCCESS;
}

void fsdp_engine_reset_peaks(fsdp_engine_t e) {
  if (!e) return;
  e->gathered_peak = e->gathered;
  e->grads_peak = e->grads_live;
}

void fsdp_tl_add(struct fsdp_engine *e, fsdp_tl_kind_t kind, int unit, fsdp_pass_t pass,
                 int stream, double t0, double t1, size_t bytes) {
  pthread_mutex_lock(&e->tl_lock);
  if (e->tl_count == e->tl_cap && e->tl_cap < e->cfg.timeline_capacity) {
    size_t cap = e->tl_cap ? 2 * e->tl_cap : 1024;
    if (cap > e->cfg.timeline_capacity) cap = e->cfg.timeline_capacity;
    fsdp_tl_event_t *grown = realloc(e->tl, cap * sizeof *grown);
    if (grown) {
      e->tl = grown;
      e->tl_cap = cap;
    }
  }
  if (e->tl_count < e->tl_cap)
    e->tl[e->tl_count++] = (fsdp_tl_event_t){kind, unit, pass, stream, t0, t1, bytes};
  else
    e->tl_dropped++;
  pthread_mutex_unlock(&e->tl_lock);
}

fsdp_status_t fsdp_engine_timeline(fsdp_engine_t e, const fsdp_tl_event_t **events,
                                   size_t *count, size_t *dropped) {
  if (!e || !events || !count)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_timeline: engine, events and "
                      "count must not be NULL");
  /* Streams append (and may grow the array) while they run: let them finish. */
  fsdp_stream_synchronize(e->s_gather);
  fsdp_stream_synchronize(e->s_reduce);
  pthread_mutex_lock(&e->tl_lock);
  *count = e->tl_count;
  if (dropped) *dropped = e->tl_dropped;
  *events = e->tl;
  pthread_mutex_unlock(&e->tl_lock);
  return FSDP_SUCCESS;
}

void fsdp_engine_timeline_clear(fsdp_engine_t e) {
  if (!e) return;
  pthread_mutex_lock(&e->tl_lock);
  e->tl_count = e->tl_dropped = 0;
  pthread_mutex_unlock(&e->tl_lock);
}
