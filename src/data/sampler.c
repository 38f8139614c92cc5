/* src/data/sampler.c — the distributed sampler: one permutation of the samples
 * per epoch, drawn from (seed, epoch) only, cut into full global batches that
 * ranks share by offset. */
#include <string.h>

#include "core/internal.h"
#include "data/data_internal.h"
#include "fsdp/data.h"

fsdp_status_t fsdp_sampler_init(fsdp_sampler_t *s, size_t n, int64_t global_batch, uint64_t seed) {
  if (!s) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "sampler init: s must not be NULL");
  if (n == 0 || n > UINT32_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "sampler init: %zu samples; need between 1 and %u (indices are uint32)", n,
                      UINT32_MAX);
  if (global_batch < 1 || (uint64_t)global_batch > n)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "sampler init: global batch %lld must be in [1, %zu], the number of samples",
                      (long long)global_batch, n);
  /* Allocated here so fsdp_sampler_batch never fails for want of memory. */
  uint32_t *perm = fsdp_alloc(n * sizeof *perm);
  if (!perm)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                      "sampler init: cannot allocate a permutation of %zu samples", n);
  s->n = n;
  s->global_batch = global_batch;
  s->batches_per_epoch = (int64_t)(n / (uint64_t)global_batch);
  s->seed = seed;
  s->epoch = -1;
  s->perm = perm;
  return FSDP_SUCCESS;
}

void fsdp_sampler_free(fsdp_sampler_t *s) {
  if (!s) return;
  fsdp_free(s->perm);
  memset(s, 0, sizeof *s);
  s->epoch = -1;
}

/* Fisher–Yates over [0, n), draws from a counter-based splitmix64 stream keyed
 * by (seed, epoch). */
static void sampler_shuffle(fsdp_sampler_t *s, int64_t epoch) {
  uint64_t key = fsdp_data_key(s->seed, (uint64_t)epoch);
  for (size_t i = 0; i < s->n; i++) s->perm[i] = (uint32_t)i;
  for (size_t i = s->n - 1; i > 0; i--) {
    uint64_t r = fsdp_data_mix64(key + (uint64_t)i * 0x9E3779B97F4A7C15ULL);
    /* n <= 2^32, so the modulo bias is at most 2^-32 per draw. */
    size_t j = (size_t)(r % (uint64_t)(i + 1));
    uint32_t t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
  }
  s->epoch = epoch;
}

fsdp_status_t fsdp_sampler_batch(fsdp_sampler_t *s, int64_t epoch, int64_t batch, int64_t first,
                                 int64_t count, uint32_t *indices) {
  if (!s || !s->perm || !indices)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "sampler batch: s (initialised) and indices must not be NULL");
  if (epoch < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "sampler batch: epoch %lld is negative",
                      (long long)epoch);
  if (batch < 0 || batch >= s->batches_per_epoch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "sampler batch: batch %lld outside [0, %lld): %zu samples make %lld full "
                      "batches of %lld",
                      (long long)batch, (long long)s->batches_per_epoch, s->n,
                      (long long)s->batches_per_epoch, (long long)s->global_batch);
  if (first < 0 || count < 1 || first >= s->global_batch || count > s->global_batch - first)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "sampler batch: samples [%lld, %lld + %lld) are not a non-empty part of the "
                      "global batch of %lld",
                      (long long)first, (long long)first, (long long)count,
                      (long long)s->global_batch);
  if (s->epoch != epoch) sampler_shuffle(s, epoch);
  const uint32_t *src = s->perm + batch * s->global_batch + first;
  memcpy(indices, src, (size_t)count * sizeof *indices);
  return FSDP_SUCCESS;
}
