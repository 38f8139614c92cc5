/* tests/unit/test_gpt2.c — GPT-2 on one rank: the published parameter counts,
 * the unit plans the wrap policies make, the model's gradient against finite
 * differences, activation checkpointing giving identical gradients with the
 * memory the shapes predict (k of L blocks too, and checkpoint auto's choice
 * at budgets around its boundaries), the activation memory computed without
 * a model (fsdp_gpt2_memory), and sampling. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "common/solo_world.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;
static void setup(void) { ck_assert_int_eq(solo_world_init(&world), FSDP_SUCCESS); }
static void teardown(void) { fsdp_world_destroy(world); }

/* Small enough for finite differences, with no power-of-two sizes. */
static const fsdp_gpt2_config_t cfg = {2, 3, 12, 9, 11};
enum { B = 2, T = 7 };

START_TEST(published_sizes) {
  static const struct { const char *name; size_t params; } sizes[] = {
      {"124M", 124439808}, {"350M", 354823168}, {"774M", 774030080}, {"1558M", 1557611200}};
  for (size_t i = 0; i < 4; i++) {
    fsdp_gpt2_config_t c;
    ck_assert_int_eq(fsdp_gpt2_preset(sizes[i].name, &c), FSDP_SUCCESS);
    ck_assert_uint_eq(fsdp_gpt2_num_params(&c), sizes[i].params);
  }
  fsdp_gpt2_config_t c;
  ck_assert_int_ne(fsdp_gpt2_preset("125M", &c), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "125M"));
  c = cfg;
  c.n_head = 5;
  ck_assert_int_ne(fsdp_gpt2_config_check(&c), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "divisible"));
}
END_TEST

static fsdp_engine_t engine(const fsdp_config_t *c) {
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, c, &e), FSDP_SUCCESS);
  return e;
}

static fsdp_gpt2_t model(fsdp_engine_t e, const char *wrap, size_t min_params, const char *ckpt) {
  fsdp_gpt2_opts_t o = {.wrap_kinds = wrap, .wrap_min_params = min_params,
                         .checkpoint_kinds = ckpt, .max_batch = B};
  fsdp_gpt2_t g;
  ck_assert_int_eq(fsdp_gpt2_create(e, &cfg, &o, &g), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  return g;
}

/* Units each policy makes, and that the units hold every parameter once. */
START_TEST(wrap_plans) {
  static const struct { const char *wrap; size_t min; int units; const char *second; } plans[] = {
      {NULL, 0, 1, NULL},              /* one root unit */
      {"GPT2Block", 0, 3, "h.0"},      /* root + one per block */
      {NULL, 1, 3, "h.0"},             /* any block reaches 1 parameter */
      {NULL, 3000, 2, "h.0-1"},        /* two blocks (1884 each) make one unit */
      {NULL, 100000, 1, NULL},         /* nothing reaches it: all in the root */
  };
  for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    fsdp_engine_t e = engine(&c);
    fsdp_gpt2_t g = model(e, plans[i].wrap, plans[i].min, NULL);
    ck_assert_int_eq(fsdp_engine_num_units(e), plans[i].units);
    size_t total = 0;
    for (int u = 0; u < plans[i].units; u++) {
      fsdp_unit_info_t info;
      fsdp_unit_info(e, u, &info);
      total += info.numel;
      if (u == 0) ck_assert_str_eq(info.name, "root");
      if (u == 1) ck_assert_str_eq(info.name, plans[i].second);
    }
    ck_assert_uint_eq(total, fsdp_gpt2_num_params(&cfg));
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
  }
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_opts_t bad = {.wrap_kinds = "GPT2Attention", .max_batch = B};
  fsdp_gpt2_t g;
  ck_assert_int_ne(fsdp_gpt2_create(e, &cfg, &bad, &g), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "GPT2Attention"));
  fsdp_gpt2_opts_t no_unit = {.checkpoint_kinds = "GPT2Block", .max_batch = B};
  ck_assert_int_ne(fsdp_gpt2_create(e, &cfg, &no_unit, &g), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "wrap"));
  fsdp_engine_destroy(e);
}
END_TEST

static void batch(int *tok, int *tgt) {
  for (int i = 0; i < B * T; i++) {
    tok[i] = (i * 7 + 3) % cfg.vocab_size;
    tgt[i] = (i * 5 + 1) % cfg.vocab_size;
  }
}

static const char *const probe_tensors[] = {"wte", "wpe", "h.0.attn.c_attn.weight",
                                            "h.1.mlp.c_proj.weight", "h.1.ln_2.weight",
                                            "ln_f.bias", "h.0.attn.c_proj.bias"};

/* The gradient the engine applied (SGD, lr 1: before - after) against central
 * differences of the loss, on a few elements of tensors all over the model. In
 * fp32 with eps 1e-2 the differences carry ~1e-4 absolute error from rounding
 * and O(eps^2) curvature: tolerance 2e-3 absolute plus 5 % relative. */
START_TEST(gradient_check) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.lr = 1.0f;
  c.prefetch_depth = 2;
  int tok[B * T], tgt[B * T];
  batch(tok, tgt);
  float before[2000], after[2000];
  for (size_t p = 0; p < sizeof probe_tensors / sizeof probe_tensors[0]; p++) {
    /* A fresh model per tensor: the step moved every other tensor too. */
    fsdp_engine_t e = engine(&c);
    fsdp_gpt2_t g = model(e, "GPT2Block", 0, _i ? "GPT2Block" : NULL);
    const char *name = probe_tensors[p];
    fsdp_engine_read_tensor(e, name, before, -1);
    ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 1.0f, NULL), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    fsdp_engine_read_tensor(e, name, after, -1);
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
    e = engine(&c);
    g = model(e, "GPT2Block", 0, NULL);
    for (int k = 0; k < 3; k++) {
      int i = (k * 37 + (int)p * 11) % 12;
      float grad = before[i] - after[i], keep = before[i];
      double lp, lm;
      before[i] = keep + 1e-2f;
      fsdp_engine_load_tensor(e, name, before, 0);
      fsdp_gpt2_forward(g, tok, tgt, B, T, &lp, NULL);
      before[i] = keep - 1e-2f;
      fsdp_engine_load_tensor(e, name, before, 0);
      fsdp_gpt2_forward(g, tok, tgt, B, T, &lm, NULL);
      before[i] = keep;
      double fd = (lp - lm) / 2e-2;
      ck_assert_msg(fabs(fd - grad) <= 2e-3 + 0.05 * fabs(fd), "%s[%d]: engine %g, numeric %g",
                    name, i, (double)grad, fd);
    }
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
  }
}
END_TEST

START_TEST(checkpoint_identical) {
  float w[2][2000];
  size_t act[2], full[2];
  for (int ck = 0; ck < 2; ck++) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    c.strategy = (fsdp_strategy_t)_i;
    fsdp_engine_t e = engine(&c);
    fsdp_gpt2_t g = model(e, "GPT2Block", 0, ck ? "GPT2Block" : NULL);
    int tok[B * T], tgt[B * T];
    batch(tok, tgt);
    for (int s = 0; s < 3; s++) {
      ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    }
    fsdp_engine_read_tensor(e, "h.0.mlp.c_fc.weight", w[ck], -1);
    act[ck] = fsdp_gpt2_activation_bytes(g, &full[ck]);
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
  }
  ck_assert_int_eq(memcmp(w[0], w[1], 12 * 48 * sizeof(float)), 0);
  /* Predicted by the shapes: every block but one (the recompute scratch) stops
   * keeping its activations: per token ln_1 C, qkv 3C, attention output C, first
   * residual C, ln_2 C, MLP 4C before and 4C after GELU, and 4 LayerNorm
   * statistics, plus NH x T attention probabilities. */
  size_t C = (size_t)cfg.n_embd, maxT = (size_t)cfg.block_size;
  size_t per_block = ((size_t)B * maxT * (15 * C + 4) + (size_t)B * (size_t)cfg.n_head * maxT * maxT)
                     * sizeof(float);
  ck_assert_uint_eq(act[0], full[0]);
  ck_assert_uint_eq(full[1], full[0]);
  ck_assert_uint_eq(act[0] - act[1], (size_t)(cfg.n_layer - 1) * per_block);
}
END_TEST

/* A checkpointed unit of two blocks (wrap_min_params groups h.0-1): the
 * recompute of its second block finishes that block's input from the first's
 * residual (the residual add lives in the next LayerNorm's kernel), so its
 * gradients, and three steps' weights of both blocks, are those of the run
 * that keeps every activation, bit for bit. */
START_TEST(checkpoint_grouped_identical) {
  float w[2][2][2000];
  size_t act[2], full[2];
  for (int ck = 0; ck < 2; ck++) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    fsdp_engine_t e = engine(&c);
    fsdp_plan_opts_t plan = FSDP_PLAN_OPTS_INIT;
    plan.wrap_min_params = 3000;
    plan.checkpoint_names = ck ? "h.*" : NULL;
    fsdp_gpt2_opts_t o = {.plan = &plan, .max_batch = B};
    fsdp_gpt2_t g;
    ck_assert_msg(fsdp_gpt2_create(e, &cfg, &o, &g) == FSDP_SUCCESS, "%s", fsdp_last_error());
    ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_num_units(e), 2);
    int tok[B * T], tgt[B * T];
    batch(tok, tgt);
    for (int s = 0; s < 3; s++) {
      ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    }
    fsdp_engine_read_tensor(e, "h.0.mlp.c_fc.weight", w[ck][0], -1);
    fsdp_engine_read_tensor(e, "h.1.attn.c_attn.weight", w[ck][1], -1);
    act[ck] = fsdp_gpt2_activation_bytes(g, &full[ck]);
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
  }
  /* two blocks of one checkpointed unit keep two blocks of recompute scratch */
  ck_assert_uint_eq(act[1], act[0]);
  ck_assert_int_eq(memcmp(w[0][0], w[1][0], 12 * 48 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(w[0][1], w[1][1], 12 * 36 * sizeof(float)), 0);
}
END_TEST

/* fsdp_checkpoint_auto on made-up sizes: the fewest k at budgets around each
 * boundary (exactly fits: k; one byte less: the next k that saves memory),
 * k = 1 never chosen (it keeps a layer of scratch for the one it frees), the
 * fixed part counted, and a budget nothing fits refused in numbers. */
START_TEST(checkpoint_auto_choice) {
  const fsdp_gpt2_memory_t m = {.per_layer = 1000, .inputs = 300, .common = 50};
  const int L = 8;
  const size_t fixed = 7000;
  ck_assert_uint_eq(fsdp_activation_arena_bytes(&m, L, 0), 300 + 8 * 1000 + 50);
  ck_assert_uint_eq(fsdp_activation_arena_bytes(&m, 5, 1), 300 + 6 * 1000 + 50);
  fsdp_checkpoint_choice_t ch;
  for (int k = 0; k <= L; k++) {
    if (k == 1) continue;
    const size_t acts = fsdp_activation_arena_bytes(&m, L - k, k > 0);
    ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, fixed, fixed + acts, &ch), FSDP_SUCCESS);
    ck_assert_int_eq(ch.k, k);
    ck_assert_uint_eq(ch.activations, acts);
    ck_assert_uint_eq(ch.need, fixed + acts);
    if (k == L) break;
    ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, fixed, fixed + acts - 1, &ch), FSDP_SUCCESS);
    ck_assert_int_eq(ch.k, k == 0 ? 2 : k + 1);
  }
  ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, fixed, (size_t)1 << 40, &ch), FSDP_SUCCESS);
  ck_assert_int_eq(ch.k, 0);
  /* every layer checkpointed, one byte short: refused, naming the numbers */
  const size_t all = fixed + fsdp_activation_arena_bytes(&m, 0, 1);
  ch.k = -5;
  ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, fixed, all - 1, &ch), FSDP_ERR_OUT_OF_MEMORY);
  ck_assert_int_eq(ch.k, -5); /* untouched */
  char want[64];
  snprintf(want, sizeof want, "(%zu bytes)", all - 1);
  ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  snprintf(want, sizeof want, "(%zu bytes;", all);
  ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "all 8 layers checkpointed"));
  /* a fixed part past the budget fits nothing */
  ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, 1u << 20, 1000, &ch), FSDP_ERR_OUT_OF_MEMORY);
  /* ... and its sums in the message saturate instead of wrapping */
  ck_assert_int_eq(fsdp_checkpoint_auto(&m, L, SIZE_MAX, SIZE_MAX - 1, &ch),
                   FSDP_ERR_OUT_OF_MEMORY);
  snprintf(want, sizeof want, "(%zu bytes;", (size_t)SIZE_MAX);
  ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_checkpoint_auto(NULL, L, 0, 1, &ch), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_checkpoint_auto(&m, 0, 0, 1, &ch), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "n_layer"));
}
END_TEST

/* Four blocks, so that k of L is partial. */
static const fsdp_gpt2_config_t cfg4 = {4, 3, 12, 9, 11};

/* Materializes e (seed 5) and takes three steps of g on the test's batch. */
static void train3(fsdp_engine_t e, fsdp_gpt2_t g) {
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  int tok[B * T], tgt[B * T];
  batch(tok, tgt);
  for (int s = 0; s < 3; s++) {
    ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
}

/* Three SGD-free AdamW steps with the first blocks checkpointed by names
 * (ckpt) or by checkpoint_auto at budget (reserved: memory_reserved); the
 * weights of h.0 and h.3 after them, the activation bytes, the blocks
 * checkpointed, the engine's reserved bytes (fsdp_engine_memory). A create
 * refused returns its status. */
static fsdp_status_t train4(const char *ckpt, int autock, size_t budget, size_t reserved,
                            float w[2][2000], size_t *act, size_t *full, int *k, size_t *state) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_plan_opts_t plan = FSDP_PLAN_OPTS_INIT;
  plan.wrap_kinds = "GPT2Block";
  plan.checkpoint_names = ckpt;
  fsdp_gpt2_opts_t o = {.plan = &plan, .max_batch = B, .checkpoint_auto = autock,
                        .memory_budget = budget, .memory_reserved = reserved};
  fsdp_gpt2_t g;
  fsdp_status_t st = fsdp_gpt2_create(e, &cfg4, &o, &g);
  if (st != FSDP_SUCCESS) {
    fsdp_engine_destroy(e);
    return st;
  }
  train3(e, g);
  fsdp_mem_stats_t mem;
  ck_assert_int_eq(fsdp_engine_memory(e, &mem), FSDP_SUCCESS);
  *state = mem.total_reserved;
  fsdp_engine_read_tensor(e, "h.0.mlp.c_fc.weight", w[0], -1);
  fsdp_engine_read_tensor(e, "h.3.attn.c_attn.weight", w[1], -1);
  *act = fsdp_gpt2_activation_bytes(g, full);
  size_t used;
  *k = fsdp_gpt2_checkpointed(g, &used);
  if (autock) ck_assert_uint_eq(used, budget);
  for (int l = 0; l < cfg4.n_layer; l++) /* the first k, whichever policy chose them */
    ck_assert_int_eq(fsdp_gpt2_layer_checkpointed(g, l), l < *k);
  ck_assert_int_eq(fsdp_gpt2_layer_checkpointed(g, cfg4.n_layer), -1);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
  return FSDP_SUCCESS;
}

/* k of L blocks checkpointed (by names, then by checkpoint_auto at budgets
 * around each boundary) trains bit for bit as none, and holds the arena the
 * size function gives for that k: L - k blocks saved and one of scratch. The
 * budgets are built from the model's own bytes: its activation bytes without
 * checkpointing less L blocks is everything but the blocks (the kernels'
 * memory, inputs, head), so the exact budget for k is that + (L - k + 1)
 * blocks + the engine's state (what fsdp_engine_memory reports after the
 * steps: auto sized it before materialize by fsdp_engine_memory_plan) (+
 * memory_reserved). */
START_TEST(checkpoint_partial_identical) {
  static float w0[2][2000], w[2][2000];
  size_t act0, full0, act, full, state, state_k;
  int k;
  ck_assert_int_eq(train4(NULL, 0, 0, 0, w0, &act0, &full0, &k, &state), FSDP_SUCCESS);
  ck_assert_int_eq(k, 0);
  ck_assert_uint_eq(act0, full0);
  const size_t C = (size_t)cfg4.n_embd, maxT = (size_t)cfg4.block_size;
  const size_t per = ((size_t)B * maxT * (15 * C + 4) + (size_t)B * cfg4.n_head * maxT * maxT) *
                     sizeof(float);
  const int L = cfg4.n_layer;
  const fsdp_gpt2_memory_t m = {.per_layer = per};
  const size_t base = full0 - fsdp_activation_arena_bytes(&m, L, 0);
  static const char *const names[] = {"h.0", "h.0,h.1", "h.[0-2]", "h.*"};
  for (int n = 1; n <= L; n++) {
    ck_assert_int_eq(train4(names[n - 1], 0, 0, 0, w, &act, &full, &k, &state_k), FSDP_SUCCESS);
    ck_assert_int_eq(k, n);
    ck_assert_uint_eq(full, full0);
    ck_assert_uint_eq(act, base + fsdp_activation_arena_bytes(&m, L - n, 1));
    ck_assert_int_eq(memcmp(w0[0], w[0], 12 * 48 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(w0[1], w[1], 12 * 36 * sizeof(float)), 0);
  }
  /* auto: exactly fits -> k; one byte less -> the next k that saves memory */
  const size_t reserved = 12345;
  for (int want = 0; want <= L; want++) {
    if (want == 1) continue;
    const size_t exact =
        reserved + state + base + fsdp_activation_arena_bytes(&m, L - want, want > 0);
    ck_assert_msg(train4(NULL, 1, exact, reserved, w, &act, &full, &k, &state_k) ==
                      FSDP_SUCCESS, "%s", fsdp_last_error());
    ck_assert_int_eq(k, want);
    ck_assert_uint_eq(act, exact - reserved - state);
    ck_assert_uint_eq(state_k, state);
    ck_assert_int_eq(memcmp(w0[0], w[0], 12 * 48 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(w0[1], w[1], 12 * 36 * sizeof(float)), 0);
    fsdp_status_t st = train4(NULL, 1, exact - 1, reserved, w, &act, &full, &k, &state_k);
    if (want == L) { /* nothing fits: refused in words naming the numbers */
      ck_assert_int_eq(st, FSDP_ERR_OUT_OF_MEMORY);
      char num[64];
      snprintf(num, sizeof num, "(%zu bytes)", exact - 1);
      ck_assert_msg(strstr(fsdp_last_error(), num) &&
                        strstr(fsdp_last_error(), "all 4 layers checkpointed") &&
                        strstr(fsdp_last_error(), "GPT-2, micro-batch 2 x 9"),
                    "%s", fsdp_last_error());
      break;
    }
    ck_assert_int_eq(st, FSDP_SUCCESS);
    ck_assert_int_eq(k, want == 0 ? 2 : want + 1);
  }
  /* the CPU without a budget: nothing checkpointed, no budget reported */
  ck_assert_int_eq(train4(NULL, 1, 0, 0, w, &act, &full, &k, &state_k), FSDP_SUCCESS);
  ck_assert_int_eq(k, 0);
  ck_assert_uint_eq(act, full0);
  /* a memory_reserved that would wrap the fixed part past SIZE_MAX fits nothing */
  ck_assert_int_eq(train4(NULL, 1, 1u << 30, SIZE_MAX, w, &act, &full, &k, &state_k),
                   FSDP_ERR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(fsdp_last_error(), "holds no plan"), "%s", fsdp_last_error());
  /* auto beside another checkpointing policy, or over grouped units: refused */
  ck_assert_int_eq(train4("h.1", 1, 1u << 30, 0, w, &act, &full, &k, &state_k),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "one policy"));
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_opts_t grouped = {.wrap_min_params = 3000, .max_batch = B, .checkpoint_auto = 1,
                              .memory_budget = 1u << 30};
  fsdp_gpt2_t g;
  ck_assert_int_eq(fsdp_gpt2_create(e, &cfg4, &grouped, &g), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "a unit of its own"));
  fsdp_engine_destroy(e);
}
END_TEST

/* Three steps under a plan; w: two tensors after them, one from each block. */
static void plan_train(const fsdp_gpt2_opts_t *o, int units, float w[2][2000]) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_t g;
  ck_assert_msg(fsdp_gpt2_create(e, &cfg, o, &g) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_engine_num_units(e), units);
  train3(e, g);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "h.0.mlp.c_fc.weight", w[0], -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "h.1.attn.c_attn.weight", w[1], -1), FSDP_SUCCESS);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
}

static fsdp_wrap_t second_only(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  (void)user, (void)m, (void)n, (void)open;
  return i == 1 ? FSDP_WRAP_UNIT : FSDP_WRAP_SKIP;
}

/* The library's policies (fsdp/plan.h) shape GPT-2 without changing what it
 * computes: a block left in the root ahead of a wrapped one (names), the same
 * from a callback with the wrapped block recomputed, all bit for bit as a unit
 * per block. */
START_TEST(plans_train_identically) {
  float ref[2][2000], got[2][2000];
  fsdp_gpt2_opts_t o = {.wrap_kinds = "GPT2Block", .max_batch = B};
  plan_train(&o, 3, ref);
  fsdp_plan_opts_t names = FSDP_PLAN_OPTS_INIT, fn = FSDP_PLAN_OPTS_INIT;
  names.wrap_names = "h.1";
  fn.wrap_fn = second_only;
  fn.checkpoint_names = "h.1";
  const fsdp_plan_opts_t *plans[2] = {&names, &fn};
  for (int i = 0; i < 2; i++) {
    fsdp_gpt2_opts_t p = {.plan = plans[i], .max_batch = B};
    plan_train(&p, 2, got);
    ck_assert_int_eq(memcmp(ref[0], got[0], 12 * 48 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(ref[1], got[1], 12 * 36 * sizeof(float)), 0);
  }
}
END_TEST

/* unit_opts: h.1's tensors frozen (lr_mult 0) and kept gathered (ZeRO-2). */
static fsdp_status_t freeze_h1(void *user, const char *unit, const char *kind,
                               const fsdp_tensor_desc_t *t, int n, fsdp_unit_opts_t *o) {
  static float zeros[64];
  (void)t, (void)kind;
  ++*(int *)user;
  if (strcmp(unit, "h.1")) return FSDP_SUCCESS;
  ck_assert_int_le(n, 64);
  o->lr_mult = zeros;
  o->reshard_after_forward = 0;
  return FSDP_SUCCESS;
}

START_TEST(unit_options_from_a_callback) {
  float before[2][2000], after[2][2000];
  int calls = 0;
  fsdp_gpt2_opts_t o = {.wrap_kinds = "GPT2Block", .max_batch = B, .unit_opts = freeze_h1,
                        .unit_opts_user = &calls};
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_t g;
  ck_assert_int_eq(fsdp_gpt2_create(e, &cfg, &o, &g), FSDP_SUCCESS);
  ck_assert_int_eq(calls, 3); /* root, h.0, h.1 */
  fsdp_unit_info_t info;
  ck_assert_int_eq(fsdp_unit_info(e, 2, &info), FSDP_SUCCESS);
  ck_assert_str_eq(info.name, "h.1");
  ck_assert_int_eq(info.reshard_after_forward, 0);
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  fsdp_engine_read_tensor(e, "h.0.attn.c_attn.weight", before[0], -1);
  fsdp_engine_read_tensor(e, "h.1.attn.c_attn.weight", before[1], -1);
  int tok[B * T], tgt[B * T];
  batch(tok, tgt);
  ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_engine_read_tensor(e, "h.0.attn.c_attn.weight", after[0], -1);
  fsdp_engine_read_tensor(e, "h.1.attn.c_attn.weight", after[1], -1);
  ck_assert_int_ne(memcmp(before[0], after[0], 12 * 36 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(before[1], after[1], 12 * 36 * sizeof(float)), 0);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
}
END_TEST

/* bf16 parameters: compute sees weights rounded to 8 significant bits, so the
 * loss curve follows f32's within bf16's resolution (2^-8 relative per weight;
 * allow 2 % on the loss), while the fp32 master keeps learning. */
START_TEST(bf16_follows_f32) {
  double loss[2][10];
  for (int k = 0; k < 2; k++) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    c.param_dtype = k ? FSDP_BF16 : FSDP_F32;
    c.optim.lr = 1e-2f;
    fsdp_engine_t e = engine(&c);
    fsdp_gpt2_t g = model(e, "GPT2Block", 0, NULL);
    int tok[B * T], tgt[B * T];
    batch(tok, tgt);
    for (int s = 0; s < 10; s++) {
      ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 1.0f / (B * T), &loss[k][s]),
                       FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    }
    fsdp_gpt2_destroy(g);
    fsdp_engine_destroy(e);
  }
  ck_assert(loss[0][9] < 0.8 * loss[0][0]);
  for (int s = 0; s < 10; s++)
    ck_assert_msg(fabs(loss[1][s] - loss[0][s]) <= 0.02 * loss[0][s], "step %d: bf16 %g, f32 %g",
                  s, loss[1][s], loss[0][s]);
  ck_assert(loss[1][0] != loss[0][0]); /* bf16 really was used */
}
END_TEST

/* top-k 1 is greedy: every draw is the argmax of the logits, whatever the
 * seed; top-k k draws only among the k largest. */
START_TEST(sampling_top_k) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_t g = model(e, "GPT2Block", 0, NULL);
  int ctx[8] = {1, 2}, a[6], b[6];
  fsdp_gpt2_sampling_t greedy = {1.0f, 1, 7}, other = {1.0f, 1, 99};
  ck_assert_int_eq(fsdp_gpt2_sample(g, ctx, 2, 6, &greedy, a), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_gpt2_sample(g, ctx, 2, 6, &other, b), FSDP_SUCCESS);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
  for (int i = 0; i < 6; i++) {
    const float *logits;
    ck_assert_int_eq(fsdp_gpt2_forward(g, ctx, NULL, 1, 2 + i, NULL, &logits), FSDP_SUCCESS);
    const float *row = logits + (size_t)(1 + i) * cfg.vocab_size;
    int best = 0;
    for (int v = 1; v < cfg.vocab_size; v++) best = row[v] > row[best] ? v : best;
    ck_assert_int_eq(a[i], best);
    ctx[2 + i] = a[i];
  }
  fsdp_gpt2_sampling_t top3 = {5.0f, 3, 11}; /* hot: without the cut, any token */
  int many[40];
  const float *logits;
  ck_assert_int_eq(fsdp_gpt2_sample(g, ctx, 2, 1, &top3, many), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_gpt2_forward(g, ctx, NULL, 1, 2, NULL, &logits), FSDP_SUCCESS);
  float row[512];
  memcpy(row, logits + cfg.vocab_size, cfg.vocab_size * sizeof(float));
  for (int s = 0; s < 40; s++) {
    top3.seed = (uint64_t)s;
    ck_assert_int_eq(fsdp_gpt2_sample(g, ctx, 2, 1, &top3, &many[s]), FSDP_SUCCESS);
    int above = 0;
    for (int v = 0; v < cfg.vocab_size; v++) above += row[v] > row[many[s]];
    ck_assert_msg(above < 3, "seed %d drew token %d, %d logits above it", s, many[s], above);
  }
  fsdp_gpt2_sampling_t bad = {1.0f, -1, 1};
  ck_assert_int_eq(fsdp_gpt2_sample(g, ctx, 2, 1, &bad, a), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(sampling_and_errors) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&c);
  fsdp_gpt2_t g = model(e, "GPT2Block", 0, NULL);
  int prompt[2] = {1, 2}, a[20], b[20];
  ck_assert_int_eq(fsdp_gpt2_generate(g, prompt, 2, 20, 1.0f, 7, a), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_gpt2_generate(g, prompt, 2, 20, 1.0f, 7, b), FSDP_SUCCESS);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
  for (int i = 0; i < 20; i++) ck_assert(a[i] >= 0 && a[i] < cfg.vocab_size);
  int tok[B * T], tgt[B * T];
  batch(tok, tgt);
  tok[5] = cfg.vocab_size;
  ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 1.0f, NULL),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "position 5"));
  batch(tok, tgt);
  ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, cfg.block_size + 1, 1.0f, NULL),
                   FSDP_ERR_INVALID_ARGUMENT);
  /* The refused calls left the engine ready to train. */
  ck_assert_int_eq(fsdp_gpt2_forward_backward(g, tok, tgt, B, T, 1.0f, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_gpt2_destroy(g);
  fsdp_engine_destroy(e);
}
END_TEST

/* fsdp_gpt2_memory: the arena by the shapes, for both layouts, at a shape
 * where every buffer is a multiple of the 256-byte alignment (so the formula
 * is exact); the numbers at 124M and 1558M; bad arguments named. */
START_TEST(memory_plan) {
  const fsdp_gpt2_config_t c = {3, 4, 64, 64, 250};
  const size_t Bm = 2, Tm = 64, C = 64, NH = 4, BT = Bm * Tm, f = sizeof(float);
  fsdp_gpt2_memory_t m[2];
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 64, FSDP_F32, FSDP_GPT2_LAYOUT_PROBS, &m[0]),
                   FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 64, FSDP_F32, FSDP_GPT2_LAYOUT_FLASH, &m[1]),
                   FSDP_SUCCESS);
  /* Per block: 15 C activations and 4 LayerNorm statistics per token, plus
   * attention's (B,NH,T,T) probabilities or (B,NH,T) log-sum-exp. */
  ck_assert_uint_eq(m[0].attention, Bm * NH * Tm * Tm * f);
  ck_assert_uint_eq(m[1].attention, Bm * NH * Tm * f);
  ck_assert_uint_eq(m[0].per_layer, BT * (15 * C + 4) * f + m[0].attention);
  ck_assert_uint_eq(m[1].per_layer, BT * (15 * C + 4) * f + m[1].attention);
  ck_assert_uint_eq(m[0].inputs, 4 * BT * C * f);
  /* ln_f (C + 2), backward scratch 13 C (9 C since the fused backward writes
   * GELU's gradient over fc-proj's), and logits: V twice, or Vp = 256 once. */
  ck_assert_uint_eq(m[0].common, BT * (14 * C + 2 + 2 * 250) * f);
  ck_assert_uint_eq(m[1].common, BT * (10 * C + 2 + 256) * f);
  for (int i = 0; i < 2; i++) {
    ck_assert_uint_eq(m[i].saved, m[i].inputs + 3 * m[i].per_layer + m[i].common);
    ck_assert_uint_eq(m[i].checkpointed, m[i].inputs + m[i].per_layer + m[i].common);
  }
  /* Today's kernels keep probabilities and one padded logits buffer. */
  fsdp_gpt2_memory_t built;
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 64, FSDP_F32, FSDP_GPT2_LAYOUT_BUILT, &built),
                   FSDP_SUCCESS);
  ck_assert_uint_eq(built.per_layer, m[0].per_layer);
  ck_assert_uint_eq(built.common, m[1].common);
  /* Issue 15: 768 MiB of probabilities per layer at 124M, 16 x 1024 (1600 MiB
   * at 1558M); the log-sum-exp is 768 KiB. */
  const struct { const char *name; size_t nh; } p[] = {{"124M", 12}, {"1558M", 25}};
  for (int i = 0; i < 2; i++) {
    fsdp_gpt2_config_t pc;
    ck_assert_int_eq(fsdp_gpt2_preset(p[i].name, &pc), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_gpt2_memory(&pc, 16, 1024, FSDP_BF16, FSDP_GPT2_LAYOUT_PROBS, &m[0]),
                     FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_gpt2_memory(&pc, 16, 1024, FSDP_BF16, FSDP_GPT2_LAYOUT_FLASH, &m[1]),
                     FSDP_SUCCESS);
    ck_assert_uint_eq(m[0].attention, 16 * p[i].nh * 1024 * 1024 * f);
    ck_assert_uint_eq(m[1].attention, 16 * p[i].nh * 1024 * f);
    ck_assert_uint_eq(m[0].per_layer - m[1].per_layer, m[0].attention - m[1].attention);
  }
  /* Errors name the value. */
  fsdp_gpt2_memory_t x;
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 65, FSDP_F32, FSDP_GPT2_LAYOUT_PROBS, &x),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "T 65"));
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 0, 8, FSDP_F32, FSDP_GPT2_LAYOUT_PROBS, &x),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "batch 0"));
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 8, FSDP_F64, FSDP_GPT2_LAYOUT_PROBS, &x),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "f64"));
  ck_assert_int_eq(fsdp_gpt2_memory(&c, 2, 8, FSDP_F32, (fsdp_gpt2_layout_t)7, &x),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "layout 7"));
}
END_TEST

static Suite *gpt2_suite(void) {
  Suite *s = suite_create("gpt2");
  TCase *tc = tcase_create("gpt2");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, published_sizes);
  tcase_add_test(tc, memory_plan);
  tcase_add_test(tc, wrap_plans);
  tcase_add_loop_test(tc, gradient_check, 0, 2);
  tcase_add_loop_test(tc, checkpoint_identical, 0, 3);
  tcase_add_test(tc, checkpoint_grouped_identical);
  tcase_add_test(tc, checkpoint_auto_choice);
  tcase_add_test(tc, checkpoint_partial_identical);
  tcase_add_test(tc, plans_train_identically);
  tcase_add_test(tc, unit_options_from_a_callback);
  tcase_add_test(tc, bf16_follows_f32);
  tcase_add_test(tc, sampling_and_errors);
  tcase_add_test(tc, sampling_top_k);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(gpt2_suite()); }
