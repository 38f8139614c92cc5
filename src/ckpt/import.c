/* src/ckpt/import.c — full weights from a safetensors file into a weights-only
 * checkpoint (one rank, step 0) that fsdp_ckpt_load starts a model from. The
 * file is validated strictly before anything is written. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "ckpt/offline.h"

#define ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define ST_MAX_DIMS 16

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
  if (n < 2 || n > ST_MAX_HEADER || n > (uint64_t)sb.st_size - 8)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header length %" PRIu64 " is impossible for a file of "
                      "%lld bytes (not safetensors, or truncated)", f->file, n, (long long)sb.st_size);
  char *text = malloc(n);
  if (!text) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: header of %" PRIu64 " bytes", f->file, n);
  fsdp_status_t st = ckpt_pread(f->fd, f->file, text, n, 8);
  char what[CKPT_PATH_MAX + 16];
  snprintf(what, sizeof what, "%s (header)", f->file);
  if (!st && text[0] != '{')
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: the header does not start with '{'", f->file);
  if (!st) st = json_parse(text, n, what, &f->header);
  free(text);
  f->data_at = 8 + n;
  f->data_len = (uint64_t)sb.st_size - 8 - n;
  return st ? st : read_entries(f);
}

/* ---- names: ours from the published GPT-2 ones -------------------------------------- */

static int skipped(const char *key) {
  size_t n = strlen(key);
  static const char *const buffers[] = {".attn.bias", ".attn.masked_bias"};
  for (size_t i = 0; i < 2; i++) {
    size_t k = strlen(buffers[i]);
    if (n > k && !strcmp(key + n - k, buffers[i])) return 1;
  }
  return !strcmp(key, "lm_head.weight"); /* tied to wte */
}

static fsdp_status_t map_names(st_file_t *f, int *kept) {
  *kept = 0;
  for (int i = 0; i < f->n; i++) {
    st_tensor_t *t = &f->t[i];
    const char *k = !strncmp(t->key, "transformer.", 12) ? t->key + 12 : t->key;
    if (skipped(k)) continue;
    if (strcmp(t->dtype, "F32"))
      return entry_error(f, t->key, "dtype is not F32 (only F32 imports; convert it first)");
    if (t->ndim < 1 || t->ndim > FSDP_MAX_DIMS || t->numel == 0)
      return entry_error(f, t->key, "needs 1 to 4 dimensions and at least one element");
    const char *ours = !strcmp(k, "wte.weight") ? "wte" : !strcmp(k, "wpe.weight") ? "wpe" : k;
    for (int j = 0; j < i; j++)
      if (f->t[j].name && !strcmp(f->t[j].name, ours))
        return entry_error(f, t->key, "maps to a name another tensor already has");
    if (!(t->name = fsdp_strdup(ours))) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import");
    (*kept)++;
  }
  if (*kept == 0) return fsdp_error(FSDP_ERR_FORMAT, "%s: holds no tensor to import", f->file);
  return FSDP_SUCCESS;
}

/* ---- the checkpoint ---------------------------------------------------------------- */

static fsdp_status_t make_manifest(const st_file_t *f, int kept, ckpt_manifest_t *m) {
  FSDP_TRY(ckpt_manifest_alloc(m, 1, 1, kept));
  m->id = ckpt_random_id();
  m->align = 1;
  m->n_states = 1;
  m->state_names[0] = "param";
  snprintf(m->strategy, sizeof m->strategy, "import");
  snprintf(m->optimizer, sizeof m->optimizer, "none");
  snprintf(m->param_dtype, sizeof m->param_dtype, "f32");
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

static fsdp_status_t copy_bytes(const st_file_t *f, const st_tensor_t *t, ckpt_writer_t *w) {
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "import: copy buffer");
  fsdp_status_t st = FSDP_SUCCESS;
  for (uint64_t at = t->begin; at < t->end && !st;) {
    size_t k = t->end - at < CHUNK ? (size_t)(t->end - at) : CHUNK;
    st = ckpt_pread(f->fd, f->file, buf, k, f->data_at + at);
    if (!st) st = ckpt_write(w, buf, k);
    at += k;
  }
  free(buf);
  return st;
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
    if (f->t[i].name) st = copy_bytes(f, &f->t[i], &w);
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  m->files[0] = (ckpt_file_t){w.bytes, w.crc};
  return FSDP_SUCCESS;
}

static fsdp_status_t write_checkpoint(const st_file_t *f, int kept, const char *out_dir) {
  ckpt_manifest_t m = {0};
  char tmp[CKPT_PATH_MAX];
  int guard = -1;
  fsdp_status_t st = make_manifest(f, kept, &m);
  if (!st) st = ckpt_prepare(out_dir, 0, m.id, 0, tmp, sizeof tmp, &guard);
  if (st) return ckpt_manifest_free(&m), st;
  st = ckpt_path(m.dir, sizeof m.dir, "%s", tmp);
  if (!st) st = write_shard(f, &m);
  if (!st) st = ckpt_commit(&m, out_dir, tmp, NULL, NULL, 0);
  if (st) ckpt_discard(tmp);
  ckpt_guard_release(guard);
  ckpt_manifest_free(&m);
  return st;
}

fsdp_status_t fsdp_ckpt_import(const char *file, const char *out_dir) {
  if (!file || !out_dir || !out_dir[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "import: needs a safetensors file and an output "
                      "directory");
  st_file_t f = {file, open(file, O_RDONLY | O_CLOEXEC), 0, 0, NULL, NULL, 0};
  if (f.fd < 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", file, strerror(errno));
  int kept = 0;
  fsdp_status_t st = read_header(&f);
  if (!st) st = map_names(&f, &kept);
  if (!st) st = write_checkpoint(&f, kept, out_dir);
  for (int i = 0; f.t && i < f.n; i++) free(f.t[i].name);
  free(f.t);
  json_free(f.header);
  close(f.fd);
  return st;
}
