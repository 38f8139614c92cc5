/* fsdp/optim.h — optimizers and learning-rate schedules on flat fp32 shards.
 *
 * The engine applies these to each rank's shard in fsdp_engine_step; they are
 * public so that users (and tests) can check them against hand-computed values
 * or drive their own state. The update kernels are elementwise: the result for an
 * element never depends on which rank holds it, so sharding cannot change it.
 * Thread safety: pure functions. */
#ifndef FSDP_OPTIM_H
#define FSDP_OPTIM_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FSDP_OPTIM_ADAMW = 0, FSDP_OPTIM_SGD } fsdp_optim_kind_t;

typedef struct {
  fsdp_optim_kind_t kind;
  float lr;            /* peak learning rate; the schedule scales it */
  float beta1, beta2;  /* AdamW moments */
  float eps;           /* AdamW denominator */
  float weight_decay;  /* AdamW: decoupled, p -= lr*wd*p; SGD: added to the grad */
  float momentum;      /* SGD; 0 = plain SGD (no state kept) */
  int nesterov;        /* SGD */
  float max_grad_norm; /* clip by the global L2 norm over all shards; 0 = off */
} fsdp_optim_config_t;

/* Defaults. A value type (also taken by the pure update functions below) and
 * frozen inside fsdp_config_t: new optimizer options are appended there. */
#define FSDP_OPTIM_CONFIG_INIT                                                       \
  {                                                                                  \
    .kind = FSDP_OPTIM_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,            \
    .eps = 1e-8f, .weight_decay = 0.0f, .momentum = 0.0f, .nesterov = 0,              \
    .max_grad_norm = 0.0f                                                            \
  }

typedef enum { FSDP_SCHED_CONSTANT = 0, FSDP_SCHED_WARMUP_COSINE } fsdp_schedule_kind_t;

typedef struct {
  fsdp_schedule_kind_t kind;
  int64_t warmup_steps; /* linear from lr/warmup_steps up to lr over these steps */
  int64_t total_steps;  /* cosine reaches min_lr_ratio*lr here, and stays */
  float min_lr_ratio;
} fsdp_schedule_t;

/* Constant learning rate. A value type, frozen like fsdp_optim_config_t. */
#define FSDP_SCHEDULE_INIT                                                           \
  { .kind = FSDP_SCHED_CONSTANT, .warmup_steps = 0, .total_steps = 0, .min_lr_ratio = 0.0f }

/* Learning rate of update number `step` (0-based). */
FSDP_API float fsdp_schedule_lr(const fsdp_schedule_t *sched, float base_lr, int64_t step);
/* Checks a schedule; FSDP_ERR_INVALID_ARGUMENT with a message when wrong. */
FSDP_API fsdp_status_t fsdp_schedule_check(const fsdp_schedule_t *sched);
FSDP_API fsdp_status_t fsdp_optim_check(const fsdp_optim_config_t *optim);

/* AdamW (Loshchilov & Hutter) with bias correction; t is the 1-based update
 * count. decay selects whether weight decay applies to these elements. */
FSDP_API void fsdp_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                                const fsdp_optim_config_t *c, float lr, int64_t t, int decay);
/* SGD with optional momentum (PyTorch semantics, no dampening): the momentum
 * buffer starts as the first gradient (first != 0). buf may be NULL when
 * c->momentum == 0. */
FSDP_API void fsdp_sgd_update(float *param, const float *grad, float *buf, size_t n,
                              const fsdp_optim_config_t *c, float lr, int first, int decay);

#ifdef __cplusplus
}
#endif
#endif
