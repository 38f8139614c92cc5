/* tests/common/gqa.c — grouped-query attention's qkv to and from multi-head
 * attention's (gqa.h). */
#include "common/gqa.h"

#include <stddef.h>
#include <string.h>

void gqa_repeat_kv(float *mha, const float *qkv, int B, int T, int C, int NH, int NKV) {
  const int D = C / NH, G = NH / NKV;
  const size_t ld = (size_t)(NH + 2 * NKV) * D, rows = (size_t)B * T;
  for (size_t r = 0; r < rows; ++r) {
    const float *src = qkv + r * ld;
    float *dst = mha + r * 3 * C;
    memcpy(dst, src, (size_t)C * sizeof(float));
    for (int h = 0; h < NH; ++h) {
      memcpy(dst + C + h * D, src + C + (h / G) * D, (size_t)D * sizeof(float));
      memcpy(dst + 2 * C + h * D, src + C + (NKV + h / G) * D, (size_t)D * sizeof(float));
    }
  }
}

void gqa_fold_kv(float *dqkv, const float *dmha, int B, int T, int C, int NH, int NKV) {
  const int D = C / NH, G = NH / NKV;
  const size_t ld = (size_t)(NH + 2 * NKV) * D, rows = (size_t)B * T;
  for (size_t r = 0; r < rows; ++r) {
    const float *src = dmha + r * 3 * C;
    float *dst = dqkv + r * ld;
    memcpy(dst, src, (size_t)C * sizeof(float));
    memset(dst + C, 0, 2 * (size_t)NKV * D * sizeof(float));
    for (int h = 0; h < NH; ++h)
      for (int d = 0; d < D; ++d) {
        dst[C + (h / G) * D + d] += src[C + h * D + d];
        dst[C + (NKV + h / G) * D + d] += src[2 * C + h * D + d];
      }
  }
}
