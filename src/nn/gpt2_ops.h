/* src/nn/gpt2_ops.h — the kernels GPT-2 runs, as one table per backend: CPU
 * (fsdp/nn.h, fp32, host memory; gpt2_ops.c), CUDA fp32 and CUDA bf16
 * (src/cuda/kernels.h, device memory, the engine's compute stream;
 * gpt2_cuda.c). gpt2.c holds the model's structure once and calls the table.
 * Not installed.
 *
 * Pointers typed void * are activations in the table's dtype (float, or bf16
 * as uint16_t) and parameters as the engine's view hands them out (the same
 * dtype); float * are always fp32: parameter gradients, LayerNorm statistics,
 * attention's saved state (probabilities, or the log-sum-exp: att_lse). Every
 * pointer lives in the table's memory, except
 * the host arguments of stage and read. Kernels follow nn.h: outputs first,
 * backward adds into gradients, dims last, then the backend state. On CUDA
 * every call is queued on the stream bound by bind and returns at once, except
 * loss and read, which wait for their results. */
#ifndef FSDP_NN_GPT2_OPS_H
#define FSDP_NN_GPT2_OPS_H

#include "fsdp/engine.h"

typedef struct gpt2_dev gpt2_dev_t; /* a backend's state (buffers, stream) */

/* What a backend must size its scratch for. */
typedef struct {
  int maxB, maxT, C, NH, V;
} gpt2_dims_t;

typedef struct {
  const char *name;           /* "cpu", "cuda f32", "cuda bf16" */
  fsdp_device_kind_t memory;  /* where buffers live */
  fsdp_dtype_t dtype;         /* activations, and parameters in views */
  size_t act_size;            /* bytes per activation element */
  int att_lse;                /* 1: attention keeps the (B,NH,T) log-sum-exp in att, not the
                                 (B,NH,T,T) probabilities (the bf16 CUDA table) */

  /* Buffers in the table's memory, zeroed; free ignores NULL. */
  fsdp_status_t (*alloc)(void **p, size_t bytes);
  void (*free)(void *p);
  void (*destroy)(gpt2_dev_t *d);
  /* Binds the engine's compute stream for the calls that follow. */
  fsdp_status_t (*bind)(gpt2_dev_t *d, fsdp_stream_t stream);
  /* Makes host tokens and targets (n each; targets may be NULL) visible to the
   * kernels: *tok, *tgt point at them, in the table's memory. */
  fsdp_status_t (*stage)(const int **tok, const int **tgt, const int *tokens, const int *targets,
                         size_t n, gpt2_dev_t *d);
  fsdp_status_t (*zero)(void *p, size_t bytes, gpt2_dev_t *d);

  fsdp_status_t (*embedding_forward)(void *out, const int *tok, const void *wte, const void *wpe,
                                     int B, int T, int C, gpt2_dev_t *d);
  fsdp_status_t (*embedding_backward)(float *dwte, float *dwpe, const void *dout, const int *tok,
                                      int B, int T, int C, gpt2_dev_t *d);
  fsdp_status_t (*layernorm_forward)(void *out, float *mean, float *rstd, const void *inp,
                                     const void *w, const void *b, int N, int C, gpt2_dev_t *d);
  fsdp_status_t (*layernorm_backward)(void *dinp, float *dw, float *db, const void *dout,
                                      const void *inp, const void *w, const float *mean,
                                      const float *rstd, int N, int C, gpt2_dev_t *d);
  /* The tied vocabulary head, wte (V,C): logits (BT,V) with rows ld apart (ld
   * >= V; the model pads to a multiple of 128 so that every leading dimension
   * of the three vocabulary products is aligned). Columns [V, ld) are neither
   * read nor written. Backward adds into dinp and dwte. */
  fsdp_status_t (*head_forward)(void *logits, int ld, const void *inp, const void *wte, int BT,
                                int C, int V, gpt2_dev_t *d);
  fsdp_status_t (*head_backward)(void *dinp, float *dwte, const void *dlogits, int ld,
                                 const void *inp, const void *wte, int BT, int C, int V,
                                 gpt2_dev_t *d);
  /* Weight (C,OC): GPT-2's Conv1D. */
  fsdp_status_t (*conv1d_forward)(void *out, const void *inp, const void *w, const void *b, int B,
                                  int C, int OC, gpt2_dev_t *d);
  fsdp_status_t (*conv1d_backward)(void *dinp, float *dw, float *db, const void *dout,
                                   const void *inp, const void *w, int B, int C, int OC,
                                   gpt2_dev_t *d);
  fsdp_status_t (*gelu_forward)(void *out, const void *inp, size_t n, gpt2_dev_t *d);
  fsdp_status_t (*gelu_backward)(void *dinp, const void *inp, const void *dout, size_t n,
                                 gpt2_dev_t *d);
  fsdp_status_t (*residual_forward)(void *out, const void *a, const void *b, size_t n,
                                    gpt2_dev_t *d);
  fsdp_status_t (*attention_forward)(void *out, float *att, const void *qkv, int B, int T, int C,
                                     int NH, gpt2_dev_t *d);
  fsdp_status_t (*attention_backward)(void *dqkv, const void *dout, const void *qkv,
                                      const float *att, int B, int T, int C, int NH,
                                      gpt2_dev_t *d);
  /* Cross-entropy of logits (BT,V; rows ld apart), fused with its gradient:
   * starts the loss, which `loss` then returns summed in double, and with grad
   * writes (softmax - onehot) * scale over the logits in the same kernel, so
   * one buffer serves both. */
  fsdp_status_t (*xent)(void *logits, int ld, const int *tgt, int BT, int V, float scale,
                        int grad, gpt2_dev_t *d);
  fsdp_status_t (*loss)(double *sum, gpt2_dev_t *d);
  /* Copies n activations to host fp32, waiting for them. */
  fsdp_status_t (*read)(float *host, const void *act, size_t n, gpt2_dev_t *d);
} gpt2_ops_t;

fsdp_status_t gpt2_backend_cpu(const gpt2_ops_t **ops, gpt2_dev_t **d);
/* Device bytes gpt2_backend_cuda allocates for dims (0 without CUDA). */
size_t gpt2_cuda_scratch_bytes(fsdp_dtype_t dtype, const gpt2_dims_t *dims);
/* dtype FSDP_F32 or FSDP_BF16. *scratch_bytes: device memory the backend holds
 * (staging, the bf16 attention's fp32 copies, attention backward's scratch).
 * FSDP_ERR_UNSUPPORTED when fsdp was built without CUDA. */
fsdp_status_t gpt2_backend_cuda(fsdp_dtype_t dtype, const gpt2_dims_t *dims,
                                const gpt2_ops_t **ops, gpt2_dev_t **d, size_t *scratch_bytes);

#endif
