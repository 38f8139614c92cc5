/* tests/unit/test_layers.c — the CPU layer kernels, src/backend/cpu/layers.c (linear,
 * ReLU, softmax cross-entropy, LayerNorm, embedding, causal attention,
 * residual) and src/backend/cpu/gelu.c (GELU), against float64 references written
 * here: forward values, gradients by central finite differences of the
 * float64 forward (common/gradcheck.h), the += contract of backward kernels,
 * and the invariants each kernel promises (softmax rows, causality,
 * normalised statistics); GPT-2's vocabulary head with a padded row stride
 * and its in-place cross-entropy, bitwise against the unpadded kernels. The
 * MLP end to end needs an engine and lives with
 * the engine tests. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/arrays.h"
#include "common/check_run.h"
#include "common/gradcheck.h"
#include "common/rng.h"
#include "fsdp/nn.h"
#include "backend/cpu/head.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Forward values: fp32 kernels against float64 with O(1) outputs, a few ulps
 * of accumulated rounding (2e-7 seen); 1e-5 relative with a floor of 1e-5. */
#define FWD_TOL 1e-5

static void assert_fwd(const char *what, size_t i, double got, double want) {
  ck_assert_msg(fabs(got - want) <= FWD_TOL * (1.0 + fabs(want)), "%s[%zu]: got %.9g want %.9g",
                what, i, got, want);
}

/* A second backward call into the same buffer must double it. */
static void assert_doubled(const char *what, const float *twice, const float *once, size_t n) {
  for (size_t i = 0; i < n; ++i)
    ck_assert_msg(fabs(twice[i] - 2.0 * once[i]) <= 1e-6 * (1.0 + fabs(once[i])),
                  "%s[%zu]: %.9g after two calls, %.9g after one", what, i, twice[i], once[i]);
}

/* ---- linear ---- */

static const struct { int B, C, OC; } kLinear[] = {{1, 1, 1}, {3, 5, 4}, {7, 16, 3}, {2, 33, 17}};

struct lin {
  int B, C, OC;
  float *inp, *w, *b, *r; /* r (B,OC): the loss is sum(r * out) */
};

static struct lin lin_make(int i) {
  rng_seed(1000 + (uint64_t)i);
  struct lin l = {kLinear[i].B, kLinear[i].C, kLinear[i].OC, NULL, NULL, NULL, NULL};
  l.inp = rand_floats((size_t)l.B * l.C, 0.0, 1.0);
  l.w = rand_floats((size_t)l.OC * l.C, 0.0, 1.0);
  l.b = rand_floats((size_t)l.OC, 0.0, 1.0);
  l.r = rand_floats((size_t)l.B * l.OC, 0.0, 1.0);
  return l;
}

static void lin_free(struct lin *l) { free(l->inp), free(l->w), free(l->b), free(l->r); }

/* float64 sum(r * (inp @ w^T + b)), reading the float arrays as given. */
static double lin_loss64(const void *p) {
  const struct lin *l = p;
  double loss = 0;
  for (int b = 0; b < l->B; ++b)
    for (int o = 0; o < l->OC; ++o) {
      double acc = l->b[o];
      for (int c = 0; c < l->C; ++c) acc += (double)l->inp[b * l->C + c] * l->w[o * l->C + c];
      loss += acc * l->r[b * l->OC + o];
    }
  return loss;
}

START_TEST(linear_forward_matches_f64) {
  struct lin l = lin_make(_i);
  /* Not zeroed: the forward must overwrite what is there. */
  float *out = xmalloc((size_t)l.B * l.OC * sizeof(float));
  float *nob = xmalloc((size_t)l.B * l.OC * sizeof(float));
  fsdp_linear_forward(out, l.inp, l.w, l.b, l.B, l.C, l.OC);
  fsdp_linear_forward(nob, l.inp, l.w, NULL, l.B, l.C, l.OC);
  for (int b = 0; b < l.B; ++b)
    for (int o = 0; o < l.OC; ++o) {
      double acc = 0;
      for (int c = 0; c < l.C; ++c) acc += (double)l.inp[b * l.C + c] * l.w[o * l.C + c];
      ck_assert_double_eq_tol(nob[b * l.OC + o], acc, 1e-5);
      ck_assert_double_eq_tol(out[b * l.OC + o], acc + l.b[o], 1e-5);
    }
  free(out), free(nob);
  lin_free(&l);
}
END_TEST

START_TEST(linear_backward_gradcheck) {
  struct lin l = lin_make(_i);
  const size_t ni = (size_t)l.B * l.C, nw = (size_t)l.OC * l.C;
  float *dinp = zeros(ni), *dw = zeros(nw), *db = zeros((size_t)l.OC);
  fsdp_linear_backward(dinp, dw, db, l.r, l.inp, l.w, l.B, l.C, l.OC);
  check_grads("dinp", lin_loss64, &l, l.inp, dinp, ni);
  check_grads("dweight", lin_loss64, &l, l.w, dw, nw);
  check_grads("dbias", lin_loss64, &l, l.b, db, (size_t)l.OC);
  free(dinp), free(dw), free(db);
  lin_free(&l);
}
END_TEST

/* Backward must add to what is there (gradient accumulation, several uses of
 * one input), and NULL dinp/dbias must skip those outputs only. */
START_TEST(linear_backward_accumulates) {
  struct lin l = lin_make(_i);
  const size_t ni = (size_t)l.B * l.C, nw = (size_t)l.OC * l.C;
  float *fresh_i = zeros(ni), *fresh_w = zeros(nw), *fresh_b = zeros((size_t)l.OC);
  fsdp_linear_backward(fresh_i, fresh_w, fresh_b, l.r, l.inp, l.w, l.B, l.C, l.OC);
  float *acc_i = xmalloc(ni * sizeof(float)), *acc_w = xmalloc(nw * sizeof(float));
  float *acc_b = xmalloc((size_t)l.OC * sizeof(float));
  for (size_t i = 0; i < ni; ++i) acc_i[i] = 0.5f + (float)i;
  for (size_t i = 0; i < nw; ++i) acc_w[i] = -1.0f - (float)i;
  for (int o = 0; o < l.OC; ++o) acc_b[o] = 3.0f * (float)o;
  fsdp_linear_backward(acc_i, acc_w, acc_b, l.r, l.inp, l.w, l.B, l.C, l.OC);
  for (size_t i = 0; i < ni; ++i) ck_assert_float_eq_tol(acc_i[i], 0.5f + (float)i + fresh_i[i], 1e-4f);
  for (size_t i = 0; i < nw; ++i) ck_assert_float_eq_tol(acc_w[i], -1.0f - (float)i + fresh_w[i], 1e-4f);
  for (int o = 0; o < l.OC; ++o) ck_assert_float_eq_tol(acc_b[o], 3.0f * (float)o + fresh_b[o], 1e-4f);
  /* Weight-only backward (the first layer of a model) leaves dweight as the
   * sum of two contributions and touches nothing else. */
  fsdp_linear_backward(NULL, acc_w, NULL, l.r, l.inp, l.w, l.B, l.C, l.OC);
  for (size_t i = 0; i < nw; ++i)
    ck_assert_float_eq_tol(acc_w[i], -1.0f - (float)i + 2.0f * fresh_w[i], 1e-4f);
  free(fresh_i), free(fresh_w), free(fresh_b), free(acc_i), free(acc_w), free(acc_b);
  lin_free(&l);
}
END_TEST

/* ---- ReLU ---- */

START_TEST(relu_forward_backward) {
  const size_t n = 257;
  rng_seed(77);
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) { /* 0.1 away from 0, sign kept: no kink within GRAD_H */
    const double d = rnd();
    x[i] = (float)(d < 0 ? d - 0.1 : d + 0.1);
  }
  float *r = rand_floats(n, 0.0, 1.0);
  float *y = xmalloc(n * sizeof(float)), *dx = xmalloc(n * sizeof(float));
  fsdp_relu_forward(y, x, n);
  for (size_t i = 0; i < n; ++i) {
    ck_assert_float_eq(y[i], x[i] > 0 ? x[i] : 0.0f);
    dx[i] = 2.0f; /* must be added to, not overwritten */
  }
  fsdp_relu_backward(dx, y, r, n);
  /* Loss sum(r * relu(x)) is separable: the central difference of element i
   * alone, in float64; |x| >= 0.1 > GRAD_H keeps both probes on one side of 0. */
  for (size_t i = 0; i < n; ++i) {
    double up = x[i] + GRAD_H, down = x[i] - GRAD_H;
    double numeric = r[i] * ((up > 0 ? up : 0) - (down > 0 ? down : 0)) / (2 * GRAD_H);
    assert_grad("relu dinp", i, dx[i] - 2.0, numeric);
  }
  /* In place, as the MLP uses it. */
  fsdp_relu_forward(x, x, n);
  ck_assert_mem_eq(x, y, n * sizeof(float));
  free(x), free(r), free(y), free(dx);
}
END_TEST

/* ---- softmax cross-entropy ---- */

static const struct {
  int B, V;
  double spread; /* logits in +-spread around an offset */
  double offset; /* large offsets overflow a naive exp */
  float scale;
} kXent[] = {
    {1, 2, 1, 0, 1.0f}, {4, 10, 3, 0, 1.0f}, {5, 7, 2, 0, 0.125f},
    {3, 33, 5, 0, 2.0f}, {2, 6, 4, 1000, 1.0f}, {2, 6, 4, -1000, 0.5f},
};

/* Stable float64 reference of one row: lse(row) - row[t]. */
static double xent_row64(const double *row, int t, int V) {
  double mx = row[0], s = 0;
  for (int j = 1; j < V; ++j) mx = fmax(mx, row[j]);
  for (int j = 0; j < V; ++j) s += exp(row[j] - mx);
  return mx + log(s) - row[t];
}

START_TEST(softmax_xent_gradcheck) {
  const int B = kXent[_i].B, V = kXent[_i].V;
  const size_t n = (size_t)B * V;
  rng_seed(500 + (uint64_t)_i);
  float *logits = rand_floats(n, kXent[_i].offset, kXent[_i].spread);
  float *dl = xmalloc(n * sizeof(float));
  int *t = rand_tokens((size_t)B, V);
  double *row = xmalloc((size_t)V * sizeof(double));
  const double loss = fsdp_softmax_xent(dl, logits, t, B, V, kXent[_i].scale);
  double want = 0;
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < V; ++j) row[j] = logits[(size_t)b * V + j];
    want += xent_row64(row, t[b], V);
  }
  ck_assert(isfinite(loss));
  ck_assert_double_eq_tol(loss, want, 1e-5 * (1.0 + fabs(want)));
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < V; ++j) row[j] = logits[(size_t)b * V + j];
    for (int j = 0; j < V; ++j) {
      const double x0 = row[j];
      row[j] = x0 + GRAD_H;
      const double up = xent_row64(row, t[b], V);
      row[j] = x0 - GRAD_H;
      const double down = xent_row64(row, t[b], V);
      row[j] = x0;
      assert_grad("dlogits", (size_t)b * V + j, dl[(size_t)b * V + j],
                  kXent[_i].scale * (up - down) / (2 * GRAD_H));
    }
  }
  /* Without dlogits only the loss is computed, and it is the same. */
  ck_assert_double_eq(fsdp_softmax_xent(NULL, logits, t, B, V, 1.0f), loss);
  free(logits), free(dl), free(row), free(t);
}
END_TEST

START_TEST(softmax_xent_known_value) {
  /* Uniform logits over V classes: loss log(V) per row; gradient 1/V - onehot. */
  const float logits[2 * 4] = {0.3f, 0.3f, 0.3f, 0.3f, -2, -2, -2, -2};
  const int t[2] = {1, 3};
  float dl[8];
  ck_assert_double_eq_tol(fsdp_softmax_xent(dl, logits, t, 2, 4, 1.0f), 2 * log(4.0), 1e-6);
  for (int i = 0; i < 8; ++i)
    ck_assert_float_eq_tol(dl[i], 0.25f - (i == 1 || i == 7 ? 1.0f : 0.0f), 1e-7f);
}
END_TEST

START_TEST(softmax_xent_bad_target_is_nan) {
  const float logits[2 * 3] = {1, 2, 3, 1, 2, 3};
  const int t[2] = {0, 3};
  float dl[6];
  ck_assert(isnan(fsdp_softmax_xent(dl, logits, t, 2, 3, 1.0f)));
  for (int j = 0; j < 3; ++j) {
    ck_assert(isfinite(dl[j])); /* the good row is untouched by the bad one */
    ck_assert(isnan(dl[3 + j]));
  }
}
END_TEST

/* ---- GELU ---- */

static double gelu64(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Inputs spread over +-spread: 6 reaches both tails, 0.5 the curved middle. */
static const struct { size_t n; double spread; } kGelu[] = {{1, 1.0}, {37, 0.5}, {1000, 6.0}};

START_TEST(gelu_forward_backward) {
  const size_t n = kGelu[_i].n;
  rng_seed(100 + (uint64_t)_i);
  float *x = rand_floats(n, 0.0, kGelu[_i].spread), *r = rand_floats(n, 0.0, 1.0);
  float *y = zeros(n), *dx = zeros(n), *dx2 = zeros(n);
  fsdp_gelu_forward(y, x, n);
  for (size_t i = 0; i < n; ++i) assert_fwd("gelu", i, y[i], gelu64(x[i]));
  fsdp_gelu_backward(dx, x, r, n);
  /* sum(r * gelu(x)) is separable: the difference of element i alone. */
  for (size_t i = 0; i < n; ++i) {
    const double num = r[i] * (gelu64(x[i] + GRAD_H) - gelu64(x[i] - GRAD_H)) / (2 * GRAD_H);
    assert_grad("gelu dinp", i, dx[i], num);
  }
  memcpy(dx2, dx, n * sizeof(float));
  fsdp_gelu_backward(dx2, x, r, n);
  assert_doubled("gelu dinp", dx2, dx, n);
  free(x), free(r), free(y), free(dx), free(dx2);
}
END_TEST

/* Far tails: no NaN from exp over/underflow; values x and 0 and slopes 1 and 0,
 * to within 2 ulp (the vectorised division is a reciprocal estimate refined
 * once; see gelu.c). */
START_TEST(gelu_tails_are_finite) {
  const float x[4] = {-100.0f, -30.0f, 30.0f, 100.0f}, r[4] = {1, 1, 1, 1};
  float y[4], dx[4] = {0};
  fsdp_gelu_forward(y, x, 4);
  fsdp_gelu_backward(dx, x, r, 4);
  for (int i = 0; i < 4; ++i) {
    const float want_y = x[i] > 0 ? x[i] : 0.0f, want_dx = x[i] > 0 ? 1.0f : 0.0f;
    ck_assert_float_eq_tol(y[i], want_y, 2 * FLT_EPSILON * fabsf(x[i]));
    ck_assert_float_eq_tol(dx[i], want_dx, 2 * FLT_EPSILON);
  }
}
END_TEST

/* ---- LayerNorm ---- */

/* offset moves the row means away from 0, where one-pass variance loses bits. */
static const struct { int N, C; double offset; } kLn[] = {
    {1, 1, 0.0}, {3, 12, 0.0}, {5, 33, 0.5}, {4, 20, 10.0}};

struct ln {
  int N, C;
  float *inp, *w, *b, *r; /* r (N,C): loss = sum(r * out) */
};

static struct ln ln_make(int i) {
  rng_seed(200 + (uint64_t)i);
  struct ln l = {kLn[i].N, kLn[i].C, NULL, NULL, NULL, NULL};
  const size_t n = (size_t)l.N * l.C;
  l.inp = rand_floats(n, kLn[i].offset, 1.0);
  l.w = rand_floats((size_t)l.C, 1.0, 0.5);
  l.b = rand_floats((size_t)l.C, 0.0, 0.5);
  l.r = rand_floats(n, 0.0, 1.0);
  return l;
}

static void ln_free(struct ln *l) { free(l->inp), free(l->w), free(l->b), free(l->r); }

/* float64 LayerNorm of row i: out (C) and the row's mean and rstd. */
static void ln_row64(double *out, double *mean, double *rstd, const struct ln *l, int i) {
  const float *x = l->inp + (size_t)i * l->C;
  double m = 0, v = 0;
  for (int c = 0; c < l->C; ++c) m += x[c];
  m /= l->C;
  for (int c = 0; c < l->C; ++c) v += (x[c] - m) * (x[c] - m);
  const double s = 1.0 / sqrt(v / l->C + 1e-5);
  for (int c = 0; c < l->C; ++c) out[c] = (x[c] - m) * s * l->w[c] + l->b[c];
  *mean = m;
  *rstd = s;
}

static double ln_loss64(const void *p) {
  const struct ln *l = p;
  double *row = malloc((size_t)l->C * sizeof(double)), m, s, loss = 0;
  for (int i = 0; i < l->N; ++i) {
    ln_row64(row, &m, &s, l, i);
    for (int c = 0; c < l->C; ++c) loss += row[c] * l->r[(size_t)i * l->C + c];
  }
  free(row);
  return loss;
}

START_TEST(layernorm_forward_matches_f64) {
  struct ln l = ln_make(_i);
  const size_t n = (size_t)l.N * l.C;
  float *out = zeros(n), *mean = zeros((size_t)l.N), *rstd = zeros((size_t)l.N);
  double *row = malloc((size_t)l.C * sizeof(double)), m, s;
  fsdp_layernorm_forward(out, mean, rstd, l.inp, l.w, l.b, l.N, l.C);
  for (int i = 0; i < l.N; ++i) {
    ln_row64(row, &m, &s, &l, i);
    assert_fwd("mean", (size_t)i, mean[i], m);
    assert_fwd("rstd", (size_t)i, rstd[i], s);
    for (int c = 0; c < l.C; ++c) assert_fwd("ln out", (size_t)i * l.C + c, out[i * l.C + c], row[c]);
  }
  free(out), free(mean), free(rstd), free(row);
  ln_free(&l);
}
END_TEST

/* With weight 1 and bias 0 each row comes out with mean 0 and variance
 * var / (var + eps) of its input variance var: ~1, or 0 for one column. */
START_TEST(layernorm_normalises) {
  struct ln l = ln_make(_i);
  const size_t n = (size_t)l.N * l.C;
  float *out = zeros(n), *mean = zeros((size_t)l.N), *rstd = zeros((size_t)l.N);
  float *one = zeros((size_t)l.C), *zero = zeros((size_t)l.C);
  for (int c = 0; c < l.C; ++c) one[c] = 1.0f;
  fsdp_layernorm_forward(out, mean, rstd, l.inp, one, zero, l.N, l.C);
  for (int i = 0; i < l.N; ++i) {
    const float *x = l.inp + (size_t)i * l.C, *y = out + (size_t)i * l.C;
    double mx = 0, vx = 0, my = 0, vy = 0;
    for (int c = 0; c < l.C; ++c) mx += x[c], my += y[c];
    mx /= l.C, my /= l.C;
    for (int c = 0; c < l.C; ++c) vx += (x[c] - mx) * (x[c] - mx), vy += (y[c] - my) * (y[c] - my);
    vx /= l.C, vy /= l.C;
    ck_assert_double_eq_tol(my, 0.0, 1e-6);
    ck_assert_double_eq_tol(vy, vx / (vx + 1e-5), 1e-5);
  }
  free(out), free(mean), free(rstd), free(one), free(zero);
  ln_free(&l);
}
END_TEST

START_TEST(layernorm_backward_gradcheck) {
  struct ln l = ln_make(_i);
  const size_t n = (size_t)l.N * l.C;
  float *out = zeros(n), *mean = zeros((size_t)l.N), *rstd = zeros((size_t)l.N);
  float *dx = zeros(n), *dw = zeros((size_t)l.C), *db = zeros((size_t)l.C);
  fsdp_layernorm_forward(out, mean, rstd, l.inp, l.w, l.b, l.N, l.C);
  fsdp_layernorm_backward(dx, dw, db, l.r, l.inp, l.w, mean, rstd, l.N, l.C);
  check_grads("ln dinp", ln_loss64, &l, l.inp, dx, n);
  check_grads("ln dweight", ln_loss64, &l, l.w, dw, (size_t)l.C);
  check_grads("ln dbias", ln_loss64, &l, l.b, db, (size_t)l.C);
  free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
  ln_free(&l);
}
END_TEST

/* Two calls double every gradient; with dinp NULL only dweight and dbias move. */
START_TEST(layernorm_backward_accumulates) {
  struct ln l = ln_make(_i);
  const size_t n = (size_t)l.N * l.C, C = (size_t)l.C;
  float *out = zeros(n), *mean = zeros((size_t)l.N), *rstd = zeros((size_t)l.N);
  float *dx = zeros(n), *dw = zeros(C), *db = zeros(C);
  fsdp_layernorm_forward(out, mean, rstd, l.inp, l.w, l.b, l.N, l.C);
  fsdp_layernorm_backward(dx, dw, db, l.r, l.inp, l.w, mean, rstd, l.N, l.C);
  float *dx2 = copy_floats(dx, n), *dw2 = copy_floats(dw, C), *db2 = copy_floats(db, C);
  fsdp_layernorm_backward(dx2, dw2, db2, l.r, l.inp, l.w, mean, rstd, l.N, l.C);
  assert_doubled("ln dinp", dx2, dx, n);
  assert_doubled("ln dweight", dw2, dw, C);
  assert_doubled("ln dbias", db2, db, C);
  float *dw3 = zeros(C), *db3 = zeros(C);
  fsdp_layernorm_backward(NULL, dw3, db3, l.r, l.inp, l.w, mean, rstd, l.N, l.C);
  ck_assert_mem_eq(dw3, dw, C * sizeof(float));
  ck_assert_mem_eq(db3, db, C * sizeof(float));
  free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
  free(dx2), free(dw2), free(db2), free(dw3), free(db3);
  ln_free(&l);
}
END_TEST

/* ---- embedding ---- */

static const struct { int B, T, C, V; } kEmb[] = {{1, 1, 1, 1}, {2, 5, 12, 11}, {3, 7, 5, 4}};

struct emb {
  int B, T, C, V;
  int *tok;
  float *wte, *wpe, *r; /* (V,C), (T,C), (B,T,C) */
};

static struct emb emb_make(int i) {
  rng_seed(300 + (uint64_t)i);
  struct emb e = {kEmb[i].B, kEmb[i].T, kEmb[i].C, kEmb[i].V, NULL, NULL, NULL, NULL};
  const size_t bt = (size_t)e.B * e.T;
  e.tok = rand_tokens(bt, e.V);
  if (bt > 1) e.tok[bt - 1] = e.tok[0]; /* a repeated token: the scatter must add */
  e.wte = rand_floats((size_t)e.V * e.C, 0.0, 1.0);
  e.wpe = rand_floats((size_t)e.T * e.C, 0.0, 1.0);
  e.r = rand_floats(bt * e.C, 0.0, 1.0);
  return e;
}

static void emb_free(struct emb *e) { free(e->tok), free(e->wte), free(e->wpe), free(e->r); }

static double emb_loss64(const void *p) {
  const struct emb *e = p;
  double loss = 0;
  for (int b = 0; b < e->B; ++b)
    for (int t = 0; t < e->T; ++t) {
      const size_t bt = (size_t)b * e->T + t;
      for (int c = 0; c < e->C; ++c)
        loss += ((double)e->wte[(size_t)e->tok[bt] * e->C + c] + e->wpe[(size_t)t * e->C + c]) *
                e->r[bt * e->C + c];
    }
  return loss;
}

START_TEST(embedding_forward_backward) {
  struct emb e = emb_make(_i);
  const size_t bt = (size_t)e.B * e.T, nte = (size_t)e.V * e.C, npe = (size_t)e.T * e.C;
  float *out = zeros(bt * e.C), *dwte = zeros(nte), *dwpe = zeros(npe);
  fsdp_embedding_forward(out, e.tok, e.wte, e.wpe, e.B, e.T, e.C);
  for (int b = 0; b < e.B; ++b)
    for (int t = 0; t < e.T; ++t)
      for (int c = 0; c < e.C; ++c) {
        const size_t bt_i = (size_t)b * e.T + t;
        ck_assert_float_eq(out[bt_i * e.C + c],
                           e.wte[(size_t)e.tok[bt_i] * e.C + c] + e.wpe[(size_t)t * e.C + c]);
      }
  fsdp_embedding_backward(dwte, dwpe, e.r, e.tok, e.B, e.T, e.C);
  check_grads("dwte", emb_loss64, &e, e.wte, dwte, nte);
  check_grads("dwpe", emb_loss64, &e, e.wpe, dwpe, npe);
  float *dwte2 = copy_floats(dwte, nte), *dwpe2 = copy_floats(dwpe, npe);
  fsdp_embedding_backward(dwte2, dwpe2, e.r, e.tok, e.B, e.T, e.C);
  assert_doubled("dwte", dwte2, dwte, nte);
  assert_doubled("dwpe", dwpe2, dwpe, npe);
  free(out), free(dwte), free(dwpe), free(dwte2), free(dwpe2);
  emb_free(&e);
}
END_TEST

/* ---- attention ---- */

/* T = 70 spans three forward row blocks and two backward ones (4096 / 70 =
 * 58 rows); hs = 1 and 2 and odd heads exercise the strides. */
static const struct { int B, T, C, NH; } kAtt[] = {
    {1, 1, 4, 1}, {2, 5, 12, 3}, {1, 7, 10, 2}, {2, 9, 8, 4}, {1, 70, 6, 3}, {1, 3, 3, 3}};

struct att {
  int B, T, C, NH;
  float *qkv, *r; /* (B,T,3C), (B,T,C) */
};

static struct att att_make(int i) {
  rng_seed(400 + (uint64_t)i);
  struct att a = {kAtt[i].B, kAtt[i].T, kAtt[i].C, kAtt[i].NH, NULL, NULL};
  const size_t bt = (size_t)a.B * a.T;
  /* Spread 2 gives peaked and flat softmax rows alike. */
  a.qkv = rand_floats(bt * 3 * a.C, 0.0, 2.0);
  a.r = rand_floats(bt * a.C, 0.0, 1.0);
  return a;
}

static void att_free(struct att *a) { free(a->qkv), free(a->r); }

/* float64 causal attention: out (B,T,C) and att (B,NH,T,T). */
static void attention64(double *out, double *att, const struct att *a) {
  const int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
  const double scale = 1.0 / sqrt(hs);
  for (int b = 0; b < a->B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float *q = a->qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
        double *p = att + (((size_t)b * NH + h) * T + t) * T, mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; ++j) {
          const float *k = a->qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
          double s = 0;
          for (int c = 0; c < hs; ++c) s += (double)q[c] * k[c];
          p[j] = s * scale;
          if (j <= t) mx = fmax(mx, p[j]);
        }
        for (int j = 0; j < T; ++j) {
          p[j] = j <= t ? exp(p[j] - mx) : 0.0;
          sum += p[j];
        }
        double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
        for (int c = 0; c < hs; ++c) o[c] = 0;
        for (int j = 0; j <= t; ++j) {
          p[j] /= sum;
          const float *v = a->qkv + ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs;
          for (int c = 0; c < hs; ++c) o[c] += p[j] * v[c];
        }
      }
}

static double att_loss64(const void *p) {
  const struct att *a = p;
  const size_t no = (size_t)a->B * a->T * a->C;
  double *out = malloc(no * sizeof(double));
  double *att = malloc((size_t)a->B * a->NH * a->T * a->T * sizeof(double)), loss = 0;
  attention64(out, att, a);
  for (size_t i = 0; i < no; ++i) loss += out[i] * a->r[i];
  free(out), free(att);
  return loss;
}

START_TEST(attention_forward_matches_f64) {
  struct att a = att_make(_i);
  const size_t no = (size_t)a.B * a.T * a.C, na = (size_t)a.B * a.NH * a.T * a.T;
  float *out = zeros(no), *att = rand_floats(na, 0.0, 1.0); /* stale values must go */
  double *out64 = malloc(no * sizeof(double)), *att64 = malloc(na * sizeof(double));
  fsdp_attention_forward(out, att, a.qkv, a.B, a.T, a.C, a.NH);
  attention64(out64, att64, &a);
  for (size_t i = 0; i < no; ++i) assert_fwd("att out", i, out[i], out64[i]);
  for (size_t i = 0; i < na; ++i) assert_fwd("att", i, att[i], att64[i]);
  /* Rows are distributions over the past and present only. */
  for (size_t row = 0; row < (size_t)a.B * a.NH * a.T; ++row) {
    const int t = (int)(row % (size_t)a.T);
    const float *p = att + row * a.T;
    double sum = 0;
    for (int j = 0; j <= t; ++j) sum += p[j];
    ck_assert_double_eq_tol(sum, 1.0, 1e-5);
    for (int j = t + 1; j < a.T; ++j) ck_assert_float_eq(p[j], 0.0f);
  }
  free(out), free(att), free(out64), free(att64);
  att_free(&a);
}
END_TEST

/* Changing the q, k and v of position t0 leaves every earlier output and
 * probability row bit-for-bit unchanged. */
START_TEST(attention_is_causal) {
  struct att a = att_make(_i);
  const size_t no = (size_t)a.B * a.T * a.C, na = (size_t)a.B * a.NH * a.T * a.T;
  float *out = zeros(no), *att = zeros(na), *out2 = zeros(no), *att2 = zeros(na);
  fsdp_attention_forward(out, att, a.qkv, a.B, a.T, a.C, a.NH);
  const int t0 = a.T / 2;
  for (int b = 0; b < a.B; ++b)
    for (int c = 0; c < 3 * a.C; ++c) a.qkv[((size_t)b * a.T + t0) * 3 * a.C + c] += 1.5f;
  fsdp_attention_forward(out2, att2, a.qkv, a.B, a.T, a.C, a.NH);
  for (int b = 0; b < a.B; ++b) {
    const size_t first = (size_t)b * a.T * a.C;
    ck_assert_mem_eq(out + first, out2 + first, (size_t)t0 * a.C * sizeof(float));
    for (int h = 0; h < a.NH; ++h) {
      const size_t head = ((size_t)b * a.NH + h) * a.T * a.T;
      ck_assert_mem_eq(att + head, att2 + head, (size_t)t0 * a.T * sizeof(float));
    }
  }
  /* and the perturbed row itself does change */
  ck_assert(memcmp(out + (size_t)t0 * a.C, out2 + (size_t)t0 * a.C, a.C * sizeof(float)));
  free(out), free(att), free(out2), free(att2);
  att_free(&a);
}
END_TEST

START_TEST(attention_backward_gradcheck) {
  struct att a = att_make(_i);
  const size_t nq = (size_t)a.B * a.T * 3 * a.C, no = (size_t)a.B * a.T * a.C;
  float *out = zeros(no), *att = zeros((size_t)a.B * a.NH * a.T * a.T), *dqkv = zeros(nq);
  fsdp_attention_forward(out, att, a.qkv, a.B, a.T, a.C, a.NH);
  fsdp_attention_backward(dqkv, a.r, a.qkv, att, a.B, a.T, a.C, a.NH);
  check_grads("dqkv", att_loss64, &a, a.qkv, dqkv, nq);
  float *dqkv2 = copy_floats(dqkv, nq);
  fsdp_attention_backward(dqkv2, a.r, a.qkv, att, a.B, a.T, a.C, a.NH);
  assert_doubled("dqkv", dqkv2, dqkv, nq);
  free(out), free(att), free(dqkv), free(dqkv2);
  att_free(&a);
}
END_TEST

/* Past FSDP_ATTENTION_MAX_T the backward has no scratch: it poisons dqkv with
 * NaN instead of returning a wrong gradient, and reads nothing else (hence
 * the NULL inputs). */
START_TEST(attention_backward_rejects_long_t) {
  const int T = FSDP_ATTENTION_MAX_T + 1, C = 2;
  float *dqkv = zeros((size_t)T * 3 * C);
  fsdp_attention_backward(dqkv, NULL, NULL, NULL, 1, T, C, 1);
  for (size_t i = 0; i < (size_t)T * 3 * C; ++i) ck_assert(isnan(dqkv[i]));
  free(dqkv);
}
END_TEST

/* ---- residual ---- */

START_TEST(residual_forward_backward) {
  const size_t n = 101;
  rng_seed(500);
  float *a = rand_floats(n, 0.0, 1.0), *b = rand_floats(n, 0.0, 1.0), *d = rand_floats(n, 0.0, 1.0);
  float *out = zeros(n), *da = zeros(n), *db = zeros(n);
  fsdp_residual_forward(out, a, b, n);
  for (size_t i = 0; i < n; ++i) ck_assert_float_eq(out[i], a[i] + b[i]);
  for (size_t i = 0; i < n; ++i) da[i] = 0.5f * (float)i, db[i] = -1.0f;
  fsdp_residual_backward(da, db, d, n);
  fsdp_residual_backward(da, db, d, n);
  for (size_t i = 0; i < n; ++i) { /* the same two fp32 adds, so exact */
    float wa = 0.5f * (float)i, wb = -1.0f;
    wa += d[i], wa += d[i], wb += d[i], wb += d[i];
    ck_assert_float_eq(da[i], wa);
    ck_assert_float_eq(db[i], wb);
  }
  /* In place, as a residual stream uses it. */
  fsdp_residual_forward(a, a, b, n);
  ck_assert_mem_eq(a, out, n * sizeof(float));
  free(a), free(b), free(d), free(out), free(da), free(db);
}
END_TEST

/* GPT-2's head (backend/cpu/head.h): logits rows ld apart, the gradient written over
 * them. Against the unpadded kernels on the same inputs: bitwise (the same
 * sgemm calls but for the leading dimension, which OpenBLAS only reads while
 * packing; the same xent_row arithmetic), at GPT-2's V = 50257 -> 50304 and
 * at a small V; columns [V, ld) keep a sentinel through forward, the
 * cross-entropy and backward (nothing reads or writes them). */
static const struct { int B, C, V; } kHead[] = {{5, 8, 50257}, {7, 12, 250}, {3, 5, 128}};

START_TEST(head_padded_matches_unpadded) {
  const int B = kHead[_i].B, C = kHead[_i].C, V = kHead[_i].V, ld = (V + 127) / 128 * 128;
  const float sentinel = -12345.0f, scale = 0.37f;
  rng_seed(40 + (uint64_t)_i);
  float *inp = rand_floats((size_t)B * C, 0.0, 1.0), *wte = rand_floats((size_t)V * C, 0.0, 1.0);
  int *tgt = rand_tokens((size_t)B, V);
  float *ref = zeros((size_t)B * V), *dref = zeros((size_t)B * V);
  float *pad = xmalloc((size_t)B * ld * sizeof(float));
  for (size_t i = 0; i < (size_t)B * ld; i++) pad[i] = sentinel;
  fsdp_linear_forward(ref, inp, wte, NULL, B, C, V);
  nn_head_forward(pad, ld, inp, wte, B, C, V);
  for (int b = 0; b < B; b++)
    ck_assert_mem_eq(pad + (size_t)b * ld, ref + (size_t)b * V, (size_t)V * sizeof(float));
  /* loss alone leaves the logits as they were */
  const double want = fsdp_softmax_xent(dref, ref, tgt, B, V, scale);
  ck_assert(nn_xent_inplace(pad, ld, NULL, tgt, B, V, scale, 0) == want);
  for (int b = 0; b < B; b++)
    ck_assert_mem_eq(pad + (size_t)b * ld, ref + (size_t)b * V, (size_t)V * sizeof(float));
  ck_assert(nn_xent_inplace(pad, ld, NULL, tgt, B, V, scale, 1) == want);
  for (int b = 0; b < B; b++)
    ck_assert_mem_eq(pad + (size_t)b * ld, dref + (size_t)b * V, (size_t)V * sizeof(float));
  float *din_ref = rand_floats((size_t)B * C, 0.0, 1.0), *din = copy_floats(din_ref, (size_t)B * C);
  float *dw_ref = rand_floats((size_t)V * C, 0.0, 1.0), *dw = copy_floats(dw_ref, (size_t)V * C);
  fsdp_linear_backward(din_ref, dw_ref, NULL, dref, inp, wte, B, C, V);
  nn_head_backward(din, dw, pad, ld, inp, wte, B, C, V);
  ck_assert_mem_eq(din, din_ref, (size_t)B * C * sizeof(float));
  ck_assert_mem_eq(dw, dw_ref, (size_t)V * C * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int j = V; j < ld; j++) ck_assert(pad[(size_t)b * ld + j] == sentinel);
  /* a bad target: a NaN loss and a NaN row, in place as in a second buffer */
  tgt[1] = V;
  nn_head_forward(pad, ld, inp, wte, B, C, V);
  ck_assert(isnan(nn_xent_inplace(pad, ld, NULL, tgt, B, V, scale, 1)));
  for (int j = 0; j < V; j++) ck_assert(isnan(pad[(size_t)ld + j]));
  ck_assert(!isnan(pad[0]));
  for (int j = V; j < ld; j++) ck_assert(pad[(size_t)ld + j] == sentinel);
  free(inp), free(wte), free(tgt), free(ref), free(dref), free(pad);
  free(din_ref), free(din), free(dw_ref), free(dw);
}
END_TEST

static Suite *layers_suite(void) {
  Suite *s = suite_create("layers");
  TCase *t = tcase_create("linear");
  tcase_add_loop_test(t, linear_forward_matches_f64, 0, LEN(kLinear));
  tcase_add_loop_test(t, linear_backward_gradcheck, 0, LEN(kLinear));
  tcase_add_loop_test(t, linear_backward_accumulates, 0, LEN(kLinear));
  suite_add_tcase(s, t);
  t = tcase_create("relu");
  tcase_add_test(t, relu_forward_backward);
  suite_add_tcase(s, t);
  t = tcase_create("xent");
  tcase_add_loop_test(t, softmax_xent_gradcheck, 0, LEN(kXent));
  tcase_add_test(t, softmax_xent_known_value);
  tcase_add_test(t, softmax_xent_bad_target_is_nan);
  tcase_add_loop_test(t, head_padded_matches_unpadded, 0, LEN(kHead));
  suite_add_tcase(s, t);
  t = tcase_create("gelu");
  tcase_add_loop_test(t, gelu_forward_backward, 0, LEN(kGelu));
  tcase_add_test(t, gelu_tails_are_finite);
  suite_add_tcase(s, t);
  t = tcase_create("layernorm");
  tcase_add_loop_test(t, layernorm_forward_matches_f64, 0, LEN(kLn));
  tcase_add_loop_test(t, layernorm_normalises, 0, LEN(kLn));
  tcase_add_loop_test(t, layernorm_backward_gradcheck, 0, LEN(kLn));
  tcase_add_loop_test(t, layernorm_backward_accumulates, 0, LEN(kLn));
  suite_add_tcase(s, t);
  t = tcase_create("embedding");
  tcase_add_loop_test(t, embedding_forward_backward, 0, LEN(kEmb));
  suite_add_tcase(s, t);
  t = tcase_create("attention");
  tcase_add_loop_test(t, attention_forward_matches_f64, 0, LEN(kAtt));
  tcase_add_loop_test(t, attention_is_causal, 0, LEN(kAtt));
  tcase_add_loop_test(t, attention_backward_gradcheck, 0, LEN(kAtt));
  tcase_add_test(t, attention_backward_rejects_long_t);
  tcase_set_timeout(t, 60);
  suite_add_tcase(s, t);
  t = tcase_create("residual");
  tcase_add_test(t, residual_forward_backward);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return check_run(layers_suite()); }
