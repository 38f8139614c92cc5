/* tests/unit/test_optim.c — AdamW and SGD against values computed by hand (in
 * float64, formulas below), learning-rate schedules, and config validation. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "fsdp/optim.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* fp32 arithmetic on O(1) values against a float64 reference: a few ulps. */
#define TOL 2e-6

/* AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8, PyTorch semantics:
 *   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 * Step 1 by hand: m/(1-b1) = g and v/(1-b2) = g^2, so the update is
 * lr*g/(|g|+eps) = 0.1*sign(g) (0 where g = 0): p = 1 - 0.1 = 0.9,
 * -2 + 0.1 = -1.9, 0.5 unchanged; with wd 0.01 first p *= 1 - 0.001:
 * 0.999 - 0.1 = 0.899, -1.998 + 0.1 = -1.898, 0.4995. Steps 2 and 3 were
 * evaluated in float64 from the same formula. */
static const float kAdamP0[3] = {1.0f, -2.0f, 0.5f};
static const float kAdamG[3][3] = {{0.5f, -1.0f, 0.0f}, {0.1f, 2.0f, 0.0f}, {-0.3f, 0.5f, 1.0f}};
static const struct {
  float wd;
  int decay;
  double want[3][3]; /* parameters after steps 1, 2, 3 */
} kAdam[] = {
    {0.0f, 1, {{0.9, -1.9, 0.5}, {0.819695906, -1.936610353, 0.5},
               {0.798624612, -1.978175473, 0.436118641}}},
    {0.01f, 1, {{0.899, -1.898, 0.4995}, {0.817796906, -1.932712353, 0.4990005},
                {0.795907815, -1.972344761, 0.434620141}}},
    /* decay = 0 (a bias) ignores wd entirely: same as the first row. */
    {0.01f, 0, {{0.9, -1.9, 0.5}, {0.819695906, -1.936610353, 0.5},
                {0.798624612, -1.978175473, 0.436118641}}},
};

START_TEST(adamw_matches_hand_values) {
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.weight_decay = kAdam[_i].wd;
  float p[3], m[3] = {0}, v[3] = {0};
  memcpy(p, kAdamP0, sizeof p);
  for (int t = 1; t <= 3; ++t) {
    fsdp_adamw_update(p, kAdamG[t - 1], m, v, 3, &c, 0.1f, t, kAdam[_i].decay);
    for (int i = 0; i < 3; ++i)
      ck_assert_msg(fabs(p[i] - kAdam[_i].want[t - 1][i]) < TOL, "step %d p[%d] = %.9g want %.9g",
                    t, i, (double)p[i], kAdam[_i].want[t - 1][i]);
  }
  /* The moments are plain EMAs of g and g^2: check them after step 3 too. The
   * betas are taken as stored (0.999f is 0.99900001): 1 - b2 then differs
   * from 0.001 by 1.3e-5 relative, more than fp32 rounding, so a reference
   * with the decimal value would test the config's type, not the kernel. */
  const double b1 = 0.9f, b2 = 0.999f, g1 = 0.5f, g2 = 0.1f, g3 = -0.3f;
  const double m3 = b1 * (b1 * (1 - b1) * g1 + (1 - b1) * g2) + (1 - b1) * g3;
  const double v3 = b2 * (b2 * (1 - b2) * g1 * g1 + (1 - b2) * g2 * g2) + (1 - b2) * g3 * g3;
  /* fp32 ops (eps 6e-8), with g3 cancelling 60% of m2: 1e-6 relative. */
  ck_assert_double_eq_tol(m[0], m3, 1e-6 * fabs(m3));
  ck_assert_double_eq_tol(v[0], v3, 1e-6 * v3);
}
END_TEST

/* SGD, lr 0.1, PyTorch semantics (no dampening):
 *   g' = g + wd p;  buf = first ? g' : mu buf + g';  g' = nesterov ? g' + mu buf : buf;
 *   p -= lr g'
 * Step 1 by hand from p = (1, -2), g = (0.5, 1): plain p = (0.95, -2.1); wd 0.1
 * makes g' = (0.6, 0.8) so p = (0.94, -2.08); nesterov with mu 0.9 uses
 * g' (1 + mu) = (0.95, 1.9) so p = (0.905, -2.19). Later steps in float64. */
static const float kSgdP0[2] = {1.0f, -2.0f};
static const float kSgdG[3][2] = {{0.5f, 1.0f}, {-0.5f, 0.25f}, {0.2f, -1.0f}};
static const struct {
  float momentum, wd;
  int nesterov;
  double want[3][2];
} kSgd[] = {
    {0.0f, 0.0f, 0, {{0.95, -2.1}, {1.0, -2.125}, {0.98, -2.025}}},
    {0.0f, 0.1f, 0, {{0.94, -2.08}, {0.9806, -2.0842}, {0.950794, -1.963358}}},
    {0.9f, 0.0f, 0, {{0.95, -2.1}, {0.955, -2.215}, {0.9395, -2.2185}}},
    {0.9f, 0.0f, 1, {{0.905, -2.19}, {0.9595, -2.3185}, {0.92555, -2.22165}}},
    {0.9f, 0.1f, 0, {{0.94, -2.08}, {0.9266, -2.1562}, {0.885274, -2.103218}}},
    {0.9f, 0.1f, 1, {{0.886, -2.152}, {0.915566, -2.223412}, {0.849753646, -2.052305972}}},
};

START_TEST(sgd_matches_hand_values) {
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.kind = FSDP_OPTIM_SGD;
  c.momentum = kSgd[_i].momentum;
  c.weight_decay = kSgd[_i].wd;
  c.nesterov = kSgd[_i].nesterov;
  ck_assert_int_eq(fsdp_optim_check(&c), FSDP_SUCCESS);
  float p[2], buf[2] = {123.0f, 456.0f}; /* garbage: the first step must overwrite it */
  memcpy(p, kSgdP0, sizeof p);
  for (int k = 0; k < 3; ++k) {
    fsdp_sgd_update(p, kSgdG[k], c.momentum > 0 ? buf : NULL, 2, &c, 0.1f, k == 0, 1);
    for (int i = 0; i < 2; ++i)
      ck_assert_msg(fabs(p[i] - kSgd[_i].want[k][i]) < TOL, "step %d p[%d] = %.9g want %.9g",
                    k + 1, i, (double)p[i], kSgd[_i].want[k][i]);
  }
}
END_TEST

START_TEST(sgd_decay_flag_off_ignores_wd) {
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.kind = FSDP_OPTIM_SGD;
  c.momentum = 0.9f;
  c.weight_decay = 0.5f;
  float p[2], buf[2];
  memcpy(p, kSgdP0, sizeof p);
  for (int k = 0; k < 3; ++k) fsdp_sgd_update(p, kSgdG[k], buf, 2, &c, 0.1f, k == 0, 0);
  ck_assert_double_eq_tol(p[0], kSgd[2].want[2][0], TOL);
  ck_assert_double_eq_tol(p[1], kSgd[2].want[2][1], TOL);
}
END_TEST

/* Warm-up 4 of 14 steps, floor 0.1 of a base lr of 2:
 *   step < 4: 2 (step+1)/4;  4 <= step < 14: 0.2 + 1.8 * (1 + cos(pi (step-4)/10)) / 2;
 *   step >= 14: 0.2. The midpoint (step 9) is (1 + 0.1)/2 * 2 = 1.1. */
static const struct {
  int64_t step;
  double want;
} kCosine[] = {
    {-5, 0.5}, {0, 0.5}, {1, 1.0}, {3, 2.0}, {4, 2.0}, {9, 1.1},
    {13, 2.0 * 0.12202456766718092}, {14, 0.2}, {15, 0.2}, {1000000, 0.2},
};

START_TEST(schedule_warmup_cosine) {
  const fsdp_schedule_t s = {FSDP_SCHED_WARMUP_COSINE, 4, 14, 0.1f};
  ck_assert_int_eq(fsdp_schedule_check(&s), FSDP_SUCCESS);
  ck_assert_double_eq_tol(fsdp_schedule_lr(&s, 2.0f, kCosine[_i].step), kCosine[_i].want, 1e-6);
}
END_TEST

START_TEST(schedule_constant_and_no_warmup) {
  const fsdp_schedule_t c = FSDP_SCHEDULE_INIT;
  ck_assert_int_eq(fsdp_schedule_check(&c), FSDP_SUCCESS);
  for (int64_t step = 0; step < 1000; step += 37)
    ck_assert_float_eq(fsdp_schedule_lr(&c, 3e-4f, step), 3e-4f);
  /* Without warm-up the first step already runs at the peak. */
  const fsdp_schedule_t s = {FSDP_SCHED_WARMUP_COSINE, 0, 10, 0.0f};
  ck_assert_int_eq(fsdp_schedule_check(&s), FSDP_SUCCESS);
  ck_assert_double_eq_tol(fsdp_schedule_lr(&s, 1.0f, 0), 1.0, 1e-7);
  ck_assert_double_eq_tol(fsdp_schedule_lr(&s, 1.0f, 5), 0.5, 1e-7);
  ck_assert_double_eq_tol(fsdp_schedule_lr(&s, 1.0f, 10), 0.0, 1e-7);
}
END_TEST

static const struct {
  fsdp_schedule_t s;
  const char *needle;
} kBadSchedule[] = {
    {{(fsdp_schedule_kind_t)7, 0, 10, 0.0f}, "kind 7"},
    {{FSDP_SCHED_WARMUP_COSINE, 0, 0, 0.0f}, "total_steps 0"},
    {{FSDP_SCHED_WARMUP_COSINE, 0, -4, 0.0f}, "total_steps -4"},
    {{FSDP_SCHED_WARMUP_COSINE, -1, 10, 0.0f}, "warmup_steps -1"},
    {{FSDP_SCHED_WARMUP_COSINE, 11, 10, 0.0f}, "warmup_steps 11 exceeds total_steps 10"},
    {{FSDP_SCHED_WARMUP_COSINE, 1, 10, -0.5f}, "min_lr_ratio -0.5"},
    {{FSDP_SCHED_WARMUP_COSINE, 1, 10, 1.5f}, "min_lr_ratio 1.5"},
    {{FSDP_SCHED_WARMUP_COSINE, 1, 10, NAN}, "min_lr_ratio nan"},
};

START_TEST(schedule_rejects) {
  ck_assert_int_eq(fsdp_schedule_check(&kBadSchedule[_i].s), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), kBadSchedule[_i].needle), "message '%s' lacks '%s'",
                fsdp_last_error(), kBadSchedule[_i].needle);
}
END_TEST

/* Each row breaks one field of an otherwise valid config. */
enum field { LR, BETA1, BETA2, EPS, WD, MOMENTUM, NESTEROV, MAX_NORM, KIND };
static const struct {
  fsdp_optim_kind_t kind;
  enum field field;
  float value;
  const char *needle;
} kBadOptim[] = {
    {FSDP_OPTIM_ADAMW, LR, -1e-3f, "lr -0.001"},
    {FSDP_OPTIM_ADAMW, LR, NAN, "lr nan"},
    {FSDP_OPTIM_SGD, LR, INFINITY, "lr inf"},
    {FSDP_OPTIM_ADAMW, BETA1, 1.0f, "beta1 1"},
    {FSDP_OPTIM_ADAMW, BETA1, -0.1f, "beta1 -0.1"},
    {FSDP_OPTIM_ADAMW, BETA2, 1.5f, "beta2 1.5"},
    {FSDP_OPTIM_ADAMW, BETA2, NAN, "beta2 nan"},
    {FSDP_OPTIM_ADAMW, EPS, 0.0f, "eps 0"},
    {FSDP_OPTIM_ADAMW, EPS, -1e-8f, "eps -1e-08"},
    {FSDP_OPTIM_ADAMW, WD, -0.01f, "weight_decay -0.01"},
    {FSDP_OPTIM_SGD, WD, NAN, "weight_decay nan"},
    {FSDP_OPTIM_SGD, MOMENTUM, 1.0f, "momentum 1"},
    {FSDP_OPTIM_SGD, MOMENTUM, -0.5f, "momentum -0.5"},
    {FSDP_OPTIM_SGD, NESTEROV, 1.0f, "nesterov needs momentum"},
    {FSDP_OPTIM_ADAMW, MAX_NORM, -1.0f, "max_grad_norm -1"},
    {FSDP_OPTIM_SGD, MAX_NORM, NAN, "max_grad_norm nan"},
    {(fsdp_optim_kind_t)5, KIND, 0.0f, "kind 5"},
};

static void set_field(fsdp_optim_config_t *c, enum field f, float x) {
  switch (f) {
  case LR: c->lr = x; break;
  case BETA1: c->beta1 = x; break;
  case BETA2: c->beta2 = x; break;
  case EPS: c->eps = x; break;
  case WD: c->weight_decay = x; break;
  case MOMENTUM: c->momentum = x; break;
  case NESTEROV: c->nesterov = 1; c->momentum = 0.0f; break;
  case MAX_NORM: c->max_grad_norm = x; break;
  case KIND: break;
  }
}

START_TEST(optim_rejects) {
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.kind = kBadOptim[_i].kind;
  set_field(&c, kBadOptim[_i].field, kBadOptim[_i].value);
  ck_assert_int_eq(fsdp_optim_check(&c), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), kBadOptim[_i].needle), "message '%s' lacks '%s'",
                fsdp_last_error(), kBadOptim[_i].needle);
}
END_TEST

START_TEST(optim_accepts_defaults_and_nulls_rejected) {
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  ck_assert_int_eq(fsdp_optim_check(&c), FSDP_SUCCESS);
  c.kind = FSDP_OPTIM_SGD;
  ck_assert_int_eq(fsdp_optim_check(&c), FSDP_SUCCESS);
  c.momentum = 0.9f;
  c.nesterov = 1;
  c.max_grad_norm = 1.0f;
  ck_assert_int_eq(fsdp_optim_check(&c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_optim_check(NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_schedule_check(NULL), FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *t = tcase_create("update");
  tcase_add_loop_test(t, adamw_matches_hand_values, 0, LEN(kAdam));
  tcase_add_loop_test(t, sgd_matches_hand_values, 0, LEN(kSgd));
  tcase_add_test(t, sgd_decay_flag_off_ignores_wd);
  suite_add_tcase(s, t);
  t = tcase_create("schedule");
  tcase_add_loop_test(t, schedule_warmup_cosine, 0, LEN(kCosine));
  tcase_add_test(t, schedule_constant_and_no_warmup);
  tcase_add_loop_test(t, schedule_rejects, 0, LEN(kBadSchedule));
  suite_add_tcase(s, t);
  t = tcase_create("check");
  tcase_add_loop_test(t, optim_rejects, 0, LEN(kBadOptim));
  tcase_add_test(t, optim_accepts_defaults_and_nulls_rejected);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return check_run(optim_suite()); }
