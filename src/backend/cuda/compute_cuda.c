/* src/backend/cuda/compute_cuda.c — the CUDA compute table: src/backend/cuda's entry points
 * themselves in the slots, no adapter between a caller and the kernel's
 * dtype dispatch (release alone joins two). Built only with CUDA (meson.build). */
#include <stdio.h>

#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/kernels.h"
#include "backend/compute.h"
#include "core/internal.h"

/* The release slot: cuBLAS's handles, then cuDNN attention's per-stream
 * handles and buffers, the second even when the first fails (whose error is
 * the one reported). */
static fsdp_status_t cuda_release(void) {
  const fsdp_status_t blas = fsdp_cuda_blas_release();
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", fsdp_last_error());
  const fsdp_status_t cudnn = fsdp_cudnn_attention_release();
  if (blas == FSDP_SUCCESS) return cudnn;
  fsdp_error_set(keep);
  return blas;
}

const fsdp_compute_ops_t fsdp_compute_cuda_ops = {
    .name = "cuda",
    .device = FSDP_DEVICE_CUDA,
    .sum_squares_partials = FSDP_CUDA_SUMSQ_PARTIALS,
    .head_forward = fsdp_cuda_head_forward,
    .head_backward = fsdp_cuda_head_backward,
    .embedding_forward = fsdp_cuda_embedding_forward,
    .embedding_backward = fsdp_cuda_embedding_backward,
    .attention_state_floats = fsdp_cuda_attention_state_floats,
    .attention_scratch_bytes = fsdp_cuda_attention_scratch_bytes,
    .attention_forward = fsdp_cuda_attention_forward,
    .attention_backward = fsdp_cuda_attention_backward,
    .xent = fsdp_cuda_xent,
    .colsum_scratch_bytes = fsdp_cuda_colsum_scratch_bytes,
    .matmul_forward = fsdp_cuda_matmul_forward,
    .matmul_backward = fsdp_cuda_matmul_backward,
    .layernorm_fused_forward = fsdp_cuda_layernorm_fused_forward,
    .layernorm_fused_backward = fsdp_cuda_layernorm_fused_backward,
    .relu_forward = fsdp_cuda_relu_forward,
    .relu_backward = fsdp_cuda_relu_backward,
    .rmsnorm_forward = fsdp_cuda_rmsnorm_forward,
    .rmsnorm_backward = fsdp_cuda_rmsnorm_backward,
    .rope_forward = fsdp_cuda_rope_forward,
    .rope_backward = fsdp_cuda_rope_backward,
    .swiglu_forward = fsdp_cuda_swiglu_forward,
    .swiglu_backward = fsdp_cuda_swiglu_backward,
    .sum_squares = fsdp_cuda_sum_squares,
    .scale = fsdp_cuda_scale,
    .axpy = fsdp_cuda_axpy,
    .cast = fsdp_cuda_cast,
    .adamw_multi = fsdp_cuda_adamw_multi,
    .sgd_update = fsdp_cuda_sgd_update,
    .prepare = fsdp_cuda_blas_prepare,
    .release = cuda_release,
};
