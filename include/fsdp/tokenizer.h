/* fsdp/tokenizer.h — GPT-2's byte-level BPE tokenizer and the text-to-token-
 * file conversion (what fsdp-tokenize runs).
 *
 * A tokenizer is loaded from the files GPT-2 ships (or from a Hugging Face
 * tokenizer.json holding the same): a directory holding
 * vocab.json ({"token": id, ...}, tokens spelled in GPT-2's byte-to-unicode
 * alphabet) and merges.txt (an optional "#version" line, then one merge
 * "left right" per line, best first). Encoding splits text with GPT-2's
 * pre-tokenisation regex (PCRE2, Unicode classes), maps each piece's bytes
 * into the alphabet and applies the merges by rank; decoding concatenates
 * the tokens' bytes. Every byte string round-trips: decode(encode(x)) == x,
 * also for bytes that are not valid UTF-8 (the regex cannot see them; each
 * run of them becomes a piece of its own).
 *
 * Special tokens: "<|endoftext|>", when the vocabulary has it. Encoding
 * treats its spelling in the text as plain text unless
 * FSDP_TOKENIZE_ALLOW_SPECIAL is passed (as tiktoken does).
 *
 * Loading is strict: a missing file, bad JSON, an id that is negative,
 * repeated or leaves a gap (ids must be exactly 0 .. n-1), a token outside
 * the byte alphabet, a byte without its single-byte token, a malformed merge
 * line, a merge naming a token (or making one) the vocabulary lacks, or a
 * repeated merge fail with FSDP_ERR_IO (missing, unreadable) or
 * FSDP_ERR_FORMAT and a message naming the file, the line and the token.
 *
 * Ownership and threads: the handle owns everything it loaded; free it with
 * fsdp_tokenizer_free. A loaded tokenizer is read-only: encode and decode may
 * run on many threads at once. */
#ifndef FSDP_TOKENIZER_H
#define FSDP_TOKENIZER_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_tokenizer *fsdp_tokenizer_t;

/* dir holds vocab.json and merges.txt, or Hugging Face's tokenizer.json
 * (model.vocab, model.merges as "a b" or ["a", "b"]; a BPE model with the
 * ByteLevel pre-tokenizer, no prefix space, no normalizer, added tokens that
 * are tokens of the vocabulary: GPT-2's; anything else is
 * FSDP_ERR_UNSUPPORTED naming the field). dir may also name a tokenizer.json
 * file itself. vocab.json wins when a directory has both. */
FSDP_API fsdp_status_t fsdp_tokenizer_load(const char *dir, fsdp_tokenizer_t *out);
FSDP_API void fsdp_tokenizer_free(fsdp_tokenizer_t tok); /* NULL is ignored */

/* Number of ids (the largest plus one). */
FSDP_API int fsdp_tokenizer_vocab_size(fsdp_tokenizer_t tok);
/* The id of "<|endoftext|>", or -1 when the vocabulary lacks it. */
FSDP_API int fsdp_tokenizer_eot(fsdp_tokenizer_t tok);
/* The bytes token `id` stands for (not NUL-terminated), *len their count;
 * NULL when id is out of range. Valid while the tokenizer lives. */
FSDP_API const char *fsdp_tokenizer_token(fsdp_tokenizer_t tok, int id, size_t *len);

/* A growable array of ids the caller owns: start it zeroed, reuse it across
 * calls (encode appends), release it with fsdp_token_buf_free. */
typedef struct {
  int *ids;   /* (n) */
  size_t n, cap;
} fsdp_token_buf_t;
FSDP_API void fsdp_token_buf_free(fsdp_token_buf_t *buf);

#define FSDP_TOKENIZE_ALLOW_SPECIAL 1 /* "<|endoftext|>" in the text is the special token */

/* Appends the ids of text[0..len) to out. FSDP_ERR_OUT_OF_MEMORY leaves out
 * with what was appended before the failure. */
FSDP_API fsdp_status_t fsdp_tokenizer_encode(fsdp_tokenizer_t tok, const char *text, size_t len,
                                             int flags, fsdp_token_buf_t *out);
/* Writes the bytes of ids[0..n) to text (at most cap bytes; text may be NULL
 * when cap is 0) and their full count to *len, as snprintf does: call again
 * with a larger buffer when *len > cap. An id outside the vocabulary is
 * FSDP_ERR_INVALID_ARGUMENT naming its position and value. */
FSDP_API fsdp_status_t fsdp_tokenizer_decode(fsdp_tokenizer_t tok, const int *ids, size_t n,
                                             char *text, size_t cap, size_t *len);

/* ---- text files to token files (fsdp-tokenize) ------------------------------
 * Inputs are files or directories (their regular files in name order, with
 * the skipping rules of fsdp_text_load). Each file, or each part between
 * lines equal to doc_separator, is a document; with eot, "<|endoftext|>"
 * precedes every document (llm.c's convention). Output is llm.c's token file
 * format (fsdp/data.h): one file `out`, or with shard_tokens > 0, files
 * out_000000.bin, out_000001.bin, ... of at most shard_tokens tokens. Files
 * are written to a temporary name and renamed; an existing file is refused
 * unless overwrite. A vocabulary of more than 65536 ids cannot be stored in
 * uint16 tokens: FSDP_ERR_INVALID_ARGUMENT before anything is read. */
typedef struct {
  const char *doc_separator; /* e.g. "%" for fortune files; NULL: a file is a document */
  int eot;                   /* "<|endoftext|>" before every document */
  int flags;                 /* FSDP_TOKENIZE_ALLOW_SPECIAL */
  size_t shard_tokens;       /* 0: one file */
  int overwrite;
} fsdp_tokenize_opts_t;

typedef struct {
  size_t files, documents, bytes, tokens;
  int shards;
  int max_id;                /* the largest id written, -1 when none */
} fsdp_tokenize_stats_t;

FSDP_API fsdp_status_t fsdp_tokenize_files(fsdp_tokenizer_t tok, const char *const *inputs,
                                           int n_inputs, const char *out,
                                           const fsdp_tokenize_opts_t *opts,
                                           fsdp_tokenize_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
