/* bench/coll_bench.c — all-gather and reduce-scatter through fsdp's comm API,
 * in the nccl-tests mould: a size sweep, out-of-place and in-place, time,
 * algorithm and bus bandwidth, and a wrong-element count for every row; exit
 * status 1 when any element is wrong. Launch with mpirun -np N coll_bench ...
 * or fsdp-run --nproc-per-node N coll_bench ...
 *
 * Sizes are bytes of the whole (gathered) buffer, as in nccl-tests: a row of
 * size S moves count = S / sizeof(type) elements in all, S / N per rank.
 * algbw = S / time, busbw = algbw * (N - 1) / N for both collectives; time is
 * the mean over iterations of the slowest rank. Values are small integers, so
 * every sum is exact in every type and the check is bitwise.
 *
 * --backend picks the communicator measured (mpi, gloo, self or nccl) and
 * --device where its buffers live: cuda buffers come from fsdp_device_alloc on
 * device local_rank % devices and are filled and checked through host copies
 * outside the timed loop; with -s 1 the collectives are queued on a CUDA
 * stream (nccl enqueues, the host backends stage through pinned memory). The
 * bench's own bookkeeping (barriers, the slowest rank's time, wrong counts)
 * goes over a second communicator on the world's backend. */
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static const char usage_text[] =
    "usage: coll_bench [options]        launch with: mpirun -np N coll_bench ...\n"
    "                                   or fsdp-run --nproc-per-node N coll_bench ...\n"
    "  -b, --minbytes S     smallest buffer, bytes of the gathered whole (default 1K)\n"
    "  -e, --maxbytes S     largest (default 16M); K, M, G suffixes\n"
    "  -f, --stepfactor F   size multiplier between rows (default 4)\n"
    "  -n, --iters N        timed iterations per row (default 20)\n"
    "  -w, --warmup N       untimed iterations first (default 5)\n"
    "  -c, --check 0|1      check every row's result element by element (default 1)\n"
    "  -d, --datatype T     float (default), double, bfloat16 (sums exact up to 32 ranks)\n"
    "  -o, --op OP          reduce-scatter operation: sum (default) or max\n"
    "  -s, --stream 0|1     1: issue on a communication stream, as the engine does\n"
    "                       (default); 0: on the calling thread\n"
    "  --coll NAME          all_gather, reduce_scatter or all (default)\n"
    "  --backend NAME       communicator measured: mpi, gloo, self or nccl (default: the\n"
    "                       world's backend, as fsdp_comm_create gives)\n"
    "  --device cpu|cuda    where the buffers live (default: cuda with nccl, else cpu);\n"
    "                       cuda: device local_rank % devices, -s 1 queues on a CUDA stream\n"
    "  --json               one JSON document on stdout (rank 0) instead of the table\n"
    "  --json-file PATH     also write that document to PATH (the table still prints)\n"
    "Columns: size (B), count (elements in all), type, redop, time (us, mean of the\n"
    "slowest rank), algbw = size/time, busbw = algbw*(N-1)/N (GB/s), #wrong elements,\n"
    "out-of-place then in-place. Exit status 1 when any element is wrong.\n";

typedef enum { COLL_ALL_GATHER = 0, COLL_REDUCE_SCATTER } coll_t;
static const char *const coll_names[] = {"all_gather", "reduce_scatter"};

typedef struct {
  int64_t minbytes, maxbytes, iters, warmup, check, stream;
  double factor;
  fsdp_dtype_t dtype;
  fsdp_reduce_op_t op;
  int colls; /* bit mask of coll_t */
  const char *backend; /* NULL: the world's */
  int device;          /* fsdp_device_kind_t, or -1 until chosen */
  int json;
  const char *json_file; /* also write the JSON document here */
} coll_opts_t;

typedef struct {
  coll_t coll;
  size_t bytes, count;
  int inplace;
  double time_us, algbw, busbw;
  double wrong;
} coll_row_t;

typedef struct {
  fsdp_comm_t comm; /* measured */
  fsdp_comm_t ctrl; /* host reductions and barriers of the bench itself */
  fsdp_stream_t stream;
  fsdp_device_kind_t kind;
  int rank, nranks, ordinal; /* ordinal: the CUDA device, -1 on the CPU */
  void *send, *recv; /* each maxbytes, of kind */
  void *host;        /* maxbytes of host memory to fill and check device buffers */
} coll_ctx_t;

/* ---- flags ----------------------------------------------------------------- */

static int parse_word(const char *a, const char *v, coll_opts_t *o) {
  if (!strcmp(a, "-d") || !strcmp(a, "--datatype")) {
    if (!strcmp(v, "float") || !strcmp(v, "f32")) return o->dtype = FSDP_F32, 0;
    if (!strcmp(v, "double") || !strcmp(v, "f64")) return o->dtype = FSDP_F64, 0;
    if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) return o->dtype = FSDP_BF16, 0;
  } else if (!strcmp(a, "-o") || !strcmp(a, "--op")) {
    if (!strcmp(v, "sum")) return o->op = FSDP_SUM, 0;
    if (!strcmp(v, "max")) return o->op = FSDP_MAX, 0;
  } else if (!strcmp(a, "--coll")) {
    if (!strcmp(v, "all_gather")) return o->colls = 1 << COLL_ALL_GATHER, 0;
    if (!strcmp(v, "reduce_scatter")) return o->colls = 1 << COLL_REDUCE_SCATTER, 0;
    if (!strcmp(v, "all")) return o->colls = 3, 0;
  } else if (!strcmp(a, "--backend")) {
    return o->backend = v, 0;
  } else if (!strcmp(a, "--device")) {
    if (!strcmp(v, "cpu")) return o->device = FSDP_DEVICE_CPU, 0;
    if (!strcmp(v, "cuda")) return o->device = FSDP_DEVICE_CUDA, 0;
  } else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) {
    return bench_parse_double("coll_bench", a, v, &o->factor);
  } else {
    fprintf(stderr, "coll_bench: unknown flag %s (see --help)\n", a);
    return -1;
  }
  fprintf(stderr, "coll_bench: %s '%s' is not a valid value (see --help)\n", a, v);
  return -1;
}

static int parse(int argc, char **argv, coll_opts_t *o) {
  const struct { const char *s, *l; int64_t *p; int suffix; } nums[] = {
      {"-b", "--minbytes", &o->minbytes, 1}, {"-e", "--maxbytes", &o->maxbytes, 1},
      {"-n", "--iters", &o->iters, 0},       {"-w", "--warmup", &o->warmup, 0},
      {"-c", "--check", &o->check, 0},       {"-s", "--stream", &o->stream, 0}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return fputs(usage_text, stdout), 1;
    if (!strcmp(a, "--json")) {
      o->json = 1;
      continue;
    }
    if (!v) return fprintf(stderr, "coll_bench: %s needs a value (see --help)\n", a), -1;
    i++;
    if (!strcmp(a, "--json-file")) {
      o->json_file = v;
      continue;
    }
    size_t k = 0;
    while (k < sizeof nums / sizeof nums[0] && strcmp(a, nums[k].s) && strcmp(a, nums[k].l)) k++;
    if (k < sizeof nums / sizeof nums[0]) {
      if (bench_parse_i64("coll_bench", a, v, nums[k].suffix, nums[k].p)) return -1;
    } else if (parse_word(a, v, o)) {
      return -1;
    }
  }
  if (o->iters < 1 || o->factor <= 1.0 || o->minbytes < 1 || o->maxbytes < o->minbytes)
    return fprintf(stderr, "coll_bench: need -n >= 1, -f > 1 and 1 <= -b <= -e\n"), -1;
  int nccl = o->backend && !strcmp(o->backend, "nccl");
  if (nccl && o->device == FSDP_DEVICE_CPU)
    return fprintf(stderr, "coll_bench: --backend nccl takes CUDA device buffers, not "
                           "--device cpu\n"), -1;
  if (o->device < 0) o->device = nccl ? FSDP_DEVICE_CUDA : FSDP_DEVICE_CPU;
  return 0;
}

/* ---- data and checks ------------------------------------------------------- */

/* Element i of rank r's contribution: a small integer, exact in every type. */
static double value(int r, size_t i) { return (double)((int)((r * 5 + i * 7) % 17) - 8); }

static void store(void *buf, fsdp_dtype_t t, size_t i, double x) {
  if (t == FSDP_F32) ((float *)buf)[i] = (float)x;
  else if (t == FSDP_F64) ((double *)buf)[i] = x;
  else ((uint16_t *)buf)[i] = fsdp_f32_to_bf16((float)x);
}

static double load(const void *buf, fsdp_dtype_t t, size_t i) {
  if (t == FSDP_F32) return ((const float *)buf)[i];
  if (t == FSDP_F64) return ((const double *)buf)[i];
  return fsdp_bf16_to_f32(((const uint16_t *)buf)[i]);
}

static double expected(const coll_ctx_t *c, const coll_opts_t *o, coll_t coll, size_t per,
                       size_t i) {
  if (coll == COLL_ALL_GATHER) return value((int)(i / per), i % per);
  size_t g = (size_t)c->rank * per + i;
  double acc = value(0, g);
  for (int r = 1; r < c->nranks; r++) {
    double x = value(r, g);
    acc = o->op == FSDP_SUM ? acc + x : (x > acc ? x : acc);
  }
  return acc;
}

/* The buffers each variant reads and writes; in place as fsdp_comm allows. */
static void operands(const coll_ctx_t *c, coll_t coll, int inplace, size_t per, size_t esz,
                     void **send, void **recv) {
  char *s = c->send, *r = c->recv;
  if (!inplace) {
    *send = s;
    *recv = r;
  } else if (coll == COLL_ALL_GATHER) {
    *recv = r;
    *send = r + (size_t)c->rank * per * esz;
  } else {
    *send = s;
    *recv = s + (size_t)c->rank * per * esz;
  }
}

/* This rank's contribution into send (through c->host for device buffers). */
static fsdp_status_t fill(const coll_ctx_t *c, const coll_opts_t *o, coll_t coll, void *send,
                          size_t per) {
  size_t n = coll == COLL_ALL_GATHER ? per : per * (size_t)c->nranks;
  void *dst = c->kind == FSDP_DEVICE_CPU ? send : c->host;
  for (size_t i = 0; i < n; i++) store(dst, o->dtype, i, value(c->rank, i));
  if (dst == send) return FSDP_SUCCESS;
  return fsdp_device_copy(send, dst, n * fsdp_dtype_size(o->dtype), FSDP_HOST_STREAM);
}

static fsdp_status_t issue(const coll_ctx_t *c, const coll_opts_t *o, coll_t coll, void *send,
                           void *recv, size_t per) {
  fsdp_stream_t s = o->stream ? c->stream : FSDP_HOST_STREAM;
  if (coll == COLL_ALL_GATHER) return fsdp_all_gather(c->comm, send, recv, per, o->dtype, s);
  return fsdp_reduce_scatter(c->comm, send, recv, per, o->dtype, o->op, s);
}

static fsdp_status_t finish(const coll_ctx_t *c, const coll_opts_t *o) {
  return o->stream ? fsdp_stream_synchronize(c->stream) : FSDP_SUCCESS;
}

/* 1 when any rank failed: a rank that cannot go on makes every rank stop
 * (through ctrl) rather than leave the others waiting in a collective. */
static int agree(const coll_ctx_t *c, int failed) {
  double any = failed;
  if (bench_reduce(c->ctrl, &any, 1, FSDP_MAX) == FSDP_SUCCESS) return any != 0;
  fprintf(stderr, "coll_bench: rank %d: %s\n", c->rank, fsdp_last_error());
  return 1;
}

static int peer_failed; /* this rank stopped because another one failed */

/* The fill's status once every rank has filled: a rank whose copy failed
 * stops them all before the collective rather than leave them in it. */
static fsdp_status_t filled(const coll_ctx_t *c, fsdp_status_t st) {
  if (!agree(c, st != FSDP_SUCCESS)) return FSDP_SUCCESS;
  if (st == FSDP_SUCCESS) peer_failed = 1, st = FSDP_ERR_COMM;
  return st;
}

/* One collective on fresh data, then every element of this rank's result. */
static fsdp_status_t check_row(const coll_ctx_t *c, const coll_opts_t *o, coll_row_t *row,
                               size_t per, size_t esz) {
  void *send, *recv;
  operands(c, row->coll, row->inplace, per, esz, &send, &recv);
  BENCH_TRY(filled(c, fill(c, o, row->coll, send, per)));
  BENCH_TRY(issue(c, o, row->coll, send, recv, per));
  BENCH_TRY(finish(c, o));
  size_t n = row->coll == COLL_ALL_GATHER ? per * (size_t)c->nranks : per;
  const void *res = recv;
  if (c->kind != FSDP_DEVICE_CPU) {
    BENCH_TRY(fsdp_device_copy(c->host, recv, n * esz, FSDP_HOST_STREAM));
    res = c->host;
  }
  double wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong += load(res, o->dtype, i) != expected(c, o, row->coll, per, i);
  row->wrong = wrong;
  return bench_reduce(c->ctrl, &row->wrong, 1, FSDP_SUM);
}

/* ---- timing ---------------------------------------------------------------- */

static fsdp_status_t time_row(const coll_ctx_t *c, const coll_opts_t *o, coll_row_t *row,
                              size_t per, size_t esz) {
  void *send, *recv;
  operands(c, row->coll, row->inplace, per, esz, &send, &recv);
  BENCH_TRY(filled(c, fill(c, o, row->coll, send, per)));
  for (int64_t i = 0; i < o->warmup; i++) BENCH_TRY(issue(c, o, row->coll, send, recv, per));
  BENCH_TRY(finish(c, o));
  BENCH_TRY(fsdp_barrier(c->ctrl, FSDP_HOST_STREAM));
  double t0 = fsdp_time_now();
  for (int64_t i = 0; i < o->iters; i++) BENCH_TRY(issue(c, o, row->coll, send, recv, per));
  BENCH_TRY(finish(c, o));
  double secs = (fsdp_time_now() - t0) / (double)o->iters;
  BENCH_TRY(bench_reduce(c->ctrl, &secs, 1, FSDP_MAX));
  row->time_us = secs * 1e6;
  row->algbw = (double)row->bytes / secs / 1e9;
  row->busbw = row->algbw * (c->nranks - 1) / c->nranks;
  return FSDP_SUCCESS;
}

static fsdp_status_t run_row(const coll_ctx_t *c, const coll_opts_t *o, coll_row_t *row) {
  size_t esz = fsdp_dtype_size(o->dtype), per = row->count / (size_t)c->nranks;
  row->wrong = 0;
  if (o->check) BENCH_TRY(check_row(c, o, row, per, esz));
  return time_row(c, o, row, per, esz);
}

/* ---- output ---------------------------------------------------------------- */

/* "cpu" or "cuda:<ordinal>" (rank 0's; every rank takes local_rank % devices). */
static const char *device_name(const coll_ctx_t *c, char buf[32]) {
  if (c->kind == FSDP_DEVICE_CPU) return "cpu";
  snprintf(buf, 32, "cuda:%d", c->ordinal);
  return buf;
}

static void print_header(const coll_ctx_t *c, const coll_opts_t *o) {
  char dev[32];
  printf("# coll_bench: fsdp comm over %s, %d ranks, %s buffers | -b %lld -e %lld -f %g | %lld "
         "iterations after %lld warm-up | %s | check %s\n#\n",
         fsdp_comm_backend(c->comm), c->nranks, device_name(c, dev), (long long)o->minbytes,
         (long long)o->maxbytes, o->factor, (long long)o->iters, (long long)o->warmup,
         o->stream ? "communication stream" : "calling thread", o->check ? "on" : "off");
  printf("#%55s%33s%33s\n", "", "out-of-place", "in-place");
  printf("# %-14s %12s %12s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "collective", "size",
         "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
         "#wrong");
  printf("# %-14s %12s %12s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "", "(B)", "(elements)",
         "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static const char *redop_name(const coll_opts_t *o, coll_t coll) {
  return coll == COLL_ALL_GATHER ? "none" : o->op == FSDP_SUM ? "sum" : "max";
}

static void print_pair(const coll_opts_t *o, const coll_row_t *r) {
  printf("  %-14s %12zu %12zu %6s %6s", coll_names[r[0].coll], r[0].bytes, r[0].count,
         fsdp_dtype_name(o->dtype), redop_name(o, r[0].coll));
  for (int k = 0; k < 2; k++)
    printf(" %9.1f %7.2f %7.2f %6.0f", r[k].time_us, r[k].algbw, r[k].busbw, r[k].wrong);
  printf("\n");
  fflush(stdout);
}

static void print_json(FILE *f, const coll_ctx_t *c, const coll_opts_t *o, const coll_row_t *rows, int n,
                       double wrong, double avg_busbw) {
  bench_machine_t m;
  bench_machine(&m);
  char dev[32];
  fprintf(f, "{\"bench\":\"coll_bench\",\"backend\":\"%s\",\"device\":\"%s\",\"ranks\":%d,"
          "\"iters\":%lld,\"warmup\":%lld,\"stream\":%d,\"check\":%d,\"machine\":",
          fsdp_comm_backend(c->comm), device_name(c, dev), c->nranks, (long long)o->iters,
          (long long)o->warmup, (int)o->stream, (int)o->check);
  bench_machine_json(f, &m);
  fprintf(f, ",\"rows\":[");
  for (int i = 0; i < n; i++)
    fprintf(f, "%s\n{\"collective\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\","
           "\"inplace\":%d,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"wrong\":%.0f}",
           i ? "," : "", coll_names[rows[i].coll], rows[i].bytes, rows[i].count,
           fsdp_dtype_name(o->dtype), redop_name(o, rows[i].coll), rows[i].inplace,
           rows[i].time_us, rows[i].algbw, rows[i].busbw, rows[i].wrong);
  fprintf(f, "],\n\"wrong\":%.0f,\"avg_busbw\":%.4f}\n", wrong, avg_busbw);
}

/* ---- driver ---------------------------------------------------------------- */

static int count_rows(const coll_ctx_t *c, const coll_opts_t *o) {
  int n = 0;
  size_t unit = fsdp_dtype_size(o->dtype) * (size_t)c->nranks;
  for (double b = (double)o->minbytes; b <= (double)o->maxbytes; b *= o->factor)
    n += (size_t)b >= unit;
  return n;
}

static fsdp_status_t sweep(const coll_ctx_t *c, const coll_opts_t *o, coll_row_t *rows, int *n) {
  size_t esz = fsdp_dtype_size(o->dtype), unit = esz * (size_t)c->nranks;
  *n = 0;
  for (int coll = 0; coll < 2; coll++) {
    if (!(o->colls & (1 << coll))) continue;
    for (double b = (double)o->minbytes; b <= (double)o->maxbytes; b *= o->factor) {
      size_t bytes = (size_t)b / unit * unit;
      if (bytes == 0) continue;
      for (int inplace = 0; inplace < 2; inplace++) {
        coll_row_t *r = &rows[(*n)++];
        *r = (coll_row_t){(coll_t)coll, bytes, bytes / esz, inplace, 0, 0, 0, 0};
        BENCH_TRY(run_row(c, o, r));
      }
      if (c->rank == 0 && !o->json) print_pair(o, &rows[*n - 2]);
    }
  }
  return FSDP_SUCCESS;
}

/* Rank 0: the summary or the JSON, and the JSON file; 1 when that cannot be written. */
static int report(const coll_ctx_t *c, const coll_opts_t *o, const coll_row_t *rows, int n) {
  double wrong = 0, busbw = 0;
  for (int i = 0; i < n; i++) wrong += rows[i].wrong, busbw += rows[i].busbw;
  busbw = n ? busbw / n : 0;
  if (o->json)
    print_json(stdout, c, o, rows, n, wrong, busbw);
  else
    printf("# Out of bounds values : %.0f %s\n# Avg bus bandwidth    : %.4f GB/s\n#\n", wrong,
           wrong == 0 ? "OK" : "FAILED", busbw);
  if (!o->json_file) return 0;
  FILE *f = fopen(o->json_file, "w");
  if (f) print_json(f, c, o, rows, n, wrong, busbw);
  if (f && fclose(f) == 0) return 0;
  fprintf(stderr, "coll_bench: cannot write %s\n", o->json_file);
  return 1;
}

/* The buffers on every rank, or 1 on all when any rank lacks them (failed:
 * this rank already knows it cannot go on). */
static int allocate(coll_ctx_t *c, const coll_opts_t *o, int failed) {
  size_t bytes = (size_t)o->maxbytes + 64;
  fsdp_status_t st = failed ? FSDP_ERR_OUT_OF_MEMORY : fsdp_device_alloc(c->kind, bytes, &c->send);
  if (st == FSDP_SUCCESS) st = fsdp_device_alloc(c->kind, bytes, &c->recv);
  if (st == FSDP_SUCCESS && c->kind != FSDP_DEVICE_CPU)
    st = fsdp_device_alloc(FSDP_DEVICE_CPU, bytes, &c->host);
  if (st != FSDP_SUCCESS && !failed)
    fprintf(stderr, "coll_bench: rank %d: cannot allocate the %zu-byte buffers: %s\n", c->rank,
            bytes, fsdp_last_error());
  return agree(c, st != FSDP_SUCCESS);
}

static int run(coll_ctx_t *c, const coll_opts_t *o) {
  int max_rows = 4 * count_rows(c, o), n = 0;
  coll_row_t *rows = calloc((size_t)(max_rows ? max_rows : 1), sizeof *rows);
  if (!rows) fprintf(stderr, "coll_bench: rank %d: out of memory for %d rows\n", c->rank, max_rows);
  if (allocate(c, o, !rows)) return free(rows), 1;
  if (c->rank == 0 && !o->json) print_header(c, o);
  fsdp_status_t st = sweep(c, o, rows, &n);
  int bad = st == FSDP_SUCCESS && c->rank == 0 ? report(c, o, rows, n) : 0;
  if (st != FSDP_SUCCESS)
    fprintf(stderr, "coll_bench: rank %d: %s\n", c->rank,
            peer_failed ? "stopped: another rank could not fill its buffer" : fsdp_last_error());
  /* Every rank knows the (reduced) wrong counts; rank 0 alone knows its IO. */
  double wrong = 0;
  for (int i = 0; i < n; i++) wrong += rows[i].wrong;
  free(rows);
  return st != FSDP_SUCCESS || wrong != 0 || bad ? 1 : 0;
}

/* Device local_rank % devices for CUDA buffers; 0, or 1 after saying why. */
static int select_device(fsdp_world_t world, coll_ctx_t *c) {
  if (c->kind != FSDP_DEVICE_CUDA) return 0;
  int n = fsdp_cuda_device_count();
  if (n < 1)
    return fprintf(stderr, "coll_bench: rank %d: --device cuda: no usable CUDA device (fsdp "
                           "built without CUDA, or no GPU visible to this process)\n", c->rank), 1;
  c->ordinal = fsdp_world_local_rank(world) % n;
  if (fsdp_cuda_set_device(c->ordinal) == FSDP_SUCCESS) return 0;
  return fprintf(stderr, "coll_bench: rank %d: %s\n", c->rank, fsdp_last_error()), 1;
}

/* The device, the measured communicator (created by every rank or none: its
 * create is collective) and the stream the collectives are issued on. */
static int open_comm(fsdp_world_t world, const coll_opts_t *o, coll_ctx_t *c) {
  c->kind = (fsdp_device_kind_t)o->device;
  c->ordinal = -1;
  if (agree(c, select_device(world, c))) return 1;
  fsdp_status_t st = fsdp_comm_create_backend(world, o->backend, &c->comm);
  if (st == FSDP_SUCCESS)
    st = c->kind == FSDP_DEVICE_CUDA && o->stream
             ? fsdp_stream_create_cuda("coll-bench", 1, &c->stream)
             : fsdp_stream_create("coll-bench", &c->stream);
  if (st != FSDP_SUCCESS) fprintf(stderr, "coll_bench: rank %d: %s\n", c->rank, fsdp_last_error());
  return agree(c, st != FSDP_SUCCESS);
}

int main(int argc, char **argv) {
  coll_opts_t o = {1 << 10, 16 << 20, 20, 5, 1, 1, 4.0, FSDP_F32, FSDP_SUM, 3, NULL, -1, 0, NULL};
  int p = parse(argc, argv, &o);
  if (p) return p > 0 ? 0 : 2;
  coll_ctx_t c = {0};
  fsdp_world_t world = NULL;
  int rc = 1;
  if (fsdp_world_init(&world, NULL) || fsdp_comm_create(world, &c.ctrl)) {
    fprintf(stderr, "coll_bench: %s\n", fsdp_last_error());
    goto done;
  }
  c.rank = fsdp_comm_rank(c.ctrl);
  c.nranks = fsdp_comm_size(c.ctrl);
  /* bf16 holds every integer up to 256: the sums of up to 32 values in [-8, 8]. */
  if (o.dtype == FSDP_BF16 && (o.colls & (1 << COLL_REDUCE_SCATTER)) && c.nranks > 32) {
    if (c.rank == 0)
      fprintf(stderr, "coll_bench: -d bfloat16 reduce_scatter checks exact sums of up to 32 "
                      "ranks, not %d; use --coll all_gather or float\n", c.nranks);
    goto done;
  }
  if (open_comm(world, &o, &c) == 0) rc = run(&c, &o);
done:
  fsdp_stream_destroy(c.stream);
  fsdp_comm_destroy(c.comm);
  fsdp_comm_destroy(c.ctrl);
  fsdp_world_destroy(world);
  fsdp_device_free(c.kind, c.send);
  fsdp_device_free(c.kind, c.recv);
  fsdp_device_free(FSDP_DEVICE_CPU, c.host);
  return rc;
}
