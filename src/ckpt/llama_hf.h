/* src/ckpt/llama_hf.h — a Llama as Hugging Face writes it, shared by import
 * (import.c) and export --hf (hf.c): the tensors a configuration implies, in
 * fsdp's order, and config.json read into fsdp_llama_config_t and written
 * back. Not installed. */
#ifndef FSDP_CKPT_LLAMA_HF_H
#define FSDP_CKPT_LLAMA_HF_H

#include <stdint.h>

#include "ckpt/ckpt_internal.h"
#include "core/json.h"

/* Tensors of Llama c: model.embed_tokens.weight, nine a layer,
 * model.norm.weight and, untied, lm_head.weight. */
int llama_n_tensors(const fsdp_llama_config_t *c);
/* Tensor i (0 <= i < llama_n_tensors) in that order: its (HF) name and shape. */
void llama_tensor(const fsdp_llama_config_t *c, int i, char *name, size_t cap, int *ndim,
                  int64_t shape[2]);

/* transformers' LlamaConfig in config.json (file names it in errors), as v4
 * writes it (rope_theta, rope_scaling, torch_dtype) or v5 (rope_parameters,
 * dtype), into *out, checked by fsdp_llama_config_check. What fsdp's Llama
 * cannot compute is refused naming the key (FSDP_ERR_UNSUPPORTED):
 * attention_bias or mlp_bias true, a head_dim other than hidden_size /
 * num_attention_heads, hidden_act other than silu, a rope type other than
 * default and llama3; a malformed value is FSDP_ERR_FORMAT. */
fsdp_status_t llama_config_from_hf(const char *file, const json_t *cfg, fsdp_llama_config_t *out);
/* config.json that LlamaForCausalLM.from_pretrained reads back as c (v4's
 * keys, which v5 reads too; torch_dtype float32, as the weights are). */
void llama_config_to_hf(const fsdp_llama_config_t *c, sbuf_t *sb);
/* FSDP_ERR_FORMAT naming the first field where a (a_what) and b (b_what)
 * differ. */
fsdp_status_t llama_config_same(const char *a_what, const fsdp_llama_config_t *a,
                                const char *b_what, const fsdp_llama_config_t *b);

#endif
