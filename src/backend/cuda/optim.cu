/* src/backend/cuda/optim.cu — the optimizer step on a flat fp32 shard: AdamW over a
 * whole unit in one launch (decay per run of tensors, clipping folded in) and
 * SGD (the semantics of src/backend/cpu/optim.c, scalars prepared on the host as
 * there), and the deterministic sum of squares behind the global norm. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

#define GRID_STRIDE(i, n)                                                           \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);           \
       i += (size_t)gridDim.x * blockDim.x)

/* The decay flag of element i of a shard: runs[r] = start << 1 | decay, starts
 * ascending from 0; the last run starting at or before i holds it. */
__device__ __forceinline__ bool run_decays(const unsigned long long *runs, int n_runs, size_t i) {
  int lo = 0, hi = n_runs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if ((size_t)(runs[mid] >> 1) <= i) lo = mid;
    else hi = mid - 1;
  }
  return runs[lo] & 1ull;
}

/* The 16-bit copy AdamW writes beside the fp32 parameters (none, bf16, fp16). */
enum adamw_lp { LP_NONE, LP_BF16, LP_F16 };

/* AdamW over a whole shard in one launch: the clipping factor and each
 * tensor's decay flag folded in (what the per-tensor path does with a scale
 * launch and one update launch per tensor piece), expression for expression;
 * LP also writes the updated value rounded, as the cast kernel would. */
template <int LP>
__global__ void adamw_multi_kernel(float *param, uint16_t *lp, const float *grad, float *m,
                                   float *v, size_t n, const unsigned long long *runs, int n_runs,
                                   float coef, float b1, float b2, float eps, float step_size,
                                   float inv_sqrt_bc2, float keep_decay) {
  GRID_STRIDE(i, n) {
    const float g = coef != 1.0f ? grad[i] * coef : grad[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    const float keep = run_decays(runs, n_runs, i) ? keep_decay : 1.0f;
    m[i] = mi;
    v[i] = vi;
    const float p = param[i] * keep - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    param[i] = p;
    if (LP == LP_BF16) lp[i] = fsdp_bf16_bits(p);
    if (LP == LP_F16) lp[i] = fsdp_f16_bits(p);
  }
}

fsdp_status_t fsdp_cuda_adamw_multi(const fsdp_adamw_args_t *a, fsdp_stream_t s) {
  CUDA_STREAM(stream, s, "adamw_multi");
  const fsdp_optim_config_t *c = a->c;
  const size_t n = a->n;
  const float lr = a->lr;
  int64_t t = a->t;
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "AdamW update: NULL config");
  if (a->param_lp && a->lp_dtype != FSDP_BF16 && a->lp_dtype != FSDP_F16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "AdamW update: a 16-bit copy of dtype %s "
                      "(bf16 or f16)", fsdp_dtype_name(a->lp_dtype));
  if (n == 0) return FSDP_SUCCESS;
  if (!a->runs || a->n_runs < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "AdamW update: %zu elements but no decay runs",
                      n);
  if (t < 1) t = 1;
  const double bc1 = 1.0 - pow((double)c->beta1, (double)t);
  const double bc2 = 1.0 - pow((double)c->beta2, (double)t);
  const float step_size = (float)(lr / bc1);
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  const float keep_decay = 1.0f - lr * c->weight_decay;
  /* the launch's arguments by value: the simulator's launch reads them when
   * the kernel runs, after a caller's descriptor may be gone */
  float *param = a->param, *grad = a->grad, *m = a->m, *v = a->v;
  uint16_t *lp = static_cast<uint16_t *>(a->param_lp);
  const unsigned long long *runs = a->runs;
  const int n_runs = a->n_runs;
  const float coef = a->coef, b1 = c->beta1, b2 = c->beta2, eps = c->eps;
  const unsigned grid = fsdp_grid(n, FSDP_CUDA_BLOCK);
  if (!lp)
    FSDP_LAUNCH(adamw_multi_kernel<LP_NONE>, grid, FSDP_CUDA_BLOCK, 0, stream, param, lp, grad, m,
                v, n, runs, n_runs, coef, b1, b2, eps, step_size, inv_sqrt_bc2, keep_decay);
  else if (a->lp_dtype == FSDP_BF16)
    FSDP_LAUNCH(adamw_multi_kernel<LP_BF16>, grid, FSDP_CUDA_BLOCK, 0, stream, param, lp, grad, m,
                v, n, runs, n_runs, coef, b1, b2, eps, step_size, inv_sqrt_bc2, keep_decay);
  else
    FSDP_LAUNCH(adamw_multi_kernel<LP_F16>, grid, FSDP_CUDA_BLOCK, 0, stream, param, lp, grad, m,
                v, n, runs, n_runs, coef, b1, b2, eps, step_size, inv_sqrt_bc2, keep_decay);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* The CPU's five SGD cases; mode is uniform over the launch. */
enum sgd_mode { SGD_PLAIN, SGD_FIRST_NESTEROV, SGD_FIRST, SGD_NESTEROV, SGD_MOMENTUM };

__global__ void sgd_kernel(float *param, const float *grad, float *buf, size_t n, float lr,
                           float wd, float mu, int mode) {
  GRID_STRIDE(i, n) {
    const float g = grad[i] + wd * param[i];
    switch (mode) {
    case SGD_PLAIN:
      param[i] -= lr * g;
      break;
    case SGD_FIRST_NESTEROV:
      buf[i] = g;
      param[i] -= lr * (g + mu * g);
      break;
    case SGD_FIRST:
      buf[i] = g;
      param[i] -= lr * g;
      break;
    case SGD_NESTEROV: {
      const float b = mu * buf[i] + g;
      buf[i] = b;
      param[i] -= lr * (g + mu * b);
      break;
    }
    default: { /* SGD_MOMENTUM: the CPU adds grad and decay to mu * buf in this order */
      const float b = mu * buf[i] + grad[i] + wd * param[i];
      buf[i] = b;
      param[i] -= lr * b;
    }
    }
  }
}

fsdp_status_t fsdp_cuda_sgd_update(const fsdp_sgd_args_t *a, fsdp_stream_t s) {
  CUDA_STREAM(stream, s, "sgd_update");
  const fsdp_optim_config_t *c = a->c;
  const size_t n = a->n;
  const float *grad = a->grad;
  float *param = a->param, *buf = a->buf;
  const int first = a->first, decay = a->decay;
  const float lr = a->lr;
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "SGD update: NULL config");
  if (n == 0) return FSDP_SUCCESS;
  const float wd = decay ? c->weight_decay : 0.0f, mu = c->momentum;
  const int mode = mu == 0.0f || !buf      ? SGD_PLAIN
                   : first && c->nesterov ? SGD_FIRST_NESTEROV
                   : first                ? SGD_FIRST
                   : c->nesterov          ? SGD_NESTEROV
                                          : SGD_MOMENTUM;
  FSDP_LAUNCH(sgd_kernel, fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, stream, param, grad,
              buf, n, lr, wd, mu, mode);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- sum of squares ----
 * Pass 1: nb blocks, nb a function of n alone; each thread sums squares over a
 * grid stride in double, the block adds its threads in a fixed tree order into
 * partials[block]. Pass 2: one block adds the nb partials the same way. The
 * same n gives the same grid and the same order on every run and device. */
#define SUMSQ_BLOCK 256
#define SUMSQ_PER_THREAD 16 /* elements a thread covers before another block is added */

__global__ void sum_squares_kernel(double *partials, const float *x, size_t n) {
  FSDP_SHARED(double, shared, [32]);
  double s = 0.0;
  GRID_STRIDE(i, n) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double *out, const double *partials, int nb) {
  FSDP_SHARED(double, shared, [32]);
  double s = 0.0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) s += partials[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

fsdp_status_t fsdp_cuda_sum_squares(const fsdp_sum_squares_args_t *a, fsdp_stream_t s) {
  CUDA_STREAM(stream, s, "sum_squares");
  double *out = a->out, *partials = a->partials;
  const float *x = a->x;
  const size_t n = a->n;
  const size_t per_block = (size_t)SUMSQ_BLOCK * SUMSQ_PER_THREAD;
  const size_t want = (n + per_block - 1) / per_block;
  const int nb = (int)(want < FSDP_CUDA_SUMSQ_PARTIALS ? want : FSDP_CUDA_SUMSQ_PARTIALS);
  if (nb > 0) {
    FSDP_LAUNCH(sum_squares_kernel, nb, SUMSQ_BLOCK, 0, stream, partials, x, n);
    LAUNCH_CHECK();
  }
  /* With n = 0 this writes 0: the loop adds nothing. */
  FSDP_LAUNCH(sum_partials_kernel, 1, SUMSQ_BLOCK, 0, stream, out, partials, nb);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}
