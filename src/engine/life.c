/* src/engine/life.c — the engine's life: create, materialize and destroy.
 * Each part of the state (engine_internal.h) is set up and freed by the file
 * that owns it; this file only orders those calls, and owns the device part
 * (the compute stream). Nothing else in the engine calls into it. */
#include <stdlib.h>

#include "engine/engine_internal.h"

fsdp_status_t fsdp_engine_create(fsdp_world_t world, const fsdp_config_t *cfg,
                                 fsdp_engine_t *engine) {
  if (!world || !engine)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_create: world and engine "
                      "must not be NULL");
  struct fsdp_engine *e = calloc(1, sizeof *e);
  if (!e) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  fsdp_status_t st = fsdp_engine_conf_init(e, world, cfg);
  if (st != FSDP_SUCCESS) { /* nothing else exists yet */
    fsdp_engine_conf_free(e);
    free(e);
    return st;
  }
  /* set: the configuration check refused a device without one */
  e->dev.ops = fsdp_compute_ops(e->conf.cfg.device);
  fsdp_engine_optim_init(e);
  FSDP_TRYG(st, fsdp_engine_stats_create(e), fail);
  FSDP_TRYG(st, fsdp_engine_comm_create(e), fail);
  if (!fsdp_engine_on_host(e))
    FSDP_TRYG(st, fsdp_stream_create_cuda("fsdp-compute", 0, &e->dev.s_compute), fail);
  FSDP_TRYG(st, fsdp_tl_marks_create(e), fail);
  FSDP_TRYG(st, fsdp_engine_sched_create(e), fail);
  *engine = e;
  return FSDP_SUCCESS;
fail:
  fsdp_engine_destroy(e);
  return st;
}

fsdp_status_t fsdp_engine_materialize(fsdp_engine_t e, uint64_t seed) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_materialize called twice");
  /* Ranks that built different models would issue mismatched collectives
   * from here on: compare first (one 16-byte all-gather when they agree),
   * before any check that could fail on one rank only — a rank without units
   * returning here would leave the others waiting in the comparison. */
  FSDP_TRY(fsdp_engine_check_plan(e));
  if (e->plan.n_units == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "fsdp_engine_materialize: no units were added");
  FSDP_TRY(fsdp_engine_shards_create(e, seed));
  FSDP_TRY(fsdp_engine_sched_plan(e));
  /* The compute stream's state (CUDA: its cuBLAS handle) now, not at the
   * first product of the first step while gathers are in flight. */
  FSDP_TRY(e->dev.ops->prepare(e->dev.s_compute, NULL));
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute)); /* CUDA: the bf16 casts, before gathers */
  e->plan.materialized = 1;
  return FSDP_SUCCESS;
}

void fsdp_engine_destroy(fsdp_engine_t e) {
  if (!e) return;
  /* Streams first: their queued work may still touch buffers freed below.
   * cuBLAS and cuDNN handles are cached per stream: released while these
   * still exist. */
  fsdp_stream_synchronize(e->dev.s_compute);
  e->dev.ops->release();
  fsdp_engine_comm_stop(e);
  fsdp_stream_destroy(e->dev.s_compute);
  fsdp_engine_units_free(e);
  fsdp_engine_pools_free(e);
  fsdp_engine_conf_free(e);
  fsdp_engine_sched_destroy(e);
  fsdp_engine_stats_destroy(e);
  fsdp_engine_comm_destroy(e);
  free(e);
}
