/* bench/bench_timeline.c — what the engine's timeline says about a step: time
 * in collectives, the part of it compute waited for, and the Chrome trace of
 * every rank's compute, gather and reduce tracks.
 *
 * Exposed communication: the host calls that can block on a collective are
 * acquire (waits for its unit's gather, or for a reduction still reading the
 * gradient buffer it is about to reuse), release (waits for the unit's previous
 * reduction before reusing its closure) and step (waits for every reduction).
 * For each such call [a, b], the wait is the time from a to the last end, inside
 * [a, b], of a collective it can wait for (acquire: a gather of the same unit or
 * any reduction; release and step: any reduction). A collective that finished
 * before the call started was hidden behind compute and counts nothing.
 *
 * On CUDA the host calls only queue work, and a host wait says nothing about
 * the GPU (the step's wait for the gradient norm spans the whole backward
 * still queued): exposed communication is the time the compute stream
 * itself stalled in its waits for collectives, as the engine times them
 * with CUDA events (FSDP_TL_COMPUTE_WAIT). */
#include <stdlib.h>
#include <string.h>

#include "fsdp_bench.h"

static int is_comm(const fsdp_tl_event_t *e) {
  return e->kind == FSDP_TL_ALL_GATHER || e->kind == FSDP_TL_REDUCE ||
         e->kind == FSDP_TL_REPLICA_REDUCE;
}

static int may_wait_for(const fsdp_tl_event_t *host, const fsdp_tl_event_t *c) {
  if (c->kind == FSDP_TL_REDUCE || c->kind == FSDP_TL_REPLICA_REDUCE) return 1;
  return c->kind == FSDP_TL_ALL_GATHER && host->kind == FSDP_TL_ACQUIRE && c->unit == host->unit;
}

static double host_wait(const fsdp_tl_event_t *h, const fsdp_tl_event_t *tl, size_t n) {
  double last = h->t_begin;
  for (size_t i = 0; i < n; i++)
    if (is_comm(&tl[i]) && tl[i].t_end >= h->t_begin && tl[i].t_end <= h->t_end &&
        tl[i].t_end > last && may_wait_for(h, &tl[i]))
      last = tl[i].t_end;
  return last - h->t_begin;
}

static int cmp_begin(const void *a, const void *b) {
  double x = ((const double *)a)[0], y = ((const double *)b)[0];
  return (x > y) - (x < y);
}

/* Length of the union of the collectives' spans clipped to [lo, hi]. */
static double comm_union(const fsdp_tl_event_t *tl, size_t n, double lo, double hi) {
  double(*span)[2] = malloc((n ? n : 1) * sizeof *span);
  size_t k = 0;
  if (!span) return 0.0;
  for (size_t i = 0; i < n; i++) {
    if (!is_comm(&tl[i])) continue;
    double a = tl[i].t_begin > lo ? tl[i].t_begin : lo, b = tl[i].t_end < hi ? tl[i].t_end : hi;
    if (b > a) span[k][0] = a, span[k++][1] = b;
  }
  qsort(span, k, sizeof *span, cmp_begin);
  double total = 0.0, end = lo;
  for (size_t i = 0; i < k; i++) {
    double a = span[i][0] > end ? span[i][0] : end;
    if (span[i][1] > a) total += span[i][1] - a;
    if (span[i][1] > end) end = span[i][1];
  }
  free(span);
  return total;
}

void bench_split_steps(const fsdp_tl_event_t *tl, size_t n, const bench_window_t *w, int steps,
                       int device_waits, bench_split_t *out) {
  for (int s = 0; s < steps; s++) {
    bench_split_t *p = &out[s];
    double lo = w[s].t_begin, hi = w[s].t_end;
    memset(p, 0, sizeof *p);
    p->step_s = hi - lo;
    for (size_t i = 0; i < n; i++) {
      const fsdp_tl_event_t *e = &tl[i];
      if (e->t_begin < lo || e->t_begin > hi) continue;
      double span = e->t_end - e->t_begin, bytes = (double)e->bytes;
      if (e->kind == FSDP_TL_ALL_GATHER) p->gather_s += span, p->gather_bytes += bytes;
      else if (e->kind == FSDP_TL_REDUCE && e->unit >= 0)
        p->reduce_s += span, p->reduce_bytes += bytes;
      else if (e->kind == FSDP_TL_REDUCE) p->reduce_s += span; /* the gradient norm */
      else if (e->kind == FSDP_TL_REPLICA_REDUCE) p->reduce_s += span, p->replica_bytes += bytes;
      else if (e->kind == FSDP_TL_COMPUTE_WAIT) p->exposed_s += device_waits ? span : 0.0;
      else if (!device_waits) p->exposed_s += host_wait(e, tl, n);
    }
    p->comm_s = comm_union(tl, n, lo, hi);
  }
}

/* ---- Chrome trace ------------------------------------------------------------ */

/* An event as 7 doubles, so every rank's timeline travels in one all-gather:
 * kind, unit, pass, stream, begin and end (us from the rank's origin), bytes.
 * Bench step windows travel as kind BENCH_ITER. */
enum { PACK = 7, BENCH_ITER = 100 };

static double *pack(const fsdp_tl_event_t *tl, size_t n, const bench_window_t *w, int steps,
                    double t0, size_t cap) {
  double *p = calloc(cap * PACK, sizeof *p);
  if (!p) return NULL;
  size_t k = 0;
  for (int s = 0; s < steps; s++, k++) {
    double *q = p + k * PACK;
    q[0] = BENCH_ITER, q[1] = s, q[4] = (w[s].t_begin - t0) * 1e6, q[5] = (w[s].t_end - t0) * 1e6;
  }
  for (size_t i = 0; i < n; i++, k++) {
    double *q = p + k * PACK;
    q[0] = tl[i].kind, q[1] = tl[i].unit, q[2] = tl[i].pass, q[3] = tl[i].stream;
    q[4] = (tl[i].t_begin - t0) * 1e6, q[5] = (tl[i].t_end - t0) * 1e6, q[6] = (double)tl[i].bytes;
  }
  for (; k < cap; k++) p[k * PACK] = -1; /* padding up to the largest rank's count */
  return p;
}

typedef struct {
  FILE *f;
  int first;
  fsdp_engine_t eng;
} trace_out_t;

static void span(trace_out_t *t, int rank, int tid, const char *cat, const char *name,
                 const char *unit, const char *pass, double b, double e, double bytes) {
  fprintf(t->f, "%s\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s%s%s\","
          "\"ts\":%.3f,\"dur\":%.3f,\"args\":{", t->first ? "" : ",", rank, tid, cat, name,
          unit ? " " : "", unit ? unit : "", b, e > b ? e - b : 0.0);
  int comma = 0;
  if (unit) fprintf(t->f, "\"unit\":\"%s\"", unit), comma = 1;
  if (pass) fprintf(t->f, "%s\"pass\":\"%s\"", comma ? "," : "", pass), comma = 1;
  if (bytes > 0) fprintf(t->f, "%s\"bytes\":%.0f", comma ? "," : "", bytes);
  fprintf(t->f, "}}");
  t->first = 0;
}

static const char *unit_name(fsdp_engine_t eng, int u) {
  fsdp_unit_info_t info;
  return u >= 0 && fsdp_unit_info(eng, u, &info) == FSDP_SUCCESS ? info.name : "?";
}

/* The compute span of a unit: from its acquire's end to its release's start. */
static void compute_spans(trace_out_t *t, int rank, const double *ev, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const double *a = ev + i * PACK;
    if (a[0] != FSDP_TL_ACQUIRE) continue;
    for (size_t j = i + 1; j < n; j++) {
      const double *r = ev + j * PACK;
      if (r[0] != FSDP_TL_RELEASE || r[1] != a[1] || r[2] != a[2] || r[4] < a[5]) continue;
      span(t, rank, 0, "compute", a[2] == FSDP_FORWARD ? "forward" : "backward",
           unit_name(t->eng, (int)a[1]), a[2] == FSDP_FORWARD ? "forward" : "backward", a[5],
           r[4], 0);
      break;
    }
  }
}

static void rank_events(trace_out_t *t, int rank, const double *ev, size_t n) {
  static const char *const kind_names[] = {"acquire", "release", "all_gather", "reduce_scatter",
                                           "optimizer step"};
  static const char *const cats[] = {"acquire", "release", "gather", "reduce", "optimizer"};
  static const int tids[] = {0, 0, 1, 2, 0};
  for (size_t i = 0; i < n; i++) {
    const double *q = ev + i * PACK;
    char it[32];
    if (q[0] == BENCH_ITER) {
      snprintf(it, sizeof it, "step %d", (int)q[1]);
      span(t, rank, 0, "step", it, NULL, NULL, q[4], q[5], 0);
    } else if (q[0] >= 0 && q[0] <= FSDP_TL_STEP) {
      int k = (int)q[0];
      int unit = k == FSDP_TL_STEP ? -1 : (int)q[1];
      int norm = k == FSDP_TL_REDUCE && unit < 0; /* the step's gradient-norm all-reduce */
      span(t, rank, norm ? 0 : tids[k], norm ? "grad_norm" : cats[k],
           norm ? "all_reduce (grad norm)" : kind_names[k],
           unit >= 0 ? unit_name(t->eng, unit) : NULL,
           k == FSDP_TL_STEP ? NULL : q[2] == FSDP_FORWARD ? "forward" : "backward", q[4], q[5],
           q[6]);
    }
  }
  compute_spans(t, rank, ev, n);
}

static void metadata(trace_out_t *t, int nranks) {
  static const char *const tracks[] = {"compute", "gather", "reduce"};
  for (int r = 0; r < nranks; r++) {
    fprintf(t->f, "%s\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":"
            "\"rank %d\"}}", t->first ? "" : ",", r, r);
    t->first = 0;
    for (int k = 0; k < 3; k++)
      fprintf(t->f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":"
              "{\"name\":\"%s\"}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":"
              "\"thread_sort_index\",\"args\":{\"sort_index\":%d}}", r, k, tracks[k], r, k, k);
  }
}

static fsdp_status_t write_file(fsdp_engine_t eng, const char *path, const double *all,
                                size_t cap, int nranks) {
  trace_out_t t = {fopen(path, "w"), 1, eng};
  if (!t.f) {
    fprintf(stderr, "fsdp-bench: cannot write the trace to %s\n", path);
    return FSDP_ERR_IO;
  }
  fprintf(t.f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"fsdp-bench\","
          "\"time_origin\":\"each rank's first timed step\"},\"traceEvents\":[");
  metadata(&t, nranks);
  for (int r = 0; r < nranks; r++) rank_events(&t, r, all + (size_t)r * cap * PACK, cap);
  fprintf(t.f, "\n]}\n");
  return fclose(t.f) == 0 ? FSDP_SUCCESS : FSDP_ERR_IO;
}

fsdp_status_t bench_trace_write(fsdp_engine_t eng, const char *path, const fsdp_tl_event_t *tl,
                                size_t n, const bench_window_t *w, int steps, double t0) {
  fsdp_comm_t comm = fsdp_engine_comm(eng);
  int nranks = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm);
  double cap = (double)(n + (size_t)steps);
  BENCH_TRY(bench_reduce(comm, &cap, 1, FSDP_MAX));
  double *mine = pack(tl, n, w, steps, t0, (size_t)cap);
  double *all = rank == 0 ? malloc((size_t)cap * PACK * nranks * sizeof *all) : NULL;
  double *recv = rank == 0 ? all : malloc((size_t)cap * PACK * nranks * sizeof *recv);
  fsdp_status_t st = mine && recv ? FSDP_SUCCESS : FSDP_ERR_OUT_OF_MEMORY;
  if (st == FSDP_SUCCESS)
    st = fsdp_all_gather(comm, mine, recv, (size_t)cap * PACK, FSDP_F64, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && rank == 0) st = write_file(eng, path, all, (size_t)cap, nranks);
  free(mine);
  free(recv);
  return st;
}
