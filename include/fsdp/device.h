/* fsdp/device.h — streams and events: the only synchronisation in a step.
 *
 * A stream is an ordered queue of work; an event marks a point in a stream.
 * On the CPU backend a communication stream is a worker thread with a FIFO queue,
 * the compute stream is the calling thread itself (work on it is done when the
 * call returns) and an event is a completion ticket, so the engine's schedule is
 * the same code on CPU and GPU and the overlap is real on both.
 *
 * Ownership: the creator destroys what it creates; destroying a stream waits for
 * the work queued on it. Thread safety: a stream may be fed from one thread at a
 * time; waiting on an event is safe from any thread. An event refers to the
 * stream it was last recorded on: before destroying a stream, synchronize the
 * streams that wait on its events, and do not wait on those events afterwards.
 *
 * Errors in queued work are sticky: the stream records the first failure, skips
 * the work after it, and every later wait on that stream (or on an event recorded
 * on it) returns the failure with its message. */
#ifndef FSDP_DEVICE_H
#define FSDP_DEVICE_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FSDP_DEVICE_CPU = 0, FSDP_DEVICE_CUDA } fsdp_device_kind_t;

typedef struct fsdp_stream *fsdp_stream_t;
typedef struct fsdp_event *fsdp_event_t;

/* NULL names the host stream: work "on" it runs in the caller immediately. */
#define FSDP_HOST_STREAM ((fsdp_stream_t)0)

FSDP_API fsdp_status_t fsdp_stream_create(const char *name, fsdp_stream_t *stream);
FSDP_API void fsdp_stream_destroy(fsdp_stream_t stream);
/* Blocks until everything queued so far has run; returns the sticky error. */
FSDP_API fsdp_status_t fsdp_stream_synchronize(fsdp_stream_t stream);

/* Queue a host function; it runs after everything queued before it. Its status
 * becomes the stream's sticky error when it fails; on the host stream it runs
 * now and its status is returned. */
typedef fsdp_status_t (*fsdp_host_fn)(void *arg);
FSDP_API fsdp_status_t fsdp_stream_launch(fsdp_stream_t stream, fsdp_host_fn fn, void *arg);

FSDP_API fsdp_status_t fsdp_event_create(fsdp_event_t *event);
FSDP_API void fsdp_event_destroy(fsdp_event_t event);
/* Marks the current end of the stream's queue. An event never recorded, or
 * recorded on the host stream, is complete. */
FSDP_API fsdp_status_t fsdp_event_record(fsdp_event_t event, fsdp_stream_t stream);
/* Makes later work on stream wait for the event (host stream: blocks now). */
FSDP_API fsdp_status_t fsdp_stream_wait_event(fsdp_stream_t stream, fsdp_event_t event);
/* Blocks the caller until the event is complete; returns its stream's error. */
FSDP_API fsdp_status_t fsdp_event_synchronize(fsdp_event_t event);
/* 1 when complete, 0 when not yet (never blocks). */
FSDP_API int fsdp_event_query(fsdp_event_t event);

/* ---- CUDA -------------------------------------------------------------------
 * Built when fsdp was configured with CUDA (fsdp_config.h: FSDP_HAVE_CUDA);
 * otherwise every call below fails with FSDP_ERR_UNSUPPORTED saying so, and
 * fsdp_cuda_device_count returns 0.
 *
 * A CUDA stream (fsdp_stream_create_cuda) is a cudaStream_t that does not
 * synchronise with the legacy default stream, on the device current when it was
 * created. On it: fsdp_stream_launch queues the host function with
 * cudaLaunchHostFunc (it must not call CUDA; its failure becomes the stream's
 * sticky error, reported by the next synchronize); an event recorded on it is a
 * cudaEvent. Waits between kinds:
 *   CUDA stream waits on a CUDA event: cudaStreamWaitEvent, no host involvement;
 *   CPU stream waits on a CUDA event: its worker blocks in cudaEventSynchronize
 *     when it reaches the wait (the event may be re-recorded at once);
 *   CUDA stream waits on a CPU event: the caller blocks until the event is
 *     complete (a host synchronisation; the engine never does this).
 * fsdp_event_synchronize and fsdp_stream_synchronize on CUDA objects block the
 * caller (cudaEventSynchronize, cudaStreamSynchronize) and return CUDA faults as
 * FSDP_ERR_SYSTEM with CUDA's message. */

/* CUDA devices this process can use; 0 when CUDA is not built or none works. */
FSDP_API int fsdp_cuda_device_count(void);
/* Makes `ordinal` the calling thread's current device (cudaSetDevice); the
 * current device is per thread, as in CUDA. */
FSDP_API fsdp_status_t fsdp_cuda_set_device(int ordinal);
FSDP_API fsdp_status_t fsdp_cuda_get_device(int *ordinal);
/* Free and total bytes of the current device's memory (cudaMemGetInfo). */
FSDP_API fsdp_status_t fsdp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* high_priority: 1 for communication streams (the greatest priority the device
 * offers), 0 for compute. */
FSDP_API fsdp_status_t fsdp_stream_create_cuda(const char *name, int high_priority,
                                               fsdp_stream_t *stream);
/* FSDP_DEVICE_CPU for worker streams and the host stream. */
FSDP_API fsdp_device_kind_t fsdp_stream_device(fsdp_stream_t stream);
/* The cudaStream_t of a CUDA stream, NULL for any other. */
FSDP_API void *fsdp_stream_cuda_handle(fsdp_stream_t stream);
/* What runs causal attention in `dtype` for B x T tokens of C channels in NH
 * query heads over NKV key/value heads (grouped-query; 0: NKV = NH) on `stream` (a CUDA stream; its device is the current one), in words,
 * into buf (len bytes, NUL-terminated, truncated to fit): "cudnn 9.x.y
 * (/path/libcudnn.so.9)" (cuDNN's fused flash attention), "in-house flash:
 * <why not cuDNN>" (bf16), or "in-house fp32: ..." (f32). For bf16 this makes
 * the choice attention's first call would make, once per process, device
 * and shape: cuDNN where it loads ($FSDP_CUDNN_LIBRARY, else libcudnn.so.9)
 * and builds both graphs of the shape; $FSDP_ATTENTION=flash|cudnn forces
 * one (cudnn where cuDNN cannot run the shape: FSDP_ERR_UNSUPPORTED with
 * cuDNN's reason). Thread-safe. FSDP_ERR_UNSUPPORTED without CUDA. */
FSDP_API fsdp_status_t fsdp_cuda_attention_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B,
                                                int T, int C, int NH, int NKV, char *buf,
                                                size_t len);

/* fsdp_cuda_product_impl's flags: the weight is (OC, C) (a linear layer;
 * else a Conv1D's (C, OC)); the layer adds a bias; a GELU follows it (the
 * forward keeps its input); its input is a GELU's output (d(input) takes
 * GELU's slope). */
enum {
  FSDP_PRODUCT_OUT_IN = 1,
  FSDP_PRODUCT_BIAS = 2,
  FSDP_PRODUCT_GELU = 4,
  FSDP_PRODUCT_DGELU = 8,
};
/* What runs a block's layer y (B, OC) = x (B, C) @ W [+ bias] in `dtype` on
 * `stream` (a CUDA stream; its device is the current one), for each of its
 * three products, in words into buf (len bytes, NUL-terminated, truncated to
 * fit): "fwd <how>, dinp <how>, dW <how>", each "cuBLASLt <epilogue>" (BIAS,
 * GELU_AUX_BIAS, DGELU, BGRADA, BGRADB: what follows the product runs as its
 * epilogue), "cuBLAS" (a plain product: nothing follows it), or "cuBLAS +
 * <pass> (<why not cuBLASLt>)". This makes the choice the layer's first
 * products make, once per process, device, dtype, shape and epilogue, for
 * 16-byte aligned tensors (a less aligned one takes the pass). Thread-safe.
 * FSDP_ERR_INVALID_ARGUMENT for sizes below 1 or no buffer;
 * FSDP_ERR_UNSUPPORTED without CUDA or for a dtype other than f32 and bf16. */
FSDP_API fsdp_status_t fsdp_cuda_product_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B,
                                              int C, int OC, int flags, char *buf, size_t len);

/* Memory on a device kind: CPU is fsdp_alloc's aligned host memory, CUDA is
 * cudaMalloc on the current device. Neither is initialised. The caller frees
 * with fsdp_device_free of the same kind (NULL is ignored). */
FSDP_API fsdp_status_t fsdp_device_alloc(fsdp_device_kind_t kind, size_t bytes, void **ptr);
FSDP_API void fsdp_device_free(fsdp_device_kind_t kind, void *ptr);
/* Copies bytes between any two of host and device memory (cudaMemcpyDefault).
 * On a CUDA stream it is queued (host memory should then be pinned, or CUDA
 * copies synchronously); on the host stream or a CPU stream it is done before
 * the call returns. */
FSDP_API fsdp_status_t fsdp_device_copy(void *dst, const void *src, size_t bytes,
                                        fsdp_stream_t stream);
/* Sets bytes to zero, with fsdp_device_copy's stream rules. */
FSDP_API fsdp_status_t fsdp_device_zero(void *dst, size_t bytes, fsdp_stream_t stream);
/* Page-locked host memory (cudaHostAlloc, portable: every device may use it),
 * which copies queued on a CUDA stream move without blocking the caller. Not
 * initialised; the caller frees it with fsdp_pinned_free (NULL is ignored),
 * which waits for the device like cudaFreeHost. Needs a usable CUDA device:
 * otherwise FSDP_ERR_UNSUPPORTED (built without CUDA) or FSDP_ERR_SYSTEM with
 * CUDA's message; FSDP_ERR_OUT_OF_MEMORY when the pages cannot be locked. */
FSDP_API fsdp_status_t fsdp_pinned_alloc(size_t bytes, void **ptr);
FSDP_API void fsdp_pinned_free(void *ptr);
/* 1 when p points into CUDA device memory (not host, pinned or managed). */
FSDP_API int fsdp_is_device_pointer(const void *p);

#ifdef __cplusplus
}
#endif
#endif
