/* src/ckpt/gpt2_layout.c — GPT-2's tensor table (gpt2_layout.h) and its
 * named shapes (fsdp_gpt2_preset of fsdp/nn.h), which the model and import
 * both read. */
#include "ckpt/gpt2_layout.h"

#include <string.h>

#include "core/internal.h"
#include "fsdp/nn.h"

const gpt2_block_tensor_t gpt2_block_tensors[GPT2_BLOCK_TENSORS] = {
    [GPT2_LN1W] = {"ln_1.weight", 1, 0},
    [GPT2_LN1B] = {"ln_1.bias", 1, 0},
    [GPT2_QKVW] = {"attn.c_attn.weight", 1, 3},
    [GPT2_QKVB] = {"attn.c_attn.bias", 3, 0},
    [GPT2_ATTPROJW] = {"attn.c_proj.weight", 1, 1},
    [GPT2_ATTPROJB] = {"attn.c_proj.bias", 1, 0},
    [GPT2_LN2W] = {"ln_2.weight", 1, 0},
    [GPT2_LN2B] = {"ln_2.bias", 1, 0},
    [GPT2_FCW] = {"mlp.c_fc.weight", 1, 4},
    [GPT2_FCB] = {"mlp.c_fc.bias", 4, 0},
    [GPT2_FCPROJW] = {"mlp.c_proj.weight", 4, 1},
    [GPT2_FCPROJB] = {"mlp.c_proj.bias", 1, 0},
};

/* The names that differ between ours and the published ones. */
static const struct { const char *ours, *published; } renamed[] = {
    {"wte", "wte.weight"},
    {"wpe", "wpe.weight"},
};

const char *gpt2_published_name(const char *name) {
  for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++)
    if (!strcmp(name, renamed[i].ours)) return renamed[i].published;
  return name;
}

const char *gpt2_our_name(const char *published) {
  for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++)
    if (!strcmp(published, renamed[i].published)) return renamed[i].ours;
  return published;
}

int gpt2_published_buffer(const char *published) {
  static const char *const buffers[] = {".attn.bias", ".attn.masked_bias"};
  size_t n = strlen(published);
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
    size_t k = strlen(buffers[i]);
    if (n > k && !strcmp(published + n - k, buffers[i])) return 1;
  }
  return 0;
}

fsdp_status_t fsdp_gpt2_preset(const char *name, fsdp_gpt2_config_t *out) {
  static const struct { const char *name; fsdp_gpt2_config_t c; } presets[] = {
      {"124M", {12, 12, 768, 1024, 50257}},   {"350M", {24, 16, 1024, 1024, 50257}},
      {"774M", {36, 20, 1280, 1024, 50257}},  {"1558M", {48, 25, 1600, 1024, 50257}},
      {"tiny", {2, 4, 64, 64, 256}},          {"small", {4, 4, 128, 128, 256}},
  };
  for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(name, presets[i].name) == 0) {
      *out = presets[i].c;
      return FSDP_SUCCESS;
    }
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                    "unknown GPT-2 preset '%s': use 124M, 350M, 774M, 1558M, tiny or small",
                    name ? name : "(null)");
}
