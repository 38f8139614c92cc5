/* tests/cudasim/cublas/test_cublas.cc — the simulated cuBLAS as fsdp meets
 * it: opened by src/backend/cuda/cublas_lazy.h's dlopen (and checked to be the
 * simulator's library, not the toolkit's), handles bound to streams of the
 * simulated runtime, products on device buffers that run asynchronously and
 * in stream order, and the handle and argument errors through the API. Exit
 * 0 when every check passes. */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <vector>

#include "../sim_test.h"
#include "backend/cuda/cublas_lazy.h"

static const fsdp_cublas_t *api;

/* Row-major C (m x n) = A (m x k) B (k x n) as blas.cu issues it: the
 * column-major C^T = B^T A^T. */
static cublasStatus_t row_major(cublasHandle_t h, int m, int n, int k, const float *A,
                                const float *B, float *C) {
  const float one = 1.0f, zero = 0.0f;
  return api->gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, B, CUDA_R_32F, n, A,
                      CUDA_R_32F, k, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

static void *to_device(const void *host, size_t bytes) {
  void *d = nullptr;
  if (cudaMalloc(&d, bytes) != cudaSuccess) return nullptr;
  cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  return d;
}

static std::atomic<int> gate{0};
static void wait_for_gate(void *) {
  while (!gate.load()) sched_yield(); /* the stream is held until the host opens the gate */
}

static void test_library_is_the_simulator(void) {
  const char *why = nullptr;
  api = fsdp_cublas(&why);
  CHECK(api != nullptr, "cublas_lazy.h could not open the simulated cuBLAS: %s", why);
  if (!api) return;
  Dl_info info;
  CHECK(dladdr((void *)api->gemm_ex, &info) && strstr(info.dli_fname, "cudasim/cublas"),
        "cublasGemmEx comes from %s, not the simulator's libcublas.so.13 (is its directory "
        "first on LD_LIBRARY_PATH?)", info.dli_fname);
}

static void test_products_on_a_stream(void) {
  const int m = 3, n = 4, k = 5;
  std::vector<float> A(m * k), B(k * n), I(n * n, 0.0f), want(m * n), got(m * n);
  for (int i = 0; i < m * k; ++i) A[i] = (float)(i % 7 - 3);
  for (int i = 0; i < k * n; ++i) B[i] = (float)(i % 5 - 2);
  for (int i = 0; i < n; ++i) I[i * n + i] = 2.0f;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int l = 0; l < k; ++l) s += A[i * k + l] * B[l * n + j];
      want[i * n + j] = 2.0f * s; /* after the second product, by 2I */
    }
  float *dA = (float *)to_device(A.data(), A.size() * 4), *dB = (float *)to_device(B.data(), B.size() * 4),
        *dI = (float *)to_device(I.data(), I.size() * 4), *dC = nullptr, *dD = nullptr;
  cudaMalloc((void **)&dC, m * n * 4);
  cudaMalloc((void **)&dD, m * n * 4);
  cudaMemset(dD, 0, m * n * 4);
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  cublasHandle_t h = nullptr;
  CHECK(api->create(&h) == CUBLAS_STATUS_SUCCESS, "create");
  CHECK(api->set_stream(h, s) == CUBLAS_STATUS_SUCCESS, "set stream");
  /* Hold the stream: the products must queue behind the gate, not run in the call. */
  CHECK(cudaLaunchHostFunc(s, wait_for_gate, nullptr) == cudaSuccess, "gate");
  CHECK(row_major(h, m, n, k, dA, dB, dC) == CUBLAS_STATUS_SUCCESS, "C = A B");
  CHECK(row_major(h, m, n, n, dC, dI, dD) == CUBLAS_STATUS_SUCCESS, "D = C 2I (reads C)");
  cudaMemcpy(got.data(), dD, m * n * 4, cudaMemcpyDeviceToHost); /* another stream: no wait */
  bool untouched = true;
  for (float v : got) untouched = untouched && v == 0.0f;
  CHECK(untouched, "a product ran before its stream reached it");
  gate.store(1);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  cudaMemcpy(got.data(), dD, m * n * 4, cudaMemcpyDeviceToHost);
  CHECK(memcmp(got.data(), want.data(), got.size() * 4) == 0,
        "two products in stream order must give 2 A B (D[0] = %g, want %g)", got[0], want[0]);

  /* bf16 strided batches, C in bf16: batch b of C is A_b (2x2) times B_b (2x2) */
  const uint16_t one = 0x3f80, two = 0x4000; /* 1.0 and 2.0 in bf16 */
  uint16_t hA[8] = {one, one, one, one, two, two, two, two}, hB[8] = {one, 0, 0, one, one, 0, 0, one};
  uint16_t *bA = (uint16_t *)to_device(hA, 16), *bB = (uint16_t *)to_device(hB, 16), *bC = nullptr;
  cudaMalloc((void **)&bC, 16);
  const float f1 = 1.0f, f0 = 0.0f;
  CHECK(api->gemm_strided_batched_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &f1, bA, CUDA_R_16BF,
                                     2, 4, bB, CUDA_R_16BF, 2, 4, &f0, bC, CUDA_R_16BF, 2, 4, 2,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_SUCCESS, "batched bf16");
  cudaStreamSynchronize(s);
  uint16_t hC[8];
  cudaMemcpy(hC, bC, 16, cudaMemcpyDeviceToHost);
  CHECK(memcmp(hC, hA, 16) == 0, "A_b times I must be A_b in each batch");

  /* Errors through the API: refused at the call, nothing queued. */
  CHECK(api->gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &f1, dB, CUDA_R_32F, n - 1, dA,
                     CUDA_R_32F, k, &f0, dC, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE, "lda < m");
  CHECK(api->gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &f1, dB, CUDA_R_32F, n, dA,
                     CUDA_R_32F, k, &f0, dC, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED, "f32 in, bf16 out");
  CHECK(api->gemm_ex(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &f1, dA, CUDA_R_32F, 1, dB,
                     CUDA_R_32F, 1, &f0, dC, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED, "NULL handle");
  CHECK(api->destroy(h) == CUBLAS_STATUS_SUCCESS, "destroy");
  CHECK(api->set_stream(h, s) == CUBLAS_STATUS_NOT_INITIALIZED, "a destroyed handle");
  CHECK(api->destroy(h) == CUBLAS_STATUS_NOT_INITIALIZED, "destroyed twice");
  CHECK(strstr(api->status_string(CUBLAS_STATUS_INVALID_VALUE), "INVALID_VALUE") != nullptr,
        "status string");
  cudaStreamDestroy(s);
  for (void *p : {(void *)dA, (void *)dB, (void *)dI, (void *)dC, (void *)dD, (void *)bA,
                  (void *)bB, (void *)bC})
    cudaFree(p);
}

int main(void) {
  test_library_is_the_simulator();
  if (api) test_products_on_a_stream();
  printf("test_cublas: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
