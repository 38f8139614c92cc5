/* tests/cudasim/include/nccl.h — the simulated NCCL's public header
 * (implementation: tests/cudasim/nccl/). It declares the subset of NCCL 2.28
 * that fsdp calls (src/comm/comm_nccl.c), with NCCL's own enum values and
 * signatures, so the same comm_nccl.c line runs on a GPU and here.
 *
 * How it works. A communicator of N >= 2 ranks is a POSIX shared-memory
 * segment that the ranks' processes map: a header, one slot per rank (its
 * barrier counter, its pid, the description of its current collective) and
 * one staging area of SIM_NCCL_STAGE bytes per rank. A collective is queued
 * on the caller's stream with cudaLaunchHostFunc, so it runs asynchronously
 * and in stream order like NCCL's kernel; when it runs, every rank posts the
 * collective's description and the ranks compare them, then the data move in
 * rounds (each rank copies its piece into its staging area, a barrier, each
 * rank reads what it needs, a barrier). Reductions combine contributions in
 * rank order 0, 1, ..., N-1, so every rank gets the same bits. N = 1 needs no
 * segment: collectives are copies.
 *
 * The id. ncclGetUniqueId only writes a fresh name into the id (nothing is
 * created, so an id that is never used leaves nothing behind). The first rank
 * to reach ncclCommInitRank creates the segment under that name; the others
 * open it; once all N have joined, every rank unlinks the name, so the
 * segment disappears from /dev/shm while the ranks still use it and is freed
 * by the kernel when the last one unmaps it or dies. An init that times out
 * unlinks the name too. Nothing is left in /dev/shm after destroy, abort, a
 * crash after init, or a failed init.
 *
 * Point to point (ncclSend, ncclRecv), as NCCL documents it: a send to peer
 * p pairs with p's receive from this rank, the k-th send from a to b with
 * the k-th receive on b from a; inside one ncclGroupStart/End the sends and
 * receives on a communicator run together as one operation (so a ring of
 * them, each rank sending to the next and receiving from the previous,
 * cannot deadlock), taking one turn among the communicator's collectives.
 * Only the two ranks of a pair take part; the others need not call
 * anything. The bytes move in chunks through the sender's staging area (a
 * slice per destination). A send without its matching receive (or the
 * reverse) keeps its stream until ncclCommAbort here or at any rank, the
 * peer's exit, or the deadline (then ncclRemoteError naming the peer); a
 * receive whose size differs from its send's is ncclInvalidUsage naming
 * both. At N = 1 a rank may send to and receive from itself (a copy).
 * A call that fails inside a group (a bad argument) makes ncclGroupEnd
 * return that error and run nothing of the group, as NCCL does.
 *
 * Arithmetic (matching fsdp's host backends, include/fsdp/comm.h):
 *  - f32 and f64 (and the integer types) reduce in their own type;
 *  - bf16 combines two values at a time in fp32 and rounds each step to bf16
 *    (nearest even), so a sum over N ranks rounds N - 1 times;
 *  - ncclAvg on floating types is NCCL's pre-multiplied sum: each
 *    contribution is multiplied by 1/N in the type (for bf16: the factor is
 *    bf16(1/N) and each product is rounded to bf16) and the products summed;
 *    on integer types the sum is divided by N afterwards;
 *  - ncclProd, ncclMax, ncclMin as their names say (bf16 products round).
 * Types: every integer type, ncclFloat16, ncclFloat32, ncclFloat64 and
 * ncclBfloat16 move and reduce (fp16 like bf16: each sum rounded to the
 * type, nearest even); the fp8 types are refused (ncclInvalidArgument,
 * "not modelled by the simulator"). Pre-multiplied-sum ops made by
 * ncclRedOpCreatePreMulSum are not available.
 *
 * Errors (every one also printed to stderr on one line, "simnccl: ..."):
 *  - at the call: bad arguments (NULL comm or buffer, rank, root, nranks,
 *    type, op out of range, a destroyed communicator) return
 *    ncclInvalidArgument; a collective on a communicator that failed earlier
 *    returns the earlier error;
 *  - inside the stream (returned later by ncclCommGetAsyncError, described by
 *    ncclGetLastError): ranks whose collectives differ (kind, count, type, op,
 *    root — real NCCL would hang or mix buffers) fail with ncclInvalidUsage
 *    and a message showing each rank's call; a peer that does not arrive
 *    within the deadline, that exited, or that aborted its communicator gives
 *    ncclRemoteError naming it. After an asynchronous error the communicator
 *    runs nothing more (queued collectives are skipped, their outputs left as
 *    they were) until it is destroyed or aborted.
 *  - every wait has a deadline: FSDP_SIM_NCCL_TIMEOUT_S seconds (default
 *    120), so a stalled or dead peer is an error, never a hang.
 *  - a collective that fails inside its stream (ncclCommGetAsyncError then
 *    reports it) keeps the stream, as NCCL's kernel does, until
 *    ncclCommAbort or the deadline: poll ncclCommGetAsyncError, then abort,
 *    rather than synchronise the stream first.
 *  - ncclCommAbort returns at once: a collective of this communicator waiting
 *    in a stream ends (its output is not written), queued ones are skipped,
 *    and peers waiting for this rank fail with ncclRemoteError ("rank r
 *    aborted") instead of waiting for the deadline. ncclCommDestroy does not
 *    wait either: queued collectives keep the communicator's memory alive and
 *    still run; real NCCL finalizes first. Synchronise the streams before
 *    destroying, as fsdp does.
 *
 * Stall injection, for watchdog tests: FSDP_SIM_NCCL_STALL=rank:op[:comm]
 * makes the process whose rank is `rank` in communicator number `comm` (the
 * 0-based order in which this process created communicators of N >= 2 ranks;
 * default 0) never arrive at that communicator's op-th collective (1-based,
 * in issue order): its stream blocks there until ncclCommAbort (or, so that
 * nothing hangs forever, the deadline), and its peers time out with an error
 * naming it. A line on stderr says when the stall begins. With a fourth
 * field, FSDP_SIM_NCCL_STALL=rank:op:comm:enqueue, the call itself (e.g.
 * ncclAllReduce) blocks instead, as a real enqueue can (a peer that never
 * connects, a full work queue), until another thread calls ncclCommAbort
 * (or the deadline passes); it then fails, and the collective never runs.
 * The entry points hold a reference on the communicator while they run, so
 * an abort from another thread during a call is safe.
 *
 * Failure injection: FSDP_SIM_NCCL_FAIL=rank:op[:comm] (numbered as above)
 * makes that collective fail inside the stream on that rank: it becomes the
 * communicator's asynchronous error (ncclSystemError), its output is not
 * written, and it keeps the stream until ncclCommAbort; the peers wait for
 * the rank until it aborts the communicator (or the deadline).
 *
 * Not modelled: speed, NCCL's ring/tree order of summation (any order within
 * comm.h's bounds is NCCL-like; rank order is one), devices (a communicator
 * is not tied to the device current at init), nonblocking communicators
 * (ncclConfig_t), ncclCommSplit, sends and receives on one communicator from
 * several streams in one group (refused: ncclInvalidUsage), registration. */
#ifndef FSDP_CUDASIM_NCCL_H
#define FSDP_CUDASIM_NCCL_H

#include <cuda_runtime_api.h> /* cudaStream_t */
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX "sim"
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

/* Bytes of staging per rank in the shared segment; collectives move in
 * rounds of at most this much per rank. */
#define SIM_NCCL_STAGE (1u << 20)
/* The most ranks a simulated communicator takes. */
#define SIM_NCCL_MAX_RANKS 64

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Point to point: count elements to / from rank peer (pairing above). */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

/* Collectives issued between the two are queued at ncclGroupEnd, in order
 * (sends and receives after them, together per communicator). */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif
