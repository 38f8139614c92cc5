/* src/engine/step.c — the optimizer step on this rank's shards: wait for the
 * reductions, the global gradient norm (one all-reduce of the shard sums of
 * squares, which also carries the numerics guard's flags), skipping steps with
 * non-finite loss or gradients, the dynamic loss scale, clipping, the
 * learning-rate schedule and the update: AdamW over each unit in one call
 * (weight decay per run of tensors sharing a no_decay flag), SGD and units with
 * parameter groups tensor piece by tensor piece. Every kernel is the compute
 * table's (backend/compute.h), so CPU and CUDA run this same code. The step
 * counts, the guard and the scaler are this file's (engine_internal.h's
 * engine_optim), set again by a loader (fsdp_engine_set_step, after it wrote
 * shards: their host copies go to the device, the 16-bit copies follow). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_names.h"
#include "engine/engine_internal.h"

static fsdp_status_t step_ready(struct fsdp_engine *e) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_step before fsdp_engine_materialize");
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].sched.held >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_step while unit '%s' is acquired",
                        e->plan.units[i].name);
  if (e->sched.phase != PHASE_IDLE)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "fsdp_engine_step in the middle of a %s pass: finish it first",
                      e->sched.phase == PHASE_FORWARD ? "forward" : "backward");
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].sched.bwd_count != e->conf.cfg.grad_accum)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "fsdp_engine_step before backward: unit '%s' has had %d of %d backward "
                        "passes (config.grad_accum) since the last step", e->plan.units[i].name,
                        e->plan.units[i].sched.bwd_count, e->conf.cfg.grad_accum);
  return FSDP_SUCCESS;
}

/* Each unit's sum of squares of this rank's real gradient elements (padding
 * never counts) into norm_dev, on the compute stream. */
static fsdp_status_t shard_sums(const struct fsdp_engine *e) {
  FSDP_TRY(fsdp_device_zero(e->pools.norm_dev, (size_t)e->plan.n_units * sizeof(double),
                            e->dev.s_compute));
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].count)
      FSDP_TRY(e->dev.ops->sum_squares(
          &(fsdp_sum_squares_args_t){
              .out = e->pools.norm_dev + i,
              .partials = e->dev.ops->sum_squares_partials ? e->pools.norm_dev + e->plan.n_units
                                                           : NULL,
              .x = e->plan.units[i].mem.grad,
              .n = e->plan.units[i].count},
          e->dev.s_compute));
  return FSDP_SUCCESS;
}

/* Their total: the sums copied back (CUDA: the step's one synchronisation)
 * and added in unit order. */
static fsdp_status_t shard_sumsq(struct fsdp_engine *e, double *total) {
  const size_t bytes = (size_t)e->plan.n_units * sizeof(double);
  *total = 0.0;
  FSDP_TRY(fsdp_engine_kclass_begin(e, FSDP_KC_GRAD_NORM));
  const fsdp_status_t st = shard_sums(e);
  const fsdp_status_t end = fsdp_engine_kclass_end(e, FSDP_KC_GRAD_NORM); /* closed either way */
  FSDP_TRY(st);
  FSDP_TRY(end);
  FSDP_TRY(fsdp_device_copy(e->pools.norm_host, e->pools.norm_dev, bytes, e->dev.s_compute));
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute));
  for (int i = 0; i < e->plan.n_units; i++) *total += e->pools.norm_host[i];
  return FSDP_SUCCESS;
}

struct update_ctx {
  const struct fsdp_engine *e;
  const struct unit *u;
  float lr, coef;
  fsdp_status_t st; /* the first failure */
};

static void update_segment(const struct tensor *t, size_t first, size_t n, size_t flat,
                           void *arg) {
  (void)first;
  struct update_ctx *c = arg;
  /* Parameter groups: the tensor's multipliers of lr and weight decay. */
  fsdp_optim_config_t o_t = c->e->conf.cfg.optim;
  const fsdp_optim_config_t *o = &o_t;
  o_t.weight_decay *= t->wd_mult;
  const float lr = c->lr * t->lr_mult;
  size_t k = flat - c->u->shard_offset;
  const fsdp_compute_ops_t *ops = c->e->dev.ops;
  const fsdp_stream_t s = c->e->dev.s_compute;
  float *p = c->u->mem.master + k, *g = c->u->mem.grad + k;
  fsdp_status_t st = FSDP_SUCCESS;
  if (c->coef != 1.0f) st = ops->scale(&(fsdp_scale_args_t){.x = g, .alpha = c->coef, .n = n}, s);
  /* AdamW comes here only for units with parameter groups (update_unit):
   * one run, the piece's, its gradient already scaled. */
  if (st == FSDP_SUCCESS && o->kind == FSDP_OPTIM_ADAMW)
    st = ops->adamw_multi(&(fsdp_adamw_args_t){.param = p, .grad = g, .m = c->u->mem.m + k,
                                                .v = c->u->mem.v + k, .n = n,
                                                .runs = c->e->pools.piece_runs + !t->no_decay,
                                                .n_runs = 1, .coef = 1.0f, .c = o, .lr = lr,
                                                .t = c->e->optim.optim_step + 1},
                          s);
  else if (st == FSDP_SUCCESS)
    st = ops->sgd_update(&(fsdp_sgd_args_t){.param = p, .grad = g,
                                            .buf = c->u->mem.m ? c->u->mem.m + k : NULL, .n = n,
                                            .c = o, .lr = lr,
                                            .first = c->e->optim.optim_step == 0,
                                            .decay = !t->no_decay},
                         s);
  if (c->st == FSDP_SUCCESS) c->st = st;
}

/* A tensor of u has an lr or weight-decay multiplier other than 1. */
static int has_groups(const struct unit *u) {
  for (int i = 0; i < u->n_tensors; i++)
    if (u->tensors[i].lr_mult != 1.0f || u->tensors[i].wd_mult != 1.0f) return 1;
  return 0;
}

/* AdamW over the whole unit in one call (decay_runs; one launch on CUDA),
 * which also writes the 16-bit copy: units without parameter groups. */
static int whole_unit_adamw(const struct fsdp_engine *e, const struct unit *u) {
  return e->conf.cfg.optim.kind == FSDP_OPTIM_ADAMW && !has_groups(u);
}

/* The optimizer on u's shard: whole_unit_adamw, else tensor piece by piece. */
static fsdp_status_t update_unit(const struct fsdp_engine *e, const struct unit *u, float lr,
                                 float coef) {
  if (whole_unit_adamw(e, u))
    return e->dev.ops->adamw_multi(
        &(fsdp_adamw_args_t){.param = u->mem.master, .grad = u->mem.grad, .m = u->mem.m,
                             .v = u->mem.v, .param_lp = u->lowp ? u->mem.lp : NULL,
                             .lp_dtype = u->lp_dtype, .n = u->count, .runs = u->mem.decay_runs,
                             .n_runs = u->mem.n_runs, .coef = coef, .c = &e->conf.cfg.optim,
                             .lr = lr, .t = e->optim.optim_step + 1},
        e->dev.s_compute);
  struct update_ctx ctx = {e, u, lr, coef, FSDP_SUCCESS};
  fsdp_unit_segments(u, u->shard_offset, u->shard_offset + u->count, update_segment, &ctx);
  return ctx.st;
}

/* What the ranks agree on before updating: the global sum of squares of the
 * (scaled) gradients and how many ranks saw a non-finite loss or gradient
 * shard. One all-reduce, the norm's, carries all three; only one copy of the
 * model adds its sums: the first shard group (ranks below shard_world: every
 * rank under FSDP, rank 0 under NO_SHARD, shard group 0 under HSDP, whose
 * replicas hold the same gradient shards). */
struct guard {
  double sumsq, bad_loss, bad_grad;
};

static fsdp_status_t agree(struct fsdp_engine *e, struct guard *g) {
  double local = 0.0;
  FSDP_TRY(shard_sumsq(e, &local));
  struct guard mine = {e->conf.rank < e->conf.shard_world ? local : 0.0, e->optim.loss_bad,
                       !isfinite(local)};
  *g = mine;
  if (e->conf.nranks == 1) return FSDP_SUCCESS;
  fsdp_comm_set_tag(e->comm.comm_host, "grad_norm"); /* named in timeouts and desyncs */
  double t0 = fsdp_time_now();
  FSDP_TRY(fsdp_all_reduce(e->comm.comm_host, &mine, g, 3, FSDP_F64, FSDP_SUM, FSDP_HOST_STREAM));
  /* On the timeline: it absorbs the ranks' skew, which is waiting, not compute. */
  fsdp_tl_add(e, FSDP_TL_REDUCE, -1, FSDP_BACKWARD, 0, t0, fsdp_time_now(), sizeof mine);
  return FSDP_SUCCESS;
}

/* The gradients are consumed either way: zeroed for the next accumulation. */
static fsdp_status_t clear_grads(struct fsdp_engine *e, struct unit *u) {
  u->sched.bwd_count = 0;
  FSDP_TRY(fsdp_engine_kclass_begin(e, FSDP_KC_GRAD_NORM));
  const fsdp_status_t st = fsdp_engine_zero(e, u->mem.grad, u->shard * sizeof(float));
  const fsdp_status_t end = fsdp_engine_kclass_end(e, FSDP_KC_GRAD_NORM); /* closed either way */
  return st != FSDP_SUCCESS ? st : end;
}

static fsdp_status_t update(struct fsdp_engine *e, float lr, double coef) {
  for (int i = 0; i < e->plan.n_units; i++) {
    struct unit *u = &e->plan.units[i];
    FSDP_TRY(fsdp_engine_kclass_begin(e, FSDP_KC_ADAMW));
    fsdp_status_t st = update_unit(e, u, lr, (float)coef);
    const fsdp_status_t end = fsdp_engine_kclass_end(e, FSDP_KC_ADAMW); /* closed either way */
    FSDP_TRY(st);
    FSDP_TRY(end);
    FSDP_TRY(whole_unit_adamw(e, u) ? fsdp_unit_widen_params(e, u)
                                    : fsdp_unit_refresh_params(e, u));
    FSDP_TRY(clear_grads(e, u));
    u->mem.mirror_dirty = 0; /* host copies from before the update are stale */
  }
  fsdp_engine_drop_gathers(e);
  /* The next gathers read the updated shards: they wait for the compute
   * stream to pass the update (on the CPU it already has). */
  for (int i = 0; i < e->pools.n_pslots; i++)
    FSDP_TRY(fsdp_event_record(e->pools.pslots[i].free_ev, e->dev.s_compute));
  e->optim.step++;
  e->optim.optim_step++;
  return FSDP_SUCCESS;
}

/* GradScaler's rule: back off on a skipped step, grow after an interval of
 * good ones. Without scaling (scale 1) nothing changes. */
static void scaler_update(struct fsdp_engine *e, int skipped) {
  const fsdp_config_t *c = &e->conf.cfg;
  if (c->loss_scale_init == 1.0) return;
  if (skipped) {
    e->optim.loss_scale *= c->loss_scale_backoff;
    e->optim.good_steps = 0;
  } else if (++e->optim.good_steps >= c->loss_scale_interval) {
    e->optim.loss_scale *= c->loss_scale_growth;
    e->optim.good_steps = 0;
  }
}

static fsdp_status_t skip(struct fsdp_engine *e, const struct guard *g, double norm) {
  for (int i = 0; i < e->plan.n_units; i++) FSDP_TRY(clear_grads(e, &e->plan.units[i]));
  e->optim.consecutive_skips++;
  e->optim.skipped_total++;
  if (e->optim.consecutive_skips < e->conf.cfg.max_consecutive_skips) return FSDP_SUCCESS;
  char scale[64] = "";
  if (e->conf.cfg.loss_scale_init != 1.0)
    snprintf(scale, sizeof scale, " (loss scale %g)", e->optim.loss_scale);
  return fsdp_error(FSDP_ERR_NONFINITE,
                    "fsdp_engine_step: %d steps in a row skipped for non-finite values "
                    "(config.max_consecutive_skips %d); at the last, after update %lld, the "
                    "gradient norm was %g%s and %d of %d ranks reported a non-finite loss: "
                    "training has diverged; lower the learning rate or clip gradients",
                    e->optim.consecutive_skips, e->conf.cfg.max_consecutive_skips,
                    (long long)e->optim.step, norm, scale, (int)g->bad_loss, e->conf.nranks);
}

/* The step reads every gradient shard. Worker streams are waited for here;
 * on CUDA streams the compute stream waits for each unit's last reduction
 * (and HSDP replica all-reduce), and the step's one host wait, for the
 * gradient norm, covers them. On CUDA the waits lie between two timing marks
 * on the compute stream (one FSDP_TL_COMPUTE_WAIT): how long it stalled. */
static fsdp_status_t wait_reductions(struct fsdp_engine *e) {
  /* (conf.direct_grads: no reduction was queued, the waits pass at once.) */
  size_t mark;
  FSDP_TRY(fsdp_tl_mark_begin(e, e->dev.s_compute, &mark));
  if (!fsdp_stream_cuda_handle(e->comm.s_reduce)) {
    FSDP_TRY(fsdp_stream_synchronize(e->comm.s_reduce));
    FSDP_TRY(fsdp_stream_synchronize(e->comm.s_replica));
  } else {
    for (int i = 0; i < e->plan.n_units; i++) {
      FSDP_TRY(fsdp_stream_wait_event(e->dev.s_compute, e->plan.units[i].sched.reduced));
      if (e->conf.hybrid)
        FSDP_TRY(fsdp_stream_wait_event(e->dev.s_compute, e->plan.units[i].sched.replicated));
    }
  }
  return fsdp_tl_mark_end(e, e->dev.s_compute, mark, (fsdp_tl_event_t){FSDP_TL_COMPUTE_WAIT, -1,
                          FSDP_BACKWARD, 0, 0.0, 0.0, 0});
}

static fsdp_status_t step(struct fsdp_engine *e, fsdp_step_stats_t *stats) {
  FSDP_TRY(wait_reductions(e));
  for (int i = 0; i < e->pools.n_gslots; i++) e->pools.gslots[i].busy = e->pools.gslots[i].held = 0;
  e->stats.grads_live = 0;

  struct guard g;
  FSDP_TRY(agree(e, &g));
  e->optim.loss_bad = 0;
  double scale = e->optim.loss_scale, norm = sqrt(g.sumsq) / scale, clip = 1.0;
  int skipped = g.bad_loss > 0 || g.bad_grad > 0 || !isfinite(norm);
  float max_norm = e->conf.cfg.optim.max_grad_norm;
  if (!skipped && max_norm > 0.0f && norm > max_norm) clip = max_norm / (norm + 1e-6);
  float lr = fsdp_schedule_lr(&e->conf.cfg.schedule, e->conf.cfg.optim.lr, e->optim.step);

  fsdp_status_t st = skipped ? skip(e, &g, norm) : update(e, lr, clip / scale);
  if (st != FSDP_SUCCESS && st != FSDP_ERR_NONFINITE) return st;
  if (!skipped) e->optim.consecutive_skips = 0;
  scaler_update(e, skipped);
  fsdp_step_stats_t s = {.step = e->optim.step, .lr = lr, .grad_norm = norm, .clip_coef = clip,
                         .skipped = skipped, .nonfinite_loss_ranks = (int)g.bad_loss,
                         .consecutive_skips = e->optim.consecutive_skips,
                         .skipped_total = e->optim.skipped_total, .loss_scale = scale};
  if (stats) memcpy(stats, &s, e->conf.stats_bytes);
  return st;
}

fsdp_status_t fsdp_engine_step(fsdp_engine_t e, fsdp_step_stats_t *stats) {
  FSDP_TRY(step_ready(e));
  double t0 = fsdp_time_now();
  fsdp_status_t st = step(e, stats);
  /* The streams have passed this step's collectives: their marks are read;
   * kernel-class scopes the compute stream has passed are added up. */
  if (st == FSDP_SUCCESS || st == FSDP_ERR_NONFINITE) {
    fsdp_status_t marks = fsdp_tl_resolve(e);
    if (marks == FSDP_SUCCESS) marks = fsdp_kprof_drain(e, 0);
    if (marks != FSDP_SUCCESS) st = marks;
  }
  if (st == FSDP_ERR_NONFINITE) return st; /* nothing was updated: the engine stays usable */
  if (st != FSDP_SUCCESS) return fsdp_engine_poison(e, st);
  fsdp_tl_add(e, FSDP_TL_STEP, -1, FSDP_BACKWARD, 0, t0, fsdp_time_now(), 0);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_report_loss(fsdp_engine_t e, double loss) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_report_loss: engine is NULL");
  if (!isfinite(loss)) e->optim.loss_bad = 1;
  return FSDP_SUCCESS;
}

double fsdp_engine_loss_scale(fsdp_engine_t e) { return e ? e->optim.loss_scale : -1.0; }

fsdp_status_t fsdp_engine_scaler_state(fsdp_engine_t e, double *scale, int64_t *good_steps) {
  if (!e || !scale || !good_steps)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_scaler_state: NULL argument");
  *scale = e->optim.loss_scale;
  *good_steps = e->optim.good_steps;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_set_scaler_state(fsdp_engine_t e, double scale, int64_t good_steps) {
  if (!e)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_set_scaler_state: engine is NULL");
  if (!(scale > 0.0 && scale < 1e300) || good_steps < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_set_scaler_state: scale %g must "
                      "be finite and > 0, good_steps %lld >= 0", scale, (long long)good_steps);
  if (e->conf.cfg.loss_scale_init == 1.0 && scale != 1.0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_set_scaler_state: scale %g, but "
                      "this engine has no loss scaling (config.loss_scale_init 1)", scale);
  e->optim.loss_scale = scale;
  e->optim.good_steps = good_steps;
  return FSDP_SUCCESS;
}

void fsdp_engine_optim_init(struct fsdp_engine *e) {
  e->optim.loss_scale = e->conf.cfg.loss_scale_init;
}

fsdp_status_t fsdp_engine_set_step(fsdp_engine_t e, int64_t step) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->plan.materialized) /* no shards to refresh from */
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "fsdp_engine_set_step before fsdp_engine_materialize");
  if (step < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_set_step: step %lld is negative",
                      (long long)step);
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].sched.held >= 0 || e->plan.units[i].sched.bwd_count > 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "fsdp_engine_set_step while unit '%s' is %s: finish the step first",
                        e->plan.units[i].name,
                        e->plan.units[i].sched.held >= 0 ? "acquired" : "holding gradients");
  fsdp_engine_drop_gathers(e);
  for (int i = 0; i < e->plan.n_units; i++) {
    struct unit *u = &e->plan.units[i];
    if (u->mem.mirror_dirty) FSDP_TRY(fsdp_unit_host_copies_write_back(u));
    FSDP_TRY(fsdp_unit_refresh_params(e, u));
  }
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute));
  e->optim.step = e->optim.optim_step = step;
  /* A loaded state starts a new trajectory: a loss reported for the abandoned
   * step, and skips counted before, no longer count. */
  e->optim.loss_bad = 0;
  e->optim.consecutive_skips = 0;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_set_optim_step(fsdp_engine_t e, int64_t step) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (step < 0 || step > e->optim.step)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_set_optim_step: step %lld is not "
                      "in [0, %lld] (the engine's step)",
                      (long long)step, (long long)e->optim.step);
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].sched.bwd_count > 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_set_optim_step while unit '%s' "
                        "holds gradients: finish the step first", e->plan.units[i].name);
  e->optim.optim_step = step;
  return FSDP_SUCCESS;
}
