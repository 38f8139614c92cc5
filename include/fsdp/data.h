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
 * llm.c's token files (its dev/data scripts write them, and fsdp-tokenize): a
 * header of 256 little-endian int32 (magic, version, the token count, the
 * rest 0), then count little-endian tokens of the format's width:
 *   GPT-2    magic 20240520, version 1, uint16 tokens (vocabularies of <= 65536)
 *   Llama 3  magic 20240801, version 7, uint32 tokens (larger ones: 128256)
 * The file's size is exactly 1024 + width x count bytes. A dataset is one
 * such file, or every regular ".bin" file of a directory in strcmp name
 * order, end to end (other files are ignored), held in memory at the files'
 * width; the files of one dataset share one format. The validation split is
 * the last val_fraction of the tokens, as for text. Truncated files, a wrong
 * magic, version or count, a uint32 token above INT32_MAX, files of both
 * formats in one directory, and a directory without ".bin" files fail with
 * FSDP_ERR_IO or FSDP_ERR_FORMAT naming the file and the values. */
#define FSDP_TOKEN_FILE_MAGIC 20240520        /* GPT-2: uint16 tokens */
#define FSDP_TOKEN_FILE_VERSION 1
#define FSDP_TOKEN_FILE_MAGIC_LLAMA3 20240801 /* Llama 3: uint32 tokens */
#define FSDP_TOKEN_FILE_VERSION_LLAMA3 7
#define FSDP_TOKEN_FILE_HEADER 1024 /* bytes */

typedef struct {
  void *tokens;        /* (n) uint16_t when width is 2, uint32_t when 4: read with fsdp_tokens_at */
  int width;           /* bytes per token: 2 (GPT-2 files) or 4 (Llama 3 files) */
  size_t n;            /* all tokens */
  size_t n_train;      /* tokens [0, n_train) train, [n_train, n) validate */
  int max_token;       /* the largest token */
  int n_files;
  char **files;        /* (n_files) the paths read */
  size_t *file_start;  /* (n_files + 1) file f holds tokens [file_start[f], file_start[f+1]) */
} fsdp_tokens_t;

/* Token i (< tokens->n) of loaded token data. */
static inline int fsdp_tokens_at(const fsdp_tokens_t *tokens, size_t i) {
  return tokens->width == 4 ? (int)((const uint32_t *)tokens->tokens)[i]
                            : ((const uint16_t *)tokens->tokens)[i];
}

/* 1 when path is token data: a regular file that starts with either magic or
 * is named ".bin", or a directory holding a ".bin" file; else 0. */
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
/* The width (2 or 4 bytes) of the token files of a vocabulary of vocab_size
 * ids: GPT-2's uint16 files when every id fits, else Llama 3's uint32. */
FSDP_API int fsdp_token_file_width(int vocab_size);
/* Writes ids[0..n) as a token file of `width` bytes a token (2: GPT-2's
 * format, 4: Llama 3's) at path (via path.tmp and a rename). Ids must lie in
 * [0, 65535] for width 2, [0, INT32_MAX] for 4: else FSDP_ERR_INVALID_ARGUMENT
 * naming the position and value. An existing path is refused
 * (FSDP_ERR_INVALID_USAGE) unless overwrite. */
FSDP_API fsdp_status_t fsdp_token_file_write(const char *path, const int *ids, size_t n,
                                             int width, int overwrite);

#ifdef __cplusplus
}
#endif
#endif
