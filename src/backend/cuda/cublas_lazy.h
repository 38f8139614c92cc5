/* src/backend/cuda/cublas_lazy.h — cuBLAS opened on first use (dlopen), for src/backend/cuda
 * and the bench. Linking libcublas would make the loader map and relocate
 * cuBLAS and cuBLASLt in every program that links libfsdp — about 210 MiB of
 * resident memory at start-up, GPU or not — so the CPU tools and the CPU
 * bench's memory numbers would carry it. Only the few entry points used here
 * are looked up; their types come from cublas_v2.h itself.
 *
 * fsdp_cublas() returns the table, or NULL with the reason in *why (the
 * library or a symbol is missing). Thread-safe (pthread_once); the library
 * stays open for the life of the process. Include from one place per program
 * (each includer gets its own static copy). C and C++. */
#ifndef FSDP_CUDA_CUBLAS_LAZY_H
#define FSDP_CUDA_CUBLAS_LAZY_H

#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

typedef struct {
  __typeof__(&cublasCreate_v2) create;
  __typeof__(&cublasDestroy_v2) destroy;
  __typeof__(&cublasSetStream_v2) set_stream;
  /* Spelled out: C++ sees overloads of these two in cublas_api.h. */
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void *, const void *, cudaDataType, int, const void *,
                            cudaDataType, int, const void *, void *, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void *, const void *,
                                            cudaDataType, int, long long, const void *,
                                            cudaDataType, int, long long, const void *, void *,
                                            cudaDataType, int, long long, int,
                                            cublasComputeType_t, cublasGemmAlgo_t);
  __typeof__(&cublasGetStatusString) status_string;
} fsdp_cublas_t;

#define FSDP_CUBLAS_STR2(x) #x
#define FSDP_CUBLAS_STR(x) FSDP_CUBLAS_STR2(x)

static fsdp_cublas_t fsdp_cublas_table;
static char fsdp_cublas_why[256];
static int fsdp_cublas_ok;
static pthread_once_t fsdp_cublas_once = PTHREAD_ONCE_INIT;

static void fsdp_cublas_load(void) {
  const char *names[] = {"libcublas.so." FSDP_CUBLAS_STR(CUBLAS_VER_MAJOR), "libcublas.so"};
  void *lib = NULL;
  for (int i = 0; i < 2 && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(fsdp_cublas_why, sizeof fsdp_cublas_why, "cannot open %s: %s (is the CUDA "
             "toolkit's lib64 on the library path?)", names[0], dlerror());
    return;
  }
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&fsdp_cublas_table.create, "cublasCreate_v2"},
      {(void **)&fsdp_cublas_table.destroy, "cublasDestroy_v2"},
      {(void **)&fsdp_cublas_table.set_stream, "cublasSetStream_v2"},
      {(void **)&fsdp_cublas_table.gemm_ex, "cublasGemmEx"},
      {(void **)&fsdp_cublas_table.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx"},
      {(void **)&fsdp_cublas_table.status_string, "cublasGetStatusString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
      snprintf(fsdp_cublas_why, sizeof fsdp_cublas_why, "%s has no %s", names[0], syms[i].name);
      return;
    }
  fsdp_cublas_ok = 1;
}

static inline const fsdp_cublas_t *fsdp_cublas(const char **why) {
  pthread_once(&fsdp_cublas_once, fsdp_cublas_load);
  if (why) *why = fsdp_cublas_why;
  return fsdp_cublas_ok ? &fsdp_cublas_table : NULL;
}

#endif
