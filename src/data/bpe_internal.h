/* src/data/bpe_internal.h — the tokenizer's tables, shared by the loader
 * (bpe_load.c) and the encoder (bpe.c). Not installed. */
#ifndef FSDP_DATA_BPE_INTERNAL_H
#define FSDP_DATA_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

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

struct fsdp_tokenizer {
  int n;             /* ids 0 .. n-1 */
  char *bytes;       /* every token's bytes, end to end */
  size_t *off;       /* (n+1) token id's bytes are bytes[off[id], off[id+1]) */
  bpe_vocab_map_t map;
  bpe_merge_t *merges; /* (merge_cap) */
  size_t merge_cap, n_merges;
  int byte_id[256];  /* the single-byte token of each byte */
  int eot;           /* "<|endoftext|>", -1 none */
  pcre2_code *re;    /* GPT-2's pre-tokenisation pattern */
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

/* Compiles the pre-tokenisation pattern into t->re. */
fsdp_status_t bpe_compile_pattern(struct fsdp_tokenizer *t);

#endif
