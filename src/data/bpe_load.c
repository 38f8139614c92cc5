/* src/data/bpe_load.c — loading a GPT-2 tokenizer from vocab.json and
 * merges.txt, strictly: every way the files can be wrong is an error naming
 * the file, the line and the token; the parts Hugging Face's tokenizer.json
 * shares with them (bpe_json.c reads the rest). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/json.h"
#include "data/bpe_internal.h"

/* Llama 3's tokenizer.json is 9 MB; a file this large is not a tokenizer. */
#define BPE_MAX_FILE ((size_t)1 << 30)

/* The whole of path, NUL-terminated. */
static fsdp_status_t read_all(const char *path, char **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  while (b) {
    if (cap > BPE_MAX_FILE) {
      free(b);
      fclose(f);
      return fsdp_error(FSDP_ERR_FORMAT, "%s: larger than %zu MiB: not a tokenizer file", path,
                        BPE_MAX_FILE >> 20);
    }
    n += fread(b + n, 1, cap - 1 - n, f);
    if (n < cap - 1) break;
    char *g = realloc(b, cap *= 2);
    if (!g) free(b);
    b = g;
  }
  int err = ferror(f);
  fclose(f);
  if (!b) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory reading it", path);
  if (err) return free(b), fsdp_error(FSDP_ERR_IO, "%s: read failed", path);
  b[n] = '\0';
  *buf = b;
  *len = n;
  return FSDP_SUCCESS;
}

/* One UTF-8 code point of s[0..len) (valid UTF-8: it came from the JSON
 * reader); *k its bytes. */
static uint32_t utf8_next(const unsigned char *s, size_t len, size_t *k) {
  unsigned c = s[0];
  size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (n > len) n = len;
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (size_t i = 1; i < n; i++) cp = cp << 6 | (s[i] & 0x3F);
  *k = n;
  return cp;
}

/* A token's spelling in the byte alphabet, turned into its bytes (dst holds
 * len bytes: never more than the spelling). 0, or -1 with *bad the first
 * code point outside the alphabet. */
static int spelling_bytes(const char *s, size_t len, char *dst, size_t *n, uint32_t *bad) {
  size_t at = 0, k;
  *n = 0;
  while (at < len) {
    uint32_t cp = utf8_next((const unsigned char *)s + at, len - at, &k);
    int b = bpe_char_byte(cp);
    if (b < 0) return *bad = cp, -1;
    dst[(*n)++] = (char)b;
    at += k;
  }
  return 0;
}

static size_t pow2_above(size_t n) {
  size_t c = 16;
  while (c < 2 * n) c *= 2;
  return c;
}

/* ---- vocab.json ------------------------------------------------------------ */

/* Every id in [0, n): none repeated, none past the end (so none missing). */
static fsdp_status_t check_ids(const char *path, const json_t *v, int *owner) {
  size_t n = v->n;
  for (size_t i = 0; i < n; i++) owner[i] = -1;
  for (size_t i = 0; i < n; i++) {
    const json_t *it = &v->items[i];
    int64_t id;
    if (!json_int(it, &id) || id < 0)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.64s\" has id %.32s; ids are "
                        "integers from 0", path, it->line, v->keys[i],
                        it->type == JSON_NUMBER ? it->text : "(not a number)");
    if ((uint64_t)id >= n) {
      size_t missing = 0;
      for (size_t j = 0; j < n; j++) /* the smallest id no token has so far */
        if (owner[j] < 0) { missing = j; break; }
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.64s\" has id %lld, but ids must "
                        "be 0 .. %zu (the file has %zu tokens): the ids are not contiguous (id "
                        "%zu is missing)", path, it->line, v->keys[i], (long long)id, n - 1, n,
                        missing);
    }
    if (owner[id] >= 0)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.64s\" has id %lld, already the "
                        "id of \"%.64s\" (line %d)", path, it->line, v->keys[i], (long long)id,
                        v->keys[owner[id]], v->items[owner[id]].line);
    owner[id] = (int)i;
  }
  return FSDP_SUCCESS;
}

/* Fills bytes/off in id order from the spellings; owner[id] is the key. */
static fsdp_status_t vocab_bytes(struct fsdp_tokenizer *t, const char *path, const json_t *v,
                                 const int *owner) {
  size_t total = 0;
  for (size_t i = 0; i < v->n; i++) total += strlen(v->keys[i]);
  t->bytes = malloc(total + 1);
  t->off = malloc((v->n + 1) * sizeof *t->off);
  if (!t->bytes || !t->off) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  size_t at = 0;
  for (int id = 0; id < t->n; id++) {
    const char *key = v->keys[owner[id]];
    size_t k;
    uint32_t bad;
    t->off[id] = at;
    if (spelling_bytes(key, strlen(key), t->bytes + at, &k, &bad))
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.64s\" (id %d): character "
                        "U+%04X is not in GPT-2's byte alphabet", path, v->items[owner[id]].line,
                        key, id, (unsigned)bad);
    if (k == 0)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"\" (id %d) is empty", path,
                        v->items[owner[id]].line, id);
    at += k;
  }
  t->off[t->n] = at;
  return FSDP_SUCCESS;
}

static fsdp_status_t vocab_index(struct fsdp_tokenizer *t, const char *path) {
  t->map.cap = pow2_above((size_t)t->n);
  t->map.slot = malloc(t->map.cap * sizeof *t->map.slot);
  if (!t->map.slot) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  memset(t->map.slot, 0xff, t->map.cap * sizeof *t->map.slot);
  for (int id = 0; id < t->n; id++) {
    const char *s = t->bytes + t->off[id];
    size_t len = t->off[id + 1] - t->off[id], i = bpe_hash(s, len) & (t->map.cap - 1);
    int other = bpe_vocab_find(t, s, len);
    if (other >= 0) /* two spellings of one byte string cannot happen; say so if it does */
      return fsdp_error(FSDP_ERR_FORMAT, "%s: ids %d and %d are the same bytes", path, other, id);
    while (t->map.slot[i] >= 0) i = (i + 1) & (t->map.cap - 1);
    t->map.slot[i] = id;
  }
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    if ((t->byte_id[b] = bpe_vocab_find(t, &c, 1)) < 0)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: no token for byte 0x%02x (spelled U+%04X): a "
                        "byte-level vocabulary needs all 256 bytes", path, b,
                        (unsigned)bpe_byte_char(b));
  }
  t->eot = bpe_vocab_find(t, "<|endoftext|>", 13);
  return FSDP_SUCCESS;
}

/* The vocabulary from v, an object of tokens and ids (vocab.json's root, or
 * tokenizer.json's model.vocab). */
fsdp_status_t bpe_vocab_from_json(struct fsdp_tokenizer *t, const char *path, const json_t *v) {
  if (!v || v->type != JSON_OBJECT || v->n == 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: expected an object of tokens and ids, found %s", path,
                      !v ? "nothing" : v->type == JSON_OBJECT ? "an empty object"
                                                              : "another JSON value");
  if (v->n > INT32_MAX / 2) return fsdp_error(FSDP_ERR_FORMAT, "%s: %zu tokens is too many", path, v->n);
  int *owner = malloc(v->n * sizeof *owner);
  if (!owner) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  t->n = t->n_model = (int)v->n;
  fsdp_status_t st = check_ids(path, v, owner);
  if (!st) st = vocab_bytes(t, path, v, owner);
  if (!st) st = vocab_index(t, path);
  free(owner);
  return st;
}

fsdp_status_t bpe_read_json(const char *path, json_t **v) {
  char *text;
  size_t len;
  FSDP_TRY(read_all(path, &text, &len));
  fsdp_status_t st = json_parse(text, len, path, v);
  free(text);
  return st;
}

static fsdp_status_t load_vocab(struct fsdp_tokenizer *t, const char *path) {
  json_t *v = NULL;
  FSDP_TRY(bpe_read_json(path, &v));
  fsdp_status_t st = bpe_vocab_from_json(t, path, v);
  json_free(v);
  return st;
}

/* ---- merges.txt ------------------------------------------------------------ */

/* The id a merge line's token names. */
static fsdp_status_t merge_token(const struct fsdp_tokenizer *t, const char *path, int line,
                                 const char *s, size_t len, char *scratch, int *id) {
  size_t n;
  uint32_t bad;
  if (spelling_bytes(s, len, scratch, &n, &bad))
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.*s\": character U+%04X is not in "
                      "GPT-2's byte alphabet", path, line, (int)len, s, (unsigned)bad);
  if ((*id = bpe_vocab_find(t, scratch, n)) < 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: token \"%.*s\" is not in the vocabulary",
                      path, line, (int)len, s);
  return FSDP_SUCCESS;
}

fsdp_status_t bpe_add_merge(struct fsdp_tokenizer *t, const char *path, int line, const char *s,
                            size_t len, const int *merge_line) {
  const char *sp = memchr(s, ' ', len);
  if (!sp || sp == s || sp + 1 == s + len || memchr(sp + 1, ' ', (size_t)(s + len - sp - 1)))
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: \"%.*s\" is not a merge (two tokens "
                      "separated by one space)", path, line, (int)(len < 64 ? len : 64), s);
  char scratch[1024];
  if (len >= sizeof scratch)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: a merge of %zu bytes is too long", path,
                      line, len);
  int a = -1, b = -1;
  size_t la = (size_t)(sp - s), lb = len - la - 1;
  FSDP_TRY(merge_token(t, path, line, s, la, scratch, &a));
  FSDP_TRY(merge_token(t, path, line, sp + 1, lb, scratch, &b));
  size_t na = t->off[a + 1] - t->off[a], nb = t->off[b + 1] - t->off[b];
  memcpy(scratch, t->bytes + t->off[a], na);
  memcpy(scratch + na, t->bytes + t->off[b], nb);
  int id = bpe_vocab_find(t, scratch, na + nb);
  if (id < 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: merge \"%.*s\" makes \"%.*s%.*s\", which is "
                      "not in the vocabulary", path, line, (int)len, s, (int)la, s, (int)lb,
                      sp + 1);
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b, mask = t->merge_cap - 1;
  uint64_t i = (key * 0x9E3779B97F4A7C15ULL >> 17) & mask;
  for (; t->merges[i].key != UINT64_MAX; i = (i + 1) & mask)
    if (t->merges[i].key == key)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: merge \"%.*s\" repeats line %d", path,
                        line, (int)len, s, merge_line[t->merges[i].rank]);
  t->merges[i] = (bpe_merge_t){key, (int)t->n_merges++, id};
  return FSDP_SUCCESS;
}

fsdp_status_t bpe_merges_alloc(struct fsdp_tokenizer *t, const char *path, size_t n,
                                  int **merge_line) {
  t->merge_cap = pow2_above(n);
  t->merges = malloc(t->merge_cap * sizeof *t->merges);
  *merge_line = malloc((n ? n : 1) * sizeof **merge_line); /* rank -> line, for messages */
  if (!t->merges || !*merge_line) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  for (size_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
  return FSDP_SUCCESS;
}

/* The first byte of s[0..n) that is not UTF-8 text (a control character, or
 * not a well-formed sequence), or n: checked before a line is echoed.
 * Well-formed as Unicode's table 3-7 has it: the lead bytes C0, C1 and F5-FF
 * never occur, and the second byte's range after E0, ED, F0 and F4 excludes
 * overlong forms, surrogates (U+D800-DFFF) and code points above U+10FFFF. */
static size_t bad_byte(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
                                                   : c >= 0xF0 && c < 0xF5 ? 4 : 0;
    if (k == 0 || c < 0x20 || c == 0x7f || i + k > n) return i;
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    for (size_t j = 1; j < k; j++, lo = 0x80, hi = 0xBF)
      if (s[i + j] < lo || s[i + j] > hi) return i;
    i += k;
  }
  return n;
}

static fsdp_status_t load_merges(struct fsdp_tokenizer *t, const char *path) {
  char *text;
  size_t len;
  FSDP_TRY(read_all(path, &text, &len));
  size_t lines = 1;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  int *merge_line = NULL;
  fsdp_status_t st = bpe_merges_alloc(t, path, lines, &merge_line);
  const char *s = text, *end = text + len;
  for (int line = 1; st == FSDP_SUCCESS && s < end; line++) {
    const char *nl = memchr(s, '\n', (size_t)(end - s)), *e = nl ? nl : end;
    size_t n = (size_t)(e - s);
    if (n && s[n - 1] == '\r') n--;
    size_t bad = bad_byte((const unsigned char *)s, n);
    if (bad < n) {
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: byte 0x%02x at column %zu: merges.txt is "
                      "UTF-8 text without control characters", path, line,
                      (unsigned char)s[bad], bad + 1);
      break;
    }
    if (!(line == 1 && n >= 8 && !memcmp(s, "#version", 8))) {
      merge_line[t->n_merges] = line;
      st = bpe_add_merge(t, path, line, s, n, merge_line);
    }
    s = nl ? nl + 1 : end;
  }
  free(merge_line);
  free(text);
  return st;
}

/* GPT-2's pair of files, vocab.json and merges.txt (the tokenizer's front
 * door, fsdp_tokenizer_load in bpe_json.c, decides which format a path holds). */
fsdp_status_t bpe_load_gpt2_files(struct fsdp_tokenizer *t, const char *vocab,
                                  const char *merges) {
  FSDP_TRY(load_vocab(t, vocab));
  FSDP_TRY(load_merges(t, merges));
  FSDP_TRY(bpe_add_split(t, NULL, 0, 0, vocab));
  if (t->eot < 0) return FSDP_SUCCESS;
  if (!(t->added = malloc(sizeof *t->added)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", vocab);
  t->added[t->n_added++] = (bpe_added_t){t->eot, 1, 0};
  return bpe_index_added(t, vocab);
}
