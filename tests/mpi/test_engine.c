/* tests/mpi/test_engine.c — the engine across ranks: the materialised model does
 * not depend on N; weights from rank `root` reach every shard; the memory each
 * rank reports follows the ZeRO formulas; with prefetch on, gathers overlap
 * compute (read off the engine's timeline); ranks with other settings or
 * another model are named at start-up. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;
static int rank, nranks;

/* Units of prime-sized tensors so shards straddle tensors and ranks. */
#define N_UNITS 4
static const int64_t unit_rows[N_UNITS] = {13, 97, 31, 61};
static const int64_t unit_cols = 17;

/* opts: per-unit choices (NULL: none). */
static fsdp_engine_t make_engine_opts(fsdp_config_t *c, char names[][2][24],
                                      const fsdp_unit_opts_t *opts) {
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, c, &e), FSDP_SUCCESS);
  for (int k = 0; k < N_UNITS; k++) {
    snprintf(names[k][0], 24, "block.%d.w", k);
    snprintf(names[k][1], 24, "block.%d.b", k);
    fsdp_tensor_desc_t t[2] = {
        {names[k][0], 2, {unit_rows[k], unit_cols}, FSDP_INIT_NORMAL, 0.02f, 0},
        {names[k][1], 1, {unit_rows[k]}, FSDP_INIT_UNIFORM, 0.5f, 1}};
    fsdp_unit_t u;
    ck_assert_msg(fsdp_unit_add_opts(e, names[k][0], "Block", t, 2, opts ? &opts[k] : NULL, &u) ==
                  FSDP_SUCCESS, "%s", fsdp_last_error());
  }
  ck_assert_int_eq(fsdp_engine_materialize(e, 2024), FSDP_SUCCESS);
  return e;
}

static fsdp_engine_t make_engine(fsdp_config_t *c, char names[][2][24]) {
  return make_engine_opts(c, names, NULL);
}

/* Real work between acquire and release so overlap has something to hide behind:
 * `work` dependent multiply-adds over the unit's parameters (16M: ~20 ms). */
static float compute(const fsdp_view_t *v, size_t n, size_t work) {
  float acc = 0.0f;
  for (size_t r = 0; r < work / n + 1; r++)
    for (size_t i = 0; i < n; i++) acc = acc * 0.999f + v->param[0][i] * (float)r;
  return acc;
}

static volatile float sink;

static void run_step(fsdp_engine_t e, size_t work) {
  fsdp_view_t v;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
    sink = compute(&v, (size_t)(unit_rows[k] * unit_cols), work);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int k = N_UNITS - 1; k >= 0; k--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    sink = compute(&v, (size_t)(unit_rows[k] * unit_cols), work);
    for (int64_t i = 0; i < unit_rows[k] * unit_cols; i++) v.grad[0][i] += 1.0f;
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
}

START_TEST(init_independent_of_world) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  size_t local = 0, total = 0, numel = 0;
  for (int k = 0; k < N_UNITS; k++) {
    size_t n = (size_t)(unit_rows[k] * unit_cols);
    float *w = malloc(n * sizeof(float));
    ck_assert_int_eq(fsdp_engine_read_tensor(e, names[k][0], w, -1), FSDP_SUCCESS);
    for (size_t i = 0; i < n; i++)
      ck_assert_float_eq(w[i], fsdp_init_value(2024, names[k][0], i, FSDP_INIT_NORMAL, 0.02f));
    free(w);
    fsdp_shard_t s;
    fsdp_unit_shard(e, k, &s);
    local += s.count;
    numel += n + (size_t)unit_rows[k];
  }
  /* The real elements of all shards tile the model exactly once (NO_SHARD: N times). */
  double l = (double)local, t;
  fsdp_all_reduce(fsdp_engine_comm(e), &l, &t, 1, FSDP_F64, FSDP_SUM, FSDP_HOST_STREAM);
  total = (size_t)t;
  ck_assert_uint_eq(total, c.strategy == FSDP_NO_SHARD ? numel * (size_t)nranks : numel);
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(load_from_root) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  int root = nranks - 1;
  size_t n = (size_t)(unit_rows[1] * unit_cols);
  float *w = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) w[i] = rank == root ? (float)i * 0.25f : -1.0f;
  ck_assert_int_eq(fsdp_engine_load_tensor(e, names[1][0], rank == root ? w : NULL, root),
                   FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[1][0], back, -1), FSDP_SUCCESS);
  for (size_t i = 0; i < n; i++) ck_assert_float_eq(back[i], (float)i * 0.25f);
  /* The unit's acquired view shows the loaded weights on every rank. */
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, 0, FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_release(e, 0, FSDP_FORWARD), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_acquire(e, 1, FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_float_eq(v.param[0][n - 1], (float)(n - 1) * 0.25f);
  ck_assert_int_eq(fsdp_unit_release(e, 1, FSDP_FORWARD), FSDP_SUCCESS);
  free(w);
  free(back);
  fsdp_engine_destroy(e);
}
END_TEST

/* ZeRO-3: gathered bytes never exceed (depth + 1) x the largest unit; persistent
 * bytes are 16 per parameter / N up to padding. ZeRO-2 holds every unit between
 * forward and backward; NO_SHARD keeps 16 bytes per parameter on every rank. */
START_TEST(memory) {
  static const struct { fsdp_strategy_t s; int depth; } cases[] = {
      {FSDP_FULL_SHARD, 0}, {FSDP_FULL_SHARD, 1}, {FSDP_FULL_SHARD, 2},
      {FSDP_SHARD_GRAD_OP, 1}, {FSDP_NO_SHARD, 1}};
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = cases[_i].s;
  c.prefetch_depth = cases[_i].depth;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  size_t largest = 0, all = 0, params = 0;
  for (int k = 0; k < N_UNITS; k++) {
    fsdp_unit_info_t info;
    fsdp_unit_info(e, k, &info);
    size_t b = info.padded_numel * sizeof(float);
    largest = b > largest ? b : largest;
    all += b;
    params += info.numel;
  }
  run_step(e, 1);
  run_step(e, 1);
  fsdp_mem_stats_t m;
  fsdp_engine_memory(e, &m);
  size_t shards = c.strategy == FSDP_NO_SHARD ? 1 : (size_t)nranks;
  double ideal = 16.0 * (double)params / (double)shards;
  double padding = 16.0 * N_UNITS * (double)(nranks * c.align) / (double)shards;
  ck_assert_msg(m.persistent >= ideal && m.persistent <= ideal + padding,
                "persistent %zu bytes, 16P/N = %.0f (+%.0f padding)", m.persistent, ideal,
                padding);
  if (nranks == 1 || c.strategy == FSDP_NO_SHARD)
    ck_assert_uint_eq(m.gathered_params_peak, 0); /* views read the whole master */
  else if (c.strategy == FSDP_FULL_SHARD)
    ck_assert_msg(m.gathered_params_peak <= (size_t)(c.prefetch_depth + 1) * largest,
                  "gathered peak %zu > (%d+1) x %zu", m.gathered_params_peak,
                  c.prefetch_depth, largest);
  else
    ck_assert_uint_eq(m.gathered_params_peak, all);
  ck_assert_uint_le(m.grads_in_flight_peak, 3 * largest);
  ck_assert_uint_eq(m.gathered_params, 0); /* everything freed after the step */
  fsdp_engine_destroy(e);
}
END_TEST

static const fsdp_tl_event_t *find(const fsdp_tl_event_t *tl, size_t n, fsdp_tl_kind_t kind,
                                   int unit, fsdp_pass_t pass) {
  for (size_t i = 0; i < n; i++)
    if (tl[i].kind == kind && tl[i].unit == unit && tl[i].pass == pass) return &tl[i];
  return NULL;
}

/* With prefetch, the gather of unit i+1 starts before the compute of unit i
 * ends (its release); without, only after. */
START_TEST(overlap) {
  int depth = _i;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.prefetch_depth = depth;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  run_step(e, 1); /* warm-up: first-touch of buffers, MPI connections */
  fsdp_engine_timeline_clear(e);
  run_step(e, 16000000);
  size_t n;
  const fsdp_tl_event_t *tl = NULL;
  ck_assert_int_eq(fsdp_engine_timeline(e, &tl, &n, NULL), FSDP_SUCCESS);
  /* With prefetch the gather of unit k+1 is queued before unit k's compute and
   * starts as soon as the gather thread runs: it must be seen overlapping at
   * least once (every time, unless a loaded machine delays the thread past the
   * compute). Without prefetch it cannot start before the release: every time. */
  int overlapped = 0;
  for (int k = 0; nranks > 1 && k + 1 < N_UNITS; k++) { /* one rank gathers nothing */
    const fsdp_tl_event_t *g = find(tl, n, FSDP_TL_ALL_GATHER, k + 1, FSDP_FORWARD);
    const fsdp_tl_event_t *r = find(tl, n, FSDP_TL_RELEASE, k, FSDP_FORWARD);
    ck_assert_ptr_nonnull(g);
    ck_assert_ptr_nonnull(r);
    overlapped += g->t_begin < r->t_begin;
    if (depth == 0)
      ck_assert_msg(g->t_begin >= r->t_end, "depth 0: gather of unit %d began before unit %d "
                    "was released", k + 1, k);
  }
  if (depth > 0 && nranks > 1)
    ck_assert_msg(overlapped > 0, "depth %d: no gather started before the previous unit's "
                  "compute ended", depth);
  /* The first reduction of the backward finds its stream idle and starts at its
   * unit's release, under the next unit's compute. (Later ones queue behind the
   * previous collective, which waits for the slowest rank, so skew can delay
   * them: not asserted.) One rank with one micro-batch reduces nothing:
   * backward adds into its gradient shards. */
  const fsdp_tl_event_t *rs = find(tl, n, FSDP_TL_REDUCE, N_UNITS - 1, FSDP_BACKWARD);
  const fsdp_tl_event_t *next = find(tl, n, FSDP_TL_RELEASE, N_UNITS - 2, FSDP_BACKWARD);
  if (nranks == 1) {
    ck_assert_ptr_null(rs);
    fsdp_engine_destroy(e);
    return;
  }
  ck_assert_ptr_nonnull(rs);
  ck_assert_ptr_nonnull(next);
  ck_assert_msg(rs->t_begin < next->t_begin, "the reduction of unit %d did not overlap the "
                "backward of unit %d", N_UNITS - 1, N_UNITS - 2);
  fsdp_engine_destroy(e);
}
END_TEST

/* Beyond max_live_units held units the acquire is refused, not deadlocked, and
 * the engine carries on. (One rank gathers nothing, so there is no cap.) */
START_TEST(live_cap) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.prefetch_depth = 0;
  c.max_live_units = 1;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, 0, FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_acquire(e, 1, FSDP_FORWARD, &v), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "max_live_units"));
  ck_assert_int_eq(fsdp_unit_release(e, 0, FSDP_FORWARD), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  c.max_live_units = 0;
  e = make_engine(&c, names);
  run_step(e, 1);
  fsdp_engine_destroy(e);
}
END_TEST

/* ZeRO-2 keeps every unit gathered from forward to backward: a written
 * fsdp_unit_shard_release then would leave the gathered copy with the old
 * values, so it is refused; after the step (gathers dropped) it goes through. */
START_TEST(shard_release_gathered) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = FSDP_SHARD_GRAD_OP;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  fsdp_view_t v;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
  }
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, 0, &s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, 0, 1), FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "'block.0.w'") && strstr(fsdp_last_error(), "gathered"),
                "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_unit_shard_release(e, 0, 0), FSDP_SUCCESS);
  for (int k = N_UNITS - 1; k >= 0; k--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard(e, 0, &s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, 0, 1), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

/* fsdp_engine_check_consistency: equal settings pass; one rank's other value
 * fails on every rank with the key and each rank's value; and materialize
 * compares the plans by itself: the last rank's third unit has another shape. */
START_TEST(consistency) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  const char *keys[3] = {"--seed", "--lr", "--data"};
  const char *same[3] = {"1", "0.002", "text.txt"};
  ck_assert_int_eq(fsdp_engine_check_consistency(e, 3, keys, same), FSDP_SUCCESS);
  const char *mine[3] = {"1", rank == nranks - 1 ? "0.01" : "0.002", "text.txt"};
  ck_assert_int_eq(fsdp_engine_check_consistency(e, 3, keys, mine), FSDP_ERR_INVALID_USAGE);
  char want[160];
  if (nranks == 2) snprintf(want, sizeof want, "--lr: rank 0 has 0.002, rank 1 has 0.01");
  else snprintf(want, sizeof want, "--lr: ranks 0-%d have 0.002, rank %d has 0.01", nranks - 2,
                nranks - 1);
  ck_assert_msg(strstr(fsdp_last_error(), want), "'%s' lacks '%s'", fsdp_last_error(), want);
  for (int k = 0; k < 3; k++) {
    char name[24];
    snprintf(name, sizeof name, "u%d.w", k);
    int64_t rows = k == 2 && rank == nranks - 1 ? 9 : 8;
    fsdp_tensor_desc_t t = {name, 2, {rows, 4}, FSDP_INIT_NORMAL, 0.02f, 0};
    fsdp_unit_t u;
    ck_assert_int_eq(fsdp_unit_add(e, name, "Block", &t, 1, &u), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "engine.unit[2].tensor[0]: ") &&
                strstr(fsdp_last_error(), " u2.w 8x4, rank") &&
                strstr(fsdp_last_error(), " has u2.w 9x4"), "%s", fsdp_last_error());
  fsdp_engine_destroy(e);
}
END_TEST

/* A rank whose own part fails before any exchange (here: it passes no
 * settings array, as a caller whose list could not be built would) fails
 * the check on every rank at once, the others naming that rank and its
 * reason, instead of leaving them in the comparison until the deadline. */
START_TEST(consistency_local_failure) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  const char *keys[2] = {"--seed", "--lr"}, *values[2] = {"1", "0.002"};
  const int bad = nranks - 1;
  double t0 = fsdp_time_now();
  fsdp_status_t st = fsdp_engine_check_consistency(e, 2, keys, rank == bad ? NULL : values);
  double took = fsdp_time_now() - t0;
  ck_assert_int_eq(st, FSDP_ERR_INVALID_ARGUMENT);
  char want[64];
  snprintf(want, sizeof want, "rank %d", bad);
  ck_assert_msg(rank == bad || (strstr(fsdp_last_error(), want) &&
                                strstr(fsdp_last_error(), "2 settings with keys")),
                "rank %d: '%s' lacks '%s' and the reason", rank, fsdp_last_error(), want);
  ck_assert_msg(took < fsdp_world_timeout(world) / 2, "rank %d waited %.1f s", rank, took);
  ck_assert_int_eq(fsdp_engine_check_consistency(e, 2, keys, values), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

/* A rank that built no model at all (a flag that yields zero layers) is a plan
 * mismatch like any other: every rank fails at once, naming it, instead of
 * that rank returning early and the others waiting in the comparison until
 * the collective deadline. */
START_TEST(consistency_rank_without_units) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t = {"u0.w", 2, {8, 4}, FSDP_INIT_NORMAL, 0.02f, 0};
  fsdp_unit_t u;
  if (rank != nranks - 1) ck_assert_int_eq(fsdp_unit_add(e, "u0", "Block", &t, 1, &u), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "engine.unit[0]") &&
                strstr(fsdp_last_error(), "nothing (its list of settings ends earlier)"), "%s",
                fsdp_last_error());
  fsdp_engine_destroy(e);
}
END_TEST

/* 1 when the timeline holds a gather of `unit` in `pass`. */
static int gathered(fsdp_engine_t e, int unit, fsdp_pass_t pass) {
  const fsdp_tl_event_t *ev;
  size_t n;
  ck_assert_int_eq(fsdp_engine_timeline(e, &ev, &n, NULL), FSDP_SUCCESS);
  for (size_t i = 0; i < n; i++)
    if (ev[i].kind == FSDP_TL_ALL_GATHER && ev[i].unit == unit && ev[i].pass == pass) return 1;
  return 0;
}

/* FSDP_CONFIG_INIT with a root unit (0) held across the others, as tied
 * embeddings are: while block k computes, block k + 1 is already gathered
 * (fsdp_engine_timeline waits for the gather stream, so a prefetch issued at
 * the acquire of k is on the timeline before k + 1 is acquired), in forward
 * and in backward, and three units' parameters are live at the peak. */
START_TEST(prefetch_under_a_held_root) {
  if (nranks == 1) return; /* one rank gathers nothing */
  fsdp_config_t c = FSDP_CONFIG_INIT;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine(&c, names);
  fsdp_view_t v;
  for (int step = 0; step < 2; step++) {
    fsdp_engine_timeline_clear(e);
    ck_assert_int_eq(fsdp_unit_acquire(e, 0, FSDP_FORWARD, &v), FSDP_SUCCESS);
    for (int k = 1; k < N_UNITS; k++) {
      ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
      if (k + 1 < N_UNITS)
        ck_assert_msg(gathered(e, k + 1, FSDP_FORWARD), "step %d: no prefetch of unit %d "
                      "while unit %d computes under the held root", step, k + 1, k);
      ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
    }
    ck_assert_int_eq(fsdp_unit_release(e, 0, FSDP_FORWARD), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_acquire(e, 0, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    for (int k = N_UNITS - 1; k >= 1; k--) {
      ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
      if (k > 1)
        ck_assert_msg(gathered(e, k - 1, FSDP_BACKWARD), "step %d: no prefetch of unit %d in "
                      "backward while unit %d computes under the held root", step, k - 1, k);
      ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
    }
    ck_assert_int_eq(fsdp_unit_release(e, 0, FSDP_BACKWARD), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  fsdp_mem_stats_t m;
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  fsdp_unit_info_t info[N_UNITS];
  size_t root_and_two = 0, largest = 0;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_info(e, k, &info[k]), FSDP_SUCCESS);
    if (k > 0 && info[k].padded_numel > largest) largest = info[k].padded_numel;
  }
  root_and_two = info[0].padded_numel + info[1].padded_numel + info[2].padded_numel;
  ck_assert_uint_ge(m.gathered_params_peak, root_and_two * sizeof(float));
  /* The pool grew by one slot for the one unit held: prefetch_depth + 1 + 1. */
  size_t max_padded = largest > info[0].padded_numel ? largest : info[0].padded_numel;
  ck_assert_uint_eq(m.param_pool, 3 * max_padded * sizeof(float));
  fsdp_engine_destroy(e);
}
END_TEST

/* ---- per-unit options (fsdp_unit_add_opts) -------------------------------- */

/* Gathers of `unit` on the timeline since it was last cleared. */
static int gathers_of(fsdp_engine_t e, int unit) {
  const fsdp_tl_event_t *ev;
  size_t n;
  int count = 0;
  ck_assert_int_eq(fsdp_engine_timeline(e, &ev, &n, NULL), FSDP_SUCCESS);
  for (size_t i = 0; i < n; i++) count += ev[i].kind == FSDP_TL_ALL_GATHER && ev[i].unit == unit;
  return count;
}

/* Every tensor of every unit, concatenated. */
static float *read_all(fsdp_engine_t e, char names[][2][24], size_t *n) {
  size_t total = 0;
  for (int k = 0; k < N_UNITS; k++) total += (size_t)(unit_rows[k] * (unit_cols + 1));
  float *all = malloc(total * sizeof(float)), *p = all;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_engine_read_tensor(e, names[k][0], p, -1), FSDP_SUCCESS);
    p += unit_rows[k] * unit_cols;
    ck_assert_int_eq(fsdp_engine_read_tensor(e, names[k][1], p, -1), FSDP_SUCCESS);
    p += unit_rows[k];
  }
  *n = total;
  return all;
}

/* Under ZeRO-3, unit 1 as ZeRO-2 (reshard_after_forward 0): gathered once per
 * step, kept from forward to backward in a buffer of its own (the memory
 * accounting says so), and the trajectory is ZeRO-3's bit for bit. */
START_TEST(unit_reshard_choice) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.max_live_units = 2;
  fsdp_unit_opts_t o[N_UNITS] = {FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT,
                                 FSDP_UNIT_OPTS_INIT};
  o[1].reshard_after_forward = 0;
  char names[N_UNITS][2][24];
  fsdp_engine_t mixed = make_engine_opts(&c, names, o), plain = make_engine(&c, names);
  fsdp_unit_info_t info[N_UNITS];
  size_t largest_other = 0;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_info(mixed, k, &info[k]), FSDP_SUCCESS);
    ck_assert_int_eq(info[k].reshard_after_forward, k != 1);
    if (k != 1 && info[k].padded_numel > largest_other) largest_other = info[k].padded_numel;
  }
  fsdp_engine_timeline_clear(mixed);
  for (int s = 0; s < 2; s++) {
    run_step(mixed, 1);
    run_step(plain, 1);
  }
  fsdp_mem_stats_t m;
  ck_assert_int_eq(fsdp_engine_memory(mixed, &m), FSDP_SUCCESS);
  if (nranks > 1) {
    ck_assert_int_eq(gathers_of(mixed, 1), 2); /* once per step */
    ck_assert_int_eq(gathers_of(mixed, 2), 4); /* forward and backward */
    ck_assert_uint_eq(m.param_pool, (info[1].padded_numel + 2 * largest_other) * sizeof(float));
  } else {
    ck_assert_uint_eq(m.param_pool, 0); /* one rank gathers nothing */
  }
  size_t n;
  float *a = read_all(mixed, names, &n), *b = read_all(plain, names, &n);
  ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0, "per-unit ZeRO-2 changed the result");
  free(a);
  free(b);
  fsdp_engine_destroy(mixed);
  fsdp_engine_destroy(plain);
}
END_TEST

/* bf16 parameters with unit 0 kept in f32: its views show the master values
 * exactly while unit 1's are rounded to bf16; only bf16 units cost a bf16
 * copy (2 bytes per shard element). */
START_TEST(unit_dtype_choice) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.param_dtype = FSDP_BF16;
  fsdp_unit_opts_t o[N_UNITS] = {FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT,
                                 FSDP_UNIT_OPTS_INIT};
  o[0].param_dtype = FSDP_F32;
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine_opts(&c, names, o);
  size_t lp = 0;
  for (int k = 0; k < N_UNITS; k++) {
    fsdp_unit_info_t info;
    ck_assert_int_eq(fsdp_unit_info(e, k, &info), FSDP_SUCCESS);
    ck_assert_int_eq(info.param_dtype, k == 0 ? FSDP_F32 : FSDP_BF16);
    if (k) lp += info.shard_numel * 2 + (nranks == 1 ? info.shard_numel * 4 : 0);
  }
  fsdp_mem_stats_t m;
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  ck_assert_uint_eq(m.param_copy, lp);
  size_t n0 = (size_t)(unit_rows[0] * unit_cols), n1 = (size_t)(unit_rows[1] * unit_cols);
  float *w0 = malloc(n0 * sizeof(float)), *w1 = malloc(n1 * sizeof(float));
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[0][0], w0, -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[1][0], w1, -1), FSDP_SUCCESS);
  fsdp_view_t v;
  int inexact = 0;
  ck_assert_int_eq(fsdp_unit_acquire(e, 0, FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(v.dtype, FSDP_F32);
  ck_assert(memcmp(v.param[0], w0, n0 * sizeof(float)) == 0);
  ck_assert_int_eq(fsdp_unit_release(e, 0, FSDP_FORWARD), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_acquire(e, 1, FSDP_FORWARD, &v), FSDP_SUCCESS);
  for (size_t i = 0; i < n1; i++) {
    ck_assert(v.param[0][i] == fsdp_bf16_to_f32(fsdp_f32_to_bf16(w1[i])));
    inexact += v.param[0][i] != w1[i];
  }
  ck_assert_int_gt(inexact, 0);
  ck_assert_int_eq(fsdp_unit_release(e, 1, FSDP_FORWARD), FSDP_SUCCESS);
  free(w0);
  free(w1);
  fsdp_engine_destroy(e);
}
END_TEST

/* Parameter groups: SGD without momentum, every gradient 1. Tensor t of unit
 * 2 moves by lr * lr_mult[t] * (1 + wd * wd_mult[t] * p) exactly as the
 * optimizer computes it; the bias is no_decay whatever its wd_mult. */
START_TEST(unit_param_groups) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.momentum = 0.0f;
  c.optim.lr = 0.125f;
  c.optim.weight_decay = 0.25f;
  c.grad_reduce = FSDP_SUM;
  static const float lr_mult[2] = {2.0f, 0.5f}, wd_mult[2] = {0.5f, 3.0f};
  fsdp_unit_opts_t o[N_UNITS] = {FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT, FSDP_UNIT_OPTS_INIT,
                                 FSDP_UNIT_OPTS_INIT};
  o[2].lr_mult = lr_mult;
  o[2].wd_mult = wd_mult;
  o[3].lr_mult = (const float[2]){0.0f, 0.0f}; /* frozen */
  char names[N_UNITS][2][24];
  fsdp_engine_t e = make_engine_opts(&c, names, o);
  size_t n = (size_t)(unit_rows[2] * (unit_cols + 1));
  float *before = malloc(2 * n * sizeof(float)), *after = before + n;
  size_t nw = (size_t)(unit_rows[2] * unit_cols);
  fsdp_tensor_info_t ti;
  ck_assert_int_eq(fsdp_unit_tensor(e, 2, 0, &ti), FSDP_SUCCESS);
  ck_assert(ti.lr_mult == 2.0f && ti.wd_mult == 0.5f);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[2][0], before, -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[2][1], before + nw, -1), FSDP_SUCCESS);
  float *frozen0 = malloc(2 * (size_t)unit_rows[3] * sizeof(float)),
        *frozen1 = frozen0 + unit_rows[3];
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[3][1], frozen0, -1), FSDP_SUCCESS);
  fsdp_view_t v;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int k = N_UNITS - 1; k >= 0; k--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    for (int64_t i = 0; i < unit_rows[k] * unit_cols; i++) v.grad[0][i] = 1.0f / (float)nranks;
    for (int64_t i = 0; i < unit_rows[k]; i++) v.grad[1][i] = 1.0f / (float)nranks;
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[2][0], after, -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[2][1], after + nw, -1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, names[3][1], frozen1, -1), FSDP_SUCCESS);
  for (size_t i = 0; i < n; i++) {
    int w = i < nw;
    float g = 1.0f / (float)nranks * (float)nranks; /* the sum of the ranks' gradients */
    float lr = c.optim.lr * lr_mult[!w], wd = w ? c.optim.weight_decay * wd_mult[0] : 0.0f;
    float want = before[i] - lr * (g + wd * before[i]);
    ck_assert_msg(after[i] == want, "element %zu: %.9g, want %.9g", i, (double)after[i],
                  (double)want);
  }
  ck_assert(memcmp(frozen0, frozen1, (size_t)unit_rows[3] * sizeof(float)) == 0);
  free(before);
  free(frozen0);
  fsdp_engine_destroy(e);
}
END_TEST

/* Per-unit options that differ between ranks would issue different
 * collectives: materialize's plan comparison names the unit and the values. */
START_TEST(unit_opts_must_agree) {
  if (nranks == 1) return;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t = {"x.w", 1, {8}, FSDP_INIT_ZEROS, 0.0f, 0};
  fsdp_unit_opts_t o = FSDP_UNIT_OPTS_INIT;
  o.reshard_after_forward = rank == nranks - 1 ? 0 : 1;
  fsdp_unit_t u;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, &t, 1, &o, &u), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_ERR_INVALID_USAGE);
  char want[64];
  snprintf(want, sizeof want, "rank %d has reshard_after_forward 0", nranks - 1);
  ck_assert_msg(strstr(fsdp_last_error(), "engine.unit[0].opts: ") &&
                strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  fsdp_engine_destroy(e);
}
END_TEST

/* Bad options fail at the call, name the unit and field, and add nothing. */
START_TEST(unit_opts_refused) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t[1] = {{"x.w", 1, {8}, FSDP_INIT_ZEROS, 0.0f, 0}};
  fsdp_unit_t u;
  fsdp_unit_opts_t raw = {0}, o = FSDP_UNIT_OPTS_INIT;
  raw.size = sizeof raw;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &raw, &u), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "FSDP_UNIT_OPTS_INIT"));
  o.reshard_after_forward = 2;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &o, &u), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "unit 'x': reshard_after_forward 2"));
  o.reshard_after_forward = -1;
  o.param_dtype = FSDP_F64;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &o, &u), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "unit 'x': param_dtype f64"));
  o.param_dtype = FSDP_DTYPE_UNSET;
  o.wd_mult = (const float[1]){NAN};
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &o, &u), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "unit 'x': wd_mult[0] (tensor 'x.w') is nan"));
  o.wd_mult = NULL;
  o.lr_mult = (const float[1]){-1.0f};
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &o, &u), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "lr_mult[0] (tensor 'x.w') is -1"));
  ck_assert_int_eq(fsdp_engine_num_units(e), 0);
  o.lr_mult = NULL;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "x", NULL, t, 1, &o, &u), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

static Suite *engine_suite(void) {
  Suite *s = suite_create("engine-mpi");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, init_independent_of_world, 0, 3);
  tcase_add_loop_test(tc, load_from_root, 0, 3);
  tcase_add_loop_test(tc, memory, 0, 5);
  tcase_add_loop_test(tc, overlap, 0, 2);
  tcase_add_test(tc, live_cap);
  tcase_add_test(tc, shard_release_gathered);
  tcase_add_test(tc, consistency);
  tcase_add_test(tc, consistency_rank_without_units);
  tcase_add_test(tc, consistency_local_failure);
  tcase_add_test(tc, prefetch_under_a_held_root);
  tcase_add_test(tc, unit_reshard_choice);
  tcase_add_test(tc, unit_dtype_choice);
  tcase_add_test(tc, unit_param_groups);
  tcase_add_test(tc, unit_opts_refused);
  tcase_add_test(tc, unit_opts_must_agree);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
  return mpi_check_run(engine_suite());
}
