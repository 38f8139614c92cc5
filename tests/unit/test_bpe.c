/* tests/unit/test_bpe.c — the GPT-2 BPE tokenizer (src/data/bpe.c,
 * bpe_load.c, bpe_json.c): round trips, merges applied by rank,
 * pre-tokenisation boundaries, <|endoftext|>, every malformed vocabulary with
 * its message, and tokenizer.json's steps, added tokens and refusals.
 * Vocabularies are written by tok_vocab.h into a mkdtemp directory. */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsdp/tokenizer.h"
#include "common/check_run.h"
#include "common/tok_vocab.h"

static char tmp_dir[64];

static const char *const small_merges[][2] = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"},
    {" w", "or"}, {" wor", "l"}, {" worl", "d"}, {"o", " "}, {" ", "t"}, {" t", "he"},
};

static fsdp_tokenizer_t load_small(const char *name) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/%s", tmp_dir, name);
  tok_write_vocab(dir, small_merges, sizeof small_merges / sizeof small_merges[0]);
  fsdp_tokenizer_t t;
  ck_assert_msg(fsdp_tokenizer_load(dir, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  return t;
}

/* The ids of text, as a string "a b c" for messages and comparisons. */
static void encode_str(fsdp_tokenizer_t t, const char *text, size_t len, int flags, char *out) {
  fsdp_token_buf_t b = {0};
  ck_assert_msg(fsdp_tokenizer_encode(t, text, len, flags, &b) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  out[0] = 0;
  for (size_t i = 0; i < b.n; i++) sprintf(out + strlen(out), i ? " %d" : "%d", b.ids[i]);
  fsdp_token_buf_free(&b);
}

static void check_round_trip(fsdp_tokenizer_t t, const char *text, size_t len) {
  fsdp_token_buf_t b = {0};
  ck_assert_int_eq(fsdp_tokenizer_encode(t, text, len, 0, &b), FSDP_SUCCESS);
  char back[4096];
  size_t n;
  ck_assert_int_eq(fsdp_tokenizer_decode(t, b.ids, b.n, back, sizeof back, &n), FSDP_SUCCESS);
  ck_assert_uint_eq(n, len);
  ck_assert_msg(!memcmp(back, text, len), "round trip changed the bytes of \"%.*s\"", (int)len,
                text);
  fsdp_token_buf_free(&b);
}

START_TEST(bpe_round_trips) {
  fsdp_tokenizer_t t = load_small("rt");
  const char *texts[] = {"hello world", "  hello   world  \n\n\t", "It's the dog's; they'll",
                         "Straße naïve 日本語 🙂 ٣½", "12345 3.14 a+b=c <|endoftext|>"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    check_round_trip(t, texts[i], strlen(texts[i]));
  char all[512]; /* every byte, and text that is not UTF-8 */
  for (int i = 0; i < 256; i++) all[i] = all[511 - i] = (char)i;
  check_round_trip(t, all, sizeof all);
  check_round_trip(t, "ab\xff\xfe cd \xc3 \xe6\x97 hello", 19);
  fsdp_tokenizer_free(t);
}
END_TEST

/* Merges apply by rank (best first), not by position or length. */
START_TEST(bpe_merges_by_rank) {
  fsdp_tokenizer_t t = load_small("rank");
  char ids[256];
  /* "hello": h e -> he (256), l l -> ll (257), he ll -> hell (258), hell o -> hello (259). */
  encode_str(t, "hello", 5, 0, ids);
  ck_assert_str_eq(ids, "259");
  /* " world": Ġ w (260), o r (261), Ġw or (262), Ġwor l (263), Ġworl d (264). */
  encode_str(t, "hello world", 11, 0, ids);
  ck_assert_str_eq(ids, "259 264");
  fsdp_tokenizer_free(t);
  /* Same tokens, the two first merges of "abc" in either order. */
  const char *const ab_first[][2] = {{"a", "b"}, {"b", "c"}};
  const char *const bc_first[][2] = {{"b", "c"}, {"a", "b"}};
  char dir[256];
  snprintf(dir, sizeof dir, "%s/ab", tmp_dir);
  tok_write_vocab(dir, ab_first, 2);
  ck_assert_int_eq(fsdp_tokenizer_load(dir, &t), FSDP_SUCCESS);
  encode_str(t, "abc", 3, 0, ids);
  ck_assert_str_eq(ids, "256 99"); /* ab c */
  fsdp_tokenizer_free(t);
  snprintf(dir, sizeof dir, "%s/bc", tmp_dir);
  tok_write_vocab(dir, bc_first, 2);
  ck_assert_int_eq(fsdp_tokenizer_load(dir, &t), FSDP_SUCCESS);
  encode_str(t, "abc", 3, 0, ids);
  ck_assert_str_eq(ids, "97 256"); /* a bc: "bc" is id 256 in this vocabulary */
  encode_str(t, "ababab", 6, 0, ids); /* a b a b a b: "ab" ranks second, merged everywhere */
  ck_assert_str_eq(ids, "257 257 257");
  fsdp_tokenizer_free(t);
}
END_TEST

/* Merges never cross the regex's pieces: "o " is a merge, but "hello world"
 * splits as "hello" | " world", and "hello  world" as "hello" | " " | " world". */
START_TEST(bpe_pieces_bound_merges) {
  fsdp_tokenizer_t t = load_small("pieces");
  char ids[256];
  encode_str(t, "hello  world", 12, 0, ids);
  ck_assert_str_eq(ids, "259 32 264");
  encode_str(t, "o the", 5, 0, ids); /* "o" | " the": Ġt (266) he (256) -> Ġthe (267) */
  ck_assert_str_eq(ids, "111 267");
  encode_str(t, "you're", 6, 0, ids); /* "you" | "'re" */
  ck_assert_str_eq(ids, "121 111 117 39 114 101");
  fsdp_tokenizer_free(t);
}
END_TEST

START_TEST(bpe_special_tokens) {
  fsdp_tokenizer_t t = load_small("special");
  int eot = fsdp_tokenizer_eot(t);
  ck_assert_int_eq(eot, fsdp_tokenizer_vocab_size(t) - 1);
  char ids[1024], want[64];
  encode_str(t, "hello<|endoftext|>hello", 23, FSDP_TOKENIZE_ALLOW_SPECIAL, ids);
  snprintf(want, sizeof want, "259 %d 259", eot);
  ck_assert_str_eq(ids, want);
  encode_str(t, "<|endoftext|>", 13, 0, ids); /* as text: < | endoftext | > */
  ck_assert_ptr_null(strstr(ids, want + 4));
  ck_assert_str_eq(ids, "60 124 101 110 100 111 102 116 101 120 116 124 62"); /* no merges */
  size_t len;
  const char *s = fsdp_tokenizer_token(t, eot, &len);
  ck_assert_uint_eq(len, 13);
  ck_assert(!memcmp(s, "<|endoftext|>", 13));
  ck_assert_ptr_null(fsdp_tokenizer_token(t, fsdp_tokenizer_vocab_size(t), &len));
  int bad[] = {259, 9999};
  char out[8];
  ck_assert_int_eq(fsdp_tokenizer_decode(t, bad, 2, out, sizeof out, &len),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "id 9999 at position 1"));
  fsdp_tokenizer_free(t);
}
END_TEST

/* ---- malformed vocabularies -------------------------------------------------- */

typedef struct {
  const char *vocab;  /* vocab.json text; NULL: none written; "" : the 256 bytes only */
  const char *merges; /* merges.txt text; NULL: none written */
  const char *want;   /* in the message; "%s" is the directory */
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {NULL, "", "%s/vocab.json: cannot open"},
    {"", NULL, "%s/merges.txt: cannot open"},
    {"{\"a\": 0,}", "", "%s/vocab.json: line 1, column 9: trailing comma"},
    {"[1, 2]", "", "%s/vocab.json: expected an object"},
    {"+\"xq\": -1", "", "%s/vocab.json: line 258: token \"xq\" has id -1; ids are integers"},
    {"+\"xq\": 1.5", "", "%s/vocab.json: line 258: token \"xq\" has id 1.5"},
    {"+\"xy\": 300", "", "token \"xy\" has id 300, but ids must be 0 .. 256 (the file has 257 "
     "tokens): the ids are not contiguous (id 256 is missing)"},
    {"+\"xy\": 7", "", "%s/vocab.json: line 258: token \"xy\" has id 7, already the id of "
     "\"ć\" (line 9)"},
    {"+\"a b\": 256", "", "line 258: token \"a b\" (id 256): character U+0020 is not in GPT-2's "
     "byte alphabet"},
    {"-", "", "%s/vocab.json: no token for byte 0x0a (spelled U+010A)"},
    {"+\"ab\": 256", "#version: 0.2\na b c\n", "%s/merges.txt: line 2: \"a b c\" is not a merge"},
    {"+\"ab\": 256", "a b\n\nb a\n", "%s/merges.txt: line 2: \"\" is not a merge"},
    {"+\"ab\": 256", "ab\n", "%s/merges.txt: line 1: \"ab\" is not a merge"},
    {"+\"ab\": 256", "a b\nab zz\n", "%s/merges.txt: line 2: token \"zz\" is not in the vocabulary"},
    {"+\"ab\": 256", "a b\nb a\n", "%s/merges.txt: line 2: merge \"b a\" makes \"ba\", which is "
     "not in the vocabulary"},
    {"+\"ab\": 256", "#version: 0.2\na b\na b\n", "%s/merges.txt: line 3: merge \"a b\" repeats "
     "line 2"},
    {"+\"Ċ\": 256", "", "%s/vocab.json: line 258, column 7: duplicate key \"Ċ\" (first at line 12)"},
    {"+\"zz\": 256, \"zz\": 257", "", "%s/vocab.json: line 258, column 18: duplicate key "
     "\"zz\" (first at line 258)"},
    /* a key holding U+0000 was "a duplicate of" the key before its NUL */
    {"+\"Ā\\u0000\": 256", "", "%s/vocab.json: line 258, column 1: key \"Ā\\u0000...\" holds "
     "U+0000"},
    /* binary merges lines were echoed raw */
    {"+\"ab\": 256", "a b\na\x01" "b\x02 c\n", "%s/merges.txt: line 2: byte 0x01 at column 2: "
     "merges.txt is UTF-8 text"},
    {"+\"ab\": 256", "a \xff\xfe\n", "%s/merges.txt: line 1: byte 0xff at column 3"},
    {"+\"ab\": 256", "a \xc3\n", "%s/merges.txt: line 1: byte 0xc3 at column 3"},
    /* ill-formed sequences whose bytes have UTF-8's shape were accepted:
     * overlong, a surrogate, above U+10FFFF; the extremes around them pass
     * (and are refused later, as no byte of GPT-2's alphabet) */
    {"+\"ab\": 256", "a \xe0\x80\x80\n", "%s/merges.txt: line 1: byte 0xe0 at column 3"},
    {"+\"ab\": 256", "a \xf0\x80\x80\x80\n", "%s/merges.txt: line 1: byte 0xf0 at column 3"},
    {"+\"ab\": 256", "a \xed\xa0\x80\n", "%s/merges.txt: line 1: byte 0xed at column 3"},
    {"+\"ab\": 256", "a \xf4\x90\x80\x80\n", "%s/merges.txt: line 1: byte 0xf4 at column 3"},
    {"+\"ab\": 256", "a \xc0\x80\n", "%s/merges.txt: line 1: byte 0xc0 at column 3"},
    {"+\"ab\": 256", "a \xf5\x80\x80\x80\n", "%s/merges.txt: line 1: byte 0xf5 at column 3"},
    {"+\"ab\": 256", "\xe0\xa0\x80 \xf0\x90\x80\x80\n",
     "%s/merges.txt: line 1: token \"\xe0\xa0\x80\": character U+0800 is not"},
    {"+\"ab\": 256", "\xed\x9f\xbf \xf4\x8f\xbf\xbf\n",
     "%s/merges.txt: line 1: token \"\xed\x9f\xbf\": character U+D7FF is not"},
};

/* vocab.json: "" the 256 byte tokens; "+..." those and more members; "-" the
 * byte tokens without byte 0x0a. */
static void write_case(const char *dir, const bad_case_t *c) {
  char path[512];
  mkdir(dir, 0755);
  if (c->vocab) {
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    if (c->vocab[0] != '+' && c->vocab[0] != '-' && c->vocab[0]) {
      fputs(c->vocab, f);
    } else {
      fprintf(f, "{");
      for (int i = 0, id = 0; i < 256; i++) {
        if (c->vocab[0] == '-' && i == 10) continue;
        char s[4];
        tok_byte_spelling(i, s);
        fprintf(f, id ? ",\n" : "\n");
        tok_json_key(f, s);
        fprintf(f, ": %d", id++);
      }
      if (c->vocab[0] == '+') fprintf(f, ",\n%s", c->vocab + 1);
      fprintf(f, "\n}\n");
    }
    fclose(f);
  }
  if (c->merges) {
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(c->merges, f);
    fclose(f);
  }
}

START_TEST(bpe_load_errors) {
  const bad_case_t *c = &bad_cases[_i];
  char dir[256], want[512];
  snprintf(dir, sizeof dir, "%s/bad%d", tmp_dir, _i);
  write_case(dir, c);
  snprintf(want, sizeof want, c->want, dir);
  fsdp_tokenizer_t t = NULL;
  fsdp_status_t st = fsdp_tokenizer_load(dir, &t);
  ck_assert_msg(st == FSDP_ERR_IO || st == FSDP_ERR_FORMAT, "case %d loaded (status %d)", _i, st);
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(fsdp_last_error(), want), "case %d: message\n  %s\nlacks\n  %s", _i,
                fsdp_last_error(), want);
}
END_TEST

/* A vocabulary as large as GPT-2's loads fast (duplicate keys by sorting). */
START_TEST(bpe_large_vocab_loads) {
  char dir[256], path[512], a[4], b[4];
  snprintf(dir, sizeof dir, "%s/large", tmp_dir);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  FILE *v = fopen(path, "w");
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  FILE *m = fopen(path, "w");
  ck_assert(v && m);
  fprintf(v, "{");
  for (int i = 0; i < 256; i++) {
    tok_byte_spelling(i, a);
    fprintf(v, i ? ",\n" : "\n");
    tok_json_key(v, a);
    fprintf(v, ": %d", i);
  }
  int id = 256;
  for (int x = 0; x < 256 && id < 50256; x++)
    for (int y = 0; y < 256 && id < 50256; y++, id++) {
      char ab[8];
      tok_byte_spelling(x, a);
      tok_byte_spelling(y, b);
      snprintf(ab, sizeof ab, "%s%s", a, b);
      fprintf(v, ",\n");
      tok_json_key(v, ab);
      fprintf(v, ": %d", id);
      fprintf(m, "%s %s\n", a, b);
    }
  fprintf(v, ",\n\"<|endoftext|>\": %d\n}\n", id);
  fclose(v);
  fclose(m);
  fsdp_tokenizer_t t;
  ck_assert_msg(fsdp_tokenizer_load(dir, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_tokenizer_vocab_size(t), 50257);
  ck_assert_int_eq(fsdp_tokenizer_eot(t), 50256);
  char ids[64];
  encode_str(t, "\x01\x02", 2, 0, ids); /* the merge of bytes 1 and 2: 256 + 1 * 256 + 2 */
  ck_assert_str_eq(ids, "514");
  fsdp_tokenizer_free(t);
}
END_TEST

/* A tokenizer.json with the byte tokens, "ab", <|endoftext|> and vocab_extra
 * (ids from 258); the merge "a b"; the other parts as given (JSON text). */
static void write_hf_json(const char *path, const char *model_type, const char *model_extra,
                          const char *normalizer, const char *pre, const char *added,
                          const char *vocab_extra) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "{\"version\": \"1.0\", \"added_tokens\": [%s], \"normalizer\": %s,\n"
          "\"pre_tokenizer\": %s,\n"
          "\"model\": {\"type\": \"%s\"%s, \"merges\": [\"a b\"], \"vocab\": {", added,
          normalizer, pre, model_type, model_extra);
  for (int i = 0; i < 256; i++) {
    char sp[4];
    tok_byte_spelling(i, sp);
    fprintf(f, i ? ",\n" : "\n");
    tok_json_key(f, sp);
    fprintf(f, ": %d", i);
  }
  fprintf(f, ",\n\"ab\": 256, \"<|endoftext|>\": 257%s}}}\n", vocab_extra);
  fclose(f);
}

static void write_tokenizer_json(const char *path, const char *model_type, const char *prefix,
                                 const char *added) {
  char pre[128];
  snprintf(pre, sizeof pre, "{\"type\": \"ByteLevel\", \"add_prefix_space\": %s}", prefix);
  write_hf_json(path, model_type, "", "null", pre, added, "");
}

START_TEST(bpe_tokenizer_json) {
  char dir[256], path[300], ids[256];
  snprintf(dir, sizeof dir, "%s/hf", tmp_dir);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  const char *eot = "{\"id\": 257, \"content\": \"<|endoftext|>\", \"special\": true}";
  write_tokenizer_json(path, "BPE", "false", eot);
  fsdp_tokenizer_t t;
  for (int named = 0; named < 2; named++) { /* the directory, or the file itself */
    ck_assert_msg(fsdp_tokenizer_load(named ? path : dir, &t) == FSDP_SUCCESS, "%s",
                  fsdp_last_error());
    encode_str(t, "abc<|endoftext|>", 16, FSDP_TOKENIZE_ALLOW_SPECIAL, ids);
    ck_assert_str_eq(ids, "256 99 257");
    fsdp_tokenizer_free(t);
  }
  struct { const char *model, *prefix, *added, *want; fsdp_status_t code; } bad[] = {
      {"WordPiece", "false", "", "model.type is WordPiece; fsdp reads BPE models",
       FSDP_ERR_UNSUPPORTED},
      {"BPE", "true", "", "line 2: pre_tokenizer: add_prefix_space is true", FSDP_ERR_UNSUPPORTED},
      {"BPE", "false", "{\"id\": 30, \"content\": \"<pad>\"}", "added token \"<pad>\" has id "
       "30; tokenizers reads it as id 258 (the next after model.vocab's", FSDP_ERR_FORMAT},
      {"BPE", "false", "{\"id\": 258, \"content\": \"ab\"}", "added token \"ab\" has id 258; "
       "tokenizers reads it as id 256 (model.vocab's token of that spelling)", FSDP_ERR_FORMAT},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    write_tokenizer_json(path, bad[k].model, bad[k].prefix, bad[k].added);
    ck_assert_int_eq(fsdp_tokenizer_load(dir, &t), bad[k].code);
    ck_assert_msg(strstr(fsdp_last_error(), path) && strstr(fsdp_last_error(), bad[k].want),
                  "case %zu: %s", k, fsdp_last_error());
  }
}
END_TEST

#define BL_NOREGEX "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}"
#define SEQ(step) "{\"type\": \"Sequence\", \"pretokenizers\": [" step ", " BL_NOREGEX "]}"
#define SPLIT(kind, pat, behavior) \
  "{\"type\": \"Split\", \"pattern\": {\"" kind "\": \"" pat "\"}, \"behavior\": \"" behavior "\"}"

/* Llama 3's pipeline pieces: Split steps (a string, a regex with empty
 * matches), ignore_merges, added tokens after model.vocab's ids. */
START_TEST(bpe_tokenizer_json_pipeline) {
  char path[300], ids[256];
  snprintf(path, sizeof path, "%s/pipeline.json", tmp_dir);
  struct { const char *pre, *model, *text, *want; } ok[] = {
      {SEQ(SPLIT("String", "b", "Isolated")), "", "abab", "97 98 97 98"},
      {SEQ(SPLIT("Regex", "x*", "Isolated")), "", "ab\xc3\xa9xab", /* empty matches split too */
       "97 98 195 169 120 97 98"},
      {BL_NOREGEX, "", "ab ab", "256 32 256"},
      {SEQ(SPLIT("String", "b", "Isolated")), ", \"ignore_merges\": true", "abc abc",
       "97 98 99 32 97 98 99"}, /* pieces "a", "b", ... : none is "abc" */
      {BL_NOREGEX, ", \"ignore_merges\": true", "abc", "258"},
      {BL_NOREGEX, ", \"ignore_merges\": false", "abc", "256 99"},
  };
  fsdp_tokenizer_t t;
  for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
    write_hf_json(path, "BPE", ok[k].model, "null", ok[k].pre, "", ", \"abc\": 258");
    ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
    encode_str(t, ok[k].text, strlen(ok[k].text), 0, ids);
    ck_assert_msg(!strcmp(ids, ok[k].want), "case %zu: %s, want %s", k, ids, ok[k].want);
    fsdp_tokenizer_free(t);
  }
  /* an empty match at the very end ("$") reads nothing past the text: the
   * text is a heap block of exactly its bytes (valgrind and ASan see) */
  write_hf_json(path, "BPE", "", "null", SEQ(SPLIT("Regex", "$", "Isolated")), "", "");
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  char *exact = malloc(2);
  ck_assert_ptr_nonnull(exact);
  memcpy(exact, "ab", 2);
  encode_str(t, exact, 2, 0, ids);
  ck_assert_str_eq(ids, "256");
  free(exact);
  fsdp_tokenizer_free(t);
  write_hf_json(path, "BPE", "", "null", BL_NOREGEX,
                "{\"id\": 257, \"content\": \"<|endoftext|>\", \"special\": true},"
                "{\"id\": 258, \"content\": \"<x>\", \"special\": false},"
                "{\"id\": 259, \"content\": \"<|bos|>\", \"special\": true},"
                "{\"id\": 259, \"content\": \"<|bos|>\", \"special\": true}", "");
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_tokenizer_vocab_size(t), 260);
  ck_assert_int_eq(fsdp_tokenizer_eot(t), 257);
  encode_str(t, "a<x>b<|bos|>", 12, 0, ids); /* a non-special added token always matches */
  ck_assert_str_eq(ids, "97 258 98 60 124 98 111 115 124 62");
  encode_str(t, "a<x>b<|bos|>", 12, FSDP_TOKENIZE_ALLOW_SPECIAL, ids);
  ck_assert_str_eq(ids, "97 258 98 259");
  size_t len;
  const char *s = fsdp_tokenizer_token(t, 259, &len);
  ck_assert_int_eq((int)len, 7);
  ck_assert(!memcmp(s, "<|bos|>", 7));
  fsdp_tokenizer_free(t);
}
END_TEST

/* Qwen2's normalizer: NFC before pre-tokenisation (ids checked against
 * tokenizers 0.23 on the same files), then the added tokens marked
 * "normalized" matched in the normalized text, after the others in the raw. */
START_TEST(bpe_tokenizer_json_nfc) {
  char path[300], ids[256];
  snprintf(path, sizeof path, "%s/nfc.json", tmp_dir);
  const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
  const char *nfc = "{\"type\": \"NFC\"}";
  struct { const char *norm, *text, *want; } ok[] = {
      {"null", "e\xcc\x81", "101 204 129"},        /* e + U+0301 as it is */
      {nfc, "e\xcc\x81", "195 169"},               /* composed: U+00E9 */
      {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"NFC\"}]}",
       "e\xcc\x81", "195 169"},
      {nfc, "A\xcc\x8a", "195 133"},               /* U+00C5 */
      {nfc, "\xe2\x84\xab", "195 133"},            /* ANGSTROM SIGN: a singleton, to U+00C5 */
      {nfc, "\xe1\x84\x80\xe1\x85\xa1", "234 176 128"}, /* Hangul jamo to U+AC00 */
      {nfc, "\xe0\xa5\x98", "224 164 149 224 164 188"}, /* U+0958: excluded from composition */
      {nfc, "\xff\xcc\x81" "e\xcc\x81", "255 204 129 195 169"}, /* not UTF-8: kept, composes with nothing */
  };
  fsdp_tokenizer_t t;
  for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
    write_hf_json(path, "BPE", "", ok[k].norm, bl, "", "");
    ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
    encode_str(t, ok[k].text, strlen(ok[k].text), 0, ids);
    ck_assert_msg(!strcmp(ids, ok[k].want), "case %zu: %s, want %s", k, ids, ok[k].want);
    if (k + 1 == sizeof ok / sizeof ok[0]) { /* NUL kept */
      encode_str(t, "e\0e\xcc\x81", 5, 0, ids);
      ck_assert_str_eq(ids, "101 0 195 169");
    }
    fsdp_tokenizer_free(t);
  }
  /* "né" normalized: found in ne + U+0301 once composed; not normalized: raw text only. */
  write_hf_json(path, "BPE", "", nfc, bl, "{\"id\": 258, \"content\": \"n\xc3\xa9\", "
                "\"normalized\": true, \"special\": false}", "");
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  encode_str(t, "xne\xcc\x81y", 6, 0, ids);
  ck_assert_str_eq(ids, "120 258 121");
  fsdp_tokenizer_free(t);
  write_hf_json(path, "BPE", "", nfc, bl, "{\"id\": 258, \"content\": \"n\xc3\xa9\", "
                "\"normalized\": false, \"special\": false}", "");
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  encode_str(t, "xne\xcc\x81y", 6, 0, ids);
  ck_assert_str_eq(ids, "120 110 195 169 121");
  encode_str(t, "xn\xc3\xa9y", 5, 0, ids);
  ck_assert_str_eq(ids, "120 258 121");
  fsdp_tokenizer_free(t);
  /* Raw-text tokens first: the special "bc" wins over the normalized "abc". */
  write_hf_json(path, "BPE", "", "null", bl,
                "{\"id\": 258, \"content\": \"bc\", \"normalized\": false, \"special\": true},"
                "{\"id\": 259, \"content\": \"abc\", \"normalized\": true, \"special\": false}", "");
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  encode_str(t, "abc", 3, FSDP_TOKENIZE_ALLOW_SPECIAL, ids);
  ck_assert_str_eq(ids, "97 258");
  encode_str(t, "abc", 3, 0, ids);
  ck_assert_str_eq(ids, "259");
  fsdp_tokenizer_free(t);
}
END_TEST

/* Every part fsdp does not implement, refused naming the file and the key. */
START_TEST(bpe_tokenizer_json_refused) {
  char path[300];
  snprintf(path, sizeof path, "%s/refused.json", tmp_dir);
  const char *bl = "{\"type\": \"ByteLevel\"}";
  struct { const char *model, *norm, *pre, *added, *want; fsdp_status_t code; } bad[] = {
      {"", "null", SEQ(SPLIT("Regex", "\\\\s", "Removed")), "",
       "pre_tokenizer.pretokenizers[0]: behavior is Removed", FSDP_ERR_UNSUPPORTED},
      {"", "null", SEQ(SPLIT("Regex", "(a", "Isolated")), "",
       "pre_tokenizer.pretokenizers[0]: PCRE2 cannot compile the pattern \"(a\" at offset 2",
       FSDP_ERR_FORMAT},
      {"", "null", "{\"type\": \"Sequence\", \"pretokenizers\": [" BL_NOREGEX ", "
       SPLIT("String", "b", "Isolated") "]}", "", "pre_tokenizer.pretokenizers[1]: Split follows "
       "ByteLevel", FSDP_ERR_UNSUPPORTED},
      {"", "null", "{\"type\": \"Sequence\", \"pretokenizers\": [" SPLIT("String", "b", "Isolated")
       "]}", "", "pre_tokenizer has no ByteLevel step", FSDP_ERR_UNSUPPORTED},
      {"", "null", "null", "", "pre_tokenizer is null", FSDP_ERR_UNSUPPORTED},
      {"", "null", "{\"type\": \"Metaspace\"}", "", "pre_tokenizer: Metaspace: a SentencePiece",
       FSDP_ERR_UNSUPPORTED},
      {"", "null", "{\"type\": \"Whitespace\"}", "", "pre_tokenizer: type Whitespace",
       FSDP_ERR_UNSUPPORTED},
      {"", "{\"type\": \"Lowercase\"}", bl, "", "line 1: normalizer: Lowercase; fsdp reads "
       "tokenizers without a normalizer or with NFC", FSDP_ERR_UNSUPPORTED},
      {"", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"NFKC\"}]}",
       bl, "", "line 1: normalizer.normalizers[1]: NFKC;", FSDP_ERR_UNSUPPORTED},
      {"", "{\"type\": \"Prepend\", \"prepend\": \"x\"}", bl, "", "normalizer: Prepend; fsdp "
       "reads tokenizers without a normalizer or with NFC (Qwen2's); this one is a SentencePiece",
       FSDP_ERR_UNSUPPORTED},
      {"", "{\"type\": \"NFC\"}", bl, "{\"id\": 258, \"content\": \"ne\xcc\x81\", \"normalized\": "
       "true}", "added token \"ne\xcc\x81\" is normalized but not in NFC", FSDP_ERR_UNSUPPORTED},
      {", \"byte_fallback\": true", "null", bl, "", "model.byte_fallback is true: a SentencePiece",
       FSDP_ERR_UNSUPPORTED},
      {", \"continuing_subword_prefix\": \"##\"", "null", bl, "",
       "model.continuing_subword_prefix is set", FSDP_ERR_UNSUPPORTED},
      {"", "null", bl, "{\"id\": 258, \"content\": \"<s>\", \"lstrip\": true}",
       "added token \"<s>\" has lstrip true", FSDP_ERR_UNSUPPORTED},
      {"", "null", bl, "{\"id\": 258, \"content\": \"<s>\"}, {\"id\": 258, \"content\": \"<t>\"}",
       "added token \"<t>\" has id 258; tokenizers reads it as id 259", FSDP_ERR_FORMAT},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    write_hf_json(path, "BPE", bad[k].model, bad[k].norm, bad[k].pre, bad[k].added, "");
    fsdp_tokenizer_t t = NULL;
    ck_assert_msg(fsdp_tokenizer_load(path, &t) == bad[k].code, "case %zu: %s", k,
                  fsdp_last_error());
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(fsdp_last_error(), path) && strstr(fsdp_last_error(), bad[k].want),
                  "case %zu: %s\nlacks %s", k, fsdp_last_error(), bad[k].want);
  }
}
END_TEST

/* A tokenizer.json of Llama 3's size loads in linear time (the test's timeout
 * would catch a quadratic step): 128000 model ids (bytes, every byte pair,
 * then pairs plus a byte), 190k merges ([a, b] pairs, alternative splits last),
 * 256 special tokens after them, <|begin_of_text|> from the template. */
START_TEST(bpe_llama3_size_loads) {
  char path[300], a[4], b[4], c[4];
  snprintf(path, sizeof path, "%s/llama3-size.json", tmp_dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "{\"added_tokens\": [");
  for (int i = 0; i < 256; i++)
    fprintf(f, "%s{\"id\": %d, \"content\": \"<|special_%d|>\", \"special\": true}", i ? ", " : "",
            128000 + i, i);
  fprintf(f, "], \"normalizer\": null, \"pre_tokenizer\": "
          SEQ(SPLIT("Regex", "\\\\s+", "Isolated")) ", \"post_processor\": {\"type\": "
          "\"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|special_0|>\", "
          "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\"}}]},\n"
          "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {");
  int id = 0;
  for (; id < 256; id++) {
    tok_byte_spelling(id, a);
    fprintf(f, id ? ",\n" : "\n");
    tok_json_key(f, a);
    fprintf(f, ": %d", id);
  }
  for (int k = 0; id < 128000; k++, id++) { /* pair k, or triple k - 65536 (x = 0) */
    char key[12];
    tok_byte_spelling(k < 65536 ? k >> 8 : 0, a);
    tok_byte_spelling(k < 65536 ? k & 255 : (k - 65536) >> 8, b);
    tok_byte_spelling(k < 65536 ? 0 : (k - 65536) & 255, c);
    snprintf(key, sizeof key, "%s%s%s", a, b, k < 65536 ? "" : c);
    fprintf(f, ",\n");
    tok_json_key(f, key);
    fprintf(f, ": %d", id);
  }
  fprintf(f, "}, \"merges\": [");
  for (int k = 0; k < 127744 + 62208; k++) { /* pairs, triples, then the triples' other split */
    int t = k < 65536 ? 0 : k < 127744 ? k - 65536 : k - 127744;
    char l[12], r[12];
    tok_byte_spelling(k < 65536 ? k >> 8 : 0, a);
    tok_byte_spelling(k < 65536 ? k & 255 : t >> 8, b);
    tok_byte_spelling(t & 255, c);
    if (k < 65536) snprintf(l, sizeof l, "%s", a), snprintf(r, sizeof r, "%s", b);
    else if (k < 127744) snprintf(l, sizeof l, "%s%s", a, b), snprintf(r, sizeof r, "%s", c);
    else snprintf(l, sizeof l, "%s", a), snprintf(r, sizeof r, "%s%s", b, c);
    fprintf(f, "%s[", k ? ",\n" : "\n");
    tok_json_key(f, l);
    fprintf(f, ", ");
    tok_json_key(f, r);
    fprintf(f, "]");
  }
  fprintf(f, "]}}\n");
  fclose(f);
  fsdp_tokenizer_t t;
  ck_assert_msg(fsdp_tokenizer_load(path, &t) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_tokenizer_vocab_size(t), 128256);
  ck_assert_int_eq(fsdp_tokenizer_eot(t), 128000);
  char ids[64];
  encode_str(t, "\x00\x01\x02<|special_9|>\x01\x02", 18, FSDP_TOKENIZE_ALLOW_SPECIAL, ids);
  ck_assert_str_eq(ids, "66050 128009 514"); /* triple (0, 1, 2): 256 + 65536 + 1 * 256 + 2 */
  fsdp_tokenizer_free(t);
}
END_TEST

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int main(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/fsdp-test-bpe-XXXXXX", base);
  if (strlen(base) > 30 || !mkdtemp(tmp_dir)) return fprintf(stderr, "no temporary directory\n"), 1;
  Suite *s = suite_create("bpe");
  TCase *tc = tcase_create("bpe");
  tcase_add_test(tc, bpe_round_trips);
  tcase_add_test(tc, bpe_merges_by_rank);
  tcase_add_test(tc, bpe_pieces_bound_merges);
  tcase_add_test(tc, bpe_special_tokens);
  tcase_add_loop_test(tc, bpe_load_errors, 0, sizeof bad_cases / sizeof bad_cases[0]);
  tcase_add_test(tc, bpe_large_vocab_loads);
  tcase_add_test(tc, bpe_tokenizer_json);
  tcase_add_test(tc, bpe_tokenizer_json_pipeline);
  tcase_add_test(tc, bpe_tokenizer_json_nfc);
  tcase_add_test(tc, bpe_tokenizer_json_refused);
  tcase_add_test(tc, bpe_llama3_size_loads);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  const int rc = check_run(s);
  nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
