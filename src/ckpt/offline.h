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

#endif
