/* src/engine/step.c — the optimizer step on this rank's shards: wait for the
 * reductions, the global gradient norm (one all-reduce of the shard sums of
 * squares), clipping, the learning-rate schedule and AdamW/SGD per tensor piece
 * (so weight decay follows each tensor's no_decay flag). */
#include <math.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "engine/engine_internal.h"
#include "fsdp_config.h"
#if FSDP_HAVE_CUDA
#include "cuda/kernels.h"
#endif

static fsdp_status_t step_ready(struct fsdp_engine *e) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_step before fsdp_engine_materialize");
  for (int i = 0; i < e->n_units; i++)
    if (e->units[i].held >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_step while unit '%s' is acquired",
                        e->units[i].name);
  if (e->phase != PHASE_IDLE)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "fsdp_engine_step in the middle of a %s pass: finish it first",
                      e->phase == PHASE_FORWARD ? "forward" : "backward");
  for (int i = 0; i < e->n_units; i++)
    if (e->units[i].bwd_count != e->cfg.grad_accum)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "fsdp_engine_step before backward: unit '%s' has had %d of %d backward "
                        "passes (config.grad_accum) since the last step", e->units[i].name,
                        e->units[i].bwd_count, e->cfg.grad_accum);
  return FSDP_SUCCESS;
}

/* Sum of squares of this rank's real gradient elements; padding never counts.
 * Units are added in order on both devices (CUDA: one sum per unit on the
 * compute stream, copied back; the step's one synchronisation). */
static fsdp_status_t shard_sumsq(const struct fsdp_engine *e, double *total) {
  *total = 0.0;
#if FSDP_HAVE_CUDA
  if (e->cuda) {
    fsdp_cuda_stream_t cs = (fsdp_cuda_stream_t)fsdp_stream_cuda_handle(e->s_compute);
    FSDP_TRY(fsdp_device_zero(e->norm_dev, (size_t)e->n_units * sizeof(double), e->s_compute));
    for (int i = 0; i < e->n_units; i++)
      if (e->units[i].count)
        FSDP_TRY(fsdp_cuda_sum_squares(e->norm_dev + i, e->norm_dev + e->n_units,
                                       e->units[i].grad, e->units[i].count, cs));
    FSDP_TRY(fsdp_device_copy(e->norm_host, e->norm_dev, (size_t)e->n_units * sizeof(double),
                              e->s_compute));
    FSDP_TRY(fsdp_stream_synchronize(e->s_compute));
    for (int i = 0; i < e->n_units; i++) *total += e->norm_host[i];
    return FSDP_SUCCESS;
  }
#endif
  for (int i = 0; i < e->n_units; i++) {
    const struct unit *u = &e->units[i];
    double s = 0.0;
    for (size_t k = 0; k < u->count; k++) s += (double)u->grad[k] * u->grad[k];
    *total += s;
  }
  return FSDP_SUCCESS;
}

struct update_ctx {
  const struct fsdp_engine *e;
  const struct unit *u;
  float lr, coef;
  fsdp_status_t st; /* CUDA: the first launch failure */
};

#if FSDP_HAVE_CUDA
static void update_segment_cuda(const struct tensor *t, size_t k, size_t n, struct update_ctx *c) {
  const fsdp_optim_config_t *o = &c->e->cfg.optim;
  fsdp_cuda_stream_t cs = (fsdp_cuda_stream_t)fsdp_stream_cuda_handle(c->e->s_compute);
  float *p = c->u->master + k, *g = c->u->grad + k;
  fsdp_status_t st = FSDP_SUCCESS;
  if (c->coef != 1.0f) st = fsdp_cuda_scale(g, c->coef, n, cs);
  if (st == FSDP_SUCCESS) /* SGD: AdamW takes the whole unit at once (update_unit) */
    st = fsdp_cuda_sgd_update(p, g, c->u->m ? c->u->m + k : NULL, n, o, c->lr, c->e->step == 0,
                              !t->no_decay, cs);
  if (c->st == FSDP_SUCCESS) c->st = st;
}
#endif

static void update_segment(const struct tensor *t, size_t first, size_t n, size_t flat,
                           void *arg) {
  (void)first;
  struct update_ctx *c = arg;
  const fsdp_optim_config_t *o = &c->e->cfg.optim;
  size_t k = flat - c->u->shard_offset;
#if FSDP_HAVE_CUDA
  if (c->e->cuda) {
    update_segment_cuda(t, k, n, c);
    return;
  }
#endif
  float *p = c->u->master + k, *g = c->u->grad + k;
  if (c->coef != 1.0f)
    for (size_t i = 0; i < n; i++) g[i] *= c->coef;
  if (o->kind == FSDP_OPTIM_ADAMW)
    fsdp_adamw_update(p, g, c->u->m + k, c->u->v + k, n, o, c->lr, c->e->step + 1, !t->no_decay);
  else
    fsdp_sgd_update(p, g, c->u->m ? c->u->m + k : NULL, n, o, c->lr, c->e->step == 0,
                    !t->no_decay);
}

/* The optimizer on u's shard: CUDA AdamW in one launch over the unit
 * (decay_runs), else tensor piece by tensor piece. */
static fsdp_status_t update_unit(const struct fsdp_engine *e, const struct unit *u, float lr,
                                 float coef) {
#if FSDP_HAVE_CUDA
  if (e->cuda && e->cfg.optim.kind == FSDP_OPTIM_ADAMW)
    return fsdp_cuda_adamw_multi(u->master, u->grad, u->m, u->v, u->count, u->decay_runs,
                                 u->n_runs, coef, &e->cfg.optim, lr, e->step + 1,
                                 (fsdp_cuda_stream_t)fsdp_stream_cuda_handle(e->s_compute));
#endif
  struct update_ctx ctx = {e, u, lr, coef, FSDP_SUCCESS};
  fsdp_unit_segments(u, u->shard_offset, u->shard_offset + u->count, update_segment, &ctx);
  return ctx.st;
}

static fsdp_status_t step(struct fsdp_engine *e, fsdp_step_stats_t *stats) {
  FSDP_TRY(fsdp_stream_synchronize(e->s_reduce));
  for (int i = 0; i < e->n_gslots; i++) e->gslots[i].busy = e->gslots[i].held = 0;
  e->grads_live = 0;

  double local = 0.0;
  FSDP_TRY(shard_sumsq(e, &local));
  double global = local;
  if (e->shard_world > 1) {
    fsdp_comm_set_tag(e->comm_host, "grad_norm"); /* named in timeouts and desyncs */
    double t0 = fsdp_time_now();
    FSDP_TRY(fsdp_all_reduce(e->comm_host, &local, &global, 1, FSDP_F64, FSDP_SUM,
                             FSDP_HOST_STREAM));
    /* On the timeline: it absorbs the ranks' skew, which is waiting, not compute. */
    fsdp_tl_add(e, FSDP_TL_REDUCE, -1, FSDP_BACKWARD, 0, t0, fsdp_time_now(), sizeof local);
  }
  double norm = sqrt(global), coef = 1.0;
  float max_norm = e->cfg.optim.max_grad_norm;
  if (max_norm > 0.0f && norm > max_norm) coef = max_norm / (norm + 1e-6);

  float lr = fsdp_schedule_lr(&e->cfg.schedule, e->cfg.optim.lr, e->step);
  for (int i = 0; i < e->n_units; i++) {
    struct unit *u = &e->units[i];
    FSDP_TRY(update_unit(e, u, lr, (float)coef));
    FSDP_TRY(fsdp_unit_refresh_params(e, u));
    FSDP_TRY(fsdp_engine_zero(e, u->grad, u->shard * sizeof(float)));
    u->bwd_count = 0;
    u->mirror_dirty = 0; /* host copies from before the update are stale */
  }
  fsdp_engine_drop_gathers(e);
  /* The next gathers read the updated shards: they wait for the compute
   * stream to pass the update (on the CPU it already has). */
  for (int i = 0; i < e->n_pslots; i++) FSDP_TRY(fsdp_event_record(e->pslots[i].free_ev, e->s_compute));
  e->step++;
  if (stats) *stats = (fsdp_step_stats_t){e->step, lr, norm, coef};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_step(fsdp_engine_t e, fsdp_step_stats_t *stats) {
  FSDP_TRY(step_ready(e));
  double t0 = fsdp_time_now();
  fsdp_status_t st = step(e, stats);
  if (st != FSDP_SUCCESS) return fsdp_engine_poison(e, st);
  fsdp_tl_add(e, FSDP_TL_STEP, -1, FSDP_BACKWARD, 0, t0, fsdp_time_now(), 0);
  return FSDP_SUCCESS;
}
