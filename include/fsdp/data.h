/* fsdp/data.h — datasets and the distributed sampler.
 *
 * Readers load a whole (small) dataset into memory the caller frees with the
 * matching _free call. Missing, truncated or malformed files fail with
 * FSDP_ERR_IO (missing, unreadable, too short) or FSDP_ERR_FORMAT (wrong magic,
 * sizes that disagree) and a message naming the
 * file and what is wrong; outputs are untouched on failure.
 *
 * The sampler decides which samples form each global batch from (seed, epoch)
 * alone: never from the world size. Rank r of N takes its contiguous share of
 * each global batch, so one global batch size gives the same trajectory at any N.
 * Thread safety: all functions are reentrant; a sampler caches the permutation
 * of the epoch last asked for, so threads sharing one serialise their
 * fsdp_sampler_batch calls. */
#ifndef FSDP_DATA_H
#define FSDP_DATA_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* IDX images (magic 0x00000803, u8, n x rows x cols) and labels (0x00000801, u8),
 * plain or gzip-compressed (as Fashion-MNIST ships). */
typedef struct {
  int n, rows, cols;
  uint8_t *images; /* (n, rows, cols) */
  uint8_t *labels; /* (n) */
} fsdp_idx_dataset_t;

FSDP_API fsdp_status_t fsdp_idx_load(const char *images_path, const char *labels_path,
                                     fsdp_idx_dataset_t *out);
FSDP_API void fsdp_idx_free(fsdp_idx_dataset_t *ds);
/* Loads <dir>/<split>-images-idx3-ubyte.gz and <dir>/<split>-labels-idx1-ubyte.gz,
 * split "train" or "t10k". */
FSDP_API fsdp_status_t fsdp_fashion_mnist_load(const char *dir, const char *split,
                                               fsdp_idx_dataset_t *out);

/* Bytes of text: a file, or every regular file of a directory in strcmp name
 * order, joined by newlines. In a directory, symlinks, hidden files and names
 * ending in ".dat" or ".u8" (fortune indexes and aliases) are skipped. An
 * empty result is FSDP_ERR_FORMAT. The last val_fraction (in [0, 0.5]) of the
 * bytes is the validation split: n_train = n - (size_t)(n * val_fraction). */
typedef struct {
  uint8_t *bytes;
  size_t n;       /* all bytes */
  size_t n_train; /* bytes [0, n_train) train, [n_train, n) validate */
} fsdp_text_t;

FSDP_API fsdp_status_t fsdp_text_load(const char *path, double val_fraction, fsdp_text_t *out);
FSDP_API void fsdp_text_free(fsdp_text_t *text);

/* Sampler over n samples with a global batch of `global_batch`: each epoch is a
 * permutation of [0, n) drawn from (seed, epoch); the trailing n % global_batch
 * samples of a permutation are dropped, so every batch is full. */
typedef struct {
  size_t n;
  int64_t global_batch, batches_per_epoch;
  uint64_t seed;
  int64_t epoch;   /* the epoch perm holds, -1 none */
  uint32_t *perm;  /* (n) */
} fsdp_sampler_t;

FSDP_API fsdp_status_t fsdp_sampler_init(fsdp_sampler_t *s, size_t n, int64_t global_batch,
                                         uint64_t seed);
FSDP_API void fsdp_sampler_free(fsdp_sampler_t *s);
/* Indices of samples [first, first+count) of global batch `batch` of `epoch`:
 * a rank passes its offset and micro-batch size from fsdp_engine_shard_batch. */
FSDP_API fsdp_status_t fsdp_sampler_batch(fsdp_sampler_t *s, int64_t epoch, int64_t batch,
                                          int64_t first, int64_t count, uint32_t *indices);

/* Random windows of text for a language model: global sample k of step `step`
 * starts at a position drawn from (seed, step, k) in [lo, hi - T - 1]; tokens
 * (count, T) are bytes from there, targets the next bytes. */
FSDP_API fsdp_status_t fsdp_text_windows(const fsdp_text_t *text, int validation,
                                         uint64_t seed, int64_t step, int64_t first,
                                         int64_t count, int T, int *tokens, int *targets);

#ifdef __cplusplus
}
#endif
#endif
