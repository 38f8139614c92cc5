/* src/core/core.c — status text, per-thread last error, element types, bf16 and fp16
 * conversion, the monotonic clock, logging and aligned allocation. Everything
 * else in the library is built on these; none of it depends on MPI or devices. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

#define FSDP_ERROR_BUF 1024
#define FSDP_ALIGN 64

/* Per thread so that a worker stream's failure never clobbers the text the
 * main thread is about to read; streams copy it across explicitly. */
static _Thread_local char last_error[FSDP_ERROR_BUF];

const char *fsdp_status_string(fsdp_status_t status) {
  switch (status) {
  case FSDP_SUCCESS:
    return "success";
  case FSDP_ERR_INVALID_ARGUMENT:
    return "invalid argument: a value passed in is wrong; fix the call described by "
           "fsdp_last_error()";
  case FSDP_ERR_INVALID_USAGE:
    return "invalid usage: a call was made in the wrong order or state, or the program "
           "was launched the wrong way; see fsdp_last_error() for the fix";
  case FSDP_ERR_OUT_OF_MEMORY:
    return "out of memory: an allocation failed and nothing was changed; reduce the "
           "model, batch or prefetch depth, or use more ranks";
  case FSDP_ERR_COMM:
    return "communication error: a collective or the transport under it failed; check "
           "that every rank issued the same collectives and that all ranks are alive";
  case FSDP_ERR_SYSTEM:
    return "system error: an OS call (thread, file, clock) failed; check resource "
           "limits and the message from fsdp_last_error()";
  case FSDP_ERR_UNSUPPORTED:
    return "unsupported: the feature is not built in or not available here; see "
           "fsdp_last_error() for an alternative";
  case FSDP_ERR_INTERNAL:
    return "internal error: a bug in fsdp; please report it with the text of "
           "fsdp_last_error()";
  case FSDP_ERR_IO:
    return "I/O error: a file is missing, unreadable or shorter than it should be; "
           "check the path in fsdp_last_error()";
  case FSDP_ERR_FORMAT:
    return "format error: a file's contents are malformed or corrupt; "
           "fsdp_last_error() names the file and the field";
  case FSDP_ERR_TIMEOUT:
    return "timeout: a collective or the rendezvous did not finish before its deadline; "
           "fsdp_last_error() names the operation and the ranks that never arrived";
  case FSDP_ERR_NONFINITE:
    return "non-finite values: a loss, gradient or saved state holds NaN or Inf; lower the "
           "learning rate, clip gradients, or (fp16) check the loss scale; "
           "fsdp_last_error() says where";
  case FSDP_STATUS_COUNT:
    break;
  }
  return "unknown status code: not a value of fsdp_status_t; check that the caller "
         "passes a status returned by fsdp";
}

const char *fsdp_last_error(void) { return last_error; }

fsdp_status_t fsdp_error(fsdp_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  fsdp_log(FSDP_LOG_DEBUG, "error (%s): %s", fsdp_status_string(st), last_error);
  return st;
}

void fsdp_error_set(const char *msg) {
  /* A stream may pass our own buffer back in; copying onto itself is a no-op. */
  if (msg == last_error) return;
  snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
}

/* ---- element types ------------------------------------------------------- */

size_t fsdp_dtype_size(fsdp_dtype_t dtype) {
  switch (dtype) {
  case FSDP_F32:
    return 4;
  case FSDP_BF16:
  case FSDP_F16:
    return 2;
  case FSDP_F64:
    return 8;
  case FSDP_DTYPE_COUNT:
    break;
  }
  return 0;
}

const char *fsdp_dtype_name(fsdp_dtype_t dtype) {
  switch (dtype) {
  case FSDP_F32:
    return "f32";
  case FSDP_BF16:
    return "bf16";
  case FSDP_F64:
    return "f64";
  case FSDP_F16:
    return "f16";
  case FSDP_DTYPE_COUNT:
    break;
  }
  return "invalid";
}

uint16_t fsdp_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    /* NaN: keep sign and top payload bits, force quiet so it cannot round to inf. */
    return (uint16_t)((u >> 16) | 0x0040u);
  }
  /* Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. Overflow
   * past the largest finite bf16 correctly carries into the exponent (inf). */
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return (uint16_t)(u >> 16);
}

float fsdp_bf16_to_f32(uint16_t x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Subnormal fp16 (|x| < 2^-14): the significand rounded to units of 2^-24. */
static uint16_t f16_subnormal(uint32_t a) {
  if (a < 0x33000000u) return 0; /* below 2^-25, or exactly it (a tie to even 0) */
  uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into the smallest normal */
  return (uint16_t)q;
}

uint16_t fsdp_f32_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* quiet NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* 65520 and up round past 65504: inf */
  if (a < 0x38800000u) return sign | f16_subnormal(a);
  a += 0xfffu + ((a >> 13) & 1u); /* nearest, ties to even; carries into the exponent */
  return sign | (uint16_t)((a - 0x38000000u) >> 13); /* rebias 127 -> 15 */
}

float fsdp_f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu, u;
  float f;
  if (e == 0x1fu) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    f = (float)m * 0x1p-24f; /* subnormal or zero: exact in f32 */
    memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  memcpy(&f, &u, sizeof f);
  return f;
}

double fsdp_time_now(void) {
  struct timespec ts;
  /* CLOCK_MONOTONIC cannot fail on Linux for a valid pointer; a zero clock is a
   * harmless fallback for the timeline rather than a reason to fail a step. */
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0.0;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- text ----------------------------------------------------------------- */

void fsdp_format_ranks(char *buf, size_t n, const int *r, int count) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < count && used < n; i++) {
    int j = i;
    while (j + 1 < count && r[j + 1] == r[j] + 1) j++;
    int w = j > i ? snprintf(buf + used, n - used, "%s%d-%d", i ? ", " : "", r[i], r[j])
                  : snprintf(buf + used, n - used, "%s%d", i ? ", " : "", r[i]);
    used += w > 0 ? (size_t)w : 0;
    i = j;
  }
}

/* ---- logging ------------------------------------------------------------- */

/* Written once by world init before any stream exists; read-only afterwards. */
static int log_rank = -1;

void fsdp_log_set_rank(int rank) { log_rank = rank; }

static fsdp_log_level_t log_level_from_env(void) {
  const char *s = getenv("FSDP_LOG_LEVEL");
  if (!s) return FSDP_LOG_WARN;
  if (strcmp(s, "error") == 0) return FSDP_LOG_ERROR;
  if (strcmp(s, "info") == 0) return FSDP_LOG_INFO;
  if (strcmp(s, "debug") == 0) return FSDP_LOG_DEBUG;
  return FSDP_LOG_WARN;
}

void fsdp_log(fsdp_log_level_t level, const char *fmt, ...) {
  static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  /* Read each time: cheap next to the I/O, and lets tests change it at run time. */
  if (level > log_level_from_env()) return;
  char msg[FSDP_ERROR_BUF];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* One fprintf per line so concurrent threads and ranks do not interleave. */
  if (log_rank >= 0)
    fprintf(stderr, "fsdp[%d] %s %s\n", log_rank, names[level], msg);
  else
    fprintf(stderr, "fsdp %s %s\n", names[level], msg);
}

/* ---- memory -------------------------------------------------------------- */

void *fsdp_alloc(size_t bytes) {
  if (bytes == 0) return NULL;
  /* Round up to the alignment (aligned_alloc requires a multiple); refuse sizes
   * where the rounding itself would wrap around. */
  if (bytes > SIZE_MAX - (FSDP_ALIGN - 1)) return NULL;
  size_t rounded = (bytes + FSDP_ALIGN - 1) & ~(size_t)(FSDP_ALIGN - 1);
  void *p = aligned_alloc(FSDP_ALIGN, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

void fsdp_free(void *p) { free(p); }

char *fsdp_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int fsdp_test_fault(const char *site, int rank) {
  const char *list = getenv("FSDP_TEST_FAULT");
  size_t n = strlen(site);
  for (const char *p = list; p && *p; p += strcspn(p, ","), p += *p == ',') {
    char *end = NULL;
    if (!strncmp(p, site, n) && p[n] == '@' && strtol(p + n + 1, &end, 10) == rank &&
        end != p + n + 1 && (*end == ',' || !*end))
      return 1;
  }
  return 0;
}

int fsdp_get_version(void) { return FSDP_VERSION_CODE; }

fsdp_status_t fsdp_opts_import(void *out, const void *in, size_t ours, unsigned int magic,
                               const char *what, const char *init_macro) {
  const fsdp_opts_head_t *h = in;
  if (h->magic != magic)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s was not initialised by %s (magic 0x%x, want 0x%x): start from "
                      "%s, then set the fields you need", what, init_macro, h->magic, magic,
                      init_macro);
  if (h->size < sizeof(fsdp_opts_head_t) || h->size > ours)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s has size %zu, this library's has %zu (version %d, caller's header %u): "
                      "%s", what, h->size, ours, FSDP_VERSION_CODE, h->version,
                      h->size > ours ? "link against the fsdp the program was compiled with"
                                     : "the struct is damaged");
  memcpy((char *)out + sizeof(fsdp_opts_head_t), (const char *)in + sizeof(fsdp_opts_head_t),
         h->size - sizeof(fsdp_opts_head_t));
  return FSDP_SUCCESS;
}
