/* tests/unit/test_engine.c — the engine on a one-rank world (no MPI): every
 * usage error returns a clear message and leaves the engine usable; one step of
 * SGD and AdamW matches a reference written out here; padding is never visible;
 * memory follows the ZeRO formulas. */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "common/solo_world.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;

static void setup(void) { ck_assert_int_eq(solo_world_init(&world), FSDP_SUCCESS); }
static void teardown(void) { fsdp_world_destroy(world); }

static fsdp_tensor_desc_t desc2(const char *name, int64_t a, int64_t b) {
  fsdp_tensor_desc_t d = {name, 2, {a, b, 0, 0}, FSDP_INIT_NORMAL, 0.5f, 0};
  return d;
}
static fsdp_tensor_desc_t desc1(const char *name, int64_t a) {
  fsdp_tensor_desc_t d = {name, 1, {a, 0, 0, 0}, FSDP_INIT_UNIFORM, 0.1f, 1};
  return d;
}

/* Three units of prime-sized tensors: "u0" {w0 (7,5), b0 (7)}, "u1" {w1 (3,7)},
 * "u2" {w2 (2,3), b2 (2)}. */
static fsdp_engine_t make_engine(const fsdp_config_t *cfg, fsdp_unit_t *units) {
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, cfg, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t0[] = {desc2("w0", 7, 5), desc1("b0", 7)};
  fsdp_tensor_desc_t t1[] = {desc2("w1", 3, 7)};
  fsdp_tensor_desc_t t2[] = {desc2("w2", 2, 3), desc1("b2", 2)};
  ck_assert_int_eq(fsdp_unit_add(e, "u0", "Linear", t0, 2, &units[0]), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_add(e, "u1", "Linear", t1, 1, &units[1]), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_add(e, "u2", "Linear", t2, 2, &units[2]), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 42), FSDP_SUCCESS);
  return e;
}

/* A pass with no arithmetic: grads get `g` everywhere. */
static void run_pass(fsdp_engine_t e, const fsdp_unit_t *u, int n, float g) {
  fsdp_view_t v;
  for (int i = 0; i < n; i++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int i = n - 1; i >= 0; i--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_BACKWARD, &v), FSDP_SUCCESS);
    ck_assert_ptr_nonnull(v.grad);
    /* tensor sizes of the fixture */
    static const size_t sizes[3][2] = {{35, 7}, {21, 0}, {6, 2}};
    for (int t = 0; t < v.n; t++)
      for (size_t k = 0; k < sizes[u[i]][t]; k++) v.grad[t][k] += g;
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_BACKWARD), FSDP_SUCCESS);
  }
}

#define ck_error(call, status, needle)                                              \
  do {                                                                              \
    ck_assert_int_eq((call), (status));                                             \
    ck_assert_msg(strstr(fsdp_last_error(), (needle)) != NULL,                      \
                  "message '%s' lacks '%s'", fsdp_last_error(), (needle));          \
  } while (0)

START_TEST(config_errors) {
  static const struct { int field; const char *needle; } cases[] = {
      {0, "strategy"}, {1, "prefetch_depth"}, {2, "max_live_units"}, {3, "grad_accum"},
      {4, "grad_reduce"}, {5, "align"}, {6, "lr"}, {7, "param_dtype"},
      {8, "max_consecutive_skips"}, {9, "loss_scale_init"}, {10, "loss_scale_growth"},
      {11, "loss_scale_backoff"}, {12, "loss_scale_interval"}, {13, "loss_scale_backoff"},
      {14, "config.shard_size -1 is negative"},
      {15, "config.shard_size 2 does not divide the world of 1 ranks"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    switch (cases[i].field) {
      case 0: c.strategy = (fsdp_strategy_t)7; break;
      case 1: c.prefetch_depth = -1; break;
      case 2: c.max_live_units = -2; break;
      case 3: c.grad_accum = 0; break;
      case 4: c.grad_reduce = FSDP_MAX; break;
      case 5: c.align = 12; break;
      case 6: c.optim.lr = -1.0f; break;
      case 7: c.param_dtype = FSDP_F64; break;
      case 8: c.max_consecutive_skips = -1; break;
      case 9: c.loss_scale_init = NAN; break;
      case 10: c.loss_scale_growth = 0.5; break;
      case 11: c.loss_scale_backoff = 0.0; break;
      case 12: c.loss_scale_interval = 0; break;
      case 13: c.loss_scale_backoff = 1.5; break;
      case 14: c.shard_size = -1; break;
      case 15: c.shard_size = 2; break;
    }
    fsdp_engine_t e = NULL;
    ck_assert_int_ne(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
    ck_assert_msg(strstr(fsdp_last_error(), cases[i].needle), "case %zu: '%s'", i,
                  fsdp_last_error());
    ck_assert_ptr_null(e);
  }
}
END_TEST

/* A program compiled against an older header passes a smaller config: every
 * field past its size takes its default, whatever the memory there holds. The
 * "old header" here ends before reduce_dtype and comm_backend. */
START_TEST(config_from_older_header_gets_defaults) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.size = offsetof(fsdp_config_t, reduce_dtype);
  c.strategy = FSDP_SHARD_GRAD_OP;
  c.grad_accum = 3;
  c.reduce_dtype = (fsdp_dtype_t)77;          /* beyond the old size: never read */
  c.comm_backend = "no such backend";         /* beyond the old size: never read */
  c.shard_size = 99;                          /* beyond the old size: never read */
  fsdp_engine_t e = NULL;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  const fsdp_config_t *got = fsdp_engine_config(e);
  ck_assert_int_eq(got->shard_size, 1); /* resolved: the world of one */
  ck_assert_int_eq(got->strategy, FSDP_SHARD_GRAD_OP);
  ck_assert_int_eq(got->grad_accum, 3);
  ck_assert_int_eq(got->reduce_dtype, FSDP_F32);
  ck_assert_ptr_null(got->comm_backend);
  ck_assert_uint_eq(got->size, sizeof(fsdp_config_t));
  fsdp_engine_destroy(e);

  /* The old caller's out is as short as its cfg: resolve writes its fields
   * and nothing past them (the engine above ran with the defaults there). */
  fsdp_config_t out;
  memset(&out, 0xab, sizeof out);
  ck_assert_int_eq(fsdp_config_resolve(&c, &out), FSDP_SUCCESS);
  ck_assert_uint_eq(out.size, c.size);
  ck_assert_int_eq(out.strategy, FSDP_SHARD_GRAD_OP);
  ck_assert_int_eq(out.grad_accum, 3);
  const unsigned char *past = (const unsigned char *)&out + c.size;
  size_t untouched = 0, n = sizeof out - c.size;
  for (size_t i = 0; i < n; i++) untouched += past[i] == 0xab;
  ck_assert_uint_eq(untouched, n);
}
END_TEST

/* A caller compiled before the guard's stats fields (its config ends before
 * max_consecutive_skips) has a shorter fsdp_step_stats_t: nothing past the
 * fields it knows is written. A current caller gets them all. */
START_TEST(step_stats_of_an_older_header) {
  for (int old = 1; old >= 0; old--) {
    fsdp_config_t c = FSDP_CONFIG_INIT;
    if (old) c.size = offsetof(fsdp_config_t, max_consecutive_skips);
    fsdp_unit_t u[3];
    fsdp_engine_t e = make_engine(&c, u);
    fsdp_step_stats_t st;
    memset(&st, 0xab, sizeof st);
    run_pass(e, u, 3, 1.0f);
    ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
    ck_assert_int_eq(st.step, 1);
    const unsigned char *tail = (const unsigned char *)&st + offsetof(fsdp_step_stats_t, skipped);
    size_t untouched = 0, n = sizeof st - offsetof(fsdp_step_stats_t, skipped);
    for (size_t i = 0; i < n; i++) untouched += tail[i] == 0xab;
    if (old) ck_assert_uint_eq(untouched, n);
    else ck_assert(st.skipped == 0 && st.skipped_total == 0 && st.loss_scale == 1.0);
    fsdp_engine_destroy(e);
  }
}
END_TEST

/* Unset values resolve by dtype: fp16 scales the loss from 65536, the others
 * not at all; the engine starts at that scale. */
START_TEST(config_loss_scale_defaults) {
  fsdp_config_t c = FSDP_CONFIG_INIT, out;
  c.param_dtype = FSDP_F16;
  ck_assert_int_eq(fsdp_config_resolve(&c, &out), FSDP_SUCCESS);
  ck_assert(out.loss_scale_init == 65536.0 && out.loss_scale_growth == 2.0 &&
            out.loss_scale_backoff == 0.5 && out.loss_scale_interval == 2000);
  ck_assert_int_eq(out.max_consecutive_skips, 20);
  c.param_dtype = FSDP_BF16;
  ck_assert_int_eq(fsdp_config_resolve(&c, &out), FSDP_SUCCESS);
  ck_assert(out.loss_scale_init == 1.0);
  fsdp_engine_t e;
  c.param_dtype = FSDP_F16;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  ck_assert(fsdp_engine_loss_scale(e) == 65536.0);
  fsdp_engine_destroy(e);
  ck_assert(fsdp_engine_loss_scale(NULL) == -1.0);
}
END_TEST

/* Unit options from an older header that ended before the multipliers: they
 * take their defaults (1), whatever the caller's memory holds there. */
START_TEST(unit_opts_from_older_header) {
  fsdp_engine_t e = NULL;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_unit_opts_t o = FSDP_UNIT_OPTS_INIT;
  o.size = offsetof(fsdp_unit_opts_t, lr_mult);
  o.reshard_after_forward = 0;
  o.lr_mult = (const float[1]){-5.0f}; /* beyond the old size: never read */
  fsdp_tensor_desc_t t = {"w", 1, {4}, FSDP_INIT_ZEROS, 0.0f, 0};
  fsdp_unit_t u;
  ck_assert_int_eq(fsdp_unit_add_opts(e, "u", NULL, &t, 1, &o, &u), FSDP_SUCCESS);
  fsdp_tensor_info_t ti;
  fsdp_unit_info_t ui;
  ck_assert_int_eq(fsdp_unit_tensor(e, u, 0, &ti), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_info(e, u, &ui), FSDP_SUCCESS);
  ck_assert(ti.lr_mult == 1.0f && ti.wd_mult == 1.0f);
  ck_assert_int_eq(ui.reshard_after_forward, 0);
  ck_assert_int_eq(ui.param_dtype, FSDP_F32);
  fsdp_engine_destroy(e);
}
END_TEST

/* Not from FSDP_CONFIG_INIT, or from a newer header: refused, saying why. */
START_TEST(config_head_errors) {
  fsdp_config_t c = FSDP_CONFIG_INIT, out;
  c.magic = 0;
  fsdp_engine_t e = NULL;
  ck_error(fsdp_engine_create(world, &c, &e), FSDP_ERR_INVALID_ARGUMENT, "FSDP_CONFIG_INIT");
  ck_assert_ptr_null(e);
  c = (fsdp_config_t)FSDP_CONFIG_INIT;
  c.size = sizeof c + 8;
  ck_error(fsdp_config_resolve(&c, &out), FSDP_ERR_INVALID_ARGUMENT, "link against");
  c.size = 2;
  ck_error(fsdp_config_resolve(&c, &out), FSDP_ERR_INVALID_ARGUMENT, "damaged");
  ck_assert_int_eq(fsdp_get_version(), FSDP_VERSION_CODE);
}
END_TEST

/* Skips counted before a checkpoint load do not count after it: with K = 2, a
 * skip, a load (fsdp_engine_set_step), and a skip again is one in a row. */
START_TEST(skips_restart_after_a_load) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.max_consecutive_skips = 2;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  fsdp_step_stats_t st;
  run_pass(e, u, 3, 1.0f);
  ck_assert_int_eq(fsdp_engine_report_loss(e, NAN), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
  ck_assert_int_eq(st.consecutive_skips, 1);
  ck_assert_int_eq(fsdp_engine_set_step(e, fsdp_engine_step_count(e)), FSDP_SUCCESS);
  run_pass(e, u, 3, 1.0f);
  ck_assert_int_eq(fsdp_engine_report_loss(e, NAN), FSDP_SUCCESS);
  ck_assert_msg(fsdp_engine_step(e, &st) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(st.consecutive_skips, 1);
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(unit_add_errors) {
  fsdp_engine_t e;
  fsdp_unit_t u;
  ck_assert_int_eq(fsdp_engine_create(world, NULL, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t zero = desc2("z", 3, 0);
  ck_error(fsdp_unit_add(e, "a", NULL, &zero, 1, &u), FSDP_ERR_INVALID_ARGUMENT, "'z'");
  fsdp_tensor_desc_t dup[] = {desc1("x", 3), desc1("x", 4)};
  ck_error(fsdp_unit_add(e, "a", NULL, dup, 2, &u), FSDP_ERR_INVALID_ARGUMENT, "'x'");
  ck_error(fsdp_unit_add(e, "a", NULL, dup, 0, &u), FSDP_ERR_INVALID_ARGUMENT, "at least one");
  fsdp_tensor_desc_t bad_ndim = {"n", 5, {1, 1, 1, 1}, FSDP_INIT_ZEROS, 0, 0};
  ck_error(fsdp_unit_add(e, "a", NULL, &bad_ndim, 1, &u), FSDP_ERR_INVALID_ARGUMENT, "ndim");
  ck_assert_int_eq(fsdp_unit_add(e, "a", NULL, dup, 1, &u), FSDP_SUCCESS);
  ck_error(fsdp_unit_add(e, "b", NULL, dup, 1, &u), FSDP_ERR_INVALID_ARGUMENT,
           "already registered");
  ck_error(fsdp_unit_add(e, "a", NULL, &dup[1], 1, &u), FSDP_ERR_INVALID_ARGUMENT,
           "unit 'a' is already");
  fsdp_view_t v;
  ck_error(fsdp_unit_acquire(e, 0, FSDP_FORWARD, &v), FSDP_ERR_INVALID_USAGE, "materialize");
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "materialize");
  ck_error(fsdp_engine_set_step(e, 0), FSDP_ERR_INVALID_USAGE, "materialize");
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_SUCCESS);
  ck_error(fsdp_unit_add(e, "late", NULL, &dup[1], 1, &u), FSDP_ERR_INVALID_USAGE,
           "after fsdp_engine_materialize");
  ck_error(fsdp_engine_materialize(e, 1), FSDP_ERR_INVALID_USAGE, "twice");
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(schedule_errors) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  fsdp_view_t v;
  ck_error(fsdp_unit_acquire(e, u[1], FSDP_FORWARD, &v), FSDP_ERR_INVALID_USAGE, "out of order");
  ck_error(fsdp_unit_acquire(e, u[0], FSDP_BACKWARD, &v), FSDP_ERR_INVALID_USAGE,
           "without a complete forward");
  ck_error(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_ERR_INVALID_USAGE, "not acquired");
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "before backward");
  ck_error(fsdp_unit_acquire(e, 9, FSDP_FORWARD, &v), FSDP_ERR_INVALID_ARGUMENT, "does not exist");
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_error(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_ERR_INVALID_USAGE, "already acquired");
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "acquired");
  ck_error(fsdp_engine_read_tensor(e, "w0", NULL, -1), FSDP_ERR_INVALID_USAGE, "release");
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
  ck_error(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_ERR_INVALID_USAGE, "released twice");
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "middle of a forward");
  for (int i = 1; i < 3; i++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
  }
  ck_error(fsdp_unit_acquire(e, u[0], FSDP_BACKWARD, &v), FSDP_ERR_INVALID_USAGE,
           "expected 'u2'");
  ck_assert_int_eq(fsdp_unit_acquire(e, u[2], FSDP_BACKWARD, &v), FSDP_SUCCESS);
  ck_error(fsdp_unit_release(e, u[2], FSDP_FORWARD), FSDP_ERR_INVALID_USAGE, "not acquired");
  ck_assert_int_eq(fsdp_unit_release(e, u[2], FSDP_BACKWARD), FSDP_SUCCESS);
  ck_error(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_ERR_INVALID_USAGE,
           "middle of a backward");
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "middle of a backward");
  for (int i = 1; i >= 0; i--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_BACKWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_BACKWARD), FSDP_SUCCESS);
  }
  /* grad_accum is 1: a second backward before the step is refused */
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
  }
  ck_error(fsdp_unit_acquire(e, u[2], FSDP_BACKWARD, &v), FSDP_ERR_INVALID_USAGE, "grad_accum");
  /* After all those refusals the engine still trains. */
  fsdp_step_stats_t s;
  ck_assert_int_eq(fsdp_engine_step(e, &s), FSDP_SUCCESS);
  ck_assert_int_eq(s.step, 1);
  run_pass(e, u, 3, 1.0f);
  ck_assert_int_eq(fsdp_engine_step(e, &s), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(batch_errors) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.grad_accum = 3;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  int64_t mb, off;
  ck_error(fsdp_engine_shard_batch(e, 10, &mb, &off), FSDP_ERR_INVALID_ARGUMENT, "divisible");
  ck_assert_int_eq(fsdp_engine_shard_batch(e, 12, &mb, &off), FSDP_SUCCESS);
  ck_assert_int_eq(mb, 4);
  ck_assert_int_eq(off, 0);
  ck_error(fsdp_engine_load_tensor(e, "nope", NULL, 0), FSDP_ERR_INVALID_ARGUMENT, "'nope'");
  ck_error(fsdp_engine_load_tensor(e, "w0", NULL, 0), FSDP_ERR_INVALID_ARGUMENT, "no data");
  ck_error(fsdp_engine_load_tensor(e, "w0", NULL, 3), FSDP_ERR_INVALID_ARGUMENT, "root 3");
  fsdp_strategy_t s;
  ck_error(fsdp_strategy_parse("zero4", &s), FSDP_ERR_INVALID_ARGUMENT, "zero4");
  ck_assert_int_eq(fsdp_strategy_parse("shard_grad_op", &s), FSDP_SUCCESS);
  ck_assert_int_eq(s, FSDP_SHARD_GRAD_OP);
  fsdp_engine_destroy(e);
}
END_TEST

/* Nested root: backward follows the reverse of the forward release order. */
START_TEST(nested_root_order) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.max_live_units = 3;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
  for (int i = 1; i < 3; i++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
  ck_error(fsdp_unit_acquire(e, u[2], FSDP_BACKWARD, &v), FSDP_ERR_INVALID_USAGE,
           "expected 'u0'");
  /* the root stays acquired (its gradient buffer too) around the others */
  fsdp_view_t root;
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_BACKWARD, &root), FSDP_SUCCESS);
  root.grad[0][0] += 1.0f;
  for (int i = 2; i >= 1; i--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_BACKWARD, &v), FSDP_SUCCESS);
    ck_assert_ptr_ne(v.grad[0], root.grad[0]);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_float_eq(root.grad[0][0], 1.0f); /* nobody else was handed its buffer */
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "acquired");
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_BACKWARD), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

/* Materialised values are the documented pure function of (seed, name, index);
 * views show exactly the tensors, and padding stays zero through training. */
START_TEST(init_and_padding) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = (fsdp_strategy_t)_i;
  c.align = 64;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  float w0[35];
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "w0", w0, -1), FSDP_SUCCESS);
  for (int i = 0; i < 35; i++)
    ck_assert_float_eq(w0[i], fsdp_init_value(42, "w0", (size_t)i, FSDP_INIT_NORMAL, 0.5f));
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(v.n, 2);
  ck_assert_ptr_eq(v.param[1], v.param[0] + 35);
  ck_assert_float_eq(v.param[1][6], fsdp_init_value(42, "b0", 6, FSDP_INIT_UNIFORM, 0.1f));
  ck_assert_ptr_null(v.grad);
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
  fsdp_engine_destroy(e);

  c.optim.weight_decay = 0.1f;
  e = make_engine(&c, u);
  for (int step = 0; step < 3; step++) {
    run_pass(e, u, 3, 1.0f);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  for (int i = 0; i < 3; i++) {
    fsdp_shard_t s;
    ck_assert_int_eq(fsdp_unit_shard(e, u[i], &s), FSDP_SUCCESS);
    ck_assert_uint_eq(s.capacity % 64, 0);
    for (size_t k = s.count; k < s.capacity; k++) {
      ck_assert_float_eq(s.master[k], 0.0f);
      ck_assert_float_eq(s.m[k], 0.0f);
      ck_assert_float_eq(s.v[k], 0.0f);
    }
  }
  fsdp_engine_destroy(e);
}
END_TEST

/* fsdp_unit_shard_release on the CPU: the shard is the engine's own memory
 * (no host copies, what was written stays), a written release is refused
 * while the unit is acquired or holds gradients, and a bad unit is named. */
START_TEST(shard_release) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, u[1], &s), FSDP_SUCCESS);
  s.master[0] = 3.5f;
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[1], 1), FSDP_SUCCESS);
  size_t live = 1, peak = 1;
  ck_assert_int_eq(fsdp_engine_host_copy_bytes(e, &live, &peak), FSDP_SUCCESS);
  ck_assert_uint_eq(live, 0);
  ck_assert_uint_eq(peak, 0);
  float w1[21];
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "w1", w1, -1), FSDP_SUCCESS);
  ck_assert_float_eq(w1[0], 3.5f);
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[0], 1), FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "'u0'") && strstr(fsdp_last_error(), "acquired"), "%s",
                fsdp_last_error());
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[0], 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, 7, 0), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_engine_host_copy_bytes(NULL, &live, &peak), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_engine_destroy(e);
}
END_TEST

/* A written release is refused in the middle of a pass (a gather may read
 * the master shard it overwrites); after the step it goes through. (The
 * ZeRO-2 gathered copy kept for backward needs two ranks: tests/mpi.) */
START_TEST(shard_release_mid_pass) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  fsdp_view_t v;
  ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, u[1], &s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[1], 1), FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "'u1'") && strstr(fsdp_last_error(), "forward pass"),
                "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[1], 0), FSDP_SUCCESS);
  for (int i = 1; i < 3; i++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int i = 2; i >= 0; i--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_BACKWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard(e, u[0], &s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard_release(e, u[0], 1), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
}
END_TEST

/* One rank, grads of 1 everywhere: SGD and AdamW results written out by hand. */
START_TEST(step_numerics) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.lr = 0.5f;
  c.optim.momentum = 0.9f;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  float before[21], after[21];
  fsdp_engine_read_tensor(e, "w1", before, -1);
  for (int s = 0; s < 2; s++) {
    run_pass(e, u, 3, 1.0f);
    fsdp_step_stats_t st;
    ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
    /* 35+7+21+6+2 = 71 grads of 1 */
    ck_assert_double_eq_tol(st.grad_norm, sqrt(71.0), 1e-9);
  }
  fsdp_engine_read_tensor(e, "w1", after, -1);
  /* momentum buffer: 1 then 0.9*1+1 = 1.9; p -= 0.5*(1 + 1.9) */
  for (int i = 0; i < 21; i++)
    ck_assert_float_eq_tol(after[i], before[i] - 0.5f * 2.9f, 1e-6f);
  fsdp_engine_destroy(e);

  c = (fsdp_config_t)FSDP_CONFIG_INIT;
  c.optim.lr = 0.01f;
  c.optim.max_grad_norm = 1.0f;
  e = make_engine(&c, u);
  fsdp_engine_read_tensor(e, "w1", before, -1);
  run_pass(e, u, 3, 2.0f);
  fsdp_step_stats_t st;
  ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
  ck_assert_double_eq_tol(st.grad_norm, 2.0 * sqrt(71.0), 1e-9);
  ck_assert_double_eq_tol(st.clip_coef, 1.0 / (2.0 * sqrt(71.0) + 1e-6), 1e-12);
  fsdp_engine_read_tensor(e, "w1", after, -1);
  /* AdamW's first step moves every element by lr * g/(|g| + eps') ~ lr */
  for (int i = 0; i < 21; i++) ck_assert_float_eq_tol(after[i], before[i] - 0.01f, 1e-6f);
  fsdp_engine_destroy(e);
}
END_TEST

/* Two micro-batches with gradients 1 and 3: the step sees their mean (AVG) or
 * sum (SUM), whether each micro-batch is reduced or full grads are kept. */
START_TEST(accumulation) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.lr = 1.0f;
  c.grad_accum = 2;
  c.accumulate_full_grads = _i % 2;
  c.grad_reduce = _i / 2 ? FSDP_SUM : FSDP_AVG;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  float before[6], after[6];
  fsdp_engine_read_tensor(e, "w2", before, -1);
  run_pass(e, u, 3, 1.0f);
  ck_error(fsdp_engine_step(e, NULL), FSDP_ERR_INVALID_USAGE, "1 of 2");
  run_pass(e, u, 3, 3.0f);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_engine_read_tensor(e, "w2", after, -1);
  float expect = c.grad_reduce == FSDP_AVG ? 2.0f : 4.0f;
  for (int i = 0; i < 6; i++) ck_assert_float_eq(after[i], before[i] - expect);
  fsdp_engine_destroy(e);
}
END_TEST

/* Persistent bytes: 16 per (padded) parameter with AdamW, 12 with SGD+momentum. */
START_TEST(memory_formula) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  size_t padded = 0;
  for (int i = 0; i < 3; i++) {
    fsdp_unit_info_t info;
    fsdp_unit_info(e, u[i], &info);
    padded += info.padded_numel;
  }
  fsdp_mem_stats_t m;
  fsdp_engine_memory(e, &m);
  ck_assert_uint_eq(m.persistent, 16 * padded);
  run_pass(e, u, 3, 1.0f);
  fsdp_engine_memory(e, &m);
  /* One rank: shards are whole, views read the master, nothing is gathered;
   * with one micro-batch backward adds into the gradient shards themselves:
   * no gradient buffer. */
  ck_assert_uint_eq(m.gathered_params_peak, 0);
  ck_assert_uint_eq(m.grad_pool, 0);
  ck_assert_uint_eq(m.grads_in_flight_peak, 0);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  /* accumulate_full_grads has nothing to keep there either. */
  c.accumulate_full_grads = 1;
  e = make_engine(&c, u);
  fsdp_engine_memory(e, &m);
  ck_assert_uint_eq(m.grad_pool, 0);
  run_pass(e, u, 3, 1.0f);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  c.accumulate_full_grads = 0;
  /* Two micro-batches: each one's gradient goes through a buffer. */
  c.grad_accum = 2;
  e = make_engine(&c, u);
  run_pass(e, u, 3, 1.0f);
  fsdp_engine_memory(e, &m);
  ck_assert_uint_gt(m.grads_in_flight_peak, 0);
  ck_assert_uint_le(m.grads_in_flight_peak, m.grad_pool);
  run_pass(e, u, 3, 1.0f);
  /* After the step nothing is in flight; reset_peaks brings the peaks down to
   * what is live now, and the next pass raises them again. */
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  ck_assert_uint_eq(m.grads_in_flight, 0);
  const size_t peak = m.grads_in_flight_peak;
  fsdp_engine_reset_peaks(e);
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  ck_assert_uint_eq(m.grads_in_flight_peak, 0);
  run_pass(e, u, 3, 1.0f);
  ck_assert_int_eq(fsdp_engine_memory(e, &m), FSDP_SUCCESS);
  ck_assert_uint_eq(m.grads_in_flight_peak, peak);
  ck_assert_int_ne(fsdp_engine_memory(NULL, &m), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  c.grad_accum = 1;
  c.optim.kind = FSDP_OPTIM_SGD;
  c.optim.momentum = 0.5f;
  e = make_engine(&c, u);
  fsdp_engine_memory(e, &m);
  ck_assert_uint_eq(m.persistent, 12 * padded);
  fsdp_engine_destroy(e);
}
END_TEST

/* 16-bit parameters (_i & 1: bf16, fp16 with its default loss scale; _i & 2:
 * AdamW, which writes the 16-bit copy itself, else SGD, after which the
 * engine casts): views show the master rounded to the type (and widened),
 * updates still land on the fp32 master (the scaled gradient unscaled
 * exactly), and the 16-bit copy costs 2 bytes per parameter (plus its f32
 * widening when the shard is whole, as on one rank). */
START_TEST(bf16_params) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  const int f16 = _i & 1, adamw = _i & 2;
  c.param_dtype = f16 ? FSDP_F16 : FSDP_BF16;
  uint16_t (*to)(float) = f16 ? fsdp_f32_to_f16 : fsdp_f32_to_bf16;
  float (*from)(uint16_t) = f16 ? fsdp_f16_to_f32 : fsdp_bf16_to_f32;
  c.optim.kind = adamw ? FSDP_OPTIM_ADAMW : FSDP_OPTIM_SGD;
  c.optim.lr = 1e-3f;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  float master[35];
  for (int s = 0; s < 2; s++) {
    fsdp_engine_read_tensor(e, "w0", master, -1);
    fsdp_view_t v;
    ck_assert_int_eq(fsdp_unit_acquire(e, u[0], FSDP_FORWARD, &v), FSDP_SUCCESS);
    int differ = 0;
    for (int i = 0; i < 35; i++) {
      ck_assert_float_eq(v.param[0][i], from(to(master[i])));
      differ += v.param[0][i] != master[i];
    }
    ck_assert_int_gt(differ, 0); /* the master keeps the bits bf16 drops */
    ck_assert_int_eq(fsdp_unit_release(e, u[0], FSDP_FORWARD), FSDP_SUCCESS);
    for (int i = 1; i < 3; i++) {
      ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_FORWARD, &v), FSDP_SUCCESS);
      ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_FORWARD), FSDP_SUCCESS);
    }
    for (int i = 2; i >= 0; i--) {
      ck_assert_int_eq(fsdp_unit_acquire(e, u[i], FSDP_BACKWARD, &v), FSDP_SUCCESS);
      v.grad[0][0] += (float)fsdp_engine_loss_scale(e);
      ck_assert_int_eq(fsdp_unit_release(e, u[i], FSDP_BACKWARD), FSDP_SUCCESS);
    }
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
    float after[35];
    fsdp_engine_read_tensor(e, "w0", after, -1);
    if (adamw) ck_assert_float_ne(after[0], master[0]);
    else ck_assert_float_eq(after[0], master[0] - 1e-3f); /* on the fp32 master, unrounded */
  }
  size_t padded = 0;
  for (int i = 0; i < 3; i++) {
    fsdp_unit_info_t info;
    fsdp_unit_info(e, u[i], &info);
    padded += info.padded_numel;
  }
  fsdp_mem_stats_t m;
  fsdp_engine_memory(e, &m);
  ck_assert_uint_eq(m.param_copy, (2 + 4) * padded);
  /* AdamW's two moments; SGD without momentum has no state */
  ck_assert_uint_eq(m.persistent, (8 + (adamw ? 8 : 0) + 2 + 4) * padded);
  fsdp_engine_destroy(e);
}
END_TEST

/* The step's own passes are timed as a class: the norm's sum of squares (one
 * scope) and each unit's zeroing, on an update and on a skipped step alike
 * (whose scopes must close: the next begin would be refused as nested);
 * AdamW's only when it runs. */
START_TEST(step_passes_profiled) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_unit_t u[3];
  fsdp_engine_t e = make_engine(&c, u);
  ck_assert_int_eq(fsdp_engine_profile(e, 1), FSDP_SUCCESS);
  fsdp_kclass_time_t t[FSDP_KC_COUNT];
  for (int skip = 0; skip < 2; skip++) {
    run_pass(e, u, 3, 1.0f);
    if (skip) ck_assert_int_eq(fsdp_engine_report_loss(e, NAN), FSDP_SUCCESS);
    fsdp_step_stats_t st;
    ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
    ck_assert_int_eq(st.skipped, skip);
    ck_assert_int_eq(fsdp_engine_profile_read(e, t, FSDP_KC_COUNT), FSDP_SUCCESS);
    ck_assert_int_eq(t[FSDP_KC_GRAD_NORM].calls, 4 * (skip + 1));
    ck_assert_int_eq(t[FSDP_KC_ADAMW].calls, 3);
  }
  fsdp_engine_destroy(e);
}
END_TEST

static Suite *engine_suite(void) {
  Suite *s = suite_create("engine");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, config_errors);
  tcase_add_test(tc, config_from_older_header_gets_defaults);
  tcase_add_test(tc, config_loss_scale_defaults);
  tcase_add_test(tc, step_stats_of_an_older_header);
  tcase_add_test(tc, config_head_errors);
  tcase_add_test(tc, skips_restart_after_a_load);
  tcase_add_test(tc, unit_opts_from_older_header);
  tcase_add_test(tc, unit_add_errors);
  tcase_add_loop_test(tc, schedule_errors, 0, 3);
  tcase_add_test(tc, batch_errors);
  tcase_add_test(tc, nested_root_order);
  tcase_add_loop_test(tc, init_and_padding, 0, 3);
  tcase_add_test(tc, step_numerics);
  tcase_add_test(tc, memory_formula);
  tcase_add_test(tc, shard_release);
  tcase_add_test(tc, shard_release_mid_pass);
  tcase_add_loop_test(tc, accumulation, 0, 4);
  tcase_add_loop_test(tc, bf16_params, 0, 4);
  tcase_add_test(tc, step_passes_profiled);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(engine_suite()); }
