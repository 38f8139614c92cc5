/* src/backend/compute.h — the compute table: every kernel the engine and the
 * models run, as one table of function pointers per backend. The CPU table
 * (compute.c) holds the fp32 kernels of fsdp/nn.h; the CUDA table holds the
 * entry points of src/backend/cuda/kernels.h themselves, so a model's call reaches the
 * kernel's launch in one hop: gpt2.c -> ops->layernorm_fused_forward (that
 * is fsdp_cuda_layernorm_fused_forward) -> layernorm_forward<bf16> ->
 * launch. Not installed.
 *
 * Why this shape (ggml's backend interface, llm.c's one floatX kernel per op):
 * - One kernel per op, generic over the storage type: each slot takes the
 *   dtype of its activations and weights first, and a backend dispatches on
 *   it in one place (cuda_internal.cuh: fsdp_cuda_dispatch). A dtype a
 *   backend does not implement is refused with FSDP_ERR_UNSUPPORTED naming the
 *   op, the backend and the dtype, before anything runs; never a wrong answer.
 * - Pointers typed void * hold values of that dtype (bf16 as uint16_t bit
 *   patterns); float * are always fp32 (parameter gradients, LayerNorm
 *   statistics, attention's saved state), double * always fp64 (per-row
 *   losses). Every pointer lives in the backend's memory (fsdp_device_alloc
 *   of the table's `device`).
 * - The stream is the last argument (llm.c's order: outputs, inputs, weights,
 *   dims, stream). CUDA queues the work on it and returns (it must be a CUDA
 *   stream: another is refused, since the legacy stream would race the
 *   engine's); the CPU runs the op in the caller before returning, so it takes
 *   the stream the caller's work is ordered on and that is the caller itself
 *   (FSDP_HOST_STREAM, which is the CPU engine's compute stream).
 * - Backward ops ADD into gradient buffers (+=); zeroing is the caller's.
 *   The one exception is matmul_backward's d(input), which it writes (an
 *   activation's gradient has one producer: no zeroing pass).
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

typedef struct fsdp_compute_ops {
  const char *name;            /* "cpu", "cuda" */
  fsdp_device_kind_t device;   /* where every pointer lives */
  size_t sum_squares_partials; /* doubles of scratch sum_squares takes (0: none) */

  /* ---- the vocabulary head (fp32 accumulation) ---- */
  /* A tied vocabulary head, wte (V,C), no bias: logits (B,V) with rows ld
   * apart (ld >= V; columns [V, ld) neither read nor written). Forward
   * writes; backward adds dinp (B,C) += dlogits @ wte (dinp may be NULL) and
   * dwte (V,C) += dlogits^T @ inp. */
  fsdp_status_t (*head_forward)(fsdp_dtype_t dt, void *logits, int ld, const void *inp,
                                const void *wte, int B, int C, int V, fsdp_stream_t s);
  fsdp_status_t (*head_backward)(fsdp_dtype_t dt, void *dinp, float *dwte, const void *dlogits,
                                 int ld, const void *inp, const void *wte, int B, int C, int V,
                                 fsdp_stream_t s);

  /* ---- token + position embedding ---- */
  /* out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t]; tokens (int, the backend's
   * memory) must be in [0,V): callers validate them. */
  fsdp_status_t (*embedding_forward)(fsdp_dtype_t dt, void *out, const int *tokens,
                                     const void *wte, const void *wpe, int B, int T, int C,
                                     fsdp_stream_t s);
  fsdp_status_t (*embedding_backward)(fsdp_dtype_t dt, float *dwte, float *dwpe, const void *dout,
                                      const int *tokens, int B, int T, int C, fsdp_stream_t s);

  /* ---- causal multi-head self-attention ----
   * qkv (B,T,3C), out (B,T,C), C a multiple of NH. What attention keeps for
   * backward, att (fp32), depends on the backend and dtype:
   * attention_state_floats says how many floats (the (B,NH,T,T) probabilities,
   * or the (B,NH,T) log-sum-exp of an op that recomputes them). scratch:
   * attention_scratch_bytes(dt, T, NH) of the caller's (NULL when 0), contents
   * not kept between calls: layers may share it. Backward adds into dqkv and
   * is given forward's out (B,T,C), which a kernel that recomputes the
   * probabilities from the log-sum-exp needs (rowsum(dout * out)). */
  size_t (*attention_state_floats)(fsdp_dtype_t dt, int B, int T, int NH);
  size_t (*attention_scratch_bytes)(fsdp_dtype_t dt, int T, int NH);
  fsdp_status_t (*attention_forward)(fsdp_dtype_t dt, void *out, float *att, void *scratch,
                                     const void *qkv, int B, int T, int C, int NH,
                                     fsdp_stream_t s);
  fsdp_status_t (*attention_backward)(fsdp_dtype_t dt, void *dqkv, void *scratch,
                                      const void *dout, const void *qkv, const void *out,
                                      const float *att, int B, int T, int C, int NH,
                                      fsdp_stream_t s);

  /* ---- softmax cross-entropy, fused with its gradient, in place ----
   * logits (B,V) rows ld apart; targets (B) in the backend's memory. losses
   * (B; may be NULL) get each row's loss in double. With grad, each row is
   * overwritten by (softmax - onehot) * scale (the target logit is read
   * first), so one buffer holds the logits and then their gradient; columns
   * [V, ld) are not touched. A target outside [0,V) gives a NaN loss and a
   * NaN row. */
  fsdp_status_t (*xent)(fsdp_dtype_t dt, void *logits, int ld, double *losses,
                        const int *targets, int B, int V, float scale, int grad,
                        fsdp_stream_t s);

  /* ---- GPT-2's block products and LayerNorms, each fused with the
   * memory-bound work beside it (issue 15 item 4) ----
   * The products accumulate in fp32 and WRITE their outputs (beta = 0 on
   * CUDA: no bias fill, no zeroed buffer read back), d(input) included: the
   * one exception to "backward adds", since an activation's gradient has one
   * producer. The column sums of the bias and LayerNorm gradients take
   * scratch (colsum_scratch_bytes(cols) of the caller's, NULL when 0;
   * contents not kept: layers share it). weight_out_in: 1 for a (OC,C)
   * weight (linear; W = weight^T), 0 for GPT-2's (C,OC) Conv1D (W =
   * weight). GELU is GPT-2's tanh form. */
  size_t (*colsum_scratch_bytes)(int cols);
  /* out (B,OC) = inp (B,C) @ W + bias (may be NULL); with pre (B,OC) not
   * NULL, pre = inp @ W + bias (kept for backward) and out = gelu(pre). */
  fsdp_status_t (*matmul_forward)(fsdp_dtype_t dt, void *out, void *pre, const void *inp,
                                  const void *weight, const void *bias, int B, int C, int OC,
                                  int weight_out_in, fsdp_stream_t s);
  /* dinp (B,C) = dout @ W^T written (may be NULL), times gelu'(gelu_pre)
   * when gelu_pre (B,C) is given (the GELU below the product, backward in
   * the same pass); dweight += the weight's gradient in its own layout;
   * dbias += column sums of dout (may be NULL). */
  fsdp_status_t (*matmul_backward)(fsdp_dtype_t dt, void *dinp, float *dweight, float *dbias,
                                   void *scratch, const void *dout, const void *inp,
                                   const void *weight, const void *gelu_pre, int B, int C, int OC,
                                   int weight_out_in, fsdp_stream_t s);
  /* LayerNorm over the last dim, eps 1e-5, fused with the residual add that
   * feeds it: with branch, res (N,C) = inp + branch (as stored in dt; res
   * may be inp or branch) and out = LayerNorm(res); without, out =
   * LayerNorm(inp), res unused. mean and rstd (N) are saved for backward. */
  fsdp_status_t (*layernorm_fused_forward)(fsdp_dtype_t dt, void *res, void *out, float *mean,
                                           float *rstd, const void *inp, const void *branch,
                                           const void *weight, const void *bias, int N, int C,
                                           fsdp_stream_t s);
  /* inp is what forward normalised (res with a branch). dinp (N,C; may be
   * NULL: d(residual) in GPT-2) += d(inp); dweight (C) += column sums of
   * xhat * dout and dbias (C) += of dout, over all SMs through scratch. */
  fsdp_status_t (*layernorm_fused_backward)(fsdp_dtype_t dt, void *dinp, float *dweight,
                                            float *dbias, void *scratch, const void *dout,
                                            const void *inp, const void *weight,
                                            const float *mean, const float *rstd, int N, int C,
                                            fsdp_stream_t s);

  /* ---- the engine's shard kernels ---- */
  /* *out (one double) = sum of x[i]^2, accumulated in double, deterministic;
   * partials: sum_squares_partials doubles of the caller's (NULL when 0). */
  fsdp_status_t (*sum_squares)(double *out, double *partials, const float *x, size_t n,
                               fsdp_stream_t s);
  /* x *= a (clipping). */
  fsdp_status_t (*scale)(float *x, float a, size_t n, fsdp_stream_t s);
  /* y += a * x, x of dtype xdt (f32, or bf16 when gradients are reduced in
   * bf16): a reduced gradient into the fp32 grad shard. */
  fsdp_status_t (*axpy)(float *y, fsdp_dtype_t xdt, const void *x, float a, size_t n,
                        fsdp_stream_t s);
  /* dst (dst_dt) = src (src_dt) element by element with fsdp_f32_to_bf16's /
   * fsdp_f32_to_f16's exact rounding, or their widening inverses: f32 to and
   * from bf16 and f16. */
  fsdp_status_t (*cast)(fsdp_dtype_t dst_dt, void *dst, fsdp_dtype_t src_dt, const void *src,
                        size_t n, fsdp_stream_t s);
  /* AdamW (fsdp_adamw_update's semantics) over a whole shard in one call:
   * runs (n_runs >= 1 when n > 0, the backend's memory): start << 1 | decay
   * for each run of elements sharing a weight-decay flag, starts ascending
   * from 0. Gradients are taken times coef (clipping; the CPU scales them in
   * place, CUDA only reads them: do not read grad afterwards). */
  fsdp_status_t (*adamw_multi)(float *param, float *grad, float *m, float *v, size_t n,
                               const unsigned long long *runs, int n_runs, float coef,
                               const fsdp_optim_config_t *c, float lr, int64_t t,
                               fsdp_stream_t s);
  /* fsdp_sgd_update's semantics; buf may be NULL (no momentum). */
  fsdp_status_t (*sgd_update)(float *param, const float *grad, float *buf, size_t n,
                              const fsdp_optim_config_t *c, float lr, int first, int decay,
                              fsdp_stream_t s);

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
