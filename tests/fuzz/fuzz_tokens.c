/* tests/fuzz/fuzz_tokens.c — libFuzzer target: fsdp_tokens_load on an llm.c
 * token file (src/data/tokens.c: the 1024-byte header, the count, the size). */
#include "fsdp/data.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("tokens.bin", data, size, NULL);
  fsdp_tokens_t t;
  if (fsdp_tokens_load(path, 0.25, &t) == FSDP_SUCCESS) {
    fsdp_tokens_check_vocab(&t, 50257);
    fsdp_tokens_free(&t);
  }
  return 0;
}
