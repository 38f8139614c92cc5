/* src/backend/cuda/cuda_internal.cuh — what the .cu files share and nothing else sees:
 * the error macros, launch geometry, fp32/bf16 loads and stores, warp and block
 * reductions, and the row-major cuBLAS wrappers. */
#ifndef FSDP_CUDA_INTERNAL_CUH
#define FSDP_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <type_traits>

extern "C" {
#include "core/internal.h"
}
#include "backend/cuda/kernels.h"

/* ---- errors: a status with file:line, never exit() ---- */

fsdp_status_t fsdp_cuda_fail(cudaError_t err, const char *expr, const char *file, int line);
fsdp_status_t fsdp_cublas_fail(cublasStatus_t st, const char *expr, const char *file, int line);

#define CUDA_CHECK(expr)                                                            \
  do {                                                                              \
    const cudaError_t cuda_check_err_ = (expr);                                     \
    if (cuda_check_err_ != cudaSuccess)                                             \
      return fsdp_cuda_fail(cuda_check_err_, #expr, __FILE__, __LINE__);            \
  } while (0)

#define CUBLAS_CHECK(expr)                                                          \
  do {                                                                              \
    const cublasStatus_t cublas_check_st_ = (expr);                                 \
    if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                  \
      return fsdp_cublas_fail(cublas_check_st_, #expr, __FILE__, __LINE__);         \
  } while (0)

/* ---- launches and shared memory: one spelling for nvcc and the simulator ----
 * Every kernel is launched with FSDP_LAUNCH and every shared array declared
 * with FSDP_SHARED, so that the same lines build with nvcc and, against
 * tests/cudasim (-Dgpu_sim=true), run on the CPU, where the simulator's
 * cuda_runtime.h defines both to check the launch and the shared memory. A
 * template kernel is named with its arguments written out (kernel<T>): the
 * simulator takes the kernel's address, the key of its attributes
 * (cudaFuncSetAttribute). */
#ifndef FSDP_CUDA_SIM
/* kernel<<<grid, block, shmem, stream>>>(args...) */
#define FSDP_LAUNCH(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
/* __shared__ T name dims; e.g. FSDP_SHARED(float, part, [32][33]) */
#define FSDP_SHARED(T, name, dims) __shared__ T name dims
/* extern __shared__ T name[]: the launch's dynamic shared memory */
#define FSDP_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

/* After every FSDP_LAUNCH: a bad configuration is reported by the launch itself. */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* ---- launch geometry ----
 * Elementwise kernels use grid-stride loops with size_t indices, so the grid is
 * capped (any n works, including n > 2^31) and never 0: callers return early
 * when there is nothing to do, since a 0-block launch is an error. */
#define FSDP_CUDA_BLOCK 256
#define FSDP_CUDA_MAX_GRID 65536u

static inline unsigned fsdp_grid(size_t n, unsigned block) {
  const size_t g = (n + block - 1) / block;
  return g == 0 ? 1u : g > FSDP_CUDA_MAX_GRID ? FSDP_CUDA_MAX_GRID : (unsigned)g;
}

/* ---- storage types: fp32 and bf16 bit patterns, arithmetic in fp32 ---- */

struct bf16 {
  uint16_t bits;
};

/* fsdp_f32_to_bf16 bit for bit (src/core/core.c), so that GPU and CPU agree
 * exactly; __float2bfloat16_rn may treat NaN payloads differently. */
__device__ __forceinline__ uint16_t fsdp_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* fsdp_f32_to_f16 and fsdp_f16_to_f32 bit for bit (src/core/core.c): fp16
 * parameters are only cast on the device, never computed in. */
__device__ __forceinline__ uint16_t fsdp_f16_bits(float x) {
  uint32_t u = __float_as_uint(x), a = u & 0x7fffffffu;
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {
    a += 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((a - 0x38000000u) >> 13);
  }
  if (a < 0x33000000u) return sign;
  uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | (uint16_t)q;
}
__device__ __forceinline__ float fsdp_f16_value(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
  return __uint_as_float(sign | __float_as_uint((float)m * 0x1p-24f));
}

__device__ __forceinline__ float load(const float *p) { return *p; }
__device__ __forceinline__ float load(const bf16 *p) { return __uint_as_float((uint32_t)p->bits << 16); }
__device__ __forceinline__ void store(float *p, float x) { *p = x; }
__device__ __forceinline__ void store(bf16 *p, float x) { p->bits = fsdp_bf16_bits(x); }


/* ---- dtype dispatch: the one place a table entry point picks its kernel ----
 * fsdp_cuda_dispatch(op, dt, stream, f) calls f((S *)nullptr, cudaStream_t)
 * with S the storage type of dt (float or bf16); any other dtype, or a stream
 * that is not a CUDA stream (the legacy stream would race the engine's
 * non-blocking streams), is refused naming the op. Each entry point is then
 *   return fsdp_cuda_dispatch("op", dt, stream, [&](auto *tag, cudaStream_t s) {
 *     STORAGE(tag);
 *     return op(as<S>(out), ..., s); });  */
fsdp_status_t fsdp_cuda_refuse(const char *op, fsdp_dtype_t dt, fsdp_stream_t stream);

template <typename F>
static inline fsdp_status_t fsdp_cuda_dispatch(const char *op, fsdp_dtype_t dt,
                                               fsdp_stream_t stream, F &&f) {
  cudaStream_t s = static_cast<cudaStream_t>(fsdp_stream_cuda_handle(stream));
  if (!s) return fsdp_cuda_refuse(op, dt, stream);
  switch (dt) {
  case FSDP_F32: return f(static_cast<float *>(nullptr), s);
  case FSDP_BF16: return f(static_cast<bf16 *>(nullptr), s);
  default: return fsdp_cuda_refuse(op, dt, stream);
  }
}

/* cudaStream_t var of the fsdp stream `stream` for the op named op, or the
 * op's return refusing a stream of another kind (for the shard kernels, which
 * dispatch on no dtype). */
#define CUDA_STREAM(var, stream, op)                                         \
  cudaStream_t var = static_cast<cudaStream_t>(fsdp_stream_cuda_handle(stream)); \
  if (!var) return fsdp_cuda_refuse(op, FSDP_F32, stream)

/* S: the storage type a dispatch lambda was called with. */
#define STORAGE(tag) using S = std::remove_pointer_t<decltype(tag)>

/* A void pointer of the table as the kernel's storage type. */
template <typename S> static inline S *as(void *p) { return static_cast<S *>(p); }
template <typename S> static inline const S *as(const void *p) {
  return static_cast<const S *>(p);
}

/* ---- 16-byte vector access (llm.c's x128): 8 bf16 or 4 floats per load ----
 * A pack is loaded and stored as one 16-byte transaction (an int4), so a warp
 * moves 512 contiguous bytes per instruction instead of 64 with 2-byte bf16
 * loads. Kernels are templated on the pack width W: pack_width<T>() when every
 * pointer they touch is 16-byte aligned (and row strides are multiples of a
 * pack), else 1, the scalar form of the same kernel: a misaligned pointer
 * falls back, it is never read as a pack. Elements past the last whole pack
 * (n % W) are a scalar tail. */
template <typename T> struct alignas(16) pack128 {
  static constexpr int size = 16 / (int)sizeof(T);
  T v[16 / sizeof(T)];
};

template <typename T> constexpr int pack_width() { return pack128<T>::size; }

/* f[0..W) = p[0..W) as floats; p 16-byte aligned when W > 1. */
template <int W, typename T> __device__ __forceinline__ void vload(float (&f)[W], const T *p) {
  if constexpr (W == 1) {
    f[0] = load(p);
  } else {
    static_assert(W == pack128<T>::size, "a pack is 16 bytes");
    const int4 bits = *reinterpret_cast<const int4 *>(p);
    pack128<T> q;
    memcpy(&q, &bits, sizeof bits);
    for (int i = 0; i < W; ++i) f[i] = load(&q.v[i]);
  }
}

/* p[0..W) = f[0..W), each rounded once to T. */
template <int W, typename T> __device__ __forceinline__ void vstore(T *p, const float (&f)[W]) {
  if constexpr (W == 1) {
    store(p, f[0]);
  } else {
    static_assert(W == pack128<T>::size, "a pack is 16 bytes");
    pack128<T> q;
    for (int i = 0; i < W; ++i) store(&q.v[i], f[i]);
    int4 bits;
    memcpy(&bits, &q, sizeof bits);
    *reinterpret_cast<int4 *>(p) = bits;
  }
}

/* Whether p may be read as packs (NULL, an absent operand, may). */
static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Whether rows of C elements may be read as packs: every row starts 16-byte
 * aligned (C a multiple of a pack and every pointer aligned); else a kernel
 * takes the scalar form of itself. */
template <typename T> static bool rows_packable(int C, std::initializer_list<const void *> ps) {
  if (C % pack_width<T>() != 0) return false;
  for (const void *p : ps)
    if (!aligned16(p)) return false;
  return true;
}

template <typename T> struct fsdp_cuda_type;
template <> struct fsdp_cuda_type<float> {
  static constexpr cudaDataType_t value = CUDA_R_32F;
};
template <> struct fsdp_cuda_type<bf16> {
  static constexpr cudaDataType_t value = CUDA_R_16BF;
};

/* ---- reductions ---- */

template <typename A> __device__ __forceinline__ A warp_sum(A x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024), the same
 * value returned to every thread, in a fixed order: deterministic. `shared`
 * holds 32 values; the trailing barrier lets the caller reuse it at once. */
template <typename A> __device__ A block_sum(A x, A *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  A y = lane < nwarps ? shared[lane] : A(0);
  y = warp_sum(y);
  __syncthreads();
  return y;
}

__device__ __forceinline__ float block_max(float x, float *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_max(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float y = lane < nwarps ? shared[lane] : -INFINITY;
  y = warp_max(y);
  __syncthreads();
  return y;
}

/* ---- GELU, GPT-2's tanh form: the CPU's formulas (src/backend/cpu/gelu.c), tanh via
 * one expf; for the products' epilogues (blas.cu) ---- */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_value(float x) {
  const float u = GELU_K * (x + GELU_C * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

/* d gelu(x) / dx */
__device__ __forceinline__ float gelu_slope(float x) {
  const float u = GELU_K * (x + GELU_C * x * x * x);
  const float sg = 1.0f / (1.0f + expf(-2.0f * u));
  const float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
  return sg + 2.0f * x * sg * (1.0f - sg) * du;
}

/* x as T stores it: what a later kernel reading the stored value sees. */
__device__ __forceinline__ float rounded(float x, const float *) { return x; }
__device__ __forceinline__ float rounded(float x, const bf16 *) {
  return __uint_as_float((uint32_t)fsdp_bf16_bits(x) << 16);
}

/* ---- column sums over all SMs: partials, then a second pass ----
 * acc[k][c] += sum over rows r of f_k(r, c), for K outputs at once (a bias
 * gradient: K = 1; LayerNorm's weight and bias: K = 2). A (32, 8) block owns
 * 32 packs of columns and one slice of the rows; its 8 row lanes add their
 * rows in order, then the lanes in order, into scratch[k][slice][c]; a second
 * kernel adds the slices in order into acc. The grid is a function of (rows,
 * cols) alone, so the result is the same bits every run on every device, and
 * there are enough slices for ~COLSUM_TARGET_BLOCKS blocks: a 768-wide bias
 * gradient is 264 blocks, not the 24 that one block per 32 columns gives on a
 * 132-SM H100. f(r, c, v) adds the W columns c..c+W-1 of row r into v[k][.]. */
#define COLSUM_LANES 8
#define COLSUM_TARGET_BLOCKS 264
#define COLSUM_MAX_SLICES 128

template <int K, int W, typename F>
__global__ void __launch_bounds__(32 * COLSUM_LANES)
    colsum_partial_kernel(float *scratch, int rows, int cols, int per_slice, F f) {
  FSDP_SHARED(float, part, [COLSUM_LANES][K][32 * W]);
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * W;
  const int r0 = blockIdx.y * per_slice, r1 = rows - r0 < per_slice ? rows : r0 + per_slice;
  float v[K][W];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < W; ++j) v[k][j] = 0.0f;
  if (c0 < cols)
    for (int r = r0 + threadIdx.y; r < r1; r += COLSUM_LANES) f(r, c0, v);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < W; ++j) part[threadIdx.y][k][threadIdx.x * W + j] = v[k][j];
  __syncthreads();
  if (threadIdx.y != 0 || c0 >= cols) return;
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < W; ++j) {
      float t = 0.0f;
      for (int l = 0; l < COLSUM_LANES; ++l) t += part[l][k][threadIdx.x * W + j];
      scratch[((size_t)k * gridDim.y + blockIdx.y) * cols + c0 + j] = t;
    }
}

/* acc[k][c] (K pointers) += the slices' partials, added in slice order. */
template <int K>
__global__ void colsum_finish_kernel(float *acc0, float *acc1, const float *scratch, int slices,
                                     int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int k = 0; k < K; ++k) {
    float t = 0.0f;
    for (int s = 0; s < slices; ++s) t += scratch[((size_t)k * slices + s) * cols + c];
    float *acc = k == 0 ? acc0 : acc1;
    acc[c] += t;
  }
}

/* Scratch floats a column sum of `cols` columns and K outputs needs. */
static inline size_t colsum_scratch_floats(int K, int cols) {
  return (size_t)K * COLSUM_MAX_SLICES * (size_t)(cols > 0 ? cols : 0);
}

template <int K, int W, typename F>
static fsdp_status_t colsum(float *acc0, float *acc1, float *scratch, int rows, int cols, F f,
                            cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return FSDP_SUCCESS;
  const int col_blocks = (cols + 32 * W - 1) / (32 * W);
  int slices = (COLSUM_TARGET_BLOCKS + col_blocks - 1) / col_blocks;
  const int most = (rows + COLSUM_LANES - 1) / COLSUM_LANES;
  slices = slices > COLSUM_MAX_SLICES ? COLSUM_MAX_SLICES : slices;
  slices = slices > most ? most : slices;
  const int per_slice = (rows + slices - 1) / slices;
  slices = (rows + per_slice - 1) / per_slice; /* no empty slice */
  FSDP_LAUNCH((colsum_partial_kernel<K, W, F>), dim3(col_blocks, slices), dim3(32, COLSUM_LANES),
              0, s, scratch, rows, cols, per_slice, f);
  LAUNCH_CHECK();
  FSDP_LAUNCH(colsum_finish_kernel<K>, (unsigned)((cols + 255) / 256), 256, 0, s, acc0, acc1,
              scratch, slices, cols);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- cuBLAS on row-major buffers (blas.cu) ----
 * C (m,n) = alpha op(A) (m,k) @ op(B) (k,n) + beta C, every matrix row-major
 * with its leading dimension, as cblas_sgemm(CblasRowMajor, ...) takes them;
 * ta/tb say whether A/B are used transposed. A and B have type `ab`, C type
 * `c` (CUDA_R_32F or CUDA_R_16BF); compute is always fp32. */
struct fsdp_gemm {
  bool ta, tb;
  int m, n, k;
  float alpha;
  const void *A;
  int lda;
  long long strideA;
  const void *B;
  int ldb;
  long long strideB;
  float beta;
  void *C;
  int ldc;
  long long strideC;
  int batch; /* 1: a plain product; >1: strided batches (strides in elements) */
  cudaDataType_t ab, c;
};

fsdp_status_t fsdp_cuda_gemm(const struct fsdp_gemm *g, cudaStream_t stream);

/* ---- fused causal flash attention, bf16 (flash.cu) ----
 * qkv (B,T,(NH+2*NKV)*D), out (B,T,C), lse (B,NH,T) fp32, D = C/NH, NKV KV
 * heads (0: NH); backward writes dqkv, reads forward's out and uses
 * scratch, (B,NH,T) floats. Head size a multiple of 16 up to 128, NKV
 * dividing NH, pointers 16-byte aligned, else FSDP_ERR_INVALID_ARGUMENT
 * naming the value. */
fsdp_status_t fsdp_cuda_flash_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int C,
                                      int NH, int NKV, cudaStream_t stream);
fsdp_status_t fsdp_cuda_flash_backward(bf16 *dqkv, float *scratch, const bf16 *dout,
                                       const bf16 *qkv, const bf16 *out, const float *lse, int B,
                                       int T, int C, int NH, int NKV, cudaStream_t stream);

#endif
