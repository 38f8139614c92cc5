/* tests/cuda/test_llama_cuda.c — the Llama model (fsdp/nn.h) trained on a
 * CUDA engine against the same model trained on the CPU engine, from the same
 * seed and batches. Shapes: the tiny preset (2 layers, C 64, 4 query heads
 * over 2 KV heads, F 160, V 256) as is, and with 4 KV heads (multi-head);
 * head untied and tied. For each shape and dtype:
 *   losses of a few AdamW steps, the forward-only loss and logits after
 *   them, and every tensor's change under those steps (the parameters after
 *   AdamW), CUDA against the CPU;
 *   every tensor's gradient after one micro-batch, read as the parameters'
 *   change under one plain SGD step (grads_of), CUDA without and with
 *   per-layer checkpointing against the CPU;
 *   per-layer checkpointing on CUDA against none (losses and parameters).
 * fp32: CUDA fp32 kernels against the CPU's; bf16: bf16 parameters and
 * activations on CUDA against the CPU engine with bf16 parameters (fp32
 * compute). bf16 attention runs on cuDNN where it runs the shape and on the
 * in-house flash kernel otherwise (the simulator), grouped-query included
 * (attention_choice.cu).
 * FSDP_TEST_SMALL=1 (the TSan run of scripts/sim-test.sh): T 16, 2 steps, one
 * dtype (FSDP_TEST_DTYPE=f32: grouped-query, untied; bf16: multi-head, tied),
 * CUDA with checkpointing and prefetch against the CPU: losses and every
 * tensor's gradient.
 * CK_RUN_CASE=layer135m (suite big): one SmolLM-135M decoder layer at its real
 * width (C 576, 9 heads of 64 over 3 KV heads, F 1536) at T 512: one
 * micro-batch's loss and every gradient, CUDA against the CPU.
 * Prints one "llama cuda ..." line per comparison. Exits 77 (skipped) without
 * a usable GPU or when the engine has no CUDA backend. CK_FORK=no: a forked
 * child cannot use its parent's CUDA context. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "common/solo_world.h"
#include "cuda_gate.h"
#include "fsdp/fsdp.h"

#define LAYER "LlamaDecoderLayer"

enum { MAX_STEPS = 4, MAX_TENSORS = 32 };
static int B = 2, T = 32, STEPS = 4; /* FSDP_TEST_SMALL: 2, 16, 2 */
static fsdp_llama_config_t cfg;       /* the case's shape */
static fsdp_world_t world;
static fsdp_dtype_t small_dtype = FSDP_F32; /* FSDP_TEST_SMALL: the one dtype */
static int skipped;                         /* a run found no CUDA engine */

typedef struct {
  fsdp_device_kind_t device;
  fsdp_dtype_t dtype;
  const char *checkpoint; /* NULL or LAYER */
} run_t;

/* Every tensor of a model, fp32, in the engine's order (host copies). */
typedef struct {
  int n;
  char *name[MAX_TENSORS];
  size_t numel[MAX_TENSORS];
  float *val[MAX_TENSORS];
} tensors_t;

static void tensors_read(fsdp_engine_t e, tensors_t *t) {
  t->n = 0;
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_unit_info_t ui;
    ck_assert_int_eq(fsdp_unit_info(e, u, &ui), FSDP_SUCCESS);
    for (int k = 0; k < ui.n_tensors; k++, t->n++) {
      ck_assert_int_lt(t->n, MAX_TENSORS);
      fsdp_tensor_info_t ti;
      ck_assert_int_eq(fsdp_unit_tensor(e, u, k, &ti), FSDP_SUCCESS);
      t->name[t->n] = strdup(ti.name);
      t->numel[t->n] = ti.numel;
      t->val[t->n] = malloc(ti.numel * sizeof(float));
      ck_assert(t->name[t->n] && t->val[t->n]);
      ck_assert_msg(fsdp_engine_read_tensor(e, ti.name, t->val[t->n], -1) == FSDP_SUCCESS, "%s",
                    fsdp_last_error());
    }
  }
}

static void tensors_free(tensors_t *t) {
  for (int i = 0; i < t->n; i++) free(t->name[i]), free(t->val[i]);
  t->n = 0;
}

/* A learnable stream: each token follows from the previous one, with noise. */
static void batch(int step, int *tok, int *tgt) {
  const int V = cfg.vocab_size;
  unsigned x = 12345u + 977u * (unsigned)step;
  for (int i = 0; i < B * T; i++) {
    x = x * 1103515245u + 12345u;
    tok[i] = i % T == 0 ? (int)(x >> 16) % V : (tok[i - 1] * 7 + 3) % V;
    if ((x >> 8) % 8 == 0) tok[i] = (int)(x >> 12) % V;
  }
  for (int i = 0; i < B * T; i++) tgt[i] = (tok[i] * 7 + 3) % V;
}

static const char *shape_name(void) {
  static char s[64];
  snprintf(s, sizeof s, "%s%d/%d heads, %s", cfg.n_kv_head == cfg.n_head ? "" : "grouped-query ",
           cfg.n_head, cfg.n_kv_head, cfg.tie_embeddings ? "tied" : "untied");
  return s;
}

/* The engine (c: device and dtype from r) and the model on it, seed 7.
 * FSDP_SUCCESS, or FSDP_ERR_UNSUPPORTED (no CUDA engine: skip). */
static fsdp_status_t open_model(const run_t *r, fsdp_config_t *c, fsdp_engine_t *e,
                                fsdp_llama_t *g) {
  c->device = r->device;
  c->param_dtype = r->dtype;
  c->max_live_units = c->prefetch_depth + 2; /* the root stays gathered */
  *e = NULL;
  *g = NULL;
  fsdp_status_t st = fsdp_engine_create(world, c, e);
  if (st == FSDP_ERR_UNSUPPORTED) return st;
  ck_assert_msg(st == FSDP_SUCCESS, "engine: %s", fsdp_last_error());
  fsdp_llama_opts_t o = {.wrap_kinds = LAYER, .checkpoint_kinds = r->checkpoint, .max_batch = B,
                         .max_T = T};
  st = fsdp_llama_create(*e, &cfg, &o, g);
  if (st == FSDP_SUCCESS) st = fsdp_engine_materialize(*e, 7);
  if (st == FSDP_ERR_UNSUPPORTED) {
    fsdp_llama_destroy(*g);
    fsdp_engine_destroy(*e);
    return st;
  }
  ck_assert_msg(st == FSDP_SUCCESS, "model: %s", fsdp_last_error());
  return FSDP_SUCCESS;
}

typedef struct {
  double loss[MAX_STEPS]; /* mean per token */
  double eval;            /* forward-only loss after training */
  float *logits;          /* (B,T,V) host copy of the forward-only logits */
  tensors_t before, after; /* parameters at init and after the AdamW steps */
} result_t;

static void result_free(result_t *r) {
  free(r->logits);
  tensors_free(&r->before);
  tensors_free(&r->after);
  *r = (result_t){0};
}

static fsdp_status_t train(const run_t *r, result_t *out) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.lr = 1e-3f;
  fsdp_engine_t e;
  fsdp_llama_t g;
  fsdp_status_t st = open_model(r, &c, &e, &g);
  if (st != FSDP_SUCCESS) return st;
  tensors_read(e, &out->before);
  int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
  ck_assert(tok && tgt);
  for (int s = 0; s < STEPS; s++) {
    batch(s, tok, tgt);
    ck_assert_msg(fsdp_llama_forward_backward(g, tok, tgt, B, T, 1.0f / (B * T),
                                              &out->loss[s]) == FSDP_SUCCESS,
                  "%s, %s on %s, step %d: %s", shape_name(), fsdp_dtype_name(r->dtype),
                  r->device == FSDP_DEVICE_CUDA ? "cuda" : "cpu", s, fsdp_last_error());
    ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
    out->loss[s] /= B * T;
  }
  tensors_read(e, &out->after);
  const float *logits = NULL;
  batch(STEPS, tok, tgt);
  ck_assert_msg(fsdp_llama_forward(g, tok, tgt, B, T, &out->eval, &logits) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  out->eval /= B * T;
  const size_t n = (size_t)B * T * cfg.vocab_size;
  out->logits = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(out->logits);
  memcpy(out->logits, logits, n * sizeof(float)); /* host memory on every device */
  free(tok), free(tgt);
  fsdp_llama_destroy(g);
  fsdp_engine_destroy(e);
  return FSDP_SUCCESS;
}

/* Runs a and b; 1 when both trained, 0 when the case is skipped (no CUDA
 * engine). */
static int both(const char *what, const run_t *a, const run_t *b, result_t *ra, result_t *rb) {
  fsdp_status_t st = train(a, ra);
  if (st == FSDP_SUCCESS) st = train(b, rb);
  if (st == FSDP_SUCCESS) return 1;
  skipped = 1;
  printf("llama cuda %s: SKIP: %s\n", what, fsdp_last_error());
  return 0;
}

/* The largest relative difference of the step losses, asserted within tol. */
static void losses_match(const char *what, const result_t *ra, const result_t *rb, double tol) {
  double worst = 0.0;
  for (int s = 0; s < STEPS; s++)
    worst = fmax(worst, fabs(ra->loss[s] - rb->loss[s]) / fabs(ra->loss[s]));
  printf("llama cuda %s (%s): losses %.6f -> %.6f vs %.6f -> %.6f, max relative difference "
         "%.3g (tolerance %.0e) %s\n", what, shape_name(), ra->loss[0], ra->loss[STEPS - 1],
         rb->loss[0], rb->loss[STEPS - 1], worst, tol, worst <= tol ? "ok" : "FAIL");
  ck_assert_msg(ra->loss[STEPS - 1] < ra->loss[0], "%s: the loss did not fall", what);
  ck_assert_msg(worst <= tol, "%s: relative loss difference %g above %g", what, worst, tol);
}

/* Every tensor's change under the AdamW steps: |d(b) - d(a)| / |d(a)| over
 * the tensor (2-norms: AdamW's first steps move each element by about lr
 * whatever its gradient, so an element whose gradient is rounding noise may
 * step either way on either device; a wrong gradient moves most of a tensor
 * the wrong way). The initial parameters must be equal. */
static void params_match(const char *what, const result_t *ra, const result_t *rb, double tol) {
  ck_assert_int_eq(ra->after.n, rb->after.n);
  double worst = -1.0;
  int worst_i = 0;
  for (int i = 0; i < ra->after.n; i++) {
    ck_assert_str_eq(ra->after.name[i], rb->after.name[i]);
    ck_assert_int_eq(memcmp(ra->before.val[i], rb->before.val[i],
                            ra->before.numel[i] * sizeof(float)), 0);
    double se = 0.0, ss = 0.0;
    for (size_t k = 0; k < ra->after.numel[i]; k++) {
      const double da = (double)ra->after.val[i][k] - ra->before.val[i][k];
      const double db = (double)rb->after.val[i][k] - rb->before.val[i][k];
      se += isnan(db) ? INFINITY : (db - da) * (db - da);
      ss += da * da;
    }
    ck_assert_msg(ss > 0.0, "%s: %s did not move", what, ra->after.name[i]);
    const double rel = sqrt(se / ss);
    if (rel > worst) worst = rel, worst_i = i;
    ck_assert_msg(rel <= tol, "%s: %s moved %g (relative) apart from the reference's move "
                  "(tolerance %g)", what, ra->after.name[i], rel, tol);
  }
  printf("llama cuda %s (%s): %d tensors after %d AdamW steps, worst %s's change at %.3g "
         "(tolerance %.0e) ok\n", what, shape_name(), ra->after.n, STEPS,
         ra->after.name[worst_i], worst, tol);
}

/* Forward-only loss within tol relative; logits (tol of their largest, at
 * least 1) when logits_tol > 0. */
static void forward_matches(const char *what, const result_t *ra, const result_t *rb, double tol,
                            double logits_tol) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < (size_t)B * T * cfg.vocab_size; i++) {
    worst = fmax(worst, isnan(rb->logits[i]) ? INFINITY : fabs((double)ra->logits[i] -
                                                                 rb->logits[i]));
    scale = fmax(scale, fabs(ra->logits[i]));
  }
  printf("llama cuda %s forward (%s): eval loss %.6f vs %.6f, logits max difference %.3g (of "
         "%.3g)\n", what, shape_name(), ra->eval, rb->eval, worst, scale);
  ck_assert_msg(fabs(ra->eval - rb->eval) <= tol * ra->eval, "%s: eval loss %g vs %g", what,
                ra->eval, rb->eval);
  ck_assert_msg(logits_tol <= 0 || worst <= logits_tol * fmax(scale, 1.0),
                "%s: logits %g apart (of %g)", what, worst, scale);
}

/* ---- every tensor's gradient after one micro-batch ----
 * Read through the public API as the parameters' change under one plain SGD
 * step (no momentum, decay or clipping) of lr GRAD_LR: both engines keep
 * fp32 masters, so (before - after) / GRAD_LR is the reduced, unscaled
 * gradient the optimizer applied, after the whole reduce path. GRAD_LR is
 * large enough that the change is dominated by lr * gradient (with lr 1 it
 * would carry only 2^-24 of the parameter, about 1e-4 of the smallest
 * gradients here); a power of two divides exactly. */
#define GRAD_LR 1024.0f

/* g: every tensor's gradient; *loss the mean loss. FSDP_SUCCESS, or
 * FSDP_ERR_UNSUPPORTED: no CUDA engine. */
static fsdp_status_t grads_of(const run_t *r, tensors_t *g, double *loss) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.lr = GRAD_LR;
  fsdp_engine_t e;
  fsdp_llama_t m;
  fsdp_status_t st = open_model(r, &c, &e, &m);
  if (st != FSDP_SUCCESS) return st;
  tensors_read(e, g);
  int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
  ck_assert(tok && tgt);
  batch(0, tok, tgt);
  ck_assert_msg(fsdp_llama_forward_backward(m, tok, tgt, B, T, 1.0f / (B * T), loss) ==
                    FSDP_SUCCESS,
                "%s, %s on %s: %s", shape_name(), fsdp_dtype_name(r->dtype),
                r->device == FSDP_DEVICE_CUDA ? "cuda" : "cpu", fsdp_last_error());
  free(tok), free(tgt);
  *loss /= B * T;
  ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
  for (int i = 0; i < g->n; i++) {
    float *after = malloc(g->numel[i] * sizeof(float));
    ck_assert_int_eq(fsdp_engine_read_tensor(e, g->name[i], after, -1), FSDP_SUCCESS);
    for (size_t k = 0; k < g->numel[i]; k++) g->val[i][k] = (g->val[i][k] - after[k]) / GRAD_LR;
    free(after);
  }
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
  return FSDP_SUCCESS;
}

/* Each tensor's max |b - a| over max |a| (its gradient's own scale), the
 * worst named; every tensor within tol, none without a gradient. */
static void grads_match(const char *what, const run_t *ra, const run_t *rb, double tol,
                        double loss_tol) {
  tensors_t a = {0}, b = {0};
  double la = 0.0, lb = 0.0;
  fsdp_status_t st = grads_of(ra, &a, &la);
  if (st == FSDP_SUCCESS) st = grads_of(rb, &b, &lb);
  if (st != FSDP_SUCCESS) {
    tensors_free(&a);
    skipped = 1;
    printf("llama cuda %s: SKIP: %s\n", what, fsdp_last_error());
    return;
  }
  ck_assert_int_eq(a.n, b.n);
  double worst = -1.0;
  int worst_i = 0;
  for (int i = 0; i < a.n; i++) {
    ck_assert_str_eq(a.name[i], b.name[i]);
    double d = 0.0, scale = 0.0;
    for (size_t k = 0; k < a.numel[i]; k++) {
      d = fmax(d, isnan(b.val[i][k]) ? INFINITY : fabs((double)b.val[i][k] - a.val[i][k]));
      scale = fmax(scale, fabs(a.val[i][k]));
    }
    ck_assert_msg(scale > 0.0, "%s: %s has no gradient at all", what, a.name[i]);
    const double rel = d / scale;
    if (rel > worst) worst = rel, worst_i = i;
    ck_assert_msg(rel <= tol, "%s: %s's gradient differs from the reference's by %g of its "
                  "largest element %g (tolerance %g)", what, a.name[i], rel, scale, tol);
  }
  printf("llama cuda %s (%s): loss %.6f vs %.6f, %d tensors' gradients, worst %s at %.3g of its "
         "scale (tolerance %.0e) ok\n", what, shape_name(), la, lb, a.n, a.name[worst_i], worst,
         tol);
  ck_assert_msg(fabs(la - lb) <= loss_tol * la, "%s: loss %.6f vs %.6f", what, la, lb);
  tensors_free(&a);
  tensors_free(&b);
}

/* The tiny preset with n_kv KV heads and the head tied or not. */
static void shape(int n_kv, int tie) {
  ck_assert_int_eq(fsdp_llama_preset("tiny", &cfg), FSDP_SUCCESS);
  cfg.n_kv_head = n_kv;
  cfg.tie_embeddings = tie;
}

/* One shape in one dtype: CPU against CUDA (training, forward, gradients
 * with and without checkpointing), and CUDA checkpointed against not. */
static void case_run(fsdp_dtype_t dt) {
  const int f32 = dt == FSDP_F32;
  run_t cpu = {FSDP_DEVICE_CPU, dt, NULL}, gpu = {FSDP_DEVICE_CUDA, dt, NULL};
  run_t ckpt = {FSDP_DEVICE_CUDA, dt, LAYER};
  char what[96];
  result_t a = {0}, b = {0}, k = {0};
  snprintf(what, sizeof what, "%s vs cpu", fsdp_dtype_name(dt));
  if (both(what, &cpu, &gpu, &a, &b)) {
    losses_match(what, &a, &b, f32 ? 1e-4 : 2e-2);
    forward_matches(what, &a, &b, f32 ? 1e-4 : 2e-2, f32 ? 1e-4 : 0.0);
    /* bf16: gradients ~1e-2 of their scale from the CPU's, so more elements
     * step the other way (0.05 to 0.11 seen); RoPE's sign flipped on CUDA
     * gave 0.85 */
    params_match(what, &a, &b, f32 ? 1e-3 : 0.3);
    snprintf(what, sizeof what, "%s checkpoint vs none", fsdp_dtype_name(dt));
    ck_assert_msg(train(&ckpt, &k) == FSDP_SUCCESS, "%s: %s", what, fsdp_last_error());
    /* recompute runs the same kernels on the same inputs; only the
     * embedding's float atomics may add in another order */
    losses_match(what, &b, &k, f32 ? 1e-5 : 1e-3);
    params_match(what, &b, &k, f32 ? 1e-4 : 1e-2);
  }
  result_free(&a);
  result_free(&b);
  result_free(&k);
  if (skipped) return;
  snprintf(what, sizeof what, "%s grads vs cpu", fsdp_dtype_name(dt));
  grads_match(what, &cpu, &gpu, f32 ? 1e-4 : 5e-2, f32 ? 1e-5 : 1e-2);
  snprintf(what, sizeof what, "%s checkpointed grads vs cpu", fsdp_dtype_name(dt));
  if (!skipped) grads_match(what, &cpu, &ckpt, f32 ? 1e-4 : 5e-2, f32 ? 1e-5 : 1e-2);
}

START_TEST(gqa_untied_f32) {
  shape(2, 0);
  case_run(FSDP_F32);
}
END_TEST

START_TEST(mha_tied_f32) {
  shape(4, 1);
  case_run(FSDP_F32);
}
END_TEST

START_TEST(mha_untied_bf16) {
  shape(4, 0);
  case_run(FSDP_BF16);
}
END_TEST

START_TEST(mha_tied_bf16) {
  shape(4, 1);
  case_run(FSDP_BF16);
}
END_TEST

/* On cuDNN where it loads, on the in-house flash kernel otherwise. */
START_TEST(gqa_untied_bf16) {
  shape(2, 0);
  case_run(FSDP_BF16);
}
END_TEST

/* FSDP_TEST_SMALL: CUDA with checkpointing and prefetch against the CPU. */
START_TEST(small_matches_cpu) {
  const int f32 = small_dtype == FSDP_F32;
  shape(f32 ? 2 : 4, !f32);
  run_t cpu = {FSDP_DEVICE_CPU, small_dtype, NULL};
  run_t gpu = {FSDP_DEVICE_CUDA, small_dtype, LAYER};
  result_t a = {0}, b = {0};
  char what[64];
  snprintf(what, sizeof what, "small %s checkpointed vs cpu", fsdp_dtype_name(small_dtype));
  if (both(what, &cpu, &gpu, &a, &b)) losses_match(what, &a, &b, f32 ? 1e-4 : 2e-2);
  result_free(&a);
  result_free(&b);
  snprintf(what, sizeof what, "small %s grads vs cpu", fsdp_dtype_name(small_dtype));
  if (!skipped) grads_match(what, &cpu, &gpu, f32 ? 1e-4 : 5e-2, f32 ? 1e-5 : 1e-2);
}
END_TEST

/* One SmolLM-135M decoder layer (C 576, 9 heads of 64 over 3 KV heads, F
 * 1536) at T 512, batch 1, a small vocabulary: one micro-batch's loss and
 * every gradient, CUDA against the CPU, fp32 and bf16. */
START_TEST(smollm_layer_matches_cpu) {
  ck_assert_int_eq(fsdp_llama_preset("SmolLM-135M", &cfg), FSDP_SUCCESS);
  cfg.n_layer = 1;
  cfg.vocab_size = 256;
  B = 1;
  T = 512;
  static const fsdp_dtype_t dts[] = {FSDP_F32, FSDP_BF16};
  for (int k = 0; k < 2 && !skipped; k++) {
    run_t cpu = {FSDP_DEVICE_CPU, dts[k], NULL}, gpu = {FSDP_DEVICE_CUDA, dts[k], NULL};
    char what[64];
    snprintf(what, sizeof what, "SmolLM-135M layer, T %d, %s", T, fsdp_dtype_name(dts[k]));
    grads_match(what, &cpu, &gpu, dts[k] == FSDP_F32 ? 1e-4 : 5e-2,
                dts[k] == FSDP_F32 ? 1e-5 : 1e-2);
  }
}
END_TEST

static Suite *llama_cuda_suite(void) {
  Suite *s = suite_create("llama_cuda");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 600);
  const char *small = getenv("FSDP_TEST_SMALL");
  if (small && *small && strcmp(small, "0") != 0) {
    tcase_add_test(tc, small_matches_cpu);
    suite_add_tcase(s, tc);
    return s;
  }
  tcase_add_test(tc, gqa_untied_f32);
  tcase_add_test(tc, mha_tied_f32);
  tcase_add_test(tc, mha_untied_bf16);
  tcase_add_test(tc, mha_tied_bf16);
  tcase_add_test(tc, gqa_untied_bf16);
  suite_add_tcase(s, tc);
  tc = tcase_create("layer135m");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, smollm_layer_matches_cpu);
  suite_add_tcase(s, tc);
  return s;
}

/* FSDP_TEST_SMALL=1: T 16, 2 steps; FSDP_TEST_DTYPE picks its one dtype. */
static int read_mode(void) {
  const char *small = getenv("FSDP_TEST_SMALL"), *dt = getenv("FSDP_TEST_DTYPE");
  if (!small || !*small || strcmp(small, "0") == 0) return 0;
  T = 16;
  STEPS = 2;
  if (!dt || !*dt || strcmp(dt, "f32") == 0) return 0;
  if (strcmp(dt, "bf16") == 0) {
    small_dtype = FSDP_BF16;
    return 0;
  }
  fprintf(stderr, "test_llama_cuda: FSDP_TEST_DTYPE '%s' is not f32 or bf16\n", dt);
  return 1;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_llama_cuda");
  if (gate) return gate;
  if (read_mode()) return 1;
  if (solo_world_init(&world) != FSDP_SUCCESS) {
    fprintf(stderr, "test_llama_cuda: %s\n", fsdp_last_error());
    return 1;
  }
  const int rc = check_run(llama_cuda_suite());
  fsdp_world_destroy(world);
  if (rc || !skipped) return rc;
  const char *req = getenv("FSDP_REQUIRE_GPU");
  return req && *req && strcmp(req, "0") != 0 ? 1 : 77;
}
