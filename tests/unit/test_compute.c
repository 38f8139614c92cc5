/* tests/unit/test_compute.c — the compute tables (src/backend/cpu/compute.c): every
 * slot of every table built is set, the CPU table computes what fsdp/nn.h
 * and the engine's shard loops compute, and it refuses a dtype or a stream it cannot serve with a named
 * error before touching anything. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "common/check_run.h"
#include "core/internal.h"
#include "backend/compute.h"
#include "fsdp/nn.h"
#include "fsdp/optim.h"
#include "fsdp_config.h"
#include "backend/cpu/head.h"

START_TEST(every_built_table_is_complete) {
  const fsdp_device_kind_t kinds[] = {FSDP_DEVICE_CPU, FSDP_DEVICE_CUDA};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    const fsdp_compute_ops_t *ops = fsdp_compute_ops(kinds[i]);
    if (kinds[i] == FSDP_DEVICE_CUDA && !FSDP_HAVE_CUDA) {
      ck_assert_ptr_null(ops); /* no CUDA table without CUDA, never a half one */
      continue;
    }
    ck_assert_ptr_nonnull(ops);
    ck_assert_int_eq(ops->device, kinds[i]);
    const char *missing = "?";
    ck_assert_msg(fsdp_compute_ops_complete(ops, &missing), "the %s table leaves slot %s empty",
                  ops->name, missing);
  }
}
END_TEST

/* The check itself finds an empty slot, and names it: the first, one in the
 * middle, the last. */
START_TEST(completeness_check_names_an_empty_slot) {
  fsdp_compute_ops_t t = *fsdp_compute_ops(FSDP_DEVICE_CPU);
  t.head_forward = NULL;
  const char *missing = NULL;
  ck_assert_int_eq(fsdp_compute_ops_complete(&t, &missing), 0);
  ck_assert_str_eq(missing, "head_forward");
  t = *fsdp_compute_ops(FSDP_DEVICE_CPU);
  t.layernorm_fused_backward = NULL;
  ck_assert_int_eq(fsdp_compute_ops_complete(&t, &missing), 0);
  ck_assert_str_eq(missing, "layernorm_fused_backward");
  t = *fsdp_compute_ops(FSDP_DEVICE_CPU);
  t.release = NULL;
  ck_assert_int_eq(fsdp_compute_ops_complete(&t, &missing), 0);
  ck_assert_str_eq(missing, "release");
}
END_TEST

enum { N = 3, C = 8 };

/* bf16 (and f16) are not computed on the CPU: refused naming the op and the
 * dtype, the output untouched; a worker stream and a residual branch without
 * its output are refused too. */
START_TEST(cpu_table_refuses_what_it_cannot_run) {
  const fsdp_compute_ops_t *k = fsdp_compute_ops(FSDP_DEVICE_CPU);
  const fsdp_dtype_t dts[] = {FSDP_BF16, FSDP_F16};
  float x[N * C], w[C], b[C], out[N * C], mean[N], rstd[N];
  for (int i = 0; i < N * C; i++) x[i] = (float)i, out[i] = -1.0f;
  for (int c = 0; c < C; c++) w[c] = 1.0f, b[c] = 0.0f;
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    ck_assert_int_eq(k->layernorm_fused_forward(
                         &(fsdp_layernorm_forward_args_t){.dt = dts[i], .out = out, .mean = mean,
                                                          .rstd = rstd, .inp = x, .weight = w,
                                                          .bias = b, .N = N, .C = C},
                         FSDP_HOST_STREAM),
                     FSDP_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(fsdp_last_error(), "layernorm_fused_forward") &&
                      strstr(fsdp_last_error(), fsdp_dtype_name(dts[i])),
                  "%s", fsdp_last_error());
    for (int j = 0; j < N * C; j++) ck_assert_float_eq(out[j], -1.0f);
  }
  /* a (1,C) linear weight with its GELU: out (N,1) and pre (N,1) */
  fsdp_matmul_forward_args_t mm = {.dt = FSDP_BF16, .out = out, .pre = out + N, .inp = x,
                                   .weight = w, .bias = b, .B = N, .C = C, .OC = 1,
                                   .weight_out_in = 1};
  ck_assert_int_eq(k->matmul_forward(&mm, FSDP_HOST_STREAM), FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "matmul_forward"));
  fsdp_stream_t worker;
  ck_assert_int_eq(fsdp_stream_create("compute-test", &worker), FSDP_SUCCESS);
  mm.dt = FSDP_F32;
  ck_assert_int_eq(k->matmul_forward(&mm, worker), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "FSDP_HOST_STREAM"));
  fsdp_stream_destroy(worker);
  /* a residual branch with nowhere to write the sum (the CUDA table refuses
   * it too) */
  ck_assert_int_eq(k->layernorm_fused_forward(
                       &(fsdp_layernorm_forward_args_t){.dt = FSDP_F32, .out = out, .mean = mean,
                                                        .rstd = rstd, .inp = x, .branch = x,
                                                        .weight = w, .bias = b, .N = N, .C = C},
                       FSDP_HOST_STREAM),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "residual branch needs an output"));
  for (int j = 0; j < N * C; j++) ck_assert_float_eq(out[j], -1.0f);
}
END_TEST

/* Through the table, bitwise what fsdp/nn.h and backend/cpu/head.h give: a LayerNorm,
 * and the fused cross-entropy's per-row losses summing (in row order) to the
 * CPU's double sum. */
START_TEST(cpu_table_is_the_cpu_kernels) {
  const fsdp_compute_ops_t *k = fsdp_compute_ops(FSDP_DEVICE_CPU);
  float x[N * C], w[C], b[C], out[N * C], want[N * C], mean[N], rstd[N], m2[N], r2[N];
  for (int i = 0; i < N * C; i++) x[i] = sinf((float)i);
  for (int c = 0; c < C; c++) w[c] = 1.0f + 0.1f * (float)c, b[c] = 0.01f * (float)c;
  ck_assert_int_eq(k->layernorm_fused_forward(
                       &(fsdp_layernorm_forward_args_t){.dt = FSDP_F32, .out = out, .mean = mean,
                                                        .rstd = rstd, .inp = x, .weight = w,
                                                        .bias = b, .N = N, .C = C},
                       FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  fsdp_layernorm_forward(want, m2, r2, x, w, b, N, C);
  ck_assert_int_eq(memcmp(out, want, sizeof out), 0);
  ck_assert_int_eq(memcmp(mean, m2, sizeof mean), 0);

  const int ld = C + 2, tgt[N] = {1, 7, 0};
  float logits[N * (C + 2)], ref[N * (C + 2)];
  for (int i = 0; i < N * ld; i++) logits[i] = ref[i] = cosf((float)i);
  double losses[N], sum = 0.0;
  ck_assert_int_eq(k->xent(&(fsdp_xent_args_t){.dt = FSDP_F32, .logits = logits, .ld = ld,
                                                .losses = losses, .targets = tgt, .B = N, .V = C,
                                                .scale = 0.5f, .grad = 1},
                           FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  const double want_sum = nn_xent_inplace(ref, ld, NULL, tgt, N, C, 0.5f, 1);
  for (int r = 0; r < N; r++) sum += losses[r];
  ck_assert(sum == want_sum);
  ck_assert_int_eq(memcmp(logits, ref, sizeof logits), 0);
}
END_TEST

/* The engine's shard kernels on the CPU are the loops the engine ran: AdamW
 * over two runs of opposite decay with a clipping factor, run by run as
 * fsdp_adamw_update after scaling; the norm in double; a bf16 round trip with
 * fsdp_f32_to_bf16's rounding; a cast it has no kernel for refused by name. */
START_TEST(cpu_shard_kernels_are_the_engine_loops) {
  const fsdp_compute_ops_t *k = fsdp_compute_ops(FSDP_DEVICE_CPU);
  enum { NS = 10, CUT = 4 };
  float p[NS], g[NS], m[NS], v[NS], p2[NS], g2[NS], m2[NS], v2[NS];
  for (int i = 0; i < NS; i++) {
    p[i] = p2[i] = sinf((float)i + 1.0f), g[i] = g2[i] = cosf((float)i);
    m[i] = m2[i] = 0.01f * (float)i, v[i] = v2[i] = 0.001f * (float)(i + 1);
  }
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.weight_decay = 0.1f;
  const unsigned long long runs[2] = {0ull << 1 | 1ull, (unsigned long long)CUT << 1 | 0ull};
  ck_assert_int_eq(k->adamw_multi(&(fsdp_adamw_args_t){.param = p, .grad = g, .m = m, .v = v,
                                                       .n = NS, .runs = runs, .n_runs = 2,
                                                       .coef = 0.5f, .c = &c, .lr = 1e-2f, .t = 3},
                                  FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  for (int i = 0; i < NS; i++) g2[i] *= 0.5f;
  fsdp_adamw_update(p2, g2, m2, v2, CUT, &c, 1e-2f, 3, 1);
  fsdp_adamw_update(p2 + CUT, g2 + CUT, m2 + CUT, v2 + CUT, NS - CUT, &c, 1e-2f, 3, 0);
  ck_assert_int_eq(memcmp(p, p2, sizeof p), 0);
  ck_assert_int_eq(memcmp(v, v2, sizeof v), 0);

  double sum = -1.0, want = 0.0;
  for (int i = 0; i < NS; i++) want += (double)p[i] * p[i];
  ck_assert_int_eq(k->sum_squares(&(fsdp_sum_squares_args_t){.out = &sum, .x = p, .n = NS},
                                  FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  ck_assert(sum == want);

  uint16_t h[NS];
  float back[NS];
  ck_assert_int_eq(k->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_BF16, .dst = h,
                                               .src_dt = FSDP_F32, .src = p, .n = NS},
                           FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  ck_assert_int_eq(k->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_F32, .dst = back,
                                               .src_dt = FSDP_BF16, .src = h, .n = NS},
                           FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  for (int i = 0; i < NS; i++) {
    ck_assert_uint_eq(h[i], fsdp_f32_to_bf16(p[i]));
    ck_assert_float_eq(back[i], fsdp_bf16_to_f32(h[i]));
  }
  ck_assert_int_eq(k->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_F64, .dst = back,
                                               .src_dt = FSDP_F32, .src = p, .n = NS},
                           FSDP_HOST_STREAM),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "f64"));
}
END_TEST

/* AdamW's 16-bit copy (param_lp): the updated parameters rounded as the cast
 * rounds them, bf16 and fp16; another dtype is refused by name before any
 * state changes. */
START_TEST(cpu_adamw_writes_the_16_bit_copy) {
  const fsdp_compute_ops_t *k = fsdp_compute_ops(FSDP_DEVICE_CPU);
  enum { NS = 9 };
  const fsdp_dtype_t dts[2] = {FSDP_BF16, FSDP_F16};
  uint16_t (*round_to[2])(float) = {fsdp_f32_to_bf16, fsdp_f32_to_f16};
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  const unsigned long long runs[1] = {1ull};
  for (int d = 0; d < 2; d++) {
    float p[NS], g[NS], m[NS] = {0}, v[NS] = {0};
    uint16_t lp[NS];
    for (int i = 0; i < NS; i++)
      p[i] = sinf((float)i + 0.3f), g[i] = cosf(3.0f * (float)i), lp[i] = 0xdead;
    ck_assert_int_eq(k->adamw_multi(&(fsdp_adamw_args_t){.param = p, .grad = g, .m = m, .v = v,
                                                         .param_lp = lp, .lp_dtype = dts[d],
                                                         .n = NS, .runs = runs, .n_runs = 1,
                                                         .coef = 1.0f, .c = &c, .lr = 1e-2f,
                                                         .t = 1},
                                    FSDP_HOST_STREAM),
                     FSDP_SUCCESS);
    for (int i = 0; i < NS; i++) ck_assert_uint_eq(lp[i], round_to[d](p[i]));
  }
  float p[NS] = {1.0f}, g[NS] = {1.0f}, m[NS] = {0}, v[NS] = {0}, lp32[NS];
  ck_assert_int_eq(k->adamw_multi(&(fsdp_adamw_args_t){.param = p, .grad = g, .m = m, .v = v,
                                                       .param_lp = lp32, .lp_dtype = FSDP_F32,
                                                       .n = NS, .runs = runs, .n_runs = 1,
                                                       .coef = 1.0f, .c = &c, .lr = 1e-2f, .t = 1},
                                  FSDP_HOST_STREAM),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "f32"));
  ck_assert_float_eq(p[0], 1.0f);
  ck_assert_float_eq(m[0], 0.0f);
}
END_TEST

static Suite *compute_suite(void) {
  Suite *s = suite_create("compute");
  TCase *tc = tcase_create("tables");
  tcase_add_test(tc, every_built_table_is_complete);
  tcase_add_test(tc, completeness_check_names_an_empty_slot);
  tcase_add_test(tc, cpu_table_refuses_what_it_cannot_run);
  tcase_add_test(tc, cpu_table_is_the_cpu_kernels);
  tcase_add_test(tc, cpu_shard_kernels_are_the_engine_loops);
  tcase_add_test(tc, cpu_adamw_writes_the_16_bit_copy);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(compute_suite()); }
