/* src/tools/eval_run.c — fsdp-eval's jobs: scoring a split (every position, or
 * fsdp-train's validation windows), writing logits as .npy, sampling. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/eval.h"

static size_t split_lo(const evaluator_t *e) {
  size_t n_train = e->is_tokens ? e->toks.n_train : e->text.n_train;
  return !strcmp(e->o->split, "val") ? n_train : 0;
}

static size_t split_hi(const evaluator_t *e) {
  size_t n = e->is_tokens ? e->toks.n : e->text.n;
  return !strcmp(e->o->split, "train") ? (e->is_tokens ? e->toks.n_train : e->text.n_train) : n;
}

static int token_at(const evaluator_t *e, size_t i) {
  return e->is_tokens ? fsdp_tokens_at(&e->toks, i) : e->text.bytes[i];
}

/* The bytes a target stands for: 1 on byte data, its text's length with a
 * tokenizer, 0 when unknown (no bits per byte then). */
static double target_bytes(const evaluator_t *e, int id) {
  if (!e->is_tokens) return 1.0;
  size_t len = 0;
  return e->tok && fsdp_tokenizer_token(e->tok, id, &len) ? (double)len : 0.0;
}

/* Inputs and targets of `count` consecutive windows of T from `at`. */
static void fill(evaluator_t *e, size_t at, int count, int T, double *bytes) {
  for (int w = 0; w < count; w++)
    for (int t = 0; t < T; t++) {
      size_t i = at + (size_t)w * (size_t)T + (size_t)t;
      e->ids[w * T + t] = token_at(e, i);
      e->tgt[w * T + t] = token_at(e, i + 1);
      *bytes += target_bytes(e, e->tgt[w * T + t]);
    }
}

static fsdp_status_t sum_ranks(evaluator_t *e, double *v, int n) {
  return fsdp_all_reduce(fsdp_engine_comm(e->eng), v, v, (size_t)n, FSDP_F64, FSDP_SUM,
                         FSDP_HOST_STREAM);
}

/* Every position of [lo, hi): windows of T back to back, global_batch at a
 * time (a rank past the end runs one window and drops it: the forward is
 * collective), then the tail shorter than T on every rank, counted once. */
static int score_all(evaluator_t *e, double acc[3], int64_t *windows) {
  size_t lo = split_lo(e), hi = split_hi(e);
  int T = e->T;
  if (hi - lo < 2) return fprintf(stderr, "fsdp-eval: the %s split has %zu tokens: nothing to "
                                  "score\n", e->o->split, hi - lo), -2;
  int64_t W = (int64_t)((hi - lo - 1) / (size_t)T);
  size_t tail = (hi - lo - 1) % (size_t)T;
  if (e->o->max_windows && W >= e->o->max_windows) W = e->o->max_windows, tail = 0;
  for (int64_t base = 0; base < W; base += e->global_batch) {
    int64_t first = base + e->offset, count = W - first < e->micro ? W - first : e->micro;
    double l = 0, bytes = 0;
    fill(e, lo + (size_t)(count > 0 ? first : 0) * (size_t)T, count > 0 ? (int)count : 1, T, &bytes);
    if (eval_forward(e, count > 0 ? (int)count : 1, T, &l, NULL)) return -1;
    if (count > 0) acc[0] += l, acc[1] += (double)count * T, acc[2] += bytes;
  }
  if (tail > 0) {
    double l = 0, bytes = 0;
    fill(e, lo + (size_t)W * (size_t)T, 1, (int)tail, &bytes);
    if (eval_forward(e, 1, (int)tail, &l, NULL)) return -1;
    if (e->rank == 0) acc[0] += l, acc[1] += (double)tail, acc[2] += bytes;
  }
  *windows = W + (tail > 0);
  return 0;
}

/* fsdp-train's validation estimate: the same windows (fsdp_*_windows of
 * validation, seed + 1, batches 0 .. eval_batches-1), the same batch. */
static int score_match_train(evaluator_t *e, double acc[3], int64_t *windows) {
  int64_t seed = 1, batches = 4;
  eval_meta(e, "seed", &seed);
  eval_meta(e, "eval_batches", &batches);
  for (int64_t b = 0; b < batches; b++) {
    fsdp_status_t st = e->is_tokens
        ? fsdp_tokens_windows(&e->toks, 1, (uint64_t)seed + 1, b, e->offset, e->micro, e->T,
                              e->ids, e->tgt)
        : fsdp_text_windows(&e->text, 1, (uint64_t)seed + 1, b, e->offset, e->micro, e->T,
                            e->ids, e->tgt);
    double l = 0;
    if (st || eval_forward(e, (int)e->micro, e->T, &l, NULL)) return -1;
    acc[0] += l;
    acc[1] += (double)e->micro * e->T;
    for (int64_t i = 0; i < e->micro * e->T; i++) acc[2] += target_bytes(e, e->tgt[i]);
  }
  *windows = batches * e->global_batch;
  return 0;
}

static void report_score(const evaluator_t *e, const double acc[3], int64_t windows, double secs) {
  double mean = acc[0] / acc[1], bpb = acc[2] > 0 ? acc[0] / M_LN2 / acc[2] : NAN;
  const char *unit = e->is_tokens ? "token" : "byte";
  const char *what = e->o->match_train ? "fsdp-train's validation windows" : e->o->split;
  if (e->o->json) {
    printf("{\"event\":\"score\",\"checkpoint\":\"%s\",\"step\":%lld,\"ranks\":%d,\"split\":\"%s\","
           "\"windows\":%lld,\"T\":%d,\"targets\":%.0f,\"loss\":%.6f,\"unit\":\"%s\","
           "\"perplexity\":%.6f", e->o->ckpt, (long long)e->step, e->nranks, what,
           (long long)windows, e->T, acc[1], mean, unit, exp(mean));
    if (acc[2] > 0) printf(",\"bits_per_byte\":%.6f", bpb);
    printf(",\"seconds\":%.3f}\n", secs);
  } else {
    printf("fsdp-eval: %s (step %lld) on %s, %s: %lld windows of T %d, %.0f %ss | loss %.6f "
           "nats/%s | perplexity %.4f", e->o->ckpt, (long long)e->step,
           e->o->data ? e->o->data : "the fortunes", what, (long long)windows, e->T, acc[1], unit,
           mean, unit, exp(mean));
    if (acc[2] > 0) printf(" | %.4f bits/byte", bpb);
    printf(" | %d ranks, %.2f s\n", e->nranks, secs);
  }
  fflush(stdout);
}

int eval_score(evaluator_t *e) {
  double acc[3] = {0, 0, 0}, t0 = fsdp_time_now(); /* nats, targets, bytes */
  int64_t windows = 0;
  int rc = e->o->match_train ? score_match_train(e, acc, &windows) : score_all(e, acc, &windows);
  if (rc) return rc;
  if (sum_ranks(e, acc, 3)) return -1;
  if (e->rank == 0) report_score(e, acc, windows, fsdp_time_now() - t0);
  return 0;
}

/* NumPy's .npy version 1.0: magic, version, a little-endian uint16 header
 * length, a Python dict literal padded with spaces to a multiple of 64 bytes
 * (newline last), then the C-order data. */
static int write_npy(const char *path, const float *data, int rows, int cols) {
  char dict[128];
  int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }",
                   rows, cols);
  int header = (10 + n + 1 + 63) / 64 * 64 - 10;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(header & 0xff),
                           (unsigned char)(header >> 8)};
  FILE *f = fopen(path, "wb");
  if (!f) return fprintf(stderr, "fsdp-eval: %s: cannot create\n", path), -2;
  fwrite(pre, 1, sizeof pre, f);
  fprintf(f, "%s%*s\n", dict, header - n - 1, "");
  size_t wrote = fwrite(data, sizeof(float), (size_t)rows * (size_t)cols, f);
  if (fclose(f) != 0 || wrote != (size_t)rows * (size_t)cols)
    return fprintf(stderr, "fsdp-eval: %s: write failed\n", path), -2;
  return 0;
}

int eval_logits(evaluator_t *e) {
  int K = e->o->logits_k, V = e->o->gpt.vocab_size;
  size_t lo = split_lo(e), hi = split_hi(e);
  if ((size_t)K > hi - lo) {
    if (e->rank == 0) fprintf(stderr, "fsdp-eval: --logits %d: the %s split has %zu tokens\n", K,
                              e->o->split, hi - lo);
    return -2;
  }
  float *all = e->rank == 0 ? malloc((size_t)K * (size_t)V * sizeof(float)) : NULL;
  if (e->rank == 0 && !all) return -1;
  int rc = 0;
  /* Windows of T from the split's start, as scoring reads them. */
  for (int at = 0; at < K && !rc; at += e->T) {
    int T = K - at < e->T ? K - at : e->T;
    double bytes = 0;
    const float *logits;
    fill(e, lo + (size_t)at, 1, T, &bytes);
    rc = eval_forward(e, 1, T, NULL, &logits) ? -1 : 0;
    if (!rc && all) memcpy(all + (size_t)at * V, logits, (size_t)T * V * sizeof(float));
  }
  if (!rc && all) rc = write_npy(e->o->logits_out, all, K, V);
  if (!rc && all && !e->o->json)
    printf("fsdp-eval: logits of the %s split's first %d positions -> %s (float32, %d x %d)\n",
           e->o->split, K, e->o->logits_out, K, V);
  free(all);
  return rc;
}

/* The prompt: --prompt-tokens, --prompt encoded (tokenizer) or as bytes,
 * else <|endoftext|> or a newline. */
static int prompt_ids(evaluator_t *e, fsdp_token_buf_t *p) {
  const eval_opts_t *o = e->o;
  if (o->prompt_tokens) {
    for (const char *s = o->prompt_tokens; *s;) {
      char *end;
      long v = strtol(s, &end, 10);
      if (end == s || v < 0 || v >= o->gpt.vocab_size || (*end && *end != ','))
        return fprintf(stderr, "fsdp-eval: --prompt-tokens '%s': ids in [0, %d), comma-separated\n",
                       o->prompt_tokens, o->gpt.vocab_size), -2;
      if (p->n == p->cap && !(p->ids = realloc(p->ids, (p->cap = p->cap * 2 + 8) * sizeof(int))))
        return -1;
      p->ids[p->n++] = (int)v;
      s = *end ? end + 1 : end;
    }
  } else if (o->prompt && e->tok) {
    if (fsdp_tokenizer_encode(e->tok, o->prompt, strlen(o->prompt), 0, p)) return -1;
  } else {
    const char *s = o->prompt ? o->prompt : "\n";
    int eot = e->tok ? fsdp_tokenizer_eot(e->tok) : -1;
    size_t n = !o->prompt && eot >= 0 ? 1 : strlen(s);
    if (!(p->ids = malloc((n ? n : 1) * sizeof(int)))) return -1;
    for (size_t i = 0; i < n; i++) p->ids[i] = !o->prompt && eot >= 0 ? eot : (unsigned char)s[i];
    p->n = p->cap = n;
  }
  if (p->n == 0) return fprintf(stderr, "fsdp-eval: the prompt is empty\n"), -2;
  return 0;
}

static void print_tokens(const evaluator_t *e, const int *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t len = 1;
    const char *s = e->tok ? fsdp_tokenizer_token(e->tok, ids[i], &len) : NULL;
    if (s) fwrite(s, 1, len, stdout);
    else if (e->o->gpt.vocab_size <= 256) putchar(isprint(ids[i]) || isspace(ids[i]) ? ids[i] : '?');
    else printf("[%d]", ids[i]);
  }
}

/* The prompt, then the sample (text with a tokenizer or on bytes, else ids). */
static void print_sample(const evaluator_t *e, const fsdp_token_buf_t *prompt, const int *out,
                         int n) {
  if (e->o->json) {
    printf("{\"event\":\"sample\",\"tokens\":[");
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", out[i]);
    printf("]}\n");
  } else {
    printf("sample (%d tokens after a prompt of %zu, temperature %.2f, top-k %d, seed %llu):\n", n,
           prompt->n, (double)e->o->temperature, e->o->top_k, (unsigned long long)e->o->seed);
    print_tokens(e, prompt->ids, prompt->n);
    print_tokens(e, out, (size_t)n);
    printf("\n");
  }
  fflush(stdout);
}

int eval_sample(evaluator_t *e) {
  fsdp_token_buf_t p = {0};
  int rc = prompt_ids(e, &p);
  int *out = rc ? NULL : malloc((size_t)e->o->sample * sizeof(int));
  if (!rc && !out) rc = -1;
  fsdp_gpt2_sampling_t how = {e->o->temperature, e->o->top_k, e->o->seed};
  int keep = (int)p.n > e->T ? e->T : (int)p.n; /* the context the model can see */
  const int *ctx = p.ids + p.n - keep;
  if (!rc && lm_sample(&e->lm, ctx, keep, e->o->sample, &how, out))
    rc = -1;
  if (!rc && e->rank == 0) print_sample(e, &p, out, e->o->sample);
  free(out);
  fsdp_token_buf_free(&p);
  return rc;
}
