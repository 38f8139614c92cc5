/* src/backend/cpu/compute.c — the compute tables: which one a device kind
 * gets, the check that a table fills every slot, and the CPU table. The CPU
 * table's slots unpack each descriptor into the fp32 kernels of fsdp/nn.h
 * (layers.c, llama_layers.c, gelu.c, optim.c here, which depend on nothing
 * above core),
 * called in the caller; any other dtype is refused before anything is
 * touched. The CUDA table is src/backend/cuda's entry points
 * (cuda/compute_cuda.c). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "backend/compute.h"
#include "fsdp/nn.h"
#include "fsdp/optim.h"
#include "fsdp_config.h"
#include "backend/cpu/head.h"
#include "backend/cpu/llama_layers.h"

/* Every slot's name, in the struct's order: a slot added without a name here
 * fails the static assertion below. */
static const char *const slot_names[] = {
    "head_forward",            "head_backward",            "embedding_forward",
    "embedding_backward",      "attention_state_floats",   "attention_scratch_bytes",
    "attention_forward",       "attention_backward",       "xent",
    "colsum_scratch_bytes",    "matmul_forward",           "matmul_backward",
    "layernorm_fused_forward", "layernorm_fused_backward", "relu_forward",
    "relu_backward",           "rmsnorm_forward",          "rmsnorm_backward",
    "rope_forward",            "rope_backward",            "swiglu_forward",
    "swiglu_backward",         "sum_squares",              "scale",
    "axpy",                    "cast",                     "adamw_multi",
    "sgd_update",              "prepare",                  "release",
};
typedef void (*any_fn)(void);
#define FIRST_SLOT offsetof(fsdp_compute_ops_t, head_forward)
#define N_SLOTS ((sizeof(fsdp_compute_ops_t) - FIRST_SLOT) / sizeof(any_fn))
_Static_assert(sizeof slot_names / sizeof *slot_names == N_SLOTS,
               "every slot of fsdp_compute_ops_t has a name in slot_names");

int fsdp_compute_ops_complete(const fsdp_compute_ops_t *ops, const char **missing) {
  for (size_t i = 0; i < N_SLOTS; i++) {
    any_fn f;
    memcpy(&f, (const char *)ops + FIRST_SLOT + i * sizeof f, sizeof f);
    if (!f) {
      if (missing) *missing = slot_names[i];
      return 0;
    }
  }
  return 1;
}

/* ---- the CPU table ---- */

/* fp32 on the caller's thread: another dtype, or a worker stream whose queue
 * the op would overtake, is refused with the op's name. */
static fsdp_status_t cpu_refuse(const char *op, fsdp_dtype_t dt, fsdp_stream_t s) {
  if (dt != FSDP_F32)
    return fsdp_error(FSDP_ERR_UNSUPPORTED,
                      "CPU %s: no %s kernel (the CPU kernels compute in f32; %s runs on "
                      "config.device FSDP_DEVICE_CUDA)",
                      op, fsdp_dtype_name(dt), fsdp_dtype_name(dt));
  (void)s;
  return fsdp_error(FSDP_ERR_INVALID_USAGE,
                    "CPU %s: given a worker stream; CPU kernels run in the caller, so they take "
                    "FSDP_HOST_STREAM (queue a host function on the worker to run one there)",
                    op);
}

#define CPU_OP(op, dt, s) \
  if ((dt) != FSDP_F32 || (s) != FSDP_HOST_STREAM) return cpu_refuse(op, dt, s)
#define CPU_SHARD_OP(op, s) \
  if ((s) != FSDP_HOST_STREAM) return cpu_refuse(op, FSDP_F32, s)

static fsdp_status_t cpu_head_forward(const fsdp_head_forward_args_t *a, fsdp_stream_t s) {
  CPU_OP("head_forward", a->dt, s);
  nn_head_forward(a->logits, a->ld, a->inp, a->wte, a->B, a->C, a->V);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_head_backward(const fsdp_head_backward_args_t *a, fsdp_stream_t s) {
  CPU_OP("head_backward", a->dt, s);
  nn_head_backward(a->dinp, a->dwte, a->dlogits, a->ld, a->inp, a->wte, a->B, a->C, a->V);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_embedding_forward(const fsdp_embedding_forward_args_t *a,
                                           fsdp_stream_t s) {
  CPU_OP("embedding_forward", a->dt, s);
  fsdp_embedding_forward(a->out, a->tokens, a->wte, a->wpe, a->B, a->T, a->C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_embedding_backward(const fsdp_embedding_backward_args_t *a,
                                            fsdp_stream_t s) {
  CPU_OP("embedding_backward", a->dt, s);
  fsdp_embedding_backward(a->dwte, a->dwpe, a->dout, a->tokens, a->B, a->T, a->C);
  return FSDP_SUCCESS;
}

/* The CPU keeps the probabilities, and its backward's scratch on its stack. */
static size_t cpu_attention_state_floats(const fsdp_attention_forward_args_t *a) {
  return (size_t)a->B * (size_t)a->NH * (size_t)a->T * (size_t)a->T;
}

static size_t cpu_attention_scratch_bytes(const fsdp_attention_forward_args_t *a) {
  (void)a;
  return 0;
}

/* NKV must divide NH (0: NH): a query head past the last KV head would read
 * the v heads or past the row. */
static fsdp_status_t check_kv_heads(const char *op, int NH, int NKV) {
  if (NKV < 0 || NH <= 0 || (NKV && (NKV > NH || NH % NKV)))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "CPU %s: NKV %d key/value heads must divide NH %d query heads (0: NH)",
                      op, NKV, NH);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_attention_forward(const fsdp_attention_forward_args_t *a,
                                           fsdp_stream_t s) {
  CPU_OP("attention_forward", a->dt, s);
  FSDP_TRY(check_kv_heads("attention_forward", a->NH, a->NKV));
  nn_attention_forward(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH, a->NKV);
  return FSDP_SUCCESS;
}

/* The probabilities give the softmax backward directly: no scratch, no out.
 * The layer adds into dqkv; the table's contract is to write it. */
static fsdp_status_t cpu_attention_backward(const fsdp_attention_backward_args_t *a,
                                            fsdp_stream_t s) {
  CPU_OP("attention_backward", a->dt, s);
  FSDP_TRY(check_kv_heads("attention_backward", a->NH, a->NKV));
  if (a->B <= 0 || a->T <= 0 || a->C <= 0) return FSDP_SUCCESS;
  const int nkv = a->NKV > 0 ? a->NKV : a->NH;
  memset(a->dqkv, 0, (size_t)a->B * a->T * (size_t)(a->NH + 2 * nkv) * (size_t)(a->C / a->NH) *
                         sizeof(float));
  nn_attention_backward(a->dqkv, a->dout, a->qkv, a->att, a->B, a->T, a->C, a->NH, a->NKV);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_xent(const fsdp_xent_args_t *a, fsdp_stream_t s) {
  CPU_OP("xent", a->dt, s);
  nn_xent_inplace(a->logits, a->ld, a->losses, a->targets, a->B, a->V, a->scale, a->grad);
  return FSDP_SUCCESS;
}

/* ---- fused ops: the CPU kernels composed (no scratch, same arithmetic) ---- */

static size_t cpu_colsum_scratch_bytes(int cols) {
  (void)cols;
  return 0;
}

static fsdp_status_t cpu_matmul_forward(const fsdp_matmul_forward_args_t *a, fsdp_stream_t s) {
  CPU_OP("matmul_forward", a->dt, s);
  float *y = a->pre ? a->pre : a->out;
  if (a->weight_out_in) fsdp_linear_forward(y, a->inp, a->weight, a->bias, a->B, a->C, a->OC);
  else fsdp_conv1d_forward(y, a->inp, a->weight, a->bias, a->B, a->C, a->OC);
  if (a->pre) fsdp_gelu_forward(a->out, a->pre, (size_t)a->B * (size_t)a->OC);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_matmul_backward(const fsdp_matmul_backward_args_t *a, fsdp_stream_t s) {
  CPU_OP("matmul_backward", a->dt, s);
  const size_t n = (size_t)a->B * (size_t)a->C;
  float *dinp = a->dinp;
  /* d(input) is written: the product into zeros (then times gelu'(pre)) */
  float *dx = dinp && a->gelu_pre ? calloc(n ? n : 1, sizeof(float)) : dinp;
  if (dinp && !dx)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "CPU matmul_backward: %zu floats", n);
  if (dx && dx == dinp) memset(dx, 0, n * sizeof(float)); /* calloc zeroed the other */
  if (a->weight_out_in)
    fsdp_linear_backward(dx, a->dweight, a->dbias, a->dout, a->inp, a->weight, a->B, a->C, a->OC);
  else
    fsdp_conv1d_backward(dx, a->dweight, a->dbias, a->dout, a->inp, a->weight, a->B, a->C, a->OC);
  if (dx != dinp) {
    memset(dinp, 0, n * sizeof(float));
    fsdp_gelu_backward(dinp, a->gelu_pre, dx, n);
    free(dx);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_layernorm_fused_forward(const fsdp_layernorm_forward_args_t *a,
                                                 fsdp_stream_t s) {
  CPU_OP("layernorm_fused_forward", a->dt, s);
  if (a->branch && !a->res)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "LayerNorm: a residual branch needs an output");
  const size_t n = (size_t)a->N * (size_t)a->C;
  if (a->branch) fsdp_residual_forward(a->res, a->inp, a->branch, n);
  fsdp_layernorm_forward(a->out, a->mean, a->rstd, a->branch ? a->res : a->inp, a->weight,
                         a->bias, a->N, a->C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_layernorm_fused_backward(const fsdp_layernorm_backward_args_t *a,
                                                  fsdp_stream_t s) {
  CPU_OP("layernorm_fused_backward", a->dt, s);
  fsdp_layernorm_backward(a->dinp, a->dweight, a->dbias, a->dout, a->inp, a->weight, a->mean,
                          a->rstd, a->N, a->C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_relu_forward(const fsdp_relu_forward_args_t *a, fsdp_stream_t s) {
  CPU_OP("relu_forward", a->dt, s);
  fsdp_relu_forward(a->x, a->x, a->n);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_relu_backward(const fsdp_relu_backward_args_t *a, fsdp_stream_t s) {
  CPU_OP("relu_backward", a->dt, s);
  float *d = a->dx;
  const float *o = a->out;
  for (size_t i = 0; i < a->n; i++) d[i] = o[i] > 0.0f ? d[i] : 0.0f;
  return FSDP_SUCCESS;
}

/* ---- the Llama family's layers ---- */

static fsdp_status_t cpu_rmsnorm_forward(const fsdp_rmsnorm_forward_args_t *a,
                                         fsdp_stream_t s) {
  CPU_OP("rmsnorm_forward", a->dt, s);
  if (a->branch && !a->res)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "RMSNorm: a residual branch needs an output");
  const size_t n = (size_t)a->N * (size_t)a->C;
  if (a->branch) fsdp_residual_forward(a->res, a->inp, a->branch, n);
  nn_rmsnorm_forward(a->out, a->rstd, a->branch ? a->res : a->inp, a->weight, a->N, a->C,
                     a->eps);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_rmsnorm_backward(const fsdp_rmsnorm_backward_args_t *a,
                                          fsdp_stream_t s) {
  CPU_OP("rmsnorm_backward", a->dt, s);
  nn_rmsnorm_backward(a->dinp, a->dweight, a->dout, a->inp, a->weight, a->rstd, a->N, a->C);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_rope(const char *op, const fsdp_rope_args_t *a) {
  FSDP_TRY(check_kv_heads(op, a->NH, a->NKV));
  if (a->D < 2 || a->D % 2)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "CPU %s: head dim D %d must be even and > 0",
                      op, a->D);
  if (!a->inv_freq)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "CPU %s: no inv_freq table", op);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_rope_forward(const fsdp_rope_args_t *a, fsdp_stream_t s) {
  CPU_OP("rope_forward", a->dt, s);
  FSDP_TRY(check_rope("rope_forward", a));
  nn_rope(a->qkv, a->inv_freq, a->B, a->T, a->NH, a->NKV, a->D, a->pos0, 0);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_rope_backward(const fsdp_rope_args_t *a, fsdp_stream_t s) {
  CPU_OP("rope_backward", a->dt, s);
  FSDP_TRY(check_rope("rope_backward", a));
  nn_rope(a->qkv, a->inv_freq, a->B, a->T, a->NH, a->NKV, a->D, a->pos0, 1);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_swiglu_forward(const fsdp_swiglu_forward_args_t *a, fsdp_stream_t s) {
  CPU_OP("swiglu_forward", a->dt, s);
  nn_swiglu_forward(a->out, a->inp, a->N, a->F);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_swiglu_backward(const fsdp_swiglu_backward_args_t *a,
                                         fsdp_stream_t s) {
  CPU_OP("swiglu_backward", a->dt, s);
  nn_swiglu_backward(a->dinp, a->dout, a->inp, a->N, a->F);
  return FSDP_SUCCESS;
}

/* ---- the engine's shard kernels: the loops the engine ran before the table,
 * expression for expression, so CPU results are bitwise what they were ---- */

static fsdp_status_t cpu_sum_squares(const fsdp_sum_squares_args_t *a, fsdp_stream_t s) {
  CPU_SHARD_OP("sum_squares", s);
  const float *x = a->x;
  double acc = 0.0;
  for (size_t i = 0; i < a->n; i++) acc += (double)x[i] * x[i];
  *a->out = acc;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_scale(const fsdp_scale_args_t *a, fsdp_stream_t s) {
  CPU_SHARD_OP("scale", s);
  float *x = a->x;
  const float alpha = a->alpha;
  for (size_t i = 0; i < a->n; i++) x[i] *= alpha;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_axpy(const fsdp_axpy_args_t *a, fsdp_stream_t s) {
  if (a->xdt != FSDP_F32 && a->xdt != FSDP_BF16) return cpu_refuse("axpy", a->xdt, s);
  CPU_SHARD_OP("axpy", s);
  float *restrict y = a->y;
  const float alpha = a->alpha;
  const size_t n = a->n;
  if (a->xdt == FSDP_BF16)
    for (size_t i = 0; i < n; i++) y[i] += alpha * fsdp_bf16_to_f32(((const uint16_t *)a->x)[i]);
  else
    for (size_t i = 0; i < n; i++) y[i] += alpha * ((const float *)a->x)[i];
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_cast(const fsdp_cast_args_t *a, fsdp_stream_t s) {
  CPU_SHARD_OP("cast", s);
  const fsdp_dtype_t src_dt = a->src_dt, dst_dt = a->dst_dt;
  const size_t n = a->n;
  const float *f = a->src;
  const uint16_t *h = a->src;
  float *fo = a->dst;
  uint16_t *ho = a->dst;
  if (src_dt == FSDP_F32 && dst_dt == FSDP_BF16)
    for (size_t i = 0; i < n; i++) ho[i] = fsdp_f32_to_bf16(f[i]);
  else if (src_dt == FSDP_F32 && dst_dt == FSDP_F16)
    for (size_t i = 0; i < n; i++) ho[i] = fsdp_f32_to_f16(f[i]);
  else if (src_dt == FSDP_BF16 && dst_dt == FSDP_F32)
    for (size_t i = 0; i < n; i++) fo[i] = fsdp_bf16_to_f32(h[i]);
  else if (src_dt == FSDP_F16 && dst_dt == FSDP_F32)
    for (size_t i = 0; i < n; i++) fo[i] = fsdp_f16_to_f32(h[i]);
  else
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "CPU cast: no %s -> %s kernel (f32 to and from bf16 "
                      "and f16)", fsdp_dtype_name(src_dt), fsdp_dtype_name(dst_dt));
  return FSDP_SUCCESS;
}

/* Run by run, each as fsdp_adamw_update after the gradients were scaled in
 * place (what the engine did tensor piece by tensor piece). */
static fsdp_status_t cpu_adamw_multi(const fsdp_adamw_args_t *a, fsdp_stream_t s) {
  CPU_SHARD_OP("adamw_multi", s);
  const size_t n = a->n;
  if (n && (!a->runs || a->n_runs < 1))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "AdamW update: %zu elements but no decay runs",
                      n);
  if (a->param_lp && a->lp_dtype != FSDP_BF16 && a->lp_dtype != FSDP_F16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "AdamW update: a 16-bit copy of dtype %s "
                      "(bf16 or f16)", fsdp_dtype_name(a->lp_dtype));
  if (a->coef != 1.0f)
    for (size_t i = 0; i < n; i++) a->grad[i] *= a->coef;
  for (int r = 0; r < a->n_runs; r++) {
    const size_t at = (size_t)(a->runs[r] >> 1);
    const size_t end = r + 1 < a->n_runs ? (size_t)(a->runs[r + 1] >> 1) : n;
    fsdp_adamw_update(a->param + at, a->grad + at, a->m + at, a->v + at, end - at, a->c, a->lr,
                      a->t, (int)(a->runs[r] & 1));
  }
  if (!a->param_lp) return FSDP_SUCCESS;
  return cpu_cast(&(fsdp_cast_args_t){.dst_dt = a->lp_dtype, .dst = a->param_lp,
                                      .src_dt = FSDP_F32, .src = a->param, .n = n},
                  s);
}

static fsdp_status_t cpu_sgd_update(const fsdp_sgd_args_t *a, fsdp_stream_t s) {
  CPU_SHARD_OP("sgd_update", s);
  fsdp_sgd_update(a->param, a->grad, a->buf, a->n, a->c, a->lr, a->first, a->decay);
  return FSDP_SUCCESS;
}

/* The CPU keeps no per-stream state. */
static fsdp_status_t cpu_prepare(fsdp_stream_t s, int *created) {
  (void)s;
  if (created) *created = 0;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_release(void) { return FSDP_SUCCESS; }

static const fsdp_compute_ops_t cpu_ops = {
    .name = "cpu",
    .device = FSDP_DEVICE_CPU,
    .sum_squares_partials = 0,
    .head_forward = cpu_head_forward,
    .head_backward = cpu_head_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_scratch_bytes = cpu_attention_scratch_bytes,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .xent = cpu_xent,
    .colsum_scratch_bytes = cpu_colsum_scratch_bytes,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .layernorm_fused_forward = cpu_layernorm_fused_forward,
    .layernorm_fused_backward = cpu_layernorm_fused_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .cast = cpu_cast,
    .adamw_multi = cpu_adamw_multi,
    .sgd_update = cpu_sgd_update,
    .prepare = cpu_prepare,
    .release = cpu_release,
};

#if FSDP_HAVE_CUDA
extern const fsdp_compute_ops_t fsdp_compute_cuda_ops; /* compute_cuda.c */
#endif

const fsdp_compute_ops_t *fsdp_compute_ops(fsdp_device_kind_t kind) {
  switch (kind) {
  case FSDP_DEVICE_CPU: return &cpu_ops;
#if FSDP_HAVE_CUDA
  case FSDP_DEVICE_CUDA: return &fsdp_compute_cuda_ops;
#endif
  default: return NULL;
  }
}
