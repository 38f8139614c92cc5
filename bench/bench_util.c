/* bench/bench_util.c — statistics, flag values, machine description, resident
 * memory and host reductions shared by the benches. */
#include "bench_util.h"

#include <cblas.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double percentile(const double *sorted, int n, double p) {
  double pos = p * (n - 1);
  int lo = (int)pos;
  if (lo >= n - 1) return sorted[n - 1];
  return sorted[lo] + (pos - lo) * (sorted[lo + 1] - sorted[lo]);
}

bench_stat_t bench_stat(const double *x, int n) {
  bench_stat_t s = {0, 0, 0, 0, 0};
  double *v = n > 0 ? malloc((size_t)n * sizeof *v) : NULL;
  if (!v) return s;
  memcpy(v, x, (size_t)n * sizeof *v);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  s = (bench_stat_t){percentile(v, n, 0.5), v[0], v[n - 1], percentile(v, n, 0.1),
                     percentile(v, n, 0.9)};
  free(v);
  return s;
}

void bench_stat_json(FILE *f, const bench_stat_t *s, double scale) {
  fprintf(f, "{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g,\"p10\":%.6g,\"p90\":%.6g}",
          s->median * scale, s->min * scale, s->max * scale, s->p10 * scale, s->p90 * scale);
}

int bench_parse_i64(const char *tool, const char *flag, const char *v, int suffix, int64_t *out) {
  char *end;
  errno = 0;
  long long x = v ? strtoll(v, &end, 10) : -1;
  if (!v || end == v || errno || x < 0) goto bad;
  if (suffix && (*end == 'K' || *end == 'k')) x <<= 10, end++;
  else if (suffix && (*end == 'M' || *end == 'm')) x <<= 20, end++;
  else if (suffix && (*end == 'G' || *end == 'g')) x <<= 30, end++;
  if (*end) goto bad;
  *out = x;
  return 0;
bad:
  fprintf(stderr, "%s: %s '%s' is not a non-negative integer%s\n", tool, flag, v ? v : "",
          suffix ? " (K, M, G suffixes allowed)" : "");
  return -1;
}

int bench_parse_double(const char *tool, const char *flag, const char *v, double *out) {
  char *end;
  errno = 0;
  double x = v ? strtod(v, &end) : -1.0;
  if (!v || end == v || *end || errno || !(x > 0.0)) {
    fprintf(stderr, "%s: %s '%s' is not a positive number\n", tool, flag, v ? v : "");
    return -1;
  }
  *out = x;
  return 0;
}

void bench_machine(bench_machine_t *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->cpu, sizeof m->cpu, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = 0;
    snprintf(m->cpu, sizeof m->cpu, "%s", colon);
    break;
  }
  if (f) fclose(f);
  m->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(m->blas, sizeof m->blas, "%s", openblas_get_config());
}

/* Writes s as a JSON string: quotes and backslashes escaped, controls dropped. */
void bench_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++)
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s >= 0x20) fputc(*s, f);
  fputc('"', f);
}

void bench_machine_json(FILE *f, const bench_machine_t *m) {
  fprintf(f, "{\"cpu\":");
  bench_json_string(f, m->cpu);
  fprintf(f, ",\"cores\":%d,\"blas\":", m->cores);
  bench_json_string(f, m->blas);
  fprintf(f, "}");
}

static size_t status_kib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  size_t kib = 0, n = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':') {
      kib = (size_t)strtoull(line + n + 1, NULL, 10);
      break;
    }
  if (f) fclose(f);
  return kib;
}

size_t bench_rss_now(void) { return status_kib("VmRSS") * 1024; }
size_t bench_rss_peak(void) { return status_kib("VmHWM") * 1024; }

void bench_rss_reset(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  fputs("5", f);
  fclose(f);
}

double bench_cpu_busy(void) {
  unsigned long long v[10] = {0};
  FILE *f = fopen("/proc/stat", "r");
  int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                     &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) : 0;
  if (f) fclose(f);
  if (n < 8) return 0.0;
  /* user nice system irq softirq steal; idle and iowait are not busy, guest
   * time is already inside user and nice. */
  double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
  return busy / (double)sysconf(_SC_CLK_TCK);
}

double bench_cpu_self(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

fsdp_status_t bench_reduce(fsdp_comm_t comm, double *x, size_t n, fsdp_reduce_op_t op) {
  return fsdp_all_reduce(comm, x, x, n, FSDP_F64, op, FSDP_HOST_STREAM);
}

int bench_split(const char *list, char items[][32], int max) {
  int n = 0;
  for (const char *p = list; p && *p && n < max;) {
    size_t len = strcspn(p, ",");
    if (len == 0 || len >= 32) return -1;
    memcpy(items[n], p, len);
    items[n++][len] = 0;
    p += len + (p[len] == ',');
  }
  return n;
}
