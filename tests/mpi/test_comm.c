/* tests/mpi/test_comm.c — collectives against a serial reference on the
 * world's backend, at whatever rank count the launcher gives (1..4): mpi under
 * mpirun, gloo under fsdp-run. Every collective on the host stream and on a
 * worker stream, counts from 0 to 1<<20, SUM/AVG/MAX, f32/bf16/f64, in-place
 * forms, bf16 rounding within comm.h's bound, two communicators in flight on
 * two streams, argument errors that fail on every rank without hanging, the
 * self backend, backends by name, and the world each launcher makes.
 *
 * Data is a pure function of (rank, index, salt) with small integer values, so
 * each rank computes every other rank's contribution locally and sums are exact.
 * Tests count wrong elements and assert only after their last collective, so a
 * wrong result on one rank never leaves the others blocked. */
#include <check.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "core/internal.h"
#include "fsdp/fsdp.h"
#include "fsdp_config.h"

static fsdp_world_t world;
static int rank, nranks;

/* Fixtures: a communicator and a worker stream. The stream is fresh for every
 * test, so one test's sticky stream error never reaches the next. */
static fsdp_comm_t comm;
static fsdp_stream_t worker;

static void setup_comm(void) {
  ck_assert_msg(fsdp_comm_create(world, &comm) == FSDP_SUCCESS, "%s", fsdp_last_error());
}

static void teardown_comm(void) { fsdp_comm_destroy(comm); }

static void setup_stream(void) {
  ck_assert_int_eq(fsdp_stream_create("test-comm", &worker), FSDP_SUCCESS);
}

static void teardown_stream(void) { fsdp_stream_destroy(worker); }

static void setup(void) {
  setup_comm();
  setup_stream();
}

static void teardown(void) {
  teardown_stream();
  teardown_comm();
}

/* ---- data ---------------------------------------------------------------- */

static double val(int r, size_t i, int salt) {
  return (double)((int)(((size_t)r * 7 + (i % 1000003) * 3 + (size_t)salt) % 17) - 8);
}

static void put(void *b, fsdp_dtype_t dt, size_t i, double v) {
  if (dt == FSDP_F32) ((float *)b)[i] = (float)v;
  if (dt == FSDP_F64) ((double *)b)[i] = v;
  if (dt == FSDP_BF16) ((uint16_t *)b)[i] = fsdp_f32_to_bf16((float)v);
}

static double get(const void *b, fsdp_dtype_t dt, size_t i) {
  if (dt == FSDP_F32) return ((const float *)b)[i];
  if (dt == FSDP_F64) return ((const double *)b)[i];
  return fsdp_bf16_to_f32(((const uint16_t *)b)[i]);
}

/* n elements of dtype, filled with val(r, offset + i, salt). */
static void *filled(size_t n, fsdp_dtype_t dt, int r, size_t offset, int salt) {
  void *b = fsdp_alloc(n * fsdp_dtype_size(dt) + 64); /* never NULL, even for n == 0 */
  ck_assert_ptr_nonnull(b);
  for (size_t i = 0; i < n; i++) put(b, dt, i, val(r, offset + i, salt));
  return b;
}

static void *garbage(size_t n, fsdp_dtype_t dt) {
  void *b = fsdp_alloc(n * fsdp_dtype_size(dt) + 64);
  ck_assert_ptr_nonnull(b);
  for (size_t i = 0; i < n; i++) put(b, dt, i, 99.0);
  return b;
}

/* The reduction over ranks of element j, computed as the backend must. */
static double reference(fsdp_reduce_op_t op, fsdp_dtype_t dt, size_t j, int salt) {
  double acc = val(0, j, salt);
  for (int r = 1; r < nranks; r++)
    acc = op == FSDP_MAX ? (val(r, j, salt) > acc ? val(r, j, salt) : acc) : acc + val(r, j, salt);
  if (op != FSDP_AVG) return acc;
  if (dt == FSDP_F64) return acc * (1.0 / nranks);
  float avg = (float)acc * (float)(1.0 / nranks); /* partial sums are small integers: exact */
  return dt == FSDP_F32 ? avg : fsdp_bf16_to_f32(fsdp_f32_to_bf16(avg));
}

/* Issue has happened; on a worker stream, wait for it through an event. */
static fsdp_status_t finish(fsdp_status_t issued, fsdp_stream_t s) {
  if (issued != FSDP_SUCCESS || !s) return issued;
  fsdp_event_t e;
  ck_assert_int_eq(fsdp_event_create(&e), FSDP_SUCCESS);
  fsdp_event_record(e, s);
  fsdp_status_t st = fsdp_event_synchronize(e);
  fsdp_event_destroy(e);
  return st;
}

/* ---- case tables --------------------------------------------------------- */

static const size_t counts[] = {0, 1, 7, 1009, (size_t)1 << 20};
#define N_COUNTS (int)(sizeof counts / sizeof counts[0])
static const fsdp_reduce_op_t ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
static const fsdp_dtype_t any_types[] = {FSDP_F32, FSDP_BF16, FSDP_F64};
static const fsdp_dtype_t red_types[] = {FSDP_F32, FSDP_BF16, FSDP_F64};

typedef struct {
  size_t count;
  fsdp_dtype_t dtype;
  fsdp_reduce_op_t op;
  int on_stream;
  int in_place;
} coll_case_t;

/* Decodes a loop index into (count, dtype, op, stream, in-place). */
static coll_case_t decode(int i, const fsdp_dtype_t *types, int n_types, int n_ops) {
  coll_case_t c;
  c.count = counts[i % N_COUNTS];
  i /= N_COUNTS;
  c.dtype = types[i % n_types];
  i /= n_types;
  c.op = ops[i % n_ops];
  i /= n_ops;
  c.on_stream = i % 2;
  c.in_place = (i / 2) % 2;
  return c;
}

#define N_GATHER_CASES (N_COUNTS * 3 * 1 * 2 * 2)
#define N_REDUCE_CASES (N_COUNTS * 3 * 3 * 2 * 2)

/* ---- collectives --------------------------------------------------------- */

START_TEST(all_gather_matches_reference) {
  coll_case_t c = decode(_i, any_types, 3, 1);
  size_t es = fsdp_dtype_size(c.dtype), n = c.count;
  fsdp_stream_t s = c.on_stream ? worker : FSDP_HOST_STREAM;
  char *recv = garbage(n * (size_t)nranks, c.dtype);
  void *own = filled(n, c.dtype, rank, 0, 1);
  const void *send = own;
  if (c.in_place) {
    memcpy(recv + (size_t)rank * n * es, own, n * es);
    send = recv + (size_t)rank * n * es;
  }
  fsdp_status_t st = finish(fsdp_all_gather(comm, send, recv, n, c.dtype, s), s);
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) wrong += get(recv, c.dtype, (size_t)r * n + i) != val(r, i, 1);
  fsdp_free(own);
  fsdp_free(recv);
  ck_assert_msg(st == FSDP_SUCCESS, "all_gather failed: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "all_gather %zu %s stream=%d in_place=%d: %zu wrong", n,
                fsdp_dtype_name(c.dtype), c.on_stream, c.in_place, wrong);
}
END_TEST

START_TEST(reduce_scatter_matches_reference) {
  coll_case_t c = decode(_i, red_types, 3, 3);
  size_t es = fsdp_dtype_size(c.dtype), n = c.count;
  fsdp_stream_t s = c.on_stream ? worker : FSDP_HOST_STREAM;
  char *send = filled(n * (size_t)nranks, c.dtype, rank, 0, 2);
  char *own = garbage(n, c.dtype);
  void *recv = c.in_place ? send + (size_t)rank * n * es : own;
  fsdp_status_t st = finish(fsdp_reduce_scatter(comm, send, recv, n, c.dtype, c.op, s), s);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong += get(recv, c.dtype, i) != reference(c.op, c.dtype, (size_t)rank * n + i, 2);
  fsdp_free(own);
  fsdp_free(send);
  ck_assert_msg(st == FSDP_SUCCESS, "reduce_scatter failed: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "reduce_scatter %zu %s op=%d stream=%d in_place=%d: %zu wrong", n,
                fsdp_dtype_name(c.dtype), (int)c.op, c.on_stream, c.in_place, wrong);
}
END_TEST

START_TEST(all_reduce_matches_reference) {
  coll_case_t c = decode(_i, red_types, 3, 3);
  size_t n = c.count;
  fsdp_stream_t s = c.on_stream ? worker : FSDP_HOST_STREAM;
  void *send = filled(n, c.dtype, rank, 0, 3);
  void *own = garbage(n, c.dtype);
  void *recv = c.in_place ? send : own;
  fsdp_status_t st = finish(fsdp_all_reduce(comm, send, recv, n, c.dtype, c.op, s), s);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += get(recv, c.dtype, i) != reference(c.op, c.dtype, i, 3);
  fsdp_free(own);
  fsdp_free(send);
  ck_assert_msg(st == FSDP_SUCCESS, "all_reduce failed: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "all_reduce %zu %s op=%d stream=%d in_place=%d: %zu wrong", n,
                fsdp_dtype_name(c.dtype), (int)c.op, c.on_stream, c.in_place, wrong);
}
END_TEST

START_TEST(broadcast_from_each_root) {
  coll_case_t c = decode(_i, any_types, 3, 1);
  size_t n = c.count, wrong = 0;
  fsdp_stream_t s = c.on_stream ? worker : FSDP_HOST_STREAM;
  fsdp_status_t st = FSDP_SUCCESS;
  for (int root = 0; root < nranks && st == FSDP_SUCCESS; root++) {
    void *buf = rank == root ? filled(n, c.dtype, root, 0, root) : garbage(n, c.dtype);
    st = finish(fsdp_broadcast(comm, buf, n, c.dtype, root, s), s);
    for (size_t i = 0; i < n; i++) wrong += get(buf, c.dtype, i) != val(root, i, root);
    fsdp_free(buf);
  }
  ck_assert_msg(st == FSDP_SUCCESS, "broadcast failed: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "broadcast %zu %s stream=%d: %zu wrong", n,
                fsdp_dtype_name(c.dtype), c.on_stream, wrong);
}
END_TEST

START_TEST(barrier_on_host_and_stream) {
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
  ck_assert_int_eq(finish(fsdp_barrier(comm, worker), worker), FSDP_SUCCESS);
  /* Many queued barriers drain in order without deadlock. */
  for (int i = 0; i < 100; i++) ck_assert_int_eq(fsdp_barrier(comm, worker), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(worker), FSDP_SUCCESS);
}
END_TEST

/* ---- bf16 rounding -------------------------------------------------------- */

/* Rank r's bf16 input at index i: both signs, magnitudes 2^-7 .. 2^6, full
 * mantissas, so sums round. */
static uint16_t random_bf16(int r, size_t i) {
  uint64_t x = ((uint64_t)r << 40 ^ i) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  double v = ldexp(0.5 + (double)(x & 0xffffff) / 0x1000000, (int)((x >> 24) % 14) - 6);
  return fsdp_f32_to_bf16((float)((x >> 40) & 1 ? -v : v));
}

/* The error bound of comm.h for k roundings to bf16 (unit roundoff u = 2^-8)
 * of a reduction whose contributions have magnitudes summing to `mass`:
 * ((1 + u)^k - 1) * mass. SUM rounds N-1 times; AVG once more when 1/N is
 * not a power of two, plus fp32's 2^-24 for 1/N and for the product. */
static double bf16_bound(fsdp_reduce_op_t op, double mass) {
  double u = ldexp(1.0, -8);
  if (op == FSDP_MAX) return 0.0;
  int pow2 = (nranks & (nranks - 1)) == 0;
  int k = nranks - 1 + (op == FSDP_AVG && !pow2);
  double fp32 = op == FSDP_AVG && !pow2 ? 1.0 + ldexp(1.0, -23) : 1.0;
  return (pow(1.0 + u, k) * fp32 - 1.0) * mass / (op == FSDP_AVG ? nranks : 1);
}

enum { N_RANDOM = 100003 };

/* Random inputs: bf16 SUM and AVG agree with the exact (double) reduction of
 * the same bf16 inputs within bf16_bound, MAX exactly; with one rank the
 * bound is 0 and the result is the input bit for bit. */
START_TEST(bf16_reduction_within_rounding_bound) {
  fsdp_reduce_op_t op = ops[_i % 3];
  int all_reduce = (_i / 3) % 2;
  fsdp_stream_t s = _i / 6 ? worker : FSDP_HOST_STREAM;
  size_t n = N_RANDOM, total = all_reduce ? n : n * (size_t)nranks;
  size_t off = all_reduce ? 0 : (size_t)rank * n;
  uint16_t *send = fsdp_alloc(total * sizeof *send), *recv = fsdp_alloc(n * sizeof *recv);
  ck_assert(send && recv);
  for (size_t i = 0; i < total; i++) send[i] = random_bf16(rank, i);
  fsdp_status_t st = all_reduce ? fsdp_all_reduce(comm, send, recv, n, FSDP_BF16, op, s)
                                : fsdp_reduce_scatter(comm, send, recv, n, FSDP_BF16, op, s);
  st = finish(st, s);
  size_t wrong = 0;
  double worst = 0.0; /* largest error as a fraction of its bound */
  for (size_t i = 0; i < n && st == FSDP_SUCCESS; i++) {
    double exact = 0.0, mass = 0.0, max = -INFINITY;
    for (int r = 0; r < nranks; r++) {
      double x = fsdp_bf16_to_f32(random_bf16(r, off + i));
      exact += x, mass += fabs(x), max = x > max ? x : max;
    }
    exact = op == FSDP_MAX ? max : op == FSDP_AVG ? exact / nranks : exact;
    double err = fabs(fsdp_bf16_to_f32(recv[i]) - exact), bound = bf16_bound(op, mass);
    wrong += err > bound;
    if (bound > 0 && err / bound > worst) worst = err / bound;
  }
  fsdp_free(send);
  fsdp_free(recv);
  ck_assert_msg(st == FSDP_SUCCESS, "bf16 reduction failed: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "bf16 %s op=%d at %d ranks: %zu of %zu outside the bound (worst "
                "%.3g of it)", all_reduce ? "all_reduce" : "reduce_scatter", (int)op, nranks,
                wrong, n, worst);
}
END_TEST

/* ---- two communicators on two streams ------------------------------------ */

enum { N_ITER = 64, N_ELEM = 257 };

/* Gathers on one stream and reduce-scatters on another, interleaved, then a
 * reduce-scatter of a gathered buffer that must wait for the gather stream: the
 * FSDP backward pattern. */
START_TEST(two_comms_on_two_streams) {
  fsdp_comm_t rs_comm;
  fsdp_stream_t rs_stream = worker, ag_stream;
  ck_assert_int_eq(fsdp_comm_dup(comm, &rs_comm), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create("ag", &ag_stream), FSDP_SUCCESS);
  size_t n = N_ELEM, full = n * (size_t)nranks;
  float *ag_send[N_ITER], *ag_recv[N_ITER], *rs_send[N_ITER], *rs_recv[N_ITER];
  for (int it = 0; it < N_ITER; it++) {
    ag_send[it] = filled(n, FSDP_F32, rank, 0, it);
    ag_recv[it] = garbage(full, FSDP_F32);
    rs_send[it] = filled(full, FSDP_F32, rank, 0, 100 + it);
    rs_recv[it] = garbage(n, FSDP_F32);
    ck_assert_int_eq(fsdp_all_gather(comm, ag_send[it], ag_recv[it], n, FSDP_F32, ag_stream),
                     FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_reduce_scatter(rs_comm, rs_send[it], rs_recv[it], n, FSDP_F32,
                                         FSDP_SUM, rs_stream), FSDP_SUCCESS);
  }
  fsdp_event_t gathered;
  float *chain = garbage(n, FSDP_F32);
  ck_assert_int_eq(fsdp_event_create(&gathered), FSDP_SUCCESS);
  fsdp_event_record(gathered, ag_stream);
  fsdp_stream_wait_event(rs_stream, gathered);
  fsdp_reduce_scatter(rs_comm, ag_recv[N_ITER - 1], chain, n, FSDP_F32, FSDP_SUM, rs_stream);
  fsdp_status_t st_ag = fsdp_stream_synchronize(ag_stream);
  fsdp_status_t st_rs = fsdp_stream_synchronize(rs_stream);

  size_t wrong = 0;
  for (int it = 0; it < N_ITER; it++)
    for (size_t i = 0; i < n; i++) {
      for (int r = 0; r < nranks; r++) wrong += ag_recv[it][(size_t)r * n + i] != val(r, i, it);
      wrong += rs_recv[it][i] != reference(FSDP_SUM, FSDP_F32, (size_t)rank * n + i, 100 + it);
    }
  /* Every rank gathered the same buffer, so each slot sums to nranks x it. */
  for (size_t i = 0; i < n; i++) wrong += chain[i] != nranks * val(rank, i, N_ITER - 1);
  for (int it = 0; it < N_ITER; it++) {
    fsdp_free(ag_send[it]);
    fsdp_free(ag_recv[it]);
    fsdp_free(rs_send[it]);
    fsdp_free(rs_recv[it]);
  }
  fsdp_free(chain);
  fsdp_event_destroy(gathered);
  fsdp_stream_destroy(ag_stream);
  fsdp_comm_destroy(rs_comm);
  ck_assert_int_eq(st_ag, FSDP_SUCCESS);
  ck_assert_int_eq(st_rs, FSDP_SUCCESS);
  ck_assert_msg(wrong == 0, "%zu wrong elements", wrong);
}
END_TEST

/* ---- argument errors ----------------------------------------------------- */

typedef struct {
  fsdp_status_t want;
  const char *says; /* a word the message must contain */
} expect_t;

static void expect_error(fsdp_status_t got, expect_t e, const char *what) {
  ck_assert_msg(got == e.want, "%s: got %s, want %s", what, fsdp_status_string(got),
                fsdp_status_string(e.want));
  ck_assert_msg(strstr(fsdp_last_error(), e.says), "%s: message '%s' lacks '%s'", what,
                fsdp_last_error(), e.says);
}

START_TEST(invalid_arguments_fail_on_every_rank) {
  fsdp_stream_t s = _i ? worker : FSDP_HOST_STREAM;
  float a[8] = {0}, b[8] = {0};
  const expect_t bad_arg_root = {FSDP_ERR_INVALID_ARGUMENT, "root"};
  expect_error(fsdp_broadcast(comm, a, 4, FSDP_F32, -1, s), bad_arg_root, "root -1");
  expect_error(fsdp_broadcast(comm, a, 4, FSDP_F32, nranks, s), bad_arg_root, "root = size");
  char bad_dtype[32]; /* the first value past the dtypes, however many there are */
  snprintf(bad_dtype, sizeof bad_dtype, "dtype %d", (int)FSDP_DTYPE_COUNT);
  expect_error(fsdp_reduce_scatter(comm, a, b, 1, FSDP_DTYPE_COUNT, FSDP_AVG, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, bad_dtype}, "bad reduction dtype");
  expect_error(fsdp_all_reduce(comm, a, b, 4, FSDP_F32, (fsdp_reduce_op_t)9, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "op 9"}, "bad op");
  expect_error(fsdp_all_gather(comm, a, b, 1, (fsdp_dtype_t)9, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "dtype 9"}, "bad dtype");
  expect_error(fsdp_all_gather(comm, NULL, b, 1, FSDP_F32, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "NULL"}, "null send");
  expect_error(fsdp_all_reduce(NULL, a, b, 1, FSDP_F32, FSDP_SUM, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "comm"}, "null comm");
  expect_error(fsdp_comm_set_cancel_on_failure(NULL, 0),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "comm is NULL"}, "null comm to exempt");
  expect_error(fsdp_all_reduce(comm, a + 1, a, 4, FSDP_F32, FSDP_SUM, s),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "overlap"}, "aliased buffers");
  expect_error(fsdp_broadcast(comm, a, (size_t)INT_MAX + 1, FSDP_F32, 0, s),
               (expect_t){FSDP_ERR_UNSUPPORTED, "limit"}, "count > INT_MAX");
  /* Nothing was queued and nobody is stuck: a real collective still works. */
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_SUCCESS);
  float one = 1.0f, total = 0.0f;
  ck_assert_int_eq(finish(fsdp_all_reduce(comm, &one, &total, 1, FSDP_F32, FSDP_SUM, s), s),
                   FSDP_SUCCESS);
  ck_assert(total == (float)nranks);
}
END_TEST

/* ---- self backend -------------------------------------------------------- */

START_TEST(self_backend_copies_in_order) {
  fsdp_world_opts_t o = FSDP_WORLD_OPTS_INIT;
  o.launch = FSDP_LAUNCH_SINGLE;
  fsdp_world_t solo;
  fsdp_comm_t c, d;
  ck_assert_int_eq(fsdp_world_init(&solo, &o), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_world_backend(solo), "self");
  ck_assert_int_eq(fsdp_comm_create(solo, &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_comm_dup(c, &d), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_comm_backend(d), "self");
  ck_assert_int_eq(fsdp_comm_size(d), 1);
  ck_assert_int_eq(fsdp_comm_rank(d), 0);
  fsdp_stream_t s = _i ? worker : FSDP_HOST_STREAM;
  double x[5] = {1, -2, 3, -4, 5}, y[5] = {0}, z[5] = {0}, w[5] = {0};
  ck_assert_int_eq(fsdp_all_gather(d, x, y, 5, FSDP_F64, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_reduce_scatter(d, x, z, 5, FSDP_F64, FSDP_AVG, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_all_reduce(d, x, w, 5, FSDP_F64, FSDP_MAX, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_all_reduce(d, x, x, 5, FSDP_F64, FSDP_SUM, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_broadcast(d, x, 5, FSDP_F64, 0, s), FSDP_SUCCESS);
  ck_assert_int_eq(finish(fsdp_barrier(d, s), s), FSDP_SUCCESS);
  for (int i = 0; i < 5; i++) {
    ck_assert(y[i] == x[i] && z[i] == x[i] && w[i] == x[i]);
  }
  ck_assert_int_eq(fsdp_broadcast(d, x, 5, FSDP_F64, 1, s), FSDP_ERR_INVALID_ARGUMENT);
  uint16_t h[3] = {fsdp_f32_to_bf16(1.5f), fsdp_f32_to_bf16(-3.0f), 0x7f80 /* inf */}, g[3];
  ck_assert_int_eq(fsdp_all_reduce(d, h, g, 3, FSDP_BF16, FSDP_AVG, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_SUCCESS);
  ck_assert(memcmp(h, g, sizeof h) == 0);
  fsdp_comm_destroy(d);
  fsdp_comm_destroy(c);
  fsdp_world_destroy(solo);
}
END_TEST

/* ---- backends by name ---------------------------------------------------- */

/* The backend the launcher implies: fsdp-run's torchrun variables (without
 * an MPI launcher's), else mpi. The suite runs under these two only. */
static const char *launcher_backend(void) {
  int mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
  return !mpi && getenv("MASTER_ADDR") && getenv("WORLD_SIZE") ? "gloo" : "mpi";
}

START_TEST(backend_by_name) {
  const char *own = launcher_backend(), *other = strcmp(own, "mpi") ? "mpi" : "gloo";
  fsdp_comm_t c = NULL;
  ck_assert_int_eq(fsdp_comm_create_backend(world, NULL, &c), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_comm_backend(c), own);
  fsdp_comm_destroy(c);
  ck_assert_msg(fsdp_comm_create_backend(world, own, &c) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_str_eq(fsdp_comm_backend(c), own);
  fsdp_comm_destroy(c);
  /* A one-rank world may use "self"; a larger one may not. */
  fsdp_status_t st = fsdp_comm_create_backend(world, "self", &c);
  if (nranks == 1) {
    ck_assert_int_eq(st, FSDP_SUCCESS);
    ck_assert_str_eq(fsdp_comm_backend(c), "self");
    fsdp_comm_destroy(c);
  } else {
    expect_error(st, (expect_t){FSDP_ERR_UNSUPPORTED, "'self' is not available"}, "self");
  }
  char offers[32];
  snprintf(offers, sizeof offers, "offers: %s", own);
  expect_error(fsdp_comm_create_backend(world, other, &c),
               (expect_t){FSDP_ERR_UNSUPPORTED, offers}, "the other launcher's backend");
  expect_error(fsdp_comm_create_backend(world, "nvlink", &c),
               (expect_t){FSDP_ERR_INVALID_ARGUMENT, "unknown backend 'nvlink'"}, "unknown");
#if FSDP_HAVE_NCCL
  /* Without a GPU NCCL fails on every rank, after the id went round. */
  if (fsdp_cuda_device_count() == 0)
    expect_error(fsdp_comm_create_backend(world, "nccl", &c),
                 (expect_t){FSDP_ERR_COMM, "nccl"}, "nccl without a GPU");
#else
  expect_error(fsdp_comm_create_backend(world, "nccl", &c),
               (expect_t){FSDP_ERR_UNSUPPORTED, "built without NCCL"}, "nccl not built");
#endif
  /* Nobody is stuck: the fixture's communicator still works. */
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
}
END_TEST

/* Communicators created and destroyed back to back, with no collective
 * between: create returns on every rank only when all of them are connected,
 * so a rank that destroys at once never breaks a peer still connecting. */
START_TEST(comms_created_and_destroyed_back_to_back) {
  fsdp_status_t st = FSDP_SUCCESS;
  for (int i = 0; i < 40 && st == FSDP_SUCCESS; i++) {
    fsdp_comm_t c = NULL;
    st = fsdp_comm_create(world, &c);
    fsdp_comm_destroy(c);
  }
  ck_assert_msg(st == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
}
END_TEST

/* Two groups by parity, ranked in reverse by key: each group sums and
 * gathers its own ranks only, on the host and on a stream, and a dup of a
 * group is the same group. */
START_TEST(split_into_groups) {
  fsdp_comm_t g = NULL, d = NULL;
  ck_assert_msg(fsdp_comm_split(comm, rank % 2, -rank, &g) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  int size = (nranks - rank % 2 + 1) / 2; /* ranks of my parity */
  ck_assert_int_eq(fsdp_comm_size(g), size);
  ck_assert_int_eq(fsdp_comm_rank(g), size - 1 - rank / 2); /* key -rank: reversed */
  ck_assert_int_eq(fsdp_comm_dup(g, &d), FSDP_SUCCESS);
  float mine = (float)rank, sum = 0, all[4] = {0};
  ck_assert_int_eq(fsdp_all_reduce(g, &mine, &sum, 1, FSDP_F32, FSDP_SUM, FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_all_gather(d, &mine, all, 1, FSDP_F32, worker), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(worker), FSDP_SUCCESS);
  float want = 0;
  for (int r = rank % 2; r < nranks; r += 2) want += (float)r;
  ck_assert_float_eq(sum, want);
  for (int i = 0; i < size; i++) /* group rank i is world rank of parity, largest first */
    ck_assert_float_eq(all[i], (float)(rank % 2 + 2 * (size - 1 - i)));
  /* A split of a group: halves of my parity group, by group rank. */
  fsdp_comm_t h = NULL;
  int gr = fsdp_comm_rank(g), half = gr < (size + 1) / 2;
  ck_assert_int_eq(fsdp_comm_split(g, half, gr, &h), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_comm_size(h), half ? (size + 1) / 2 : size / 2);
  float hsum = 0, hwant = 0;
  ck_assert_int_eq(fsdp_all_reduce(h, &mine, &hsum, 1, FSDP_F32, FSDP_SUM, FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  for (int i = 0; i < size; i++) /* group rank i is world rank rank % 2 + 2 (size - 1 - i) */
    if ((i < (size + 1) / 2) == half) hwant += (float)(rank % 2 + 2 * (size - 1 - i));
  ck_assert_float_eq(hsum, hwant);
  fsdp_comm_destroy(h);
  fsdp_comm_destroy(d);
  fsdp_comm_destroy(g);
  ck_assert_int_eq(fsdp_comm_split(comm, -1, 0, &g), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "colour -1"));
}
END_TEST

/* A split that fails on one rank fails on every rank, promptly and naming
 * that rank: a failure of its local allocations before any exchange
 * (FSDP_TEST_FAULT comm_split), and of its new communicator after the
 * backend made it (comm_split_setup). No rank keeps a group, and a split
 * afterwards works (the ranks still agree on communicator ids). */
START_TEST(split_failure_is_collective) {
  static const char *const sites[] = {"comm_split", "comm_split_setup"};
  const int bad = nranks - 1;
  for (int s = 0; s < 2; s++) {
    char spec[64], who[32];
    snprintf(spec, sizeof spec, "%s@%d", sites[s], bad);
    snprintf(who, sizeof who, "rank %d", bad);
    setenv("FSDP_TEST_FAULT", spec, 1);
    fsdp_comm_t g = NULL;
    fsdp_status_t st = fsdp_comm_split(comm, rank % 2, rank, &g);
    unsetenv("FSDP_TEST_FAULT");
    ck_assert_msg(st != FSDP_SUCCESS && !g, "%s: the split succeeded on rank %d", spec, rank);
    if (rank != bad)
      ck_assert_msg(st == FSDP_ERR_COMM && strstr(fsdp_last_error(), who), "%s: rank %d: %s "
                    "(%s)", spec, rank, fsdp_last_error(), fsdp_status_string(st));
  }
  fsdp_comm_t g = NULL;
  ck_assert_msg(fsdp_comm_split(comm, rank % 2, rank, &g) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  float mine = 1.0f, sum = 0.0f;
  ck_assert_int_eq(fsdp_all_reduce(g, &mine, &sum, 1, FSDP_F32, FSDP_SUM, FSDP_HOST_STREAM),
                   FSDP_SUCCESS);
  ck_assert_float_eq(sum, (float)fsdp_comm_size(g));
  fsdp_comm_destroy(g);
}
END_TEST

/* ---- world --------------------------------------------------------------- */

START_TEST(world_reports_launcher_layout) {
  const char *own = launcher_backend();
  ck_assert_str_eq(fsdp_world_backend(world), own);
  ck_assert_str_eq(fsdp_comm_backend(comm), own);
  if (!strcmp(own, "mpi")) {
    const char *size = getenv("OMPI_COMM_WORLD_SIZE");
    if (size) ck_assert_int_eq(nranks, atoi(size));
  } else { /* fsdp-run's torchrun variables */
    ck_assert_int_eq(nranks, atoi(getenv("WORLD_SIZE")));
    ck_assert_int_eq(rank, atoi(getenv("RANK")));
    ck_assert_int_eq(fsdp_world_local_rank(world), atoi(getenv("LOCAL_RANK")));
  }
  ck_assert_int_ge(rank, 0);
  ck_assert_int_lt(rank, nranks);
  /* The test suite starts every rank on this one node. */
  ck_assert_int_eq(fsdp_world_local_size(world), nranks);
  ck_assert_int_eq(fsdp_world_local_rank(world), rank);
  ck_assert_int_eq(fsdp_comm_size(comm), nranks);
  ck_assert_int_eq(fsdp_comm_rank(comm), rank);
}
END_TEST

/* env:// rendezvous once per process; a single-rank world still works. */
static void check_env_world_is_once(void) {
  fsdp_world_t again = NULL;
  ck_assert_int_eq(fsdp_world_init(&again, NULL), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "already has an env:// world"));
  fsdp_world_opts_t solo = FSDP_WORLD_OPTS_INIT;
  solo.launch = FSDP_LAUNCH_SINGLE;
  ck_assert_int_eq(fsdp_world_init(&again, &solo), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_world_backend(again), "self");
  fsdp_world_destroy(again);
}

START_TEST(world_checks_expected_size) {
  if (strcmp(launcher_backend(), "mpi")) {
    check_env_world_is_once();
    return;
  }
  fsdp_world_opts_t o = FSDP_WORLD_OPTS_INIT;
  fsdp_world_t w = NULL;
  o.expected_world_size = nranks;
  ck_assert_int_eq(fsdp_world_init(&w, &o), FSDP_SUCCESS); /* MPI already up: shared */
  ck_assert_int_eq(fsdp_world_size(w), nranks);
  fsdp_world_destroy(w);
  o.expected_world_size = nranks + 1;
  ck_assert_int_eq(fsdp_world_init(&w, &o), FSDP_ERR_INVALID_USAGE);
  char want[64];
  snprintf(want, sizeof want, "expected_world_size is %d but the launcher started %d",
           nranks + 1, nranks);
  ck_assert_msg(strstr(fsdp_last_error(), want), "message: %s", fsdp_last_error());
  o.expected_world_size = -2;
  ck_assert_int_eq(fsdp_world_init(&w, &o), FSDP_ERR_INVALID_ARGUMENT);
  o.expected_world_size = 0;
  o.launch = (fsdp_launch_t)7;
  ck_assert_int_eq(fsdp_world_init(&w, &o), FSDP_ERR_INVALID_ARGUMENT);
  o.launch = FSDP_LAUNCH_SINGLE;
  o.expected_world_size = 4;
  ck_assert_int_eq(fsdp_world_init(&w, &o), FSDP_ERR_INVALID_USAGE);
  /* The shared world still works after all of that. */
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
}
END_TEST

/* Pretends this process was started without a launcher: the launcher's
 * variables are hidden for the duration (MPI read them at init already). */
static const char *launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                      "MPI_LOCALNRANKS", "WORLD_SIZE", "MASTER_ADDR"};
#define N_LAUNCHER_VARS (sizeof launcher_vars / sizeof launcher_vars[0])
static char *saved_env[N_LAUNCHER_VARS];

static void hide_launcher(void) {
  for (size_t i = 0; i < N_LAUNCHER_VARS; i++) {
    const char *v = getenv(launcher_vars[i]);
    saved_env[i] = v ? fsdp_strdup(v) : NULL;
    unsetenv(launcher_vars[i]);
  }
}

static void restore_launcher(void) {
  for (size_t i = 0; i < N_LAUNCHER_VARS; i++) {
    if (saved_env[i]) setenv(launcher_vars[i], saved_env[i], 1);
    else unsetenv(launcher_vars[i]);
    fsdp_free(saved_env[i]);
    saved_env[i] = NULL;
  }
}

static const struct {
  const char *world_size, *master_addr;
  int expected;
  fsdp_status_t want;
  const char *says;
} no_launcher_cases[] = {
    {NULL, NULL, 0, FSDP_SUCCESS, ""},
    {"1", NULL, 0, FSDP_SUCCESS, ""},
    {"4", NULL, 0, FSDP_ERR_INVALID_USAGE, "mpirun -np 4"},
    {NULL, NULL, 3, FSDP_ERR_INVALID_USAGE, "mpirun -np 3"},
    {"4", "10.0.0.1", 0, FSDP_ERR_INVALID_USAGE, "env://"},
    {"four", NULL, 0, FSDP_ERR_INVALID_USAGE, "WORLD_SIZE='four'"},
};

START_TEST(world_without_launcher) {
  /* Under fsdp-run RANK stays visible and a case would rendezvous for real. */
  if (strcmp(launcher_backend(), "mpi")) return;
  hide_launcher();
  if (no_launcher_cases[_i].world_size) setenv("WORLD_SIZE", no_launcher_cases[_i].world_size, 1);
  if (no_launcher_cases[_i].master_addr)
    setenv("MASTER_ADDR", no_launcher_cases[_i].master_addr, 1);
  fsdp_world_opts_t o = FSDP_WORLD_OPTS_INIT;
  o.expected_world_size = no_launcher_cases[_i].expected;
  fsdp_world_t w = NULL;
  fsdp_error_set("");
  fsdp_status_t st = fsdp_world_init(&w, &o);
  restore_launcher();
  ck_assert_msg(st == no_launcher_cases[_i].want, "got %s (%s)", fsdp_status_string(st),
                fsdp_last_error());
  ck_assert_msg(strstr(fsdp_last_error(), no_launcher_cases[_i].says), "message: %s",
                fsdp_last_error());
  if (st == FSDP_SUCCESS) {
    ck_assert_str_eq(fsdp_world_backend(w), "self");
    ck_assert_int_eq(fsdp_world_size(w), 1);
    fsdp_world_destroy(w);
  }
}
END_TEST

static Suite *comm_suite(void) {
  Suite *s = suite_create("comm");
  TCase *tc = tcase_create("collectives");
  tcase_set_timeout(tc, 240);
  /* One communicator for every collective, as a trainer holds it (a gloo mesh
   * is set up once); the world cases below get a fresh one each, which also
   * covers creating and destroying communicators back to back. */
  tcase_add_unchecked_fixture(tc, setup_comm, teardown_comm);
  tcase_add_checked_fixture(tc, setup_stream, teardown_stream);
  tcase_add_loop_test(tc, all_gather_matches_reference, 0, N_GATHER_CASES);
  tcase_add_loop_test(tc, reduce_scatter_matches_reference, 0, N_REDUCE_CASES);
  tcase_add_loop_test(tc, all_reduce_matches_reference, 0, N_REDUCE_CASES);
  tcase_add_loop_test(tc, broadcast_from_each_root, 0, N_GATHER_CASES / 2);
  tcase_add_loop_test(tc, bf16_reduction_within_rounding_bound, 0, 12);
  tcase_add_test(tc, barrier_on_host_and_stream);
  tcase_add_test(tc, two_comms_on_two_streams);
  tcase_add_loop_test(tc, invalid_arguments_fail_on_every_rank, 0, 2);
  tcase_add_loop_test(tc, self_backend_copies_in_order, 0, 2);
  tcase_add_test(tc, split_into_groups);
  tcase_add_test(tc, split_failure_is_collective);
  suite_add_tcase(s, tc);

  TCase *tw = tcase_create("world");
  tcase_add_checked_fixture(tw, setup, teardown);
  tcase_add_test(tw, world_reports_launcher_layout);
  tcase_add_test(tw, world_checks_expected_size);
  tcase_add_test(tw, backend_by_name);
  tcase_add_test(tw, comms_created_and_destroyed_back_to_back);
  tcase_add_loop_test(tw, world_without_launcher, 0,
                      sizeof no_launcher_cases / sizeof no_launcher_cases[0]);
  suite_add_tcase(s, tw);
  return s;
}

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
  return mpi_check_run(comm_suite());
}
