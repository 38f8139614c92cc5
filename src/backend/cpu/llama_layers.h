/* src/backend/cpu/llama_layers.h — the CPU fp32 kernels the Llama family adds
 * (llama_layers.c: RMSNorm, rotary position embedding, SwiGLU) and
 * grouped-query attention (layers.c, beside multi-head attention, which is its
 * NKV = NH case). Dims as in fsdp/nn.h, plus D (head dim), NKV (key/value
 * heads, dividing NH; 0 means NH), F (SwiGLU's width). The CPU compute table
 * (compute.c) unpacks the descriptors of backend/compute.h into these; the
 * contracts are those descriptors'. Internal; not installed. */
#ifndef FSDP_BACKEND_CPU_LLAMA_LAYERS_H
#define FSDP_BACKEND_CPU_LLAMA_LAYERS_H

/* Causal attention over qkv (B,T,(NH+2*NKV)*D), D = C / NH: query head h
 * reads KV head h / (NH / NKV). out (B,T,C), att (B,NH,T,T) probabilities.
 * Backward adds into dqkv (qkv's shape); past FSDP_ATTENTION_MAX_T it fills
 * dqkv with NaN, as fsdp_attention_backward. */
void nn_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                          int NKV);
void nn_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH, int NKV);

/* out (N,C) = weight * (x * rstd), rstd (N) = 1 / sqrt(mean(x^2) + eps),
 * the mean of squares summed in double. Backward: dinp (N,C) += d(x),
 * dweight (C) += sum over rows of (x * rstd) * dout. */
void nn_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                        int C, float eps);
void nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);

/* HF's rotate-half RoPE in place on the NH query and NKV key heads of each
 * (b,t) row of qkv (B,T,(NH+2*NKV)*D) at position pos0 + t, inv_freq (D/2);
 * inverse: the transposed rotation (backward's, on a gradient). */
void nn_rope(float *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int D, int pos0,
             int inverse);

/* out (N,F) = silu(gate) * up from inp (N,2F) = [gate | up] per row;
 * backward WRITES dinp (N,2F) = [dout * up * silu'(gate) | dout * silu(gate)]. */
void nn_swiglu_forward(float *out, const float *inp, int N, int F);
void nn_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F);

#endif
