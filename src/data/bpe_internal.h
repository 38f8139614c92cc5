/* src/data/bpe_internal.h — the tokenizer's tables, shared by the loaders
 * (bpe_load.c, bpe_json.c) and the encoder (bpe.c). Not installed. */
#ifndef FSDP_DATA_BPE_INTERNAL_H
#define FSDP_DATA_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/json.h"
#include "fsdp/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Open-addressing table from a token's bytes to its id. */
typedef struct {
  int *slot;  /* (cap) id, -1 empty */
  size_t cap; /* a power of two, at least twice the tokens */
} bpe_vocab_map_t;

/* Open-addressing table from an id pair to the merge's rank and result. */
typedef struct {
  uint64_t key; /* left << 32 | right; UINT64_MAX empty */
  int rank, id;
} bpe_merge_t;

/* A token matched in the text before pre-tokenisation (HF's added tokens). */
typedef struct {
  int id;
  int special;    /* matched only under FSDP_TOKENIZE_ALLOW_SPECIAL */
  int normalized; /* matched in the normalized text, after those matched in the raw text */
} bpe_added_t;

#define BPE_MAX_SPLITS 8    /* pre-tokenizer steps that split */
#define BPE_MAX_PATTERN 4096 /* bytes of one pre-tokenizer pattern */

struct fsdp_tokenizer {
  int n;             /* ids 0 .. n-1 */
  int n_model;       /* ids 0 .. n_model-1 are the BPE model's (map, merges); the rest added */
  char *bytes;       /* every token's bytes, end to end */
  size_t *off;       /* (n+1) token id's bytes are bytes[off[id], off[id+1]) */
  bpe_vocab_map_t map; /* the model's tokens only */
  bpe_merge_t *merges; /* (merge_cap) */
  size_t merge_cap, n_merges;
  int byte_id[256];  /* the single-byte token of each byte */
  int eot;           /* the document token ("<|endoftext|>", else a BOS), -1 none */
  int ignore_merges; /* a piece that is a token of the model is that token (Llama 3) */
  int nfc;           /* the normalizer: Unicode NFC (Qwen2's) */
  bpe_added_t *added;    /* (n_added) by first byte: those starting with byte b are */
  int n_added;           /* added[added_at[b] .. added_at[b+1]) */
  int added_at[257];
  pcre2_code *split[BPE_MAX_SPLITS]; /* (n_split) each splits every piece of the one before */
  int n_split;
};

/* GPT-2's byte-to-unicode alphabet: the code point byte b is spelled with,
 * and the byte of code point cp (-1 when cp spells no byte). */
int bpe_byte_char(int b);
int bpe_char_byte(uint32_t cp);

uint64_t bpe_hash(const char *s, size_t len);
/* The id of bytes s[0..len), -1 when none. */
int bpe_vocab_find(const struct fsdp_tokenizer *t, const char *s, size_t len);
/* The merge of (left, right), NULL when none. */
const bpe_merge_t *bpe_merge_find(const struct fsdp_tokenizer *t, int left, int right);

/* Appends a pre-tokenizer step splitting on pattern[0..len) (a regex, or with
 * literal a plain string), HF's "Isolated" behaviour: matches and the text
 * between them are pieces. NULL pattern: GPT-2's. where names the file and
 * key for messages. */
fsdp_status_t bpe_add_split(struct fsdp_tokenizer *t, const char *pattern, size_t len,
                            int literal, const char *where);
/* s[0..len) in Unicode NFC, into *buf (grown as needed; *cap its size), its
 * length in *out_len. Runs of valid UTF-8 are normalized; a byte that is not
 * UTF-8 is kept as is and composes with nothing (as a starter would). */
fsdp_status_t bpe_nfc(const char *s, size_t len, char **buf, size_t *cap, size_t *out_len);
/* Orders t->added by first byte and fills added_at (after added changes). */
fsdp_status_t bpe_index_added(struct fsdp_tokenizer *t, const char *path);

/* Shared by the two loaders (bpe_load.c). */
fsdp_status_t bpe_read_json(const char *path, json_t **v);
fsdp_status_t bpe_vocab_from_json(struct fsdp_tokenizer *t, const char *path, const json_t *v);
fsdp_status_t bpe_merges_alloc(struct fsdp_tokenizer *t, const char *path, size_t n,
                               int **merge_line);
fsdp_status_t bpe_add_merge(struct fsdp_tokenizer *t, const char *path, int line, const char *s,
                            size_t len, const int *merge_line);
/* GPT-2's vocab.json and merges.txt (bpe_load.c), for fsdp_tokenizer_load
 * (bpe_json.c), which also reads Hugging Face's tokenizer.json. */
fsdp_status_t bpe_load_gpt2_files(struct fsdp_tokenizer *t, const char *vocab,
                                  const char *merges);

#endif
