/* tests/launch/test_gloo.c — the gloo backend of env:// worlds, run under
 * fsdp-run --nproc-per-node 1..4: every collective against a serial
 * reference (host stream and a worker stream, in place and not, SUM/AVG/MAX,
 * f32/bf16/f64), two communicators busy on two streams at once as the
 * engine uses them, and the world's env:// layout. With FSDP_DESYNC_CHECK=1
 * the same run shows the fingerprint exchange never fires on agreeing ranks.
 *
 * Values are small integers that depend on (rank, index, salt), so each rank
 * computes every contribution itself and sums are exact. Tests assert only
 * after their last collective, so a wrong result never strands the others.
 * Check runs in-process (CK_NOFORK); the failure count is summed over ranks
 * so every rank exits with the same status. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;
static int rank, nranks;
static fsdp_comm_t comm;
static fsdp_stream_t worker;

static void setup(void) {
  ck_assert_int_eq(fsdp_comm_create(world, &comm), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create("test-gloo", &worker), FSDP_SUCCESS);
}

static void teardown(void) {
  fsdp_stream_destroy(worker);
  fsdp_comm_destroy(comm);
}

/* ---- data ---------------------------------------------------------------- */

static double val(int r, size_t i, int salt) {
  return (double)((int)(((size_t)r * 7 + (i % 1009) * 3 + (size_t)salt) % 17) - 8);
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

static void *buffer(size_t n, fsdp_dtype_t dt) {
  void *b = fsdp_alloc(n * fsdp_dtype_size(dt) + 64);
  ck_assert_ptr_nonnull(b);
  return b;
}

static double reference(fsdp_reduce_op_t op, fsdp_dtype_t dt, size_t j, int salt) {
  double acc = val(0, j, salt);
  for (int r = 1; r < nranks; r++)
    acc = op == FSDP_MAX ? (val(r, j, salt) > acc ? val(r, j, salt) : acc) : acc + val(r, j, salt);
  if (op != FSDP_AVG) return acc;
  if (dt == FSDP_F64) return acc * (1.0 / nranks);
  float avg = (float)acc * (float)(1.0 / nranks); /* sums of small integers: exact */
  return dt == FSDP_F32 ? avg : fsdp_bf16_to_f32(fsdp_f32_to_bf16(avg));
}

static fsdp_status_t finish(fsdp_status_t st, fsdp_stream_t s) {
  return st != FSDP_SUCCESS ? st : fsdp_stream_synchronize(s);
}

/* ---- collectives --------------------------------------------------------- */

static const size_t counts[] = {1, 7, 1000, 65537};
static const fsdp_dtype_t moved[] = {FSDP_F32, FSDP_BF16, FSDP_F64};
#define N_GATHER (4 * 3 * 2 * 2) /* count x dtype x in place x stream */

START_TEST(all_gather_matches_reference) {
  size_t n = counts[_i % 4];
  fsdp_dtype_t dt = moved[(_i / 4) % 3];
  int in_place = (_i / 12) % 2;
  fsdp_stream_t s = _i / 24 ? worker : FSDP_HOST_STREAM;
  size_t es = fsdp_dtype_size(dt), total = n * (size_t)nranks;
  char *recv = buffer(total, dt), *send = in_place ? recv + (size_t)rank * n * es : buffer(n, dt);
  for (size_t i = 0; i < n; i++) put(send, dt, i, val(rank, i, _i));
  ck_assert_int_eq(finish(fsdp_all_gather(comm, send, recv, n, dt, s), s), FSDP_SUCCESS);
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) wrong += get(recv, dt, (size_t)r * n + i) != val(r, i, _i);
  ck_assert_msg(wrong == 0, "%zu of %zu elements wrong (count %zu, %s)", wrong, total, n,
                fsdp_dtype_name(dt));
  if (!in_place) fsdp_free(send);
  fsdp_free(recv);
}
END_TEST

static const fsdp_reduce_op_t ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
static const fsdp_dtype_t reduced[] = {FSDP_F32, FSDP_BF16, FSDP_F64};
#define N_REDUCE (3 * 3 * 3 * 2 * 2) /* count x op x dtype x in place x stream */

START_TEST(reduce_scatter_matches_reference) {
  size_t n = counts[_i % 3];
  fsdp_reduce_op_t op = ops[(_i / 3) % 3];
  fsdp_dtype_t dt = reduced[(_i / 9) % 3];
  int in_place = (_i / 27) % 2;
  fsdp_stream_t s = _i / 54 ? worker : FSDP_HOST_STREAM;
  size_t es = fsdp_dtype_size(dt);
  char *send = buffer(n * (size_t)nranks, dt);
  for (size_t i = 0; i < n * (size_t)nranks; i++) put(send, dt, i, val(rank, i, _i));
  char *recv = in_place ? send + (size_t)rank * n * es : buffer(n, dt);
  ck_assert_int_eq(finish(fsdp_reduce_scatter(comm, send, recv, n, dt, op, s), s), FSDP_SUCCESS);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong += get(recv, dt, i) != reference(op, dt, (size_t)rank * n + i, _i);
  ck_assert_msg(wrong == 0, "%zu of %zu wrong (count %zu, op %d, %s, in place %d)", wrong, n, n,
                (int)op, fsdp_dtype_name(dt), in_place);
  if (!in_place) fsdp_free(recv);
  fsdp_free(send);
}
END_TEST

START_TEST(all_reduce_matches_reference) {
  size_t n = counts[_i % 3];
  fsdp_reduce_op_t op = ops[(_i / 3) % 3];
  fsdp_dtype_t dt = reduced[(_i / 9) % 3];
  int in_place = (_i / 27) % 2;
  fsdp_stream_t s = _i / 54 ? worker : FSDP_HOST_STREAM;
  char *recv = buffer(n, dt), *send = in_place ? recv : buffer(n, dt);
  for (size_t i = 0; i < n; i++) put(send, dt, i, val(rank, i, _i));
  ck_assert_int_eq(finish(fsdp_all_reduce(comm, send, recv, n, dt, op, s), s), FSDP_SUCCESS);
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += get(recv, dt, i) != reference(op, dt, i, _i);
  if (!in_place)
    for (size_t i = 0; i < n; i++) wrong += get(send, dt, i) != val(rank, i, _i); /* untouched */
  ck_assert_msg(wrong == 0, "%zu wrong (count %zu, op %d, %s, in place %d)", wrong, n, (int)op,
                fsdp_dtype_name(dt), in_place);
  if (!in_place) fsdp_free(send);
  fsdp_free(recv);
}
END_TEST

START_TEST(broadcast_from_every_root) {
  size_t n = _i % 2 ? 10000 : 3;
  fsdp_stream_t s = _i / 2 ? worker : FSDP_HOST_STREAM;
  size_t wrong = 0;
  for (int root = 0; root < nranks; root++) {
    double *b = buffer(n, FSDP_F64);
    for (size_t i = 0; i < n; i++) b[i] = rank == root ? val(root, i, 5) : 99.0;
    ck_assert_int_eq(finish(fsdp_broadcast(comm, b, n, FSDP_F64, root, s), s), FSDP_SUCCESS);
    for (size_t i = 0; i < n; i++) wrong += b[i] != val(root, i, 5);
    fsdp_free(b);
  }
  ck_assert_msg(wrong == 0, "%zu wrong", wrong);
}
END_TEST

START_TEST(barrier_on_host_and_stream) {
  ck_assert_int_eq(fsdp_barrier(comm, FSDP_HOST_STREAM), FSDP_SUCCESS);
  ck_assert_int_eq(finish(fsdp_barrier(comm, worker), worker), FSDP_SUCCESS);
}
END_TEST

/* The engine's pattern: gathers on one communicator and stream while
 * reductions run on another, many in flight, neither waiting for the other. */
START_TEST(two_communicators_on_two_streams) {
  fsdp_comm_t other;
  fsdp_stream_t second;
  ck_assert_int_eq(fsdp_comm_dup(comm, &other), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create("test-gloo-2", &second), FSDP_SUCCESS);
  enum { ROUNDS = 20, N = 4096 };
  float *g = buffer((size_t)ROUNDS * N * (size_t)nranks, FSDP_F32);
  float *in = buffer((size_t)ROUNDS * N, FSDP_F32), *red = buffer((size_t)ROUNDS * N, FSDP_F32);
  for (size_t i = 0; i < (size_t)ROUNDS * N; i++) in[i] = (float)val(rank, i, 9);
  for (int k = 0; k < ROUNDS; k++) {
    ck_assert_int_eq(fsdp_all_gather(comm, in + (size_t)k * N, g + (size_t)k * N * nranks, N,
                                     FSDP_F32, worker), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_all_reduce(other, in + (size_t)k * N, red + (size_t)k * N, N,
                                     FSDP_F32, FSDP_SUM, second), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_stream_synchronize(worker), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(second), FSDP_SUCCESS);
  size_t wrong = 0;
  for (int k = 0; k < ROUNDS; k++)
    for (size_t i = 0; i < N; i++) {
      size_t j = (size_t)k * N + i;
      wrong += red[j] != reference(FSDP_SUM, FSDP_F32, j, 9);
      for (int r = 0; r < nranks; r++)
        wrong += g[(size_t)k * N * nranks + (size_t)r * N + i] != val(r, j, 9);
    }
  ck_assert_msg(wrong == 0, "%zu wrong", wrong);
  fsdp_free(g);
  fsdp_free(in);
  fsdp_free(red);
  fsdp_stream_destroy(second);
  fsdp_comm_destroy(other);
}
END_TEST

START_TEST(world_is_the_launchers) {
  ck_assert_str_eq(fsdp_world_backend(world), "gloo");
  ck_assert_str_eq(fsdp_comm_backend(comm), "gloo");
  ck_assert_int_eq(nranks, atoi(getenv("WORLD_SIZE")));
  ck_assert_int_eq(rank, atoi(getenv("RANK")));
  ck_assert_int_eq(fsdp_world_local_rank(world), atoi(getenv("LOCAL_RANK")));
  ck_assert_int_eq(fsdp_world_local_size(world), atoi(getenv("LOCAL_WORLD_SIZE")));
  ck_assert_int_eq(fsdp_comm_rank(comm), rank);
  ck_assert_int_eq(fsdp_comm_size(comm), nranks);
  /* The rendezvous is once per process; a single-rank world still works. */
  fsdp_world_t again = NULL;
  ck_assert_int_eq(fsdp_world_init(&again, NULL), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "already has an env:// world"));
  fsdp_world_opts_t solo = {.launch = FSDP_LAUNCH_SINGLE};
  ck_assert_int_eq(fsdp_world_init(&again, &solo), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_world_backend(again), "self");
  fsdp_world_destroy(again);
}
END_TEST

static Suite *gloo_suite(void) {
  Suite *s = suite_create("gloo");
  TCase *tc = tcase_create("collectives");
  tcase_set_timeout(tc, 120);
  tcase_add_unchecked_fixture(tc, setup, teardown); /* one connection set-up */
  tcase_add_loop_test(tc, all_gather_matches_reference, 0, N_GATHER);
  tcase_add_loop_test(tc, reduce_scatter_matches_reference, 0, N_REDUCE);
  tcase_add_loop_test(tc, all_reduce_matches_reference, 0, N_REDUCE);
  tcase_add_loop_test(tc, broadcast_from_every_root, 0, 4);
  tcase_add_test(tc, barrier_on_host_and_stream);
  tcase_add_test(tc, two_communicators_on_two_streams);
  tcase_add_test(tc, world_is_the_launchers);
  suite_add_tcase(s, tc);
  return s;
}

/* Runs the suite and sums the failures over ranks with the backend itself. */
int main(void) {
  if (fsdp_world_init(&world, NULL) != FSDP_SUCCESS) {
    fprintf(stderr, "test_gloo: %s\n", fsdp_last_error());
    return EXIT_FAILURE;
  }
  rank = fsdp_world_rank(world);
  nranks = fsdp_world_size(world);
  SRunner *sr = srunner_create(gloo_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  double counts_[2] = {srunner_ntests_failed(sr), srunner_ntests_run(sr)};
  srunner_free(sr);
  fsdp_comm_t c = NULL;
  fsdp_status_t st = fsdp_comm_create(world, &c);
  if (st == FSDP_SUCCESS)
    st = fsdp_all_reduce(c, counts_, counts_, 2, FSDP_F64, FSDP_SUM, FSDP_HOST_STREAM);
  fsdp_comm_destroy(c);
  if (st != FSDP_SUCCESS) fprintf(stderr, "test_gloo: summing failures: %s\n", fsdp_last_error());
  if (rank == 0)
    printf("test_gloo: %.0f checks over %d rank(s), %.0f failed%s\n", counts_[1], nranks,
           counts_[0], getenv("FSDP_DESYNC_CHECK") ? " (desync check on)" : "");
  fsdp_world_destroy(world);
  return st == FSDP_SUCCESS && counts_[0] == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
