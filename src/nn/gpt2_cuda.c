/* src/nn/gpt2_cuda.c — GPT-2's CUDA kernel tables (fp32 and bf16): the twins
 * of src/cuda/kernels.h queued on the engine's compute stream, device buffers
 * for tokens, targets and per-row losses, and two pinned host buffers that the
 * host fills and reads between synchronisations.
 *
 * bf16: activations, weights and activation gradients are bf16; parameter
 * gradients, LayerNorm statistics and losses fp32. Attention runs on tensor
 * cores in bf16 and keeps per layer only the (B,NH,T) fp32 log-sum-exp
 * (att_lse); its T^2 scratch is one batch row's, shared by all layers. fp32:
 * attention keeps (B,NH,T,T) fp32 probabilities.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp_config.h"
#include "nn/gpt2_ops.h"

#if FSDP_HAVE_CUDA
#include "cuda/kernels.h"

enum { READ_CHUNK = 1 << 20 }; /* bytes of the pinned buffer `read` copies through */

struct gpt2_dev {
  gpt2_dims_t dims;
  fsdp_cuda_stream_t s;          /* the bound compute stream */
  fsdp_stream_t stream;
  int *tok, *tgt;                /* (maxB*maxT) device */
  float *losses;                 /* (maxB*maxT) device, per-row losses */
  int *stage_h;                  /* (2*maxB*maxT) pinned: tokens then targets */
  float *losses_h;               /* (maxB*maxT) pinned */
  void *chunk_h;                 /* (READ_CHUNK bytes) pinned */
  fsdp_event_t staged, lossed;   /* stage_h and losses_h are free / filled */
  int loss_rows;                 /* rows of the loss in flight */
  void *att_scratch;             /* fp32: (NH,T,T) floats for backward; bf16: one batch row's
                                    scores, dP, p and dscore (attention_lse) */
};

/* Zeroed on the host stream, which returns when the zeros have landed (the
 * engine's non-blocking streams do not wait for the legacy stream): at
 * create, never in a step. */
static fsdp_status_t cuda_alloc(void **p, size_t bytes) {
  FSDP_TRY(fsdp_device_alloc(FSDP_DEVICE_CUDA, bytes, p));
  fsdp_status_t st = fsdp_device_zero(*p, bytes, FSDP_HOST_STREAM);
  if (st != FSDP_SUCCESS) fsdp_device_free(FSDP_DEVICE_CUDA, *p), *p = NULL;
  return st;
}

static void cuda_free(void *p) { fsdp_device_free(FSDP_DEVICE_CUDA, p); }

static void cuda_destroy(gpt2_dev_t *d) {
  if (!d) return;
  /* Device and pinned frees wait for the device: no queued kernel still reads these. */
  if (d->staged) fsdp_event_destroy(d->staged);
  if (d->lossed) fsdp_event_destroy(d->lossed);
  void *dev[] = {d->tok, d->tgt, d->losses, d->att_scratch};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cuda_free(dev[i]);
  fsdp_pinned_free(d->stage_h);
  fsdp_pinned_free(d->losses_h);
  fsdp_pinned_free(d->chunk_h);
  free(d);
}

static fsdp_status_t cuda_bind(gpt2_dev_t *d, fsdp_stream_t stream) {
  d->s = fsdp_stream_cuda_handle(stream);
  if (!d->s)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "GPT-2 on CUDA: the engine's compute stream is not a CUDA stream (is "
                      "config.device FSDP_DEVICE_CUDA?)");
  d->stream = stream;
  return FSDP_SUCCESS;
}

/* Through the pinned buffer, which the previous stage's copies must have left. */
static fsdp_status_t cuda_stage(const int **tok, const int **tgt, const int *tokens,
                                const int *targets, size_t n, gpt2_dev_t *d) {
  FSDP_TRY(fsdp_event_synchronize(d->staged));
  memcpy(d->stage_h, tokens, n * sizeof(int));
  FSDP_TRY(fsdp_device_copy(d->tok, d->stage_h, n * sizeof(int), d->stream));
  if (targets) {
    memcpy(d->stage_h + n, targets, n * sizeof(int));
    FSDP_TRY(fsdp_device_copy(d->tgt, d->stage_h + n, n * sizeof(int), d->stream));
  }
  FSDP_TRY(fsdp_event_record(d->staged, d->stream));
  *tok = d->tok, *tgt = targets ? d->tgt : NULL;
  return FSDP_SUCCESS;
}

static fsdp_status_t cuda_zero(void *p, size_t bytes, gpt2_dev_t *d) {
  return fsdp_device_zero(p, bytes, d->stream);
}

/* ---- fp32 ---------------------------------------------------------------- */

static fsdp_status_t f32_embedding_forward(void *out, const int *tok, const void *wte,
                                           const void *wpe, int B, int T, int C, gpt2_dev_t *d) {
  return fsdp_cuda_embedding_forward(out, tok, wte, wpe, B, T, C, d->s);
}

static fsdp_status_t f32_embedding_backward(float *dwte, float *dwpe, const void *dout,
                                            const int *tok, int B, int T, int C, gpt2_dev_t *d) {
  return fsdp_cuda_embedding_backward(dwte, dwpe, dout, tok, B, T, C, d->s);
}

static fsdp_status_t f32_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                           const void *w, const void *b, int N, int C,
                                           gpt2_dev_t *d) {
  return fsdp_cuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, d->s);
}

static fsdp_status_t f32_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                                            const void *inp, const void *w, const float *mean,
                                            const float *rstd, int N, int C, gpt2_dev_t *d) {
  return fsdp_cuda_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, d->s);
}

static fsdp_status_t f32_head_forward(void *logits, int ld, const void *inp, const void *wte,
                                      int BT, int C, int V, gpt2_dev_t *d) {
  return fsdp_cuda_head_forward(logits, ld, inp, wte, BT, C, V, d->s);
}

static fsdp_status_t f32_head_backward(void *dinp, float *dwte, const void *dlogits, int ld,
                                       const void *inp, const void *wte, int BT, int C, int V,
                                       gpt2_dev_t *d) {
  return fsdp_cuda_head_backward(dinp, dwte, dlogits, ld, inp, wte, BT, C, V, d->s);
}

static fsdp_status_t f32_conv1d_forward(void *out, const void *inp, const void *w, const void *b,
                                        int B, int C, int OC, gpt2_dev_t *d) {
  return fsdp_cuda_conv1d_forward(out, inp, w, b, B, C, OC, d->s);
}

static fsdp_status_t f32_conv1d_backward(void *dinp, float *dw, float *db, const void *dout,
                                         const void *inp, const void *w, int B, int C, int OC,
                                         gpt2_dev_t *d) {
  return fsdp_cuda_conv1d_backward(dinp, dw, db, dout, inp, w, B, C, OC, d->s);
}

static fsdp_status_t f32_gelu_forward(void *out, const void *inp, size_t n, gpt2_dev_t *d) {
  return fsdp_cuda_gelu_forward(out, inp, n, d->s);
}

static fsdp_status_t f32_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n,
                                       gpt2_dev_t *d) {
  return fsdp_cuda_gelu_backward(dinp, inp, dout, n, d->s);
}

static fsdp_status_t f32_residual_forward(void *out, const void *a, const void *b, size_t n,
                                          gpt2_dev_t *d) {
  return fsdp_cuda_residual_forward(out, a, b, n, d->s);
}

static fsdp_status_t f32_attention_forward(void *out, float *att, const void *qkv, int B, int T,
                                           int C, int NH, gpt2_dev_t *d) {
  return fsdp_cuda_attention_forward(out, att, qkv, B, T, C, NH, d->s);
}

static fsdp_status_t f32_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                            const float *att, int B, int T, int C, int NH,
                                            gpt2_dev_t *d) {
  return fsdp_cuda_attention_backward(dqkv, d->att_scratch, dout, qkv, att, B, T, C, NH, d->s);
}

/* The per-row losses go to pinned memory behind an event; `loss` waits. */
static fsdp_status_t loss_copy(int BT, gpt2_dev_t *d) {
  FSDP_TRY(fsdp_device_copy(d->losses_h, d->losses, (size_t)BT * sizeof(float), d->stream));
  FSDP_TRY(fsdp_event_record(d->lossed, d->stream));
  d->loss_rows = BT;
  return FSDP_SUCCESS;
}

static fsdp_status_t f32_xent(void *logits, int ld, const int *tgt, int BT, int V, float scale,
                         int grad, gpt2_dev_t *d) {
  FSDP_TRY(fsdp_cuda_xent_inplace(logits, ld, d->losses, tgt, BT, V, scale, grad, d->s));
  return loss_copy(BT, d);
}

static fsdp_status_t cuda_loss(double *sum, gpt2_dev_t *d) {
  FSDP_TRY(fsdp_event_synchronize(d->lossed));
  double s = 0.0;
  for (int i = 0; i < d->loss_rows; i++) s += d->losses_h[i];
  *sum = s;
  return FSDP_SUCCESS;
}

/* Through the pinned chunk, widening bf16 on the host. */
static fsdp_status_t read_chunks(float *host, const void *act, size_t n, size_t esize,
                                 gpt2_dev_t *d) {
  size_t per = READ_CHUNK / esize;
  for (size_t at = 0; at < n; at += per) {
    size_t k = n - at < per ? n - at : per;
    FSDP_TRY(fsdp_device_copy(d->chunk_h, (const char *)act + at * esize, k * esize, d->stream));
    FSDP_TRY(fsdp_stream_synchronize(d->stream));
    if (esize == sizeof(float)) memcpy(host + at, d->chunk_h, k * sizeof(float));
    else
      for (size_t i = 0; i < k; i++) host[at + i] = fsdp_bf16_to_f32(((uint16_t *)d->chunk_h)[i]);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t f32_read(float *host, const void *act, size_t n, gpt2_dev_t *d) {
  return read_chunks(host, act, n, sizeof(float), d);
}

/* ---- bf16 ---------------------------------------------------------------- */

static fsdp_status_t bf16_embedding_forward(void *out, const int *tok, const void *wte,
                                            const void *wpe, int B, int T, int C, gpt2_dev_t *d) {
  return fsdp_cuda_embedding_forward_bf16(out, tok, wte, wpe, B, T, C, d->s);
}

static fsdp_status_t bf16_embedding_backward(float *dwte, float *dwpe, const void *dout,
                                             const int *tok, int B, int T, int C, gpt2_dev_t *d) {
  return fsdp_cuda_embedding_backward_bf16(dwte, dwpe, dout, tok, B, T, C, d->s);
}

static fsdp_status_t bf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                            const void *w, const void *b, int N, int C,
                                            gpt2_dev_t *d) {
  return fsdp_cuda_layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C, d->s);
}

static fsdp_status_t bf16_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
                                             const void *inp, const void *w, const float *mean,
                                             const float *rstd, int N, int C, gpt2_dev_t *d) {
  return fsdp_cuda_layernorm_backward_bf16(dinp, dw, db, dout, inp, w, mean, rstd, N, C, d->s);
}

static fsdp_status_t bf16_head_forward(void *logits, int ld, const void *inp, const void *wte,
                                       int BT, int C, int V, gpt2_dev_t *d) {
  return fsdp_cuda_head_forward_bf16(logits, ld, inp, wte, BT, C, V, d->s);
}

static fsdp_status_t bf16_head_backward(void *dinp, float *dwte, const void *dlogits, int ld,
                                        const void *inp, const void *wte, int BT, int C, int V,
                                        gpt2_dev_t *d) {
  return fsdp_cuda_head_backward_bf16(dinp, dwte, dlogits, ld, inp, wte, BT, C, V, d->s);
}

static fsdp_status_t bf16_conv1d_forward(void *out, const void *inp, const void *w, const void *b,
                                         int B, int C, int OC, gpt2_dev_t *d) {
  return fsdp_cuda_conv1d_forward_bf16(out, inp, w, b, B, C, OC, d->s);
}

static fsdp_status_t bf16_conv1d_backward(void *dinp, float *dw, float *db, const void *dout,
                                          const void *inp, const void *w, int B, int C, int OC,
                                          gpt2_dev_t *d) {
  return fsdp_cuda_conv1d_backward_bf16(dinp, dw, db, dout, inp, w, B, C, OC, d->s);
}

static fsdp_status_t bf16_gelu_forward(void *out, const void *inp, size_t n, gpt2_dev_t *d) {
  return fsdp_cuda_gelu_forward_bf16(out, inp, n, d->s);
}

static fsdp_status_t bf16_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n,
                                        gpt2_dev_t *d) {
  return fsdp_cuda_gelu_backward_bf16(dinp, inp, dout, n, d->s);
}

static fsdp_status_t bf16_residual_forward(void *out, const void *a, const void *b, size_t n,
                                           gpt2_dev_t *d) {
  return fsdp_cuda_residual_forward_bf16(out, a, b, n, d->s);
}

/* att is the (B,NH,T) log-sum-exp: tensor-core attention (attention.cu). */
static fsdp_status_t bf16_attention_forward(void *out, float *att, const void *qkv, int B, int T,
                                            int C, int NH, gpt2_dev_t *d) {
  return fsdp_cuda_attention_lse_forward_bf16(out, att, d->att_scratch, qkv, B, T, C, NH, d->s);
}

static fsdp_status_t bf16_attention_backward(void *dqkv, const void *dout, const void *qkv,
                                             const float *att, int B, int T, int C, int NH,
                                             gpt2_dev_t *d) {
  return fsdp_cuda_attention_lse_backward_bf16(dqkv, d->att_scratch, dout, qkv, att, B, T, C, NH,
                                               d->s);
}

static fsdp_status_t bf16_xent(void *logits, int ld, const int *tgt, int BT, int V, float scale,
                          int grad, gpt2_dev_t *d) {
  FSDP_TRY(fsdp_cuda_xent_inplace_bf16(logits, ld, d->losses, tgt, BT, V, scale, grad, d->s));
  return loss_copy(BT, d);
}

static fsdp_status_t bf16_read(float *host, const void *act, size_t n, gpt2_dev_t *d) {
  return read_chunks(host, act, n, sizeof(uint16_t), d);
}

static const gpt2_ops_t f32_ops = {
    .name = "cuda f32",
    .memory = FSDP_DEVICE_CUDA,
    .dtype = FSDP_F32,
    .act_size = sizeof(float),
    .alloc = cuda_alloc,
    .free = cuda_free,
    .destroy = cuda_destroy,
    .bind = cuda_bind,
    .stage = cuda_stage,
    .zero = cuda_zero,
    .embedding_forward = f32_embedding_forward,
    .embedding_backward = f32_embedding_backward,
    .layernorm_forward = f32_layernorm_forward,
    .layernorm_backward = f32_layernorm_backward,
    .head_forward = f32_head_forward,
    .head_backward = f32_head_backward,
    .conv1d_forward = f32_conv1d_forward,
    .conv1d_backward = f32_conv1d_backward,
    .gelu_forward = f32_gelu_forward,
    .gelu_backward = f32_gelu_backward,
    .residual_forward = f32_residual_forward,
    .attention_forward = f32_attention_forward,
    .attention_backward = f32_attention_backward,
    .xent = f32_xent,
    .loss = cuda_loss,
    .read = f32_read,
};

static const gpt2_ops_t bf16_ops = {
    .name = "cuda bf16",
    .memory = FSDP_DEVICE_CUDA,
    .dtype = FSDP_BF16,
    .act_size = sizeof(uint16_t),
    .att_lse = 1,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .destroy = cuda_destroy,
    .bind = cuda_bind,
    .stage = cuda_stage,
    .zero = cuda_zero,
    .embedding_forward = bf16_embedding_forward,
    .embedding_backward = bf16_embedding_backward,
    .layernorm_forward = bf16_layernorm_forward,
    .layernorm_backward = bf16_layernorm_backward,
    .head_forward = bf16_head_forward,
    .head_backward = bf16_head_backward,
    .conv1d_forward = bf16_conv1d_forward,
    .conv1d_backward = bf16_conv1d_backward,
    .gelu_forward = bf16_gelu_forward,
    .gelu_backward = bf16_gelu_backward,
    .residual_forward = bf16_residual_forward,
    .attention_forward = bf16_attention_forward,
    .attention_backward = bf16_attention_backward,
    .xent = bf16_xent,
    .loss = cuda_loss,
    .read = bf16_read,
};

enum { N_DEV_BUFFERS = 4 };

/* Bytes of each device buffer, in dev_buffers' order. */
static void dev_sizes(const gpt2_dims_t *m, int bf16, size_t sz[N_DEV_BUFFERS]) {
  size_t BT = (size_t)m->maxB * (size_t)m->maxT;
  size_t att = bf16 ? fsdp_cuda_attention_lse_scratch_bytes(m->maxT, m->NH)
                    : (size_t)m->NH * (size_t)m->maxT * (size_t)m->maxT * sizeof(float);
  const size_t s[N_DEV_BUFFERS] = {BT * sizeof(int), BT * sizeof(int), BT * sizeof(float), att};
  memcpy(sz, s, sizeof s);
}

size_t gpt2_cuda_scratch_bytes(fsdp_dtype_t dtype, const gpt2_dims_t *dims) {
  size_t sz[N_DEV_BUFFERS], total = 0;
  dev_sizes(dims, dtype == FSDP_BF16, sz);
  for (int i = 0; i < N_DEV_BUFFERS; i++) total += sz[i];
  return total;
}

static fsdp_status_t dev_buffers(gpt2_dev_t *d, int bf16, size_t *bytes) {
  const gpt2_dims_t *m = &d->dims;
  size_t BT = (size_t)m->maxB * (size_t)m->maxT, sz[N_DEV_BUFFERS];
  dev_sizes(m, bf16, sz);
  void **dev[N_DEV_BUFFERS] = {(void **)&d->tok, (void **)&d->tgt, (void **)&d->losses,
                               (void **)&d->att_scratch};
  *bytes = 0;
  for (int i = 0; i < N_DEV_BUFFERS; i++)
    if (sz[i]) {
      FSDP_TRY(cuda_alloc(dev[i], sz[i]));
      *bytes += sz[i];
    }
  FSDP_TRY(fsdp_pinned_alloc(2 * BT * sizeof(int), (void **)&d->stage_h));
  FSDP_TRY(fsdp_pinned_alloc(BT * sizeof(float), (void **)&d->losses_h));
  FSDP_TRY(fsdp_pinned_alloc(READ_CHUNK, &d->chunk_h));
  FSDP_TRY(fsdp_event_create(&d->staged));
  return fsdp_event_create(&d->lossed);
}

fsdp_status_t gpt2_backend_cuda(fsdp_dtype_t dtype, const gpt2_dims_t *dims,
                                const gpt2_ops_t **ops, gpt2_dev_t **out, size_t *scratch_bytes) {
  if (dtype != FSDP_F32 && dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "GPT-2 on CUDA computes in f32 or bf16, not %s",
                      fsdp_dtype_name(dtype));
  gpt2_dev_t *d = calloc(1, sizeof *d);
  if (!d) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  d->dims = *dims;
  fsdp_status_t st = dev_buffers(d, dtype == FSDP_BF16, scratch_bytes);
  if (st != FSDP_SUCCESS) {
    cuda_destroy(d);
    return st;
  }
  *ops = dtype == FSDP_BF16 ? &bf16_ops : &f32_ops;
  *out = d;
  return FSDP_SUCCESS;
}

#else

size_t gpt2_cuda_scratch_bytes(fsdp_dtype_t dtype, const gpt2_dims_t *dims) {
  (void)dtype, (void)dims;
  return 0;
}

fsdp_status_t gpt2_backend_cuda(fsdp_dtype_t dtype, const gpt2_dims_t *dims,
                                const gpt2_ops_t **ops, gpt2_dev_t **out, size_t *scratch_bytes) {
  (void)dtype, (void)dims, (void)ops, (void)out, (void)scratch_bytes;
  return fsdp_error(FSDP_ERR_UNSUPPORTED,
                    "GPT-2 on CUDA: fsdp was built without CUDA; reconfigure with nvcc on PATH "
                    "(meson setup -Dcuda=enabled)");
}

#endif
