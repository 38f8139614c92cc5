/* tests/unit/test_llama_layers.c — the Llama family's CPU kernels
 * (src/backend/cpu/llama_layers.c; grouped-query attention and the embedding
 * without positions in layers.c), through the CPU compute table's slots so
 * each descriptor's contract is what is held: RMSNorm (with and without its
 * residual branch), RoPE and SwiGLU against float64 references written here
 * and their gradients against central finite differences
 * (common/gradcheck.h); RoPE against the rotate-half formula at HF's
 * frequencies, default and llama3-scaled, themselves against HF's formula;
 * grouped-query attention against multi-head attention over K and V repeated
 * per group (HF's repeat_kv); the += / written contracts of each backward;
 * bad head counts refused by name. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arrays.h"
#include "common/check_run.h"
#include "common/gqa.h"
#include "common/gradcheck.h"
#include "common/rng.h"
#include "core/internal.h"
#include "backend/compute.h"
#include "fsdp/nn.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define HOST FSDP_HOST_STREAM

static const fsdp_compute_ops_t *cpu(void) { return fsdp_compute_ops(FSDP_DEVICE_CPU); }

static void assert_close(const char *what, size_t i, double got, double want, double tol) {
  ck_assert_msg(fabs(got - want) <= tol * (1.0 + fabs(want)), "%s[%zu]: got %.9g want %.9g",
                what, i, got, want);
}

/* ---- RMSNorm ---- */

/* offset moves the rows' mean away from 0; eps as the presets' and larger. */
static const struct { int N, C; double offset; float eps; } kRms[] = {
    {1, 1, 0.0, 1e-5f}, {3, 12, 0.0, 1e-5f}, {5, 33, 0.5, 1e-6f}, {4, 20, 3.0, 1e-2f}};

struct rms {
  int N, C;
  float eps;
  float *inp, *w, *r; /* r (N,C): loss = sum(r * out) */
};

static struct rms rms_make(int i) {
  rng_seed(700 + (uint64_t)i);
  struct rms p = {kRms[i].N, kRms[i].C, kRms[i].eps, NULL, NULL, NULL};
  const size_t n = (size_t)p.N * p.C;
  p.inp = rand_floats(n, kRms[i].offset, 1.0);
  p.w = rand_floats((size_t)p.C, 1.0, 0.5);
  p.r = rand_floats(n, 0.0, 1.0);
  return p;
}

static void rms_free(struct rms *p) { free(p->inp), free(p->w), free(p->r); }

static double rms_row64(double *out, const struct rms *p, int i) {
  const float *x = p->inp + (size_t)i * p->C;
  double ss = 0;
  for (int c = 0; c < p->C; ++c) ss += (double)x[c] * x[c];
  const double s = 1.0 / sqrt(ss / p->C + p->eps);
  for (int c = 0; c < p->C; ++c) out[c] = p->w[c] * (x[c] * s);
  return s;
}

static double rms_loss64(const void *q) {
  const struct rms *p = q;
  double *row = xmalloc((size_t)p->C * sizeof(double)), loss = 0;
  for (int i = 0; i < p->N; ++i) {
    rms_row64(row, p, i);
    for (int c = 0; c < p->C; ++c) loss += row[c] * p->r[(size_t)i * p->C + c];
  }
  free(row);
  return loss;
}

static fsdp_rmsnorm_forward_args_t rms_fwd(const struct rms *p, float *out, float *rstd) {
  return (fsdp_rmsnorm_forward_args_t){.dt = FSDP_F32, .out = out, .rstd = rstd,
                                       .inp = p->inp, .weight = p->w, .N = p->N, .C = p->C,
                                       .eps = p->eps};
}

START_TEST(rmsnorm_forward_matches_f64) {
  struct rms p = rms_make(_i);
  const size_t n = (size_t)p.N * p.C;
  float *out = rand_floats(n, 0.0, 1.0), *rstd = zeros((size_t)p.N); /* out overwritten */
  double *row = xmalloc((size_t)p.C * sizeof(double));
  fsdp_rmsnorm_forward_args_t a = rms_fwd(&p, out, rstd);
  ck_assert_int_eq(cpu()->rmsnorm_forward(&a, HOST), FSDP_SUCCESS);
  for (int i = 0; i < p.N; ++i) {
    assert_close("rstd", (size_t)i, rstd[i], rms_row64(row, &p, i), 1e-6);
    for (int c = 0; c < p.C; ++c)
      assert_close("rms out", (size_t)i * p.C + c, out[(size_t)i * p.C + c], row[c], 1e-6);
  }
  free(out), free(rstd), free(row);
  rms_free(&p);
}
END_TEST

/* With the residual branch: res = inp + branch is written and normalised,
 * bitwise the unfused residual add followed by the plain RMSNorm. */
START_TEST(rmsnorm_fused_residual) {
  struct rms p = rms_make(_i);
  const size_t n = (size_t)p.N * p.C;
  float *branch = rand_floats(n, 0.0, 1.0), *res = zeros(n), *out = zeros(n);
  float *rstd = zeros((size_t)p.N), *sum = zeros(n), *want = zeros(n), *want_r = zeros((size_t)p.N);
  fsdp_rmsnorm_forward_args_t a = rms_fwd(&p, out, rstd);
  a.branch = branch, a.res = res;
  ck_assert_int_eq(cpu()->rmsnorm_forward(&a, HOST), FSDP_SUCCESS);
  for (size_t i = 0; i < n; ++i) sum[i] = p.inp[i] + branch[i];
  ck_assert_mem_eq(res, sum, n * sizeof(float));
  float *saved = p.inp;
  p.inp = sum;
  fsdp_rmsnorm_forward_args_t plain = rms_fwd(&p, want, want_r);
  ck_assert_int_eq(cpu()->rmsnorm_forward(&plain, HOST), FSDP_SUCCESS);
  p.inp = saved;
  ck_assert_mem_eq(out, want, n * sizeof(float));
  ck_assert_mem_eq(rstd, want_r, (size_t)p.N * sizeof(float));
  /* a branch with nowhere to write the sum is refused, out untouched */
  memset(out, 0, n * sizeof(float));
  a.res = NULL;
  ck_assert_int_eq(cpu()->rmsnorm_forward(&a, HOST), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "residual branch needs an output"));
  for (size_t i = 0; i < n; ++i) ck_assert_float_eq(out[i], 0.0f);
  free(branch), free(res), free(out), free(rstd), free(sum), free(want), free(want_r);
  rms_free(&p);
}
END_TEST

/* Gradients against finite differences; a second call doubles them (+=). */
START_TEST(rmsnorm_backward_gradcheck) {
  struct rms p = rms_make(_i);
  const size_t n = (size_t)p.N * p.C, C = (size_t)p.C;
  float *out = zeros(n), *rstd = zeros((size_t)p.N), *dx = zeros(n), *dw = zeros(C);
  fsdp_rmsnorm_forward_args_t a = rms_fwd(&p, out, rstd);
  ck_assert_int_eq(cpu()->rmsnorm_forward(&a, HOST), FSDP_SUCCESS);
  fsdp_rmsnorm_backward_args_t b = {.dt = FSDP_F32, .dinp = dx, .dweight = dw, .dout = p.r,
                                    .inp = p.inp, .weight = p.w, .rstd = rstd, .N = p.N,
                                    .C = p.C};
  ck_assert_int_eq(cpu()->rmsnorm_backward(&b, HOST), FSDP_SUCCESS);
  check_grads("rms dinp", rms_loss64, &p, p.inp, dx, n);
  check_grads("rms dweight", rms_loss64, &p, p.w, dw, C);
  float *dx1 = copy_floats(dx, n), *dw1 = copy_floats(dw, C);
  ck_assert_int_eq(cpu()->rmsnorm_backward(&b, HOST), FSDP_SUCCESS);
  for (size_t i = 0; i < n; ++i) assert_close("rms dinp twice", i, dx[i], 2.0 * dx1[i], 1e-6);
  for (size_t i = 0; i < C; ++i) assert_close("rms dweight twice", i, dw[i], 2.0 * dw1[i], 1e-6);
  free(out), free(rstd), free(dx), free(dw), free(dx1), free(dw1);
  rms_free(&p);
}
END_TEST

/* ---- RoPE ---- */

/* HF's frequencies in float64: theta^(-2i/D), and for llama3 the
 * wavelength-banded scaling of _compute_llama3_parameters. */
static double inv_freq64(const fsdp_llama_config_t *c, int i) {
  const int D = c->n_embd / c->n_head;
  double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / D);
  if (c->rope_type != FSDP_ROPE_LLAMA3) return f;
  const double old = c->rope_original_max_pos, lo = c->rope_low_freq_factor,
               hi = c->rope_high_freq_factor, factor = c->rope_factor;
  const double wavelen = 2 * M_PI / f;
  if (wavelen < old / hi) return f;           /* high frequencies kept */
  if (wavelen > old / lo) return f / factor;  /* low ones divided */
  const double smooth = (old / wavelen - lo) / (hi - lo);
  return (1 - smooth) * f / factor + smooth * f;
}

/* The Llama-3.2-1B preset's llama3 scaling at D = 64 crosses all three bands. */
static fsdp_llama_config_t rope_config(int llama3) {
  fsdp_llama_config_t c;
  ck_assert_int_eq(fsdp_llama_preset(llama3 ? "Llama-3.2-1B" : "TinyLlama-1.1B", &c),
                   FSDP_SUCCESS);
  return c;
}

START_TEST(rope_inv_freq_matches_hf_formula) {
  for (int llama3 = 0; llama3 < 2; ++llama3) {
    fsdp_llama_config_t c = rope_config(llama3);
    const int half = c.n_embd / c.n_head / 2;
    float *f = zeros((size_t)half);
    fsdp_llama_inv_freq(&c, f);
    int scaled = 0, kept = 0, smoothed = 0;
    for (int i = 0; i < half; ++i) {
      const double want = inv_freq64(&c, i), plain = 1.0 / pow(c.rope_theta, 2.0 * i / (2 * half));
      assert_close("inv_freq", (size_t)i, f[i] / want, 1.0, 2e-6);
      if (fabs(want / plain - 1.0) < 1e-12) kept++;
      else if (fabs(want * c.rope_factor / plain - 1.0) < 1e-12) scaled++;
      else smoothed++;
    }
    if (llama3) ck_assert_msg(kept && scaled && smoothed, "bands %d %d %d", kept, scaled, smoothed);
    else ck_assert_int_eq(kept, half);
    free(f);
  }
}
END_TEST

static const struct { int B, T, NH, NKV, D, pos0, llama3; } kRope[] = {
    {1, 1, 1, 1, 2, 0, 0}, {2, 5, 4, 2, 8, 0, 0}, {1, 9, 3, 1, 6, 7, 0},
    {2, 4, 4, 4, 64, 100, 1}, {1, 2, 4, 2, 128, 4000, 1}};

struct rope {
  int B, T, NH, NKV, D, pos0;
  float *qkv, *r, *inv_freq; /* (B,T,(NH+2NKV)D), the same, (D/2) */
};

static size_t rope_n(const struct rope *p) {
  return (size_t)p->B * p->T * (p->NH + 2 * p->NKV) * p->D;
}

static struct rope rope_make(int i) {
  rng_seed(800 + (uint64_t)i);
  struct rope p = {kRope[i].B, kRope[i].T, kRope[i].NH, kRope[i].NKV, kRope[i].D,
                   kRope[i].pos0, NULL, NULL, NULL};
  p.qkv = rand_floats(rope_n(&p), 0.0, 1.0);
  p.r = rand_floats(rope_n(&p), 0.0, 1.0);
  /* frequencies of a config with this head dim (theta, llama3 bands) */
  fsdp_llama_config_t c = rope_config(kRope[i].llama3);
  c.n_head = 1, c.n_embd = p.D;
  p.inv_freq = zeros((size_t)p.D / 2);
  fsdp_llama_inv_freq(&c, p.inv_freq);
  return p;
}

static void rope_free(struct rope *p) { free(p->qkv), free(p->r), free(p->inv_freq); }

/* The rotate-half formula in float64 (the angle is the fp32 product the
 * contract names): x * cos + rotate_half(x) * sin on q and k heads, v as is. */
static void rope64(double *y, const struct rope *p) {
  const int half = p->D / 2, W = (p->NH + 2 * p->NKV) * p->D;
  for (int b = 0; b < p->B; ++b)
    for (int t = 0; t < p->T; ++t)
      for (int j = 0; j < W; ++j) {
        const size_t row = ((size_t)b * p->T + t) * W;
        const int head = j / p->D, i = j % p->D;
        const float *x = p->qkv + row + (size_t)head * p->D;
        if (head >= p->NH + p->NKV) {
          y[row + j] = x[i];
          continue;
        }
        const double angle = (float)(p->pos0 + t) * p->inv_freq[i % half];
        const double rot = i < half ? -(double)x[i + half] : x[i - half];
        y[row + j] = x[i] * cos(angle) + rot * sin(angle);
      }
}

static double rope_loss64(const void *q) {
  const struct rope *p = q;
  const size_t n = rope_n(p);
  double *y = xmalloc(n * sizeof(double)), loss = 0;
  rope64(y, p);
  for (size_t i = 0; i < n; ++i) loss += y[i] * p->r[i];
  free(y);
  return loss;
}

static fsdp_rope_args_t rope_args(const struct rope *p, float *x) {
  return (fsdp_rope_args_t){.dt = FSDP_F32, .qkv = x, .inv_freq = p->inv_freq, .B = p->B,
                            .T = p->T, .NH = p->NH, .NKV = p->NKV, .D = p->D, .pos0 = p->pos0};
}

static fsdp_status_t rope_run(const struct rope *p, float *x, int backward) {
  const fsdp_rope_args_t a = rope_args(p, x);
  return backward ? cpu()->rope_backward(&a, HOST) : cpu()->rope_forward(&a, HOST);
}

/* Forward against the formula; v's columns bitwise untouched. Positions up
 * to 4000 make angles of thousands of radians: fp32 sin/cos of the same fp32
 * angle agree to ~1e-7 with float64's. */
START_TEST(rope_forward_matches_formula) {
  struct rope p = rope_make(_i);
  const size_t n = rope_n(&p);
  float *x = copy_floats(p.qkv, n);
  double *want = xmalloc(n * sizeof(double));
  ck_assert_int_eq(rope_run(&p, x, 0),
                   FSDP_SUCCESS);
  rope64(want, &p);
  for (size_t i = 0; i < n; ++i) assert_close("rope", i, x[i], want[i], 1e-6);
  free(x), free(want);
  rope_free(&p);
}
END_TEST

/* Backward is the gradient (finite differences of the formula) and undoes
 * forward (a rotation's transpose is its inverse). */
START_TEST(rope_backward_gradcheck) {
  struct rope p = rope_make(_i);
  const size_t n = rope_n(&p);
  float *g = copy_floats(p.r, n);
  ck_assert_int_eq(rope_run(&p, g, 1),
                   FSDP_SUCCESS);
  check_grads("rope dqkv", rope_loss64, &p, p.qkv, g, n);
  float *x = copy_floats(p.qkv, n);
  ck_assert_int_eq(rope_run(&p, x, 0),
                   FSDP_SUCCESS);
  ck_assert_int_eq(rope_run(&p, x, 1),
                   FSDP_SUCCESS);
  for (size_t i = 0; i < n; ++i) assert_close("rope round trip", i, x[i], p.qkv[i], 1e-6);
  free(g), free(x);
  rope_free(&p);
}
END_TEST

/* A sequence started at pos0 rotates row t as position pos0 + t: rows of a
 * longer sequence from 0 (what generation with a cache relies on). */
START_TEST(rope_pos0_shifts_positions) {
  const int NH = 2, NKV = 1, D = 8, T = 6, shift = 3, W = (NH + 2 * NKV) * D;
  rng_seed(880);
  float *full = rand_floats((size_t)T * W, 0.0, 1.0);
  float *tail = copy_floats(full + (size_t)shift * W, (size_t)(T - shift) * W);
  float inv[D / 2];
  fsdp_llama_config_t c = rope_config(0);
  c.n_head = 1, c.n_embd = D;
  fsdp_llama_inv_freq(&c, inv);
  fsdp_rope_args_t a = {.dt = FSDP_F32, .qkv = full, .inv_freq = inv, .B = 1, .T = T,
                        .NH = NH, .NKV = NKV, .D = D};
  ck_assert_int_eq(cpu()->rope_forward(&a, HOST), FSDP_SUCCESS);
  a.qkv = tail, a.T = T - shift, a.pos0 = shift;
  ck_assert_int_eq(cpu()->rope_forward(&a, HOST), FSDP_SUCCESS);
  ck_assert_mem_eq(tail, full + (size_t)shift * W, (size_t)(T - shift) * W * sizeof(float));
  free(full), free(tail);
}
END_TEST

/* ---- SwiGLU ---- */

static const struct { int N, F; double spread; } kSwi[] = {{1, 1, 1.0}, {4, 7, 2.0}, {3, 33, 6.0}};

struct swi {
  int N, F;
  float *inp, *r; /* (N,2F), (N,F) */
};

static double silu64(double x) { return x / (1.0 + exp(-x)); }

static double swi_loss64(const void *q) {
  const struct swi *p = q;
  double loss = 0;
  for (int i = 0; i < p->N; ++i)
    for (int j = 0; j < p->F; ++j) {
      const float *g = p->inp + (size_t)i * 2 * p->F;
      loss += silu64(g[j]) * g[p->F + j] * p->r[(size_t)i * p->F + j];
    }
  return loss;
}

START_TEST(swiglu_forward_backward) {
  rng_seed(900 + (uint64_t)_i);
  struct swi p = {kSwi[_i].N, kSwi[_i].F, NULL, NULL};
  const size_t ni = (size_t)p.N * 2 * p.F, no = (size_t)p.N * p.F;
  p.inp = rand_floats(ni, 0.0, kSwi[_i].spread);
  p.r = rand_floats(no, 0.0, 1.0);
  float *out = rand_floats(no, 0.0, 1.0), *din = rand_floats(ni, 5.0, 1.0); /* both written */
  ck_assert_int_eq(cpu()->swiglu_forward(&(fsdp_swiglu_forward_args_t){.dt = FSDP_F32,
                                                                       .out = out,
                                                                       .inp = p.inp, .N = p.N,
                                                                       .F = p.F},
                                         HOST),
                   FSDP_SUCCESS);
  for (int i = 0; i < p.N; ++i)
    for (int j = 0; j < p.F; ++j) {
      const float *g = p.inp + (size_t)i * 2 * p.F;
      assert_close("swiglu", (size_t)i * p.F + j, out[(size_t)i * p.F + j],
                   silu64(g[j]) * g[p.F + j], 1e-6);
    }
  ck_assert_int_eq(cpu()->swiglu_backward(&(fsdp_swiglu_backward_args_t){.dt = FSDP_F32,
                                                                         .dinp = din,
                                                                         .dout = p.r,
                                                                         .inp = p.inp,
                                                                         .N = p.N, .F = p.F},
                                          HOST),
                   FSDP_SUCCESS);
  check_grads("swiglu dinp", swi_loss64, &p, p.inp, din, ni);
  free(out), free(din), free(p.inp), free(p.r);
}
END_TEST

/* Far tails: finite values and slopes (silu -> x and 0, silu' -> 1 and 0). */
START_TEST(swiglu_tails_are_finite) {
  const float inp[2 * 4] = {-200.0f, -90.0f, 90.0f, 200.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const float dy[4] = {1, 1, 1, 1};
  float out[4], din[8];
  ck_assert_int_eq(cpu()->swiglu_forward(&(fsdp_swiglu_forward_args_t){.dt = FSDP_F32,
                                                                       .out = out, .inp = inp,
                                                                       .N = 1, .F = 4},
                                         HOST),
                   FSDP_SUCCESS);
  ck_assert_int_eq(cpu()->swiglu_backward(&(fsdp_swiglu_backward_args_t){.dt = FSDP_F32,
                                                                         .dinp = din, .dout = dy,
                                                                         .inp = inp, .N = 1,
                                                                         .F = 4},
                                          HOST),
                   FSDP_SUCCESS);
  for (int j = 0; j < 4; ++j) {
    const int pos = inp[j] > 0;
    ck_assert_float_eq_tol(out[j], pos ? inp[j] : 0.0f, 1e-5f);
    ck_assert_float_eq_tol(din[j], pos ? 1.0f : 0.0f, 1e-6f);
    ck_assert_float_eq_tol(din[4 + j], pos ? inp[j] : 0.0f, 1e-5f);
  }
}
END_TEST

/* ---- grouped-query attention ---- */

/* NKV 0 is NH; a group of NH / NKV query heads shares each KV head; T = 70
 * spans several row blocks. */
static const struct { int B, T, NH, NKV, D; } kGqa[] = {
    {1, 4, 2, 1, 3}, {2, 9, 4, 2, 4}, {1, 70, 6, 2, 2}, {2, 5, 3, 3, 4}, {1, 6, 4, 0, 2}};

/* Forward equals multi-head attention over the repeated K and V; backward's
 * dq equals its dq and each KV head's dk, dv the sum over its group's heads;
 * backward adds into what is there. */
START_TEST(gqa_matches_repeat_kv) {
  const int B = kGqa[_i].B, T = kGqa[_i].T, NH = kGqa[_i].NH, D = kGqa[_i].D;
  const int NKV = kGqa[_i].NKV ? kGqa[_i].NKV : NH, C = NH * D, W = (NH + 2 * NKV) * D;
  const size_t bt = (size_t)B * T, na = (size_t)B * NH * T * T;
  rng_seed(950 + (uint64_t)_i);
  float *qkv = rand_floats(bt * W, 0.0, 2.0), *dout = rand_floats(bt * C, 0.0, 1.0);
  float *mha = zeros(bt * 3 * C);
  gqa_repeat_kv(mha, qkv, B, T, C, NH, NKV);
  float *out = zeros(bt * C), *att = zeros(na), *want = zeros(bt * C), *watt = zeros(na);
  fsdp_attention_forward_args_t f = {.dt = FSDP_F32, .out = out, .att = att, .qkv = qkv,
                                     .B = B, .T = T, .C = C, .NH = NH, .NKV = kGqa[_i].NKV};
  ck_assert_int_eq(cpu()->attention_forward(&f, HOST), FSDP_SUCCESS);
  fsdp_attention_forward(want, watt, mha, B, T, C, NH);
  for (size_t i = 0; i < bt * C; ++i) assert_close("gqa out", i, out[i], want[i], 1e-6);
  for (size_t i = 0; i < na; ++i) assert_close("gqa att", i, att[i], watt[i], 1e-6);

  float *dqkv = zeros(bt * W), *dmha = zeros(bt * 3 * C);
  for (size_t i = 0; i < bt * W; ++i) dqkv[i] = NAN; /* the table writes dqkv */
  fsdp_attention_backward_args_t b = {.dt = FSDP_F32, .dqkv = dqkv, .dout = dout, .qkv = qkv,
                                      .out = out, .att = att, .B = B, .T = T, .C = C, .NH = NH,
                                      .NKV = kGqa[_i].NKV};
  ck_assert_int_eq(cpu()->attention_backward(&b, HOST), FSDP_SUCCESS);
  fsdp_attention_backward(dmha, dout, mha, watt, B, T, C, NH);
  float *fold = zeros(bt * W); /* dq as it is, dk and dv summed over each group */
  gqa_fold_kv(fold, dmha, B, T, C, NH, NKV);
  for (size_t i = 0; i < bt * W; ++i) assert_close("gqa dqkv", i, dqkv[i], fold[i], 1e-5);
  float *once = copy_floats(dqkv, bt * W);
  ck_assert_int_eq(cpu()->attention_backward(&b, HOST), FSDP_SUCCESS);
  for (size_t i = 0; i < bt * W; ++i) assert_close("gqa dqkv twice", i, dqkv[i], once[i], 0.0);
  free(qkv), free(dout), free(mha), free(out), free(att), free(want), free(watt);
  free(dqkv), free(dmha), free(fold), free(once);
}
END_TEST

/* NKV not dividing NH (or negative, or above NH) is refused by attention and
 * RoPE alike, naming both counts, before anything is written; an odd head
 * dim or a missing frequency table by RoPE. */
START_TEST(bad_head_counts_are_refused) {
  float buf[64] = {0}, att[64] = {0}, inv[2] = {1, 1};
  const int bad[][2] = {{4, 3}, {4, -1}, {2, 4}};
  for (int i = 0; i < LEN(bad); ++i) {
    char want[64];
    snprintf(want, sizeof want, "NKV %d key/value heads must divide NH %d", bad[i][1], bad[i][0]);
    ck_assert_int_eq(cpu()->attention_forward(
                         &(fsdp_attention_forward_args_t){.dt = FSDP_F32, .out = buf, .att = att,
                                                          .qkv = buf, .B = 1, .T = 1, .C = 4,
                                                          .NH = bad[i][0], .NKV = bad[i][1]},
                         HOST),
                     FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
    ck_assert_int_eq(cpu()->attention_backward(
                         &(fsdp_attention_backward_args_t){.dt = FSDP_F32, .dqkv = buf,
                                                           .dout = buf, .qkv = buf, .att = att,
                                                           .B = 1, .T = 1, .C = 4,
                                                           .NH = bad[i][0], .NKV = bad[i][1]},
                         HOST),
                     FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
    ck_assert_int_eq(cpu()->rope_forward(&(fsdp_rope_args_t){.dt = FSDP_F32, .qkv = buf,
                                                             .inv_freq = inv, .B = 1, .T = 1,
                                                             .NH = bad[i][0], .NKV = bad[i][1],
                                                             .D = 4},
                                         HOST),
                     FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  }
  for (int i = 0; i < 64; ++i) ck_assert_float_eq(buf[i], 0.0f);
  fsdp_rope_args_t r = {.dt = FSDP_F32, .qkv = buf, .inv_freq = inv, .B = 1, .T = 1, .NH = 2,
                        .NKV = 1, .D = 3};
  ck_assert_int_eq(cpu()->rope_backward(&r, HOST), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "head dim D 3"));
  r.D = 4, r.inv_freq = NULL;
  ck_assert_int_eq(cpu()->rope_forward(&r, HOST), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "inv_freq"));
}
END_TEST

/* ---- embedding without positions; other dtypes ---- */

/* wpe NULL: out is the token rows, bitwise; backward scatter-adds into dwte
 * only (dwpe NULL), a repeated token's rows summed. */
START_TEST(embedding_without_positions) {
  const int B = 2, T = 3, C = 5, V = 4;
  rng_seed(990);
  int tok[6] = {1, 3, 1, 0, 2, 1};
  float *wte = rand_floats((size_t)V * C, 0.0, 1.0), *out = rand_floats((size_t)B * T * C, 0, 1);
  float *dout = rand_floats((size_t)B * T * C, 0.0, 1.0), *dwte = zeros((size_t)V * C);
  ck_assert_int_eq(cpu()->embedding_forward(&(fsdp_embedding_forward_args_t){.dt = FSDP_F32,
                                                                             .out = out,
                                                                             .tokens = tok,
                                                                             .wte = wte, .B = B,
                                                                             .T = T, .C = C},
                                            HOST),
                   FSDP_SUCCESS);
  for (int i = 0; i < B * T; ++i)
    ck_assert_mem_eq(out + (size_t)i * C, wte + (size_t)tok[i] * C, C * sizeof(float));
  ck_assert_int_eq(cpu()->embedding_backward(&(fsdp_embedding_backward_args_t){.dt = FSDP_F32,
                                                                               .dwte = dwte,
                                                                               .dout = dout,
                                                                               .tokens = tok,
                                                                               .B = B, .T = T,
                                                                               .C = C},
                                             HOST),
                   FSDP_SUCCESS);
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int i = 0; i < B * T; ++i)
        if (tok[i] == v) want += dout[(size_t)i * C + c];
      assert_close("dwte", (size_t)v * C + c, dwte[(size_t)v * C + c], want, 1e-6);
    }
  free(wte), free(out), free(dout), free(dwte);
}
END_TEST

/* The new slots refuse bf16 on the CPU by op name, output untouched. */
START_TEST(cpu_refuses_bf16) {
  float x[8] = {0}, w[4] = {1, 1, 1, 1}, r[2], inv[1] = {1};
  ck_assert_int_eq(cpu()->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){.dt = FSDP_BF16,
                                                                         .out = x, .rstd = r,
                                                                         .inp = x, .weight = w,
                                                                         .N = 2, .C = 4},
                                          HOST),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "rmsnorm_forward"));
  ck_assert_int_eq(cpu()->rope_forward(&(fsdp_rope_args_t){.dt = FSDP_BF16, .qkv = x,
                                                           .inv_freq = inv, .B = 1, .T = 1,
                                                           .NH = 1, .NKV = 1, .D = 2},
                                       HOST),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "rope_forward"));
  ck_assert_int_eq(cpu()->swiglu_backward(&(fsdp_swiglu_backward_args_t){.dt = FSDP_BF16,
                                                                         .dinp = x, .dout = x,
                                                                         .inp = x, .N = 1,
                                                                         .F = 2},
                                          HOST),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "swiglu_backward"));
  for (int i = 0; i < 8; ++i) ck_assert_float_eq(x[i], 0.0f);
}
END_TEST

static Suite *llama_layers_suite(void) {
  Suite *s = suite_create("llama_layers");
  TCase *t = tcase_create("rmsnorm");
  tcase_add_loop_test(t, rmsnorm_forward_matches_f64, 0, LEN(kRms));
  tcase_add_loop_test(t, rmsnorm_fused_residual, 0, LEN(kRms));
  tcase_add_loop_test(t, rmsnorm_backward_gradcheck, 0, LEN(kRms));
  suite_add_tcase(s, t);
  t = tcase_create("rope");
  tcase_add_test(t, rope_inv_freq_matches_hf_formula);
  tcase_add_loop_test(t, rope_forward_matches_formula, 0, LEN(kRope));
  tcase_add_loop_test(t, rope_backward_gradcheck, 0, LEN(kRope));
  tcase_add_test(t, rope_pos0_shifts_positions);
  tcase_set_timeout(t, 60);
  suite_add_tcase(s, t);
  t = tcase_create("swiglu");
  tcase_add_loop_test(t, swiglu_forward_backward, 0, LEN(kSwi));
  tcase_add_test(t, swiglu_tails_are_finite);
  suite_add_tcase(s, t);
  t = tcase_create("gqa");
  tcase_add_loop_test(t, gqa_matches_repeat_kv, 0, LEN(kGqa));
  tcase_add_test(t, bad_head_counts_are_refused);
  suite_add_tcase(s, t);
  t = tcase_create("misc");
  tcase_add_test(t, embedding_without_positions);
  tcase_add_test(t, cpu_refuses_bf16);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return check_run(llama_layers_suite()); }
