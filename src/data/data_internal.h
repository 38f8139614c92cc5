/* src/data/data_internal.h — the hash shared by the text windows and the
 * sampler. Not installed. */
#ifndef FSDP_DATA_INTERNAL_H
#define FSDP_DATA_INTERNAL_H

#include <stdint.h>

/* splitmix64's output function: a bijective 64-bit mixer with full avalanche,
 * so counters and seeds that differ in one bit give unrelated draws. */
static inline uint64_t fsdp_data_mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* The key of stream (seed, a): seed and a pass through the mixer separately
 * so that (seed, a) and (seed + 1, a - 1) do not collide. */
static inline uint64_t fsdp_data_key(uint64_t seed, uint64_t a) {
  return fsdp_data_mix64(fsdp_data_mix64(seed) ^ (a + 1) * 0x9E3779B97F4A7C15ULL);
}

#endif
