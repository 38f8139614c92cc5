/* src/ckpt/hf.h — GPT-2's shape and the tensors it implies, shared by export
 * --hf (hf.c) and import (import.c). Not installed. */
#ifndef FSDP_CKPT_HF_H
#define FSDP_CKPT_HF_H

#include <limits.h>

#include "ckpt/offline.h"

typedef struct {
  int64_t n_layer, n_head, n_embd, n_positions, vocab; /* n_head 0: unknown */
} hf_shape_t;

/* Tensors of a GPT-2 of shape s: wte, wpe, 12 per layer, ln_f's two; s has
 * at most HF_MAX_LAYERS layers, so that the count fits an int. */
int hf_n_tensors(const hf_shape_t *s);
#define HF_MAX_LAYERS ((INT_MAX - 4) / 12)
/* Tensor i (0 <= i < hf_n_tensors) in fsdp's order: our name and shape. */
void hf_tensor(const hf_shape_t *s, int i, char *name, size_t cap, int *ndim, int64_t shape[2]);

#endif
