/* src/engine/shard.c — flat-shard layout arithmetic and the world-size
 * independent initialiser: element values are a pure function of
 * (seed, tensor name, element index), so any rank can fill any slice. */
#include "engine/shard.h"

#include <math.h>

#include "core/internal.h"

fsdp_status_t fsdp_shard_layout(size_t numel, int world, size_t align, int rank, size_t *padded,
                                size_t *shard, size_t *begin, size_t *end) {
  if (numel == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "shard layout: numel is 0; a unit needs at least one element");
  if (world < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "shard layout: world size %d must be >= 1",
                      world);
  if (align == 0 || (align & (align - 1)) != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "shard layout: align %zu must be a power of two (1, 2, 4, ...)", align);
  if (rank < 0 || rank >= world)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "shard layout: rank %d outside [0, %d)", rank,
                      world);
  size_t unit = (size_t)world * align;
  if (unit / align != (size_t)world || numel > SIZE_MAX - (unit - 1))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "shard layout: numel %zu padded to a multiple of %d*%zu overflows size_t",
                      numel, world, align);
  size_t p = (numel + unit - 1) / unit * unit;
  size_t s = p / (size_t)world;
  size_t lo = (size_t)rank * s, hi = lo + s;
  /* Outputs are optional so callers can ask for just the piece they need. */
  if (padded) *padded = p;
  if (shard) *shard = s;
  if (begin) *begin = lo < numel ? lo : numel;
  if (end) *end = hi < numel ? hi : numel;
  return FSDP_SUCCESS;
}

/* splitmix64's output function: a bijective 64-bit mixer with full avalanche. */
static uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* The per-tensor key. FNV-1a alone mixes poorly in its high bits, so the hash
 * and the seed go through mix64 before they are combined. */
static uint64_t init_key(uint64_t seed, const char *name) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const unsigned char *c = (const unsigned char *)(name ? name : ""); *c; ++c)
    h = (h ^ *c) * 0x100000001B3ULL;
  return mix64(h ^ mix64(seed));
}

/* Draw number `counter` of the stream `key`: the counter-th splitmix64 output
 * from state `key`, computable out of order. Returns a uniform in (0, 1) from
 * the top 24 bits, centred in its bin so that 0 and 1 never occur (log(0)). */
static double uniform01(uint64_t key, uint64_t counter) {
  uint64_t x = mix64(key + (counter + 1) * 0x9E3779B97F4A7C15ULL);
  return ((double)(x >> 40) + 0.5) * (1.0 / 16777216.0);
}

static float init_from_key(uint64_t key, size_t index, fsdp_init_kind_t kind, float scale) {
  switch (kind) {
  case FSDP_INIT_ZEROS:
    return 0.0f;
  case FSDP_INIT_CONSTANT:
    return scale;
  case FSDP_INIT_UNIFORM:
    return (float)(scale * (2.0 * uniform01(key, index) - 1.0));
  case FSDP_INIT_NORMAL: {
    /* Two draws per element (Box–Muller, cosine branch) keep every element
     * independent of its neighbours, so slices never share a draw. */
    uint64_t i2 = 2 * (uint64_t)index;
    double u1 = uniform01(key, i2), u2 = uniform01(key, i2 + 1);
    return (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
  }
  /* Unknown kinds are rejected where tensors are declared; NaN makes a
   * missed check loud instead of silently training from zero. */
  return NAN;
}

float fsdp_init_value(uint64_t seed, const char *name, size_t index, fsdp_init_kind_t kind,
                      float scale) {
  return init_from_key(init_key(seed, name), index, kind, scale);
}

void fsdp_init_fill(float *dst, size_t n, uint64_t seed, const char *name, size_t first_index,
                    fsdp_init_kind_t kind, float scale) {
  uint64_t key = init_key(seed, name);
  for (size_t i = 0; i < n; ++i) dst[i] = init_from_key(key, first_index + i, kind, scale);
}
