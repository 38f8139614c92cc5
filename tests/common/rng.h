/* tests/common/rng.h — the tests' random inputs: splitmix64 draws from one
 * state that each test seeds itself (a failure reproduces from its seed
 * alone), and the float and token arrays drawn from them. Arrays come from
 * xmalloc (common/arrays.h): free() them. */
#ifndef FSDP_TESTS_COMMON_RNG_H
#define FSDP_TESTS_COMMON_RNG_H

#include <stddef.h>
#include <stdint.h>

/* Restarts the sequence: the same seed gives the same draws. */
void rng_seed(uint64_t seed);

/* The next draw, uniform in [-1, 1). */
double rnd(void);

/* n floats uniform in offset +- spread. */
float *rand_floats(size_t n, double offset, double spread);

/* n token ids uniform in [0, V). */
int *rand_tokens(size_t n, int V);

#endif
