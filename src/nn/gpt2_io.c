/* src/nn/gpt2_io.c — GPT-2's host traffic (gpt2_io.h): device buffers for
 * tokens, targets and per-row losses; host buffers (pinned on CUDA) that the
 * host fills and reads between synchronisations, each guarded by an event. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "nn/gpt2_io.h"

enum { READ_CHUNK = 1 << 20 }; /* bytes of the host buffer `read` copies through */

struct gpt2_io {
  fsdp_device_kind_t kind;
  size_t rows;
  int *tok, *tgt;              /* (rows) the kernels' memory */
  double *losses;              /* (rows) the kernels' memory */
  int *stage_h;                /* (2*rows) host: tokens then targets */
  double *losses_h;            /* (rows) host */
  void *chunk_h;               /* (READ_CHUNK bytes) host */
  fsdp_event_t staged, lossed; /* stage_h is free again / losses_h is filled */
  int loss_rows;               /* rows of the loss in flight */
};

size_t gpt2_io_bytes(size_t rows) { return rows * (2 * sizeof(int) + sizeof(double)); }

static fsdp_status_t host_alloc(const gpt2_io_t *io, size_t bytes, void **p) {
  if (io->kind == FSDP_DEVICE_CUDA) return fsdp_pinned_alloc(bytes, p);
  return fsdp_device_alloc(FSDP_DEVICE_CPU, bytes, p);
}

static void host_free(const gpt2_io_t *io, void *p) {
  if (io->kind == FSDP_DEVICE_CUDA) fsdp_pinned_free(p);
  else fsdp_device_free(FSDP_DEVICE_CPU, p);
}

void gpt2_io_destroy(gpt2_io_t *io) {
  if (!io) return;
  /* Device and pinned frees wait for the device: no queued copy still uses these. */
  if (io->staged) fsdp_event_destroy(io->staged);
  if (io->lossed) fsdp_event_destroy(io->lossed);
  fsdp_device_free(io->kind, io->tok);
  fsdp_device_free(io->kind, io->tgt);
  fsdp_device_free(io->kind, io->losses);
  host_free(io, io->stage_h);
  host_free(io, io->losses_h);
  host_free(io, io->chunk_h);
  free(io);
}

static fsdp_status_t io_buffers(gpt2_io_t *io) {
  const size_t n = io->rows;
  FSDP_TRY(fsdp_device_alloc(io->kind, n * sizeof(int), (void **)&io->tok));
  FSDP_TRY(fsdp_device_alloc(io->kind, n * sizeof(int), (void **)&io->tgt));
  FSDP_TRY(fsdp_device_alloc(io->kind, n * sizeof(double), (void **)&io->losses));
  FSDP_TRY(host_alloc(io, 2 * n * sizeof(int), (void **)&io->stage_h));
  FSDP_TRY(host_alloc(io, n * sizeof(double), (void **)&io->losses_h));
  FSDP_TRY(host_alloc(io, READ_CHUNK, &io->chunk_h));
  FSDP_TRY(fsdp_event_create(&io->staged));
  return fsdp_event_create(&io->lossed);
}

fsdp_status_t gpt2_io_create(fsdp_device_kind_t kind, size_t rows, gpt2_io_t **out) {
  gpt2_io_t *io = calloc(1, sizeof *io);
  if (!io) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "GPT-2: out of host memory");
  io->kind = kind;
  io->rows = rows;
  fsdp_status_t st = io_buffers(io);
  if (st != FSDP_SUCCESS) {
    gpt2_io_destroy(io);
    return st;
  }
  *out = io;
  return FSDP_SUCCESS;
}

/* Through the host buffer, which the previous stage's copies must have left. */
fsdp_status_t gpt2_io_stage(gpt2_io_t *io, const int *tokens, const int *targets, size_t n,
                            fsdp_stream_t s, const int **tok, const int **tgt) {
  FSDP_TRY(fsdp_event_synchronize(io->staged));
  memcpy(io->stage_h, tokens, n * sizeof(int));
  FSDP_TRY(fsdp_device_copy(io->tok, io->stage_h, n * sizeof(int), s));
  if (targets) {
    memcpy(io->stage_h + n, targets, n * sizeof(int));
    FSDP_TRY(fsdp_device_copy(io->tgt, io->stage_h + n, n * sizeof(int), s));
  }
  FSDP_TRY(fsdp_event_record(io->staged, s));
  *tok = io->tok, *tgt = targets ? io->tgt : NULL;
  return FSDP_SUCCESS;
}

double *gpt2_io_losses(gpt2_io_t *io) { return io->losses; }

fsdp_status_t gpt2_io_loss_start(gpt2_io_t *io, int rows, fsdp_stream_t s) {
  FSDP_TRY(fsdp_device_copy(io->losses_h, io->losses, (size_t)rows * sizeof(double), s));
  FSDP_TRY(fsdp_event_record(io->lossed, s));
  io->loss_rows = rows;
  return FSDP_SUCCESS;
}

fsdp_status_t gpt2_io_loss(gpt2_io_t *io, double *sum) {
  FSDP_TRY(fsdp_event_synchronize(io->lossed));
  double total = 0.0;
  for (int i = 0; i < io->loss_rows; i++) total += io->losses_h[i];
  *sum = total;
  return FSDP_SUCCESS;
}

/* Through the host chunk, widening bf16 on the host. */
fsdp_status_t gpt2_io_read(gpt2_io_t *io, float *host, const void *act, fsdp_dtype_t dt,
                           size_t n, fsdp_stream_t s) {
  const size_t esize = fsdp_dtype_size(dt), per = READ_CHUNK / esize;
  for (size_t at = 0; at < n; at += per) {
    size_t k = n - at < per ? n - at : per;
    FSDP_TRY(fsdp_device_copy(io->chunk_h, (const char *)act + at * esize, k * esize, s));
    FSDP_TRY(fsdp_stream_synchronize(s));
    if (dt == FSDP_F32) memcpy(host + at, io->chunk_h, k * sizeof(float));
    else
      for (size_t i = 0; i < k; i++) host[at + i] = fsdp_bf16_to_f32(((uint16_t *)io->chunk_h)[i]);
  }
  return FSDP_SUCCESS;
}
