/* bench/bench_util.h — what fsdp-bench and coll_bench share: flag values,
 * statistics over repeated measurements, the machine's description, resident
 * memory, and host-side reductions over the ranks of a communicator. */
#ifndef FSDP_BENCH_UTIL_H
#define FSDP_BENCH_UTIL_H

#include <stdio.h>

#include "fsdp/fsdp.h"

/* Returns a failing status to the caller (the library has set the message). */
#define BENCH_TRY(expr)                          \
  do {                                           \
    fsdp_status_t bench_try_st_ = (expr);        \
    if (bench_try_st_ != FSDP_SUCCESS) return bench_try_st_; \
  } while (0)

/* Median and spread of n samples (nearest-rank percentiles, linear between). */
typedef struct {
  double median, min, max, p10, p90;
} bench_stat_t;

bench_stat_t bench_stat(const double *x, int n);
/* "{"median":..,"min":..,"max":..,"p10":..,"p90":..}" with values times scale. */
void bench_stat_json(FILE *f, const bench_stat_t *s, double scale);

/* Parses a non-negative integer (with an optional K, M or G suffix when
 * suffix != 0) or a positive double; prints "<tool>: <flag> '<v>' is not ..."
 * and returns -1 when it is not one. */
int bench_parse_i64(const char *tool, const char *flag, const char *v, int suffix, int64_t *out);
int bench_parse_double(const char *tool, const char *flag, const char *v, double *out);

/* What the numbers were measured on: CPU model, cores online, BLAS build. */
typedef struct {
  char cpu[128];
  int cores;
  char blas[160];
} bench_machine_t;

void bench_machine(bench_machine_t *m);
void bench_machine_json(FILE *f, const bench_machine_t *m);
/* s as a JSON string: quotes and backslashes escaped, controls dropped. */
void bench_json_string(FILE *f, const char *s);

/* Resident set size of this process in bytes: now, and its high-water mark
 * since the last bench_rss_reset (Linux /proc/self/status VmRSS and VmHWM;
 * writing 5 to /proc/self/clear_refs resets the mark). */
size_t bench_rss_now(void);
size_t bench_rss_peak(void);
void bench_rss_reset(void);

/* CPU seconds: the whole machine busy (steal included; /proc/stat), and this
 * process (every thread) in user and system mode. */
double bench_cpu_busy(void);
double bench_cpu_self(void);

/* In-place host reductions of doubles over every rank of comm. */
fsdp_status_t bench_reduce(fsdp_comm_t comm, double *x, size_t n, fsdp_reduce_op_t op);

/* Strings from a list "a,b,c": up to max items, each at most 31 characters. */
int bench_split(const char *list, char items[][32], int max);

#endif
