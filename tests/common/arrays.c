/* tests/common/arrays.c — checked host allocations for tests. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/arrays.h"

void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

float *zeros(size_t n) {
  float *x = calloc(n ? n : 1, sizeof(float));
  ck_assert_ptr_nonnull(x);
  return x;
}

float *copy_floats(const float *x, size_t n) {
  float *y = xmalloc(n * sizeof(float));
  memcpy(y, x, n * sizeof(float));
  return y;
}
