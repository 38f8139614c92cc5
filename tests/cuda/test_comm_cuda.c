/* tests/cuda/test_comm_cuda.c — collectives on CUDA device buffers against host
 * references: the nccl backend (when built, and when every rank of the node
 * has a GPU of its own) and the host backend of the world (mpi under mpirun,
 * self alone) with its device buffers staged through pinned memory (ranks
 * may share one GPU). Each collective runs on a CUDA stream, a CPU stream and
 * the host stream, f32 and bf16, out of place and in place (the ring shift
 * out of place only, at every offset).
 *
 * One communicator and its streams serve every check of a backend (an
 * unchecked fixture): making an NCCL communicator costs a GPU tenths of a
 * second and threads of its own, and one per check took 77 s on an H200.
 * Each backend's checks print their time.
 *
 * Exits 77 (skipped) when no CUDA device is usable. Run alone or under
 * mpirun -np 1..N; CK_FORK=no (a forked child cannot use the CUDA context).
 * Data are small integers, so every sum and maximum is exact in bf16 as
 * well; averages are checked against comm.h's bound. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/mpi_check.h"
#include "cuda_gate.h"
#include "core/internal.h"
#include "fsdp/fsdp.h"
#include "fsdp_config.h"

static fsdp_world_t world;
static int rank, nranks;
static fsdp_comm_t comm;
static fsdp_stream_t cuda_stream, cpu_stream;

/* The backend under test: "nccl", or NULL for the world's own (staged). */
static const char *backend;
static double t_setup; /* when its communicator was made */

static void setup(void) {
  t_setup = fsdp_time_now();
  ck_assert_int_eq(fsdp_comm_create_backend(world, backend, &comm), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create_cuda("test-comm", 1, &cuda_stream), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create("test-cpu", &cpu_stream), FSDP_SUCCESS);
}

static void setup_staged(void) {
  backend = NULL;
  setup();
}

static void setup_nccl(void) {
  backend = "nccl";
  setup();
}

static void teardown(void) {
  fsdp_stream_destroy(cpu_stream);
  fsdp_stream_destroy(cuda_stream);
  fsdp_comm_destroy(comm);
  if (rank == 0)
    printf("comm-cuda %s at N=%d: every check on one communicator, %.2f s\n",
           backend ? backend : "staged", nranks, fsdp_time_now() - t_setup);
}

static double val(int r, size_t i, int salt) {
  return (double)((int)(((size_t)r * 5 + i * 3 + (size_t)salt) % 13) - 6);
}

static void put(void *b, fsdp_dtype_t dt, size_t i, double v) {
  if (dt == FSDP_F32) ((float *)b)[i] = (float)v;
  else ((uint16_t *)b)[i] = fsdp_f32_to_bf16((float)v);
}

static double get(const void *b, fsdp_dtype_t dt, size_t i) {
  return dt == FSDP_F32 ? ((const float *)b)[i] : fsdp_bf16_to_f32(((const uint16_t *)b)[i]);
}

/* 1 when got is the reduction over ranks of val(., j, salt): exactly for SUM
 * and MAX (small integers), and for AVG within the bound comm.h gives for
 * nccl, the loosest of the backends: ((1 + u)^(N+1) - 1) * sum |x| / N. */
static int reduced_ok(double got, fsdp_reduce_op_t op, fsdp_dtype_t dt, size_t j, int salt) {
  double acc = val(0, j, salt), mass = fabs(acc);
  for (int r = 1; r < nranks; r++) {
    double x = val(r, j, salt);
    acc = op == FSDP_MAX ? (x > acc ? x : acc) : acc + x;
    mass += fabs(x);
  }
  if (op != FSDP_AVG) return got == acc;
  double u = dt == FSDP_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -24);
  return fabs(got - acc / nranks) <= (pow(1.0 + u, nranks + 1) - 1.0) * mass / nranks;
}

/* A device buffer of n elements holding host[0..n). */
static void *to_device(const void *host, size_t bytes) {
  void *d = NULL;
  ck_assert_int_eq(fsdp_device_alloc(FSDP_DEVICE_CUDA, bytes + 64, &d), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_device_copy(d, host, bytes, FSDP_HOST_STREAM), FSDP_SUCCESS);
  return d;
}

static void from_device(void *host, const void *d, size_t bytes) {
  ck_assert_int_eq(fsdp_device_copy(host, d, bytes, FSDP_HOST_STREAM), FSDP_SUCCESS);
}

enum { N = 4099 };
static const fsdp_dtype_t dtypes[] = {FSDP_F32, FSDP_BF16};
static const fsdp_reduce_op_t ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};

typedef struct {
  fsdp_dtype_t dtype;
  fsdp_reduce_op_t op;
  fsdp_stream_t stream;
  int in_place;
} coll_case_t;

/* _i -> (dtype, op, stream, in place): 2 x 3 x 3 x 2 cases. */
static coll_case_t decode(int i) {
  fsdp_stream_t streams[] = {cuda_stream, cpu_stream, FSDP_HOST_STREAM};
  coll_case_t c = {dtypes[i % 2], ops[(i / 2) % 3], streams[(i / 6) % 3], (i / 18) % 2};
  return c;
}
#define N_CASES (2 * 3 * 3 * 2)

static fsdp_status_t finish(fsdp_status_t st, fsdp_stream_t s) {
  return st != FSDP_SUCCESS ? st : fsdp_stream_synchronize(s);
}

START_TEST(all_gather_on_device) {
  coll_case_t c = decode(_i);
  size_t es = fsdp_dtype_size(c.dtype), total = (size_t)N * (size_t)nranks;
  char *h = fsdp_alloc(total * es);
  for (size_t i = 0; i < total; i++) put(h, c.dtype, i, 99.0);
  for (size_t i = 0; i < N; i++) put(h + (size_t)rank * N * es, c.dtype, i, val(rank, i, _i));
  char *recv = to_device(h, total * es), *own = to_device(h + (size_t)rank * N * es, N * es);
  const void *send = c.in_place ? recv + (size_t)rank * N * es : own;
  fsdp_status_t st = finish(fsdp_all_gather(comm, send, recv, N, c.dtype, c.stream), c.stream);
  from_device(h, recv, total * es);
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < N; i++) wrong += get(h, c.dtype, (size_t)r * N + i) != val(r, i, _i);
  fsdp_device_free(FSDP_DEVICE_CUDA, recv);
  fsdp_device_free(FSDP_DEVICE_CUDA, own);
  fsdp_free(h);
  ck_assert_msg(st == FSDP_SUCCESS, "all_gather: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "all_gather %s case %d: %zu wrong", fsdp_dtype_name(c.dtype), _i,
                wrong);
}
END_TEST

START_TEST(reduce_scatter_on_device) {
  coll_case_t c = decode(_i);
  size_t es = fsdp_dtype_size(c.dtype), total = (size_t)N * (size_t)nranks;
  char *h = fsdp_alloc(total * es);
  for (size_t i = 0; i < total; i++) put(h, c.dtype, i, val(rank, i, _i));
  char *send = to_device(h, total * es), *own = to_device(h, N * es);
  void *recv = c.in_place ? send + (size_t)rank * N * es : own;
  fsdp_status_t st = finish(fsdp_reduce_scatter(comm, send, recv, N, c.dtype, c.op, c.stream),
                            c.stream);
  from_device(h, recv, N * es);
  size_t wrong = 0;
  for (size_t i = 0; i < N; i++)
    wrong += !reduced_ok(get(h, c.dtype, i), c.op, c.dtype, (size_t)rank * N + i, _i);
  fsdp_device_free(FSDP_DEVICE_CUDA, send);
  fsdp_device_free(FSDP_DEVICE_CUDA, own);
  fsdp_free(h);
  ck_assert_msg(st == FSDP_SUCCESS, "reduce_scatter: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "reduce_scatter %s op %d case %d: %zu wrong",
                fsdp_dtype_name(c.dtype), (int)c.op, _i, wrong);
}
END_TEST

START_TEST(all_reduce_on_device) {
  coll_case_t c = decode(_i);
  size_t es = fsdp_dtype_size(c.dtype);
  char *h = fsdp_alloc(N * es);
  for (size_t i = 0; i < N; i++) put(h, c.dtype, i, val(rank, i, _i));
  char *send = to_device(h, N * es), *own = to_device(h, N * es);
  void *recv = c.in_place ? send : own;
  fsdp_status_t st = finish(fsdp_all_reduce(comm, send, recv, N, c.dtype, c.op, c.stream),
                            c.stream);
  from_device(h, recv, N * es);
  size_t wrong = 0;
  for (size_t i = 0; i < N; i++) wrong += !reduced_ok(get(h, c.dtype, i), c.op, c.dtype, i, _i);
  fsdp_device_free(FSDP_DEVICE_CUDA, send);
  fsdp_device_free(FSDP_DEVICE_CUDA, own);
  fsdp_free(h);
  ck_assert_msg(st == FSDP_SUCCESS, "all_reduce: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "all_reduce %s op %d case %d: %zu wrong", fsdp_dtype_name(c.dtype),
                (int)c.op, _i, wrong);
}
END_TEST

START_TEST(broadcast_on_device) {
  coll_case_t c = decode(_i);
  size_t es = fsdp_dtype_size(c.dtype), wrong = 0;
  char *h = fsdp_alloc(N * es);
  fsdp_status_t st = FSDP_SUCCESS;
  for (int root = 0; root < nranks && st == FSDP_SUCCESS; root++) {
    for (size_t i = 0; i < N; i++) put(h, c.dtype, i, rank == root ? val(root, i, _i) : 99.0);
    void *buf = to_device(h, N * es);
    st = finish(fsdp_broadcast(comm, buf, N, c.dtype, root, c.stream), c.stream);
    from_device(h, buf, N * es);
    for (size_t i = 0; i < N; i++) wrong += get(h, c.dtype, i) != val(root, i, _i);
    fsdp_device_free(FSDP_DEVICE_CUDA, buf);
  }
  fsdp_free(h);
  ck_assert_msg(st == FSDP_SUCCESS, "broadcast: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "broadcast %s case %d: %zu wrong", fsdp_dtype_name(c.dtype), _i,
                wrong);
}
END_TEST

/* _i -> (dtype, stream), every offset: recv holds rank - offset's send. */
START_TEST(shift_on_device) {
  fsdp_stream_t streams[] = {cuda_stream, cpu_stream, FSDP_HOST_STREAM};
  fsdp_dtype_t dt = dtypes[_i % 2];
  fsdp_stream_t s = streams[_i / 2];
  size_t es = fsdp_dtype_size(dt), wrong = 0;
  char *h = fsdp_alloc(N * es);
  for (size_t i = 0; i < N; i++) put(h, dt, i, val(rank, i, _i));
  char *send = to_device(h, N * es);
  fsdp_status_t st = FSDP_SUCCESS;
  for (int off = 0; off < nranks && st == FSDP_SUCCESS; off++) {
    for (size_t i = 0; i < N; i++) put(h, dt, i, 99.0);
    void *recv = to_device(h, N * es);
    st = finish(fsdp_shift(comm, send, recv, N, dt, off, s), s);
    from_device(h, recv, N * es);
    int from = (rank - off + nranks) % nranks;
    for (size_t i = 0; i < N; i++) wrong += get(h, dt, i) != val(from, i, _i);
    fsdp_device_free(FSDP_DEVICE_CUDA, recv);
  }
  fsdp_device_free(FSDP_DEVICE_CUDA, send);
  fsdp_free(h);
  ck_assert_msg(st == FSDP_SUCCESS, "shift: %s", fsdp_last_error());
  ck_assert_msg(wrong == 0, "shift %s case %d: %zu wrong", fsdp_dtype_name(dt), _i, wrong);
}
END_TEST

/* Host backends: the second round of the same collectives allocates no
 * staging memory. nccl: host buffers are refused on every rank. */
START_TEST(staging_is_kept_or_host_refused) {
  size_t bytes = (size_t)N * (size_t)nranks * sizeof(float);
  float *h = fsdp_alloc(bytes);
  for (size_t i = 0; i < (size_t)N * (size_t)nranks; i++) h[i] = (float)val(rank, i, 7);
  void *send = to_device(h, bytes), *recv = to_device(h, bytes);
  if (backend && strcmp(backend, "nccl") == 0) {
    fsdp_status_t st = fsdp_all_reduce(comm, h, recv, N, FSDP_F32, FSDP_SUM, cuda_stream);
    ck_assert_int_eq(st, FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp_last_error(), "device buffers"), "%s", fsdp_last_error());
  } else {
    size_t kept = 0;
    for (int round = 0; round < 2; round++) {
      ck_assert_int_eq(fsdp_all_gather(comm, send, recv, N, FSDP_F32, cuda_stream),
                       FSDP_SUCCESS);
      ck_assert_int_eq(finish(fsdp_reduce_scatter(comm, send, recv, N, FSDP_F32, FSDP_SUM,
                                                  cpu_stream), cpu_stream), FSDP_SUCCESS);
      if (round == 0) kept = comm->stage_bytes;
      if (round == 1) ck_assert_msg(comm->stage == NULL || comm->stage_bytes == kept,
                                    "staging grew from %zu to %zu", kept, comm->stage_bytes);
    }
    ck_assert_uint_ge(kept, bytes); /* the all-gather's recv was staged */
  }
  fsdp_device_free(FSDP_DEVICE_CUDA, send);
  fsdp_device_free(FSDP_DEVICE_CUDA, recv);
  fsdp_free(h);
}
END_TEST

static TCase *collectives(const char *name, void (*fixture)(void)) {
  TCase *tc = tcase_create(name);
  tcase_set_timeout(tc, 240);
  tcase_add_unchecked_fixture(tc, fixture, teardown);
  tcase_add_loop_test(tc, all_gather_on_device, 0, N_CASES);
  tcase_add_loop_test(tc, reduce_scatter_on_device, 0, N_CASES);
  tcase_add_loop_test(tc, all_reduce_on_device, 0, N_CASES);
  tcase_add_loop_test(tc, broadcast_on_device, 0, N_CASES);
  tcase_add_loop_test(tc, shift_on_device, 0, 6);
  tcase_add_test(tc, staging_is_kept_or_host_refused);
  return tc;
}

static Suite *comm_cuda_suite(void) {
  Suite *s = suite_create("comm-cuda");
  /* The world's host backend with staged device buffers (ranks may share a
   * GPU), then NCCL, which refuses two ranks on one GPU: only with a device
   * per local rank. */
  suite_add_tcase(s, collectives("staged", setup_staged));
  if (FSDP_HAVE_NCCL && fsdp_cuda_device_count() >= fsdp_world_local_size(world))
    suite_add_tcase(s, collectives("nccl", setup_nccl));
  return s;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_comm_cuda");
  if (gate) return gate;
  const int rc = mpi_check_join_gpu(&world, &rank, &nranks);
  return rc ? rc : mpi_check_run(comm_cuda_suite());
}
