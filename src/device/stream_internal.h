/* src/device/stream_internal.h — stream hooks for other modules of the library.
 * Not installed. */
#ifndef FSDP_DEVICE_STREAM_INTERNAL_H
#define FSDP_DEVICE_STREAM_INTERNAL_H

#include "fsdp/device.h"

/* fsdp_stream_launch for work that owns a heap argument: when the stream has
 * already failed and skips the task, on_skip(arg) runs instead of fn(arg) so the
 * argument is still released (its status is ignored). On the host stream fn runs
 * now. When this call itself fails, nothing was queued and the caller still owns
 * arg. */
fsdp_status_t fsdp_stream_launch_owned(fsdp_stream_t stream, fsdp_host_fn fn,
                                       fsdp_host_fn on_skip, void *arg);

#endif
