/* src/nn/gpt2_ops.c — GPT-2's CPU kernel table: the fp32 kernels of fsdp/nn.h
 * on host memory, called exactly as the model called them before the table
 * existed (same kernels, same order, same zeroing), so results are bitwise
 * what they were; the vocabulary head and its fused cross-entropy are
 * nn/head.h's (the same arithmetic on rows a padded stride apart). */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/nn.h"
#include "nn/gpt2_ops.h"
#include "nn/head.h"

struct gpt2_dev {
  double loss; /* the last xent's sum */
};

static fsdp_status_t cpu_alloc(void **p, size_t bytes) {
  *p = fsdp_alloc(bytes);
  return *p ? FSDP_SUCCESS
            : fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: cannot allocate %zu bytes of host memory",
                         bytes);
}

static void cpu_free(void *p) { fsdp_free(p); }
static void cpu_destroy(gpt2_dev_t *d) { free(d); }

static fsdp_status_t cpu_bind(gpt2_dev_t *d, fsdp_stream_t stream) {
  (void)d, (void)stream;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_stage(const int **tok, const int **tgt, const int *tokens,
                               const int *targets, size_t n, gpt2_dev_t *d) {
  (void)n, (void)d;
  *tok = tokens, *tgt = targets;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_zero(void *p, size_t bytes, gpt2_dev_t *d) {
  (void)d;
  memset(p, 0, bytes);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_embedding_forward(void *out, const int *tok, const void *wte,
                                           const void *wpe, int B, int T, int C, gpt2_dev_t *d) {
  (void)d;
  fsdp_embedding_forward(out, tok, wte, wpe, B, T, C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_embedding_backward(float *dwte, float *dwpe, const void *dout,
                                            const int *tok, int B, int T, int C, gpt2_dev_t *d) {
  (void)d;
  fsdp_embedding_backward(dwte, dwpe, dout, tok, B, T, C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                           const void *w, const void *b, int N, int C,
                                           gpt2_dev_t *d) {
  (void)d;
  fsdp_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                                            const void *inp, const void *w, const float *mean,
                                            const float *rstd, int N, int C, gpt2_dev_t *d) {
  (void)d;
  fsdp_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_head_forward(void *logits, int ld, const void *inp, const void *wte,
                                      int BT, int C, int V, gpt2_dev_t *d) {
  (void)d;
  nn_head_forward(logits, ld, inp, wte, BT, C, V);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_head_backward(void *dinp, float *dwte, const void *dlogits, int ld,
                                       const void *inp, const void *wte, int BT, int C, int V,
                                       gpt2_dev_t *d) {
  (void)d;
  nn_head_backward(dinp, dwte, dlogits, ld, inp, wte, BT, C, V);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_conv1d_forward(void *out, const void *inp, const void *w, const void *b,
                                        int B, int C, int OC, gpt2_dev_t *d) {
  (void)d;
  fsdp_conv1d_forward(out, inp, w, b, B, C, OC);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_conv1d_backward(void *dinp, float *dw, float *db, const void *dout,
                                         const void *inp, const void *w, int B, int C, int OC,
                                         gpt2_dev_t *d) {
  (void)d;
  fsdp_conv1d_backward(dinp, dw, db, dout, inp, w, B, C, OC);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_gelu_forward(void *out, const void *inp, size_t n, gpt2_dev_t *d) {
  (void)d;
  fsdp_gelu_forward(out, inp, n);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n,
                                       gpt2_dev_t *d) {
  (void)d;
  fsdp_gelu_backward(dinp, inp, dout, n);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_residual_forward(void *out, const void *a, const void *b, size_t n,
                                          gpt2_dev_t *d) {
  (void)d;
  fsdp_residual_forward(out, a, b, n);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_attention_forward(void *out, float *att, const void *qkv, int B, int T,
                                           int C, int NH, gpt2_dev_t *d) {
  (void)d;
  fsdp_attention_forward(out, att, qkv, B, T, C, NH);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                            const float *att, int B, int T, int C, int NH,
                                            gpt2_dev_t *d) {
  (void)d;
  fsdp_attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_xent(void *logits, int ld, const int *tgt, int BT, int V, float scale,
                              int grad, gpt2_dev_t *d) {
  d->loss = nn_xent_inplace(logits, ld, tgt, BT, V, scale, grad);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_loss(double *sum, gpt2_dev_t *d) {
  *sum = d->loss;
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_read(float *host, const void *act, size_t n, gpt2_dev_t *d) {
  (void)d;
  memcpy(host, act, n * sizeof(float));
  return FSDP_SUCCESS;
}

static const gpt2_ops_t cpu_ops = {
    .name = "cpu",
    .memory = FSDP_DEVICE_CPU,
    .dtype = FSDP_F32,
    .act_size = sizeof(float),
    .alloc = cpu_alloc,
    .free = cpu_free,
    .destroy = cpu_destroy,
    .bind = cpu_bind,
    .stage = cpu_stage,
    .zero = cpu_zero,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .head_forward = cpu_head_forward,
    .head_backward = cpu_head_backward,
    .conv1d_forward = cpu_conv1d_forward,
    .conv1d_backward = cpu_conv1d_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .xent = cpu_xent,
    .loss = cpu_loss,
    .read = cpu_read,
};

fsdp_status_t gpt2_backend_cpu(const gpt2_ops_t **ops, gpt2_dev_t **d) {
  *d = calloc(1, sizeof **d);
  if (!*d) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  *ops = &cpu_ops;
  return FSDP_SUCCESS;
}
