/* src/backend/cuda/attention_choice.cu — which kernel runs bf16 attention: cuDNN's
 * fused SDPA (attention_cudnn.cpp) where it loads and builds the shape, else
 * the in-house flash kernel (flash.cu); decided once per process, device and
 * shape, and said in words (fsdp_cuda_attention_impl). Built in every CUDA
 * build; FSDP_HAVE_CUDNN (src/backend/cuda/meson.build) says whether
 * attention_cudnn.cpp is in it: not where its headers were missing at
 * configure time, nor under the simulator, where the cuDNN entry points are
 * defined here as unavailable. */
#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <vector>

#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_internal.cuh"
#include "fsdp/device.h"

#ifndef FSDP_HAVE_CUDNN
#define FSDP_HAVE_CUDNN 0
#endif

namespace {

enum attention_mode { MODE_AUTO, MODE_FLASH, MODE_CUDNN, MODE_BAD };

struct decision {
  int device, B, T, C, NH, NKV;
  bool cudnn;
  char text[640]; /* "cudnn 9.x.y (path)" or "in-house flash: why" */
};

std::mutex choice_lock;
std::vector<decision> decisions;
bool mode_read;
int mode;
char mode_value[64]; /* what FSDP_ATTENTION said, for the error */

int parse_mode(const char *v) {
  if (!v || !*v || !strcmp(v, "auto")) return MODE_AUTO;
  if (!strcmp(v, "flash")) return MODE_FLASH;
  if (!strcmp(v, "cudnn")) return MODE_CUDNN;
  return MODE_BAD;
}

/* Whether cuDNN runs the shape; its text (version and path) or why not in text.
 * A refusal is no failure of the caller's (the flash kernel runs instead): the
 * thread's last error is left as it was. */
bool cudnn_runs(int B, int T, int C, int NH, int NKV, char *text, size_t len) {
  const char *load_text = nullptr;
  if (!fsdp_cudnn_load(&load_text)) {
    snprintf(text, len, "%s", load_text);
    return false;
  }
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", fsdp_last_error());
  if (fsdp_cudnn_attention_prepare(B, T, C, NH, NKV) != FSDP_SUCCESS) {
    snprintf(text, len, "%s", fsdp_last_error());
    fsdp_error_set(keep);
    return false;
  }
  snprintf(text, len, "%s", load_text);
  return true;
}

/* cuDNN where it runs the shape (unless FSDP_ATTENTION=flash), else the
 * in-house flash kernel, multi-head and grouped-query alike. */
fsdp_status_t decide(int device, int B, int T, int C, int NH, int NKV, decision **out) {
  if (!mode_read) {
    const char *v = getenv("FSDP_ATTENTION");
    snprintf(mode_value, sizeof mode_value, "%s", v ? v : "");
    mode = parse_mode(v);
    mode_read = true;
  }
  if (mode == MODE_BAD)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "FSDP_ATTENTION=%s: expected flash, cudnn or auto (unset)", mode_value);
  decision d = {device, B, T, C, NH, NKV, false, ""};
  if (mode == MODE_FLASH) {
    snprintf(d.text, sizeof d.text, "in-house flash: FSDP_ATTENTION=flash");
  } else {
    char why[600];
    d.cudnn = cudnn_runs(B, T, C, NH, NKV, why, sizeof why);
    if (!d.cudnn && mode == MODE_CUDNN)
      return fsdp_error(FSDP_ERR_UNSUPPORTED,
                        "attention: FSDP_ATTENTION=cudnn, but cuDNN cannot run B %d, T %d, C %d, "
                        "NH %d, NKV %d: %s",
                        B, T, C, NH, NKV, why);
    snprintf(d.text, sizeof d.text, d.cudnn ? "%s" : "in-house flash: %s", why);
  }
  fsdp_log(FSDP_LOG_INFO, "attention on device %d, B %d, T %d, C %d, NH %d, NKV %d, bf16: %s",
           device, B, T, C, NH, NKV, d.text);
  decisions.push_back(d);
  *out = &decisions.back();
  return FSDP_SUCCESS;
}

fsdp_status_t find_or_decide(int B, int T, int C, int NH, int NKV, decision *out) {
  NKV = NKV == 0 ? NH : NKV;
  if (NKV < 0 || (NKV > 0 && NH % NKV != 0))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "attention: NKV %d key/value heads do not "
                      "divide the NH %d query heads", NKV, NH);
  int device;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> guard(choice_lock);
  for (const decision &d : decisions)
    if (d.device == device && d.B == B && d.T == T && d.C == C && d.NH == NH && d.NKV == NKV) {
      *out = d;
      return FSDP_SUCCESS;
    }
  decision *d;
  FSDP_TRY(decide(device, B, T, C, NH, NKV, &d));
  *out = *d;
  return FSDP_SUCCESS;
}

} // namespace

#if !FSDP_HAVE_CUDNN
/* attention_cudnn.cpp is not in this build: cuDNN never loads, so it is never
 * picked, and a direct call says why. */
static const char kNoCudnn[] =
#ifdef FSDP_CUDA_SIM
    "cuDNN not built: the simulator has none";
#else
    "cuDNN not built: the cuDNN frontend or cudnn.h was not found at configure time "
    "(scripts/cudnn-headers.sh)";
#endif

int fsdp_cudnn_load(const char **text) {
  if (text) *text = kNoCudnn;
  return 0;
}
fsdp_status_t fsdp_cudnn_attention_prepare(int B, int T, int C, int NH, int NKV) {
  (void)B, (void)T, (void)C, (void)NH, (void)NKV;
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s", kNoCudnn);
}
fsdp_status_t fsdp_cudnn_attention_forward(void *out, float *stats, const void *qkv, int B, int T,
                                           int C, int NH, int NKV, cudaStream_t stream) {
  (void)out, (void)stats, (void)qkv, (void)stream;
  return fsdp_cudnn_attention_prepare(B, T, C, NH, NKV);
}
fsdp_status_t fsdp_cudnn_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                            const void *out, const float *stats, int B, int T,
                                            int C, int NH, int NKV, cudaStream_t stream) {
  (void)dqkv, (void)dout, (void)qkv, (void)out, (void)stats, (void)stream;
  return fsdp_cudnn_attention_prepare(B, T, C, NH, NKV);
}
fsdp_status_t fsdp_cudnn_attention_release(void) { return FSDP_SUCCESS; } /* nothing made */
#endif

fsdp_status_t fsdp_cuda_attention_pick(int B, int T, int C, int NH, int NKV, int *use_cudnn) {
  decision d{};
  FSDP_TRY(find_or_decide(B, T, C, NH, NKV, &d));
  *use_cudnn = d.cudnn;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_attention_set_mode(const char *value) {
  const int m = parse_mode(value);
  if (m == MODE_BAD)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "attention mode %s: expected flash, cudnn or "
                      "auto", value);
  std::lock_guard<std::mutex> guard(choice_lock);
  mode = m;
  mode_read = true;
  decisions.clear();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_attention_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B, int T,
                                       int C, int NH, int NKV, char *buf, size_t len) {
  if (!fsdp_stream_cuda_handle(stream)) return fsdp_cuda_refuse("attention_impl", dtype, stream);
  if (!buf || len == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_cuda_attention_impl: no buffer");
  if (dtype == FSDP_F32) {
    snprintf(buf, len, "in-house fp32: probabilities kept (cuDNN runs bf16 only)");
    return FSDP_SUCCESS;
  }
  if (dtype != FSDP_BF16) return fsdp_cuda_refuse("attention_impl", dtype, stream);
  decision d{};
  FSDP_TRY(find_or_decide(B, T, C, NH, NKV > 0 ? NKV : NH, &d));
  snprintf(buf, len, "%s", d.text);
  return FSDP_SUCCESS;
}
