/* fsdp/comm.h — process group: the collectives FSDP is made of.
 *
 * Backends: "mpi" (host buffers, one duplicated MPI communicator per
 * fsdp_comm_t), "gloo" (env:// worlds: host buffers over Gloo's TCP transport,
 * one Gloo context per fsdp_comm_t; reduce_scatter is a ring of N-1 steps
 * over Gloo's point-to-point buffers), "self" (one rank, plain copies,
 * no MPI) and, when fsdp was built with NCCL, "nccl" (CUDA device buffers,
 * one ncclComm_t per fsdp_comm_t on the CUDA device current when it was
 * created; every world kind). Every backend runs every collective below in
 * every dtype (reductions: see Counts).
 *
 * Streams. Each collective is issued on a stream: FSDP_HOST_STREAM runs it
 * now in the caller; a CPU stream (fsdp_stream_create) queues it, and the
 * caller records an event after it to wait on. On a CUDA stream
 * (fsdp_stream_create_cuda) nccl queues it on that stream and returns at
 * once (order it with events like any kernel); the host backends first wait
 * for everything queued on the stream (fsdp_stream_synchronize), then run it
 * in the caller, so it is complete when the call returns. nccl on the host or
 * a CPU stream runs it on the communicator's own CUDA stream and waits for it
 * in the calling thread (the caller's current device is left as it was).
 * Buffers must stay valid and untouched until the collective is complete.
 *
 * Device buffers. nccl takes CUDA device memory only (fsdp_device_alloc with
 * FSDP_DEVICE_CUDA); a host pointer is FSDP_ERR_INVALID_ARGUMENT. The host
 * backends take host memory and CUDA device memory alike (on any stream):
 * device buffers are staged through pinned host memory owned by the
 * communicator, copied in before and out after the collective with
 * synchronous copies in the thread that runs it. That memory is allocated on
 * the first staged collective, grows to the largest send + recv bytes of one
 * staged collective (the one buffer for in-place forms), and is kept until
 * fsdp_comm_destroy, so a loop of the same collectives allocates nothing after
 * its first round. This lets several ranks share one GPU (which NCCL refuses)
 * and GPUs work without NCCL, at the cost of two PCIe copies per collective.
 *
 * Ordering and threads: every rank must issue the same collectives on a
 * communicator in the same order. A communicator must only be used from one
 * stream (or the host) and one issuing thread at a time — use fsdp_comm_dup
 * to get one per stream; the engine holds one per stream. Create and destroy
 * communicators from the thread that made the world.
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
 * nccl reduces bf16 the same way for SUM and MAX; its AVG (ncclAvg) scales
 * each contribution by 1/N before summing (the factor and the product may
 * each round when N is not a power of two): |result - exact average| <=
 * ((1 + 2^-8)^(N+1) - 1) * sum |x| / N.
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
 * exit (fsdp-train does, non-zero). A gloo collective that fails before any
 * deadline (a peer died: its connections closed) cancels every gloo
 * communicator of the world on this rank at once
 * (fsdp_comm_set_cancel_on_failure), so that no peer, and none of this
 * rank's own streams, waits for the deadline in a collective this rank will
 * not finish: a loss spreads to every rank in about a connection's round
 * trip per hop. Under fsdp-run --min-nproc the watchdog also cancels them,
 * within a tick (at most 1 s), once fsdp-run announces a smaller world on its
 * control pipe, which frees a rank whose collective waits on no peer that
 * failed. mpi: MPI offers no way to interrupt a
 * call, so the watchdog calls MPI_Abort and the whole job ends non-zero.
 * nccl: a collective run on the host or a CPU stream is watched like the
 * others (staged host-backend collectives too, from the first copy to the
 * last). A collective queued on a CUDA stream is watched too: a CUDA event is
 * recorded after it, and the watchdog thread polls the events in issue order
 * (cudaEventQuery) and ncclCommGetAsyncError every tick; its deadline counts
 * from when it became the oldest unfinished collective queued on its
 * communicator (work queued on the stream before it counts against it). Past
 * the deadline the watchdog logs the same report and calls ncclCommAbort on
 * every nccl communicator of the world (from its own thread, which ends every
 * wait on their streams and the peers' waits for this rank); under mpirun it
 * then calls MPI_Abort and the job ends non-zero; otherwise the waiting call
 * and every later collective on the world's communicators fail with
 * FSDP_ERR_TIMEOUT and the report, and fsdp-run ends the job when the rank
 * exits. A collective that fails inside its stream (ncclCommGetAsyncError,
 * read by the watchdog each tick and before every collective of the world)
 * has not written its outputs, so nothing computed from them may pass for
 * good: the report names it (operation, number, unit, communicator, NCCL's
 * text; logged at ERROR), every NCCL communicator of the world is aborted
 * (so that peers waiting for this rank in any of them are released; a call
 * inside NCCL on another thread is let return first, or, if it is stuck
 * there, the abort comes at its deadline with the timeout's report), and
 * every later collective on any communicator of the world fails with
 * FSDP_ERR_COMM and that report (the engine's next acquire, release or step
 * that issues one): the world's communicators must be destroyed and made
 * anew, or the job ended.
 * NCCL calls that fail at once fail with FSDP_ERR_COMM, NCCL's text and the
 * collective; after any NCCL error the communicator refuses work and destroy
 * aborts it unless the watchdog already did. A collective's enqueue that
 * blocks inside NCCL is watched too: its deadline starts at the call when
 * nothing queued before it is still running, and the watchdog's abort ends
 * the call.
 *
 * Signals: Gloo's TCP transport writes with writev, so a write to a peer that
 * has just died raises SIGPIPE. The first gloo communicator of a process sets
 * SIGPIPE to ignored when its disposition is still the default, so that such
 * a write fails the collective with FSDP_ERR_COMM ("a peer failed") instead
 * of killing the rank silently; a handler or SIG_IGN the program set is kept.
 * SIG_IGN is inherited across exec: a program that starts children after
 * its first gloo communicator and wants SIGPIPE's default for them restores
 * it in the child. The other backends change no signal disposition.
 *
 * Desync check (on by default; world opts desync_check -1 or
 * FSDP_DESYNC_CHECK=0 turn it off): before each collective the ranks
 * all-gather a fixed-size fingerprint of it (operation, tag, count, dtype,
 * reduction, root, sequence number) on the same communicator. If they differ
 * (an extra collective on one rank, another count, a skipped unit) every rank
 * fails with FSDP_ERR_INVALID_USAGE and a message listing each distinct
 * fingerprint and the ranks that issued it, instead of hanging or mixing up
 * buffers. Costs one all-gather of 72 bytes per rank per collective (README,
 * "Desync check", has the numbers); a rank that issues a collective nobody
 * else ever issues still hangs there, until the deadline. nccl communicators
 * are not checked (their collectives never pass through the host). */
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

/* A communicator over every rank of the world on the world's backend
 * (fsdp_world_backend). Collective: every rank creates its communicators in
 * the same order (gloo meshes them through the store). The caller destroys
 * it, before the world. */
FSDP_API fsdp_status_t fsdp_comm_create(fsdp_world_t world, fsdp_comm_t *comm);
/* The same on a backend chosen by name: NULL is the world's own; "mpi" (MPI
 * worlds), "gloo" (env:// worlds), "self" (worlds of one rank) and "nccl"
 * (any world, when built with NCCL). nccl bootstraps through the world: rank
 * 0's ncclUniqueId goes out by MPI_Bcast (mpirun) or the store key
 * "nccl/<id>" (env://); set each rank's CUDA device first (e.g.
 * fsdp_cuda_set_device(fsdp_world_local_rank(world))), and give each rank a
 * device of its own. Errors: FSDP_ERR_INVALID_ARGUMENT for a name that is no
 * backend, FSDP_ERR_UNSUPPORTED for one this world or build lacks (both list
 * what is available), FSDP_ERR_COMM when NCCL or CUDA fails. */
FSDP_API fsdp_status_t fsdp_comm_create_backend(fsdp_world_t world, const char *backend,
                                                fsdp_comm_t *comm);
/* A new communicator over the same ranks, on the same backend (nccl: the same
 * device), independent in ordering. Collective. */
FSDP_API fsdp_status_t fsdp_comm_dup(fsdp_comm_t comm, fsdp_comm_t *out);
/* Splits comm into groups: the ranks passing the same colour (>= 0) form a
 * new communicator, ranked by key, ties by their rank in comm; every rank of
 * comm calls it (collective) and gets the communicator of its group in *out.
 * The backend is comm's: mpi (MPI_Comm_split), gloo (a new Gloo context per
 * group, meshed through the world's store under the group's colour), self,
 * nccl (a new NCCL communicator per group, bootstrapped with the group
 * leader's unique id through the world; comm must span the world, and every
 * rank of the world creates, dups and destroys its group's communicators at
 * the same time, since under mpirun the ids travel through the world's
 * communicator). Dups of a group are groups. The watchdog and the desync
 * check cover groups like any communicator; their reports name the group
 * ("group 1 of communicator 3: world ranks 2-3") and give world ranks.
 * The colour/key exchange is one small all-gather on comm (nccl: on a
 * temporary host communicator of the world), between two one-float
 * all-reduces there by which the ranks agree that every rank allocated what
 * it needs and, after the backend built the groups, that every rank's group
 * is set up: a rank failing in either fails with its own error and every
 * other with FSDP_ERR_COMM naming it, and no rank keeps a group (a backend
 * that blocks in its own set-up until every rank arrives, as MPI and NCCL
 * do, still waits there for a rank that failed inside it, until the
 * deadline). Errors: FSDP_ERR_INVALID_ARGUMENT
 * for a NULL argument or a negative colour (checked before any exchange, so
 * a rank passing one fails alone while the others wait: pass it everywhere);
 * FSDP_ERR_UNSUPPORTED for a nccl comm that does not span the world. */
FSDP_API fsdp_status_t fsdp_comm_split(fsdp_comm_t comm, int color, int key, fsdp_comm_t *out);
/* Waits for nothing: the caller must have synchronised streams using it.
 * Frees the staging memory. */
FSDP_API void fsdp_comm_destroy(fsdp_comm_t comm);
/* Whether comm is cancelled when a collective of its world fails on this
 * rank (gloo; 1, the default, for every new communicator, dups included).
 * Cancelled: comm's pending and later collectives fail at once with
 * FSDP_ERR_COMM naming that first failure, and its connections close, so
 * the peers' collectives waiting for this rank in comm fail at once too
 * ("Connection closed by peer") instead of at the deadline. 0 exempts comm:
 * its collectives go on between the ranks alive, failing only on a peer of
 * their own that is gone (the buddy snapshots, fsdp/replica.h: a copy a
 * rank sent before it died must still arrive). A no-op for the other
 * backends (mpi, self, nccl). Set it before comm's first collective; not
 * thread-safe against collectives on comm. FSDP_ERR_INVALID_ARGUMENT for a
 * NULL comm. */
FSDP_API fsdp_status_t fsdp_comm_set_cancel_on_failure(fsdp_comm_t comm, int cancel);

FSDP_API int fsdp_comm_rank(fsdp_comm_t comm);
FSDP_API int fsdp_comm_size(fsdp_comm_t comm);
/* "mpi", "gloo", "self" or "nccl" */
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
/* A ring shift: recv (count elements) = send of rank (rank - offset) mod size;
 * each rank sends to (rank + offset) mod size. offset in 0 .. size - 1 (0 is a
 * copy); send and recv must not overlap. Every rank passes the same count and
 * offset. What buddy replicas (fsdp/replica.h) move: point to point, so each
 * rank sends and receives count elements whatever the size. Every backend
 * runs it: mpi, gloo and self on host buffers (device ones staged), nccl on
 * device buffers as one ncclSend and one ncclRecv in a group (on a CUDA
 * stream: queued there and watched like the other collectives). */
FSDP_API fsdp_status_t fsdp_shift(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                                  fsdp_dtype_t dtype, int offset, fsdp_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
