/* tests/mpi/test_replica.c — buddy replicas (src/ckpt/replica.c) and the ring
 * shift they travel by (fsdp_shift): after a snapshot a rank's buddy holds
 * exactly its shard (master and both AdamW moments, bit for bit, checked
 * against an all-gather of the live shards), the previous snapshot survives
 * the next one (double buffering), and a restore into a fresh engine
 * reproduces the snapshot's state and step; HSDP snapshots restore into
 * plain FSDP and back; fsdp_replica_bytes says what create allocates; a
 * rejoin outside an elastic launcher is refused. N = 1..4. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

static fsdp_world_t world;
static int rank, nranks;

/* Prime-sized tensors so shards straddle tensors and ranks. */
#define N_UNITS 3
static const int64_t rows[N_UNITS] = {13, 31, 7};
#define COLS 11
#define EVERY 2

static fsdp_engine_t make_engine_sharded(uint64_t seed, int extra_row, int shard_size) {
  static char names[N_UNITS][2][16];
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  c.shard_size = shard_size;
  c.optim.kind = FSDP_OPTIM_ADAMW;
  c.optim.lr = 1e-2f;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  for (int k = 0; k < N_UNITS; k++) {
    snprintf(names[k][0], 16, "u.%d.w", k);
    snprintf(names[k][1], 16, "u.%d.b", k);
    int64_t r = rows[k] + (k == 1 ? extra_row : 0);
    fsdp_tensor_desc_t t[2] = {{names[k][0], 2, {r, COLS}, FSDP_INIT_NORMAL, 0.1f, 0},
                               {names[k][1], 1, {r}, FSDP_INIT_UNIFORM, 0.5f, 1}};
    fsdp_unit_t u;
    ck_assert_int_eq(fsdp_unit_add(e, names[k][0], "Block", t, 2, &u), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_materialize(e, seed), FSDP_SUCCESS);
  return e;
}

static fsdp_engine_t make_engine(uint64_t seed, int extra_row) {
  return make_engine_sharded(seed, extra_row, 0);
}

/* A step whose gradients differ by rank, element and step, so the moments are
 * not all alike. */
static void step(fsdp_engine_t e, int s) {
  fsdp_view_t v;
  for (int k = 0; k < N_UNITS; k++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int k = N_UNITS - 1; k >= 0; k--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, k, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    for (int64_t i = 0; i < rows[k] * COLS; i++)
      v.grad[0][i] += 0.01f * (float)((i * 7 + s * 3 + rank) % 13) - 0.05f;
    for (int64_t i = 0; i < rows[k]; i++) v.grad[1][i] += 0.02f * (float)(s + k);
    ck_assert_int_eq(fsdp_unit_release(e, k, FSDP_BACKWARD), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
}

/* Every rank's live state of unit u (master, m, v; each padded to the
 * shard's capacity), gathered: [rank][state][capacity]. */
static float *gather_unit(fsdp_engine_t e, int u, size_t *cap) {
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, u, &s), FSDP_SUCCESS);
  *cap = s.capacity;
  float *mine = calloc(3 * s.capacity, sizeof(float));
  float *all = calloc(3 * s.capacity * (size_t)nranks, sizeof(float));
  ck_assert(mine && all && s.m && s.v);
  memcpy(mine, s.master, s.count * sizeof(float));
  memcpy(mine + s.capacity, s.m, s.count * sizeof(float));
  memcpy(mine + 2 * s.capacity, s.v, s.count * sizeof(float));
  ck_assert_int_eq(fsdp_unit_shard_release(e, u, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_all_gather(fsdp_engine_comm(e), mine, all, 3 * s.capacity, FSDP_F32,
                                   FSDP_HOST_STREAM), FSDP_SUCCESS);
  free(mine);
  return all;
}

/* The snapshot `step` this rank keeps for source equals `all` (gathered at
 * that step) bit for bit, and so does its own. */
static void check_copies(fsdp_replica_t r, int64_t step, float *const *all, const size_t *cap) {
  fsdp_replica_info_t info;
  ck_assert_int_eq(fsdp_replica_info(r, &info), FSDP_SUCCESS);
  for (int u = 0; u < N_UNITS; u++)
    for (int k = 0; k < 3; k++) {
      const float *held, *own;
      size_t n;
      ck_assert_int_eq(fsdp_replica_view(r, 1, step, u, k, &held, &n), FSDP_SUCCESS);
      ck_assert_uint_eq(n, cap[u]);
      ck_assert_int_eq(fsdp_replica_view(r, 0, step, u, k, &own, &n), FSDP_SUCCESS);
      const float *want_held = all[u] + ((size_t)info.source * 3 + (size_t)k) * cap[u];
      const float *want_own = all[u] + ((size_t)rank * 3 + (size_t)k) * cap[u];
      ck_assert_msg(!memcmp(held, want_held, n * sizeof(float)),
                    "rank %d: held copy of rank %d, step %lld, unit %d, state %d differs", rank,
                    info.source, (long long)step, u, k);
      ck_assert_msg(!memcmp(own, want_own, n * sizeof(float)),
                    "rank %d: own copy, step %lld, unit %d, state %d differs", rank,
                    (long long)step, u, k);
    }
}

START_TEST(shift_moves_each_rank_to_rank_plus_offset) {
  fsdp_comm_t c;
  ck_assert_int_eq(fsdp_comm_create(world, &c), FSDP_SUCCESS);
  int send[5], recv[5];
  for (int off = 0; off < nranks; off++) {
    for (int i = 0; i < 5; i++) send[i] = rank * 1000 + off * 10 + i, recv[i] = -1;
    ck_assert_int_eq(fsdp_shift(c, send, recv, 5, FSDP_F32, off, FSDP_HOST_STREAM),
                     FSDP_SUCCESS);
    int from = (rank - off + nranks) % nranks;
    for (int i = 0; i < 5; i++) ck_assert_int_eq(recv[i], from * 1000 + off * 10 + i);
  }
  ck_assert_int_eq(fsdp_shift(c, send, recv, 5, FSDP_F32, nranks, FSDP_HOST_STREAM),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "offset"));
  fsdp_comm_destroy(c);
}
END_TEST

START_TEST(buddy_holds_the_shard_bit_for_bit) {
  fsdp_engine_t e = make_engine(7, 0);
  fsdp_replica_t r;
  ck_assert_int_eq(fsdp_replica_create(e, EVERY, &r), FSDP_SUCCESS);
  fsdp_replica_info_t info;
  ck_assert_int_eq(fsdp_replica_info(r, &info), FSDP_SUCCESS);
  ck_assert_int_eq(info.buddy, (rank + 1) % nranks);
  ck_assert_int_eq(info.source, (rank - 1 + nranks) % nranks);
  ck_assert_uint_eq(info.host_bytes, 4 * info.snapshot_bytes);
  float *at2[N_UNITS], *at4[N_UNITS];
  size_t cap[N_UNITS];
  fsdp_ckpt_meta_t meta = {0}, got;
  for (int s = 1; s <= 4; s++) {
    step(e, s);
    int taken;
    ck_assert_int_eq(fsdp_ckpt_meta_set(&meta, "data_pos", 100 + s), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_replica_snapshot(r, &meta, &taken), FSDP_SUCCESS);
    ck_assert_int_eq(taken, s % EVERY == 0);
    for (int u = 0; u < N_UNITS && (s == 2 || s == 4); u++)
      (s == 2 ? at2 : at4)[u] = gather_unit(e, u, &cap[u]);
    if (s == 2) { /* the first snapshot, complete once its transfer is */
      ck_assert_int_eq(fsdp_replica_wait(r), FSDP_SUCCESS);
      check_copies(r, 2, at2, cap);
    }
  }
  ck_assert_int_eq(fsdp_replica_wait(r), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_replica_info(r, &info), FSDP_SUCCESS);
  ck_assert(info.held_step[0] + info.held_step[1] == 6 && info.own_step[0] != info.own_step[1]);
  check_copies(r, 4, at4, cap);
  check_copies(r, 2, at2, cap); /* the older buffer was not touched */

  /* Restore into a fresh engine of the same world (seeded differently): the
   * state and step of step 4, the trainer's integers with it. */
  fsdp_engine_t f = make_engine(99, 0);
  int64_t restored;
  ck_assert_int_eq(fsdp_replica_restore(r, f, &got, &restored), FSDP_SUCCESS);
  ck_assert_int_eq(restored, 4);
  ck_assert_int_eq(fsdp_engine_step_count(f), 4);
  int64_t pos;
  ck_assert_int_eq(fsdp_ckpt_meta_get(&got, "data_pos", &pos), FSDP_SUCCESS);
  ck_assert_int_eq(pos, 104);
  for (int u = 0; u < N_UNITS; u++) {
    size_t c2;
    float *now = gather_unit(f, u, &c2);
    ck_assert(!memcmp(now, at4[u], 3 * cap[u] * (size_t)nranks * sizeof(float)));
    free(now);
  }
  /* The restored replica snapshots its new world. */
  step(f, 5);
  step(f, 6);
  ck_assert_int_eq(fsdp_replica_snapshot(r, NULL, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_replica_wait(r), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_replica_info(r, &info), FSDP_SUCCESS);
  ck_assert(info.held_step[0] == 6 || info.held_step[1] == 6);
  for (int u = 0; u < N_UNITS; u++) free(at2[u]), free(at4[u]);
  fsdp_replica_destroy(r);
  fsdp_engine_destroy(f);
  fsdp_engine_destroy(e);
}
END_TEST

/* Outside an elastic fsdp-run (mpirun, or fsdp-run without --min-nproc) a
 * rejoin is refused and the world left as it was. */
START_TEST(rejoin_needs_an_elastic_launcher) {
  fsdp_world_t w = world;
  ck_assert_int_eq(fsdp_world_elastic(), 0);
  ck_assert_int_eq(fsdp_world_rejoin(&w, NULL, NULL), FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_eq(w, world);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "--min-nproc"));
  ck_assert_int_eq(fsdp_world_size(world), nranks);
}
END_TEST

START_TEST(restore_refuses_another_model) {
  fsdp_engine_t e = make_engine(7, 0);
  fsdp_replica_t r;
  ck_assert_int_eq(fsdp_replica_create(e, 1, &r), FSDP_SUCCESS);
  step(e, 1);
  ck_assert_int_eq(fsdp_replica_snapshot(r, NULL, NULL), FSDP_SUCCESS);
  fsdp_engine_t f = make_engine(7, 1);
  ck_assert_int_eq(fsdp_replica_restore(r, f, NULL, NULL), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "unit 1 ('u.1.w') has"));
  ck_assert_int_eq(fsdp_engine_step_count(f), 0);
  ck_assert_int_eq(fsdp_replica_create(e, -1, &r), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_replica_destroy(r);
  fsdp_engine_destroy(f);
  fsdp_engine_destroy(e);
}
END_TEST

/* Unit u's whole state (master, m, v of its numel elements, one after the
 * other) on every rank: shard group 0's slices summed over the world (the
 * other ranks, replicas of those, add zeros). */
static float *whole_unit(fsdp_engine_t e, int u, size_t *numel) {
  fsdp_unit_info_t info;
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_info(e, u, &info), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard(e, u, &s), FSDP_SUCCESS);
  *numel = info.numel;
  float *all = calloc(3 * info.numel, sizeof(float));
  ck_assert(all && s.m && s.v);
  const float *from[3] = {s.master, s.m, s.v};
  size_t count = s.offset >= info.numel ? 0
                 : s.offset + s.count > info.numel ? info.numel - s.offset : s.count;
  for (int k = 0; k < 3 && rank < fsdp_engine_config(e)->shard_size; k++)
    memcpy(all + (size_t)k * info.numel + s.offset, from[k], count * sizeof(float));
  ck_assert_int_eq(fsdp_unit_shard_release(e, u, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_all_reduce(fsdp_engine_comm(e), all, all, 3 * info.numel, FSDP_F32,
                                   FSDP_SUM, FSDP_HOST_STREAM), FSDP_SUCCESS);
  return all;
}

/* One replica's snapshots restored into `to`: its state equals `want`
 * (whole_unit of the snapshot's step) bit for bit, its step is `at`. */
static void check_restore(fsdp_replica_t r, fsdp_engine_t to, int64_t at, float *const *want) {
  int64_t restored;
  ck_assert_int_eq(fsdp_replica_restore(r, to, NULL, &restored), FSDP_SUCCESS);
  ck_assert_int_eq(restored, at);
  for (int u = 0; u < N_UNITS; u++) {
    size_t n;
    float *now = whole_unit(to, u, &n);
    ck_assert_msg(!memcmp(now, want[u], 3 * n * sizeof(float)), "rank %d: unit %d differs after "
                  "the restore of step %lld", rank, u, (long long)at);
    free(now);
  }
}

/* HSDP (shard groups of S < N ranks, each shard held by N / S of them): the
 * snapshots follow the shard group (fsdp_replica_bytes says what create
 * allocates), restore into plain FSDP over the world (another layout) and
 * from there back into HSDP, each time with the state of the snapshot. */
START_TEST(hsdp_restores_into_another_layout) {
  if (nranks < 2) return;
  const int S = nranks % 2 == 0 && nranks > 2 ? 2 : 1;
  fsdp_engine_t e = make_engine_sharded(7, 0, S);
  fsdp_replica_t r;
  ck_assert_int_eq(fsdp_replica_create(e, EVERY, &r), FSDP_SUCCESS);
  fsdp_replica_info_t info;
  ck_assert_int_eq(fsdp_replica_info(r, &info), FSDP_SUCCESS);
  size_t numel[N_UNITS], snap, host;
  for (int u = 0; u < N_UNITS; u++) {
    fsdp_unit_info_t ui;
    ck_assert_int_eq(fsdp_unit_info(e, u, &ui), FSDP_SUCCESS);
    numel[u] = ui.numel;
  }
  ck_assert_int_eq(fsdp_replica_bytes(numel, N_UNITS, 3, S, fsdp_engine_config(e)->align, &snap,
                                      &host), FSDP_SUCCESS);
  ck_assert_uint_eq(snap, info.snapshot_bytes);
  ck_assert_uint_eq(host, info.host_bytes);
  ck_assert_int_eq(fsdp_replica_bytes(numel, N_UNITS, 3, 0, 64, &snap, NULL),
                   FSDP_ERR_INVALID_ARGUMENT);
  float *at2[N_UNITS], *at4[N_UNITS];
  for (int s = 1; s <= 3; s++) {
    step(e, s);
    ck_assert_int_eq(fsdp_replica_snapshot(r, NULL, NULL), FSDP_SUCCESS);
    for (int u = 0; u < N_UNITS && s == 2; u++) at2[u] = whole_unit(e, u, &numel[u]);
  }
  ck_assert_int_eq(fsdp_replica_wait(r), FSDP_SUCCESS);
  fsdp_engine_t f = make_engine(99, 0); /* plain FSDP over the world */
  check_restore(r, f, 2, at2);
  step(f, 3);
  step(f, 4);
  ck_assert_int_eq(fsdp_replica_snapshot(r, NULL, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_replica_wait(r), FSDP_SUCCESS);
  for (int u = 0; u < N_UNITS; u++) at4[u] = whole_unit(f, u, &numel[u]);
  fsdp_engine_t g = make_engine_sharded(5, 0, S); /* and back into HSDP */
  check_restore(r, g, 4, at4);
  for (int u = 0; u < N_UNITS; u++) free(at2[u]), free(at4[u]);
  fsdp_replica_destroy(r);
  fsdp_engine_destroy(g);
  fsdp_engine_destroy(f);
  fsdp_engine_destroy(e);
}
END_TEST

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
  Suite *s = suite_create("replica");
  TCase *tc = tcase_create("buddy");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, shift_moves_each_rank_to_rank_plus_offset);
  tcase_add_test(tc, buddy_holds_the_shard_bit_for_bit);
  tcase_add_test(tc, restore_refuses_another_model);
  tcase_add_test(tc, rejoin_needs_an_elastic_launcher);
  tcase_add_test(tc, hsdp_restores_into_another_layout);
  suite_add_tcase(s, tc);
  return mpi_check_run(s);
}
