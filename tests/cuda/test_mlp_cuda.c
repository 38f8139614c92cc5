/* tests/cuda/test_mlp_cuda.c — the MLP (src/nn/mlp.c) trained on a CUDA
 * engine against the same MLP trained on the CPU engine: three layers (one
 * unit each, the per-layer default) from the same seed, a few AdamW steps on
 * the same batches; every step's loss, then every parameter, compared
 * (within 1e-4 relative: cuBLAS sums in another order than OpenBLAS), and the
 * predictions of a forward-only pass, which must be the CPU's. A bf16 engine
 * is refused in words (the MLP computes in f32). Prints one "mlp cuda ..."
 * line per comparison. Exits 77 (skipped) without a usable GPU or when the
 * engine has no CUDA backend (FSDP_ERR_UNSUPPORTED). CK_FORK=no: a forked
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

enum { L = 3, B = 8, STEPS = 4, N_PARAMS = 2 * L };
static const int widths[L + 1] = {12, 20, 16, 5};
static fsdp_world_t world;
static int skipped; /* no CUDA engine */

typedef struct {
  double loss[STEPS]; /* mean per row */
  float *param[N_PARAMS]; /* fc.<i>.weight, fc.<i>.bias after training */
  int pred[B];
} result_t;

/* A learnable batch: the label is the argmax of a fixed mix of the inputs. */
static void batch(int step, float *x, int *y) {
  unsigned s = 977u + 131u * (unsigned)step;
  for (int b = 0; b < B; b++) {
    float best = -1e30f;
    for (int j = 0; j < widths[0]; j++) {
      s = s * 1103515245u + 12345u;
      x[b * widths[0] + j] = (float)((s >> 9) % 2001) / 1000.0f - 1.0f;
    }
    for (int k = 0; k < widths[L]; k++) {
      const float v = x[b * widths[0] + k] - 0.5f * x[b * widths[0] + k + widths[L]];
      if (v > best) best = v, y[b] = k;
    }
  }
}

static const char *param_name(int p, char *buf, size_t cap) {
  snprintf(buf, cap, "fc.%d.%s", p / 2, p % 2 ? "bias" : "weight");
  return buf;
}

static size_t param_size(int p) {
  return (size_t)widths[p / 2 + 1] * (p % 2 ? 1 : (size_t)widths[p / 2]);
}

/* Trains on device kind d in param_dtype dt; FSDP_ERR_UNSUPPORTED when there
 * is no CUDA engine or the MLP refuses the engine (r untouched then). */
static fsdp_status_t train(fsdp_device_kind_t d, fsdp_dtype_t dt, result_t *r) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.device = d;
  c.param_dtype = dt;
  c.optim.lr = 1e-2f;
  fsdp_engine_t e = NULL;
  fsdp_mlp_t m = NULL;
  fsdp_status_t st = fsdp_engine_create(world, &c, &e);
  if (st == FSDP_ERR_UNSUPPORTED) return st;
  ck_assert_msg(st == FSDP_SUCCESS, "engine: %s", fsdp_last_error());
  st = fsdp_mlp_create(e, widths, L, B, &m);
  if (st == FSDP_ERR_UNSUPPORTED) {
    fsdp_engine_destroy(e);
    return st;
  }
  ck_assert_msg(st == FSDP_SUCCESS, "mlp: %s", fsdp_last_error());
  ck_assert_msg(fsdp_engine_materialize(e, 5) == FSDP_SUCCESS, "%s", fsdp_last_error());
  float x[B * 12];
  int y[B];
  for (int s = 0; s < STEPS; s++) {
    batch(s, x, y);
    ck_assert_msg(fsdp_mlp_forward_backward(m, x, y, B, 1.0f / B, &r->loss[s]) == FSDP_SUCCESS,
                  "step %d: %s", s, fsdp_last_error());
    ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
    r->loss[s] /= B;
  }
  for (int p = 0; p < N_PARAMS; p++) {
    char name[32];
    r->param[p] = malloc(param_size(p) * sizeof(float));
    ck_assert_ptr_nonnull(r->param[p]);
    ck_assert_msg(fsdp_engine_read_tensor(e, param_name(p, name, sizeof name), r->param[p], -1) ==
                      FSDP_SUCCESS, "%s", fsdp_last_error());
  }
  batch(STEPS, x, y);
  ck_assert_msg(fsdp_mlp_predict(m, x, NULL, B, r->pred, NULL) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  fsdp_mlp_destroy(m);
  fsdp_engine_destroy(e);
  return FSDP_SUCCESS;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-3); }

START_TEST(mlp_trains_on_cuda_as_on_cpu) {
  result_t gpu = {0}, cpu = {0};
  if (train(FSDP_DEVICE_CUDA, FSDP_F32, &gpu) == FSDP_ERR_UNSUPPORTED) {
    skipped = 1;
    printf("mlp cuda: SKIP: %s\n", fsdp_last_error());
    return;
  }
  ck_assert_int_eq(train(FSDP_DEVICE_CPU, FSDP_F32, &cpu), FSDP_SUCCESS);
  double worst_loss = 0.0, worst_param = 0.0;
  for (int s = 0; s < STEPS; s++) worst_loss = fmax(worst_loss, rel(gpu.loss[s], cpu.loss[s]));
  for (int p = 0; p < N_PARAMS; p++)
    for (size_t i = 0; i < param_size(p); i++)
      worst_param = fmax(worst_param, rel(gpu.param[p][i], cpu.param[p][i]));
  int same_pred = 0;
  for (int b = 0; b < B; b++) same_pred += gpu.pred[b] == cpu.pred[b];
  printf("mlp cuda: losses %.6f -> %.6f vs cpu %.6f -> %.6f, max relative difference %.3g; "
         "params %.3g; predictions %d/%d the same\n", gpu.loss[0], gpu.loss[STEPS - 1],
         cpu.loss[0], cpu.loss[STEPS - 1], worst_loss, worst_param, same_pred, B);
  ck_assert_msg(cpu.loss[STEPS - 1] < cpu.loss[0], "the CPU loss did not fall");
  ck_assert_msg(worst_loss <= 1e-4, "loss: relative difference %g above 1e-4", worst_loss);
  ck_assert_msg(worst_param <= 1e-4, "params: relative difference %g above 1e-4", worst_param);
  ck_assert_int_eq(same_pred, B);
  for (int p = 0; p < N_PARAMS; p++) free(gpu.param[p]), free(cpu.param[p]);
}
END_TEST

/* The MLP computes in f32: a bf16 CUDA engine is refused, naming the dtype. */
START_TEST(mlp_refuses_bf16_on_cuda) {
  result_t r = {0};
  if (train(FSDP_DEVICE_CUDA, FSDP_BF16, &r) != FSDP_ERR_UNSUPPORTED)
    ck_abort_msg("a bf16 CUDA engine was not refused");
  if (!strstr(fsdp_last_error(), "mlp")) { /* no CUDA engine at all: the engine said so */
    skipped = 1;
    return;
  }
  ck_assert_msg(strstr(fsdp_last_error(), "bf16") && strstr(fsdp_last_error(), "FSDP_F32"), "%s",
                fsdp_last_error());
}
END_TEST

static Suite *mlp_cuda_suite(void) {
  Suite *s = suite_create("mlp_cuda");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, mlp_trains_on_cuda_as_on_cpu);
  tcase_add_test(tc, mlp_refuses_bf16_on_cuda);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_mlp_cuda");
  if (gate) return gate;
  if (solo_world_init(&world) != FSDP_SUCCESS) {
    fprintf(stderr, "test_mlp_cuda: %s\n", fsdp_last_error());
    return 1;
  }
  const int rc = check_run(mlp_cuda_suite());
  fsdp_world_destroy(world);
  if (rc || !skipped) return rc;
  const char *req = getenv("FSDP_REQUIRE_GPU");
  return req && *req && strcmp(req, "0") != 0 ? 1 : 77;
}
