/* tests/cuda/cudnn_attention_check.c — a one-minute check of cuDNN attention
 * alone on a real GPU: GPT-2 124M's attention (B 16, T 1024, 12 heads of 64,
 * bf16; or B T C NH from the command line) through the table's entry points
 * with cuDNN forced, against the in-house flash kernel on the same inputs,
 * and both timed with CUDA events. Prints what was opened (version, path),
 * the largest differences (on the scale of each tensor's largest value: a
 * layout or mask error is O(1), bf16 rounding about 1e-2 at most), the
 * milliseconds per call, and PASS or FAIL. Exit 0 pass, 1 fail, 77 without
 * a GPU or without cuDNN (the reason printed). Not a meson test: the kernels
 * test checks both kernels against the CPU; this is for a lent GPU's minutes.
 * Usage: cudnn_attention_check [B T C NH] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/kernels.h"
#include "cuda_gate.h"
#include "fsdp/device.h"

#define CU(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      printf("cudnn_attention_check: %s: %s\nFAIL\n", #x, cudaGetErrorString(e_));     \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
#define OK(x)                                                                           \
  do {                                                                                  \
    if ((x) != FSDP_SUCCESS) {                                                          \
      printf("cudnn_attention_check: %s: %s\nFAIL\n", #x, fsdp_last_error());          \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

typedef struct {
  int B, T, C, NH;
  size_t nqkv, no, nlse;
  void *qkv, *dout, *out, *dqkv; /* bf16 */
  float *lse;
} problem;

/* rnd(), not rand_floats: the common arrays assert with Check, which reports
 * to a test runner this program does not have. */
static void *dev_bf16_random(size_t n) {
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) {
    printf("cudnn_attention_check: out of host memory\nFAIL\n");
    exit(1);
  }
  for (size_t i = 0; i < n; ++i) h[i] = fsdp_f32_to_bf16((float)rnd());
  void *d = NULL;
  CU(cudaMalloc(&d, n * 2));
  CU(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static float *host_bf16(const void *d, size_t n) {
  uint16_t *h = malloc(n * sizeof *h);
  float *f = malloc(n * sizeof *f);
  CU(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) f[i] = fsdp_bf16_to_f32(h[i]);
  free(h);
  return f;
}

static float *host_f32(const float *d, size_t n) {
  float *f = malloc(n * sizeof *f);
  CU(cudaMemcpy(f, d, n * sizeof *f, cudaMemcpyDeviceToHost));
  return f;
}

static fsdp_attention_forward_args_t fwd_args(const problem *p) {
  return (fsdp_attention_forward_args_t){.dt = FSDP_BF16, .out = p->out, .att = p->lse,
                                         .qkv = p->qkv, .B = p->B, .T = p->T, .C = p->C,
                                         .NH = p->NH};
}

static fsdp_attention_backward_args_t bwd_args(const problem *p) {
  return (fsdp_attention_backward_args_t){.dt = FSDP_BF16, .dqkv = p->dqkv, .dout = p->dout,
                                          .qkv = p->qkv, .out = p->out, .att = p->lse,
                                          .B = p->B, .T = p->T, .C = p->C, .NH = p->NH};
}

/* Forward and backward (from zeros) with the kernel `mode` picks. */
static void run(problem *p, const char *mode, fsdp_stream_t fs) {
  OK(fsdp_cuda_attention_set_mode(mode));
  CU(cudaMemset(p->dqkv, 0, p->nqkv * 2));
  const fsdp_attention_forward_args_t fa = fwd_args(p);
  const fsdp_attention_backward_args_t ba = bwd_args(p);
  OK(fsdp_cuda_attention_forward(&fa, fs));
  OK(fsdp_cuda_attention_backward(&ba, fs));
  CU(cudaStreamSynchronize((cudaStream_t)fsdp_stream_cuda_handle(fs)));
}

/* Milliseconds per forward and per backward, over 20 calls each. */
static void timed(problem *p, const char *mode, fsdp_stream_t fs, float *fwd, float *bwd) {
  cudaStream_t s = (cudaStream_t)fsdp_stream_cuda_handle(fs);
  cudaEvent_t e0, e1, e2;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  CU(cudaEventCreate(&e2));
  run(p, mode, fs); /* warm: graphs built, workspace allocated */
  const int n = 20;
  const fsdp_attention_forward_args_t fa = fwd_args(p);
  const fsdp_attention_backward_args_t ba = bwd_args(p);
  CU(cudaEventRecord(e0, s));
  for (int i = 0; i < n; ++i)
    OK(fsdp_cuda_attention_forward(&fa, fs));
  CU(cudaEventRecord(e1, s));
  for (int i = 0; i < n; ++i)
    OK(fsdp_cuda_attention_backward(&ba, fs));
  CU(cudaEventRecord(e2, s));
  CU(cudaEventSynchronize(e2));
  CU(cudaEventElapsedTime(fwd, e0, e1));
  CU(cudaEventElapsedTime(bwd, e1, e2));
  *fwd /= n, *bwd /= n;
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
}

/* max |a - b| / max |b|; NaN anywhere is infinite. */
static double scaled_diff(const float *a, const float *b, size_t n) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = fabs((double)a[i] - b[i]);
    if (isnan(d)) return INFINITY;
    worst = fmax(worst, d);
    scale = fmax(scale, fabs((double)b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

int main(int argc, char **argv) {
  const int gate = fsdp_cuda_gate("cudnn_attention_check");
  if (gate) return gate;
  problem p = {16, 1024, 768, 12, 0, 0, 0, NULL, NULL, NULL, NULL, NULL};
  if (argc == 5) p.B = atoi(argv[1]), p.T = atoi(argv[2]), p.C = atoi(argv[3]), p.NH = atoi(argv[4]);
  const char *text = NULL;
  if (!fsdp_cudnn_load(&text)) {
    printf("cudnn_attention_check: SKIP: %s\n", text);
    return 77;
  }
  printf("cudnn_attention_check: opened %s\n", text);
  fsdp_stream_t fs;
  OK(fsdp_stream_create_cuda("cudnn_attention_check", 0, &fs));
  rng_seed(1234);
  p.nqkv = (size_t)p.B * p.T * 3 * p.C, p.no = (size_t)p.B * p.T * p.C;
  p.nlse = (size_t)p.B * p.NH * p.T;
  p.qkv = dev_bf16_random(p.nqkv), p.dout = dev_bf16_random(p.no);
  CU(cudaMalloc(&p.out, p.no * 2));
  CU(cudaMalloc(&p.dqkv, p.nqkv * 2));
  CU(cudaMalloc((void **)&p.lse, p.nlse * 4));
  char impl[512];
  OK(fsdp_cuda_attention_set_mode("auto"));
  OK(fsdp_cuda_attention_impl(fs, FSDP_BF16, p.B, p.T, p.C, p.NH, impl, sizeof impl));
  printf("shape B %d T %d C %d NH %d: auto picks %s\n", p.B, p.T, p.C, p.NH, impl);

  run(&p, "flash", fs);
  float *out_f = host_bf16(p.out, p.no), *lse_f = host_f32(p.lse, p.nlse),
        *d_f = host_bf16(p.dqkv, p.nqkv);
  run(&p, "cudnn", fs);
  float *out_c = host_bf16(p.out, p.no), *lse_c = host_f32(p.lse, p.nlse),
        *d_c = host_bf16(p.dqkv, p.nqkv);
  const double e_out = scaled_diff(out_c, out_f, p.no), e_lse = scaled_diff(lse_c, lse_f, p.nlse),
               e_d = scaled_diff(d_c, d_f, p.nqkv);
  const double tol = 2e-2;
  printf("cudnn vs in-house flash, max |diff| / max |flash|: out %.3g, lse %.3g, dqkv %.3g "
         "(limit %.0e)\n", e_out, e_lse, e_d, tol);
  float cf, cb, ff, fb;
  timed(&p, "cudnn", fs, &cf, &cb);
  timed(&p, "flash", fs, &ff, &fb);
  printf("ms per call: cudnn forward %.3f backward %.3f (backward includes the add into dqkv) | "
         "flash forward %.3f backward %.3f | speed-up %.1fx\n", cf, cb, ff, fb,
         (ff + fb) / (cf + cb));
  const int pass = e_out <= tol && e_lse <= tol && e_d <= tol;
  printf("%s\n", pass ? "PASS" : "FAIL");
  free(out_f), free(lse_f), free(d_f), free(out_c), free(lse_c), free(d_c);
  return pass ? 0 : 1;
}
