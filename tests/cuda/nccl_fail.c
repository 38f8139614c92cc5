/* tests/cuda/nccl_fail.c — an NCCL all-gather that fails inside its stream
 * never passes for a good one: under mpirun at N = 2 on the simulator, with
 * FSDP_SIM_NCCL_FAIL=1:2:0 rank 1's second all-gather on the engine's gather
 * communicator (the prefetch of unit u1 issued by acquiring u0) fails inside
 * the stream and leaves its output unwritten, as a network error does. The
 * engine's calls of one training step (acquire and release of every unit,
 * forward and backward, then the step) must not all succeed on any rank: one
 * of them fails with FSDP_ERR_COMM whose message leads with the all-gather
 * and its unit (not the call that met the failure: with
 * FSDP_TEST_FAULT=nccl_enqueue_poll@1 rank 1's next enqueue meets the
 * communicator the poll has just aborted), and every later collective of
 * the world fails too. Without FSDP_SIM_NCCL_FAIL the step succeeds (the
 * same program is its own control).
 * Exits 0 when that holds, 1 otherwise, 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "core/internal.h" /* FSDP_TRY */
#include "cuda_gate.h"
#include "fsdp/fsdp.h"

#define N_UNITS 3

static fsdp_status_t make(fsdp_world_t world, fsdp_engine_t *e) {
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  cfg.device = FSDP_DEVICE_CUDA;
  cfg.comm_backend = "nccl";
  FSDP_TRY(fsdp_engine_create(world, &cfg, e));
  for (int u = 0; u < N_UNITS; u++) {
    char name[8], tensor[16];
    snprintf(name, sizeof name, "u%d", u);
    snprintf(tensor, sizeof tensor, "u%d.w", u);
    fsdp_tensor_desc_t d = {tensor, 2, {16, 8}, FSDP_INIT_NORMAL, 0.5f, 0};
    fsdp_unit_t id;
    FSDP_TRY(fsdp_unit_add(*e, name, "Linear", &d, 1, &id));
  }
  return fsdp_engine_materialize(*e, 7);
}

/* One step; the first failing call's status (its message is the last
 * error) and *where names that call. */
static fsdp_status_t step(fsdp_engine_t e, char *where, size_t n) {
  fsdp_view_t v;
  fsdp_status_t st = FSDP_SUCCESS;
  for (int u = 0; u < N_UNITS && !st; u++) {
    snprintf(where, n, "acquire(u%d, forward)", u);
    if (!(st = fsdp_unit_acquire(e, u, FSDP_FORWARD, &v))) {
      snprintf(where, n, "release(u%d, forward)", u);
      st = fsdp_unit_release(e, u, FSDP_FORWARD);
    }
  }
  for (int u = N_UNITS - 1; u >= 0 && !st; u--) {
    snprintf(where, n, "acquire(u%d, backward)", u);
    if (!(st = fsdp_unit_acquire(e, u, FSDP_BACKWARD, &v)))
      st = fsdp_device_zero(v.grad[0], 16 * 8 * sizeof(float), fsdp_engine_stream(e));
    if (!st) {
      snprintf(where, n, "release(u%d, backward)", u);
      st = fsdp_unit_release(e, u, FSDP_BACKWARD);
    }
  }
  fsdp_step_stats_t stats;
  if (!st) snprintf(where, n, "fsdp_engine_step");
  return st ? st : fsdp_engine_step(e, &stats);
}

int main(void) {
  const int gate = fsdp_cuda_gate("nccl_fail");
  if (gate) return gate;
  fsdp_world_t world;
  int rank, nranks;
  int rc = mpi_check_join_gpu(&world, &rank, &nranks);
  if (rc) return rc;
  const char *inject = getenv("FSDP_SIM_NCCL_FAIL");
  const int injected = inject && *inject;
  fsdp_engine_t e = NULL;
  fsdp_status_t st = make(world, &e);
  if (st != FSDP_SUCCESS) {
    printf("nccl-fail: rank %d: set-up failed: %s\n", rank, fsdp_last_error());
    return 1;
  }
  char where[64];
  st = step(e, where, sizeof where);
  const char *msg = fsdp_last_error();
  int ok;
  if (!injected) {
    ok = st == FSDP_SUCCESS;
    printf("nccl-fail: rank %d: control step: %s\n", rank, ok ? "ok" : msg);
  } else {
    /* The report leads with the gather that failed, whichever call met it. */
    ok = st == FSDP_ERR_COMM && strstr(msg, "nccl: all_gather #2 for 'u1'") == msg &&
         strstr(msg, "failed inside its stream");
    printf("nccl-fail: rank %d: %s: %s%s%s (%s)\n", rank, ok ? "ok" : "FAIL",
           st == FSDP_SUCCESS ? "every call of the step succeeded" : where,
           st == FSDP_SUCCESS ? "" : " failed: ", st == FSDP_SUCCESS ? "" : msg,
           fsdp_status_string(st));
    /* The world refuses what follows: nothing computed from the lost
     * gather can pass for good. */
    float x = 1, y = 0;
    fsdp_status_t later = fsdp_all_reduce(fsdp_engine_comm(e), &x, &y, 1, FSDP_F32, FSDP_SUM,
                                          FSDP_HOST_STREAM);
    if (later != FSDP_ERR_COMM || !strstr(fsdp_last_error(), "'u1'")) {
      printf("nccl-fail: rank %d: FAIL: a later all-reduce returned %s: %s\n", rank,
             fsdp_status_string(later), later ? fsdp_last_error() : "success");
      ok = 0;
    }
  }
  fflush(stdout);
  /* A rank that failed the test ends the job at once (its peer may sit in
   * a collective); one that passed tears down normally. */
  if (!ok) fsdp_world_abort(world, st, "nccl-fail: the check failed");
  fsdp_engine_destroy(e);
  fsdp_world_destroy(world);
  return ok ? 0 : 1;
}
