/* src/ckpt/import.c — full weights from a safetensors file, or a Hugging Face
 * directory (config.json + model.safetensors, or the shards an index names),
 * into a weights-only checkpoint (one rank, step 0) that fsdp_ckpt_load
 * starts a model from. F32, BF16 and F16 become f32. Every file is validated
 * strictly, a GPT-2's or a Llama's shapes and the tied head checked, before
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
#include "ckpt/llama_hf.h"
#include "ckpt/llama_layout.h"
#include "core/json.h"
#include "fsdp/nn.h"

#define ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define ST_MAX_DIMS 16
/* Entries in a header: a parsed entry costs about 2 KB, and the largest GPT-2
 * preset has 677 (docs/limits.md); a header is counted before it is parsed. */
#define ST_MAX_ENTRIES 65536
/* Shard files an index may name (Llama 3.1 405B has 191). */
#define ST_MAX_PARTS 4096

typedef struct {
  const char *key; /* name in the file (owned by its part's parsed header) */
  char *name;      /* our name, NULL when skipped */
  int part;        /* the file that holds it */
  int expected;    /* 1: a tensor the model's shape implies (check_llama) */
  char dtype[16];
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  size_t numel;
  uint64_t begin, end; /* data_offsets */
} st_tensor_t;

/* One safetensors file. */
typedef struct {
  char *path;
  int fd;
  uint64_t data_at, data_len; /* where the data buffer starts, its bytes */
  json_t *header;
} st_part_t;

/* What is imported: one file, or the shards an index names, with their
 * tensors in one table. */
typedef struct {
  const char *file; /* the safetensors file or the index, as named */
  json_t *index;    /* the parsed index, NULL for one file */
  st_part_t *parts;
  int n_parts;
  st_tensor_t *t;
  int n;
  int llama;   /* 1: names are a Llama's, kept as they are */
  int lm_head; /* index of a tied lm_head.weight in t, or -1 */
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

static fsdp_status_t entry_error(const char *file, const char *key, const char *problem) {
  return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s': %s", file, key, problem);
}

/* The same for tensor t, named with the file that holds it. */
static fsdp_status_t tensor_error(const st_file_t *f, const st_tensor_t *t, const char *problem) {
  return entry_error(f->parts[t->part].path, t->key, problem);
}

static fsdp_status_t read_shape(const char *file, const char *key, const json_t *s,
                                st_tensor_t *t) {
  if (!s || s->type != JSON_ARRAY || s->n > ST_MAX_DIMS)
    return entry_error(file, key, "\"shape\" must be an array of at most 16 integers");
  t->ndim = (int)s->n;
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (!json_int(&s->items[d], &t->shape[d]) || t->shape[d] < 0 ||
        (t->shape[d] > 0 && t->numel > (SIZE_MAX >> 8) / (size_t)t->shape[d]))
      return entry_error(file, key, "\"shape\" must hold non-negative integers of sane size");
    t->numel *= (size_t)t->shape[d];
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t read_entry(const char *file, const char *key, const json_t *v,
                                st_tensor_t *t) {
  const json_t *d = json_get(v, "dtype"), *o = json_get(v, "data_offsets");
  int64_t a, b;
  if (v->type != JSON_OBJECT || v->n != 3 || !d || !o || !json_get(v, "shape"))
    return entry_error(file, key, "must be an object with exactly \"dtype\", \"shape\" and "
                       "\"data_offsets\"");
  if (d->type != JSON_STRING || !dtype_bytes(d->text))
    return entry_error(file, key, "\"dtype\" is not a safetensors dtype");
  snprintf(t->dtype, sizeof t->dtype, "%s", d->text);
  FSDP_TRY(read_shape(file, key, json_get(v, "shape"), t));
  if (o->type != JSON_ARRAY || o->n != 2 || !json_int(&o->items[0], &a) ||
      !json_int(&o->items[1], &b) || a < 0 || b < a)
    return entry_error(file, key, "\"data_offsets\" must be [begin, end] with 0 <= begin <= end");
  t->key = key;
  t->begin = (uint64_t)a;
  t->end = (uint64_t)b;
  if (t->end - t->begin != (uint64_t)t->numel * dtype_bytes(t->dtype)) {
    char msg[160];
    snprintf(msg, sizeof msg, "shape and dtype %s need %" PRIu64 " bytes, data_offsets span %"
             PRIu64, t->dtype, (uint64_t)t->numel * dtype_bytes(t->dtype), t->end - t->begin);
    return entry_error(file, key, msg);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t read_metadata(const char *file, const json_t *v) {
  if (v->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"__metadata__\" must be an object", file);
  for (size_t i = 0; i < v->n; i++)
    if (v->items[i].type != JSON_STRING)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: \"__metadata__\".\"%s\" must be a string", file,
                        v->keys[i]);
  return FSDP_SUCCESS;
}

static int by_begin(const void *x, const void *y) {
  const st_tensor_t *a = x, *b = y;
  return a->begin < b->begin ? -1 : a->begin > b->begin ? 1 : (a->end > b->end) - (a->end < b->end);
}

/* Sorted by offset, the n entries of part p must tile its data buffer exactly. */
static fsdp_status_t check_tiling(const st_part_t *p, st_tensor_t *t, int n) {
  qsort(t, (size_t)n, sizeof *t, by_begin);
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (t[i].begin != at)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' starts at data byte %" PRIu64 ", "
                        "expected %" PRIu64 " (%s)", p->path, t[i].key, t[i].begin, at,
                        t[i].begin < at ? "it overlaps the previous one" : "a gap");
    at = t[i].end;
  }
  if (at != p->data_len)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: tensors cover %" PRIu64 " data bytes, but the file "
                      "holds %" PRIu64 " after its header (%s)", p->path, at, p->data_len,
                      at < p->data_len ? "trailing bytes" : "truncated");
  return FSDP_SUCCESS;
}

/* Part `part`'s entries appended to f->t. */
static fsdp_status_t read_entries(st_file_t *f, int part) {
  const st_part_t *p = &f->parts[part];
  const json_t *h = p->header;
  if (h->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: the header is not a JSON object", p->path);
  if ((size_t)f->n + h->n > ST_MAX_ENTRIES)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: the shards hold more than %d entries together, the "
                      "limit (docs/limits.md)", p->path, ST_MAX_ENTRIES);
  st_tensor_t *t = realloc(f->t, ((size_t)f->n + h->n + 1) * sizeof *f->t);
  if (!t) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", p->path);
  f->t = t;
  int first = f->n;
  for (size_t i = 0; i < h->n; i++) {
    if (!strcmp(h->keys[i], "__metadata__")) {
      FSDP_TRY(read_metadata(p->path, &h->items[i]));
      continue;
    }
    st_tensor_t *e = &f->t[f->n];
    *e = (st_tensor_t){.part = part};
    f->n++; /* counted before it is read: freed with the rest on failure */
    FSDP_TRY(read_entry(p->path, h->keys[i], &h->items[i], e));
  }
  return check_tiling(p, f->t + first, f->n - first);
}

/* Members of the objects at most max_depth deep (1: the top level), counted
 * without parsing (strings skipped, escapes too): the parser is never handed
 * more than ST_MAX_ENTRIES. Stops counting just past the limit. */
static size_t count_entries(const char *s, size_t n, int max_depth) {
  size_t count = 0;
  int depth = 0;
  for (size_t i = 0; i < n && count <= ST_MAX_ENTRIES; i++) {
    if (s[i] == '"') {
      for (i++; i < n && s[i] != '"'; i++) i += s[i] == '\\';
    } else if (s[i] == '{' || s[i] == '[') {
      depth++;
    } else if (s[i] == '}' || s[i] == ']') {
      depth--;
    } else if (s[i] == ':' && depth <= max_depth) {
      count++;
    }
  }
  return count;
}

static fsdp_status_t read_header(st_file_t *f, int part) {
  st_part_t *p = &f->parts[part];
  struct stat sb;
  uint8_t len8[8];
  if (fstat(p->fd, &sb) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot stat: %s", p->path, strerror(errno));
  if (sb.st_size < 8)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: %lld bytes is too short for a safetensors file",
                      p->path, (long long)sb.st_size);
  FSDP_TRY(ckpt_pread(p->fd, p->path, len8, 8, 0));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n > ST_MAX_HEADER)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header length %" PRIu64 " is over the limit of %u "
                      "bytes (the reference implementation's; docs/limits.md)", p->path, n,
                      ST_MAX_HEADER);
  if (n < 2 || n > (uint64_t)sb.st_size - 8)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header length %" PRIu64 " is impossible for a file of "
                      "%lld bytes (not safetensors, or truncated)", p->path, n,
                      (long long)sb.st_size);
  char *text = malloc(n);
  if (!text) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: header of %" PRIu64 " bytes", p->path, n);
  fsdp_status_t st = ckpt_pread(p->fd, p->path, text, n, 8);
  char what[CKPT_PATH_MAX + 16];
  snprintf(what, sizeof what, "%s (header)", p->path);
  if (!st && text[0] != '{')
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: the header does not start with '{'", p->path);
  if (!st && count_entries(text, n, 1) > ST_MAX_ENTRIES)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: the header holds more than %d entries, the limit (the "
                    "largest GPT-2 has 677; docs/limits.md)", p->path, ST_MAX_ENTRIES);
  if (!st) st = json_parse(text, n, what, &p->header);
  free(text);
  p->data_at = 8 + n;
  p->data_len = (uint64_t)sb.st_size - 8 - n;
  return st ? st : read_entries(f, part);
}

/* Part i: path opened, header read, tensors appended. */
static fsdp_status_t open_part(st_file_t *f, int i, const char *path) {
  st_part_t *p = &f->parts[i];
  if (!(p->path = fsdp_strdup(path))) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import");
  if ((p->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  return read_header(f, i);
}

/* ---- a sharded checkpoint's index ----------------------------------------------------- */

/* A JSON file of at most ST_MAX_HEADER bytes and ST_MAX_ENTRIES members in
 * its objects two deep (an index's weight_map; config.json's rope_scaling),
 * parsed. */
static fsdp_status_t read_json(const char *file, json_t **out) {
  FILE *fp = fopen(file, "rb");
  if (!fp) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", file, strerror(errno));
  char *text = NULL;
  long len = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
  fsdp_status_t st = len < 0 || len > ST_MAX_HEADER || fseek(fp, 0, SEEK_SET) != 0 ||
                             !(text = malloc((size_t)len + 1)) ||
                             fread(text, 1, (size_t)len, fp) != (size_t)len
                         ? fsdp_error(FSDP_ERR_IO, "%s: cannot read (or over %u bytes)", file,
                                      ST_MAX_HEADER)
                         : FSDP_SUCCESS;
  fclose(fp);
  if (!st && count_entries(text, (size_t)len, 2) > ST_MAX_ENTRIES)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: holds more than %d entries, the limit (docs/limits.md)",
                    file, ST_MAX_ENTRIES);
  if (!st) st = json_parse(text, (size_t)len, file, out);
  free(text);
  return st;
}

typedef struct {
  const char *key, *file; /* a tensor and the shard the index puts it in */
} wm_entry_t;

static int by_file(const void *x, const void *y) {
  return strcmp(((const wm_entry_t *)x)->file, ((const wm_entry_t *)y)->file);
}

static int by_key(const void *x, const void *y) {
  return strcmp(((const wm_entry_t *)x)->key, ((const wm_entry_t *)y)->key);
}

/* The index's weight_map as (key, file) pairs: files plain names in dir. */
static fsdp_status_t weight_map(const st_file_t *f, wm_entry_t **out, size_t *n) {
  const json_t *wm = json_get(f->index, "weight_map");
  if (!wm || wm->type != JSON_OBJECT || wm->n == 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: has no \"weight_map\" object naming the shards",
                      f->file);
  if (!(*out = malloc(wm->n * sizeof **out)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  for (size_t i = 0; i < wm->n; i++) {
    const json_t *v = &wm->items[i];
    if (v->type != JSON_STRING || !v->len || strlen(v->text) != v->len || strchr(v->text, '/') ||
        !strcmp(v->text, ".") || !strcmp(v->text, ".."))
      return fsdp_error(FSDP_ERR_FORMAT, "%s: \"weight_map\".\"%s\" must name a file in the "
                        "index's directory (no '/')", f->file, wm->keys[i]);
    (*out)[i] = (wm_entry_t){wm->keys[i], v->text};
  }
  *n = wm->n;
  return FSDP_SUCCESS;
}

/* Every shard the index names, in name order, read (each checked as one file). */
static fsdp_status_t open_shards(st_file_t *f, const char *dir, wm_entry_t *wm, size_t n) {
  qsort(wm, n, sizeof *wm, by_file);
  size_t distinct = 0;
  for (size_t i = 0; i < n; i++) distinct += !i || strcmp(wm[i].file, wm[i - 1].file);
  if (distinct > ST_MAX_PARTS)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: names %zu shard files, over the limit of %d", f->file,
                      distinct, ST_MAX_PARTS);
  if (!(f->parts = calloc(distinct, sizeof *f->parts)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  for (size_t i = 0; i < distinct; i++) f->parts[i].fd = -1;
  for (size_t i = 0; i < n; i++) {
    if (i && !strcmp(wm[i].file, wm[i - 1].file)) continue;
    char path[CKPT_PATH_MAX];
    FSDP_TRY(ckpt_path(path, sizeof path, "%s/%s", dir, wm[i].file));
    f->n_parts++;
    FSDP_TRY(open_part(f, f->n_parts - 1, path));
  }
  return FSDP_SUCCESS;
}

/* The shards hold exactly the tensors the index lists, each where it says:
 * both lists sorted by name and walked together (linear after the sort). */
static fsdp_status_t check_index(const st_file_t *f, wm_entry_t *wm, size_t n) {
  wm_entry_t *have = malloc(((size_t)f->n + 1) * sizeof *have);
  if (!have) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  for (int i = 0; i < f->n; i++) {
    const char *path = f->parts[f->t[i].part].path, *slash = strrchr(path, '/');
    have[i] = (wm_entry_t){f->t[i].key, slash ? slash + 1 : path};
  }
  qsort(have, (size_t)f->n, sizeof *have, by_key);
  qsort(wm, n, sizeof *wm, by_key);
  fsdp_status_t st = FSDP_SUCCESS;
  size_t i = 0, j = 0;
  while (!st && (i < (size_t)f->n || j < n)) {
    int c = i == (size_t)f->n ? 1 : j == n ? -1 : strcmp(have[i].key, wm[j].key);
    if (c == 0 && i + 1 < (size_t)f->n && !strcmp(have[i].key, have[i + 1].key))
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", f->file,
                      have[i].key, have[i].file, have[i + 1].file);
    else if (c < 0)
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' of %s is not in the index's weight_map",
                      f->file, have[i].key, have[i].file);
    else if (c > 0)
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' is in the weight_map (%s) but that "
                      "file does not hold it", f->file, wm[j].key, wm[j].file);
    else if (strcmp(have[i].file, wm[j].file))
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' is in %s, not in %s as the weight_map "
                      "says", f->file, have[i].key, have[i].file, wm[j].file);
    i++, j++;
  }
  free(have);
  return st;
}

/* model.safetensors.index.json: its shards, all of them, nothing else. */
static fsdp_status_t read_index(st_file_t *f) {
  char dir[CKPT_PATH_MAX];
  const char *slash = strrchr(f->file, '/');
  FSDP_TRY(ckpt_path(dir, sizeof dir, "%.*s", slash ? (int)(slash - f->file) : 1,
                     slash ? f->file : "."));
  FSDP_TRY(read_json(f->file, &f->index));
  wm_entry_t *wm = NULL;
  size_t n = 0;
  fsdp_status_t st = weight_map(f, &wm, &n);
  if (!st) st = open_shards(f, dir, wm, n);
  if (!st) st = check_index(f, wm, n);
  free(wm);
  return st;
}

/* One file, or an index's shards. */
static fsdp_status_t read_input(st_file_t *f, int sharded) {
  if (sharded) return read_index(f);
  if (!(f->parts = calloc(1, sizeof *f->parts)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
  f->parts[0].fd = -1;
  f->n_parts = 1;
  return open_part(f, 0, f->file);
}

/* ---- names: ours from the published ones -------------------------------------------- */

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

/* Buffers, not parameters: GPT-2's attention masks, and the RoPE inverse
 * frequencies older Llama checkpoints saved. */
static int skipped(const st_file_t *f, const char *k) {
  static const char inv_freq[] = ".rotary_emb.inv_freq";
  size_t n = strlen(k), m = sizeof inv_freq - 1;
  return f->llama ? n > m && !strcmp(k + n - m, inv_freq) : gpt2_published_buffer(k);
}

/* Our name for key k: a Llama's as it is; GPT-2's without "transformer.",
 * renamed. NULL: the tied head, checked against the embedding, never
 * imported (a Llama's untied head is a tensor like the others). */
static const char *our_name(const st_file_t *f, const char *k, int tied) {
  size_t prefix = strlen(GPT2_HF_PREFIX);
  if (f->llama) return tied && !strcmp(k, LLAMA_HEAD) ? NULL : k;
  if (!strncmp(k, GPT2_HF_PREFIX, prefix)) k += prefix;
  return strcmp(k, GPT2_HF_HEAD) ? gpt2_our_name(k) : NULL;
}

/* Our names from the file's, each once (an index makes this linear: 10^6
 * entries compared pairwise took minutes). tied: a Llama's head is tied. */
static fsdp_status_t map_names(st_file_t *f, int tied, int *kept) {
  *kept = 0;
  f->cap = 16;
  while (f->cap < 2 * (size_t)f->n) f->cap *= 2;
  if (!(f->slot = malloc(f->cap * sizeof *f->slot)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", f->file);
  memset(f->slot, 0xff, f->cap * sizeof *f->slot);
  for (int i = 0; i < f->n; i++) {
    st_tensor_t *t = &f->t[i];
    if (skipped(f, t->key)) continue;
    if (!importable(t->dtype))
      return tensor_error(f, t, "dtype is not F32, BF16 or F16 (the ones that import)");
    const char *ours = our_name(f, t->key, tied);
    if (!ours) { /* checked against the embedding, never imported */
      f->lm_head = i;
      continue;
    }
    if (t->ndim < 1 || t->ndim > FSDP_MAX_DIMS || t->numel == 0)
      return tensor_error(f, t, "needs 1 to 4 dimensions and at least one element");
    size_t at = slot_of(f, ours);
    if (f->slot[at] >= 0) return tensor_error(f, t, "maps to a name another tensor already has");
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
  const st_part_t *p = &f->parts[t->part];
  size_t eb = dtype_bytes(t->dtype);
  if (eb == 4) return ckpt_pread(p->fd, p->path, out, n * 4, p->data_at + t->begin + first * 4);
  uint16_t *raw = (uint16_t *)out + n; /* the upper half of out, converted upwards */
  FSDP_TRY(ckpt_pread(p->fd, p->path, raw, n * 2, p->data_at + t->begin + first * 2));
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
                        f->parts[t->part].path, t->key, (double)buf[j], at + j);
    }
  }
  free(buf);
  return st;
}

/* ---- the tied head ------------------------------------------------------------------ */

/* A tied output head (GPT-2's always, a Llama's with tie_word_embeddings)
 * must equal the embedding: one that differs is another model, which the
 * tied model cannot hold, so it is refused rather than dropped. */
static fsdp_status_t check_head(const st_file_t *f, const char *embed, const char *model) {
  if (f->lm_head < 0) return FSDP_SUCCESS;
  const st_tensor_t *h = &f->t[f->lm_head], *w = named(f, embed);
  char msg[256];
  snprintf(msg, sizeof msg, "an output head without a %s tensor of its shape: %s ties lm_head "
           "to it and cannot import an untied head", embed, model);
  if (!w || h->ndim != w->ndim || memcmp(h->shape, w->shape, sizeof h->shape))
    return tensor_error(f, h, msg);
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
                      "%g): an untied output head, which %s (lm_head tied to %s) cannot hold; "
                      "refusing rather than dropping it", f->parts[h->part].path, h->key, w->key,
                      at + i, (double)a[i], (double)a[CHUNK + i], model, embed);
  }
  free(a);
  return st;
}

/* ---- GPT-2: the shapes, the model's size ---------------------------------------------- */

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
static fsdp_status_t shape_from_config(const char *file, const json_t *cfg, hf_shape_t *s) {
  const json_t *inner = json_get(cfg, "n_inner");
  int64_t v;
  FSDP_TRY(config_int(file, cfg, "n_layer", HF_MAX_LAYERS, &s->n_layer));
  FSDP_TRY(config_int(file, cfg, "n_head", INT_MAX, &s->n_head));
  FSDP_TRY(config_int(file, cfg, "n_embd", INT_MAX, &s->n_embd));
  FSDP_TRY(config_int(file, cfg, "n_positions", INT_MAX, &s->n_positions));
  FSDP_TRY(config_int(file, cfg, "vocab_size", INT_MAX, &s->vocab));
  if (s->n_embd % s->n_head)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"n_head\" %lld does not divide \"n_embd\" %lld",
                      file, (long long)s->n_head, (long long)s->n_embd);
  if (inner && inner->type != JSON_NULL && (!json_int(inner, &v) || v != 4 * s->n_embd))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"n_inner\" must be null or 4 * n_embd (fsdp's "
                      "GPT-2 MLP is 4 x wide)", file);
  return FSDP_SUCCESS;
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

/* Our tensor `name` is in the file with this shape (what: the model that
 * needs it); marked expected. */
static fsdp_status_t check_one(st_file_t *f, const char *name, int ndim,
                               const int64_t shape[2], const char *what) {
  int at = f->slot[slot_of(f, name)];
  st_tensor_t *t = at >= 0 ? &f->t[at] : NULL;
  if (!t)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' is missing (%s needs it)", f->file, name,
                      what);
  if (t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1])) {
    char have[64], want[64];
    shape_text(t->ndim, t->shape, have, sizeof have);
    shape_text(ndim, shape, want, sizeof want);
    return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s': shape %s is not the %s that %s needs",
                      f->parts[t->part].path, t->key, have, want, what);
  }
  t->expected = 1;
  return FSDP_SUCCESS;
}

/* Every tensor the shape implies is there with its shape, and nothing else. */
static fsdp_status_t check_shapes(st_file_t *f, int kept, const hf_shape_t *s,
                                  const char *what) {
  for (int i = 0; i < hf_n_tensors(s); i++) {
    char name[64];
    int ndim;
    int64_t shape[2];
    hf_tensor(s, i, name, sizeof name, &ndim, shape);
    FSDP_TRY(check_one(f, name, ndim, shape, what));
  }
  if (kept != hf_n_tensors(s))
    for (int i = 0; i < f->n; i++)
      if (f->t[i].name && !f->t[i].expected)
        return tensor_error(f, &f->t[i], "is not a tensor of GPT-2");
  return FSDP_SUCCESS;
}

typedef struct {
  const char *config; /* config.json or NULL */
  json_t *cfg;        /* config.json parsed, or NULL */
  const char *preset; /* or NULL */
  hf_shape_t shape;   /* n_layer 0: not GPT-2 (other tensors import as they are) */
  fsdp_llama_config_t llama; /* the file's Llama (f->llama) */
} expect_t;

/* The shape to hold the file to: the preset's and config.json's (which must
 * agree), else the one the tensors imply, for files with wte, wpe and ln_f. */
static fsdp_status_t check_gpt2(st_file_t *f, int kept, expect_t *x) {
  hf_shape_t cfg = {0}, pre = {0};
  if (x->config) FSDP_TRY(shape_from_config(x->config, x->cfg, &cfg));
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

/* ---- Llama: the configuration and the shapes ----------------------------------------- */

/* A Llama, by config.json's model_type or, without one, by its embedding. */
static fsdp_status_t detect_llama(const st_file_t *f, const expect_t *x, int *llama) {
  const json_t *type = x->cfg ? json_get(x->cfg, "model_type") : NULL;
  *llama = 0;
  if (type && (type->type != JSON_STRING || (strcmp(type->text, "llama") &&
                                             strcmp(type->text, "gpt2"))))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"model_type\" %s is not one fsdp imports "
                      "(\"gpt2\", \"llama\")", x->config,
                      type->type == JSON_STRING ? type->text : "(not a string)");
  if (type) return *llama = !strcmp(type->text, "llama"), FSDP_SUCCESS;
  if (x->cfg) return FSDP_SUCCESS; /* GPT2Config's names, as before model_type was read */
  for (int i = 0; i < f->n && !*llama; i++) *llama = !strcmp(f->t[i].key, LLAMA_EMBED);
  return FSDP_SUCCESS;
}

/* The Llama config.json and the preset describe (both must agree). */
static fsdp_status_t llama_expected(const st_file_t *f, expect_t *x) {
  fsdp_llama_config_t cfg, pre;
  if (x->config) FSDP_TRY(llama_config_from_hf(x->config, x->cfg, &cfg));
  if (x->preset) FSDP_TRY(fsdp_llama_preset(x->preset, &pre));
  if (!x->config && !x->preset)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: holds a Llama (%s) but no config.json beside it says "
                      "its heads, rope_theta and rms_norm_eps: import the directory with its "
                      "config.json, or name a Llama preset (--preset)", f->file, LLAMA_EMBED);
  if (x->config && x->preset) {
    char what[CKPT_PATH_MAX + 32], pwhat[64];
    snprintf(what, sizeof what, "%s's Llama", x->config);
    snprintf(pwhat, sizeof pwhat, "Llama preset %s", x->preset);
    FSDP_TRY(llama_config_same(what, &cfg, pwhat, &pre));
  }
  x->llama = x->config ? cfg : pre;
  return FSDP_SUCCESS;
}

/* Every tensor the Llama implies is there with its shape, and nothing else. */
static fsdp_status_t check_llama(st_file_t *f, int kept, const expect_t *x) {
  char what[CKPT_PATH_MAX + 32];
  snprintf(what, sizeof what, "the Llama of %s", x->config ? x->config : x->preset);
  for (int i = 0; i < llama_n_tensors(&x->llama); i++) {
    char name[96];
    int ndim;
    int64_t shape[2];
    llama_tensor(&x->llama, i, name, sizeof name, &ndim, shape);
    FSDP_TRY(check_one(f, name, ndim, shape, what));
  }
  if (kept != llama_n_tensors(&x->llama))
    for (int i = 0; i < f->n; i++)
      if (f->t[i].name && !f->t[i].expected) {
        char msg[CKPT_PATH_MAX + 64];
        snprintf(msg, sizeof msg, "is not a tensor of %s", what);
        return tensor_error(f, &f->t[i], msg);
      }
  return FSDP_SUCCESS;
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

/* The imported tensors in checkpoint order: a Llama's as the model lists
 * them (the same checkpoint from one file or from shards), else the file's. */
static fsdp_status_t import_order(const st_file_t *f, const expect_t *x, int kept, int **order) {
  if (!(*order = malloc((size_t)kept * sizeof **order)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
  for (int i = 0, k = 0; !f->llama && i < f->n; i++)
    if (f->t[i].name) (*order)[k++] = i;
  for (int i = 0; f->llama && i < kept; i++) {
    char name[96];
    int ndim;
    int64_t shape[2];
    llama_tensor(&x->llama, i, name, sizeof name, &ndim, shape);
    (*order)[i] = (int)(named(f, name) - f->t);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t make_manifest(const st_file_t *f, const expect_t *x, const int *order,
                                   int kept, ckpt_manifest_t *m) {
  const hf_shape_t *s = &x->shape;
  FSDP_TRY(ckpt_manifest_alloc(m, 1, 1, kept));
  m->id = ckpt_random_id();
  m->align = 1;
  m->n_states = 1;
  m->state_names[0] = "param";
  snprintf(m->strategy, sizeof m->strategy, "import");
  snprintf(m->optimizer, sizeof m->optimizer, "none");
  snprintf(m->param_dtype, sizeof m->param_dtype, "f32");
  FSDP_TRY(shape_meta(s, &m->meta));
  m->has_llama = f->llama;
  if (f->llama) m->llama = x->llama;
  ckpt_unit_t *u = &m->units[0];
  if (!(u->name = fsdp_strdup("model")) || !(u->kind = fsdp_strdup("import")))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
  for (int k = 0; k < kept; k++) {
    const st_tensor_t *src = &f->t[order[k]];
    ckpt_tensor_t *t = &m->tensors[k];
    *t = (ckpt_tensor_t){fsdp_strdup(src->name), 0, u->numel, src->numel, src->ndim, {0}};
    if (!t->name) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: out of memory");
    memcpy(t->shape, src->shape, sizeof t->shape);
    u->numel += t->numel;
  }
  u->ranges[0] = (ckpt_range_t){0, u->numel};
  return ckpt_manifest_layout(m, "imported checkpoint");
}

static fsdp_status_t write_shard(const st_file_t *f, const int *order, int kept,
                                 ckpt_manifest_t *m) {
  char path[CKPT_PATH_MAX];
  uint8_t head[CKPT_HEADER_BYTES];
  ckpt_writer_t w;
  ckpt_shard_path(m, 0, path, sizeof path);
  ckpt_header_encode(m, 0, head);
  FSDP_TRY(ckpt_writer_open(&w, path, NULL));
  fsdp_status_t st = ckpt_write(&w, head, sizeof head);
  for (int k = 0; k < kept && !st; k++) st = copy_f32(f, &f->t[order[k]], &w);
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  m->files[0] = (ckpt_file_t){w.bytes, w.crc};
  return FSDP_SUCCESS;
}

static fsdp_status_t write_checkpoint(const st_file_t *f, int kept, const expect_t *x,
                                      const char *out_dir, int flags, char *step_dir, size_t cap) {
  ckpt_manifest_t m = {0};
  char tmp[CKPT_PATH_MAX];
  int guard = -1, *order = NULL;
  fsdp_status_t st = import_order(f, x, kept, &order);
  if (!st) st = make_manifest(f, x, order, kept, &m);
  if (!st) st = ckpt_prepare(out_dir, 0, m.id, flags & FSDP_CKPT_OVERWRITE, tmp, sizeof tmp, &guard);
  if (st) return free(order), ckpt_manifest_free(&m), st;
  st = ckpt_path(m.dir, sizeof m.dir, "%s", tmp);
  if (!st) st = write_shard(f, order, kept, &m);
  if (!st) st = ckpt_commit(&m, out_dir, tmp, NULL, NULL, 0);
  if (st) ckpt_discard(tmp);
  if (!st) snprintf(step_dir, cap, "%s/step-0", out_dir);
  ckpt_guard_release(guard);
  ckpt_manifest_free(&m);
  free(order);
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

/* The model the tensors must make: a Llama's (names kept) or GPT-2's. */
static fsdp_status_t check_model(st_file_t *f, expect_t *x, int *kept) {
  FSDP_TRY(detect_llama(f, x, &f->llama));
  if (f->llama) FSDP_TRY(llama_expected(f, x));
  FSDP_TRY(map_names(f, f->llama && x->llama.tie_embeddings, kept));
  if (!f->llama) {
    FSDP_TRY(check_gpt2(f, *kept, x));
    return check_head(f, "wte", "fsdp's GPT-2");
  }
  FSDP_TRY(check_llama(f, *kept, x));
  return check_head(f, LLAMA_EMBED, "a Llama with tie_word_embeddings");
}

static fsdp_status_t import_file(st_file_t *f, expect_t *x, int sharded, const char *out_dir,
                                 int flags, fsdp_ckpt_io_summary_t *sum) {
  struct stat sb;
  char step[CKPT_PATH_MAX];
  int kept = 0;
  *sum = (fsdp_ckpt_io_summary_t){0};
  FSDP_TRY(ckpt_path(step, sizeof step, "%s/step-0", out_dir));
  if (!(flags & FSDP_CKPT_OVERWRITE) && stat(step, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite a committed "
                      "checkpoint (ask for overwrite, e.g. fsdp-ckpt import --overwrite, or import "
                      "elsewhere)", step);
  if (x->config) FSDP_TRY(read_json(x->config, &x->cfg));
  FSDP_TRY(read_input(f, sharded));
  FSDP_TRY(check_model(f, x, &kept));
  FSDP_TRY(check_finite(f));
  /* Only now is the output touched: a refused file leaves nothing behind. */
  fsdp_ckpt_lock_t lock = NULL;
  if (flags & FSDP_CKPT_LOCK) FSDP_TRY(fsdp_ckpt_lock(NULL, out_dir, &lock));
  fsdp_status_t st = write_checkpoint(f, kept, x, out_dir, flags, sum->out, sizeof sum->out);
  fsdp_ckpt_unlock(lock);
  FSDP_TRY(st);
  sum->tensors = kept;
  for (int i = 0; i < f->n; i++)
    if (f->t[i].name) sum->numel += f->t[i].numel;
  for (int i = 0; i < f->n_parts; i++) sum->bytes += f->parts[i].data_at + f->parts[i].data_len;
  snprintf(sum->file, sizeof sum->file, "%s", f->file);
  source_dtype(f, sum->dtype, sizeof sum->dtype);
  return FSDP_SUCCESS;
}

#define ST_INDEX "model.safetensors.index.json"

static int is_index(const char *path) {
  size_t n = strlen(path), k = strlen(".index.json");
  return n > k && !strcmp(path + n - k, ".index.json");
}

/* A directory is config.json + model.safetensors, or + the index of its
 * shards; a file (safetensors or an index) may have a config.json beside it. */
static fsdp_status_t locate(const char *in, char *file, char *config, size_t cap, int *has_config,
                            int *sharded) {
  struct stat sb;
  if (stat(in, &sb) != 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", in, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    FSDP_TRY(ckpt_path(file, cap, "%s/model.safetensors", in));
    FSDP_TRY(ckpt_path(config, cap, "%s/config.json", in));
    *has_config = stat(config, &sb) == 0;
    if (stat(file, &sb) == 0) return FSDP_SUCCESS;
    FSDP_TRY(ckpt_path(file, cap, "%s/" ST_INDEX, in));
    if (stat(file, &sb) != 0)
      return fsdp_error(FSDP_ERR_IO, "%s: neither model.safetensors nor " ST_INDEX " (with its "
                        "shards) in the directory", in);
    *sharded = 1;
    return FSDP_SUCCESS;
  }
  FSDP_TRY(ckpt_path(file, cap, "%s", in));
  const char *slash = strrchr(in, '/');
  int dlen = slash ? (int)(slash - in) : 1;
  FSDP_TRY(ckpt_path(config, cap, "%.*s/config.json", dlen, slash ? in : "."));
  *has_config = stat(config, &sb) == 0;
  *sharded = is_index(in);
  return FSDP_SUCCESS;
}

static void free_input(st_file_t *f, expect_t *x) {
  for (int i = 0; f->t && i < f->n; i++) free(f->t[i].name);
  for (int i = 0; f->parts && i < f->n_parts; i++) {
    free(f->parts[i].path);
    json_free(f->parts[i].header);
    if (f->parts[i].fd >= 0) close(f->parts[i].fd);
  }
  free(f->parts);
  free(f->t);
  free(f->slot);
  json_free(f->index);
  json_free(x->cfg);
}

fsdp_status_t fsdp_ckpt_import_hf(const char *in, const char *out_dir, const char *preset,
                                  int flags, fsdp_ckpt_io_summary_t *summary) {
  if (!in || !out_dir || !out_dir[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "import: needs a safetensors file or Hugging "
                      "Face directory and an output directory");
  char file[CKPT_PATH_MAX], config[CKPT_PATH_MAX];
  int has_config = 0, sharded = 0;
  FSDP_TRY(locate(in, file, config, sizeof file, &has_config, &sharded));
  st_file_t f = {.file = file, .lm_head = -1};
  expect_t x = {.config = has_config ? config : NULL, .preset = preset};
  fsdp_ckpt_io_summary_t local = {0};
  fsdp_status_t st = import_file(&f, &x, sharded, out_dir, flags, summary ? summary : &local);
  free_input(&f, &x);
  return st;
}

fsdp_status_t fsdp_ckpt_import(const char *file, const char *out_dir) {
  return fsdp_ckpt_import_hf(file, out_dir, NULL, 0, NULL);
}
