/* src/ckpt/manifest.c — the manifest (write, read with its CRC, strict field
 * checks), the 64-byte shard header, section offsets inside shard files, and
 * the trainer-state table. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "core/json.h"

static const char shard_magic[8] = {'F', 'S', 'D', 'P', 'S', 'H', 'R', 'D'};

const char *ckpt_state_name(const char *optimizer, int state) {
  if (state == 0) return "param";
  if (!strcmp(optimizer, "adamw")) return state == 1 ? "exp_avg" : state == 2 ? "exp_avg_sq" : NULL;
  if (!strcmp(optimizer, "sgd")) return state == 1 ? "momentum_buffer" : NULL;
  return NULL;
}

/* ---- trainer state ------------------------------------------------------------- */

static int meta_key_ok(const char *key) {
  size_t n = key ? strlen(key) : 0;
  if (n == 0 || n >= FSDP_CKPT_KEY_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-", key[i]))
      return 0;
  return 1;
}

fsdp_status_t fsdp_ckpt_meta_set(fsdp_ckpt_meta_t *meta, const char *key, int64_t value) {
  if (!meta || !meta_key_ok(key))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "trainer state key '%s' must be 1..%d "
                      "characters of [A-Za-z0-9_.-]", key ? key : "(null)", FSDP_CKPT_KEY_MAX - 1);
  for (int i = 0; i < meta->n; i++)
    if (!strcmp(meta->kv[i].key, key)) return meta->kv[i].value = value, FSDP_SUCCESS;
  if (meta->n >= FSDP_CKPT_META_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "trainer state is full (%d keys): cannot add "
                      "'%s'", FSDP_CKPT_META_MAX, key);
  snprintf(meta->kv[meta->n].key, FSDP_CKPT_KEY_MAX, "%s", key);
  meta->kv[meta->n++].value = value;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_meta_get(const fsdp_ckpt_meta_t *meta, const char *key,
                                int64_t *value) {
  for (int i = 0; meta && key && i < meta->n; i++)
    if (!strcmp(meta->kv[i].key, key)) {
      if (value) *value = meta->kv[i].value;
      return FSDP_SUCCESS;
    }
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "checkpoint metadata has no key '%s'",
                    key ? key : "(null)");
}

/* ---- allocation and layout -------------------------------------------------- */

fsdp_status_t ckpt_manifest_alloc(ckpt_manifest_t *m, int world, int n_units, int n_tensors) {
  m->world = world;
  m->n_units = n_units;
  m->n_tensors = n_tensors;
  m->units = calloc((size_t)n_units, sizeof *m->units);
  m->tensors = calloc((size_t)n_tensors, sizeof *m->tensors);
  m->files = calloc((size_t)world, sizeof *m->files);
  m->section = calloc((size_t)world * (size_t)n_units, sizeof *m->section);
  int ok = m->units && m->tensors && m->files && m->section;
  for (int u = 0; ok && u < n_units; u++)
    ok = (m->units[u].ranges = calloc((size_t)world, sizeof(ckpt_range_t))) != NULL;
  if (!ok) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint manifest: out of memory");
  return FSDP_SUCCESS;
}

void ckpt_manifest_free(ckpt_manifest_t *m) {
  for (int u = 0; m->units && u < m->n_units; u++) {
    free(m->units[u].name);
    free(m->units[u].kind);
    free(m->units[u].ranges);
  }
  for (int t = 0; m->tensors && t < m->n_tensors; t++) free(m->tensors[t].name);
  free(m->units);
  free(m->tensors);
  free(m->files);
  free(m->section);
  m->units = NULL;
  m->tensors = NULL;
  m->files = NULL;
  m->section = NULL;
}

fsdp_status_t ckpt_manifest_layout(ckpt_manifest_t *m, const char *what) {
  for (int u = 0; u < m->n_units; u++) {
    const ckpt_unit_t *un = &m->units[u];
    size_t at = 0;
    for (int r = 0; r < m->world; r++) {
      if (un->ranges[r].begin != at || un->ranges[r].end < at)
        return fsdp_error(FSDP_ERR_FORMAT, "%s: unit '%s': rank %d's range [%zu, %zu) does not "
                          "continue at element %zu", what, un->name, r, un->ranges[r].begin,
                          un->ranges[r].end, at);
      at = un->ranges[r].end;
    }
    if (at != un->numel)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: unit '%s': ranges end at %zu, not at its %zu "
                        "elements", what, un->name, at, un->numel);
  }
  for (int r = 0; r < m->world; r++) {
    uint64_t off = CKPT_HEADER_BYTES;
    for (int u = 0; u < m->n_units; u++) {
      m->section[(size_t)r * (size_t)m->n_units + (size_t)u] = off;
      const ckpt_range_t *g = &m->units[u].ranges[r];
      off += (uint64_t)(g->end - g->begin) * (uint64_t)m->n_states * sizeof(float);
    }
  }
  return FSDP_SUCCESS;
}

/* Payload bytes of rank r's file (without the header). */
static uint64_t ckpt_payload_bytes(const ckpt_manifest_t *m, int r) {
  uint64_t b = 0;
  for (int u = 0; u < m->n_units; u++)
    b += (uint64_t)(m->units[u].ranges[r].end - m->units[u].ranges[r].begin);
  return b * (uint64_t)m->n_states * sizeof(float);
}

void ckpt_shard_path(const ckpt_manifest_t *m, int r, char *out, size_t cap) {
  snprintf(out, cap, "%s/rank-%d-of-%d.bin", m->dir, r, m->world);
}

int ckpt_find_tensor(const ckpt_manifest_t *m, const char *name) {
  for (int t = 0; t < m->n_tensors; t++)
    if (!strcmp(m->tensors[t].name, name)) return t;
  return -1;
}

/* ---- writing -------------------------------------------------------------------- */

static void write_config(const fsdp_config_t *c, sbuf_t *sb) {
  const fsdp_optim_config_t *o = &c->optim;
  const fsdp_schedule_t *s = &c->schedule;
  sb_printf(sb, "  \"config\": {\"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, "
            "\"weight_decay\": %.9g, \"momentum\": %.9g, \"nesterov\": %d, \"max_grad_norm\": "
            "%.9g, \"schedule\": \"%s\", \"warmup_steps\": %" PRId64 ", \"total_steps\": %" PRId64
            ", \"min_lr_ratio\": %.9g, \"grad_accum\": %d},\n", (double)o->lr, (double)o->beta1,
            (double)o->beta2, (double)o->eps, (double)o->weight_decay, (double)o->momentum,
            o->nesterov, (double)o->max_grad_norm,
            s->kind == FSDP_SCHED_WARMUP_COSINE ? "warmup_cosine" : "constant", s->warmup_steps,
            s->total_steps, (double)s->min_lr_ratio, c->grad_accum);
}

static const char *rope_type_name(fsdp_rope_type_t t) {
  return t == FSDP_ROPE_LLAMA3 ? "llama3" : "default";
}

/* Floats as the shortest text that reads back to the same float. */
static void write_llama(const fsdp_llama_config_t *c, sbuf_t *sb) {
  sb_printf(sb, "  \"model\": {\"family\": \"llama\", \"n_layer\": %d, \"n_head\": %d, "
            "\"n_kv_head\": %d, \"n_embd\": %d, \"ffn_hidden\": %d, \"vocab_size\": %d, "
            "\"max_seq_len\": %d, \"rope_theta\": ", c->n_layer, c->n_head, c->n_kv_head,
            c->n_embd, c->ffn_hidden, c->vocab_size, c->max_seq_len);
  sb_json_float(sb, c->rope_theta);
  sb_printf(sb, ", \"rms_eps\": ");
  sb_json_float(sb, c->rms_eps);
  sb_printf(sb, ", \"tie_embeddings\": %s, \"rope_type\": \"%s\"",
            c->tie_embeddings ? "true" : "false", rope_type_name(c->rope_type));
  if (c->rope_type == FSDP_ROPE_LLAMA3) {
    sb_printf(sb, ", \"rope_factor\": ");
    sb_json_float(sb, c->rope_factor);
    sb_printf(sb, ", \"rope_low_freq_factor\": ");
    sb_json_float(sb, c->rope_low_freq_factor);
    sb_printf(sb, ", \"rope_high_freq_factor\": ");
    sb_json_float(sb, c->rope_high_freq_factor);
    sb_printf(sb, ", \"rope_original_max_pos\": %d", c->rope_original_max_pos);
  }
  sb_printf(sb, "},\n");
}

static void write_head(const ckpt_manifest_t *m, sbuf_t *sb) {
  sb_printf(sb, "{\n  \"format\": \"fsdp-checkpoint\",\n  \"version\": %d,\n  \"id\": \"%016" PRIx64
            "\",\n  \"step\": %" PRId64 ",\n  \"world_size\": %d,\n  \"strategy\": \"%s\",\n"
            "  \"align\": %zu,\n  \"param_dtype\": \"%s\",\n  \"optimizer\": {\"kind\": \"%s\", "
            "\"states\": [", CKPT_VERSION, m->id, m->step, m->world, m->strategy, m->align,
            m->param_dtype, m->optimizer);
  for (int s = 1; s < m->n_states; s++) sb_printf(sb, "%s\"%s\"", s > 1 ? ", " : "", m->state_names[s]);
  sb_printf(sb, "]},\n");
  if (m->cfg) write_config(m->cfg, sb);
  sb_printf(sb, "  \"trainer\": {");
  for (int i = 0; i < m->meta.n; i++)
    sb_printf(sb, "%s\"%s\": %" PRId64, i ? ", " : "", m->meta.kv[i].key, m->meta.kv[i].value);
  sb_printf(sb, "},\n");
  if (m->has_llama) write_llama(&m->llama, sb);
  if (m->has_scaler) /* %.17g: the double comes back bit for bit */
    sb_printf(sb, "  \"loss_scaler\": {\"scale\": %.17g, \"good_steps\": %" PRId64 "},\n",
              m->loss_scale, m->good_steps);
}

static void write_units(const ckpt_manifest_t *m, sbuf_t *sb) {
  sb_printf(sb, "  \"units\": [\n");
  for (int u = 0; u < m->n_units; u++) {
    const ckpt_unit_t *un = &m->units[u];
    sb_printf(sb, "    {\"name\": ");
    sb_json_str(sb, un->name);
    sb_printf(sb, ", \"kind\": ");
    sb_json_str(sb, un->kind);
    sb_printf(sb, ", \"numel\": %zu, \"ranges\": [", un->numel);
    for (int r = 0; r < m->world; r++)
      sb_printf(sb, "%s[%zu, %zu]", r ? ", " : "", un->ranges[r].begin, un->ranges[r].end);
    sb_printf(sb, "]}%s\n", u + 1 < m->n_units ? "," : "");
  }
  sb_printf(sb, "  ],\n");
}

static void write_tensors(const ckpt_manifest_t *m, sbuf_t *sb) {
  sb_printf(sb, "  \"tensors\": [\n");
  for (int t = 0; t < m->n_tensors; t++) {
    const ckpt_tensor_t *ts = &m->tensors[t];
    sb_printf(sb, "    {\"name\": ");
    sb_json_str(sb, ts->name);
    sb_printf(sb, ", \"dtype\": \"F32\", \"shape\": [");
    for (int d = 0; d < ts->ndim; d++) sb_printf(sb, "%s%" PRId64, d ? ", " : "", ts->shape[d]);
    sb_printf(sb, "], \"unit\": %d, \"offset\": %zu}%s\n", ts->unit, ts->offset,
              t + 1 < m->n_tensors ? "," : "");
  }
  sb_printf(sb, "  ],\n");
}

fsdp_status_t ckpt_manifest_write(const ckpt_manifest_t *m, sbuf_t *sb) {
  write_head(m, sb);
  write_units(m, sb);
  write_tensors(m, sb);
  sb_printf(sb, "  \"files\": [\n");
  for (int r = 0; r < m->world; r++)
    sb_printf(sb, "    {\"name\": \"rank-%d-of-%d.bin\", \"bytes\": %" PRIu64 ", \"crc32\": "
              "\"%08" PRIx32 "\"}%s\n", r, m->world, m->files[r].bytes, m->files[r].crc,
              r + 1 < m->world ? "," : "");
  sb_printf(sb, "  ],\n");
  if (sb->failed) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint manifest: out of memory");
  uint32_t crc = ckpt_crc(0, sb->buf, sb->len);
  sb_printf(sb, "  " CKPT_CRC_KEY "%08" PRIx32 "\"\n}\n", crc);
  if (sb->failed) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint manifest: out of memory");
  return FSDP_SUCCESS;
}

/* ---- reading: typed fields with errors that say where ---------------------------- */

typedef struct {
  const char *file;
  fsdp_status_t st;
} mctx_t;

static int bad(mctx_t *c, const json_t *at, const char *field, const char *problem) {
  if (c->st == FSDP_SUCCESS)
    c->st = fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: field \"%s\" %s", c->file,
                       at ? at->line : 1, field, problem);
  return -1;
}

static const json_t *field(mctx_t *c, const json_t *obj, const char *key, json_type_t type,
                           const char *path) {
  const json_t *v = json_get(obj, key);
  static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array",
                                      "an object"};
  char problem[64];
  if (!v) return bad(c, obj, path, "is missing"), NULL;
  if (v->type != type) {
    snprintf(problem, sizeof problem, "must be %s", names[type]);
    return bad(c, v, path, problem), NULL;
  }
  return v;
}

static int get_int(mctx_t *c, const json_t *obj, const char *key, int64_t lo, int64_t hi,
                   const char *path, int64_t *out) {
  const json_t *v = field(c, obj, key, JSON_NUMBER, path);
  char problem[96];
  if (!v) return -1;
  if (!json_int(v, out) || *out < lo || *out > hi) {
    snprintf(problem, sizeof problem, "must be an integer in [%" PRId64 ", %" PRId64 "], not %s",
             lo, hi, v->text);
    return bad(c, v, path, problem);
  }
  return 0;
}

static int get_size(mctx_t *c, const json_t *obj, const char *key, const char *path, size_t *out) {
  int64_t x;
  if (get_int(c, obj, key, 0, INT64_MAX >> 4, path, &x)) return -1;
  *out = (size_t)x;
  return 0;
}

static int get_str(mctx_t *c, const json_t *obj, const char *key, const char *path, char *out,
                   size_t cap) {
  const json_t *v = field(c, obj, key, JSON_STRING, path);
  if (!v) return -1;
  if (v->len >= cap || strlen(v->text) != v->len) return bad(c, v, path, "is too long or holds NUL");
  memcpy(out, v->text, v->len + 1);
  return 0;
}

static int get_dup(mctx_t *c, const json_t *obj, const char *key, const char *path, char **out) {
  const json_t *v = field(c, obj, key, JSON_STRING, path);
  if (!v) return -1;
  if (strlen(v->text) != v->len) return bad(c, v, path, "holds a NUL character");
  if (!(*out = fsdp_strdup(v->text)))
    return c->st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", c->file), -1;
  return 0;
}

static int get_hex(mctx_t *c, const json_t *obj, const char *key, const char *path, int digits,
                   uint64_t *out) {
  char text[24], *end;
  if (get_str(c, obj, key, path, text, sizeof text)) return -1;
  if ((int)strlen(text) != digits || strspn(text, "0123456789abcdef") != (size_t)digits)
    return bad(c, json_get(obj, key), path, "must be lowercase hexadecimal of the right length");
  *out = strtoull(text, &end, 16);
  return 0;
}

/* ---- reading: sections ------------------------------------------------------------ */

static int read_optimizer(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  const json_t *o = field(c, root, "optimizer", JSON_OBJECT, "optimizer");
  if (!o || get_str(c, o, "kind", "optimizer.kind", m->optimizer, sizeof m->optimizer)) return -1;
  if (strcmp(m->optimizer, "adamw") && strcmp(m->optimizer, "sgd") && strcmp(m->optimizer, "none"))
    return bad(c, json_get(o, "kind"), "optimizer.kind", "must be \"adamw\", \"sgd\" or \"none\"");
  const json_t *s = field(c, o, "states", JSON_ARRAY, "optimizer.states");
  if (!s) return -1;
  if (s->n + 1 > CKPT_MAX_STATES) return bad(c, s, "optimizer.states", "has too many entries");
  m->n_states = (int)s->n + 1;
  for (int i = 0; i < m->n_states; i++) {
    const char *want = ckpt_state_name(m->optimizer, i);
    if (!want || (i > 0 && (s->items[i - 1].type != JSON_STRING || strcmp(s->items[i - 1].text, want))))
      return bad(c, s, "optimizer.states", "does not list this optimizer's states in order");
    m->state_names[i] = want;
  }
  return 0;
}

static int read_trainer(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  const json_t *t = field(c, root, "trainer", JSON_OBJECT, "trainer");
  if (!t) return -1;
  for (size_t i = 0; i < t->n; i++) {
    int64_t v;
    if (!json_int(&t->items[i], &v)) return bad(c, &t->items[i], "trainer", "values must be integers");
    if (fsdp_ckpt_meta_set(&m->meta, t->keys[i], v))
      return bad(c, &t->items[i], "trainer", "has a key that is too long, invalid, or too many keys");
  }
  return 0;
}

/* Optional: checkpoints of engines without loss scaling have none. */
static int read_scaler(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  const json_t *s = json_get(root, "loss_scaler");
  if (!s) return 0;
  if (s->type != JSON_OBJECT) return bad(c, s, "loss_scaler", "must be an object");
  const json_t *v = field(c, s, "scale", JSON_NUMBER, "loss_scaler.scale");
  if (!v || get_int(c, s, "good_steps", 0, INT64_MAX, "loss_scaler", &m->good_steps)) return -1;
  char *end;
  m->loss_scale = strtod(v->text, &end);
  if (*end || !(m->loss_scale > 0.0 && m->loss_scale < 1e300))
    return bad(c, v, "loss_scaler.scale", "must be a finite number > 0");
  m->has_scaler = 1;
  return 0;
}

static int get_float(mctx_t *c, const json_t *obj, const char *key, const char *path,
                     float *out) {
  const json_t *v = field(c, obj, key, JSON_NUMBER, path);
  if (!v) return -1;
  if (!json_float(v, out)) return bad(c, v, path, "must be a finite number");
  return 0;
}

/* Optional: "model" records a Llama (import, or a save given its config). */
static int read_model(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  const json_t *v = json_get(root, "model");
  if (!v) return 0;
  if (v->type != JSON_OBJECT) return bad(c, v, "model", "must be an object");
  char family[16], rope[16];
  if (get_str(c, v, "family", "model.family", family, sizeof family)) return -1;
  if (strcmp(family, "llama"))
    return bad(c, json_get(v, "family"), "model.family", "must be \"llama\" (the family this "
               "build records)");
  fsdp_llama_config_t *l = &m->llama;
  const struct { const char *key; int *out; } ints[] = {
      {"n_layer", &l->n_layer}, {"n_head", &l->n_head}, {"n_kv_head", &l->n_kv_head},
      {"n_embd", &l->n_embd}, {"ffn_hidden", &l->ffn_hidden}, {"vocab_size", &l->vocab_size},
      {"max_seq_len", &l->max_seq_len}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    int64_t x;
    if (get_int(c, v, ints[i].key, 1, INT32_MAX, "model", &x)) return -1;
    *ints[i].out = (int)x;
  }
  const json_t *tie = field(c, v, "tie_embeddings", JSON_BOOL, "model.tie_embeddings");
  if (!tie || get_float(c, v, "rope_theta", "model.rope_theta", &l->rope_theta) ||
      get_float(c, v, "rms_eps", "model.rms_eps", &l->rms_eps) ||
      get_str(c, v, "rope_type", "model.rope_type", rope, sizeof rope))
    return -1;
  l->tie_embeddings = tie->boolean;
  if (!strcmp(rope, "llama3")) {
    int64_t old;
    l->rope_type = FSDP_ROPE_LLAMA3;
    if (get_float(c, v, "rope_factor", "model.rope_factor", &l->rope_factor) ||
        get_float(c, v, "rope_low_freq_factor", "model.rope_low_freq_factor",
                  &l->rope_low_freq_factor) ||
        get_float(c, v, "rope_high_freq_factor", "model.rope_high_freq_factor",
                  &l->rope_high_freq_factor) ||
        get_int(c, v, "rope_original_max_pos", 1, INT32_MAX, "model.rope_original_max_pos", &old))
      return -1;
    l->rope_original_max_pos = (int)old;
  } else if (strcmp(rope, "default")) {
    return bad(c, json_get(v, "rope_type"), "model.rope_type", "must be \"default\" or \"llama3\"");
  }
  if (fsdp_llama_config_check(l)) {
    char problem[512];
    snprintf(problem, sizeof problem, "is not a valid Llama: %s", fsdp_last_error());
    return bad(c, v, "model", problem);
  }
  m->has_llama = 1;
  return 0;
}

static int read_range(mctx_t *c, const json_t *r, const char *path, ckpt_range_t *out) {
  int64_t a, b;
  if (r->type != JSON_ARRAY || r->n != 2 || !json_int(&r->items[0], &a) ||
      !json_int(&r->items[1], &b) || a < 0 || b < a)
    return bad(c, r, path, "must be [begin, end] with 0 <= begin <= end");
  out->begin = (size_t)a;
  out->end = (size_t)b;
  return 0;
}

static int read_unit(mctx_t *c, const json_t *v, int u, ckpt_manifest_t *m) {
  char path[64];
  ckpt_unit_t *un = &m->units[u];
  snprintf(path, sizeof path, "units[%d]", u);
  if (v->type != JSON_OBJECT) return bad(c, v, path, "must be an object");
  if (get_dup(c, v, "name", path, &un->name) || get_dup(c, v, "kind", path, &un->kind) ||
      get_size(c, v, "numel", path, &un->numel))
    return -1;
  const json_t *r = field(c, v, "ranges", JSON_ARRAY, path);
  if (!r) return -1;
  if (r->n != (size_t)m->world) return bad(c, r, path, "ranges must have one entry per rank");
  for (int k = 0; k < m->world; k++) {
    snprintf(path, sizeof path, "units[%d].ranges[%d]", u, k);
    if (read_range(c, &r->items[k], path, &un->ranges[k])) return -1;
  }
  return 0;
}

static int read_shape(mctx_t *c, const json_t *v, const char *path, ckpt_tensor_t *t) {
  const json_t *s = field(c, v, "shape", JSON_ARRAY, path);
  if (!s) return -1;
  if (s->n < 1 || s->n > FSDP_MAX_DIMS) return bad(c, s, path, "shape must have 1 to 4 dimensions");
  t->ndim = (int)s->n;
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (!json_int(&s->items[d], &t->shape[d]) || t->shape[d] < 1 || t->shape[d] > (1ll << 40) ||
        t->numel > (SIZE_MAX >> 8) / (size_t)t->shape[d])
      return bad(c, s, path, "shape dimensions must be positive integers of sane size");
    t->numel *= (size_t)t->shape[d];
  }
  return 0;
}

static int read_tensor(mctx_t *c, const json_t *v, int i, ckpt_manifest_t *m) {
  char path[64], dtype[8];
  ckpt_tensor_t *t = &m->tensors[i];
  int64_t unit;
  snprintf(path, sizeof path, "tensors[%d]", i);
  if (v->type != JSON_OBJECT) return bad(c, v, path, "must be an object");
  if (get_dup(c, v, "name", path, &t->name) || get_str(c, v, "dtype", path, dtype, sizeof dtype) ||
      read_shape(c, v, path, t) || get_int(c, v, "unit", 0, m->n_units - 1, path, &unit) ||
      get_size(c, v, "offset", path, &t->offset))
    return -1;
  if (strcmp(dtype, "F32")) return bad(c, json_get(v, "dtype"), path, "dtype must be \"F32\"");
  t->unit = (int)unit;
  if (t->offset > m->units[unit].numel || t->numel > m->units[unit].numel - t->offset)
    return bad(c, v, path, "lies outside its unit");
  return 0;
}

static int read_file_entry(mctx_t *c, const json_t *v, int r, ckpt_manifest_t *m) {
  char path[64], name[64], want[64];
  uint64_t crc;
  int64_t bytes;
  snprintf(path, sizeof path, "files[%d]", r);
  snprintf(want, sizeof want, "rank-%d-of-%d.bin", r, m->world);
  if (v->type != JSON_OBJECT) return bad(c, v, path, "must be an object");
  if (get_str(c, v, "name", path, name, sizeof name) ||
      get_int(c, v, "bytes", CKPT_HEADER_BYTES, INT64_MAX, path, &bytes) ||
      get_hex(c, v, "crc32", path, 8, &crc))
    return -1;
  if (strcmp(name, want)) return bad(c, v, path, "name is not rank-<r>-of-<world>.bin in rank order");
  m->files[r].bytes = (uint64_t)bytes;
  m->files[r].crc = (uint32_t)crc;
  return 0;
}

static int read_head(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  char format[32];
  int64_t version, step, world, align;
  if (get_str(c, root, "format", "format", format, sizeof format)) return -1;
  if (strcmp(format, "fsdp-checkpoint"))
    return bad(c, json_get(root, "format"), "format", "is not \"fsdp-checkpoint\"");
  if (get_int(c, root, "version", 1, 1000, "version", &version)) return -1;
  if (version != CKPT_VERSION)
    return bad(c, json_get(root, "version"), "version", "is a format this build cannot read (1)");
  if (get_hex(c, root, "id", "id", 16, &m->id) || get_int(c, root, "step", 0, INT64_MAX, "step", &step) ||
      get_int(c, root, "world_size", 1, 1 << 20, "world_size", &world) ||
      get_str(c, root, "strategy", "strategy", m->strategy, sizeof m->strategy) ||
      get_int(c, root, "align", 1, 1 << 30, "align", &align) ||
      get_str(c, root, "param_dtype", "param_dtype", m->param_dtype, sizeof m->param_dtype))
    return -1;
  m->step = step;
  m->world = (int)world;
  m->align = (size_t)align;
  return read_optimizer(c, root, m) || read_trainer(c, root, m) || read_scaler(c, root, m) ||
                 read_model(c, root, m)
             ? -1
             : 0;
}

static int read_tables(mctx_t *c, const json_t *root, ckpt_manifest_t *m) {
  const json_t *u = field(c, root, "units", JSON_ARRAY, "units");
  const json_t *t = u ? field(c, root, "tensors", JSON_ARRAY, "tensors") : NULL;
  const json_t *f = t ? field(c, root, "files", JSON_ARRAY, "files") : NULL;
  if (!f) return -1;
  if (u->n < 1 || u->n > (1 << 20) || t->n < 1 || t->n > (1 << 24))
    return bad(c, u, "units", "and tensors must not be empty");
  if (f->n != (size_t)m->world) return bad(c, f, "files", "must have one entry per rank");
  int world = m->world;
  if (ckpt_manifest_alloc(m, world, (int)u->n, (int)t->n))
    return c->st = FSDP_ERR_OUT_OF_MEMORY, -1;
  for (int i = 0; i < m->n_units; i++)
    if (read_unit(c, &u->items[i], i, m)) return -1;
  for (int i = 0; i < m->n_tensors; i++)
    if (read_tensor(c, &t->items[i], i, m)) return -1;
  for (int r = 0; r < world; r++)
    if (read_file_entry(c, &f->items[r], r, m)) return -1;
  return 0;
}

/* Tensors must tile their units exactly and have unique names. */
static fsdp_status_t check_tiling(const ckpt_manifest_t *m, const char *file) {
  for (int u = 0; u < m->n_units; u++) {
    size_t at = 0;
    for (int t = 0; t < m->n_tensors; t++)
      if (m->tensors[t].unit == u) {
        if (m->tensors[t].offset != at)
          return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' starts at %zu of unit '%s', "
                            "expected %zu (tensors must tile their unit in order)", file,
                            m->tensors[t].name, m->tensors[t].offset, m->units[u].name, at);
        at += m->tensors[t].numel;
      }
    if (at != m->units[u].numel)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: tensors of unit '%s' hold %zu elements, the unit "
                        "%zu", file, m->units[u].name, at, m->units[u].numel);
  }
  for (int t = 0; t < m->n_tensors; t++)
    for (int k = t + 1; k < m->n_tensors; k++)
      if (!strcmp(m->tensors[t].name, m->tensors[k].name))
        return fsdp_error(FSDP_ERR_FORMAT, "%s: tensor '%s' appears twice", file,
                          m->tensors[t].name);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_crc(const char *file, const char *text, size_t len) {
  const char *key = NULL;
  if (strlen(text) != len)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: holds a NUL byte: the manifest is corrupt", file);
  for (const char *p = text; (p = strstr(p, "\n  " CKPT_CRC_KEY)) != NULL; p++) key = p;
  if (!key)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: has no manifest_crc32 line: truncated, corrupt or "
                      "not an fsdp manifest", file);
  const char *hex = key + strlen("\n  " CKPT_CRC_KEY);
  char *end;
  unsigned long want = strtoul(hex, &end, 16);
  uint32_t got = ckpt_crc(0, text, (size_t)(key - text) + 1);
  if (end != hex + 8 || strcmp(end, "\"\n}\n") != 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: its last line is not '  \"manifest_crc32\": "
                      "\"<8 hex digits>\"' followed by '}': corrupt or edited", file);
  if (got != (uint32_t)want)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: CRC-32 of the contents is %08" PRIx32 " but its last "
                      "line says %08lx: the manifest is corrupt", file, got, want);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_files(const ckpt_manifest_t *m, const char *file) {
  for (int r = 0; r < m->world; r++)
    if (m->files[r].bytes != CKPT_HEADER_BYTES + ckpt_payload_bytes(m, r))
      return fsdp_error(FSDP_ERR_FORMAT, "%s: files[%d] says %" PRIu64 " bytes, but its ranges "
                        "need %" PRIu64, file, r, m->files[r].bytes,
                        (uint64_t)CKPT_HEADER_BYTES + ckpt_payload_bytes(m, r));
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_manifest_read(const char *dir, ckpt_manifest_t *m) {
  char file[CKPT_PATH_MAX], *text = NULL;
  size_t len;
  memset(m, 0, sizeof *m);
  FSDP_TRY(ckpt_path(m->dir, sizeof m->dir, "%s", dir));
  FSDP_TRY(ckpt_path(file, sizeof file, "%s/" CKPT_MANIFEST, dir));
  FSDP_TRY(ckpt_read_whole(file, &text, &len));
  fsdp_status_t st = check_crc(file, text, len);
  json_t *root = NULL;
  if (!st) st = json_parse(text, len, file, &root);
  free(text);
  if (st) return st;
  mctx_t c = {file, FSDP_SUCCESS};
  if (root->type != JSON_OBJECT) bad(&c, root, "(root)", "must be an object");
  else if (!read_head(&c, root, m)) read_tables(&c, root, m);
  json_free(root);
  st = c.st;
  if (!st) st = ckpt_manifest_layout(m, file);
  if (!st) st = check_tiling(m, file);
  if (!st) st = check_files(m, file);
  if (st) ckpt_manifest_free(m);
  return st;
}

/* ---- shard header ------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t x) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static void put64(uint8_t *p, uint64_t x) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t x = 0;
  for (int i = 3; i >= 0; i--) x = (x << 8) | p[i];
  return x;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
  return x;
}

void ckpt_header_encode(const ckpt_manifest_t *m, int rank, uint8_t out[CKPT_HEADER_BYTES]) {
  memset(out, 0, CKPT_HEADER_BYTES);
  memcpy(out, shard_magic, 8);
  put32(out + 8, CKPT_VERSION);
  put32(out + 12, CKPT_HEADER_BYTES);
  put64(out + 16, (uint64_t)m->step);
  put64(out + 24, m->id);
  put32(out + 32, (uint32_t)rank);
  put32(out + 36, (uint32_t)m->world);
  put32(out + 40, (uint32_t)m->n_units);
  put32(out + 44, (uint32_t)m->n_states);
  put64(out + 48, ckpt_payload_bytes(m, rank));
  put32(out + 56, ckpt_crc(0, out, 56));
}

fsdp_status_t ckpt_header_check(const ckpt_manifest_t *m, int r, const char *path,
                                const uint8_t in[CKPT_HEADER_BYTES]) {
  if (memcmp(in, shard_magic, 8) != 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: not an fsdp shard file (bad magic)", path);
  if (get32(in + 56) != ckpt_crc(0, in, 56))
    return fsdp_error(FSDP_ERR_FORMAT, "%s: its header is corrupt (header CRC mismatch)", path);
  if (get32(in + 8) != CKPT_VERSION || get32(in + 12) != CKPT_HEADER_BYTES)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: shard format version %u, this build reads %d", path,
                      get32(in + 8), CKPT_VERSION);
  int64_t step = (int64_t)get64(in + 16);
  uint64_t id = get64(in + 24);
  if (step != m->step || id != m->id)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: is a shard of step %" PRId64 " (checkpoint id %016"
                      PRIx64 "), but the manifest is step %" PRId64 " (id %016" PRIx64 "): a stray "
                      "file from another checkpoint", path, step, id, m->step, m->id);
  if (get32(in + 32) != (uint32_t)r || get32(in + 36) != (uint32_t)m->world)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: holds rank %u of %u, but this is rank %d of %d's "
                      "place", path, get32(in + 32), get32(in + 36), r, m->world);
  if (get32(in + 40) != (uint32_t)m->n_units || get32(in + 44) != (uint32_t)m->n_states ||
      get64(in + 48) != ckpt_payload_bytes(m, r))
    return fsdp_error(FSDP_ERR_FORMAT, "%s: header disagrees with the manifest on units, states "
                      "or payload size", path);
  return FSDP_SUCCESS;
}
