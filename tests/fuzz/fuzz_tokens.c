/* tests/fuzz/fuzz_tokens.c — libFuzzer target: fsdp_tokens_load on an llm.c
 * token file (src/data/tokens.c: either format's 1024-byte header, the count,
 * the size, uint32 tokens beyond int), then the vocabulary check and windows. */
#include "fsdp/data.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("tokens.bin", data, size, NULL);
  fsdp_tokens_t t;
  if (fsdp_tokens_load(path, 0.25, &t) == FSDP_SUCCESS) {
    fsdp_tokens_check_vocab(&t, t.width == 2 ? 50257 : 128256);
    int ids[4], targets[4];
    fsdp_tokens_windows(&t, 0, 1, 0, 0, 2, 2, ids, targets);
    fsdp_tokens_free(&t);
  }
  return 0;
}
