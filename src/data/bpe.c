/* src/data/bpe.c — byte-level BPE at work: the byte alphabet, the lookup
 * tables, added tokens, NFC through utf8proc, pre-tokenisation through PCRE2,
 * merges by rank, encode and decode. Loading the files is bpe_load.c's and
 * bpe_json.c's. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/internal.h"
#include "data/bpe_internal.h"

/* ---- the byte alphabet ----------------------------------------------------
 * Bytes that are printable Latin-1 (33..126, 161..172, 174..255) are spelled
 * as themselves; the other 68, in byte order, as U+0100, U+0101, ... so that
 * no token's spelling holds a space or a control character. */
static int printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

int bpe_byte_char(int b) {
  if (printable(b)) return b;
  int k = 0;
  for (int c = 0; c < b; c++) k += !printable(c);
  return 256 + k;
}

int bpe_char_byte(uint32_t cp) {
  if (cp < 256) return printable((int)cp) ? (int)cp : -1;
  if (cp >= 256 + 68) return -1;
  for (int b = 0, k = 0; b < 256; b++)
    if (!printable(b) && k++ == (int)(cp - 256)) return b;
  return -1;
}

/* ---- lookups ------------------------------------------------------------- */

uint64_t bpe_hash(const char *s, size_t len) { /* FNV-1a, then a final mix */
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
  return h ^ (h >> 29);
}

int bpe_vocab_find(const struct fsdp_tokenizer *t, const char *s, size_t len) {
  size_t mask = t->map.cap - 1;
  for (size_t i = bpe_hash(s, len) & mask;; i = (i + 1) & mask) {
    int id = t->map.slot[i];
    if (id < 0) return -1;
    size_t n = t->off[id + 1] - t->off[id];
    if (n == len && memcmp(t->bytes + t->off[id], s, len) == 0) return id;
  }
}

static uint64_t pair_key(int left, int right) {
  return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

const bpe_merge_t *bpe_merge_find(const struct fsdp_tokenizer *t, int left, int right) {
  uint64_t key = pair_key(left, right), mask = t->merge_cap - 1;
  for (uint64_t i = (key * 0x9E3779B97F4A7C15ULL >> 17) & mask;; i = (i + 1) & mask) {
    if (t->merges[i].key == key) return &t->merges[i];
    if (t->merges[i].key == UINT64_MAX) return NULL;
  }
}

/* ---- pre-tokenisation -----------------------------------------------------
 * Patterns run under PCRE2 because they need Unicode letter and number
 * classes (\p{L}, \p{N}), Unicode whitespace (\s under UCP) and case-folding
 * groups (Llama 3's (?i:'s|...)), which POSIX regex does not have; PCRE2's
 * dialect reads the patterns Hugging Face writes for Oniguruma. MATCH_INVALID_UTF
 * lets it run on text that is not valid UTF-8 (it then skips what it cannot
 * read, and the bytes between matches become pieces of their own). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

fsdp_status_t bpe_add_split(struct fsdp_tokenizer *t, const char *pattern, size_t len,
                            int literal, const char *where) {
  if (t->n_split == BPE_MAX_SPLITS)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps that split",
                      where, BPE_MAX_SPLITS);
  if (!pattern) pattern = gpt2_pattern, len = sizeof gpt2_pattern - 1;
  int err;
  PCRE2_SIZE at;
  uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opt, &err, &at, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return fsdp_error(err == PCRE2_ERROR_UNICODE_NOT_SUPPORTED ? FSDP_ERR_UNSUPPORTED
                                                                : FSDP_ERR_FORMAT,
                      "%s: PCRE2 cannot compile the pattern \"%.*s\" at offset %zu: %s", where,
                      (int)(len < 80 ? len : 80), pattern, (size_t)at, (const char *)msg);
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* an interpreter fallback when JIT is absent */
  t->split[t->n_split++] = re;
  return FSDP_SUCCESS;
}

static int added_first(const struct fsdp_tokenizer *t, const bpe_added_t *a) {
  return (unsigned char)t->bytes[t->off[a->id]];
}

fsdp_status_t bpe_index_added(struct fsdp_tokenizer *t, const char *path) {
  bpe_added_t *by = malloc((t->n_added ? (size_t)t->n_added : 1) * sizeof *by);
  if (!by) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  memset(t->added_at, 0, sizeof t->added_at); /* counting sort by first byte */
  for (int i = 0; i < t->n_added; i++) t->added_at[added_first(t, &t->added[i]) + 1]++;
  for (int b = 0; b < 256; b++) t->added_at[b + 1] += t->added_at[b];
  int fill[256];
  memcpy(fill, t->added_at, sizeof fill);
  for (int i = 0; i < t->n_added; i++) by[fill[added_first(t, &t->added[i])]++] = t->added[i];
  free(t->added);
  t->added = by;
  return FSDP_SUCCESS;
}

/* The leftmost added token in s[0..len) of those matched in the raw text
 * (normalized 0) or in the normalized text (1), the longest there (HF's
 * leftmost-longest match): its offset (len when none), *id and *k its bytes. */
static size_t find_added(const struct fsdp_tokenizer *t, const char *s, size_t len, int special,
                         int normalized, int *id, size_t *k) {
  for (size_t i = 0; t->n_added && i < len; i++) {
    unsigned char b = (unsigned char)s[i];
    *k = 0;
    for (int j = t->added_at[b]; j < t->added_at[b + 1]; j++) {
      const bpe_added_t *a = &t->added[j];
      size_t n = t->off[a->id + 1] - t->off[a->id];
      if ((special || !a->special) && a->normalized == normalized && n > *k && n <= len - i &&
          !memcmp(s + i, t->bytes + t->off[a->id], n))
        *id = a->id, *k = n;
    }
    if (*k) return i;
  }
  return len;
}

/* ---- normalization ---------------------------------------------------------- */

static fsdp_status_t nfc_append(char **buf, size_t *cap, size_t at, const void *p, size_t n) {
  if (*cap - at < n) {
    size_t c = *cap ? *cap : 4096;
    while (c - at < n) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer: out of memory normalizing "
                              "%zu bytes", at + n);
    *buf = b, *cap = c;
  }
  memcpy(*buf + at, p, n);
  return FSDP_SUCCESS;
}

fsdp_status_t bpe_nfc(const char *s, size_t len, char **buf, size_t *cap, size_t *out_len) {
  const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
  size_t at = 0, n = 0;
  while (at < len) {
    size_t end = at;
    utf8proc_int32_t cp;
    utf8proc_ssize_t k;
    while (end < len && (k = utf8proc_iterate(u + end, (utf8proc_ssize_t)(len - end), &cp)) > 0)
      end += (size_t)k;
    if (end > at) {
      utf8proc_uint8_t *nfc = NULL;
      utf8proc_ssize_t m = utf8proc_map(u + at, (utf8proc_ssize_t)(end - at), &nfc,
                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE);
      if (m < 0)
        return fsdp_error(m == UTF8PROC_ERROR_NOMEM ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_INTERNAL,
                          "tokenizer: NFC of bytes %zu..%zu failed: %s", at, end,
                          utf8proc_errmsg(m));
      fsdp_status_t st = nfc_append(buf, cap, n, nfc, (size_t)m);
      free(nfc);
      FSDP_TRY(st);
      n += (size_t)m;
    }
    if (end < len) { /* not UTF-8: the byte itself */
      FSDP_TRY(nfc_append(buf, cap, n, s + end, 1));
      n++, end++;
    }
    at = end;
  }
  *out_len = n;
  return FSDP_SUCCESS;
}

/* ---- merges ----------------------------------------------------------------
 * A piece's symbols form a linked list; candidate pairs wait in a min-heap by
 * (rank, position), so the best-ranked pair is merged first and, among equal
 * pairs, the leftmost: the result of GPT-2's "merge the best pair everywhere,
 * left to right" in O(m log m) for a piece of m bytes. A popped candidate
 * whose symbols changed since it was pushed is stale and skipped. */
typedef struct {
  int rank, pos, left, right;
} cand_t;

typedef struct {
  int *sym, *next, *prev; /* (m) */
  cand_t *heap;           /* (3m) pushes: m-1 at the start, at most 2 per merge */
  size_t cap, n_heap;
  char *norm;             /* (norm_cap) the normalized text of a span */
  size_t norm_cap;
} bpe_work_t;

static int cand_less(const cand_t *a, const cand_t *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_work_t *w, cand_t c) {
  size_t i = w->n_heap++;
  while (i > 0 && cand_less(&c, &w->heap[(i - 1) / 2])) {
    w->heap[i] = w->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->heap[i] = c;
}

static cand_t heap_pop(bpe_work_t *w) {
  cand_t top = w->heap[0], last = w->heap[--w->n_heap];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= w->n_heap) break;
    if (c + 1 < w->n_heap && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
    if (!cand_less(&w->heap[c], &last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (w->n_heap) w->heap[i] = last;
  return top;
}

static void push_pair(const struct fsdp_tokenizer *t, bpe_work_t *w, int pos) {
  if (pos < 0 || w->next[pos] < 0) return;
  const bpe_merge_t *m = bpe_merge_find(t, w->sym[pos], w->sym[w->next[pos]]);
  if (m) heap_push(w, (cand_t){m->rank, pos, w->sym[pos], w->sym[w->next[pos]]});
}

static fsdp_status_t work_reserve(bpe_work_t *w, size_t m) {
  if (m <= w->cap) return FSDP_SUCCESS;
  size_t cap = m < 64 ? 64 : m;
  int *sym = realloc(w->sym, 3 * cap * sizeof(int));
  if (!sym) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for a piece of "
                              "%zu bytes", m);
  w->sym = sym;
  cand_t *heap = realloc(w->heap, 3 * cap * sizeof *heap);
  if (!heap) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for a piece of "
                               "%zu bytes", m);
  w->heap = heap;
  w->cap = cap;
  return FSDP_SUCCESS;
}

static fsdp_status_t buf_reserve(fsdp_token_buf_t *out, size_t more) {
  if (out->cap - out->n >= more) return FSDP_SUCCESS;
  size_t cap = out->cap ? out->cap : 1024;
  while (cap - out->n < more) cap *= 2;
  int *ids = realloc(out->ids, cap * sizeof *ids);
  if (!ids) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for %zu ids", cap);
  out->ids = ids;
  out->cap = cap;
  return FSDP_SUCCESS;
}

/* The ids of one piece, appended to out. */
static fsdp_status_t bpe_piece(const struct fsdp_tokenizer *t, bpe_work_t *w,
                               const unsigned char *p, size_t m, fsdp_token_buf_t *out) {
  if (m == 0) return FSDP_SUCCESS;
  FSDP_TRY(work_reserve(w, m));
  FSDP_TRY(buf_reserve(out, m));
  w->next = w->sym + w->cap;
  w->prev = w->next + w->cap;
  w->n_heap = 0;
  for (size_t i = 0; i < m; i++) {
    w->sym[i] = t->byte_id[p[i]];
    w->next[i] = i + 1 < m ? (int)i + 1 : -1;
    w->prev[i] = (int)i - 1;
  }
  for (size_t i = 0; i + 1 < m; i++) push_pair(t, w, (int)i);
  while (w->n_heap) {
    cand_t c = heap_pop(w);
    int nx = w->next[c.pos];
    if (w->sym[c.pos] != c.left || nx < 0 || w->sym[nx] != c.right) continue; /* stale */
    w->sym[c.pos] = bpe_merge_find(t, c.left, c.right)->id;
    w->sym[nx] = -1; /* gone: no candidate can match it again */
    w->next[c.pos] = w->next[nx];
    if (w->next[nx] >= 0) w->prev[w->next[nx]] = c.pos;
    push_pair(t, w, w->prev[c.pos]);
    push_pair(t, w, c.pos);
  }
  for (int i = 0; i >= 0; i = w->next[i]) out->ids[out->n++] = w->sym[i];
  return FSDP_SUCCESS;
}

/* A piece after the last split: one token when ignore_merges and the model
 * has it whole, else the merges. */
static fsdp_status_t bpe_word(const struct fsdp_tokenizer *t, bpe_work_t *w, const char *s,
                              size_t m, fsdp_token_buf_t *out) {
  int whole = t->ignore_merges && m ? bpe_vocab_find(t, s, m) : -1;
  if (whole < 0) return bpe_piece(t, w, (const unsigned char *)s, m, out);
  FSDP_TRY(buf_reserve(out, 1));
  out->ids[out->n++] = whole;
  return FSDP_SUCCESS;
}

static size_t utf8_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Split step `step` on s[0..len): each match, and each run between matches
 * (text the pattern does not take, or cannot read: not UTF-8), is a piece for
 * the next step. An empty match is a boundary but no piece, and the search
 * goes on one character later, as HF's iteration over Oniguruma's matches
 * does. */
static fsdp_status_t split_pieces(const struct fsdp_tokenizer *t, bpe_work_t *w,
                                  pcre2_match_data *md, int step, const char *s, size_t len,
                                  fsdp_token_buf_t *out) {
  if (step == t->n_split) return bpe_word(t, w, s, len, out);
  size_t at = 0, prev = 0;
  while (at < len) {
    int rc = pcre2_match(t->split[step], (PCRE2_SPTR)s, len, at, 0, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) { /* rc 0: the ovector holds fewer groups than the pattern; [0], [1] are set */
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return fsdp_error(FSDP_ERR_INTERNAL, "tokenizer: PCRE2 failed at byte %zu: %s", at,
                        (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e == b) { /* an empty match makes no piece but ends the one before */
      if (b > prev) FSDP_TRY(split_pieces(t, w, md, step + 1, s + prev, b - prev, out));
      prev = b;
      if (b == len) break; /* at the end ("$"): s[b] is past the text */
      at = b + utf8_len((unsigned char)s[b]);
      continue;
    }
    if (b > prev) FSDP_TRY(split_pieces(t, w, md, step + 1, s + prev, b - prev, out));
    FSDP_TRY(split_pieces(t, w, md, step + 1, s + b, e - b, out));
    prev = at = e;
  }
  return prev < len ? split_pieces(t, w, md, step + 1, s + prev, len - prev, out) : FSDP_SUCCESS;
}

static fsdp_status_t add_id(fsdp_token_buf_t *out, int id) {
  FSDP_TRY(buf_reserve(out, 1));
  out->ids[out->n++] = id;
  return FSDP_SUCCESS;
}

/* Text between the added tokens matched in the raw text, as HF's
 * AddedVocabulary takes it: normalized (NFC when the file says so), split on
 * the added tokens matched in normalized text, pre-tokenised. */
static fsdp_status_t encode_span(const struct fsdp_tokenizer *t, bpe_work_t *w,
                                 pcre2_match_data *md, const char *s, size_t len, int special,
                                 fsdp_token_buf_t *out) {
  if (t->nfc && len) {
    FSDP_TRY(bpe_nfc(s, len, &w->norm, &w->norm_cap, &len));
    s = w->norm;
  }
  while (len > 0) {
    int id = -1;
    size_t k = 0, plain = find_added(t, s, len, special, 1, &id, &k);
    FSDP_TRY(split_pieces(t, w, md, 0, s, plain, out));
    if (k) FSDP_TRY(add_id(out, id));
    s += plain + k;
    len -= plain + k;
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_tokenizer_encode(fsdp_tokenizer_t t, const char *text, size_t len, int flags,
                                    fsdp_token_buf_t *out) {
  if (!t || (!text && len) || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer encode: tok, text and out must not "
                      "be NULL");
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (!md) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer encode: out of memory");
  bpe_work_t w = {0};
  fsdp_status_t st = FSDP_SUCCESS;
  int special = flags & FSDP_TOKENIZE_ALLOW_SPECIAL, id = -1;
  while (st == FSDP_SUCCESS && len > 0) {
    size_t k = 0, plain = find_added(t, text, len, special, 0, &id, &k);
    st = encode_span(t, &w, md, text, plain, special, out);
    if (st == FSDP_SUCCESS && k) st = add_id(out, id);
    text += plain + k;
    len -= plain + k;
  }
  free(w.sym);
  free(w.heap);
  free(w.norm);
  pcre2_match_data_free(md);
  return st;
}

fsdp_status_t fsdp_tokenizer_decode(fsdp_tokenizer_t t, const int *ids, size_t n, char *text,
                                    size_t cap, size_t *len) {
  if (!t || (!ids && n) || (!text && cap) || !len)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer decode: tok, ids, text (when cap > "
                      "0) and len must not be NULL");
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer decode: id %d at position %zu is "
                        "outside the vocabulary [0, %d)", ids[i], i, t->n);
    size_t k = t->off[ids[i] + 1] - t->off[ids[i]];
    if (at < cap) memcpy(text + at, t->bytes + t->off[ids[i]], k < cap - at ? k : cap - at);
    at += k;
  }
  *len = at;
  return FSDP_SUCCESS;
}

int fsdp_tokenizer_vocab_size(fsdp_tokenizer_t t) { return t ? t->n : 0; }

int fsdp_tokenizer_eot(fsdp_tokenizer_t t) { return t ? t->eot : -1; }

const char *fsdp_tokenizer_token(fsdp_tokenizer_t t, int id, size_t *len) {
  if (!t || id < 0 || id >= t->n) return NULL;
  if (len) *len = t->off[id + 1] - t->off[id];
  return t->bytes + t->off[id];
}

void fsdp_tokenizer_free(fsdp_tokenizer_t t) {
  if (!t) return;
  free(t->bytes);
  free(t->off);
  free(t->map.slot);
  free(t->merges);
  free(t->added);
  for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i]);
  free(t);
}

void fsdp_token_buf_free(fsdp_token_buf_t *buf) {
  if (!buf) return;
  free(buf->ids);
  *buf = (fsdp_token_buf_t){0};
}
