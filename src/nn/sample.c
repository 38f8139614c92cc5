/* src/nn/sample.c — the decoders' sampler (nn/sample.h): a seeded uniform
 * stream, softmax at a temperature over a top-k cut, rank 0's draw broadcast. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/comm.h"
#include "nn/sample.h"

static double uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1.0p-53;
}

/* The k-th largest of row[0..V), by quickselect on scratch (V floats). */
static float kth_largest(const float *row, int V, int k, float *scratch) {
  memcpy(scratch, row, (size_t)V * sizeof *scratch);
  int lo = 0, hi = V - 1, want = k - 1; /* descending order: index k-1 */
  while (lo < hi) {
    float pivot = scratch[lo + (hi - lo) / 2];
    int i = lo, j = hi;
    while (i <= j) {
      while (scratch[i] > pivot) i++;
      while (scratch[j] < pivot) j--;
      if (i <= j) {
        float t = scratch[i];
        scratch[i++] = scratch[j];
        scratch[j--] = t;
      }
    }
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else break;
  }
  return scratch[want];
}

/* Draws from softmax(row / temperature) over the top_k largest logits (all
 * when top_k is 0 or >= V; ties with the k-th are kept), overwriting row with
 * the weights. */
static int sample_token(float *row, int V, float temperature, int top_k, float *scratch,
                        double u) {
  float maxv = row[0];
  for (int v = 1; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
  float floor_v = top_k > 0 && top_k < V ? kth_largest(row, V, top_k, scratch) : -INFINITY;
  double sum = 0.0;
  for (int v = 0; v < V; v++)
    sum += row[v] = row[v] >= floor_v ? expf((row[v] - maxv) / temperature) : 0.0f;
  double acc = 0.0, target = u * sum;
  for (int v = 0; v < V; v++)
    if (row[v] > 0.0f && (acc += row[v]) >= target) return v;
  for (int v = V - 1; v > 0; v--) /* rounding left target past the sum: the last kept */
    if (row[v] > 0.0f) return v;
  return 0;
}

fsdp_status_t nn_sample(const char *who, fsdp_engine_t eng, void *model, nn_next_logits_fn next,
                        float *row, int V, int max_T, const int *prompt, int n_prompt, int n_new,
                        const fsdp_gpt2_sampling_t *how, int *out) {
  if (!prompt || n_prompt < 1 || n_new < 0 || !out || !how || !(how->temperature > 0.0f) ||
      how->top_k < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s: needs a prompt of at least one token, n_new >= 0, a positive "
                      "temperature and top_k >= 0 (got %d, %d, %g, %d)", who, n_prompt, n_new,
                      how ? (double)how->temperature : 0.0, how ? how->top_k : 0);
  int *ctx = malloc((size_t)(n_prompt + n_new) * sizeof(int));
  float *scratch = how->top_k ? malloc((size_t)V * sizeof(float)) : NULL;
  fsdp_status_t st = FSDP_SUCCESS;
  if (!ctx || (how->top_k && !scratch)) {
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
    goto done;
  }
  memcpy(ctx, prompt, (size_t)n_prompt * sizeof(int));
  for (int i = 0; i < n_new; i++) {
    int len = n_prompt + i, T = len < max_T ? len : max_T;
    FSDP_TRYG(st, next(model, ctx + len - T, T, row), done);
    int tok = sample_token(row, V, how->temperature, how->top_k, scratch,
                           uniform01(how->seed, (uint64_t)i));
    /* Every rank computed the same logits; rank 0's draw (an int moved as 4
     * bytes) makes that certain. */
    FSDP_TRYG(st, fsdp_broadcast(fsdp_engine_comm(eng), &tok, 1, FSDP_F32, 0, FSDP_HOST_STREAM),
              done);
    ctx[len] = out[i] = tok;
  }
done:
  free(scratch);
  free(ctx);
  return st;
}
