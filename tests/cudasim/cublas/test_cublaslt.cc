/* tests/cudasim/cublas/test_cublaslt.cc — the simulated cuBLASLt as fsdp
 * meets it: opened by src/backend/cuda/cublaslt_lazy.h's dlopen (and checked
 * to be the simulator's library), descriptors built as blas.cu builds them, the
 * heuristic answering no algorithm where the call would be refused (a GELU
 * input leading dimension not divisible by 8), a D less aligned than the
 * preference promised refused, a bias or aux pointer less aligned than the one
 * the heuristic was shown refused (and one off its element refused by the
 * heuristic), the workspace an algorithm takes (none or less refused, all of
 * it overwritten), and cublasLtMatmul with
 * GELU_AUX_BIAS on a stream of the simulated runtime, against the host. Exit 0
 * when every check passes. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "../sim_test.h"
#include "backend/cuda/cublaslt_lazy.h"

static const fsdp_cublaslt_t *api;

struct descs {
  cublasLtMatmulDesc_t d = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t p = nullptr;
  ~descs() {
    api->pref_destroy(p), api->layout_destroy(c), api->layout_destroy(b), api->layout_destroy(a);
    api->desc_destroy(d);
  }
};

/* y (B, OC) = gelu(x (B, C) W^T + bias), pre kept with leading dimension OC. */
static void build(descs &s, int B, int C, int OC, const float *bias, float *pre) {
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const uint32_t ep = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const int64_t ld = OC;
  CHECK(api->desc_create(&s.d, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0, "desc");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0, "transa");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0, "transb");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) == 0, "epilogue");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) == 0, "bias");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre, sizeof pre) == 0, "aux");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld) == 0, "aux ld");
  CHECK(api->desc_set(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 4) ==
            CUBLAS_STATUS_INVALID_VALUE, "an attribute of the wrong size accepted");
  CHECK(api->layout_create(&s.a, CUDA_R_32F, C, OC, C) == 0, "A");
  CHECK(api->layout_create(&s.b, CUDA_R_32F, C, B, C) == 0, "B");
  CHECK(api->layout_create(&s.c, CUDA_R_32F, OC, B, OC) == 0, "D");
  CHECK(api->pref_create(&s.p) == 0, "pref");
}

static float *dev(size_t n, const float *host) {
  float *d = nullptr;
  CHECK(cudaMalloc((void **)&d, n * 4) == cudaSuccess, "malloc");
  if (host) cudaMemcpy(d, host, n * 4, cudaMemcpyHostToDevice);
  return d;
}

static void test_gelu_aux_bias(void) {
  const int B = 5, C = 7, OC = 16;
  std::vector<float> x(B * C), w(OC * C), bias(OC), y(B * OC), pre(B * OC);
  for (int i = 0; i < B * C; ++i) x[i] = (float)((i * 37 % 19) - 9) / 8;
  for (int i = 0; i < OC * C; ++i) w[i] = (float)((i * 53 % 23) - 11) / 16;
  for (int i = 0; i < OC; ++i) bias[i] = (float)(i % 5 - 2) / 4;
  float *dx = dev(x.size(), x.data()), *dw = dev(w.size(), w.data()),
        *db = dev(bias.size(), bias.data()), *dy = dev(y.size(), nullptr),
        *dp = dev(pre.size(), nullptr);
  cublasLtHandle_t h = nullptr;
  CHECK(api->create(&h) == 0, "create");
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  {
    descs d;
    build(d, B, C, OC, db, dp);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) == 0 && found == 1,
          "no algorithm for a valid GELU_AUX_BIAS (found %d)", found);
    const float one = 1.0f, zero = 0.0f;
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == 0, "matmul");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dp, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == CUBLAS_STATUS_NOT_SUPPORTED, "C != D accepted");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy + 1, d.c, dy + 1, d.c, &r.algo,
                      nullptr, 0, s) == CUBLAS_STATUS_NOT_SUPPORTED,
          "D 4 bytes off the 256 promised (the default MIN_ALIGNMENT_D_BYTES) accepted");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  }
  cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(pre.data(), dp, pre.size() * 4, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o) {
      double p = bias[o];
      for (int c = 0; c < C; ++c) p += (double)x[b * C + c] * w[o * C + c];
      const double g = 0.5 * p * (1 + tanh(sqrt(2 / M_PI) * (p + 0.044715 * p * p * p)));
      bad += fabs(pre[b * OC + o] - p) > 1e-5 || fabs(y[b * OC + o] - g) > 1e-5;
    }
  CHECK(bad == 0, "%d of %d values wrong", bad, B * OC);
  {
    descs d; /* OC 12: the GELU input's leading dimension is not a multiple of 8 */
    build(d, B, C, 12, db, dp);
    cublasLtMatmulHeuristicResult_t r;
    int found = 5;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) ==
              CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
          "an aux ld of 12 got an algorithm (found %d)", found);
  }
  CHECK(api->destroy(h) == 0 && api->destroy(h) == CUBLAS_STATUS_NOT_INITIALIZED,
        "destroy twice");
  cudaStreamDestroy(s);
  cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dy), cudaFree(dp);
}

/* The bias and aux pointers: the heuristic is shown them (cublasLt.h: it reads
 * their values for the alignment to expect), the call must keep that
 * alignment, as blas.cu relies on when it shows a 16-byte aligned probe and
 * calls only with 16-byte aligned tensors. A refused call writes nothing. */
static void test_epilogue_alignment(void) {
  const int B = 5, C = 7, OC = 16;
  /* x, W zero and the bias one: a call that ran leaves gelu(1) in D */
  std::vector<float> zeros(B * OC, 0.0f), ones(OC + 8, 1.0f), got(B * OC);
  float *dx = dev(B * C, zeros.data()), *dw = dev(OC * C, nullptr), *db = dev(OC + 8, ones.data()),
        *dp = dev(B * OC + 8, nullptr), *dy = dev(B * OC, zeros.data());
  cudaMemset(dw, 0, OC * C * 4);
  cublasLtHandle_t h = nullptr;
  CHECK(api->create(&h) == 0, "create");
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const float one = 1.0f, zero = 0.0f;
  {
    descs d; /* shown 16-byte aligned bias and aux (cudaMalloc gives 256) */
    build(d, B, C, OC, db + 4, dp + 4);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) == 0 && found == 1,
          "no algorithm for a 16-byte aligned bias and aux (found %d)", found);
    const float *bias_off = db + 1, *bias_ok = db + 4;
    float *aux_off = dp + 2, *aux_ok = dp + 4;
    CHECK(api->desc_set(d.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_off, sizeof bias_off) == 0,
          "bias");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == CUBLAS_STATUS_NOT_SUPPORTED,
          "a bias 4 bytes off the 16-byte alignment the heuristic saw accepted");
    CHECK(api->desc_set(d.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ok, sizeof bias_ok) == 0 &&
              api->desc_set(d.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_off,
                            sizeof aux_off) == 0,
          "bias, aux");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == CUBLAS_STATUS_NOT_SUPPORTED,
          "an aux 8 bytes off the 16-byte alignment the heuristic saw accepted");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
    CHECK(got == zeros, "a refused call wrote D");
    CHECK(api->desc_set(d.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_ok,
                        sizeof aux_ok) == 0, "aux");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == 0, "the bias and aux the heuristic saw refused");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
    CHECK(fabs(got[0] - 0.8411920f) < 1e-5 && fabs(got[B * OC - 1] - 0.8411920f) < 1e-5,
          "D = %g, %g, want gelu(1) = 0.8411920", got[0], got[B * OC - 1]);
  }
  {
    descs d; /* a bias 2 bytes into an fp32: no kernel loads it, no algorithm */
    build(d, B, C, OC, (const float *)((char *)db + 2), dp);
    cublasLtMatmulHeuristicResult_t r;
    int found = 5;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) ==
              CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
          "an fp32 bias 2 bytes off its element got an algorithm (found %d)", found);
  }
  {
    descs d; /* the aux likewise */
    build(d, B, C, OC, db, (float *)((char *)dp + 2));
    cublasLtMatmulHeuristicResult_t r;
    int found = 5;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) ==
              CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
          "an fp32 aux 2 bytes off its element got an algorithm (found %d)", found);
  }
  CHECK(api->destroy(h) == 0, "destroy");
  cudaStreamDestroy(s);
  cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dp), cudaFree(dy);
}

/* The workspace as blas.cu offers it: the heuristic's algorithm takes
 * min(offered, m * n * 4) bytes; cublasLtMatmul refuses none or less (and
 * writes nothing), takes enough and overwrites it in stream order. */
static void test_workspace(void) {
  const int B = 5, C = 7, OC = 16;
  std::vector<float> x(B * C, 0.25f), w(OC * C, 0.5f), bias(OC, 0.0f), got(B * OC);
  float *dx = dev(x.size(), x.data()), *dw = dev(w.size(), w.data()),
        *db = dev(bias.size(), bias.data()), *dy = dev(B * OC, nullptr),
        *dp = dev(B * OC, nullptr), *ws = dev(B * OC, nullptr);
  cudaMemset(dy, 0, B * OC * 4);
  cudaMemset(ws, 0, B * OC * 4);
  cublasLtHandle_t h = nullptr;
  CHECK(api->create(&h) == 0, "create");
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const float one = 1.0f, zero = 0.0f;
  const size_t partials = (size_t)B * OC * 4;
  for (const uint64_t offered : {(uint64_t)32 << 20, (uint64_t)64}) {
    descs d;
    build(d, B, C, OC, db, dp);
    CHECK(api->pref_set(d.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &offered,
                        sizeof offered) == 0, "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CHECK(api->heuristic(h, d.d, d.a, d.b, d.c, d.c, d.p, 1, &r, &found) == 0 && found == 1,
          "no algorithm with %llu bytes of workspace offered", (unsigned long long)offered);
    const size_t need = offered < partials ? (size_t)offered : partials;
    CHECK(r.workspaceSize == need, "offered %llu bytes, the algorithm takes %zu, want %zu",
          (unsigned long long)offered, r.workspaceSize, need);
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, nullptr,
                      0, s) == CUBLAS_STATUS_INVALID_VALUE, "an algorithm taking %zu bytes of "
          "workspace ran without one", need);
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, ws,
                      need - 4, s) == CUBLAS_STATUS_INVALID_VALUE,
          "an algorithm taking %zu bytes of workspace ran with %zu", need, need - 4);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
    CHECK(got == std::vector<float>(B * OC, 0.0f), "a refused call wrote D");
    CHECK(api->matmul(h, d.d, &one, dw, d.a, dx, d.b, &zero, dy, d.c, dy, d.c, &r.algo, ws,
                      partials, s) == 0, "the workspace the algorithm takes refused");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    std::vector<unsigned char> scratch(partials);
    cudaMemcpy(scratch.data(), ws, partials, cudaMemcpyDeviceToHost);
    size_t written = 0;
    while (written < partials && scratch[written] == 0xa5) ++written;
    CHECK(written == need, "the call overwrote %zu bytes of its workspace, its algorithm takes "
          "%zu", written, need);
    cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
    const float want = 0.5f * 0.875f * (1 + tanhf(sqrtf(2 / (float)M_PI) *
                                                  (0.875f + 0.044715f * 0.875f * 0.875f * 0.875f)));
    CHECK(fabsf(got[0] - want) < 1e-5f, "D = %g with a workspace, want gelu(0.875) = %g", got[0],
          want);
    cudaMemset(ws, 0, partials);
    cudaMemset(dy, 0, B * OC * 4);
  }
  CHECK(api->destroy(h) == 0, "destroy");
  cudaStreamDestroy(s);
  cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dy), cudaFree(dp), cudaFree(ws);
}

int main(void) {
  const char *why = nullptr;
  api = fsdp_cublaslt(&why);
  CHECK(api != nullptr, "cublaslt_lazy.h could not open the simulated cuBLASLt: %s", why);
  if (!api) return 1;
  Dl_info info;
  CHECK(dladdr((void *)api->matmul, &info) && strstr(info.dli_fname, "cudasim/cublas"),
        "cublasLtMatmul comes from %s, not the simulator's", info.dli_fname);
  test_gelu_aux_bias();
  test_epilogue_alignment();
  test_workspace();
  printf("test_cublaslt: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
