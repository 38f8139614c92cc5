/* tests/unit/test_core.c — status text, last error, element types, bf16 and fp16
 * conversion, clock and aligned allocation (src/core). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "core/internal.h"
#include "fsdp/core.h"

START_TEST(status_strings_say_something) {
  /* _i runs over every code plus one past the end (an unknown code). */
  const char *s = fsdp_status_string((fsdp_status_t)_i);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_gt(strlen(s), 5);
  if (_i == FSDP_STATUS_COUNT) ck_assert_ptr_nonnull(strstr(s, "unknown"));
}
END_TEST

START_TEST(status_strings_are_distinct) {
  for (int a = 0; a <= FSDP_STATUS_COUNT; a++)
    for (int b = a + 1; b <= FSDP_STATUS_COUNT; b++)
      ck_assert_str_ne(fsdp_status_string((fsdp_status_t)a), fsdp_status_string((fsdp_status_t)b));
}
END_TEST

START_TEST(last_error_set_and_overwrite) {
  ck_assert_int_eq(fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "count %d is bad", 7),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(fsdp_last_error(), "count 7 is bad");
  fsdp_error(FSDP_ERR_COMM, "rank %d lost", 3);
  ck_assert_str_eq(fsdp_last_error(), "rank 3 lost");
  fsdp_error_set("copied verbatim %d");
  ck_assert_str_eq(fsdp_last_error(), "copied verbatim %d");
  fsdp_error_set(fsdp_last_error()); /* copying onto itself keeps the text */
  ck_assert_str_eq(fsdp_last_error(), "copied verbatim %d");
}
END_TEST

START_TEST(last_error_truncates_long_text) {
  char big[4096];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  fsdp_error(FSDP_ERR_INTERNAL, "%s", big);
  size_t n = strlen(fsdp_last_error());
  ck_assert_uint_gt(n, 500);
  ck_assert_uint_lt(n, sizeof big - 1);
}
END_TEST

static void *other_thread_error(void *arg) {
  (void)arg;
  fsdp_error(FSDP_ERR_SYSTEM, "from another thread");
  return NULL;
}

START_TEST(last_error_is_per_thread) {
  fsdp_error(FSDP_ERR_COMM, "mine");
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, other_thread_error, NULL), 0);
  pthread_join(t, NULL);
  ck_assert_str_eq(fsdp_last_error(), "mine");
}
END_TEST

static const struct {
  fsdp_dtype_t dtype;
  size_t size;
  const char *name;
} dtype_table[] = {
    {FSDP_F32, 4, "f32"},
    {FSDP_BF16, 2, "bf16"},
    {FSDP_F64, 8, "f64"},
    {FSDP_F16, 2, "f16"},
    {FSDP_DTYPE_COUNT, 0, "invalid"},
    {(fsdp_dtype_t)-1, 0, "invalid"},
};

START_TEST(dtype_size_and_name) {
  ck_assert_uint_eq(fsdp_dtype_size(dtype_table[_i].dtype), dtype_table[_i].size);
  ck_assert_str_eq(fsdp_dtype_name(dtype_table[_i].dtype), dtype_table[_i].name);
}
END_TEST

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f32 bit patterns and the bf16 they must round to (nearest, ties to even). */
static const struct {
  uint32_t f32;
  uint16_t bf16;
} bf16_table[] = {
    {0x3f800000u, 0x3f80}, /* 1.0 exact */
    {0x3f808000u, 0x3f80}, /* tie, kept bit even: round down */
    {0x3f818000u, 0x3f82}, /* tie, kept bit odd: round up */
    {0x3f808001u, 0x3f81}, /* just above the tie: round up */
    {0x3f807fffu, 0x3f80}, /* just below the tie: round down */
    {0xbf808001u, 0xbf81}, /* negative rounds by magnitude */
    {0x00000000u, 0x0000}, /* +0 */
    {0x80000000u, 0x8000}, /* -0 */
    {0x7f800000u, 0x7f80}, /* +inf */
    {0xff800000u, 0xff80}, /* -inf */
    {0x7f7fffffu, 0x7f80}, /* largest finite f32 rounds to inf */
    {0x00008000u, 0x0000}, /* subnormal tie to even (zero) */
    {0x00018000u, 0x0002}, /* subnormal tie to even (up) */
};

START_TEST(bf16_rounding) {
  uint16_t got = fsdp_f32_to_bf16(f32_from_bits(bf16_table[_i].f32));
  ck_assert_msg(got == bf16_table[_i].bf16, "f32 0x%08x -> bf16 0x%04x, want 0x%04x",
                bf16_table[_i].f32, got, bf16_table[_i].bf16);
}
END_TEST

START_TEST(bf16_nan_stays_nan) {
  /* Payloads chosen so that naive rounding would carry into inf or lose NaN. */
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fffffffu, 0xff800001u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t b = fsdp_f32_to_bf16(f32_from_bits(nans[i]));
    ck_assert_msg(isnan(fsdp_bf16_to_f32(b)), "NaN 0x%08x became 0x%04x", nans[i], b);
    ck_assert_uint_eq(b >> 15, nans[i] >> 31); /* sign kept */
  }
}
END_TEST

/* fp16 against the compiler's own IEEE binary16 (_Float16, round to nearest
 * even): every f32 whose top 16 bits vary with fixed low bits chosen to hit
 * ties, just-above and just-below cases, in every exponent range (normal,
 * subnormal, overflow to inf). */
START_TEST(f16_matches_ieee) {
  const uint32_t lows[] = {0x0000u, 0x1000u, 0x0fffu, 0x1001u, 0x2000u, 0x3000u, 0xffffu};
  for (uint32_t hi = 0; hi < 0x10000u; hi++)
    for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
      float x = f32_from_bits(hi << 16 | lows[k]);
      if (isnan(x)) continue;
      _Float16 ref = (_Float16)x;
      uint16_t want, got = fsdp_f32_to_f16(x);
      memcpy(&want, &ref, sizeof want);
      ck_assert_msg(got == want, "f32 0x%08x -> f16 0x%04x, want 0x%04x", hi << 16 | lows[k], got,
                    want);
    }
}
END_TEST

START_TEST(f16_round_trip_and_nan) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    float f = fsdp_f16_to_f32((uint16_t)h);
    _Float16 ref;
    uint16_t bits = (uint16_t)h;
    memcpy(&ref, &bits, sizeof ref);
    if (isnan((float)ref)) {
      ck_assert_msg(isnan(f), "f16 NaN 0x%04x widened to %g", h, (double)f);
      ck_assert_msg(isnan(fsdp_f16_to_f32(fsdp_f32_to_f16(f))), "NaN 0x%04x lost", h);
      continue;
    }
    ck_assert_msg(f == (float)ref, "f16 0x%04x -> %g, want %g", h, (double)f, (double)ref);
    ck_assert_uint_eq(fsdp_f32_to_f16(f), h);
  }
  ck_assert_uint_eq(fsdp_f32_to_f16(65520.0f), 0x7c00u); /* overflow is inf, not 65504 */
  ck_assert_uint_eq(fsdp_f32_to_f16(-1e30f), 0xfc00u);
}
END_TEST

START_TEST(bf16_round_trip_is_exact) {
  /* Every finite bf16 value converts to f32 and back unchanged. */
  for (uint32_t b = 0; b <= 0xffff; b++) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) continue; /* NaN payloads: checked above */
    ck_assert_uint_eq(fsdp_f32_to_bf16(fsdp_bf16_to_f32((uint16_t)b)), b);
  }
}
END_TEST

START_TEST(time_is_monotonic) {
  double a = fsdp_time_now();
  double b = fsdp_time_now();
  ck_assert(a > 0.0);
  ck_assert(b >= a);
}
END_TEST

static const size_t alloc_sizes[] = {1, 3, 63, 64, 65, 1000, 1 << 20};

START_TEST(alloc_is_aligned_and_zeroed) {
  size_t n = alloc_sizes[_i];
  unsigned char *p = fsdp_alloc(n);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq((uintptr_t)p % 64, 0);
  size_t first = 0; /* one assertion, not n: each is a pipe write under CK_FORK */
  while (first < n && p[first] == 0) first++;
  ck_assert_msg(first == n, "byte %zu of %zu is 0x%02x, not 0", first, n, first < n ? p[first] : 0);
  memset(p, 0xab, n); /* the whole requested size is writable */
  fsdp_free(p);
}
END_TEST

START_TEST(alloc_refuses_zero_and_huge) {
  ck_assert_ptr_null(fsdp_alloc(0));
  ck_assert_ptr_null(fsdp_alloc(SIZE_MAX));
  ck_assert_ptr_null(fsdp_alloc(SIZE_MAX - 10));
  fsdp_free(NULL);
}
END_TEST

START_TEST(strdup_copies) {
  char *s = fsdp_strdup("gather");
  ck_assert_str_eq(s, "gather");
  fsdp_free(s);
  ck_assert_ptr_null(fsdp_strdup(NULL));
}
END_TEST

static Suite *core_suite(void) {
  Suite *s = suite_create("core");
  TCase *tc = tcase_create("core");
  tcase_add_loop_test(tc, status_strings_say_something, 0, FSDP_STATUS_COUNT + 1);
  tcase_add_test(tc, status_strings_are_distinct);
  tcase_add_test(tc, last_error_set_and_overwrite);
  tcase_add_test(tc, last_error_truncates_long_text);
  tcase_add_test(tc, last_error_is_per_thread);
  tcase_add_loop_test(tc, dtype_size_and_name, 0, sizeof dtype_table / sizeof dtype_table[0]);
  tcase_add_loop_test(tc, bf16_rounding, 0, sizeof bf16_table / sizeof bf16_table[0]);
  tcase_add_test(tc, bf16_nan_stays_nan);
  tcase_add_test(tc, bf16_round_trip_is_exact);
  tcase_add_test(tc, f16_matches_ieee);
  tcase_add_test(tc, f16_round_trip_and_nan);
  tcase_add_test(tc, time_is_monotonic);
  tcase_add_loop_test(tc, alloc_is_aligned_and_zeroed, 0,
                      sizeof alloc_sizes / sizeof alloc_sizes[0]);
  tcase_add_test(tc, alloc_refuses_zero_and_huge);
  tcase_add_test(tc, strdup_copies);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(core_suite()); }
