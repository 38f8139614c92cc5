/* src/cuda/elementwise.cu — elementwise kernels: GELU and the residual
 * add (fp32 and bf16), the shard kernels axpy and scale, and the f32 <-> bf16
 * and f32 <-> fp16 casts. Grid-stride loops over size_t indices; math in fp32. */
#include "cuda/cuda_internal.cuh"

/* Runs f(i) for every i < n: a grid-stride loop, so any n fits the capped grid. */
template <typename F> __global__ void for_each_kernel(size_t n, F f) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    f(i);
}

template <typename F> static fsdp_status_t for_each(size_t n, cudaStream_t s, F f) {
  if (n == 0) return FSDP_SUCCESS;
  FSDP_LAUNCH(for_each_kernel, fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, n, f);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- GELU: the CPU's formulas (src/nn/gelu.c), tanh via one expf ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

template <typename T>
static fsdp_status_t gelu_forward(T *out, const T *inp, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) {
    const float x = load(inp + i);
    const float u = GELU_K * (x + GELU_C * x * x * x);
    store(out + i, x / (1.0f + expf(-2.0f * u)));
  });
}

template <typename T>
static fsdp_status_t gelu_backward(T *dinp, const T *inp, const T *dout, size_t n,
                                   cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) {
    const float x = load(inp + i);
    const float u = GELU_K * (x + GELU_C * x * x * x);
    const float sg = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    store(dinp + i, load(dinp + i) + (sg + 2.0f * x * sg * (1.0f - sg) * du) * load(dout + i));
  });
}

/* ---- residual ---- */

template <typename T>
static fsdp_status_t residual_forward(T *out, const T *a, const T *b, size_t n, cudaStream_t s) {
  return for_each(n, s,
                  [=] __device__(size_t i) { store(out + i, load(a + i) + load(b + i)); });
}


/* ---- shard kernels ---- */

template <typename T>
static fsdp_status_t axpy(float *y, const T *x, float scale, size_t n, cudaStream_t s) {
  /* The engine's loop is g[i] += scale * src[i]: same two roundings here. */
  return for_each(n, s, [=] __device__(size_t i) { y[i] += __fmul_rn(scale, load(x + i)); });
}

/* ---- the exported twins ---- */

fsdp_status_t fsdp_cuda_gelu_forward(float *out, const float *inp, size_t n,
                                     fsdp_cuda_stream_t stream) {
  return gelu_forward(out, inp, n, stream);
}
fsdp_status_t fsdp_cuda_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, size_t n,
                                          fsdp_cuda_stream_t stream) {
  return gelu_forward(as_bf16(out), as_bf16(inp), n, stream);
}
fsdp_status_t fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                                      fsdp_cuda_stream_t stream) {
  return gelu_backward(dinp, inp, dout, n, stream);
}
fsdp_status_t fsdp_cuda_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp,
                                           const uint16_t *dout, size_t n,
                                           fsdp_cuda_stream_t stream) {
  return gelu_backward(as_bf16(dinp), as_bf16(inp), as_bf16(dout), n, stream);
}

fsdp_status_t fsdp_cuda_residual_forward(float *out, const float *a, const float *b, size_t n,
                                         fsdp_cuda_stream_t stream) {
  return residual_forward(out, a, b, n, stream);
}
fsdp_status_t fsdp_cuda_residual_forward_bf16(uint16_t *out, const uint16_t *a,
                                              const uint16_t *b, size_t n,
                                              fsdp_cuda_stream_t stream) {
  return residual_forward(as_bf16(out), as_bf16(a), as_bf16(b), n, stream);
}

fsdp_status_t fsdp_cuda_scale(float *x, float s, size_t n, fsdp_cuda_stream_t stream) {
  return for_each(n, stream, [=] __device__(size_t i) { x[i] *= s; });
}

fsdp_status_t fsdp_cuda_axpy(float *y, const float *x, float scale, size_t n,
                             fsdp_cuda_stream_t stream) {
  return axpy(y, x, scale, n, stream);
}
fsdp_status_t fsdp_cuda_axpy_bf16(float *y, const uint16_t *x, float scale, size_t n,
                                  fsdp_cuda_stream_t stream) {
  return axpy(y, as_bf16(x), scale, n, stream);
}

fsdp_status_t fsdp_cuda_f32_to_bf16(uint16_t *out, const float *inp, size_t n,
                                    fsdp_cuda_stream_t stream) {
  return for_each(n, stream, [=] __device__(size_t i) { out[i] = fsdp_bf16_bits(inp[i]); });
}
fsdp_status_t fsdp_cuda_bf16_to_f32(float *out, const uint16_t *inp, size_t n,
                                    fsdp_cuda_stream_t stream) {
  return for_each(n, stream,
                  [=] __device__(size_t i) { out[i] = __uint_as_float((uint32_t)inp[i] << 16); });
}
fsdp_status_t fsdp_cuda_f32_to_f16(uint16_t *out, const float *inp, size_t n,
                                   fsdp_cuda_stream_t stream) {
  return for_each(n, stream, [=] __device__(size_t i) { out[i] = fsdp_f16_bits(inp[i]); });
}
fsdp_status_t fsdp_cuda_f16_to_f32(float *out, const uint16_t *inp, size_t n,
                                   fsdp_cuda_stream_t stream) {
  return for_each(n, stream, [=] __device__(size_t i) { out[i] = fsdp_f16_value(inp[i]); });
}
