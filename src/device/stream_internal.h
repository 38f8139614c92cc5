/* src/device/stream_internal.h — stream hooks for other modules of the library.
 * Not installed. */
#ifndef FSDP_DEVICE_STREAM_INTERNAL_H
#define FSDP_DEVICE_STREAM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/device.h"

/* fsdp_stream_launch for work that owns a heap argument: when the stream has
 * already failed and skips the task, on_skip(arg) runs instead of fn(arg) so the
 * argument is still released (its status is ignored). On the host stream fn runs
 * now. When this call itself fails, nothing was queued and the caller still owns
 * arg. */
fsdp_status_t fsdp_stream_launch_owned(fsdp_stream_t stream, fsdp_host_fn fn,
                                       fsdp_host_fn on_skip, void *arg);

/* Host functions queued on CUDA streams since the process started (every
 * fsdp_stream_launch on a CUDA stream is one cudaLaunchHostFunc, which stalls
 * that stream for a round trip to the host); 0 without CUDA. Tests assert that
 * a step queues none. Thread-safe. */
uint64_t fsdp_cuda_host_fn_count(void);
/* Device allocations fsdp_device_alloc has made since the process started:
 * their number, their bytes, and their bytes each rounded up to the driver's
 * 2 MiB page (what the device can lose to them at most); 0 without CUDA.
 * Tests hold the engine's accounting and the device's memory to them.
 * Thread-safe. */
#define FSDP_CUDA_PAGE ((uint64_t)2 << 20)
void fsdp_cuda_alloc_totals(uint64_t *count, uint64_t *bytes, uint64_t *paged_bytes);

/* Timing marks: CUDA events with timing enabled, made once (a pool), recorded
 * on CUDA streams as work is queued and read afterwards as fsdp_time_now()
 * seconds, with no host function on the stream. Times are measured against an
 * anchor, a mark whose host time is known: fsdp_marks_anchor records it on an
 * idle stream and waits for it; fsdp_marks_recycle hands the latest read mark
 * over as the next anchor, so each read spans a short interval (a float of
 * milliseconds keeps microseconds) and the GPU's clock is tied to the host's
 * once. One thread uses a pool at a time. Without CUDA, create fails with
 * FSDP_ERR_UNSUPPORTED. */
typedef struct fsdp_marks *fsdp_marks_t;
#define FSDP_NO_MARK SIZE_MAX
/* capacity marks (and the anchor) on the current device. */
fsdp_status_t fsdp_marks_create(size_t capacity, fsdp_marks_t *marks);
void fsdp_marks_destroy(fsdp_marks_t marks);
/* Records the anchor on CUDA stream s, which must be idle, and waits for it
 * (the tightest of up to five tries); only before any mark is taken. */
fsdp_status_t fsdp_marks_anchor(fsdp_marks_t marks, fsdp_stream_t s);
/* Seconds by which mark times may be off the host clock: half the bracket of
 * the measured anchor (anchors handed on keep it). */
double fsdp_marks_anchor_error(fsdp_marks_t marks);
/* Records the next free mark on CUDA stream s; *id is its number, or
 * FSDP_NO_MARK when every mark is taken (nothing is recorded then). Marks are
 * taken in a ring: fsdp_marks_release frees the oldest. */
fsdp_status_t fsdp_marks_record(fsdp_marks_t marks, fsdp_stream_t s, size_t *id);
/* 1 when the stream has passed mark id (never waits). */
int fsdp_marks_done(fsdp_marks_t marks, size_t id);
/* Seconds from mark a to mark b, waiting for b. */
fsdp_status_t fsdp_marks_between(fsdp_marks_t marks, size_t a, size_t b, double *seconds);
/* Frees the n oldest marks taken. */
void fsdp_marks_release(fsdp_marks_t marks, size_t n);
/* The host time of mark id, waiting for its stream to pass it (no wait when it
 * has: read marks after the work they follow is known to be done). */
fsdp_status_t fsdp_marks_time(fsdp_marks_t marks, size_t id, double *t);
/* Frees every mark; mark `latest` (read at host time t, FSDP_NO_MARK: none)
 * becomes the anchor. */
void fsdp_marks_recycle(fsdp_marks_t marks, size_t latest, double t);

#endif
