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

/* ---- token files ------------------------------------------------------------
 * llm.c's GPT-2 token file (llm.c's dev/data scripts write them, and fsdp-tokenize):
 * a header of 256 little-endian int32 (magic 20240520, version 1, the token
 * count, the rest 0), then count little-endian uint16 tokens; the file's size
 * is exactly 1024 + 2 x count bytes. A dataset is one such file, or every
 * regular ".bin" file of a directory in strcmp name order, end to end (other
 * files are ignored), held in memory. The validation split is the last
 * val_fraction of the tokens, as for text. Truncated files, a wrong magic
 * (llm.c's Llama-3 uint32 files named as such), version or count, and a
 * directory without ".bin" files fail with FSDP_ERR_IO or FSDP_ERR_FORMAT
 * naming the file and the values. */
#define FSDP_TOKEN_FILE_MAGIC 20240520
#define FSDP_TOKEN_FILE_VERSION 1
#define FSDP_TOKEN_FILE_HEADER 1024 /* bytes */

typedef struct {
  uint16_t *tokens;    /* (n) */
  size_t n;            /* all tokens */
  size_t n_train;      /* tokens [0, n_train) train, [n_train, n) validate */
  int max_token;       /* the largest token */
  int n_files;
  char **files;        /* (n_files) the paths read */
  size_t *file_start;  /* (n_files + 1) file f holds tokens [file_start[f], file_start[f+1]) */
} fsdp_tokens_t;

/* 1 when path is token data: a regular file that starts with the magic or is
 * named ".bin", or a directory holding a ".bin" file; else 0. */
FSDP_API int fsdp_tokens_probe(const char *path);
FSDP_API fsdp_status_t fsdp_tokens_load(const char *path, double val_fraction,
                                        fsdp_tokens_t *out);
FSDP_API void fsdp_tokens_free(fsdp_tokens_t *tokens);
/* FSDP_ERR_INVALID_ARGUMENT naming the file, the position in it and the
 * value of the first token >= vocab_size (a model cannot embed it). */
FSDP_API fsdp_status_t fsdp_tokens_check_vocab(const fsdp_tokens_t *tokens, int vocab_size);
/* fsdp_text_windows over tokens: the same starts for the same (seed, step, k). */
FSDP_API fsdp_status_t fsdp_tokens_windows(const fsdp_tokens_t *tokens, int validation,
                                           uint64_t seed, int64_t step, int64_t first,
                                           int64_t count, int T, int *ids, int *targets);
/* Writes ids[0..n) as a token file at path (via path.tmp and a rename). Ids
 * must lie in [0, 65535]: else FSDP_ERR_INVALID_ARGUMENT naming the position
 * and value. An existing path is refused (FSDP_ERR_INVALID_USAGE) unless
 * overwrite. */
FSDP_API fsdp_status_t fsdp_token_file_write(const char *path, const int *ids, size_t n,
                                             int overwrite);

#ifdef __cplusplus
}
#endif
#endif
