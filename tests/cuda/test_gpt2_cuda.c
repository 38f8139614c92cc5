/* tests/cuda/test_gpt2_cuda.c — GPT-2 trained on a CUDA engine against the
 * same model trained on the CPU engine: a small model (2 layers, C 64), a few
 * AdamW steps from the same seed, the loss of every step compared.
 *   fp32:  CUDA fp32 kernels vs CPU, within 1e-4 relative (different
 *          summation orders, float atomics in the embedding backward);
 *   bf16:  bf16 parameters and activations on CUDA vs the CPU engine with bf16
 *          parameters (fp32 compute), within 2e-2 relative;
 *   activation checkpointing on CUDA gives the losses without it (1e-5);
 *   2 of 3 blocks checkpointed by checkpoint auto (bf16) follows the CPU;
 *   forward-only logits on the host and sampling agree with the CPU (fp32);
 *   every tensor's gradient after one forward/backward (fp32 and bf16), read
 *   as the parameters' change under one SGD step of lr 1 (see grads_match_cpu).
 * FSDP_TEST_SMALL=1 (the TSan run of scripts/sim-test.sh): a tiny model (2
 * layers, C 32, T 16, V 64), 2 steps, one dtype (FSDP_TEST_DTYPE=f32|bf16,
 * default f32), CUDA with activation checkpointing and prefetch against the
 * CPU: losses and every tensor's gradient; the same streams (compute,
 * gather, reduce) and recomputation, at a size TSan finishes.
 * Prints one "gpt2 cuda ..." line per comparison. Exits 77 (skipped) without a
 * usable GPU or when the engine has no CUDA backend (FSDP_ERR_UNSUPPORTED).
 * CK_FORK=no: a forked child cannot use its parent's CUDA context. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "common/solo_world.h"
#include "cuda_gate.h"
#include "fsdp/fsdp.h"

enum { MAX_STEPS = 6, SAMPLE = 16 };
static int B = 4, T = 32, STEPS = 6; /* FSDP_TEST_SMALL: 2, 16, 2 */
static fsdp_gpt2_config_t cfg = {2, 4, 64, 32, 256}; /* tests of another shape copy it */
static fsdp_world_t world;
static fsdp_dtype_t small_dtype = FSDP_F32; /* FSDP_TEST_SMALL: the one dtype */

typedef struct {
  fsdp_device_kind_t device;
  fsdp_dtype_t dtype;
  const char *checkpoint; /* NULL or "GPT2Block" */
  size_t budget;          /* > 0: checkpoint auto at this memory_budget ... */
  int want_k;             /* ... which must checkpoint the first want_k blocks */
  const fsdp_gpt2_config_t *model; /* NULL: cfg (a test's own shape is a local copy) */
} run_t;

static const fsdp_gpt2_config_t *model_of(const run_t *r) { return r->model ? r->model : &cfg; }

typedef struct {
  double loss[MAX_STEPS]; /* mean per token */
  double eval;        /* forward-only loss after training */
  float *logits;      /* (B,T,V) host copy of the forward-only logits */
  int sample[SAMPLE];
} result_t;

/* A learnable stream over V tokens: each follows from the previous one, with noise. */
static void batch(int step, int V, int *tok, int *tgt) {
  unsigned x = 12345u + 977u * (unsigned)step;
  for (int i = 0; i < B * T; i++) {
    x = x * 1103515245u + 12345u;
    tok[i] = i % T == 0 ? (int)(x >> 16) % V : (tok[i - 1] * 7 + 3) % V;
    if ((x >> 8) % 8 == 0) tok[i] = (int)(x >> 12) % V;
  }
  for (int i = 0; i < B * T; i++) tgt[i] = (tok[i] * 7 + 3) % V;
}

/* The engine (c: device and dtype set from r) and the model on it, seed 7.
 * FSDP_SUCCESS, FSDP_ERR_UNSUPPORTED (no CUDA engine: skip), or a failure. */
static fsdp_status_t open_model(const run_t *r, fsdp_config_t *c, fsdp_engine_t *e,
                                fsdp_gpt2_t *g) {
  c->device = r->device;
  c->param_dtype = r->dtype;
  c->max_live_units = c->prefetch_depth + 2; /* the root stays gathered */
  *e = NULL;
  *g = NULL;
  fsdp_status_t st = fsdp_engine_create(world, c, e);
  if (st == FSDP_ERR_UNSUPPORTED) return st;
  ck_assert_msg(st == FSDP_SUCCESS, "engine: %s", fsdp_last_error());
  fsdp_gpt2_opts_t o = {.wrap_kinds = "GPT2Block", .checkpoint_kinds = r->checkpoint,
                         .max_batch = B, .checkpoint_auto = r->budget > 0,
                         .memory_budget = r->budget};
  st = fsdp_gpt2_create(*e, model_of(r), &o, g);
  if (st == FSDP_SUCCESS) st = fsdp_engine_materialize(*e, 7);
  if (st == FSDP_ERR_UNSUPPORTED) {
    fsdp_gpt2_destroy(*g);
    fsdp_engine_destroy(*e);
    return st;
  }
  ck_assert_msg(st == FSDP_SUCCESS, "model: %s", fsdp_last_error());
  return FSDP_SUCCESS;
}

static fsdp_status_t train(const run_t *r, result_t *out) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.lr = 1e-3f;
  fsdp_engine_t e;
  fsdp_gpt2_t g;
  const fsdp_status_t st = open_model(r, &c, &e, &g);
  if (st != FSDP_SUCCESS) return st;
  int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
  ck_assert(tok && tgt);
  if (r->budget) { /* checkpoint auto took the first want_k blocks */
    ck_assert_int_eq(fsdp_gpt2_checkpointed(g, NULL), r->want_k);
    for (int l = 0; l < model_of(r)->n_layer; l++)
      ck_assert_int_eq(fsdp_gpt2_layer_checkpointed(g, l), l < r->want_k);
  }
  for (int s = 0; s < STEPS; s++) {
    batch(s, model_of(r)->vocab_size, tok, tgt);
    ck_assert_msg(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 1.0f / (B * T), &out->loss[s]) ==
                      FSDP_SUCCESS, "step %d: %s", s, fsdp_last_error());
    ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
    out->loss[s] /= B * T;
  }
  const float *logits = NULL;
  batch(STEPS, model_of(r)->vocab_size, tok, tgt);
  ck_assert_msg(fsdp_gpt2_forward(g, tok, tgt, B, T, &out->eval, &logits) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  out->eval /= B * T;
  size_t n = (size_t)B * T * model_of(r)->vocab_size;
  out->logits = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(out->logits);
  memcpy(out->logits, logits, n * sizeof(float)); /* host memory on every device */
  int prompt[3] = {1, 10, 73 % model_of(r)->vocab_size};
  ck_assert_msg(fsdp_gpt2_generate(g, prompt, 3, SAMPLE, 1.0f, 11, out->sample) == FSDP_SUCCESS,
                "%s", fsdp_last_error());
  free(tok);
  free(tgt);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
  return FSDP_SUCCESS;
}

static int skipped; /* a run found no CUDA engine */

/* Both runs, then the largest relative difference of their step losses. */
static double compare(const char *what, const run_t *a, const run_t *b, result_t *ra,
                      result_t *rb, double tol) {
  if (train(a, ra) == FSDP_ERR_UNSUPPORTED || train(b, rb) == FSDP_ERR_UNSUPPORTED) {
    skipped = 1;
    printf("gpt2 cuda %s: SKIP: %s\n", what, fsdp_last_error());
    return 0.0;
  }
  double worst = 0.0;
  for (int s = 0; s < STEPS; s++) {
    double d = fabs(ra->loss[s] - rb->loss[s]) / fabs(ra->loss[s]);
    worst = d > worst ? d : worst;
  }
  printf("gpt2 cuda %s: losses %.6f -> %.6f vs %.6f -> %.6f, max relative difference %.3g "
         "(tolerance %.0e) %s\n", what, ra->loss[0], ra->loss[STEPS - 1], rb->loss[0],
         rb->loss[STEPS - 1], worst, tol, worst <= tol ? "ok" : "FAIL");
  ck_assert_msg(ra->loss[STEPS - 1] < ra->loss[0], "%s: the loss did not fall", what);
  ck_assert_msg(worst <= tol, "%s: relative loss difference %g above %g", what, worst, tol);
  return worst;
}

START_TEST(fp32_matches_cpu) {
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_F32, NULL, 0, 0, NULL},
        gpu = {FSDP_DEVICE_CUDA, FSDP_F32, NULL, 0, 0, NULL};
  result_t a = {0}, b = {0};
  compare("fp32 vs cpu", &cpu, &gpu, &a, &b, 1e-4);
  if (!skipped) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < (size_t)B * T * cfg.vocab_size; i++) {
      double d = fabs((double)a.logits[i] - b.logits[i]);
      worst = d > worst ? d : worst;
      scale = fabs(a.logits[i]) > scale ? fabs(a.logits[i]) : scale;
    }
    printf("gpt2 cuda fp32 forward: eval loss %.6f vs %.6f, logits max difference %.3g (of "
           "%.3g), samples %s\n", a.eval, b.eval, worst, scale,
           memcmp(a.sample, b.sample, sizeof a.sample) ? "differ" : "equal");
    ck_assert(fabs(a.eval - b.eval) <= 1e-4 * a.eval);
    ck_assert(worst <= 1e-4 * (scale > 1.0 ? scale : 1.0));
    for (int i = 0; i < SAMPLE; i++) ck_assert(b.sample[i] >= 0 && b.sample[i] < cfg.vocab_size);
    ck_assert_int_eq(memcmp(a.sample, b.sample, sizeof a.sample), 0);
  }
  free(a.logits);
  free(b.logits);
}
END_TEST

START_TEST(bf16_follows_cpu) {
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_BF16, NULL, 0, 0, NULL},
        gpu = {FSDP_DEVICE_CUDA, FSDP_BF16, NULL, 0, 0, NULL};
  result_t a = {0}, b = {0};
  compare("bf16 vs cpu bf16", &cpu, &gpu, &a, &b, 2e-2);
  if (!skipped) ck_assert(fabs(a.eval - b.eval) <= 2e-2 * a.eval);
  free(a.logits);
  free(b.logits);
}
END_TEST

START_TEST(checkpointing_on_cuda) {
  static const fsdp_dtype_t dtypes[] = {FSDP_F32, FSDP_BF16};
  for (int k = 0; k < 2 && !skipped; k++) {
    run_t plain = {FSDP_DEVICE_CUDA, dtypes[k], NULL, 0, 0, NULL};
    run_t ckpt = {FSDP_DEVICE_CUDA, dtypes[k], "GPT2Block", 0, 0, NULL};
    result_t a = {0}, b = {0};
    char what[64];
    snprintf(what, sizeof what, "%s checkpoint vs none", fsdp_dtype_name(dtypes[k]));
    /* recompute runs the same kernels on the same inputs; only the embedding's
     * float atomics may add in another order */
    compare(what, &plain, &ckpt, &a, &b, dtypes[k] == FSDP_F32 ? 1e-5 : 1e-3);
    free(a.logits);
    free(b.logits);
  }
}
END_TEST

/* k of L blocks checkpointed on CUDA in bf16 against the CPU engine with
 * none: 3 blocks, checkpoint auto at the budget that exactly fits k = 2
 * (blocks h.0 and h.1 recompute, h.2 keeps its activations), the budget made
 * of the CUDA model's own bytes without checkpointing less fsdp_gpt2_memory's
 * arena (CUDA's, to the byte: the same carving, 256-byte alignment) plus the
 * arena fsdp_activation_arena_bytes gives for k = 2, plus the engine's state
 * (fsdp_engine_memory_plan). */
START_TEST(partial_checkpoint_follows_cpu) {
  fsdp_gpt2_config_t three = cfg;
  three.n_layer = 3;
  run_t gpu = {FSDP_DEVICE_CUDA, FSDP_BF16, NULL, 0, 0, &three};
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  fsdp_gpt2_t g;
  if (open_model(&gpu, &c, &e, &g) == FSDP_ERR_UNSUPPORTED) {
    skipped = 1;
    printf("gpt2 cuda bf16 partial checkpoint: SKIP: %s\n", fsdp_last_error());
    return;
  }
  size_t full, act = fsdp_gpt2_activation_bytes(g, &full);
  /* checkpoint auto's fixed part also holds the engine's state, the root held */
  fsdp_unit_t root = -1;
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_unit_info_t ri;
    ck_assert_int_eq(fsdp_unit_info(e, u, &ri), FSDP_SUCCESS);
    if (!strcmp(ri.name, "root")) root = u;
  }
  fsdp_mem_stats_t state;
  ck_assert_int_eq(fsdp_engine_memory_plan(e, &root, 1, &state), FSDP_SUCCESS);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
  fsdp_gpt2_memory_t m;
  ck_assert_int_eq(fsdp_gpt2_memory(&three, B, T, FSDP_BF16, FSDP_GPT2_LAYOUT_BUILT, &m),
                   FSDP_SUCCESS);
  ck_assert_uint_eq(act, full);
  gpu.budget = state.total_reserved + full - fsdp_activation_arena_bytes(&m, 3, 0) +
               fsdp_activation_arena_bytes(&m, 1, 1);
  gpu.want_k = 2;
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_BF16, NULL, 0, 0, &three};
  result_t a = {0}, b = {0};
  compare("bf16 2 of 3 blocks checkpointed (auto) vs cpu bf16", &cpu, &gpu, &a, &b, 2e-2);
  free(a.logits);
  free(b.logits);
  gpu.budget--; /* one byte less: all three */
  gpu.want_k = 3;
  result_t d = {0};
  ck_assert_int_eq(train(&gpu, &d), FSDP_SUCCESS);
  free(d.logits);
}
END_TEST

/* A vocabulary off the multiple of 128 (300: logits rows 384 apart on both
 * devices, the gradient written over them): the CUDA model follows the
 * CPU's, and the forward's logits come back packed (B,T,V) alike. GPT-2's own
 * 50257 -> 50304 is test_kernels' head case (a model step at that width takes
 * minutes in the simulator). */
START_TEST(padded_vocab_matches_cpu) {
  fsdp_gpt2_config_t v300 = cfg;
  v300.vocab_size = 300;
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_F32, NULL, 0, 0, &v300},
        gpu = {FSDP_DEVICE_CUDA, FSDP_F32, NULL, 0, 0, &v300};
  result_t a = {0}, b = {0};
  compare("fp32 vs cpu, V 300", &cpu, &gpu, &a, &b, 1e-4);
  if (!skipped) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < (size_t)B * T * v300.vocab_size; i++) {
      worst = fmax(worst, fabs((double)a.logits[i] - b.logits[i]));
      scale = fmax(scale, fabs(a.logits[i]));
    }
    printf("gpt2 cuda V 300 forward: eval loss %.6f vs %.6f, logits max difference %.3g (of "
           "%.3g)\n", a.eval, b.eval, worst, scale);
    ck_assert(fabs(a.eval - b.eval) <= 1e-4 * a.eval);
    ck_assert(worst <= 1e-4 * (scale > 1.0 ? scale : 1.0));
  }
  free(a.logits);
  free(b.logits);
}
END_TEST

/* GPT-2 124M's layer shape (C 768, 12 heads of 64, T 1024) at batch 1, one
 * layer, a small vocabulary: one micro-batch on CUDA against the CPU, the loss
 * and every parameter gradient (ZeRO-3 at N = 1: each unit's shard is all of
 * it). fp32 against fp32; bf16 (tensor-core attention, bf16 activations)
 * against the CPU with the same bf16 weights. The gradient is read as the
 * masters' change under one SGD step (GRAD_LR). Errors per unit: fp32, max
 * |a - b| / RMS(a); bf16, |a - b| / |a| (bf16 activations round each large
 * element a little differently from the CPU's fp32 ones). */
/* The step that exposes the gradient: large enough that master - lr * grad
 * is dominated by lr * grad, so the difference carries the gradient to about
 * 2^-24 of itself (with lr 1 it would carry only 2^-24 of the parameter, 1e-4
 * of the smallest gradients here); a power of two divides exactly. */
#define GRAD_LR 1024.0f

/* One micro-batch's mean loss; grads[u] (malloc'd) the gradient of unit u,
 * n[0] the number of units (at most 3), n[1 + u] unit u's elements. */
static double grads_and_loss(fsdp_device_kind_t dev, fsdp_dtype_t dt, float **grads, size_t *n) {
  const fsdp_gpt2_config_t c124 = {1, 12, 768, 1024, 256};
  const int T124 = c124.block_size;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.device = dev;
  c.param_dtype = dt;
  c.optim.kind = FSDP_OPTIM_SGD; /* no momentum: master -= lr * gradient */
  c.optim.lr = GRAD_LR;
  fsdp_engine_t e = NULL;
  ck_assert_msg(fsdp_engine_create(world, &c, &e) == FSDP_SUCCESS, "%s", fsdp_last_error());
  fsdp_gpt2_opts_t o = {.wrap_kinds = "GPT2Block", .max_batch = 1};
  fsdp_gpt2_t g = NULL;
  ck_assert_msg(fsdp_gpt2_create(e, &c124, &o, &g) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_msg(fsdp_engine_materialize(e, 7) == FSDP_SUCCESS, "%s", fsdp_last_error());
  int *tok = malloc(T124 * sizeof(int)), *tgt = malloc(T124 * sizeof(int));
  for (int i = 0; i < T124; i++) tok[i] = (i * 37 + 11) % 256, tgt[i] = (i * 91 + 5) % 256;
  *n = (size_t)fsdp_engine_num_units(e);
  ck_assert_uint_le(*n, 3);
  for (size_t u = 0; u < *n; u++) { /* the masters before the step */
    fsdp_shard_t sh;
    ck_assert_int_eq(fsdp_unit_shard(e, (fsdp_unit_t)u, &sh), FSDP_SUCCESS);
    n[1 + u] = sh.count;
    grads[u] = malloc(sh.count * sizeof(float));
    memcpy(grads[u], sh.master, sh.count * sizeof(float));
  }
  double loss = 0.0;
  ck_assert_msg(fsdp_gpt2_forward_backward(g, tok, tgt, 1, T124, 1.0f / T124, &loss) ==
                    FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
  for (size_t u = 0; u < *n; u++) { /* gradient = before - after */
    fsdp_shard_t sh;
    ck_assert_int_eq(fsdp_unit_shard(e, (fsdp_unit_t)u, &sh), FSDP_SUCCESS);
    for (size_t i = 0; i < sh.count; i++) grads[u][i] = (grads[u][i] - sh.master[i]) / GRAD_LR;
  }
  free(tok), free(tgt);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
  return loss / T124;
}

START_TEST(gpt2_124m_layer_matches_cpu) {
  static const fsdp_dtype_t dts[] = {FSDP_F32, FSDP_BF16};
  /* fp32: 8.8e-5 elementwise and 5e-7 overall seen (summation order over
   * T = 1024); bf16: 3.9e-3 overall. A wrong index or scale is O(1). */
  static const double tol[] = {1e-3, 3e-2}, loss_tol[] = {1e-5, 1e-3};
  for (int k = 0; k < 2; k++) {
    float *ga[4] = {0}, *gb[4] = {0};
    size_t na[4] = {0}, nb[4] = {0};
    const double la = grads_and_loss(FSDP_DEVICE_CPU, dts[k], ga, na);
    const double lb = grads_and_loss(FSDP_DEVICE_CUDA, dts[k], gb, nb);
    ck_assert_uint_eq(na[0], nb[0]);
    double worst = 0.0, worst2 = 0.0;
    for (size_t u = 0; u < na[0]; u++) {
      ck_assert_uint_eq(na[1 + u], nb[1 + u]);
      double ss = 0.0, err = 0.0, se = 0.0;
      for (size_t i = 0; i < na[1 + u]; i++) ss += (double)ga[u][i] * ga[u][i];
      const double rms = sqrt(ss / (double)na[1 + u]);
      for (size_t i = 0; i < na[1 + u]; i++) {
        const double d = isnan(gb[u][i]) ? INFINITY : fabs((double)ga[u][i] - gb[u][i]);
        err = fmax(err, d);
        se += d * d;
      }
      worst = fmax(worst, err / rms);
      worst2 = fmax(worst2, sqrt(se / ss));
      free(ga[u]), free(gb[u]);
    }
    printf("gpt2 cuda 124M layer (C 768, T 1024, B 1) %s: loss %.6f vs %.6f, gradients max "
           "|error| / RMS %.3g, |error| / |gradient| %.3g (tolerance %.0e)\n",
           fsdp_dtype_name(dts[k]), la, lb, worst, worst2, tol[k]);
    ck_assert(fabs(la - lb) <= loss_tol[k] * la);
    const double err = dts[k] == FSDP_F32 ? worst : worst2;
    ck_assert_msg(err <= tol[k], "%s gradients: %g", fsdp_dtype_name(dts[k]), err);
  }
}
END_TEST

/* Device buffers besides the arena at bf16: tokens and targets (int) and
 * per-row losses (double) of gpt2_io.c; the column sums' partials, two fp32
 * outputs of 128 row slices over fc's 4C columns; the bf16 attention's
 * (B,NH,T) floats of D = rowsum(dout * out) (attention_scratch_bytes). */
static size_t kernel_scratch(const fsdp_gpt2_config_t *c, size_t b, size_t t) {
  return b * t * (2 * 4 + 8) + b * t * (size_t)c->n_head * 4 + 2 * 128 * 4 * (size_t)c->n_embd * 4;
}

static size_t need_at(const fsdp_gpt2_config_t *c, int b, int t) {
  fsdp_gpt2_memory_t m;
  ck_assert_int_eq(fsdp_gpt2_memory(c, b, t, FSDP_BF16, FSDP_GPT2_LAYOUT_BUILT, &m),
                   FSDP_SUCCESS);
  return m.saved + kernel_scratch(c, (size_t)b, (size_t)t);
}

/* GPT-2 1558M in bf16 without checkpointing at the smallest micro-batch of
 * sequence 1024 that does not fit this device's free memory (cudaMemGetInfo;
 * 37 on the simulator's 80 GiB, about 64 on a 140 GiB H200, where the 48 of
 * an 80 GiB card fits): create refuses before allocating anything,
 * saying what it needs, what is free, and three ways to fit, each of which
 * the arithmetic confirms is the largest that does. The micro-batch clears
 * the free memory by an eighth, so that what other processes take or give
 * back in between does not make it fit. On a card of 80 GiB or more the
 * 16 x 1024 of issue 15's preset fits, parameters and AdamW state
 * (18 B/param) included, even without checkpointing: attention keeps no T^2
 * per layer. */
START_TEST(too_big_is_refused_in_words) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.device = FSDP_DEVICE_CUDA;
  c.param_dtype = FSDP_BF16;
  fsdp_engine_t e = NULL;
  fsdp_status_t st = fsdp_engine_create(world, &c, &e);
  if (st == FSDP_ERR_UNSUPPORTED) return;
  ck_assert_msg(st == FSDP_SUCCESS, "engine: %s", fsdp_last_error());
  fsdp_gpt2_config_t big;
  ck_assert_int_eq(fsdp_gpt2_preset("1558M", &big), FSDP_SUCCESS);
  size_t free0 = 0, free1 = 0, total = 0;
  ck_assert_int_eq(fsdp_cuda_mem_info(&free0, &total), FSDP_SUCCESS);
  const size_t at16 = need_at(&big, 16, 1024), state = 18 * fsdp_gpt2_num_params(&big);
  printf("gpt2 cuda 1558M 16 x 1024 bf16: activations %.2f GiB + model state %.2f GiB = %.2f GiB "
         "of %.0f GiB\n", (double)at16 / (1u << 30), (double)state / (1u << 30),
         (double)(at16 + state) / (1u << 30), (double)total / (1u << 30));
  if (total >= (size_t)80 << 30) ck_assert_uint_le(at16 + state, total);
  int batch = 1;
  while (need_at(&big, batch, 1024) <= free0 + free0 / 8) batch++;
  fsdp_gpt2_opts_t o = {.wrap_kinds = "GPT2Block", .max_batch = batch, .max_T = 1024};
  fsdp_gpt2_t g = NULL;
  st = fsdp_gpt2_create(e, &big, &o, &g);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", fsdp_last_error());
  printf("gpt2 cuda 1558M %d x 1024 bf16 (the smallest micro-batch over %.2f GiB free) on %.0f "
         "GiB: %s\n", batch, (double)free0 / (1u << 30), (double)total / (1u << 30), msg);
  ck_assert_int_eq(fsdp_cuda_mem_info(&free1, &total), FSDP_SUCCESS);
  if (g) fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
  ck_assert_msg(st == FSDP_ERR_OUT_OF_MEMORY, "create: %d %s", (int)st, msg);
  ck_assert_ptr_null(g);
  ck_assert_uint_eq(free1, free0); /* refused before allocating */
  char want[128];
  snprintf(want, sizeof want, "needs %.2f GiB", (double)need_at(&big, batch, 1024) / (1u << 30));
  ck_assert_msg(strstr(msg, want), "'%s' not in: %s", want, msg);
  snprintf(want, sizeof want, "%.2f GiB free of %.2f GiB", (double)free0 / (1u << 30),
           (double)total / (1u << 30));
  ck_assert_msg(strstr(msg, want), "'%s' not in: %s", want, msg);
  const char *mb = strstr(msg, "a micro-batch of "), *sl = strstr(msg, "a sequence length of ");
  ck_assert_msg(mb && sl && strstr(msg, "checkpointing of every block"), "%s", msg);
  ck_assert_ptr_null(strstr(msg, "still too much")); /* checkpointing fits */
  const int b = atoi(mb + strlen("a micro-batch of ")), t = atoi(sl + strlen("a sequence length of "));
  ck_assert_msg(b >= 1 && need_at(&big, b, 1024) <= free0 && need_at(&big, b + 1, 1024) > free0,
                "micro-batch %d is not the largest that fits", b);
  ck_assert_msg(t >= 1 && need_at(&big, batch, t) <= free0 && need_at(&big, batch, t + 1) > free0,
                "sequence length %d is not the largest that fits", t);
}
END_TEST

/* ---- every tensor's gradient after one step ----
 * Read through the public API as the parameters' change under one plain SGD
 * step of lr 1 (no momentum, decay or clipping): both engines keep fp32 master
 * weights, so before - after is the reduced, unscaled gradient the optimizer
 * applied, after the whole reduce path (reduce-scatter, bf16 casts on CUDA),
 * with no test hook into the engine. The subtraction costs at most one ulp of
 * the parameter (weights ~0.02: 2e-9), far below the tolerances below. */
enum { MAX_TENSORS = 64 };
typedef struct {
  int n;
  const char *name[MAX_TENSORS]; /* owned by the engine: compare before destroying */
  size_t numel[MAX_TENSORS];
  float *grad[MAX_TENSORS];
  fsdp_engine_t e;
  fsdp_gpt2_t g;
} grads_t;

static fsdp_status_t one_step_grads(const run_t *r, grads_t *out) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.lr = 1.0f;
  const fsdp_status_t st = open_model(r, &c, &out->e, &out->g);
  if (st != FSDP_SUCCESS) return st;
  out->n = 0;
  for (int u = 0; u < fsdp_engine_num_units(out->e); u++) {
    fsdp_unit_info_t ui;
    ck_assert_int_eq(fsdp_unit_info(out->e, u, &ui), FSDP_SUCCESS);
    for (int t = 0; t < ui.n_tensors; t++, out->n++) {
      ck_assert_int_lt(out->n, MAX_TENSORS);
      fsdp_tensor_info_t ti;
      ck_assert_int_eq(fsdp_unit_tensor(out->e, u, t, &ti), FSDP_SUCCESS);
      out->name[out->n] = ti.name;
      out->numel[out->n] = ti.numel;
      out->grad[out->n] = malloc(ti.numel * sizeof(float));
      ck_assert_msg(fsdp_engine_read_tensor(out->e, ti.name, out->grad[out->n], -1) ==
                        FSDP_SUCCESS, "%s", fsdp_last_error());
    }
  }
  int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
  batch(0, model_of(r)->vocab_size, tok, tgt);
  double loss;
  ck_assert_msg(fsdp_gpt2_forward_backward(out->g, tok, tgt, B, T, 1.0f / (B * T), &loss) ==
                    FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_msg(fsdp_engine_step(out->e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
  for (int i = 0; i < out->n; i++) {
    float *after = malloc(out->numel[i] * sizeof(float));
    ck_assert_int_eq(fsdp_engine_read_tensor(out->e, out->name[i], after, -1), FSDP_SUCCESS);
    for (size_t k = 0; k < out->numel[i]; k++) out->grad[i][k] -= after[k];
    free(after);
  }
  free(tok);
  free(tgt);
  return FSDP_SUCCESS;
}

static void grads_free(grads_t *g) {
  for (int i = 0; i < g->n; i++) free(g->grad[i]);
  fsdp_gpt2_destroy(g->g);
  fsdp_engine_destroy(g->e);
}

/* Each tensor's max |gpu - cpu| over max |cpu| (its gradient's own scale), the
 * worst tensor named; every tensor must be at most tol. */
static void compare_grads(const char *what, const run_t *cpu, const run_t *gpu, double tol) {
  grads_t a = {0}, b = {0};
  if (one_step_grads(cpu, &a) != FSDP_SUCCESS || one_step_grads(gpu, &b) != FSDP_SUCCESS) {
    skipped = 1;
    printf("gpt2 cuda %s: SKIP: %s\n", what, fsdp_last_error());
    return;
  }
  ck_assert_int_eq(a.n, b.n);
  double worst = -1.0;
  int worst_i = 0, zero = 0;
  for (int i = 0; i < a.n; i++) {
    ck_assert_str_eq(a.name[i], b.name[i]);
    double d = 0.0, scale = 0.0;
    for (size_t k = 0; k < a.numel[i]; k++) {
      d = fmax(d, fabs((double)b.grad[i][k] - a.grad[i][k]));
      scale = fmax(scale, fabs(a.grad[i][k]));
    }
    zero += scale == 0.0;
    const double rel = d / (scale > 0.0 ? scale : 1.0);
    if (rel > worst) worst = rel, worst_i = i;
    ck_assert_msg(rel <= tol, "%s: %s's gradient differs from the CPU's by %g of its largest "
                  "element %g (tolerance %g)", what, a.name[i], rel, scale, tol);
  }
  printf("gpt2 cuda %s: %d tensors' gradients after one step, worst %s at %.3g of its scale "
         "(tolerance %.0e) ok\n", what, a.n, a.name[worst_i], worst, tol);
  ck_assert_msg(zero == 0, "%s: %d tensors had no gradient at all", what, zero);
  grads_free(&a);
  grads_free(&b);
}

START_TEST(fp32_grads_match_cpu) {
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_F32, NULL, 0, 0, NULL},
        gpu = {FSDP_DEVICE_CUDA, FSDP_F32, NULL, 0, 0, NULL};
  compare_grads("fp32 grads vs cpu", &cpu, &gpu, 1e-4);
}
END_TEST

START_TEST(bf16_grads_follow_cpu) {
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_BF16, NULL, 0, 0, NULL},
        gpu = {FSDP_DEVICE_CUDA, FSDP_BF16, NULL, 0, 0, NULL};
  compare_grads("bf16 grads vs cpu bf16", &cpu, &gpu, 5e-2);
}
END_TEST

/* V 300: the CUDA head's products split the vocabulary at 256 (blas.cu), the
 * logits rows are 384 apart; every tensor's gradient, wte's whole (300, C)
 * among them, follows the CPU's, which runs unsplit and unpadded. (The
 * FSDP_TEST_SMALL runs' V 64 is the remainder product alone; V 256 above is
 * the first product alone.) */
START_TEST(padded_vocab_grads_match_cpu) {
  fsdp_gpt2_config_t v300 = cfg;
  v300.vocab_size = 300;
  run_t cpu = {FSDP_DEVICE_CPU, FSDP_F32, NULL, 0, 0, &v300},
        gpu = {FSDP_DEVICE_CUDA, FSDP_F32, NULL, 0, 0, &v300};
  compare_grads("fp32 grads vs cpu, V 300", &cpu, &gpu, 1e-4);
  cpu.dtype = gpu.dtype = FSDP_BF16;
  if (!skipped) compare_grads("bf16 grads vs cpu bf16, V 300", &cpu, &gpu, 5e-2);
}
END_TEST

/* FSDP_TEST_SMALL: CUDA with checkpointing and prefetch against the CPU. */
START_TEST(small_matches_cpu) {
  run_t cpu = {FSDP_DEVICE_CPU, small_dtype, NULL, 0, 0, NULL};
  run_t gpu = {FSDP_DEVICE_CUDA, small_dtype, "GPT2Block", 0, 0, NULL};
  const int f32 = small_dtype == FSDP_F32;
  result_t a = {0}, b = {0};
  char what[64];
  snprintf(what, sizeof what, "small %s checkpointed vs cpu", fsdp_dtype_name(small_dtype));
  compare(what, &cpu, &gpu, &a, &b, f32 ? 1e-4 : 2e-2);
  free(a.logits);
  free(b.logits);
  snprintf(what, sizeof what, "small %s grads vs cpu", fsdp_dtype_name(small_dtype));
  if (!skipped) compare_grads(what, &cpu, &gpu, f32 ? 1e-4 : 5e-2);
}
END_TEST

static Suite *gpt2_cuda_suite(void) {
  Suite *s = suite_create("gpt2_cuda");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 240);
  const char *small = getenv("FSDP_TEST_SMALL");
  if (small && *small && strcmp(small, "0") != 0) {
    tcase_add_test(tc, small_matches_cpu);
    suite_add_tcase(s, tc);
    return s;
  }
  tcase_add_test(tc, fp32_matches_cpu);
  tcase_add_test(tc, bf16_follows_cpu);
  tcase_add_test(tc, checkpointing_on_cuda);
  tcase_add_test(tc, partial_checkpoint_follows_cpu);
  tcase_add_test(tc, padded_vocab_matches_cpu);
  tcase_add_test(tc, too_big_is_refused_in_words);
  tcase_add_test(tc, fp32_grads_match_cpu);
  tcase_add_test(tc, bf16_grads_follow_cpu);
  tcase_add_test(tc, padded_vocab_grads_match_cpu);
  suite_add_tcase(s, tc);
  tc = tcase_create("layer124m");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, gpt2_124m_layer_matches_cpu);
  suite_add_tcase(s, tc);
  return s;
}

/* FSDP_TEST_SMALL=1: the tiny shape; FSDP_TEST_DTYPE picks its one dtype. */
static int read_mode(void) {
  const char *small = getenv("FSDP_TEST_SMALL"), *dt = getenv("FSDP_TEST_DTYPE");
  if (!small || !*small || strcmp(small, "0") == 0) return 0;
  cfg = (fsdp_gpt2_config_t){2, 2, 32, 16, 64};
  B = 2;
  T = 16;
  STEPS = 2;
  if (!dt || !*dt || strcmp(dt, "f32") == 0) return 0;
  if (strcmp(dt, "bf16") == 0) {
    small_dtype = FSDP_BF16;
    return 0;
  }
  fprintf(stderr, "test_gpt2_cuda: FSDP_TEST_DTYPE '%s' is not f32 or bf16\n", dt);
  return 1;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_gpt2_cuda");
  if (gate) return gate;
  if (read_mode()) return 1;
  if (solo_world_init(&world) != FSDP_SUCCESS) {
    fprintf(stderr, "test_gpt2_cuda: %s\n", fsdp_last_error());
    return 1;
  }
  const int rc = check_run(gpt2_cuda_suite());
  fsdp_world_destroy(world);
  if (rc || !skipped) return rc;
  const char *req = getenv("FSDP_REQUIRE_GPU");
  return req && *req && strcmp(req, "0") != 0 ? 1 : 77;
}
