/* src/nn/sample.h — autoregressive sampling shared by the decoders (GPT-2,
 * Llama): the seeded draw over a temperature and a top-k cut, rank 0's token
 * broadcast so every rank continues alike. No KV cache: each new token runs
 * the model over the context again. Not installed. */
#ifndef FSDP_NN_SAMPLE_H
#define FSDP_NN_SAMPLE_H

#include "fsdp/nn.h"

/* Writes into row (V floats, host) the logits after the T tokens of ctx. */
typedef fsdp_status_t (*nn_next_logits_fn)(void *model, const int *ctx, int T, float *row);

/* The body of fsdp_gpt2_sample (fsdp/nn.h) for any decoder: the context is
 * the last max_T tokens; who names the caller in errors. Collective over
 * eng's world. */
fsdp_status_t nn_sample(const char *who, fsdp_engine_t eng, void *model, nn_next_logits_fn next,
                        float *row, int V, int max_T, const int *prompt, int n_prompt, int n_new,
                        const fsdp_gpt2_sampling_t *how, int *out);

#endif
