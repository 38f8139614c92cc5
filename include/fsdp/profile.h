/* fsdp/profile.h — per-kernel-class accounting: the classes of kernels a
 * training step runs (bench/gpu-budget.md's), and their time on the engine's
 * compute stream when profiling is on. What each class should cost (FLOPs
 * and bytes) is fsdp_gpt2_kernel_costs and fsdp_llama_kernel_costs
 * (fsdp/nn.h); a model leaves the classes it has no kernels for at zero (GPT-2
 * the RMSNorm, RoPE and SwiGLU ones, a Llama the LayerNorm ones); fsdp-bench
 * --kernel-profile puts the two together, listing the classes the model has.
 *
 * The class list is FSDP_KERNEL_CLASSES, one line per class: add or rename a
 * class there (and its cost in src/nn/gpt2_cost.c, its row's class in
 * bench/gpu_budget.py for GPT-2, check_bench.py's llama_costs for a Llama: the
 * kernel-profile tests hold them together).
 * FSDP_KC_COUNT grows when classes are added: pass the count your header has.
 *
 * Timing: between fsdp_engine_kclass_begin and _end of a class the caller
 * queues that class's kernels on fsdp_engine_stream. On CUDA a timing event
 * is recorded on the compute stream at each (no host function, no wait: the
 * pairs are read when they are done, at fsdp_engine_step and at
 * fsdp_engine_profile_read); on the CPU backend the kernels run in the caller
 * and the host clock times them. Scopes do not nest. Profiling is off by
 * default: begin and end then return at once. Thread safety: the engine's
 * thread. Errors: FSDP_ERR_INVALID_USAGE for a scope begun inside another or
 * ended without its begin; CUDA failures as FSDP_ERR_SYSTEM. */
#ifndef FSDP_PROFILE_H
#define FSDP_PROFILE_H

#include <stdint.h>

#include "fsdp/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(ID, "name"): the classes, in the order tables print them. */
#define FSDP_KERNEL_CLASSES(X)                                         \
  X(BLOCK_FWD, "block products, forward")   /* qkv, proj, fc, fcproj */ \
  X(BLOCK_BWD, "block products, backward")  /* bias gradients, gelu' */ \
  X(ATTN_FWD, "attention forward")                                     \
  X(ATTN_BWD, "attention backward")                                    \
  X(RESID_LN_FWD, "residual + LayerNorm forward")                      \
  X(LN_BWD, "LayerNorm backward")                                      \
  X(HEAD_FWD, "LM head forward")                                       \
  X(HEAD_BWD, "LM head backward")                                      \
  X(XENT, "cross-entropy")                                             \
  X(EMBED, "embedding")                                                \
  X(ADAMW, "AdamW")                                                    \
  X(RMSNORM_FWD, "residual + RMSNorm forward") /* the Llama family */  \
  X(RMSNORM_BWD, "RMSNorm backward")                                   \
  X(ROPE, "RoPE forward + backward")                                   \
  X(SWIGLU, "SwiGLU forward + backward")                               \
  X(GRAD_NORM, "gradient norm + zeroing") /* the engine's step */

typedef enum {
#define FSDP_KC_ENUM_(id, name) FSDP_KC_##id,
  FSDP_KERNEL_CLASSES(FSDP_KC_ENUM_)
#undef FSDP_KC_ENUM_
  FSDP_KC_COUNT
} fsdp_kclass_t;

/* "block products, forward", ...; "?" for a value outside the list. */
FSDP_API const char *fsdp_kclass_name(fsdp_kclass_t k);

typedef struct {
  int64_t calls;  /* scopes timed */
  double seconds; /* their summed time on the compute stream */
} fsdp_kclass_time_t;

/* on: starts profiling with zeroed sums (CUDA: makes the engine's timing
 * events, once); off: stops it, keeping the sums for a read. */
FSDP_API fsdp_status_t fsdp_engine_profile(fsdp_engine_t engine, int on);
FSDP_API fsdp_status_t fsdp_engine_kclass_begin(fsdp_engine_t engine, fsdp_kclass_t k);
FSDP_API fsdp_status_t fsdp_engine_kclass_end(fsdp_engine_t engine, fsdp_kclass_t k);
/* The sums since profiling started into out[0, n) (n <= FSDP_KC_COUNT; the
 * rest of the engine's classes are left out); waits for the compute stream. */
FSDP_API fsdp_status_t fsdp_engine_profile_read(fsdp_engine_t engine, fsdp_kclass_time_t *out,
                                                int n);

#ifdef __cplusplus
}
#endif
#endif
