/* src/ckpt/offline.h — the offline checkpoint handle's contents, shared by the
 * sources that implement the tools on it. Not installed. */
#ifndef FSDP_CKPT_OFFLINE_H
#define FSDP_CKPT_OFFLINE_H

#include "ckpt/ckpt_internal.h"

struct fsdp_ckpt {
  ckpt_manifest_t m;
  ckpt_files_t f;
};

/* Streams n elements of unit u, state s, starting at flat element first, into
 * the writer through a fixed buffer. */
fsdp_status_t ckpt_copy_unit(ckpt_files_t *f, int u, int s, size_t first, size_t n,
                             ckpt_writer_t *w);

/* What ckpt_write_safetensors writes: every state under our names
 * (consolidate), parameters under the published GPT-2 names (export), under
 * GPT2LMHeadModel's "transformer." names (export --hf), or under their own
 * names, which are LlamaForCausalLM's (export --hf of a Llama). */
enum { CKPT_ST_ALL, CKPT_ST_GPT2, CKPT_ST_HF, CKPT_ST_LLAMA };
/* Refuses an existing out_file unless flags has FSDP_CKPT_OVERWRITE; verifies
 * the checkpoint; fills *sum (may be NULL) on success. */
fsdp_status_t ckpt_write_safetensors(fsdp_ckpt_t c, const char *out_file, int mode, int flags,
                                     fsdp_ckpt_io_summary_t *sum);

#endif
