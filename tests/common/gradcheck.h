/* tests/common/gradcheck.h — gradients of fp32 kernels against central finite
 * differences of a float64 forward.
 *
 * The loss is sum(out * R) for a random R, so dout = R, and the numeric side
 * is a central difference of a float64 forward with step GRAD_H: truncation
 * O(H^2 f''') ~ 1e-8 and round-off ~ 1e-16 |loss| / H ~ 1e-11, so it is exact
 * next to the fp32 analytic gradient, whose error is a few fp32 ulps (6e-8) of
 * sums of at most a few hundred O(1) terms: ~1e-6 absolute at worst (2e-7
 * seen, attention at T = 70). |analytic - numeric| <= GRAD_RTOL |numeric| +
 * GRAD_ATOL leaves 50x room on that and still fails a dropped or mis-scaled
 * term, which is off by 1e-3 or more. */
#ifndef FSDP_TESTS_COMMON_GRADCHECK_H
#define FSDP_TESTS_COMMON_GRADCHECK_H

#include <stddef.h>

#define GRAD_H 1e-4
#define GRAD_RTOL 1e-3
#define GRAD_ATOL 1e-5

/* A float64 loss over a problem whose inputs are float arrays. */
typedef double (*loss64_fn)(const void *problem);

/* Central difference of loss around x[i], x restored after. The probes are
 * stored in the fp32 array, so the divisor is the step actually taken after
 * rounding, not the nominal 2 GRAD_H. */
double numeric_grad(loss64_fn loss, const void *problem, float *x, size_t i);

/* Fails the running test unless analytic is within the bound above of
 * numeric; what[i] names the element in the message. */
void assert_grad(const char *what, size_t i, double analytic, double numeric);

/* assert_grad for every x[i], i < n, against numeric_grad: analytic[i] is
 * d loss / d x[i] as the kernel computed it. */
void check_grads(const char *what, loss64_fn loss, const void *problem, float *x,
                 const float *analytic, size_t n);

#endif
