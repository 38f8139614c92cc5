/* tests/unit/test_llama.c — the Llama family's model (src/nn/llama.c) on one
 * rank: its units and names as the wrap policies make them, its logits
 * against a float64 forward written here from HF's LlamaForCausalLM (RMSNorm,
 * q/k/v, rotate-half RoPE, grouped-query causal attention, o_proj, SwiGLU,
 * tied or untied head), every parameter's gradient against central
 * differences of that float64 loss, activation checkpointing giving
 * identical weights with less memory (k of L layers too, checkpoint auto's
 * first k), the activation memory computed without
 * a model (fsdp_llama_memory), loss going down on the tiny preset, and
 * bad input refused by name. */
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

/* Small enough to difference every parameter: grouped (4 heads / 2 KV, D 4),
 * no power-of-two F or V; untied with the default frequencies, tied with
 * llama3's scaling. */
static const fsdp_llama_config_t cfgs[] = {
    {2, 4, 2, 16, 20, 11, 9, 10000.0f, 1e-5f, 0, FSDP_ROPE_DEFAULT, 0, 0, 0, 0},
    {2, 4, 2, 16, 20, 11, 9, 500.0f, 1e-6f, 1, FSDP_ROPE_LLAMA3, 4.0f, 1.0f, 2.0f, 4},
};
enum { B = 2, T = 7, MAXP = 4096 };

static fsdp_engine_t engine(const fsdp_config_t *c) {
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, c, &e), FSDP_SUCCESS);
  return e;
}

static fsdp_llama_t model(fsdp_engine_t e, const fsdp_llama_config_t *c, const char *wrap,
                          const char *ckpt) {
  fsdp_llama_opts_t o = {.wrap_kinds = wrap, .checkpoint_kinds = ckpt, .max_batch = B};
  fsdp_llama_t m;
  ck_assert_msg(fsdp_llama_create(e, c, &o, &m) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  return m;
}

static void batch(int V, int *tok, int *tgt) {
  for (int i = 0; i < B * T; i++) {
    tok[i] = (i * 7 + 3) % V;
    tgt[i] = (i * 5 + 1) % V;
  }
}

/* ---- the float64 reference ---- */

/* Every tensor of the model by name, in double. */
#define MAXT 24
struct ref {
  const fsdp_llama_config_t *c;
  int n;
  char name[MAXT][64];
  size_t numel[MAXT];
  double *w[MAXT];
  float inv_freq[64];
  const int *tok, *tgt;
};

static size_t numel_of(const fsdp_llama_config_t *c, const char *name) {
  const size_t C = (size_t)c->n_embd, D = C / (size_t)c->n_head, F = (size_t)c->ffn_hidden;
  const size_t V = (size_t)c->vocab_size, KV = (size_t)c->n_kv_head * D;
  if (strstr(name, "norm")) return C;
  if (strstr(name, "embed_tokens") || strstr(name, "lm_head")) return V * C;
  if (strstr(name, "k_proj") || strstr(name, "v_proj")) return KV * C;
  if (strstr(name, "mlp")) return F * C;
  return C * C; /* q_proj, o_proj: NH D = C */
}

static void ref_add(struct ref *r, const char *name) {
  ck_assert_int_lt(r->n, MAXT);
  snprintf(r->name[r->n], sizeof r->name[0], "%s", name);
  r->numel[r->n] = numel_of(r->c, name);
  r->w[r->n] = calloc(r->numel[r->n], sizeof(double));
  r->n++;
}

static const char *const layer_tensors[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};

/* The reference's tensors: embed, the layers' nine each, norm, (lm_head). */
static void ref_init(struct ref *r, const fsdp_llama_config_t *c) {
  memset(r, 0, sizeof *r);
  r->c = c;
  ref_add(r, "model.embed_tokens.weight");
  for (int l = 0; l < c->n_layer; l++)
    for (int j = 0; j < 9; j++) {
      char name[64];
      snprintf(name, sizeof name, "model.layers.%d.%s", l, layer_tensors[j]);
      ref_add(r, name);
    }
  ref_add(r, "model.norm.weight");
  if (!c->tie_embeddings) ref_add(r, "lm_head.weight");
  fsdp_llama_inv_freq(c, r->inv_freq);
}

static void ref_free(struct ref *r) {
  for (int i = 0; i < r->n; i++) free(r->w[i]);
}

static void ref_read(struct ref *r, fsdp_engine_t e) {
  static float buf[MAXP];
  for (int i = 0; i < r->n; i++) {
    ck_assert_uint_le(r->numel[i], MAXP);
    ck_assert_int_eq(fsdp_engine_read_tensor(e, r->name[i], buf, -1), FSDP_SUCCESS);
    for (size_t k = 0; k < r->numel[i]; k++) r->w[i][k] = buf[k];
  }
}

static const double *W(const struct ref *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->name[i], name)) return r->w[i];
  ck_abort_msg("no tensor %s", name);
  return NULL;
}

/* y (rows, out) = x (rows, in) @ w^T, w (out, in) */
static void lin(double *y, const double *x, const double *w, int rows, int in, int out) {
  for (int i = 0; i < rows; i++)
    for (int o = 0; o < out; o++) {
      double s = 0;
      for (int k = 0; k < in; k++) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
}

static void rms(double *y, const double *x, const double *w, int rows, int C, double eps) {
  for (int i = 0; i < rows; i++) {
    double ss = 0;
    for (int k = 0; k < C; k++) ss += x[i * C + k] * x[i * C + k];
    const double s = 1.0 / sqrt(ss / C + eps);
    for (int k = 0; k < C; k++) y[i * C + k] = w[k] * x[i * C + k] * s;
  }
}

/* HF's apply_rotary_pos_emb on heads of D at position p: x cos + rotate_half(x) sin. */
static void rope(double *x, int heads, int D, int p, const float *inv_freq) {
  for (int h = 0; h < heads; h++)
    for (int i = 0; i < D / 2; i++) {
      const double a = (float)p * inv_freq[i], c = cos(a), s = sin(a);
      double *v = x + h * D;
      const double x0 = v[i], x1 = v[i + D / 2];
      v[i] = x0 * c - x1 * s;
      v[i + D / 2] = x1 * c + x0 * s;
    }
}

/* LlamaForCausalLM's forward on one sequence of T tokens: the summed
 * cross-entropy against tgt, logits (T,V) into out when not NULL. */
static double ref_sequence(const struct ref *r, const int *tok, const int *tgt, double *out) {
  const fsdp_llama_config_t *c = r->c;
  const int C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, D = C / NH, F = c->ffn_hidden;
  const int V = c->vocab_size, KV = NKV * D;
  static double x[T * 64], h[T * 64], q[T * 64], k[T * 64], v[T * 64], y[T * 64], o[T * 64],
      g[T * 64], u[T * 64], logits[T * 64];
  char nm[96];
#define LW(l, t) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, t), W(r, nm))
  const double *emb = W(r, "model.embed_tokens.weight");
  for (int t = 0; t < T; t++)
    for (int j = 0; j < C; j++) x[t * C + j] = emb[tok[t] * C + j];
  for (int l = 0; l < c->n_layer; l++) {
    rms(h, x, LW(l, "input_layernorm.weight"), T, C, c->rms_eps);
    lin(q, h, LW(l, "self_attn.q_proj.weight"), T, C, C);
    lin(k, h, LW(l, "self_attn.k_proj.weight"), T, C, KV);
    lin(v, h, LW(l, "self_attn.v_proj.weight"), T, C, KV);
    for (int t = 0; t < T; t++) rope(q + t * C, NH, D, t, r->inv_freq);
    for (int t = 0; t < T; t++) rope(k + t * KV, NKV, D, t, r->inv_freq);
    for (int hd = 0; hd < NH; hd++) {
      const int kv = hd / (NH / NKV); /* repeat_kv */
      for (int t = 0; t < T; t++) {
        double p[T], mx = -INFINITY, sum = 0;
        for (int j = 0; j <= t; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += q[t * C + hd * D + d] * k[j * KV + kv * D + d];
          p[j] = s / sqrt(D);
          mx = fmax(mx, p[j]);
        }
        for (int j = 0; j <= t; j++) sum += p[j] = exp(p[j] - mx);
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j <= t; j++) acc += p[j] / sum * v[j * KV + kv * D + d];
          y[t * C + hd * D + d] = acc;
        }
      }
    }
    lin(o, y, LW(l, "self_attn.o_proj.weight"), T, C, C);
    for (int i = 0; i < T * C; i++) x[i] += o[i];
    rms(h, x, LW(l, "post_attention_layernorm.weight"), T, C, c->rms_eps);
    lin(g, h, LW(l, "mlp.gate_proj.weight"), T, C, F);
    lin(u, h, LW(l, "mlp.up_proj.weight"), T, C, F);
    for (int i = 0; i < T * F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    lin(o, g, LW(l, "mlp.down_proj.weight"), T, F, C);
    for (int i = 0; i < T * C; i++) x[i] += o[i];
  }
#undef LW
  rms(h, x, W(r, "model.norm.weight"), T, C, c->rms_eps);
  lin(logits, h, c->tie_embeddings ? emb : W(r, "lm_head.weight"), T, C, V);
  double loss = 0;
  for (int t = 0; t < T; t++) {
    const double *row = logits + t * V;
    double mx = row[0], s = 0;
    for (int j = 1; j < V; j++) mx = fmax(mx, row[j]);
    for (int j = 0; j < V; j++) s += exp(row[j] - mx);
    loss += mx + log(s) - row[tgt[t]];
  }
  if (out) memcpy(out, logits, (size_t)T * V * sizeof(double));
  return loss;
}

static double ref_loss(const struct ref *r) {
  double loss = 0;
  for (int b = 0; b < B; b++) loss += ref_sequence(r, r->tok + b * T, r->tgt + b * T, NULL);
  return loss;
}

/* ---- tests ---- */

/* Units each policy makes, named as HF names the modules; every parameter
 * in exactly one, the counts the config's. */
START_TEST(units_and_names) {
  static const struct { const char *wrap; size_t min; int units; const char *second; } plans[] = {
      {NULL, 0, 1, NULL},
      {"LlamaDecoderLayer", 0, 3, "model.layers.0"},
      {NULL, 3000, 2, "model.layers.0-1"}, /* 1760 per layer */
  };
  for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
    for (int k = 0; k < 2; k++) {
      fsdp_config_t c = FSDP_CONFIG_INIT;
      fsdp_engine_t e = engine(&c);
      fsdp_llama_opts_t o = {.wrap_kinds = plans[i].wrap, .wrap_min_params = plans[i].min,
                             .max_batch = B};
      fsdp_llama_t m;
      ck_assert_msg(fsdp_llama_create(e, &cfgs[k], &o, &m) == FSDP_SUCCESS, "%s",
                    fsdp_last_error());
      ck_assert_int_eq(fsdp_engine_num_units(e), plans[i].units);
      size_t total = 0;
      for (int u = 0; u < plans[i].units; u++) {
        fsdp_unit_info_t info;
        fsdp_unit_info(e, u, &info);
        total += info.numel;
        if (u == 0) ck_assert_str_eq(info.name, "root");
        if (u == 0) ck_assert_str_eq(info.kind, "LlamaForCausalLM");
        if (u == 1) ck_assert_str_eq(info.name, plans[i].second);
        if (u == 1) ck_assert_str_eq(info.kind, "LlamaDecoderLayer");
      }
      ck_assert_uint_eq(total, fsdp_llama_num_params(&cfgs[k]));
      ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_SUCCESS);
      /* HF's init: norms 1, matrices N(0, 0.02) */
      float w[MAXP];
      ck_assert_int_eq(fsdp_engine_read_tensor(e, "model.layers.1.post_attention_layernorm.weight",
                                               w, -1), FSDP_SUCCESS);
      for (int j = 0; j < cfgs[k].n_embd; j++) ck_assert_float_eq(w[j], 1.0f);
      ck_assert_int_eq(fsdp_engine_read_tensor(e, "model.layers.0.mlp.up_proj.weight", w, -1),
                       FSDP_SUCCESS);
      double ss = 0;
      const int n = cfgs[k].ffn_hidden * cfgs[k].n_embd;
      for (int j = 0; j < n; j++) ss += (double)w[j] * w[j];
      ck_assert_msg(fabs(sqrt(ss / n) - 0.02) < 0.003, "std %g", sqrt(ss / n));
      ck_assert_int_eq(fsdp_engine_read_tensor(e, "lm_head.weight", w, -1),
                       k ? FSDP_ERR_INVALID_ARGUMENT : FSDP_SUCCESS);
      fsdp_llama_destroy(m);
      fsdp_engine_destroy(e);
    }
}
END_TEST

/* The logits of fsdp_llama_forward are the float64 reference's over the
 * same weights, to fp32 rounding; so is the loss. */
START_TEST(logits_match_reference) {
  const fsdp_llama_config_t *c = &cfgs[_i];
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&ec);
  fsdp_llama_t m = model(e, c, "LlamaDecoderLayer", NULL);
  int tok[B * T], tgt[B * T];
  batch(c->vocab_size, tok, tgt);
  struct ref r;
  ref_init(&r, c);
  ref_read(&r, e);
  const float *logits;
  double loss;
  ck_assert_int_eq(fsdp_llama_forward(m, tok, tgt, B, T, &loss, &logits), FSDP_SUCCESS);
  double want_loss = 0, want[T * 64];
  for (int b = 0; b < B; b++) {
    want_loss += ref_sequence(&r, tok + b * T, tgt + b * T, want);
    for (int i = 0; i < T * c->vocab_size; i++)
      ck_assert_msg(fabs(logits[b * T * c->vocab_size + i] - want[i]) <= 1e-5,
                    "logit %d of sequence %d: %.9g, reference %.9g", i, b,
                    (double)logits[b * T * c->vocab_size + i], want[i]);
  }
  ck_assert_msg(fabs(loss - want_loss) <= 1e-5 * want_loss, "loss %.9g, reference %.9g", loss,
                want_loss);
  ref_free(&r);
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}
END_TEST

/* Every parameter's gradient (SGD at lr 1: before - after) against central
 * differences of the float64 loss (step 1e-5: truncation ~1e-10, round-off
 * ~1e-11 / 1e-5), within 1e-5 absolute + 1e-4 relative: fp32's rounding is
 * 2e-2 of that bound at worst (printed); units per layer, recomputed (_i
 * odd) or kept. */
START_TEST(gradient_check) {
  const fsdp_llama_config_t *c = &cfgs[_i / 2];
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  ec.optim.kind = FSDP_OPTIM_SGD;
  ec.optim.lr = 1.0f;
  fsdp_engine_t e = engine(&ec);
  fsdp_llama_t m = model(e, c, "LlamaDecoderLayer", _i % 2 ? "LlamaDecoderLayer" : NULL);
  int tok[B * T], tgt[B * T];
  batch(c->vocab_size, tok, tgt);
  struct ref r;
  ref_init(&r, c);
  ref_read(&r, e);
  r.tok = tok, r.tgt = tgt;
  ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, B, T, 1.0f, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  static float after[MAXP];
  double worst = 0;
  for (int i = 0; i < r.n; i++) {
    ck_assert_int_eq(fsdp_engine_read_tensor(e, r.name[i], after, -1), FSDP_SUCCESS);
    for (size_t k = 0; k < r.numel[i]; k++) {
      const double keep = r.w[i][k], grad = (double)(float)keep - after[k], h = 1e-5;
      r.w[i][k] = keep + h;
      const double up = ref_loss(&r);
      r.w[i][k] = keep - h;
      const double down = ref_loss(&r);
      r.w[i][k] = keep;
      const double fd = (up - down) / (2 * h), err = fabs(fd - grad);
      worst = fmax(worst, err / (1e-5 + 1e-4 * fabs(fd)));
      ck_assert_msg(err <= 1e-5 + 1e-4 * fabs(fd), "%s[%zu]: engine %.7g, numeric %.7g",
                    r.name[i], k, grad, fd);
    }
  }
  printf("llama gradient check (config %d, checkpoint %d): worst error %.3g of the bound\n",
         _i / 2, _i % 2, worst);
  ref_free(&r);
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}
END_TEST

/* Checkpointing trains bit for bit as keeping every activation (three AdamW
 * steps): a unit per layer (_i 0) holds one layer's activations fewer; one
 * unit of both layers (_i 1), whose recompute finishes the second layer's
 * input from the first's residual, keeps two layers of recompute scratch. */
START_TEST(checkpoint_identical) {
  const fsdp_llama_config_t *c = &cfgs[0];
  static float w[2][2][MAXP];
  size_t act[2], full[2];
  for (int ck = 0; ck < 2; ck++) {
    fsdp_config_t ec = FSDP_CONFIG_INIT;
    fsdp_engine_t e = engine(&ec);
    fsdp_plan_opts_t plan = FSDP_PLAN_OPTS_INIT;
    plan.wrap_kinds = _i ? NULL : "LlamaDecoderLayer";
    plan.wrap_min_params = _i ? 3000 : 0;
    plan.checkpoint_names = ck ? "model.layers.*" : NULL;
    fsdp_llama_opts_t o = {.plan = &plan, .max_batch = B};
    fsdp_llama_t m;
    ck_assert_msg(fsdp_llama_create(e, c, &o, &m) == FSDP_SUCCESS, "%s", fsdp_last_error());
    ck_assert_int_eq(fsdp_engine_num_units(e), _i ? 2 : 3);
    ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
    int tok[B * T], tgt[B * T];
    batch(c->vocab_size, tok, tgt);
    for (int s = 0; s < 3; s++) {
      ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    }
    fsdp_engine_read_tensor(e, "model.layers.0.self_attn.k_proj.weight", w[ck][0], -1);
    fsdp_engine_read_tensor(e, "model.layers.1.mlp.gate_proj.weight", w[ck][1], -1);
    act[ck] = fsdp_llama_activation_bytes(m, &full[ck]);
    fsdp_llama_destroy(m);
    fsdp_engine_destroy(e);
  }
  ck_assert_int_eq(memcmp(w[0][0], w[1][0], 8 * 16 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(w[0][1], w[1][1], 20 * 16 * sizeof(float)), 0);
  /* per token: ln1, atty, res2, ln2 C each, qkv (NH + 2 NKV) D, gate|up 2F,
   * h F, 2 rstd; and NH x T probabilities */
  const size_t C = 16, QKV = 32, F = 20, maxT = (size_t)c->max_seq_len;
  const size_t layer = (B * maxT * (4 * C + QKV + 3 * F + 2) + B * 4 * maxT * maxT) * sizeof(float);
  ck_assert_uint_eq(act[0], full[0]);
  ck_assert_uint_eq(full[1], full[0]);
  ck_assert_uint_eq(act[0] - act[1], _i ? 0 : layer);
}
END_TEST

/* k of L layers checkpointed (two of four, the first two: by names and by
 * checkpoint_auto at the budget that exactly fits k = 2) trains bit for bit
 * as none, with L - k layers saved and one of scratch; one byte less
 * checkpoints a third layer, and checkpoint_auto's budget is reported. The
 * budget holds the engine's state too (*state: fsdp_engine_memory's reserved
 * bytes after the steps, which auto predicted before materialize). */
static void train_llama4(const char *ckpt, size_t budget, float w[2][MAXP], size_t *act,
                         size_t *full, int *k, size_t *state) {
  fsdp_llama_config_t c = cfgs[0];
  c.n_layer = 4;
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&ec);
  fsdp_plan_opts_t plan = FSDP_PLAN_OPTS_INIT;
  plan.wrap_kinds = "LlamaDecoderLayer";
  plan.checkpoint_names = ckpt;
  fsdp_llama_opts_t o = {.plan = &plan, .max_batch = B, .checkpoint_auto = budget > 0,
                         .memory_budget = budget};
  fsdp_llama_t m;
  ck_assert_msg(fsdp_llama_create(e, &c, &o, &m) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  int tok[B * T], tgt[B * T];
  batch(c.vocab_size, tok, tgt);
  for (int s = 0; s < 3; s++) {
    ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, B, T, 0.1f, NULL), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  fsdp_mem_stats_t mem;
  ck_assert_int_eq(fsdp_engine_memory(e, &mem), FSDP_SUCCESS);
  *state = mem.total_reserved;
  fsdp_engine_read_tensor(e, "model.layers.0.self_attn.k_proj.weight", w[0], -1);
  fsdp_engine_read_tensor(e, "model.layers.3.mlp.gate_proj.weight", w[1], -1);
  *act = fsdp_llama_activation_bytes(m, full);
  size_t used;
  *k = fsdp_llama_checkpointed(m, &used);
  ck_assert_uint_eq(used, budget);
  for (int l = 0; l < c.n_layer; l++) /* the first k */
    ck_assert_int_eq(fsdp_llama_layer_checkpointed(m, l), l < *k);
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}

START_TEST(checkpoint_partial_identical) {
  static float w0[2][MAXP], w[2][MAXP];
  size_t act0, full0, act, full, state, state_k;
  int k;
  train_llama4(NULL, 0, w0, &act0, &full0, &k, &state);
  ck_assert_int_eq(k, 0);
  const size_t C = 16, QKV = 32, F = 20, maxT = (size_t)cfgs[0].max_seq_len;
  const fsdp_llama_memory_t m = {
      .per_layer = (B * maxT * (4 * C + QKV + 3 * F + 2) + B * 4 * maxT * maxT) * sizeof(float)};
  const size_t base = full0 - fsdp_activation_arena_bytes(&m, 4, 0);
  const size_t exact = state + base + fsdp_activation_arena_bytes(&m, 2, 1);
  const size_t budgets[3] = {0, exact, exact - 1};
  const int want[3] = {2, 2, 3};
  for (int i = 0; i < 3; i++) {
    train_llama4(i ? NULL : "model.layers.[01]", budgets[i], w, &act, &full, &k, &state_k);
    ck_assert_int_eq(k, want[i]);
    ck_assert_uint_eq(state_k, state);
    ck_assert_uint_eq(full, full0);
    ck_assert_uint_eq(act, base + fsdp_activation_arena_bytes(&m, 4 - want[i], 1));
    ck_assert_int_eq(memcmp(w0[0], w[0], 8 * 16 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(w0[1], w[1], 20 * 16 * sizeof(float)), 0);
  }
}
END_TEST

/* fsdp_llama_memory at SmolLM-135M's shape, 2 x 64, where every buffer is a
 * multiple of the 256-byte alignment so the formula is exact: per layer,
 * per token 4 C + QKV + 3 F activations and 2 fp32 statistics, plus
 * attention's fp32 probabilities (f32) or log-sum-exp (bf16). */
START_TEST(memory_plan) {
  fsdp_llama_config_t c;
  ck_assert_int_eq(fsdp_llama_preset("SmolLM-135M", &c), FSDP_SUCCESS);
  const size_t Bm = 2, Tm = 64, BT = Bm * Tm, C = 576, QKV = 15 * 64, F = 1536, NH = 9;
  const size_t Vp = 49152, L = 30;
  for (int bf = 0; bf < 2; bf++) {
    fsdp_llama_memory_t m;
    const size_t e = bf ? 2 : 4, att = bf ? Bm * NH * Tm : Bm * NH * Tm * Tm;
    ck_assert_int_eq(fsdp_llama_memory(&c, 2, 64, bf ? FSDP_BF16 : FSDP_F32, &m), FSDP_SUCCESS);
    ck_assert_uint_eq(m.attention, att * 4);
    ck_assert_uint_eq(m.per_layer, BT * (4 * C + QKV + 3 * F) * e + 2 * BT * 4 + att * 4);
    ck_assert_uint_eq(m.inputs, (L + 1) * BT * C * e);
    /* final norm and its statistics, logits, dres, d1, max(QKV, 2F) and F */
    ck_assert_uint_eq(m.common, BT * (C + Vp + 2 * C + 2 * F + F) * e + BT * 4);
    ck_assert_uint_eq(m.saved, m.inputs + L * m.per_layer + m.common);
    ck_assert_uint_eq(m.checkpointed, m.inputs + m.per_layer + m.common);
  }
  fsdp_llama_memory_t m;
  ck_assert_int_eq(fsdp_llama_memory(&c, 2, 4096, FSDP_F32, &m), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "T 4096"));
  ck_assert_int_eq(fsdp_llama_memory(&c, 2, 64, FSDP_F16, &m), FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

/* The tiny preset learns a repeating sequence: AdamW, 40 steps. */
START_TEST(tiny_preset_learns) {
  fsdp_llama_config_t c;
  ck_assert_int_eq(fsdp_llama_preset("tiny", &c), FSDP_SUCCESS);
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  ec.optim.lr = 1e-2f;
  fsdp_engine_t e = engine(&ec);
  fsdp_llama_opts_t o = {.wrap_kinds = "LlamaDecoderLayer", .max_batch = 2, .max_T = 32};
  fsdp_llama_t m;
  ck_assert_int_eq(fsdp_llama_create(e, &c, &o, &m), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 9), FSDP_SUCCESS);
  int tok[64], tgt[64];
  for (int i = 0; i < 64; i++) tok[i] = (i * 37) % 23, tgt[i] = ((i + 1) * 37) % 23;
  double first = 0, loss = 0;
  for (int s = 0; s < 40; s++) {
    ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, 2, 32, 1.0f / 64, &loss),
                     FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    if (s == 0) first = loss / 64;
  }
  loss /= 64;
  ck_assert_msg(first > 5.0 && loss < 0.2 * first, "loss %g -> %g", first, loss);
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}
END_TEST

/* Greedy generation (top-k 1, whatever the seed) is the argmax of
 * fsdp_llama_forward's last logits row, step by step, past max_seq_len (the
 * context then slides); seeded draws repeat; bad arguments are refused. */
START_TEST(greedy_sampling) {
  const fsdp_llama_config_t *c = &cfgs[_i];
  enum { P = 2, N = 12 };
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&ec);
  fsdp_llama_t m = model(e, c, "LlamaDecoderLayer", NULL);
  int ctx[P + N] = {1, 2}, a[N], b[N];
  fsdp_llama_sampling_t greedy = {1.0f, 1, 7}, other = {1.0f, 1, 99};
  ck_assert_int_eq(fsdp_llama_sample(m, ctx, P, N, &greedy, a), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_llama_sample(m, ctx, P, N, &other, b), FSDP_SUCCESS);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
  for (int i = 0; i < N; i++) {
    const int len = P + i, t = len < c->max_seq_len ? len : c->max_seq_len;
    const float *logits;
    ck_assert_int_eq(fsdp_llama_forward(m, ctx + len - t, NULL, 1, t, NULL, &logits),
                     FSDP_SUCCESS);
    const float *row = logits + (size_t)(t - 1) * c->vocab_size;
    int best = 0;
    for (int v = 1; v < c->vocab_size; v++) best = row[v] > row[best] ? v : best;
    ck_assert_msg(a[i] == best, "token %d: generated %d, argmax %d", i, a[i], best);
    ctx[len] = a[i];
  }
  ck_assert_int_eq(fsdp_llama_generate(m, ctx, P, N, 1.0f, 3, a), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_llama_generate(m, ctx, P, N, 1.0f, 3, b), FSDP_SUCCESS);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
  for (int i = 0; i < N; i++) ck_assert(a[i] >= 0 && a[i] < c->vocab_size);
  ck_assert_int_eq(fsdp_llama_generate(m, ctx, P, N, 0.0f, 3, a), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "fsdp_llama_sample"));
  ctx[1] = c->vocab_size;
  ck_assert_int_eq(fsdp_llama_generate(m, ctx, P, N, 1.0f, 3, a), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "not in the vocabulary"));
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}
END_TEST

/* Bad configs, batches and tokens are refused naming the value; the model
 * trains after a refused call. */
START_TEST(errors) {
  fsdp_config_t ec = FSDP_CONFIG_INIT;
  fsdp_engine_t e = engine(&ec);
  fsdp_llama_config_t bad = cfgs[0];
  bad.n_kv_head = 3;
  fsdp_llama_opts_t o = {.max_batch = B};
  fsdp_llama_t m;
  ck_assert_int_eq(fsdp_llama_create(e, &bad, &o, &m), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "n_kv_head 3"));
  fsdp_llama_config_t longer;
  ck_assert_int_eq(fsdp_llama_preset("Llama-3.2-1B", &longer), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_llama_create(e, &longer, &o, &m), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "set max_T"));
  o.wrap_kinds = "LlamaAttention";
  ck_assert_int_ne(fsdp_llama_create(e, &cfgs[0], &o, &m), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "LlamaAttention"));
  fsdp_engine_destroy(e);
  e = engine(&ec);
  m = model(e, &cfgs[0], "LlamaDecoderLayer", NULL);
  int tok[B * T], tgt[B * T];
  batch(cfgs[0].vocab_size, tok, tgt);
  tgt[3] = -1;
  ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, B, T, 1.0f, NULL),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "target -1 at position 3"));
  batch(cfgs[0].vocab_size, tok, tgt);
  ck_assert_int_eq(fsdp_llama_forward(m, tok, NULL, B, cfgs[0].max_seq_len + 1, NULL, NULL),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_llama_forward_backward(m, tok, tgt, B, T, 1.0f, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_llama_destroy(m);
  fsdp_engine_destroy(e);
}
END_TEST

static Suite *llama_suite(void) {
  Suite *s = suite_create("llama");
  TCase *t = tcase_create("llama");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_set_timeout(t, 120);
  tcase_add_test(t, units_and_names);
  tcase_add_loop_test(t, logits_match_reference, 0, 2);
  tcase_add_loop_test(t, gradient_check, 0, 4);
  tcase_add_loop_test(t, checkpoint_identical, 0, 2);
  tcase_add_test(t, checkpoint_partial_identical);
  tcase_add_test(t, memory_plan);
  tcase_add_test(t, tiny_preset_learns);
  tcase_add_loop_test(t, greedy_sampling, 0, 2);
  tcase_add_test(t, errors);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return check_run(llama_suite()); }
