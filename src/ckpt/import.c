/* src/ckpt/import.c — full weights from a safetensors file (or a Hugging Face
 * directory) into a weights-only checkpoint (one rank, step 0) that
 * fsdp_ckpt_load starts a model from. F32, BF16 and F16 become f32. The file
 * is validated strictly, GPT-2 shapes and the tied head checked, before
 * anything is written. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/gpt2_layout.h"
#include "ckpt/hf.h"
#include "core/json.h"
#include "fsdp/nn.h"

#define ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define ST_MAX_DIMS 16
/* Entries in a header: a parsed entry costs about 2 KB, and the largest GPT-2
 * preset has 677 (docs/limits.md); a header is counted before it is parsed. */
#define ST_MAX_ENTRIES 65536

typedef struct {
  const char *key; /* name in the file (owned by the parsed header) */
  char *name;      /* our name, NULL when skipped */
  char dtype[16];
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  size_t numel;
  uint64_t begin, end; /* data_offsets */
} st_tensor_t;

typedef struct {
  const char *file;
  int fd;
  uint64_t data_at, data_len; /* where the data buffer starts, its bytes */
  json_t *header;
  st_tensor_t *t;
  int n;
  int lm_head; /* index of lm_head.weight in t, or -1 */
  int *slot;   /* (cap) open addressing from our name to its index in t, -1 empty */
  size_t cap;  /* a power of two above 2n */
} st_file_t;

static size_t dtype_bytes(const char *d) {
  static const struct { const char *name; size_t bytes; } table[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(d, table[i].name)) return table[i].bytes;
  return 0;
}

/* ---- the header, strictly ---------------------------------------------------------- */

static fsdp_status_t entry_error(const st_file_t *f, const char *key, const char *problem) {
  return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s': %s", f->file, key, problem);
}

static fsdp_status_t read_shape(const st_file_t *f, const char *key, const json_t *s,
                                st_tensor_t *t) {
  if (!s || s->type != JSON_ARRAY || s->n > ST_MAX_DIMS)
    return entry_error(f, key, "\"shape\" must be an array of at most 16 integers");
  t->ndim = (int)s->n;
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (!json_int(&s->items[d], &t->shape[d]) || t->shape[d] < 0 ||
        (t->shape[d] > 0 && t->numel > (SIZE_MAX >> 8) / (size_t)t->shape[d]))
      return entry_error(f, key, "\"shape\" must hold non-negative integers of sane size");
    t->numel *= (size_t)t->shape[d];
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t read_entry(const st_file_t *f, const char *key, const json_t *v,
                                st_tensor_t *t) {
  const json_t *d = json_get(v, "dtype"), *o = json_get(v, "data_offsets");
  int64_t a, b;
  if (v->type != JSON_OBJECT || v->n != 3 || !d || !o || !json_get(v, "shape"))
    return entry_error(f, key, "must be an object with exactly \"dtype\", \"shape\" and "
                       "\"data_offsets\"");
  if (d->type != JSON_STRING || !dtype_bytes(d->text))
    return entry_error(f, key, "\"dtype\" is not a safetensors dtype");
  snprintf(t->dtype, sizeof t->dtype, "%s", d->text);
  FSDP_TRY(read_shape(f, key, json_get(v, "shape"), t));
  if (o->type != JSON_ARRAY || o->n != 2 || !json_int(&o->items[0], &a) ||
      !json_int(&o->items[1], &b) || a < 0 || b < a)
    return entry_error(f, key, "\"data_offsets\" must be [begin, end] with 0 <= begin <= end");
  t->key = key;
  t->begin = (uint64_t)a;
  t->end = (uint64_t)b;
  if (t->end - t->begin != (uint64_t)t->numel * dtype_bytes(t->dtype)) {
    char msg[160];
    snprintf(msg, sizeof msg, "shape and dtype %s need %" PRIu64 " bytes, data_offsets span %"
             PRIu64, t->dtype, (uint64_t)t->numel * dtype_bytes(t->dtype), t->end - t->begin);
    return entry_error(f, key, msg);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t read_metadata(const st_file_t *f, const json_t *v) {
  if (v->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"__metadata__\" must be an object", f->file);
  for (size_t i = 0; i < v->n; i++)
    if (v->items[i].type != JSON_STRING)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: \"__metadata__\".\"%s\" must be a string", f->file,
                        v->keys[i]);
  return FSDP_SUCCESS;
}

static int by_begin(const void *x, const void *y) {
  const st_tensor_t *a = x, *b = y;
  return a->begin < b->begin ? -1 : a->begin > b->begin ? 1 : (a->end > b->end) - (a->end < b->end);
}

/* Sorted by offset, the entries must tile the data buffer exactly. */
static fsdp_status_t check_tiling(st_file_t *f) {
  qsort(f->t, (size_t)f->n, sizeof *f->t, by_begin);
  uint64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    if (f->t[i].begin != at)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' starts at data byte %" PRIu64 ", "
                        "expected %" PRIu64 " (%s)", f->file, f->t[i].key, f->t[i].begin, at,
                        f->t[i].begin < at ? "it overlaps the previous one" : "a gap");
    at = f->t[i].end;
  }
  if (at != f->data_len)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: tensors cover %" PRIu64 " data bytes, but the file "
                      "holds %" PRIu64 " after its header (%s)", f->file, at, f->data_len,
                      at < f->data_len ? "trailing bytes" : "truncated");
  return FSDP_SUCCESS;
}

static fsdp_status_t read_entries(st_file_t *f) {
  const json_t *h = f->header;
  if (h->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: the header is not a JSON object", f->file);
  f->t = calloc(h->n ? h->n : 1, sizeof *f->t);
  if (!f->t) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  for (size_t i = 0; i < h->n; i++) {
    if (!strcmp(h->keys[i], "__metadata__")) FSDP_TRY(read_metadata(f, &h->items[i]));
    else FSDP_TRY(read_entry(f, h->keys[i], &h->items[i], &f->t[f->n++]));
  }
  return check_tiling(f);
}

/* Members of the top-level object, counted without parsing (strings skipped,
 * escapes too): the parser is never handed more than ST_MAX_ENTRIES. Stops
 * counting just past the limit. */
static size_t count_entries(const char *s, size_t n) {
  size_t count = 0;
  int depth = 0;
  for (size_t i = 0; i < n && count <= ST_MAX_ENTRIES; i++) {
    if (s[i] == '"') {
      for (i++; i < n && s[i] != '"'; i++) i += s[i] == '\\';
    } else if (s[i] == '{' || s[i] == '[') {
      depth++;
    } else if (s[i] == '}' || s[i] == ']') {
      depth--;
    } else if (s[i] == ':' && depth == 1) {
      count++;
    }
  }
  return count;
}

static fsdp_status_t read_header(st_file_t *f) {
  struct stat sb;
  uint8_t len8[8];
  if (fstat(f->fd, &sb) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot stat: %s", f->file, strerror(errno));
  if (sb.st_size < 8)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: %lld bytes is too short for a safetensors file",
                      f->file, (long long)sb.st_size);
  FSDP_TRY(ckpt_pread(f->fd, f->file, len8, 8, 0));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n > ST_MAX_HEADER)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header length %" PRIu64 " is over the limit of %u "
                      "bytes (the reference implementation's; docs/limits.md)", f->file, n,
                      ST_MAX_HEADER);
  if (n < 2 || n > (uint64_t)sb.st_size - 8)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header length %" PRIu64 " is impossible for a file of "
                      "%lld bytes (not safetensors, or truncated)", f->file, n, (long long)sb.st_size);
  char *text = malloc(n);
  if (!text) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: header of %" PRIu64 " bytes", f->file, n);
  fsdp_status_t st = ckpt_pread(f->fd, f->file, text, n, 8);
  char what[CKPT_PATH_MAX + 16];
  snprintf(what, sizeof what, "%s (header)", f->file);
  if (!st && text[0] != '{')
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: the header does not start with '{'", f->file);
  if (!st && count_entries(text, n) > ST_MAX_ENTRIES)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: the header holds more than %d entries, the limit (the "
                    "largest GPT-2 has 677; docs/limits.md)", f->file, ST_MAX_ENTRIES);
  if (!st) st = json_parse(text, n, what, &f->header);
  free(text);
  f->data_at = 8 + n;
  f->data_len = (uint64_t)sb.st_size - 8 - n;
  return st ? st : read_entries(f);
}

/* ---- names: ours from the published GPT-2 ones -------------------------------------- */

static int importable(const char *dtype) {
  return !strcmp(dtype, "F32") || !strcmp(dtype, "BF16") || !strcmp(dtype, "F16");
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The slot of our name: the one holding it, or the empty one it would take. */
static size_t slot_of(const st_file_t *f, const char *ours) {
  size_t i = name_hash(ours) & (f->cap - 1);
  while (f->slot[i] >= 0 && strcmp(f->t[f->slot[i]].name, ours)) i = (i + 1) & (f->cap - 1);
  return i;
}

static const st_tensor_t *named(const st_file_t *f, const char *ours) {
  int i = f->slot[slot_of(f, ours)];
  return i >= 0 ? &f->t[i] : NULL;
}

/* Our names from the file's, each once (an index makes this linear: 10^6
 * entries compared pairwise took minutes). */
static fsdp_status_t map_names(st_file_t *f, int *kept) {
  *kept = 0;
  f->cap = 16;
  while (f->cap < 2 * (size_t)f->n) f->cap *= 2;
  if (!(f->slot = malloc(f->cap * sizeof *f->slot)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  memset(f->slot, 0xff, f->cap * sizeof *f->slot);
  for (int i = 0; i < f->n; i++) {
    st_tensor_t *t = &f->t[i];
    size_t prefix = strlen(GPT2_HF_PREFIX);
    const char *k = !strncmp(t->key, GPT2_HF_PREFIX, prefix) ? t->key + prefix : t->key;
    if (gpt2_published_buffer(k)) continue;
    if (!importable(t->dtype))
      return entry_error(f, t->key, "dtype is not F32, BF16 or F16 (the ones that import)");
    if (!strcmp(k, GPT2_HF_HEAD)) { /* checked against wte, never imported */
      f->lm_head = i;
      continue;
    }
    if (t->ndim < 1 || t->ndim > FSDP_MAX_DIMS || t->numel == 0)
      return entry_error(f, t->key, "needs 1 to 4 dimensions and at least one element");
    const char *ours = gpt2_our_name(k);
    size_t at = slot_of(f, ours);
    if (f->slot[at] >= 0) return entry_error(f, t->key, "maps to a name another tensor already has");
    if (!(t->name = fsdp_strdup(ours))) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import");
    f->slot[at] = i;
    (*kept)++;
  }
  if (*kept == 0) return fsdp_error(FSDP_ERR_FORMAT, "%s: holds no tensor to import", f->file);
  return FSDP_SUCCESS;
}

/* ---- values: f32 from F32, BF16 or F16 ---------------------------------------------- */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0x1f) bits = sign | 0x7f800000u | (m << 13); /* inf, NaN */
  else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
  else if (!m) bits = sign;
  else { /* subnormal: normalise */
    e = 113;
    while (!(m & 0x400)) m <<= 1, e--;
    bits = sign | (e << 23) | ((m & 0x3ff) << 13);
  }
  float x;
  memcpy(&x, &bits, 4);
  return x;
}

/* out[0..n) = elements [first, first+n) of t as f32. */
static fsdp_status_t read_f32(const st_file_t *f, const st_tensor_t *t, size_t first, size_t n,
                              float *out) {
  size_t eb = dtype_bytes(t->dtype);
  if (eb == 4) return ckpt_pread(f->fd, f->file, out, n * 4, f->data_at + t->begin + first * 4);
  uint16_t *raw = (uint16_t *)out + n; /* the upper half of out, converted upwards */
  FSDP_TRY(ckpt_pread(f->fd, f->file, raw, n * 2, f->data_at + t->begin + first * 2));
  int bf16 = !strcmp(t->dtype, "BF16");
  for (size_t i = 0; i < n; i++) {
    uint16_t h = raw[i];
    if (bf16) {
      uint32_t bits = (uint32_t)h << 16;
      memcpy(&out[i], &bits, 4);
    } else {
      out[i] = half_to_float(h);
    }
  }
  return FSDP_SUCCESS;
}

enum { CHUNK = 1 << 18 }; /* floats per read: 1 MiB */

static fsdp_status_t copy_f32(const st_file_t *f, const st_tensor_t *t, ckpt_writer_t *w) {
  float *buf = malloc(CHUNK * sizeof(float));
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: copy buffer");
  fsdp_status_t st = FSDP_SUCCESS;
  for (size_t at = 0; at < t->numel && !st; at += CHUNK) {
    size_t k = t->numel - at < CHUNK ? t->numel - at : CHUNK;
    st = read_f32(f, t, at, k, buf);
    if (!st) st = ckpt_write(w, buf, k * sizeof(float));
  }
  free(buf);
  return st;
}

/* A checkpoint never holds NaN or Inf (fsdp_ckpt_save refuses them too): the
 * values are scanned before anything is written, at the cost of reading the
 * data twice, so that a refused file leaves the output as it was. */
static fsdp_status_t check_finite(const st_file_t *f) {
  float *buf = malloc(CHUNK * sizeof(float));
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: scan buffer");
  fsdp_status_t st = FSDP_SUCCESS;
  for (int i = 0; i < f->n && !st; i++) {
    const st_tensor_t *t = &f->t[i];
    for (size_t at = 0; t->name && at < t->numel && !st; at += CHUNK) {
      size_t k = t->numel - at < CHUNK ? t->numel - at : CHUNK, j = 0;
      st = read_f32(f, t, at, k, buf);
      while (!st && j < k && isfinite(buf[j])) j++;
      if (!st && j < k)
        st = fsdp_error(FSDP_ERR_NONFINITE, "%s: tensor '%s' is %g at index %zu: a checkpoint "
                        "never holds NaN or Inf (fix or drop the weights before importing)",
                        f->file, t->key, (double)buf[j], at + j);
    }
  }
  free(buf);
  return st;
}

/* ---- GPT-2: the head, the shapes, the model's size ---------------------------------- */

/* GPT-2 ties its output head to wte: a head that differs is another model,
 * which fsdp's GPT-2 cannot hold, so it is refused rather than dropped. */
static fsdp_status_t check_head(const st_file_t *f) {
  if (f->lm_head < 0) return FSDP_SUCCESS;
  const st_tensor_t *h = &f->t[f->lm_head], *w = named(f, "wte");
  if (!w || h->ndim != w->ndim || memcmp(h->shape, w->shape, sizeof h->shape))
    return entry_error(f, h->key, "an output head without a wte tensor of its shape: fsdp's "
                       "GPT-2 ties lm_head to wte and cannot import an untied head");
  float *a = malloc(2 * CHUNK * sizeof(float));
  if (!a) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: head comparison");
  fsdp_status_t st = FSDP_SUCCESS;
  for (size_t at = 0; at < h->numel && !st; at += CHUNK) {
    size_t k = h->numel - at < CHUNK ? h->numel - at : CHUNK, i = 0;
    st = read_f32(f, h, at, k, a);
    if (!st) st = read_f32(f, w, at, k, a + CHUNK);
    while (!st && i < k && !memcmp(&a[i], &a[CHUNK + i], 4)) i++;
    if (!st && i < k)
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' differs from '%s' at element %zu (%g vs "
                      "%g): an untied output head, which fsdp's GPT-2 (lm_head tied to wte) "
                      "cannot hold; refusing rather than dropping it", f->file, h->key, w->key,
                      at + i, (double)a[i], (double)a[CHUNK + i]);
  }
  free(a);
  return st;
}

/* A positive integer no larger than max (fsdp's GPT-2 holds ints; a hostile
 * n_layer must not wrap hf_n_tensors and so check no tensor). */
static fsdp_status_t config_int(const char *file, const json_t *cfg, const char *key,
                                int64_t max, int64_t *out) {
  const json_t *v = json_get(cfg, key);
  if (!v || !json_int(v, out) || *out < 1 || *out > max)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" must be an integer from 1 to %lld", file,
                      key, (long long)max);
  return FSDP_SUCCESS;
}

/* The shape config.json describes (GPT2Config's names). */
static fsdp_status_t shape_from_config(const char *file, hf_shape_t *s) {
  FILE *fp = fopen(file, "rb");
  if (!fp) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", file, strerror(errno));
  char *text = NULL;
  long len = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
  fsdp_status_t st = len < 0 || len > ST_MAX_HEADER || fseek(fp, 0, SEEK_SET) != 0 ||
                             !(text = malloc((size_t)len + 1)) ||
                             fread(text, 1, (size_t)len, fp) != (size_t)len
                         ? fsdp_error(FSDP_ERR_IO, "%s: cannot read", file)
                         : FSDP_SUCCESS;
  fclose(fp);
  json_t *cfg = NULL;
  if (!st) st = json_parse(text, (size_t)len, file, &cfg);
  free(text);
  const json_t *inner = cfg ? json_get(cfg, "n_inner") : NULL;
  int64_t v;
  if (!st) st = config_int(file, cfg, "n_layer", HF_MAX_LAYERS, &s->n_layer);
  if (!st) st = config_int(file, cfg, "n_head", INT_MAX, &s->n_head);
  if (!st) st = config_int(file, cfg, "n_embd", INT_MAX, &s->n_embd);
  if (!st) st = config_int(file, cfg, "n_positions", INT_MAX, &s->n_positions);
  if (!st) st = config_int(file, cfg, "vocab_size", INT_MAX, &s->vocab);
  if (!st && s->n_embd % s->n_head)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: \"n_head\" %lld does not divide \"n_embd\" %lld", file,
                    (long long)s->n_head, (long long)s->n_embd);
  if (!st && inner && inner->type != JSON_NULL && (!json_int(inner, &v) || v != 4 * s->n_embd))
    st = fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"n_inner\" must be null or 4 * n_embd (fsdp's "
                    "GPT-2 MLP is 4 x wide)", file);
  json_free(cfg);
  return st;
}

/* Layers, width, context and vocabulary as the file's tensors have them. */
static void shape_from_tensors(const st_file_t *f, hf_shape_t *s) {
  const st_tensor_t *wte = named(f, "wte"), *wpe = named(f, "wpe");
  *s = (hf_shape_t){.vocab = wte->shape[0], .n_embd = wte->ndim == 2 ? wte->shape[1] : 0,
                    .n_positions = wpe->shape[0]};
  char name[64] = "h.0.ln_1.weight";
  while (named(f, name)) snprintf(name, sizeof name, "h.%d.ln_1.weight", (int)++s->n_layer);
}

static fsdp_status_t same_shape(const char *a_what, const hf_shape_t *a, const char *b_what,
                                const hf_shape_t *b) {
  if (a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
      a->n_positions == b->n_positions && a->vocab == b->vocab)
    return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_FORMAT, "%s (%lld layers, %lld heads, width %lld, context %lld, "
                    "vocabulary %lld) is not %s (%lld, %lld, %lld, %lld, %lld)", a_what,
                    (long long)a->n_layer, (long long)a->n_head, (long long)a->n_embd,
                    (long long)a->n_positions, (long long)a->vocab, b_what,
                    (long long)b->n_layer, (long long)b->n_head, (long long)b->n_embd,
                    (long long)b->n_positions, (long long)b->vocab);
}

static void shape_text(int ndim, const int64_t *shape, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? "," : "", (long long)shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Every tensor the shape implies is there with its shape, and nothing else. */
static fsdp_status_t check_shapes(const st_file_t *f, int kept, const hf_shape_t *s,
                                  const char *what) {
  for (int i = 0; i < hf_n_tensors(s); i++) {
    char name[64];
    int ndim;
    int64_t shape[2];
    hf_tensor(s, i, name, sizeof name, &ndim, shape);
    const st_tensor_t *t = named(f, name);
    if (!t)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' is missing (%s needs it)", f->file,
                        name, what);
    if (t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1])) {
      char have[64], want[64];
      shape_text(t->ndim, t->shape, have, sizeof have);
      shape_text(ndim, shape, want, sizeof want);
      return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s': shape %s is not the %s that %s needs",
                        f->file, t->key, have, want, what);
    }
  }
  if (kept != hf_n_tensors(s))
    for (int i = 0; i < f->n; i++) {
      const char *n = f->t[i].name;
      int known = n && (!strcmp(n, "wte") || !strcmp(n, "wpe") || !strncmp(n, "ln_f.", 5));
      int layer = -1;
      if (n && sscanf(n, "h.%d.", &layer) == 1 && layer >= 0 && layer < s->n_layer) known = 1;
      if (n && !known) return entry_error(f, f->t[i].key, "is not a tensor of GPT-2");
    }
  return FSDP_SUCCESS;
}

typedef struct {
  const char *config; /* config.json or NULL */
  const char *preset; /* or NULL */
  hf_shape_t shape;   /* n_layer 0: not GPT-2 (other tensors import as they are) */
} expect_t;

/* The shape to hold the file to: the preset's and config.json's (which must
 * agree), else the one the tensors imply, for files with wte, wpe and ln_f. */
static fsdp_status_t check_gpt2(const st_file_t *f, int kept, expect_t *x) {
  hf_shape_t cfg = {0}, pre = {0};
  if (x->config) FSDP_TRY(shape_from_config(x->config, &cfg));
  if (x->preset) {
    fsdp_gpt2_config_t c;
    FSDP_TRY(fsdp_gpt2_preset(x->preset, &c));
    pre = (hf_shape_t){c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size};
  }
  char what[CKPT_PATH_MAX + 32];
  if (x->config && x->preset) {
    snprintf(what, sizeof what, "%s's model", x->config);
    FSDP_TRY(same_shape(what, &cfg, x->preset, &pre));
  }
  if (x->preset) x->shape = pre, snprintf(what, sizeof what, "GPT-2 preset %s", x->preset);
  else if (x->config) x->shape = cfg, snprintf(what, sizeof what, "the GPT-2 of %s", x->config);
  else if (named(f, "wte") && named(f, "wpe") && named(f, "ln_f.weight")) {
    shape_from_tensors(f, &x->shape);
    snprintf(what, sizeof what, "a GPT-2 of the width and layers of its wte and h.*");
  } else return FSDP_SUCCESS;
  return check_shapes(f, kept, &x->shape, what);
}

/* ---- the checkpoint ---------------------------------------------------------------- */

/* The model's shape in the trainer state, as fsdp-train records it. */
static fsdp_status_t shape_meta(const hf_shape_t *s, fsdp_ckpt_meta_t *meta) {
  const char *keys[] = {"gpt2.n_layer", "gpt2.n_head", "gpt2.n_embd", "gpt2.block_size",
                        "gpt2.vocab_size"};
  int64_t v[] = {s->n_layer, s->n_head, s->n_embd, s->n_positions, s->vocab};
  if (!s->n_layer || !s->n_head) return FSDP_SUCCESS; /* not GPT-2, or heads unknown */
  for (int i = 0; i < 5; i++) FSDP_TRY(fsdp_ckpt_meta_set(meta, keys[i], v[i]));
  return FSDP_SUCCESS;
}

static fsdp_status_t make_manifest(const st_file_t *f, int kept, const hf_shape_t *s,
                                   ckpt_manifest_t *m) {
  FSDP_TRY(ckpt_manifest_alloc(m, 1, 1, kept));
  m->id = ckpt_random_id();
  m->align = 1;
  m->n_states = 1;
  m->state_names[0] = "param";
  snprintf(m->strategy, sizeof m->strategy, "import");
  snprintf(m->optimizer, sizeof m->optimizer, "none");
  snprintf(m->param_dtype, sizeof m->param_dtype, "f32");
  FSDP_TRY(shape_meta(s, &m->meta));
  ckpt_unit_t *u = &m->units[0];
  if (!(u->name = fsdp_strdup("model")) || !(u->kind = fsdp_strdup("import")))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
  for (int i = 0, k = 0; i < f->n; i++) {
    if (!f->t[i].name) continue;
    ckpt_tensor_t *t = &m->tensors[k++];
    *t = (ckpt_tensor_t){fsdp_strdup(f->t[i].name), 0, u->numel, f->t[i].numel, f->t[i].ndim, {0}};
    if (!t->name) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
    memcpy(t->shape, f->t[i].shape, sizeof t->shape);
    u->numel += t->numel;
  }
  u->ranges[0] = (ckpt_range_t){0, u->numel};
  return ckpt_manifest_layout(m, "imported checkpoint");
}

static fsdp_status_t write_shard(const st_file_t *f, ckpt_manifest_t *m) {
  char path[CKPT_PATH_MAX];
  uint8_t head[CKPT_HEADER_BYTES];
  ckpt_writer_t w;
  ckpt_shard_path(m, 0, path, sizeof path);
  ckpt_header_encode(m, 0, head);
  FSDP_TRY(ckpt_writer_open(&w, path, NULL));
  fsdp_status_t st = ckpt_write(&w, head, sizeof head);
  for (int i = 0; i < f->n && !st; i++)
    if (f->t[i].name) st = copy_f32(f, &f->t[i], &w);
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  m->files[0] = (ckpt_file_t){w.bytes, w.crc};
  return FSDP_SUCCESS;
}

static fsdp_status_t write_checkpoint(const st_file_t *f, int kept, const hf_shape_t *s,
                                      const char *out_dir, int flags, char *step_dir, size_t cap) {
  ckpt_manifest_t m = {0};
  char tmp[CKPT_PATH_MAX];
  int guard = -1;
  fsdp_status_t st = make_manifest(f, kept, s, &m);
  if (!st) st = ckpt_prepare(out_dir, 0, m.id, flags & FSDP_CKPT_OVERWRITE, tmp, sizeof tmp, &guard);
  if (st) return ckpt_manifest_free(&m), st;
  st = ckpt_path(m.dir, sizeof m.dir, "%s", tmp);
  if (!st) st = write_shard(f, &m);
  if (!st) st = ckpt_commit(&m, out_dir, tmp, NULL, NULL, 0);
  if (st) ckpt_discard(tmp);
  if (!st) snprintf(step_dir, cap, "%s/step-0", out_dir);
  ckpt_guard_release(guard);
  ckpt_manifest_free(&m);
  return st;
}

/* The file's dtype for the summary: one name, or "mixed". */
static void source_dtype(const st_file_t *f, char *out, size_t cap) {
  out[0] = 0;
  for (int i = 0; i < f->n; i++) {
    if (!f->t[i].name) continue;
    if (!out[0]) snprintf(out, cap, "%s", f->t[i].dtype);
    else if (strcmp(out, f->t[i].dtype)) snprintf(out, cap, "mixed");
  }
}

static fsdp_status_t import_file(st_file_t *f, expect_t *x, const char *out_dir, int flags,
                                 fsdp_ckpt_io_summary_t *sum) {
  struct stat sb;
  char step[CKPT_PATH_MAX];
  int kept = 0;
  *sum = (fsdp_ckpt_io_summary_t){0};
  FSDP_TRY(ckpt_path(step, sizeof step, "%s/step-0", out_dir));
  if (!(flags & FSDP_CKPT_OVERWRITE) && stat(step, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite a committed "
                      "checkpoint (ask for overwrite, e.g. fsdp-ckpt import --overwrite, or import "
                      "elsewhere)", step);
  FSDP_TRY(read_header(f));
  FSDP_TRY(map_names(f, &kept));
  FSDP_TRY(check_gpt2(f, kept, x));
  FSDP_TRY(check_head(f));
  FSDP_TRY(check_finite(f));
  /* Only now is the output touched: a refused file leaves nothing behind. */
  fsdp_ckpt_lock_t lock = NULL;
  if (flags & FSDP_CKPT_LOCK) FSDP_TRY(fsdp_ckpt_lock(NULL, out_dir, &lock));
  fsdp_status_t st = write_checkpoint(f, kept, &x->shape, out_dir, flags, sum->out,
                                      sizeof sum->out);
  fsdp_ckpt_unlock(lock);
  FSDP_TRY(st);
  sum->tensors = kept;
  for (int i = 0; i < f->n; i++)
    if (f->t[i].name) sum->numel += f->t[i].numel;
  sum->bytes = f->data_at + f->data_len;
  snprintf(sum->file, sizeof sum->file, "%s", f->file);
  source_dtype(f, sum->dtype, sizeof sum->dtype);
  return FSDP_SUCCESS;
}

/* A directory is config.json + model.safetensors; a file may have a
 * config.json beside it. */
static fsdp_status_t locate(const char *in, char *file, char *config, size_t cap, int *has_config) {
  struct stat sb;
  if (stat(in, &sb) != 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", in, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    FSDP_TRY(ckpt_path(file, cap, "%s/model.safetensors", in));
    FSDP_TRY(ckpt_path(config, cap, "%s/config.json", in));
    *has_config = stat(config, &sb) == 0;
    if (stat(file, &sb) != 0)
      return fsdp_error(FSDP_ERR_IO, "%s: no model.safetensors in the directory (sharded "
                        "checkpoints are not read: save with safe_serialization and a "
                        "max_shard_size above the model's size)", in);
    return FSDP_SUCCESS;
  }
  FSDP_TRY(ckpt_path(file, cap, "%s", in));
  const char *slash = strrchr(in, '/');
  int dlen = slash ? (int)(slash - in) : 1;
  FSDP_TRY(ckpt_path(config, cap, "%.*s/config.json", dlen, slash ? in : "."));
  *has_config = stat(config, &sb) == 0;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_import_hf(const char *in, const char *out_dir, const char *preset,
                                  int flags, fsdp_ckpt_io_summary_t *summary) {
  if (!in || !out_dir || !out_dir[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "import: needs a safetensors file or Hugging "
                      "Face directory and an output directory");
  char file[CKPT_PATH_MAX], config[CKPT_PATH_MAX];
  int has_config = 0;
  FSDP_TRY(locate(in, file, config, sizeof file, &has_config));
  st_file_t f = {file, open(file, O_RDONLY | O_CLOEXEC), 0, 0, NULL, NULL, 0, -1, NULL, 0};
  if (f.fd < 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", file, strerror(errno));
  expect_t x = {has_config ? config : NULL, preset, {0}};
  fsdp_ckpt_io_summary_t local = {0};
  fsdp_status_t st = import_file(&f, &x, out_dir, flags, summary ? summary : &local);
  for (int i = 0; f.t && i < f.n; i++) free(f.t[i].name);
  free(f.t);
  free(f.slot);
  json_free(f.header);
  close(f.fd);
  return st;
}

fsdp_status_t fsdp_ckpt_import(const char *file, const char *out_dir) {
  return fsdp_ckpt_import_hf(file, out_dir, NULL, 0, NULL);
}
