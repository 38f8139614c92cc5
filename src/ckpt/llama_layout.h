/* src/ckpt/llama_layout.h — the Llama family's tensor table, the one place
 * that knows it (as gpt2_layout.h is GPT-2's): a decoder layer's nine tensors
 * in their order (q, k, v adjacent and gate, up adjacent, so a model may run
 * each group as one product where the unit keeps them contiguous), their
 * Hugging Face names under "model.layers.<i>." and their shapes from the
 * config; the top-level names; and fsdp_llama_preset / _config_check /
 * _num_params / _inv_freq of fsdp/nn.h, defined in llama_layout.c. Names are
 * HF's own, so nothing is renamed on import or export and Linear weights stay
 * in HF's (out, in) layout. Not installed; the table is immutable data. */
#ifndef FSDP_CKPT_LLAMA_LAYOUT_H
#define FSDP_CKPT_LLAMA_LAYOUT_H

#include <stddef.h>

#include "fsdp/nn.h"

enum {
  LLAMA_ATTN_NORM, LLAMA_Q, LLAMA_K, LLAMA_V, LLAMA_O,
  LLAMA_MLP_NORM, LLAMA_GATE, LLAMA_UP, LLAMA_DOWN,
  LLAMA_LAYER_TENSORS
};

#define LLAMA_LAYER_PREFIX "model.layers."
#define LLAMA_EMBED "model.embed_tokens.weight"
#define LLAMA_NORM "model.norm.weight"
#define LLAMA_HEAD "lm_head.weight"

/* The layer tensor's name under "model.layers.<i>.", e.g.
 * "self_attn.q_proj.weight". */
extern const char *const llama_layer_tensor_names[LLAMA_LAYER_TENSORS];

/* The layer tensor's shape for config c: rows and cols (cols 0 for a vector
 * of rows elements). */
void llama_layer_tensor_shape(const fsdp_llama_config_t *c, int which, int *rows, int *cols);

/* "model.layers.<layer>.<tensor>" into buf (cap bytes); 0, or -1 when it
 * does not fit. */
int llama_layer_tensor_name(int layer, int which, char *buf, size_t cap);

#endif
