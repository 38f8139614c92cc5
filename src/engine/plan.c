/* src/engine/plan.c — wrap and checkpoint policies (fsdp/plan.h): from a
 * model's modules to units. Every policy is a wrap callback; the built-in ones
 * (kinds, names, min_params) are callbacks of this file. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/plan.h"

struct fsdp_plan {
  int n_modules, n_units;
  int *unit_of;            /* (n_modules) unit or -1 */
  fsdp_plan_unit_t *units; /* (n_units) */
  char **names;            /* (n_units) owned unit names */
  char **kinds;            /* (n_units) owned kinds */
};

int fsdp_pattern_match(const char *pattern, const char *name) {
  return pattern && name && fnmatch(pattern, name, 0) == 0;
}

/* A comma-separated list cut into its items (spaces around items dropped,
 * empty items skipped), each whole whatever its length, in one owned block:
 * the item pointers, then the text they point into. */
struct list {
  int n;
  char **item; /* (n) */
};

static fsdp_status_t list_split(const char *field, const char *text, struct list *out) {
  *out = (struct list){0, NULL};
  if (!text || !*text) return FSDP_SUCCESS;
  size_t len = strlen(text), max_items = 1;
  for (const char *c = text; *c; c++) max_items += *c == ',';
  char **item = malloc(max_items * sizeof *item + len + 1);
  if (!item)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of host memory for a list of %zu bytes",
                      field, len);
  char *buf = memcpy((char *)(item + max_items), text, len + 1);
  int n = 0;
  for (char *p = buf; *p;) {
    p += strspn(p, " ");
    size_t k = strcspn(p, ","), end = k;
    while (end > 0 && p[end - 1] == ' ') end--;
    int more = p[k] == ',';
    p[end] = '\0';
    if (end) item[n++] = p;
    p += k + more;
  }
  *out = (struct list){n, item};
  return FSDP_SUCCESS;
}

/* The four lists of a plan's options. */
struct lists {
  const fsdp_plan_opts_t *o;
  struct list wrap_kinds, wrap_names, ck_kinds, ck_names;
};

static void lists_free(const struct lists *l) {
  free(l->wrap_kinds.item);
  free(l->wrap_names.item);
  free(l->ck_kinds.item);
  free(l->ck_names.item);
}

static fsdp_status_t lists_split(const fsdp_plan_opts_t *o, struct lists *l) {
  *l = (struct lists){.o = o};
  fsdp_status_t st = list_split("wrap_kinds", o->wrap_kinds, &l->wrap_kinds);
  if (!st) st = list_split("wrap_names", o->wrap_names, &l->wrap_names);
  if (!st) st = list_split("checkpoint_kinds", o->checkpoint_kinds, &l->ck_kinds);
  if (!st) st = list_split("checkpoint_names", o->checkpoint_names, &l->ck_names);
  if (st) {
    lists_free(l);
    *l = (struct lists){.o = o};
  }
  return st;
}

static int item_matches(const char *item, const fsdp_module_t *m, int by_name) {
  const char *kind = m->kind ? m->kind : "";
  return by_name ? fsdp_pattern_match(item, m->name) : strcmp(item, kind) == 0;
}

static int in_list(const struct list *l, const fsdp_module_t *m, int by_name) {
  for (int i = 0; i < l->n; i++)
    if (item_matches(l->item[i], m, by_name)) return 1;
  return 0;
}

/* The first list item that no module matches, or NULL: an error, since it is
 * a typo or a policy written for another model. */
static const char *unmatched(const struct list *l, const fsdp_module_t *m, int n, int by_name) {
  for (int i = 0; i < l->n; i++) {
    int hit = 0;
    for (int j = 0; j < n && !hit; j++) hit = item_matches(l->item[i], &m[j], by_name);
    if (!hit) return l->item[i];
  }
  return NULL;
}

static fsdp_status_t check_list(const char *field, const struct list *l, const fsdp_module_t *m,
                                int n, int by_name) {
  const char *hit = unmatched(l, m, n, by_name);
  if (!hit) return FSDP_SUCCESS;
  char kinds[256] = "";
  for (int i = 0; i < n && !by_name; i++) {
    const char *k = m[i].kind ? m[i].kind : "";
    if (!strstr(kinds, k)) snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds),
                                    "%s%s", kinds[0] ? ", " : "", k);
  }
  if (by_name)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: pattern '%s' matches no module (the first "
                      "is '%s', the last '%s')", field, hit, n ? m[0].name : "none",
                      n ? m[n - 1].name : "none");
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: no module of kind '%s' (kinds here: %s)",
                    field, hit, kinds[0] ? kinds : "none");
}

static fsdp_wrap_t by_list(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  const struct lists *l = user;
  (void)n, (void)open;
  return in_list(&l->wrap_kinds, &m[i], 0) || in_list(&l->wrap_names, &m[i], 1) ? FSDP_WRAP_UNIT
                                                                                 : FSDP_WRAP_SKIP;
}

static fsdp_wrap_t by_size(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  const fsdp_plan_opts_t *o = ((const struct lists *)user)->o;
  (void)m, (void)n;
  return i > 0 && open > 0 && open < o->wrap_min_params ? FSDP_WRAP_JOIN : FSDP_WRAP_UNIT;
}

static fsdp_status_t pick_policy(const struct lists *l, const fsdp_module_t *m, int n,
                                 fsdp_wrap_fn *fn, void **user) {
  const fsdp_plan_opts_t *o = l->o;
  int lists = (o->wrap_kinds && *o->wrap_kinds) || (o->wrap_names && *o->wrap_names);
  if (lists + (o->wrap_min_params > 0) + (o->wrap_fn != NULL) > 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "wrap policy: give one of wrap_kinds/wrap_names, "
                      "wrap_min_params (%zu) and wrap_fn, not several", o->wrap_min_params);
  FSDP_TRY(check_list("wrap_kinds", &l->wrap_kinds, m, n, 0));
  FSDP_TRY(check_list("wrap_names", &l->wrap_names, m, n, 1));
  *fn = o->wrap_fn ? o->wrap_fn : lists ? by_list : o->wrap_min_params ? by_size : NULL;
  *user = o->wrap_fn ? o->wrap_user : (void *)l;
  return FSDP_SUCCESS;
}

/* Asks the policy about every module; fills unit_of and counts units. */
static fsdp_status_t assign(struct fsdp_plan *p, const fsdp_module_t *m, int n,
                            const struct lists *l) {
  const fsdp_plan_opts_t *o = l->o;
  fsdp_wrap_fn fn = NULL;
  void *user = NULL;
  FSDP_TRY(pick_policy(l, m, n, &fn, &user));
  size_t open = 0;
  for (int i = 0; i < n; i++) {
    fsdp_wrap_t w = fn ? fn(user, m, n, i, open) : FSDP_WRAP_SKIP;
    if (w == FSDP_WRAP_JOIN && (i == 0 || p->unit_of[i - 1] < 0))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "wrap policy: module '%s' joins the unit of "
                        "the module before it, but %s", m[i].name,
                        i ? "that one is in no unit" : "it is the first module");
    if (w == FSDP_WRAP_FAIL)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "wrap policy: the callback refused module "
                        "'%s'", m[i].name);
    if (w != FSDP_WRAP_SKIP && w != FSDP_WRAP_UNIT && w != FSDP_WRAP_JOIN)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "wrap policy: answer %d for module '%s' is not "
                        "FSDP_WRAP_SKIP, _UNIT, _JOIN or _FAIL", (int)w, m[i].name);
    if (w == FSDP_WRAP_UNIT) p->n_units++, open = 0;
    p->unit_of[i] = w == FSDP_WRAP_SKIP ? -1 : p->n_units - 1;
    open = w == FSDP_WRAP_SKIP ? 0 : open + m[i].numel;
  }
  /* the size policy leaves a tail below the minimum in the root */
  if (fn == by_size && n > 0 && open < o->wrap_min_params) {
    for (int i = n - 1; i >= 0 && p->unit_of[i] == p->n_units - 1; i--) p->unit_of[i] = -1;
    p->n_units--;
  }
  return FSDP_SUCCESS;
}

/* "h.0" + "h.3" -> "h.0-3"; otherwise "<first>-<last>". */
static char *unit_name(const char *a, const char *b) {
  const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
  size_t n = strlen(a) + strlen(b) + 2;
  char *s = malloc(n);
  if (!s) return NULL;
  int same = da && db && da - a == db - b && !strncmp(a, b, (size_t)(da - a)) &&
             da[1] && db[1] && strspn(da + 1, "0123456789") == strlen(da + 1) &&
             strspn(db + 1, "0123456789") == strlen(db + 1);
  if (same) snprintf(s, n, "%s-%s", a, db + 1);
  else snprintf(s, n, "%s-%s", a, b);
  return s;
}

static fsdp_status_t describe(struct fsdp_plan *p, const fsdp_module_t *m, int n,
                              const struct lists *l) {
  p->units = calloc((size_t)p->n_units + 1, sizeof *p->units);
  p->names = calloc((size_t)p->n_units + 1, sizeof *p->names);
  p->kinds = calloc((size_t)p->n_units + 1, sizeof *p->kinds);
  if (!p->units || !p->names || !p->kinds) goto oom;
  /* after the wrap callback, which may have its own words for these */
  FSDP_TRY(check_list("checkpoint_kinds", &l->ck_kinds, m, n, 0));
  FSDP_TRY(check_list("checkpoint_names", &l->ck_names, m, n, 1));
  for (int i = 0; i < n; i++) {
    int u = p->unit_of[i];
    int ck = in_list(&l->ck_kinds, &m[i], 0) || in_list(&l->ck_names, &m[i], 1);
    if (ck && u < 0)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "checkpoint: module '%s' (%s) is in no unit of "
                        "its own, and only a unit's activations can be recomputed: wrap it",
                        m[i].name, m[i].kind ? m[i].kind : "");
    if (u < 0) continue;
    fsdp_plan_unit_t *pu = &p->units[u];
    if (!pu->count) pu->first = i;
    pu->count++, pu->numel += m[i].numel;
    pu->checkpoint |= ck;
  }
  for (int u = 0; u < p->n_units; u++) {
    fsdp_plan_unit_t *pu = &p->units[u];
    const fsdp_module_t *a = &m[pu->first], *b = &m[pu->first + pu->count - 1];
    p->names[u] = pu->count == 1 ? fsdp_strdup(a->name) : unit_name(a->name, b->name);
    p->kinds[u] = fsdp_strdup(a->kind ? a->kind : "");
    if (!p->names[u] || !p->kinds[u]) goto oom;
    pu->name = p->names[u], pu->kind = p->kinds[u];
  }
  return FSDP_SUCCESS;
oom:
  return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "plan: out of host memory");
}

fsdp_status_t fsdp_plan_create(const fsdp_module_t *modules, int n, const fsdp_plan_opts_t *opts,
                               fsdp_plan_t *plan) {
  fsdp_plan_opts_t o = FSDP_PLAN_OPTS_INIT;
  if (!plan || n < 0 || (n > 0 && !modules))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_plan_create: modules (n %d) and plan "
                      "must be given", n);
  if (opts) FSDP_TRY(fsdp_opts_import(&o, opts, sizeof o, FSDP_PLAN_OPTS_MAGIC, "fsdp_plan_opts_t",
                                      "FSDP_PLAN_OPTS_INIT"));
  for (int i = 0; i < n; i++)
    if (!modules[i].name)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_plan_create: module %d has no name", i);
  struct fsdp_plan *p = calloc(1, sizeof *p);
  if (!p || !(p->unit_of = calloc((size_t)n + 1, sizeof *p->unit_of))) {
    free(p);
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "plan: out of host memory");
  }
  p->n_modules = n;
  struct lists l;
  fsdp_status_t st = lists_split(&o, &l);
  if (st == FSDP_SUCCESS) st = assign(p, modules, n, &l);
  if (st == FSDP_SUCCESS) st = describe(p, modules, n, &l);
  lists_free(&l);
  if (st != FSDP_SUCCESS) return fsdp_plan_destroy(p), st;
  *plan = p;
  return FSDP_SUCCESS;
}

void fsdp_plan_destroy(fsdp_plan_t p) {
  if (!p) return;
  for (int u = 0; u < p->n_units && p->names; u++) free(p->names[u]);
  for (int u = 0; u < p->n_units && p->kinds; u++) free(p->kinds[u]);
  free(p->names);
  free(p->kinds);
  free(p->units);
  free(p->unit_of);
  free(p);
}

int fsdp_plan_num_units(fsdp_plan_t p) { return p ? p->n_units : -1; }

int fsdp_plan_unit_of(fsdp_plan_t p, int module) {
  return p && module >= 0 && module < p->n_modules ? p->unit_of[module] : -1;
}

fsdp_status_t fsdp_plan_unit(fsdp_plan_t p, int u, fsdp_plan_unit_t *out) {
  if (!p || !out || u < 0 || u >= p->n_units)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_plan_unit: unit %d of a plan of %d", u,
                      p ? p->n_units : 0);
  *out = p->units[u];
  return FSDP_SUCCESS;
}
