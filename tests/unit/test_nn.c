/* tests/unit/test_nn.c — CPU layer kernels against float64 references:
 * forward values, gradients by central finite differences, and the +=
 * contract of backward kernels. The MLP end to end needs an engine and lives
 * with the engine tests. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/nn.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Finite differences run on a float64 forward, so with step H the central
 * difference has truncation error O(H^2 f''') ~ 1e-8 and round-off
 * ~ 1e-16 / H ~ 1e-12: it is exact next to the fp32 analytic gradients,
 * whose error is a few fp32 ulps of sums of O(1) terms (~1e-6). Hence
 * |analytic - numeric| <= RTOL |numeric| + ATOL with room to spare. */
#define H 1e-4
#define RTOL 1e-3
#define ATOL 1e-5

static uint64_t rng_state;

static double rnd(void) { /* uniform in [-1, 1), splitmix64 */
  uint64_t x = (rng_state += 0x9E3779B97F4A7C15ULL);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return (double)((x ^ (x >> 31)) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *rand_floats(size_t n, double lo_abs) {
  float *x = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (size_t i = 0; i < n; ++i) {
    double r = rnd();
    /* Away from 0 by lo_abs, keeping the sign: no ReLU kink within H. */
    x[i] = (float)(r < 0 ? r - lo_abs : r + lo_abs);
  }
  return x;
}

static void assert_grad(const char *what, size_t i, double analytic, double numeric) {
  ck_assert_msg(fabs(analytic - numeric) <= RTOL * fabs(numeric) + ATOL,
                "%s[%zu]: analytic %.9g vs numeric %.9g", what, i, analytic, numeric);
}

/* ---- linear ---- */

static const struct { int B, C, OC; } kLinear[] = {{1, 1, 1}, {3, 5, 4}, {7, 16, 3}, {2, 33, 17}};

struct lin {
  int B, C, OC;
  float *inp, *w, *b, *r; /* r (B,OC): the loss is sum(r * out) */
};

static struct lin lin_make(int i) {
  rng_state = 1000 + (uint64_t)i;
  struct lin l = {kLinear[i].B, kLinear[i].C, kLinear[i].OC, NULL, NULL, NULL, NULL};
  l.inp = rand_floats((size_t)l.B * l.C, 0);
  l.w = rand_floats((size_t)l.OC * l.C, 0);
  l.b = rand_floats((size_t)l.OC, 0);
  l.r = rand_floats((size_t)l.B * l.OC, 0);
  return l;
}

static void lin_free(struct lin *l) {
  free(l->inp);
  free(l->w);
  free(l->b);
  free(l->r);
}

/* float64 sum(r * (inp @ w^T + b)), reading the float arrays as given. */
static double lin_loss64(const struct lin *l) {
  double loss = 0;
  for (int b = 0; b < l->B; ++b)
    for (int o = 0; o < l->OC; ++o) {
      double acc = l->b[o];
      for (int c = 0; c < l->C; ++c) acc += (double)l->inp[b * l->C + c] * l->w[o * l->C + c];
      loss += acc * l->r[b * l->OC + o];
    }
  return loss;
}

/* Central difference of the float64 loss around x[i]; x is restored after.
 * The probes are stored in the fp32 array, so the divisor is the step
 * actually taken after rounding, not the nominal 2H. */
static double numeric_grad(const struct lin *l, float *x, size_t i) {
  const float x0 = x[i];
  x[i] = (float)(x0 + H);
  const double up = lin_loss64(l), dx_up = (double)x[i] - x0;
  x[i] = (float)(x0 - H);
  const double down = lin_loss64(l), dx_down = x0 - (double)x[i];
  x[i] = x0;
  return (up - down) / (dx_up + dx_down);
}

START_TEST(linear_forward_matches_f64) {
  struct lin l = lin_make(_i);
  float *out = malloc((size_t)l.B * l.OC * sizeof(float));
  float *nob = malloc((size_t)l.B * l.OC * sizeof(float));
  fsdp_linear_forward(out, l.inp, l.w, l.b, l.B, l.C, l.OC);
  fsdp_linear_forward(nob, l.inp, l.w, NULL, l.B, l.C, l.OC);
  for (int b = 0; b < l.B; ++b)
    for (int o = 0; o < l.OC; ++o) {
      double acc = 0;
      for (int c = 0; c < l.C; ++c) acc += (double)l.inp[b * l.C + c] * l.w[o * l.C + c];
      ck_assert_double_eq_tol(nob[b * l.OC + o], acc, 1e-5);
      ck_assert_double_eq_tol(out[b * l.OC + o], acc + l.b[o], 1e-5);
    }
  free(out);
  free(nob);
  lin_free(&l);
}
END_TEST

START_TEST(linear_backward_gradcheck) {
  struct lin l = lin_make(_i);
  const size_t ni = (size_t)l.B * l.C, nw = (size_t)l.OC * l.C;
  float *dinp = calloc(ni, sizeof(float)), *dw = calloc(nw, sizeof(float));
  float *db = calloc((size_t)l.OC, sizeof(float));
  fsdp_linear_backward(dinp, dw, db, l.r, l.inp, l.w, l.B, l.C, l.OC);
  for (size_t i = 0; i < ni; ++i) assert_grad("dinp", i, dinp[i], numeric_grad(&l, l.inp, i));
  for (size_t i = 0; i < nw; ++i) assert_grad("dweight", i, dw[i], numeric_grad(&l, l.w, i));
  for (int o = 0; o < l.OC; ++o) assert_grad("dbias", (size_t)o, db[o], numeric_grad(&l, l.b, o));
  free(dinp);
  free(dw);
  free(db);
  lin_free(&l);
}
END_TEST

/* Backward must add to what is there (gradient accumulation, several uses of
 * one input), and NULL dinp/dbias must skip those outputs only. */
START_TEST(linear_backward_accumulates) {
  struct lin l = lin_make(_i);
  const size_t ni = (size_t)l.B * l.C, nw = (size_t)l.OC * l.C;
  float *fresh_i = calloc(ni, sizeof(float)), *fresh_w = calloc(nw, sizeof(float));
  float *fresh_b = calloc((size_t)l.OC, sizeof(float));
  fsdp_linear_backward(fresh_i, fresh_w, fresh_b, l.r, l.inp, l.w, l.B, l.C, l.OC);
  float *acc_i = malloc(ni * sizeof(float)), *acc_w = malloc(nw * sizeof(float));
  float *acc_b = malloc((size_t)l.OC * sizeof(float));
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
  rng_state = 77;
  float *x = rand_floats(n, 0.1), *r = rand_floats(n, 0);
  float *y = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float));
  fsdp_relu_forward(y, x, n);
  for (size_t i = 0; i < n; ++i) {
    ck_assert_float_eq(y[i], x[i] > 0 ? x[i] : 0.0f);
    dx[i] = 2.0f; /* must be added to, not overwritten */
  }
  fsdp_relu_backward(dx, y, r, n);
  /* Loss sum(r * relu(x)) is separable: the central difference of element i
   * alone, in float64; |x| >= 0.1 > H keeps both probes on one side of 0. */
  for (size_t i = 0; i < n; ++i) {
    double up = x[i] + H, down = x[i] - H;
    double numeric = r[i] * ((up > 0 ? up : 0) - (down > 0 ? down : 0)) / (2 * H);
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
  rng_state = 500 + (uint64_t)_i;
  float *logits = malloc(n * sizeof(float)), *dl = malloc(n * sizeof(float));
  double *row = malloc((size_t)V * sizeof(double));
  int *t = calloc((size_t)B, sizeof(int));
  for (size_t i = 0; i < n; ++i) logits[i] = (float)(kXent[_i].offset + kXent[_i].spread * rnd());
  for (int b = 0; b < B; ++b) t[b] = (int)((rnd() + 1.0) * 0.5 * V) % V;
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
      row[j] = x0 + H;
      const double up = xent_row64(row, t[b], V);
      row[j] = x0 - H;
      const double down = xent_row64(row, t[b], V);
      row[j] = x0;
      assert_grad("dlogits", (size_t)b * V + j, dl[(size_t)b * V + j],
                  kXent[_i].scale * (up - down) / (2 * H));
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

static Suite *nn_suite(void) {
  Suite *s = suite_create("nn");
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
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(nn_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
