/* src/backend/cpu/optim.c — the CPU AdamW and SGD update kernels over flat
 * fp32 shards (fsdp/optim.h's fsdp_adamw_update and fsdp_sgd_update). */
#include <math.h>

#include "fsdp/optim.h"

void fsdp_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                       const fsdp_optim_config_t *c, float lr, int64_t t, int decay) {
  /* t < 1 would divide by a zero bias correction and write NaN everywhere. */
  if (t < 1) t = 1;
  const float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
  const double bc1 = 1.0 - pow((double)b1, (double)t);
  const double bc2 = 1.0 - pow((double)b2, (double)t);
  const float step_size = (float)(lr / bc1);
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  const float keep = decay ? 1.0f - lr * c->weight_decay : 1.0f;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * keep - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

/* Each momentum case gets its own branch-free loop so that GCC vectorises it. */
void fsdp_sgd_update(float *param, const float *grad, float *buf, size_t n,
                     const fsdp_optim_config_t *c, float lr, int first, int decay) {
  const float wd = decay ? c->weight_decay : 0.0f;
  const float mu = c->momentum;
  /* A missing buffer with momentum on breaks the contract; plain SGD beats a
   * crash inside the optimizer step. */
  if (mu == 0.0f || !buf) {
    for (size_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
  } else if (first && c->nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      buf[i] = g;
      param[i] -= lr * (g + mu * g);
    }
  } else if (first) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      buf[i] = g;
      param[i] -= lr * g;
    }
  } else if (c->nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float b = mu * buf[i] + g;
      buf[i] = b;
      param[i] -= lr * (g + mu * b);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float b = mu * buf[i] + grad[i] + wd * param[i];
      buf[i] = b;
      param[i] -= lr * b;
    }
  }
}
