/* src/ckpt/gpt2_layout.h — GPT-2's tensor table, the one place that knows it:
 * the twelve tensors of a block (names and shapes in units of C; a model is
 * wte, wpe, h.<l>.* for each layer, ln_f.weight and ln_f.bias, in that
 * order), the published (Hugging Face) names, and the named shapes
 * (fsdp_gpt2_preset, declared in fsdp/nn.h). The model (nn/gpt2.c)
 * registers its units from it; export --hf and import (ckpt/hf.c's
 * hf_tensor) and safetensors name and check tensors by it.
 * It lives in ckpt because ckpt is the lowest layer that needs it: nn sits
 * above ckpt and may include it. ckpt takes from nn only the public
 * fsdp/nn.h's fsdp_gpt2_config_t, and fsdp_gpt2_preset, declared there and
 * defined here (gpt2_layout.c); it includes no nn internal header and calls
 * no nn code. No transposes: the block's matrices are stored in GPT-2's
 * Conv1D layout (in, out), which is Hugging Face's. Not installed; the table is immutable data. */
#ifndef FSDP_CKPT_GPT2_LAYOUT_H
#define FSDP_CKPT_GPT2_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* A block's tensors, in the order of gpt2_block_tensors and of a block's
 * slice of a unit's view. */
enum {
  GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB, GPT2_ATTPROJW, GPT2_ATTPROJB,
  GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB, GPT2_FCPROJW, GPT2_FCPROJB,
  GPT2_BLOCK_TENSORS
};

typedef struct {
  const char *name; /* under "h.<l>.", e.g. "attn.c_attn.weight" */
  int rows, cols;   /* in units of C; cols 0: a vector of rows * C */
} gpt2_block_tensor_t;

extern const gpt2_block_tensor_t gpt2_block_tensors[GPT2_BLOCK_TENSORS];

/* The published name of one of ours, without Hugging Face's GPT2LMHeadModel
 * prefix GPT2_HF_PREFIX: "wte" -> "wte.weight", "wpe" -> "wpe.weight", the
 * rest unchanged (a pointer into name or a literal). gpt2_our_name is its
 * inverse, for a published name with the prefix removed. */
#define GPT2_HF_PREFIX "transformer."
const char *gpt2_published_name(const char *name);
const char *gpt2_our_name(const char *published);

/* What a published GPT-2 holds beyond our tensors (names without the
 * prefix): the output head, tied to wte, and the attention's mask buffers
 * ("h.<l>.attn.bias", "h.<l>.attn.masked_bias"), which are no parameters.
 * gpt2_published_buffer says whether a name is one of the buffers. */
#define GPT2_HF_HEAD "lm_head.weight"
int gpt2_published_buffer(const char *published);

#endif
