/* src/engine/optim.c — learning-rate schedules and validation of the optimizer
 * settings (the update kernels are in src/backend/cpu/optim.c). */
#include <math.h>

#include "core/internal.h"
#include "fsdp/optim.h"

static const double kPi = 3.14159265358979323846;

float fsdp_schedule_lr(const fsdp_schedule_t *sched, float base_lr, int64_t step) {
  if (!sched || sched->kind != FSDP_SCHED_WARMUP_COSINE) return base_lr;
  if (step < 0) step = 0;
  if (step < sched->warmup_steps)
    return (float)((double)base_lr * (double)(step + 1) / (double)sched->warmup_steps);
  double min_lr = (double)sched->min_lr_ratio * base_lr;
  if (step >= sched->total_steps) return (float)min_lr;
  double progress = (double)(step - sched->warmup_steps) /
                    (double)(sched->total_steps - sched->warmup_steps);
  return (float)(min_lr + (base_lr - min_lr) * 0.5 * (1.0 + cos(kPi * progress)));
}

fsdp_status_t fsdp_schedule_check(const fsdp_schedule_t *s) {
  if (!s) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "schedule: NULL pointer");
  if (s->kind == FSDP_SCHED_CONSTANT) return FSDP_SUCCESS;
  if (s->kind != FSDP_SCHED_WARMUP_COSINE)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "schedule: kind %d unknown (use FSDP_SCHED_CONSTANT or "
                      "FSDP_SCHED_WARMUP_COSINE)",
                      (int)s->kind);
  if (s->total_steps <= 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "schedule: total_steps %lld must be > 0 for warmup-cosine",
                      (long long)s->total_steps);
  if (s->warmup_steps < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "schedule: warmup_steps %lld must be >= 0",
                      (long long)s->warmup_steps);
  if (s->warmup_steps > s->total_steps)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "schedule: warmup_steps %lld exceeds total_steps %lld",
                      (long long)s->warmup_steps, (long long)s->total_steps);
  if (!(s->min_lr_ratio >= 0.0f && s->min_lr_ratio <= 1.0f))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "schedule: min_lr_ratio %g must be in [0, 1]",
                      (double)s->min_lr_ratio);
  return FSDP_SUCCESS;
}

/* Written as !(x in range) so that NaN fails too. */
static fsdp_status_t check_unit_interval(const char *field, float x) {
  if (!(x >= 0.0f && x < 1.0f))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "optimizer: %s %g must be in [0, 1)", field,
                      (double)x);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_nonnegative(const char *field, float x) {
  if (!(x >= 0.0f) || isinf(x))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "optimizer: %s %g must be finite and >= 0",
                      field, (double)x);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_adamw(const fsdp_optim_config_t *o) {
  FSDP_TRY(check_unit_interval("beta1", o->beta1));
  FSDP_TRY(check_unit_interval("beta2", o->beta2));
  if (!(o->eps > 0.0f) || isinf(o->eps))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "optimizer: eps %g must be finite and > 0",
                      (double)o->eps);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_sgd(const fsdp_optim_config_t *o) {
  FSDP_TRY(check_unit_interval("momentum", o->momentum));
  /* As in PyTorch: Nesterov with no momentum is plain SGD in disguise, and
   * asking for it is almost always a configuration mistake. */
  if (o->nesterov && o->momentum == 0.0f)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "optimizer: nesterov needs momentum > 0 (momentum is 0)");
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_optim_check(const fsdp_optim_config_t *o) {
  if (!o) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "optimizer: NULL config");
  if (o->kind != FSDP_OPTIM_ADAMW && o->kind != FSDP_OPTIM_SGD)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "optimizer: kind %d unknown (use FSDP_OPTIM_ADAMW or FSDP_OPTIM_SGD)",
                      (int)o->kind);
  FSDP_TRY(check_nonnegative("lr", o->lr));
  FSDP_TRY(check_nonnegative("weight_decay", o->weight_decay));
  FSDP_TRY(check_nonnegative("max_grad_norm", o->max_grad_norm));
  return o->kind == FSDP_OPTIM_ADAMW ? check_adamw(o) : check_sgd(o);
}
