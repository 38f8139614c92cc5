/* src/backend/compute.h — the compute table: every kernel the engine and the
 * models run, as one table of function pointers per backend, and each
 * kernel's argument descriptor. The CPU table (cpu/compute.c) runs the fp32
 * kernels of fsdp/nn.h; the CUDA table holds the entry points of
 * cuda/kernels.h themselves, so a model's call reaches the kernel's launch in
 * one hop: gpt2.c -> ops->layernorm_fused_forward (that is
 * fsdp_cuda_layernorm_fused_forward) -> layernorm_forward<bf16> -> launch.
 * Not installed.
 *
 * Why this shape (ggml's backend interface, llm.c's one floatX kernel per op):
 * - One kernel per op, generic over the storage type: each descriptor's dt
 *   is the dtype of its activations and weights, and a backend dispatches on
 *   it in one place (cuda_internal.cuh: fsdp_cuda_dispatch). A dtype a
 *   backend does not implement is refused with FSDP_ERR_UNSUPPORTED naming the
 *   op, the backend and the dtype, before anything runs; never a wrong answer.
 * - Pointers typed void * hold values of that dtype (bf16 as uint16_t bit
 *   patterns); float * are always fp32 (parameter gradients, LayerNorm
 *   statistics, attention's saved state), double * always fp64 (per-row
 *   losses). Every pointer lives in the backend's memory (fsdp_device_alloc
 *   of the table's `device`).
 * - A kernel's arguments are ONE descriptor struct, defined below once
 *   (fsdp_<kernel>_args_t: the dtype, outputs, inputs, weights, dims and
 *   flags, each field named and documented), and the stream: a slot is
 *   (const fsdp_<kernel>_args_t *a, fsdp_stream_t s), and callers fill the
 *   struct with designated initialisers, so a flag reads by its name and a
 *   field left out is 0 / NULL. The stream is the last argument (llm.c's
 *   order). CUDA queues the work on it and returns (it must be a CUDA
 *   stream: another is refused, since the legacy stream would race the
 *   engine's); the CPU runs the op in the caller before returning, so it takes
 *   the stream the caller's work is ordered on and that is the caller itself
 *   (FSDP_HOST_STREAM, which is the CPU engine's compute stream).
 * - Backward ops ADD into gradient buffers (+=); zeroing is the caller's.
 *   The exceptions are matmul_backward's d(input) and attention_backward's
 *   dqkv, which they write (an activation's gradient with one producer: no
 *   zeroing pass, and no pass adding a library's result into it).
 * - Statuses say whether the work was launched (bad arguments, launch and
 *   cuBLAS errors, with file:line in fsdp_last_error()); a fault while queued
 *   work runs surfaces at the next synchronising call, as CUDA errors do.
 * - Where the GPU needs memory the CPU keeps on its stack (attention's
 *   scratch), the op takes a buffer and the table says how large.
 * The engine's shard kernels (norm, clipping, gradient accumulation, casts,
 * optimizer updates) are in the same table, so the engine has no backend
 * branches either; they work on fp32 shards of n elements.
 * Dims legend as in fsdp/nn.h (B, T, C, OC, NH, V; N rows). Tables are
 * immutable and may be used from any thread. */
#ifndef FSDP_BACKEND_COMPUTE_H
#define FSDP_BACKEND_COMPUTE_H

#include <stddef.h>

#include <stdint.h>

#include "fsdp/core.h"
#include "fsdp/device.h"
#include "fsdp/optim.h"

/* ---- the kernels' descriptors ---- */

/* A tied vocabulary head, wte (V,C), no bias (fp32 accumulation): logits
 * (B,V) with rows ld apart (ld >= V; columns [V, ld) neither read nor
 * written). Forward writes logits = inp @ wte^T. */
typedef struct fsdp_head_forward_args {
  fsdp_dtype_t dt;
  void *logits;    /* (B,ld) written */
  int ld;          /* >= V */
  const void *inp; /* (B,C) */
  const void *wte; /* (V,C) */
  int B, C, V;
} fsdp_head_forward_args_t;

/* Backward adds dinp (B,C) += dlogits @ wte and dwte (V,C) += dlogits^T @ inp. */
typedef struct fsdp_head_backward_args {
  fsdp_dtype_t dt;
  void *dinp;          /* (B,C) +=; may be NULL */
  float *dwte;         /* (V,C) += */
  const void *dlogits; /* (B,ld) */
  int ld;              /* >= V */
  const void *inp;     /* (B,C) */
  const void *wte;     /* (V,C) */
  int B, C, V;
} fsdp_head_backward_args_t;

/* Token + position embedding: out (B,T,C) = wte[tokens[b,t]] + wpe[t];
 * without wpe (NULL: RoPE models), out = wte[tokens[b,t]] and dwpe is NULL. */
typedef struct fsdp_embedding_forward_args {
  fsdp_dtype_t dt;
  void *out;         /* (B,T,C) written */
  const int *tokens; /* (B,T) in [0,V), the backend's memory: callers validate them */
  const void *wte;   /* (V,C) */
  const void *wpe;   /* (maxT,C) */
  int B, T, C;
} fsdp_embedding_forward_args_t;

typedef struct fsdp_embedding_backward_args {
  fsdp_dtype_t dt;
  float *dwte;       /* (V,C) += */
  float *dwpe;       /* (maxT,C) += */
  const void *dout;  /* (B,T,C) */
  const int *tokens; /* (B,T) */
  int B, T, C;
} fsdp_embedding_backward_args_t;

/* Causal self-attention, multi-head or grouped-query: NH query heads of D =
 * C / NH and NKV key/value heads (NKV divides NH; 0 means NH), query head h
 * reading KV head h / (NH / NKV) (HF's repeat_kv). qkv (B,T,(NH+2*NKV)*D)
 * holds each row's q heads, then k's, then v's: (B,T,3C) for GPT-2. out
 * (B,T,C). What attention keeps for backward, att (fp32), depends on the
 * backend and dtype: attention_state_floats says how many floats (the
 * (B,NH,T,T) probabilities, or the (B,NH,T) log-sum-exp of an op that
 * recomputes them). scratch: attention_scratch_bytes of the caller's (NULL
 * when 0), contents not kept between calls: layers may share it. */
typedef struct fsdp_attention_forward_args {
  fsdp_dtype_t dt;
  void *out;       /* (B,T,C) written */
  float *att;      /* attention_state_floats written */
  void *scratch;   /* attention_scratch_bytes, or NULL when 0 */
  const void *qkv; /* (B,T,(NH+2*NKV)*D) */
  int B, T, C, NH;
  int NKV; /* KV heads; 0: NH */
} fsdp_attention_forward_args_t;

/* Backward writes dqkv (every element; what was there is not read) and is
 * given forward's out, which a kernel that recomputes the probabilities from
 * the log-sum-exp needs (rowsum(dout * out)). */
typedef struct fsdp_attention_backward_args {
  fsdp_dtype_t dt;
  void *dqkv;       /* qkv's shape, written */
  void *scratch;    /* attention_scratch_bytes, or NULL when 0 */
  const void *dout; /* (B,T,C) */
  const void *qkv;  /* (B,T,(NH+2*NKV)*D) */
  const void *out;  /* (B,T,C), forward's */
  const float *att; /* forward's state */
  int B, T, C, NH;
  int NKV; /* as forward's */
} fsdp_attention_backward_args_t;

/* Softmax cross-entropy, fused with its gradient, in place: logits (B,V)
 * rows ld apart. With grad, each row is overwritten by (softmax - onehot) *
 * scale (the target logit is read first), so one buffer holds the logits
 * and then their gradient; columns [V, ld) are not touched. A target outside
 * [0,V) gives a NaN loss and a NaN row. */
typedef struct fsdp_xent_args {
  fsdp_dtype_t dt;
  void *logits;       /* (B,ld); with grad, overwritten by the gradient */
  int ld;             /* >= V */
  double *losses;     /* (B) each row's loss; may be NULL */
  const int *targets; /* (B), the backend's memory */
  int B, V;
  float scale; /* the gradient's factor (1 / rows averaged over) */
  int grad;    /* 1: write the gradient over the logits; 0: losses only */
} fsdp_xent_args_t;

/* GPT-2's block products, each fused with the memory-bound work beside it
 * (issue 15 item 4). The products accumulate in fp32 and WRITE their outputs
 * (beta = 0 on CUDA: no bias fill, no zeroed buffer read back), d(input)
 * included: the one exception to "backward adds", since an activation's
 * gradient has one producer. GELU is GPT-2's tanh form.
 * Forward: out (B,OC) = inp (B,C) @ W + bias; with pre, pre = inp @ W + bias
 * (kept for backward) and out = gelu(pre). */
typedef struct fsdp_matmul_forward_args {
  fsdp_dtype_t dt;
  void *out;          /* (B,OC) written */
  void *pre;          /* (B,OC) written, out = gelu(pre); NULL: no GELU */
  const void *inp;    /* (B,C) */
  const void *weight; /* (OC,C) when weight_out_in, else (C,OC) */
  const void *bias;   /* (OC); may be NULL */
  int B, C, OC;
  int weight_out_in; /* 1: a (OC,C) weight (linear; W = weight^T); 0: GPT-2's
                      * (C,OC) Conv1D (W = weight) */
} fsdp_matmul_forward_args_t;

/* dinp = dout @ W^T written, times gelu'(gelu_pre) when gelu_pre is given
 * (the GELU below the product, backward in the same pass); dweight += the
 * weight's gradient in its own layout; dbias += column sums of dout. */
typedef struct fsdp_matmul_backward_args {
  fsdp_dtype_t dt;
  void *dinp;           /* (B,C) written; may be NULL */
  float *dweight;       /* the weight's shape, += */
  float *dbias;         /* (OC) +=; may be NULL */
  void *scratch;        /* colsum_scratch_bytes(OC) of the caller's, NULL when 0 */
  const void *dout;     /* (B,OC) */
  const void *inp;      /* (B,C), forward's */
  const void *weight;   /* as forward's */
  const void *gelu_pre; /* (B,C) the pre-activation of a GELU feeding inp; may be NULL */
  int B, C, OC;
  int weight_out_in; /* as forward's */
} fsdp_matmul_backward_args_t;

/* LayerNorm over the last dim, eps 1e-5, fused with the residual add that
 * feeds it: with branch, res = inp + branch (as stored in dt; res may be inp
 * or branch) and out = LayerNorm(res); without, out = LayerNorm(inp), res
 * unused. */
typedef struct fsdp_layernorm_forward_args {
  fsdp_dtype_t dt;
  void *res;          /* (N,C) written with branch; else unused (may be NULL) */
  void *out;          /* (N,C) written */
  float *mean, *rstd; /* (N) written, for backward */
  const void *inp;    /* (N,C) */
  const void *branch; /* (N,C) the residual branch; may be NULL */
  const void *weight; /* (C) */
  const void *bias;   /* (C) */
  int N, C;
} fsdp_layernorm_forward_args_t;

/* dinp += d(inp); dweight += column sums of xhat * dout and dbias += of
 * dout, over all SMs through scratch. */
typedef struct fsdp_layernorm_backward_args {
  fsdp_dtype_t dt;
  void *dinp;         /* (N,C) +=; may be NULL (d(residual) in GPT-2) */
  float *dweight;     /* (C) += */
  float *dbias;       /* (C) += */
  void *scratch;      /* colsum_scratch_bytes(C) of the caller's, NULL when 0 */
  const void *dout;   /* (N,C) */
  const void *inp;    /* (N,C) what forward normalised (res with a branch) */
  const void *weight; /* (C) */
  const float *mean, *rstd; /* (N) forward's */
  int N, C;
} fsdp_layernorm_backward_args_t;

/* The MLP's ReLU over n elements of dt, in place: x = max(x, 0) (NaN to 0). */
typedef struct fsdp_relu_forward_args {
  fsdp_dtype_t dt;
  void *x; /* (n) read and written */
  size_t n;
} fsdp_relu_forward_args_t;

/* dx = out > 0 ? dx : 0 with out forward's result: the gradient through the
 * ReLU written over the one above it. */
typedef struct fsdp_relu_backward_args {
  fsdp_dtype_t dt;
  void *dx;        /* (n) read and written */
  const void *out; /* (n) forward's */
  size_t n;
} fsdp_relu_backward_args_t;

/* RMSNorm over the last dim (the Llama family's), fused with the residual
 * add that feeds it as layernorm_fused_forward is: with branch, res = inp +
 * branch (as stored in dt) and x = res, else x = inp; rstd = 1 /
 * sqrt(mean(x^2) + eps) in fp32 and out = weight * (x * rstd), HF's order
 * (the normalised x rounded to dt before the weight multiplies it). */
typedef struct fsdp_rmsnorm_forward_args {
  fsdp_dtype_t dt;
  void *res;          /* (N,C) written with branch; else unused (may be NULL) */
  void *out;          /* (N,C) written */
  float *rstd;        /* (N) written, for backward */
  const void *inp;    /* (N,C) */
  const void *branch; /* (N,C) the residual branch; may be NULL */
  const void *weight; /* (C) */
  int N, C;
  float eps;
} fsdp_rmsnorm_forward_args_t;

/* dinp += d(x); dweight += column sums of (x * rstd) * dout, over all SMs
 * through scratch (colsum_scratch_bytes(C)). */
typedef struct fsdp_rmsnorm_backward_args {
  fsdp_dtype_t dt;
  void *dinp;         /* (N,C) += */
  float *dweight;     /* (C) += */
  void *scratch;      /* colsum_scratch_bytes(C) of the caller's, NULL when 0 */
  const void *dout;   /* (N,C) */
  const void *inp;    /* (N,C) what forward normalised (res with a branch) */
  const void *weight; /* (C) */
  const float *rstd;  /* (N) forward's */
  int N, C;
} fsdp_rmsnorm_backward_args_t;

/* Rotary position embedding in HF's rotate-half convention, in place on the
 * q and k heads of a packed qkv (attention's layout; v untouched): for
 * position p = pos0 + t and i < D/2, angle = p * inv_freq[i] (fp32, cos and
 * sin in fp32), (x[i], x[i+D/2]) -> (x[i] cos - x[i+D/2] sin, x[i+D/2] cos +
 * x[i] sin). rope_backward applies the inverse rotation (the transpose) to a
 * gradient of the same layout, in place. */
typedef struct fsdp_rope_args {
  fsdp_dtype_t dt;
  void *qkv;              /* (B,T,(NH+2*NKV)*D) read and written */
  const float *inv_freq;  /* (D/2) fp32, the backend's memory (fsdp_llama_inv_freq) */
  int B, T, NH, NKV, D;
  int pos0; /* position of t = 0 */
} fsdp_rope_args_t;

/* SwiGLU over one product's output: inp (N,2F) holds each row's gate (columns
 * [0,F), gate_proj's) then up ([F,2F)); out (N,F) = silu(gate) * up, silu(x)
 * = x / (1 + exp(-x)), computed in fp32. */
typedef struct fsdp_swiglu_forward_args {
  fsdp_dtype_t dt;
  void *out;       /* (N,F) written */
  const void *inp; /* (N,2F) */
  int N, F;
} fsdp_swiglu_forward_args_t;

/* dinp (N,2F) written (the gate's and up's gradients; one producer, as
 * matmul_backward's dinp) from dout (N,F) and forward's inp. */
typedef struct fsdp_swiglu_backward_args {
  fsdp_dtype_t dt;
  void *dinp;       /* (N,2F) written */
  const void *dout; /* (N,F) */
  const void *inp;  /* (N,2F) forward's */
  int N, F;
} fsdp_swiglu_backward_args_t;

/* ---- the engine's shard kernels' descriptors (shards of n elements) ---- */

/* *out (one double) = sum of x[i]^2, accumulated in double, deterministic
 * (the same n gives the same order on every run). */
typedef struct fsdp_sum_squares_args {
  double *out;      /* (1) written */
  double *partials; /* sum_squares_partials doubles of the caller's (NULL when 0) */
  const float *x;   /* (n) */
  size_t n;
} fsdp_sum_squares_args_t;

/* x *= alpha (gradient clipping by the global norm). */
typedef struct fsdp_scale_args {
  float *x; /* (n) read and written */
  float alpha;
  size_t n;
} fsdp_scale_args_t;

/* y += alpha * x: a reduced gradient into the fp32 grad shard. */
typedef struct fsdp_axpy_args {
  float *y;         /* (n) fp32, += */
  fsdp_dtype_t xdt; /* x's dtype: f32, or bf16 when gradients are reduced in bf16 */
  const void *x;    /* (n) of xdt */
  float alpha;
  size_t n;
} fsdp_axpy_args_t;

/* dst = src element by element with fsdp_f32_to_bf16's / fsdp_f32_to_f16's
 * exact rounding, or their widening inverses: f32 to and from bf16 and f16
 * (another pair is refused with FSDP_ERR_UNSUPPORTED naming both). */
typedef struct fsdp_cast_args {
  fsdp_dtype_t dst_dt;
  void *dst; /* (n) of dst_dt, written */
  fsdp_dtype_t src_dt;
  const void *src; /* (n) of src_dt */
  size_t n;
} fsdp_cast_args_t;

/* AdamW (fsdp_adamw_update's semantics) over a whole fp32 shard in one call.
 * Gradients are taken times coef (clipping; the CPU scales them in place,
 * CUDA only reads them: do not read grad afterwards). With param_lp the
 * updated parameters are also written rounded to lp_dtype (FSDP_BF16 or
 * FSDP_F16; fsdp_f32_to_bf16 / fsdp_f32_to_f16 bit for bit, what a cast of
 * param would write): the 16-bit copy without a second pass over param. */
typedef struct fsdp_adamw_args {
  float *param, *grad, *m, *v; /* (n) each */
  void *param_lp;              /* (n) of lp_dtype, written; NULL: none */
  fsdp_dtype_t lp_dtype;
  size_t n;
  /* (n_runs >= 1 when n > 0, the backend's memory): start << 1 | decay for
   * each run of elements sharing a weight-decay flag, starts ascending from 0 */
  const unsigned long long *runs;
  int n_runs;
  float coef;                   /* the gradients' factor (1: none) */
  const fsdp_optim_config_t *c; /* a host struct */
  float lr;
  int64_t t; /* the step, from 1 (bias corrections) */
} fsdp_adamw_args_t;

/* fsdp_sgd_update's semantics over an fp32 shard. */
typedef struct fsdp_sgd_args {
  float *param;
  const float *grad;
  float *buf; /* momentum; may be NULL (no momentum) */
  size_t n;
  const fsdp_optim_config_t *c; /* a host struct */
  float lr;
  int first; /* 1: the first step (buf is set, not decayed) */
  int decay; /* 1: apply weight decay */
} fsdp_sgd_args_t;

typedef struct fsdp_compute_ops {
  const char *name;            /* "cpu", "cuda" */
  fsdp_device_kind_t device;   /* where every pointer lives */
  size_t sum_squares_partials; /* doubles of scratch sum_squares takes (0: none) */

  /* ---- GPT-2's layers (and the Llama family's attention, products, head,
   * embedding): each slot's contract is its descriptor's ---- */
  fsdp_status_t (*head_forward)(const fsdp_head_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*head_backward)(const fsdp_head_backward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*embedding_forward)(const fsdp_embedding_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*embedding_backward)(const fsdp_embedding_backward_args_t *a, fsdp_stream_t s);
  /* sizes of attention's state (floats) and scratch (bytes), forward's and
   * backward's alike: they read a's dt, B, T and NH only (no pointer), so a
   * caller sizing buffers before it has them passes those four */
  size_t (*attention_state_floats)(const fsdp_attention_forward_args_t *a);
  size_t (*attention_scratch_bytes)(const fsdp_attention_forward_args_t *a);
  fsdp_status_t (*attention_forward)(const fsdp_attention_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*attention_backward)(const fsdp_attention_backward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*xent)(const fsdp_xent_args_t *a, fsdp_stream_t s);
  /* bytes of the column sums' scratch (bias and LayerNorm gradients) over
   * cols columns; contents not kept: layers share it. One int, not a
   * descriptor: it sizes matmul_backward's (cols = OC) and
   * layernorm_fused_backward's (cols = C) scratch alike, for the widest of a
   * model's layers of both kinds */
  size_t (*colsum_scratch_bytes)(int cols);
  fsdp_status_t (*matmul_forward)(const fsdp_matmul_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*matmul_backward)(const fsdp_matmul_backward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*layernorm_fused_forward)(const fsdp_layernorm_forward_args_t *a,
                                           fsdp_stream_t s);
  fsdp_status_t (*layernorm_fused_backward)(const fsdp_layernorm_backward_args_t *a,
                                            fsdp_stream_t s);
  fsdp_status_t (*relu_forward)(const fsdp_relu_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*relu_backward)(const fsdp_relu_backward_args_t *a, fsdp_stream_t s);
  /* ---- the Llama family's layers ---- */
  fsdp_status_t (*rmsnorm_forward)(const fsdp_rmsnorm_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*rmsnorm_backward)(const fsdp_rmsnorm_backward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*rope_forward)(const fsdp_rope_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*rope_backward)(const fsdp_rope_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*swiglu_forward)(const fsdp_swiglu_forward_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*swiglu_backward)(const fsdp_swiglu_backward_args_t *a, fsdp_stream_t s);
  /* ---- the engine's shard kernels: likewise ---- */
  fsdp_status_t (*sum_squares)(const fsdp_sum_squares_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*scale)(const fsdp_scale_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*axpy)(const fsdp_axpy_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*cast)(const fsdp_cast_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*adamw_multi)(const fsdp_adamw_args_t *a, fsdp_stream_t s);
  fsdp_status_t (*sgd_update)(const fsdp_sgd_args_t *a, fsdp_stream_t s);

  /* ---- per-stream state ---- */
  /* Creates what the products on stream s need (CUDA: its cuBLAS handle and
   * workspace) now, not at the first product while gathers are in flight.
   * *created (may be NULL): 1 when this call made it. */
  fsdp_status_t (*prepare)(fsdp_stream_t s, int *created);
  /* Releases what prepare and the products created, for every stream; call it
   * when no kernel runs, before those streams are destroyed. */
  fsdp_status_t (*release)(void);
} fsdp_compute_ops_t;

/* The table of a device kind: never NULL for FSDP_DEVICE_CPU; NULL for
 * FSDP_DEVICE_CUDA when fsdp was built without CUDA (callers say so: the
 * engine refuses such a config first) and for an unknown kind. */
const fsdp_compute_ops_t *fsdp_compute_ops(fsdp_device_kind_t kind);

/* Every slot of *ops is set: 1, else 0 with the first empty slot's name in
 * *missing (tests hold each built table to it). */
int fsdp_compute_ops_complete(const fsdp_compute_ops_t *ops, const char **missing);

#endif
