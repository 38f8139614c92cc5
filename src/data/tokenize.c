/* src/data/tokenize.c — text files to token files (fsdp_tokenize_files, what
 * fsdp-tokenize runs): documents, the document token (fsdp_tokenizer_eot)
 * before each, shards. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "data/data_internal.h"
#include "fsdp/data.h"
#include "fsdp/tokenizer.h"

typedef struct {
  fsdp_tokenizer_t tok;
  const fsdp_tokenize_opts_t *o;
  const char *out;
  fsdp_token_buf_t buf;
  fsdp_tokenize_stats_t *stats;
} tokenize_t;

static fsdp_status_t read_file(const char *path, char **text, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  while (b) {
    n += fread(b + n, 1, cap - n, f);
    if (n < cap) break;
    char *g = realloc(b, cap *= 2);
    if (!g) free(b);
    b = g;
  }
  int err = ferror(f);
  fclose(f);
  if (!b) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory reading it", path);
  if (err) return free(b), fsdp_error(FSDP_ERR_IO, "%s: read failed", path);
  *text = b;
  *len = n;
  return FSDP_SUCCESS;
}

/* Writes buf[0..count) as the next shard and keeps the rest. */
static fsdp_status_t flush_shard(tokenize_t *z, size_t count) {
  char path[4096];
  if (z->o->shard_tokens) snprintf(path, sizeof path, "%s_%06d.bin", z->out, z->stats->shards);
  else snprintf(path, sizeof path, "%s", z->out);
  FSDP_TRY(fsdp_token_file_write(path, z->buf.ids, count, z->stats->width, z->o->overwrite));
  z->stats->shards++;
  z->stats->tokens += count;
  for (size_t i = 0; i < count; i++)
    z->stats->max_id = z->buf.ids[i] > z->stats->max_id ? z->buf.ids[i] : z->stats->max_id;
  memmove(z->buf.ids, z->buf.ids + count, (z->buf.n - count) * sizeof *z->buf.ids);
  z->buf.n -= count;
  return FSDP_SUCCESS;
}

static fsdp_status_t add_document(tokenize_t *z, const char *s, size_t len) {
  if (z->o->eot && z->buf.n == z->buf.cap) {
    size_t cap = z->buf.cap ? 2 * z->buf.cap : 1024;
    int *ids = realloc(z->buf.ids, cap * sizeof *ids);
    if (!ids) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenize: out of memory for %zu ids", cap);
    z->buf.ids = ids;
    z->buf.cap = cap;
  }
  if (z->o->eot) z->buf.ids[z->buf.n++] = fsdp_tokenizer_eot(z->tok);
  FSDP_TRY(fsdp_tokenizer_encode(z->tok, s, len, z->o->flags, &z->buf));
  z->stats->documents++;
  while (z->o->shard_tokens && z->buf.n >= z->o->shard_tokens)
    FSDP_TRY(flush_shard(z, z->o->shard_tokens));
  return FSDP_SUCCESS;
}

/* The documents of one file: all of it, or the parts between separator lines. */
static fsdp_status_t add_file(tokenize_t *z, const char *text, size_t len) {
  const char *sep = z->o->doc_separator;
  if (!sep) return add_document(z, text, len);
  size_t k = strlen(sep), doc = 0;
  for (size_t at = 0; at <= len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - text) : len;
    int is_sep = end - at == k && !memcmp(text + at, sep, k);
    if (is_sep || !nl) {
      size_t stop = is_sep ? at : len;
      if (stop > doc) FSDP_TRY(add_document(z, text + doc, stop - doc));
      doc = nl ? end + 1 : len;
    }
    if (!nl) break;
    at = end + 1;
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t add_input(tokenize_t *z, const char *input) {
  char **paths;
  size_t n;
  FSDP_TRY(data_text_files(input, &paths, &n));
  fsdp_status_t st = FSDP_SUCCESS;
  for (size_t i = 0; i < n && !st; i++) {
    char *text = NULL;
    size_t len = 0;
    st = read_file(paths[i], &text, &len);
    if (st) break;
    z->stats->files++;
    z->stats->bytes += len;
    st = add_file(z, text, len);
    free(text);
  }
  data_text_files_free(paths, n);
  return st;
}

fsdp_status_t fsdp_tokenize_files(fsdp_tokenizer_t tok, const char *const *inputs, int n_inputs,
                                  const char *out, const fsdp_tokenize_opts_t *opts,
                                  fsdp_tokenize_stats_t *stats) {
  if (!tok || !inputs || n_inputs < 1 || !out || !opts || !stats)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenize: needs a tokenizer, inputs, an output "
                      "and options");
  if (opts->eot && fsdp_tokenizer_eot(tok) < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenize: the vocabulary has no "
                      "\"<|endoftext|>\" (nor, in a tokenizer.json, a post-processor's "
                      "beginning-of-sequence token) to put before every document: pass --no-eot");
  *stats = (fsdp_tokenize_stats_t){
      .max_id = -1, .width = fsdp_token_file_width(fsdp_tokenizer_vocab_size(tok))};
  tokenize_t z = {tok, opts, out, {0}, stats};
  fsdp_status_t st = FSDP_SUCCESS;
  for (int i = 0; i < n_inputs && !st; i++) st = add_input(&z, inputs[i]);
  if (!st && (z.buf.n > 0 || stats->shards == 0)) st = flush_shard(&z, z.buf.n);
  fsdp_token_buf_free(&z.buf);
  return st;
}
