/* src/engine/units.c — the unit registry: tensors checked and laid end to end
 * into a unit's flat buffer (fsdp_unit_add), per-unit choices resolved
 * against the config (fsdp_unit_add_opts), and lookups by unit index and
 * tensor name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

const struct tensor *fsdp_tensor_find(const struct fsdp_engine *e, const char *name,
                                      int *unit, int *index) {
  for (int u = 0; u < e->plan.n_units; u++)
    for (int t = 0; t < e->plan.units[u].n_tensors; t++)
      if (strcmp(e->plan.units[u].tensors[t].name, name) == 0) {
        if (unit) *unit = u;
        if (index) *index = t;
        return &e->plan.units[u].tensors[t];
      }
  return NULL;
}

static fsdp_status_t tensor_check(const struct fsdp_engine *e, const char *unit_name,
                                  const fsdp_tensor_desc_t *descs, int i, size_t *numel) {
  const fsdp_tensor_desc_t *d = &descs[i];
  if (!d->name || !d->name[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s': tensor %d has no name",
                      unit_name, i);
  if (fsdp_tensor_find(e, d->name, NULL, NULL))
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
  u->sched.param_ptrs = calloc((size_t)n, sizeof *u->sched.param_ptrs);
  u->sched.grad_ptrs = calloc((size_t)n, sizeof *u->sched.grad_ptrs);
  if (!u->name || !u->kind || !u->tensors || !u->sched.param_ptrs || !u->sched.grad_ptrs)
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
    t->lr_mult = t->wd_mult = 1.0f;
    u->numel += numel;
  }
  u->sched.slot = u->sched.held = u->sched.gslot = u->own_slot = -1;
  FSDP_TRY(fsdp_event_create(&u->sched.ready));
  FSDP_TRY(fsdp_event_create(&u->sched.replicated));
  return fsdp_event_create(&u->sched.reduced);
}

/* Written as !(x >= 0) so that NaN fails too. */
static fsdp_status_t mults_check(const char *unit, const fsdp_tensor_desc_t *descs, int n,
                                 const float *mult, const char *field) {
  for (int i = 0; mult && i < n; i++)
    if (!(mult[i] >= 0.0f) || mult[i] == INFINITY)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s': %s[%d] (tensor '%s') is %g; a "
                        "multiplier must be finite and >= 0", unit, field, i,
                        descs[i].name ? descs[i].name : "(unnamed)", (double)mult[i]);
  return FSDP_SUCCESS;
}

/* The caller's options with unset fields resolved against the engine config. */
static fsdp_status_t opts_resolve(const struct fsdp_engine *e, const char *name,
                                  const fsdp_tensor_desc_t *descs, int n,
                                  const fsdp_unit_opts_t *in, fsdp_unit_opts_t *o) {
  fsdp_unit_opts_t d = FSDP_UNIT_OPTS_INIT;
  *o = d;
  if (in) FSDP_TRY(fsdp_opts_import(o, in, sizeof *o, FSDP_UNIT_OPTS_MAGIC, "fsdp_unit_opts_t",
                                    "FSDP_UNIT_OPTS_INIT"));
  if (o->reshard_after_forward < -1 || o->reshard_after_forward > 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s': reshard_after_forward %d is not "
                      "-1 (the strategy's), 0 or 1", name, o->reshard_after_forward);
  if (o->reshard_after_forward < 0)
    o->reshard_after_forward = e->conf.cfg.strategy == FSDP_FULL_SHARD;
  if (o->param_dtype == FSDP_DTYPE_UNSET) o->param_dtype = e->conf.cfg.param_dtype;
  if (o->param_dtype != FSDP_F32 && o->param_dtype != FSDP_BF16 && o->param_dtype != FSDP_F16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s': param_dtype %s: parameters are "
                      "gathered in f32, bf16 or f16", name, fsdp_dtype_name(o->param_dtype));
  FSDP_TRY(mults_check(name, descs, n, o->lr_mult, "lr_mult"));
  return mults_check(name, descs, n, o->wd_mult, "wd_mult");
}

static void opts_apply(const struct fsdp_engine *e, struct unit *u, const fsdp_unit_opts_t *o) {
  u->reshard = o->reshard_after_forward;
  u->lowp = o->param_dtype == FSDP_BF16 || o->param_dtype == FSDP_F16;
  u->lp_dtype = o->param_dtype;
  u->widen = u->lowp && fsdp_engine_on_host(e);
  for (int i = 0; i < u->n_tensors; i++) {
    if (o->lr_mult) u->tensors[i].lr_mult = o->lr_mult[i];
    if (o->wd_mult) u->tensors[i].wd_mult = o->wd_mult[i];
  }
}

fsdp_status_t fsdp_unit_add(fsdp_engine_t e, const char *name, const char *kind,
                            const fsdp_tensor_desc_t *tensors, int n_tensors,
                            fsdp_unit_t *unit) {
  return fsdp_unit_add_opts(e, name, kind, tensors, n_tensors, NULL, unit);
}

fsdp_status_t fsdp_unit_add_opts(fsdp_engine_t e, const char *name, const char *kind,
                                 const fsdp_tensor_desc_t *tensors, int n_tensors,
                                 const fsdp_unit_opts_t *opts, fsdp_unit_t *unit) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "unit '%s' added after fsdp_engine_materialize: add every unit first",
                      name ? name : "(null)");
  if (!name || !name[0] || !tensors || n_tensors < 1 || !unit)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_unit_add: a unit needs a name, at least one tensor (got %d) and "
                      "an output handle", n_tensors);
  for (int i = 0; i < e->plan.n_units; i++)
    if (strcmp(e->plan.units[i].name, name) == 0)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "unit '%s' is already registered", name);
  fsdp_unit_opts_t o;
  FSDP_TRY(opts_resolve(e, name, tensors, n_tensors, opts, &o));
  if (e->plan.n_units == e->plan.cap_units) {
    int cap = e->plan.cap_units ? 2 * e->plan.cap_units : 16;
    struct unit *grown = realloc(e->plan.units, (size_t)cap * sizeof *grown);
    if (!grown) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "unit '%s': out of host memory", name);
    e->plan.units = grown;
    e->plan.cap_units = cap;
  }
  struct unit *u = &e->plan.units[e->plan.n_units];
  memset(u, 0, sizeof *u);
  fsdp_status_t st = unit_fill(e, u, name, kind, tensors, n_tensors);
  if (st != FSDP_SUCCESS) {
    fsdp_unit_free(e, u);
    return st;
  }
  opts_apply(e, u, &o);
  *unit = e->plan.n_units++;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_get(fsdp_engine_t e, fsdp_unit_t unit, const char *what,
                            struct unit **u) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: engine is NULL", what);
  if (unit < 0 || unit >= e->plan.n_units)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: unit %d does not exist (%d units)", what,
                      unit, e->plan.n_units);
  *u = &e->plan.units[unit];
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_info(fsdp_engine_t e, fsdp_unit_t unit, fsdp_unit_info_t *info) {
  struct unit *u = NULL;
  FSDP_TRY(fsdp_unit_get(e, unit, "fsdp_unit_info", &u));
  if (!info) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_unit_info: info is NULL");
  *info = (fsdp_unit_info_t){u->name, u->kind, u->n_tensors, u->numel, u->padded, u->shard,
                             u->shard_offset, u->reshard, u->lp_dtype};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_find_tensor(fsdp_engine_t e, const char *name, fsdp_unit_t *unit,
                                      int *index) {
  if (!e || !name)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_find_tensor: NULL argument");
  if (!fsdp_tensor_find(e, name, unit, index))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "no tensor named '%s'", name);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_tensor(fsdp_engine_t e, fsdp_unit_t unit, int index,
                               fsdp_tensor_info_t *info) {
  struct unit *u = NULL;
  FSDP_TRY(fsdp_unit_get(e, unit, "fsdp_unit_tensor", &u));
  if (index < 0 || index >= u->n_tensors || !info)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_unit_tensor('%s'): tensor %d does not exist (%d tensors) or info is "
                      "NULL", u->name, index, u->n_tensors);
  const struct tensor *t = &u->tensors[index];
  *info = (fsdp_tensor_info_t){t->name, t->ndim, {0}, t->numel, t->offset, t->no_decay,
                               t->lr_mult, t->wd_mult};
  memcpy(info->shape, t->shape, sizeof info->shape);
  return FSDP_SUCCESS;
}

void fsdp_unit_free(const struct fsdp_engine *e, struct unit *u) {
  for (int t = 0; t < u->n_tensors; t++) free(u->tensors[t].name);
  free(u->tensors);
  free(u->name);
  free(u->kind);
  free(u->sched.param_ptrs);
  free(u->sched.grad_ptrs);
  fsdp_engine_free(e, u->mem.master);
  fsdp_engine_free(e, u->mem.grad);
  fsdp_engine_free(e, u->mem.m);
  fsdp_engine_free(e, u->mem.v);
  fsdp_engine_free(e, u->mem.decay_runs);
  fsdp_engine_free(e, u->mem.full_grad);
  fsdp_engine_free(e, u->mem.lp);
  fsdp_engine_free(e, u->mem.rounded);
  for (int i = 0; i < 4; i++) fsdp_free(u->mem.mirror[i]);
  fsdp_event_destroy(u->sched.ready);
  fsdp_event_destroy(u->sched.reduced);
  fsdp_event_destroy(u->sched.replicated);
}

void fsdp_engine_units_free(struct fsdp_engine *e) {
  for (int i = 0; i < e->plan.n_units; i++) fsdp_unit_free(e, &e->plan.units[i]);
  free(e->plan.units);
}
