/* src/backend/cuda/cublaslt_lazy.h — cuBLASLt opened on first use (dlopen),
 * for src/backend/cuda/blas.cu's fused-epilogue products, for the reason
 * cublas_lazy.h gives (no link-time cost for programs that never multiply on
 * a GPU). Only the entry points blas.cu calls are looked up; their types come
 * from cublasLt.h itself.
 *
 * fsdp_cublaslt() returns the table, or NULL with the reason in *why (the
 * library or a symbol is missing; callers then use cuBLAS and a separate
 * pass). Thread-safe (pthread_once); the library stays open for the life of
 * the process. Include from one place per program. C and C++. */
#ifndef FSDP_CUDA_CUBLASLT_LAZY_H
#define FSDP_CUDA_CUBLASLT_LAZY_H

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

typedef struct {
  __typeof__(&cublasLtCreate) create;
  __typeof__(&cublasLtDestroy) destroy;
  __typeof__(&cublasLtMatmulDescCreate) desc_create;
  __typeof__(&cublasLtMatmulDescDestroy) desc_destroy;
  __typeof__(&cublasLtMatmulDescSetAttribute) desc_set;
  __typeof__(&cublasLtMatrixLayoutCreate) layout_create;
  __typeof__(&cublasLtMatrixLayoutDestroy) layout_destroy;
  __typeof__(&cublasLtMatmulPreferenceCreate) pref_create;
  __typeof__(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  __typeof__(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  __typeof__(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  __typeof__(&cublasLtMatmul) matmul;
} fsdp_cublaslt_t;

#define FSDP_CUBLASLT_STR2(x) #x
#define FSDP_CUBLASLT_STR(x) FSDP_CUBLASLT_STR2(x)

static fsdp_cublaslt_t fsdp_cublaslt_table;
static char fsdp_cublaslt_why[256];
static int fsdp_cublaslt_ok;
static pthread_once_t fsdp_cublaslt_once = PTHREAD_ONCE_INIT;

static void fsdp_cublaslt_load(void) {
  const char *names[] = {"libcublasLt.so." FSDP_CUBLASLT_STR(CUBLAS_VER_MAJOR), "libcublasLt.so"};
  void *lib = NULL;
  for (int i = 0; i < 2 && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(fsdp_cublaslt_why, sizeof fsdp_cublaslt_why, "cannot open %s: %s", names[0],
             dlerror());
    return;
  }
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&fsdp_cublaslt_table.create, "cublasLtCreate"},
      {(void **)&fsdp_cublaslt_table.destroy, "cublasLtDestroy"},
      {(void **)&fsdp_cublaslt_table.desc_create, "cublasLtMatmulDescCreate"},
      {(void **)&fsdp_cublaslt_table.desc_destroy, "cublasLtMatmulDescDestroy"},
      {(void **)&fsdp_cublaslt_table.desc_set, "cublasLtMatmulDescSetAttribute"},
      {(void **)&fsdp_cublaslt_table.layout_create, "cublasLtMatrixLayoutCreate"},
      {(void **)&fsdp_cublaslt_table.layout_destroy, "cublasLtMatrixLayoutDestroy"},
      {(void **)&fsdp_cublaslt_table.pref_create, "cublasLtMatmulPreferenceCreate"},
      {(void **)&fsdp_cublaslt_table.pref_destroy, "cublasLtMatmulPreferenceDestroy"},
      {(void **)&fsdp_cublaslt_table.pref_set, "cublasLtMatmulPreferenceSetAttribute"},
      {(void **)&fsdp_cublaslt_table.heuristic, "cublasLtMatmulAlgoGetHeuristic"},
      {(void **)&fsdp_cublaslt_table.matmul, "cublasLtMatmul"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
      snprintf(fsdp_cublaslt_why, sizeof fsdp_cublaslt_why, "%s has no %s", names[0],
               syms[i].name);
      return;
    }
  fsdp_cublaslt_ok = 1;
}

static inline const fsdp_cublaslt_t *fsdp_cublaslt(const char **why) {
  pthread_once(&fsdp_cublaslt_once, fsdp_cublaslt_load);
  if (why) *why = fsdp_cublaslt_why;
  return fsdp_cublaslt_ok ? &fsdp_cublaslt_table : NULL;
}

#endif
