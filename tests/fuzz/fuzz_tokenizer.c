/* tests/fuzz/fuzz_tokenizer.c — libFuzzer target: fsdp_tokenizer_load
 * (src/data/bpe_load.c). An input holding a line "#merges" is vocab.json
 * before it and merges.txt after; any other input is a tokenizer.json. A
 * tokenizer that loads encodes a few bytes. */
#include "fsdp/tokenizer.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char sep[] = "\n#merges\n";
  const uint8_t *cut = memmem(data, size, sep, sizeof sep - 1);
  fuzz_remove("vocab.json");
  fuzz_remove("merges.txt");
  fuzz_remove("tokenizer.json");
  if (cut) {
    size_t head = (size_t)(cut - data), skip = head + sizeof sep - 1;
    fuzz_write("vocab.json", data, head, NULL);
    fuzz_write("merges.txt", data + skip, size - skip, NULL);
  } else {
    fuzz_write("tokenizer.json", data, size, NULL);
  }
  fsdp_tokenizer_t t;
  if (fsdp_tokenizer_load(fuzz_dir_path(), &t) == FSDP_SUCCESS) {
    fsdp_token_buf_t ids = {0};
    char back[256];
    size_t len = 0;
    if (fsdp_tokenizer_encode(t, (const char *)data, size < 32 ? size : 32, 0, &ids) ==
        FSDP_SUCCESS)
      fsdp_tokenizer_decode(t, ids.ids, ids.n, back, sizeof back, &len);
    fsdp_token_buf_free(&ids);
    fsdp_tokenizer_free(t);
  }
  return 0;
}
