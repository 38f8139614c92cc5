/* src/data/data_internal.h — what the data readers share: the hash behind the
 * sampler and the language-model windows, the windows' checks and starts,
 * and the listing of text files. Not installed. */
#ifndef FSDP_DATA_INTERNAL_H
#define FSDP_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/core.h"

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

/* Checks a request for `count` windows of T tokens (plus the next) from the
 * split [lo, hi) of a corpus of `unit` ("bytes", "tokens") and gives the key
 * of step's draws and the number of possible starts. */
fsdp_status_t data_windows_check(const char *unit, int validation, size_t lo, size_t hi,
                                 uint64_t seed, int64_t step, int64_t first, int64_t count, int T,
                                 uint64_t *key, uint64_t *starts);

/* Where global sample k of a step starts: a pure function of (seed, step, k),
 * so any rank count draws the same windows. Starts lie in [lo, hi - T - 1]. */
static inline size_t data_window_start(uint64_t key, int64_t k, size_t lo, uint64_t starts) {
  uint64_t r = fsdp_data_mix64(key ^ fsdp_data_mix64((uint64_t)k));
  /* The modulo favours some starts by at most starts / 2^64: nothing a run can see. */
  return lo + (size_t)(r % starts);
}

/* The text files `path` names: itself when a regular file, else the files of
 * the directory as fsdp_text_load reads them (fsdp/data.h), in name order, as
 * malloc'd "dir/name" paths in a malloc'd array. */
fsdp_status_t data_text_files(const char *path, char ***paths, size_t *count);
void data_text_files_free(char **paths, size_t count);

#endif
