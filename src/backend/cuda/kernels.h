/* src/backend/cuda/kernels.h — the CUDA kernels: the compute table's entry points
 * (src/backend/compute.h; one per op, generic over the storage dtype), and the
 * engine's shard kernels (optimizer updates of include/fsdp/optim.h, global
 * norm, clipping, gradient accumulation, casts). A C header: no CUDA header
 * leaks through it, so C code (the engine, the tests) includes it freely and
 * only the .cu files see the CUDA types.
 *
 * Conventions, shared by every function here:
 * - The table's slots take their descriptor (src/backend/compute.h, which
 *   documents each field) and the stream, last. Where the GPU needs memory the CPU does without
 *   (attention's scratch, the sum of squares' partials) or cannot return a
 *   value without waiting for the stream (cross-entropy's losses), the call
 *   takes a buffer and says so.
 * - Pointers are device pointers (configs are host structs); tensors are
 *   row-major; dims legend as in fsdp/nn.h (B, T, C, OC, NH, V; N rows).
 * - Backward kernels ADD into gradient buffers (+=), as on the CPU, except
 *   fsdp_cuda_matmul_backward's d(input), which it writes (beta = 0), and
 *   fsdp_cuda_attention_backward's dqkv, which it writes.
 * - Calls are asynchronous: they enqueue work on `stream` and return. The status
 *   says whether the work was launched (bad arguments, launch and cuBLAS
 *   errors, with file:line in fsdp_last_error()); a fault while the work runs
 *   surfaces at the next synchronising CUDA call, as CUDA errors do.
 * - No call allocates device memory (the engine allocates nothing inside a
 *   step). Scratch that the GPU needs and the CPU keeps on its stack is passed
 *   in. The one exception is the first cuBLAS call on a (device, stream): it
 *   creates that stream's cuBLAS handle and cuBLASLt workspace unless
 *   fsdp_cuda_blas_prepare did (see fsdp_cuda_blas_release).
 * - bf16 values are stored as uint16_t bit patterns, as fsdp_f32_to_bf16 makes
 *   them. With dtype bf16 activations, weights and activation gradients are
 *   bf16, while parameter gradients (dweight, dbias, dwte, dwpe) and
 *   statistics (mean, rstd) stay fp32 (losses fp64): they are the engine's full
 *   gradient buffer in the default fp32 reduce dtype, and accumulating
 *   micro-batches in bf16 would drop everything below 2^-8 of the running sum.
 *   All arithmetic is fp32 (double where noted); each result is rounded once,
 *   except a product with a bias in bf16, stored and then rounded again with
 *   the bias added (blas.cu says why).
 * - Deterministic: every kernel gives the same bits run to run on a device
 *   (cuBLAS does, with one handle per stream), except the dwte scatter of
 *   fsdp_cuda_embedding_backward (float atomicAdd: the order in which repeated
 *   tokens add varies, a few ulps).
 * Thread safety: as CUDA's; kernels may be called from several host threads. */
#ifndef FSDP_CUDA_KERNELS_H
#define FSDP_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/compute.h"
#include "fsdp/core.h"
#include "fsdp/device.h"
#include "fsdp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the compute table's CUDA entry points (src/backend/compute.h) ----
 * Each is the table slot of the same name, with the semantics documented
 * there; compute_cuda.c fills the table with them. One entry point per op,
 * generic over the storage dtype (f32 or bf16; any other is refused naming
 * the op), the stream an fsdp CUDA stream. Matrix products use cuBLAS with
 * fp32 compute, never TF32. */

/* GPT-2 pads V to a multiple of 128 for ld, so that every leading dimension
 * of the three vocabulary products is aligned for the tensor-core kernels. */
fsdp_status_t fsdp_cuda_head_forward(const fsdp_head_forward_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_head_backward(const fsdp_head_backward_args_t *a, fsdp_stream_t stream);
/* dwpe[t] += sum over b in order (deterministic); dwte rows += dout by float
 * atomicAdd (repeated tokens add in a varying order: a few ulps). Without wpe
 * (NULL) the forward copies wte's rows, and a NULL dwpe is not written. */
fsdp_status_t fsdp_cuda_embedding_forward(const fsdp_embedding_forward_args_t *a,
                                          fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_embedding_backward(const fsdp_embedding_backward_args_t *a,
                                           fsdp_stream_t stream);
/* Multi-head or grouped-query (NKV KV heads, 0: NH; qkv rows (NH+2*NKV)*D).
 * f32: att keeps the (B,NH,T,T) probabilities; the score and value products
 * of each batch row are strided-batched cuBLAS calls over its KV heads, once
 * per query head of a group (attention.cu); scratch is NH*T*T floats for
 * backward; out is not read. bf16: cuDNN where it runs the shape
 * (attention_choice.cu), else the fused causal flash kernel (flash.cu:
 * FlashAttention-2 on mma.sync, the scores in registers, tiles wholly above
 * the diagonal skipped); att keeps only the (B,NH,T) fp32 log-sum-exp of each
 * row's scaled scores, backward recomputes p = exp(s - lse), reads forward's
 * out for D = rowsum(dout * out) and keeps D in scratch (B*NH*T floats). bf16
 * needs a head size C/NH that is a multiple of 16 up to 128 (GPT-2's is 64)
 * and 16-byte aligned tensors: else FSDP_ERR_INVALID_ARGUMENT naming the
 * value. No bound on T. */
size_t fsdp_cuda_attention_state_floats(const fsdp_attention_forward_args_t *a);
size_t fsdp_cuda_attention_scratch_bytes(const fsdp_attention_forward_args_t *a);
fsdp_status_t fsdp_cuda_attention_forward(const fsdp_attention_forward_args_t *a,
                                          fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_attention_backward(const fsdp_attention_backward_args_t *a,
                                           fsdp_stream_t stream);
/* The fused slots (issue 15 item 4). The products write their outputs with
 * beta = 0 and one vectorised pass follows (+ bias, GELU; gelu' on d(input)):
 * blas.cu says why that pass is ours and not a cuBLASLt epilogue. scratch:
 * fsdp_cuda_colsum_scratch_bytes(cols) bytes, the partial column sums of up
 * to 128 row slices (added in slice order: deterministic). 16-byte vector
 * access wherever the pointers are 16-byte aligned and rows are whole packs,
 * the scalar form of the same kernel elsewhere. */
size_t fsdp_cuda_colsum_scratch_bytes(int cols);
fsdp_status_t fsdp_cuda_matmul_forward(const fsdp_matmul_forward_args_t *a,
                                       fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_matmul_backward(const fsdp_matmul_backward_args_t *a,
                                        fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_layernorm_fused_forward(const fsdp_layernorm_forward_args_t *a,
                                                fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_layernorm_fused_backward(const fsdp_layernorm_backward_args_t *a,
                                                 fsdp_stream_t stream);
/* The MLP's ReLU, in place (elementwise.cu). */
fsdp_status_t fsdp_cuda_relu_forward(const fsdp_relu_forward_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_relu_backward(const fsdp_relu_backward_args_t *a, fsdp_stream_t stream);
/* One block per row; the exponential sum and the loss in double, as on the
 * CPU. A bf16 row whose gradient is written is read from global memory once,
 * into shared memory, when V rounded up to a multiple of 8, times 2 bytes,
 * plus 384 bytes of the block's scratch fits two blocks to an SM: at most the
 * device's cudaDevAttrMaxSharedMemoryPerBlockOptin and half its
 * cudaDevAttrMaxSharedMemoryPerMultiprocessor less
 * cudaDevAttrReservedSharedMemoryPerBlock (V <= 57664 on an H100: GPT-2's
 * 50257, not Llama-3's 128256); every other row is read twice. Both give the
 * same bits. fsdp_cuda_xent_staged_bytes says which on the current device:
 * *bytes, the row's shared memory, or 0 (read twice); it opts the kernels in
 * to the device's shared memory (cudaFuncSetAttribute) the first time,
 * thread-safe, and fails naming the CUDA error. */
fsdp_status_t fsdp_cuda_xent(const fsdp_xent_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_xent_staged_bytes(const fsdp_xent_args_t *a, size_t *bytes);
/* The Llama family's layers (llama.cu). RMSNorm: a warp per row as LayerNorm,
 * dweight's column sums through scratch (fsdp_cuda_colsum_scratch_bytes(C);
 * NULL is FSDP_ERR_INVALID_ARGUMENT, as a NULL dinp). RoPE: NKV 0 means
 * NH; NKV must divide NH, D be even, pos0 + T at most 2^24 (positions exact in
 * fp32), else FSDP_ERR_INVALID_ARGUMENT naming the values; cos and sin with
 * CUDA's full-range cosf/sinf. SwiGLU: d(input) written, not added (its
 * descriptor's contract). */
fsdp_status_t fsdp_cuda_rmsnorm_forward(const fsdp_rmsnorm_forward_args_t *a,
                                        fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_rmsnorm_backward(const fsdp_rmsnorm_backward_args_t *a,
                                         fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_rope_forward(const fsdp_rope_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_rope_backward(const fsdp_rope_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_swiglu_forward(const fsdp_swiglu_forward_args_t *a,
                                       fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_swiglu_backward(const fsdp_swiglu_backward_args_t *a,
                                        fsdp_stream_t stream);

/* ---- cuBLAS handles: the table's prepare and release ---- */

/* Destroys the cuBLAS handles the matrix products created, one per (device,
 * stream) they ran on, at most FSDP_CUDA_MAX_BLAS_HANDLES, with each one's
 * cuBLASLt workspace (32 MiB from compute capability 9 on, 4 MiB before;
 * FSDP_CUBLASLT_WORKSPACE_KIB sets it, 0 for none), and the cuBLASLt
 * handle of each device with its cached epilogue decisions. Call it when no
 * kernel is running and no thread is in a product, before destroying those
 * streams (a handle keeps its
 * stream's address; a new stream at the same address would inherit it). */
#define FSDP_CUDA_MAX_BLAS_HANDLES 32
fsdp_status_t fsdp_cuda_blas_release(void);
/* Creates the cuBLAS handle of (current device, stream) and, with cuBLASLt
 * present, its cuBLASLt workspace now, so that no product pays for them
 * later (the engine calls it at materialize, not at the first product while
 * gathers are in flight). *created (may be NULL): 1 when this call made
 * them, 0 when they were there. Errors: FSDP_ERR_OUT_OF_MEMORY naming the
 * workspace's size when the device has no room for it,
 * FSDP_ERR_INVALID_ARGUMENT for a bad FSDP_CUBLASLT_WORKSPACE_KIB. */
fsdp_status_t fsdp_cuda_blas_prepare(fsdp_stream_t stream, int *created);

/* ---- the engine's shard kernels (fp32 shards): the table's slots ---- */

/* AdamW and SGD with the semantics of fsdp_adamw_update / fsdp_sgd_update
 * (the bias corrections are computed on the host in double, as there).
 * AdamW over a whole shard in one launch (the engine's step: one per unit
 * instead of two per tensor piece); runs in device memory. Gradients are
 * read times coef (clipping; not written back). The same arithmetic as
 * fsdp_adamw_update on each run after the gradients were scaled. */
fsdp_status_t fsdp_cuda_adamw_multi(const fsdp_adamw_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_sgd_update(const fsdp_sgd_args_t *a, fsdp_stream_t stream);

/* Sum of squares, deterministic: the grid depends on n alone, each block
 * reduces its part in a fixed order into partials (FSDP_CUDA_SUMSQ_PARTIALS
 * doubles of the caller's), and one block adds those in a fixed order. */
#define FSDP_CUDA_SUMSQ_PARTIALS 512
fsdp_status_t fsdp_cuda_sum_squares(const fsdp_sum_squares_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_scale(const fsdp_scale_args_t *a, fsdp_stream_t stream);
fsdp_status_t fsdp_cuda_axpy(const fsdp_axpy_args_t *a, fsdp_stream_t stream);
/* Casts: f32 to bf16 or f16 with fsdp_f32_to_bf16's / fsdp_f32_to_f16's exact
 * rounding (nearest even; NaN stays a quiet NaN with its sign and top payload
 * bits; fp16 overflows to inf, keeps subnormals), and the widening inverses:
 * fp16 parameters are gathered, not computed in, so casts are all the fp16
 * kernels there are. */
fsdp_status_t fsdp_cuda_cast(const fsdp_cast_args_t *a, fsdp_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
