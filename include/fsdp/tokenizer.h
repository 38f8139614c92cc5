/* fsdp/tokenizer.h — byte-level BPE tokenizers (GPT-2's, and Hugging Face
 * tokenizer.json's of that kind: Llama 3, SmolLM, Qwen2-style) and the
 * text-to-token-file conversion (what fsdp-tokenize runs).
 *
 * A tokenizer is loaded from the files GPT-2 ships: a directory holding
 * vocab.json ({"token": id, ...}, tokens spelled in GPT-2's byte-to-unicode
 * alphabet) and merges.txt (an optional "#version" line, then one merge
 * "left right" per line, best first); or from Hugging Face's tokenizer.json
 * (see fsdp_tokenizer_load). Encoding first finds the added tokens in the
 * text (leftmost, then longest), normalizes the text between them when the
 * tokenizer.json has a normalizer (NFC, utf8proc) and finds there the added
 * tokens marked "normalized", then splits the rest with the pre-tokenizer's
 * patterns (GPT-2's regex; Llama 3's; PCRE2, Unicode classes), maps each
 * piece's bytes into the alphabet and applies the merges by rank; decoding
 * concatenates the tokens' bytes. Every byte string round-trips:
 * decode(encode(x)) == x (NFC(x) with the NFC normalizer), also for bytes
 * that are not valid UTF-8 (the patterns cannot see them, NFC keeps them;
 * each run of them becomes a piece of its own).
 *
 * Special tokens: GPT-2's files have one, "<|endoftext|>" when the vocabulary
 * has it; a tokenizer.json's are its added tokens marked "special". Encoding
 * treats their spelling in the text as plain text unless
 * FSDP_TOKENIZE_ALLOW_SPECIAL is passed (as tiktoken does; tokenizers'
 * encode_special_tokens=True). Added tokens not marked special are always
 * matched, as tokenizers does.
 *
 * Loading is strict: a missing file, bad JSON, an id that is negative,
 * repeated or leaves a gap (ids must be exactly 0 .. n-1), a token outside
 * the byte alphabet, a byte without its single-byte token, a malformed merge
 * line, a merge naming a token (or making one) the vocabulary lacks, or a
 * repeated merge fail with FSDP_ERR_IO (missing, unreadable) or
 * FSDP_ERR_FORMAT and a message naming the file, the line and the token (or
 * the tokenizer.json key).
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

/* dir holds vocab.json and merges.txt, or Hugging Face's tokenizer.json; dir
 * may also name a tokenizer.json file itself. vocab.json wins when a
 * directory has both. tokenizer.json is read as the tokenizers package reads
 * it, for the byte-level BPE kind: model "BPE" (vocab; merges as "a b" or
 * ["a", "b"]; ignore_merges), no normalizer or NFC (Qwen2's; also in a
 * Sequence), a pre_tokenizer ending in ByteLevel (its regex when use_regex)
 * after Split steps (a Regex or String pattern, behavior "Isolated") and
 * Digits; added tokens with the ids
 * tokenizers gives them (model.vocab's, else the next after it in list
 * order). Other kinds are FSDP_ERR_UNSUPPORTED naming the model type or the
 * key: WordPiece, Unigram, SentencePiece-style BPE (byte_fallback, Metaspace:
 * Llama 2, TinyLlama), other normalizers (NFKC, Lowercase, Prepend, ...),
 * add_prefix_space, other Split behaviours, lstrip/rstrip/single_word, a
 * normalized added token that NFC would respell. A pattern PCRE2 cannot
 * compile, and ids tokenizers would read otherwise, are FSDP_ERR_FORMAT. */
FSDP_API fsdp_status_t fsdp_tokenizer_load(const char *dir, fsdp_tokenizer_t *out);
FSDP_API void fsdp_tokenizer_free(fsdp_tokenizer_t tok); /* NULL is ignored */

/* Number of ids (the largest plus one). */
FSDP_API int fsdp_tokenizer_vocab_size(fsdp_tokenizer_t tok);
/* The document token fsdp-tokenize puts before every document: the id of
 * "<|endoftext|>"; without it, the special token a tokenizer.json's
 * TemplateProcessing post-processor puts first (Llama 3's <|begin_of_text|>);
 * -1 when neither exists. */
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

#define FSDP_TOKENIZE_ALLOW_SPECIAL 1 /* special tokens in the text are those tokens */

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
 * lines equal to doc_separator, is a document; with eot, the document token
 * (fsdp_tokenizer_eot) precedes every document (llm.c's convention). Output
 * is llm.c's token file format (fsdp/data.h) of the vocabulary's width
 * (fsdp_token_file_width: GPT-2's uint16 files up to 65536 ids, Llama 3's
 * uint32 files above): one file `out`, or with shard_tokens > 0, files
 * out_000000.bin, out_000001.bin, ... of at most shard_tokens tokens. Files
 * are written to a temporary name and renamed; an existing file is refused
 * unless overwrite. */
typedef struct {
  const char *doc_separator; /* e.g. "%" for fortune files; NULL: a file is a document */
  int eot;                   /* the document token before every document */
  int flags;                 /* FSDP_TOKENIZE_ALLOW_SPECIAL */
  size_t shard_tokens;       /* 0: one file */
  int overwrite;
} fsdp_tokenize_opts_t;

typedef struct {
  size_t files, documents, bytes, tokens;
  int shards;
  int max_id;                /* the largest id written, -1 when none */
  int width;                 /* bytes a token in the files written: 2 or 4 */
} fsdp_tokenize_stats_t;

FSDP_API fsdp_status_t fsdp_tokenize_files(fsdp_tokenizer_t tok, const char *const *inputs,
                                           int n_inputs, const char *out,
                                           const fsdp_tokenize_opts_t *opts,
                                           fsdp_tokenize_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
