/* tests/unit/test_shard.c — flat-shard layout arithmetic and the world-size
 * independent initialiser (fsdp_shard_layout, fsdp_init_value, fsdp_init_fill). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "engine/shard.h"
#include "fsdp/engine.h"

static const size_t kNumel[] = {1, 2, 7, 13, 97, 1009, 4096, 65537};
static const int kWorld[] = {1, 2, 3, 4, 5, 7, 8};
static const size_t kAlign[] = {1, 16};
#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Every rank's slice, checked against the padding rules and against each
 * other: together they must tile [0, numel) in rank order. */
static void check_layout(size_t numel, int world, size_t align) {
  size_t covered = 0, padded0 = 0, shard0 = 0;
  for (int r = 0; r < world; ++r) {
    size_t padded, shard, begin, end;
    ck_assert_int_eq(fsdp_shard_layout(numel, world, align, r, &padded, &shard, &begin, &end),
                     FSDP_SUCCESS);
    const size_t unit = (size_t)world * align;
    ck_assert_uint_eq(padded % unit, 0);
    ck_assert_uint_ge(padded, numel);
    ck_assert_uint_lt(padded, numel + unit);
    ck_assert_uint_eq(shard * (size_t)world, padded);
    ck_assert_uint_eq(shard % align, 0);
    if (r > 0) ck_assert_uint_eq(padded, padded0);
    if (r > 0) ck_assert_uint_eq(shard, shard0);
    padded0 = padded;
    shard0 = shard;
    ck_assert_uint_le(begin, end);
    ck_assert_uint_le(end - begin, shard);
    /* Contiguous with the previous rank: no gap and no overlap. */
    ck_assert_uint_eq(begin, covered);
    covered = end;
  }
  ck_assert_uint_eq(covered, numel);
}

START_TEST(layout_tiles) {
  for (int w = 0; w < LEN(kWorld); ++w)
    for (int a = 0; a < LEN(kAlign); ++a) check_layout(kNumel[_i], kWorld[w], kAlign[a]);
}
END_TEST

START_TEST(layout_known_values) {
  /* 10 elements over 4 ranks, align 2: padded to 16, slices of 4, last rank
   * holds no real element. */
  static const size_t want[4][2] = {{0, 4}, {4, 8}, {8, 10}, {10, 10}};
  for (int r = 0; r < 4; ++r) {
    size_t padded, shard, begin, end;
    ck_assert_int_eq(fsdp_shard_layout(10, 4, 2, r, &padded, &shard, &begin, &end),
                     FSDP_SUCCESS);
    ck_assert_uint_eq(padded, 16);
    ck_assert_uint_eq(shard, 4);
    ck_assert_uint_eq(begin, want[r][0]);
    ck_assert_uint_eq(end, want[r][1]);
  }
}
END_TEST

static const struct {
  size_t numel;
  int world;
  size_t align;
  int rank;
  const char *needle; /* must appear in the error message */
} kBadLayout[] = {
    {0, 2, 16, 0, "numel is 0"},
    {10, 0, 16, 0, "world size 0"},
    {10, -3, 16, 0, "world size -3"},
    {10, 2, 0, 0, "align 0"},
    {10, 2, 12, 0, "align 12"},
    {10, 2, 16, 2, "rank 2"},
    {10, 2, 16, -1, "rank -1"},
    {SIZE_MAX - 3, 2, 16, 0, "overflows"},
};

START_TEST(layout_rejects) {
  size_t padded = 123, shard = 456, begin = 7, end = 8;
  ck_assert_int_eq(fsdp_shard_layout(kBadLayout[_i].numel, kBadLayout[_i].world,
                                     kBadLayout[_i].align, kBadLayout[_i].rank, &padded, &shard,
                                     &begin, &end),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), kBadLayout[_i].needle), "message '%s' lacks '%s'",
                fsdp_last_error(), kBadLayout[_i].needle);
  /* Outputs are written only on success. */
  ck_assert_uint_eq(padded, 123);
  ck_assert_uint_eq(shard, 456);
  ck_assert_uint_eq(begin, 7);
  ck_assert_uint_eq(end, 8);
}
END_TEST

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

START_TEST(init_is_pure_and_keyed) {
  const fsdp_init_kind_t kind = _i ? FSDP_INIT_UNIFORM : FSDP_INIT_NORMAL;
  float a = fsdp_init_value(42, "fc.0.weight", 17, kind, 1.0f);
  ck_assert_uint_eq(bits(a), bits(fsdp_init_value(42, "fc.0.weight", 17, kind, 1.0f)));
  ck_assert_float_ne(a, fsdp_init_value(43, "fc.0.weight", 17, kind, 1.0f));
  ck_assert_float_ne(a, fsdp_init_value(42, "fc.1.weight", 17, kind, 1.0f));
  ck_assert_float_ne(a, fsdp_init_value(42, "fc.0.weight", 18, kind, 1.0f));
  /* Scale is a pure multiplier, so changing it must not change the draw. */
  ck_assert_float_eq_tol(fsdp_init_value(42, "fc.0.weight", 17, kind, 0.25f), 0.25f * a, 1e-7f);
}
END_TEST

START_TEST(init_fixed_kinds) {
  ck_assert_float_eq(fsdp_init_value(1, "b", 5, FSDP_INIT_ZEROS, 3.0f), 0.0f);
  ck_assert_float_eq(fsdp_init_value(1, "b", 5, FSDP_INIT_CONSTANT, 3.0f), 3.0f);
  ck_assert(isnan(fsdp_init_value(1, "b", 5, (fsdp_init_kind_t)99, 3.0f)));
}
END_TEST

/* Fills a tensor the way `world` ranks would, each its own slice, and checks
 * the result bit for bit against one rank filling everything. */
START_TEST(init_independent_of_world) {
  const size_t n = 4099;
  const fsdp_init_kind_t kinds[] = {FSDP_INIT_NORMAL, FSDP_INIT_UNIFORM};
  float *one = malloc(n * sizeof(float)), *many = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(one);
  ck_assert_ptr_nonnull(many);
  for (int k = 0; k < 2; ++k) {
    fsdp_init_fill(one, n, 7, "h.3.attn.weight", 0, kinds[k], 0.02f);
    for (int world = 1; world <= 4; ++world) {
      memset(many, 0xFF, n * sizeof(float));
      for (int r = world - 1; r >= 0; --r) { /* out of order on purpose */
        size_t begin, end;
        ck_assert_int_eq(fsdp_shard_layout(n, world, 16, r, NULL, NULL, &begin, &end),
                         FSDP_SUCCESS);
        fsdp_init_fill(many + begin, end - begin, 7, "h.3.attn.weight", begin, kinds[k], 0.02f);
      }
      ck_assert_mem_eq(one, many, n * sizeof(float));
    }
    for (size_t i = 0; i < n; i += 97)
      ck_assert_uint_eq(bits(one[i]), bits(fsdp_init_value(7, "h.3.attn.weight", i, kinds[k],
                                                           0.02f)));
  }
  free(one);
  free(many);
}
END_TEST

struct moments {
  double mean, sd, lag1; /* lag1: correlation of neighbouring elements */
};

static struct moments sample(fsdp_init_kind_t kind, float scale, size_t n) {
  float *x = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(x);
  fsdp_init_fill(x, n, 2024, "stats", 0, kind, scale);
  double s = 0, ss = 0, cross = 0;
  for (size_t i = 0; i < n; ++i) s += x[i];
  const double mean = s / (double)n;
  for (size_t i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  for (size_t i = 1; i < n; ++i) cross += (x[i] - mean) * (x[i - 1] - mean);
  free(x);
  return (struct moments){mean, sqrt(ss / (double)(n - 1)), cross / ss};
}

/* Tolerances are 5 standard errors, so a correct generator fails with
 * probability ~1e-6 per check (and the seed is fixed, so it never flakes):
 *   SE(mean) = sd / sqrt(n);
 *   SE(sd) ~= sqrt(mu4 - sd^4) / (2 sd sqrt(n)): sd / sqrt(2n) for a normal,
 *             sd * sqrt(0.2 / n) for a uniform (mu4 = 9/5 sd^4);
 *   SE(lag-1 correlation) = 1 / sqrt(n) for independent draws. */
START_TEST(init_normal_moments) {
  const size_t n = 100000;
  const float scale = 0.02f;
  struct moments m = sample(FSDP_INIT_NORMAL, scale, n);
  ck_assert_double_le(fabs(m.mean), 5.0 * scale / sqrt((double)n));
  ck_assert_double_le(fabs(m.sd - scale), 5.0 * scale / sqrt(2.0 * (double)n));
  ck_assert_double_le(fabs(m.lag1), 5.0 / sqrt((double)n));
}
END_TEST

START_TEST(init_uniform_moments_and_bounds) {
  const size_t n = 100000;
  const float scale = 0.5f;
  struct moments m = sample(FSDP_INIT_UNIFORM, scale, n);
  const double sd = scale / sqrt(3.0);
  ck_assert_double_le(fabs(m.mean), 5.0 * sd / sqrt((double)n));
  ck_assert_double_le(fabs(m.sd - sd), 5.0 * sd * sqrt(0.2 / (double)n));
  ck_assert_double_le(fabs(m.lag1), 5.0 / sqrt((double)n));
  float lo = 0, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    float x = fsdp_init_value(9, "u", i, FSDP_INIT_UNIFORM, scale);
    ck_assert_float_le(fabsf(x), scale);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  /* The whole range is reached, not a sliver of it. */
  ck_assert_float_lt(lo, -0.99f * scale);
  ck_assert_float_gt(hi, 0.99f * scale);
}
END_TEST

static Suite *shard_suite(void) {
  Suite *s = suite_create("shard");
  TCase *t = tcase_create("layout");
  tcase_add_loop_test(t, layout_tiles, 0, LEN(kNumel));
  tcase_add_test(t, layout_known_values);
  tcase_add_loop_test(t, layout_rejects, 0, LEN(kBadLayout));
  suite_add_tcase(s, t);
  t = tcase_create("init");
  tcase_add_loop_test(t, init_is_pure_and_keyed, 0, 2);
  tcase_add_test(t, init_fixed_kinds);
  tcase_add_test(t, init_independent_of_world);
  tcase_add_test(t, init_normal_moments);
  tcase_add_test(t, init_uniform_moments_and_bounds);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return check_run(shard_suite()); }
