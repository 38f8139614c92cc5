/* src/engine/shard.h — engine-internal helpers for flat-shard initialisation.
 * Not installed; the public pieces (fsdp_shard_layout, fsdp_init_value) live in
 * fsdp/engine.h. */
#ifndef FSDP_ENGINE_SHARD_H
#define FSDP_ENGINE_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/engine.h"

/* dst[i] = fsdp_init_value(seed, name, first_index + i, kind, scale) for i < n,
 * with the name hashed once: a rank fills its slice of a tensor this way. */
void fsdp_init_fill(float *dst, size_t n, uint64_t seed, const char *name, size_t first_index,
                    fsdp_init_kind_t kind, float scale);

#endif
