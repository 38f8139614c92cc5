/* src/tools/config.c — the tools' YAML configuration file (config.h): reading
 * it with libyaml, applying its keys as flags, and its sharding rules as the
 * callbacks of GPT-2's wrap policy and per-unit options. */
#include "tools/config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* A text for a message: at most FLAGS_ECHO bytes, then "...". */
#define ECHO(s) FLAGS_ECHO, (s), strlen(s) > FLAGS_ECHO ? "..." : ""

static const char *const rule_keys[RULE_NKEYS] = {
    [RULE_WRAP] = "wrap", [RULE_MIN_PARAMS] = "wrap_min_params", [RULE_CHECKPOINT] = "checkpoint",
    [RULE_RESHARD] = "reshard_after_forward", [RULE_DTYPE] = "param_dtype",
    [RULE_LR] = "lr_mult", [RULE_WD] = "wd_mult"};
static const char *const domains[3] = {"module", "unit", "tensor"};
static int domain_of(int k) { return k <= RULE_CHECKPOINT ? 0 : k <= RULE_DTYPE ? 1 : 2; }

const char *cfg_path(int argc, char **argv, int *print) {
  const char *path = NULL;
  *print = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--print-config")) *print = 1;
    if (!strcmp(argv[i], "--config") && i + 1 < argc) path = argv[++i];
  }
  return path;
}

static int fail(const char *tool, const cfg_file_t *c, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: %s:%d: ", tool, c->path, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return -1;
}

static int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

static const char *scalar(const yaml_node_t *n) {
  return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A rule's value, checked for its key's type. */
static int rule_value(const char *tool, const cfg_file_t *c, int k, const yaml_node_t *vn,
                      double *out) {
  const char *v = scalar(vn);
  char *end = NULL;
  if (v && (k == RULE_WRAP || k == RULE_CHECKPOINT || k == RULE_RESHARD) &&
      (!strcmp(v, "true") || !strcmp(v, "false")))
    return *out = !strcmp(v, "true"), 0;
  if (v && k == RULE_DTYPE && (!strcmp(v, "f32") || !strcmp(v, "bf16")))
    return *out = !strcmp(v, "bf16") ? FSDP_BF16 : FSDP_F32, 0;
  errno = 0;
  double x = v ? strtod(v, &end) : 0;
  /* lr_mult and wd_mult become floats: 1e308 would be inf */
  int number = v && *v && !*end && !errno && x >= 0 && x <= FLT_MAX;
  /* wrap_min_params becomes a size_t; past 2^53 a double skips whole numbers */
  if (number && k == RULE_MIN_PARAMS && x >= 1 && x <= 9007199254740992.0 && x == floor(x))
    return *out = x, 0;
  if (number && (k == RULE_LR || k == RULE_WD)) return *out = x, 0;
  static const char *const want[RULE_NKEYS] = {
      "true or false", "a whole number from 1 to 2^53 (9007199254740992)", "true or false", "true or false", "f32 or bf16",
      "a number from 0 to 3.4e38 (a float)", "a number from 0 to 3.4e38 (a float)"};
  if (!v)
    return fail(tool, c, line_of(vn), "rule %d: %s: a %s is not %s", c->n_rules, rule_keys[k],
                vn->type == YAML_MAPPING_NODE ? "mapping" : "list", want[k]);
  return fail(tool, c, line_of(vn), "rule %d: %s: '%.*s%s' is not %s", c->n_rules, rule_keys[k],
              ECHO(v), want[k]);
}

static int read_rule(const char *tool, cfg_file_t *c, yaml_document_t *d, yaml_node_t *n) {
  /* counted at once, so that cfg_free frees what a failing rule holds */
  cfg_rule_t *r = &c->rules[c->n_rules++];
  *r = (cfg_rule_t){.line = line_of(n)};
  if (n->type != YAML_MAPPING_NODE)
    return fail(tool, c, line_of(n), "sharding: rule %d is not a mapping (match: PATTERN, then "
                "settings)", c->n_rules);
  for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
    yaml_node_t *kn = yaml_document_get_node(d, p->key), *vn = yaml_document_get_node(d, p->value);
    const char *key = scalar(kn);
    if (!key) /* else k stays 0 and the value silently sets wrap */
      return fail(tool, c, line_of(kn), "rule %d: a %s where a key belongs", c->n_rules,
                  kn->type == YAML_MAPPING_NODE ? "mapping" : "list");
    int k = 0;
    while (k < RULE_NKEYS && strcmp(key, rule_keys[k])) k++;
    if (k < RULE_NKEYS ? r->set[k] : !strcmp(key, "match") && r->match)
      return fail(tool, c, line_of(kn), "rule %d: %s given twice", c->n_rules, key);
    if (!strcmp(key, "match") && !scalar(vn))
      return fail(tool, c, line_of(vn), "rule %d: match: a %s where a pattern belongs",
                  c->n_rules, vn->type == YAML_MAPPING_NODE ? "mapping" : "list");
    if (!strcmp(key, "match") && strlen(scalar(vn)) > CFG_MAX_VALUE)
      return fail(tool, c, line_of(vn), "rule %d: match: a pattern of %zu bytes: the limit is %d "
                  "(docs/limits.md)", c->n_rules, strlen(scalar(vn)), CFG_MAX_VALUE);
    if (!strcmp(key, "match")) {
      if (!(r->match = strdup(scalar(vn)))) return fail(tool, c, line_of(kn), "out of memory");
      continue;
    }
    if (k == RULE_NKEYS)
      return fail(tool, c, line_of(kn), "rule %d: no such key '%.*s%s' (keys: match, wrap, "
                  "wrap_min_params, checkpoint, reshard_after_forward, param_dtype, lr_mult, "
                  "wd_mult)", c->n_rules, ECHO(key));
    if (rule_value(tool, c, k, vn, &r->val[k])) return -1;
    if (strlen(scalar(vn)) >= sizeof r->text[k])
      return fail(tool, c, line_of(vn), "rule %d: %s: '%.*s%s' is too long", c->n_rules,
                  rule_keys[k], ECHO(scalar(vn)));
    snprintf(r->text[k], sizeof r->text[k], "%s", scalar(vn));
    r->set[k] = 1;
  }
  if (!r->match)
    return fail(tool, c, r->line, "rule %d: no 'match: PATTERN' (a string)", c->n_rules);
  if (r->set[RULE_WRAP] && r->set[RULE_MIN_PARAMS])
    return fail(tool, c, r->line, "rule %d (match '%s'): wrap and wrap_min_params are two "
                "policies: give one", c->n_rules, r->match);
  if (r->set[RULE_CHECKPOINT] && r->val[RULE_CHECKPOINT] && strchr(r->match, ','))
    return fail(tool, c, r->line, "rule %d (match '%s'): checkpoint: a pattern with ',' "
                "(the checkpointed patterns travel as one comma-separated list)", c->n_rules,
                r->match);
  return 0;
}

static int read_sharding(const char *tool, cfg_file_t *c, yaml_document_t *d, yaml_node_t *n) {
  if (n->type != YAML_SEQUENCE_NODE)
    return fail(tool, c, line_of(n), "sharding: not a list of rules (- match: PATTERN ...)");
  size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
  if (count > CFG_MAX_RULES) /* planning matches every rule against every name */
    return fail(tool, c, line_of(n), "sharding: %zu rules; the limit is %d (docs/limits.md)",
                count, CFG_MAX_RULES);
  if (!(c->rules = calloc(count + 1, sizeof *c->rules)))
    return fail(tool, c, line_of(n), "out of memory");
  for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top; i++)
    if (read_rule(tool, c, d, yaml_document_get_node(d, *i))) return -1;
  return 0;
}

/* 1 when the tool takes key, 0 when it skips it (one of the other tool's),
 * -1 after printing why it is refused. */
static int key_taken(const char *tool, const cfg_file_t *c, const char *key, int line) {
  const cfg_keys_t *k = c->keys;
  char flag[80];
  if (!strcmp(key, "config") || !strcmp(key, "print-config"))
    return fail(tool, c, line, "'%s' is not a key of a configuration file", key);
  if (strlen(key) + 3 <= sizeof flag) {
    snprintf(flag, sizeof flag, "--%s", key);
    if (flags_lookup(k->table, k->n, flag) || k->word(k->ctx, tool, flag, NULL) == 1) return 1;
  }
  for (const char *const *s = k->skip; s && *s; s++)
    if (!strcmp(key, *s)) {
      if (cfg_launch_rank() == 0)
        fprintf(stderr, "%s: %s:%d: skipping '%s': a key of %s that %s has no use for\n", tool,
                c->path, line, key, k->skip_owner, tool);
      return 0;
    }
  return fail(tool, c, line, "unknown key '%.*s%s' (see --help)", ECHO(key));
}

static int read_entry(const char *tool, cfg_file_t *c, yaml_node_t *kn, yaml_node_t *vn) {
  const char *key = scalar(kn), *v = scalar(vn);
  if (!key)
    return fail(tool, c, line_of(kn), "a %s where a key belongs",
                kn->type == YAML_MAPPING_NODE ? "mapping" : "list");
  int taken = key_taken(tool, c, key, line_of(kn));
  if (taken < 0) return -1;
  /* Only keys the tools take get here, each once: this scan is over a few
   * dozen entries at most, whatever the file holds. */
  for (int i = 0; i < c->n_entries; i++)
    if (!strcmp(c->entries[i].key, key))
      return fail(tool, c, line_of(kn), "%s given twice (first at line %d)", key,
                  c->entries[i].line);
  if (!v)
    return fail(tool, c, line_of(vn), "%s: a %s where a single value belongs", key,
                vn->type == YAML_MAPPING_NODE ? "mapping" : "list");
  if (strlen(v) > CFG_MAX_VALUE)
    return fail(tool, c, line_of(vn), "%s: a value of %zu bytes ('%.*s...'): the limit is %d "
                "(docs/limits.md)", key, strlen(v), FLAGS_ECHO, v, CFG_MAX_VALUE);
  cfg_entry_t *e = &c->entries[c->n_entries++]; /* counted at once: cfg_free frees it */
  *e = (cfg_entry_t){strdup(key), strdup(v), line_of(kn), !taken};
  if (!e->key || !e->value) return fail(tool, c, e->line, "out of memory");
  return 0;
}

static int read_root(const char *tool, cfg_file_t *c, yaml_document_t *d) {
  yaml_node_t *root = yaml_document_get_root_node(d);
  if (!root) /* an empty file is more likely a mistake than a wish for the defaults */
    return fail(tool, c, 1, "no keys: the file is empty (leave --config out for the defaults)");
  if (root->type != YAML_MAPPING_NODE)
    return fail(tool, c, line_of(root), "the file is not a mapping of keys (key: value)");
  size_t n = (size_t)(root->data.mapping.pairs.top - root->data.mapping.pairs.start);
  if (!(c->entries = calloc(n + 1, sizeof *c->entries)))
    return fail(tool, c, 1, "out of memory");
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
       p++) {
    yaml_node_t *kn = yaml_document_get_node(d, p->key), *vn = yaml_document_get_node(d, p->value);
    int rc = scalar(kn) && !strcmp(scalar(kn), "sharding") ? (c->rules ? fail(tool, c,
             line_of(kn), "sharding given twice") : read_sharding(tool, c, d, vn))
                                                        : read_entry(tool, c, kn, vn);
    if (rc) return -1;
  }
  return 0;
}

/* The file, whole, in *text: at most CFG_MAX_BYTES (a pipe too). */
static int read_file(const char *tool, cfg_file_t *c, FILE *f, char **text, size_t *len) {
  size_t cap = 4096;
  *len = 0;
  for (;;) {
    char *grown = realloc(*text, cap);
    if (!grown) return fail(tool, c, 1, "out of memory");
    *text = grown;
    *len += fread(*text + *len, 1, cap - *len, f);
    if (*len < cap || cap > CFG_MAX_BYTES) break;
    cap = cap * 2 > CFG_MAX_BYTES ? CFG_MAX_BYTES + 1 : cap * 2;
  }
  if (ferror(f)) return fail(tool, c, 1, "cannot read: %s", strerror(errno));
  if (*len > CFG_MAX_BYTES)
    return fail(tool, c, 1, "larger than %d bytes, the limit for a configuration file "
                "(docs/limits.md)", CFG_MAX_BYTES);
  return 0;
}

/* libyaml's loader takes time quadratic in the nesting (200,000 '[' in 400 KB
 * took a minute): a first pass over the events stops at CFG_MAX_DEPTH, long
 * before that. Syntax errors are left to the loader, which says more. */
static int check_depth(const char *tool, cfg_file_t *c, const char *text, size_t len) {
  yaml_parser_t p;
  yaml_event_t e;
  int depth = 0, rc = 0, end = 0;
  if (!yaml_parser_initialize(&p)) return fail(tool, c, 1, "out of memory");
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  while (!rc && !end && yaml_parser_parse(&p, &e)) {
    depth += e.type == YAML_SEQUENCE_START_EVENT || e.type == YAML_MAPPING_START_EVENT;
    depth -= e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_MAPPING_END_EVENT;
    if (depth > CFG_MAX_DEPTH)
      rc = fail(tool, c, (int)e.start_mark.line + 1, "nested deeper than %d levels, the limit "
                "(a configuration needs 3: keys, sharding's list, a rule's keys)", CFG_MAX_DEPTH);
    end = e.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&e);
  }
  yaml_parser_delete(&p);
  return rc;
}

static int load_text(const char *tool, cfg_file_t *c, const char *text, size_t len) {
  yaml_parser_t p;
  yaml_document_t d;
  int rc = -1;
  if (!yaml_parser_initialize(&p)) return fail(tool, c, 1, "out of memory");
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  if (!yaml_parser_load(&p, &d)) {
    if (p.context)
      fail(tool, c, (int)p.problem_mark.line + 1, "not YAML: %s %s at line %d", p.problem,
           p.context, (int)p.context_mark.line + 1);
    else
      fail(tool, c, (int)p.problem_mark.line + 1, "not YAML: %s", p.problem);
  } else {
    rc = read_root(tool, c, &d);
    yaml_document_delete(&d);
    if (rc == 0 && yaml_parser_load(&p, &d)) { /* a second document would be ignored */
      if (yaml_document_get_root_node(&d))
        rc = fail(tool, c, (int)d.start_mark.line + 1, "a second document ('---'): one "
                  "configuration per file");
      yaml_document_delete(&d);
    }
  }
  yaml_parser_delete(&p);
  return rc;
}

int cfg_load(const char *tool, const char *path, const cfg_keys_t *keys, cfg_file_t *c) {
  *c = (cfg_file_t){.path = strdup(path), .keys = keys};
  if (!c->path) return fprintf(stderr, "%s: --config %s: out of memory\n", tool, path), -1;
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "%s: --config %s: %s\n", tool, path, strerror(errno)), -1;
  char *text = NULL;
  size_t len = 0;
  int rc = read_file(tool, c, f, &text, &len);
  fclose(f);
  if (!rc) rc = check_depth(tool, c, text, len);
  if (!rc) rc = load_text(tool, c, text, len);
  free(text);
  c->keys = NULL; /* the tool's, valid during the load only */
  return rc;
}

void cfg_free(cfg_file_t *c) {
  for (int i = 0; i < c->n_entries; i++) free(c->entries[i].key), free(c->entries[i].value);
  for (int i = 0; i < c->n_rules; i++) free(c->rules[i].match);
  free(c->entries);
  free(c->rules);
  free(c->mults);
  free(c->path);
  *c = (cfg_file_t){0};
}

int cfg_apply(const char *tool, const cfg_file_t *c, const flag_t *table, size_t n,
              flag_word_fn word, void *ctx) {
  for (int i = 0; i < c->n_entries; i++) {
    char flag[96], label[512];
    if (c->entries[i].skipped) continue;
    snprintf(flag, sizeof flag, "--%s", c->entries[i].key);
    snprintf(label, sizeof label, "%s: %s:%d", tool, c->path, c->entries[i].line);
    if (flags_apply(label, table, n, word, ctx, flag, c->entries[i].value, 1)) return -1;
  }
  return 0;
}

const char *const cfg_train_only[] = {
    "data", "layers", "heads", "embd", "context", "vocab", "global-batch", "accumulate-full",
    "optim", "lr", "momentum", "wd", "clip", "schedule", "min-lr-ratio", "loss-scale",
    "loss-scale-interval", "max-skips", "steps", "epochs", "eval-every", "eval-batches",
    "log-every", "sample", "temperature", "save-dir", "save-every", "save-overwrite", "resume",
    "stop-after", NULL};
const char *const cfg_bench_only[] = {
    "micro-batch", "iters", "rounds", "check", "peak-size", "trace", "json-file", "sweep",
    "sweep-strategies", "sweep-prefetch", "sweep-shard-sizes", "memory-plan", "kernel-profile",
    NULL};

int cfg_launch_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return 0;
}

int cfg_parse_args(const char *tool, const char *usage, int argc, char **argv,
                   const cfg_keys_t *keys, cfg_file_t *file, cfg_file_t **loaded) {
  int print;
  const char *path = cfg_path(argc, argv, &print);
  if (path && (cfg_load(tool, path, keys, file) ||
               cfg_apply(tool, file, keys->table, keys->n, keys->word, keys->ctx)))
    return -1;
  if (path) *loaded = file;
  return flags_parse(tool, usage, argc, argv, keys->table, keys->n, keys->word, keys->ctx);
}

/* ---- rules at planning time ---------------------------------------------- */

/* Counts a match once per name, though several keys of a rule may ask. */
static void hit(cfg_rule_t *r, int dom, const char *name) {
  if (r->hits[dom] && !strcmp(r->last[dom], name)) return;
  if (!r->hits[dom]++) snprintf(r->first[dom], sizeof r->first[dom], "%s", name);
  snprintf(r->last[dom], sizeof r->last[dom], "%s", name);
}

/* The value rules give key k on `name`: the first rule that sets it, checked
 * against every other. Returns the rule index, -1 when none, -2 on a
 * conflict (c->err says which). */
static int ruled(cfg_file_t *c, int k, const char *name, int count) {
  int found = -1;
  for (int i = 0; i < c->n_rules; i++) {
    cfg_rule_t *r = &c->rules[i];
    if (!r->set[k] || !fsdp_pattern_match(r->match, name)) continue;
    if (count) hit(r, domain_of(k), name);
    if (found >= 0 && c->rules[found].val[k] != r->val[k]) {
      snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') sets %s %s on %s '%s', but "
               "rule %d (line %d, match '%s') sets %s: the rules conflict", c->path, r->line,
               i + 1, r->match, rule_keys[k], r->text[k], domains[domain_of(k)], name, found + 1,
               c->rules[found].line, c->rules[found].match, c->rules[found].text[k]);
      return -2;
    }
    if (found < 0) found = i;
  }
  return found;
}

/* The first item of the --wrap kinds list equal to kind. */
static int in_kinds(const char *list, const char *kind) {
  char item[128];
  for (const char *p = list; p && *p && kind;) {
    size_t len = strcspn(p, ",");
    snprintf(item, sizeof item, "%.*s", (int)len, p);
    if (!strcmp(item, kind)) return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* The plan's wrap callback: wrap and wrap_min_params rules, else --wrap's
 * kinds; and the place where module rules are checked for conflicts. */
static fsdp_wrap_t wrap_fn(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  cfg_file_t *c = user;
  int w = ruled(c, RULE_WRAP, m[i].name, 1), g = ruled(c, RULE_MIN_PARAMS, m[i].name, 1);
  int ck = ruled(c, RULE_CHECKPOINT, m[i].name, 1);
  if (w == -2 || g == -2 || ck == -2) return FSDP_WRAP_FAIL;
  if (w >= 0 && g >= 0) {
    snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') groups module '%s' by size, but "
             "rule %d (line %d, match '%s') wraps it: the rules conflict", c->path,
             c->rules[g].line, g + 1, c->rules[g].match, m[i].name, w + 1, c->rules[w].line,
             c->rules[w].match);
    return FSDP_WRAP_FAIL;
  }
  if (i == n - 1 && cfg_check_matched(c, 0)) return FSDP_WRAP_FAIL;
  int was = i > 0 ? c->prev_rule : -1;
  c->prev_rule = g;
  if (g >= 0)
    return was == g && open > 0 && open < (size_t)c->rules[g].val[RULE_MIN_PARAMS]
               ? FSDP_WRAP_JOIN : FSDP_WRAP_UNIT;
  int wrap = w >= 0 ? c->rules[w].val[RULE_WRAP] != 0 : in_kinds(c->wrap_kinds, m[i].kind);
  if (!wrap && ck >= 0 && c->rules[ck].val[RULE_CHECKPOINT]) {
    snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') checkpoints module '%s', which "
             "no rule or --wrap puts in a unit of its own: only a unit's activations can be "
             "recomputed", c->path, c->rules[ck].line, ck + 1, c->rules[ck].match, m[i].name);
    return FSDP_WRAP_FAIL;
  }
  return wrap ? FSDP_WRAP_UNIT : FSDP_WRAP_SKIP;
}

static fsdp_status_t unit_opts(void *user, const char *unit, const char *kind,
                               const fsdp_tensor_desc_t *t, int n, fsdp_unit_opts_t *o) {
  cfg_file_t *c = user;
  (void)kind;
  int rs = ruled(c, RULE_RESHARD, unit, 1), dt = ruled(c, RULE_DTYPE, unit, 1);
  if (rs == -2 || dt == -2) return FSDP_ERR_INVALID_ARGUMENT;
  if (rs >= 0) o->reshard_after_forward = (int)c->rules[rs].val[RULE_RESHARD];
  if (dt >= 0) o->param_dtype = (fsdp_dtype_t)c->rules[dt].val[RULE_DTYPE];
  if (n * 2 > c->n_mults) {
    float *m = realloc(c->mults, (size_t)n * 2 * sizeof *m);
    if (!m) return snprintf(c->err, sizeof c->err, "out of memory"), FSDP_ERR_OUT_OF_MEMORY;
    c->mults = m, c->n_mults = n * 2;
  }
  int any = 0;
  for (int i = 0; i < n; i++) {
    int lr = ruled(c, RULE_LR, t[i].name, 1), wd = ruled(c, RULE_WD, t[i].name, 1);
    if (lr == -2 || wd == -2) return FSDP_ERR_INVALID_ARGUMENT;
    c->mults[i] = lr >= 0 ? (float)c->rules[lr].val[RULE_LR] : 1.0f;
    c->mults[n + i] = wd >= 0 ? (float)c->rules[wd].val[RULE_WD] : 1.0f;
    any |= lr >= 0 || wd >= 0;
  }
  if (any) o->lr_mult = c->mults, o->wd_mult = c->mults + n;
  return FSDP_SUCCESS;
}

int cfg_check_matched(cfg_file_t *c, int domain) {
  for (int i = 0; i < c->n_rules; i++)
    for (int k = 0; k < RULE_NKEYS; k++) {
      cfg_rule_t *r = &c->rules[i];
      if (!r->set[k] || domain_of(k) != domain || r->hits[domain]) continue;
      snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') matches no %s, so its %s "
               "applies to nothing", c->path, r->line, i + 1, r->match, domains[domain_of(k)],
               rule_keys[k]);
      return -1;
    }
  return 0;
}

int cfg_gpt2_opts(cfg_file_t *c, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan, char *ckpt,
                  size_t ckpt_len) {
  int wrap_rule = -1, unit_rules = 0;
  ckpt[0] = '\0';
  for (int i = 0; i < c->n_rules; i++) {
    cfg_rule_t *r = &c->rules[i];
    memset(r->hits, 0, sizeof r->hits); /* counted afresh for each model made */
    if (wrap_rule < 0 && (r->set[RULE_WRAP] || r->set[RULE_MIN_PARAMS] || r->set[RULE_CHECKPOINT]))
      wrap_rule = i;
    unit_rules |= r->set[RULE_RESHARD] || r->set[RULE_DTYPE] || r->set[RULE_LR] || r->set[RULE_WD];
    size_t used = strlen(ckpt);
    if (r->set[RULE_CHECKPOINT] && r->val[RULE_CHECKPOINT] &&
        (size_t)snprintf(ckpt + used, ckpt_len - used, "%s%s", used ? "," : "", r->match) >=
            ckpt_len - used) { /* a cut pattern would checkpoint other units */
      snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%.64s'): the checkpoint rules' "
               "patterns come to more than %zu bytes, the limit: give fewer, or a pattern "
               "covering several", c->path, r->line, i + 1, r->match, ckpt_len - 1);
      return -1;
    }
  }
  int ck = o->checkpoint_kinds && *o->checkpoint_kinds;
  if (wrap_rule >= 0 && (o->wrap_min_params || ck)) {
    const cfg_rule_t *r = &c->rules[wrap_rule];
    char flag[160];
    if (o->wrap_min_params) snprintf(flag, sizeof flag, "--wrap-min-params %zu", o->wrap_min_params);
    else snprintf(flag, sizeof flag, "--checkpoint %.*s%s", ECHO(o->checkpoint_kinds));
    snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') chooses the units and their "
             "checkpointing, and so does %s: give one policy (drop the flag, or say it in the "
             "rules)", c->path, r->line, wrap_rule + 1, r->match, flag);
    return -1;
  }
  if (wrap_rule >= 0) {
    *plan = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
    c->wrap_kinds = o->wrap_kinds;
    plan->wrap_fn = wrap_fn;
    plan->wrap_user = c;
    plan->checkpoint_names = ckpt[0] ? ckpt : NULL;
    o->plan = plan;
  }
  if (unit_rules || wrap_rule >= 0) o->unit_opts = unit_opts, o->unit_opts_user = c;
  return 0;
}

/* ---- printing ------------------------------------------------------------ */

void cfg_print_rules(FILE *out, const cfg_file_t *c) {
  if (!c->n_rules) return;
  fprintf(out, "sharding:\n");
  for (int i = 0; i < c->n_rules; i++) {
    const cfg_rule_t *r = &c->rules[i];
    fprintf(out, "  - ");
    flags_print_str(out, "match", r->match);
    for (int k = 0; k < RULE_NKEYS; k++) {
      if (!r->set[k]) continue;
      fprintf(out, "    %s: %s\n", rule_keys[k], r->text[k]);
    }
  }
}

void cfg_print_matches(FILE *out, const cfg_file_t *c) {
  for (int i = 0; i < c->n_rules; i++) {
    const cfg_rule_t *r = &c->rules[i];
    fprintf(out, "  rule %d (%s:%d, match '%s'):", i + 1, c->path, r->line, r->match);
    for (int k = 0; k < RULE_NKEYS; k++) {
      if (!r->set[k]) continue;
      int d = domain_of(k);
      fprintf(out, " %s %s", rule_keys[k], r->text[k]);
      fprintf(out, " -> %d %s%s (%s%s%s)", r->hits[d], domains[d], r->hits[d] == 1 ? "" : "s",
              r->first[d], r->hits[d] > 1 ? " .. " : "", r->hits[d] > 1 ? r->last[d] : "");
      fputc(';', out);
    }
    fputc('\n', out);
  }
}
