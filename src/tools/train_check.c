/* src/tools/train_check.c — fsdp-train's start-up consistency check: every
 * setting that changes what a rank computes, and the identity of its data,
 * compared across ranks through fsdp_engine_check_consistency before the
 * model is built, so that a rank started with another --lr, --seed, batch,
 * model shape or data file is named instead of training a different model or
 * hanging in a mismatched collective.
 *
 * Data identity is the path, the size and a content hash (FNV-1a over the
 * bytes loaded): the data is in memory already, hashing it costs about a
 * millisecond per MB once, and it catches what an mtime cannot — equal files
 * copied to each node carry different mtimes, and a regenerated file of the
 * same size differs only in content. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/train.h"

uint64_t train_hash(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  if (!h) h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

#define MAX_SETTINGS 64 /* fsdp-train passes 45 */

typedef struct {
  const char *keys[MAX_SETTINGS];
  const char *values[MAX_SETTINGS];
  char text[MAX_SETTINGS][96];
  int n;
} settings_t;

static void add(settings_t *s, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(settings_t *s, const char *key, const char *fmt, ...) {
  if (s->n == MAX_SETTINGS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->text[s->n], sizeof s->text[s->n], fmt, ap);
  va_end(ap);
  s->keys[s->n] = key;
  s->values[s->n] = s->text[s->n];
  s->n++;
}

/* A float flag as typed (%g) unless that loses bits, then every digit. */
static void add_float(settings_t *s, const char *key, float x) {
  char text[32];
  snprintf(text, sizeof text, "%g", (double)x);
  if (strtof(text, NULL) == x) add(s, key, "%s", text);
  else add(s, key, "%.9g", (double)x);
}

/* --config's sharding rules (its flag keys arrive resolved in the flags): the
 * rules as --print-config writes them, hashed, so a rank reading another file
 * is named here rather than planning other units. */
static void add_rules(settings_t *s, const cfg_file_t *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = c && c->n_rules ? open_memstream(&text, &len) : NULL;
  if (!f) {
    add(s, "sharding rules", "%s", c && c->n_rules ? "(unreadable)" : "(none)");
    return;
  }
  cfg_print_rules(f, c);
  fclose(f);
  add(s, "sharding rules", "%d, FNV-1a 64 %016" PRIx64, c->n_rules, train_hash(0, text, len));
  free(text);
}

/* The flags as this rank resolved them, in --help's order. */
static void add_flags(settings_t *s, const train_opts_t *o) {
  const fsdp_config_t *c = &o->cfg;
  add(s, "--model", "%s", o->model);
  if (strcmp(o->model, "mlp")) {
    if (!strcmp(o->model, "llama")) {
      add(s, "--preset", "%s", o->preset);
    } else {
      add(s, "--layers", "%d", o->gpt.n_layer);
      add(s, "--heads", "%d", o->gpt.n_head);
      add(s, "--embd", "%d", o->gpt.n_embd);
      add(s, "--context", "%d", o->gpt.block_size);
      add(s, "--vocab", "%d", o->gpt.vocab_size);
    }
    add(s, "--seq-len", "%d", o->seq_len);
    add(s, "--steps", "%d", o->steps);
    add(s, "--eval-batches", "%d", o->eval_batches);
    add(s, "--sample", "%d %.9g", o->sample, (double)o->temperature);
  } else {
    char w[64] = "";
    for (int i = 0, k = 0; i < o->n_hidden && k < (int)sizeof w; i++)
      k += snprintf(w + k, sizeof w - (size_t)k, "%s%d", i ? "," : "", o->hidden[i]);
    add(s, "--hidden", "%s", w);
    add(s, "--epochs", "%d", o->epochs);
  }
  /* the wrap flags plan both models' units (the MLP's layers too) */
  add(s, "--wrap", "%s", o->wrap.wrap_kinds ? o->wrap.wrap_kinds : "(none)");
  add(s, "--wrap-min-params", "%zu", o->wrap.wrap_min_params);
  add(s, "--checkpoint", "%s", o->wrap.checkpoint_kinds ? o->wrap.checkpoint_kinds : "(none)");
  add_rules(s, o->config);
  add(s, "--strategy", "%s", fsdp_strategy_name(c->strategy));
  add(s, "--prefetch", "%d", c->prefetch_depth);
  add(s, "--max-live", "%d", c->max_live_units);
  add(s, "--dtype", "%s", fsdp_dtype_name(c->param_dtype));
  add(s, "--reduce-dtype", "%s", fsdp_dtype_name(c->reduce_dtype));
  add(s, "--device", "%s", c->device == FSDP_DEVICE_CUDA ? "cuda" : "cpu");
  add(s, "--comm-backend", "%s", c->comm_backend ? c->comm_backend : "(the world's)");
  add(s, "--global-batch", "%" PRId64, o->global_batch);
  add(s, "--micro-batches", "%d", c->grad_accum);
  add(s, "--accumulate-full", "%d", c->accumulate_full_grads);
  add(s, "--optim", "%s", c->optim.kind == FSDP_OPTIM_SGD ? "sgd" : "adamw");
  add_float(s, "--lr", c->optim.lr);
  add_float(s, "--momentum", c->optim.momentum);
  add_float(s, "--wd", c->optim.weight_decay);
  add_float(s, "--clip", c->optim.max_grad_norm);
  add(s, "--schedule", "%s", c->schedule.kind == FSDP_SCHED_CONSTANT ? "constant" : "cosine");
  add(s, "--warmup", "%" PRId64, c->schedule.warmup_steps);
  add_float(s, "--min-lr-ratio", c->schedule.min_lr_ratio);
  add_float(s, "--loss-scale", o->loss_scale);
  add(s, "--loss-scale-interval", "%d", c->loss_scale_interval);
  add(s, "--max-skips", "%d", c->max_consecutive_skips);
  add(s, "--eval-every", "%d", o->eval_every);
  add(s, "--seed", "%" PRIu64, o->seed);
  add(s, "--save-dir", "%s", o->save_dir ? o->save_dir : "(none)");
  add(s, "--save-every", "%d", o->save_every);
  add(s, "--save-overwrite", "%d", o->save_overwrite);
  add(s, "--resume", "%s", o->resume ? o->resume : "(none)");
  add(s, "--stop-after", "%d", o->stop_after);
}

int train_check_consistency(trainer_t *t, const char *data_path, size_t data_bytes,
                            uint64_t data_hash) {
  settings_t s = {.n = 0};
  add_flags(&s, t->o);
  add(&s, "--data", "%s", data_path);
  add(&s, "data size", "%zu bytes", data_bytes);
  add(&s, "data content (FNV-1a 64)", "%016" PRIx64, data_hash);
  return fsdp_engine_check_consistency(t->eng, s.n, s.keys, s.values) ? -1 : 0;
}
