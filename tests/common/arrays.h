/* tests/common/arrays.h — host arrays for tests: allocated, zeroed or copied,
 * failing the running Check test (not returning NULL) when memory runs out.
 * Zero-length requests get a valid pointer. free() them. */
#ifndef FSDP_TESTS_COMMON_ARRAYS_H
#define FSDP_TESTS_COMMON_ARRAYS_H

#include <stddef.h>

void *xmalloc(size_t bytes);

/* n floats, all 0. */
float *zeros(size_t n);

/* A copy of x[0..n). */
float *copy_floats(const float *x, size_t n);

#endif
