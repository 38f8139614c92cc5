/* tests/cuda/test_engine_cuda.c — the engine on a CUDA device against the same
 * engine on the CPU, model-free: each unit's backward writes a known gradient
 * (a function of step, tensor, element and rank), so any difference comes from
 * the engine itself — gathers, reductions (NCCL or staged MPI, fp32 or bf16),
 * accumulation, clipping, AdamW and the bf16 and fp16 parameter copies. Also checks that
 * the memory the engine reports is what the device gave up, and that a
 * checkpoint's save and load hold the shards' host copies one unit at a time.
 *
 * Runs under mpirun at N = 1..4 and under fsdp-run (env://, gloo) at N = 2:
 * the world's backend with device buffers staged through pinned memory (ranks
 * may share one GPU), and NCCL wherever the node has a GPU per local rank (a
 * case printed "skipped" otherwise; the simulator has FSDP_SIM_DEVICES, 4 by
 * default). Exits 77 (skipped) without a usable GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/mpi_check.h"
#include "backend/cuda/kernels.h"
#include "cuda_gate.h"
#include "device/stream_internal.h"
#include "engine/engine_internal.h" /* the timeline marks' anchor error */
#include "fsdp/fsdp.h"
#include "fsdp_config.h"

#define STEPS 6

typedef struct {
  const char *name;
  int n;
  struct { const char *name; int64_t rows, cols; int no_decay; } t[2];
} unit_spec_t;

/* Odd sizes so that every unit has padding at every world size. */
static const unit_spec_t units[] = {
    {"a", 2, {{"a.w", 37, 19, 0}, {"a.b", 19, 1, 1}}},
    {"b", 1, {{"b.w", 64, 33, 0}, {NULL, 0, 0, 0}}},
    {"c", 2, {{"c.w", 1000, 1, 0}, {"c.b", 7, 1, 1}}},
};
#define N_UNITS 3

typedef struct {
  fsdp_strategy_t strategy;
  fsdp_dtype_t param, reduce;
  const char *backend; /* NULL: the world's */
  int shard_size;      /* HSDP: ranks per shard group (0: the world; run where 1 < it < N) */
} case_t;

static fsdp_world_t world;
static int rank, nranks;

static size_t numel(int u, int t) { return (size_t)(units[u].t[t].rows * units[u].t[t].cols); }

static float grad_value(int step, int u, int t, size_t i) {
  return 0.02f * sinf(0.37f * (float)i + 1.3f * (float)step + 0.7f * (float)u + (float)t) *
         (1.0f + (float)rank);
}

static fsdp_engine_t make_engine(const case_t *c, fsdp_device_kind_t dev) {
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  cfg.strategy = c->strategy;
  cfg.param_dtype = c->param;
  cfg.reduce_dtype = c->reduce;
  cfg.device = dev;
  cfg.comm_backend = dev == FSDP_DEVICE_CUDA ? c->backend : NULL;
  cfg.shard_size = c->shard_size;
  cfg.optim.lr = 1e-2f;
  cfg.optim.weight_decay = 0.1f;
  cfg.optim.max_grad_norm = 0.5f;
  fsdp_engine_t e = NULL;
  ck_assert_msg(fsdp_engine_create(world, &cfg, &e) == FSDP_SUCCESS, "create: %s",
                fsdp_last_error());
  for (int u = 0; u < N_UNITS; u++) {
    fsdp_tensor_desc_t d[2];
    for (int t = 0; t < units[u].n; t++)
      d[t] = (fsdp_tensor_desc_t){units[u].t[t].name, 2, {units[u].t[t].rows, units[u].t[t].cols},
                                  FSDP_INIT_NORMAL, 0.5f, units[u].t[t].no_decay};
    fsdp_unit_t id;
    ck_assert_int_eq(fsdp_unit_add(e, units[u].name, "Linear", d, units[u].n, &id),
                     FSDP_SUCCESS);
  }
  ck_assert_msg(fsdp_engine_materialize(e, 99) == FSDP_SUCCESS, "materialize: %s",
                fsdp_last_error());
  return e;
}

/* The view's parameter t as f32 on the host. */
static void param_to_host(fsdp_engine_t e, const fsdp_view_t *v, int t, size_t n, float *out) {
  if (v->dtype == FSDP_F32) {
    ck_assert_int_eq(fsdp_device_copy(out, v->param[t], n * sizeof(float), fsdp_engine_stream(e)),
                     FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_stream_synchronize(fsdp_engine_stream(e)), FSDP_SUCCESS);
    return;
  }
  uint16_t *lp = malloc(n * sizeof *lp);
  ck_assert_int_eq(fsdp_device_copy(lp, v->param[t], n * sizeof *lp, fsdp_engine_stream(e)),
                   FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(fsdp_engine_stream(e)), FSDP_SUCCESS);
  float (*widen)(uint16_t) = v->dtype == FSDP_F16 ? fsdp_f16_to_f32 : fsdp_bf16_to_f32;
  for (size_t i = 0; i < n; i++) out[i] = widen(lp[i]);
  free(lp);
}

static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0.0, scale = 1e-30;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]) / scale);
  return d;
}

static const case_t cases[] = {
    {FSDP_FULL_SHARD, FSDP_F32, FSDP_F32, NULL, 0},
    {FSDP_SHARD_GRAD_OP, FSDP_F32, FSDP_F32, NULL, 0},
    {FSDP_FULL_SHARD, FSDP_BF16, FSDP_F32, NULL, 0},
    {FSDP_FULL_SHARD, FSDP_BF16, FSDP_BF16, NULL, 0},
    {FSDP_NO_SHARD, FSDP_F32, FSDP_BF16, NULL, 0},
    {FSDP_FULL_SHARD, FSDP_F32, FSDP_F32, "nccl", 0},
    {FSDP_FULL_SHARD, FSDP_BF16, FSDP_BF16, "nccl", 0},
    /* fp16 parameters (gathered and viewed as fp16; the default loss scale
     * divides these unscaled gradients on both engines alike) */
    {FSDP_FULL_SHARD, FSDP_F16, FSDP_F32, NULL, 0},
    {FSDP_FULL_SHARD, FSDP_F16, FSDP_F32, "nccl", 0},
    /* HSDP at N = 4: 2 replica groups of 2, the replica all-reduce on NCCL too */
    {FSDP_FULL_SHARD, FSDP_F32, FSDP_F32, "nccl", 2},
};

/* NCCL needs a GPU per rank of the node; the world's backend runs anywhere. */
static int runnable(const case_t *c) {
  if (c->shard_size && (nranks <= c->shard_size || nranks % c->shard_size)) return 0;
  if (!c->backend) return 1;
  if (!FSDP_HAVE_NCCL) return 0;
  const int have = fsdp_cuda_device_count(), need = fsdp_world_local_size(world);
  if (have < need && rank == 0)
    printf("engine N=%d backend %s: skipped (%d devices for %d local ranks)\n", nranks,
           c->backend, have, need);
  return have >= need;
}

/* The backend the engine's gathers and reductions ran on. */
static const char *backend_name(const case_t *c, fsdp_engine_t e) {
  return c->backend ? c->backend : fsdp_comm_backend(fsdp_engine_comm(e));
}

START_TEST(engine_matches_cpu) {
  const case_t *c = &cases[_i];
  if (c->shard_size || !runnable(c)) return; /* HSDP: the timeline case only */
  fsdp_engine_t cpu = make_engine(c, FSDP_DEVICE_CPU), gpu = make_engine(c, FSDP_DEVICE_CUDA);
  /* Parameters: fp32 agree to the optimizer kernels' rounding; bf16 copies may
   * sit one bf16 step (2^-8) apart where the fp32 masters straddle a rounding
   * boundary. */
  double tol = c->param != FSDP_F32 || c->reduce == FSDP_BF16 ? 1e-2 : 1e-5;
  double worst = 0.0;
  float *a = malloc(64 * 1024 * sizeof(float)), *b = malloc(64 * 1024 * sizeof(float));
  for (int s = 0; s < STEPS; s++) {
    for (int u = 0; u < N_UNITS; u++) {
      fsdp_view_t vc, vg;
      ck_assert_int_eq(fsdp_unit_acquire(cpu, u, FSDP_FORWARD, &vc), FSDP_SUCCESS);
      ck_assert_msg(fsdp_unit_acquire(gpu, u, FSDP_FORWARD, &vg) == FSDP_SUCCESS, "%s",
                    fsdp_last_error());
      for (int t = 0; t < units[u].n; t++) {
        param_to_host(gpu, &vg, t, numel(u, t), a);
        double d = rel_diff(a, vc.param[t], numel(u, t));
        worst = fmax(worst, d);
        ck_assert_msg(d <= tol, "step %d, %s: GPU parameters differ from the CPU's by %g > %g",
                      s, units[u].t[t].name, d, tol);
      }
      ck_assert_int_eq(fsdp_unit_release(cpu, u, FSDP_FORWARD), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(gpu, u, FSDP_FORWARD), FSDP_SUCCESS);
    }
    for (int u = N_UNITS - 1; u >= 0; u--) {
      fsdp_view_t vc, vg;
      ck_assert_int_eq(fsdp_unit_acquire(cpu, u, FSDP_BACKWARD, &vc), FSDP_SUCCESS);
      ck_assert_msg(fsdp_unit_acquire(gpu, u, FSDP_BACKWARD, &vg) == FSDP_SUCCESS, "%s",
                    fsdp_last_error());
      for (int t = 0; t < units[u].n; t++) {
        size_t n = numel(u, t);
        for (size_t i = 0; i < n; i++) b[i] = grad_value(s, u, t, i);
        memcpy(vc.grad[t], b, n * sizeof(float));
        ck_assert_int_eq(fsdp_device_copy(vg.grad[t], b, n * sizeof(float),
                                          fsdp_engine_stream(gpu)), FSDP_SUCCESS);
        ck_assert_int_eq(fsdp_stream_synchronize(fsdp_engine_stream(gpu)), FSDP_SUCCESS);
      }
      ck_assert_int_eq(fsdp_unit_release(cpu, u, FSDP_BACKWARD), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(gpu, u, FSDP_BACKWARD), FSDP_SUCCESS);
    }
    fsdp_step_stats_t sc, sg;
    ck_assert_int_eq(fsdp_engine_step(cpu, &sc), FSDP_SUCCESS);
    ck_assert_msg(fsdp_engine_step(gpu, &sg) == FSDP_SUCCESS, "%s", fsdp_last_error());
    double dn = fabs(sg.grad_norm - sc.grad_norm) / sc.grad_norm;
    ck_assert_msg(dn <= (c->reduce == FSDP_BF16 ? 1e-2 : 1e-5),
                  "step %d: gradient norm %g on the GPU, %g on the CPU", s, sg.grad_norm,
                  sc.grad_norm);
  }
  for (int u = 0; u < N_UNITS; u++)
    for (int t = 0; t < units[u].n; t++) {
      ck_assert_int_eq(fsdp_engine_read_tensor(gpu, units[u].t[t].name, a, -1), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_engine_read_tensor(cpu, units[u].t[t].name, b, -1), FSDP_SUCCESS);
      double d = rel_diff(a, b, numel(u, t));
      worst = fmax(worst, d);
      ck_assert_msg(d <= tol, "%s: final GPU master differs from the CPU's by %g > %g",
                    units[u].t[t].name, d, tol);
    }
  if (rank == 0)
    printf("engine N=%d %s param %s reduce %s backend %s: worst relative difference %.3g "
           "(tolerance %.0e)\n", nranks, fsdp_strategy_name(c->strategy),
           fsdp_dtype_name(c->param), fsdp_dtype_name(c->reduce), backend_name(c, gpu), worst,
           tol);
  free(a);
  free(b);
  fsdp_engine_destroy(gpu);
  fsdp_engine_destroy(cpu);
}
END_TEST

/* Stream ordering, with no host synchronisation to hide a missing wait: before
 * every release a long kernel is queued on the compute stream, then the work
 * that uses the view (forward: a copy of the parameters out; backward: the
 * gradients copied in), then the release, at once. If the engine let a gather
 * reuse the parameter buffer, or a reduction read the gradient buffer, before
 * the compute stream passed the release, the copies see the wrong values (on a
 * GPU and on the simulator, whose streams order only what they are told to)
 * and ThreadSanitizer sees the race. */
#define RACE_SCRATCH (1u << 20) /* floats: a kernel long enough to lose a race to */

static void slow_kernel(fsdp_engine_t e, float *scratch) {
  ck_assert_int_eq(fsdp_cuda_scale(&(fsdp_scale_args_t){.x = scratch, .alpha = 1.0f,
                                                        .n = RACE_SCRATCH},
                                   fsdp_engine_stream(e)),
                   FSDP_SUCCESS);
}

START_TEST(release_waits_for_compute) {
  const case_t *c = &cases[_i];
  if (c->param != FSDP_F32 || c->reduce != FSDP_F32 || c->strategy != FSDP_FULL_SHARD ||
      c->shard_size)
    return;
  if (!runnable(c)) return;
  fsdp_engine_t cpu = make_engine(c, FSDP_DEVICE_CPU), gpu = make_engine(c, FSDP_DEVICE_CUDA);
  fsdp_stream_t cs = fsdp_engine_stream(gpu);
  float *scratch = NULL, *snap[N_UNITS][2];
  ck_assert_int_eq(fsdp_device_alloc(FSDP_DEVICE_CUDA, RACE_SCRATCH * sizeof(float),
                                     (void **)&scratch), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_device_zero(scratch, RACE_SCRATCH * sizeof(float), cs), FSDP_SUCCESS);
  for (int u = 0; u < N_UNITS; u++)
    for (int t = 0; t < units[u].n; t++)
      ck_assert_int_eq(fsdp_device_alloc(FSDP_DEVICE_CUDA, numel(u, t) * sizeof(float),
                                         (void **)&snap[u][t]), FSDP_SUCCESS);
  float *a = malloc(64 * 1024 * sizeof(float)), *g[N_UNITS][2];
  for (int s = 0; s < 2; s++) {
    for (int u = 0; u < N_UNITS; u++) {
      fsdp_view_t vg;
      ck_assert_int_eq(fsdp_unit_acquire(gpu, u, FSDP_FORWARD, &vg), FSDP_SUCCESS);
      slow_kernel(gpu, scratch);
      for (int t = 0; t < units[u].n; t++)
        ck_assert_int_eq(fsdp_device_copy(snap[u][t], vg.param[t], numel(u, t) * sizeof(float),
                                          cs), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(gpu, u, FSDP_FORWARD), FSDP_SUCCESS);
    }
    for (int u = 0; u < N_UNITS; u++) { /* the CPU engine's parameters, then the snapshots */
      fsdp_view_t vc;
      ck_assert_int_eq(fsdp_unit_acquire(cpu, u, FSDP_FORWARD, &vc), FSDP_SUCCESS);
      for (int t = 0; t < units[u].n; t++) {
        ck_assert_int_eq(fsdp_device_copy(a, snap[u][t], numel(u, t) * sizeof(float), cs),
                         FSDP_SUCCESS);
        ck_assert_int_eq(fsdp_stream_synchronize(cs), FSDP_SUCCESS);
        const double d = rel_diff(a, vc.param[t], numel(u, t));
        ck_assert_msg(d <= 1e-5, "step %d, %s: the parameters copied before the release differ "
                      "from the CPU's by %g: the buffer changed under the compute stream", s,
                      units[u].t[t].name, d);
      }
      ck_assert_int_eq(fsdp_unit_release(cpu, u, FSDP_FORWARD), FSDP_SUCCESS);
    }
    for (int u = N_UNITS - 1; u >= 0; u--) {
      fsdp_view_t vc, vg;
      ck_assert_int_eq(fsdp_unit_acquire(cpu, u, FSDP_BACKWARD, &vc), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_acquire(gpu, u, FSDP_BACKWARD, &vg), FSDP_SUCCESS);
      slow_kernel(gpu, scratch);
      for (int t = 0; t < units[u].n; t++) {
        const size_t n = numel(u, t);
        g[u][t] = malloc(n * sizeof(float)); /* alive until the stream has copied it */
        for (size_t i = 0; i < n; i++) g[u][t][i] = grad_value(s, u, t, i);
        memcpy(vc.grad[t], g[u][t], n * sizeof(float));
        ck_assert_int_eq(fsdp_device_copy(vg.grad[t], g[u][t], n * sizeof(float), cs),
                         FSDP_SUCCESS);
      }
      ck_assert_int_eq(fsdp_unit_release(cpu, u, FSDP_BACKWARD), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(gpu, u, FSDP_BACKWARD), FSDP_SUCCESS);
    }
    fsdp_step_stats_t sc, sg;
    ck_assert_int_eq(fsdp_engine_step(cpu, &sc), FSDP_SUCCESS);
    ck_assert_msg(fsdp_engine_step(gpu, &sg) == FSDP_SUCCESS, "%s", fsdp_last_error());
    ck_assert_msg(fabs(sg.grad_norm - sc.grad_norm) <= 1e-5 * sc.grad_norm,
                  "step %d: gradient norm %g on the GPU, %g on the CPU: a reduction read the "
                  "gradients before the compute stream wrote them", s, sg.grad_norm,
                  sc.grad_norm);
    for (int u = 0; u < N_UNITS; u++)
      for (int t = 0; t < units[u].n; t++) free(g[u][t]);
  }
  if (rank == 0)
    printf("engine N=%d release ordering (backend %s): parameters and gradients intact behind "
           "a long compute kernel\n", nranks, backend_name(c, gpu));
  for (int u = 0; u < N_UNITS; u++)
    for (int t = 0; t < units[u].n; t++) fsdp_device_free(FSDP_DEVICE_CUDA, snap[u][t]);
  fsdp_device_free(FSDP_DEVICE_CUDA, scratch);
  free(a);
  fsdp_engine_destroy(gpu);
  fsdp_engine_destroy(cpu);
}
END_TEST

/* Collectives on CUDA streams go on the timeline through CUDA events: a step
 * that keeps a timeline queues no host function on any CUDA stream (each one
 * stalls its stream for a round trip to the host), and the events still come
 * out in host seconds: every reduction begins after the release that queued
 * it and ends before the step that waits for it returns, every gather (N > 1)
 * lies inside its step. Three steps: the later ones are timed against the
 * anchor the previous step handed over. */
/* s: the GPU's clock is tied to the host's to within half the time the host
 * took to see one event recorded (the engine's anchor error: microseconds on
 * a GPU, up to milliseconds on a loaded simulator), plus a millisecond; a
 * clock mapping gone wrong is off by far more */
static double tl_slack(fsdp_engine_t e) {
  return 1e-3 + fsdp_marks_anchor_error(e->stats.tl_marks);
}

static void tl_check(fsdp_engine_t e, int step, double t0, double t1, const double *released) {
  const double slack = tl_slack(e);
  const fsdp_tl_event_t *tl;
  size_t n, dropped;
  ck_assert_int_eq(fsdp_engine_timeline(e, &tl, &n, &dropped), FSDP_SUCCESS);
  ck_assert_uint_eq(dropped, 0);
  int reduced[N_UNITS] = {0}, replicated[N_UNITS] = {0}, gathered = 0;
  const int hsdp = fsdp_engine_config(e)->shard_size < nranks;
  for (size_t i = 0; i < n; i++) {
    const fsdp_tl_event_t *v = &tl[i];
    if (v->kind == FSDP_TL_REPLICA_REDUCE) {
      replicated[v->unit]++;
      ck_assert_msg(v->t_begin >= released[v->unit] - slack && v->t_begin <= v->t_end &&
                    v->t_end <= t1 + slack, "step %d: the replica all-reduce of unit %d "
                    "spans [%.6f, %.6f] s, outside [release %.6f, step end %.6f]", step,
                    v->unit, v->t_begin, v->t_end, released[v->unit], t1);
      continue;
    }
    if (v->kind != FSDP_TL_REDUCE && v->kind != FSDP_TL_ALL_GATHER) continue;
    ck_assert_msg(v->t_begin >= t0 - slack && v->t_begin <= v->t_end &&
                  v->t_end <= t1 + slack, "step %d: %s of unit %d spans [%.6f, %.6f] s, "
                  "outside its step [%.6f, %.6f]", step, v->kind == FSDP_TL_REDUCE ? "reduction"
                  : "gather", v->unit, v->t_begin, v->t_end, t0, t1);
    if (v->kind == FSDP_TL_ALL_GATHER) {
      gathered++;
      continue;
    }
    if (v->unit < 0) continue; /* the gradient norm's all-reduce */
    reduced[v->unit]++;
    ck_assert_msg(v->t_begin >= released[v->unit] - slack, "step %d: the reduction of unit %d "
                  "begins at %.6f s, before the release that queued it (%.6f s)", step, v->unit,
                  v->t_begin, released[v->unit]);
  }
  /* One rank with one micro-batch reduces nothing: backward adds into the
   * gradient shards. */
  const int reductions = nranks > 1;
  for (int u = 0; u < N_UNITS; u++)
    ck_assert_msg(reduced[u] == reductions && replicated[u] == hsdp, "step %d: %d reductions "
                  "(want %d) and %d replica all-reduces of unit %d on the timeline", step,
                  reduced[u], reductions, replicated[u], u);
  if (nranks > 1)
    ck_assert_msg(gathered >= N_UNITS, "step %d: %d gathers on the timeline", step, gathered);
}

/* The compute stream's waits for communication (FSDP_TL_COMPUTE_WAIT, what
 * fsdp-bench calls exposed on CUDA), timed by CUDA events around each wait:
 * one per forward acquire, one or two per backward acquire (its gather, a
 * reduction still reading the gradient buffer it reuses), one before the
 * step; each inside its step, and each ends after what it waited for: an
 * acquire's after its unit's gather in that pass, the step's after every
 * reduction. Marks placed beside the waits instead of around them, or on
 * another stream, break the last two. */
static double waits_check(fsdp_engine_t e, int step, double t0, double t1) {
  const double slack = tl_slack(e);
  const fsdp_tl_event_t *tl;
  size_t n;
  ck_assert_int_eq(fsdp_engine_timeline(e, &tl, &n, NULL), FSDP_SUCCESS);
  int waits[N_UNITS][2] = {{0}}, step_waits = 0;
  double step_wait = 0.0;
  for (size_t i = 0; i < n; i++) {
    const fsdp_tl_event_t *w = &tl[i];
    if (w->kind != FSDP_TL_COMPUTE_WAIT) continue;
    ck_assert_msg(w->stream == 0 && w->t_begin <= w->t_end && w->t_begin >= t0 - slack &&
                  w->t_end <= t1 + slack, "step %d: compute wait of unit %d spans [%.6f, "
                  "%.6f] s, outside its step [%.6f, %.6f]", step, w->unit, w->t_begin,
                  w->t_end, t0, t1);
    if (w->unit < 0) step_waits++, step_wait = w->t_end - w->t_begin;
    else waits[w->unit][w->pass == FSDP_BACKWARD]++;
    for (size_t j = 0; j < n; j++) {
      const fsdp_tl_event_t *c = &tl[j];
      const int before = w->unit < 0 ? c->kind == FSDP_TL_REDUCE && c->unit >= 0
                                     : c->kind == FSDP_TL_ALL_GATHER && c->unit == w->unit &&
                                           c->pass == w->pass;
      ck_assert_msg(!before || w->t_end >= c->t_end - slack, "step %d: the compute stream's "
                    "wait (unit %d, pass %d) ended at %.6f s, before the %s of unit %d it "
                    "waited for (%.6f s)", step, w->unit, (int)w->pass, w->t_end,
                    c->kind == FSDP_TL_REDUCE ? "reduction" : "gather", c->unit, c->t_end);
    }
  }
  ck_assert_msg(step_waits == 1, "step %d: %d waits before the step", step, step_waits);
  for (int u = 0; u < N_UNITS; u++)
    ck_assert_msg(waits[u][0] == 1 && waits[u][1] >= 1 && waits[u][1] <= 2, "step %d: unit %d "
                  "has %d forward and %d backward compute waits", step, u, waits[u][0],
                  waits[u][1]);
  return step_wait;
}

/* Holds stream s back by a slow kernel before the work queued next (about
 * 0.1 s on the simulator, far beyond the timeline's slack; microseconds on a
 * GPU, where the checks hold all the same). */
static void hold_stream(fsdp_stream_t s, float *scratch) {
  ck_assert_int_eq(
      fsdp_cuda_scale(&(fsdp_scale_args_t){.x = scratch, .alpha = 1.0f, .n = RACE_SCRATCH}, s),
      FSDP_SUCCESS);
}

START_TEST(timeline_without_host_functions) {
  const case_t *c = &cases[_i];
  if (!c->backend || !runnable(c)) return;
  fsdp_engine_t e = make_engine(c, FSDP_DEVICE_CUDA);
  ck_assert_uint_gt(fsdp_engine_config(e)->timeline_capacity, 0);
  float *scratch[2];
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(fsdp_device_alloc(FSDP_DEVICE_CUDA, RACE_SCRATCH * sizeof(float),
                                       (void **)&scratch[k]), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_device_zero(scratch[k], RACE_SCRATCH * sizeof(float),
                                      FSDP_HOST_STREAM), FSDP_SUCCESS);
  }
  double step_wait = 0.0;
  for (int s = 0; s < 3; s++) {
    double released[N_UNITS];
    fsdp_engine_timeline_clear(e);
    const uint64_t before = fsdp_cuda_host_fn_count();
    const double t0 = fsdp_time_now();
    fsdp_view_t v;
    /* The gathers and then the reductions start late: the compute stream,
     * idle, waits for them (waits_check). */
    hold_stream(e->comm.s_gather, scratch[0]);
    for (int u = 0; u < N_UNITS; u++) {
      ck_assert_int_eq(fsdp_unit_acquire(e, u, FSDP_FORWARD, &v), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(e, u, FSDP_FORWARD), FSDP_SUCCESS);
    }
    hold_stream(e->comm.s_reduce, scratch[1]);
    for (int u = N_UNITS - 1; u >= 0; u--) { /* zero gradients: only the schedule matters */
      ck_assert_int_eq(fsdp_unit_acquire(e, u, FSDP_BACKWARD, &v), FSDP_SUCCESS);
      released[u] = fsdp_time_now();
      ck_assert_int_eq(fsdp_unit_release(e, u, FSDP_BACKWARD), FSDP_SUCCESS);
    }
    ck_assert_msg(fsdp_engine_step(e, NULL) == FSDP_SUCCESS, "%s", fsdp_last_error());
    const double t1 = fsdp_time_now();
    const uint64_t launched = fsdp_cuda_host_fn_count() - before;
    ck_assert_msg(launched == 0, "step %d: %llu host functions queued on CUDA streams while a "
                  "timeline is kept (each stalls its stream for a host round trip)", s,
                  (unsigned long long)launched);
    tl_check(e, s, t0, t1, released);
    step_wait = waits_check(e, s, t0, t1);
  }
  if (rank == 0)
    printf("engine N=%d timeline (backend %s, param %s%s): no host function on a CUDA stream "
           "in 3 steps; collectives and the compute stream's waits for them (the step's for "
           "held reductions: %.2f ms) timed by CUDA events within their steps (clocks tied "
           "within %.0f us)\n", nranks, backend_name(c, e), fsdp_dtype_name(c->param),
           c->shard_size ? ", HSDP 2x2" : "", 1e3 * step_wait,
           1e6 * fsdp_marks_anchor_error(e->stats.tl_marks));
  fsdp_engine_destroy(e);
  for (int k = 0; k < 2; k++) fsdp_device_free(FSDP_DEVICE_CUDA, scratch[k]);
}
END_TEST

/* The compute stream's cuBLAS handle exists once materialize returns: the
 * first product of the first step does not create it while gathers are in
 * flight (issue 15). */
START_TEST(blas_handle_made_at_materialize) {
  fsdp_engine_t e = make_engine(&cases[0], FSDP_DEVICE_CUDA);
  int created = -1;
  ck_assert_int_eq(fsdp_cuda_blas_prepare(fsdp_engine_stream(e), &created), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  ck_assert_msg(created == 0, "the compute stream had no cuBLAS handle after materialize");
}
END_TEST

/* An engine on CUDA of n_units units of rows x 2048 parameters (bf16, AdamW),
 * not materialized. */
static fsdp_engine_t memory_engine(int n_units, int rows) {
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  cfg.device = FSDP_DEVICE_CUDA;
  cfg.param_dtype = FSDP_BF16;
  fsdp_engine_t e = NULL;
  ck_assert_int_eq(fsdp_engine_create(world, &cfg, &e), FSDP_SUCCESS);
  for (int u = 0; u < n_units; u++) {
    char name[16];
    snprintf(name, sizeof name, "m%d.w", u);
    fsdp_tensor_desc_t d = {name, 2, {rows, 2048}, FSDP_INIT_ZEROS, 0.0f, 0};
    fsdp_unit_t id;
    ck_assert_int_eq(fsdp_unit_add(e, name, "Linear", &d, 1, &id), FSDP_SUCCESS);
  }
  return e;
}

static size_t device_free(void) {
  size_t free_b, total;
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  ck_assert_int_eq(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  return free_b;
}

/* The engine's reserved bytes against what it allocated and what
 * cudaMemGetInfo says the device gave at materialize. The allocations
 * (fsdp_cuda_alloc_totals) are the engine's reserved bytes and a few small
 * buffers it does not report (each unit's decay runs, the norm's partial
 * sums, the piece runs: under 1 MiB here). The device gives each allocation
 * whole 2 MiB pages (at most one page more than asked; small ones may share a
 * page already mapped), and two costs of a first materialize that are not
 * the engine's buffers are paid before the reading: the compute stream's
 * cuBLAS handle (its workspace, 32 MiB on Hopper; materialize makes it, here
 * it is made first) and each kernel's first launch (its module's code and
 * local memory, once per process: a small engine is materialized first). The
 * 5 % ratio this replaces failed on an H200 at 6.4 %: the handle and pages. */
START_TEST(memory_matches_device) {
  fsdp_engine_t warm = memory_engine(1, 16);
  ck_assert_int_eq(fsdp_engine_materialize(warm, 1), FSDP_SUCCESS);
  fsdp_engine_destroy(warm);
  fsdp_engine_t e = memory_engine(6, 4096);
  const size_t before_blas = device_free();
  ck_assert_int_eq(fsdp_cuda_blas_prepare(fsdp_engine_stream(e), NULL), FSDP_SUCCESS);
  const size_t free0 = device_free();
  uint64_t n0, bytes0, paged0, n1, bytes1, paged1;
  fsdp_cuda_alloc_totals(&n0, &bytes0, &paged0);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_SUCCESS);
  const size_t free1 = device_free();
  fsdp_cuda_alloc_totals(&n1, &bytes1, &paged1);
  fsdp_mem_stats_t m;
  fsdp_engine_memory(e, &m);
  const double engine = (double)m.total_reserved, allocated = (double)(bytes1 - bytes0);
  const double paged = (double)(paged1 - paged0), mib = 1048576.0;
  ck_assert_msg(allocated >= engine && allocated <= engine + mib, "the engine reports %.0f "
                "bytes reserved but allocated %.0f on the device (%llu allocations)", engine,
                allocated, (unsigned long long)(n1 - n0));
  /* Other ranks sharing the GPU allocate at the same time: judge the device's
   * reading in a one-rank world only. */
  if (nranks == 1) {
    const double device = (double)free0 - (double)free1, page = (double)FSDP_CUDA_PAGE;
    printf("memory: engine reports %.1f MiB reserved, allocated %.1f MiB in %llu allocations "
           "(%.1f MiB in 2 MiB pages), the device gave %.1f MiB (the cuBLAS handle before it: "
           "%.1f MiB)\n", engine / mib, allocated / mib, (unsigned long long)(n1 - n0),
           paged / mib, device / mib, ((double)before_blas - (double)free0) / mib);
    ck_assert_msg(device >= allocated - page && device <= paged,
                  "the engine allocated %.0f bytes (%.0f in 2 MiB pages) but the device lost "
                  "%.0f", allocated, paged, device);
  }
  fsdp_engine_destroy(e);
}
END_TEST

/* A checkpoint's save and load hold fsdp_unit_shard's host copies of one unit
 * at a time and free each after use (issue 22: a 1558M GPU run kept 16 bytes
 * per parameter on the host for the engine's life); what the load wrote into
 * the copies reaches the device. */
static void host_copies_expect(fsdp_engine_t e, size_t one_unit, const char *after) {
  size_t live = 1, peak = 0;
  ck_assert_int_eq(fsdp_engine_host_copy_bytes(e, &live, &peak), FSDP_SUCCESS);
  ck_assert_msg(live == 0, "after %s, %zu bytes of host copies remain", after, live);
  ck_assert_msg(peak > 0 && peak <= one_unit, "during %s, %zu bytes of host copies at once "
                "(0 < bytes <= one unit's %zu)", after, peak, one_unit);
}

START_TEST(host_copies_released) {
  fsdp_engine_t e = make_engine(&cases[0], FSDP_DEVICE_CUDA);
  fsdp_comm_t comm = fsdp_engine_comm(e);
  size_t one_unit = 0, total = 0;
  for (int u = 0; u < N_UNITS; u++) {
    fsdp_unit_info_t info;
    ck_assert_int_eq(fsdp_unit_info(e, u, &info), FSDP_SUCCESS);
    size_t b = 4 * info.shard_numel * sizeof(float); /* master, gradient, m, v */
    one_unit = b > one_unit ? b : one_unit;
    total += b;
  }
  ck_assert(one_unit < total); /* else one unit at a time would prove nothing */
  char dir[32] = "/tmp/fsdp-hostcopy-XXXXXX";
  if (rank == 0) ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_eq(fsdp_broadcast(comm, dir, sizeof dir / 2, FSDP_BF16, 0, FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  float *before = malloc(1000 * sizeof(float)), *now = malloc(1000 * sizeof(float));
  float *zeros = calloc(1000, sizeof(float));
  ck_assert_msg(fsdp_ckpt_save(e, dir, NULL, NULL, 0) == FSDP_SUCCESS, "save: %s",
                fsdp_last_error());
  host_copies_expect(e, one_unit, "a save");
  /* Overwritten after the save; the load brings back what was saved. */
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "c.w", before, -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_load_tensor(e, "c.w", zeros, 0), FSDP_SUCCESS);
  ck_assert_msg(fsdp_ckpt_load(e, dir, NULL, NULL, NULL, 0) == FSDP_SUCCESS, "load: %s",
                fsdp_last_error());
  host_copies_expect(e, one_unit, "a save and a load");
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "c.w", now, -1), FSDP_SUCCESS);
  ck_assert_msg(memcmp(before, now, 1000 * sizeof(float)) == 0,
                "c.w after the load differs from what was saved");
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
  if (rank == 0) {
    char rm[64];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    ck_assert_int_eq(system(rm), 0);
  }
  free(before);
  free(now);
  free(zeros);
  fsdp_engine_destroy(e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("engine_cuda");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, engine_matches_cpu, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_loop_test(tc, release_waits_for_compute, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_loop_test(tc, timeline_without_host_functions, 0,
                      (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, memory_matches_device);
  tcase_add_test(tc, blas_handle_made_at_materialize);
  tcase_add_test(tc, host_copies_released);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_engine_cuda");
  if (gate) return gate;
  const int rc = mpi_check_join_gpu(&world, &rank, &nranks);
  return rc ? rc : mpi_check_run(suite());
}
