/* tests/mpi/test_step.c — the step's numerics guard and loss scaler across
 * ranks (src/engine/step.c): a NaN in one rank's gradients or loss makes every
 * rank skip the same step with nothing updated, and the stats count it; K
 * skips in a row fail the step with FSDP_ERR_NONFINITE and a message; the
 * loss scale backs off on an overflow, grows after its interval, and is
 * divided out of the reported norm. Every strategy, N = 1..4. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;
static int rank, nranks;

/* Prime-sized tensors so shards straddle tensors and ranks. */
#define N_UNITS 3
static const int64_t rows[N_UNITS] = {13, 31, 7};
#define COLS 11
static size_t n_params; /* all weights and biases */

static fsdp_engine_t make_engine(fsdp_config_t *c) {
  static char names[N_UNITS][2][16];
  fsdp_engine_t e;
  c->optim.kind = FSDP_OPTIM_ADAMW;
  c->optim.lr = 1e-2f;
  ck_assert_int_eq(fsdp_engine_create(world, c, &e), FSDP_SUCCESS);
  n_params = 0;
  for (int k = 0; k < N_UNITS; k++) {
    snprintf(names[k][0], 16, "u.%d.w", k);
    snprintf(names[k][1], 16, "u.%d.b", k);
    fsdp_tensor_desc_t t[2] = {{names[k][0], 2, {rows[k], COLS}, FSDP_INIT_NORMAL, 0.1f, 0},
                               {names[k][1], 1, {rows[k]}, FSDP_INIT_UNIFORM, 0.5f, 1}};
    fsdp_unit_t u;
    ck_assert_int_eq(fsdp_unit_add(e, names[k][0], "Block", t, 2, &u), FSDP_SUCCESS);
    n_params += (size_t)(rows[k] * COLS + rows[k]);
  }
  ck_assert_int_eq(fsdp_engine_materialize(e, 77), FSDP_SUCCESS);
  return e;
}

/* One micro-batch whose gradient is `g` everywhere, times the loss scale (as
 * a model's backward would make it), except element 5 of unit 1's weight on
 * rank `bad_rank`, which is `bad`; then the step. */
static fsdp_status_t step(fsdp_engine_t e, float g, int bad_rank, float bad,
                          fsdp_step_stats_t *st) {
  fsdp_view_t v;
  float scale = (float)fsdp_engine_loss_scale(e);
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int k = N_UNITS - 1; k >= 0; k--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    for (int64_t i = 0; i < rows[k] * COLS; i++) v.grad[0][i] += g * scale;
    for (int64_t i = 0; i < rows[k]; i++) v.grad[1][i] += g * scale;
    if (k == 1 && rank == bad_rank) v.grad[0][5] = bad;
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
  }
  return fsdp_engine_step(e, st);
}

static void read_all(fsdp_engine_t e, float *out) {
  char name[16];
  for (int k = 0; k < N_UNITS; k++) {
    snprintf(name, sizeof name, "u.%d.w", k);
    ck_assert_int_eq(fsdp_engine_read_tensor(e, name, out, -1), FSDP_SUCCESS);
    out += rows[k] * COLS;
    snprintf(name, sizeof name, "u.%d.b", k);
    ck_assert_int_eq(fsdp_engine_read_tensor(e, name, out, -1), FSDP_SUCCESS);
    out += rows[k];
  }
}

/* How many ranks have x != 0: the guard must be agreed, not per rank. */
static int ranks_with(fsdp_engine_t e, int x) {
  double mine = x != 0, all = 0;
  ck_assert_int_eq(fsdp_all_reduce(fsdp_engine_comm(e), &mine, &all, 1, FSDP_F64, FSDP_SUM,
                                   FSDP_HOST_STREAM), FSDP_SUCCESS);
  return (int)all;
}

static const float bad_values[] = {NAN, INFINITY, -INFINITY};

/* _i: strategy x bad value. The last rank's gradient holds it. */
START_TEST(bad_grad_on_one_rank_skips_everywhere) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)(_i % 3);
  fsdp_engine_t e = make_engine(&c);
  fsdp_step_stats_t st;
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  ck_assert_int_eq(st.skipped, 0);
  float *before = malloc(n_params * sizeof(float)), *after = malloc(n_params * sizeof(float));
  read_all(e, before);
  ck_assert_int_eq(step(e, 0.5f, nranks - 1, bad_values[_i / 3], &st), FSDP_SUCCESS);
  ck_assert_int_eq(ranks_with(e, st.skipped), nranks);
  ck_assert_int_eq(st.step, 1);
  ck_assert_int_eq(fsdp_engine_step_count(e), 1);
  ck_assert_int_eq(st.skipped_total, 1);
  ck_assert_int_eq(st.consecutive_skips, 1);
  ck_assert_msg(!isfinite(st.grad_norm), "norm %g of a skipped step", st.grad_norm);
  read_all(e, after);
  ck_assert_msg(!memcmp(before, after, n_params * sizeof(float)), "a skipped step changed "
                "parameters");
  /* The poisoned gradients are gone: the next step is a normal one. */
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  ck_assert_int_eq(ranks_with(e, st.skipped), 0);
  ck_assert_int_eq(st.step, 2);
  ck_assert_int_eq(st.consecutive_skips, 0);
  ck_assert_int_eq(st.skipped_total, 1);
  ck_assert_msg(fabs(st.grad_norm - 0.5 * sqrt((double)n_params)) < 1e-4 * st.grad_norm,
                "norm %g after the skip, want %g", st.grad_norm, 0.5 * sqrt((double)n_params));
  read_all(e, after);
  ck_assert_msg(memcmp(before, after, n_params * sizeof(float)), "the next step did not update");
  free(before);
  free(after);
  fsdp_engine_destroy(e);
}
END_TEST

/* Finite gradients, but rank 0's loss is NaN: every rank skips. */
START_TEST(bad_loss_on_one_rank_skips_everywhere) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  fsdp_engine_t e = make_engine(&c);
  fsdp_step_stats_t st;
  ck_assert_int_eq(fsdp_engine_report_loss(e, rank == 0 ? NAN : 2.5), FSDP_SUCCESS);
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  ck_assert_int_eq(ranks_with(e, st.skipped), nranks);
  ck_assert_int_eq(st.nonfinite_loss_ranks, 1);
  ck_assert_int_eq(st.step, 0);
  ck_assert_msg(isfinite(st.grad_norm), "the norm is still reported: %g", st.grad_norm);
  /* The report is for one step only. */
  ck_assert_int_eq(fsdp_engine_report_loss(e, 2.5), FSDP_SUCCESS);
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  ck_assert_int_eq(ranks_with(e, st.skipped), 0);
  ck_assert_int_eq(st.step, 1);
  fsdp_engine_destroy(e);
}
END_TEST

/* K = 3: two skips are reported, the third fails on every rank with the
 * message; the engine is still usable (a clean step updates). */
START_TEST(k_consecutive_skips_stop) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  c.max_consecutive_skips = 3;
  fsdp_engine_t e = make_engine(&c);
  fsdp_step_stats_t st;
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  for (int k = 1; k <= 2; k++) {
    ck_assert_int_eq(step(e, 0.5f, 0, NAN, &st), FSDP_SUCCESS);
    ck_assert_int_eq(st.consecutive_skips, k);
  }
  fsdp_status_t s3 = step(e, 0.5f, 0, NAN, &st);
  ck_assert_int_eq(ranks_with(e, s3 == FSDP_ERR_NONFINITE), nranks);
  ck_assert_msg(strstr(fsdp_last_error(), "3 steps in a row skipped") &&
                strstr(fsdp_last_error(), "max_consecutive_skips 3"), "message: %s",
                fsdp_last_error());
  ck_assert_int_eq(st.consecutive_skips, 3);
  ck_assert_int_eq(st.skipped_total, 3);
  ck_assert_int_eq(fsdp_engine_step_count(e), 1);
  ck_assert_int_eq(step(e, 0.5f, -1, 0, &st), FSDP_SUCCESS);
  ck_assert_int_eq(st.step, 2);
  fsdp_engine_destroy(e);
}
END_TEST

/* Scale 1024, backoff 0.5, growth 2 every 2 good steps: good (1024), overflow
 * (skip; -> 512), good, good (-> 1024), good. The reported norm is the
 * unscaled one, whatever the scale. */
START_TEST(loss_scale_backs_off_and_grows) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  c.param_dtype = FSDP_F16;
  c.loss_scale_init = 1024;
  c.loss_scale_interval = 2;
  fsdp_engine_t e = make_engine(&c);
  const double want_scale[] = {1024, 1024, 512, 512, 1024};
  const double next_scale[] = {1024, 512, 512, 1024, 1024};
  const int overflow[] = {0, 1, 0, 0, 0};
  double norm = 0.25 * sqrt((double)n_params);
  for (int s = 0; s < 5; s++) {
    fsdp_step_stats_t st;
    ck_assert_int_eq(step(e, 0.25f, overflow[s] ? nranks - 1 : -1, INFINITY, &st), FSDP_SUCCESS);
    ck_assert_int_eq(ranks_with(e, st.skipped), overflow[s] ? nranks : 0);
    ck_assert_msg(st.loss_scale == want_scale[s], "step %d: scale %g, want %g", s, st.loss_scale,
                  want_scale[s]);
    ck_assert_msg(fsdp_engine_loss_scale(e) == next_scale[s], "after step %d: scale %g, want %g",
                  s, fsdp_engine_loss_scale(e), next_scale[s]);
    if (!overflow[s])
      ck_assert_msg(fabs(st.grad_norm - norm) < 1e-5 * norm, "step %d: norm %g, want %g", s,
                    st.grad_norm, norm);
  }
  double scale;
  int64_t good;
  ck_assert_int_eq(fsdp_engine_scaler_state(e, &scale, &good), FSDP_SUCCESS);
  ck_assert(scale == 1024 && good == 1);
  ck_assert_int_eq(fsdp_engine_set_scaler_state(e, NAN, 0), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_engine_destroy(e);
}
END_TEST

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
  Suite *s = suite_create("step");
  TCase *tc = tcase_create("guard");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, bad_grad_on_one_rank_skips_everywhere, 0, 9);
  tcase_add_loop_test(tc, bad_loss_on_one_rank_skips_everywhere, 0, 3);
  tcase_add_loop_test(tc, k_consecutive_skips_stop, 0, 3);
  tcase_add_loop_test(tc, loss_scale_backs_off_and_grows, 0, 3);
  suite_add_tcase(s, tc);
  return mpi_check_run(s);
}
