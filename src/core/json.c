/* src/core/json.c — the strict JSON reader (recursive descent into a small
 * tree) and the text buffer the manifest and safetensors writers build on. */
#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define JSON_MAX_DEPTH 64
/* Objects up to this many keys are checked for duplicates as they are read. */
#define JSON_SCAN_KEYS 32

typedef struct {
  const char *s, *what;
  size_t len, pos;
  int line;
  size_t line_start;
  int depth;
  fsdp_status_t st;
} parser_t;

static int fail_at(parser_t *p, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Line and column of pos (pos is never before the current line's start). */
static int fail_at(parser_t *p, size_t pos, const char *fmt, ...) {
  if (p->st != FSDP_SUCCESS) return -1;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  p->st = fsdp_error(FSDP_ERR_FORMAT, "%s: line %d, column %zu: %s", p->what, p->line,
                     pos - p->line_start + 1, msg);
  return -1;
}

static int oom(parser_t *p) {
  if (p->st == FSDP_SUCCESS)
    p->st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory while parsing", p->what);
  return -1;
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c == '\n') {
      p->line++;
      p->line_start = p->pos + 1;
    } else if (c != ' ' && c != '\t' && c != '\r') {
      return;
    }
    p->pos++;
  }
}

static int peek(const parser_t *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static void describe(const parser_t *p, char *out, size_t cap) {
  int c = peek(p);
  if (c < 0) snprintf(out, cap, "the end of the text");
  else if (c >= 0x20 && c < 0x7f) snprintf(out, cap, "'%c'", c);
  else snprintf(out, cap, "byte 0x%02x", c);
}

static int expect_word(parser_t *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return fail_at(p, p->pos, "invalid literal (expected '%s')", word);
  p->pos += n;
  return 0;
}

static int parse_value(parser_t *p, json_t *v);

/* ---- strings -------------------------------------------------------------- */

static int hex4(parser_t *p, unsigned *out) {
  if (p->len - p->pos < 4) return fail_at(p, p->pos, "truncated \\u escape");
  unsigned x = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos + (size_t)i];
    unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                 : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                 : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
    if (d == 16) return fail_at(p, p->pos + (size_t)i, "invalid hex digit in \\u escape");
    x = x * 16 + d;
  }
  p->pos += 4;
  *out = x;
  return 0;
}

static size_t utf8_put(char *dst, unsigned cp) {
  if (cp < 0x80) return dst[0] = (char)cp, 1;
  if (cp < 0x800) {
    dst[0] = (char)(0xc0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xe0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    dst[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  dst[0] = (char)(0xf0 | (cp >> 18));
  dst[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  dst[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  dst[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

static int unicode_escape(parser_t *p, char *dst, size_t *n) {
  size_t at = p->pos - 2;
  unsigned cp;
  if (hex4(p, &cp)) return -1;
  if (cp >= 0xdc00 && cp <= 0xdfff) return fail_at(p, at, "lone low surrogate in \\u escape");
  if (cp >= 0xd800 && cp <= 0xdbff) {
    unsigned lo;
    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
      return fail_at(p, at, "high surrogate not followed by a low one");
    p->pos += 2;
    if (hex4(p, &lo)) return -1;
    if (lo < 0xdc00 || lo > 0xdfff) return fail_at(p, at, "invalid surrogate pair");
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  *n += utf8_put(dst + *n, cp);
  return 0;
}

static int escape(parser_t *p, char *dst, size_t *n) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  if (p->pos >= p->len) return fail_at(p, p->pos, "unterminated string");
  char c = p->s[p->pos++];
  if (c == 'u') return unicode_escape(p, dst, n);
  const char *k = c ? strchr(from, c) : NULL;
  if (!k) return fail_at(p, p->pos - 2, "invalid escape '\\%c'", c >= 0x20 ? c : '?');
  dst[(*n)++] = to[k - from];
  return 0;
}

/* The decoded string is never longer than its source, so one allocation of
 * the remaining length bounds it; it is trimmed at the end. */
static int parse_string(parser_t *p, char **out, size_t *out_len) {
  size_t start = p->pos++; /* the opening quote */
  size_t end = start + 1;
  while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->len) return fail_at(p, start, "unterminated string");
  char *dst = malloc(end - start);
  if (!dst) return oom(p);
  size_t n = 0;
  while (p->pos < end) {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c < 0x20) {
      free(dst);
      return fail_at(p, p->pos, "control character 0x%02x inside a string", c);
    }
    p->pos++;
    if (c != '\\') dst[n++] = (char)c;
    else if (escape(p, dst, &n)) return free(dst), -1;
  }
  p->pos = end + 1;
  dst[n] = '\0';
  *out = dst;
  *out_len = n;
  return 0;
}

/* ---- numbers, arrays, objects ---------------------------------------------- */

static size_t digits(const parser_t *p, size_t i) {
  while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
  return i;
}

static int parse_number(parser_t *p, json_t *v) {
  size_t i = p->pos, start = p->pos;
  if (i < p->len && p->s[i] == '-') i++;
  size_t int_start = i;
  i = digits(p, i);
  if (i == int_start) return fail_at(p, start, "invalid number");
  if (p->s[int_start] == '0' && i - int_start > 1)
    return fail_at(p, start, "number with a leading zero");
  if (i < p->len && p->s[i] == '.') {
    size_t f = digits(p, i + 1);
    if (f == i + 1) return fail_at(p, i, "number needs digits after '.'");
    i = f;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    size_t e = digits(p, i);
    if (e == i) return fail_at(p, i, "number needs digits in its exponent");
    i = e;
  }
  v->type = JSON_NUMBER;
  if (!(v->text = malloc(i - start + 1))) return oom(p);
  memcpy(v->text, p->s + start, i - start);
  v->text[i - start] = '\0';
  p->pos = i;
  return 0;
}

static int grow(parser_t *p, json_t *v, size_t *cap, int with_keys) {
  if (v->n < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 8;
  json_t *items = realloc(v->items, c * sizeof *items);
  if (!items) return oom(p);
  v->items = items;
  if (with_keys) {
    char **keys = realloc(v->keys, c * sizeof *keys);
    if (!keys) return oom(p);
    v->keys = keys;
  }
  *cap = c;
  return 0;
}

/* After an item: ',' and another, or the closing bracket. 1 = closed. */
static int next_or_close(parser_t *p, char close, const char *where) {
  skip_ws(p);
  if (peek(p) == close) return p->pos++, 1;
  if (peek(p) == ',') {
    p->pos++;
    skip_ws(p);
    if (peek(p) == close) return fail_at(p, p->pos, "trailing comma in %s", where);
    return 0;
  }
  char got[32];
  describe(p, got, sizeof got);
  return fail_at(p, p->pos, "expected ',' or '%c' in %s, found %s", close, where, got);
}

static int parse_array(parser_t *p, json_t *v) {
  size_t cap = 0;
  v->type = JSON_ARRAY;
  p->pos++;
  skip_ws(p);
  if (peek(p) == ']') return p->pos++, 0;
  for (;;) {
    if (grow(p, v, &cap, 0)) return -1;
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    if (parse_value(p, &v->items[v->n++])) return -1;
    int r = next_or_close(p, ']', "an array");
    if (r) return r > 0 ? 0 : -1;
  }
}

static int parse_member(parser_t *p, json_t *v, size_t *cap) {
  if (peek(p) != '"') {
    char got[32];
    describe(p, got, sizeof got);
    return fail_at(p, p->pos, "expected a quoted key, found %s", got);
  }
  size_t key_pos = p->pos, key_len;
  char *key;
  if (parse_string(p, &key, &key_len)) return -1;
  if (strlen(key) != key_len) { /* keys are C strings: "a\u0000b" would read as "a" */
    fail_at(p, key_pos, "key \"%.64s\\u0000...\" holds U+0000, which no key may hold", key);
    return free(key), -1;
  }
  for (size_t i = 0; i < v->n && v->n < JSON_SCAN_KEYS; i++)
    if (strcmp(v->keys[i], key) == 0) {
      fail_at(p, key_pos, "duplicate key \"%.64s\"", key);
      return free(key), -1;
    }
  if (grow(p, v, cap, 1)) return free(key), -1;
  v->keys[v->n] = key;
  memset(&v->items[v->n], 0, sizeof v->items[0]);
  v->n++;
  skip_ws(p);
  if (peek(p) != ':') return fail_at(p, p->pos, "expected ':' after key \"%.64s\"", key);
  p->pos++;
  return parse_value(p, &v->items[v->n - 1]);
}

/* Key order, ties by position, so the later of two equal keys follows. */
static int key_cmp(const void *a, const void *b, void *obj) {
  const json_t *v = obj;
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  int c = strcmp(v->keys[i], v->keys[j]);
  return c ? c : (i > j) - (i < j);
}

/* Duplicates in an object with more keys than parse_member scans (a
 * vocab.json has 50257): sorted, so O(n log n) rather than O(n^2). */
static int check_duplicates(parser_t *p, const json_t *v) {
  size_t *order = malloc(v->n * sizeof *order);
  if (!order) return oom(p);
  for (size_t i = 0; i < v->n; i++) order[i] = i;
  qsort_r(order, v->n, sizeof *order, key_cmp, (void *)v); /* glibc's, reentrant */
  for (size_t k = 1; k < v->n; k++) {
    size_t a = order[k - 1], b = order[k];
    if (strcmp(v->keys[a], v->keys[b]) != 0) continue;
    const json_t *dup = &v->items[b];
    p->st = fsdp_error(FSDP_ERR_FORMAT, "%s: line %d, column %d: duplicate key \"%.64s\" (first "
                       "at line %d)", p->what, dup->line, dup->col, v->keys[b], v->items[a].line);
    break;
  }
  free(order);
  return p->st == FSDP_SUCCESS ? 0 : -1;
}

static int parse_object(parser_t *p, json_t *v) {
  size_t cap = 0;
  v->type = JSON_OBJECT;
  p->pos++;
  skip_ws(p);
  if (peek(p) == '}') return p->pos++, 0;
  for (;;) {
    if (parse_member(p, v, &cap)) return -1;
    int r = next_or_close(p, '}', "an object");
    if (r < 0) return -1;
    if (r > 0) return v->n >= JSON_SCAN_KEYS ? check_duplicates(p, v) : 0;
  }
}

static int parse_value(parser_t *p, json_t *v) {
  skip_ws(p);
  v->line = p->line;
  v->col = (int)(p->pos - p->line_start + 1);
  if (p->depth >= JSON_MAX_DEPTH) return fail_at(p, p->pos, "nested deeper than %d", JSON_MAX_DEPTH);
  int c = peek(p), r;
  p->depth++;
  switch (c) {
  case '{': r = parse_object(p, v); break;
  case '[': r = parse_array(p, v); break;
  case '"':
    v->type = JSON_STRING;
    r = parse_string(p, &v->text, &v->len);
    break;
  case 't': v->type = JSON_BOOL, v->boolean = 1, r = expect_word(p, "true"); break;
  case 'f': v->type = JSON_BOOL, r = expect_word(p, "false"); break;
  case 'n': v->type = JSON_NULL, r = expect_word(p, "null"); break;
  default:
    if (c == '-' || (c >= '0' && c <= '9')) {
      r = parse_number(p, v);
    } else {
      char got[32];
      describe(p, got, sizeof got);
      r = fail_at(p, p->pos, "expected a value, found %s", got);
    }
  }
  p->depth--;
  return r;
}

static void json_clear(json_t *v) {
  for (size_t i = 0; i < v->n; i++) {
    json_clear(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->text);
}

void json_free(json_t *v) {
  if (!v) return;
  json_clear(v);
  free(v);
}

fsdp_status_t json_parse(const char *text, size_t len, const char *what, json_t **out) {
  parser_t p = {text, what ? what : "JSON", len, 0, 1, 0, 0, FSDP_SUCCESS};
  json_t *root = calloc(1, sizeof *root);
  if (!root) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", p.what);
  if (parse_value(&p, root) == 0) {
    skip_ws(&p);
    if (p.pos < p.len) {
      char got[32];
      describe(&p, got, sizeof got);
      fail_at(&p, p.pos, "unexpected %s after the end of the document", got);
    }
  }
  if (p.st != FSDP_SUCCESS) {
    json_free(root);
    return p.st;
  }
  *out = root;
  return FSDP_SUCCESS;
}

/* ---- access ------------------------------------------------------------------ */

const json_t *json_get(const json_t *v, const char *key) {
  if (!v || v->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < v->n; i++)
    if (strcmp(v->keys[i], key) == 0) return &v->items[i];
  return NULL;
}

int json_int(const json_t *v, int64_t *out) {
  if (!v || v->type != JSON_NUMBER || strpbrk(v->text, ".eE")) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(v->text, &end, 10);
  if (errno || *end) return 0;
  *out = x;
  return 1;
}

int json_float(const json_t *v, float *out) {
  if (!v || v->type != JSON_NUMBER) return 0;
  char *end;
  float x = strtof(v->text, &end);
  if (*end || !isfinite(x)) return 0;
  *out = x;
  return 1;
}

/* ---- writing ------------------------------------------------------------------ */

static int sb_reserve(sbuf_t *sb, size_t extra) {
  if (sb->failed) return -1;
  if (sb->len + extra + 1 <= sb->cap) return 0;
  size_t cap = sb->cap ? sb->cap : 1024;
  while (cap < sb->len + extra + 1) cap *= 2;
  char *b = realloc(sb->buf, cap);
  if (!b) return sb->failed = 1, -1;
  sb->buf = b;
  sb->cap = cap;
  return 0;
}

void sb_printf(sbuf_t *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || sb_reserve(sb, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb->len += (size_t)n;
}

void sb_json_str(sbuf_t *sb, const char *s) {
  sb_printf(sb, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') sb_printf(sb, "\\%c", *c);
    else if (*c < 0x20) sb_printf(sb, "\\u%04x", *c);
    else sb_printf(sb, "%c", *c);
  }
  sb_printf(sb, "\"");
}

void sb_json_float(sbuf_t *sb, float x) {
  char text[48];
  if (x == floorf(x) && fabsf(x) < 1e15f) { /* integral: 500000, not 5e+05 */
    sb_printf(sb, "%.0f", (double)x);
    return;
  }
  for (int digits = 1; digits <= 9; digits++) { /* 9 significant digits always round-trip */
    snprintf(text, sizeof text, "%.*g", digits, (double)x);
    if (strtof(text, NULL) == x) break;
  }
  sb_printf(sb, "%s", text);
}

void sb_free(sbuf_t *sb) {
  free(sb->buf);
  *sb = (sbuf_t){0};
}
