/* src/nn/gpt2_io.h — GPT-2's traffic between the host and the memory its
 * kernels run in (the compute table's device): tokens and targets staged in,
 * per-row losses and activations read out. The one part of GPT-2 that differs
 * by backend is here, and only in what host memory it stages through (pinned
 * on CUDA, so the copies do not block the caller); the kernels are the
 * compute table's (src/backend/compute.h). Not installed.
 *
 * Every copy is ordered on the stream passed (the engine's compute stream);
 * stage returns at once, loss and read wait for their results. */
#ifndef FSDP_NN_GPT2_IO_H
#define FSDP_NN_GPT2_IO_H

#include "fsdp/core.h"
#include "fsdp/device.h"

typedef struct gpt2_io gpt2_io_t;

/* Bytes of the kernels' memory gpt2_io_create allocates for rows tokens. */
size_t gpt2_io_bytes(size_t rows);
fsdp_status_t gpt2_io_create(fsdp_device_kind_t kind, size_t rows, gpt2_io_t **out);
void gpt2_io_destroy(gpt2_io_t *io);

/* Host tokens and targets (n each; targets may be NULL) into the kernels'
 * memory: *tok and *tgt point at them there. The host arrays may be reused
 * as soon as this returns. */
fsdp_status_t gpt2_io_stage(gpt2_io_t *io, const int *tokens, const int *targets, size_t n,
                            fsdp_stream_t s, const int **tok, const int **tgt);
/* The (rows) per-row losses buffer the xent op writes; loss_start then queues
 * their copy to the host after it, and loss waits and returns their sum in
 * double, in row order. */
double *gpt2_io_losses(gpt2_io_t *io);
fsdp_status_t gpt2_io_loss_start(gpt2_io_t *io, int rows, fsdp_stream_t s);
fsdp_status_t gpt2_io_loss(gpt2_io_t *io, double *sum);
/* n activations of dtype dt (f32 or bf16) to host fp32, waiting for them. */
fsdp_status_t gpt2_io_read(gpt2_io_t *io, float *host, const void *act, fsdp_dtype_t dt,
                           size_t n, fsdp_stream_t s);

#endif
