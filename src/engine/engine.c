/* src/engine/engine.c — the engine's configuration: checks, resolution and
 * the shard groups (engine_internal.h's engine_conf); the device's
 * allocation helpers, poisoning, and the properties of an engine. Its life
 * (create, materialize, destroy) is life.c; communicators and their streams
 * are made in comms.c; units are registered in units.c, materialised in
 * materialize.c; parameters move in and out in tensor_io.c; the per-step
 * schedule is schedule.c, the optimizer step step.c, memory accounting and
 * the timeline accounting.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

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

/* Written as !(x in range) so that NaN fails too. */
static fsdp_status_t scaler_check(const fsdp_config_t *c) {
  if (c->max_consecutive_skips < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.max_consecutive_skips %d is negative",
                      c->max_consecutive_skips);
  if (!(c->loss_scale_init >= 0.0 && c->loss_scale_init < 1e300))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.loss_scale_init %g must be finite "
                      "and > 0 (0: the default)", c->loss_scale_init);
  if (!(c->loss_scale_growth >= 1.0 && c->loss_scale_growth < 1e300))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.loss_scale_growth %g must be finite "
                      "and >= 1", c->loss_scale_growth);
  if (!(c->loss_scale_backoff > 0.0 && c->loss_scale_backoff <= 1.0))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.loss_scale_backoff %g must be in "
                      "(0, 1]", c->loss_scale_backoff);
  if (c->loss_scale_interval < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.loss_scale_interval %d must be >= 1",
                      c->loss_scale_interval);
  return FSDP_SUCCESS;
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
  if (c->param_dtype != FSDP_F32 && c->param_dtype != FSDP_BF16 && c->param_dtype != FSDP_F16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.param_dtype %s: parameters are stored in f32, bf16 or f16",
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
                      "config.device is CUDA but %s", fsdp_compute_ops(FSDP_DEVICE_CUDA)
                          ? "no CUDA device is usable by this process (driver, "
                            "CUDA_VISIBLE_DEVICES?)"
                          : "this fsdp was built without CUDA (configure with nvcc on PATH)");
  if (c->device == FSDP_DEVICE_CPU && c->comm_backend && strcmp(c->comm_backend, "nccl") == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.comm_backend 'nccl' needs config.device CUDA");
  if (c->shard_size < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.shard_size %d is negative (0: the "
                      "world)", c->shard_size);
  if (c->align == 0 || (c->align & (c->align - 1)) != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.align %zu must be a power of two", c->align);
  FSDP_TRY(fsdp_optim_check(&c->optim));
  FSDP_TRY(scaler_check(c));
  return fsdp_schedule_check(&c->schedule);
}

/* Unset values become their defaults (see fsdp_config_t). */
static void config_defaults(fsdp_config_t *c) {
  if (c->max_consecutive_skips == 0) c->max_consecutive_skips = 20;
  if (c->loss_scale_init == 0.0) c->loss_scale_init = c->param_dtype == FSDP_F16 ? 65536.0 : 1.0;
}

/* cfg imported over the defaults, checked and resolved, into our full-size *c. */
static fsdp_status_t config_resolve(const fsdp_config_t *cfg, fsdp_config_t *c) {
  *c = (fsdp_config_t)FSDP_CONFIG_INIT;
  FSDP_TRY(fsdp_opts_import(c, cfg, sizeof *c, FSDP_CONFIG_MAGIC, "fsdp_config_t",
                            "FSDP_CONFIG_INIT"));
  FSDP_TRY(config_check(c));
  config_defaults(c);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_config_resolve(const fsdp_config_t *cfg, fsdp_config_t *out) {
  if (!cfg || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_config_resolve: cfg and out must not "
                      "be NULL");
  fsdp_config_t c;
  FSDP_TRY(config_resolve(cfg, &c));
  /* out is the caller's struct, as large as cfg says: an older header's is
   * shorter than ours, and writing all of ours would overrun it. */
  c.size = cfg->size;
  memcpy(out, &c, cfg->size);
  return FSDP_SUCCESS;
}

/* The shard group (HSDP: R replica groups x S ranks): shard group g holds
 * the consecutive ranks [g*S, (g+1)*S), replica group k the ranks equal to k
 * mod S. shard_size is resolved in e->conf.cfg. */
static fsdp_status_t shard_groups(struct fsdp_engine *e) {
  int s = e->conf.cfg.shard_size ? e->conf.cfg.shard_size : e->conf.nranks;
  if (e->conf.nranks % s != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "config.shard_size %d does not divide the world "
                      "of %d ranks: choose a divisor (e.g. the ranks per node, %d)",
                      s, e->conf.nranks, fsdp_world_local_size(e->conf.world));
  if (e->conf.cfg.strategy == FSDP_NO_SHARD && s != e->conf.nranks)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "config.shard_size %d with strategy noshard: "
                      "NO_SHARD replicates over the whole world; shard_size applies to zero2 "
                      "and zero3", s);
  e->conf.cfg.shard_size = s;
  e->conf.shard_world = e->conf.cfg.strategy == FSDP_NO_SHARD ? 1 : s;
  e->conf.shard_rank = e->conf.shard_world == 1 ? 0 : e->conf.rank % e->conf.shard_world;
  e->conf.hybrid = e->conf.shard_world > 1 && e->conf.shard_world < e->conf.nranks;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_conf_init(struct fsdp_engine *e, fsdp_world_t world,
                                    const fsdp_config_t *cfg) {
  fsdp_config_t resolved = FSDP_CONFIG_INIT;
  if (cfg) FSDP_TRY(config_resolve(cfg, &resolved));
  const fsdp_config_t *c = &resolved;
  e->conf.world = world;
  e->conf.cfg = *c;
  e->conf.rank = fsdp_world_rank(world);
  e->conf.nranks = fsdp_world_size(world);
  e->conf.bf16_reduce = c->reduce_dtype == FSDP_BF16;
  /* Alone with one micro-batch a step's reduction is the identity (scale 1,
   * nothing on the wire): views hand out the fp32 gradient shard itself, zero
   * since the last step, and there is no gradient buffer, no zeroing of one
   * and no accumulation pass (2 GB a step of HBM traffic at GPT-2 124M). */
  e->conf.direct_grads = e->conf.nranks == 1 && c->grad_accum == 1;
  /* A caller compiled before the guard's stats fields passes a config that
   * ends before max_consecutive_skips, and a smaller fsdp_step_stats_t: the
   * step writes only the fields its header had. */
  e->conf.stats_bytes = cfg && cfg->size <= offsetof(fsdp_config_t, max_consecutive_skips)
                       ? offsetof(fsdp_step_stats_t, skipped)
                       : sizeof(fsdp_step_stats_t);
  FSDP_TRY(shard_groups(e));
  if (c->comm_backend && !(e->conf.comm_backend = fsdp_strdup(c->comm_backend)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  e->conf.cfg.comm_backend = e->conf.comm_backend;
  return FSDP_SUCCESS;
}

void fsdp_engine_conf_free(struct fsdp_engine *e) { free(e->conf.comm_backend); }

void *fsdp_engine_alloc(const struct fsdp_engine *e, size_t bytes) {
  void *p = NULL;
  const fsdp_device_kind_t kind = e->dev.ops->device;
  if (fsdp_device_alloc(kind, bytes, &p) != FSDP_SUCCESS) return NULL;
  if (!fsdp_engine_on_host(e) && fsdp_device_zero(p, bytes, FSDP_HOST_STREAM) != FSDP_SUCCESS) {
    fsdp_device_free(kind, p);
    return NULL;
  }
  return p; /* fsdp_alloc zeroes host memory */
}

void fsdp_engine_free(const struct fsdp_engine *e, void *p) {
  fsdp_device_free(e->dev.ops->device, p);
}

fsdp_status_t fsdp_engine_zero(const struct fsdp_engine *e, void *p, size_t bytes) {
  if (fsdp_engine_on_host(e)) return memset(p, 0, bytes), FSDP_SUCCESS;
  return fsdp_device_zero(p, bytes, e->dev.s_compute);
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

fsdp_status_t fsdp_engine_shard_batch(fsdp_engine_t e, int64_t global_batch,
                                      int64_t *micro_batch, int64_t *offset) {
  FSDP_TRY(fsdp_engine_check_live(e));
  int64_t parts = (int64_t)e->conf.nranks * e->conf.cfg.grad_accum;
  if (global_batch <= 0 || global_batch % parts != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "global batch %lld is not divisible by world size %d x grad_accum %d = "
                      "%lld: choose a multiple of %lld", (long long)global_batch, e->conf.nranks,
                      e->conf.cfg.grad_accum, (long long)parts, (long long)parts);
  int64_t mb = global_batch / parts;
  if (micro_batch) *micro_batch = mb;
  if (offset) *offset = mb * e->conf.rank;
  return FSDP_SUCCESS;
}

int fsdp_engine_num_units(fsdp_engine_t e) { return e ? e->plan.n_units : -1; }
int64_t fsdp_engine_step_count(fsdp_engine_t e) { return e ? e->optim.step : -1; }
const fsdp_config_t *fsdp_engine_config(fsdp_engine_t e) { return e ? &e->conf.cfg : NULL; }
fsdp_world_t fsdp_engine_world(fsdp_engine_t e) { return e ? e->conf.world : NULL; }
fsdp_comm_t fsdp_engine_comm(fsdp_engine_t e) { return e ? e->comm.comm_host : NULL; }
fsdp_stream_t fsdp_engine_stream(fsdp_engine_t e) {
  return e ? e->dev.s_compute : FSDP_HOST_STREAM;
}
