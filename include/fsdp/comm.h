/* fsdp/comm.h — process group: the collectives FSDP is made of.
 *
 * Backends: "mpi" (host buffers, one duplicated MPI communicator per
 * fsdp_comm_t), "gloo" (env:// worlds: host buffers over Gloo's TCP transport,
 * one Gloo context per fsdp_comm_t; reduce_scatter is an all_reduce plus this
 * rank's slice, which moves twice the bytes) and "self" (one rank, plain
 * copies, no MPI). Each collective is issued on a stream: FSDP_HOST_STREAM
 * runs it now in the caller; a stream from fsdp_stream_create queues it, and
 * the caller records an event after it to wait on. Buffers must stay valid and
 * untouched until that point.
 *
 * Ordering: every rank must issue the same collectives on a communicator in the
 * same order. A communicator must only be used from one stream (or the host) —
 * use fsdp_comm_dup to get one per stream; the engine holds one per stream.
 *
 * Counts are in elements of dtype; gathers and broadcasts move any dtype.
 * Reductions (SUM, AVG, MAX) take FSDP_F32, FSDP_BF16 and FSDP_F64. f32 and
 * f64 sum in their own precision. bf16 (uint16_t bit patterns, see
 * fsdp_f32_to_bf16) combines two contributions at a time in fp32 and rounds
 * the result once to bf16 (nearest even), so a sum over N ranks is rounded
 * N-1 times, in an order the backend chooses: |result - exact sum| <=
 * ((1 + 2^-8)^(N-1) - 1) * sum of |contributions|, and integers up to 256 in
 * magnitude (every partial sum included) are exact. AVG multiplies the sum
 * by 1/N in fp32 (f32, and bf16, which then rounds once more) or in f64.
 * MAX is exact. With one rank every reduction returns its input unchanged.
 * In-place: all_gather with send == recv + rank*count, reduce_scatter with
 * recv == send + rank*count, and all_reduce with send == recv are allowed (after
 * an in-place reduce_scatter the rest of send is scratch). Any other overlap of
 * send and recv is FSDP_ERR_INVALID_ARGUMENT.
 *
 * Arguments are checked on the calling rank before anything is sent, so a bad
 * argument passed identically on every rank fails on every rank without hanging.
 * Destroy every communicator before the world it was made from.
 *
 * Deadlines: every collective must complete within the world's timeout
 * (fsdp_world_timeout: world opts, FSDP_TIMEOUT_S, default 600 s). A watchdog
 * thread per world (started with the first communicator of a world of more
 * than one rank) watches the collectives in flight. When one passes its
 * deadline the watchdog logs, at ERROR level on stderr, the operation, its
 * sequence number on its communicator, the unit it was for (the engine tags
 * gathers and reductions with the unit name) and, under env://, which ranks
 * never issued it (every rank's watchdog publishes its progress to the
 * store); then it aborts. gloo: every communicator of the world is closed, the
 * blocked call and every later one fail with FSDP_ERR_TIMEOUT and that report,
 * and peers blocked on this rank fail at once; the program is expected to
 * exit (fsdp-train does, non-zero). mpi: MPI offers no way to interrupt a
 * call, so the watchdog calls MPI_Abort and the whole job ends non-zero.
 *
 * Desync check (world opts desync_check, FSDP_DESYNC_CHECK=1): before each
 * collective the ranks all-gather a fixed-size fingerprint of it (operation,
 * tag, count, dtype, reduction, root, sequence number) on the same
 * communicator. If they differ (an extra collective on one rank, another
 * count, a skipped unit) every rank fails with FSDP_ERR_INVALID_USAGE and a
 * message listing each distinct fingerprint and the ranks that issued it,
 * instead of hanging or mixing up buffers. Costs one small all-gather per
 * collective; a rank that issues a collective nobody else ever issues still
 * hangs there, until the deadline. */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include "fsdp/core.h"
#include "fsdp/device.h"
#include "fsdp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_comm *fsdp_comm_t;

typedef enum { FSDP_SUM = 0, FSDP_AVG, FSDP_MAX } fsdp_reduce_op_t;

/* A communicator over every rank of the world. Collective: every rank creates
 * its communicators in the same order (gloo meshes them through the store). */
FSDP_API fsdp_status_t fsdp_comm_create(fsdp_world_t world, fsdp_comm_t *comm);
/* A new communicator over the same ranks, independent in ordering. Collective. */
FSDP_API fsdp_status_t fsdp_comm_dup(fsdp_comm_t comm, fsdp_comm_t *out);
/* Waits for nothing: the caller must have synchronised streams using it. */
FSDP_API void fsdp_comm_destroy(fsdp_comm_t comm);

FSDP_API int fsdp_comm_rank(fsdp_comm_t comm);
FSDP_API int fsdp_comm_size(fsdp_comm_t comm);
/* "mpi", "gloo" or "self" */
FSDP_API const char *fsdp_comm_backend(fsdp_comm_t comm);

/* recv[r*count .. (r+1)*count) = send of rank r. */
FSDP_API fsdp_status_t fsdp_all_gather(fsdp_comm_t comm, const void *send, void *recv,
                                       size_t count, fsdp_dtype_t dtype, fsdp_stream_t stream);
/* recv (count elements) = op over ranks of send[rank*count .. (rank+1)*count). */
FSDP_API fsdp_status_t fsdp_reduce_scatter(fsdp_comm_t comm, const void *send, void *recv,
                                           size_t count, fsdp_dtype_t dtype,
                                           fsdp_reduce_op_t op, fsdp_stream_t stream);
FSDP_API fsdp_status_t fsdp_all_reduce(fsdp_comm_t comm, const void *send, void *recv,
                                       size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                       fsdp_stream_t stream);
FSDP_API fsdp_status_t fsdp_broadcast(fsdp_comm_t comm, void *buf, size_t count,
                                      fsdp_dtype_t dtype, int root, fsdp_stream_t stream);
FSDP_API fsdp_status_t fsdp_barrier(fsdp_comm_t comm, fsdp_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
