/* src/backend/cuda/attention_cudnn.h — bf16 causal attention through cuDNN's fused
 * scaled-dot-product attention (attention_cudnn.cpp), and the choice between
 * it and the in-house flash kernel (attention_choice.cu). C linkage, for the
 * .cu files and the cuda tests.
 *
 * Layout, the table's (src/backend/compute.h): NH query heads and NKV
 * key/value heads of HS = C/NH (NKV 0 means NH; NKV divides NH, query head h
 * reading KV head h / (NH/NKV): grouped-query attention, which cuDNN's SDPA
 * takes as K and V tensors of NKV heads); qkv (B,T,(NH+2*NKV)*HS) with q of
 * head h at column h*HS, k and v of KV head g at C + g*HS and C + (NKV+g)*HS
 * ((B,T,3C) for NKV = NH); out (B,T,C); stats (B,NH,T) fp32, the natural
 * log-sum-exp of each query row's scaled causal scores (cuDNN's softmax
 * stats, what flash.cu calls lse). Scale 1/sqrt(HS), causal (a query sees the
 * keys at or before it).
 *
 * cuDNN is opened at first use (dlopen: $FSDP_CUDNN_LIBRARY, else
 * libcudnn.so.9 on the library path); libfsdp does not link it. Graphs are
 * built once per (device, B, T, NH, NKV, HS), with a handle of the device's own
 * that runs nothing; both are kept for the process. Each (device, stream)
 * pair that runs attention gets its own cuDNN handle, bound to the stream
 * once, and its workspace (cudaMalloc at first use and when a larger shape
 * needs more; the one place besides cuBLAS's handles where an attention call
 * allocates device memory), until fsdp_cudnn_attention_release. Thread-safe. */
#ifndef FSDP_CUDA_ATTENTION_CUDNN_H
#define FSDP_CUDA_ATTENTION_CUDNN_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- attention_choice.cu: which kernel runs a bf16 shape ---- */

/* Sets *use_cudnn for this shape on the current device, deciding it the
 * first time the (device, B, T, C, NH, NKV) is seen: cuDNN when it loads and
 * both its graphs (forward with stats, backward) build for the shape, else
 * the in-house flash kernel. $FSDP_ATTENTION (read once) forces a path:
 * "flash", or "cudnn", where a shape cuDNN cannot run is
 * FSDP_ERR_UNSUPPORTED with cuDNN's reason; any other value is
 * FSDP_ERR_INVALID_ARGUMENT. Grouped-query shapes (NKV neither 0 nor NH)
 * go the same way as multi-head ones; an NKV that does not divide NH is
 * FSDP_ERR_INVALID_ARGUMENT. The same answer for forward and backward, so a
 * backward always reads the stats its own kind of forward wrote. */
fsdp_status_t fsdp_cuda_attention_pick(int B, int T, int C, int NH, int NKV, int *use_cudnn);
/* For tests and tools: the mode as $FSDP_ATTENTION would set it ("auto",
 * "flash", "cudnn"), replacing the environment's, and forgetting every
 * decision made so far. Not while attention runs on another thread. */
fsdp_status_t fsdp_cuda_attention_set_mode(const char *mode);

/* ---- attention_cudnn.cpp: cuDNN itself (built where its headers were found) ---- */

/* Whether cuDNN is open (opening it on the first call); *text is then
 * "cudnn 9.x.y (/path/libcudnn.so.9)", else why not. The text lives for the
 * process. */
int fsdp_cudnn_load(const char **text);
/* Builds (once) the forward and backward graphs of this shape on the current
 * device; an error says why cuDNN refused it. */
fsdp_status_t fsdp_cudnn_attention_prepare(int B, int T, int C, int NH, int NKV);
/* out and stats written. Pointers device memory, 16-byte aligned. */
fsdp_status_t fsdp_cudnn_attention_forward(void *out, float *stats, const void *qkv, int B, int T,
                                           int C, int NH, int NKV, cudaStream_t stream);
/* The gradient of qkv written into dqkv (qkv's layout; every element
 * written, what was there not read). Pointers device memory, 16-byte
 * aligned. */
fsdp_status_t fsdp_cudnn_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                            const void *out, const float *stats, int B, int T,
                                            int C, int NH, int NKV, cudaStream_t stream);
/* Destroys every (device, stream) pair's handle and frees its workspace (the
 * graphs and their builder handles stay); the CUDA
 * table's release calls it. Call it when no attention runs, before those
 * streams are destroyed (a handle keeps its stream's address; a new stream
 * at the same address would inherit it). Releases every pair even when one
 * fails, reporting the first failure; FSDP_SUCCESS where nothing was made. */
fsdp_status_t fsdp_cudnn_attention_release(void);

#ifdef __cplusplus
}
#endif

#endif
