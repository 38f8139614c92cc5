/* tests/cuda/cudnn_attention_check.c — a one-minute check of cuDNN attention
 * alone on a real GPU, two cases through the table's entry points with cuDNN
 * forced, each timed with CUDA events:
 * - multi-head: GPT-2 124M's attention (B 16, T 1024, 12 heads of 64, bf16)
 *   against the in-house flash kernel on the same inputs;
 * - grouped-query: Llama-3.2-1B's (B 4, T 1024, 32 query heads over 8 KV
 *   heads of 64) against cuDNN's multi-head attention on the same inputs
 *   with each KV head repeated for its query heads (HF's repeat_kv), its dk
 *   and dv summed back over each group (an independent reference: the
 *   in-house flash kernel is the other implementation under test).
 * Prints what was opened (version, path), the largest differences (on the
 * scale of each tensor's largest value: a layout or mask error is O(1), bf16
 * rounding about 1e-2 at most), the milliseconds per call, and PASS or FAIL.
 * Exit 0 pass, 1 fail, 77 without a GPU or without cuDNN (the reason
 * printed: "SKIP: ..."). Not a meson test: the kernels test checks the
 * kernels against the CPU; this is for a lent GPU's minutes.
 * Usage: cudnn_attention_check [B T C NH [NKV]]: that one shape, multi-head
 * (NKV absent or NH) or grouped-query. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gqa.h"
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
  int B, T, C, NH, NKV; /* NKV: KV heads, NH for multi-head */
  size_t nqkv, no, nlse;
  void *qkv, *dout, *out, *dqkv; /* bf16 */
  float *lse, *scratch;           /* scratch: attention_scratch_bytes */
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

static void *dev_bf16_of(const float *x, size_t n) {
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) {
    printf("cudnn_attention_check: out of host memory\nFAIL\n");
    exit(1);
  }
  for (size_t i = 0; i < n; ++i) h[i] = fsdp_f32_to_bf16(x[i]);
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
                                         .NH = p->NH, .NKV = p->NKV};
}

static fsdp_attention_backward_args_t bwd_args(const problem *p) {
  return (fsdp_attention_backward_args_t){.dt = FSDP_BF16, .dqkv = p->dqkv,
                                          .scratch = p->scratch, .dout = p->dout, .qkv = p->qkv,
                                          .out = p->out, .att = p->lse, .B = p->B, .T = p->T,
                                          .C = p->C, .NH = p->NH, .NKV = p->NKV};
}

/* Forward and backward with the kernel `mode` picks; dqkv starts as NaN
 * (0xffff), so an element backward does not write shows. */
static void run(problem *p, const char *mode, fsdp_stream_t fs) {
  OK(fsdp_cuda_attention_set_mode(mode));
  CU(cudaMemset(p->dqkv, 0xff, p->nqkv * 2));
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

/* The problem's sizes and device buffers: qkv and dout random (dout shared
 * when given), out, dqkv and lse allocated. */
static problem make(int B, int T, int C, int NH, int NKV, void *dout) {
  problem p = {B, T, C, NH, NKV, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
  p.nqkv = (size_t)B * T * (size_t)(NH + 2 * NKV) * (size_t)(C / NH), p.no = (size_t)B * T * C;
  p.nlse = (size_t)B * NH * T;
  p.qkv = dev_bf16_random(p.nqkv), p.dout = dout ? dout : dev_bf16_random(p.no);
  CU(cudaMalloc(&p.out, p.no * 2));
  CU(cudaMalloc(&p.dqkv, p.nqkv * 2));
  CU(cudaMalloc((void **)&p.lse, p.nlse * 4));
  const fsdp_attention_forward_args_t sizes = fwd_args(&p);
  CU(cudaMalloc((void **)&p.scratch, fsdp_cuda_attention_scratch_bytes(&sizes)));
  return p;
}

static void forget(problem *p, int owns_dout) {
  cudaFree(p->qkv), cudaFree(p->out), cudaFree(p->dqkv), cudaFree(p->lse);
  cudaFree(p->scratch);
  if (owns_dout) cudaFree(p->dout);
}

static const double kTol = 2e-2;

/* Multi-head: cuDNN against the in-house flash kernel. */
static int mha_check(int B, int T, int C, int NH, fsdp_stream_t fs) {
  problem p = make(B, T, C, NH, NH, NULL);
  char impl[512];
  OK(fsdp_cuda_attention_set_mode("auto"));
  OK(fsdp_cuda_attention_impl(fs, FSDP_BF16, p.B, p.T, p.C, p.NH, p.NKV, impl, sizeof impl));
  printf("shape B %d T %d C %d NH %d NKV %d: auto picks %s\n", p.B, p.T, p.C, p.NH, p.NKV, impl);

  run(&p, "flash", fs);
  float *out_f = host_bf16(p.out, p.no), *lse_f = host_f32(p.lse, p.nlse),
        *d_f = host_bf16(p.dqkv, p.nqkv);
  run(&p, "cudnn", fs);
  float *out_c = host_bf16(p.out, p.no), *lse_c = host_f32(p.lse, p.nlse),
        *d_c = host_bf16(p.dqkv, p.nqkv);
  const double e_out = scaled_diff(out_c, out_f, p.no), e_lse = scaled_diff(lse_c, lse_f, p.nlse),
               e_d = scaled_diff(d_c, d_f, p.nqkv);
  printf("cudnn vs in-house flash, max |diff| / max |flash|: out %.3g, lse %.3g, dqkv %.3g "
         "(limit %.0e)\n", e_out, e_lse, e_d, kTol);
  float cf, cb, ff, fb;
  timed(&p, "cudnn", fs, &cf, &cb);
  timed(&p, "flash", fs, &ff, &fb);
  printf("ms per call: cudnn forward %.3f backward %.3f | "
         "flash forward %.3f backward %.3f | speed-up %.1fx\n", cf, cb, ff, fb,
         (ff + fb) / (cf + cb));
  const int pass = e_out <= kTol && e_lse <= kTol && e_d <= kTol;
  printf("multi-head: %s\n", pass ? "PASS" : "FAIL");
  free(out_f), free(lse_f), free(d_f), free(out_c), free(lse_c), free(d_c);
  forget(&p, 1);
  return pass;
}

/* Grouped-query: cuDNN with NKV KV heads against cuDNN's multi-head
 * attention on the repeat_kv of the same inputs, dk and dv folded back. */
static int gqa_check(int B, int T, int C, int NH, int NKV, fsdp_stream_t fs) {
  problem g = make(B, T, C, NH, NKV, NULL);
  problem m = make(B, T, C, NH, NH, g.dout);
  float *qkv = host_bf16(g.qkv, g.nqkv), *mha = malloc(m.nqkv * sizeof *mha);
  float *d_m = malloc(g.nqkv * sizeof *d_m);
  if (!mha || !d_m) {
    printf("cudnn_attention_check: out of host memory\nFAIL\n");
    exit(1);
  }
  gqa_repeat_kv(mha, qkv, B, T, C, NH, NKV);
  CU(cudaFree(m.qkv));
  m.qkv = dev_bf16_of(mha, m.nqkv);
  run(&g, "cudnn", fs);
  float *out_g = host_bf16(g.out, g.no), *lse_g = host_f32(g.lse, g.nlse),
        *d_g = host_bf16(g.dqkv, g.nqkv);
  run(&m, "cudnn", fs);
  float *out_m = host_bf16(m.out, m.no), *lse_m = host_f32(m.lse, m.nlse),
        *dm = host_bf16(m.dqkv, m.nqkv);
  gqa_fold_kv(d_m, dm, B, T, C, NH, NKV);
  const double e_out = scaled_diff(out_g, out_m, g.no), e_lse = scaled_diff(lse_g, lse_m, g.nlse),
               e_d = scaled_diff(d_g, d_m, g.nqkv);
  printf("shape B %d T %d C %d NH %d NKV %d: cudnn grouped-query vs cudnn multi-head on "
         "repeat_kv'd inputs, max |diff| / max |multi-head|: out %.3g, lse %.3g, dqkv %.3g "
         "(limit %.0e)\n", B, T, C, NH, NKV, e_out, e_lse, e_d, kTol);
  float gf, gb, mf, mb;
  timed(&g, "cudnn", fs, &gf, &gb);
  timed(&m, "cudnn", fs, &mf, &mb);
  printf("ms per call: grouped-query forward %.3f backward %.3f | multi-head on repeated KV "
         "forward %.3f backward %.3f\n", gf, gb, mf, mb);
  const int pass = e_out <= kTol && e_lse <= kTol && e_d <= kTol;
  printf("grouped-query: %s\n", pass ? "PASS" : "FAIL");
  free(qkv), free(mha), free(d_m), free(out_g), free(lse_g), free(d_g), free(out_m), free(lse_m);
  free(dm);
  forget(&m, 0);
  forget(&g, 1);
  return pass;
}

int main(int argc, char **argv) {
  const int gate = fsdp_cuda_gate("cudnn_attention_check");
  if (gate) return gate;
  if (argc != 1 && argc != 5 && argc != 6) {
    printf("usage: cudnn_attention_check [B T C NH [NKV]]\n");
    return 1;
  }
  const char *text = NULL;
  if (!fsdp_cudnn_load(&text)) {
    printf("cudnn_attention_check: SKIP: %s\n", text);
    return 77;
  }
  printf("cudnn_attention_check: opened %s\n", text);
  fsdp_stream_t fs;
  OK(fsdp_stream_create_cuda("cudnn_attention_check", 0, &fs));
  rng_seed(1234);
  int pass;
  if (argc == 1) {
    pass = mha_check(16, 1024, 768, 12, fs);
    pass = gqa_check(4, 1024, 2048, 32, 8, fs) && pass;
  } else {
    const int B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), NH = atoi(argv[4]);
    const int NKV = argc == 6 ? atoi(argv[5]) : NH;
    if (B <= 0 || T <= 0 || NH <= 0 || C % NH || NKV <= 0 || NH % NKV) {
      printf("cudnn_attention_check: B %d T %d C %d NH %d NKV %d: positive sizes, C a multiple "
             "of NH and NKV dividing NH expected\n", B, T, C, NH, NKV);
      return 1;
    }
    pass = NKV == NH ? mha_check(B, T, C, NH, fs) : gqa_check(B, T, C, NH, NKV, fs);
  }
  printf("%s\n", pass ? "PASS" : "FAIL");
  fsdp_stream_destroy(fs);
  return pass ? 0 : 1;
}
