/* tests/fuzz/fuzz_safetensors.c — libFuzzer target: fsdp_ckpt_import_hf on a
 * safetensors file (src/ckpt/import.c: the header's length, JSON, entries,
 * tiling, names, GPT-2 shapes, the tied head, the values). The output
 * directory cannot be made, so an input that passes every check ends at the
 * lock (FSDP_CKPT_LOCK is taken only then) and nothing is written. */
#include "fsdp/ckpt.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("model.safetensors", data, size, NULL);
  fsdp_ckpt_import_hf(path, "/proc/fsdp-fuzz/out", NULL, FSDP_CKPT_LOCK, NULL);
  return 0;
}
