/* tests/common/gqa.h — grouped-query attention's inputs as multi-head
 * attention's and back, so that a multi-head reference (or kernel) checks a
 * grouped-query one: query head h of NH reads KV head h / (NH / NKV). Dims
 * as in src/backend/compute.h: qkv (B,T,(NH+2*NKV)*D), D = C / NH, NKV
 * dividing NH. Buffers are the caller's; nothing is allocated. */
#ifndef FSDP_TESTS_COMMON_GQA_H
#define FSDP_TESTS_COMMON_GQA_H

/* mha (B,T,3C) = qkv with each KV head repeated for the NH/NKV query heads
 * that read it (HF's repeat_kv). */
void gqa_repeat_kv(float *mha, const float *qkv, int B, int T, int C, int NH, int NKV);

/* The reverse for a gradient (or a bound on its error): dqkv (B,T,(NH+2*NKV)*D)
 * written with dq as it is in dmha (B,T,3C) and each KV head's gradient the
 * sum over the query heads that read it. */
void gqa_fold_kv(float *dqkv, const float *dmha, int B, int T, int C, int NH, int NKV);

#endif
