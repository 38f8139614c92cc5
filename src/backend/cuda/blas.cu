/* src/backend/cuda/blas.cu — CUDA error reporting, the cuBLAS handle cache, row-major
 * matrix products through cuBLAS, and GPT-2's products on them (the blocks'
 * linear / Conv1D layers with their bias and GELU, the vocabulary head). */
#include <mutex>

#include "backend/cuda/cublas_lazy.h"
#include "backend/cuda/cuda_internal.cuh"

/* cuBLAS, opened on first use (cublas_lazy.h); NULL with the reason set. */
static const fsdp_cublas_t *cublas_api(void) {
  const char *why = nullptr;
  const fsdp_cublas_t *api = fsdp_cublas(&why);
  if (!api) fsdp_error(FSDP_ERR_UNSUPPORTED, "cuBLAS: %s", why);
  return api;
}

/* ---- errors ---- */

fsdp_status_t fsdp_cuda_fail(cudaError_t err, const char *expr, const char *file, int line) {
  const fsdp_status_t st = err == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY
                           : err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver
                               ? FSDP_ERR_UNSUPPORTED
                               : FSDP_ERR_SYSTEM;
  return fsdp_error(st, "%s:%d: %s failed: %s (%s)", file, line, expr, cudaGetErrorString(err),
                    cudaGetErrorName(err));
}

fsdp_status_t fsdp_cublas_fail(cublasStatus_t s, const char *expr, const char *file, int line) {
  const fsdp_status_t st = s == CUBLAS_STATUS_ALLOC_FAILED     ? FSDP_ERR_OUT_OF_MEMORY
                           : s == CUBLAS_STATUS_NOT_SUPPORTED ||
                                   s == CUBLAS_STATUS_ARCH_MISMATCH
                               ? FSDP_ERR_UNSUPPORTED
                           : s == CUBLAS_STATUS_INVALID_VALUE ? FSDP_ERR_INVALID_ARGUMENT
                                                              : FSDP_ERR_SYSTEM;
  const fsdp_cublas_t *api = fsdp_cublas(nullptr);
  return fsdp_error(st, "%s:%d: %s failed: %s", file, line, expr,
                    api ? api->status_string(s) : "cuBLAS status");
}

fsdp_status_t fsdp_cuda_refuse(const char *op, fsdp_dtype_t dt, fsdp_stream_t stream) {
  if (!fsdp_stream_cuda_handle(stream))
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "CUDA %s: given %s, not a CUDA stream (fsdp_stream_create_cuda; the "
                      "engine's is fsdp_engine_stream of a config.device FSDP_DEVICE_CUDA engine)",
                      op, stream ? "a CPU worker stream" : "the host stream");
  return fsdp_error(FSDP_ERR_UNSUPPORTED,
                    "CUDA %s: no %s kernel (the CUDA kernels are built for f32 and bf16)", op,
                    fsdp_dtype_name(dt));
}

/* ---- handle cache ----
 * One cuBLAS handle per (device, stream), bound to its stream once at creation
 * and never reconfigured, which cuBLAS allows to be shared between host
 * threads. A handle owns a workspace, so handles are not made per call; a
 * small table under a lock is all the bookkeeping this needs. */

namespace {
struct blas_slot {
  int device;
  cudaStream_t stream;
  cublasHandle_t handle;
};
std::mutex blas_lock;
blas_slot blas_slots[FSDP_CUDA_MAX_BLAS_HANDLES];
int blas_count;
} // namespace

static fsdp_status_t blas_create(int device, cudaStream_t stream, cublasHandle_t *out) {
  const fsdp_cublas_t *api = cublas_api();
  if (!api) return FSDP_ERR_UNSUPPORTED;
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(api->create(&h));
  const cublasStatus_t st = api->set_stream(h, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    api->destroy(h);
    return fsdp_cublas_fail(st, "cublasSetStream(h, stream)", __FILE__, __LINE__);
  }
  blas_slots[blas_count++] = blas_slot{device, stream, h};
  *out = h;
  return FSDP_SUCCESS;
}

static fsdp_status_t blas_handle(cudaStream_t stream, cublasHandle_t *out) {
  int device;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> guard(blas_lock);
  for (int i = 0; i < blas_count; ++i)
    if (blas_slots[i].device == device && blas_slots[i].stream == stream) {
      *out = blas_slots[i].handle;
      return FSDP_SUCCESS;
    }
  if (blas_count == FSDP_CUDA_MAX_BLAS_HANDLES)
    return fsdp_error(FSDP_ERR_UNSUPPORTED,
                      "cuBLAS: %d (device, stream) pairs already have a handle; run the "
                      "matrix products on fewer streams or call fsdp_cuda_blas_release first",
                      FSDP_CUDA_MAX_BLAS_HANDLES);
  return blas_create(device, stream, out);
}

fsdp_status_t fsdp_cuda_blas_prepare(fsdp_stream_t s, int *created) {
  CUDA_STREAM(stream, s, "prepare");
  int before;
  {
    std::lock_guard<std::mutex> guard(blas_lock);
    before = blas_count;
  }
  cublasHandle_t h;
  FSDP_TRY(blas_handle(stream, &h));
  if (created) {
    std::lock_guard<std::mutex> guard(blas_lock);
    *created = blas_count > before;
  }
  return FSDP_SUCCESS;
}

/* Destroys every handle even when one fails, and reports the first failure. */
fsdp_status_t fsdp_cuda_blas_release(void) {
  int current;
  CUDA_CHECK(cudaGetDevice(&current));
  std::lock_guard<std::mutex> guard(blas_lock);
  fsdp_status_t first = FSDP_SUCCESS;
  for (int i = 0; i < blas_count; ++i) {
    /* A handle is destroyed on the device it was made on. */
    const cudaError_t e = cudaSetDevice(blas_slots[i].device);
    const cublasStatus_t s =
        e == cudaSuccess ? fsdp_cublas(nullptr)->destroy(blas_slots[i].handle)
                         : CUBLAS_STATUS_SUCCESS; /* a handle exists: cuBLAS is open */
    if (first == FSDP_SUCCESS && e != cudaSuccess)
      first = fsdp_cuda_fail(e, "cudaSetDevice(device)", __FILE__, __LINE__);
    else if (first == FSDP_SUCCESS && s != CUBLAS_STATUS_SUCCESS)
      first = fsdp_cublas_fail(s, "cublasDestroy(handle)", __FILE__, __LINE__);
  }
  blas_count = 0;
  const cudaError_t e = cudaSetDevice(current); /* the caller's device, as it was */
  if (first == FSDP_SUCCESS && e != cudaSuccess)
    first = fsdp_cuda_fail(e, "cudaSetDevice(current)", __FILE__, __LINE__);
  return first;
}

/* ---- row-major products ----
 * cuBLAS is column-major and our buffers are row-major. A row-major (r x c)
 * matrix with leading dimension ld is, byte for byte, the column-major (c x r)
 * matrix with the same ld: its transpose. So the row-major product
 *     C (m x n) = op(A) (m x k) @ op(B) (k x n)
 * is, read column-major, C^T (n x m) = op(B)^T (n x k) @ op(A)^T (k x m):
 * cuBLAS with the operands swapped (B first), m and n swapped, and the same
 * transpose flags and leading dimensions, because the column-major view of
 * each stored operand is already its transpose. Every product in src/backend/cuda goes
 * through here, so each call site reads exactly like the CPU kernel's
 * cblas_sgemm(CblasRowMajor, ...) call.
 * Compute is CUBLAS_COMPUTE_32F in the default math mode: fp32 inputs give
 * Sgemm's arithmetic (no TF32), bf16 inputs run on tensor cores with fp32
 * accumulation. */
fsdp_status_t fsdp_cuda_gemm(const struct fsdp_gemm *g, cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  FSDP_TRY(blas_handle(stream, &h));
  const fsdp_cublas_t *api = fsdp_cublas(nullptr); /* open: a handle exists */
  const cublasOperation_t opA = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (g->batch == 1)
    CUBLAS_CHECK(api->gemm_ex(h, opB, opA, g->n, g->m, g->k, &g->alpha, g->B, g->ab, g->ldb, g->A,
                              g->ab, g->lda, &g->beta, g->C, g->c, g->ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_CHECK(api->gemm_strided_batched_ex(
        h, opB, opA, g->n, g->m, g->k, &g->alpha, g->B, g->ab, g->ldb, g->strideB, g->A, g->ab,
        g->lda, g->strideA, &g->beta, g->C, g->c, g->ldc, g->strideC, g->batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return FSDP_SUCCESS;
}

/* One row-major product, unbatched, A and B of type T, C of type TC. */
template <typename T, typename TC>
static fsdp_status_t gemm(bool ta, bool tb, int m, int n, int k, const T *A, int lda, const T *B,
                          int ldb, float beta, TC *C, int ldc, cudaStream_t stream) {
  const fsdp_gemm g = {ta, tb, m, n, k, 1.0f, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1,
                       fsdp_cuda_type<T>::value, fsdp_cuda_type<TC>::value};
  return fsdp_cuda_gemm(&g, stream);
}

/* ---- the blocks' products: linear and Conv1D ----
 * Why our own epilogue kernel and not cuBLASLt's (CUBLASLT_EPILOGUE_BIAS,
 * GELU_AUX_BIAS, DGELU, as llm.c does): the products here run under the
 * simulator in CI against a reference cuBLAS, which has no cuBLASLt, and
 * cuBLASLt's epilogues carry constraints of their own (the GELU aux leading
 * dimension a multiple of 8, NOT_SUPPORTED for some shapes and types) that a
 * reference would have to model faithfully before its green meant anything on
 * a GPU. So every product writes its output with beta = 0 (no fill, no zeroed
 * buffer read back) and one vectorised pass follows it: + bias, and GELU for
 * the MLP's fc (keeping the pre-activation for backward), or gelu'(pre) for
 * the fc-proj product's d(input). The price against a cuBLASLt epilogue: one
 * read and one write of the output per product (bench/gpu-budget.md counts
 * it), and in bf16 the product is rounded before the bias is added (two
 * roundings, not one). cuBLASLt with a simulator reference is the next step. */

/* One pass after a beta = 0 product y (rows, OC), rows of OC elements:
 * y += bias (bias may be NULL); with gelu, act = gelu(y) (y keeps the
 * pre-activation, rounded as stored, which is what backward will read); with
 * dgelu (pre not NULL), y *= gelu'(pre). Columns come in packs of W (OC % W
 * == 0 when W > 1). */
template <int W, typename T>
__global__ void epilogue_kernel(T *y, T *act, const T *bias, const T *pre, size_t rows, int OC) {
  const size_t per_row = (size_t)OC / W, packs = rows * per_row;
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < packs;
       p += (size_t)gridDim.x * blockDim.x) {
    const size_t i = p * W;
    float v[W], b[W];
    vload<W>(v, y + i);
    if (bias) {
      vload<W>(b, bias + (p % per_row) * W);
      for (int j = 0; j < W; ++j) v[j] += b[j];
    }
    if (pre) {
      vload<W>(b, pre + i);
      for (int j = 0; j < W; ++j) v[j] *= gelu_slope(b[j]);
    }
    vstore<W>(y + i, v);
    if (act) {
      for (int j = 0; j < W; ++j) v[j] = gelu_value(rounded(v[j], y));
      vstore<W>(act + i, v);
    }
  }
}

template <typename T>
static fsdp_status_t epilogue(T *y, T *act, const T *bias, const T *pre, int rows, int OC,
                              cudaStream_t s) {
  if (!bias && !act && !pre) return FSDP_SUCCESS;
  constexpr int W = pack_width<T>();
  const size_t n = (size_t)rows * (size_t)OC;
  if (OC % W == 0 && aligned16(y) && aligned16(act) && aligned16(bias) && aligned16(pre))
    FSDP_LAUNCH((epilogue_kernel<W, T>), fsdp_grid(n / W, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s,
                y, act, bias, pre, (size_t)rows, OC);
  else
    FSDP_LAUNCH((epilogue_kernel<1, T>), fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, y,
                act, bias, pre, (size_t)rows, OC);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* acc[c] += sum over rows of x (rows, cols), over all SMs (colsum). */
template <typename T>
static fsdp_status_t bias_grad(float *acc, float *scratch, const T *x, int rows, int cols,
                               cudaStream_t s) {
  constexpr int W = pack_width<T>();
  if (cols % W == 0 && aligned16(x))
    return colsum<1, W>(acc, nullptr, scratch, rows, cols,
                        [=] __device__(int r, int c, float(&v)[1][W]) {
                          float t[W];
                          vload<W>(t, x + (size_t)r * cols + c);
                          for (int j = 0; j < W; ++j) v[0][j] += t[j];
                        },
                        s);
  return colsum<1, 1>(acc, nullptr, scratch, rows, cols,
                      [=] __device__(int r, int c, float(&v)[1][1]) {
                        v[0][0] += load(x + (size_t)r * cols + c);
                      },
                      s);
}

/* y (B,OC) = inp (B,C) @ op(weight), beta = 0; op transposes a (OC,C) weight. */
template <typename T>
static fsdp_status_t product(T *y, const T *inp, const T *weight, int B, int C, int OC,
                             bool weight_out_in, cudaStream_t s) {
  if (C <= 0) { /* cuBLAS rejects a leading dimension of 0: an empty sum is 0 */
    CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)B * OC * sizeof(T), s)); /* 0 bits: 0.0 in bf16 */
    return FSDP_SUCCESS;
  }
  if (weight_out_in) return gemm(false, true, B, OC, C, inp, C, weight, C, 0.0f, y, OC, s);
  return gemm(false, false, B, OC, C, inp, C, weight, OC, 0.0f, y, OC, s);
}

/* out = [gelu](inp @ op(weight) + bias); with pre, pre holds the
 * pre-activation and out its GELU. */
template <typename T>
static fsdp_status_t matmul_forward(const fsdp_matmul_forward_args_t &a, cudaStream_t s) {
  if (a.B <= 0 || a.OC <= 0) return FSDP_SUCCESS;
  T *out = as<T>(a.out), *pre = as<T>(a.pre);
  T *y = pre ? pre : out;
  FSDP_TRY(product(y, as<T>(a.inp), as<T>(a.weight), a.B, a.C, a.OC, a.weight_out_in != 0, s));
  return epilogue(y, pre ? out : nullptr, as<T>(a.bias), (const T *)nullptr, a.B, a.OC, s);
}

/* d(input) written (beta = 0), times gelu'(gelu_pre) when given; dweight +=
 * (the gradient accumulates over micro-batches); dbias += over all SMs. */
template <typename T>
static fsdp_status_t matmul_backward(const fsdp_matmul_backward_args_t &a, cudaStream_t s) {
  const int B = a.B, C = a.C, OC = a.OC;
  T *dinp = as<T>(a.dinp);
  const T *dout = as<T>(a.dout), *inp = as<T>(a.inp), *weight = as<T>(a.weight);
  float *dweight = a.dweight, *dbias = a.dbias, *scratch = static_cast<float *>(a.scratch);
  if (B <= 0) return FSDP_SUCCESS;
  if (OC <= 0) { /* an empty sum: d(input) is 0, dweight and dbias are empty */
    if (dinp && C > 0) CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)B * C * sizeof(T), s));
    return FSDP_SUCCESS;
  }
  if (dbias && !scratch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "matmul_backward: dbias needs scratch of "
                      "fsdp_cuda_colsum_scratch_bytes(%d) bytes, got NULL", OC);
  if (dbias) FSDP_TRY(bias_grad(dbias, scratch, dout, B, OC, s));
  if (C <= 0) return FSDP_SUCCESS;
  if (dinp && a.weight_out_in)
    FSDP_TRY(gemm(false, false, B, C, OC, dout, OC, weight, C, 0.0f, dinp, C, s));
  else if (dinp)
    FSDP_TRY(gemm(false, true, B, C, OC, dout, OC, weight, OC, 0.0f, dinp, C, s));
  if (dinp && a.gelu_pre)
    FSDP_TRY(epilogue(dinp, (T *)nullptr, (const T *)nullptr, as<T>(a.gelu_pre), B, C, s));
  if (a.weight_out_in) return gemm(true, false, OC, C, B, dout, OC, inp, C, 1.0f, dweight, C, s);
  return gemm(true, false, C, OC, B, inp, C, dout, OC, 1.0f, dweight, OC, s);
}

/* The table's entry points: one per op, the storage type picked in
 * fsdp_cuda_dispatch. */

size_t fsdp_cuda_colsum_scratch_bytes(int cols) {
  return colsum_scratch_floats(2, cols) * sizeof(float);
}

fsdp_status_t fsdp_cuda_matmul_forward(const fsdp_matmul_forward_args_t *a,
                                       fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("matmul_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return matmul_forward<S>(*a, s);
  });
}

fsdp_status_t fsdp_cuda_matmul_backward(const fsdp_matmul_backward_args_t *a,
                                        fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("matmul_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return matmul_backward<S>(*a, s);
  });
}

/* ---- GPT-2's vocabulary head: logits rows ld apart ---- */

template <typename T>
static fsdp_status_t head_forward(const fsdp_head_forward_args_t &a, cudaStream_t s) {
  const int B = a.B, C = a.C, V = a.V, ld = a.ld;
  T *logits = as<T>(a.logits);
  if (B <= 0 || V <= 0) return FSDP_SUCCESS;
  if (C <= 0) { /* cuBLAS rejects a leading dimension of 0: an empty sum is 0 */
    for (int b = 0; b < B; b++)
      CUDA_CHECK(cudaMemsetAsync(logits + (size_t)b * ld, 0, (size_t)V * sizeof(T), s));
    return FSDP_SUCCESS;
  }
  return gemm(false, true, B, V, C, as<T>(a.inp), C, as<T>(a.wte), C, 0.0f, logits, ld, s);
}

template <typename T>
static fsdp_status_t head_backward(const fsdp_head_backward_args_t &a, cudaStream_t s) {
  const int B = a.B, C = a.C, V = a.V, ld = a.ld;
  const T *dlogits = as<T>(a.dlogits);
  if (B <= 0 || V <= 0 || C <= 0) return FSDP_SUCCESS;
  if (a.dinp)
    FSDP_TRY(gemm(false, false, B, C, V, dlogits, ld, as<T>(a.wte), C, 1.0f, as<T>(a.dinp), C, s));
  return gemm(true, false, V, C, B, dlogits, ld, as<T>(a.inp), C, 1.0f, a.dwte, C, s);
}

fsdp_status_t fsdp_cuda_head_forward(const fsdp_head_forward_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("head_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return head_forward<S>(*a, s);
  });
}

fsdp_status_t fsdp_cuda_head_backward(const fsdp_head_backward_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("head_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return head_backward<S>(*a, s);
  });
}
