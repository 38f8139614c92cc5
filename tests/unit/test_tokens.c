/* tests/unit/test_tokens.c — llm.c token files (src/data/tokens.c) and text
 * to token files (src/data/tokenize.c): the exact layout of both widths
 * (GPT-2's uint16, Llama 3's uint32), directories of shards, every corrupt
 * file with its message, the vocabulary check, windows that match the text
 * windows, documents and <|endoftext|>, a vocabulary beyond 65536 ids. */
#include <check.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsdp/data.h"
#include "fsdp/tokenizer.h"
#include "common/check_run.h"
#include "common/tok_vocab.h"

static char tmp_dir[64];

static const char *tmp(char *buf, const char *name) {
  sprintf(buf, "%s/%s", tmp_dir, name);
  return buf;
}

/* A token file by hand: header fields, then n tokens of `width` bytes,
 * i * 7 % 1000 but the last `last` (when not 0), then `extra` bytes; cut
 * bytes off the end. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count, int width,
                      size_t n, uint32_t last, size_t extra, size_t cut) {
  size_t len = 1024 + (size_t)width * n + extra;
  unsigned char *b = calloc(1, len);
  int32_t h[3] = {magic, version, count};
  memcpy(b, h, sizeof h); /* little-endian host */
  for (size_t i = 0; i < n; i++) {
    uint32_t v = last && i + 1 == n ? last : (uint32_t)(i * 7 % 1000);
    uint16_t v16 = (uint16_t)v;
    memcpy(b + 1024 + (size_t)width * i, width == 4 ? (void *)&v : (void *)&v16, (size_t)width);
  }
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  fwrite(b, 1, len - cut, f);
  fclose(f);
  free(b);
}

START_TEST(token_file_layout) {
  char p[256];
  int ids[5] = {0, 1, 65535, 300, 7};
  ck_assert_int_eq(fsdp_token_file_write(tmp(p, "five.bin"), ids, 5, 2, 0), FSDP_SUCCESS);
  FILE *f = fopen(p, "rb");
  unsigned char b[1034];
  ck_assert_uint_eq(fread(b, 1, sizeof b + 1, f), 1034); /* exactly 1024 + 2 x 5 bytes */
  fclose(f);
  int32_t h[4];
  memcpy(h, b, sizeof h);
  ck_assert_int_eq(h[0], 20240520);
  ck_assert_int_eq(h[1], 1);
  ck_assert_int_eq(h[2], 5);
  ck_assert_int_eq(h[3], 0);
  ck_assert_int_eq(b[1024 + 4], 0xff);
  ck_assert_int_eq(b[1024 + 6], 300 & 0xff);
  fsdp_tokens_t t;
  ck_assert_int_eq(fsdp_tokens_load(p, 0.4, &t), FSDP_SUCCESS);
  ck_assert_uint_eq(t.n, 5);
  ck_assert_uint_eq(t.n_train, 3);
  ck_assert_int_eq(t.max_token, 65535);
  ck_assert_int_eq(t.width, 2); /* held as uint16, as in the file */
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fsdp_tokens_at(&t, i), ids[i]);
  ck_assert_int_eq(((const uint16_t *)t.tokens)[2], 65535);
  fsdp_tokens_free(&t);
  ck_assert_int_eq(fsdp_tokens_probe(p), 1);
  ck_assert_int_eq(fsdp_token_file_write(p, ids, 5, 2, 0), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "already exists"));
  ck_assert_int_eq(fsdp_token_file_write(p, ids, 2, 2, 1), FSDP_SUCCESS);
  int big[3] = {1, 2, 65536};
  ck_assert_int_eq(fsdp_token_file_write(p, big, 3, 2, 1), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "five.bin: token 2 is 65536; GPT-2 (uint16 "
                                                 "tokens) token files hold 0 .. 65535"));
  ck_assert_int_eq(fsdp_token_file_write(p, big, 3, 3, 1), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "five.bin: token width 3"));
  ck_assert_int_eq(fsdp_token_file_width(50257), 2);
  ck_assert_int_eq(fsdp_token_file_width(65536), 2);
  ck_assert_int_eq(fsdp_token_file_width(65537), 4);
  ck_assert_int_eq(fsdp_token_file_width(128256), 4);
}
END_TEST

/* llm.c's Llama 3 layout: magic 20240801, version 7, uint32 tokens. */
START_TEST(token_file_layout_uint32) {
  char p[256];
  int ids[5] = {0, 65536, 128255, 7, 128256};
  ck_assert_int_eq(fsdp_token_file_write(tmp(p, "wide.bin"), ids, 5, 4, 0), FSDP_SUCCESS);
  FILE *f = fopen(p, "rb");
  unsigned char b[1044];
  ck_assert_uint_eq(fread(b, 1, sizeof b + 1, f), 1044); /* exactly 1024 + 4 x 5 bytes */
  fclose(f);
  int32_t h[4];
  memcpy(h, b, sizeof h);
  ck_assert_int_eq(h[0], 20240801);
  ck_assert_int_eq(h[1], 7);
  ck_assert_int_eq(h[2], 5);
  ck_assert_int_eq(h[3], 0);
  const unsigned char want[8] = {0x00, 0x00, 0x01, 0x00, 0xff, 0xf4, 0x01, 0x00}; /* LE 65536, 128255 */
  ck_assert(!memcmp(b + 1024 + 4, want, 8));
  ck_assert_int_eq(fsdp_tokens_probe(p), 1);
  fsdp_tokens_t t;
  ck_assert_int_eq(fsdp_tokens_load(p, 0.4, &t), FSDP_SUCCESS);
  ck_assert_int_eq(t.width, 4);
  ck_assert_uint_eq(t.n, 5);
  ck_assert_uint_eq(t.n_train, 3);
  ck_assert_int_eq(t.max_token, 128256);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fsdp_tokens_at(&t, i), ids[i]);
  /* Llama 3's vocabulary of 128256 holds all but the last. */
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 128257), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 128256), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "wide.bin: token 4 is 128256, outside the "
                                                 "model's vocabulary of 128256"));
  int win[2 * 2], tgt[2 * 2];
  ck_assert_int_eq(fsdp_tokens_windows(&t, 0, 1, 0, 0, 2, 2, win, tgt), FSDP_SUCCESS);
  for (int k = 0; k < 4; k++) ck_assert(win[k] == ids[0] || win[k] == ids[1] || win[k] == ids[2]);
  fsdp_tokens_free(&t);
  int neg[2] = {5, -1};
  ck_assert_int_eq(fsdp_token_file_write(p, neg, 2, 4, 1), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "wide.bin: token 1 is -1; Llama 3 (uint32 "
                                                 "tokens) token files hold 0 .. 2147483647"));
}
END_TEST

START_TEST(token_directory_in_name_order) {
  char d[256], p[300];
  tmp(d, "shards");
  mkdir(d, 0755);
  int a[3] = {1, 2, 3}, b[2] = {4, 5};
  sprintf(p, "%s/x_val_000000.bin", d);
  ck_assert_int_eq(fsdp_token_file_write(p, b, 2, 2, 0), FSDP_SUCCESS);
  sprintf(p, "%s/x_train_000000.bin", d);
  ck_assert_int_eq(fsdp_token_file_write(p, a, 3, 2, 0), FSDP_SUCCESS);
  sprintf(p, "%s/README", d);
  FILE *f = fopen(p, "w");
  fputs("not tokens", f);
  fclose(f);
  ck_assert_int_eq(fsdp_tokens_probe(d), 1);
  fsdp_tokens_t t;
  ck_assert_int_eq(fsdp_tokens_load(d, 0.0, &t), FSDP_SUCCESS);
  ck_assert_int_eq(t.n_files, 2);
  ck_assert_uint_eq(t.n, 5);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fsdp_tokens_at(&t, i), i + 1); /* train then val */
  ck_assert_uint_eq(t.file_start[1], 3);
  /* The vocabulary check names the file and the position in it. */
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 6), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 5), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "x_val_000000.bin: token 1 is 5, outside the "
                                                 "model's vocabulary of 5"));
  fsdp_tokens_free(&t);
  ck_assert_int_eq(fsdp_tokens_probe(tmp(p, "nothing-here")), 0);
}
END_TEST

typedef struct {
  int32_t magic, version, count;
  int width;
  size_t n;
  uint32_t last;
  size_t extra, cut;
  fsdp_status_t st;
  const char *want; /* after the path */
} corrupt_t;

static const corrupt_t corrupt[] = {
    {20240520, 1, 10, 2, 10, 0, 0, 1015, FSDP_ERR_IO, ": truncated: 29 bytes, shorter than the 1024-byte header"},
    {12345, 1, 10, 2, 10, 0, 0, 0, FSDP_ERR_FORMAT, ": wrong magic 12345 (0x00003039): not a token file"},
    {20240520, 2, 10, 2, 10, 0, 0, 0, FSDP_ERR_FORMAT, ": a GPT-2 (uint16 tokens) token file of "
     "version 2; this reader knows version 1"},
    {20240520, 1, -3, 2, 10, 0, 0, 0, FSDP_ERR_FORMAT, ": the header's token count is -3"},
    {20240520, 1, 10, 2, 10, 0, 0, 3, FSDP_ERR_IO, ": the header says 10 uint16 tokens (1044 bytes "
     "with the header) but the file has 1041 bytes: truncated"},
    {20240520, 1, 10, 2, 10, 0, 4, 0, FSDP_ERR_FORMAT, ": the header says 10 uint16 tokens (1044 "
     "bytes with the header) but the file has 1048 bytes: trailing bytes or a wrong count"},
    {20240520, 1, 0, 2, 0, 0, 0, 0, FSDP_ERR_FORMAT, ": no tokens: the token file is empty"},
    /* Llama 3's uint32 files. */
    {20240801, 7, 10, 4, 10, 0, 0, 1020, FSDP_ERR_IO, ": truncated: 44 bytes, shorter than the 1024-byte header"},
    {20240801, 1, 10, 4, 10, 0, 0, 0, FSDP_ERR_FORMAT, ": a Llama 3 (uint32 tokens) token file of "
     "version 1; this reader knows version 7"},
    {20240801, 7, -1, 4, 10, 0, 0, 0, FSDP_ERR_FORMAT, ": the header's token count is -1"},
    {20240801, 7, 10, 4, 10, 0, 0, 2, FSDP_ERR_IO, ": the header says 10 uint32 tokens (1064 bytes "
     "with the header) but the file has 1062 bytes: truncated"},
    /* a GPT-2 file's body under Llama 3's magic: half the bytes the count needs */
    {20240801, 7, 10, 2, 10, 0, 0, 0, FSDP_ERR_IO, ": the header says 10 uint32 tokens (1064 bytes "
     "with the header) but the file has 1044 bytes: truncated"},
    {20240801, 7, 10, 4, 10, 0, 8, 0, FSDP_ERR_FORMAT, ": the header says 10 uint32 tokens (1064 "
     "bytes with the header) but the file has 1072 bytes: trailing bytes or a wrong count"},
    {20240801, 7, 6, 4, 6, 0x80000000u, 0, 0, FSDP_ERR_FORMAT, ": token 5 is 2147483648, beyond "
     "any vocabulary"},
    {20240801, 7, 0, 4, 0, 0, 0, 0, FSDP_ERR_FORMAT, ": no tokens: the token file is empty"},
};

START_TEST(token_file_errors) {
  const corrupt_t *c = &corrupt[_i];
  char p[256], want[512];
  sprintf(p, "%s/corrupt%d.bin", tmp_dir, _i);
  write_raw(p, c->magic, c->version, c->count, c->width, c->n, c->last, c->extra, c->cut);
  fsdp_tokens_t t = {0};
  ck_assert_int_eq(fsdp_tokens_load(p, 0.1, &t), c->st);
  ck_assert_ptr_null(t.tokens);
  snprintf(want, sizeof want, "%s%s", p, c->want);
  ck_assert_msg(strstr(fsdp_last_error(), want), "case %d: message\n  %s\nlacks\n  %s", _i,
                fsdp_last_error(), want);
}
END_TEST

START_TEST(token_directory_errors) {
  char d[256], p[300];
  ck_assert_int_eq(fsdp_tokens_load(tmp(d, "absent.bin"), 0.1, &(fsdp_tokens_t){0}), FSDP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "absent.bin: cannot open token data"));
  tmp(d, "empty-dir");
  mkdir(d, 0755);
  ck_assert_int_eq(fsdp_tokens_load(d, 0.1, &(fsdp_tokens_t){0}), FSDP_ERR_FORMAT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "empty-dir: no token files (*.bin)"));
  /* One bad shard among good ones: named, nothing loaded. */
  tmp(d, "one-bad");
  mkdir(d, 0755);
  sprintf(p, "%s/a.bin", d);
  write_raw(p, 20240520, 1, 4, 2, 4, 0, 0, 0);
  sprintf(p, "%s/b.bin", d);
  write_raw(p, 20240520, 1, 4, 2, 4, 0, 0, 1);
  ck_assert_int_eq(fsdp_tokens_load(d, 0.1, &(fsdp_tokens_t){0}), FSDP_ERR_IO);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "one-bad/b.bin: the header says 4 uint16 tokens"));
  /* Files of both formats in one dataset: two tokenizers' ids, refused. */
  tmp(d, "mixed");
  mkdir(d, 0755);
  sprintf(p, "%s/a.bin", d);
  write_raw(p, 20240520, 1, 4, 2, 4, 0, 0, 0);
  sprintf(p, "%s/b.bin", d);
  write_raw(p, 20240801, 7, 4, 4, 4, 0, 0, 0);
  fsdp_tokens_t t = {0};
  ck_assert_int_eq(fsdp_tokens_load(d, 0.1, &t), FSDP_ERR_FORMAT);
  ck_assert_ptr_null(t.tokens);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "mixed/b.bin: a Llama 3 (uint32 tokens) token "
                                                 "file, but"));
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "mixed/a.bin is a GPT-2 (uint16 tokens) one"));
}
END_TEST

/* The same content as bytes and as tokens draws the same windows: token data
 * reuses the text sampler (and so its independence of the rank count). */
START_TEST(token_windows_match_text_windows) {
  char p[256], q[256];
  enum { N = 5000, T = 16, B = 8 };
  int *ids = malloc(N * sizeof(int));
  char *bytes = malloc(N);
  for (int i = 0; i < N; i++) ids[i] = (unsigned char)(bytes[i] = (char)(i * 37 % 251 + 1));
  FILE *f = fopen(tmp(q, "same.txt"), "wb");
  fwrite(bytes, 1, N, f);
  fclose(f);
  fsdp_text_t text;
  ck_assert_int_eq(fsdp_text_load(q, 0.1, &text), FSDP_SUCCESS);
  for (int width = 2; width <= 4; width += 2) { /* GPT-2's files and Llama 3's */
    fsdp_tokens_t toks;
    ck_assert_int_eq(fsdp_token_file_write(tmp(p, "same.bin"), ids, N, width, 1), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_tokens_load(p, 0.1, &toks), FSDP_SUCCESS);
    ck_assert_int_eq(toks.width, width);
    ck_assert_uint_eq(text.n_train, toks.n_train);
    int a[B * T], at[B * T], b[B * T], bt[B * T];
    for (int val = 0; val < 2; val++)
      for (int step = 0; step < 5; step++) {
        ck_assert_int_eq(fsdp_text_windows(&text, val, 3, step, 0, B, T, a, at), FSDP_SUCCESS);
        /* as two ranks of four samples each */
        ck_assert_int_eq(fsdp_tokens_windows(&toks, val, 3, step, 0, B / 2, T, b, bt),
                         FSDP_SUCCESS);
        ck_assert_int_eq(fsdp_tokens_windows(&toks, val, 3, step, B / 2, B / 2, T, b + B / 2 * T,
                                             bt + B / 2 * T), FSDP_SUCCESS);
        ck_assert(!memcmp(a, b, sizeof a) && !memcmp(at, bt, sizeof at));
      }
    ck_assert_int_eq(fsdp_tokens_windows(&toks, 1, 3, 0, 0, 1, 600, b, bt),
                     FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "the validation split has 500 tokens"));
    fsdp_tokens_free(&toks);
  }
  fsdp_text_free(&text);
  free(ids);
  free(bytes);
}
END_TEST

static const char *const merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}};

START_TEST(tokenize_documents_and_shards) {
  char d[256], in[256], out[256], p[300];
  tok_write_vocab(tmp(d, "vocab"), merges, 4);
  fsdp_tokenizer_t tok;
  ck_assert_int_eq(fsdp_tokenizer_load(d, &tok), FSDP_SUCCESS);
  const char text[] = "hello\n%\nhello hello\n%\n%\nbye\n%\n";
  FILE *f = fopen(tmp(in, "fortunes"), "w");
  fputs(text, f);
  fclose(f);
  const char *inputs[] = {in};
  fsdp_tokenize_opts_t o = {.doc_separator = "%", .eot = 1};
  fsdp_tokenize_stats_t s;
  ck_assert_int_eq(fsdp_tokenize_files(tok, inputs, 1, tmp(out, "fort.bin"), &o, &s), FSDP_SUCCESS);
  ck_assert_uint_eq(s.files, 1);
  ck_assert_uint_eq(s.documents, 3); /* empty documents are skipped */
  ck_assert_uint_eq(s.bytes, strlen(text));
  ck_assert_int_eq(s.shards, 1);
  ck_assert_int_eq(s.width, 2); /* GPT-2's uint16 files for a small vocabulary */
  fsdp_tokens_t t;
  ck_assert_int_eq(fsdp_tokens_load(out, 0.0, &t), FSDP_SUCCESS);
  ck_assert_uint_eq(t.n, s.tokens);
  ck_assert_int_eq(t.width, 2);
  int eot = fsdp_tokenizer_eot(tok), hello = 259;
  /* <eot> hello \n <eot> hello Ġ h e l l o \n ... : ids checked where certain */
  ck_assert_int_eq(fsdp_tokens_at(&t, 0), eot);
  ck_assert_int_eq(fsdp_tokens_at(&t, 1), hello);
  ck_assert_int_eq(fsdp_tokens_at(&t, 2), '\n');
  ck_assert_int_eq(fsdp_tokens_at(&t, 3), eot);
  ck_assert_int_eq(fsdp_tokens_at(&t, t.n - 5), eot);
  char back[64];
  size_t len;
  int *ids = malloc(t.n * sizeof(int));
  for (size_t i = 0; i < t.n; i++) ids[i] = fsdp_tokens_at(&t, i);
  ck_assert_int_eq(fsdp_tokenizer_decode(tok, ids, t.n, back, sizeof back, &len), FSDP_SUCCESS);
  ck_assert_uint_eq(len, strlen("<|endoftext|>hello\n<|endoftext|>hello hello\n<|endoftext|>bye\n"));
  ck_assert(!memcmp(back, "<|endoftext|>hello\n<|endoftext|>hello hello\n<|endoftext|>bye\n", len));
  fsdp_tokens_free(&t);
  free(ids);
  /* Shards of at most 4 tokens; existing files are refused, then replaced. */
  o.shard_tokens = 4;
  ck_assert_int_eq(fsdp_tokenize_files(tok, inputs, 1, tmp(out, "sh"), &o, &s), FSDP_SUCCESS);
  ck_assert_int_eq(s.shards, (int)((s.tokens + 3) / 4));
  sprintf(p, "%s/sh_000001.bin", tmp_dir);
  ck_assert_int_eq(access(p, F_OK), 0);
  ck_assert_int_eq(fsdp_tokenize_files(tok, inputs, 1, out, &o, &s), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "sh_000000.bin already exists"));
  o.overwrite = 1;
  ck_assert_int_eq(fsdp_tokenize_files(tok, inputs, 1, out, &o, &s), FSDP_SUCCESS);
  fsdp_tokenizer_free(tok);
}
END_TEST

/* A tokenizer.json of more ids than uint16 holds: the 256 byte tokens, the
 * merges of `merges` (ids 256..259), filler tokens no merge makes up to id
 * 69999, then "<|endoftext|>" as special added token 70000. */
static void write_wide_tokenizer_json(const char *path) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  char a[8], b[64], ab[64];
  fprintf(f, "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 70000, \"content\": "
             "\"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true}], \"normalizer\": null, "
             "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
             "\"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": null, "
             "\"decoder\": null, \"model\": {\"type\": \"BPE\", \"vocab\": {");
  for (int i = 0; i < 256; i++) {
    tok_byte_spelling(i, a);
    fprintf(f, i ? ", " : "");
    tok_json_key(f, a);
    fprintf(f, ": %d", i);
  }
  for (int k = 0; k < 4; k++) {
    snprintf(b, sizeof b, "%s%s", merges[k][0], merges[k][1]);
    fprintf(f, ", \"%s\": %d", b, 256 + k);
  }
  for (int id = 260; id < 70000; id++) fprintf(f, ", \"~q%d\": %d", id, id);
  fprintf(f, "}, \"merges\": [");
  for (int k = 0; k < 4; k++) {
    tok_spell(merges[k][0], b);
    tok_spell(merges[k][1], ab);
    fprintf(f, "%s[\"%s\", \"%s\"]", k ? ", " : "", b, ab);
  }
  fprintf(f, "]}}\n");
  ck_assert_int_eq(fclose(f), 0);
}

/* A vocabulary beyond 65536 ids writes Llama 3's uint32 files, which read
 * back as the ids the tokenizer gives, 70000 among them. */
START_TEST(tokenize_wide_vocabulary) {
  char j[256], in[256], out[256];
  write_wide_tokenizer_json(tmp(j, "wide-tokenizer.json"));
  fsdp_tokenizer_t tok;
  ck_assert_int_eq(fsdp_tokenizer_load(j, &tok), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_tokenizer_vocab_size(tok), 70001);
  ck_assert_int_eq(fsdp_tokenizer_eot(tok), 70000);
  const char text[] = "hello<|endoftext|>hello ~q300";
  FILE *f = fopen(tmp(in, "wide.txt"), "w");
  fputs(text, f);
  fclose(f);
  const char *inputs[] = {in};
  fsdp_tokenize_opts_t o = {.eot = 1, .flags = FSDP_TOKENIZE_ALLOW_SPECIAL};
  fsdp_tokenize_stats_t s;
  ck_assert_int_eq(fsdp_tokenize_files(tok, inputs, 1, tmp(out, "wide-out.bin"), &o, &s),
                   FSDP_SUCCESS);
  ck_assert_int_eq(s.width, 4);
  ck_assert_int_eq(s.max_id, 70000);
  fsdp_token_buf_t want = {0};
  ck_assert_int_eq(fsdp_tokenizer_encode(tok, text, strlen(text), o.flags, &want), FSDP_SUCCESS);
  fsdp_tokens_t t;
  ck_assert_int_eq(fsdp_tokens_load(out, 0.0, &t), FSDP_SUCCESS);
  ck_assert_int_eq(t.width, 4);
  ck_assert_uint_eq(t.n, 1 + want.n);
  ck_assert_int_eq(fsdp_tokens_at(&t, 0), 70000);
  ck_assert_int_eq(fsdp_tokens_at(&t, 1), 259); /* hello */
  ck_assert_int_eq(fsdp_tokens_at(&t, 2), 70000);
  for (size_t i = 0; i < want.n; i++) ck_assert_int_eq(fsdp_tokens_at(&t, 1 + i), want.ids[i]);
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 70001), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_tokens_check_vocab(&t, 50257), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "wide-out.bin: token 0 is 70000, outside the "
                                                 "model's vocabulary of 50257"));
  fsdp_tokens_free(&t);
  fsdp_token_buf_free(&want);
  fsdp_tokenizer_free(tok);
}
END_TEST

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int main(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/fsdp-test-tokens-XXXXXX", base);
  if (strlen(base) > 30 || !mkdtemp(tmp_dir)) return fprintf(stderr, "no temporary directory\n"), 1;
  Suite *s = suite_create("tokens");
  TCase *tc = tcase_create("tokens");
  tcase_add_test(tc, token_file_layout);
  tcase_add_test(tc, token_file_layout_uint32);
  tcase_add_test(tc, token_directory_in_name_order);
  tcase_add_loop_test(tc, token_file_errors, 0, sizeof corrupt / sizeof corrupt[0]);
  tcase_add_test(tc, token_directory_errors);
  tcase_add_test(tc, token_windows_match_text_windows);
  tcase_add_test(tc, tokenize_documents_and_shards);
  tcase_add_test(tc, tokenize_wide_vocabulary);
  suite_add_tcase(s, tc);
  const int rc = check_run(s);
  nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
