/* tests/mpi/test_parity.c — training at N ranks gives the trajectory of one rank.
 *
 * Every rank trains the model twice more on a one-rank world (no MPI) over the
 * whole global batch: the reference, and a noise run that differs from it only
 * in the order samples are summed. The noise run measures how far fp32 rounding
 * alone moves the 30-step trajectory; sharding changes nothing but summation
 * order and the split of the mean (1/B_local, then 1/N), so the N-rank run must
 * stay within a small multiple of that floor.
 *
 * fp16 parameters with dynamic loss scaling get the same parity check (their
 * tolerance is argued at TOL_FLOOR_F16), and a forced overflow (a scale of
 * 2^126) must skip, back off and recover.
 *
 * The bitwise variant uses an additive linear model with an L1 loss on integer
 * inputs: every gradient is an integer, so every sum is exact in any order and
 * the N-rank parameters must equal the one-rank ones bit for bit.
 *
 * With --hsdp S1,S2,... the same runs go through hybrid sharding, N ranks as
 * N/S replica groups of S (config.shard_size), plus its memory and the bytes
 * its timeline records. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

#define STEPS 30
#define GLOBAL_BATCH 24 /* divisible by N * grad_accum for N = 1..4, accum 1, 2 */
#define IN 16
#define CLASSES 4

static fsdp_world_t world, solo;
static int rank, nranks;

/* ---- data: a fixed teacher labels points drawn from the init RNG ---------- */

static float xs[STEPS][GLOBAL_BATCH][IN];
static int ys[STEPS][GLOBAL_BATCH];

static void make_data(void) {
  for (int s = 0; s < STEPS; s++)
    for (int b = 0; b < GLOBAL_BATCH; b++) {
      size_t id = (size_t)s * GLOBAL_BATCH + (size_t)b;
      float best = -INFINITY;
      for (int i = 0; i < IN; i++)
        xs[s][b][i] = fsdp_init_value(7, "x", id * IN + (size_t)i, FSDP_INIT_NORMAL, 1.0f);
      for (int c = 0; c < CLASSES; c++) {
        float z = 0;
        for (int i = 0; i < IN; i++)
          z += xs[s][b][i] * fsdp_init_value(8, "teacher", (size_t)(c * IN + i), FSDP_INIT_NORMAL,
                                             1.0f);
        if (z > best) best = z, ys[s][b] = c;
      }
    }
}

/* ---- one training run --------------------------------------------------- */

typedef struct {
  fsdp_strategy_t strategy;
  fsdp_optim_kind_t optim;
  int accum;      /* micro-batches per step */
  int full_grads; /* accumulate_full_grads */
  float clip;
  fsdp_dtype_t dtype; /* parameters as gathered and computed on */
  fsdp_dtype_t reduce; /* gradients as reduced */
  double loss_scale;   /* config.loss_scale_init (0: the dtype's default) */
  int scale_interval;  /* config.loss_scale_interval (0: the default) */
  int shard;           /* config.shard_size (HSDP), 0: the world */
} run_cfg_t;

typedef struct {
  double loss[STEPS];
  double min_clip;
  int skipped;                  /* steps skipped (and retried on the same data) */
  double scale[STEPS];          /* loss scale each applied update carried */
  double first_skip_scale, after_skip_scale; /* the scale at the first skip, and next */
  float *params; /* every tensor, concatenated */
  size_t n_params;
} run_out_t;

static const char *const tensor_names[] = {"fc.0.weight", "fc.0.bias", "fc.1.weight",
                                           "fc.1.bias", "fc.2.weight", "fc.2.bias"};
static const size_t tensor_sizes[] = {32 * IN, 32, 32 * 32, 32, CLASSES * 32, CLASSES};

static fsdp_config_t engine_config(const run_cfg_t *r) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = r->strategy;
  c.grad_accum = r->accum;
  c.accumulate_full_grads = r->full_grads;
  c.param_dtype = r->dtype;
  c.reduce_dtype = r->reduce;
  c.shard_size = r->shard;
  c.optim.kind = r->optim;
  c.optim.lr = r->optim == FSDP_OPTIM_ADAMW ? 1e-2f : 0.2f;
  c.optim.momentum = 0.9f;
  c.optim.weight_decay = 0.01f;
  c.optim.max_grad_norm = r->clip;
  c.schedule.kind = FSDP_SCHED_WARMUP_COSINE;
  c.schedule.warmup_steps = 5;
  c.schedule.total_steps = STEPS;
  c.loss_scale_init = r->loss_scale;
  if (r->scale_interval) c.loss_scale_interval = r->scale_interval;
  c.max_consecutive_skips = 64;
  return c;
}

/* reverse != 0 feeds each micro-batch's samples in reverse order. */
static void train(fsdp_world_t w, const run_cfg_t *r, int reverse, run_out_t *out) {
  fsdp_config_t c = engine_config(r);
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(w, &c, &e), FSDP_SUCCESS);
  static const int widths[] = {IN, 32, 32, CLASSES};
  fsdp_mlp_t mlp;
  ck_assert_int_eq(fsdp_mlp_create(e, widths, 3, GLOBAL_BATCH, &mlp), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1234), FSDP_SUCCESS);
  int64_t mb, off;
  ck_assert_int_eq(fsdp_engine_shard_batch(e, GLOBAL_BATCH, &mb, &off), FSDP_SUCCESS);
  int per_micro = GLOBAL_BATCH / r->accum;
  float x[GLOBAL_BATCH][IN];
  int y[GLOBAL_BATCH];
  out->min_clip = 1.0;
  out->skipped = 0;
  for (int s = 0; s < STEPS; s++) {
    double local = 0.0, total = 0.0;
    for (int m = 0; m < r->accum; m++) {
      for (int b = 0; b < mb; b++) {
        int src = m * per_micro + (int)off + (reverse ? (int)mb - 1 - b : b);
        memcpy(x[b], xs[s][src], sizeof x[b]);
        y[b] = ys[s][src];
      }
      double l;
      float scale = (float)fsdp_engine_loss_scale(e);
      ck_assert_int_eq(fsdp_mlp_forward_backward(mlp, &x[0][0], y, (int)mb, scale / (float)mb, &l),
                       FSDP_SUCCESS);
      local += l;
    }
    ck_assert_int_eq(fsdp_all_reduce(fsdp_engine_comm(e), &local, &total, 1, FSDP_F64,
                                     FSDP_SUM, FSDP_HOST_STREAM), FSDP_SUCCESS);
    out->loss[s] = total / GLOBAL_BATCH;
    fsdp_step_stats_t st;
    ck_assert_int_eq(fsdp_engine_report_loss(e, out->loss[s]), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
    if (st.skipped && out->skipped++ == 0) {
      out->first_skip_scale = st.loss_scale;
      out->after_skip_scale = fsdp_engine_loss_scale(e);
    }
    if (st.skipped) { /* as fsdp-train does: the same update again, on the same data */
      s--;
      continue;
    }
    out->scale[s] = st.loss_scale;
    if (st.clip_coef < out->min_clip) out->min_clip = st.clip_coef;
  }
  out->n_params = 0;
  for (size_t t = 0; t < 6; t++) out->n_params += tensor_sizes[t];
  out->params = malloc(out->n_params * sizeof(float));
  float *p = out->params;
  for (size_t t = 0; t < 6; t++) {
    ck_assert_int_eq(fsdp_engine_read_tensor(e, tensor_names[t], p, -1), FSDP_SUCCESS);
    p += tensor_sizes[t];
  }
  fsdp_mlp_destroy(mlp);
  fsdp_engine_destroy(e);
}

/* Largest relative difference over the loss curve and the final parameters. */
static double distance(const run_out_t *a, const run_out_t *b) {
  double d = 0.0, scale = 0.0;
  for (int s = 0; s < STEPS; s++) d = fmax(d, fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]));
  for (size_t i = 0; i < b->n_params; i++) scale = fmax(scale, fabs(b->params[i]));
  for (size_t i = 0; i < b->n_params; i++)
    d = fmax(d, fabs(a->params[i] - b->params[i]) / scale);
  return d;
}

/* Floor for a noise run that happens to round identically: a few fp32 ulps. With
 * bf16 parameters a different summation order can flip one element's rounding to
 * bf16 (a 2^-8 relative step) that the noise run did not happen to hit: the floor
 * is then a quarter of that step. Sharding bugs move these runs by 3e-2 and more. */
#define TOL_FLOOR 1e-6
#define TOL_FLOOR_BF16 (1.0 / 1024)
/* Gradients reduced in bf16 keep 8 significant bits per micro-batch, whatever
 * the summation order, so N ranks drift from one rank (which reduces nothing)
 * by more than noise: SGD measured 0.005 to 0.011 at N = 2..4 after 30 steps.
 * (AdamW amplifies the rounding of gradients that nearly cancel across ranks,
 * 0.04: not a parity case.) That the bf16 path sums the right slices exactly is
 * asserted bitwise below, with integer gradients bf16 holds exactly. */
#define TOL_FLOOR_BF16_REDUCE (1.0 / 32)
/* fp16 parameters with loss scaling: fp16 keeps 11 significant bits, so a flip
 * of one element's rounding is a 2^-11 relative step; the floor is a quarter
 * of it, as for bf16. The scale (2^16 by default) is a power of two applied to
 * fp32 gradients: the largest scaled gradient here, |dlogit| <= 2^16 / B, is
 * far from fp32's overflow (2^128) and its subnormals, so scaling and the
 * step's unscaling are exact and add nothing; no step may be skipped. */
#define TOL_FLOOR_F16 (1.0 / 8192)
#define TOL_FACTOR 10.0

#define F32 FSDP_F32
#define BF16 FSDP_BF16
#define F16 FSDP_F16
static const run_cfg_t parity_cases[] = {
    {0, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, F16, F32, 0, 0, 0},
    {0, FSDP_OPTIM_SGD, 1, 0, 0.0f, F16, F32, 0, 0, 0},
    {0, FSDP_OPTIM_SGD, 1, 0, 0.0f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_SGD, 2, 0, 0.5f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_SGD, 2, 1, 0.0f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_ADAMW, 1, 0, 0.0f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_ADAMW, 1, 0, 0.5f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_ADAMW, 2, 0, 0.0f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_ADAMW, 2, 1, 0.5f, F32, F32, 0, 0, 0},
    {0, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, BF16, F32, 0, 0, 0},
    {0, FSDP_OPTIM_SGD, 2, 1, 0.0f, F32, BF16, 0, 0, 0},
};

START_TEST(parity) {
  run_cfg_t r = parity_cases[_i];
  run_out_t ref, noise;
  r.strategy = FSDP_FULL_SHARD;
  train(solo, &r, 0, &ref);
  train(solo, &r, 1, &noise);
  double floor = distance(&noise, &ref);
  double tol = fmax(TOL_FACTOR * floor, r.reduce == FSDP_BF16 ? TOL_FLOOR_BF16_REDUCE
                                        : r.dtype == FSDP_BF16 ? TOL_FLOOR_BF16
                                        : r.dtype == FSDP_F16  ? TOL_FLOOR_F16
                                                               : TOL_FLOOR);
  ck_assert_msg(!ref.skipped && (r.dtype != FSDP_F16 || ref.scale[STEPS - 1] == 65536.0),
                "reference: %d steps skipped, loss scale %g", ref.skipped, ref.scale[STEPS - 1]);
  if (r.clip > 0) ck_assert_msg(ref.min_clip < 1.0, "clipping never engaged");
  ck_assert_msg(ref.loss[STEPS - 1] < 0.8 * ref.loss[0], "the reference did not learn: %g -> %g",
                ref.loss[0], ref.loss[STEPS - 1]);
  for (int s = 0; s < 3; s++) {
    r.strategy = (fsdp_strategy_t)s;
    run_out_t got;
    train(world, &r, 0, &got);
    double d = distance(&got, &ref);
    if (rank == 0)
      printf("parity N=%d %-7s %-5s accum=%d%s clip=%.1f %s reduce %s: distance %.3g, noise "
             "%.3g, tol %.3g\n", nranks, fsdp_strategy_name(r.strategy),
             r.optim == FSDP_OPTIM_SGD ? "sgd" : "adamw", r.accum, r.full_grads ? "(full)" : "",
             r.clip, fsdp_dtype_name(r.dtype), fsdp_dtype_name(r.reduce), d, floor, tol);
    ck_assert_msg(d <= tol, "%s: N=%d differs from N=1 by %g > tolerance %g",
                  fsdp_strategy_name(r.strategy), nranks, d, tol);
    ck_assert_int_eq(got.skipped, 0);
    free(got.params);
  }
  free(ref.params);
  free(noise.params);
}
END_TEST

/* ---- forced overflow: fp16 with a loss scale of 2^128 ---------------------- */

/* A scale of 2^128 is past fp32's range: the scaled loss gradient, and every
 * gradient after it, is Inf or NaN (this MLP's gradients stay finite up to
 * 2^127: measured). The step is skipped on every rank, the scale halves to
 * 2^127, training then learns exactly as at the default scale (the scale is a
 * power of two: unscaling is exact), and after each interval of 5 good steps
 * the scale grows back to 2^128, overflows and backs off again. */
START_TEST(overflow_backs_off_and_recovers) {
  run_cfg_t r = {(fsdp_strategy_t)_i, FSDP_OPTIM_ADAMW, 1, 0, 0.0f, F16, F32, 0x1p128, 5, 0};
  run_out_t got, plain;
  train(world, &r, 0, &got);
  r.loss_scale = 0;
  train(world, &r, 0, &plain);
  if (rank == 0)
    printf("overflow N=%d %s: %d skipped, scale %g -> %g at the first, %g at the end; loss "
           "%.4f -> %.4f (default scale: %.4f)\n", nranks, fsdp_strategy_name(r.strategy),
           got.skipped, got.first_skip_scale, got.after_skip_scale, got.scale[STEPS - 1],
           got.loss[0], got.loss[STEPS - 1], plain.loss[STEPS - 1]);
  ck_assert_msg(got.skipped >= 1 && got.first_skip_scale == 0x1p128 &&
                got.after_skip_scale == 0x1p127, "no overflow at 2^128: %d skipped",
                got.skipped);
  /* Only a scale grown back to 2^128 overflows again. */
  ck_assert_msg(got.skipped >= 2, "the scale never grew back: %d skipped", got.skipped);
  ck_assert_msg(got.loss[STEPS - 1] < 0.8 * got.loss[0], "no recovery: loss %g -> %g",
                got.loss[0], got.loss[STEPS - 1]);
  ck_assert_msg(fabs(got.loss[STEPS - 1] - plain.loss[STEPS - 1]) < 0.05 * plain.loss[STEPS - 1],
                "after the overflow the loss %g is not the default scale's %g",
                got.loss[STEPS - 1], plain.loss[STEPS - 1]);
  free(got.params);
  free(plain.params);
}
END_TEST

/* ---- bitwise: additive linear model, L1 loss, integer gradients ---------- */

#define BW_OUT 3
static const int bw_in[3] = {5, 7, 11}; /* prime widths; 23 inputs in all */

static signed char bw_x(int s, int b, int k, int i) {
  unsigned h = (unsigned)(s * 7919 + b * 104729 + k * 31 + i * 131) * 2654435761u;
  return (signed char)((int)(h >> 29) % 3 - 1);
}
static int bw_t(int s, int b, int o) { return (int)((unsigned)(s * 13 + b * 5 + o * 3) % 7) - 3; }

static void bw_train(fsdp_world_t w, fsdp_optim_kind_t optim, fsdp_strategy_t strat,
                     fsdp_dtype_t reduce, int shard, float *params) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = strat;
  c.shard_size = shard;
  c.reduce_dtype = reduce;
  c.grad_reduce = FSDP_SUM;
  c.grad_accum = 2;
  c.optim.kind = optim;
  c.optim.lr = 1.0f / 64;
  c.optim.momentum = 0.5f;
  c.optim.weight_decay = 0.1f;
  c.optim.max_grad_norm = 20.0f;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(w, &c, &e), FSDP_SUCCESS);
  char names[3][2][16];
  for (int k = 0; k < 3; k++) {
    snprintf(names[k][0], 16, "lin.%d.w", k);
    snprintf(names[k][1], 16, "lin.%d.b", k);
    fsdp_tensor_desc_t t[2] = {{names[k][0], 2, {BW_OUT, bw_in[k]}, FSDP_INIT_NORMAL, 0.5f, 0},
                               {names[k][1], 1, {BW_OUT}, FSDP_INIT_NORMAL, 0.5f, 1}};
    fsdp_unit_t u;
    ck_assert_int_eq(fsdp_unit_add(e, names[k][0], "Linear", t, 2, &u), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_materialize(e, 99), FSDP_SUCCESS);
  int64_t mb, off;
  ck_assert_int_eq(fsdp_engine_shard_batch(e, GLOBAL_BATCH, &mb, &off), FSDP_SUCCESS);
  for (int s = 0; s < STEPS; s++) {
    for (int m = 0; m < 2; m++) {
      float y[GLOBAL_BATCH][BW_OUT] = {{0}};
      fsdp_view_t v;
      int first = m * GLOBAL_BATCH / 2 + (int)off;
      for (int k = 0; k < 3; k++) { /* fixed-order loops: same rounding at every N */
        ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
        for (int b = 0; b < mb; b++)
          for (int o = 0; o < BW_OUT; o++) {
            float z = v.param[1][o];
            for (int i = 0; i < bw_in[k]; i++) z += v.param[0][o * bw_in[k] + i] * bw_x(s, first + b, k, i);
            y[b][o] += z;
          }
        ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
      }
      for (int k = 2; k >= 0; k--) {
        ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
        for (int b = 0; b < mb; b++)
          for (int o = 0; o < BW_OUT; o++) {
            float d = y[b][o] - (float)bw_t(s, first + b, o);
            float sign = (float)((d > 0) - (d < 0));
            v.grad[1][o] += sign;
            for (int i = 0; i < bw_in[k]; i++)
              v.grad[0][o * bw_in[k] + i] += sign * bw_x(s, first + b, k, i);
          }
        ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
      }
    }
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  float *p = params;
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(fsdp_engine_read_tensor(e, names[k][0], p, -1), FSDP_SUCCESS);
    p += BW_OUT * bw_in[k];
    ck_assert_int_eq(fsdp_engine_read_tensor(e, names[k][1], p, -1), FSDP_SUCCESS);
    p += BW_OUT;
  }
  fsdp_engine_destroy(e);
}

/* Cases 6..11 reduce in bf16: every partial sum is an integer of magnitude at
 * most GLOBAL_BATCH / 2 = 12 (bf16 holds every integer up to 256), so they too must
 * match one rank bit for bit. */
START_TEST(bitwise) {
  fsdp_optim_kind_t optim = _i % 2 ? FSDP_OPTIM_ADAMW : FSDP_OPTIM_SGD;
  fsdp_strategy_t strat = (fsdp_strategy_t)(_i / 2 % 3);
  fsdp_dtype_t reduce = _i < 6 ? FSDP_F32 : FSDP_BF16;
  float ref[BW_OUT * 26], got[BW_OUT * 26];
  bw_train(solo, optim, FSDP_FULL_SHARD, FSDP_F32, 0, ref);
  bw_train(world, optim, strat, reduce, 0, got);
  ck_assert_msg(memcmp(ref, got, sizeof ref) == 0, "%s %s reduce %s: N=%d parameters differ "
                "from N=1", fsdp_strategy_name(strat), optim == FSDP_OPTIM_SGD ? "sgd" : "adamw",
                fsdp_dtype_name(reduce), nranks);
}
END_TEST

/* ---- HSDP: R replica groups x S ranks (test_parity --hsdp S1,S2,...) ------- */

static int shard_sizes[8], n_shard_sizes;

/* ZeRO-3 and ZeRO-2, f32 and bf16 parameters, AdamW with clipping, two
 * micro-batches: against one rank, within the tolerance of the parity cases. */
static const run_cfg_t hsdp_cases[] = {
    {FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, F32, F32, 0, 0, 0},
    {FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, F32, F32, 0, 0, 0},
    {FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, BF16, F32, 0, 0, 0},
    {FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, 2, 0, 0.5f, BF16, F32, 0, 0, 0},
};
#define N_HSDP_CASES ((int)(sizeof hsdp_cases / sizeof hsdp_cases[0]))

START_TEST(hsdp_parity) {
  run_cfg_t r = hsdp_cases[_i % N_HSDP_CASES]; /* shard 0 for the one-rank runs */
  int shard = shard_sizes[_i / N_HSDP_CASES];
  run_out_t ref, noise, got;
  fsdp_strategy_t strategy = r.strategy;
  r.strategy = FSDP_FULL_SHARD;
  train(solo, &r, 0, &ref);
  train(solo, &r, 1, &noise);
  double floor = distance(&noise, &ref);
  double tol = fmax(TOL_FACTOR * floor, r.dtype == FSDP_BF16 ? TOL_FLOOR_BF16 : TOL_FLOOR);
  r.strategy = strategy;
  r.shard = shard;
  train(world, &r, 0, &got);
  double d = distance(&got, &ref);
  if (rank == 0)
    printf("hsdp N=%d as %d x %d %-5s %s: distance %.3g, noise %.3g, tol %.3g\n", nranks,
           nranks / r.shard, r.shard, fsdp_strategy_name(r.strategy), fsdp_dtype_name(r.dtype),
           d, floor, tol);
  ck_assert_msg(d <= tol, "HSDP %d x %d %s %s differs from N=1 by %g > tolerance %g",
                nranks / r.shard, r.shard, fsdp_strategy_name(r.strategy),
                fsdp_dtype_name(r.dtype), d, tol);
  free(ref.params);
  free(noise.params);
  free(got.params);
}
END_TEST

/* Integer gradients: every R x S layout gives one rank's parameters bit for
 * bit, gradients reduced in f32 or in bf16 (exact for these integers). */
START_TEST(hsdp_bitwise) {
  int shard = shard_sizes[_i / 8];
  fsdp_optim_kind_t optim = _i % 2 ? FSDP_OPTIM_ADAMW : FSDP_OPTIM_SGD;
  fsdp_strategy_t strat = _i / 2 % 2 ? FSDP_SHARD_GRAD_OP : FSDP_FULL_SHARD;
  fsdp_dtype_t reduce = _i / 4 % 2 ? FSDP_BF16 : FSDP_F32;
  float ref[BW_OUT * 26], got[BW_OUT * 26];
  bw_train(solo, optim, FSDP_FULL_SHARD, FSDP_F32, 0, ref);
  bw_train(world, optim, strat, reduce, shard, got);
  ck_assert_msg(memcmp(ref, got, sizeof ref) == 0, "HSDP %d x %d %s %s reduce %s: parameters "
                "differ from N=1", nranks / shard, shard, fsdp_strategy_name(strat),
                optim == FSDP_OPTIM_SGD ? "sgd" : "adamw", fsdp_dtype_name(reduce));
}
END_TEST

/* Memory: 16 bytes per parameter / S plus padding (AdamW, f32). Timeline: a
 * gather moves a shard-group slice (padded / S elements per rank) and the
 * replica all-reduce once per unit and step the same 1/S of the gradient. */
START_TEST(hsdp_memory_and_bytes) {
  int shard = shard_sizes[_i];
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.shard_size = shard;
  c.grad_accum = 2;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  static const int widths[] = {IN, 32, 32, CLASSES};
  fsdp_mlp_t mlp;
  ck_assert_int_eq(fsdp_mlp_create(e, widths, 3, GLOBAL_BATCH, &mlp), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1234), FSDP_SUCCESS);
  int n_units = fsdp_engine_num_units(e);
  size_t padded_sum = 0, p_total = 0, padded[8];
  for (int u = 0; u < n_units; u++) {
    fsdp_unit_info_t info;
    ck_assert_int_eq(fsdp_unit_info(e, u, &info), FSDP_SUCCESS);
    size_t unit = (size_t)shard * c.align;
    padded[u] = (info.numel + unit - 1) / unit * unit;
    ck_assert_uint_eq(info.padded_numel, padded[u]);
    ck_assert_uint_eq(info.shard_numel, padded[u] / (size_t)shard);
    ck_assert_uint_eq(info.shard_offset, (size_t)(rank % shard) * info.shard_numel);
    padded_sum += padded[u];
    p_total += info.numel;
  }
  fsdp_mem_stats_t m;
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  ck_assert_uint_eq(m.persistent, 16 * padded_sum / (size_t)shard);
  ck_assert_uint_le(m.persistent, 16 * p_total / (size_t)shard + 16 * c.align * (size_t)n_units);
  int64_t mb, off;
  ck_assert_int_eq(fsdp_engine_shard_batch(e, GLOBAL_BATCH, &mb, &off), FSDP_SUCCESS);
  fsdp_engine_timeline_clear(e);
  double loss;
  for (int k = 0; k < 2; k++)
    ck_assert_int_eq(fsdp_mlp_forward_backward(mlp, &xs[0][off][0], &ys[0][off], (int)mb,
                                               1.0f / (float)mb, &loss), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  const fsdp_tl_event_t *ev;
  size_t n;
  ck_assert_int_eq(fsdp_engine_timeline(e, &ev, &n, NULL), FSDP_SUCCESS);
  int gathers = 0, replicas = 0;
  for (size_t i = 0; i < n; i++) {
    if (ev[i].kind == FSDP_TL_ALL_GATHER) {
      gathers++;
      ck_assert_uint_eq(ev[i].bytes * (size_t)shard, padded[ev[i].unit] * sizeof(float));
    }
    if (ev[i].kind == FSDP_TL_REPLICA_REDUCE) {
      replicas++;
      ck_assert_uint_eq(ev[i].bytes * (size_t)shard, padded[ev[i].unit] * sizeof(float));
      ck_assert_int_eq(ev[i].stream, 3);
    }
  }
  int hybrid = shard > 1 && shard < nranks;
  ck_assert_int_eq(gathers, shard > 1 ? 2 * 2 * n_units : 0); /* forward and backward, x2 */
  ck_assert_int_eq(replicas, hybrid ? n_units : 0);           /* once per step, not per micro */
  fsdp_mlp_destroy(mlp);
  fsdp_engine_destroy(e);
}
END_TEST

/* A shard size that does not divide the world is refused, naming both. */
START_TEST(hsdp_bad_shard_size) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.shard_size = nranks + 1;
  fsdp_engine_t e = NULL;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_ERR_INVALID_ARGUMENT);
  char want[96];
  snprintf(want, sizeof want, "config.shard_size %d does not divide the world of %d ranks",
           nranks + 1, nranks);
  ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
}
END_TEST

static int parse_shard_sizes(const char *list) {
  for (const char *p = list; p && *p && n_shard_sizes < 8; p = strchr(p, ','), p = p ? p + 1 : p)
    shard_sizes[n_shard_sizes++] = atoi(p);
  return n_shard_sizes;
}

static Suite *hsdp_suite(void) {
  Suite *s = suite_create("hsdp");
  TCase *tc = tcase_create("hsdp");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, hsdp_bad_shard_size);
  tcase_add_loop_test(tc, hsdp_memory_and_bytes, 0, n_shard_sizes);
  tcase_add_loop_test(tc, hsdp_bitwise, 0, 8 * n_shard_sizes);
  tcase_add_loop_test(tc, hsdp_parity, 0, N_HSDP_CASES * n_shard_sizes);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *parity_suite(void) {
  Suite *s = suite_create("parity");
  TCase *tc = tcase_create("parity");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, parity, 0, (int)(sizeof parity_cases / sizeof parity_cases[0]));
  tcase_add_loop_test(tc, bitwise, 0, 12);
  tcase_add_loop_test(tc, overflow_backs_off_and_recovers, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  if (mpi_check_join(&world, &rank, &nranks) || !(solo = mpi_check_solo())) return EXIT_FAILURE;
  make_data();
  if (argc > 2 && !strcmp(argv[1], "--hsdp") && parse_shard_sizes(argv[2]))
    return mpi_check_run(hsdp_suite());
  return mpi_check_run(parity_suite());
}
