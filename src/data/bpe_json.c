/* src/data/bpe_json.c — Hugging Face's tokenizer.json of the byte-level BPE
 * kind (GPT-2, Llama 3, SmolLM, Qwen2): the model's vocabulary and merges,
 * the NFC normalizer, the pre-tokenizer's steps, added tokens, the document
 * token; every other kind refused by name. And fsdp_tokenizer_load: a
 * tokenizer.json, or GPT-2's vocab.json + merges.txt (bpe_load.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "data/bpe_internal.h"

static const char *json_str(const json_t *v, const char *key) {
  const json_t *s = json_get(v, key);
  return s && s->type == JSON_STRING ? s->text : NULL;
}

static int json_true(const json_t *v, const char *key) {
  const json_t *b = json_get(v, key);
  return b && b->type == JSON_BOOL && b->boolean;
}

/* ---- model ------------------------------------------------------------------ */

/* One merge of model.merges as "a b" in buf. */
static fsdp_status_t json_merge(const char *path, const json_t *m, char *buf, size_t cap,
                                size_t *len) {
  if (m->type == JSON_STRING && m->len < cap) {
    memcpy(buf, m->text, m->len);
    return *len = m->len, FSDP_SUCCESS;
  }
  if (m->type == JSON_ARRAY && m->n == 2 && m->items[0].type == JSON_STRING &&
      m->items[1].type == JSON_STRING && m->items[0].len + m->items[1].len + 1 < cap) {
    *len = (size_t)snprintf(buf, cap, "%s %s", m->items[0].text, m->items[1].text);
    return FSDP_SUCCESS;
  }
  return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: model.merges: a merge must be \"a b\" or "
                    "[\"a\", \"b\"] of at most 1 KiB", path, m->line);
}

static fsdp_status_t merges_from_json(struct fsdp_tokenizer *t, const char *path, const json_t *a) {
  if (!a || a->type != JSON_ARRAY)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: model.merges must be an array", path);
  int *merge_line = NULL;
  fsdp_status_t st = bpe_merges_alloc(t, path, a->n, &merge_line);
  for (size_t i = 0; i < a->n && !st; i++) {
    char buf[1024];
    size_t len = 0;
    st = json_merge(path, &a->items[i], buf, sizeof buf, &len);
    merge_line[t->n_merges] = a->items[i].line;
    if (!st) st = bpe_add_merge(t, path, a->items[i].line, buf, len, merge_line);
  }
  free(merge_line);
  return st;
}

static const char sentencepiece[] = "a SentencePiece-style BPE (Llama 2's, TinyLlama's: "
                                    "Metaspace, byte fallback), not byte-level";

/* model: a BPE whose options fsdp's encoder implements. */
static fsdp_status_t check_model(struct fsdp_tokenizer *t, const char *path, const json_t *m) {
  const char *type = json_str(m, "type");
  if (!m || m->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: no \"model\" object: not a tokenizer.json", path);
  if (!type)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: model.type is missing", path, m->line);
  if (strcmp(type, "BPE"))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: model.type is %s; fsdp reads BPE "
                      "models of the byte-level kind only (GPT-2, Llama 3, SmolLM, Qwen2)", path,
                      m->line, type);
  if (json_true(m, "byte_fallback"))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: model.byte_fallback is true: %s; fsdp "
                      "reads byte-level BPE only", path, json_get(m, "byte_fallback")->line,
                      sentencepiece);
  const json_t *drop = json_get(m, "dropout");
  if (drop && drop->type != JSON_NULL && !(drop->type == JSON_NUMBER && atof(drop->text) == 0.0))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: model.dropout is set; fsdp encodes "
                      "deterministically", path, drop->line);
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const json_t *a = json_get(m, affixes[i]);
    if (a && a->type != JSON_NULL && !(a->type == JSON_STRING && a->len == 0))
      return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: model.%s is set; byte-level BPE has "
                        "none", path, a->line, affixes[i]);
  }
  t->ignore_merges = json_true(m, "ignore_merges");
  return FSDP_SUCCESS;
}

/* ---- pre-tokenizer ------------------------------------------------------------
 * Steps that split (Split on a regex or a string, Digits), then ByteLevel
 * (splitting with GPT-2's pattern when use_regex), which must come last. */

typedef struct {
  const char *path;
  char key[128]; /* the step's key, e.g. pre_tokenizer.pretokenizers[0] */
  int byte_level;
} pre_walk_t;

static fsdp_status_t step_error(const pre_walk_t *w, const json_t *at, fsdp_status_t code,
                                const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static fsdp_status_t step_error(const pre_walk_t *w, const json_t *at, fsdp_status_t code,
                                const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fsdp_error(code, "%s: line %d: %s: %s", w->path, at->line, w->key, msg);
}

static fsdp_status_t add_step(struct fsdp_tokenizer *t, pre_walk_t *w, const char *pattern,
                              size_t len, int literal, const json_t *at) {
  char where[4096 + 160];
  snprintf(where, sizeof where, "%s: line %d: %s", w->path, at->line, w->key);
  if (len > BPE_MAX_PATTERN)
    return step_error(w, at, FSDP_ERR_FORMAT, "a pattern of %zu bytes (at most %d)", len,
                      BPE_MAX_PATTERN);
  return bpe_add_split(t, pattern, len, literal, where);
}

/* Split: {"pattern": {"Regex": ...} or {"String": ...}, "behavior": "Isolated",
 * "invert": false} (Llama 3's, Qwen2's). */
static fsdp_status_t split_step(struct fsdp_tokenizer *t, pre_walk_t *w, const json_t *p) {
  const json_t *pat = json_get(p, "pattern"), *re = json_get(pat, "Regex");
  const json_t *lit = json_get(pat, "String"), *s = re ? re : lit;
  const char *behavior = json_str(p, "behavior");
  if (!s || s->type != JSON_STRING || s->len == 0)
    return step_error(w, p, FSDP_ERR_FORMAT, "a Split needs \"pattern\": {\"Regex\": \"...\"} "
                      "or {\"String\": \"...\"}, not empty");
  if (!behavior || strcmp(behavior, "Isolated"))
    return step_error(w, p, FSDP_ERR_UNSUPPORTED, "behavior is %s; fsdp splits with Isolated "
                      "(the byte-level tokenizers' behaviour) only",
                      behavior ? behavior : "missing");
  if (json_true(p, "invert"))
    return step_error(w, p, FSDP_ERR_UNSUPPORTED, "invert is true; fsdp splits on matches only");
  return add_step(t, w, s->text, s->len, s == lit, s);
}

static fsdp_status_t pre_step(struct fsdp_tokenizer *t, pre_walk_t *w, const json_t *p);

static fsdp_status_t sequence_step(struct fsdp_tokenizer *t, pre_walk_t *w, const json_t *p) {
  const json_t *list = json_get(p, "pretokenizers");
  if (!list || list->type != JSON_ARRAY)
    return step_error(w, p, FSDP_ERR_FORMAT, "a Sequence needs a \"pretokenizers\" array");
  size_t at = strlen(w->key);
  for (size_t i = 0; i < list->n; i++) {
    if (at + 40 > sizeof w->key) return step_error(w, p, FSDP_ERR_UNSUPPORTED, "nested too deep");
    snprintf(w->key + at, sizeof w->key - at, ".pretokenizers[%zu]", i);
    FSDP_TRY(pre_step(t, w, &list->items[i]));
    w->key[at] = '\0';
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t pre_step(struct fsdp_tokenizer *t, pre_walk_t *w, const json_t *p) {
  const char *type = json_str(p, "type");
  if (!type) return step_error(w, p, FSDP_ERR_FORMAT, "a pre-tokenizer needs a \"type\"");
  if (w->byte_level && strcmp(type, "Sequence"))
    return step_error(w, p, FSDP_ERR_UNSUPPORTED, "%s follows ByteLevel; fsdp reads ByteLevel "
                      "as the last step", type);
  if (!strcmp(type, "Sequence")) return sequence_step(t, w, p);
  if (!strcmp(type, "Split")) return split_step(t, w, p);
  if (!strcmp(type, "Digits")) /* Rust's char::is_numeric is \p{N} */
    return json_true(p, "individual_digits") ? add_step(t, w, "\\p{N}", 5, 0, p)
                                              : add_step(t, w, "\\p{N}+", 6, 0, p);
  if (!strcmp(type, "ByteLevel")) {
    const json_t *regex = json_get(p, "use_regex");
    if (json_true(p, "add_prefix_space"))
      return step_error(w, json_get(p, "add_prefix_space"), FSDP_ERR_UNSUPPORTED,
                        "add_prefix_space is true; fsdp encodes without it, as GPT-2 and "
                        "Llama 3 do");
    w->byte_level = 1;
    return regex && regex->type == JSON_BOOL && !regex->boolean ? FSDP_SUCCESS
                                                                : add_step(t, w, NULL, 0, 0, p);
  }
  if (!strcmp(type, "Metaspace"))
    return step_error(w, p, FSDP_ERR_UNSUPPORTED, "Metaspace: %s; fsdp reads byte-level BPE only",
                      sentencepiece);
  return step_error(w, p, FSDP_ERR_UNSUPPORTED, "type %s; fsdp reads ByteLevel, after Split "
                    "(Isolated) and Digits steps", type);
}

/* ---- normalizer ----------------------------------------------------------------
 * None, NFC (Qwen2's), or a Sequence of those: NFC twice is NFC. */

static fsdp_status_t norm_step(struct fsdp_tokenizer *t, pre_walk_t *w, const json_t *n) {
  const char *type = json_str(n, "type");
  if (!type) return step_error(w, n, FSDP_ERR_FORMAT, "a normalizer needs a \"type\"");
  if (!strcmp(type, "NFC")) return t->nfc = 1, FSDP_SUCCESS;
  if (strcmp(type, "Sequence"))
    return step_error(w, n, FSDP_ERR_UNSUPPORTED, "%s; fsdp reads tokenizers without a "
                      "normalizer or with NFC (Qwen2's)%s%s", type,
                      strcmp(type, "Prepend") && strcmp(type, "Replace") ? "" : "; this one is ",
                      strcmp(type, "Prepend") && strcmp(type, "Replace") ? "" : sentencepiece);
  const json_t *list = json_get(n, "normalizers");
  if (!list || list->type != JSON_ARRAY)
    return step_error(w, n, FSDP_ERR_FORMAT, "a Sequence needs a \"normalizers\" array");
  size_t at = strlen(w->key);
  for (size_t i = 0; i < list->n; i++) {
    if (at + 40 > sizeof w->key) return step_error(w, n, FSDP_ERR_UNSUPPORTED, "nested too deep");
    snprintf(w->key + at, sizeof w->key - at, ".normalizers[%zu]", i);
    FSDP_TRY(norm_step(t, w, &list->items[i]));
    w->key[at] = '\0';
  }
  return FSDP_SUCCESS;
}

/* normalizer (none or NFC) and pre_tokenizer (ending in ByteLevel). */
static fsdp_status_t check_pipeline(struct fsdp_tokenizer *t, const char *path,
                                    const json_t *root) {
  const json_t *norm = json_get(root, "normalizer"), *pre = json_get(root, "pre_tokenizer");
  if (norm && norm->type != JSON_NULL) {
    pre_walk_t n = {.path = path, .key = "normalizer"};
    FSDP_TRY(norm_step(t, &n, norm));
  }
  if (!pre || pre->type == JSON_NULL)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: pre_tokenizer is null: not a byte-level BPE "
                      "(those end in ByteLevel; %s has none)", path, sentencepiece);
  pre_walk_t w = {.path = path, .key = "pre_tokenizer"};
  FSDP_TRY(pre_step(t, &w, pre));
  if (!w.byte_level)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: pre_tokenizer has no ByteLevel step: "
                      "not a byte-level BPE", path, pre->line);
  return FSDP_SUCCESS;
}

/* ---- added tokens --------------------------------------------------------------
 * tokenizers ignores the ids written in added_tokens: it gives each token
 * model.vocab's id when the vocabulary has it (looked up by its spelling),
 * else the next id after model.vocab's and the added tokens before it, in
 * list order (Llama 3's 128000 ..). A file whose ids say otherwise would
 * encode differently here and there, so it is refused. A token marked
 * "normalized" (default: not special) is matched in the normalized text,
 * where tokenizers looks for its normalized spelling: with NFC, a token
 * whose spelling NFC changes is refused rather than matched differently. */

static fsdp_status_t check_nfc_spelling(const char *path, const json_t *a, const json_t *c) {
  char *buf = NULL;
  size_t cap = 0, len = 0;
  fsdp_status_t st = bpe_nfc(c->text, c->len, &buf, &cap, &len);
  int same = !st && len == c->len && !memcmp(buf, c->text, len);
  free(buf);
  FSDP_TRY(st);
  if (same) return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: added token \"%.64s\" is normalized but "
                    "not in NFC; fsdp matches normalized added tokens as they are spelled",
                    path, a->line, c->text);
}

static int spells_itself(const char *s, size_t n) { /* printable ASCII: spelling == bytes */
  for (size_t i = 0; i < n; i++)
    if (s[i] < 33 || s[i] > 126) return 0;
  return 1;
}

static fsdp_status_t added_one(struct fsdp_tokenizer *t, const char *path, const json_t *a) {
  const json_t *c = json_get(a, "content");
  int64_t id;
  if (!c || c->type != JSON_STRING || c->len == 0 || !json_int(json_get(a, "id"), &id) || id < 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: added_tokens: a token needs \"id\" (from 0) "
                      "and \"content\" (not empty)", path, a->line);
  static const char *const opts[] = {"lstrip", "rstrip", "single_word"};
  for (int i = 0; i < 3; i++)
    if (json_true(a, opts[i]))
      return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: line %d: added token \"%.64s\" has %s true; "
                        "fsdp matches added tokens exactly", path, a->line, c->text, opts[i]);
  int model = spells_itself(c->text, c->len) ? bpe_vocab_find(t, c->text, c->len) : -1;
  if (model < 0 && id >= t->n_model && id < t->n && /* a repeat of an earlier added token */
      t->off[id + 1] - t->off[id] == c->len && !memcmp(t->bytes + t->off[id], c->text, c->len))
    return FSDP_SUCCESS;
  const json_t *norm = json_get(a, "normalized");
  int special = json_true(a, "special");
  int normalized = norm && norm->type == JSON_BOOL ? norm->boolean : !special;
  if (normalized && t->nfc) FSDP_TRY(check_nfc_spelling(path, a, c));
  int want = model >= 0 ? model : t->n;
  if (id != want)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: added token \"%.64s\" has id %lld; "
                      "tokenizers reads it as id %d (%s)", path, a->line, c->text, (long long)id,
                      want, model >= 0 ? "model.vocab's token of that spelling"
                                       : "the next after model.vocab's and the added tokens "
                                         "before it");
  if (model < 0) { /* room was made by added_tokens */
    memcpy(t->bytes + t->off[t->n], c->text, c->len);
    t->off[t->n + 1] = t->off[t->n] + c->len;
    t->n++;
  }
  t->added[t->n_added++] = (bpe_added_t){want, special, normalized};
  return FSDP_SUCCESS;
}

static fsdp_status_t added_tokens(struct fsdp_tokenizer *t, const char *path, const json_t *list) {
  if (!list || list->type == JSON_NULL) return bpe_index_added(t, path);
  if (list->type != JSON_ARRAY)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: added_tokens must be an array", path,
                      list->line);
  if (list->n > (size_t)1 << 20)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: line %d: %zu added tokens (at most %d)", path,
                      list->line, list->n, 1 << 20);
  size_t extra = 0, n = list->n ? list->n : 1;
  for (size_t i = 0; i < list->n; i++) {
    const json_t *c = json_get(&list->items[i], "content");
    extra += c && c->type == JSON_STRING ? c->len : 0;
  }
  char *b = realloc(t->bytes, t->off[t->n] + extra + 1);
  if (b) t->bytes = b;
  size_t *off = b ? realloc(t->off, ((size_t)t->n + n + 1) * sizeof *off) : NULL;
  if (off) t->off = off;
  if (!off || !(t->added = malloc(n * sizeof *t->added)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  for (size_t i = 0; i < list->n; i++) FSDP_TRY(added_one(t, path, &list->items[i]));
  return bpe_index_added(t, path);
}

/* ---- the document token -------------------------------------------------------
 * "<|endoftext|>" (GPT-2's, and the models trained as GPT-2 was), else the
 * special token the post-processor puts first in a sequence (Llama 3's
 * <|begin_of_text|>): what fsdp-tokenize writes before every document. */

static int added_id(const struct fsdp_tokenizer *t, const char *s) {
  size_t n = strlen(s);
  for (int i = 0; i < t->n_added; i++) {
    int id = t->added[i].id;
    if (t->off[id + 1] - t->off[id] == n && !memcmp(t->bytes + t->off[id], s, n)) return id;
  }
  return -1;
}

/* TemplateProcessing's single template starting with a SpecialToken; a
 * Sequence of processors is searched in order. */
static const char *leading_special(const json_t *pp) {
  const char *type = json_str(pp, "type");
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_get(pp, "processors");
    for (size_t i = 0; list && list->type == JSON_ARRAY && i < list->n; i++) {
      const char *s = leading_special(&list->items[i]);
      if (s) return s;
    }
    return NULL;
  }
  const json_t *single = json_get(pp, "single");
  if (!type || strcmp(type, "TemplateProcessing") || !single || single->type != JSON_ARRAY ||
      single->n == 0)
    return NULL;
  return json_str(json_get(&single->items[0], "SpecialToken"), "id");
}

static void document_token(struct fsdp_tokenizer *t, const json_t *root) {
  if ((t->eot = added_id(t, "<|endoftext|>")) >= 0) return;
  if ((t->eot = bpe_vocab_find(t, "<|endoftext|>", 13)) >= 0) return;
  const char *bos = leading_special(json_get(root, "post_processor"));
  t->eot = bos ? added_id(t, bos) : -1;
}

static fsdp_status_t load_tokenizer_json(struct fsdp_tokenizer *t, const char *path) {
  json_t *root = NULL;
  FSDP_TRY(bpe_read_json(path, &root));
  const json_t *model = json_get(root, "model");
  fsdp_status_t st = check_model(t, path, model);
  if (!st) st = check_pipeline(t, path, root);
  if (!st) st = bpe_vocab_from_json(t, path, json_get(model, "vocab"));
  if (!st) st = merges_from_json(t, path, json_get(model, "merges"));
  if (!st) st = added_tokens(t, path, json_get(root, "added_tokens"));
  if (!st) document_token(t, root);
  json_free(root);
  return st;
}

/* ---- the front door: which format a path holds ---- */

static fsdp_status_t path_in(const char *dir, const char *name, char *out, size_t cap) {
  if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer: directory name too long: %s", dir);
  return FSDP_SUCCESS;
}

/* vocab.json + merges.txt in dir, else its tokenizer.json, or dir itself a
 * tokenizer.json. */
static fsdp_status_t load_files(struct fsdp_tokenizer *t, const char *dir) {
  char vocab[4096], merges[4096], single[4096];
  struct stat sb;
  FSDP_TRY(path_in(dir, "vocab.json", vocab, sizeof vocab));
  FSDP_TRY(path_in(dir, "merges.txt", merges, sizeof merges));
  FSDP_TRY(path_in(dir, "tokenizer.json", single, sizeof single));
  if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) return load_tokenizer_json(t, dir);
  if (stat(vocab, &sb) != 0 && stat(single, &sb) == 0) return load_tokenizer_json(t, single);
  return bpe_load_gpt2_files(t, vocab, merges);
}

fsdp_status_t fsdp_tokenizer_load(const char *dir, fsdp_tokenizer_t *out) {
  if (!dir || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokenizer load: dir and out must not be NULL");
  struct fsdp_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "tokenizer load: out of memory");
  fsdp_status_t st = load_files(t, dir);
  if (st) {
    fsdp_tokenizer_free(t);
    return st;
  }
  *out = t;
  return FSDP_SUCCESS;
}
