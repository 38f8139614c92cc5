/* tests/common/ckpt_model.h — what the checkpoint tests share: a model of
 * prime-sized tensors driven directly through the engine, deterministic
 * training on synthetic samples, and checkpoint comparison through the offline
 * reader. Helpers return 0 on success and print what failed otherwise. */
#ifndef FSDP_TESTS_COMMON_CKPT_MODEL_H
#define FSDP_TESTS_COMMON_CKPT_MODEL_H

#include "fsdp/ckpt.h"
#include "fsdp/fsdp.h"

#define CKM_GLOBAL_BATCH 12 /* divisible by N = 1..4 */
#define CKM_TOTAL_STEPS 20

typedef enum {
  CKM_BASE = 0,  /* units u0..u3 of prime-sized tensors */
  CKM_RESHAPED,  /* the same with u1.w one element shorter: a different model */
  CKM_REWRAPPED  /* the same tensors grouped into two units */
} ckm_variant_t;

/* An engine with the model, materialised with seed. NULL on failure. */
fsdp_engine_t ckm_create(fsdp_world_t world, fsdp_strategy_t strategy, fsdp_optim_kind_t optim,
                         ckm_variant_t variant, uint64_t seed);
/* The same under HSDP: shard_size ranks per shard group (0: the world). */
fsdp_engine_t ckm_create_sharded(fsdp_world_t world, fsdp_strategy_t strategy,
                                 fsdp_optim_kind_t optim, ckm_variant_t variant, uint64_t seed,
                                 int shard_size);
/* Runs `steps` updates from the engine's current step: the data of step s is a
 * function of s only, so resumed runs see what uninterrupted ones see. reverse
 * sums each rank's samples in reverse order (the fp32 noise-floor run). */
int ckm_train(fsdp_engine_t e, int steps, int reverse);
/* Compares two checkpoints' tensors in every state: *dist the largest
 * relative difference (max |a - b| / max |a| per tensor and state), *bitwise
 * whether every element has the same bits. -1 when they cannot be compared
 * (unreadable, different tensor tables or states). */
int ckm_compare(const char *path_a, const char *path_b, double *dist, int *bitwise);
/* Bytes this rank holds of master + optimizer state, copied out in unit
 * order (capacity elements, padding included), for before/after checks. */
size_t ckm_snapshot(fsdp_engine_t e, float *out);

#endif
