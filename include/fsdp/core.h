/* fsdp/core.h — status codes, error text, element types and the export macro.
 *
 * Every fallible fsdp call returns fsdp_status_t. On failure the calling thread's
 * last-error text (fsdp_last_error) says what went wrong in words a user can act
 * on: the object, the value and what was expected. Outputs are written only on
 * success. The library never calls exit() and never aborts on user error. */
#ifndef FSDP_CORE_H
#define FSDP_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FSDP_BUILDING) && defined(__GNUC__)
#define FSDP_API __attribute__((visibility("default")))
#else
#define FSDP_API
#endif

#define FSDP_VERSION_MAJOR 0
#define FSDP_VERSION_MINOR 1
#define FSDP_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch, as in the headers compiled against. */
#define FSDP_VERSION_CODE (FSDP_VERSION_MAJOR * 10000 + FSDP_VERSION_MINOR * 100 + FSDP_VERSION_PATCH)

/* Extensible option structs (fsdp_config_t, fsdp_world_opts_t, the checkpoint
 * and unit options) begin with size, magic and version; fields are only
 * appended, and fields past an older caller's size take their defaults. Each
 * such struct ends without padding, which FSDP_ASSERT_NO_TAIL checks next to
 * it (a reserved field fills the gap where needed): otherwise a field appended
 * later would land in bytes an older caller never initialised, inside its
 * size. Appending a field means naming it in that check. */
#ifdef __cplusplus
#define FSDP_ASSERT_NO_TAIL(type, last)                                              \
  static_assert(sizeof(type) == offsetof(type, last) + sizeof(((type *)0)->last),    \
                #type " must end at its last field (" #last ")")
#else
#define FSDP_ASSERT_NO_TAIL(type, last)                                              \
  _Static_assert(sizeof(type) == offsetof(type, last) + sizeof(((type *)0)->last),   \
                 #type " must end at its last field (" #last ")")
#endif

/* The running library's FSDP_VERSION_CODE (a program may run against a newer
 * libfsdp than the headers it was compiled with). */
FSDP_API int fsdp_get_version(void);

typedef enum {
  FSDP_SUCCESS = 0,
  FSDP_ERR_INVALID_ARGUMENT, /* a value passed in is wrong (null, zero size, range) */
  FSDP_ERR_INVALID_USAGE,    /* a call made in the wrong order or state */
  FSDP_ERR_OUT_OF_MEMORY,    /* an allocation failed; nothing was changed */
  FSDP_ERR_COMM,             /* a collective or the transport under it failed */
  FSDP_ERR_SYSTEM,           /* an OS call (thread, file, clock) failed */
  FSDP_ERR_UNSUPPORTED,      /* a feature not built in or not available here */
  FSDP_ERR_INTERNAL,         /* a bug in fsdp: please report it with the message */
  FSDP_ERR_IO,               /* a file is missing, unreadable or ends early */
  FSDP_ERR_FORMAT,           /* a file's contents are not what they should be */
  FSDP_ERR_TIMEOUT,          /* a collective or the rendezvous passed its deadline */
  FSDP_ERR_NONFINITE,        /* NaN or Inf in a loss, gradients or state: training diverged */
  FSDP_STATUS_COUNT
} fsdp_status_t;

/* Queries follow one rule:
 *   - a property of a handle (fsdp_world_rank, fsdp_engine_num_units,
 *     fsdp_engine_stream, ...) or a predicate (fsdp_event_query) returns the
 *     value itself; on a NULL handle it returns -1 (numbers) or NULL (handles,
 *     pointers, strings);
 *   - the name of a value (fsdp_dtype_name, fsdp_strategy_name, ...) returns a
 *     static or handle-owned string, "unknown" for a value that has none;
 *   - everything else (filling a caller's struct, looking up by index or name)
 *     returns fsdp_status_t and writes its outputs only on success. */

/* A fixed, static description of a status code with what to do next. */
FSDP_API const char *fsdp_status_string(fsdp_status_t status);

/* The calling thread's last error message ("" when none). The text stays valid
 * until the next failing fsdp call on this thread. Errors raised by asynchronous
 * work (a collective on a communication stream) are reported by the call that
 * waits for it, which copies the message into its own thread's last error. */
FSDP_API const char *fsdp_last_error(void);

/* Element types of tensors and collectives. */
typedef enum {
  FSDP_F32 = 0,
  FSDP_BF16,
  FSDP_F64,
  FSDP_F16, /* IEEE binary16: 5-bit exponent, 11-bit significand, max 65504 */
  FSDP_DTYPE_COUNT
} fsdp_dtype_t;

FSDP_API size_t fsdp_dtype_size(fsdp_dtype_t dtype);     /* 0 for an invalid type */
FSDP_API const char *fsdp_dtype_name(fsdp_dtype_t dtype); /* "f32", "bf16", "f64", "f16" */

/* bf16 <-> f32 conversion (round to nearest even), used by the CPU backend. */
FSDP_API uint16_t fsdp_f32_to_bf16(float x);
FSDP_API float fsdp_bf16_to_f32(uint16_t x);
/* fp16 <-> f32 (IEEE binary16, round to nearest even): magnitudes from 65520
 * up become inf, below 2^-25 zero; subnormals are kept; NaN stays NaN. */
FSDP_API uint16_t fsdp_f32_to_f16(float x);
FSDP_API float fsdp_f16_to_f32(uint16_t x);

/* Monotonic clock in seconds; the time base of the engine's timeline. */
FSDP_API double fsdp_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
