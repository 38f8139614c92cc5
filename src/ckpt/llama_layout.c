/* src/ckpt/llama_layout.c — the Llama family's tensor table (llama_layout.h),
 * its named shapes, checks, parameter count and RoPE frequencies (fsdp/nn.h). */
#include "ckpt/llama_layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

const char *const llama_layer_tensor_names[LLAMA_LAYER_TENSORS] = {
    [LLAMA_ATTN_NORM] = "input_layernorm.weight",
    [LLAMA_Q] = "self_attn.q_proj.weight",
    [LLAMA_K] = "self_attn.k_proj.weight",
    [LLAMA_V] = "self_attn.v_proj.weight",
    [LLAMA_O] = "self_attn.o_proj.weight",
    [LLAMA_MLP_NORM] = "post_attention_layernorm.weight",
    [LLAMA_GATE] = "mlp.gate_proj.weight",
    [LLAMA_UP] = "mlp.up_proj.weight",
    [LLAMA_DOWN] = "mlp.down_proj.weight",
};

void llama_layer_tensor_shape(const fsdp_llama_config_t *c, int which, int *rows, int *cols) {
  const int C = c->n_embd, D = c->n_embd / c->n_head, F = c->ffn_hidden;
  switch (which) {
  case LLAMA_ATTN_NORM:
  case LLAMA_MLP_NORM: *rows = C, *cols = 0; return;
  case LLAMA_Q: *rows = c->n_head * D, *cols = C; return;
  case LLAMA_K:
  case LLAMA_V: *rows = c->n_kv_head * D, *cols = C; return;
  case LLAMA_O: *rows = C, *cols = c->n_head * D; return;
  case LLAMA_GATE:
  case LLAMA_UP: *rows = F, *cols = C; return;
  default: *rows = C, *cols = F; return; /* LLAMA_DOWN */
  }
}

int llama_layer_tensor_name(int layer, int which, char *buf, size_t cap) {
  int n = snprintf(buf, cap, LLAMA_LAYER_PREFIX "%d.%s", layer, llama_layer_tensor_names[which]);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

fsdp_status_t fsdp_llama_preset(const char *name, fsdp_llama_config_t *out) {
  /* n_layer, n_head, n_kv_head, C, F, V, max T, theta, eps, tied, rope scaling */
  static const struct { const char *name; fsdp_llama_config_t c; } presets[] = {
      {"tiny", {2, 4, 2, 64, 160, 256, 64, 10000.0f, 1e-5f, 0, FSDP_ROPE_DEFAULT, 0, 0, 0, 0}},
      {"SmolLM-135M",
       {30, 9, 3, 576, 1536, 49152, 2048, 10000.0f, 1e-5f, 1, FSDP_ROPE_DEFAULT, 0, 0, 0, 0}},
      {"TinyLlama-1.1B",
       {22, 32, 4, 2048, 5632, 32000, 2048, 10000.0f, 1e-5f, 0, FSDP_ROPE_DEFAULT, 0, 0, 0, 0}},
      {"Llama-3.2-1B",
       {16, 32, 8, 2048, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, FSDP_ROPE_LLAMA3, 32.0f, 1.0f,
        4.0f, 8192}},
  };
  for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(name, presets[i].name) == 0) {
      *out = presets[i].c;
      return FSDP_SUCCESS;
    }
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                    "unknown Llama preset '%s': use tiny, SmolLM-135M, TinyLlama-1.1B or "
                    "Llama-3.2-1B",
                    name ? name : "(null)");
}

fsdp_status_t fsdp_llama_config_check(const fsdp_llama_config_t *c) {
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config is NULL");
  const struct { const char *name; long v, lo, hi; } ints[] = {
      {"n_layer", c->n_layer, 1, 1 << 10},       {"n_head", c->n_head, 1, 1 << 10},
      {"n_kv_head", c->n_kv_head, 1, 1 << 10},   {"n_embd", c->n_embd, 1, 1 << 17},
      {"ffn_hidden", c->ffn_hidden, 1, 1 << 19}, {"vocab_size", c->vocab_size, 1, 1 << 24},
      {"max_seq_len", c->max_seq_len, 1, 1 << 24},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (ints[i].v < ints[i].lo || ints[i].v > ints[i].hi)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config: %s = %ld is outside [%ld, %ld]",
                        ints[i].name, ints[i].v, ints[i].lo, ints[i].hi);
  if (c->n_embd % c->n_head)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "Llama config: n_embd %d is not a multiple of n_head %d", c->n_embd,
                      c->n_head);
  if ((c->n_embd / c->n_head) % 2)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "Llama config: head dim %d (n_embd / n_head) is odd; RoPE rotates pairs",
                      c->n_embd / c->n_head);
  if (c->n_head % c->n_kv_head)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "Llama config: n_kv_head %d does not divide n_head %d", c->n_kv_head,
                      c->n_head);
  if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config: rope_theta %g is not > 1",
                      (double)c->rope_theta);
  if (!(c->rms_eps > 0.0f) || !(c->rms_eps < 1.0f))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config: rms_eps %g is not in (0, 1)",
                      (double)c->rms_eps);
  if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config: tie_embeddings %d is not 0 or 1",
                      c->tie_embeddings);
  if (c->rope_type == FSDP_ROPE_LLAMA3) {
    if (!(c->rope_factor >= 1.0f) || !(c->rope_low_freq_factor > 0.0f) ||
        !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_pos < 1)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "Llama config: llama3 RoPE scaling needs factor >= 1 (%g), "
                        "0 < low_freq_factor (%g) < high_freq_factor (%g) and "
                        "original_max_position_embeddings >= 1 (%d)",
                        (double)c->rope_factor, (double)c->rope_low_freq_factor,
                        (double)c->rope_high_freq_factor, c->rope_original_max_pos);
  } else if (c->rope_type != FSDP_ROPE_DEFAULT) {
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "Llama config: unknown rope_type %d",
                      (int)c->rope_type);
  }
  return FSDP_SUCCESS;
}

size_t fsdp_llama_num_params(const fsdp_llama_config_t *c) {
  size_t layer = 0;
  for (int t = 0; t < LLAMA_LAYER_TENSORS; t++) {
    int rows, cols;
    llama_layer_tensor_shape(c, t, &rows, &cols);
    layer += (size_t)rows * (size_t)(cols ? cols : 1);
  }
  const size_t embed = (size_t)c->vocab_size * (size_t)c->n_embd;
  return embed * (c->tie_embeddings ? 1 : 2) + (size_t)c->n_layer * layer + (size_t)c->n_embd;
}

/* HF's _compute_default_rope_parameters and, for llama3, its
 * _compute_llama3_parameters, in fp32 as torch computes them. */
void fsdp_llama_inv_freq(const fsdp_llama_config_t *c, float *inv_freq) {
  const int D = c->n_embd / c->n_head;
  for (int i = 0; i < D / 2; i++) {
    float f = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)D);
    if (c->rope_type == FSDP_ROPE_LLAMA3) {
      const float old = (float)c->rope_original_max_pos;
      const float low_wavelen = old / c->rope_low_freq_factor;
      const float high_wavelen = old / c->rope_high_freq_factor;
      const float wavelen = 2.0f * (float)M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / c->rope_factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old / wavelen - c->rope_low_freq_factor) /
                             (c->rope_high_freq_factor - c->rope_low_freq_factor);
        f = (1.0f - smooth) * f / c->rope_factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
}
