/* src/cuda/elementwise.cu — elementwise kernels: GELU and the residual
 * add (fp32 and bf16, 16-byte vector access), the shard kernels axpy and
 * scale, and the f32 <-> bf16 and f32 <-> fp16 casts. Grid-stride loops over
 * size_t indices; math in fp32. */
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

/* ---- GELU and the residual: 16-byte packs, a scalar tail ----
 * One kernel per op, templated on the pack width W (cuda_internal.cuh): the
 * grid strides over whole packs, then over the n % W elements left, one at a
 * time. W is 1 (scalar access everywhere) when a pointer is not 16-byte
 * aligned. */

/* y[i] = op(i) for n elements: op(x, k) maps the k-th input packs to outputs. */
template <int W, typename T, typename Op>
__global__ void map_kernel(T *out, const T *a, const T *b, const T *c, size_t n, Op op) {
  const size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t packs = n / W;
  for (size_t p = tid; p < packs; p += stride) {
    float x[W], y[W] = {}, z[W] = {}, o[W];
    vload<W>(x, a + p * W);
    if (b) vload<W>(y, b + p * W);
    if (c) vload<W>(z, c + p * W);
    for (int j = 0; j < W; ++j) o[j] = op(x[j], b ? y[j] : 0.0f, c ? z[j] : 0.0f);
    vstore<W>(out + p * W, o);
  }
  for (size_t i = packs * W + tid; i < n; i += stride)
    store(out + i, op(load(a + i), b ? load(b + i) : 0.0f, c ? load(c + i) : 0.0f));
}

/* out = op(a, b, c) elementwise (b, c may be NULL: op sees 0), as packs when
 * every pointer allows. */
template <typename T, typename Op>
static fsdp_status_t map(T *out, const T *a, const T *b, const T *c, size_t n, Op op,
                         cudaStream_t s) {
  if (n == 0) return FSDP_SUCCESS;
  constexpr int W = pack_width<T>();
  if (aligned16(out) && aligned16(a) && aligned16(b) && aligned16(c)) {
    const size_t work = n / W > 0 ? n / W : n;
    FSDP_LAUNCH((map_kernel<W, T, Op>), fsdp_grid(work, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s,
                out, a, b, c, n, op);
  } else {
    FSDP_LAUNCH((map_kernel<1, T, Op>), fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, out,
                a, b, c, n, op);
  }
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

struct gelu_op {
  __device__ float operator()(float x, float, float) const { return gelu_value(x); }
};
/* dinp + gelu'(x) * dout, the CPU's accumulation */
struct gelu_backward_op {
  __device__ float operator()(float dinp, float x, float dout) const {
    return dinp + gelu_slope(x) * dout;
  }
};
struct add_op {
  __device__ float operator()(float a, float b, float) const { return a + b; }
};

template <typename T>
static fsdp_status_t gelu_forward(T *out, const T *inp, size_t n, cudaStream_t s) {
  return map(out, inp, (const T *)nullptr, (const T *)nullptr, n, gelu_op{}, s);
}

template <typename T>
static fsdp_status_t gelu_backward(T *dinp, const T *inp, const T *dout, size_t n,
                                   cudaStream_t s) {
  return map(dinp, (const T *)dinp, inp, dout, n, gelu_backward_op{}, s);
}

template <typename T>
static fsdp_status_t residual_forward(T *out, const T *a, const T *b, size_t n, cudaStream_t s) {
  return map(out, a, b, (const T *)nullptr, n, add_op{}, s);
}

/* ---- shard kernels ---- */

template <typename T>
static fsdp_status_t axpy(float *y, const T *x, float scale, size_t n, cudaStream_t s) {
  /* The engine's loop is g[i] += scale * src[i]: same two roundings here. */
  return for_each(n, s, [=] __device__(size_t i) { y[i] += __fmul_rn(scale, load(x + i)); });
}

/* ---- the table's entry points ---- */

fsdp_status_t fsdp_cuda_gelu_forward(fsdp_dtype_t dt, void *out, const void *inp, size_t n,
                                     fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("gelu_forward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return gelu_forward(as<S>(out), as<S>(inp), n, s);
  });
}

fsdp_status_t fsdp_cuda_gelu_backward(fsdp_dtype_t dt, void *dinp, const void *inp,
                                      const void *dout, size_t n, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("gelu_backward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return gelu_backward(as<S>(dinp), as<S>(inp), as<S>(dout), n, s);
  });
}

fsdp_status_t fsdp_cuda_residual_forward(fsdp_dtype_t dt, void *out, const void *a, const void *b,
                                         size_t n, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("residual_forward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return residual_forward(as<S>(out), as<S>(a), as<S>(b), n, s);
  });
}

/* ---- the engine's shard kernels ---- */

fsdp_status_t fsdp_cuda_scale(float *x, float a, size_t n, fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "scale");
  return for_each(n, s, [=] __device__(size_t i) { x[i] *= a; });
}

fsdp_status_t fsdp_cuda_axpy(float *y, fsdp_dtype_t xdt, const void *x, float a, size_t n,
                             fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "axpy");
  switch (xdt) {
  case FSDP_F32: return axpy(y, as<float>(x), a, n, s);
  case FSDP_BF16: return axpy(y, as<bf16>(x), a, n, s);
  default: return fsdp_cuda_refuse("axpy", xdt, stream);
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

fsdp_status_t fsdp_cuda_cast(fsdp_dtype_t dst_dt, void *dst, fsdp_dtype_t src_dt,
                             const void *src, size_t n, fsdp_stream_t stream) {
  CUDA_STREAM(s, stream, "cast");
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
