/* src/engine/consistency.c — the start-up consistency check
 * (fsdp_engine_check_consistency, engine.h): every rank writes what must
 * agree — the caller's settings, then the engine's resolved configuration and
 * unit plan — as "key\tvalue" lines, and the ranks compare a hash of them in
 * one fixed-size all-gather. Only on a mismatch do they all-gather the texts
 * themselves (padded to the longest, so the exchange still matches in size)
 * and name the first differing key with every rank's value. Both exchanges
 * have the same size on every rank whatever the ranks were started with, so
 * the check itself can never hang or overrun a buffer; and a rank whose own
 * part fails (bad arguments, no memory) still takes part in each, saying
 * so, so that every rank fails at once with its reason instead of the
 * others waiting for it until the deadline. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

#define TEXT_MAX 512 /* longest key or value a message shows, NUL included */

typedef struct {
  char *text;
  size_t len, cap;
} text_t;

static int put(text_t *t, const char *key, const char *value) {
  size_t need = strlen(key) + strlen(value ? value : "(unset)") + 3;
  if (t->len + need > t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 4096;
    while (cap < t->len + need) cap *= 2;
    char *grown = realloc(t->text, cap);
    if (!grown) return -1;
    t->text = grown;
    t->cap = cap;
  }
  char *p = t->text + t->len;
  int k = snprintf(p, t->cap - t->len, "%s\t%s\n", key, value ? value : "(unset)");
  /* A value is one line: a newline or tab inside one would shift the keys. */
  for (int i = (int)strlen(key) + 1; i < k - 1; i++)
    if (p[i] == '\n' || p[i] == '\t') p[i] = ' ';
  t->len += (size_t)k;
  return 0;
}

static int putf(text_t *t, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int putf(text_t *t, const char *key, const char *fmt, ...) {
  char value[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  return put(t, key, value);
}

/* The resolved configuration: everything that changes what the ranks compute
 * or which collectives they issue. */
static int put_config(text_t *t, const fsdp_config_t *c) {
  const fsdp_optim_config_t *o = &c->optim;
  const fsdp_schedule_t *s = &c->schedule;
  return putf(t, "engine.strategy", "%s", fsdp_strategy_name(c->strategy)) ||
         putf(t, "engine.prefetch_depth", "%d", c->prefetch_depth) ||
         putf(t, "engine.max_live_units", "%d", c->max_live_units) ||
         putf(t, "engine.grad_accum", "%d", c->grad_accum) ||
         putf(t, "engine.accumulate_full_grads", "%d", c->accumulate_full_grads) ||
         putf(t, "engine.grad_reduce", "%d", (int)c->grad_reduce) ||
         putf(t, "engine.param_dtype", "%s", fsdp_dtype_name(c->param_dtype)) ||
         putf(t, "engine.reduce_dtype", "%s", fsdp_dtype_name(c->reduce_dtype)) ||
         putf(t, "engine.align", "%zu", c->align) ||
         putf(t, "engine.device", "%s", c->device == FSDP_DEVICE_CUDA ? "cuda" : "cpu") ||
         putf(t, "engine.comm_backend", "%s", c->comm_backend ? c->comm_backend : "world") ||
         putf(t, "engine.optim", "kind %d lr %.9g betas %.9g %.9g eps %.9g wd %.9g momentum "
              "%.9g nesterov %d clip %.9g", (int)o->kind, (double)o->lr, (double)o->beta1,
              (double)o->beta2, (double)o->eps, (double)o->weight_decay, (double)o->momentum,
              o->nesterov, (double)o->max_grad_norm) ||
         putf(t, "engine.schedule", "kind %d warmup %" PRId64 " total %" PRId64 " min_lr_ratio "
              "%.9g", (int)s->kind, s->warmup_steps, s->total_steps, (double)s->min_lr_ratio) ||
         putf(t, "engine.max_consecutive_skips", "%d", c->max_consecutive_skips) ||
         putf(t, "engine.loss_scale", "init %.17g growth %.17g backoff %.17g interval %d",
              c->loss_scale_init, c->loss_scale_growth, c->loss_scale_backoff,
              c->loss_scale_interval) ||
         putf(t, "engine.shard_size", "%d", c->shard_size);
}

/* Every unit and tensor, with shapes: the model each rank built. */
static int put_plan(text_t *t, const struct fsdp_engine *e) {
  /* No count line first: a rank that lacks a unit then differs at that unit,
   * which the message names. */
  for (int u = 0; u < e->plan.n_units; u++) {
    const struct unit *un = &e->plan.units[u];
    char key[64];
    /* Tensors before the unit's summary: a difference then names the tensor
     * and both shapes, not just two parameter counts. */
    for (int i = 0; i < un->n_tensors; i++) {
      const struct tensor *x = &un->tensors[i];
      char shape[160] = "";
      size_t used = 0;
      for (int d = 0; d < x->ndim && used < sizeof shape; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%" PRId64, d ? "x" : "",
                                 x->shape[d]);
      snprintf(key, sizeof key, "engine.unit[%d].tensor[%d]", u, i);
      if (putf(t, key, "%s %s", x->name, shape)) return -1;
      snprintf(key, sizeof key, "engine.unit[%d].tensor[%d].groups", u, i);
      if (putf(t, key, "lr_mult %.9g wd_mult %.9g", (double)x->lr_mult, (double)x->wd_mult))
        return -1;
    }
    snprintf(key, sizeof key, "engine.unit[%d]", u);
    if (putf(t, key, "%s (%s), %d tensors, %zu parameters", un->name, un->kind, un->n_tensors,
             un->numel))
      return -1;
    /* Per-unit options (fsdp_unit_add_opts) change the collectives issued. */
    snprintf(key, sizeof key, "engine.unit[%d].opts", u);
    if (putf(t, key, "reshard_after_forward %d param_dtype %s", un->reshard,
             fsdp_dtype_name(un->lp_dtype)))
      return -1;
  }
  return 0;
}

static uint64_t fnv1a(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
  return h;
}

/* Line `line` of a text, its key and value copied out; 0 past the end. */
static int line_at(const char *text, int line, char *key, size_t nk, char *val, size_t nv) {
  const char *p = text;
  for (int i = 0; i < line && p; i++) {
    p = strchr(p, '\n');
    p = p ? p + 1 : NULL;
  }
  if (!p || !*p) return 0;
  const char *tab = strchr(p, '\t'), *end = strchr(p, '\n');
  if (!end) end = p + strlen(p);
  if (!tab || tab > end) tab = end;
  snprintf(key, nk, "%.*s", (int)(tab - p), p);
  snprintf(val, nv, "%.*s", tab < end ? (int)(end - tab - 1) : 0, tab < end ? tab + 1 : "");
  return 1;
}

/* ": rank 1 has 0.01, ranks 0, 2-3 have 0.002" for the values of one key. */
static void describe_values(char **texts, int size, int line, char *buf, size_t n) {
  char (*vals)[TEXT_MAX] = fsdp_alloc((size_t)size * sizeof *vals);
  int *ranks = fsdp_alloc(2 * (size_t)size * sizeof(int)), *done = ranks ? ranks + size : NULL;
  size_t used = 0;
  buf[0] = '\0';
  if (!vals || !ranks) goto out;
  memset(done, 0, (size_t)size * sizeof(int));
  for (int r = 0; r < size; r++) {
    char key[TEXT_MAX];
    if (!line_at(texts[r], line, key, sizeof key, vals[r], sizeof vals[r]))
      snprintf(vals[r], sizeof vals[r], "nothing (its list of settings ends earlier)");
    else if (!vals[r][0]) snprintf(vals[r], sizeof vals[r], "(empty)");
  }
  for (int r = 0, groups = 0; r < size && used < n; r++) {
    if (done[r]) continue;
    int count = 0;
    for (int q = r; q < size; q++)
      if (!done[q] && !strcmp(vals[q], vals[r])) ranks[count++] = q, done[q] = 1;
    char list[128];
    fsdp_format_ranks(list, sizeof list, ranks, count);
    int k = snprintf(buf + used, n - used, "%s%s %s %s %s", groups++ ? ", " : "",
                     count == 1 ? "rank" : "ranks", list, count == 1 ? "has" : "have", vals[r]);
    used += k > 0 ? (size_t)k : 0;
  }
out:
  fsdp_free(vals);
  fsdp_free(ranks);
}

/* The first line on which some rank differs: its key (from the lowest rank
 * that has one) and every rank's value. */
static fsdp_status_t mismatch(const struct fsdp_engine *e, char **texts, int size) {
  int line = 0;
  for (;; line++) {
    char k0[TEXT_MAX], v0[TEXT_MAX], k[TEXT_MAX], v[TEXT_MAX];
    int has0 = line_at(texts[0], line, k0, sizeof k0, v0, sizeof v0), differs = 0;
    for (int r = 1; r < size && !differs; r++) {
      int has = line_at(texts[r], line, k, sizeof k, v, sizeof v);
      differs = has != has0 || (has && (strcmp(k, k0) || strcmp(v, v0)));
    }
    if (differs || !has0) break;
  }
  char key[TEXT_MAX] = "", val[TEXT_MAX], values[1200];
  for (int r = 0; r < size && !key[0]; r++)
    line_at(texts[r], line, key, sizeof key, val, sizeof val);
  if (!key[0]) /* the texts differ only past what one line here holds */
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "ranks were started with different settings, "
                      "seen by rank %d: a setting longer than %d bytes differs; start every "
                      "rank with the same arguments and data", e->conf.rank, TEXT_MAX - 1);
  describe_values(texts, size, line, values, sizeof values);
  return fsdp_error(FSDP_ERR_INVALID_USAGE, "ranks were started with different settings, "
                    "seen by rank %d: %s: %s; start every rank with the same arguments and "
                    "data", e->conf.rank, key[0] ? key : "(the list of settings)", values);
}

/* A rank's own part failed (first: the highest such rank): its reason,
 * broadcast from it in a fixed 512 bytes, on every rank. This rank, if it
 * failed, returns its own error. */
static fsdp_status_t failed_rank(struct fsdp_engine *e, fsdp_status_t mine, int first,
                                 const char *reason, const char *step) {
  uint64_t words[64 + 1] = {0}; /* the status, then the text */
  if (e->conf.rank == first) {
    words[0] = (uint64_t)mine;
    snprintf((char *)(words + 1), 64 * 8, "%s", reason);
  }
  fsdp_status_t st =
      fsdp_broadcast(e->comm.comm_host, words, 65, FSDP_F64, first, FSDP_HOST_STREAM);
  if (mine) return fsdp_error(mine, "%s", reason);
  if (st != FSDP_SUCCESS) return st;
  ((char *)(words + 1))[64 * 8 - 1] = '\0';
  fsdp_status_t theirs = words[0] ? (fsdp_status_t)words[0] : FSDP_ERR_INTERNAL;
  return fsdp_error(theirs, "consistency check: rank %d failed to %s, so no rank compared "
                    "settings: %s", first, step, (const char *)(words + 1));
}

/* Every rank learns whether any rank failed on its own (mine: this rank's
 * status), in one all-reduce with no allocation: FSDP_SUCCESS, this rank's
 * own error, or the failed rank's status and reason (broadcast from it) on
 * the others. */
static fsdp_status_t agree(struct fsdp_engine *e, fsdp_status_t mine, const char *step) {
  char reason[512];
  snprintf(reason, sizeof reason, "%s", mine ? fsdp_last_error() : "");
  double failed = mine ? e->conf.rank + 1 : 0, worst = 0;
  fsdp_status_t st = fsdp_all_reduce(e->comm.comm_host, &failed, &worst, 1, FSDP_F64, FSDP_MAX,
                                     FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && worst > 0) return failed_rank(e, mine, (int)worst - 1, reason, step);
  if (mine) return fsdp_error(mine, "%s", reason);
  return st;
}

/* All-gathers the texts, padded to the longest, and names the difference. */
static fsdp_status_t exchange_texts(struct fsdp_engine *e, const text_t *mine, size_t longest) {
  size_t words = longest / 8 + 1, size = (size_t)e->conf.nranks;
  uint64_t *send = fsdp_alloc(words * 8), *all = fsdp_alloc(words * 8 * size);
  char **texts = fsdp_alloc(size * sizeof *texts);
  fsdp_status_t st = FSDP_SUCCESS;
  if (!send || !all || !texts)
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "consistency check: cannot allocate %zu bytes of "
                    "settings", words * 8 * size);
  st = agree(e, st, "allocate the settings of every rank");
  if (st != FSDP_SUCCESS) goto out;
  memcpy(send, mine->text, mine->len);
  st = fsdp_all_gather(e->comm.comm_host, send, all, words, FSDP_F64, FSDP_HOST_STREAM);
  if (st != FSDP_SUCCESS) goto out;
  for (size_t r = 0; r < size; r++) {
    texts[r] = (char *)(all + r * words);
    texts[r][words * 8 - 1] = '\0';
  }
  st = mismatch(e, texts, e->conf.nranks);
out:
  fsdp_free(send);
  fsdp_free(all);
  fsdp_free(texts);
  return st;
}

/* One all-reduce (MAX) tells every rank whether all hashes and lengths agree
 * (each 32-bit half and the length also negated: max == -max(-x) exactly
 * when every rank has x), the longest text, and the highest rank whose own
 * part failed (mine: this rank's status; then its text is not read). */
static fsdp_status_t compare(struct fsdp_engine *e, const text_t *mine, fsdp_status_t local) {
  char reason[512];
  snprintf(reason, sizeof reason, "%s", local ? fsdp_last_error() : "");
  uint64_t h = local ? 0 : fnv1a(mine->text, mine->len);
  double hi = (double)(h >> 32), lo = (double)(h & 0xffffffffu),
         len = local ? 0 : (double)mine->len;
  double v[7] = {hi, -hi, lo, -lo, len, -len, local ? e->conf.rank + 1 : 0}, m[7];
  fsdp_status_t st =
      fsdp_all_reduce(e->comm.comm_host, v, m, 7, FSDP_F64, FSDP_MAX, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && m[6] > 0)
    return failed_rank(e, local, (int)m[6] - 1, reason, "prepare its settings");
  if (local) return fsdp_error(local, "%s", reason);
  if (st != FSDP_SUCCESS) return st;
  if (m[0] == -m[1] && m[2] == -m[3] && m[4] == -m[5]) return FSDP_SUCCESS;
  return exchange_texts(e, mine, (size_t)m[4]);
}

/* The caller's arguments are checked here, not before the exchange: a rank
 * passing bad ones (or whose engine stopped: st) still takes part, so that
 * every rank fails with its reason at once. */
static fsdp_status_t check(struct fsdp_engine *e, fsdp_status_t st, int n,
                           const char *const *keys, const char *const *values, int plan) {
  if (st == FSDP_SUCCESS && (n < 0 || (n > 0 && (!keys || !values))))
    st = fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_check_consistency: %d settings "
                    "with keys %p and values %p", n, (const void *)keys, (const void *)values);
  text_t t = {0};
  int bad = 0;
  for (int i = 0; st == FSDP_SUCCESS && i < n && !bad; i++)
    bad = put(&t, keys[i] ? keys[i] : "(null)", values[i]);
  if (st == FSDP_SUCCESS && !bad) bad = put_config(&t, &e->conf.cfg) || (plan && put_plan(&t, e));
  if (st == FSDP_SUCCESS && bad)
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "consistency check: out of memory for %zu bytes of "
                    "settings", t.len);
  if (e->conf.nranks > 1) st = compare(e, &t, st);
  free(t.text);
  return st;
}

fsdp_status_t fsdp_engine_check_consistency(fsdp_engine_t e, int n, const char *const *keys,
                                            const char *const *values) {
  fsdp_status_t live = fsdp_engine_check_live(e);
  if (!e) return live;
  return check(e, live, n, keys, values, 1);
}

fsdp_status_t fsdp_engine_check_plan(fsdp_engine_t e) {
  return check(e, FSDP_SUCCESS, 0, NULL, NULL, 1);
}
