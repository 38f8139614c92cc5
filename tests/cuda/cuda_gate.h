/* tests/cuda/cuda_gate.h — whether a cuda-suite program runs, skips or fails:
 * with a usable device it runs; it is skipped (77) only on a machine without
 * a GPU: no device (cudaErrorNoDevice, or no error and 0 devices) or no
 * NVIDIA driver at all (cudart then says "insufficient driver", but
 * cudaDriverGetVersion gives 0), and even then fails where FSDP_REQUIRE_GPU
 * is set (not 0), as scripts/gpu-check.sh sets it. Every other answer is a
 * broken machine, a failure naming the error: a driver older than the toolkit,
 * a driver that cannot initialise, devices busy or unavailable. Header-only:
 * each program of tests/cuda includes it once. */
#ifndef FSDP_TESTS_CUDA_GATE_H
#define FSDP_TESTS_CUDA_GATE_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when e (with n devices) means this machine has no GPU to use. */
static int fsdp_cuda_gate_no_gpu(cudaError_t e, int n) {
  int driver = 0; /* 0 when no NVIDIA driver is installed at all (CUDA's documented value) */
  if (e == cudaSuccess) return n == 0;
  if (e == cudaErrorNoDevice) return 1;
  return e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
         driver == 0;
}

/* 0: run; otherwise the exit status to return at once. */
static int fsdp_cuda_gate(const char *prog) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 0;
  if (!fsdp_cuda_gate_no_gpu(e, n)) {
    printf("%s: FAIL: cudaGetDeviceCount: %s (%s): %s\n", prog, cudaGetErrorString(e),
           cudaGetErrorName(e),
           e == cudaErrorInsufficientDriver
               ? "the NVIDIA driver is older than the CUDA toolkit fsdp was built with; install "
                 "a newer driver"
               : "the machine has a CUDA driver but it does not work; fix the driver or the "
                 "devices (this is not a machine without a GPU, so the test does not skip)");
    return 1;
  }
  const char *req = getenv("FSDP_REQUIRE_GPU");
  const int required = req && *req && strcmp(req, "0") != 0;
  printf("%s: %s: no usable CUDA device (cudaGetDeviceCount: %s, %d device(s))%s\n", prog,
         required ? "FAIL" : "SKIP",
         e == cudaSuccess                   ? "no error"
         : e == cudaErrorInsufficientDriver ? "no NVIDIA driver is installed"
                                            : cudaGetErrorString(e),
         e == cudaSuccess ? n : 0,
         required ? "; FSDP_REQUIRE_GPU is set, so a missing GPU is a failure" : "");
  return required ? 1 : 77;
}

#endif
