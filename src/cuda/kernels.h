/* src/cuda/kernels.h — the CUDA kernels: twins of the CPU layer kernels
 * (include/fsdp/nn.h), of the optimizer updates (include/fsdp/optim.h) and of
 * the engine's shard loops (gradient accumulation, global norm, clipping,
 * casts). A C header: no CUDA header leaks through it, so C code (the engine,
 * the tests) includes it freely and only the .cu files see the CUDA types.
 *
 * Conventions, shared by every function here:
 * - A twin has its CPU kernel's name stem with "fsdp_cuda_" for "fsdp_", the
 *   same arguments in the same order and the stream last. Where the GPU needs
 *   memory the CPU does without (attention backward's scratch, the sum of
 *   squares' partials) or cannot return a value without waiting for the
 *   stream (cross-entropy's losses), the twin takes a buffer and says so.
 * - Pointers are device pointers (configs are host structs); tensors are
 *   row-major; dims legend as in fsdp/nn.h (B, T, C, OC, NH, V; N rows).
 * - Backward kernels ADD into gradient buffers (+=), as on the CPU.
 * - Calls are asynchronous: they enqueue work on `stream` and return. The status
 *   says whether the work was launched (bad arguments, launch and cuBLAS
 *   errors, with file:line in fsdp_last_error()); a fault while the work runs
 *   surfaces at the next synchronising CUDA call, as CUDA errors do.
 * - No call allocates device memory (the engine allocates nothing inside a
 *   step). Scratch that the GPU needs and the CPU keeps on its stack is passed
 *   in. The one exception is the first cuBLAS call on a (device, stream): it
 *   creates that stream's cuBLAS handle unless fsdp_cuda_blas_prepare did
 *   (see fsdp_cuda_blas_release).
 * - bf16 values are stored as uint16_t bit patterns, as fsdp_f32_to_bf16 makes
 *   them. In the _bf16 variants activations, weights and activation gradients
 *   are bf16, while parameter gradients (dweight, dbias, dwte, dwpe) and
 *   statistics (mean, rstd, losses) stay fp32: they are the engine's full
 *   gradient buffer in the default fp32 reduce dtype, and accumulating
 *   micro-batches in bf16 would drop everything below 2^-8 of the running sum.
 *   All arithmetic is fp32 (double where noted); each result is rounded once.
 * - Deterministic: every kernel gives the same bits run to run on a device
 *   (cuBLAS does, with one handle per stream), except the dwte scatter of
 *   fsdp_cuda_embedding_backward (float atomicAdd: the order in which repeated
 *   tokens add varies, a few ulps).
 * Thread safety: as CUDA's; kernels may be called from several host threads. */
#ifndef FSDP_CUDA_KERNELS_H
#define FSDP_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/core.h"
#include "fsdp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA stream: this is cudaStream_t itself (struct CUstream_st *), spelled so
 * that C callers need no CUDA header. NULL is the legacy default stream. */
typedef struct CUstream_st *fsdp_cuda_stream_t;

/* ---- matrix products (cuBLAS; fp32 compute, never TF32) ---- */

/* out (B,OC) = inp (B,C) @ weight^T (OC,C) + bias (OC); bias may be NULL. */
fsdp_status_t fsdp_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                       const float *bias, int B, int C, int OC,
                                       fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *inp,
                                            const uint16_t *weight, const uint16_t *bias, int B,
                                            int C, int OC, fsdp_cuda_stream_t stream);
/* dinp (B,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias += sum_B
 * dout. dinp and dbias may be NULL. */
fsdp_status_t fsdp_cuda_linear_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        int B, int C, int OC, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_linear_backward_bf16(uint16_t *dinp, float *dweight, float *dbias,
                                             const uint16_t *dout, const uint16_t *inp,
                                             const uint16_t *weight, int B, int C, int OC,
                                             fsdp_cuda_stream_t stream);
/* GPT-2's tied vocabulary head, wte (V,C), no bias: logits (B,V) with rows ld
 * apart (ld >= V; GPT-2 pads V to a multiple of 128 so that every leading
 * dimension of the three vocabulary products is aligned for the tensor-core
 * kernels); columns [V, ld) are neither read nor written. Forward writes
 * (beta = 0); backward adds: dinp (B,C) += dlogits @ wte (dinp may be NULL),
 * dwte (V,C) += dlogits^T @ inp. */
fsdp_status_t fsdp_cuda_head_forward(float *logits, int ld, const float *inp, const float *wte,
                                     int B, int C, int V, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_head_forward_bf16(uint16_t *logits, int ld, const uint16_t *inp,
                                          const uint16_t *wte, int B, int C, int V,
                                          fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_head_backward(float *dinp, float *dwte, const float *dlogits, int ld,
                                      const float *inp, const float *wte, int B, int C, int V,
                                      fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_head_backward_bf16(uint16_t *dinp, float *dwte, const uint16_t *dlogits,
                                           int ld, const uint16_t *inp, const uint16_t *wte,
                                           int B, int C, int V, fsdp_cuda_stream_t stream);
/* The same with the weight stored (C,OC), GPT-2's Conv1D. */
fsdp_status_t fsdp_cuda_conv1d_forward(float *out, const float *inp, const float *weight,
                                       const float *bias, int B, int C, int OC,
                                       fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_conv1d_forward_bf16(uint16_t *out, const uint16_t *inp,
                                            const uint16_t *weight, const uint16_t *bias, int B,
                                            int C, int OC, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_conv1d_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        int B, int C, int OC, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_conv1d_backward_bf16(uint16_t *dinp, float *dweight, float *dbias,
                                             const uint16_t *dout, const uint16_t *inp,
                                             const uint16_t *weight, int B, int C, int OC,
                                             fsdp_cuda_stream_t stream);

/* Destroys the cuBLAS handles the matrix products created, one per (device,
 * stream) they ran on, at most FSDP_CUDA_MAX_BLAS_HANDLES. Call it when no
 * kernel is running, before destroying those streams (a handle keeps its
 * stream's address; a new stream at the same address would inherit it). */
#define FSDP_CUDA_MAX_BLAS_HANDLES 32
fsdp_status_t fsdp_cuda_blas_release(void);
/* Creates the cuBLAS handle of (current device, stream) now, so that no
 * product pays for it later (the engine calls it at materialize, not at the
 * first product while gathers are in flight). *created (may be NULL): 1 when
 * this call made it, 0 when it was there. */
fsdp_status_t fsdp_cuda_blas_prepare(fsdp_cuda_stream_t stream, int *created);

/* ---- elementwise layers (n elements) ---- */

/* GELU, GPT-2's tanh form; backward adds dout * gelu'(inp) into dinp. */
fsdp_status_t fsdp_cuda_gelu_forward(float *out, const float *inp, size_t n,
                                     fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, size_t n,
                                          fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                                      fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp,
                                           const uint16_t *dout, size_t n,
                                           fsdp_cuda_stream_t stream);
/* out = a + b (its backward is two accumulations of dout: axpy). */
fsdp_status_t fsdp_cuda_residual_forward(float *out, const float *a, const float *b, size_t n,
                                         fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_residual_forward_bf16(uint16_t *out, const uint16_t *a,
                                              const uint16_t *b, size_t n,
                                              fsdp_cuda_stream_t stream);

/* ---- LayerNorm over the last dim of inp (N,C), eps 1e-5 ---- */

/* mean and rstd (N) are saved for backward. */
fsdp_status_t fsdp_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                          const float *weight, const float *bias, int N, int C,
                                          fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd,
                                               const uint16_t *inp, const uint16_t *weight,
                                               const uint16_t *bias, int N, int C,
                                               fsdp_cuda_stream_t stream);
/* dinp, dweight, dbias accumulate; dinp may be NULL. dweight and dbias are
 * column sums over the N rows in a fixed order (no atomics). */
fsdp_status_t fsdp_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const float *inp,
                                           const float *weight, const float *mean,
                                           const float *rstd, int N, int C,
                                           fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_layernorm_backward_bf16(uint16_t *dinp, float *dweight, float *dbias,
                                                const uint16_t *dout, const uint16_t *inp,
                                                const uint16_t *weight, const float *mean,
                                                const float *rstd, int N, int C,
                                                fsdp_cuda_stream_t stream);

/* ---- token + position embedding ---- */

/* out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C). Tokens must be in
 * [0,V), as on the CPU (callers validate them; V is not an argument). */
fsdp_status_t fsdp_cuda_embedding_forward(float *out, const int *tokens, const float *wte,
                                          const float *wpe, int B, int T, int C,
                                          fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_embedding_forward_bf16(uint16_t *out, const int *tokens,
                                               const uint16_t *wte, const uint16_t *wpe, int B,
                                               int T, int C, fsdp_cuda_stream_t stream);
/* dwpe[t] += sum over b in order (deterministic); dwte rows += dout by float
 * atomicAdd (repeated tokens add in a varying order: not bitwise
 * reproducible, a few ulps). */
fsdp_status_t fsdp_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                           const int *tokens, int B, int T, int C,
                                           fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_embedding_backward_bf16(float *dwte, float *dwpe, const uint16_t *dout,
                                                const int *tokens, int B, int T, int C,
                                                fsdp_cuda_stream_t stream);

/* ---- causal multi-head self-attention (fp32) ----
 * qkv (B,T,3C), att (B,NH,T,T) softmax probabilities (0 above the diagonal),
 * out (B,T,C), scale 1/sqrt(C/NH). C must be a multiple of NH. Unlike the CPU
 * kernel there is no bound on T. Per (b, h) products are strided-batched
 * cuBLAS calls, one per b (the heads of a batch row are hs columns apart). */
fsdp_status_t fsdp_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                          int C, int NH, fsdp_cuda_stream_t stream);
/* dqkv += gradient. scratch: NH*T*T floats of the caller's (the CPU keeps this
 * on its stack), reused for each b in stream order; its contents on return are
 * unspecified. */
fsdp_status_t fsdp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                           const float *qkv, const float *att, int B, int T,
                                           int C, int NH, fsdp_cuda_stream_t stream);

/* bf16 on tensor cores (bf16 cuBLAS products, fp32 accumulation), keeping
 * only lse (B,NH,T) fp32, the log-sum-exp of each row's scaled scores, for
 * backward: no (B,NH,T,T) per layer. Scores and dP are fp32, probabilities
 * and dscore bf16 (the products' operands); the causal softmax reads only the
 * unmasked half; backward recomputes the scores and p = exp(s - lse).
 * scratch: fsdp_cuda_attention_lse_scratch_bytes(T, NH) (one batch row at a
 * time, contents not kept: share it between layers). Backward adds into
 * dqkv. */
size_t fsdp_cuda_attention_lse_scratch_bytes(int T, int NH);
fsdp_status_t fsdp_cuda_attention_lse_forward_bf16(uint16_t *out, float *lse, void *scratch,
                                                   const uint16_t *qkv, int B, int T, int C,
                                                   int NH, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_attention_lse_backward_bf16(uint16_t *dqkv, void *scratch,
                                                    const uint16_t *dout, const uint16_t *qkv,
                                                    const float *lse, int B, int T, int C,
                                                    int NH, fsdp_cuda_stream_t stream);

/* ---- softmax cross-entropy ----
 * For logits (B,V) and targets (B): losses[b] (fp32, may be NULL) = the row's
 * loss, computed in double and rounded once (the CPU returns their double sum;
 * the caller sums these); when dlogits is not NULL it is written (not added)
 * with (softmax - onehot) * scale. A target outside [0,V) gives a NaN loss and
 * a NaN dlogits row, as on the CPU. One block per row; the exponential sum is
 * in double as on the CPU. */
fsdp_status_t fsdp_cuda_softmax_xent(float *dlogits, float *losses, const float *logits,
                                     const int *targets, int B, int V, float scale,
                                     fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_softmax_xent_bf16(uint16_t *dlogits, float *losses,
                                          const uint16_t *logits, const int *targets, int B,
                                          int V, float scale, fsdp_cuda_stream_t stream);

/* Fused in place, for GPT-2's head: logits (B,V) rows ld apart; losses[b] as
 * above; with grad, each row is overwritten by (softmax - onehot) * scale in
 * the same kernel (the row's target logit is read before any write), so one
 * buffer holds the logits and then their gradient. Columns [V, ld) are not
 * touched. */
fsdp_status_t fsdp_cuda_xent_inplace(float *logits, int ld, float *losses, const int *targets,
                                     int B, int V, float scale, int grad,
                                     fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_xent_inplace_bf16(uint16_t *logits, int ld, float *losses,
                                          const int *targets, int B, int V, float scale,
                                          int grad, fsdp_cuda_stream_t stream);

/* ---- optimizer and shard kernels (fp32 shards) ---- */

/* AdamW and SGD with the semantics of fsdp_adamw_update / fsdp_sgd_update
 * (the bias corrections are computed on the host in double, as there).
 * AdamW over a whole shard in one launch (the engine's step: one per unit
 * instead of two per tensor piece). runs (device memory, n_runs >= 1 when n >
 * 0): start << 1 | decay for each run of elements sharing a decay flag,
 * starts ascending from 0. Gradients are read times coef (clipping; not
 * written back). The same arithmetic as fsdp_adamw_update on each run after
 * the gradients were scaled. */
fsdp_status_t fsdp_cuda_adamw_multi(float *param, const float *grad, float *m, float *v,
                                    size_t n, const unsigned long long *runs, int n_runs,
                                    float coef, const fsdp_optim_config_t *c, float lr,
                                    int64_t t, fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_sgd_update(float *param, const float *grad, float *buf, size_t n,
                                   const fsdp_optim_config_t *c, float lr, int first, int decay,
                                   fsdp_cuda_stream_t stream);

/* *out (one double) = sum of x[i]^2, accumulated in double. Deterministic: the
 * grid depends on n alone, each block reduces its part in a fixed order into
 * partials (FSDP_CUDA_SUMSQ_PARTIALS doubles of the caller's), and one block
 * adds those in a fixed order. */
#define FSDP_CUDA_SUMSQ_PARTIALS 512
fsdp_status_t fsdp_cuda_sum_squares(double *out, double *partials, const float *x, size_t n,
                                    fsdp_cuda_stream_t stream);
/* x *= s (gradient clipping by the global norm). */
fsdp_status_t fsdp_cuda_scale(float *x, float s, size_t n, fsdp_cuda_stream_t stream);
/* y += scale * x: a reduced gradient into the fp32 grad shard; the _bf16 form
 * takes a gradient reduced in bf16. */
fsdp_status_t fsdp_cuda_axpy(float *y, const float *x, float scale, size_t n,
                             fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_axpy_bf16(float *y, const uint16_t *x, float scale, size_t n,
                                  fsdp_cuda_stream_t stream);
/* Casts with fsdp_f32_to_bf16's exact rounding (nearest even; NaN stays a
 * quiet NaN with its sign and top payload bits) and its widening inverse. */
fsdp_status_t fsdp_cuda_f32_to_bf16(uint16_t *out, const float *inp, size_t n,
                                    fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_bf16_to_f32(float *out, const uint16_t *inp, size_t n,
                                    fsdp_cuda_stream_t stream);
/* The same for IEEE fp16 with fsdp_f32_to_f16's rounding (nearest even,
 * overflow to inf, subnormals kept): fp16 parameters are gathered, not
 * computed in, so these casts are all the fp16 kernels there are. */
fsdp_status_t fsdp_cuda_f32_to_f16(uint16_t *out, const float *inp, size_t n,
                                   fsdp_cuda_stream_t stream);
fsdp_status_t fsdp_cuda_f16_to_f32(float *out, const uint16_t *inp, size_t n,
                                   fsdp_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
