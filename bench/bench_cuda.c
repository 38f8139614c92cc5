/* bench/bench_cuda.c — what fsdp-bench measures on a GPU: the matrix-product
 * peak MFU is taken against (cuBLAS, in the run's dtype) and the device memory
 * in use. The only CUDA in bench/; without CUDA both say it is not built. */
#include <string.h>

#include "fsdp_bench.h"
#include "fsdp_config.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cublas_lazy.h"

#define CU_TRY(call, what)                                                                  \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      st = FSDP_ERR_SYSTEM;                                                                 \
      fprintf(stderr, "fsdp-bench: peak: %s: %s\n", what, cudaGetErrorString(e_));          \
      goto out;                                                                             \
    }                                                                                       \
  } while (0)

/* One n x n x n product; bf16: bf16 in and out, fp32 accumulation (what the
 * bf16 layers run); f32: fp32 throughout, no TF32 (what the fp32 layers run). */
static cublasStatus_t gemm(const fsdp_cublas_t *cb, cublasHandle_t h, int n, int bf16,
                           const void *a, const void *b, void *c) {
  const float one = 1.0f, zero = 0.0f;
  cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  return cb->gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, t, n, b, t, n, &zero, c, t,
                      n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* Best of three windows of at least 0.5 s of back-to-back products, timed
 * with CUDA events; every rank starts each window together (ranks sharing a
 * GPU then share its rate, as they share it in training). */
fsdp_status_t bench_cuda_peak_flops(fsdp_comm_t comm, int n, fsdp_dtype_t dtype, double *flops) {
  int bf16 = dtype == FSDP_BF16;
  size_t bytes = (size_t)n * (size_t)n * (bf16 ? 2 : 4);
  void *a = NULL, *b = NULL, *c = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cublasHandle_t h = NULL;
  fsdp_status_t st = FSDP_SUCCESS;
  const char *why = NULL;
  const fsdp_cublas_t *cb = fsdp_cublas(&why);
  if (!cb) {
    fprintf(stderr, "fsdp-bench: peak: %s\n", why);
    return FSDP_ERR_UNSUPPORTED;
  }
  double best = 0.0, per = 2.0 * n * (double)n * n;
  CU_TRY(cudaMalloc(&a, bytes), "cudaMalloc");
  CU_TRY(cudaMalloc(&b, bytes), "cudaMalloc");
  CU_TRY(cudaMalloc(&c, bytes), "cudaMalloc");
  /* 0x3c bytes: small finite values in both dtypes (zeros would let the chip clock up) */
  CU_TRY(cudaMemset(a, 0x3c, bytes), "cudaMemset");
  CU_TRY(cudaMemset(b, 0x3c, bytes), "cudaMemset");
  CU_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  CU_TRY(cudaEventCreate(&e0), "cudaEventCreate");
  CU_TRY(cudaEventCreate(&e1), "cudaEventCreate");
  if (cb->create(&h) != CUBLAS_STATUS_SUCCESS || cb->set_stream(h, s) != CUBLAS_STATUS_SUCCESS ||
      gemm(cb, h, n, bf16, a, b, c) != CUBLAS_STATUS_SUCCESS) { /* and a warm-up product */
    fprintf(stderr, "fsdp-bench: peak: cuBLAS could not run a %s %d^3 product\n",
            fsdp_dtype_name(dtype), n);
    st = FSDP_ERR_SYSTEM;
    goto out;
  }
  CU_TRY(cudaStreamSynchronize(s), "warm-up");
  for (int w = 0; st == FSDP_SUCCESS && w < 3; w++) {
    if ((st = fsdp_barrier(comm, FSDP_HOST_STREAM)) != FSDP_SUCCESS) break;
    double t0 = fsdp_time_now();
    long k = 0;
    CU_TRY(cudaEventRecord(e0, s), "cudaEventRecord");
    while (k < 16 || fsdp_time_now() - t0 < 0.5) {
      for (int i = 0; i < 16; i++, k++) gemm(cb, h, n, bf16, a, b, c);
      CU_TRY(cudaStreamSynchronize(s), "products");
    }
    CU_TRY(cudaEventRecord(e1, s), "cudaEventRecord");
    CU_TRY(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0.0f;
    CU_TRY(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (ms > 0 && k * per / (ms * 1e-3) > best) best = k * per / (ms * 1e-3);
  }
out:
  if (h) cb->destroy(h);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (s) cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  if (st == FSDP_SUCCESS) *flops = best;
  return st;
}

double bench_cuda_device_used(void) {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return -1.0;
  return (double)(total - free_b);
}

/* Datasheet HBM bandwidths by device name, most specific first (the device
 * properties of CUDA 12 no longer carry the memory clock). */
static const struct { const char *name; double bytes_per_s; } hbm_table[] = {
    {"H200", 4.8e12},        {"H100 PCIe", 2.0e12},  {"H100 NVL", 3.9e12},
    {"H100", 3.35e12},       {"GH200", 4.0e12},      {"A100-SXM4-80GB", 2.039e12},
    {"A100 80GB PCIe", 1.935e12}, {"A100", 1.555e12}, {"L40S", 0.864e12},
    {"L4", 0.3e12},          {"A10", 0.6e12},        {"V100", 0.9e12},
};

double bench_cuda_hbm(char *name, size_t len) {
  struct cudaDeviceProp p;
  int dev = 0;
  snprintf(name, len, "?");
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return 0.0;
  snprintf(name, len, "%s", p.name);
  for (size_t i = 0; i < sizeof hbm_table / sizeof hbm_table[0]; i++)
    if (strstr(p.name, hbm_table[i].name)) return hbm_table[i].bytes_per_s;
  return 0.0;
}

#else

fsdp_status_t bench_cuda_peak_flops(fsdp_comm_t comm, int n, fsdp_dtype_t dtype, double *flops) {
  (void)comm, (void)n, (void)dtype, (void)flops;
  fprintf(stderr, "fsdp-bench: the GPU peak needs fsdp built with CUDA\n");
  return FSDP_ERR_UNSUPPORTED;
}

double bench_cuda_device_used(void) { return -1.0; }

double bench_cuda_hbm(char *name, size_t len) {
  snprintf(name, len, "?");
  return 0.0;
}

#endif
