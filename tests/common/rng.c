/* tests/common/rng.c — splitmix64 and the random arrays drawn from it. */
#include "common/arrays.h"
#include "common/rng.h"

static uint64_t rng_state;

void rng_seed(uint64_t seed) { rng_state = seed; }

double rnd(void) {
  uint64_t x = (rng_state += 0x9E3779B97F4A7C15ULL);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return (double)((x ^ (x >> 31)) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

float *rand_floats(size_t n, double offset, double spread) {
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) x[i] = (float)(offset + spread * rnd());
  return x;
}

int *rand_tokens(size_t n, int V) {
  int *t = xmalloc(n * sizeof(int));
  for (size_t i = 0; i < n; ++i) t[i] = (int)((rnd() + 1.0) * 0.5 * V) % V;
  return t;
}
