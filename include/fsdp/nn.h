/* fsdp/nn.h — CPU layer kernels (fp32, OpenBLAS), the MLP model (CPU engines)
 * and GPT-2 (CPU and CUDA engines).
 *
 * Kernels are free functions over raw row-major pointers: outputs first, then
 * inputs, weights, dims. Backward kernels ADD into gradient buffers (+=); zeroing
 * is the caller's (the engine hands out zeroed gradient buffers).
 * Dims legend: B batch (or rows), T time, C channels (input features), OC output
 * features, NH attention heads, V vocabulary.
 * Thread safety: kernels are pure; an MLP handle is driven by one thread. */
#ifndef FSDP_NN_H
#define FSDP_NN_H

#include "fsdp/engine.h"
#include "fsdp/plan.h"
#include "fsdp/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (B,OC) = inp (B,C) @ weight^T (OC,C) + bias (OC); bias may be NULL. */
FSDP_API void fsdp_linear_forward(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int C, int OC);
/* dinp (B,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias += sum_B dout.
 * dinp and dbias may be NULL. */
FSDP_API void fsdp_linear_backward(float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   int B, int C, int OC);
/* The same with the weight stored (C, OC), as GPT-2's Conv1D layers store it:
 * out (B,OC) = inp (B,C) @ weight (C,OC) + bias. */
FSDP_API void fsdp_conv1d_forward(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int C, int OC);
FSDP_API void fsdp_conv1d_backward(float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   int B, int C, int OC);
FSDP_API void fsdp_relu_forward(float *out, const float *inp, size_t n);
/* dinp += dout where out > 0. */
FSDP_API void fsdp_relu_backward(float *dinp, const float *out, const float *dout, size_t n);
/* Softmax cross-entropy of logits (B,V) against targets (B) in [0,V): returns the
 * summed loss (float64) and, when dlogits is not NULL, writes (not adds)
 * dlogits = (softmax - onehot) * scale. */
FSDP_API double fsdp_softmax_xent(float *dlogits, const float *logits, const int *targets,
                                  int B, int V, float scale);

/* GELU, GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * Backward adds dout * gelu'(inp) into dinp. */
FSDP_API void fsdp_gelu_forward(float *out, const float *inp, size_t n);
FSDP_API void fsdp_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* LayerNorm over the last dim of inp (N, C), eps 1e-5; mean and rstd (N) are
 * saved for backward. dinp, dweight, dbias accumulate; dinp may be NULL. */
FSDP_API void fsdp_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                     const float *weight, const float *bias, int N, int C);
FSDP_API void fsdp_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp, const float *weight,
                                      const float *mean, const float *rstd, int N, int C);

/* out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C); wpe NULL (models
 * with rotary positions): out = wte[tokens[b,t]]. Tokens must be in [0,V):
 * callers validate them (data readers do). Backward scatter-adds dout into the
 * rows of dwte and of dwpe (NULL: none). */
FSDP_API void fsdp_embedding_forward(float *out, const int *tokens, const float *wte,
                                     const float *wpe, int B, int T, int C);
FSDP_API void fsdp_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                      const int *tokens, int B, int T, int C);

/* Causal multi-head self-attention. qkv (B,T,3C) holds q, k, v side by side
 * (GPT-2's c_attn output); att (B,NH,T,T) receives the softmax probabilities
 * (entries above the diagonal are 0); out (B,T,C). Scale 1/sqrt(C/NH).
 * Backward adds into dqkv; it needs T <= FSDP_ATTENTION_MAX_T (its stack
 * scratch) and fills dqkv with NaN past that, so callers bound T up front. */
#define FSDP_ATTENTION_MAX_T 4096
FSDP_API void fsdp_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                     int C, int NH);
FSDP_API void fsdp_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                      const float *att, int B, int T, int C, int NH);

/* out = a + b; backward adds dout into da and db. */
FSDP_API void fsdp_residual_forward(float *out, const float *a, const float *b, size_t n);
FSDP_API void fsdp_residual_backward(float *da, float *db, const float *dout, size_t n);

/* An MLP: engine units of linear layers ("fc.<i>", kind "Linear", tensors
 * "fc.<i>.weight" (out,in) and "fc.<i>.bias"; a unit per layer by default),
 * ReLU between layers, softmax cross-entropy on the last. Kaiming-uniform-like init from the engine seed. */
typedef struct fsdp_mlp *fsdp_mlp_t;

/* widths[0] inputs ... widths[n_layers] classes. max_batch bounds the
 * micro-batch the activation buffers hold. Must precede materialize. One unit
 * per layer: fsdp_mlp_create_plan with wrap_kinds "Linear". It computes in
 * f32 on the engine's device (config.device CPU or CUDA; activations in that
 * device's memory, x and labels stay host arrays, copied in on CUDA, which
 * then waits for the loss at each call); a CUDA engine with param_dtype other
 * than FSDP_F32 is refused (FSDP_ERR_UNSUPPORTED). */
FSDP_API fsdp_status_t fsdp_mlp_create(fsdp_engine_t engine, const int *widths, int n_layers,
                                       int max_batch, fsdp_mlp_t *mlp);
/* The same with the layers cut into units by a wrap policy (fsdp/plan.h): the
 * modules are the layers "fc.<i>", kind "Linear", in order (at most 64); the
 * layers no unit takes form a root unit "root" (kind "MLP") acquired first and
 * released last. The MLP recomputes nothing: a plan that checkpoints a unit is
 * refused (FSDP_ERR_UNSUPPORTED). plan NULL: every layer in the root. */
FSDP_API fsdp_status_t fsdp_mlp_create_plan(fsdp_engine_t engine, const int *widths, int n_layers,
                                            int max_batch, const fsdp_plan_opts_t *plan,
                                            fsdp_mlp_t *mlp);
FSDP_API void fsdp_mlp_destroy(fsdp_mlp_t mlp);
/* One micro-batch: forward through every unit, loss, backward. x is (B, in),
 * labels (B). Gradients are of loss_sum * loss_scale; *loss_sum (may be NULL)
 * receives the summed loss over the B samples. */
FSDP_API fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t mlp, const float *x,
                                                 const int *labels, int B, float loss_scale,
                                                 double *loss_sum);
/* Forward only: class predictions (B) and, if loss_sum is not NULL, summed loss
 * against labels (labels may be NULL when loss_sum is NULL). */
FSDP_API fsdp_status_t fsdp_mlp_predict(fsdp_mlp_t mlp, const float *x, const int *labels,
                                        int B, int *pred, double *loss_sum);
/* Activation bytes the handle holds (for memory reports). */
FSDP_API size_t fsdp_mlp_activation_bytes(fsdp_mlp_t mlp);

/* ---- GPT-2 ---------------------------------------------------------------
 * Tensors follow the published GPT-2 layout and names: "wte" (V,C) tied with the
 * output head, "wpe" (maxT,C), "h.<i>.ln_1.weight"/".bias" (C),
 * "h.<i>.attn.c_attn.weight" (C,3C) and ".bias" (3C), "h.<i>.attn.c_proj.weight"
 * (C,C), "h.<i>.ln_2.*", "h.<i>.mlp.c_fc.weight" (C,4C), "h.<i>.mlp.c_proj.weight"
 * (4C,C) with their biases, "ln_f.weight"/".bias". Init as GPT-2: N(0, 0.02),
 * residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. */
typedef struct {
  int n_layer, n_head, n_embd;
  int block_size; /* maximum sequence length */
  int vocab_size;
} fsdp_gpt2_config_t;

/* "124M", "350M", "774M", "1558M" (the published sizes, vocabulary 50257,
 * context 1024) and byte-level CPU sizes "tiny" (2 layers, 64 wide, T 64) and
 * "small" (4 layers, 128 wide, T 128), vocabulary 256. */
FSDP_API fsdp_status_t fsdp_gpt2_preset(const char *name, fsdp_gpt2_config_t *out);
FSDP_API fsdp_status_t fsdp_gpt2_config_check(const fsdp_gpt2_config_t *c);
FSDP_API size_t fsdp_gpt2_num_params(const fsdp_gpt2_config_t *c);

/* How the model becomes engine units and what it recomputes. The model's
 * modules, for the wrap policy (fsdp/plan.h), are its blocks: "h.<i>", kind
 * "GPT2Block", in order; whatever no unit takes (always wte, wpe, ln_f, and
 * the blocks the policy leaves) forms the root unit "root", acquired first and
 * released last, since the output head reuses wte.
 * wrap_kinds:  comma-separated module kinds that get a unit each ("GPT2Block");
 * wrap_min_params: otherwise, consecutive blocks are grouped into units of at
 *              least this many parameters (0: no size policy);
 * checkpoint_kinds: kinds of units whose activations are recomputed in backward
 *              from the unit's input ("GPT2Block"): memory for compute;
 * plan:        NULL, or the policy itself, in place of the three fields above
 *              (which make an fsdp_plan_opts_t's wrap_kinds, wrap_min_params
 *              and checkpoint_kinds): names, wildcards, a callback;
 * unit_opts:   NULL, or called once per unit (the root first, then the plan's
 *              units in order) with its name and tensors, to fill the per-unit
 *              options (reshard_after_forward, param_dtype, lr/wd multipliers)
 *              the unit is registered with. *opts arrives as
 *              FSDP_UNIT_OPTS_INIT; arrays it points at must live until the
 *              callback is called again or fsdp_gpt2_create returns. A status
 *              it returns fails fsdp_gpt2_create with that status (the reason
 *              is the callback's to keep). */
typedef fsdp_status_t (*fsdp_unit_opts_fn)(void *user, const char *unit, const char *kind,
                                           const fsdp_tensor_desc_t *tensors, int n_tensors,
                                           fsdp_unit_opts_t *opts);
typedef struct {
  const char *wrap_kinds;
  size_t wrap_min_params;
  const char *checkpoint_kinds;
  int max_batch; /* sequences per micro-batch the activation buffers hold */
  int max_T;     /* 0: block_size */
  const fsdp_plan_opts_t *plan; /* NULL: the policy of the three fields above */
  fsdp_unit_opts_fn unit_opts;  /* NULL: every unit with FSDP_UNIT_OPTS_INIT */
  void *unit_opts_user;         /* passed to unit_opts */
  /* Memory-budgeted checkpointing ("checkpoint auto"): checkpoint_auto 1
   * recomputes the fewest leading layers (fsdp_checkpoint_auto, below) so
   * that the model state + memory_reserved + the activation arena + the
   * kernels' memory fit memory_budget; the model state is what the engine
   * will reserve at materialize (fsdp_engine_memory_plan, the root held
   * across the layers), so the units must all be registered: the model's
   * create does it. It needs every layer in a unit of its own (wrap_kinds the
   * layer kind) and no other checkpointing policy (FSDP_ERR_INVALID_ARGUMENT
   * otherwise); a budget nothing fits is FSDP_ERR_OUT_OF_MEMORY naming the
   * numbers. memory_budget 0: on CUDA the device's free memory at create
   * less FSDP_CHECKPOINT_AUTO_MARGIN (FSDP_ERR_OUT_OF_MEMORY naming both when
   * no more than the margin is free); on the CPU nothing is checkpointed.
   * The choice: fsdp_gpt2_checkpointed / fsdp_llama_checkpointed. */
  int checkpoint_auto;
  size_t memory_budget;   /* bytes; 0: as just said */
  size_t memory_reserved; /* bytes of the budget the caller will use itself besides the
                             engine's state and the model's buffers (0: none) */
} fsdp_gpt2_opts_t;

/* What "checkpoint auto" leaves free of a CUDA device's memory when no budget
 * is given: the CUDA context, cuBLAS/cuDNN workspaces, NCCL's buffers and the
 * allocator's rounding, which no size function here counts. */
#define FSDP_CHECKPOINT_AUTO_MARGIN ((size_t)2 << 30)

typedef struct fsdp_gpt2 *fsdp_gpt2_t;

/* Devices. The model computes where its engine lives (config.device):
 * - FSDP_DEVICE_CPU: the fp32 kernels above, in host memory, on the calling
 *   thread. param_dtype bf16 changes only the parameters (views widen them).
 * - FSDP_DEVICE_CUDA: the CUDA twins of these kernels, queued on the engine's
 *   compute stream (fsdp_engine_stream) of the device current at
 *   fsdp_engine_create; activations live in device memory. param_dtype f32:
 *   fp32 throughout. bf16: parameters, activations and activation gradients in
 *   bf16; parameter gradients, LayerNorm statistics and the loss in fp32;
 *   attention on tensor cores (bf16 products, fp32 scores and statistics)
 *   keeping per layer only its (B,NH,T) fp32 log-sum-exp.
 * Every call below takes and returns host memory whatever the device: tokens,
 * targets, losses, logits, samples. On CUDA a micro-batch synchronises the
 * host once, for its loss; tokens and targets travel through a pinned staging
 * buffer. Buffers are allocated by create and sized by opts (max_batch,
 * max_T): no call allocates in a step. Errors: FSDP_ERR_UNSUPPORTED when the
 * engine is on CUDA and fsdp was built without it; FSDP_ERR_OUT_OF_MEMORY when
 * the activations do not fit (host or device); a CUDA fault in queued work
 * surfaces at the next synchronisation (the loss), as FSDP_ERR_SYSTEM. */

/* Registers the model's units with an engine not yet materialised and
 * allocates the activation buffers (in the engine's device memory). Destroy
 * the model before its engine. */
FSDP_API fsdp_status_t fsdp_gpt2_create(fsdp_engine_t engine, const fsdp_gpt2_config_t *c,
                                        const fsdp_gpt2_opts_t *opts, fsdp_gpt2_t *gpt);
FSDP_API void fsdp_gpt2_destroy(fsdp_gpt2_t gpt);
/* One micro-batch: forward, loss against targets, backward. tokens and targets
 * are (B,T) in [0,V), host memory; gradients are of loss_sum * loss_scale
 * (into the engine's gradient buffers); *loss_sum (may be NULL) receives the
 * summed per-token cross-entropy, added up in double (on CUDA from the
 * per-row losses, after the micro-batch's one wait). */
FSDP_API fsdp_status_t fsdp_gpt2_forward_backward(fsdp_gpt2_t gpt, const int *tokens,
                                                  const int *targets, int B, int T,
                                                  float loss_scale, double *loss_sum);
/* Forward only. targets and loss_sum may be NULL; *logits (may be NULL) points
 * at the (B,T,V) fp32 logits in host memory, valid until the next call on gpt.
 * The model keeps logits rows V rounded up to a multiple of 128 apart (one
 * buffer, their gradient written over them in training); they are copied (on
 * CUDA widened from bf16) and packed V apart into a host buffer of max_batch x
 * max_T x that many floats, which the first call asking for them allocates;
 * pass NULL when only the loss is wanted. */
FSDP_API fsdp_status_t fsdp_gpt2_forward(fsdp_gpt2_t gpt, const int *tokens, const int *targets,
                                         int B, int T, double *loss_sum, const float **logits);
/* Samples n_new tokens after the prompt (temperature > 0; the RNG is seeded, so
 * every rank draws the same tokens). out receives n_new tokens. Collective. */
FSDP_API fsdp_status_t fsdp_gpt2_generate(fsdp_gpt2_t gpt, const int *prompt, int n_prompt,
                                          int n_new, float temperature, uint64_t seed, int *out);
/* The same with top-k: each token is drawn from the top_k most likely (0:
 * all; ties with the k-th are kept), at the temperature, from the seeded
 * stream (top_k 0 draws what fsdp_gpt2_generate draws). Collective. */
typedef struct {
  float temperature; /* > 0 */
  int top_k;         /* 0: no cut */
  uint64_t seed;
} fsdp_gpt2_sampling_t;
FSDP_API fsdp_status_t fsdp_gpt2_sample(fsdp_gpt2_t gpt, const int *prompt, int n_prompt,
                                        int n_new, const fsdp_gpt2_sampling_t *how, int *out);
/* Bytes of activation buffers held (device memory on CUDA, with the CUDA
 * kernels' scratch), and what they would be without checkpointing (equal
 * when nothing is checkpointed). */
FSDP_API size_t fsdp_gpt2_activation_bytes(fsdp_gpt2_t gpt, size_t *without_checkpointing);
/* Blocks whose activations are recomputed (the plan's or checkpoint_auto's
 * choice; with checkpoint_auto they are h.0 .. h.<n-1>); *budget (may be
 * NULL) receives the budget checkpoint_auto chose by, 0 when it did not run
 * or had none (the CPU without memory_budget). 0 on NULL. */
FSDP_API int fsdp_gpt2_checkpointed(fsdp_gpt2_t gpt, size_t *budget);
/* 1 when block l recomputes its activations, 0 when it keeps them, -1 for a
 * NULL model or l outside [0, n_layer). */
FSDP_API int fsdp_gpt2_layer_checkpointed(fsdp_gpt2_t gpt, int l);


/* ---- activation memory, computed before anything is allocated ------------
 * What GPT-2's activation arena takes for a configuration, by the same code
 * that carves it (alignment included), without an engine. Layouts: what the
 * kernels keep across a step. */
typedef enum {
  FSDP_GPT2_LAYOUT_BUILT = 0, /* this build's kernels: one (B,T,Vp) buffer, the
                                 gradient over the logits; attention keeps the
                                 log-sum-exp with bf16 activations (CUDA), the
                                 fp32 probabilities with fp32 ones */
  FSDP_GPT2_LAYOUT_PROBS,     /* attention keeps (B,NH,T,T) fp32 probabilities;
                                 logits and their gradient are two (B,T,V) buffers */
  FSDP_GPT2_LAYOUT_FLASH,     /* attention keeps the (B,NH,T) fp32 log-sum-exp;
                                 one (B,T,Vp) buffer, the gradient over the logits */
} fsdp_gpt2_layout_t;

typedef struct {
  size_t per_layer;    /* one block's saved activations */
  size_t attention;    /* of per_layer: what attention keeps for backward */
  size_t inputs;       /* the L + 1 block inputs, kept across the step */
  size_t common;       /* ln_f, logits (and their gradient), backward scratch */
  size_t saved;        /* nothing checkpointed: inputs + L x per_layer + common */
  size_t checkpointed; /* every block checkpointed: inputs + per_layer + common */
} fsdp_gpt2_memory_t;

/* Fills *out for micro-batch B x T with activations of act_dtype (FSDP_F32, or
 * FSDP_BF16 as on a bf16 CUDA engine; LayerNorm statistics and attention's
 * state are fp32 either way) and buffers aligned to 256 bytes as on CUDA.
 * Excludes the CUDA kernels' own scratch. FSDP_ERR_INVALID_ARGUMENT naming
 * the bad value. Thread-safe; allocates nothing. */
FSDP_API fsdp_status_t fsdp_gpt2_memory(const fsdp_gpt2_config_t *c, int B, int T,
                                        fsdp_dtype_t act_dtype, fsdp_gpt2_layout_t layout,
                                        fsdp_gpt2_memory_t *out);

/* The one size function the models carve their arena by: bytes of the
 * activation arena of m's shape when `saved` layers keep their activations
 * and the largest checkpointed unit spans `scratch` layers (their recompute
 * scratch, reused by every checkpointed unit): inputs + (saved + scratch) x
 * per_layer + common. k of L layers checkpointed, each a unit of its own:
 * saved L - k, scratch (k > 0). The kernels' own memory is not in it. Pure;
 * 0 for a NULL m or a negative count. */
FSDP_API size_t fsdp_activation_arena_bytes(const fsdp_gpt2_memory_t *m, int saved, int scratch);

/* The answer to "use the memory I have, recompute as little as possible". */
typedef struct {
  int k;              /* layers to checkpoint, 0 .. n_layer: the first k (why: below) */
  size_t activations; /* fsdp_activation_arena_bytes at that k */
  size_t need;        /* fixed + activations, <= budget */
} fsdp_checkpoint_choice_t;

/* The fewest of n_layer layers (each a unit of its own) to checkpoint so that
 * fixed + fsdp_activation_arena_bytes(m, n_layer - k, k > 0) <= budget, where
 * m is fsdp_gpt2_memory's or fsdp_llama_memory's answer at the micro-batch
 * and fixed is everything else the budget must hold (model state, the
 * kernels' memory). The models checkpoint the FIRST k layers: every choice
 * of k layers costs the same here (one static arena, equal layers), and the
 * first k are the ones whose activations live longest (saved first, freed
 * last) in a caching allocator such as PyTorch's, so a PyTorch comparison
 * that checkpoints the same blocks lowers its peak the most, and it is
 * Megatron-LM's "block" recompute convention. Memory grows by per_layer per
 * layer saved, so the first k that fits is found by counting up. Errors:
 * FSDP_ERR_INVALID_ARGUMENT for a NULL pointer or n_layer < 1;
 * FSDP_ERR_OUT_OF_MEMORY when even every layer checkpointed does not fit,
 * naming the budget, fixed, the activations at k = n_layer and at k = 0.
 * Pure, thread-safe, allocates nothing; *out is written only on success. */
FSDP_API fsdp_status_t fsdp_checkpoint_auto(const fsdp_gpt2_memory_t *m, int n_layer,
                                            size_t fixed, size_t budget,
                                            fsdp_checkpoint_choice_t *out);

/* ---- what each kernel class costs, computed ------------------------------
 * For one optimizer step of GPT-2 c over micro_batches micro-batches of B x T
 * tokens with activations in act_dtype (FSDP_BF16 or FSDP_F32): per kernel
 * class of fsdp/profile.h, the FLOPs its kernels execute (attention over the
 * causal tiles the flash kernel computes, about half of T x T, with the
 * scores recomputed in backward, the vocabulary products
 * over the V real columns) and the bytes of device memory it must move, each
 * tensor once per kernel as bench/gpu-budget.md counts them: issue 15's
 * design's traffic (fused epilogues, flash attention; fp32 parameter
 * gradients and optimizer state), the floor an implementation is held to, not
 * a measurement. bench/gpu_budget.py computes the same numbers and the
 * kernel-profile test (suite cuda) compares the two. Recomputation under
 * activation checkpointing is not counted. AdamW and the step's gradient norm
 * + zeroing are counted over all the parameters, as one rank holds them; on N
 * ranks each moves its 1/N shard. Writes out[0, n) (n <=
 * FSDP_KC_COUNT). FSDP_ERR_INVALID_ARGUMENT naming a bad value. Thread-safe. */
typedef struct {
  double flops, bytes;
} fsdp_kclass_cost_t;
FSDP_API fsdp_status_t fsdp_gpt2_kernel_costs(const fsdp_gpt2_config_t *c, int B, int T,
                                              int micro_batches, fsdp_dtype_t act_dtype,
                                              fsdp_kclass_cost_t *out, int n);

/* ---- Llama family ---------------------------------------------------------
 * A decoder as Hugging Face's LlamaForCausalLM (Llama 2/3, TinyLlama, SmolLM):
 * token embedding, n_layer decoder layers (RMSNorm, q/k/v projections with
 * grouped-query attention, rotary position embedding on q and k in HF's
 * rotate-half convention, causal attention, o_proj, residual; RMSNorm, SwiGLU
 * gate/up/down, residual), a final RMSNorm and a head tied to the embedding or
 * its own; no biases. Tensors carry HF's names and (out, in) Linear layout:
 * "model.embed_tokens.weight" (V,C), "model.layers.<i>.input_layernorm.weight"
 * (C), ".self_attn.q_proj.weight" (NH*D,C), ".k_proj.weight" and
 * ".v_proj.weight" (NKV*D,C), ".o_proj.weight" (C,NH*D),
 * ".post_attention_layernorm.weight" (C), ".mlp.gate_proj.weight" and
 * ".mlp.up_proj.weight" (F,C), ".mlp.down_proj.weight" (C,F),
 * "model.norm.weight" (C) and, untied, "lm_head.weight" (V,C); D = C / NH. */
typedef enum {
  FSDP_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i/D) */
  FSDP_ROPE_LLAMA3 = 1   /* Llama 3.1's frequency scaling of those (HF "llama3") */
} fsdp_rope_type_t;

typedef struct {
  int n_layer, n_head, n_kv_head; /* n_kv_head divides n_head */
  int n_embd;                     /* C, a multiple of n_head */
  int ffn_hidden;                 /* F, SwiGLU's width */
  int vocab_size;
  int max_seq_len; /* HF's max_position_embeddings */
  float rope_theta;
  float rms_eps;
  int tie_embeddings; /* 1: the head is model.embed_tokens.weight */
  fsdp_rope_type_t rope_type;
  /* FSDP_ROPE_LLAMA3 only (HF's rope_scaling): factor, low_freq_factor,
   * high_freq_factor, original_max_position_embeddings */
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_pos;
} fsdp_llama_config_t;

/* The published shapes, parameter counts equal to the published ones:
 * "SmolLM-135M" (30 x 576, 9 heads / 3 KV, F 1536, vocabulary 49152, tied:
 * 134,515,008), "TinyLlama-1.1B" (22 x 2048, 32 / 4 KV, F 5632, vocabulary
 * 32000, untied: 1,100,048,384), "Llama-3.2-1B" (16 x 2048, 32 / 8 KV, F 8192,
 * vocabulary 128256, tied, theta 500000 with llama3 scaling:
 * 1,235,814,400), and "tiny" for tests (2 x 64, 4 / 2 KV, F 160, vocabulary
 * 256, T 64, untied). Unknown names: FSDP_ERR_INVALID_ARGUMENT listing them. */
FSDP_API fsdp_status_t fsdp_llama_preset(const char *name, fsdp_llama_config_t *out);
/* FSDP_ERR_INVALID_ARGUMENT naming the first field out of range. */
FSDP_API fsdp_status_t fsdp_llama_config_check(const fsdp_llama_config_t *c);
FSDP_API size_t fsdp_llama_num_params(const fsdp_llama_config_t *c);
/* RoPE's D/2 inverse frequencies as HF computes them in fp32 (rope_type's
 * rule); inv_freq holds n_embd / n_head / 2 floats. */
FSDP_API void fsdp_llama_inv_freq(const fsdp_llama_config_t *c, float *inv_freq);

/* How the model becomes engine units and what it recomputes: GPT-2's options
 * (fsdp_gpt2_opts_t, every field as documented there) over the Llama
 * modules, its decoder layers "model.layers.<i>", kind "LlamaDecoderLayer",
 * in order; whatever no unit takes (always model.embed_tokens, model.norm
 * and lm_head, and the layers the policy leaves) forms the root unit "root"
 * (kind "LlamaForCausalLM"), acquired first and released last. A unit of one
 * layer is named "model.layers.<i>", of several "model.layers.<i>-<j>".
 * max_T 0: max_seq_len, which must then be at most FSDP_ATTENTION_MAX_T
 * (set max_T for the long-context presets). */
typedef fsdp_gpt2_opts_t fsdp_llama_opts_t;

typedef struct fsdp_llama *fsdp_llama_t;

/* Registers the model's units with an engine not yet materialised (init as
 * HF's LlamaForCausalLM: every matrix N(0, 0.02), norm weights 1, no weight
 * decay on the norms), copies the RoPE frequencies (fsdp_llama_inv_freq) to
 * the engine's device once and allocates the activation buffers there.
 * Devices, dtypes, host memory and errors as GPT-2's (above): fp32 on the
 * CPU; on CUDA fp32, or bf16 activations with param_dtype bf16 (RMSNorm
 * statistics, parameter gradients and the loss fp32). A table without the
 * Llama kernels is refused (FSDP_ERR_UNSUPPORTED naming the missing slot).
 * Per layer: one (QKV, C) product for q, k and v and one (2F, C) for gate and
 * up, since the engine keeps a unit's tensors (and their gradients)
 * adjacent, in the order of the tensor table. Destroy before the engine. */
FSDP_API fsdp_status_t fsdp_llama_create(fsdp_engine_t engine, const fsdp_llama_config_t *c,
                                         const fsdp_llama_opts_t *opts, fsdp_llama_t *model);
FSDP_API void fsdp_llama_destroy(fsdp_llama_t model);
/* One micro-batch, as fsdp_gpt2_forward_backward: tokens and targets (B,T)
 * in [0,V), host memory; gradients of loss_sum * loss_scale into the
 * engine's buffers; *loss_sum (may be NULL) the summed per-token
 * cross-entropy in double. */
FSDP_API fsdp_status_t fsdp_llama_forward_backward(fsdp_llama_t model, const int *tokens,
                                                   const int *targets, int B, int T,
                                                   float loss_scale, double *loss_sum);
/* Forward only, as fsdp_gpt2_forward: targets and loss_sum may be NULL
 * (*loss_sum is written only with targets); *logits (may be NULL) points at
 * the (B,T,V) fp32 logits in host memory, packed V apart, valid until the
 * next call on the model. The host buffer is the model's, allocated by the
 * first call asking for logits at the full max_batch x max_T x V (padded)
 * floats (Llama-3.2-1B at 8 x 2048: 8.4 GB) and kept until destroy: ask for
 * logits with a model created for the batch you read them at. */
FSDP_API fsdp_status_t fsdp_llama_forward(fsdp_llama_t model, const int *tokens,
                                          const int *targets, int B, int T, double *loss_sum,
                                          const float **logits);
/* Sampling as GPT-2's (fsdp_gpt2_generate, fsdp_gpt2_sample, the same seeded
 * draws and errors): n_new tokens after the prompt, each from the logits of
 * fsdp_llama_forward over the last max_T tokens (no KV cache), rank 0's draw
 * broadcast. Collective. */
typedef fsdp_gpt2_sampling_t fsdp_llama_sampling_t;
FSDP_API fsdp_status_t fsdp_llama_generate(fsdp_llama_t model, const int *prompt, int n_prompt,
                                           int n_new, float temperature, uint64_t seed, int *out);
FSDP_API fsdp_status_t fsdp_llama_sample(fsdp_llama_t model, const int *prompt, int n_prompt,
                                         int n_new, const fsdp_llama_sampling_t *how, int *out);
/* Bytes of activations and kernel buffers the model holds in the engine's
 * device memory, and what they would be with no layer checkpointed. */
FSDP_API size_t fsdp_llama_activation_bytes(fsdp_llama_t model, size_t *without_checkpointing);
/* Layers whose activations are recomputed, and whether layer l is, as
 * fsdp_gpt2_checkpointed and fsdp_gpt2_layer_checkpointed. */
FSDP_API int fsdp_llama_checkpointed(fsdp_llama_t model, size_t *budget);
FSDP_API int fsdp_llama_layer_checkpointed(fsdp_llama_t model, int l);

/* What the model's activation arena takes at micro-batch B x T, by the code
 * that carves it, without an engine (fsdp_gpt2_memory's fields): per layer
 * RMSNorm outputs and statistics, q|k|v, attention's state (fp32
 * probabilities (B,NH,T,T) with f32 activations, the (B,NH,T) log-sum-exp
 * with bf16 ones, as this build's kernels keep), o_proj's input, the
 * residual, gate|up and SwiGLU's output; inputs the L + 1 layer inputs;
 * common the final norm, the padded logits (their gradient written over
 * them) and backward's scratch. Buffers aligned to 256 bytes as on CUDA; the
 * kernels' own scratch excluded. FSDP_ERR_INVALID_ARGUMENT naming a bad
 * value. Thread-safe; allocates nothing. */
typedef fsdp_gpt2_memory_t fsdp_llama_memory_t;
FSDP_API fsdp_status_t fsdp_llama_memory(const fsdp_llama_config_t *c, int B, int T,
                                         fsdp_dtype_t act_dtype, fsdp_llama_memory_t *out);

/* What each kernel class (fsdp/profile.h) of one step costs, counted as
 * fsdp_gpt2_kernel_costs counts GPT-2's: the four bias-free products per
 * layer (q|k|v, o_proj, gate|up, down_proj) in the block classes, grouped-query
 * attention's flash tiles (per query head; q|k|v (NH + 2 NKV) D wide), the
 * RMSNorms, RoPE and SwiGLU in their own classes, the head, cross-entropy,
 * embedding (no position table), AdamW and the step's gradient norm + zeroing
 * (8 bytes a parameter) over fsdp_llama_num_params; the LayerNorm classes 0. Writes out[0, n) (n <= FSDP_KC_COUNT);
 * FSDP_ERR_INVALID_ARGUMENT naming a bad value. Thread-safe. */
FSDP_API fsdp_status_t fsdp_llama_kernel_costs(const fsdp_llama_config_t *c, int B, int T,
                                               int micro_batches, fsdp_dtype_t act_dtype,
                                               fsdp_kclass_cost_t *out, int n);

#ifdef __cplusplus
}
#endif
#endif
