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

/* ---- torchprime's partition specs ---------------------------------------- */

/* torchprime's mesh axes, in CFG_AXIS_* bit order. */
static const char *const axis_names[CFG_AXES] = {"data", "fsdp", "tensor", "expert", "context"};
#define AXIS_LIST "data, fsdp, tensor, expert, context"

/* YAML's null as a plain scalar: null, Null, NULL, ~ or nothing. */
static int is_null(const yaml_node_t *n) {
  const char *v = scalar(n);
  return v && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         (!*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL"));
}

static int axis_bit(const char *v) {
  for (int a = 0; v && a < CFG_AXES; a++)
    if (!strcmp(v, axis_names[a])) return 1 << a;
  return 0;
}

/* What a node that is no dimension of a spec is, for a message. */
static void spec_why(const yaml_node_t *n, char *why, size_t cap) {
  const char *v = scalar(n);
  if (!v) snprintf(why, cap, "a %s", n->type == YAML_MAPPING_NODE ? "mapping" : "list");
  else if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE && !strcmp(v, "null"))
    snprintf(why, cap, "a quoted 'null' (the text; write null bare)");
  else snprintf(why, cap, "'%.*s%s'", ECHO(v));
}

/* One dimension of a spec: null (0), a mesh axis or a list of axes (their
 * bits); -1 when the node is none of these, with why (when not NULL) saying
 * what it is. */
static int spec_dim(yaml_document_t *d, const yaml_node_t *n, char *why, size_t cap) {
  if (is_null(n)) return 0;
  if (axis_bit(scalar(n))) return axis_bit(scalar(n));
  int bits = 0;
  const yaml_node_t *bad = n;
  for (yaml_node_item_t *i = n->type == YAML_SEQUENCE_NODE ? n->data.sequence.items.start : NULL;
       i && bad == n && i < n->data.sequence.items.top; i++) {
    const yaml_node_t *a = yaml_document_get_node(d, *i);
    if (!axis_bit(scalar(a))) bad = a;
    bits |= axis_bit(scalar(a));
  }
  if (bits && bad == n) return bits;
  if (why && bad == n && n->type == YAML_SEQUENCE_NODE) snprintf(why, cap, "an empty list");
  else if (why) spec_why(bad, why, cap);
  return -1;
}

/* 1 when every item of the sequence n is a dimension of a spec. */
static int looks_like_spec(yaml_document_t *d, const yaml_node_t *n) {
  for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top; i++)
    if (spec_dim(d, yaml_document_get_node(d, *i), NULL, 0) < 0) return 0;
  return n->data.sequence.items.top > n->data.sequence.items.start;
}

/* 1 when key is a flag of either tool (the file's own key, not a name). */
static int flag_key(const cfg_file_t *c, const char *key) {
  const cfg_keys_t *k = c->keys;
  char flag[80];
  if (strlen(key) + 3 <= sizeof flag) {
    snprintf(flag, sizeof flag, "--%s", key);
    if (flags_lookup(k->table, k->n, flag) || k->word(k->ctx, "", flag, NULL) == 1) return 1;
  }
  for (const char *const *s = k->skip; s && *s; s++)
    if (!strcmp(key, *s)) return 1;
  return !strcmp(key, "config") || !strcmp(key, "print-config");
}

/* The name and its [i] suffix: "model.layers.*[0]" is module pattern
 * "model.layers.*", output 0. The name's characters are those of tensor and
 * module names, so that it prints back as it came. */
static int spec_name(const char *tool, cfg_file_t *c, cfg_spec_t *s, const char *key) {
  size_t len = strlen(key);
  s->index = -1;
  if (len && key[len - 1] == ']') {
    const char *open = strrchr(key, '[');
    char *end = NULL;
    errno = 0;
    long i = open && open[1] >= '0' && open[1] <= '9' ? strtol(open + 1, &end, 10) : -1;
    if (i < 0 || errno || i > 1000000 || end != key + len - 1)
      return fail(tool, c, s->line, "'%.*s%s': an output index is [N], N a whole number "
                  "(model.layers.*[0])", ECHO(key));
    s->index = (int)i, len = (size_t)(open - key);
  }
  s->len = len;
  for (size_t i = 0; i < len; i++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.*-", key[i]))
      return fail(tool, c, s->line, "'%.*s%s' is not a tensor or module name (letters, digits, "
                  "'_', '-', '.' between parts, '*' for a part that is a whole number)",
                  ECHO(key));
  s->ntok = len ? 1 : 0;
  for (size_t i = 0; i < len; i++) s->ntok += key[i] == '.';
  return 0;
}

/* A top-level NAME: PARTITION_SPEC, torchprime's. What no shape of fsdp's can
 * follow is refused here; what depends on the model (a tensor's rank, the
 * batch dimension of an output) when the names meet the model. */
static int read_spec(const char *tool, cfg_file_t *c, yaml_document_t *d, yaml_node_t *kn,
                     yaml_node_t *vn) {
  const char *key = scalar(kn);
  char why[128];
  if (c->n_specs == CFG_MAX_RULES)
    return fail(tool, c, line_of(kn), "more than %d partition specs, the limit (docs/limits.md)",
                CFG_MAX_RULES);
  if (!c->specs && !(c->specs = calloc(CFG_MAX_RULES, sizeof *c->specs)))
    return fail(tool, c, line_of(kn), "out of memory");
  cfg_spec_t *s = &c->specs[c->n_specs++]; /* counted at once: cfg_free frees it */
  *s = (cfg_spec_t){.line = line_of(kn)};
  if (strlen(key) > CFG_MAX_VALUE)
    return fail(tool, c, s->line, "a name of %zu bytes ('%.*s...'): the limit is %d "
                "(docs/limits.md)", strlen(key), FLAGS_ECHO, key, CFG_MAX_VALUE);
  if (spec_name(tool, c, s, key)) return -1;
  if (!(s->name = strdup(key))) return fail(tool, c, s->line, "out of memory");
  size_t n = (size_t)(vn->data.sequence.items.top - vn->data.sequence.items.start);
  if (n == 0 || n > CFG_MAX_SPEC_DIMS)
    return fail(tool, c, line_of(vn), "%s: a partition spec of %zu entries: give one per "
                "dimension of the tensor or output (1 to %d), each null or a mesh axis", s->name,
                n, CFG_MAX_SPEC_DIMS);
  int sharded = -1;
  for (int k = 0; k < (int)n; k++) {
    const yaml_node_t *dn = yaml_document_get_node(d, vn->data.sequence.items.start[k]);
    int bits = spec_dim(d, dn, why, sizeof why);
    if (bits < 0)
      return fail(tool, c, line_of(dn), "%s: dimension %d: %s where null, a mesh axis (%s) or a "
                  "list of axes belongs", s->name, k, why, AXIS_LIST);
    for (int a = 0; a < CFG_AXES; a++)
      if (bits & (1 << a) & ~(CFG_AXIS_DATA | CFG_AXIS_FSDP))
        return fail(tool, c, line_of(dn), "%s: dimension %d on mesh axis '%s': 2-D sharding is "
                    "not supported (fsdp shards over the fsdp axis alone, batches over fsdp and "
                    "data)", s->name, k, axis_names[a]);
    if (bits && sharded >= 0)
      return fail(tool, c, line_of(dn), "%s: dimensions %d and %d both sharded: 2-D sharding "
                  "is not supported (fsdp on one dimension, null on the others)", s->name,
                  sharded, k);
    if (bits) sharded = k;
    s->axes[k] = (unsigned char)bits;
  }
  s->ndim = (int)n;
  if (sharded < 0)
    return fail(tool, c, line_of(vn), "%s: no dimension on a mesh axis replicates it, which fsdp "
                "never does (every parameter is sharded, every batch split): name fsdp on one "
                "dimension", s->name);
  s->dim = sharded;
  return 0;
}

/* Orders specs by the name they shard (without [i]), then by line. */
static int spec_order(const void *a, const void *b) {
  const cfg_spec_t *x = *(cfg_spec_t *const *)a, *y = *(cfg_spec_t *const *)b;
  int r = memcmp(x->name, y->name, x->len < y->len ? x->len : y->len);
  if (!r) r = (x->len > y->len) - (x->len < y->len);
  return r ? r : x->line - y->line;
}

/* Two specs for one name (a key given twice, or "a" beside "a[0]", as
 * torchprime refuses too): sorted, so that a file of many names stays fast. */
static int check_spec_names(const char *tool, cfg_file_t *c) {
  if (c->n_specs < 2) return 0;
  cfg_spec_t **order = malloc((size_t)c->n_specs * sizeof *order);
  if (!order) return fail(tool, c, 1, "out of memory");
  for (int i = 0; i < c->n_specs; i++) order[i] = &c->specs[i];
  qsort(order, (size_t)c->n_specs, sizeof *order, spec_order);
  int rc = 0;
  for (int i = 1; i < c->n_specs && !rc; i++) {
    const cfg_spec_t *a = order[i - 1], *b = order[i];
    if (a->len == b->len && !memcmp(a->name, b->name, a->len))
      rc = fail(tool, c, b->line, "%s given twice (first at line %d%s%s)", b->name, a->line,
                strcmp(a->name, b->name) ? ", as " : "", strcmp(a->name, b->name) ? a->name : "");
  }
  free(order);
  return rc;
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
    const char *key = scalar(kn);
    /* torchprime's NAME: [spec]; a flag's key with a list is a spec only
     * where the list reads as one ("model: [fsdp, null, null]") */
    int spec = key && vn->type == YAML_SEQUENCE_NODE && strcmp(key, "sharding") &&
               (!flag_key(c, key) || looks_like_spec(d, vn));
    int rc = key && !strcmp(key, "sharding") ? (c->rules ? fail(tool, c, line_of(kn),
             "sharding given twice") : read_sharding(tool, c, d, vn))
             : spec ? read_spec(tool, c, d, kn, vn) : read_entry(tool, c, kn, vn);
    if (rc) return -1;
  }
  return check_spec_names(tool, c);
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
  for (int i = 0; i < c->n_specs; i++) free(c->specs[i].name);
  free(c->entries);
  free(c->rules);
  free(c->specs);
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

int cfg_sharding_count(const cfg_file_t *c) { return c ? c->n_rules + c->n_specs : 0; }

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

/* torchprime's match: the first len bytes of pattern and name have the same
 * dot-separated parts, a '*' part standing for a whole number. */
static int spec_match(const char *p, size_t plen, const char *name, size_t nlen) {
  size_t i = 0, j = 0;
  while (i < plen && j < nlen) {
    size_t pe = i, ne = j;
    while (pe < plen && p[pe] != '.') pe++;
    while (ne < nlen && name[ne] != '.') ne++;
    int digits = ne > j;
    for (size_t k = j; k < ne; k++) digits &= name[k] >= '0' && name[k] <= '9';
    if (pe - i == 1 && p[i] == '*' ? !digits : pe - i != ne - j || memcmp(p + i, name + j, ne - j))
      return 0;
    i = pe + 1, j = ne + 1;
  }
  return i >= plen && j >= nlen && (i > plen) == (j > nlen);
}

/* Counts a spec's match once per name: a module's tensors come together, and
 * a module met again later ("model", before and after the layers) is the
 * first or the last one named. */
static void spec_hit(cfg_spec_t *s, int dom, const char *name, size_t len) {
  if (s->hits[dom] && ((strlen(s->last[dom]) == len && !strncmp(s->last[dom], name, len)) ||
                       (strlen(s->first[dom]) == len && !strncmp(s->first[dom], name, len))))
    return;
  if (!s->hits[dom]++) snprintf(s->first[dom], sizeof s->first[dom], "%.*s", (int)len, name);
  snprintf(s->last[dom], sizeof s->last[dom], "%.*s", (int)len, name);
}

/* The first spec naming the wrappable module `name` (its output: a unit
 * boundary), or -1. */
static int spec_wraps(cfg_file_t *c, const char *name) {
  for (int i = 0; i < c->n_specs; i++) {
    cfg_spec_t *s = &c->specs[i];
    if (spec_match(s->name, s->len, name, strlen(name))) return s->units++, i;
  }
  return -1;
}

/* A spec met a tensor (t) or the module the first len bytes of name make:
 * 0, or -1 with c->err saying why fsdp cannot follow it. */
static int spec_meets(cfg_file_t *c, cfg_spec_t *s, const fsdp_tensor_desc_t *t, const char *name,
                      size_t len) {
  char where[160];
  snprintf(where, sizeof where, "%s:%d: %s", c->path, s->line, s->name);
  spec_hit(s, t ? 0 : 1, name, len);
  if (t && s->index >= 0)
    return snprintf(c->err, sizeof c->err, "%s: [%d] picks one of a module's outputs, but "
                    "'%s' is a tensor", where, s->index, name), -1;
  if (t && s->ndim != t->ndim)
    return snprintf(c->err, sizeof c->err, "%s: %d entries, but tensor '%s' has %d dimensions: "
                    "give one per dimension", where, s->ndim, name, t->ndim), -1;
  if (t && s->axes[s->dim] != CFG_AXIS_FSDP)
    return snprintf(c->err, sizeof c->err, "%s: tensor '%s' on mesh axis data: a parameter is "
                    "sharded over fsdp alone (data splits the batch; --shard-size makes replica "
                    "groups)", where, name), -1;
  if (!t && s->index > 0)
    return snprintf(c->err, sizeof c->err, "%s: module '%.*s' returns one tensor: there is no "
                    "output [%d]", where, (int)len, name, s->index), -1;
  if (!t && s->ndim != c->out_ndim)
    return snprintf(c->err, sizeof c->err, "%s: %d entries, but the output of module '%.*s' has "
                    "%d dimensions (batch, sequence, hidden): give one per dimension", where,
                    s->ndim, (int)len, name, c->out_ndim), -1;
  if (!t && s->dim != 0)
    return snprintf(c->err, sizeof c->err, "%s: shards dimension %d of module '%.*s''s output, "
                    "not the batch (dimension 0): 2-D sharding is not supported", where, s->dim,
                    (int)len, name), -1;
  return 0;
}

/* The specs against one tensor and the modules it lies in (each prefix of
 * its name that ends before a '.', and "", the whole model): how many name
 * the tensor itself, or -1 with c->err saying why one cannot be followed. */
static int specs_meet(cfg_file_t *c, const fsdp_tensor_desc_t *t) {
  const char *name = t->name;
  size_t len = strlen(name);
  int parts = 1;
  for (size_t i = 0; i < len; i++) parts += name[i] == '.';
  int named = 0;
  for (int i = 0; i < c->n_specs; i++) {
    cfg_spec_t *s = &c->specs[i];
    if (s->ntok > parts) continue;
    size_t end = 0; /* the bytes of name's first ntok parts */
    for (int k = 0; k < s->ntok; k++) end += strcspn(name + end + (k > 0), ".") + (k > 0);
    int tensor = s->ntok == parts;
    if (!spec_match(s->name, s->len, name, end)) continue;
    if (spec_meets(c, s, tensor ? t : NULL, name, end)) return -1;
    named += tensor;
  }
  return named;
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
  int ck = ruled(c, RULE_CHECKPOINT, m[i].name, 1), sp = spec_wraps(c, m[i].name);
  if (w == -2 || g == -2 || ck == -2) return FSDP_WRAP_FAIL;
  if (sp >= 0 && (g >= 0 || (w >= 0 && !c->rules[w].val[RULE_WRAP]))) {
    int r = g >= 0 ? g : w;
    snprintf(c->err, sizeof c->err, "%s:%d: rule %d (match '%s') %s module '%s', but %s (line "
             "%d) shards its output, which makes it a unit of its own: the rules conflict",
             c->path, c->rules[r].line, r + 1, c->rules[r].match, g >= 0 ? "groups by size"
             : "sets wrap false on", m[i].name, c->specs[sp].name, c->specs[sp].line);
    return FSDP_WRAP_FAIL;
  }
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
  int wrap = w >= 0 ? c->rules[w].val[RULE_WRAP] != 0
             : sp >= 0 || in_kinds(c->wrap_kinds, m[i].kind);
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
    int named = specs_meet(c, &t[i]);
    if (lr == -2 || wd == -2 || named < 0) return FSDP_ERR_INVALID_ARGUMENT;
    for (const char *const *a = c->aliases; a && a[0]; a += 2) /* a tied head, by HF's name */
      if (!strcmp(a[1], t[i].name)) {
        fsdp_tensor_desc_t alias = t[i];
        alias.name = a[0];
        int also = specs_meet(c, &alias);
        if (also < 0) return FSDP_ERR_INVALID_ARGUMENT;
        named += also;
      }
    if (c->n_specs && !named) { /* torchprime would leave it to the compiler; fsdp shards it */
      if (!c->unnamed++) snprintf(c->unnamed_first, sizeof c->unnamed_first, "%s", t[i].name);
      snprintf(c->unnamed_last, sizeof c->unnamed_last, "%s", t[i].name);
    }
    c->mults[i] = lr >= 0 ? (float)c->rules[lr].val[RULE_LR] : 1.0f;
    c->mults[n + i] = wd >= 0 ? (float)c->rules[wd].val[RULE_WD] : 1.0f;
    any |= lr >= 0 || wd >= 0;
  }
  if (any) o->lr_mult = c->mults, o->wd_mult = c->mults + n;
  return FSDP_SUCCESS;
}

int cfg_check_matched(cfg_file_t *c, int domain) {
  for (int i = 0; domain == 2 && i < c->n_specs; i++) {
    const cfg_spec_t *s = &c->specs[i];
    if (s->hits[0] || s->hits[1]) continue;
    snprintf(c->err, sizeof c->err, "%s:%d: %s matches no tensor and no module, so its partition "
             "spec applies to nothing ('*' stands for a whole-number part: model.layers.*)",
             c->path, s->line, s->name);
    return -1;
  }
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

int cfg_model_opts(cfg_file_t *c, cfg_model_t *o, fsdp_plan_opts_t *plan, char *ckpt,
                   size_t ckpt_len) {
  int wrap_rule = -1, unit_rules = 0;
  ckpt[0] = '\0';
  c->out_ndim = o->out_ndim;
  c->aliases = o->aliases;
  for (int i = 0; i < c->n_specs; i++) { /* counted afresh for each model made */
    memset(c->specs[i].hits, 0, sizeof c->specs[i].hits);
    c->specs[i].units = 0;
  }
  c->unnamed = 0;
  for (int i = 0; i < c->n_rules; i++) {
    cfg_rule_t *r = &c->rules[i];
    memset(r->hits, 0, sizeof r->hits);
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
  if (c->n_specs && o->wrap_min_params) {
    snprintf(c->err, sizeof c->err, "%s:%d: the partition specs make a unit of each module whose "
             "output they shard, and --wrap-min-params %zu groups modules by size: give one "
             "policy (drop the flag, or use a rule's wrap_min_params without the module specs)",
             c->path, c->specs[0].line, o->wrap_min_params);
    return -1;
  }
  if (wrap_rule >= 0 || c->n_specs) {
    *plan = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
    c->wrap_kinds = o->wrap_kinds;
    plan->wrap_fn = wrap_fn;
    plan->wrap_user = c;
    plan->checkpoint_names = ckpt[0] ? ckpt : NULL;
    plan->checkpoint_kinds = ck ? o->checkpoint_kinds : NULL; /* beside specs alone */
    o->plan = plan;
  }
  if (unit_rules || wrap_rule >= 0 || c->n_specs) o->unit_opts = unit_opts, o->unit_opts_user = c;
  return 0;
}

int cfg_gpt2_opts(cfg_file_t *c, fsdp_gpt2_opts_t *o, fsdp_plan_opts_t *plan, char *ckpt,
                  size_t ckpt_len) {
  static const char *const tied[] = {"lm_head.weight", "wte", NULL}; /* the head is wte */
  cfg_model_t m = {o->wrap_kinds, o->wrap_min_params, o->checkpoint_kinds, 3, tied, o->plan,
                   o->unit_opts, o->unit_opts_user};
  if (cfg_model_opts(c, &m, plan, ckpt, ckpt_len)) return -1;
  o->plan = m.plan, o->unit_opts = m.unit_opts, o->unit_opts_user = m.unit_opts_user;
  return 0;
}

int cfg_llama_opts(cfg_file_t *c, fsdp_llama_opts_t *o, int tied, fsdp_plan_opts_t *plan,
                   char *ckpt, size_t ckpt_len) {
  static const char *const head[] = {"lm_head.weight", "model.embed_tokens.weight", NULL};
  cfg_model_t m = {o->wrap_kinds, o->wrap_min_params, o->checkpoint_kinds, 3, tied ? head : NULL,
                   o->plan, o->unit_opts, o->unit_opts_user};
  if (cfg_model_opts(c, &m, plan, ckpt, ckpt_len)) return -1;
  o->plan = m.plan, o->unit_opts = m.unit_opts, o->unit_opts_user = m.unit_opts_user;
  return 0;
}

/* ---- printing ------------------------------------------------------------ */

/* A spec's list as torchprime writes it: [[fsdp, data], null, null]. */
static void print_spec(FILE *out, const cfg_spec_t *s) {
  fputc('[', out);
  for (int k = 0; k < s->ndim; k++) {
    int n = 0;
    for (int a = 0; a < CFG_AXES; a++) n += (s->axes[k] >> a) & 1;
    fprintf(out, "%s%s", k ? ", " : "", !n ? "null" : n > 1 ? "[" : "");
    for (int a = 0, m = 0; a < CFG_AXES; a++) /* fsdp first, as torchprime writes [fsdp, data] */
      if (s->axes[k] & (1 << (a < 2 ? 1 - a : a)))
        fprintf(out, "%s%s", m++ ? ", " : "", axis_names[a < 2 ? 1 - a : a]);
    if (n > 1) fputc(']', out);
  }
  fputc(']', out);
}

void cfg_print_rules(FILE *out, const cfg_file_t *c) {
  for (int i = 0; i < c->n_specs; i++) {
    const cfg_spec_t *s = &c->specs[i];
    /* names hold [A-Za-z0-9_.*-] and a [i]: plain, unless it could read as
     * an alias ('*'), a list or nothing */
    int quote = !s->len || s->name[0] == '*' || s->name[0] == '-' || s->name[0] == '[';
    fprintf(out, quote ? "\"%s\": " : "%s: ", s->name);
    print_spec(out, s);
    fputc('\n', out);
  }
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
  for (int i = 0; i < c->n_specs; i++) {
    const cfg_spec_t *s = &c->specs[i];
    int d = s->hits[0] ? 0 : 1, n = s->hits[d];
    fprintf(out, s->len ? "  %s: " : "  \"%s\": ", s->name);
    print_spec(out, s);
    fprintf(out, " (%s:%d) -> %d %s%s (%s%s%s): ", c->path, s->line, n, d ? "module" : "tensor",
            n == 1 ? "" : "s", s->len ? s->first[d] : "the model", n > 1 ? " .. " : "",
            n > 1 ? s->last[d] : "");
    if (!d) fprintf(out, "sharded over fsdp (flat shards)\n");
    else
      fprintf(out, "batch over %s: data parallelism%s%s\n", s->axes[0] == CFG_AXIS_FSDP ? "fsdp"
              : s->axes[0] == CFG_AXIS_DATA ? "data" : "fsdp and data",
              s->units ? ", a unit each" : "", s->units && s->units < n ? " of the wrappable" : "");
  }
  if (c->unnamed)
    fprintf(out, "  %d tensor%s no spec names (%s%s%s): sharded over fsdp all the same (flat "
            "shards hold every parameter)\n", c->unnamed, c->unnamed == 1 ? "" : "s",
            c->unnamed_first, c->unnamed > 1 ? " .. " : "", c->unnamed > 1 ? c->unnamed_last : "");
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
