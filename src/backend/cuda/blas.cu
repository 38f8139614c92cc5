/* src/backend/cuda/blas.cu — CUDA error reporting, the cuBLAS handle cache, row-major
 * matrix products through cuBLAS, and GPT-2's products on them (the blocks'
 * linear / Conv1D layers with their bias and GELU, the vocabulary head). */
#include <mutex>

#include "backend/cuda/cublas_lazy.h"
#include "backend/cuda/cublaslt_lazy.h"
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
 * small table under a lock is all the bookkeeping this needs. Each slot also
 * holds the stream's cuBLASLt workspace (lt_workspace_bytes; cuBLASLt takes
 * it per call, not per handle): the products of one stream run in its order,
 * so one workspace a stream is never used by two products at once, which a
 * workspace shared between streams would be. */

namespace {
struct blas_slot {
  int device;
  cudaStream_t stream;
  cublasHandle_t handle;
  void *lt_ws; /* cuBLASLt's workspace, lt_ws_bytes of device memory (NULL when 0) */
  size_t lt_ws_bytes;
};
std::mutex blas_lock;
blas_slot blas_slots[FSDP_CUDA_MAX_BLAS_HANDLES];
int blas_count;

/* cuBLASLt (the blocks' products with their epilogues): one (device, type,
 * layer shape, epilogue)'s decision, the algorithm its heuristic gave or none. */
struct lt_choice {
  int device, dt, B, C, OC, linear, epilogue;
  bool ok;
  cublasLtMatmulAlgo_t algo;
  size_t ws; /* the workspace the algorithm takes, at most the stream's */
};
constexpr int kLtChoices = 64;
std::mutex lt_lock;
/* A cuBLASLt handle belongs to the device current at its creation (it
 * carries no stream): one per device, made at the device's first decision. */
constexpr int kLtDevices = 64;
cublasLtHandle_t lt_handles[kLtDevices];
lt_choice lt_choices[kLtChoices];
int lt_count;
} // namespace

/* ---- cuBLASLt's workspace ----
 * The size the toolkit recommends for a cuBLAS workspace (cublasSetWorkspace's
 * documentation; PyTorch's cuBLASLt default follows it): 32 MiB from Hopper
 * (compute capability 9) on, 4 MiB before. Without one, cuBLASLt's heuristic
 * chooses only among the kernels that need none, which leaves out split-K and
 * other kernels Hopper's fastest products use. FSDP_CUBLASLT_WORKSPACE_KIB
 * sets it in KiB for every device (0: none, the choice before this existed),
 * read once where cuBLASLt is present; a value that is not a whole number of
 * KiB up to 1 GiB (digits only) is an error naming it at the first product
 * or prepare. */
namespace {
constexpr long long kWorkspaceMaxKib = 1 << 20;
struct workspace_env {
  bool set, bad;
  long long kib;
  char text[64];
};
const workspace_env &workspace_setting() {
  static const workspace_env env = [] {
    workspace_env e{false, false, 0, ""};
    const char *v = getenv("FSDP_CUBLASLT_WORKSPACE_KIB");
    if (!v) return e;
    e.set = true;
    snprintf(e.text, sizeof e.text, "%s", v);
    char *end = nullptr;
    e.kib = strtoll(v, &end, 10);
    e.bad = *v < '0' || *v > '9' || *end || e.kib > kWorkspaceMaxKib;
    return e;
  }();
  return env;
}
} // namespace

static fsdp_status_t lt_workspace_bytes(int device, size_t *bytes) {
  const workspace_env &env = workspace_setting();
  if (env.bad)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "FSDP_CUBLASLT_WORKSPACE_KIB=%s: expected a whole number of KiB from 0 "
                      "(no cuBLASLt workspace) to %lld; unset, 32768 on compute capability 9 "
                      "and later, 4096 before",
                      env.text, kWorkspaceMaxKib);
  if (env.set) {
    *bytes = (size_t)env.kib << 10;
    return FSDP_SUCCESS;
  }
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  *bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
  return FSDP_SUCCESS;
}

/* The caller holds blas_lock. With cuBLASLt present, the stream's cuBLASLt
 * workspace is allocated with the handle. */
static fsdp_status_t blas_create(int device, cudaStream_t stream, blas_slot **out) {
  const fsdp_cublas_t *api = cublas_api();
  if (!api) return FSDP_ERR_UNSUPPORTED;
  size_t ws_bytes = 0;
  if (fsdp_cublaslt(nullptr)) FSDP_TRY(lt_workspace_bytes(device, &ws_bytes));
  void *ws = nullptr;
  if (ws_bytes) {
    const cudaError_t e = cudaMalloc(&ws, ws_bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* reported here, not by the next launch's check */
      return fsdp_error(e == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_SYSTEM,
                        "cuBLASLt: the %.1f MiB workspace of a stream on device %d: cudaMalloc "
                        "failed: %s (FSDP_CUBLASLT_WORKSPACE_KIB sets a smaller one, 0 none)",
                        (double)ws_bytes / 1048576.0, device, cudaGetErrorString(e));
    }
  }
  cublasHandle_t h = nullptr;
  cublasStatus_t st = api->create(&h);
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = api->set_stream(h, stream);
    if (st != CUBLAS_STATUS_SUCCESS) api->destroy(h);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaFree(ws);
    return fsdp_cublas_fail(st, h ? "cublasSetStream(h, stream)" : "cublasCreate(&h)",
                            __FILE__, __LINE__);
  }
  blas_slots[blas_count] = blas_slot{device, stream, h, ws, ws_bytes};
  *out = &blas_slots[blas_count++];
  return FSDP_SUCCESS;
}

/* The slot of (current device, stream), made at the first ask. The pointer
 * stays valid until fsdp_cuda_blas_release. */
static fsdp_status_t blas_slot_of(cudaStream_t stream, blas_slot **out) {
  int device;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> guard(blas_lock);
  for (int i = 0; i < blas_count; ++i)
    if (blas_slots[i].device == device && blas_slots[i].stream == stream) {
      *out = &blas_slots[i];
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
  blas_slot *slot;
  FSDP_TRY(blas_slot_of(stream, &slot));
  if (created) {
    std::lock_guard<std::mutex> guard(blas_lock);
    *created = blas_count > before;
  }
  return FSDP_SUCCESS;
}

/* Destroys every handle and frees every workspace even when one fails, and
 * reports the first failure. */
fsdp_status_t fsdp_cuda_blas_release(void) {
  int current;
  CUDA_CHECK(cudaGetDevice(&current));
  std::lock_guard<std::mutex> guard(blas_lock);
  fsdp_status_t first = FSDP_SUCCESS;
  for (int i = 0; i < blas_count; ++i) {
    /* A handle is destroyed, a workspace freed, on the device it was made on. */
    const cudaError_t e = cudaSetDevice(blas_slots[i].device);
    const cublasStatus_t s =
        e == cudaSuccess ? fsdp_cublas(nullptr)->destroy(blas_slots[i].handle)
                         : CUBLAS_STATUS_SUCCESS; /* a handle exists: cuBLAS is open */
    const cudaError_t f = e == cudaSuccess ? cudaFree(blas_slots[i].lt_ws) : cudaSuccess;
    if (first == FSDP_SUCCESS && e != cudaSuccess)
      first = fsdp_cuda_fail(e, "cudaSetDevice(device)", __FILE__, __LINE__);
    else if (first == FSDP_SUCCESS && s != CUBLAS_STATUS_SUCCESS)
      first = fsdp_cublas_fail(s, "cublasDestroy(handle)", __FILE__, __LINE__);
    else if (first == FSDP_SUCCESS && f != cudaSuccess)
      first = fsdp_cuda_fail(f, "cudaFree(cuBLASLt workspace)", __FILE__, __LINE__);
  }
  blas_count = 0;
  {
    std::lock_guard<std::mutex> lt_guard(lt_lock);
    for (int dev = 0; dev < kLtDevices; ++dev) {
      if (!lt_handles[dev]) continue;
      const cudaError_t e = cudaSetDevice(dev); /* destroyed on the device it was made on */
      const cublasStatus_t s = e == cudaSuccess ? fsdp_cublaslt(nullptr)->destroy(lt_handles[dev])
                                                : CUBLAS_STATUS_SUCCESS;
      if (first == FSDP_SUCCESS && e != cudaSuccess)
        first = fsdp_cuda_fail(e, "cudaSetDevice(device)", __FILE__, __LINE__);
      else if (first == FSDP_SUCCESS && s != CUBLAS_STATUS_SUCCESS)
        first = fsdp_cublas_fail(s, "cublasLtDestroy(handle)", __FILE__, __LINE__);
      lt_handles[dev] = nullptr;
    }
    lt_count = 0;
  }
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
  blas_slot *slot;
  FSDP_TRY(blas_slot_of(stream, &slot));
  const cublasHandle_t h = slot->handle;
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
 * Each product a block's layer makes runs through cuBLASLt with what follows
 * it as the product's epilogue (as llm.c does), where cuBLASLt takes the
 * shape: the forward with its bias, or the bias and GELU keeping its input
 * (CUBLASLT_EPILOGUE_BIAS, _GELU_AUX_BIAS: one rounding in bf16 and no second
 * pass over the output); the fc-proj product's d(input) with GELU's slope
 * (_DGELU, aux = the fc's pre-activation, ld C); the weight gradient with the
 * bias gradient, dout's column sums (_BGRADA for a Conv1D, whose dweight
 * is D (OC x C) = dout op(inp), _BGRADB for a linear layer, D (C x OC) = inp
 * op(dout)). The bias gradient comes out in C's type, fp32 (dweight), but
 * overwrites: it goes to the caller's column-sum scratch and one kernel over
 * OC floats adds it onto dbias, which accumulates over micro-batches. Not
 * used: _DGELU_BGRAD, which would make fc-proj's d(input) product also sum
 * the fc's bias gradient: in dinp's type (bf16 rounds the sum) and in another
 * layer's call, while the fc's own weight-gradient product already sums it
 * in fp32 with _BGRADA. The simulator's cuBLASLt
 * (tests/cudasim/cublas/lt_reference.h) models these epilogues and the
 * documented refusals (the GELU input's leading dimension a multiple of 8).
 * Each (device, type, layer shape, epilogue) is decided once by cuBLASLt's
 * heuristic and kept (lt_decide), and said in words by fsdp_cuda_product_impl.
 * The heuristic is offered the stream's workspace (lt_workspace_bytes: 32 MiB
 * on Hopper), as PyTorch and llm.c offer theirs; with none it would choose
 * only among the kernels that need none (what this ran with on the H200 of
 * 27 Nov; FSDP_CUBLASLT_WORKSPACE_KIB=0 gives that back for comparison).
 * Where cuBLASLt is absent or finds no algorithm, or a tensor is not 16-byte
 * aligned, the product is written with beta = 0 and one vectorised pass
 * follows it: + bias, and GELU for the MLP's fc (keeping the pre-activation
 * for backward), or gelu'(pre) for the fc-proj product's d(input); the bias
 * gradient is a column sum over all SMs. The price of a pass: one read and
 * one write of the output (the column sum: one read of dout), and in bf16 two
 * roundings, not one (bench/gpu-budget.md says what they cost). */

namespace {
/* The descriptors of one call, destroyed with it. */
struct lt_call {
  const fsdp_cublaslt_t *api;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit lt_call(const fsdp_cublaslt_t *x) : api(x) {}
  ~lt_call() {
    if (pref) api->pref_destroy(pref);
    if (d) api->layout_destroy(d);
    if (b) api->layout_destroy(b);
    if (a) api->layout_destroy(a);
    if (desc) api->desc_destroy(desc);
  }
};

/* One cuBLASLt call in the column-major view: D (m x n, ld ldd) [+]= op(A)
 * (m x k; A stored m x k, or k x m when ta) @ op(B) (k x n; B stored k x n,
 * or n x k when tb), with the epilogue's bias and aux (aux ld = ldd). */
struct lt_shape {
  bool ta, tb;
  int m, n, k, lda, ldb, ldd;
  uint32_t epilogue;
};

/* The layer a call belongs to: y (B, OC) = x (B, C) @ op(weight). */
struct lt_layer {
  int B, C, OC;
  bool linear;
};
} // namespace

/* The alignment promised to the heuristic (a shape's algorithm is reused for
 * every pointer, so it must not rely on more than each call guarantees):
 * lt_run takes only 16-byte aligned A, B, D, bias and aux. */
static const uint32_t kAlign = 16;

/* What the heuristic is shown for the bias and aux pointers, which it reads
 * only for their alignment: an address 16-byte aligned and no more, as the
 * smallest promise lt_run keeps (the first call's own pointers might be more
 * aligned than a later call's). */
static const void *const kProbe = reinterpret_cast<const void *>(uintptr_t{48});

/* Returns false when a descriptor call fails. A and B are of type T, C and D
 * (and the bias gradient) of TD; the heuristic may choose algorithms taking
 * up to ws_max bytes of workspace. */
template <typename T, typename TD>
static bool lt_describe(lt_call &c, const lt_shape &x, const void *bias, const void *aux,
                        uint64_t ws_max) {
  const fsdp_cublaslt_t *api = c.api;
  const cudaDataType t = fsdp_cuda_type<T>::value, td = fsdp_cuda_type<TD>::value;
  const int32_t ta = x.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = x.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t aux_ld = x.ldd;
  return api->desc_create(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
         api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
         api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
         api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &x.epilogue,
                       sizeof x.epilogue) == 0 &&
         (!bias ||
          api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) == 0) &&
         (!aux || (api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                 sizeof aux) == 0 &&
                   api->desc_set(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                 sizeof aux_ld) == 0)) &&
         api->layout_create(&c.a, t, x.ta ? x.k : x.m, x.ta ? x.m : x.k, x.lda) == 0 &&
         api->layout_create(&c.b, t, x.tb ? x.n : x.k, x.tb ? x.k : x.n, x.ldb) == 0 &&
         api->layout_create(&c.d, td, x.m, x.n, x.ldd) == 0 && api->pref_create(&c.pref) == 0 &&
         api->pref_set(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max,
                       sizeof ws_max) == 0 &&
         api->pref_set(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &kAlign,
                       sizeof kAlign) == 0 &&
         api->pref_set(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &kAlign,
                       sizeof kAlign) == 0 &&
         api->pref_set(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &kAlign,
                       sizeof kAlign) == 0 &&
         api->pref_set(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &kAlign,
                       sizeof kAlign) == 0;
}

/* Whether cuBLASLt runs x for layer l on the current device (*ok) and with
 * which algorithm, the device's handle and the workspace the algorithm takes
 * (*ws, at most lt_workspace_bytes; handle and ws may be NULL): decided at the
 * first ask per (device, type, layer shape, epilogue) by the heuristic and
 * kept. bias and aux: whether the epilogue takes them. *ok is false without
 * cuBLASLt (and on a device ordinal past kLtDevices). */
template <typename T, typename TD>
static fsdp_status_t lt_decide(const lt_shape &x, bool bias, bool aux, const lt_layer &l,
                               bool *ok, cublasLtMatmulAlgo_t *algo,
                               cublasLtHandle_t *handle = nullptr, size_t *ws = nullptr) {
  *ok = false;
  const fsdp_cublaslt_t *api = fsdp_cublaslt(nullptr);
  if (!api) return FSDP_SUCCESS;
  int device;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kLtDevices) return FSDP_SUCCESS;
  const lt_choice key{device,          fsdp_cuda_type<T>::value, l.B, l.C, l.OC, (int)l.linear,
                      (int)x.epilogue, false, cublasLtMatmulAlgo_t{}, 0};
  std::lock_guard<std::mutex> guard(lt_lock);
  for (int i = 0; i < lt_count; ++i) {
    const lt_choice &c = lt_choices[i];
    if (c.device == key.device && c.dt == key.dt && c.B == key.B && c.C == key.C &&
        c.OC == key.OC && c.linear == key.linear && c.epilogue == key.epilogue) {
      *ok = c.ok;
      *algo = c.algo;
      if (ws) *ws = c.ws;
      if (handle) *handle = lt_handles[device];
      return FSDP_SUCCESS;
    }
  }
  size_t ws_max;
  FSDP_TRY(lt_workspace_bytes(device, &ws_max));
  cublasLtHandle_t &h = lt_handles[device];
  if (!h && api->create(&h) != CUBLAS_STATUS_SUCCESS) {
    h = nullptr;
    return FSDP_SUCCESS;
  }
  if (handle) *handle = h;
  lt_call call(api);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  *ok = lt_describe<T, TD>(call, x, bias ? kProbe : nullptr, aux ? kProbe : nullptr, ws_max) &&
        api->heuristic(h, call.desc, call.a, call.b, call.d, call.d, call.pref, 1, &r,
                       &found) == CUBLAS_STATUS_SUCCESS &&
        found == 1;
  if (*ok) *algo = r.algo;
  if (ws) *ws = *ok ? r.workspaceSize : 0;
  if (lt_count < kLtChoices) { /* past the table, a rare shape is decided at each call */
    lt_choices[lt_count] = key;
    lt_choices[lt_count].ok = *ok;
    if (*ok) lt_choices[lt_count].algo = r.algo, lt_choices[lt_count].ws = r.workspaceSize;
    ++lt_count;
  }
  return FSDP_SUCCESS;
}

/* Runs D = epilogue(op(A) op(B) + beta D) through cuBLASLt when layer l's
 * shape qualifies (*done = 1), else leaves *done 0 for the product + pass. */
template <typename T, typename TD>
static fsdp_status_t lt_run(const lt_shape &x, const lt_layer &l, TD *d, const T *A, const T *Bm,
                            const void *bias, const void *aux, float beta, cudaStream_t s,
                            int *done) {
  *done = 0;
  if (!aligned16(d) || !aligned16(A) || !aligned16(Bm) || !aligned16(bias) || !aligned16(aux))
    return FSDP_SUCCESS;
  bool ok;
  cublasLtMatmulAlgo_t algo;
  cublasLtHandle_t h;
  size_t ws;
  FSDP_TRY((lt_decide<T, TD>(x, bias != nullptr, aux != nullptr, l, &ok, &algo, &h, &ws)));
  if (!ok) return FSDP_SUCCESS;
  blas_slot *slot; /* the stream's workspace: lt_workspace_bytes, as the heuristic was offered */
  FSDP_TRY(blas_slot_of(s, &slot));
  if (ws > slot->lt_ws_bytes)
    return fsdp_error(FSDP_ERR_INTERNAL, "cuBLASLt: the algorithm chosen for a %d x %d x %d "
                      "product takes %zu bytes of workspace, this stream has %zu", x.m, x.n,
                      x.k, ws, slot->lt_ws_bytes);
  lt_call call(fsdp_cublaslt(nullptr)); /* open: the heuristic ran */
  if (!lt_describe<T, TD>(call, x, bias, aux, slot->lt_ws_bytes))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "cuBLASLt: the descriptors of a %d x %d x %d "
                      "product (epilogue %u), which its heuristic took, could not be made",
                      x.m, x.n, x.k, (unsigned)x.epilogue);
  const float one = 1.0f;
  const cublasStatus_t st = call.api->matmul(h, call.desc, &one, A, call.a, Bm, call.b,
                                             &beta, d, call.d, d, call.d, &algo, slot->lt_ws,
                                             slot->lt_ws_bytes, s);
  if (st != CUBLAS_STATUS_SUCCESS)
    return fsdp_cublas_fail(st, "cublasLtMatmul(d, A, B)", __FILE__, __LINE__);
  *done = 1;
  return FSDP_SUCCESS;
}

/* The cuBLASLt call of each product of layer l, or false where the product +
 * pass runs without asking cuBLASLt; *why then says why. */

/* out (B, OC) = [gelu](inp @ op(weight) + bias), aux = the pre-activation:
 * column-major D = out^T (OC x B) = op(weight^T) inp^T. Needs a bias, and
 * with GELU, OC % 8 == 0 (the aux leading dimension). */
static bool forward_shape(const lt_layer &l, bool bias, bool gelu, lt_shape *x, const char **why) {
  *why = !bias ? "no bias" : l.C <= 0 ? "C = 0" : gelu && l.OC % 8 ? "OC not a multiple of 8"
                                                                   : nullptr;
  *x = {l.linear, false, l.OC, l.B, l.C, l.linear ? l.C : l.OC, l.C, l.OC,
        gelu ? (uint32_t)CUBLASLT_EPILOGUE_GELU_AUX_BIAS : (uint32_t)CUBLASLT_EPILOGUE_BIAS};
  return !*why;
}

/* dinp (B, C) = (dout @ op(weight)) * gelu'(pre) (DGELU, aux = pre, ld C):
 * column-major D = dinp^T (C x B) = op(weight^T) dout^T. Needs C % 8 == 0. */
static bool dgelu_shape(const lt_layer &l, lt_shape *x, const char **why) {
  *why = l.C % 8 ? "C not a multiple of 8" : nullptr;
  *x = {!l.linear, false, l.C, l.B, l.OC, l.linear ? l.C : l.OC, l.OC, l.C,
        (uint32_t)CUBLASLT_EPILOGUE_DGELU};
  return !*why;
}

/* dweight += inp^T dout (its layout), with the bias gradient (dout's column
 * sums) written: a linear layer's D = dweight^T (C x OC) = inp^T op(dout^T)
 * sums B's columns (BGRADB); a Conv1D's D = dweight^T (OC x C) = dout^T
 * op(inp^T) sums A's rows (BGRADA). Needs a bias. */
static bool wgrad_shape(const lt_layer &l, bool bias, lt_shape *x, const char **why) {
  *why = !bias ? "no bias" : nullptr;
  if (l.linear)
    *x = {false, true, l.C, l.OC, l.B, l.C, l.OC, l.C, (uint32_t)CUBLASLT_EPILOGUE_BGRADB};
  else
    *x = {false, true, l.OC, l.C, l.B, l.OC, l.C, l.OC, (uint32_t)CUBLASLT_EPILOGUE_BGRADA};
  return !*why;
}

template <typename T>
static fsdp_status_t lt_forward(T *out, T *aux, const T *inp, const T *weight, const T *bias,
                                const lt_layer &l, cudaStream_t s, int *done) {
  *done = 0;
  lt_shape x;
  const char *why;
  if (!forward_shape(l, bias != nullptr, aux != nullptr, &x, &why)) return FSDP_SUCCESS;
  return lt_run(x, l, out, weight, inp, bias, aux, 0.0f, s, done);
}

template <typename T>
static fsdp_status_t lt_dgelu(T *dinp, const T *pre, const T *dout, const T *weight,
                              const lt_layer &l, cudaStream_t s, int *done) {
  *done = 0;
  lt_shape x;
  const char *why;
  if (!dgelu_shape(l, &x, &why)) return FSDP_SUCCESS;
  return lt_run(x, l, dinp, weight, dout, nullptr, pre, 0.0f, s, done);
}

/* grad (OC) written with dout's column sums, dweight += as above. */
template <typename T>
static fsdp_status_t lt_wgrad(float *dweight, float *grad, const T *dout, const T *inp,
                              const lt_layer &l, cudaStream_t s, int *done) {
  *done = 0;
  lt_shape x;
  const char *why;
  if (!wgrad_shape(l, true, &x, &why)) return FSDP_SUCCESS;
  if (l.linear) return lt_run(x, l, dweight, inp, dout, grad, nullptr, 1.0f, s, done);
  return lt_run(x, l, dweight, dout, inp, grad, nullptr, 1.0f, s, done);
}

/* acc[i] += x[i] for n floats: an epilogue's bias gradient onto fsdp's
 * running sum. */
__global__ void add_kernel(float *acc, const float *x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    acc[i] += x[i];
}

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
  int done;
  FSDP_TRY(lt_forward(out, pre, as<T>(a.inp), as<T>(a.weight), as<T>(a.bias),
                      lt_layer{a.B, a.C, a.OC, a.weight_out_in != 0}, s, &done));
  if (done) return FSDP_SUCCESS;
  T *y = pre ? pre : out;
  FSDP_TRY(product(y, as<T>(a.inp), as<T>(a.weight), a.B, a.C, a.OC, a.weight_out_in != 0, s));
  return epilogue(y, pre ? out : nullptr, as<T>(a.bias), (const T *)nullptr, a.B, a.OC, s);
}

/* d(input) written (beta = 0), times gelu'(gelu_pre) when given; dweight +=
 * (the gradient accumulates over micro-batches); dbias += dout's column
 * sums, from the weight gradient's epilogue or a column sum over all SMs. */
template <typename T>
static fsdp_status_t matmul_backward(const fsdp_matmul_backward_args_t &a, cudaStream_t s) {
  const int B = a.B, C = a.C, OC = a.OC;
  const lt_layer l = {B, C, OC, a.weight_out_in != 0};
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
  if (C <= 0) return dbias ? bias_grad(dbias, scratch, dout, B, OC, s) : FSDP_SUCCESS;
  int fused = 0;
  if (dinp && a.gelu_pre)
    FSDP_TRY(lt_dgelu(dinp, as<T>(a.gelu_pre), dout, weight, l, s, &fused));
  if (dinp && !fused) { /* the product, then gelu'(pre) in a pass */
    if (a.weight_out_in)
      FSDP_TRY(gemm(false, false, B, C, OC, dout, OC, weight, C, 0.0f, dinp, C, s));
    else
      FSDP_TRY(gemm(false, true, B, C, OC, dout, OC, weight, OC, 0.0f, dinp, C, s));
    if (a.gelu_pre)
      FSDP_TRY(epilogue(dinp, (T *)nullptr, (const T *)nullptr, as<T>(a.gelu_pre), B, C, s));
  }
  fused = 0;
  if (dbias) FSDP_TRY(lt_wgrad(dweight, scratch, dout, inp, l, s, &fused));
  if (fused) { /* the epilogue wrote dout's column sums into scratch */
    FSDP_LAUNCH(add_kernel, fsdp_grid(OC, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, dbias,
                scratch, OC);
    LAUNCH_CHECK();
    return FSDP_SUCCESS;
  }
  if (dbias) FSDP_TRY(bias_grad(dbias, scratch, dout, B, OC, s));
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

/* "cuBLASLt <epilogue>" where cuBLASLt runs x (eligible: the shape asks it)
 * for layer l, with " (workspace <MiB>)" when its algorithm takes one, else
 * "<pass> (<why>)" into out. */
template <typename T, typename TD>
static fsdp_status_t say_choice(bool eligible, const lt_shape &x, bool bias, bool aux,
                                const lt_layer &l, const char *why, const char *pass, char *out,
                                size_t n) {
  bool ok = false;
  cublasLtMatmulAlgo_t algo;
  size_t ws = 0;
  if (eligible) {
    FSDP_TRY((lt_decide<T, TD>(x, bias, aux, l, &ok, &algo, nullptr, &ws)));
    why = fsdp_cublaslt(nullptr) ? "cuBLASLt's heuristic found no algorithm" : "no cuBLASLt";
  }
  const char *name = x.epilogue == CUBLASLT_EPILOGUE_BIAS            ? "BIAS"
                     : x.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "GELU_AUX_BIAS"
                     : x.epilogue == CUBLASLT_EPILOGUE_DGELU         ? "DGELU"
                     : x.epilogue == CUBLASLT_EPILOGUE_BGRADA        ? "BGRADA"
                                                                     : "BGRADB";
  if (ok && ws) snprintf(out, n, "cuBLASLt %s (workspace %.2f MiB)", name, ws / 1048576.0);
  else if (ok) snprintf(out, n, "cuBLASLt %s", name);
  else snprintf(out, n, "%s (%s)", pass, why);
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t product_impl(const lt_layer &l, int flags, char *buf, size_t len) {
  const bool bias = flags & FSDP_PRODUCT_BIAS, gelu = flags & FSDP_PRODUCT_GELU;
  char fwd[96] = "cuBLAS", dinp[96] = "cuBLAS", dw[96] = "cuBLAS";
  lt_shape x;
  const char *why;
  if (bias || gelu) {
    const bool e = forward_shape(l, bias, gelu, &x, &why);
    FSDP_TRY((say_choice<T, T>(e, x, true, gelu, l, why,
                               !bias ? "cuBLAS + GELU pass"
                               : gelu ? "cuBLAS + bias+GELU pass"
                                      : "cuBLAS + bias pass",
                               fwd, sizeof fwd)));
  }
  if (flags & FSDP_PRODUCT_DGELU) {
    const bool e = dgelu_shape(l, &x, &why);
    FSDP_TRY((say_choice<T, T>(e, x, false, true, l, why, "cuBLAS + GELU' pass", dinp,
                               sizeof dinp)));
  }
  if (bias) {
    const bool e = wgrad_shape(l, true, &x, &why);
    FSDP_TRY((say_choice<T, float>(e, x, true, false, l, why, "cuBLAS + bias column sum", dw,
                                   sizeof dw)));
  }
  snprintf(buf, len, "fwd %s, dinp %s, dW %s", fwd, dinp, dw);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_product_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B, int C,
                                     int OC, int flags, char *buf, size_t len) {
  if (!buf || len == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_cuda_product_impl: no buffer");
  if (B <= 0 || C <= 0 || OC <= 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_cuda_product_impl: B %d, C %d, OC %d: "
                      "a product's sizes are positive", B, C, OC);
  return fsdp_cuda_dispatch("product_impl", dtype, stream, [&](auto *tag, cudaStream_t) {
    STORAGE(tag);
    return product_impl<S>(lt_layer{B, C, OC, (flags & FSDP_PRODUCT_OUT_IN) != 0}, flags, buf,
                           len);
  });
}

/* ---- GPT-2's vocabulary head: logits rows ld apart ----
 * Every head product runs as two: over the vocabulary's first V / 128 * 128
 * entries (GPT-2: 50176 of 50257), where the vocabulary dimension is a whole
 * number of cuBLAS's tiles and 16-byte vectors, then over the rest (81), a
 * thin product. Measured on an H200 (cuBLAS 13, bf16, 16 x 1024 tokens, C
 * 768): logits, dinp and dwte took 13.3, 9.8 and 2.4 ms as single products
 * over V = 50257 (95, 129 and 532 TF/s), 1.61, 1.40 and 1.39 ms split (783 to
 * 907 TF/s), and 1.63, 1.44 and 1.52 ms over a vocabulary padded to 50304
 * rows. So wte is not padded: it stays (V, C) in the engine, checkpoints and
 * exports, with no pad rows to keep at zero through the optimizer. The one
 * price: in bf16, dinp is rounded to bf16 after each part. The remainder goes
 * first, so in the model (dinp zero on entry, the remainder 81 of 50257
 * columns) the first rounding is of a small partial sum. */

/* Where the head's products split the vocabulary (0 when V < 128). */
static int head_split(int V) { return V / 128 * 128; }

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
  const int cut = head_split(V), from[2] = {0, cut}, count[2] = {cut, V - cut};
  for (int p = 0; p < 2; p++)
    if (count[p])
      FSDP_TRY(gemm(false, true, B, count[p], C, as<T>(a.inp), C,
                    as<T>(a.wte) + (size_t)from[p] * C, C, 0.0f, logits + from[p], ld, s));
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t head_backward(const fsdp_head_backward_args_t &a, cudaStream_t s) {
  const int B = a.B, C = a.C, V = a.V, ld = a.ld;
  if (B <= 0 || V <= 0 || C <= 0) return FSDP_SUCCESS;
  const int cut = head_split(V), from[2] = {cut, 0}, count[2] = {V - cut, cut};
  for (int p = 0; p < 2; p++) {
    if (!count[p]) continue;
    const T *dlogits = as<T>(a.dlogits) + from[p], *wte = as<T>(a.wte) + (size_t)from[p] * C;
    if (a.dinp)
      FSDP_TRY(gemm(false, false, B, C, count[p], dlogits, ld, wte, C, 1.0f, as<T>(a.dinp), C, s));
    FSDP_TRY(gemm(true, false, count[p], C, B, dlogits, ld, as<T>(a.inp), C, 1.0f,
                  a.dwte + (size_t)from[p] * C, C, s));
  }
  return FSDP_SUCCESS;
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
