/* src/data/bpe.c — GPT-2's byte-level BPE at work: the byte alphabet, the
 * lookup tables, pre-tokenisation through PCRE2, merges by rank, encode and
 * decode. Loading the files is bpe_load.c's. */
#include <stdlib.h>
#include <string.h>

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
 * GPT-2's pattern. PCRE2 because the pattern needs Unicode letter and number
 * classes (\p{L}, \p{N}) and Unicode whitespace (\s under UCP), which POSIX
 * regex does not have; MATCH_INVALID_UTF lets it run on text that is not
 * valid UTF-8 (it then skips what it cannot read, and encode keeps those
 * bytes as pieces of their own). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

fsdp_status_t bpe_compile_pattern(struct fsdp_tokenizer *t) {
  int err;
  PCRE2_SIZE at;
  t->re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "tokenizer: PCRE2 cannot compile GPT-2's pattern at "
                      "offset %zu: %s (a PCRE2 built without Unicode support?)", (size_t)at,
                      (const char *)msg);
  }
  pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* an interpreter fallback when JIT is absent */
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

/* Pieces of ordinary text: regex matches, and runs of bytes between them
 * that the regex could not read (not UTF-8). */
static fsdp_status_t encode_ordinary(const struct fsdp_tokenizer *t, bpe_work_t *w,
                                     pcre2_match_data *md, const char *s, size_t len,
                                     fsdp_token_buf_t *out) {
  size_t at = 0;
  while (at < len) {
    int rc = pcre2_match(t->re, (PCRE2_SPTR)s, len, at, 0, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return bpe_piece(t, w, (const unsigned char *)s + at, len - at, out);
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return fsdp_error(FSDP_ERR_INTERNAL, "tokenizer: PCRE2 failed at byte %zu: %s", at,
                        (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (b > at) FSDP_TRY(bpe_piece(t, w, (const unsigned char *)s + at, b - at, out));
    if (e == b) e = b + 1; /* every alternative takes a character; never loop */
    FSDP_TRY(bpe_piece(t, w, (const unsigned char *)s + b, e - b, out));
    at = e;
  }
  return FSDP_SUCCESS;
}

static const char eot_text[] = "<|endoftext|>";

fsdp_status_t fsdp_tokenizer_encode(fsdp_tokenizer_t t, const char *text, size_t len, int flags,
                                    fsdp_token_buf_t *out) {
  if (!t || (!text && len) || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer encode: tok, text and out must not "
                      "be NULL");
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
  if (!md) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer encode: out of memory");
  bpe_work_t w = {0};
  fsdp_status_t st = FSDP_SUCCESS;
  int special = (flags & FSDP_TOKENIZE_ALLOW_SPECIAL) && t->eot >= 0;
  size_t k = sizeof eot_text - 1;
  while (st == FSDP_SUCCESS && len > 0) {
    const char *hit = special ? memmem(text, len, eot_text, k) : NULL;
    size_t plain = hit ? (size_t)(hit - text) : len;
    st = encode_ordinary(t, &w, md, text, plain, out);
    if (st == FSDP_SUCCESS && hit) st = buf_reserve(out, 1);
    if (st == FSDP_SUCCESS && hit) out->ids[out->n++] = t->eot;
    plain += hit ? k : 0;
    text += plain;
    len -= plain;
  }
  free(w.sym);
  free(w.heap);
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
  pcre2_code_free(t->re);
  free(t);
}

void fsdp_token_buf_free(fsdp_token_buf_t *buf) {
  if (!buf) return;
  free(buf->ids);
  *buf = (fsdp_token_buf_t){0};
}
