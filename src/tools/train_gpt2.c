/* src/tools/train_gpt2.c — a decoder, GPT-2 or a Llama-family model
 * (--model), on bytes of text or on a token file: random windows from the
 * training split, validation loss in nats per byte (or per token), and a
 * sample at the end. The two models differ only behind tools/lm.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/lm.h"
#include "tools/train.h"

typedef struct {
  fsdp_text_t text;
  fsdp_tokens_t toks; /* when --data is token data */
  int is_tokens;
  lm_t lm;            /* --model gpt2 or llama, picked once (train_gpt2) */
  int *tok, *tgt;
} gpt_task_t;

static fsdp_status_t windows(const gpt_task_t *g, int validation, uint64_t seed, int64_t step,
                             int64_t first, int64_t count, int T, int *tok, int *tgt) {
  return g->is_tokens ? fsdp_tokens_windows(&g->toks, validation, seed, step, first, count, T, tok, tgt)
                      : fsdp_text_windows(&g->text, validation, seed, step, first, count, T, tok, tgt);
}

/* Bytes of text, or token data whose tokens the model's vocabulary holds. */
static int load_data(trainer_t *t, gpt_task_t *g) {
  const train_opts_t *o = t->o;
  const char *path = o->data ? o->data : "/usr/share/games/fortunes";
  g->is_tokens = fsdp_tokens_probe(path);
  if (!g->is_tokens) return fsdp_text_load(path, 0.1, &g->text) ? -1 : 0;
  if (fsdp_tokens_load(path, 0.1, &g->toks)) return -1;
  lm_layout_t y;
  lm_layout(&g->lm, &y);
  if (fsdp_tokens_check_vocab(&g->toks, y.vocab_size) == FSDP_SUCCESS) return 0;
  if (t->rank == 0 && !y.named_by_preset)
    fprintf(stderr, "fsdp-train: %s\nfsdp-train: pass --vocab %d or more (or a preset whose "
            "vocabulary holds the data's tokens, e.g. --preset 124M)\n", fsdp_last_error(),
            g->toks.max_token + 1);
  else if (t->rank == 0)
    fprintf(stderr, "fsdp-train: %s\nfsdp-train: pass a --preset whose vocabulary holds token "
            "%d (e.g. SmolLM-135M, 49152 tokens)\n", fsdp_last_error(), g->toks.max_token);
  return -2;
}

/* Mean loss over eval_batches x global_batch fixed validation windows. */
static int evaluate(trainer_t *t, gpt_task_t *g, double *loss) {
  const train_opts_t *o = t->o;
  double sum = 0.0;
  for (int b = 0; b < o->eval_batches; b++) {
    if (windows(g, 1, o->seed + 1, b, t->offset, t->micro, o->seq_len, g->tok, g->tgt))
      return -1;
    double l;
    if (lm_forward(&g->lm, g->tok, g->tgt, (int)t->micro, o->seq_len, &l, NULL)) return -1;
    sum += l;
  }
  if (train_sum(t, &sum, 1)) return -1;
  *loss = sum / ((double)o->eval_batches * (double)(o->global_batch / o->cfg.grad_accum) *
                 o->seq_len);
  return 0;
}

static int step(trainer_t *t, gpt_task_t *g, int s, double *loss) {
  const train_opts_t *o = t->o;
  int64_t per_micro = o->global_batch / o->cfg.grad_accum;
  double sum = 0.0;
  int T = o->seq_len;
  for (int k = 0; k < o->cfg.grad_accum; k++) {
    if (windows(g, 0, o->seed, s, k * per_micro + t->offset, t->micro, T, g->tok, g->tgt))
      return -1;
    double l;
    if (lm_forward_backward(&g->lm, g->tok, g->tgt, (int)t->micro, T,
                            train_loss_scale(t) / (float)(t->micro * T), &l))
      return -1;
    sum += l;
  }
  if (train_sum(t, &sum, 1)) return -1;
  *loss = sum / ((double)o->global_batch * T);
  return 0;
}

/* Token data: ids (no tokenizer here; fsdp-eval decodes). Bytes: the text. */
static void print_sample(const trainer_t *t, const gpt_task_t *g, const int *out) {
  const train_opts_t *o = t->o;
  const char *unit = g->is_tokens ? "tokens" : "bytes";
  if (!o->json) printf("sample (%d %s, temperature %.2f):\n", o->sample, unit, (double)o->temperature);
  else printf("{\"event\":\"sample\",\"%s\":%s", g->is_tokens ? "tokens" : "text",
              g->is_tokens ? "[" : "\"");
  for (int i = 0; i < o->sample; i++)
    if (g->is_tokens) printf(i ? (o->json ? ",%d" : " %d") : "%d", out[i]);
    else if (!o->json) putchar(isprint(out[i]) || out[i] == '\n' || out[i] == '\t' ? out[i] : '?');
    else if (out[i] == '"' || out[i] == '\\') printf("\\%c", out[i]);
    else if (isprint(out[i])) putchar(out[i]);
    else printf("\\u%04x", out[i]);
  printf(o->json ? (g->is_tokens ? "]}\n" : "\"}\n") : "\n");
}

static int sample(trainer_t *t, gpt_task_t *g) {
  const train_opts_t *o = t->o;
  int prompt = g->is_tokens ? fsdp_tokens_at(&g->toks, g->toks.n_train) : '\n';
  int *out = malloc((size_t)o->sample * sizeof(int));
  if (!out) return -1;
  const fsdp_gpt2_sampling_t how = {o->temperature, 0, o->seed}; /* as fsdp_gpt2_generate */
  int rc = lm_sample(&g->lm, &prompt, 1, o->sample, &how, out) ? -1 : 0;
  if (rc == 0 && t->rank == 0) print_sample(t, g, out);
  free(out);
  return rc;
}

/* The validation loss in fmt, or none_text when no evaluation ran. */
static const char *val_text(int evals, double vl, const char *fmt, const char *none_text,
                            char *buf, size_t n) {
  if (!evals) return none_text;
  snprintf(buf, n, fmt, vl);
  return buf;
}

static int build_model(trainer_t *t, void *task);
static void unbuild_model(void *task);

static int run(trainer_t *t, gpt_task_t *g) {
  const train_opts_t *o = t->o;
  double loss = 0, first = -1, vl = 0;
  int evals = 0;
  double tokens = (double)o->global_batch * o->seq_len;
  int end = train_end_step(t), steps = end > t->start_step ? end - t->start_step : 0;
  for (int s = t->start_step; s < end; s++) {
    double ts = fsdp_time_now();
    fsdp_step_stats_t st;
    int skipped = step(t, g, s, &loss) || train_fault(t, s + 1) ? -1
                                                               : train_update(t, s + 1, loss, &st);
    if (skipped < 0) { /* elastic: the survivors go on from the last complete snapshot */
      train_model_t m = {unbuild_model, build_model, g};
      int resume;
      if (train_recover(t, s + 1, &m, &resume)) return -1;
      s = resume - 1;
      continue;
    }
    if (skipped) {
      s--; /* the same update again, on the same data */
      continue;
    }
    if (first < 0) first = loss;
    train_report_step(t, s + 1, loss, &st, fsdp_time_now() - ts, "tokens", tokens);
    if ((o->eval_every > 0 && (s + 1) % o->eval_every == 0) || s + 1 == o->steps) {
      if (evaluate(t, g, &vl)) return -1;
      evals++;
      train_report_eval(t, s + 1, "val_loss", vl, vl);
    }
    train_model_t m = {unbuild_model, build_model, g};
    if (train_save(t, s + 1) || train_snapshot(t, s + 1) || train_grow(t, s + 1, &m)) {
      int resume; /* a peer lost after the update: from the snapshot all the same */
      if (train_recover(t, s + 2, &m, &resume)) return -1;
      s = resume - 1;
    }
  }
  double secs = fsdp_time_now() - t->t0;
  char text[64];
  if (o->sample > 0 && sample(t, g)) return -1;
  if (t->rank == 0 && o->json)
    printf("{\"event\":\"summary\",\"model\":\"%s\",\"ranks\":%d,\"strategy\":\"%s\","
           "\"steps\":%d,\"seconds\":%.2f,\"tokens_per_s\":%.1f,\"first_loss\":%.6f,"
           "\"final_loss\":%.6f,\"val_loss\":%s,\"val_unit\":\"%s\",\"peak_bytes_per_rank\":%zu}\n",
           o->model, t->nranks, fsdp_strategy_name(o->cfg.strategy), steps, secs,
           tokens * steps / secs, first, loss, val_text(evals, vl, "%.6f", "null", text, sizeof text),
           g->is_tokens ? "token" : "byte", train_peak_bytes(t));
  else if (t->rank == 0)
    printf("done: %s, %d ranks, %s, %d steps in %.1f s (%.0f tokens/s) | loss %.4f -> %.4f | "
           "%s | peak %.2f MiB/rank\n", o->model, t->nranks, fsdp_strategy_name(o->cfg.strategy), steps,
           secs, tokens * steps / secs, first, loss,
           val_text(evals, vl, g->is_tokens ? "val loss %.6f nats/token" : "val loss %.6f nats/byte",
                    "no eval ran", text, sizeof text),
           train_peak_bytes(t) / 1048576.0);
  return 0;
}

static int setup(trainer_t *t, gpt_task_t *g) {
  const train_opts_t *o = t->o;
  int d = load_data(t, g);
  if (d) return d;
  /* What the ranks compare: the path, the size and a hash of the contents. */
  const char *data = o->data ? o->data : "/usr/share/games/fortunes";
  size_t size = g->is_tokens ? g->toks.n : g->text.n;
  uint64_t h = g->is_tokens ? train_hash(0, g->toks.tokens, (size_t)g->toks.width * g->toks.n)
                            : train_hash(0, g->text.bytes, g->text.n);
  /* A joining worker's peers compared their settings at their own start. */
  if (train_engine(t, o->steps) || (!t->joining && train_check_consistency(t, data, size, h)))
    return -1;
  int b = build_model(t, g);
  if (b) return b;
  if (t->rank == 0 && !o->json) {
    char what[200], shape[96];
    lm_layout_t y;
    lm_layout(&g->lm, &y);
    lm_shape(&g->lm, shape, sizeof shape);
    /* a shape the flags may have changed is not named by its preset */
    snprintf(what, sizeof what, "%s%s%s%s %s, T %d, %zu parameters, on", y.name,
             y.named_by_preset ? " " : "", y.named_by_preset ? o->preset : "",
             y.named_by_preset ? ":" : "", shape, o->seq_len, y.params);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %zu %s",
             g->is_tokens ? g->toks.n : g->text.n, g->is_tokens ? "tokens" : "bytes of text");
    train_print_plan(t, what);
    if (o->config) cfg_print_matches(stdout, o->config);
    printf("  activations %.2f MiB/rank (%.2f MiB without checkpointing)\n",
           t->act_bytes / 1048576.0, t->act_bytes_full / 1048576.0);
  }
  if (t->rank == 0 && o->wrap.checkpoint_kinds && !strcmp(o->wrap.checkpoint_kinds, "auto")) {
    char line[320];
    lm_checkpoint_auto_text(&g->lm, o->json, line, sizeof line);
    printf(o->json ? "{\"event\":\"memory\",%s}\n" : "  %s\n", line);
  }
  return train_replica_start(t);
}

static void unbuild_model(void *task) {
  gpt_task_t *g = task;
  free(g->tok);
  free(g->tgt);
  lm_destroy(&g->lm);
  g->tok = g->tgt = NULL;
}

/* The model over t->eng, materialised, and its per-rank batch buffers: at
 * start-up and again over the survivors' engine after a shrink. -2 when the
 * configuration file is at fault (rank 0 said why). */
static int build_model(trainer_t *t, void *task) {
  gpt_task_t *g = task;
  const train_opts_t *o = t->o;
  fsdp_gpt2_opts_t w = o->wrap;
  w.max_batch = (int)t->micro;
  w.max_T = o->seq_len;
  fsdp_plan_opts_t plan;
  char ckpt[512];
  cfg_file_t *c = o->config;
  lm_checkpoint_auto_opts(o->memory_budget, &w);
  int bad = c && lm_config_opts(&g->lm, c, &w, &plan, ckpt, sizeof ckpt);
  bad = bad || lm_create(&g->lm, t->eng, &w);
  bad = bad || (c && (cfg_check_matched(c, 1) || cfg_check_matched(c, 2)));
  if (bad && c && c->err[0]) { /* the same on every rank: rank 0 says it, all stop */
    if (t->rank == 0) fprintf(stderr, "fsdp-train: %s\n", c->err);
    return -2;
  }
  if (bad || fsdp_engine_materialize(t->eng, o->seed)) return -1;
  size_t n = (size_t)t->micro * (size_t)o->seq_len;
  g->tok = malloc(n * sizeof(int));
  g->tgt = malloc(n * sizeof(int));
  if (!g->tok || !g->tgt) return -1;
  size_t full;
  t->act_bytes = lm_activation_bytes(&g->lm, &full);
  t->act_bytes_full = full;
  return 0;
}

int train_gpt2(trainer_t *t) {
  gpt_task_t g = {.lm = lm_pick(t->o->model, &t->o->gpt, &t->o->llama)};
  int rc = setup(t, &g);
  rc = rc ? rc : (!t->joining && train_resume(t)) || run(t, &g) ? -1 : 0;
  unbuild_model(&g);
  fsdp_text_free(&g.text);
  fsdp_tokens_free(&g.toks);
  return rc;
}
