/* tests/fuzz/fuzz_llama_config.c — libFuzzer target: a Llama's config.json
 * (src/ckpt/llama_hf.c, through import.c's model detection, preset and shape
 * checks): the input is config.json beside a fixed small LlamaForCausalLM
 * model.safetensors (1 layer, width 4, 2 heads / 1 KV, FFN 6, vocabulary 5,
 * untied), which a config of that shape imports up to the lock (the output
 * directory cannot be made, so nothing is written). */
#include "fsdp/ckpt.h"
#include "fuzz_file.h"

/* The model's tensors: name, rows, cols (0: a vector). */
static const struct { const char *name; int rows, cols; } tensors[] = {
    {"model.embed_tokens.weight", 5, 4},
    {"model.layers.0.input_layernorm.weight", 4, 0},
    {"model.layers.0.self_attn.q_proj.weight", 4, 4},
    {"model.layers.0.self_attn.k_proj.weight", 2, 4},
    {"model.layers.0.self_attn.v_proj.weight", 2, 4},
    {"model.layers.0.self_attn.o_proj.weight", 4, 4},
    {"model.layers.0.post_attention_layernorm.weight", 4, 0},
    {"model.layers.0.mlp.gate_proj.weight", 6, 4},
    {"model.layers.0.mlp.up_proj.weight", 6, 4},
    {"model.layers.0.mlp.down_proj.weight", 4, 6},
    {"model.norm.weight", 4, 0},
    {"lm_head.weight", 5, 4},
};

static void write_model(void) {
  char header[4096];
  uint8_t file[8192];
  size_t n = (size_t)snprintf(header, sizeof header, "{"), at = 0;
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
    size_t bytes = 4 * (size_t)tensors[i].rows * (size_t)(tensors[i].cols ? tensors[i].cols : 1);
    char shape[32];
    if (tensors[i].cols) snprintf(shape, sizeof shape, "[%d,%d]", tensors[i].rows, tensors[i].cols);
    else snprintf(shape, sizeof shape, "[%d]", tensors[i].rows);
    n += (size_t)snprintf(header + n, sizeof header - n, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,"
                          "\"data_offsets\":[%zu,%zu]}", i ? "," : "", tensors[i].name, shape, at,
                          at + bytes);
    at += bytes;
  }
  n += (size_t)snprintf(header + n, sizeof header - n, "}");
  for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(file + 8, header, n);
  memset(file + 8 + n, 0, at); /* zeros: finite, and a tied head would equal the embedding */
  fuzz_write("model.safetensors", file, 8 + n + at, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int written;
  if (!written) write_model(), written = 1;
  fuzz_write("config.json", data, size, NULL);
  fsdp_ckpt_import_hf(fuzz_dir_path(), "/proc/fsdp-fuzz/out", NULL, FSDP_CKPT_LOCK, NULL);
  return 0;
}
