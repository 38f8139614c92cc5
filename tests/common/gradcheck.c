/* tests/common/gradcheck.c — the finite-difference gradient check. */
#include <check.h>
#include <math.h>

#include "common/gradcheck.h"

double numeric_grad(loss64_fn loss, const void *problem, float *x, size_t i) {
  const float x0 = x[i];
  x[i] = (float)(x0 + GRAD_H);
  const double up = loss(problem), dx_up = (double)x[i] - x0;
  x[i] = (float)(x0 - GRAD_H);
  const double down = loss(problem), dx_down = x0 - (double)x[i];
  x[i] = x0;
  return (up - down) / (dx_up + dx_down);
}

void assert_grad(const char *what, size_t i, double analytic, double numeric) {
  ck_assert_msg(fabs(analytic - numeric) <= GRAD_RTOL * fabs(numeric) + GRAD_ATOL,
                "%s[%zu]: analytic %.9g vs numeric %.9g", what, i, analytic, numeric);
}

void check_grads(const char *what, loss64_fn loss, const void *problem, float *x,
                 const float *analytic, size_t n) {
  for (size_t i = 0; i < n; ++i)
    assert_grad(what, i, analytic[i], numeric_grad(loss, problem, x, i));
}
