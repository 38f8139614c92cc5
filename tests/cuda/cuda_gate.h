/* tests/cuda/cuda_gate.h — whether a cuda-suite program runs, skips or fails:
 * with a usable device it runs; a driver older than the toolkit is a failure
 * naming the cause (it is a broken machine, not a machine without a GPU);
 * without a device or without any NVIDIA driver (cudart then also says
 * "insufficient driver", but cudaDriverGetVersion gives 0) it is skipped (77) unless FSDP_REQUIRE_GPU is set (not 0),
 * as scripts/gpu-check.sh sets it, where it is a failure. Header-only: each
 * program of tests/cuda includes it once. */
#ifndef FSDP_TESTS_CUDA_GATE_H
#define FSDP_TESTS_CUDA_GATE_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 0: run; otherwise the exit status to return at once. */
static int fsdp_cuda_gate(const char *prog) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 0;
  int driver = 0; /* 0 when no NVIDIA driver is installed at all (CUDA's documented value) */
  if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
      driver > 0) {
    printf("%s: FAIL: %s (%s): the NVIDIA driver is older than the CUDA toolkit fsdp was built "
           "with; install a newer driver\n", prog, cudaGetErrorString(e), cudaGetErrorName(e));
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
