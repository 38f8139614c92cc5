/* src/core/internal.h — error plumbing, allocation and logging shared by every
 * module of the library. Not installed. */
#ifndef FSDP_CORE_INTERNAL_H
#define FSDP_CORE_INTERNAL_H

#include <stdarg.h>

#include "fsdp/core.h"

/* Sets the calling thread's last error to the formatted text and returns st. */
fsdp_status_t fsdp_error(fsdp_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Copies msg verbatim as the calling thread's last error. */
void fsdp_error_set(const char *msg);

/* Writes "3", "1, 4", "0-2, 5" (ranges for runs) into buf; ranks ascending. */
void fsdp_format_ranks(char *buf, size_t n, const int *ranks, int count);

/* Logging to stderr, prefixed "fsdp[rank] LEVEL". Level from FSDP_LOG_LEVEL
 * (error|warn|info|debug; default warn). */
typedef enum { FSDP_LOG_ERROR = 0, FSDP_LOG_WARN, FSDP_LOG_INFO, FSDP_LOG_DEBUG } fsdp_log_level_t;
void fsdp_log(fsdp_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fsdp_log_set_rank(int rank);

/* Propagates a failure, leaving a file:line breadcrumb in the debug log. */
#define FSDP_TRY(expr)                                                              \
  do {                                                                              \
    fsdp_status_t fsdp_try_st_ = (expr);                                            \
    if (fsdp_try_st_ != FSDP_SUCCESS) {                                             \
      fsdp_log(FSDP_LOG_DEBUG, "%s:%d <- %s", __FILE__, __LINE__,                   \
               fsdp_status_string(fsdp_try_st_));                                   \
      return fsdp_try_st_;                                                          \
    }                                                                               \
  } while (0)

/* Same, but stores the status in `st` and jumps to a cleanup label. */
#define FSDP_TRYG(st, expr, label)                                                  \
  do {                                                                              \
    (st) = (expr);                                                                  \
    if ((st) != FSDP_SUCCESS) {                                                     \
      fsdp_log(FSDP_LOG_DEBUG, "%s:%d <- %s", __FILE__, __LINE__,                   \
               fsdp_status_string(st));                                             \
      goto label;                                                                   \
    }                                                                               \
  } while (0)

/* The head of every extensible option struct (fsdp_config_t and the *_opts_t
 * of world.h and ckpt.h): size, magic, version. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
} fsdp_opts_head_t;

/* Copies the caller's option struct `in` over `out`, which holds the defaults
 * (`ours` bytes, its head filled): fields past the caller's size keep them.
 * Refuses (FSDP_ERR_INVALID_ARGUMENT, naming `what` and what to do) a struct
 * whose magic is not `magic` (not made by init_macro) or whose size is
 * not plausible or larger than ours (compiled against a newer header). */
fsdp_status_t fsdp_opts_import(void *out, const void *in, size_t ours, unsigned int magic,
                               const char *what, const char *init_macro);

/* 64-byte aligned, zeroed allocation; NULL on failure (bytes 0 gives NULL). */
void *fsdp_alloc(size_t bytes);
void fsdp_free(void *p);
/* strdup that returns NULL on failure. */
char *fsdp_strdup(const char *s);

/* Test-only fault injection, for failures a test cannot otherwise cause on
 * one rank (an allocation): 1 when FSDP_TEST_FAULT, a comma-separated list
 * of SITE@RANK, names `site` on world rank `rank`. Read at every call; only
 * tests set it (tests/mpi/test_comm.c, tests/cuda/meson.build). Sites:
 * comm_split (the split's local allocations fail), comm_split_setup (the
 * group's communicator fails on this rank once its backend made it),
 * nccl_enqueue_poll (each NCCL collective's stream waits until the next
 * enqueue's health check has passed, which then polls until a queued
 * collective has failed or none is queued: comm_nccl.c; for the simulator
 * and a run that fails). */
int fsdp_test_fault(const char *site, int rank);

#endif
