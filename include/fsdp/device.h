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

#ifdef __cplusplus
}
#endif
#endif
