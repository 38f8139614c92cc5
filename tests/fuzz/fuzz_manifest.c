/* tests/fuzz/fuzz_manifest.c — libFuzzer target: a checkpoint's manifest.json
 * (src/ckpt/manifest.c). The input is the manifest up to its last line; the
 * target appends that line with the right CRC-32, so the fuzzer explores the
 * JSON and the manifest's rules rather than stopping at the checksum. */
#include <zlib.h>

#include "ckpt/ckpt_internal.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char tail[64];
  uLong crc = crc32(crc32(0, Z_NULL, 0), data, (uInt)size);
  crc = crc32(crc, (const Bytef *)"\n", 1);
  snprintf(tail, sizeof tail, "\n  " CKPT_CRC_KEY "%08lx\"\n}\n", crc);
  fuzz_write(CKPT_MANIFEST, data, size, tail);
  ckpt_manifest_t m;
  if (ckpt_manifest_read(fuzz_dir_path(), &m) == FSDP_SUCCESS) ckpt_manifest_free(&m);
  return 0;
}
