/* src/backend/cuda/elementwise.cu — elementwise kernels: the shard kernels axpy and
 * scale, the f32 <-> bf16 and f32 <-> fp16 casts, and the MLP's ReLU. Grid-stride loops over
 * size_t indices; math in fp32. (GELU and the residual add run fused into
 * the products and the LayerNorm: blas.cu, layernorm.cu.) */
#include "backend/cuda/cuda_internal.cuh"

/* Runs f(i) for every i < n: a grid-stride loop, so any n fits the capped grid. */
template <typename F> __global__ void for_each_kernel(size_t n, F f) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    f(i);
}

template <typename F> static fsdp_status_t for_each(size_t n, cudaStream_t s, F f) {
  if (n == 0) return FSDP_SUCCESS;
  FSDP_LAUNCH(for_each_kernel<F>, fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, n, f);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- shard kernels ---- */

template <typename T>
static fsdp_status_t axpy(float *y, const T *x, float scale, size_t n, cudaStream_t s) {
  /* The engine's loop is g[i] += scale * src[i]: same two roundings here. */
  return for_each(n, s, [=] __device__(size_t i) { y[i] += __fmul_rn(scale, load(x + i)); });
}

/* ---- ReLU, in place: the CPU's selects ---- */

template <typename T> static fsdp_status_t relu_forward(T *x, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) {
    if (!(load(x + i) > 0.0f)) store(x + i, 0.0f);
  });
}

template <typename T>
static fsdp_status_t relu_backward(T *dx, const T *out, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) {
    if (!(load(out + i) > 0.0f)) store(dx + i, 0.0f);
  });
}

fsdp_status_t fsdp_cuda_relu_forward(const fsdp_relu_forward_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("relu_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return relu_forward(as<S>(a->x), a->n, s);
  });
}

fsdp_status_t fsdp_cuda_relu_backward(const fsdp_relu_backward_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("relu_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return relu_backward(as<S>(a->dx), as<S>(a->out), a->n, s);
  });
}

/* ---- the engine's shard kernels ---- */

/* The device lambdas capture the fields by value, never the host descriptor. */
fsdp_status_t fsdp_cuda_scale(const fsdp_scale_args_t *a, fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "scale");
  float *x = a->x;
  const float alpha = a->alpha;
  return for_each(a->n, s, [=] __device__(size_t i) { x[i] *= alpha; });
}

fsdp_status_t fsdp_cuda_axpy(const fsdp_axpy_args_t *a, fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "axpy");
  switch (a->xdt) {
  case FSDP_F32: return axpy(a->y, as<float>(a->x), a->alpha, a->n, s);
  case FSDP_BF16: return axpy(a->y, as<bf16>(a->x), a->alpha, a->n, s);
  default: return fsdp_cuda_refuse("axpy", a->xdt, stream);
  }
}

/* ---- casts, bit for bit the host's (cuda_internal.cuh) ---- */

static fsdp_status_t to_bf16(uint16_t *out, const float *inp, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) { out[i] = fsdp_bf16_bits(inp[i]); });
}
static fsdp_status_t from_bf16(float *out, const uint16_t *inp, size_t n, cudaStream_t s) {
  return for_each(n, s,
                  [=] __device__(size_t i) { out[i] = __uint_as_float((uint32_t)inp[i] << 16); });
}
static fsdp_status_t to_f16(uint16_t *out, const float *inp, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) { out[i] = fsdp_f16_bits(inp[i]); });
}
static fsdp_status_t from_f16(float *out, const uint16_t *inp, size_t n, cudaStream_t s) {
  return for_each(n, s, [=] __device__(size_t i) { out[i] = fsdp_f16_value(inp[i]); });
}

fsdp_status_t fsdp_cuda_cast(const fsdp_cast_args_t *a, fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "cast");
  const fsdp_dtype_t src_dt = a->src_dt, dst_dt = a->dst_dt;
  void *dst = a->dst;
  const void *src = a->src;
  const size_t n = a->n;
  if (src_dt == FSDP_F32 && dst_dt == FSDP_BF16)
    return to_bf16(as<uint16_t>(dst), as<float>(src), n, s);
  if (src_dt == FSDP_F32 && dst_dt == FSDP_F16)
    return to_f16(as<uint16_t>(dst), as<float>(src), n, s);
  if (src_dt == FSDP_BF16 && dst_dt == FSDP_F32)
    return from_bf16(as<float>(dst), as<uint16_t>(src), n, s);
  if (src_dt == FSDP_F16 && dst_dt == FSDP_F32)
    return from_f16(as<float>(dst), as<uint16_t>(src), n, s);
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "CUDA cast: no %s -> %s kernel (f32 to and from bf16 "
                    "and f16)", fsdp_dtype_name(src_dt), fsdp_dtype_name(dst_dt));
}
